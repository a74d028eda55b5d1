"""Fused GAT backward without atomics: a pass over sources, then a per-destination reduction.

With ``α_ij`` recomputed from the saved ``lse`` (no attention matrix stored), dropout
``keep_ij / (1 − p)`` regenerated from the counter-based RNG (stream = CSR position),
``α'_ij = α_ij keep_ij / (1 − p)`` and ``g = ∂L/∂out``::

    ∂L/∂Wh_j   = Σ_{i: j->i} α'_ij g_i                                   (aggregation)
    δ_i        = Σ_j α'_ij <g_i, Wh_j> = <g_i, out_i>       per head      (given, like FlashAttention's D)
    ∂L/∂s_ij   = α'_ij <g_i, Wh_j> − α_ij δ_i
    ∂L/∂z_ij   = ∂L/∂s_ij · (1 if z_ij > 0 else negative_slope)
    ∂L/∂el_j   = Σ_{i: j->i} ∂L/∂z_ij         ∂L/∂er_i = Σ_{j: j->i} ∂L/∂z_ij

:func:`gat_backward_src_kernel` walks the reverse CSR: each program owns source rows (or
pieces of split ones), so ``∂L/∂Wh_j`` and ``∂L/∂el_j`` are written once, without atomics.
It also writes ``∂L/∂z`` per (edge, head) at the edge's CSR position — an E×H float32
buffer, never E×H×D — which :func:`row_sum_kernel` reduces per destination row into
``∂L/∂er`` (again one writer per row).

Bytes: the source pass gathers ``E·H·D`` elements of g plus ``E·H`` of er, lse, δ and writes
``E·H`` of ∂L/∂z and ``N·H·D`` gradients; the row sum reads ``E·H`` and writes ``N·H``.
"""

import triton.language as tl

from fusecore.backend import jit

from .dropout import attention_dropout
from .tiles import flat_head_tile, head_tile, item_edges, light_edges


@jit
def gat_backward_src_kernel(
    rev_dst_ptr, rev_pos_ptr, rows_ptr, starts_ptr, stops_ptr,
    el_ptr, er_ptr, wh_ptr, lse_ptr, grad_out_ptr, delta_ptr,
    grad_wh_ptr, grad_el_ptr, grad_z_ptr,
    H, D, negative_slope, dropout_p, keep_scale, seed, rng_offset,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PIECES: tl.constexpr, DROPOUT: tl.constexpr,
):
    acc_dtype = el_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    row, start, stop, out_index = item_edges(pid, rows_ptr, starts_ptr, stops_ptr, PIECES)
    wh_j = tl.load(wh_ptr + row * HD + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    el_j = tl.load(el_ptr + row * H + offs_h, mask=h_mask, other=0.0).to(acc_dtype)
    acc_wh = tl.zeros([BLOCK_H, BLOCK_D], dtype=acc_dtype)
    acc_el = tl.zeros([BLOCK_H], dtype=acc_dtype)
    for q0 in range(start, stop, BLOCK_E):
        q = q0 + offs_e
        e_mask = q < stop
        dst = tl.load(rev_dst_ptr + q, mask=e_mask, other=0).to(tl.int64)
        pos = tl.load(rev_pos_ptr + q, mask=e_mask, other=0).to(tl.int64)
        eh_mask = e_mask[:, None] & h_mask[None, :]
        eh_offs = dst[:, None] * H + offs_h[None, :]
        er_i = tl.load(er_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        lse_i = tl.load(lse_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        delta_i = tl.load(delta_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        z = el_j[None, :] + er_i
        s = tl.where(z > 0, z, z * negative_slope)
        alpha = tl.where(eh_mask, tl.exp(s - lse_i), 0.0)
        if DROPOUT:
            alpha_kept = attention_dropout(alpha, pos[:, None], rng_offset + offs_h[None, :], seed, dropout_p,
                                           keep_scale)
        else:
            alpha_kept = alpha
        g_i = tl.load(
            grad_out_ptr + dst[:, None, None] * HD + hd_offs[None, :, :],
            mask=e_mask[:, None, None] & hd_mask[None, :, :], other=0.0,
        ).to(acc_dtype)
        acc_wh += tl.sum(alpha_kept[:, :, None] * g_i, axis=0)
        g_dot_wh = tl.sum(g_i * wh_j[None, :, :], axis=2)
        grad_s = alpha_kept * g_dot_wh - alpha * delta_i
        grad_z = tl.where(z > 0, grad_s, grad_s * negative_slope)
        acc_el += tl.sum(tl.where(eh_mask, grad_z, 0.0), axis=0)
        tl.store(grad_z_ptr + pos[:, None] * H + offs_h[None, :], grad_z.to(grad_z_ptr.dtype.element_ty),
                 mask=eh_mask)
    tl.store(grad_wh_ptr + out_index * HD + hd_offs, acc_wh.to(grad_wh_ptr.dtype.element_ty),
             mask=hd_mask)
    tl.store(grad_el_ptr + out_index * H + offs_h, acc_el.to(grad_el_ptr.dtype.element_ty),
             mask=h_mask)


@jit
def row_sum_kernel(
    rows_ptr, starts_ptr, stops_ptr, values_ptr, out_ptr, W,
    BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr, PIECES: tl.constexpr,
):
    """out[row, :W] = Σ_{p in the row's CSR range} values[p, :W] (or per piece when PIECES)."""
    pid = tl.program_id(0).to(tl.int64)
    offs_w = tl.arange(0, BLOCK_W)
    offs_e = tl.arange(0, BLOCK_E)
    w_mask = offs_w < W
    _, start, stop, out_index = item_edges(pid, rows_ptr, starts_ptr, stops_ptr, PIECES)
    acc = tl.zeros([BLOCK_W], dtype=values_ptr.dtype.element_ty)
    for e0 in range(start, stop, BLOCK_E):
        pos = e0 + offs_e
        mask = (pos < stop)[:, None] & w_mask[None, :]
        acc += tl.sum(tl.load(values_ptr + pos[:, None] * W + offs_w[None, :], mask=mask, other=0.0), axis=0)
    tl.store(out_ptr + out_index * W + offs_w, acc.to(out_ptr.dtype.element_ty), mask=w_mask)


@jit
def gat_backward_src_light_kernel(
    rev_dst_ptr, rev_pos_ptr, rows_ptr, starts_ptr, stops_ptr,
    el_ptr, er_ptr, wh_ptr, lse_ptr, grad_out_ptr, delta_ptr,
    grad_wh_ptr, grad_el_ptr, grad_z_ptr,
    num_rows, H, D, negative_slope, dropout_p, keep_scale, seed, rng_offset,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr,
):
    """The source pass for ``ROWS`` light source rows per program, edges in one tile."""
    acc_dtype = el_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    # q: reverse-CSR positions [ROWS, BLOCK_E]
    rows, r_mask, q, e_mask = light_edges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS, BLOCK_E)
    dst = tl.load(rev_dst_ptr + q, mask=e_mask, other=0).to(tl.int64)
    pos = tl.load(rev_pos_ptr + q, mask=e_mask, other=0).to(tl.int64)
    eh_mask = e_mask[:, :, None] & h_mask[None, None, :]                      # [ROWS, BLOCK_E, BLOCK_H]
    eh_offs = dst[:, :, None] * H + offs_h[None, None, :]
    er_i = tl.load(er_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
    lse_i = tl.load(lse_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
    delta_i = tl.load(delta_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
    rh_mask = r_mask[:, None] & h_mask[None, :]
    el_j = tl.load(el_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask, other=0.0).to(acc_dtype)
    z = el_j[:, None, :] + er_i
    s = tl.where(z > 0, z, z * negative_slope)
    alpha = tl.where(eh_mask, tl.exp(s - lse_i), 0.0)
    if DROPOUT:
        alpha_kept = attention_dropout(alpha, pos[:, :, None], rng_offset + offs_h[None, None, :], seed, dropout_p,
                                       keep_scale)
    else:
        alpha_kept = alpha
    # Flatten (row, edge) for the feature tiles [ROWS * BLOCK_E, BLOCK_H, BLOCK_D].
    dst_flat = tl.reshape(dst, [ROWS * BLOCK_E])
    e_flat = tl.reshape(e_mask, [ROWS * BLOCK_E])
    rows_flat = tl.reshape(rows[:, None] + tl.zeros([ROWS, BLOCK_E], dtype=tl.int64), [ROWS * BLOCK_E])
    feat_mask = e_flat[:, None, None] & hd_mask[None, :, :]
    g_i = tl.load(grad_out_ptr + dst_flat[:, None, None] * HD + hd_offs[None, :, :], mask=feat_mask,
                  other=0.0).to(acc_dtype)
    wh_j = tl.load(wh_ptr + rows_flat[:, None, None] * HD + hd_offs[None, :, :], mask=feat_mask,
                   other=0.0).to(acc_dtype)
    kept_flat = tl.reshape(alpha_kept, [ROWS * BLOCK_E, BLOCK_H])
    grad_wh = tl.sum(tl.reshape(kept_flat[:, :, None] * g_i, [ROWS, BLOCK_E, BLOCK_H * BLOCK_D]), axis=1)
    g_dot_wh = tl.reshape(tl.sum(g_i * wh_j, axis=2), [ROWS, BLOCK_E, BLOCK_H])
    grad_s = alpha_kept * g_dot_wh - alpha * delta_i
    grad_z = tl.where(eh_mask, tl.where(z > 0, grad_s, grad_s * negative_slope), 0.0)
    tl.store(grad_z_ptr + pos[:, :, None] * H + offs_h[None, None, :], grad_z.to(grad_z_ptr.dtype.element_ty),
             mask=eh_mask)
    tl.store(grad_wh_ptr + rows[:, None] * HD + c_offs[None, :], grad_wh.to(grad_wh_ptr.dtype.element_ty),
             mask=r_mask[:, None] & c_mask[None, :])
    tl.store(grad_el_ptr + rows[:, None] * H + offs_h[None, :], tl.sum(grad_z, axis=1).to(grad_el_ptr.dtype.element_ty),
             mask=rh_mask)


@jit
def row_sum_light_kernel(
    rows_ptr, starts_ptr, stops_ptr, values_ptr, out_ptr, num_rows, W,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """out[row, :W] = Σ over the row's CSR range of values[p, :W], ``ROWS`` light rows per program."""
    pid = tl.program_id(0).to(tl.int64)
    offs_w = tl.arange(0, BLOCK_W)
    rows, r_mask, pos, e_mask = light_edges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS, BLOCK_E)
    mask = e_mask[:, :, None] & (offs_w < W)[None, None, :]
    values = tl.load(values_ptr + pos[:, :, None] * W + offs_w[None, None, :], mask=mask, other=0.0)
    tl.store(out_ptr + rows[:, None] * W + offs_w[None, :], tl.sum(values, axis=1).to(out_ptr.dtype.element_ty),
             mask=r_mask[:, None] & (offs_w < W)[None, :])
