"""Fused attention backward without atomics: a pass over sources, then a per-destination pass.

With ``α_ij`` recomputed from the saved ``lse`` (no attention matrix stored), dropout
``keep_ij / (1 − p)`` regenerated from the counter-based RNG (stream = CSR position),
``α'_ij = α_ij keep_ij / (1 − p)`` (``· w_p`` with ``FACTOR``, a per-edge factor: :mod:`gnnfuse.kernels.dropout`),
``g = ∂L/∂out``, values ``val_j (+ e_p)`` and the score ``s_ij`` of :mod:`gnnfuse.kernels.scores` (``src_j``,
``dst_i`` its two sides)::

    ∂L/∂val_j  = Σ_{i: j->i} α'_ij g_i                                    (aggregation)
    δ_i        = Σ_j α'_ij <g_i, val_j + e_p> = <g_i, out_i>   per head   (given, like FlashAttention's D)
    ∂L/∂s_ij   = α'_ij <g_i, val_j + e_p> − α_ij δ_i
    ∂L/∂src_j  = Σ_{i: j->i} ∂s/∂src · ∂L/∂s_ij          ∂L/∂dst_i = Σ_{j: j->i} ∂s/∂dst · ∂L/∂s_ij
    ∂L/∂e_p    = α'_ij g_i + ∂L/∂s_ij q̃_i            (dot score with edge features, destination pass)
    ∂L/∂e_p    = ∂L/∂z_p = ∂L/∂s_ij · a ⊙ LeakyReLU'(fs_j + fd_i + e_p)   (GATv2 with edge features)
    ∂L/∂a      = Σ_edges ∂L/∂s_ij · LeakyReLU(fs_j + fd_i)              (GATv2)
    ∂L/∂w_p    = Σ_h α_ij keep_ij / (1 − p) <g_i, val_j + e_p>          (FACTOR_GRAD, source pass)

The source pass reads the factor and stores ``∂L/∂w`` in reverse-CSR order (at ``q``, beside ``rev_dst`` /
``rev_pos``): contiguous, where the CSR position ``p`` would be a random 4-byte access per edge.  With
``EDGE_SCORE`` (GAT's per-edge score term, ``s = LeakyReLU(el_j + er_i + ee_p)``:
:func:`~gnnfuse.kernels.scores.add_edge_score`) it reads ``ee`` the same way, ``[E, H]`` in reverse-CSR order, and
adds it to ``el_j`` before the score and its gradient are formed; ``∂L/∂ee_p = ∂L/∂z_p`` is the per-edge value it
stores at ``p`` anyway (below), so the term's gradient needs nothing more here.

:func:`attention_backward_src_kernel` (and its light form) walks the reverse CSR: each
program owns source rows (or pieces of split ones), so ``∂L/∂val_j`` and the per-source
second output are written once, without atomics.  That second output is ``∂L/∂el`` ``[N, H]``
for GAT, ``∂L/∂k`` for the dot score (with edge features, whose source-side reads would be a per-edge
projection, the score's and ``<g_i, e_p>``'s edge terms come per edge and head from ``terms [E, 2, H]``,
formed before the pass by :func:`~gnnfuse.kernels.edge_features.edge_terms_kernel`) and, for GATv2
(whose values are its source terms, so the score's share is added into ``∂L/∂fs``), the source row's
partial sum of ``∂L/∂a``
(summed over rows by the launcher: deterministic, no atomics).  The pass also writes a
per-(edge, head) value at the edge's CSR position — ``∂L/∂z`` for GAT, ``∂L/∂s`` otherwise,
an E×H buffer, never E×H×D — which the destination pass reduces per row: a plain
:func:`row_sums_kernel` for GAT (``∂L/∂er``; light rows, split rows and the rest in one launch),
:func:`attention_backward_dst_kernel` (and its light form) for GATv2 (``∂L/∂fd``) and the dot
score (``∂L/∂q``, gathering the keys again; with edge features, whose ``α'_p`` the source pass
leaves in ``terms[p, 0]``, it sums ``∂s_p ⊗ attr_p`` and ``α'_p ⊗ attr_p`` per row — no edge is
projected — adds the key path's ``Σ_k B[k] W[k]`` once per row and writes the sums ``A``, ``B``
where the weight's gradient is asked for; ``∂attr`` is
:func:`~gnnfuse.kernels.edge_features.edge_attr_grad_kernel`'s).  ``LANES`` (row
kernels): the edge-loop sums are kept per edge lane and reduced once after the loop.

GATv2 with edge features (``EDGE`` and the GATv2 score, PyG GATv2Conv's ``edge_dim``): ``e_p`` sits inside the
LeakyReLU, so neither the terms nor the per-row sums above apply, and no backward kernel projects an edge: the
training forward stored each edge's score and the LeakyReLU's slopes as one bit per element at its CSR position
(:func:`~gnnfuse.kernels.edge_features.save_scores`).  The source pass reads them at the position ``p`` it has from
``rev_pos`` (``scores_ptr``, ``slopes_ptr``; the light rows in the tile form only) for ``α`` and ``∂z = ∂s · a ⊙ c``,
and forms the ``∂a`` terms without ``e_p`` (``∂s · c ⊙ (fs_j + fd_i)``); the destination pass forms ``∂z`` from ``∂s``
and the bits alone (no gather); ``∂attr``, ``∂W_e`` and ``e_p``'s share of ``∂a`` are
:func:`~gnnfuse.kernels.edge_features.gatv2_edge_grad_kernel`'s.

Strides: the ``[N, H, D]`` inputs are read with the row stride ``feat_stride`` (as in the forward), and the
feature gradients ``∂value``, ``∂dst`` and the dot score's ``∂k`` are stored with ``grad_stride`` (``H·D``
for a contiguous tensor or a piece buffer; the row width of one ``[N, W]`` gradient when they are column
blocks of it); ``g`` and GATv2's ``∂attn`` partials are contiguous.

Bytes: the source pass gathers ``E·H·D`` elements of g (and of ``dst`` for GATv2 / dot) plus
``E·H`` of lse and δ (with ``EDGE`` ``2·E·H`` terms, ``α'`` written back), writes ``E·H`` of ∂s and
``N·H·D`` gradients; the destination pass reads ``E·H`` (GAT) or ``E·H·(D + 1)`` (with ``EDGE`` also
``E·H`` of ``α'`` and ``E·K`` edge features, writing ``N·2·H·K`` sums).
"""

import triton.language as tl

from fusecore.backend import jit

from .dropout import attention_dropout, dropout_seed, edge_factor, store_factor_grad
from .edge_features import (
    edge_attr_tile,
    rows_edge_values,
    slope_factors,
    slope_grad,
)
from .merge import last_piece, merge_sums
from .normalize import unit_grad
from .scores import add_edge_score, attn_grad_terms, edge_scores, gather_keys, gather_queries, row_query, score_grad
from .tiles import (
    ONE,
    flat_head_tile,
    head_tile,
    item_edges,
    lane_add,
    lane_total,
    light_edges,
    light_slot_count,
    row_ranges,
)


@jit
def attention_backward_src_kernel(
    rev_dst_ptr, rev_pos_ptr, rows_ptr, starts_ptr, stops_ptr,
    src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, terms_ptr, lse_ptr, grad_out_ptr, delta_ptr,
    grad_value_ptr, grad_src_ptr, grad_s_ptr, factor_ptr, grad_factor_ptr, edge_score_ptr,
    H, D, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset, feat_stride, grad_stride,
    piece_super_ptr, piece_ptr, piece_count_ptr, merged_value_ptr, merged_src_ptr, merged_stride,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PIECES: tl.constexpr, DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr,
    KEY_SCALE: tl.constexpr, LANES: tl.constexpr, PREFETCH: tl.constexpr = False,
    MERGE: tl.constexpr = False, MERGE_P: tl.constexpr = 1, MERGE_W: tl.constexpr = 1, SRC_P: tl.constexpr = 1,
    SRC_W: tl.constexpr = 1, FACTOR: tl.constexpr = False, FACTOR_GRAD: tl.constexpr = False,
    EDGE_SCORE: tl.constexpr = False, scores_ptr=None, slopes_ptr=None, SLOPE_BITS: tl.constexpr = 32,
):
    """The source pass's row kernel; ``PREFETCH``: each edge block's reverse-CSR destinations and positions
    loaded one trip ahead (the trip's gathers then wait on no index load of their own).  ``EDGE`` (dot score):
    the edge features enter through the terms ``(t_p, r_p)`` at CSR position ``p`` (``terms [E, 2, H]``,
    :func:`~gnnfuse.kernels.edge_features.edge_terms_kernel`), added to the score and to ``<g_i, v_j>``.
    ``MERGE`` (with ``PIECES``: ``grad_value`` / ``grad_src`` are then the piece buffers, ``grad_stride`` theirs):
    the last piece of each super row to finish sums that row's partials into ``merged_value`` / ``merged_src``
    (the gradients, rows ``merged_stride`` apart as ``grad_stride`` otherwise; :mod:`gnnfuse.kernels.merge`;
    ``MERGE_P`` / ``MERGE_W``, ``SRC_P`` / ``SRC_W``: its tiles).  ``EDGE_SCORE`` (GAT): ``edge_score [E, H]`` in
    reverse-CSR order added to the source term per edge.  ``EDGE`` with GATv2: the scores and the LeakyReLU's slopes
    the forward stored at the CSR position ``p`` (``scores [E, H]``, ``slopes``:
    :func:`~gnnfuse.kernels.edge_features.slope_factors`) instead of ``z = fs_j + fd_i + e_p``, so no edge is
    projected; the ``∂attn`` terms without ``e_p``'s share (``∂s ⊗ c ⊙ (fs_j + fd_i)``, ``c`` the slope: the rest,
    ``Σ_k W_e[k] ⊙ Σ_p attr_p[k] ∂s_p c_p``, is the edge-gradient pass's)."""
    tl.static_assert(not EDGE or SCORE != 0, "edge features: GATv2 and the dot score")
    tl.static_assert(not EDGE_SCORE or SCORE == 0, "a per-edge score term: GAT only")
    acc_dtype = lse_ptr.dtype.element_ty
    seed, rng_offset = dropout_seed(seed, rng_offset, DROPOUT)
    pid = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    row, start, stop, out_index = item_edges(pid, rows_ptr, starts_ptr, stops_ptr, PIECES)
    val_j = tl.load(value_ptr + row * feat_stride + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    # sums over the row's edges, per edge lane with LANES (tiles.lane_add)
    if LANES:
        acc_val = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_D], dtype=acc_dtype)
    else:
        acc_val = tl.zeros([BLOCK_H, BLOCK_D], dtype=acc_dtype)
    if SCORE == 0:
        src_j = tl.load(src_term_ptr + row * H + offs_h, mask=h_mask, other=0.0).to(acc_dtype)[None, :]
        if LANES:
            acc_src = tl.zeros([BLOCK_E, BLOCK_H], dtype=acc_dtype)
        else:
            acc_src = tl.zeros([BLOCK_H], dtype=acc_dtype)
        attn = src_j
    else:
        if KEY_SCALE:
            r_j = tl.load(src_term_ptr + row * H + offs_h, mask=h_mask, other=0.0).to(acc_dtype)[None, :]
            src_j = val_j[None, :, :] * r_j[:, :, None]  # r_j kept for AGNN's fold (below)
        else:
            src_j = tl.load(src_term_ptr + row * feat_stride + hd_offs, mask=hd_mask,
                            other=0.0).to(acc_dtype)[None, :, :]
        acc_src = tl.zeros_like(acc_val)
        attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    if PREFETCH:
        dst_next = tl.load(rev_dst_ptr + start + offs_e, mask=start + offs_e < stop, other=0)
        pos_next = tl.load(rev_pos_ptr + start + offs_e, mask=start + offs_e < stop, other=0)
    for q0 in range(start, stop, BLOCK_E):
        q = q0 + offs_e
        e_mask = q < stop
        if PREFETCH:
            dst = dst_next.to(tl.int64)
            pos = pos_next.to(tl.int64)
            dst_next = tl.load(rev_dst_ptr + q + BLOCK_E, mask=q + BLOCK_E < stop, other=0)
            pos_next = tl.load(rev_pos_ptr + q + BLOCK_E, mask=q + BLOCK_E < stop, other=0)
        else:
            dst = tl.load(rev_dst_ptr + q, mask=e_mask, other=0).to(tl.int64)
            pos = tl.load(rev_pos_ptr + q, mask=e_mask, other=0).to(tl.int64)
        eh_mask = e_mask[:, None] & h_mask[None, :]
        eh_offs = dst[:, None] * H + offs_h[None, :]
        feat_mask = e_mask[:, None, None] & hd_mask[None, :, :]
        lse_i = tl.load(lse_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        delta_i = tl.load(delta_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        if SCORE == 0:
            dst_i = tl.load(dst_term_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
            src_e = add_edge_score(src_j, edge_score_ptr, q[:, None], offs_h[None, :], eh_mask, H, EDGE_SCORE)
        else:
            dst_i = gather_queries(dst_term_ptr, value_ptr, dst, e_mask, H, feat_stride, offs_h, h_mask, hd_offs,
                                   hd_mask, acc_dtype, KEY_SCALE)
            if SCORE == 2:
                dst_i = dst_i * scale
            src_e = src_j
        if EDGE and SCORE == 1:  # the forward's scores and slopes
            s = tl.load(scores_ptr + pos[:, None] * H + offs_h[None, :], mask=eh_mask, other=0.0).to(acc_dtype)
            slopes = slope_factors(slopes_ptr, pos, e_mask, negative_slope, acc_dtype, BLOCK_E, BLOCK_H, BLOCK_D,
                                   SLOPE_BITS)
        else:
            s = edge_scores(src_e, dst_i, attn, negative_slope, SCORE)
        if EDGE and SCORE == 2:
            terms_offs = pos[:, None] * (2 * H) + offs_h[None, :]
            s += tl.load(terms_ptr + terms_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        alpha, alpha_dropped = _recomputed_weights(s, lse_i, eh_mask, pos[:, None], rng_offset + offs_h[None, :],
                                                   seed, dropout_p, keep_scale, DROPOUT)
        alpha_kept = edge_factor(alpha_dropped, q[:, None], e_mask[:, None], factor_ptr, FACTOR)
        g_i = tl.load(grad_out_ptr + dst[:, None, None] * HD + hd_offs[None, :, :], mask=feat_mask,
                      other=0.0).to(acc_dtype)
        if EDGE and SCORE == 2:
            # the score's term is read: α' takes its place for the destination pass (edge-feature sums)
            replace_terms(terms_ptr, terms_offs, alpha_kept, eh_mask)
        kept_g = alpha_kept[:, :, None] * g_i
        acc_val = lane_add(acc_val, kept_g, LANES)
        g_dot_val = tl.sum(g_i * val_j[None, :, :], axis=2)
        if EDGE and SCORE == 2:
            g_dot_val += tl.load(terms_ptr + terms_offs + H, mask=eh_mask, other=0.0).to(acc_dtype)
        store_factor_grad(grad_factor_ptr, alpha_dropped, g_dot_val, q, e_mask, FACTOR_GRAD, 1)
        grad_s = alpha_kept * g_dot_val - alpha * delta_i
        if EDGE and SCORE == 1:
            scaled = grad_s[:, :, None] * slopes
            grad_src = scaled * attn
        else:
            grad_src = score_grad(grad_s, src_e, dst_i, attn, negative_slope, SCORE)
        if SCORE == 0:
            acc_src = lane_add(acc_src, tl.where(eh_mask, grad_src, 0.0), LANES)
            grad_edge_head = grad_src
        else:
            if SCORE == 1:
                acc_val = lane_add(acc_val, grad_src, LANES)
                if EDGE:
                    acc_src = lane_add(acc_src, scaled * (src_e + dst_i), LANES)
                else:
                    acc_src = lane_add(acc_src, attn_grad_terms(grad_s, src_e, dst_i, negative_slope), LANES)
            else:
                acc_src = lane_add(acc_src, grad_src, LANES)
            grad_edge_head = grad_s
        tl.store(grad_s_ptr + pos[:, None] * H + offs_h[None, :], grad_edge_head.to(grad_s_ptr.dtype.element_ty),
                 mask=eh_mask)
    acc_val = lane_total(acc_val, LANES)
    acc_src = lane_total(acc_src, LANES)
    if KEY_SCALE:  # AGNN: ∂k folded into the row's share of ∂h (kernels/normalize.py); no ∂k stored
        folded, _ = unit_grad(tl.reshape(acc_src, [1, BLOCK_H, BLOCK_D]), val_j[None, :, :], r_j, r_j)
        acc_val += tl.reshape(folded, [BLOCK_H, BLOCK_D])
    tl.store(grad_value_ptr + out_index * grad_stride + hd_offs, acc_val.to(grad_value_ptr.dtype.element_ty),
             mask=hd_mask)
    if SCORE == 0:
        tl.store(grad_src_ptr + out_index * H + offs_h, acc_src.to(grad_src_ptr.dtype.element_ty), mask=h_mask)
    elif not KEY_SCALE:
        src_stride = _src_grad_stride(HD, grad_stride, SCORE)
        tl.store(grad_src_ptr + out_index * src_stride + hd_offs, acc_src.to(grad_src_ptr.dtype.element_ty),
                 mask=hd_mask)
    if MERGE:  # the last piece of the row to finish sums the row's pieces
        tl.static_assert(PIECES, "MERGE: a launch of pieces")
        merger, merge_from, merge_to = last_piece(pid, piece_super_ptr, piece_ptr, piece_count_ptr)
        if merger:
            merge_sums(merge_from, merge_to, row, grad_value_ptr, merged_value_ptr, HD, merged_stride, MERGE_P,
                       MERGE_W)
            if SCORE == 0:
                merge_sums(merge_from, merge_to, row, grad_src_ptr, merged_src_ptr, H, H, SRC_P, SRC_W)
            elif not KEY_SCALE:
                src_stride = _src_grad_stride(HD, merged_stride, SCORE)
                merge_sums(merge_from, merge_to, row, grad_src_ptr, merged_src_ptr, HD, src_stride, SRC_P, SRC_W)


@jit
def _src_grad_stride(HD, grad_stride, SCORE: tl.constexpr):
    """The row stride of the source pass's second output: ``∂k`` (dot score) is a feature gradient laid out
    like ``∂v`` (``grad_stride``); GATv2's ``∂attn`` partials are their own ``[N, H, D]`` tensor."""
    if SCORE == 2:
        stride = grad_stride
    else:
        stride = HD
    return stride


@jit
def replace_terms(terms_ptr, offs, alpha_kept, mask):
    """Store ``α'`` over the score's edge term ``t_p`` that this program has just read at ``terms_ptr + offs``,
    after a barrier.  A ``[rows, heads]`` value is held by several threads: every holder loads ``t_p``, one stores
    ``α'``.  Where the holders sit in different warps (small head tiles at 8 warps), a warp that ran ahead could
    store before another warp's load, which then read ``α'`` as ``t_p`` and summed a wrong score into its copy of
    the row's ``∂k`` / ``∂v`` (session 45: 3-20% off on some GPU calls, never under the interpreter).  The barrier
    makes every warp's load come first."""
    tl.debug_barrier()
    tl.store(terms_ptr + offs, alpha_kept.to(terms_ptr.dtype.element_ty), mask=mask)


@jit
def _recomputed_weights(s, lse_i, mask, pos, streams, seed, dropout_p, keep_scale, DROPOUT: tl.constexpr):
    """``(α, α')``: the forward's attention weights ``exp(s − lse)`` (0 where masked) and the same with
    its dropout regenerated from the counters ``(pos, streams)``."""
    alpha = tl.where(mask, tl.exp(s - lse_i), 0.0)
    if DROPOUT:
        kept = attention_dropout(alpha, pos, streams, seed, dropout_p, keep_scale)
    else:
        kept = alpha
    return alpha, kept


@jit
def attention_backward_src_light_kernel(
    rev_dst_ptr, rev_pos_ptr, rows_ptr, starts_ptr, stops_ptr,
    src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, terms_ptr, lse_ptr, grad_out_ptr, delta_ptr,
    grad_value_ptr, grad_src_ptr, grad_s_ptr, factor_ptr, grad_factor_ptr, edge_score_ptr,
    n0, n1, n2, n3, n4, n5, n6, H, D, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset,
    feat_stride, grad_stride, LIGHT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr, KEY_SCALE: tl.constexpr,
    UNROLLED: tl.constexpr = False, FACTOR: tl.constexpr = False, FACTOR_GRAD: tl.constexpr = False,
    EDGE_SCORE: tl.constexpr = False, scores_ptr=None, slopes_ptr=None, SLOPE_BITS: tl.constexpr = 32,
):
    """The source pass over the light width classes of ``LIGHT`` in one launch (as
    :func:`~gnnfuse.kernels.attention_forward.attention_forward_light_kernel`; ``UNROLLED``:
    :func:`_src_light_unrolled`).  ``EDGE``, ``EDGE_SCORE``: as in :func:`attention_backward_src_kernel` (GATv2's
    edge features in the tile form only)."""
    tl.static_assert(not EDGE or SCORE != 0, "edge features: GATv2 and the dot score")
    tl.static_assert(not (EDGE and SCORE == 1 and UNROLLED), "GATv2's edge features: the tile form")
    tl.static_assert(not EDGE_SCORE or SCORE == 0, "a per-edge score term: GAT only")
    seed, rng_offset = dropout_seed(seed, rng_offset, DROPOUT)
    pid = tl.program_id(0).to(tl.int64)
    first = pid * 0
    row0 = pid * 0
    # slot k: the class of width 2**k; its LIGHT field f = log2(rows per program) + 1 (a static loop over
    # the values f can take, so that rows and width reach the class's code as constexprs)
    for k in tl.static_range(7):  # tiles.LIGHT_SLOTS
        for f in tl.static_range(1, 16):  # 4 bits per slot (tiles.pack_light)
            if ((ONE * LIGHT) >> (4 * k)) & 15 == f:
                count = light_slot_count(k, n0, n1, n2, n3, n4, n5, n6)
                programs = (count + (ONE << (f - 1)) - 1) >> (f - 1)
                local = pid - first
                if (local >= 0) & (local < programs):
                    if UNROLLED:
                        _src_light_unrolled(
                            local, rev_dst_ptr, rev_pos_ptr, rows_ptr + row0, starts_ptr + row0, stops_ptr + row0,
                            src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, terms_ptr, lse_ptr, grad_out_ptr,
                            delta_ptr, grad_value_ptr, grad_src_ptr, grad_s_ptr, factor_ptr, grad_factor_ptr,
                            edge_score_ptr, count, H, D, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset,
                            feat_stride, grad_stride, ONE << (f - 1), ONE << k, BLOCK_H, BLOCK_D, DROPOUT, SCORE, EDGE,
                            KEY_SCALE, FACTOR, FACTOR_GRAD, EDGE_SCORE,
                        )
                    else:
                        _src_light_rows(
                            local, rev_dst_ptr, rev_pos_ptr, rows_ptr + row0, starts_ptr + row0,
                            stops_ptr + row0, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, terms_ptr,
                            lse_ptr, grad_out_ptr, delta_ptr, grad_value_ptr, grad_src_ptr, grad_s_ptr, factor_ptr,
                            grad_factor_ptr, edge_score_ptr, count, H, D, negative_slope, scale, dropout_p, keep_scale,
                            seed, rng_offset, feat_stride, grad_stride, scores_ptr, slopes_ptr,
                            ONE << (f - 1), ONE << k, BLOCK_H, BLOCK_D, DROPOUT, SCORE, EDGE, KEY_SCALE, FACTOR,
                            FACTOR_GRAD, EDGE_SCORE, SLOPE_BITS,
                        )
                first += programs
                row0 += count


@jit
def _src_light_unrolled(
    pid, rev_dst_ptr, rev_pos_ptr, rows_ptr, starts_ptr, stops_ptr, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr,
    terms_ptr, lse_ptr, grad_out_ptr, delta_ptr, grad_value_ptr, grad_src_ptr, grad_s_ptr, factor_ptr, grad_factor_ptr,
    edge_score_ptr, num_rows, H, D, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset, feat_stride,
    grad_stride, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr, KEY_SCALE: tl.constexpr, FACTOR: tl.constexpr,
    FACTOR_GRAD: tl.constexpr, EDGE_SCORE: tl.constexpr,
):
    """The source pass for ``ROWS`` light source rows (``EDGE``: with the edge terms of
    :func:`attention_backward_src_kernel`), the out-edge slots unrolled
    (as :func:`~gnnfuse.kernels.attention_forward._forward_light_unrolled`): the row's own terms read
    once, slot ``e`` gathering the rows' ``e``-th destinations as ``[ROWS, BLOCK_H, BLOCK_D]`` tiles
    (``g``, and ``dst`` for GATv2 / dot) and adding into per-row sums, nothing reduced across warps."""
    acc_dtype = lse_ptr.dtype.element_ty
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    _, r_mask, rows, start, degree = row_ranges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS)
    rh_mask = r_mask[:, None] & h_mask[None, :]
    row_mask = r_mask[:, None, None] & hd_mask[None, :, :]
    val_row = tl.load(value_ptr + rows[:, None, None] * feat_stride + hd_offs[None, :, :], mask=row_mask,
                      other=0.0).to(acc_dtype)
    if SCORE == 0:
        src_row = tl.load(src_term_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask, other=0.0).to(acc_dtype)
        acc_src = tl.zeros([ROWS, BLOCK_H], dtype=acc_dtype)
        attn = src_row
    else:
        if SCORE == 1:
            src_row = val_row
        elif KEY_SCALE:  # the keys ĥ = h r (r kept for AGNN's fold, below)
            r_row = tl.load(src_term_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask, other=0.0).to(acc_dtype)
            src_row = val_row * r_row[:, :, None]
        else:
            src_row, _ = gather_keys(src_term_ptr, value_ptr, rows, r_mask, H, feat_stride, offs_h, h_mask, hd_offs,
                                     hd_mask, acc_dtype, KEY_SCALE)
        acc_src = tl.zeros([ROWS, BLOCK_H, BLOCK_D], dtype=acc_dtype)
        attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    acc_val = tl.zeros([ROWS, BLOCK_H, BLOCK_D], dtype=acc_dtype)
    for e in tl.static_range(BLOCK_E):
        e_mask = e < degree                                                    # [ROWS] (0 for masked rows)
        eh_mask = e_mask[:, None] & h_mask[None, :]
        feat_mask = e_mask[:, None, None] & hd_mask[None, :, :]
        q = start + e
        dst = tl.load(rev_dst_ptr + q, mask=e_mask, other=0).to(tl.int64)
        pos = tl.load(rev_pos_ptr + q, mask=e_mask, other=0).to(tl.int64)
        eh_offs = dst[:, None] * H + offs_h[None, :]
        lse_i = tl.load(lse_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        delta_i = tl.load(delta_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        g_i = tl.load(grad_out_ptr + dst[:, None, None] * HD + hd_offs[None, :, :], mask=feat_mask,
                      other=0.0).to(acc_dtype)
        if SCORE == 0:
            dst_i = tl.load(dst_term_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
            src_e = add_edge_score(src_row, edge_score_ptr, q[:, None], offs_h[None, :], eh_mask, H, EDGE_SCORE)
            s = edge_scores(src_e, dst_i, negative_slope, negative_slope, 0)
        else:
            dst_i = gather_queries(dst_term_ptr, value_ptr, dst, e_mask, H, feat_stride, offs_h, h_mask, hd_offs,
                                   hd_mask, acc_dtype, KEY_SCALE)
            if SCORE == 2:
                dst_i = dst_i * scale
            s = edge_scores(src_row, dst_i, attn, negative_slope, SCORE)
        g_dot_val = tl.sum(g_i * val_row, axis=2)
        if EDGE:
            terms_offs = pos[:, None] * (2 * H) + offs_h[None, :]
            s += tl.load(terms_ptr + terms_offs, mask=eh_mask, other=0.0).to(acc_dtype)
            g_dot_val += tl.load(terms_ptr + terms_offs + H, mask=eh_mask, other=0.0).to(acc_dtype)
        alpha, alpha_dropped = _recomputed_weights(s, lse_i, eh_mask, pos[:, None], rng_offset + offs_h[None, :],
                                                   seed, dropout_p, keep_scale, DROPOUT)
        alpha_kept = edge_factor(alpha_dropped, q[:, None], e_mask[:, None], factor_ptr, FACTOR)
        store_factor_grad(grad_factor_ptr, alpha_dropped, g_dot_val, q, e_mask, FACTOR_GRAD, 1)
        if EDGE:
            replace_terms(terms_ptr, terms_offs, alpha_kept, eh_mask)
        grad_s = alpha_kept * g_dot_val - alpha * delta_i  # [ROWS, BLOCK_H]
        if SCORE == 0:
            grad_edge_head = tl.where(eh_mask, score_grad(grad_s, src_e, dst_i, attn, negative_slope, 0), 0.0)
            acc_src += grad_edge_head
            acc_val += alpha_kept[:, :, None] * g_i
        else:
            grad_edge_head = grad_s
            grad_src = score_grad(grad_s, src_row, dst_i, attn, negative_slope, SCORE)
            if SCORE == 1:
                acc_val += alpha_kept[:, :, None] * g_i + grad_src
                acc_src += attn_grad_terms(grad_s, src_row, dst_i, negative_slope)
            else:
                acc_val += alpha_kept[:, :, None] * g_i
                acc_src += grad_src
        tl.store(grad_s_ptr + pos[:, None] * H + offs_h[None, :], grad_edge_head.to(grad_s_ptr.dtype.element_ty),
                 mask=eh_mask)
    if SCORE == 0:
        tl.store(grad_src_ptr + rows[:, None] * H + offs_h[None, :], acc_src.to(grad_src_ptr.dtype.element_ty),
                 mask=rh_mask)
    elif KEY_SCALE:  # AGNN: ∂k folded into the rows' share of ∂h (kernels/normalize.py); no ∂k stored
        folded, _ = unit_grad(acc_src, val_row, r_row, r_row)
        acc_val += folded
    else:
        src_offs = rows[:, None, None] * _src_grad_stride(HD, grad_stride, SCORE) + hd_offs[None, :, :]
        tl.store(grad_src_ptr + src_offs, acc_src.to(grad_src_ptr.dtype.element_ty), mask=row_mask)
    tl.store(grad_value_ptr + rows[:, None, None] * grad_stride + hd_offs[None, :, :],
             acc_val.to(grad_value_ptr.dtype.element_ty), mask=row_mask)


@jit
def _src_light_rows(
    pid, rev_dst_ptr, rev_pos_ptr, rows_ptr, starts_ptr, stops_ptr,
    src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, terms_ptr, lse_ptr, grad_out_ptr, delta_ptr,
    grad_value_ptr, grad_src_ptr, grad_s_ptr, factor_ptr, grad_factor_ptr, edge_score_ptr,
    num_rows, H, D, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset, feat_stride, grad_stride,
    scores_ptr, slopes_ptr,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr, KEY_SCALE: tl.constexpr, FACTOR: tl.constexpr,
    FACTOR_GRAD: tl.constexpr, EDGE_SCORE: tl.constexpr, SLOPE_BITS: tl.constexpr,
):
    """The source pass for ``ROWS`` light source rows of program ``pid`` of their class, edges in one tile (GATv2
    with ``EDGE``: the forward's scores and slopes, as :func:`attention_backward_src_kernel`)."""
    acc_dtype = lse_ptr.dtype.element_ty
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    # q: reverse-CSR positions [ROWS, BLOCK_E]
    rows, r_mask, q, e_mask = light_edges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS, BLOCK_E)
    dst = tl.load(rev_dst_ptr + q, mask=e_mask, other=0).to(tl.int64)
    pos = tl.load(rev_pos_ptr + q, mask=e_mask, other=0).to(tl.int64)
    eh_mask = e_mask[:, :, None] & h_mask[None, None, :]                      # [ROWS, BLOCK_E, BLOCK_H]
    eh_offs = dst[:, :, None] * H + offs_h[None, None, :]
    lse_i = tl.load(lse_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
    delta_i = tl.load(delta_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
    rh_mask = r_mask[:, None] & h_mask[None, :]
    if KEY_SCALE:  # AGNN's fold (below): the rows' ĥ and scales, loaded before the edges' gathers
        r_row = tl.load(src_term_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask, other=0.0).to(acc_dtype)
        val_row = tl.load(value_ptr + rows[:, None, None] * feat_stride + hd_offs[None, :, :],
                          mask=r_mask[:, None, None] & hd_mask[None, :, :], other=0.0).to(acc_dtype)
    # Flatten (row, edge) for the feature tiles [ROWS * BLOCK_E, BLOCK_H, BLOCK_D].
    dst_flat = tl.reshape(dst, [ROWS * BLOCK_E])
    e_flat = tl.reshape(e_mask, [ROWS * BLOCK_E])
    rows_flat = tl.reshape(rows[:, None] + tl.zeros([ROWS, BLOCK_E], dtype=tl.int64), [ROWS * BLOCK_E])
    feat_mask = e_flat[:, None, None] & hd_mask[None, :, :]
    if SCORE == 0:
        dst_i = tl.load(dst_term_ptr + eh_offs, mask=eh_mask, other=0.0).to(acc_dtype)
        src_e = tl.load(src_term_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask,
                        other=0.0).to(acc_dtype)[:, None, :]
        src_e = add_edge_score(src_e, edge_score_ptr, q[:, :, None], offs_h[None, None, :], eh_mask, H, EDGE_SCORE)
        s = edge_scores(src_e, dst_i, negative_slope, negative_slope, SCORE)
        attn = s
    else:
        val_j = tl.load(value_ptr + rows_flat[:, None, None] * feat_stride + hd_offs[None, :, :], mask=feat_mask,
                        other=0.0).to(acc_dtype)
        dst_i = gather_queries(dst_term_ptr, value_ptr, dst_flat, e_flat, H, feat_stride, offs_h, h_mask, hd_offs,
                               hd_mask, acc_dtype, KEY_SCALE)
        if SCORE == 2:
            dst_i = dst_i * scale
        if SCORE == 1:
            src_e = val_j
        else:
            src_e, _ = gather_keys(src_term_ptr, value_ptr, rows_flat, e_flat, H, feat_stride, offs_h, h_mask, hd_offs,
                                   hd_mask, acc_dtype, KEY_SCALE)
        attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
        if EDGE and SCORE == 1:  # the forward's scores and slopes
            s = tl.load(scores_ptr + pos[:, :, None] * H + offs_h[None, None, :], mask=eh_mask, other=0.0).to(acc_dtype)
            slopes = slope_factors(slopes_ptr, tl.reshape(pos, [ROWS * BLOCK_E]), e_flat, negative_slope, acc_dtype,
                                   ROWS * BLOCK_E, BLOCK_H, BLOCK_D, SLOPE_BITS)
        else:
            s = tl.reshape(edge_scores(src_e, dst_i, attn, negative_slope, SCORE), [ROWS, BLOCK_E, BLOCK_H])
        if EDGE and SCORE == 2:
            terms_offs = pos[:, :, None] * (2 * H) + offs_h[None, None, :]
            s += tl.load(terms_ptr + terms_offs, mask=eh_mask, other=0.0).to(acc_dtype)
    alpha = tl.where(eh_mask, tl.exp(s - lse_i), 0.0)
    if DROPOUT:
        alpha_dropped = attention_dropout(alpha, pos[:, :, None], rng_offset + offs_h[None, None, :], seed, dropout_p,
                                          keep_scale)
    else:
        alpha_dropped = alpha
    alpha_kept = edge_factor(alpha_dropped, q[:, :, None], e_mask[:, :, None], factor_ptr, FACTOR)
    if EDGE and SCORE == 2:
        replace_terms(terms_ptr, terms_offs, alpha_kept, eh_mask)
    if SCORE == 0:
        # GAT's values are the source row's own features: one [ROWS, H, D] tile broadcast over the
        # row's edges against g gathered as [ROWS, BLOCK_E, H, D], not a per-edge copy of the row
        row_mask = r_mask[:, None, None] & hd_mask[None, :, :]
        val_row = tl.load(value_ptr + rows[:, None, None] * feat_stride + hd_offs[None, :, :], mask=row_mask,
                          other=0.0).to(acc_dtype)
        g_i = tl.load(grad_out_ptr + dst[:, :, None, None] * HD + hd_offs[None, None, :, :],
                      mask=e_mask[:, :, None, None] & hd_mask[None, None, :, :], other=0.0).to(acc_dtype)
        g_dot_val = tl.sum(g_i * val_row[:, None, :, :], axis=3)
        store_factor_grad(grad_factor_ptr, alpha_dropped, g_dot_val, q, e_mask, FACTOR_GRAD, 2)
        grad_s = alpha_kept * g_dot_val - alpha * delta_i
        grad_edge_head = tl.where(eh_mask, score_grad(grad_s, src_e, dst_i, attn, negative_slope, SCORE), 0.0)
        tl.store(grad_src_ptr + rows[:, None] * H + offs_h[None, :],
                 tl.sum(grad_edge_head, axis=1).to(grad_src_ptr.dtype.element_ty), mask=rh_mask)
        acc_val = tl.sum(alpha_kept[:, :, :, None] * g_i, axis=1)
        tl.store(grad_value_ptr + rows[:, None, None] * grad_stride + hd_offs[None, :, :],
                 acc_val.to(grad_value_ptr.dtype.element_ty), mask=row_mask)
    else:
        g_i = tl.load(grad_out_ptr + dst_flat[:, None, None] * HD + hd_offs[None, :, :], mask=feat_mask,
                      other=0.0).to(acc_dtype)
        kept_g = tl.reshape(alpha_kept, [ROWS * BLOCK_E, BLOCK_H])[:, :, None] * g_i
        g_dot_val = tl.reshape(tl.sum(g_i * val_j, axis=2), [ROWS, BLOCK_E, BLOCK_H])
        if EDGE and SCORE == 2:
            g_dot_val += tl.load(terms_ptr + terms_offs + H, mask=eh_mask, other=0.0).to(acc_dtype)
        store_factor_grad(grad_factor_ptr, alpha_dropped, g_dot_val, q, e_mask, FACTOR_GRAD, 2)
        grad_s = alpha_kept * g_dot_val - alpha * delta_i
        grad_edge_head = grad_s
        grad_s_flat = tl.reshape(grad_s, [ROWS * BLOCK_E, BLOCK_H])
        if EDGE and SCORE == 1:
            scaled = grad_s_flat[:, :, None] * slopes
            grad_src = scaled * attn
        else:
            grad_src = score_grad(grad_s_flat, src_e, dst_i, attn, negative_slope, SCORE)
        if SCORE == 1:
            grad_val = kept_g + grad_src
            if EDGE:  # e_p's share of ∂attn: the edge-gradient pass's
                src_terms = scaled * (src_e + dst_i)
            else:
                src_terms = attn_grad_terms(grad_s_flat, src_e, dst_i, negative_slope)
        else:
            grad_val = kept_g
            src_terms = grad_src
        acc_src = tl.sum(tl.reshape(src_terms, [ROWS, BLOCK_E, BLOCK_H * BLOCK_D]), axis=1)
        acc_val = tl.sum(tl.reshape(grad_val, [ROWS, BLOCK_E, BLOCK_H * BLOCK_D]), axis=1)
        if KEY_SCALE:  # AGNN: ∂k folded into the rows' share of ∂h (kernels/normalize.py); no ∂k stored
            folded, _ = unit_grad(tl.reshape(acc_src, [ROWS, BLOCK_H, BLOCK_D]), val_row, r_row, r_row)
            acc_val += tl.reshape(folded, [ROWS, BLOCK_H * BLOCK_D])
        else:
            tl.store(grad_src_ptr + rows[:, None] * _src_grad_stride(HD, grad_stride, SCORE) + c_offs[None, :],
                     acc_src.to(grad_src_ptr.dtype.element_ty), mask=r_mask[:, None] & c_mask[None, :])
        tl.store(grad_value_ptr + rows[:, None] * grad_stride + c_offs[None, :],
                 acc_val.to(grad_value_ptr.dtype.element_ty), mask=r_mask[:, None] & c_mask[None, :])
    tl.store(grad_s_ptr + pos[:, :, None] * H + offs_h[None, None, :],
             grad_edge_head.to(grad_s_ptr.dtype.element_ty), mask=eh_mask)


@jit
def _edge_sums_add(sums_b, sums_a, attr, grad_s, alpha_ptrs, alpha_mask, WEIGHT_GRAD: tl.constexpr):
    """Edge-feature sums plus one tile's terms, ``[M, BLOCK_H, BLOCK_K]``: ``B[m, h, k] += ∂s[m, h] · attr[m, k]``
    and (``WEIGHT_GRAD``) ``A[m, h, k] += α'[m, h] · attr[m, k]`` (``m`` a row, or an edge whose terms the
    caller sums per row), ``α' [M, BLOCK_H]`` loaded from ``alpha_ptrs`` (where ``alpha_mask``) only then."""
    sums_b += grad_s[:, :, None] * attr[:, None, :]
    if WEIGHT_GRAD:
        alpha_kept = tl.load(alpha_ptrs, mask=alpha_mask, other=0.0)
        sums_a += alpha_kept[:, :, None] * attr[:, None, :]
    return sums_b, sums_a


@jit
def _store_edge_sums(attr_sums_ptr, sums_b, sums_a, out_index, out_mask, H, K, offs_h, h_mask,
                     BLOCK_K: tl.constexpr):
    """The rows' ``A``, ``B`` (``[ROWS, BLOCK_H, BLOCK_K]``) into ``attr_sums [N, 2, H, K]`` at ``out_index [ROWS]``
    (where ``out_mask``)."""
    offs_k = tl.arange(0, BLOCK_K)
    hk = offs_h[:, None] * K + offs_k[None, :]
    hk_mask = h_mask[:, None] & (offs_k < K)[None, :]
    offs = out_index[:, None, None] * (2 * K * H) + hk[None, :, :]
    mask = out_mask[:, None, None] & hk_mask[None, :, :]
    tl.store(attr_sums_ptr + offs, sums_a.to(attr_sums_ptr.dtype.element_ty), mask=mask)
    tl.store(attr_sums_ptr + K * H + offs, sums_b.to(attr_sums_ptr.dtype.element_ty), mask=mask)


@jit
def attention_backward_dst_kernel(
    src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr,
    w_edge_ptr, grad_s_ptr, terms_ptr, grad_dst_ptr, attr_sums_ptr,
    H, D, K, negative_slope, scale, feat_stride, grad_stride, piece_dst_ptr, piece_sums_ptr, num_pieces,
    piece_super_ptr, piece_ptr, piece_count_ptr,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    PIECES: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr,
    KEY_SCALE: tl.constexpr, WEIGHT_GRAD: tl.constexpr, LANES: tl.constexpr,
    PREFETCH: tl.constexpr = False, EDGE_FORM: tl.constexpr = 0, ATTR_AHEAD: tl.constexpr = False,
    MERGE: tl.constexpr = False, MERGE_P: tl.constexpr = 1, MERGE_W: tl.constexpr = 1, SUMS_P: tl.constexpr = 1,
    SUMS_W: tl.constexpr = 1, EDGE_DOT: tl.constexpr = False, slopes_ptr=None, SLOPE_BITS: tl.constexpr = 32,
    addend_ptr=None, beta_part_ptr=None, beta_pieces=0,
):
    """``∂L/∂dst_i = Σ_{j->i} ∂s/∂dst · ∂L/∂s_ij`` for GATv2 (``∂L/∂fd``) and the dot score
    (``∂L/∂q``, the keys gathered again), from the source pass's ``∂L/∂s`` at CSR positions.
    With ``EDGE`` no edge is projected: the row sums ``B = Σ_p ∂s_p ⊗ attr_p`` give the key path's edge
    term ``Σ_k B[k] W[k]`` after the loop, and (``WEIGHT_GRAD``) ``A = Σ_p α'_p ⊗ attr_p`` — ``α'_p`` as the
    source pass stored it in ``terms[p, 0]`` — with ``B`` go to ``attr_sums``.  ``PREFETCH``: each edge
    block's source indices loaded one trip ahead (with ``ATTR_AHEAD`` its edge ids too, so that a trip's edge
    features wait on no id load of their own); ``EDGE_FORM`` as the forward row kernel's.  ``PIECES=2``: the
    ``num_pieces`` super-row pieces first (their partials to ``piece_dst`` / ``piece_sums``, at the piece
    index), then the medium rows, in one launch; with ``MERGE`` the last piece of each super row to finish sums
    that row's partials into ``grad_dst`` (and ``attr_sums``) (:mod:`gnnfuse.kernels.merge`; ``MERGE_P`` /
    ``MERGE_W``, ``SUMS_P`` / ``SUMS_W``: its tiles).  GATv2 with ``EDGE``: no source gathered, no edge projected,
    ``∂z`` from ``∂s`` and the LeakyReLU's slopes the source pass stored (``slopes``,
    :func:`~gnnfuse.kernels.edge_features.slope_grad`); no sums (``WEIGHT_GRAD`` off: the edge gradients are
    :func:`~gnnfuse.kernels.edge_features.gatv2_edge_grad_kernel`'s).  ``KEY_SCALE`` (AGNN): ``∂q`` folded into
    ``∂h`` as it is stored (:func:`_fold`, its inputs loaded before the edge loop): ``grad_dst`` is ``∂h``, a row's
    ``addend`` (the source pass's ``P``) added to it (by the merge for a split row), and the item's ``∂β`` term
    stored at ``beta_part[row]`` (a piece's at ``beta_part[beta_pieces + piece]``)."""
    tl.static_assert(not (EDGE and SCORE == 1 and (WEIGHT_GRAD or ATTR_AHEAD)), "GATv2's edge features: no sums")
    acc_dtype = grad_s_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    row, start, stop, out_index = item_edges(pid, rows_ptr, starts_ptr, stops_ptr, PIECES == 1)
    dst_i = row_query(dst_term_ptr, value_ptr, row, H, feat_stride, offs_h, h_mask, hd_offs, hd_mask, acc_dtype,
                      KEY_SCALE)
    if KEY_SCALE:  # AGNN's fold: what it reads, loaded before the edge loop (its latency hidden behind the gathers)
        one_row = row + tl.arange(0, 1)
        fold_h, fold_r, fold_c, fold_add = _fold_inputs(
            one_row, one_row >= 0, src_term_ptr, dst_term_ptr, value_ptr, addend_ptr, H, feat_stride, grad_stride,
            offs_h, h_mask, hd_offs, hd_mask, acc_dtype)
    attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    if LANES:
        acc = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_D], dtype=acc_dtype)
    else:
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=acc_dtype)
    if EDGE and SCORE == 2:
        sums_a = tl.zeros([BLOCK_H, BLOCK_K], dtype=acc_dtype)
        sums_b = tl.zeros([BLOCK_H, BLOCK_K], dtype=acc_dtype)
    if PREFETCH:
        src_next = tl.load(src_ptr + start + offs_e, mask=start + offs_e < stop, other=0)
        if EDGE and ATTR_AHEAD:
            eid_next = tl.load(eid_ptr + start + offs_e, mask=start + offs_e < stop, other=0)
    for e0 in range(start, stop, BLOCK_E):
        pos = e0 + offs_e
        e_mask = pos < stop
        eh_mask = e_mask[:, None] & h_mask[None, :]
        if PREFETCH:
            src = src_next.to(tl.int64)
            src_next = tl.load(src_ptr + pos + BLOCK_E, mask=pos + BLOCK_E < stop, other=0)
        else:
            src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        grad_s = tl.load(grad_s_ptr + pos[:, None] * H + offs_h[None, :], mask=eh_mask, other=0.0)
        if EDGE and SCORE == 1:
            acc = lane_add(acc, slope_grad(slopes_ptr, pos, e_mask, grad_s, attn, negative_slope, BLOCK_E, BLOCK_H,
                                           BLOCK_D, SLOPE_BITS), LANES)
        else:
            src_j, _ = gather_keys(src_term_ptr, value_ptr, src, e_mask, H, feat_stride, offs_h, h_mask, hd_offs,
                                   hd_mask, acc_dtype, KEY_SCALE)
        if EDGE and SCORE == 2:
            if PREFETCH and ATTR_AHEAD:
                eid = eid_next.to(tl.int64)
                eid_next = tl.load(eid_ptr + pos + BLOCK_E, mask=pos + BLOCK_E < stop, other=0)
            else:
                eid = tl.load(eid_ptr + pos, mask=e_mask, other=0).to(tl.int64)
            attr = edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype, BLOCK_K)                  # [BLOCK_E, BLOCK_K]
            terms_b, terms_a = _edge_sums_add(tl.zeros([BLOCK_E, BLOCK_H, BLOCK_K], dtype=acc_dtype),
                                              tl.zeros([BLOCK_E, BLOCK_H, BLOCK_K], dtype=acc_dtype),
                                              attr, grad_s, terms_ptr + pos[:, None] * (2 * H) + offs_h[None, :],
                                              eh_mask, WEIGHT_GRAD)
            sums_b += tl.sum(terms_b, axis=0)
            if WEIGHT_GRAD:
                sums_a += tl.sum(terms_a, axis=0)
        if SCORE == 2:
            src_j = src_j * scale
        if EDGE and SCORE == 1:
            pass  # the slopes' ∂z, above
        else:
            acc = lane_add(acc, score_grad(grad_s, dst_i, src_j, attn, negative_slope, SCORE), LANES)
    acc = lane_total(acc, LANES)
    if EDGE and SCORE == 2:
        row_b = tl.reshape(sums_b, [1, BLOCK_H, BLOCK_K])
        acc += tl.reshape(rows_edge_values(row_b, w_edge_ptr, K, HD, hd_offs, hd_mask, BLOCK_K, EDGE_FORM),
                          [BLOCK_H, BLOCK_D]) * scale
        if WEIGHT_GRAD:
            row_a = tl.reshape(sums_a, [1, BLOCK_H, BLOCK_K])
            one = tl.full([1], True, tl.int1)
            if PIECES == 2:  # the pieces first, their sums to the piece buffer
                if pid < num_pieces:
                    _store_edge_sums(piece_sums_ptr, row_b, row_a, pid + tl.zeros([1], dtype=tl.int64), one, H, K,
                                     offs_h, h_mask, BLOCK_K)
                else:
                    _store_edge_sums(attr_sums_ptr, row_b, row_a, row + tl.zeros([1], dtype=tl.int64), one, H, K,
                                     offs_h, h_mask, BLOCK_K)
            else:
                _store_edge_sums(attr_sums_ptr, row_b, row_a, out_index + tl.zeros([1], dtype=tl.int64), one, H, K,
                                 offs_h, h_mask, BLOCK_K)
    if KEY_SCALE:  # AGNN: ∂q folded into ∂h (kernels/normalize.py)
        if PIECES == 2:
            piece = pid < num_pieces
        else:
            piece = PIECES == 1
        # a piece's partial takes no P: the merge adds it once
        folded, beta_term = _fold(tl.reshape(acc, [1, BLOCK_H, BLOCK_D]), fold_h, fold_r, fold_c,
                                  tl.where(piece, 0.0, fold_add))
        acc = tl.reshape(folded, [BLOCK_H, BLOCK_D])
        tl.store(beta_part_ptr + tl.where(piece, beta_pieces + pid, row) + tl.arange(0, 1), beta_term)
    if PIECES == 2:
        if pid < num_pieces:  # a piece's partial, contiguous in the piece buffer
            tl.store(piece_dst_ptr + pid * HD + hd_offs, acc.to(piece_dst_ptr.dtype.element_ty), mask=hd_mask)
            if MERGE:  # the last piece of the row to finish sums the row's pieces
                merger, merge_from, merge_to = last_piece(pid, piece_super_ptr, piece_ptr, piece_count_ptr)
                if merger:
                    merge_sums(merge_from, merge_to, row, piece_dst_ptr, grad_dst_ptr, HD, grad_stride, MERGE_P,
                               MERGE_W, addend_ptr, KEY_SCALE)
                    if EDGE and SCORE == 2 and WEIGHT_GRAD:
                        sums_width = 2 * H * K
                        merge_sums(merge_from, merge_to, row, piece_sums_ptr, attr_sums_ptr, sums_width, sums_width,
                                   SUMS_P, SUMS_W)
        else:
            tl.store(grad_dst_ptr + row * grad_stride + hd_offs, acc.to(grad_dst_ptr.dtype.element_ty), mask=hd_mask)
    else:
        tl.store(grad_dst_ptr + out_index * grad_stride + hd_offs, acc.to(grad_dst_ptr.dtype.element_ty),
                 mask=hd_mask)


@jit
def _fold_inputs(rows, mask, src_term_ptr, dst_term_ptr, value_ptr, addend_ptr, H, feat_stride, grad_stride, offs_h,
                 h_mask, hd_offs, hd_mask, acc_dtype: tl.constexpr):
    """AGNN's fold of ``∂q`` into ``∂h`` for rows ``rows [M]`` (where ``mask``), what it reads: ``(h, r, c, P)`` —
    the values ``[M, BLOCK_H, BLOCK_D]``, ``r`` (the source-term slot) and ``c = β r`` (the destination-term slot)
    ``[M, BLOCK_H]``, and the source pass's ``P`` (``addend``, rows ``grad_stride`` apart) — for :func:`_fold`.  The
    destination kernels load them before their edge loop: after it, in a program of a few short trips, the loads'
    latency was most of what the fold cost."""
    rh_offs = rows[:, None] * H + offs_h[None, :]
    rh_mask = mask[:, None] & h_mask[None, :]
    feat_mask = mask[:, None, None] & hd_mask[None, :, :]
    h = tl.load(value_ptr + rows[:, None, None] * feat_stride + hd_offs[None, :, :], mask=feat_mask,
                other=0.0).to(acc_dtype)
    r = tl.load(src_term_ptr + rh_offs, mask=rh_mask, other=0.0).to(acc_dtype)
    c = tl.load(dst_term_ptr + rh_offs, mask=rh_mask, other=0.0).to(acc_dtype)
    addend = tl.load(addend_ptr + rows[:, None, None] * grad_stride + hd_offs[None, :, :], mask=feat_mask,
                     other=0.0).to(acc_dtype)
    return h, r, c, addend


@jit
def _fold(grad_q, h, r, c, addend):
    """``(addend + c (∂q − ĥ (ĥ · ∂q)), Σ_h ĥ · ∂q)`` of ``[M, BLOCK_H, BLOCK_D]`` rows from :func:`_fold_inputs`
    (:func:`~gnnfuse.kernels.normalize.unit_grad`): their ``∂h`` (or a piece's share of it, ``addend`` 0) and their
    terms of ``∂β``."""
    folded, dot = unit_grad(grad_q, h, r, c)
    return folded + addend, tl.sum(dot, axis=1)


@jit
def attention_backward_dst_light_kernel(
    src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr,
    w_edge_ptr, grad_s_ptr, terms_ptr, grad_dst_ptr, attr_sums_ptr,
    n0, n1, n2, n3, n4, n5, n6, H, D, K, negative_slope, scale, feat_stride, grad_stride,
    LIGHT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    SCORE: tl.constexpr, EDGE: tl.constexpr, KEY_SCALE: tl.constexpr, WEIGHT_GRAD: tl.constexpr,
    UNROLLED: tl.constexpr = False, EDGE_DOT: tl.constexpr = False, slopes_ptr=None, SLOPE_BITS: tl.constexpr = 32,
    addend_ptr=None, beta_part_ptr=None,
):
    """The destination pass over the light width classes of ``LIGHT`` in one launch (as
    :func:`~gnnfuse.kernels.attention_forward.attention_forward_light_kernel`; ``UNROLLED``:
    :func:`_dst_light_unrolled`); ``EDGE``: the edge sums of :func:`attention_backward_dst_kernel` (GATv2: its
    stored slopes, in the tile form only); ``KEY_SCALE`` (AGNN): ``∂h`` stored, ``addend`` added and the rows' ``∂β``
    terms stored at ``beta_part[row]``, as there."""
    tl.static_assert(not (EDGE and SCORE == 1 and (UNROLLED or WEIGHT_GRAD)), "GATv2's edge features: the tile form")
    pid = tl.program_id(0).to(tl.int64)
    first = pid * 0
    row0 = pid * 0
    # slot k: the class of width 2**k; its LIGHT field f = log2(rows per program) + 1 (a static loop over
    # the values f can take, so that rows and width reach the class's code as constexprs)
    for k in tl.static_range(7):  # tiles.LIGHT_SLOTS
        for f in tl.static_range(1, 16):  # 4 bits per slot (tiles.pack_light)
            if ((ONE * LIGHT) >> (4 * k)) & 15 == f:
                count = light_slot_count(k, n0, n1, n2, n3, n4, n5, n6)
                programs = (count + (ONE << (f - 1)) - 1) >> (f - 1)
                local = pid - first
                if (local >= 0) & (local < programs):
                    if UNROLLED:
                        _dst_light_unrolled(
                            local, src_ptr, eid_ptr, rows_ptr + row0, starts_ptr + row0, stops_ptr + row0,
                            src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_edge_ptr, grad_s_ptr,
                            terms_ptr, grad_dst_ptr, attr_sums_ptr, count, H, D, K, negative_slope, scale,
                            feat_stride, grad_stride, ONE << (f - 1), ONE << k, BLOCK_H, BLOCK_D, BLOCK_K, SCORE,
                            EDGE, KEY_SCALE, WEIGHT_GRAD, addend_ptr, beta_part_ptr,
                        )
                    else:
                        _dst_light_rows(
                            local, src_ptr, eid_ptr, rows_ptr + row0, starts_ptr + row0, stops_ptr + row0,
                            src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_edge_ptr, grad_s_ptr,
                            terms_ptr, grad_dst_ptr, attr_sums_ptr, count, H, D, K, negative_slope, scale,
                            feat_stride, grad_stride, ONE << (f - 1), ONE << k, BLOCK_H, BLOCK_D, BLOCK_K, SCORE,
                            EDGE, KEY_SCALE, WEIGHT_GRAD, EDGE_DOT, slopes_ptr, SLOPE_BITS, addend_ptr, beta_part_ptr,
                        )
                first += programs
                row0 += count


@jit
def _dst_light_unrolled(
    pid, src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr,
    w_edge_ptr, grad_s_ptr, terms_ptr, grad_dst_ptr, attr_sums_ptr, num_rows, H, D, K, negative_slope, scale,
    feat_stride, grad_stride, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr, KEY_SCALE: tl.constexpr,
    WEIGHT_GRAD: tl.constexpr, addend_ptr, beta_part_ptr,
):
    """The destination pass (GATv2, dot) for ``ROWS`` light rows, the edge slots unrolled: the row's own
    term read once, slot ``e`` gathering the rows' ``e``-th sources as ``[ROWS, BLOCK_H, BLOCK_D]`` tiles
    with their ``∂s`` and adding ``∂s/∂dst · ∂s`` into the row's sum (``EDGE``: and the slot's edge features
    into the rows' sums, as :func:`attention_backward_dst_kernel`)."""
    acc_dtype = grad_s_ptr.dtype.element_ty
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    _, r_mask, rows, start, degree = row_ranges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS)
    row_mask = r_mask[:, None, None] & hd_mask[None, :, :]
    dst_row = gather_queries(dst_term_ptr, value_ptr, rows, r_mask, H, feat_stride, offs_h, h_mask, hd_offs, hd_mask,
                             acc_dtype, KEY_SCALE)
    if KEY_SCALE:  # AGNN's fold (kernels/normalize.py): its inputs before the edge slots
        fold_h, fold_r, fold_c, fold_add = _fold_inputs(
            rows, r_mask, src_term_ptr, dst_term_ptr, value_ptr, addend_ptr, H, feat_stride, grad_stride, offs_h,
            h_mask, hd_offs, hd_mask, acc_dtype)
    attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    acc = tl.zeros([ROWS, BLOCK_H, BLOCK_D], dtype=acc_dtype)
    if EDGE:
        sums_a = tl.zeros([ROWS, BLOCK_H, BLOCK_K], dtype=acc_dtype)
        sums_b = tl.zeros([ROWS, BLOCK_H, BLOCK_K], dtype=acc_dtype)
    for e in tl.static_range(BLOCK_E):
        e_mask = e < degree                                                    # [ROWS] (0 for masked rows)
        eh_mask = e_mask[:, None] & h_mask[None, :]
        pos = start + e
        src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        grad_s = tl.load(grad_s_ptr + pos[:, None] * H + offs_h[None, :], mask=eh_mask, other=0.0)
        src_j, _ = gather_keys(src_term_ptr, value_ptr, src, e_mask, H, feat_stride, offs_h, h_mask, hd_offs,
                               hd_mask, acc_dtype, KEY_SCALE)
        if EDGE:
            eid = tl.load(eid_ptr + pos, mask=e_mask, other=0).to(tl.int64)
            attr = edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype, BLOCK_K)                  # [ROWS, BLOCK_K]
            sums_b, sums_a = _edge_sums_add(sums_b, sums_a, attr, grad_s,
                                            terms_ptr + pos[:, None] * (2 * H) + offs_h[None, :], eh_mask,
                                            WEIGHT_GRAD)
        if SCORE == 2:
            src_j = src_j * scale
        acc += score_grad(grad_s, dst_row, src_j, attn, negative_slope, SCORE)
    if EDGE:
        acc += rows_edge_values(sums_b, w_edge_ptr, K, HD, hd_offs, hd_mask, BLOCK_K, 1) * scale
        if WEIGHT_GRAD:
            _store_edge_sums(attr_sums_ptr, sums_b, sums_a, rows, r_mask, H, K, offs_h, h_mask, BLOCK_K)
    if KEY_SCALE:  # AGNN: ∂q folded into ∂h (kernels/normalize.py)
        acc, beta_term = _fold(acc, fold_h, fold_r, fold_c, fold_add)
        tl.store(beta_part_ptr + rows, beta_term, mask=r_mask)
    tl.store(grad_dst_ptr + rows[:, None, None] * grad_stride + hd_offs[None, :, :],
             acc.to(grad_dst_ptr.dtype.element_ty), mask=row_mask)


@jit
def _dst_light_rows(
    pid, src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr,
    w_edge_ptr, grad_s_ptr, terms_ptr, grad_dst_ptr, attr_sums_ptr, num_rows, H, D, K, negative_slope, scale,
    feat_stride, grad_stride, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr, KEY_SCALE: tl.constexpr,
    WEIGHT_GRAD: tl.constexpr, EDGE_DOT: tl.constexpr, slopes_ptr, SLOPE_BITS: tl.constexpr, addend_ptr, beta_part_ptr,
):
    """The destination pass for ``ROWS`` light rows of program ``pid`` of their class, edges in one tile (GATv2
    with ``EDGE``: ``∂z`` from ``∂s`` and the stored slopes, :func:`~gnnfuse.kernels.edge_features.slope_grad`, no
    source gathered)."""
    acc_dtype = grad_s_ptr.dtype.element_ty
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    rows, r_mask, pos, e_mask = light_edges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS, BLOCK_E)
    if KEY_SCALE:  # AGNN's fold (kernels/normalize.py): its inputs before the edges' gathers
        fold_h, fold_r, fold_c, fold_add = _fold_inputs(
            rows, r_mask, src_term_ptr, dst_term_ptr, value_ptr, addend_ptr, H, feat_stride, grad_stride, offs_h,
            h_mask, hd_offs, hd_mask, acc_dtype)
    # Flatten (row, edge) for the feature tiles [ROWS * BLOCK_E, BLOCK_H, BLOCK_D].
    pos_flat = tl.reshape(pos, [ROWS * BLOCK_E])
    e_flat = tl.reshape(e_mask, [ROWS * BLOCK_E])
    rows_flat = tl.reshape(rows[:, None] + tl.zeros([ROWS, BLOCK_E], dtype=tl.int64), [ROWS * BLOCK_E])
    eh_flat = e_flat[:, None] & h_mask[None, :]
    grad_s = tl.load(grad_s_ptr + pos_flat[:, None] * H + offs_h[None, :], mask=eh_flat, other=0.0)
    attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    if EDGE and SCORE == 1:
        terms = slope_grad(slopes_ptr, pos_flat, e_flat, grad_s, attn, negative_slope, ROWS * BLOCK_E, BLOCK_H,
                           BLOCK_D, SLOPE_BITS)
    else:
        src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        src_j, _ = gather_keys(src_term_ptr, value_ptr, tl.reshape(src, [ROWS * BLOCK_E]), e_flat, H, feat_stride,
                               offs_h, h_mask, hd_offs, hd_mask, acc_dtype, KEY_SCALE)
        dst_i = gather_queries(dst_term_ptr, value_ptr, rows_flat, e_flat, H, feat_stride, offs_h, h_mask, hd_offs,
                               hd_mask, acc_dtype, KEY_SCALE)
        if SCORE == 2:
            src_j = src_j * scale
        terms = score_grad(grad_s, dst_i, src_j, attn, negative_slope, SCORE)
    acc = tl.reshape(tl.sum(tl.reshape(terms, [ROWS, BLOCK_E, BLOCK_H * BLOCK_D]), axis=1), [ROWS, BLOCK_H, BLOCK_D])
    if EDGE and SCORE == 2:
        eid = tl.load(eid_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        attr = edge_attr_tile(attr_ptr, tl.reshape(eid, [ROWS * BLOCK_E]), e_flat, K, acc_dtype, BLOCK_K)
        zeros = tl.zeros([ROWS * BLOCK_E, BLOCK_H, BLOCK_K], dtype=acc_dtype)
        terms_b, terms_a = _edge_sums_add(zeros, zeros, attr, grad_s,
                                          terms_ptr + pos_flat[:, None] * (2 * H) + offs_h[None, :], eh_flat,
                                          WEIGHT_GRAD)
        sums_b = tl.reshape(tl.sum(tl.reshape(terms_b, [ROWS, BLOCK_E, BLOCK_H * BLOCK_K]), axis=1),
                            [ROWS, BLOCK_H, BLOCK_K])
        acc += rows_edge_values(sums_b, w_edge_ptr, K, HD, hd_offs, hd_mask, BLOCK_K, 1) * scale
        if WEIGHT_GRAD:
            sums_a = tl.reshape(tl.sum(tl.reshape(terms_a, [ROWS, BLOCK_E, BLOCK_H * BLOCK_K]), axis=1),
                                [ROWS, BLOCK_H, BLOCK_K])
            _store_edge_sums(attr_sums_ptr, sums_b, sums_a, rows, r_mask, H, K, offs_h, h_mask, BLOCK_K)
    if KEY_SCALE:  # AGNN: ∂q folded into ∂h (kernels/normalize.py)
        acc, beta_term = _fold(acc, fold_h, fold_r, fold_c, fold_add)
        tl.store(beta_part_ptr + rows, beta_term, mask=r_mask)
    tl.store(grad_dst_ptr + rows[:, None, None] * grad_stride + hd_offs[None, :, :],
             acc.to(grad_dst_ptr.dtype.element_ty), mask=r_mask[:, None, None] & hd_mask[None, :, :])


@jit
def _row_sum_items(pid, rows_ptr, starts_ptr, stops_ptr, values_ptr, out_ptr, num_rows, W,
                   ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr, PIECES: tl.constexpr):
    """Items ``pid·ROWS ..`` of a schedule list: ``out[row, :W] = Σ_{p in the item's CSR range} values[p, :W]``
    (``[ROWS, BLOCK_E]`` edge tiles up to the largest degree among them), written at the item's position in the
    list instead of its row with ``PIECES``."""
    offs_w = tl.arange(0, BLOCK_W)
    w_mask = offs_w < W
    offs_r, r_mask, rows, start, degree = row_ranges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS)
    offs_e = tl.arange(0, BLOCK_E)
    acc = tl.zeros([ROWS, BLOCK_W], dtype=values_ptr.dtype.element_ty)
    for e0 in range(0, tl.max(degree, axis=0), BLOCK_E):
        e_mask = (e0 + offs_e)[None, :] < degree[:, None]
        pos = start[:, None] + e0 + offs_e[None, :]
        mask = e_mask[:, :, None] & w_mask[None, None, :]
        acc += tl.sum(tl.load(values_ptr + pos[:, :, None] * W + offs_w[None, None, :], mask=mask, other=0.0), axis=1)
    if PIECES:
        out_index = offs_r
    else:
        out_index = rows
    tl.store(out_ptr + out_index[:, None] * W + offs_w[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=r_mask[:, None] & w_mask[None, :])


@jit
def row_sum_kernel(
    rows_ptr, starts_ptr, stops_ptr, values_ptr, out_ptr, num_rows, W,
    piece_super_ptr, piece_ptr, piece_count_ptr, merged_ptr,
    ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr, PIECES: tl.constexpr,
    MERGE: tl.constexpr = False, MERGE_P: tl.constexpr = 1,
):
    """``out[row, :W] = Σ_{p in the row's CSR range} values[p, :W]`` for ``ROWS`` items per program
    (rows of any degree: ``[ROWS, BLOCK_E]`` edge tiles up to the largest degree among them; items
    sorted by degree waste little), written per item instead of per row with ``PIECES``; with ``MERGE``
    (pieces, one a program) the last piece of each super row to finish sums that row's pieces into
    ``merged[row, :W]`` (:mod:`gnnfuse.kernels.merge`)."""
    pid = tl.program_id(0).to(tl.int64)
    _row_sum_items(pid, rows_ptr, starts_ptr, stops_ptr, values_ptr, out_ptr, num_rows, W, ROWS, BLOCK_E, BLOCK_W,
                   PIECES)
    if MERGE:
        tl.static_assert(PIECES and ROWS == 1, "MERGE: one piece a program")
        merger, merge_from, merge_to = last_piece(pid, piece_super_ptr, piece_ptr, piece_count_ptr)
        if merger:
            merge_sums(merge_from, merge_to, tl.load(rows_ptr + pid).to(tl.int64), out_ptr, merged_ptr, W, W, MERGE_P,
                       BLOCK_W)


@jit
def row_sums_kernel(
    light_rows_ptr, light_starts_ptr, light_stops_ptr, num_light, light_programs,
    rows_ptr, starts_ptr, stops_ptr, num_items, num_pieces, values_ptr, out_ptr, piece_out_ptr, W,
    piece_super_ptr, piece_ptr, piece_count_ptr,
    LIGHT_ROWS: tl.constexpr, LIGHT_E: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_W: tl.constexpr,
    MERGE_P: tl.constexpr,
):
    """Every row sum of one CSR in one launch (:func:`row_sum_kernel`'s three launches in one): programs
    ``0 .. light_programs`` take the light rows, ``LIGHT_ROWS`` each in ``[LIGHT_ROWS, LIGHT_E]`` tiles; each later
    program one item of ``rows`` (``num_items``), whose first ``num_pieces`` are the pieces of split rows — a
    piece's partial goes to ``piece_out[piece]``, and the last piece of each split row to finish sums the row's
    partials into ``out[row]`` (:mod:`gnnfuse.kernels.merge`, its count at ``piece_count_ptr``) — and the rest
    whole rows."""
    pid = tl.program_id(0).to(tl.int64)
    if pid < light_programs:
        _row_sum_items(pid, light_rows_ptr, light_starts_ptr, light_stops_ptr, values_ptr, out_ptr, num_light, W,
                       LIGHT_ROWS, LIGHT_E, BLOCK_W, False)
    else:
        item = pid - light_programs
        if item < num_pieces:
            _row_sum_items(item, rows_ptr, starts_ptr, stops_ptr, values_ptr, piece_out_ptr, num_items, W, 1, BLOCK_E,
                           BLOCK_W, True)
            merger, merge_from, merge_to = last_piece(item, piece_super_ptr, piece_ptr, piece_count_ptr)
            if merger:
                merge_sums(merge_from, merge_to, tl.load(rows_ptr + item).to(tl.int64), piece_out_ptr, out_ptr, W, W,
                           MERGE_P, BLOCK_W)
        else:
            _row_sum_items(item, rows_ptr, starts_ptr, stops_ptr, values_ptr, out_ptr, num_items, W, 1, BLOCK_E,
                           BLOCK_W, False)
