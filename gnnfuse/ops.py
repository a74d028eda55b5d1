"""Launchers and autograd for the fused GAT attention: shapes checked, schedule applied.

Two public functions, for users with their own projections:

* :func:`gat_attention` ``(graph, wh, el, er)`` — the fused attention given the per-node
  terms ``el = a_l · Wh`` (source side) and ``er = a_r · Wh`` (destination side);
* :func:`gat` ``(graph, wh, attn_l, attn_r)`` — the same with ``el`` / ``er`` computed once per
  node by a kernel, as one autograd op whose backward folds the node scores' gradient into
  the feature gradient (one epilogue kernel).

Launch sequence of one forward: node scores (``gat`` only), the light width classes, the
medium rows, the super-row pieces and their logsumexp merge.  Backward: ``δ = <g, out>``,
the source pass over the reverse CSR (light, medium, pieces + sums), the per-destination
sum of ``∂z`` (light, medium, pieces + sums) and, for ``gat``, the node-score epilogue.
Small graphs on the GPU use the row kernel alone: one launch per pass.

Both return ``out [N, H, D]`` in the dtype of ``wh`` with ``out_i = Σ_{j->i} α_ij Wh_j`` and
``α_i· = softmax_j LeakyReLU(el_j + er_i)`` per head, and are differentiable in every tensor
argument.  Under :func:`fusecore.use_reference` they run :mod:`gnnfuse.reference` instead.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from fusecore import PhiloxStream, backend, cdiv, next_power_of_2

from .graph import Graph, as_graph
from .schedule import Buckets, ScheduleOptions

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MERGE_TILE = 4096  # elements of partial results a merge program reads per loop trip
ROW_SUM_MAX_EDGES = 256  # edges per loop trip of the ∂er row sum (its rows are only H wide)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 features, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _new_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate a tensor the kernels fill completely (tests replace this with a poisoned fill)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _row_launches(buckets: Buckets):
    """(rows, starts, stops, count, pieces) for the medium rows and the super pieces."""
    rows, starts, stops = buckets.medium
    if rows.numel():
        yield rows, starts, stops, rows.numel(), False
    if buckets.num_pieces:
        yield buckets.piece_row, buckets.piece_start, buckets.piece_stop, buckets.num_pieces, True


def _dropout_args(dropout_p: float) -> tuple[float, bool]:
    return (1.0 / (1.0 - dropout_p) if dropout_p > 0 else 1.0), dropout_p > 0


def gat_forward(
    graph: Graph, wh: torch.Tensor, el: torch.Tensor, er: torch.Tensor, negative_slope: float,
    dropout_p: float, seed: int, offset: int, options: ScheduleOptions | None, out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the fused forward on checked, contiguous inputs; returns ``(out, lse)``.

    ``out`` is written in ``out_dtype`` (default: ``wh``'s dtype; the backward asks for the
    accumulation dtype so that ``δ = <g, out>`` is not computed from a rounded output).
    """
    from .kernels.gat_forward import gat_forward_light_kernel, gat_forward_rows_kernel
    from .kernels.merge import lse_merge_kernel

    num_nodes, heads, head_dim = wh.shape
    acc = el.dtype
    out = _new_output(tuple(wh.shape), out_dtype or wh.dtype, wh.device)
    lse = _new_output((num_nodes, heads), acc, wh.device)
    if num_nodes == 0:
        return out, lse
    schedule = graph.schedule(heads, head_dim, wh.dtype, options)
    block_h, block_d = schedule.block_h, schedule.block_d
    keep_scale, use_dropout = _dropout_args(dropout_p)
    rng_args = (negative_slope, dropout_p, keep_scale, seed, offset)
    buckets = schedule.incoming
    for width, rows, starts, stops in buckets.light:
        per_program = schedule.light_rows_per_program(width, block_h * block_d)
        gat_forward_light_kernel[(cdiv(rows.numel(), per_program),)](
            graph.csr_src, rows, starts, stops, el, er, wh, out, lse, rows.numel(), heads, head_dim, *rng_args,
            ROWS=per_program, BLOCK_E=width, BLOCK_H=block_h, BLOCK_D=block_d, DROPOUT=use_dropout,
        )
    for rows, starts, stops, count, pieces in _row_launches(buckets):
        if pieces:
            target_out = _new_output((count, heads, head_dim), acc, wh.device)
            target_lse = _new_output((count, heads), acc, wh.device)
        else:
            target_out, target_lse = out, lse
        gat_forward_rows_kernel[(count,)](
            graph.csr_src, rows, starts, stops, el, er, wh, target_out, target_lse,
            heads, head_dim, *rng_args,
            BLOCK_E=schedule.medium_block_e, BLOCK_H=block_h, BLOCK_D=block_d, PIECES=pieces, DROPOUT=use_dropout,
        )
        if pieces:
            lse_merge_kernel[(buckets.super_rows.numel(),)](
                buckets.super_piece_ptr, buckets.super_rows, target_out, target_lse, out, lse, heads, head_dim,
                BLOCK_P=max(1, MERGE_TILE // (block_h * block_d)), BLOCK_H=block_h, BLOCK_D=block_d,
            )
    return out, lse


def _merge_sums(buckets: Buckets, part: torch.Tensor, out: torch.Tensor) -> None:
    from .kernels.merge import sum_merge_kernel

    width = part[0].numel()
    block_w = min(1024, next_power_of_2(width))
    sum_merge_kernel[(buckets.super_rows.numel(),)](
        buckets.super_piece_ptr, buckets.super_rows, part, out, width,
        BLOCK_P=max(1, MERGE_TILE // block_w), BLOCK_W=block_w,
    )


def gat_backward(
    graph: Graph, wh: torch.Tensor, el: torch.Tensor, er: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
    grad_out: torch.Tensor, negative_slope: float, dropout_p: float, seed: int, offset: int,
    options: ScheduleOptions | None, grad_wh_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(∂wh, ∂el, ∂er)`` of the fused attention, without atomics (``∂wh`` in
    ``grad_wh_dtype``, default ``wh``'s dtype)."""
    from .kernels.gat_backward import (
        gat_backward_src_kernel,
        gat_backward_src_light_kernel,
        row_sum_kernel,
        row_sum_light_kernel,
    )

    num_nodes, heads, head_dim = wh.shape
    acc = el.dtype
    grad_wh = _new_output(tuple(wh.shape), grad_wh_dtype or wh.dtype, wh.device)
    grad_el = _new_output((num_nodes, heads), acc, wh.device)
    grad_er = _new_output((num_nodes, heads), acc, wh.device)
    if num_nodes == 0:
        return grad_wh, grad_el, grad_er
    schedule = graph.schedule(heads, head_dim, wh.dtype, options)
    block_h, block_d = schedule.block_h, schedule.block_d
    keep_scale, use_dropout = _dropout_args(dropout_p)
    rng_args = (negative_slope, dropout_p, keep_scale, seed, offset)
    # δ_i = <g_i, out_i> per head: one pass over node rows instead of one over edges.
    delta = _head_dot(grad_out, out, acc)
    grad_z = _new_output((max(graph.num_edges, 1), heads), acc, wh.device)
    src_tensors = (el, er, wh, lse, grad_out, delta)
    outgoing = schedule.outgoing
    for width, rows, starts, stops in outgoing.light:
        # two feature tiles live at once (output gradients and own features): half the rows
        per_program = schedule.light_rows_per_program(width, 2 * block_h * block_d)
        gat_backward_src_light_kernel[(cdiv(rows.numel(), per_program),)](
            graph.rev_dst, graph.rev_pos, rows, starts, stops, *src_tensors, grad_wh, grad_el, grad_z,
            rows.numel(), heads, head_dim, *rng_args,
            ROWS=per_program, BLOCK_E=width, BLOCK_H=block_h, BLOCK_D=block_d, DROPOUT=use_dropout,
        )
    for rows, starts, stops, count, pieces in _row_launches(outgoing):
        if pieces:
            target_wh = _new_output((count, heads, head_dim), acc, wh.device)
            target_el = _new_output((count, heads), acc, wh.device)
        else:
            target_wh, target_el = grad_wh, grad_el
        gat_backward_src_kernel[(count,)](
            graph.rev_dst, graph.rev_pos, rows, starts, stops, *src_tensors,
            target_wh, target_el, grad_z, heads, head_dim, *rng_args,
            BLOCK_E=schedule.medium_block_e, BLOCK_H=block_h, BLOCK_D=block_d, PIECES=pieces, DROPOUT=use_dropout,
        )
        if pieces:
            _merge_sums(outgoing, target_wh, grad_wh)
            _merge_sums(outgoing, target_el, grad_el)
    incoming = schedule.incoming
    for width, rows, starts, stops in incoming.light:
        per_program = schedule.light_rows_per_program(width, block_h)
        row_sum_light_kernel[(cdiv(rows.numel(), per_program),)](
            rows, starts, stops, grad_z, grad_er, rows.numel(), heads,
            ROWS=per_program, BLOCK_E=width, BLOCK_W=block_h,
        )
    for rows, starts, stops, count, pieces in _row_launches(incoming):
        target_er = _new_output((count, heads), acc, wh.device) if pieces else grad_er
        row_sum_kernel[(count,)](
            rows, starts, stops, grad_z, target_er, heads,
            BLOCK_E=max(16, min(ROW_SUM_MAX_EDGES, schedule.tiles.tile_elements // block_h)), BLOCK_W=block_h,
            PIECES=pieces,
        )
        if pieces:
            _merge_sums(incoming, target_er, grad_er)
    return grad_wh, grad_el, grad_er


class GATAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: forward saves ``wh, el, er, out, lse`` (no per-edge tensor).

    When gradients are needed, ``out`` is kept in the accumulation dtype for the backward's
    ``δ = <g, out>`` (float16 / bfloat16 rounding of ``out`` would be amplified by the
    softmax-gradient cancellation); the returned output is cast to ``wh``'s dtype.
    """

    @staticmethod
    def forward(ctx, wh, el, er, graph, negative_slope, dropout_p, seed, offset, options):  # type: ignore[override]
        training = any(ctx.needs_input_grad[:3])
        out_dtype = el.dtype if training else wh.dtype
        out, lse = gat_forward(graph, wh, el, er, negative_slope, dropout_p, seed, offset, options, out_dtype)
        ctx.save_for_backward(wh, el, er, out, lse)
        ctx.graph = graph
        ctx.config = (negative_slope, dropout_p, seed, offset, options)
        return out.to(wh.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        wh, el, er, out, lse = ctx.saved_tensors
        negative_slope, dropout_p, seed, offset, options = ctx.config
        grad_wh, grad_el, grad_er = gat_backward(
            ctx.graph, wh, el, er, lse, out, grad_out.contiguous(), negative_slope, dropout_p, seed, offset, options
        )
        return grad_wh, grad_el, grad_er, None, None, None, None, None, None


def _check_wh(graph: Graph, wh: torch.Tensor) -> None:
    if wh.dim() != 3:
        raise ValueError(f"wh must have shape [num_nodes, heads, head_dim], got {tuple(wh.shape)}")
    num_nodes, heads, head_dim = wh.shape
    if num_nodes != graph.num_nodes:
        raise ValueError(f"wh has {num_nodes} rows but the graph has num_nodes={graph.num_nodes}")
    if heads < 1 or head_dim < 1:
        raise ValueError(f"wh must have at least one head and head_dim >= 1, got shape {tuple(wh.shape)}")


def _check_features(graph: Graph, wh: torch.Tensor, el: torch.Tensor, er: torch.Tensor) -> None:
    # el / er may differ from wh (they are cast to the accumulation dtype), so no "same" check.
    backend.check_dtypes(FLOAT_DTYPES, same=False, wh=wh, el=el, er=er)
    _check_wh(graph, wh)
    num_nodes, heads = wh.shape[0], wh.shape[1]
    for name, t in (("el", el), ("er", er)):
        if tuple(t.shape) != (num_nodes, heads):
            raise ValueError(f"{name} must have shape [num_nodes, heads] = {[num_nodes, heads]}, got {list(t.shape)}")


def _check_dropout(dropout: float) -> float:
    if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0 and math.isfinite(dropout)):
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    return float(dropout)


def gat_attention(
    graph,
    wh: torch.Tensor,
    el: torch.Tensor,
    er: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    rng: PhiloxStream | None = None,
    schedule: ScheduleOptions | None = None,
) -> torch.Tensor:
    """Fused GAT attention over ``graph`` given per-node scores.

    ``wh``: ``[N, H, D]`` projected features (float16 / bfloat16 / float32 / float64);
    ``el``, ``er``: ``[N, H]`` source and destination terms (``a_l · Wh``, ``a_r · Wh``),
    cast to the accumulation dtype (float32, float64 for float64 features).
    ``dropout``: attention dropout probability; the mask for the edge at CSR position ``p``
    and head ``h`` is ``uniform(seed, p, offset + h) >= dropout`` where ``(seed, offset) =
    rng.take(H)`` (``rng`` default: a stream seeded from torch's generator).
    ``schedule``: :class:`~gnnfuse.schedule.ScheduleOptions` forcing the degree buckets.
    Returns ``out [N, H, D]`` in ``wh``'s dtype; nodes without incoming edges get zeros.
    """
    graph = as_graph(graph)
    _check_features(graph, wh, el, er)
    dropout = _check_dropout(dropout)
    acc = accumulation_dtype(wh.dtype)
    el = el.to(acc).contiguous()
    er = er.to(acc).contiguous()
    wh = wh.contiguous()
    seed, offset = _rng_pair(rng, dropout, wh.shape[1])
    if backend.reference_enabled():
        from .reference import gat_attention_reference

        return gat_attention_reference(
            graph, wh, el, er, negative_slope=negative_slope, dropout=dropout, seed=seed, offset=offset
        )[0].to(wh.dtype)
    backend.check_devices(wh=wh, el=el, er=er, graph=graph.indptr)
    return GATAttentionFunction.apply(wh, el, er, graph, float(negative_slope), dropout, seed, offset, schedule)


def _node_tile_rows(heads: int, head_dim: int) -> tuple[int, int, int]:
    """(block_h, block_d, rows per program) of the per-node kernels: ~4096-element tiles."""
    block_h, block_d = next_power_of_2(heads), next_power_of_2(head_dim)
    return block_h, block_d, max(1, min(256, 4096 // (block_h * block_d)))


def _head_dot(a: torch.Tensor, b: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``Σ_d a · b`` per (node, head) of two contiguous ``[N, H, D]`` tensors, in ``acc``."""
    from .kernels.node_scores import head_dot_kernel

    num_nodes, heads, head_dim = a.shape
    out = _new_output((num_nodes, heads), acc, a.device)
    block_h, block_d, rows = _node_tile_rows(heads, head_dim)
    if num_nodes:
        head_dot_kernel[(cdiv(num_nodes, rows),)](
            a, b, out, num_nodes, heads, head_dim, ROWS=rows, BLOCK_H=block_h, BLOCK_D=block_d,
        )
    return out


def _node_scores_forward(wh: torch.Tensor, attn_l: torch.Tensor, attn_r: torch.Tensor):
    from .kernels.node_scores import node_scores_kernel

    num_nodes, heads, head_dim = wh.shape
    acc = accumulation_dtype(wh.dtype)
    el = _new_output((num_nodes, heads), acc, wh.device)
    er = _new_output((num_nodes, heads), acc, wh.device)
    block_h, block_d, rows = _node_tile_rows(heads, head_dim)
    if num_nodes:
        node_scores_kernel[(cdiv(num_nodes, rows),)](
            wh, attn_l.contiguous(), attn_r.contiguous(), el, er, num_nodes, heads, head_dim,
            ROWS=rows, BLOCK_H=block_h, BLOCK_D=block_d,
        )
    return el, er


def _node_scores_backward(wh, attn_l, attn_r, grad_el, grad_er, grad_agg):
    """(grad_wh, grad_attn_l, grad_attn_r): ``grad_agg`` plus the node scores' share, in one kernel."""
    from .kernels.node_scores import node_scores_backward_kernel

    num_nodes, heads, head_dim = wh.shape
    acc = accumulation_dtype(wh.dtype)
    block_h, block_d, rows = _node_tile_rows(heads, head_dim)
    programs = cdiv(num_nodes, rows)
    grad_wh = grad_agg if grad_agg.dtype == wh.dtype else _new_output(tuple(wh.shape), wh.dtype, wh.device)
    part_l = _new_output((programs, heads, head_dim), acc, wh.device)
    part_r = _new_output((programs, heads, head_dim), acc, wh.device)
    if programs:
        node_scores_backward_kernel[(programs,)](
            wh, attn_l.contiguous(), attn_r.contiguous(), grad_el.contiguous(), grad_er.contiguous(), grad_agg,
            grad_wh, part_l, part_r, num_nodes, heads, head_dim, ROWS=rows, BLOCK_H=block_h, BLOCK_D=block_d,
        )
    grad_attn_l = part_l.sum(0, keepdim=True).to(attn_l.dtype)
    grad_attn_r = part_r.sum(0, keepdim=True).to(attn_r.dtype)
    return grad_wh, grad_attn_l, grad_attn_r


class NodeScoresFunction(torch.autograd.Function):
    """``(el, er)`` from ``wh [N, H, D]`` and ``attn_l``, ``attn_r`` ``(1, H, D)`` in one kernel."""

    @staticmethod
    def forward(ctx, wh, attn_l, attn_r):  # type: ignore[override]
        ctx.save_for_backward(wh, attn_l, attn_r)
        return _node_scores_forward(wh, attn_l, attn_r)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_el, grad_er):  # type: ignore[override]
        wh, attn_l, attn_r = ctx.saved_tensors
        acc = accumulation_dtype(wh.dtype)
        grad_el = torch.zeros(wh.shape[:2], dtype=acc, device=wh.device) if grad_el is None else grad_el.to(acc)
        grad_er = torch.zeros(wh.shape[:2], dtype=acc, device=wh.device) if grad_er is None else grad_er.to(acc)
        return _node_scores_backward(wh, attn_l, attn_r, grad_el, grad_er, torch.zeros_like(wh))


class GATFunction(torch.autograd.Function):
    """The whole GAT op from ``(wh, attn_l, attn_r)``: node scores, fused attention, and in the
    backward the attention gradients and the node scores' share merged in one epilogue kernel."""

    @staticmethod
    def forward(ctx, wh, attn_l, attn_r, graph, negative_slope, dropout_p, seed, offset, options):  # type: ignore[override]
        el, er = _node_scores_forward(wh, attn_l, attn_r)
        training = any(ctx.needs_input_grad[:3])
        out_dtype = el.dtype if training else wh.dtype
        out, lse = gat_forward(graph, wh, el, er, negative_slope, dropout_p, seed, offset, options, out_dtype)
        ctx.save_for_backward(wh, attn_l, attn_r, el, er, out, lse)
        ctx.graph = graph
        ctx.config = (negative_slope, dropout_p, seed, offset, options)
        return out.to(wh.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        wh, attn_l, attn_r, el, er, out, lse = ctx.saved_tensors
        negative_slope, dropout_p, seed, offset, options = ctx.config
        grad_agg, grad_el, grad_er = gat_backward(
            ctx.graph, wh, el, er, lse, out, grad_out.contiguous(), negative_slope, dropout_p, seed, offset, options,
            grad_wh_dtype=el.dtype,
        )
        grad_wh, grad_attn_l, grad_attn_r = _node_scores_backward(wh, attn_l, attn_r, grad_el, grad_er, grad_agg)
        return grad_wh, grad_attn_l, grad_attn_r, None, None, None, None, None, None


def _check_attention_vectors(heads: int, head_dim: int, attn_l, attn_r) -> None:
    for name, a in (("attn_l", attn_l), ("attn_r", attn_r)):
        if not isinstance(a, torch.Tensor) or a.numel() != heads * head_dim:
            shape = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            raise ValueError(f"{name} must have {heads} x {head_dim} elements (shape (1, H, D)), got {shape}")


def _rng_pair(rng: PhiloxStream | None, dropout: float, heads: int) -> tuple[int, int]:
    """(seed, offset) of one launch: ``heads`` positions taken from ``rng`` when dropout is on."""
    if dropout <= 0:
        return 0, 0
    return (rng or PhiloxStream.from_torch()).take(heads)


def node_scores(wh: torch.Tensor, attn_l: torch.Tensor, attn_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``el = Σ_d wh · attn_l``, ``er = Σ_d wh · attn_r`` per (node, head), in the accumulation dtype.

    One kernel reads ``wh`` once (:mod:`gnnfuse.kernels.node_scores`); under
    :func:`fusecore.use_reference` the same sums in PyTorch.
    """
    acc = accumulation_dtype(wh.dtype)
    heads, head_dim = wh.shape[1], wh.shape[2]
    _check_attention_vectors(heads, head_dim, attn_l, attn_r)
    attn_l = attn_l.reshape(1, heads, head_dim)
    attn_r = attn_r.reshape(1, heads, head_dim)
    if backend.reference_enabled():
        wh_acc = wh.to(acc)
        return (wh_acc * attn_l.to(acc)).sum(-1), (wh_acc * attn_r.to(acc)).sum(-1)
    backend.check_devices(wh=wh, attn_l=attn_l, attn_r=attn_r)
    return NodeScoresFunction.apply(wh.contiguous(), attn_l, attn_r)


def gat(
    graph,
    wh: torch.Tensor,
    attn_l: torch.Tensor,
    attn_r: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    rng: PhiloxStream | None = None,
    schedule: ScheduleOptions | None = None,
) -> torch.Tensor:
    """GAT attention from projected features and attention vectors ``attn_l``, ``attn_r`` ``(1, H, D)``.

    Same result as :func:`gat_attention` with ``el``, ``er`` from :func:`node_scores`, as one
    autograd op: the node scores' backward is folded into the feature gradient's epilogue.
    """
    graph = as_graph(graph)
    backend.check_dtypes(FLOAT_DTYPES, same=False, wh=wh, attn_l=attn_l, attn_r=attn_r)
    _check_wh(graph, wh)
    if backend.reference_enabled():
        el, er = node_scores(wh, attn_l, attn_r)
        return gat_attention(
            graph, wh, el, er, negative_slope=negative_slope, dropout=dropout, rng=rng, schedule=schedule
        )
    heads, head_dim = wh.shape[1], wh.shape[2]
    _check_attention_vectors(heads, head_dim, attn_l, attn_r)
    dropout = _check_dropout(dropout)
    seed, offset = _rng_pair(rng, dropout, heads)
    backend.check_devices(wh=wh, attn_l=attn_l, attn_r=attn_r, graph=graph.indptr)
    return GATFunction.apply(
        wh.contiguous(), attn_l.reshape(1, heads, head_dim), attn_r.reshape(1, heads, head_dim), graph,
        float(negative_slope), dropout, seed, offset, schedule,
    )


def gat_floor_bytes(graph: Graph, heads: int, head_dim: int, dtype: torch.dtype, backward: bool = False) -> int:
    """The gather floor of TARGETS.md: fewest bytes a GAT attention must move.

    Forward: ``E·H·D`` gathered feature elements + the CSR index (``E`` source ids and
    ``N + 1`` offsets) + the ``N·H·D`` output.  With ``backward``: twice that (the backward
    gathers ``E·H·D`` output gradients over the reverse CSR and writes ``N·H·D`` input
    gradients) — the per-node score vectors are lower-order terms and left out.
    """
    element = torch.empty((), dtype=dtype).element_size()
    index = graph.csr_src.element_size() * graph.num_edges + graph.indptr.element_size() * (graph.num_nodes + 1)
    forward = graph.num_edges * heads * head_dim * element + index + graph.num_nodes * heads * head_dim * element
    return 2 * forward if backward else forward
