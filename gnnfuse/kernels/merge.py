"""Merging the pieces of split super rows: logsumexp combine (forward) and sums (backward).

A super row ``i`` was cut into pieces ``k`` (contiguous in piece order, ``piece_ptr[s] :
piece_ptr[s + 1]`` for the ``s``-th super row), each with a normalized partial output
``o_k [H, D]`` and its logsumexp ``lse_k [H]``.  The exact result is::

    lse_i = logsumexp_k lse_k,      out_i = Σ_k exp(lse_k − lse_i) o_k

(:mod:`fusecore.softmax`), here computed online over blocks of ``BLOCK_P`` pieces (running
maximum and rescaled sums, as in the forward kernel) so a row split into thousands of pieces
takes a few dozen loop trips.  Backward partials are plain sums: ``g_i = Σ_k g_k``.  Bytes: the
partials read once, one row written.

Two ways to run a merge: a launch of its own after the pieces' launch (one program per super row:
``lse_merge_kernel``, ``sum_merge_kernel``), or inside the pieces' launch, by the last piece of each
super row to finish (:func:`last_piece`, which also sets its row's count back to zero, then
:func:`merge_lse` / :func:`merge_sums`; a launch fewer, and the merge starts as soon as its row's pieces are
done).  The loads of the partials bypass L1 (``.cg``) either way: in the second form other multiprocessors stored
them during the same launch.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.grid_sync import last_to_arrive
from fusecore.softmax import online_rescale

from .tiles import finish_softmax, head_tile, store_output


@jit
def last_piece(pid, piece_super_ptr, piece_ptr, count_ptr):
    """After piece ``pid`` stored its partial: ``(last, first, end)`` — whether it is the last of its super row's
    pieces to finish (counted in at ``count_ptr[s]``, zero when the launch starts;
    :func:`fusecore.grid_sync.last_to_arrive`) and that row's piece range ``first : end`` (``s = piece_super[pid]``).
    The last piece sets the count back to zero, so the counts are zero again when the launch ends and one buffer
    serves every launch on a stream (:func:`fusecore.scratch.zeroed`)."""
    s = tl.load(piece_super_ptr + pid).to(tl.int64)
    first = tl.load(piece_ptr + s).to(tl.int64)
    end = tl.load(piece_ptr + s + 1).to(tl.int64)
    last = last_to_arrive(count_ptr + s, (end - first).to(tl.int32))
    tl.atomic_xchg(count_ptr + s, 0, mask=last, sem="relaxed", scope="gpu")
    return last, first, end


@jit
def merge_lse(first, last, row, part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, add_ptr, final_ptr, H, D, add_stride,
              BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, ADD: tl.constexpr,
              FINAL: tl.constexpr):
    """Row ``row``'s output and logsumexp from its pieces ``first : last``, ``BLOCK_P`` pieces at a time with an
    online rescale (``ADD``, ``FINAL``: the row's ``add`` term and second output, as in
    :mod:`gnnfuse.kernels.attention_forward`)."""
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    offs_p = tl.arange(0, BLOCK_P)
    HD = H * D
    acc_dtype = part_lse_ptr.dtype.element_ty
    m = tl.full([BLOCK_H], float("-inf"), dtype=acc_dtype)
    total = tl.zeros([BLOCK_H], dtype=acc_dtype)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=acc_dtype)
    for k0 in range(first, last, BLOCK_P):
        k = k0 + offs_p
        p_mask = k < last
        lse_k = tl.load(part_lse_ptr + k[:, None] * H + offs_h[None, :],
                        mask=p_mask[:, None] & h_mask[None, :], other=float("-inf"), cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(lse_k, axis=0))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        rescale = online_rescale(m, m_safe)
        weight = online_rescale(lse_k, m_safe[None, :])
        part = tl.load(part_out_ptr + k[:, None, None] * HD + hd_offs[None, :, :],
                       mask=p_mask[:, None, None] & hd_mask[None, :, :], other=0.0, cache_modifier=".cg")
        total = total * rescale + tl.sum(weight, axis=0)
        acc = acc * rescale[:, None] + tl.sum(weight[:, :, None] * part, axis=0)
        m = m_new
    out, lse = finish_softmax(acc, m, total)
    store_output(out_ptr, final_ptr, add_ptr, out, row * HD + hd_offs, row * add_stride + hd_offs, hd_mask, ADD, FINAL)
    tl.store(lse_ptr + row * H + offs_h, lse.to(lse_ptr.dtype.element_ty), mask=h_mask)


@jit
def merge_sums(first, last, row, part_ptr, out_ptr, W, out_stride, BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr,
               add_ptr=None, ADD: tl.constexpr = False):
    """out[row, :W] = Σ over pieces ``first : last`` of part[piece, :W], ``BLOCK_P`` pieces at a time (``out``'s rows
    ``out_stride`` elements apart); ``ADD``: plus ``add[row, :W]`` (rows ``out_stride`` apart, as ``out``'s)."""
    offs_p = tl.arange(0, BLOCK_P)
    for w0 in range(0, W, BLOCK_W):
        offs_w = w0 + tl.arange(0, BLOCK_W)
        w_mask = offs_w < W
        if ADD:
            acc = tl.load(add_ptr + row * out_stride + offs_w, mask=w_mask, other=0.0).to(part_ptr.dtype.element_ty)
        else:
            acc = tl.zeros([BLOCK_W], dtype=part_ptr.dtype.element_ty)
        for k0 in range(first, last, BLOCK_P):
            k = k0 + offs_p
            values = tl.load(part_ptr + k[:, None] * W + offs_w[None, :],
                             mask=(k < last)[:, None] & w_mask[None, :], other=0.0, cache_modifier=".cg")
            acc += tl.sum(values, axis=0)
        tl.store(out_ptr + row * out_stride + offs_w, acc.to(out_ptr.dtype.element_ty), mask=w_mask)


@jit
def lse_merge_kernel(
    piece_ptr, rows_ptr, part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, add_ptr, final_ptr, H, D, add_stride,
    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, ADD: tl.constexpr, FINAL: tl.constexpr,
):
    """One super row per program (:func:`merge_lse`)."""
    pid = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + pid).to(tl.int64)
    first = tl.load(piece_ptr + pid).to(tl.int64)
    last = tl.load(piece_ptr + pid + 1).to(tl.int64)
    merge_lse(first, last, row, part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, add_ptr, final_ptr, H, D, add_stride,
              BLOCK_P, BLOCK_H, BLOCK_D, ADD, FINAL)


@jit
def sum_merge_kernel(piece_ptr, rows_ptr, part_ptr, out_ptr, W, out_stride, BLOCK_P: tl.constexpr,
                     BLOCK_W: tl.constexpr, add_ptr=None, ADD: tl.constexpr = False):
    """One super row per program (:func:`merge_sums`, ``ADD``: plus ``add``'s row)."""
    pid = tl.program_id(0).to(tl.int64)
    row = tl.load(rows_ptr + pid).to(tl.int64)
    first = tl.load(piece_ptr + pid).to(tl.int64)
    last = tl.load(piece_ptr + pid + 1).to(tl.int64)
    merge_sums(first, last, row, part_ptr, out_ptr, W, out_stride, BLOCK_P, BLOCK_W, add_ptr, ADD)
