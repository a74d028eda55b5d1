"""The edge score of every attention layer, and its gradients, selected by a constexpr ``SCORE``.

The fused forward and backward kernels are one code path (schedule, tiles, online softmax,
super-row pieces, logsumexp merge) for three scores.  Per edge ``j -> i`` and head ``h``,
with a *source term* ``src_j`` gathered per edge and a *destination term* ``dst_i`` owned by
the row::

    SCORE_GAT   (0)  s = LeakyReLU(el_j + er_i)                 src = el [N, H],  dst = er [N, H]
    SCORE_GATV2 (1)  s = Σ_d a_d · LeakyReLU(fs_j + fd_i)_d     src = fs [N, H, D], dst = fd [N, H, D]
    SCORE_DOT   (2)  s = Σ_d k_jd · q̃_id,   q̃ = scale · q       src = k [N, H, D],  dst = q [N, H, D]

(the dot product is the Graph Transformer's ``q·k/√d``, and AGNN's ``β cos(h_i, h_j)`` with
``q = β ĥ``, ``k = ĥ``, scale 1; with ``KEY_SCALE`` the keys are not read but formed from the
values, ``k_j = v_j · r_j`` with a per-node scale ``r [N, H]`` in the source-term slot —
AGNN's ``ĥ = h / ‖h‖`` — so one feature tile per edge is gathered instead of two,
:func:`gather_keys`).  Values aggregated are ``Wh`` (GAT), ``fs`` itself (GATv2)
and ``v`` (+ the projected edge feature for the Graph Transformer).

GAT with a per-edge term (PyG GATConv's ``edge_dim``: ``ee_p = Σ_c lin_edge(attr_p)[h, c] · att_edge[h, c]``),
``s = LeakyReLU(el_j + er_i + ee_p)``: the kernels' constexpr ``EDGE_SCORE`` adds ``ee_p`` to the gathered source
term before the score is formed (:func:`add_edge_score`; ``ee [E, H]`` in the accumulation dtype, in the order
the kernel walks its edges: CSR for the forward and the weights pass, reverse CSR for the source pass), so
:func:`edge_scores` and :func:`score_grad` (whose LeakyReLU test is on ``this + other``) see ``z = el_j + ee_p``
and ``er_i`` as the two sides; ``∂L/∂ee_p = ∂L/∂z``, the per-edge value the source pass stores for ``∂er``.

The gradient of ``s`` with respect to one side, given the other (:func:`score_grad`), is
symmetric in the two sides for GAT and GATv2 (``s`` depends on ``src + dst`` only); for the
dot product it is ``∂s · other`` with the scale folded into ``other``.  Each helper takes
tensors whose last axis is the head axis (GAT) or ``[..., BLOCK_H, BLOCK_D]`` feature tiles
with the edge axis first (GATv2, dot: 3-D ``[edges, BLOCK_H, BLOCK_D]``).
"""

import triton.language as tl

from fusecore.backend import jit

SCORE_GAT = 0
SCORE_GATV2 = 1
SCORE_DOT = 2


@jit
def leaky_relu(z, negative_slope):
    return tl.where(z > 0, z, z * negative_slope)


@jit
def edge_scores(src_term, dst_term, attn, negative_slope, SCORE: tl.constexpr):
    """Scores ``[..., BLOCK_H]``: GAT on per-head terms, GATv2 and dot on ``[E, BLOCK_H,
    BLOCK_D]`` tiles (``dst_term`` and ``attn`` broadcast to them; dot: ``dst`` pre-scaled)."""
    if SCORE == 0:
        score = leaky_relu(src_term + dst_term, negative_slope)
    elif SCORE == 1:
        score = tl.sum(attn * leaky_relu(src_term + dst_term, negative_slope), axis=2)
    else:
        score = tl.sum(src_term * dst_term, axis=2)
    return score


@jit
def add_edge_score(src_term, edge_score_ptr, pos, heads, mask, H, EDGE_SCORE: tl.constexpr):
    """GAT's source term with the per-edge term added (``EDGE_SCORE``): ``src_term + edge_score[pos, heads]``
    (``edge_score [E, H]`` row-major; ``pos``, ``heads`` and ``mask`` broadcast to ``src_term``'s ``[..., BLOCK_H]``;
    0 added where not ``mask``), else ``src_term`` itself."""
    if EDGE_SCORE:
        src_term = src_term + tl.load(edge_score_ptr + pos * H + heads, mask=mask, other=0.0).to(src_term.dtype)
    return src_term


@jit
def score_grad(grad_s, this_term, other_term, attn, negative_slope, SCORE: tl.constexpr):
    """``∂L/∂this`` per edge from ``∂L/∂s`` ``[E, BLOCK_H]`` (GAT: any shape), ``this`` being
    either side of the score and ``other`` the opposite one (dot: ``other`` pre-scaled)."""
    if SCORE == 0:
        grad = tl.where(this_term + other_term > 0, grad_s, grad_s * negative_slope)
    elif SCORE == 1:
        # the slope applied as GAT's is, in the operands' dtype: a float32 select of (1, slope) carried the slope
        # rounded to float32 into float64 gradients (1e-9 off).  This form is also faster: H200, arxiv-like,
        # session 38 call 8, the source light pass 548.0 -> 477.2 µs (fp32), 520.2 -> 499.3 (bf16); steps
        # 1660 / 1657 -> 1593.5 and 1142 / 1140 -> 1123.5 µs (kernel_times.py, old / new / old processes)
        scaled = grad_s[:, :, None] * attn
        grad = tl.where(this_term + other_term > 0, scaled, scaled * negative_slope)
    else:
        grad = grad_s[:, :, None] * other_term
    return grad


@jit
def attn_grad_terms(grad_s, src_term, dst_term, negative_slope):
    """GATv2: ``∂L/∂s_e · LeakyReLU(fs_j + fd_i)`` per edge ``[E, BLOCK_H, BLOCK_D]``, whose sum
    over all edges is ``∂L/∂a``."""
    return grad_s[:, :, None] * leaky_relu(src_term + dst_term, negative_slope)


@jit
def gather_keys(src_term_ptr, value_ptr, idx, mask, H, FS, offs_h, h_mask, hd_offs, hd_mask,
                acc_dtype: tl.constexpr, KEY_SCALE: tl.constexpr):
    """(keys, values) ``[E, BLOCK_H, BLOCK_D]`` of the nodes ``idx [E]`` (0 where masked): the keys
    read from ``src_term``, or (``KEY_SCALE``) the values read once and scaled by ``src_term [N, H]``;
    ``values`` is only read (and meaningful) with ``KEY_SCALE``; ``FS``: the row stride of the feature
    tensors read."""
    feat_mask = mask[:, None, None] & hd_mask[None, :, :]
    if KEY_SCALE:
        values = tl.load(value_ptr + idx[:, None, None] * FS + hd_offs[None, :, :], mask=feat_mask,
                         other=0.0).to(acc_dtype)
        node_scale = tl.load(src_term_ptr + idx[:, None] * H + offs_h[None, :], mask=mask[:, None] & h_mask[None, :],
                             other=0.0).to(acc_dtype)
        keys = values * node_scale[:, :, None]
    else:
        keys = tl.load(src_term_ptr + idx[:, None, None] * FS + hd_offs[None, :, :], mask=feat_mask,
                       other=0.0).to(acc_dtype)
        values = keys
    return keys, values


@jit
def gather_queries(dst_term_ptr, value_ptr, idx, mask, H, FS, offs_h, h_mask, hd_offs, hd_mask,
                   acc_dtype: tl.constexpr, KEY_SCALE: tl.constexpr):
    """Destination terms ``[n, BLOCK_H, BLOCK_D]`` of the nodes ``idx [n]`` (0 where masked): read from
    ``dst_term [N, H, D]`` (row stride ``FS``), or, with ``KEY_SCALE`` (AGNN), formed from the values and a
    per-node scale in the destination-term slot, ``q_i = h_i · c_i`` with ``c = dst_term [N, H]`` (``β r``):
    AGNN's queries are never stored.  The keys' gather (:func:`gather_keys`) with the other side's slot."""
    terms, _ = gather_keys(dst_term_ptr, value_ptr, idx, mask, H, FS, offs_h, h_mask, hd_offs, hd_mask, acc_dtype,
                           KEY_SCALE)
    return terms


@jit
def row_query(dst_term_ptr, value_ptr, row, H, FS, offs_h, h_mask, hd_offs, hd_mask, acc_dtype: tl.constexpr,
              KEY_SCALE: tl.constexpr):
    """:func:`gather_queries` of one row (a scalar index): ``[1, BLOCK_H, BLOCK_D]``."""
    one = tl.arange(0, 1)
    return gather_queries(dst_term_ptr, value_ptr, row + one, one < 1, H, FS, offs_h, h_mask, hd_offs, hd_mask,
                          acc_dtype, KEY_SCALE)
