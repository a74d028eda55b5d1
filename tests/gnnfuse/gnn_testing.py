"""Shared pieces of the gnnfuse tests: corner-case graphs, forced schedules, Planetoid data."""

from __future__ import annotations

import pytest
import torch

from fusecore.testing import poisoned
from gnnfuse import Graph, ScheduleOptions, reference
from gnnfuse.datasets import default_planetoid_root, load_planetoid, planetoid_available

PLANETOID = default_planetoid_root()

# Every bucket kind forced on its own, and the automatic choice; "super" runs the row kernels
# without and "mixed" with per-edge-lane state (ScheduleOptions.edge_lanes), whatever the defaults;
# "light" has two width classes (ScheduleOptions.light_widths), the widest with most slots masked.
SCHEDULES = {
    "auto": None,
    "light": ScheduleOptions(light_max_degree=64, split_degree=64, light_widths=(4, 64)),
    "medium": ScheduleOptions(light_max_degree=0, split_degree=10_000),
    "rows only": ScheduleOptions(light_max_degree=-1, split_degree=10_000),
    "super": ScheduleOptions(light_max_degree=0, split_degree=2, piece_edges=3, edge_lanes=False),
    "mixed": ScheduleOptions(light_max_degree=2, split_degree=6, piece_edges=4, edge_lanes=True),
}


def corner_case_edges(gen: torch.Generator, num_nodes: int = 29, num_edges: int = 120) -> torch.Tensor:
    """Random edges plus: a super node (node 3 receives a third of the edges), self loops,
    duplicate edges, and isolated nodes (the last three ids receive and send nothing)."""
    active = num_nodes - 3
    src = torch.randint(0, active, (num_edges,), generator=gen)
    dst = torch.randint(0, active, (num_edges,), generator=gen)
    dst[: num_edges // 3] = 3
    loops = torch.arange(0, active, 4)
    src = torch.cat([src, loops, src[:7]])
    dst = torch.cat([dst, loops, dst[:7]])
    return torch.stack([src, dst])


def planetoid(name: str):
    """The real Planetoid dataset, or skip when the shared datasets folder is absent."""
    if not planetoid_available(name, PLANETOID):
        pytest.skip(f"Planetoid {name} not found under {PLANETOID}")
    return load_planetoid(name, PLANETOID)


def poison_op_outputs(monkeypatch) -> list[torch.Tensor]:
    """Make gnnfuse.ops allocate every output and scratch buffer filled with the poison value;
    returns the list each new buffer is appended to (for assert_all_written afterwards)."""
    from gnnfuse import ops

    created: list[torch.Tensor] = []

    def poisoned_output(shape, dtype, device):
        created.append(poisoned(shape, dtype, device))
        return created[-1]

    monkeypatch.setattr(ops, "_new_output", poisoned_output)
    return created


def edge_softmax_f64(scores: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``[E, H]`` softmax of ``scores`` over each destination's edges (input order), differentiable: an oracle's."""
    index = dst[:, None].expand_as(scores)
    row_max = torch.full((num_nodes, scores.shape[1]), -torch.inf, dtype=scores.dtype)
    row_max = row_max.scatter_reduce(0, index, scores.detach(), "amax")
    exp = torch.exp(scores - row_max[dst])
    total = torch.zeros(num_nodes, scores.shape[1], dtype=scores.dtype).index_add(0, dst, exp)
    return exp / total[dst]


def gat_oracle(edges, num_nodes, wh_src, el, er, slope, *, edge_score=None, keep=None, dropout=0.0, weight=None):
    """GAT message passing written out in float64 (input edge order): ``z = el_j + er_i (+ edge_score)``,
    ``α = softmax(LeakyReLU(z))``, kept by ``keep`` and scaled by ``1 / (1 − dropout)``, times DGL's per-edge
    ``weight``; returns ``(out [N, H, D], α' [E, H])``."""
    src, dst = edges[0], edges[1]
    z = el[src] + er[dst]
    if edge_score is not None:
        z = z + edge_score
    alpha = edge_softmax_f64(torch.where(z > 0, z, z * slope), dst, num_nodes)
    if keep is not None:
        alpha = torch.where(keep, alpha / (1 - dropout), 0.0)
    if weight is not None:
        alpha = alpha * weight[:, None]
    out = torch.zeros(num_nodes, *wh_src.shape[1:], dtype=torch.float64).index_add(
        0, dst, alpha[:, :, None] * wh_src[src])
    return out, alpha


def input_order_keep_mask(graph: Graph, heads: int, dropout: float, seed: int) -> torch.Tensor:
    """The fused forward's attention-dropout mask ``[E, H]`` (stream offset 0) in the graph's input edge order."""
    keep_csr = reference.dropout_keep_mask(graph, heads, dropout, seed, 0).cpu()
    keep = torch.empty_like(keep_csr)
    keep[graph.csr_eid.long().cpu()] = keep_csr
    return keep
