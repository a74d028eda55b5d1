"""Unfused PyTorch GAT: the same math as the fused kernels, one op at a time.

It is the benchmarks' baseline (what a user writes with gather / scatter in PyTorch) and,
in float64, the tests' oracle.  It materializes the per-edge scores ``[E, H]`` and the
gathered messages ``[E, H, D]`` — exactly what the fused kernels avoid.

Edges are taken in the graph's CSR order, so the attention-dropout mask, drawn from
:func:`fusecore.rng.uniform_reference` with stream = CSR position and position =
``offset + head``, is bit-identical to the kernels'.
"""

from __future__ import annotations

import torch

from fusecore.rng import uniform_reference

from .graph import Graph, as_graph


def dropout_keep_mask(graph: Graph, heads: int, dropout: float, seed: int, offset: int) -> torch.Tensor:
    """Boolean ``[E, H]`` (CSR order): which attention weights survive dropout."""
    positions = torch.arange(graph.num_edges, dtype=torch.int64).numpy()[:, None]
    heads_pos = offset + torch.arange(heads, dtype=torch.int64).numpy()[None, :]
    uniform = uniform_reference(seed, positions, heads_pos)[..., 0]
    return torch.from_numpy(uniform >= dropout).to(graph.device)


def gat_attention_reference(
    graph,
    wh: torch.Tensor,
    el: torch.Tensor,
    er: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    seed: int = 0,
    offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [N, H, D], lse [N, H])`` computed unfused in the dtype of ``el`` (differentiable).

    ``out_i = Σ_{j->i} α_ij Wh_j``, ``α_i· = softmax_j LeakyReLU(el_j + er_i)`` (then dropout
    with scale ``1 / (1 − dropout)``); rows without incoming edges give zeros and
    ``lse = -inf``.
    """
    graph = as_graph(graph)
    num_nodes, heads, _ = wh.shape
    dtype = el.dtype
    src = graph.csr_src.long()
    dst = graph.csr_dst.long()
    scores = torch.nn.functional.leaky_relu(el[src] + er[dst], negative_slope)  # [E, H]
    row_max = torch.full((num_nodes, heads), float("-inf"), dtype=dtype, device=wh.device)
    row_max = row_max.scatter_reduce(0, dst[:, None].expand_as(scores), scores.detach(), "amax")
    exp_scores = torch.exp(scores - row_max[dst])
    row_sum = torch.zeros(num_nodes, heads, dtype=dtype, device=wh.device).index_add(0, dst, exp_scores)
    alpha = exp_scores / row_sum[dst]
    if dropout > 0:
        keep = dropout_keep_mask(graph, heads, dropout, seed, offset)
        alpha = torch.where(keep, alpha / (1.0 - dropout), torch.zeros_like(alpha))
    messages = alpha[:, :, None] * wh.to(dtype)[src]  # [E, H, D]
    out = torch.zeros(num_nodes, *wh.shape[1:], dtype=dtype, device=wh.device).index_add(0, dst, messages)
    lse = torch.where(row_sum > 0, row_max + torch.log(row_sum.clamp_min(1e-300)), torch.full_like(row_sum, -torch.inf))
    return out, lse.detach()

