"""The attention weights of a fused forward, per edge, for users who ask for them.

The fused kernels never store ``α`` (only the logsumexp ``lse [N, H]`` per destination and head).
DGL's ``get_attention=True`` and PyG's ``return_attention_weights=True`` hand the ``[E, H]`` weights
back; :func:`attention_weights_kernel` forms them after the forward, from that forward's ``lse``, in
one pass over the CSR positions::

    α_p[h] = exp(s_p[h] − lse_i[h])          (i = dst[p], s the layer's score, kernels/scores.py)

then, when asked (``DROPOUT``), the dropout mask of that forward regenerated from the same counters
(position ``p``, stream ``offset + h``: :mod:`gnnfuse.kernels.dropout`) and the keep scale applied —
the weights the aggregation used, as DGL returns them (with the forward's per-edge factor, ``FACTOR``).  GAT's
per-edge score term (``EDGE_SCORE``, PyG GATConv's ``edge_dim``) is added to the source term as the forward adds it.
Each weight is stored at its input edge id ``eid[p]``, so the output is in the caller's edge order.  Per edge
the score's two sides are gathered (GAT: two scalars per head; GATv2 and the dot score: two ``[H, D]`` rows,
the keys formed from the values for AGNN), with edge features projected in registers as the forward's tile form
does (:func:`~gnnfuse.kernels.edge_features.project_edges`).  Bytes: ``E`` indices of three kinds,
the gathered rows (the destination's are cache hits along a CSR block), ``E·H`` of ``lse`` reads and
``E·H`` weights written; no ``E×H×D`` tensor.
"""

import triton.language as tl

from fusecore.backend import jit

from .attention_backward import _recomputed_weights
from .dropout import dropout_seed, edge_factor
from .edge_features import add_edge_vectors, csr_block, edge_weight_tile, project_edges
from .scores import add_edge_score, edge_scores, gather_keys, gather_queries


@jit
def attention_weights_kernel(
    dst_ptr, src_ptr, eid_ptr, src_term_ptr, dst_term_ptr, attn_ptr, value_ptr, attr_ptr, w_ptr, lse_ptr,
    alpha_ptr, factor_ptr, edge_score_ptr, E, H, D, K, negative_slope, scale, dropout_p, keep_scale, seed, rng_offset,
    feat_stride, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    SCORE: tl.constexpr, EDGE: tl.constexpr, KEY_SCALE: tl.constexpr, EDGE_DOT: tl.constexpr,
    DROPOUT: tl.constexpr, FACTOR: tl.constexpr = False, EDGE_SCORE: tl.constexpr = False,
):
    """``alpha[eid[p], h]`` for the CSR positions ``p`` of block ``program_id`` (``BLOCK_P`` positions).

    ``dst``, ``src``, ``eid``: the graph's CSR destination, source and input edge id per position;
    ``src_term`` / ``dst_term`` / ``attn`` / ``value`` as the forward took them (``[N, H, D]`` roles with
    row stride ``feat_stride``); ``attr [E, K]`` / ``w [K, H, D]``: the edge features (``EDGE``: the dot score's
    keys' term, or GATv2's term inside the LeakyReLU); ``lse [N, H]`` the forward's, in the accumulation dtype;
    ``alpha [E, H]`` in any float dtype.  ``DROPOUT``: the forward's dropout mode
    (:mod:`gnnfuse.kernels.dropout`); off: the softmax itself.  ``FACTOR``: times the forward's per-edge factor
    ``factor [E]`` (CSR order).  ``EDGE_SCORE`` (GAT): the forward's per-edge score term ``edge_score [E, H]`` (CSR
    order, the accumulation dtype) added to ``el_j``."""
    tl.static_assert(not EDGE or SCORE != 0, "edge features: GATv2 and the dot score")
    tl.static_assert(not EDGE_SCORE or SCORE == 0, "a per-edge score term: GAT only")
    acc_dtype = lse_ptr.dtype.element_ty
    seed, rng_offset = dropout_seed(seed, rng_offset, DROPOUT)
    p, p_mask, offs_h, h_mask, hd_offs, hd_mask, i, eid = csr_block(dst_ptr, eid_ptr, E, H, D, BLOCK_P, BLOCK_H,
                                                                    BLOCK_D)
    j = tl.load(src_ptr + p, mask=p_mask, other=0).to(tl.int64)
    ph_mask = p_mask[:, None] & h_mask[None, :]
    lse_i = tl.load(lse_ptr + i[:, None] * H + offs_h[None, :], mask=ph_mask, other=0.0).to(acc_dtype)
    if SCORE == 0:
        src = tl.load(src_term_ptr + j[:, None] * H + offs_h[None, :], mask=ph_mask, other=0.0).to(acc_dtype)
        src = add_edge_score(src, edge_score_ptr, p[:, None], offs_h[None, :], ph_mask, H, EDGE_SCORE)
        dst = tl.load(dst_term_ptr + i[:, None] * H + offs_h[None, :], mask=ph_mask, other=0.0).to(acc_dtype)
        attn = src  # unused
    else:
        src, _ = gather_keys(src_term_ptr, value_ptr, j, p_mask, H, feat_stride, offs_h, h_mask, hd_offs, hd_mask,
                             acc_dtype, KEY_SCALE)
        dst = gather_queries(dst_term_ptr, value_ptr, i, p_mask, H, feat_stride, offs_h, h_mask, hd_offs, hd_mask,
                             acc_dtype, KEY_SCALE)
        if SCORE == 2:
            dst = dst * scale
        attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    if EDGE and SCORE == 1:  # GATv2: e_p inside the LeakyReLU
        src = add_edge_vectors(src, attr_ptr, w_ptr, edge_weight_tile(w_ptr, K, H, D, BLOCK_K, BLOCK_H, BLOCK_D),
                               eid_ptr, p, p_mask, K, H * D, hd_offs, hd_mask, BLOCK_P, BLOCK_H, BLOCK_D, BLOCK_K,
                               EDGE_DOT, True)
    s = edge_scores(src, dst, attn, negative_slope, SCORE)
    if EDGE and SCORE == 2:
        w_tile = edge_weight_tile(w_ptr, K, H, D, BLOCK_K, BLOCK_H, BLOCK_D)
        e = project_edges(attr_ptr, w_ptr, w_tile, eid, p_mask, K, H * D, hd_offs, hd_mask, acc_dtype, BLOCK_P,
                          BLOCK_H, BLOCK_D, BLOCK_K, EDGE_DOT)
        s += tl.sum(e * dst, axis=2)
    alpha, kept = _recomputed_weights(s, lse_i, ph_mask, p[:, None], rng_offset + offs_h[None, :], seed, dropout_p,
                                      keep_scale, DROPOUT)
    kept = edge_factor(kept, p[:, None], p_mask[:, None], factor_ptr, FACTOR)
    tl.store(alpha_ptr + eid[:, None] * H + offs_h[None, :], kept.to(alpha_ptr.dtype.element_ty), mask=ph_mask)
