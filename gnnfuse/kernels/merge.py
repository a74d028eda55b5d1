"""Merging the pieces of split super rows: logsumexp combine (forward) and sums (backward).

A super row ``i`` was cut into pieces ``k`` (contiguous in piece order, ``piece_ptr[s] :
piece_ptr[s + 1]`` for the ``s``-th super row), each with a normalized partial output
``o_k [H, D]`` and its logsumexp ``lse_k [H]``.  The exact result is::

    lse_i = logsumexp_k lse_k,      out_i = Σ_k exp(lse_k − lse_i) o_k

(:mod:`fusecore.softmax`).  Backward partials are plain sums: ``g_i = Σ_k g_k``.
One program per super row; bytes: the partials read once, one row written.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.softmax import lse_add

from .tiles import head_tile


@jit
def lse_merge_kernel(
    piece_ptr, rows_ptr, part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, H, D,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + pid).to(tl.int64)
    first = tl.load(piece_ptr + pid).to(tl.int64)
    last = tl.load(piece_ptr + pid + 1).to(tl.int64)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    acc_dtype = part_lse_ptr.dtype.element_ty
    total = tl.full([BLOCK_H], float("-inf"), dtype=acc_dtype)
    for k in range(first, last):
        lse_k = tl.load(part_lse_ptr + k * H + offs_h, mask=h_mask, other=float("-inf"))
        total = lse_add(total, lse_k)
    finite = total > float("-inf")
    safe_total = tl.where(finite, total, 0.0)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=acc_dtype)
    for k in range(first, last):
        lse_k = tl.load(part_lse_ptr + k * H + offs_h, mask=h_mask, other=float("-inf"))
        weight = tl.where(finite, tl.exp(lse_k - safe_total), 0.0)
        part = tl.load(part_out_ptr + k * HD + hd_offs, mask=hd_mask, other=0.0)
        acc += weight[:, None] * part
    tl.store(out_ptr + row * HD + hd_offs, acc.to(out_ptr.dtype.element_ty), mask=hd_mask)
    tl.store(lse_ptr + row * H + offs_h, total.to(lse_ptr.dtype.element_ty), mask=h_mask)


@jit
def sum_merge_kernel(piece_ptr, rows_ptr, part_ptr, out_ptr, W, BLOCK_W: tl.constexpr):
    """out[row, :W] = Σ over the row's pieces of part[piece, :W] (accumulated in part's dtype)."""
    pid = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + pid).to(tl.int64)
    first = tl.load(piece_ptr + pid).to(tl.int64)
    last = tl.load(piece_ptr + pid + 1).to(tl.int64)
    for w0 in range(0, W, BLOCK_W):
        offs = w0 + tl.arange(0, BLOCK_W)
        mask = offs < W
        acc = tl.zeros([BLOCK_W], dtype=part_ptr.dtype.element_ty)
        for k in range(first, last):
            acc += tl.load(part_ptr + k * W + offs, mask=mask, other=0.0)
        tl.store(out_ptr + row * W + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
