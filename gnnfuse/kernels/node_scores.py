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
    part_attn_l_ptr, part_attn_r_ptr, num_nodes, H, D,
    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Backward of the node scores, folded into the feature gradient of the whole GAT op::

        grad_wh[n]     = grad_agg[n] + grad_el[n, h] · attn_l[h] + grad_er[n, h] · attn_r[h]
        part_attn_l[p] = Σ_{n in program p} grad_el[n, h] · Wh[n, h]      (likewise attn_r)

    ``grad_agg`` is the aggregation gradient (it may be ``grad_wh`` itself: each element is
    read before it is written by the same program); the launcher sums the per-program
    partials.  Bytes: ``Wh`` and ``grad_agg`` read once, ``grad_wh`` written once.
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
    part_offs = pid * (H * D) + hd_offs
    tl.store(part_attn_l_ptr + part_offs, tl.sum(grad_el * wh, axis=0), mask=hd_mask)
    tl.store(part_attn_r_ptr + part_offs, tl.sum(grad_er * wh, axis=0), mask=hd_mask)


@jit
def head_dot_kernel(a_ptr, b_ptr, out_ptr, part_a_ptr, copy_ptr, num_nodes, H, D, copy_stride,
                    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, COLUMN_SUMS: tl.constexpr,
                    COPY: tl.constexpr = False):
    """``out[n, h] = Σ_d a[n, h, d] · b[n, h, d]`` (the backward's ``δ = <g, out>`` per node and head);
    with ``COLUMN_SUMS`` also ``part_a[p] = Σ_{n in program p} a[n]`` ``[H, D]`` in ``out``'s dtype
    (an output bias's gradient ``Σ_n g_n``, summed over programs by the launcher), and with ``COPY`` ``a``
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
