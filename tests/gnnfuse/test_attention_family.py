"""The fused GATv2, Graph Transformer (with edge features) and AGNN ops against the float64 reference.

Every op runs through the same schedule, tiles, online softmax, super-row pieces and merges
as the GAT (gnnfuse.kernels.scores selects the score); each test here checks outputs and
every gradient — features, attention vector ``a``, edge features, β — against
gnnfuse.reference evaluated in float64 on the same (rounded) inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges, planetoid, poison_op_outputs

from fusecore import PhiloxStream
from fusecore.testing import TOLERANCES, assert_all_written, assert_close, record_launches
from gnnfuse import Graph, ops, reference


@dataclass(frozen=True)
class AttentionOp:
    """One fused op, how to make its inputs, and its float64 oracle."""

    shapes: Callable[[int, int, int, int], list[tuple[int, ...]]]  # (nodes, edges, heads, dim) -> leaf shapes
    fused: Callable
    oracle: Callable  # (graph, *float64 leaves, dropout, seed, offset) -> out
    dropout: bool = True


def _gatv2_oracle(graph, *leaves, **kw):
    return reference.gatv2_reference(graph, *leaves, negative_slope=0.15, **kw)[0]


def _transformer_oracle(graph, *leaves, **kw):
    return reference.transformer_attention_reference(graph, *leaves, **kw)[0]


def _agnn_oracle(graph, feat, beta, **kw):
    return reference.agnn_reference(graph, feat, beta)


EDGE_DIM = 3  # raw edge features per edge, projected in registers to [H, D]
OPS = {
    "gatv2": AttentionOp(
        lambda n, e, h, d: [(n, h, d), (n, h, d), (1, h, d)],
        lambda graph, *leaves, **kw: ops.gatv2(graph, *leaves, negative_slope=0.15, **kw),
        _gatv2_oracle,
    ),
    "gatv2+edge": AttentionOp(  # PyG GATv2Conv's edge_dim (tests/gnnfuse/test_gatv2_edge.py)
        lambda n, e, h, d: [(n, h, d), (n, h, d), (1, h, d), (e, EDGE_DIM), (h * d, EDGE_DIM)],
        lambda graph, *leaves, **kw: ops.gatv2(graph, *leaves, negative_slope=0.15, **kw),
        _gatv2_oracle,
    ),
    "transformer": AttentionOp(
        lambda n, e, h, d: [(n, h, d)] * 3,
        ops.transformer_attention,
        _transformer_oracle,
    ),
    "transformer+edge": AttentionOp(
        lambda n, e, h, d: [(n, h, d)] * 3 + [(e, EDGE_DIM), (h * d, EDGE_DIM)],
        ops.transformer_attention,
        _transformer_oracle,
    ),
    "agnn": AttentionOp(
        lambda n, e, h, d: [(n, h, d), (1,)],
        lambda graph, feat, beta, schedule=None, **kw: ops.agnn(graph, feat, beta, schedule=schedule),
        _agnn_oracle,
        dropout=False,
    ),
}


def make_leaves(op: AttentionOp, graph: Graph, heads: int, dim: int, dtype, device, gen) -> list[torch.Tensor]:
    shapes = op.shapes(graph.num_nodes, graph.num_edges, heads, dim)
    return [torch.randn(shape, generator=gen).to(device, dtype) for shape in shapes]


# A reference gradient under this fraction of ‖∂L/∂out‖ counts as cancelled (check_op): compared absolutely, to the
# dtype's tolerance times this fraction of ‖∂L/∂out‖.
CANCELLED = 1e-3


def check_op(name, graph, leaves, gen, *, schedule=None, dropout=0.0, seed=0, tol=None, frozen=()):
    """Forward and every gradient of op ``name`` against its float64 oracle (leaves whose index is
    in ``frozen`` need no gradient)."""
    op = OPS[name]
    fused_leaves = [t.detach().clone().requires_grad_(i not in frozen) for i, t in enumerate(leaves)]
    kwargs = {"dropout": dropout, "rng": PhiloxStream(seed, offset=5)} if op.dropout else {}
    out = op.fused(graph, *fused_leaves, schedule=schedule, **kwargs)
    value = leaves[2] if name.startswith("transformer") else leaves[0]
    assert out.dtype == value.dtype and out.shape == value.shape
    grad_out = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    grads = torch.autograd.grad(out, [t for t in fused_leaves if t.requires_grad], grad_out)
    refs = [t.detach().cpu().double().requires_grad_(i not in frozen) for i, t in enumerate(leaves)]
    oracle_kwargs = {"dropout": dropout, "seed": seed, "offset": 5} if op.dropout else {}
    ref_out = op.oracle(graph.to("cpu"), *refs, **oracle_kwargs)
    ref_grads = torch.autograd.grad(ref_out, [t for t in refs if t.requires_grad], grad_out.cpu().double())
    tol = tol or TOLERANCES[value.dtype]
    assert_close(out, ref_out, tol=tol, name=f"{name} out")
    scale = torch.linalg.vector_norm(grad_out.double()).item()
    for i, g, r in zip([i for i in range(len(leaves)) if i not in frozen], grads, ref_grads):
        assert g.dtype == leaves[i].dtype and g.shape == leaves[i].shape
        label = f"{name} grad of input {i} {tuple(r.shape)}"
        norm = torch.linalg.vector_norm(r).item()
        if norm < CANCELLED * scale:
            # A gradient that cancels, exactly or nearly (e.g. ∂fd of a row whose edges fall on the same LeakyReLU
            # branch in all but a few elements: softmax gradients sum to zero): the float32 sum of O(scale) terms
            # carries their rounding (~1e-7 · scale), which no relative tolerance of a near-zero sum absorbs, so it
            # is compared against the terms' scale.  GATv2 with edge features, seed 163 of the zero in-degree test:
            # ∂fd of norm 3e-6 · scale, computed 1.5e-7 · scale off (4.7e-2 relative).
            err = torch.linalg.vector_norm(g.double().cpu() - r).item()
            assert err <= tol * CANCELLED * scale, f"{label}: error {err:.3e} of a cancelled gradient (norm {norm:.3e})"
        else:
            assert_close(g, r, tol=tol, name=label)


@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("name", ["gatv2", "transformer+edge"])
def test_every_schedule_matches_reference(gen, device, name, schedule):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS[name], graph, 3, 5, torch.float32, device, gen)
    check_op(name, graph, leaves, gen, schedule=SCHEDULES[schedule])


@pytest.mark.parametrize("frozen", [3, 4])
def test_edge_feature_gradients_only_where_asked(gen, device, frozen):
    """Edge features without a gradient (data) or a frozen ``lin_edge``: the destination pass
    forms only the gradient autograd asks for, and it is still right."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS["transformer+edge"], graph, 2, 8, torch.float32, device, gen)
    check_op("transformer+edge", graph, leaves, gen, schedule=SCHEDULES["mixed"], frozen=(frozen,))


@pytest.mark.parametrize("unrolled, product, heads_first", [(True, "tf32x3", True), (False, "ieee", False)])
def test_edge_terms_and_weight_gradient_over_many_programs(gen, device, monkeypatch, unrolled, product, heads_first):
    """The backward's edge-feature terms ``(q̃_i · e_p, g_i · e_p)`` formed (and ``∂attr`` from ``α'``) in CSR
    blocks of 16 positions and ``∂W_e`` summed from node blocks of 7 (many programs each, partial blocks at
    the ends; its products on the tensor cores in TF32 parts, heads first, or on the CUDA cores, node blocks first),
    with the light rows of the forward, source and destination passes unrolled and in the tile form (the forward's
    projecting every edge): the output and every gradient against the float64 oracle."""
    monkeypatch.setattr(ops, "EDGE_TERMS_BLOCK_INTERPRETED", 16)
    monkeypatch.setattr(ops, "EDGE_TERMS_BLOCK", 16)
    monkeypatch.setattr(ops, "EDGE_TERMS_BLOCK_2BYTE", 16)
    monkeypatch.setattr(ops, "EDGE_WEIGHT_GRAD_NODES_INTERPRETED", 7)
    monkeypatch.setattr(ops, "EDGE_WEIGHT_GRAD_NODES", {2: 7, 4: 7})
    monkeypatch.setattr(ops, "EDGE_WEIGHT_GRAD_PRODUCT", {2: product, 4: product})
    monkeypatch.setattr(ops, "EDGE_WEIGHT_GRAD_HEADS_FIRST", {2: heads_first, 4: heads_first})
    monkeypatch.setattr(ops, "LIGHT_FORWARD_UNROLLED_WITH_EDGES", unrolled)
    monkeypatch.setattr(ops, "LIGHT_SOURCE_UNROLLED", unrolled)
    monkeypatch.setattr(ops, "LIGHT_DESTINATION_UNROLLED_WITH_EDGES", unrolled)
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS["transformer+edge"], graph, 3, 5, torch.float32, device, gen)
    check_op("transformer+edge", graph, leaves, gen, schedule=SCHEDULES["mixed"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", [0, 1, 2], ids=["K loop", "K unrolled", "whole tile"])
def test_unrolled_forward_light_rows_with_edges_every_weight_form(gen, device, monkeypatch, form, dtype):
    """The forward's unrolled light rows with edge features (``LIGHT_FORWARD_UNROLLED_WITH_EDGES``), their rows'
    ``u = W q̃`` and ``Σ_k A[k] W[k]`` with the ``K`` steps in a loop, unrolled, or as one product with the whole
    weight tile (``LIGHT_UNROLLED_EDGE_FORM``): the output and every gradient against the float64 oracle, on rows
    of in-degree 1 to 13 in five unrolled width classes (one multiprocessor's share: no class merged away) and
    the corner-case graph's rows."""
    import gnnfuse.schedule
    from gnnfuse import ScheduleOptions

    monkeypatch.setattr(ops, "LIGHT_FORWARD_UNROLLED_WITH_EDGES", True)
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_EDGE_FORM", form)
    monkeypatch.setattr(gnnfuse.schedule, "device_facts", lambda _: SimpleNamespace(sm_count=1))
    degrees = torch.tensor([1, 2, 3, 5, 9, 13] * 6)
    dst = torch.repeat_interleave(torch.arange(degrees.numel()), degrees)
    src = torch.randint(0, degrees.numel() + 3, (dst.numel(),), generator=gen)  # 3 nodes receive nothing
    options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
    for graph in (Graph(torch.stack([src, dst]).to(device), degrees.numel() + 3),
                  Graph(corner_case_edges(gen).to(device), 29)):
        leaves = make_leaves(OPS["transformer+edge"], graph, 3, 5, dtype, device, gen)
        check_op("transformer+edge", graph, leaves, gen, schedule=options)
        light = graph.schedule(3, 5, dtype, options).launches
        forward = [meta for key, plan in light.items() if key[0] == "forward" for *_, meta in plan[0]]
        assert forward and all(meta["UNROLLED"] and meta["EDGE_FORM"] == form for meta in forward)


@pytest.mark.parametrize("warps", [2, 8])
def test_tile_form_light_launches_with_edges_take_their_warps(gen, device, monkeypatch, warps):
    """``LIGHT_TILE_WARPS_WITH_EDGES``: the forward's and the destination pass's light launches in the tile form with
    edge features run at the warps it names (the plan's ``num_warps``), the others at the schedule's; the output and
    every gradient against the float64 oracle."""
    monkeypatch.setattr(ops, "LIGHT_TILE_WARPS_WITH_EDGES", {"forward": warps, "source": None, "destination": warps})
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS["transformer+edge"], graph, 3, 5, torch.float32, device, gen)
    check_op("transformer+edge", graph, leaves, gen, schedule=SCHEDULES["light"])
    schedule = graph.schedule(3, 5, torch.float32, SCHEDULES["light"])
    plans = {key[0]: plan for key, plan in schedule.launches.items()}
    forward = [meta for *_, meta in plans["forward"][0]]
    destination = [meta for *_, meta in plans["backward"]["destination light"]]
    source = [meta for *_, meta in plans["backward"]["source light"]]
    assert forward and destination and source
    assert all(meta["num_warps"] == warps for meta in forward + destination if not meta["UNROLLED"])
    assert all(meta["num_warps"] == schedule.num_warps for meta in source if not meta["UNROLLED"])


def _gap_edges(gen: torch.Generator, num_nodes: int) -> torch.Tensor:
    """Edges into three destinations far apart (ids 0, 1 and ``num_nodes − 2``): one CSR block spans almost every
    node id, only three of them present."""
    src = torch.randint(0, num_nodes, (40,), generator=gen)
    dst = torch.tensor([0, 1, num_nodes - 2]).repeat_interleave(torch.tensor([13, 2, 25]))
    return torch.stack([src, dst])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("edges", ["corner", "gap"])
def test_edge_terms_in_small_blocks(gen, device, monkeypatch, dtype, edges):
    """The backward's edge-terms pass in CSR blocks of 16 positions (many programs, blocks that end inside a
    destination's edges): the layer's output and every gradient match the float64 oracle — the super node's many
    edges, isolated nodes, self loops, duplicates, and a block whose destinations lie ~5,000 ids apart."""
    for name in ("EDGE_TERMS_BLOCK_INTERPRETED", "EDGE_TERMS_BLOCK", "EDGE_TERMS_BLOCK_2BYTE"):
        monkeypatch.setattr(ops, name, 16)
    num_nodes = 29 if edges == "corner" else 5_021
    edge_index = corner_case_edges(gen) if edges == "corner" else _gap_edges(gen, num_nodes)
    graph = Graph(edge_index.to(device), num_nodes)
    leaves = make_leaves(OPS["transformer+edge"], graph, 3, 5, dtype, device, gen)
    check_op("transformer+edge", graph, leaves, gen, schedule=SCHEDULES["mixed"])


@pytest.mark.parametrize("form, ahead", [(2, True), (0, False), (2, False)])
@pytest.mark.parametrize("schedule", ["mixed", "super"])
def test_row_kernels_edge_weight_forms_and_features_ahead(gen, device, monkeypatch, schedule, form, ahead):
    """The row kernels with edge features meeting ``W_e`` as one ``[K, H, D]`` tile (``ROW_EDGE_FORM`` 2, forward
    and destination pass) or a row at a time (0), their edge features loaded a trip ahead or not
    (``ROW_ATTR_AHEAD``: the forward's with its gathers, the destination pass's edge ids with its indices): the
    output and every gradient against the float64 oracle, whole medium rows and split super rows."""
    monkeypatch.setattr(ops, "ROW_EDGE_FORM", {"forward": form, "destination": form})
    monkeypatch.setattr(ops, "ROW_ATTR_AHEAD", {"forward": ahead, "destination": ahead})
    monkeypatch.setattr(ops, "ROW_PREFETCH_GATHERS_WITH_EDGES", True)
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS["transformer+edge"], graph, 3, 5, torch.float32, device, gen)
    check_op("transformer+edge", graph, leaves, gen, schedule=SCHEDULES[schedule])


@pytest.mark.parametrize("name", ["transformer", "agnn"])
@pytest.mark.parametrize("schedule", ["light", "super"])
def test_dot_product_without_edges_and_agnn(gen, device, name, schedule):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS[name], graph, 2, 6, torch.float32, device, gen)
    check_op(name, graph, leaves, gen, schedule=SCHEDULES[schedule])


@pytest.mark.parametrize("heads, dim", [(1, 1), (5, 3), (2, 16)])
@pytest.mark.parametrize("name", ["gatv2", "transformer+edge"])
def test_any_head_count_and_size(gen, device, name, heads, dim):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS[name], graph, heads, dim, torch.float32, device, gen)
    check_op(name, graph, leaves, gen, schedule=SCHEDULES["mixed"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["gatv2", "transformer+edge", "agnn"])
def test_half_precision_inputs_accumulate_in_float32(gen, device, name, dtype):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS[name], graph, 4, 8, dtype, device, gen)
    check_op(name, graph, leaves, gen, schedule=SCHEDULES["mixed"])


@pytest.mark.parametrize("name", ["gatv2", "transformer+edge", "agnn"])
def test_float64_gradcheck(gen, device, name):
    graph = Graph(corner_case_edges(gen, num_nodes=9, num_edges=20).to(device), 9)
    leaves = [t.requires_grad_(True) for t in make_leaves(OPS[name], graph, 2, 3, torch.float64, device, gen)]
    for schedule in (SCHEDULES["light"], SCHEDULES["super"]):
        def fused(*xs, schedule=schedule):
            return OPS[name].fused(graph, *xs, schedule=schedule)

        assert torch.autograd.gradcheck(fused, leaves, eps=1e-6, atol=1e-7, fast_mode=True)


@pytest.mark.parametrize("name", ["gatv2", "transformer+edge"])
def test_attention_dropout_is_regenerated_in_backward(gen, device, name):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS[name], graph, 3, 4, torch.float32, device, gen)
    # The oracle draws the same mask (uniform(seed, CSR position, offset + head)) and is
    # differentiated through it: the fused backward must regenerate exactly that mask.
    check_op(name, graph, leaves, gen, schedule=SCHEDULES["mixed"], dropout=0.4, seed=77)
    a = OPS[name].fused(graph, *leaves, dropout=0.4, rng=PhiloxStream(77, offset=5))
    b = OPS[name].fused(graph, *leaves, dropout=0.4, rng=PhiloxStream(77, offset=8))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("merged", [True, False, "capped"], ids=["merged inside", "merge launches", "too many pieces"])
@pytest.mark.parametrize("mixed", [True, False], ids=["one launch", "two launches"])
@pytest.mark.parametrize("name", ["gatv2", "transformer+edge", "agnn"])
def test_row_launch_of_pieces_and_medium_rows(gen, device, monkeypatch, name, mixed, merged):
    """The forward's and the destination pass's super-row pieces and medium rows in one row-kernel launch
    (``ROW_LAUNCH_MIXED``, the kernels' ``PIECES=2``: pieces first, then the rows) or in two, and the split rows
    merged by the last piece of each to finish (``PIECE_MERGE_IN_ROWS``, every pass: no merge launch at all) or
    by merge launches (asked for, or where a row has more pieces than ``MERGE_INSIDE_MAX_TRIPS`` allows): the
    output and every gradient (with edge features the destination pass's edge sums too) against the float64
    oracle (training: the forward's FINAL store), and with a per-node addend, inference and training (ADD, ADD
    with FINAL), every buffer poisoned before and written."""
    monkeypatch.setattr(ops, "ROW_LAUNCH_MIXED", {"forward": mixed, "destination": mixed})
    monkeypatch.setattr(ops, "PIECE_MERGE_IN_ROWS", dict.fromkeys(("forward", "source", "destination"), bool(merged)))
    if merged == "capped":  # every row with two pieces or more is too long to merge inside
        monkeypatch.setattr(ops, "MERGE_INSIDE_MAX_TRIPS", 0)
        merged = False
    merges = record_launches(monkeypatch, ops, "lse_merge_kernel", "sum_merge_kernel")  # the merge launches
    graph = Graph(corner_case_edges(gen).to(device), 29)
    schedule = graph.schedule(3, 5, torch.float32, SCHEDULES["mixed"])
    buckets = schedule.incoming
    assert buckets.num_pieces and buckets.medium[0].numel() and schedule.outgoing.num_pieces
    assert buckets.max_row_pieces == max(b - a for a, b in zip(buckets.super_piece_ptr, buckets.super_piece_ptr[1:]))
    assert [p for *_, p in ops._row_launches(buckets, mixed, merged)] == ([2] if mixed else [False, 2 if merged
                                                                                                else True])
    ptr = buckets.super_piece_ptr.tolist()
    assert buckets.piece_super.tolist() == [s for s in range(len(ptr) - 1) for _ in range(ptr[s + 1] - ptr[s])]
    leaves = make_leaves(OPS[name], graph, 3, 5, torch.float32, device, gen)
    check_op(name, graph, leaves, gen, schedule=SCHEDULES["mixed"])
    # forward, source pass (two sums; AGNN one, its ∂k folded into P), destination pass (with edge features two sums;
    # AGNN's adds P)
    source_sums = 1 if name == "agnn" else 2
    assert len(merges) == (0 if merged else 1 + source_sums + (2 if name == "transformer+edge" else 1)), merges
    # the merging launches count their pieces in one buffer per bucket set, kept across calls and left zeroed
    kept = {(side, key): t for side, b in enumerate((buckets, schedule.outgoing)) for key, t in b.scratch.items()}
    assert bool(kept) == bool(merged) and all(not t.any() for t in kept.values()), kept
    check_op(name, graph, leaves, gen, schedule=SCHEDULES["mixed"])
    again = {(side, key): t for side, b in enumerate((buckets, schedule.outgoing)) for key, t in b.scratch.items()}
    assert again.keys() == kept.keys() and all(again[k] is t and not t.any() for k, t in kept.items())
    if name != "transformer+edge":
        return
    created = poison_op_outputs(monkeypatch)
    add = torch.randn(graph.num_nodes, 3, 5, generator=gen).to(device)
    expected = _transformer_oracle(graph.to("cpu"), *(t.double().cpu() for t in leaves)) + add.double().cpu()
    with torch.no_grad():
        out = ops.transformer_attention(graph, *leaves, schedule=SCHEDULES["mixed"], out_add=add)
    assert_close(out, expected, tol=TOLERANCES[torch.float32], name="out + addend, inference")
    trained = [t.clone().requires_grad_(True) for t in leaves]
    out = ops.transformer_attention(graph, *trained, schedule=SCHEDULES["mixed"], out_add=add)
    assert_close(out, expected, tol=TOLERANCES[torch.float32], name="out + addend, training")
    for i, t in enumerate(created):
        if t.dim() == 2:
            t = torch.where(torch.isneginf(t), 0.0, t)  # lse is -inf for rows (and pieces) without edges
        assert_all_written(t, name=f"buffer {i} {tuple(t.shape)}")


@pytest.mark.parametrize("name", ["gatv2", "transformer+edge", "agnn"])
def test_every_output_and_scratch_element_is_written(gen, device, monkeypatch, name):
    created = poison_op_outputs(monkeypatch)
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = [t.requires_grad_(True) for t in make_leaves(OPS[name], graph, 3, 5, torch.float32, device, gen)]
    out = OPS[name].fused(graph, *leaves, schedule=SCHEDULES["mixed"])
    out.sum().backward()
    assert len(created) >= 9  # out, lse, partials, gradients, ∂s and backward partials
    for i, t in enumerate(created):
        if t.dim() == 2:
            t = torch.where(torch.isneginf(t), 0.0, t)  # lse is -inf for rows (and pieces) without edges
        assert_all_written(t, name=f"buffer {i} {tuple(t.shape)}")


@pytest.mark.parametrize("unrolled", [True, False], ids=["unrolled light rows", "light tiles"])
@pytest.mark.parametrize("schedule", ["light", "super", "mixed"])
def test_agnn_rows_at_and_under_the_normalization_eps(gen, device, monkeypatch, schedule, unrolled):
    """AGNN's normalization backward, folded into the attention passes' stores (kernels/normalize.py), on rows of
    ``h`` whose norm is 0, under the clamp's ε = 1e-12, or just above it, with β of either sign and 0: the radial term
    dropped exactly where ``torch.nn.functional.normalize``'s clamp drops it; ``∂h`` and ``∂β`` against the float64
    oracle (per head: a row may have one head under ε), light rows unrolled or in tiles."""
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_FLOAT32_SCORES", dict.fromkeys(("forward", "source", "destination"),
                                                                           (2,) if unrolled else ()))
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_SCORES", (2,) if unrolled else ())
    graph = Graph(corner_case_edges(gen).to(device), 29)
    for beta in (0.7, -1.3, 0.0):
        h, _ = make_leaves(OPS["agnn"], graph, 2, 6, torch.float32, device, gen)
        h[0] = 0.0                                  # norm 0 (an isolated or a connected row: both kinds of schedule)
        h[3, 0] = h[3, 0] / h[3, 0].norm() * 4e-13  # head 0 under ε, head 1 as drawn
        h[5] = h[5] / h[5].norm(dim=-1, keepdim=True) * 3e-12  # both heads just above ε
        h[7, 1] = 0.0
        leaves = [h, torch.full((1,), beta, device=device)]
        check_op("agnn", graph, leaves, gen, schedule=SCHEDULES[schedule])


@pytest.mark.parametrize("frozen", [0, 1], ids=["beta alone", "features alone"])
@pytest.mark.parametrize("schedule", ["light", "mixed"])
def test_agnn_gradient_of_one_input_alone(gen, device, schedule, frozen):
    """AGNN with only β or only the features asking for a gradient (``AGNNConv(learn_beta=False)`` is the second):
    the folded backward (kernels/normalize.py) gives that one gradient, against the float64 oracle, with split rows
    and light rows."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS["agnn"], graph, 2, 6, torch.float32, device, gen)
    check_op("agnn", graph, leaves, gen, schedule=SCHEDULES[schedule], frozen=(frozen,))


@pytest.mark.parametrize("name", ["gatv2", "transformer+edge", "agnn"])
def test_zero_in_degree_single_node_and_edgeless_graphs(gen, device, name):
    op = OPS[name]
    graph = Graph(torch.tensor([[0, 1], [1, 1]]).to(device), 4)  # nodes 0, 2, 3 receive nothing
    leaves = [t.requires_grad_(True) for t in make_leaves(op, graph, 2, 3, torch.float32, device, gen)]
    out = op.fused(graph, *leaves)
    assert torch.all(out[[0, 2, 3]] == 0)
    check_op(name, graph, leaves, gen)
    edgeless = Graph(torch.zeros(2, 0, dtype=torch.long, device=device), 4)
    leaves = [t.requires_grad_(True) for t in make_leaves(op, edgeless, 2, 3, torch.float32, device, gen)]
    out = op.fused(edgeless, *leaves)
    grads = torch.autograd.grad(out.sum(), leaves, allow_unused=True)
    assert torch.all(out == 0) and all(g is None or torch.all(g == 0) for g in grads)
    empty = Graph(torch.zeros(2, 0, dtype=torch.long, device=device), 0)
    leaves = make_leaves(op, empty, 2, 3, torch.float32, device, gen)
    assert op.fused(empty, *leaves).shape == leaves[2 if name.startswith("transformer") else 0].shape


@pytest.mark.parametrize("name", ["gatv2", "transformer+edge"])
def test_forward_and_backward_are_bitwise_reproducible(gen, device, name):
    """No atomics (∂a and ∂e included): identical inputs and seed give bit-identical results."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS[name], graph, 3, 5, torch.float32, device, gen)
    grad_out = torch.randn(29, 3, 5, generator=gen).to(device)
    runs = []
    for _ in range(2):
        fused_leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
        out = OPS[name].fused(graph, *fused_leaves, dropout=0.3, rng=PhiloxStream(11), schedule=SCHEDULES["mixed"])
        runs.append((out.detach(), *torch.autograd.grad(out, fused_leaves, grad_out)))
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"result {i} differs between identical runs"


@pytest.mark.parametrize("name", ["gatv2", "transformer+edge", "agnn"])
def test_real_cora(gen, device, name):
    data = planetoid("cora")
    graph = Graph(data.edge_index.to(device), data.num_nodes).add_self_loops()
    leaves = make_leaves(OPS[name], graph, 2, 4, torch.float32, device, gen)
    check_op(name, graph, leaves, gen)


def test_shared_weights_gatv2_sums_both_gradients(gen, device):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    feat = torch.randn(29, 2, 4, generator=gen).to(device).requires_grad_(True)
    attn = torch.randn(1, 2, 4, generator=gen).to(device)
    out = ops.gatv2(graph, feat, feat, attn)
    (grad,) = torch.autograd.grad(out.square().sum(), feat)
    ref_feat = feat.detach().double().requires_grad_(True)
    ref = reference.gatv2_reference(graph, ref_feat, ref_feat, attn.double())[0]
    (ref_grad,) = torch.autograd.grad(ref.square().sum(), ref_feat)
    assert_close(out, ref)
    assert_close(grad, ref_grad)


def test_bad_inputs_raise_clear_errors(gen, device):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    x = torch.randn(29, 3, 5, generator=gen).to(device)
    with pytest.raises(ValueError, match="feat_dst must have the shape of feat_src"):
        ops.gatv2(graph, x, x[:, :2], torch.ones(1, 3, 5))
    with pytest.raises(ValueError, match=r"attn must have shape \(1, H, D\) = \(1, 3, 5\)"):
        ops.gatv2(graph, x, x, torch.ones(1, 3, 4))
    with pytest.raises(ValueError, match="attn must have shape"):
        ops.gatv2(graph, x, x, torch.ones(5, 3))  # 15 elements, but not (H, D)
    with pytest.raises(TypeError, match="attn has dtype float64"):
        ops.gatv2(graph, x, x, torch.ones(1, 3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="negative_slope must be a finite float"):
        ops.gatv2(graph, x, x, torch.ones(1, 3, 5), negative_slope=float("nan"))
    with pytest.raises(TypeError, match="rng must be a fusecore.PhiloxStream"):
        ops.gatv2(graph, x, x, torch.ones(1, 3, 5), rng=3)
    with pytest.raises(TypeError, match="schedule must be a gnnfuse.ScheduleOptions"):
        ops.transformer_attention(graph, x, x, x, schedule=3)
    with pytest.raises(ValueError, match="feat_src has 28 rows"):
        ops.gatv2(graph, x[:28], x[:28], torch.ones(1, 3, 5))
    with pytest.raises(TypeError, match="key has dtype float64"):
        ops.transformer_attention(graph, x, x.double(), x)
    with pytest.raises(ValueError, match=rf"edge_attr must have shape \[num_edges={graph.num_edges}"):
        ops.transformer_attention(graph, x, x, x, torch.ones(3, 2), torch.ones(15, 2))
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[heads \* head_dim, edge_dim\] = \[15, 2\]"):
        ops.transformer_attention(graph, x, x, x, torch.ones(graph.num_edges, 2), torch.ones(2, 15))
    with pytest.raises(ValueError, match="together"):
        ops.transformer_attention(graph, x, x, x, torch.ones(graph.num_edges, 2))
    with pytest.raises(ValueError, match="scale"):
        ops.transformer_attention(graph, x, x, x, scale=float("nan"))
    with pytest.raises(ValueError, match="dropout"):
        ops.transformer_attention(graph, x, x, x, dropout=-0.1)
    with pytest.raises(ValueError, match="beta must have exactly one element"):
        ops.agnn(graph, x, torch.ones(2))
    with pytest.raises(ValueError, match="feat must have shape"):
        ops.agnn(graph, x[:, 0, 0], torch.ones(1))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gatv2", "transformer", "transformer+edge"])
def test_peak_memory_stays_far_below_one_edge_feature_tensor(gen, device, name):
    """O(N·H·D + E·(H + K)) memory: outputs, gradients, ∂s [E, H], raw edge features and their
    gradient [E, K]; never one E×H×D tensor (the edge projection included)."""
    from gnnfuse.datasets import power_law_graph

    n, e, heads, dim = 20_000, 1_000_000, 4, 32
    graph = Graph(power_law_graph(n, e, 20_000, seed=1).to(device), n)
    leaves = [t.requires_grad_(True) for t in make_leaves(OPS[name], graph, heads, dim, torch.float32, device, gen)]
    graph.schedule(heads, dim, torch.float32)  # built outside the measured region
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = OPS[name].fused(graph, *leaves, dropout=0.1)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    node_feature_bytes = n * heads * dim * 4
    edge_bytes = 3 * e * heads * 4 + 4 * e * EDGE_DIM * 4
    assert peak < 12 * node_feature_bytes + edge_bytes < e * heads * dim * 4 / 2


@pytest.mark.parametrize("schedule", ["auto", "light", "mixed"])
@pytest.mark.parametrize("kind", ["bias", "per-node"])
@pytest.mark.parametrize("name", ["gatv2", "gatv2+edge"])
def test_gatv2_addend_in_the_store(gen, device, monkeypatch, name, kind, schedule):
    """``ops.gatv2``'s ``out_add`` (PyG GATv2Conv's bias, or a residual) added as the kernels store the output: the
    output and every gradient, the addend's included (a bias's ``Σ_n g_n`` from the δ launch), against the float64
    oracle plus the addend, every buffer poisoned."""
    poison_op_outputs(monkeypatch)
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = make_leaves(OPS[name], graph, 3, 5, torch.float32, device, gen)
    add = torch.randn(15 if kind == "bias" else (graph.num_nodes, 15), generator=gen).to(device)
    fused = [t.clone().requires_grad_(True) for t in (*leaves, add)]
    out = ops.gatv2(graph, *fused[:-1], negative_slope=0.15, schedule=SCHEDULES[schedule], out_add=fused[-1])
    refs = [t.detach().cpu().double().requires_grad_(True) for t in (*leaves, add)]
    expected = _gatv2_oracle(graph.to("cpu"), *refs[:-1]) + refs[-1].view(-1, 3, 5)
    tol = TOLERANCES[torch.float32]
    assert_close(out, expected, tol=tol, name=f"{name} out + {kind}")
    grad = torch.randn(out.shape, generator=gen).to(device)
    got = torch.autograd.grad(out, fused, grad)
    want = torch.autograd.grad(expected, refs, grad.double().cpu())
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == fused[i].shape
        assert_close(g, w, tol=tol, name=f"{name} + {kind}: grad of input {i} {tuple(w.shape)}")
    with torch.no_grad():  # inference: the same store, no FINAL output
        assert_close(ops.gatv2(graph, *leaves, negative_slope=0.15, schedule=SCHEDULES[schedule], out_add=add),
                     expected, tol=tol, name=f"{name} out + {kind}, inference")


@pytest.mark.parametrize("name", ["gat", "transformer", "transformer+edge", "gatv2", "gatv2+edge"])
def test_addend_gradient_alone(gen, device, name):
    """Only the ``[H, D]`` addend (a bias) asks for a gradient, so the attention's backward does not run: ``∂bias =
    Σ_n g_n``, summed by fusecore's column sum (``ops._addend_grad``), against float64; no other gradient."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    if name == "gat":
        shapes = [(graph.num_nodes, 3, 5), (1, 3, 5), (1, 3, 5)]
        leaves = [torch.randn(s, generator=gen).to(device) for s in shapes]
        fused = ops.gat
    else:
        leaves = make_leaves(OPS[name], graph, 3, 5, torch.float32, device, gen)
        fused = OPS[name].fused
    bias = torch.randn(3 * 5, generator=gen).to(device).requires_grad_(True)
    out = fused(graph, *leaves, schedule=SCHEDULES["mixed"], out_add=bias)
    grad = torch.randn(out.shape, generator=gen).to(device)
    out.backward(grad)
    assert bias.grad.shape == bias.shape and all(t.grad is None for t in leaves)
    assert_close(bias.grad, grad.double().sum(0).flatten(), tol=TOLERANCES[torch.float32], name=f"{name} ∂bias")


def test_edge_weight_grad_product_setting_is_checked(gen, device, monkeypatch):
    """An unknown ``EDGE_WEIGHT_GRAD_PRODUCT`` is refused by name before anything is launched."""
    monkeypatch.setattr(ops, "EDGE_WEIGHT_GRAD_PRODUCT", {2: "tf32x3", 4: "tf32"})
    sums = torch.zeros(5, 2, 2, 3, device=device)
    with pytest.raises(ValueError, match="EDGE_WEIGHT_GRAD_PRODUCT"):
        ops.edge_weight_grad(sums, torch.zeros(5, 2, 4, device=device), torch.zeros(5, 2, 4, device=device), 0.5)


def test_ops_called_inside_a_compiled_function(gen):
    """A function calling the ops directly runs under ``torch.compile`` (inductor on the GPU, ``aot_eager`` on the
    CPU): each op runs as called, everything around it compiled; the loss and every gradient equal the eager run's."""
    import fusecore
    from gnnfuse.edge_score import edge_score_csr

    device = "cuda" if fusecore.COMPILED else "cpu"
    n, heads, dim = 29, 2, 4
    edges = corner_case_edges(gen, n)
    graph = Graph(edges.to(device), n)
    leaves = [torch.randn(n, heads, dim, generator=gen).to(device).requires_grad_(True) for _ in range(3)]
    attn = torch.randn(1, heads, dim, generator=gen).to(device).requires_grad_(True)
    beta = torch.tensor([1.5], device=device, requires_grad=True)
    attr = torch.randn(edges.shape[1], 3, generator=gen).to(device).requires_grad_(True)
    fold = torch.randn(3, heads, generator=gen).to(device).requires_grad_(True)
    params = [*leaves, attn, beta, attr, fold]

    def run(q, k, v, attn, beta, attr, fold):
        el, er = ops.node_scores(q, attn, attn)
        score = edge_score_csr(attr, fold, graph.csr_eid)
        out = ops.gat(graph, torch.tanh(q), attn, attn, edge_score=score, edge_score_order="csr")
        out = out + ops.gat_attention(graph, v, el, er) + ops.gatv2(graph, q, k, attn)
        out = out + ops.transformer_attention(graph, q, k, v) + ops.agnn(graph, v.reshape(n, -1), beta).view_as(v)
        return out.square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(run, backend="inductor" if fusecore.COMPILED else "aot_eager")
    loss = compiled(*params)
    grads = torch.autograd.grad(loss, params)
    want = run(*params)
    want_grads = torch.autograd.grad(want, params)
    tol = TOLERANCES[torch.float32]
    assert_close(loss, want, tol=tol, name="compiled loss")
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        assert_close(g, w, tol=tol, name=f"compiled grad {i}")
    torch._dynamo.reset()
