"""Fused attention forward: edge scores, softmax over incoming edges and aggregation in one pass.

For destination row ``i`` with incoming edges ``j -> i`` (CSR positions ``p``), all heads ``h``,
the score ``s_ijh`` selected by the constexpr ``SCORE`` (:mod:`gnnfuse.kernels.scores`: GAT,
GATv2 or scaled dot product) and values ``val_j`` (``Wh_j``, ``fs_j`` or ``v_j``)::

    lse_ih = log Σ_j exp(s_ijh)                    (online: running max m and sum l)
    α_ijh  = exp(s_ijh − lse_ih) · keep_ph / (1 − p_drop)  (· w_p with ``FACTOR``)
    out_i  = Σ_j α_ijh (val_j + e_p)[h, :]

``e_p = W_e · attr_p`` (``EDGE``) is the edge feature at CSR position ``p``
(input edge ``eid[p]``: ``attr`` is read in the caller's edge order), added to the key and to the value, as
in PyG's TransformerConv; never stored (:mod:`gnnfuse.kernels.edge_features`): the light tiles project it in
registers, the row kernel and the unrolled light rows never form it (``W_e`` applied once per row).  With the GATv2
score (PyG's GATv2Conv) ``e_p`` is added to ``fs_j`` inside the LeakyReLU, ``s = a · LeakyReLU(fs_j + fd_i + e_p)``,
and not to the value: the light tiles (never unrolled then) and the row kernel (``EDGE_DOT``: one product a block;
3: rank-1 updates unrolled) project every edge block (:func:`~gnnfuse.kernels.edge_features.add_edge_vectors`), and
with ``SAVE`` (a training forward) store each edge's score and LeakyReLU slope bits at its CSR position for the
backward, which then projects nothing (:func:`~gnnfuse.kernels.edge_features.save_scores`).
``keep_ph = uniform(seed, stream=p, position=offset + h) >= p_drop`` is attention dropout, regenerated in the backward
pass from the same counter, never stored; ``w_p = factor[p]`` (``FACTOR``, a per-edge factor in CSR order, DGL
GATConv's ``edge_weight``: :mod:`gnnfuse.kernels.dropout`) scales the kept weight, not the softmax's sum.  With
``EDGE_SCORE`` (GAT only) ``s_ijh = LeakyReLU(el_j + er_i + ee_ph)``, ``ee = edge_score [E, H]`` in CSR order and the
accumulation dtype (PyG GATConv's edge term, :func:`~gnnfuse.kernels.scores.add_edge_score`).  Only ``lse [N, H]``
is written beside the output.
With ``ADD`` a term ``add[i]`` (a bias, ``add_stride = 0``, or a per-node tensor, ``add_stride =
H·D``) is added to the output as it is stored (the layer's bias or root term without a pass of
its own); with ``FINAL`` (training) ``out`` keeps the attention's own output in the accumulation
dtype for the backward and ``final`` gets ``out (+ add)`` in the values' dtype, stored at once
(:func:`~gnnfuse.kernels.tiles.store_output`).

Two kernels, by row kind (:mod:`gnnfuse.schedule`):

* :func:`attention_forward_light_kernel` — every light width class in one launch, each program
  running :func:`_forward_light_rows` for ``ROWS`` light rows of its class, all their edges in one
  ``[ROWS, BLOCK_E]`` tile (``BLOCK_E >=`` the rows' degree): an exact softmax per row, no loop;
* :func:`attention_forward_rows_kernel` — one item per program, its edges in blocks of
  ``BLOCK_E`` with an online softmax (``LANES``: a running max, sum and output per edge lane,
  merged once after the loop, so the loop has no reduction across threads; otherwise one
  state per row, reduced over the block every trip).  An item is a whole medium row (``PIECES=False``:
  final output written at the row) or one piece of a split super row (``PIECES=True``: the
  normalized partial output and its logsumexp written at the piece index, merged later by
  :mod:`gnnfuse.kernels.merge`); ``PIECES=2`` runs both in one launch, the ``num_pieces`` pieces
  first (their partials to ``piece_out`` / ``piece_lse``), then the medium rows; with ``MERGE`` the last
  piece of each super row to finish merges that row's pieces (``piece_super``, ``piece_ptr``: the
  schedule's piece → super row map and piece ranges; ``piece_count``: one zeroed int32 count per
  super row) instead of a merge launch.  Edge ranges
  ``starts[i] : stops[i]`` come from the schedule.

Heads and head size are padded to powers of two (``BLOCK_H``, ``BLOCK_D``) and masked;
accumulation is in the dtype of ``lse`` (float32, or float64 for float64 inputs).  Pointer
arguments a score does not use (``attn`` outside GATv2, ``value`` for GATv2, ``attr`` and
``w_edge`` without ``EDGE``) are never read.  The ``[N, H, D]`` inputs (keys, queries, values; GATv2's
two sides) share a row stride ``feat_stride`` (``H·D`` when contiguous; larger when they are column
blocks of one ``[N, W]`` projection output, read in place); heads and features within a row are contiguous.

Bytes per launch (the gather floor): ``E·H·D`` value elements gathered (GATv2: the same tile
scores and aggregates; dot: keys and values, ``2·E·H·D``; GAT: ``E·H`` node scores), ``E``
source ids, ``N·H·D`` outputs and ``N·H`` lse written; with ``EDGE`` ``E·K`` raw edge features.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.softmax import online_update

from .dropout import attention_dropout, dropout_seed, edge_factor
from .edge_features import (
    add_edge_vectors,
    edge_attr_tile,
    edge_weight_tile,
    project_edges,
    rows_edge_terms,
    rows_edge_values,
    save_scores,
)
from .merge import last_piece, merge_lse
from .scores import add_edge_score, edge_scores, gather_keys, gather_queries, row_query
from .tiles import (
    ONE,
    finish_softmax,
    flat_head_tile,
    head_tile,
    item_edges,
    light_edges,
    light_slot_count,
    row_ranges,
    store_output,
)


@jit
def _trip_tiles(src_term_ptr, value_ptr, src, mask, H, FS, offs_h, h_mask, hd_offs, hd_mask,
                SCORE: tl.constexpr, KEY_SCALE: tl.constexpr):
    """The gathers of one edge block ``src [E]`` (0 where masked), as stored (no conversion), for a row
    kernel that issues them a trip ahead: ``(a, b)`` = GAT (source terms ``[E, H]``, values), GATv2 (source
    terms ``[E, H, D]`` twice: its values), the dot score (keys, values), ``KEY_SCALE`` (node scales ``[E,
    H]``, values)."""
    feat_mask = mask[:, None, None] & hd_mask[None, :, :]
    if SCORE == 0 or KEY_SCALE:
        a = tl.load(src_term_ptr + src[:, None] * H + offs_h[None, :], mask=mask[:, None] & h_mask[None, :], other=0.0)
    else:
        a = tl.load(src_term_ptr + src[:, None, None] * FS + hd_offs[None, :, :], mask=feat_mask, other=0.0)
    if SCORE == 1:
        b = a
    else:
        b = tl.load(value_ptr + src[:, None, None] * FS + hd_offs[None, :, :], mask=feat_mask, other=0.0)
    return a, b


@jit
def attention_forward_rows_kernel(
    src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr,
    src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_edge_ptr, out_ptr, lse_ptr, add_ptr, final_ptr,
    factor_ptr, edge_score_ptr, H, D, K, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset, add_stride,
    feat_stride, piece_out_ptr, piece_lse_ptr, num_pieces, piece_super_ptr, piece_ptr, piece_count_ptr,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PIECES: tl.constexpr, DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr,
    BLOCK_K: tl.constexpr, KEY_SCALE: tl.constexpr, LANES: tl.constexpr, ADD: tl.constexpr, FINAL: tl.constexpr,
    PREFETCH: tl.constexpr = 0, EDGE_FORM: tl.constexpr = 0, ATTR_AHEAD: tl.constexpr = False,
    MERGE: tl.constexpr = False, MERGE_P: tl.constexpr = 1, FACTOR: tl.constexpr = False,
    EDGE_SCORE: tl.constexpr = False, EDGE_DOT: tl.constexpr = False, scores_ptr=None, slopes_ptr=None,
    SAVE: tl.constexpr = False, SLOPE_BITS: tl.constexpr = 32,
):
    tl.static_assert(not EDGE_SCORE or SCORE == 0, "a per-edge score term: GAT only")
    tl.static_assert(not SAVE or (EDGE and SCORE == 1), "scores and slopes saved: GATv2 with edge features")
    tl.static_assert(not EDGE or SCORE != 0, "edge features: GATv2 and the dot score")
    tl.static_assert(not (EDGE and SCORE == 1 and ATTR_AHEAD), "GATv2's edge features: loaded in the trip")
    acc_dtype = lse_ptr.dtype.element_ty
    seed, rng_offset = dropout_seed(seed, rng_offset, DROPOUT)
    # PREFETCH 1: each edge block's source indices are loaded one trip ahead, so a trip's gathers wait on no
    # index load of their own (the compiler hoists loads within a trip, not across trips); 2: the block's
    # gathers too (:func:`_trip_tiles`), issued a trip ahead, indices two trips ahead (with EDGE the trip's
    # edge ids and features are loaded in the trip, or with ATTR_AHEAD the same way as the gathers: features a
    # trip ahead, edge ids two).  EDGE_FORM: how u and the epilogue's Σ_k A[k] W[k] meet W_e
    # (:func:`~gnnfuse.kernels.edge_features.rows_edge_terms`).
    pid = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    row, start, stop, out_index = item_edges(pid, rows_ptr, starts_ptr, stops_ptr, PIECES == 1)
    if SCORE == 0:
        dst_i = tl.load(dst_term_ptr + row * H + offs_h, mask=h_mask, other=0.0).to(acc_dtype)[None, :]
        attn = dst_i
    else:
        dst_i = row_query(dst_term_ptr, value_ptr, row, H, feat_stride, offs_h, h_mask, hd_offs, hd_mask, acc_dtype,
                          KEY_SCALE)
        if SCORE == 2:
            dst_i = dst_i * scale
        attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    w_tile = 0  # GATv2 with EDGE: e_p inside the LeakyReLU, projected per edge block (EDGE_DOT: one product a block)
    if EDGE and SCORE == 1:
        w_tile = edge_weight_tile(w_edge_ptr, K, H, D, BLOCK_K, BLOCK_H, BLOCK_D)
    if EDGE and SCORE == 2:
        # e_p is never formed (kernels/edge_features.py): score term attr_p · u, value term
        # Σ_k A[k] W[k] once after the loop, A[h, k] = Σ_p α_p[h] attr_p[k] rescaled like acc.
        u = tl.reshape(rows_edge_terms(w_edge_ptr, tl.reshape(dst_i, [1, BLOCK_H, BLOCK_D]), K, HD, hd_offs, hd_mask,
                                       BLOCK_K, EDGE_FORM), [BLOCK_H, BLOCK_K])
        if LANES:
            acc_attr = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_K], dtype=acc_dtype)
        else:
            acc_attr = tl.zeros([BLOCK_H, BLOCK_K], dtype=acc_dtype)
    if LANES:
        # Online-softmax state per edge lane: no reduction across threads inside the loop.
        m = tl.full([BLOCK_E, BLOCK_H], float("-inf"), dtype=acc_dtype)
        l = tl.zeros([BLOCK_E, BLOCK_H], dtype=acc_dtype)
        acc = tl.zeros([BLOCK_E, BLOCK_H, BLOCK_D], dtype=acc_dtype)
    else:
        m = tl.full([BLOCK_H], float("-inf"), dtype=acc_dtype)
        l = tl.zeros([BLOCK_H], dtype=acc_dtype)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=acc_dtype)
    if PREFETCH == 2:
        first = start + offs_e
        src_c = tl.load(src_ptr + first, mask=first < stop, other=0).to(tl.int64)
        a_c, b_c = _trip_tiles(src_term_ptr, value_ptr, src_c, first < stop, H, feat_stride, offs_h, h_mask, hd_offs,
                               hd_mask, SCORE, KEY_SCALE)
        src_next = tl.load(src_ptr + first + BLOCK_E, mask=first + BLOCK_E < stop, other=0)
        if EDGE and ATTR_AHEAD:
            eid_c = tl.load(eid_ptr + first, mask=first < stop, other=0).to(tl.int64)
            attr_c = edge_attr_tile(attr_ptr, eid_c, first < stop, K, acc_dtype, BLOCK_K)
            eid_next = tl.load(eid_ptr + first + BLOCK_E, mask=first + BLOCK_E < stop, other=0)
    elif PREFETCH == 1:
        src_next = tl.load(src_ptr + start + offs_e, mask=start + offs_e < stop, other=0)
    for e0 in range(start, stop, BLOCK_E):
        pos = e0 + offs_e
        e_mask = pos < stop
        if PREFETCH == 2:
            src = src_c
            a_raw = a_c
            b_raw = b_c
            ahead = pos + BLOCK_E
            src_c = src_next.to(tl.int64)
            a_c, b_c = _trip_tiles(src_term_ptr, value_ptr, src_c, ahead < stop, H, feat_stride, offs_h, h_mask,
                                   hd_offs,
                                   hd_mask, SCORE, KEY_SCALE)
            src_next = tl.load(src_ptr + ahead + BLOCK_E, mask=ahead + BLOCK_E < stop, other=0)
            if EDGE and ATTR_AHEAD:
                attr = attr_c
                attr_c = edge_attr_tile(attr_ptr, eid_next.to(tl.int64), ahead < stop, K, acc_dtype, BLOCK_K)
                eid_next = tl.load(eid_ptr + ahead + BLOCK_E, mask=ahead + BLOCK_E < stop, other=0)
        elif PREFETCH == 1:
            src = src_next.to(tl.int64)
            src_next = tl.load(src_ptr + pos + BLOCK_E, mask=pos + BLOCK_E < stop, other=0)
        else:
            src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        feat_mask = e_mask[:, None, None] & hd_mask[None, :, :]
        if PREFETCH == 2:
            val_pre = b_raw.to(acc_dtype)
            if KEY_SCALE:
                key_values = val_pre
                src_j = val_pre * a_raw.to(acc_dtype)[:, :, None]
            else:
                src_j = a_raw.to(acc_dtype)
        elif SCORE == 0:
            eh_mask = e_mask[:, None] & h_mask[None, :]
            src_j = tl.load(src_term_ptr + src[:, None] * H + offs_h[None, :], mask=eh_mask, other=0.0).to(acc_dtype)
        else:
            src_j, key_values = gather_keys(src_term_ptr, value_ptr, src, e_mask, H, feat_stride, offs_h, h_mask,
                                            hd_offs, hd_mask, acc_dtype, KEY_SCALE)
        src_j = add_edge_score(src_j, edge_score_ptr, pos[:, None], offs_h[None, :], e_mask[:, None] & h_mask[None, :],
                               H, EDGE_SCORE)
        score_j = add_edge_vectors(src_j, attr_ptr, w_edge_ptr, w_tile, eid_ptr, pos, e_mask, K, HD, hd_offs,
                                   hd_mask, BLOCK_E, BLOCK_H, BLOCK_D, BLOCK_K, EDGE_DOT, EDGE and SCORE == 1)
        s = edge_scores(score_j, dst_i, attn, negative_slope, SCORE)
        if SAVE:
            save_scores(scores_ptr, slopes_ptr, pos, e_mask, s, score_j + dst_i, H, offs_h, h_mask, BLOCK_E, BLOCK_H,
                        BLOCK_D, SLOPE_BITS)
        if EDGE and SCORE == 2:
            if not (PREFETCH == 2 and ATTR_AHEAD):
                eid = tl.load(eid_ptr + pos, mask=e_mask, other=0).to(tl.int64)
                attr = edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype, BLOCK_K)
            s += tl.sum(attr[:, None, :] * u[None, :, :], axis=2)
        s = tl.where(e_mask[:, None], s, float("-inf"))
        if LANES:
            m_new, rescale, p, l = online_update(m, l, s)  # a lane that has seen no edge yet stays empty
        else:
            m_new = tl.maximum(m, tl.max(s, axis=0))
            rescale = tl.exp(m - m_new)
            p = tl.exp(s - m_new[None, :])
            l = l * rescale + tl.sum(p, axis=0)
        if DROPOUT:
            p = attention_dropout(p, pos[:, None], rng_offset + offs_h[None, :], seed, dropout_p, keep_scale)
        p = edge_factor(p, pos[:, None], e_mask[:, None], factor_ptr, FACTOR)
        if SCORE == 1:
            val_j = src_j
        elif KEY_SCALE:
            val_j = key_values
        elif PREFETCH == 2:
            val_j = val_pre
        else:
            val_j = tl.load(value_ptr + src[:, None, None] * feat_stride + hd_offs[None, :, :], mask=feat_mask,
                            other=0.0).to(acc_dtype)
        if LANES:
            acc = acc * rescale[:, :, None] + p[:, :, None] * val_j
            if EDGE and SCORE == 2:
                acc_attr = acc_attr * rescale[:, :, None] + p[:, :, None] * attr[:, None, :]
        else:
            acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * val_j, axis=0)
            if EDGE and SCORE == 2:
                acc_attr = acc_attr * rescale[:, None] + tl.sum(p[:, :, None] * attr[:, None, :], axis=0)
        m = m_new
    if LANES:
        # merge the lanes: weights exp(m_lane - m_row) (0 for lanes without edges)
        m_lanes = m
        m = tl.max(m_lanes, axis=0)
        weight = tl.exp(m_lanes - tl.where(m > float("-inf"), m, 0.0)[None, :])
        l = tl.sum(l * weight, axis=0)
        acc = tl.sum(acc * weight[:, :, None], axis=0)
        if EDGE and SCORE == 2:
            acc_attr = tl.sum(acc_attr * weight[:, :, None], axis=0)
    if EDGE and SCORE == 2:
        acc += tl.reshape(rows_edge_values(tl.reshape(acc_attr, [1, BLOCK_H, BLOCK_K]), w_edge_ptr, K, HD, hd_offs,
                                           hd_mask, BLOCK_K, EDGE_FORM), [BLOCK_H, BLOCK_D])
    out, lse = finish_softmax(acc, m, l)
    # ADD and FINAL never for a piece: a split row gets its term and final output in the merge
    if PIECES == 2:
        if pid < num_pieces:
            tl.store(piece_out_ptr + pid * HD + hd_offs, out.to(piece_out_ptr.dtype.element_ty), mask=hd_mask)
            tl.store(piece_lse_ptr + pid * H + offs_h, lse.to(piece_lse_ptr.dtype.element_ty), mask=h_mask)
            if MERGE:  # the last piece of the row to finish merges the row's pieces (kernels/merge.py)
                merger, merge_from, merge_to = last_piece(pid, piece_super_ptr, piece_ptr, piece_count_ptr)
                if merger:
                    merge_lse(merge_from, merge_to, row, piece_out_ptr, piece_lse_ptr, out_ptr, lse_ptr, add_ptr,
                              final_ptr, H, D, add_stride, MERGE_P, BLOCK_H, BLOCK_D, ADD, FINAL)
        else:
            store_output(out_ptr, final_ptr, add_ptr, out, row * HD + hd_offs, row * add_stride + hd_offs, hd_mask,
                         ADD, FINAL)
            tl.store(lse_ptr + row * H + offs_h, lse.to(lse_ptr.dtype.element_ty), mask=h_mask)
    else:
        store_output(out_ptr, final_ptr, add_ptr, out, out_index * HD + hd_offs, row * add_stride + hd_offs, hd_mask,
                     ADD, FINAL)
        tl.store(lse_ptr + out_index * H + offs_h, lse.to(lse_ptr.dtype.element_ty), mask=h_mask)


@jit
def attention_forward_light_kernel(
    src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr,
    src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_edge_ptr, out_ptr, lse_ptr, add_ptr, final_ptr,
    factor_ptr, edge_score_ptr, n0, n1, n2, n3, n4, n5, n6, H, D, K, negative_slope, scale, dropout_p, keep_scale,
    seed, rng_offset, add_stride, feat_stride, LIGHT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr, BLOCK_K: tl.constexpr, EDGE_DOT: tl.constexpr,
    KEY_SCALE: tl.constexpr, ADD: tl.constexpr, FINAL: tl.constexpr, UNROLLED: tl.constexpr = False,
    FACTOR: tl.constexpr = False, EDGE_SCORE: tl.constexpr = False, scores_ptr=None, slopes_ptr=None,
    SAVE: tl.constexpr = False, SLOPE_BITS: tl.constexpr = 32, EDGE_FORM: tl.constexpr = 1,
):
    """The light width classes of ``LIGHT`` in one launch (:mod:`gnnfuse.kernels.tiles`): each program
    runs :func:`_forward_light_rows` compiled for its class's tile (:func:`_forward_light_unrolled`
    with ``UNROLLED``; ``EDGE_FORM``: how its rows' ``u`` and ``Σ_k A[k] W[k]`` meet ``W_e``,
    :func:`~gnnfuse.kernels.edge_features.rows_edge_terms`)."""
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
                        _forward_light_unrolled(
                            local, src_ptr, eid_ptr, rows_ptr + row0, starts_ptr + row0, stops_ptr + row0,
                            src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_edge_ptr, out_ptr, lse_ptr,
                            add_ptr, final_ptr, factor_ptr, edge_score_ptr, count, H, D, K, negative_slope, scale,
                            dropout_p, keep_scale, seed, rng_offset, add_stride, feat_stride, ONE << (f - 1), ONE << k,
                            BLOCK_H, BLOCK_D, DROPOUT, SCORE, EDGE, BLOCK_K, KEY_SCALE, ADD, FINAL, FACTOR, EDGE_SCORE,
                            EDGE_FORM,
                        )
                    else:
                        _forward_light_rows(
                            local, src_ptr, eid_ptr, rows_ptr + row0, starts_ptr + row0, stops_ptr + row0,
                            src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_edge_ptr, out_ptr, lse_ptr,
                            add_ptr, final_ptr, factor_ptr, edge_score_ptr, count, H, D, K, negative_slope, scale,
                            dropout_p, keep_scale, seed, rng_offset, add_stride, feat_stride, ONE << (f - 1), ONE << k,
                            BLOCK_H, BLOCK_D, DROPOUT, SCORE, EDGE, BLOCK_K, EDGE_DOT, KEY_SCALE, ADD, FINAL, FACTOR,
                            EDGE_SCORE, scores_ptr, slopes_ptr, SAVE, SLOPE_BITS,
                        )
                first += programs
                row0 += count


@jit
def _forward_light_unrolled(
    pid, src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr,
    w_edge_ptr, out_ptr, lse_ptr, add_ptr, final_ptr, factor_ptr, edge_score_ptr, num_rows, H, D, K, negative_slope,
    scale, dropout_p, keep_scale, seed, rng_offset, add_stride, feat_stride, ROWS: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr,
    BLOCK_K: tl.constexpr, KEY_SCALE: tl.constexpr, ADD: tl.constexpr, FINAL: tl.constexpr, FACTOR: tl.constexpr,
    EDGE_SCORE: tl.constexpr, EDGE_FORM: tl.constexpr,
):
    """``ROWS`` light rows of degree <= ``BLOCK_E``, the edge slots unrolled: slot ``e`` gathers the rows'
    ``e``-th sources as ``[ROWS, BLOCK_H, BLOCK_D]`` tiles and folds them into a running softmax per row
    and head, so every gather is independent of the scores (all in flight at once) and nothing is reduced
    across warps (the ``[ROWS · BLOCK_E, H, D]`` tile of :func:`_forward_light_rows` is summed over its
    edges across warps, through shared memory).  With ``EDGE`` (dot score) no edge is projected, as in
    the row kernel: the rows' ``u = W q̃`` ``[ROWS, BLOCK_H, BLOCK_K]`` once, per slot the score term
    ``Σ_k attr_p[k] u[h, k]`` and ``A[h, k] += α_p[h] attr_p[k]`` (rescaled like the output), and
    ``Σ_k A[h, k] W[k, h, :]`` added once after the last slot (``EDGE_FORM``: the ``K`` steps of both unrolled, 1,
    or a loop, 0, or one product with the whole weight tile, 2).  Not for GATv2 with edge features (the tile form
    projects them: :func:`_forward_light_rows`)."""
    tl.static_assert(not EDGE or SCORE == 2, "unrolled light rows with edge features: dot score only")
    acc_dtype = lse_ptr.dtype.element_ty
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    _, r_mask, rows, start, degree = row_ranges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS)
    rh_mask = r_mask[:, None] & h_mask[None, :]
    feat_rows = r_mask[:, None, None] & hd_mask[None, :, :]
    if SCORE == 0:
        dst_i = tl.load(dst_term_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask, other=0.0).to(acc_dtype)
    else:
        dst_i = gather_queries(dst_term_ptr, value_ptr, rows, r_mask, H, feat_stride, offs_h, h_mask, hd_offs, hd_mask,
                               acc_dtype, KEY_SCALE)
        if SCORE == 2:
            dst_i = dst_i * scale
        attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
        if EDGE:
            u = rows_edge_terms(w_edge_ptr, dst_i, K, HD, hd_offs, hd_mask, BLOCK_K, EDGE_FORM)  # [ROWS, BH, BK]
            acc_attr = tl.zeros([ROWS, BLOCK_H, BLOCK_K], dtype=acc_dtype)
    m = tl.full([ROWS, BLOCK_H], float("-inf"), dtype=acc_dtype)
    l = tl.zeros([ROWS, BLOCK_H], dtype=acc_dtype)
    acc = tl.zeros([ROWS, BLOCK_H, BLOCK_D], dtype=acc_dtype)
    for e in tl.static_range(BLOCK_E):
        e_mask = e < degree                                                    # [ROWS] (0 for masked rows)
        pos = start + e
        src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        feat_mask = e_mask[:, None, None] & hd_mask[None, :, :]
        if SCORE == 0:
            eh_mask = e_mask[:, None] & h_mask[None, :]
            src_j = tl.load(src_term_ptr + src[:, None] * H + offs_h[None, :], mask=eh_mask, other=0.0).to(acc_dtype)
            src_j = add_edge_score(src_j, edge_score_ptr, pos[:, None], offs_h[None, :], eh_mask, H, EDGE_SCORE)
            val_j = tl.load(value_ptr + src[:, None, None] * feat_stride + hd_offs[None, :, :], mask=feat_mask,
                            other=0.0).to(acc_dtype)
            s = edge_scores(src_j, dst_i, negative_slope, negative_slope, 0)
        else:
            src_j, val_j = gather_keys(src_term_ptr, value_ptr, src, e_mask, H, feat_stride, offs_h, h_mask, hd_offs,
                                       hd_mask, acc_dtype, KEY_SCALE)
            if SCORE == 1:
                val_j = src_j
            elif not KEY_SCALE:
                val_j = tl.load(value_ptr + src[:, None, None] * feat_stride + hd_offs[None, :, :], mask=feat_mask,
                                other=0.0).to(acc_dtype)
            s = edge_scores(src_j, dst_i, attn, negative_slope, SCORE)
            if EDGE:
                eid = tl.load(eid_ptr + pos, mask=e_mask, other=0).to(tl.int64)
                attr = edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype, BLOCK_K)           # [ROWS, BLOCK_K]
                s += tl.sum(attr[:, None, :] * u, axis=2)
        s = tl.where(e_mask[:, None], s, float("-inf"))
        m_new, rescale, p, l = online_update(m, l, s)  # a row that has seen no edge yet stays empty
        if DROPOUT:
            p = attention_dropout(p, pos[:, None], rng_offset + offs_h[None, :], seed, dropout_p, keep_scale)
        p = edge_factor(p, pos[:, None], e_mask[:, None], factor_ptr, FACTOR)
        acc = acc * rescale[:, :, None] + p[:, :, None] * val_j
        if EDGE:
            acc_attr = acc_attr * rescale[:, :, None] + p[:, :, None] * attr[:, None, :]
        m = m_new
    if EDGE:
        acc += rows_edge_values(acc_attr, w_edge_ptr, K, HD, hd_offs, hd_mask, BLOCK_K, EDGE_FORM)
    has_edges = l > 0
    l_safe = tl.where(has_edges, l, 1.0)
    out = acc / l_safe[:, :, None]
    lse = tl.where(has_edges, m + tl.log(l_safe), float("-inf"))
    store_output(out_ptr, final_ptr, add_ptr, out, rows[:, None, None] * HD + hd_offs[None, :, :],
                 rows[:, None, None] * add_stride + hd_offs[None, :, :], feat_rows, ADD, FINAL)
    tl.store(lse_ptr + rows[:, None] * H + offs_h[None, :], lse.to(lse_ptr.dtype.element_ty), mask=rh_mask)


@jit
def _forward_light_rows(
    pid, src_ptr, eid_ptr, rows_ptr, starts_ptr, stops_ptr,
    src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_edge_ptr, out_ptr, lse_ptr, add_ptr, final_ptr,
    factor_ptr, edge_score_ptr, num_rows, H, D, K, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset,
    add_stride, feat_stride, ROWS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    DROPOUT: tl.constexpr, SCORE: tl.constexpr, EDGE: tl.constexpr, BLOCK_K: tl.constexpr, EDGE_DOT: tl.constexpr,
    KEY_SCALE: tl.constexpr, ADD: tl.constexpr, FINAL: tl.constexpr, FACTOR: tl.constexpr, EDGE_SCORE: tl.constexpr,
    scores_ptr, slopes_ptr, SAVE: tl.constexpr, SLOPE_BITS: tl.constexpr,
):
    """``ROWS`` light rows of degree <= ``BLOCK_E`` for program ``pid`` of their class (``SAVE``: GATv2's scores and
    slopes stored at their CSR positions, :func:`~gnnfuse.kernels.edge_features.save_scores`)."""
    acc_dtype = lse_ptr.dtype.element_ty
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    # pos: CSR positions [ROWS, BLOCK_E]
    rows, r_mask, pos, e_mask = light_edges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS, BLOCK_E)
    src = tl.load(src_ptr + pos, mask=e_mask, other=0).to(tl.int64)
    rh_mask = r_mask[:, None] & h_mask[None, :]
    # Flatten (row, edge) to gather feature tiles [ROWS * BLOCK_E, BLOCK_H, BLOCK_D], fold back per row.
    src_flat = tl.reshape(src, [ROWS * BLOCK_E])
    e_flat = tl.reshape(e_mask, [ROWS * BLOCK_E])
    feat_mask = e_flat[:, None, None] & hd_mask[None, :, :]
    if SCORE == 0:
        eh_mask = e_mask[:, :, None] & h_mask[None, None, :]                  # [ROWS, BLOCK_E, BLOCK_H]
        src_j = tl.load(src_term_ptr + src[:, :, None] * H + offs_h[None, None, :], mask=eh_mask,
                        other=0.0).to(acc_dtype)
        src_j = add_edge_score(src_j, edge_score_ptr, pos[:, :, None], offs_h[None, None, :], eh_mask, H, EDGE_SCORE)
        dst_i = tl.load(dst_term_ptr + rows[:, None] * H + offs_h[None, :], mask=rh_mask, other=0.0).to(acc_dtype)
        s = edge_scores(src_j, dst_i[:, None, :], negative_slope, negative_slope, SCORE)
    else:
        src_j, key_values = gather_keys(src_term_ptr, value_ptr, src_flat, e_flat, H, feat_stride, offs_h, h_mask,
                                        hd_offs, hd_mask, acc_dtype, KEY_SCALE)
        if EDGE:
            eid_flat = tl.load(eid_ptr + tl.reshape(pos, [ROWS * BLOCK_E]), mask=e_flat, other=0).to(tl.int64)
            w_tile = edge_weight_tile(w_edge_ptr, K, H, D, BLOCK_K, BLOCK_H, BLOCK_D)
            edge_j = project_edges(attr_ptr, w_edge_ptr, w_tile, eid_flat, e_flat, K, HD, hd_offs, hd_mask,
                                   acc_dtype, ROWS * BLOCK_E, BLOCK_H, BLOCK_D, BLOCK_K, EDGE_DOT)
            score_j = src_j + edge_j  # the score's side (GATv2: inside the LeakyReLU; dot: the key)
        else:
            score_j = src_j
        # The row's own term, read per edge (cache hits) to stay in the flat edge layout.
        rows_flat = tl.reshape(rows[:, None] + tl.zeros([ROWS, BLOCK_E], dtype=tl.int64), [ROWS * BLOCK_E])
        dst_i = gather_queries(dst_term_ptr, value_ptr, rows_flat, e_flat, H, feat_stride, offs_h, h_mask, hd_offs,
                               hd_mask, acc_dtype, KEY_SCALE)
        if SCORE == 2:
            dst_i = dst_i * scale
        attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
        s_flat = edge_scores(score_j, dst_i, attn, negative_slope, SCORE)
        if SAVE:
            save_scores(scores_ptr, slopes_ptr, tl.reshape(pos, [ROWS * BLOCK_E]), e_flat, s_flat, score_j + dst_i, H,
                        offs_h, h_mask, ROWS * BLOCK_E, BLOCK_H, BLOCK_D, SLOPE_BITS)
        s = tl.reshape(s_flat, [ROWS, BLOCK_E, BLOCK_H])
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
    alpha = edge_factor(alpha, pos[:, :, None], e_mask[:, :, None], factor_ptr, FACTOR)
    if SCORE == 1:
        val_j = src_j
    elif KEY_SCALE:
        val_j = key_values
    else:
        val_j = tl.load(value_ptr + src_flat[:, None, None] * feat_stride + hd_offs[None, :, :], mask=feat_mask,
                        other=0.0).to(acc_dtype)
        if EDGE:
            val_j += edge_j
    messages = tl.reshape(alpha, [ROWS * BLOCK_E, BLOCK_H])[:, :, None] * val_j
    out = tl.sum(tl.reshape(messages, [ROWS, BLOCK_E, BLOCK_H * BLOCK_D]), axis=1)
    lse = tl.where(has_edges, m_safe + tl.log(l_safe), float("-inf"))
    rc_mask = r_mask[:, None] & c_mask[None, :]
    store_output(out_ptr, final_ptr, add_ptr, out, rows[:, None] * HD + c_offs[None, :],
                 rows[:, None] * add_stride + c_offs[None, :], rc_mask, ADD, FINAL)
    tl.store(lse_ptr + rows[:, None] * H + offs_h[None, :], lse.to(lse_ptr.dtype.element_ty), mask=rh_mask)
