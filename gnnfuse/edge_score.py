"""GAT's per-edge score term formed from edge features in the attention kernels' CSR order (PyG GATConv's
``edge_dim``), with the self loops PyG adds: :func:`edge_score_csr`.

``ee [P, H]`` at the CSR positions ``p`` of the graph the attention runs over::

    ee_p = attr[src_edge[p]] · M                                  (src_edge[p] >= 0)
    ee_{loop(i)} = mean / sum of ee_p over i's other positions     ('mean' / 'add': PyG's reduction of the features,
                                                                    moved through the linear map onto the scores)
    ee_{loop(i)} = fill_row                                        (a constant fill, fill_value · M, every loop)

``attr [R, K]`` stays in the caller's edge order; ``M [K, H]`` folds ``lin_edge`` and ``att_edge``.  Two launches
(:mod:`gnnfuse.kernels.edge_score`) instead of a product in input order, a gather of the kept edges, the loops'
reduction by atomics, a concatenation and a gather into CSR order; the backward is one launch (``∂attr`` at the
features' own rows, ``∂M`` as per-program partials summed by :func:`fusecore.linear.column_sum`; each kept edge reads
its share of its destination's loop gradient itself).  ``ops.gat(..., edge_score=ee, edge_score_order="csr")``
takes the result as it is and hands its gradient back in the same order (no scatter).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from fusecore import backend, cdiv, next_power_of_2
from fusecore.linear import column_sum
from fusecore.rows import gather_rows

from . import ops
from .kernels.edge_score import (
    FILL_ADD,
    FILL_CONST,
    FILL_MEAN,
    edge_score_backward_kernel,
    edge_score_kernel,
    loop_score_kernel,
)

FILL_MODES = {"const": FILL_CONST, "mean": FILL_MEAN, "add": FILL_ADD}
# Positions per program (forward) and per block, blocks per program (backward: the ∂M partials), loop nodes per
# program of the fill, the largest feature chunk of one product (tl.dot takes dimensions of 16 and more).  H200,
# arxiv-like K=16 H=8 float32 (session 42, benchmarks/results/H200/gnn-edge-score-sweep.s42c5.log and
# gnn-pyg-edge-dim-prof.s42c4 / s42c6.log): forward 64 positions 91.1 µs as called, 32: 105.0, 128: 89.3 (noise
# apart); backward kernel 213.3 µs at 8 blocks of 64, 203.7 at 1 (profiles), and the fastest call as made (425.3 µs
# against 779.6).  Both kernels read at 26-37% of their bytes' floor: the feature rows are 64-byte gathers.
SCORE_BLOCK_P = 64
BACKWARD_BLOCKS = 1
LOOP_BLOCK_N = 128
BLOCK_K_MAX = 32
MIN_DOT = 16


class LoopFill(NamedTuple):
    """The self loops' rows of :func:`edge_score_csr`: ``mode`` ``'mean'`` / ``'add'`` / ``'const'``;
    ``loop_pos [L]`` (the CSR position of node ``i``'s loop, ``i < L``), the graph's ``csr_dst [P]`` (each
    position's destination, sorted), ``counts [≥ L]`` (each loop node's incoming kept edges), ``num_nodes``;
    ``fill_row [H]`` (``'const'``: the score every loop gets, differentiable), else None."""

    mode: str
    loop_pos: torch.Tensor
    csr_dst: torch.Tensor
    counts: torch.Tensor
    num_nodes: int
    fill_row: torch.Tensor | None = None


def _blocks(k: int, h: int) -> tuple[int, int]:
    return max(MIN_DOT, min(BLOCK_K_MAX, next_power_of_2(k))), max(MIN_DOT, next_power_of_2(h))


class EdgeScoreFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attr, fold, fill_row, src_edge, loops, acc):  # type: ignore[override]
        positions, (rows, k), h = src_edge.numel(), attr.shape, fold.shape[1]
        block_k, block_h = _blocks(k, h)
        ee = ops._new_output((positions, h), acc, attr.device)
        num_loops = 0 if loops is None else loops.loop_pos.numel()
        summed = num_loops > 0 and loops.mode != "const"
        sums = torch.zeros((loops.num_nodes, h), dtype=acc, device=attr.device) if summed else ee
        if positions:
            edge_score_kernel[(cdiv(positions, SCORE_BLOCK_P),)](
                attr, fold, src_edge, ee, loops.csr_dst if summed else src_edge, sums, positions, K=k, H=h,
                SUMS=summed, BLOCK_P=SCORE_BLOCK_P, BLOCK_K=block_k, BLOCK_H=block_h)
        if num_loops:
            fill = ee if fill_row is None else fill_row.to(acc).contiguous()
            loop_score_kernel[(cdiv(num_loops, LOOP_BLOCK_N),)](
                ee, sums, loops.counts, loops.loop_pos, fill, num_loops, H=h, MODE=FILL_MODES[loops.mode],
                BLOCK_N=LOOP_BLOCK_N, BLOCK_H=next_power_of_2(h))
        ctx.save_for_backward(attr, fold, src_edge)
        ctx.loops, ctx.num_loops, ctx.fill_dtype = loops, num_loops, None if fill_row is None else fill_row.dtype
        ctx.covers = positions - num_loops == rows  # every feature row read once: ∂attr needs no zero fill
        return ee

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        attr, fold, src_edge = ctx.saved_tensors
        loops, num_loops = ctx.loops, ctx.num_loops
        grad = grad.contiguous()
        positions, (rows, k), h = src_edge.numel(), attr.shape, fold.shape[1]
        spread, grad_fill = 0, None
        if num_loops and loops.mode == "const":
            if ctx.needs_input_grad[2]:
                grad_fill = gather_rows(grad, loops.loop_pos).sum(0).to(ctx.fill_dtype)
        elif num_loops:
            spread = FILL_MODES[loops.mode]  # each kept edge's share of its destination's loop gradient, in-kernel
        block_k, block_h = _blocks(k, h)
        programs = max(1, cdiv(positions, SCORE_BLOCK_P * BACKWARD_BLOCKS))
        grad_attr = (ops._new_output((rows, k), attr.dtype, attr.device) if ctx.covers
                     else torch.zeros((rows, k), dtype=attr.dtype, device=attr.device))
        parts = ops._new_output((programs, k * h), grad.dtype, grad.device)
        # the loops' indices, read only with SPREAD (any int tensor stands in without it)
        looped = (loops.csr_dst, loops.loop_pos, loops.counts) if spread else (src_edge,) * 3
        if positions:
            edge_score_backward_kernel[(programs,)](
                attr, fold, src_edge, *looped, grad, grad_attr, parts, positions, num_loops, K=k, H=h, SPREAD=spread,
                BLOCKS=BACKWARD_BLOCKS, BLOCK_P=SCORE_BLOCK_P, BLOCK_K=block_k, BLOCK_H=block_h)
        else:
            parts.zero_()
        grad_fold = column_sum(parts).view(k, h).to(fold.dtype)
        return grad_attr, grad_fold, grad_fill, None, None, None


@backend.eager_under_compile
def edge_score_csr(attr: torch.Tensor, fold: torch.Tensor, src_edge: torch.Tensor, loops: LoopFill | None = None
                   ) -> torch.Tensor:
    """``ee [P, H]`` in the accumulation dtype of ``attr`` (float32; float64 for float64), CSR order — see the
    module docstring; differentiable in ``attr``, ``fold`` and ``loops.fill_row``.

    ``attr [R, K]`` (float dtype), ``fold [K, H]`` (any float dtype, used in the accumulation dtype), ``src_edge
    [P]`` (int32/int64: the feature row of each position, ``-1`` exactly at the loops' positions, each row at most
    once), ``loops``: :class:`LoopFill` or None (no position is ``-1`` then).  The indices come from a
    :class:`gnnfuse.Graph` and its :meth:`~gnnfuse.Graph.pyg_self_loops` and are not checked on the device."""
    acc = torch.float64 if attr.dtype == torch.float64 else torch.float32
    _check(attr, fold, src_edge, loops)
    if backend.reference_enabled() or not backend.on_kernel_device(attr):
        return _edge_score_reference(attr, fold.to(acc), src_edge, loops, acc)
    fill_row = None if loops is None else loops.fill_row
    return EdgeScoreFunction.apply(attr.contiguous(), fold.to(acc).contiguous(), fill_row, src_edge.contiguous(),
                                   loops, acc)


def _check(attr: torch.Tensor, fold: torch.Tensor, src_edge: torch.Tensor, loops: LoopFill | None) -> None:
    """Shapes, dtypes and devices of :func:`edge_score_csr`'s arguments, each named (index values are not read)."""
    if not isinstance(attr, torch.Tensor) or attr.dim() != 2 or not attr.is_floating_point():
        raise ValueError(f"attr must be a float tensor [rows, K], got {getattr(attr, 'dtype', type(attr).__name__)} "
                         f"{list(getattr(attr, 'shape', []))}")
    if not isinstance(fold, torch.Tensor) or fold.dim() != 2 or fold.shape[0] != attr.shape[1] or (
            not fold.is_floating_point()):
        raise ValueError(f"fold must be a float tensor [K, H] with K = attr's {attr.shape[1]} columns, got "
                         f"{list(getattr(fold, 'shape', []))}")
    if not isinstance(src_edge, torch.Tensor) or src_edge.dim() != 1 or src_edge.dtype not in (torch.int32,
                                                                                               torch.int64):
        raise ValueError("src_edge must be a 1-D int32 or int64 tensor (a feature row per CSR position)")
    named = {"attr": attr, "fold": fold, "src_edge": src_edge}
    if loops is not None:
        if loops.mode not in FILL_MODES:
            raise ValueError(f"loops.mode must be one of {sorted(FILL_MODES)}, got {loops.mode!r}")
        positions, num_loops = src_edge.numel(), loops.loop_pos.numel()
        if loops.csr_dst.numel() != positions or num_loops > positions or loops.counts.numel() < num_loops or (
                loops.num_nodes < num_loops):
            raise ValueError(f"loops do not fit the graph: csr_dst has {loops.csr_dst.numel()} entries for "
                             f"{positions} positions, {num_loops} loops, {loops.counts.numel()} counts, "
                             f"{loops.num_nodes} nodes")
        if (loops.mode == "const") != (loops.fill_row is not None):
            raise ValueError("loops.fill_row goes with mode 'const', and only with it")
        if loops.fill_row is not None and tuple(loops.fill_row.shape) != (fold.shape[1],):
            raise ValueError(f"loops.fill_row must have shape [H] = [{fold.shape[1]}], got "
                             f"{list(loops.fill_row.shape)}")
        named.update(loop_pos=loops.loop_pos, csr_dst=loops.csr_dst, counts=loops.counts, fill_row=loops.fill_row)
    for name, tensor in named.items():
        if tensor is not None and tensor.device != attr.device:
            raise ValueError(f"{name} is on '{tensor.device}' but attr is on '{attr.device}'")


def _edge_score_reference(attr, fold, src_edge, loops, acc):
    """:func:`edge_score_csr` in torch ops (differentiable): the scores per position, then the loops' rows."""
    index = src_edge.to(torch.int64)
    kept = index >= 0
    ee = (attr.to(acc)[index.clamp(min=0)] @ fold) * kept[:, None]
    if loops is None or loops.loop_pos.numel() == 0:
        return ee
    pos, num_nodes = loops.loop_pos.to(torch.int64), loops.num_nodes
    if loops.mode == "const":
        rows = loops.fill_row.to(acc).expand(pos.numel(), ee.shape[1])
    else:
        dst = loops.csr_dst.to(torch.int64)
        sums = ee.new_zeros((num_nodes, ee.shape[1])).index_add(0, dst[kept], ee[kept])[: pos.numel()]
        rows = sums / loops.counts[: pos.numel()].clamp(min=1).to(acc)[:, None] if loops.mode == "mean" else sums
    return ee.index_put((pos,), rows)
