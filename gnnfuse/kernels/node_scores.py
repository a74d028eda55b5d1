"""Per-node attention terms of GAT, both sides in one read of the projected features.

(:func:`node_scores_kernel`, and its backward :func:`node_scores_backward_kernel`.)

For every node ``n`` and head ``h``::

    el[n, h] = Σ_d Wh[n, h, d] · attn_l[h, d]        (the node as an edge source)
    er[n, h] = Σ_d Wh[n, h, d] · attn_r[h, d]        (the node as an edge destination)

computed once per node — the fused attention then reads ``el`` / ``er`` per edge instead of
recomputing dot products of width D.  Bytes: ``N·H·D`` features read once, ``2·N·H``
scores written (in the accumulation dtype of ``el``).
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.grid_sync import sum_partials

from .tiles import head_tile, node_rows


@jit
def _load_node_tile(wh_ptr, attn_l_ptr, attn_r_ptr, acc_ptr, num_nodes, H, D,
                    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's features ``[ROWS, BLOCK_H, BLOCK_D]``, both attention vectors and the
    offsets, in the dtype of ``acc_ptr``'s elements."""
    acc_dtype = acc_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    _, _, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    _, _, feat_offs, feat_mask, rh_offs, rh_mask = node_rows(pid, num_nodes, H, D, ROWS, BLOCK_H, BLOCK_D)
    attn_l = tl.load(attn_l_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    attn_r = tl.load(attn_r_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    wh = tl.load(wh_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    return wh, attn_l, attn_r, feat_offs, feat_mask, rh_offs, rh_mask


@jit
def node_scores_kernel(
    wh_ptr, attn_l_ptr, attn_r_ptr, el_ptr, er_ptr, num_nodes, H, D,
    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    wh, attn_l, attn_r, _, _, rh_offs, rh_mask = _load_node_tile(
        wh_ptr, attn_l_ptr, attn_r_ptr, el_ptr, num_nodes, H, D, ROWS, BLOCK_H, BLOCK_D
    )
    tl.store(el_ptr + rh_offs, tl.sum(wh * attn_l[None, :, :], axis=2), mask=rh_mask)
    tl.store(er_ptr + rh_offs, tl.sum(wh * attn_r[None, :, :], axis=2), mask=rh_mask)


@jit
def node_scores_backward_kernel(
    wh_ptr, attn_l_ptr, attn_r_ptr, grad_el_ptr, grad_er_ptr, grad_agg_ptr, grad_wh_ptr,
    part_ptr, group_ptr, sums_ptr, count_ptr, num_nodes, H, D, programs, count,
    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, SUM_P: tl.constexpr,
    SUM_W: tl.constexpr,
):
    """Backward of the node scores, folded into the feature gradient of the whole GAT op::

        grad_wh[n]     = grad_agg[n] + grad_el[n, h] · attn_l[h] + grad_er[n, h] · attn_r[h]
        part[0, p]     = Σ_{n in program p} grad_el[n, h] · Wh[n, h]      (part[1, p]: likewise attn_r)
        sums[k]        = Σ_p part[k, p]      for k < count

    ``grad_agg`` is the aggregation gradient (it may be ``grad_wh`` itself: each element is
    read before it is written by the same program).  ``part [count, programs, H, D]`` (accumulation dtype)
    may hold more partial rows than the two this kernel stores, filled by an earlier launch with the same
    programs (an output bias's ``Σ_n g_n``: :func:`head_dot_kernel`'s ``COLUMN_SUMS``); the launch sums all
    ``count`` of them into ``sums [count, H, D]`` (the attention vectors' dtype) itself, its last programs to
    arrive finishing the sum (:func:`fusecore.grid_sync.sum_partials`: ``group`` its ``[count, groups, H·D]``
    first level, ``count_ptr`` its zeroed counts), so no reduction or cast launch follows.  Bytes: ``Wh`` and
    ``grad_agg`` read once, ``grad_wh`` written once, the partials written once and read once.
    """
    acc_dtype = grad_el_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    wh, attn_l, attn_r, feat_offs, feat_mask, rh_offs, rh_mask = _load_node_tile(
        wh_ptr, attn_l_ptr, attn_r_ptr, grad_el_ptr, num_nodes, H, D, ROWS, BLOCK_H, BLOCK_D
    )
    grad = tl.load(grad_agg_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    grad_el = tl.load(grad_el_ptr + rh_offs, mask=rh_mask, other=0.0)[:, :, None]
    grad_er = tl.load(grad_er_ptr + rh_offs, mask=rh_mask, other=0.0)[:, :, None]
    grad += grad_el * attn_l[None, :, :] + grad_er * attn_r[None, :, :]
    tl.store(grad_wh_ptr + feat_offs, grad.to(grad_wh_ptr.dtype.element_ty), mask=feat_mask)
    _, _, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    width = H * D
    part_offs = pid * width + hd_offs
    tl.store(part_ptr + part_offs, tl.sum(grad_el * wh, axis=0), mask=hd_mask)
    tl.store(part_ptr + programs * width + part_offs, tl.sum(grad_er * wh, axis=0), mask=hd_mask)
    sum_partials(pid, programs, part_ptr, count, width, group_ptr, sums_ptr, count_ptr, GROUP, SUM_P, SUM_W)


@jit
def head_dot_kernel(a_ptr, b_ptr, out_ptr, part_a_ptr, copy_ptr, num_nodes, H, D, copy_stride, group_ptr, sums_ptr,
                    count_ptr, programs, ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                    COLUMN_SUMS: tl.constexpr, COPY: tl.constexpr = False, FINISH: tl.constexpr = False,
                    GROUP: tl.constexpr = 1, SUM_P: tl.constexpr = 1, SUM_W: tl.constexpr = 1):
    """``out[n, h] = Σ_d a[n, h, d] · b[n, h, d]`` (the backward's ``δ = <g, out>`` per node and head);
    with ``COLUMN_SUMS`` also ``part_a[p] = Σ_{n in program p} a[n]`` ``[H, D]`` in ``out``'s dtype
    (an output bias's gradient ``Σ_n g_n``), summed over the ``programs`` by a later launch
    (:func:`node_scores_backward_kernel`) or, with ``FINISH``, by this one into ``sums [H, D]`` (its own dtype;
    ``group``, ``count_ptr``: :func:`fusecore.grid_sync.sum_partials`'); and with ``COPY`` ``a``
    itself stored into ``copy [N, H, D]`` (rows ``copy_stride`` apart: a per-node addend's gradient, ``g``,
    in place in a packed gradient), from the same read of ``a``."""
    acc_dtype = out_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    _, _, feat_offs, feat_mask, rh_offs, rh_mask = node_rows(pid, num_nodes, H, D, ROWS, BLOCK_H, BLOCK_D)
    a = tl.load(a_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    b = tl.load(b_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    tl.store(out_ptr + rh_offs, tl.sum(a * b, axis=2), mask=rh_mask)
    if COPY:
        offs_r, _, _, _, _, _ = node_rows(pid, num_nodes, H, D, ROWS, BLOCK_H, BLOCK_D)
        _, _, hd_offs, _ = head_tile(H, D, BLOCK_H, BLOCK_D)
        tl.store(copy_ptr + offs_r[:, None, None] * copy_stride + hd_offs[None, :, :],
                 a.to(copy_ptr.dtype.element_ty), mask=feat_mask)
    if COLUMN_SUMS:
        _, _, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
        tl.store(part_a_ptr + pid * (H * D) + hd_offs, tl.sum(a, axis=0), mask=hd_mask)
        if FINISH:
            sum_partials(pid, programs, part_a_ptr, 1, H * D, group_ptr, sums_ptr, count_ptr, GROUP, SUM_P, SUM_W)
