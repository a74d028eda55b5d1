"""Fused GAT forward: edge scores, softmax over incoming edges and aggregation in one pass.

For destination row ``i`` with incoming edges ``j -> i`` (CSR positions ``p``), all heads ``h``::

    z_ijh  = el[j, h] + er[i, h]                   el = a_l · Wh_j,  er = a_r · Wh_i  (per node, given)
    s_ijh  = LeakyReLU(z_ijh)
    lse_ih = log Σ_j exp(s_ijh)                    (online: running max m and sum l)
    α_ijh  = exp(s_ijh − lse_ih) · keep_ph / (1 − p_drop)
    out_i  = Σ_j α_ijh Wh_j[h, :]

``keep_ph = uniform(seed, stream=p, position=offset + h) >= p_drop`` is attention dropout,
regenerated in the backward pass from the same counter, never stored.  Only ``lse [N, H]``
is written beside the output: no E×H or E×H×D tensor exists.

Two kernels, by row kind (:mod:`gnnfuse.schedule`):

* :func:`gat_forward_light_kernel` — ``ROWS`` light rows per program, all their edges in
  one ``[ROWS, BLOCK_E]`` tile (``BLOCK_E >=`` the rows' degree): an exact softmax per row,
  no loop;
* :func:`gat_forward_rows_kernel` — one item per program, its edges in blocks of
  ``BLOCK_E`` with an online softmax.  An item is a whole medium row (``PIECES=False``:
  final output written at the row) or one piece of a split super row (``PIECES=True``: the
  normalized partial output and its logsumexp written at the piece index, merged later by
  :mod:`gnnfuse.kernels.merge`).  Edge ranges ``starts[i] : stops[i]`` come from the schedule.

Heads and head size are padded to powers of two (``BLOCK_H``, ``BLOCK_D``) and masked;
accumulation is in the dtype of ``el`` (float32, or float64 for float64 inputs).

Bytes per launch (the gather floor): ``E·H·D`` feature elements gathered, ``E`` source ids,
``E·H`` el values (L2-resident node vectors), ``N·H·D`` outputs and ``N·H`` lse written.
"""

import triton.language as tl

from fusecore.backend import jit

from .dropout import attention_dropout
from .tiles import finish_softmax, flat_head_tile, head_tile, item_edges, light_edges


@jit
def gat_forward_rows_kernel(
    src_ptr, rows_ptr, starts_ptr, stops_ptr,
    el_ptr, er_ptr, wh_ptr, out_ptr, lse_ptr,
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
    er_i = tl.load(er_ptr + row * H + offs_h, mask=h_mask, other=0.0).to(acc_dtype)
    m = tl.full([BLOCK_H], float("-inf"), dtype=acc_dtype)
    l = tl.zeros([BLOCK_H], dtype=acc_dtype)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=acc_dtype)
    for e0 in range(start, stop, BLOCK_E):
        pos = e0 + offs_e
        e_mask = pos < stop
        src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        eh_mask = e_mask[:, None] & h_mask[None, :]
        el_j = tl.load(el_ptr + src[:, None] * H + offs_h[None, :], mask=eh_mask, other=0.0).to(acc_dtype)
        z = el_j + er_i[None, :]
        s = tl.where(z > 0, z, z * negative_slope)
        s = tl.where(e_mask[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        rescale = tl.exp(m - m_new)
        p = tl.exp(s - m_new[None, :])
        l = l * rescale + tl.sum(p, axis=0)
        if DROPOUT:
            p = attention_dropout(p, pos[:, None], rng_offset + offs_h[None, :], seed, dropout_p, keep_scale)
        wh_j = tl.load(
            wh_ptr + src[:, None, None] * HD + hd_offs[None, :, :],
            mask=e_mask[:, None, None] & hd_mask[None, :, :], other=0.0,
        ).to(acc_dtype)
        acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * wh_j, axis=0)
        m = m_new
    out, lse = finish_softmax(acc, m, l)
    tl.store(out_ptr + out_index * HD + hd_offs, out.to(out_ptr.dtype.element_ty), mask=hd_mask)
    tl.store(lse_ptr + out_index * H + offs_h, lse.to(lse_ptr.dtype.element_ty), mask=h_mask)


@jit
def gat_forward_light_kernel(
    src_ptr, rows_ptr, starts_ptr, stops_ptr, el_ptr, er_ptr, wh_ptr, out_ptr, lse_ptr,
    num_rows, H, D, negative_slope, dropout_p, keep_scale, seed, rng_offset,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr,
):
    acc_dtype = el_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    # pos: CSR positions [ROWS, BLOCK_E]
    rows, r_mask, pos, e_mask = light_edges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS, BLOCK_E)
    src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
    eh_mask = e_mask[:, :, None] & h_mask[None, None, :]                      # [ROWS, BLOCK_E, BLOCK_H]
    el_j = tl.load(el_ptr + src[:, :, None] * H + offs_h[None, None, :], mask=eh_mask, other=0.0).to(acc_dtype)
    rh_mask = r_mask[:, None] & h_mask[None, :]
    er_i = tl.load(er_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask, other=0.0).to(acc_dtype)
    z = el_j + er_i[:, None, :]
    s = tl.where(z > 0, z, z * negative_slope)
    s = tl.where(e_mask[:, :, None], s, float("-inf"))
    m = tl.max(s, axis=1)                                                     # [ROWS, BLOCK_H]
    has_edges = m > float("-inf")
    m_safe = tl.where(has_edges, m, 0.0)
    p = tl.exp(s - m_safe[:, None, :])
    l = tl.sum(p, axis=1)
    l_safe = tl.where(has_edges, l, 1.0)
    alpha = p / l_safe[:, None, :]
    if DROPOUT:
        alpha = attention_dropout(alpha, pos[:, :, None], rng_offset + offs_h[None, None, :], seed, dropout_p,
                                  keep_scale)
    # Flatten (row, edge) to gather the features as a 3-D tile, then fold back per row.
    src_flat = tl.reshape(src, [ROWS * BLOCK_E])
    e_flat = tl.reshape(e_mask, [ROWS * BLOCK_E])
    wh_j = tl.load(
        wh_ptr + src_flat[:, None, None] * HD + hd_offs[None, :, :],
        mask=e_flat[:, None, None] & hd_mask[None, :, :], other=0.0,
    ).to(acc_dtype)
    messages = tl.reshape(alpha, [ROWS * BLOCK_E, BLOCK_H])[:, :, None] * wh_j
    out = tl.sum(tl.reshape(messages, [ROWS, BLOCK_E, BLOCK_H * BLOCK_D]), axis=1)
    lse = tl.where(has_edges, m_safe + tl.log(l_safe), float("-inf"))
    tl.store(out_ptr + rows[:, None] * HD + c_offs[None, :], out.to(out_ptr.dtype.element_ty),
             mask=r_mask[:, None] & c_mask[None, :])
    tl.store(lse_ptr + rows[:, None] * H + offs_h[None, :], lse.to(lse_ptr.dtype.element_ty), mask=rh_mask)
