"""Edge features projected in registers: the Graph Transformer's ``e_p = W_e · attr_p``, never stored.

PyG's TransformerConv adds ``e_p = lin_edge(edge_attr_p)`` (``[H, D]`` per edge) to the key and
the value of edge ``p``.  Materializing ``e`` would be an ``E×H×D`` tensor; instead every kernel
that needs ``e_p`` recomputes it from the raw features ``attr [E, K]`` and the
weight ``W [K, H, D]`` as one matrix product per edge tile (:func:`project_edges`: ``E·K``
feature reads, the ``K·H·D`` weight tile once per program from cache, ``E·K·H·D`` MACs; ``K``
rank-1 updates where a product cannot be used: float64, tiles under 16 edges).  ``attr`` stays
in the caller's edge order: a kernel maps its CSR (or reverse-CSR) positions to input edge ids
``eid`` and reads rows ``attr[eid]`` (no permuted copy of ``attr``), and ``∂attr`` is written at
the same rows, in input order.

A kernel that owns a destination row ``i`` (the row kernels of the forward and of the
backward's destination pass) never forms ``e_p`` at all: with ``u_i[k, h] = Σ_d W[k, h, d] q̃_i[h, d]``
(:func:`rows_edge_terms`, once per row)::

    q̃_i · e_p              = Σ_k attr_p[k] u_i[k, h]                       (score)
    Σ_p α_p e_p[h, :]       = Σ_k A_i[k, h] W[k, h, :],  A_i[k, h] = Σ_p α_p[h] attr_p[k]   (values)

so per edge only ``K·H`` products remain (instead of the ``K·H·D`` of a projection) and the
``W`` terms are applied once per row (:func:`rows_edge_values`).  The forward's light rows do the same
unrolled (one edge slot of many rows at a time); in the tile form (all of a program's edges at once) they
project with :func:`project_edges`.

Backward, with ``∂e_p = α'_p g_i + ∂s_p q̃_i`` per head (value path + key path, ``i`` the
edge's destination; see :mod:`gnnfuse.kernels.attention_backward`)::

    ∂attr_p[k] = Σ_{h,d} ∂e_p[h, d] W[k, h, d]                         (:func:`store_attr_grad`)
    ∂W[k, h, :] = Σ_p attr_p[k] ∂e_p[h, :]
                = Σ_i A_i[k, h] g_i[h, :] + B_i[k, h] q̃_i[h, :]
    A_i[k, h] = Σ_{p -> i} attr_p[k] α'_p[h],   B_i[k, h] = Σ_{p -> i} attr_p[k] ∂s_p[h]

(and the key path's ``Σ_p ∂s_p e_p = Σ_k B_i[k, h] W[k, h, :]``), so the weight gradient needs
only the per-destination sums ``A``, ``B`` (``attr_sums [N, 2, H, K]``, written by the destination
pass, one writer per row) and a
reduction over nodes (:func:`edge_weight_grad_kernel`: per-head products over node blocks, the
blocks' partial sums added in a fixed order) — deterministic, no atomics, no ``E×H×D`` buffer.

The backward's source pass walks the reverse CSR, so its edges have many destinations and the
row form does not apply; it needs ``e_p`` only through two scalars per edge and head,
``t_p = q̃_i · e_p`` (the score's edge term) and ``r_p = g_i · e_p`` (the edge term of
``<g_i, v_j + e_p>``).  :func:`edge_terms_kernel` forms both first, in CSR order (edge blocks
of consecutive positions, mostly of one destination: its ``q̃_i`` and ``g_i`` are cache hits),
into an ``[E, 2, H]`` buffer; the source pass then reads ``2·H`` values per edge instead of
projecting ``K`` features to ``H·D``, and leaves ``α'_p`` in the place of ``t_p`` (after a CTA barrier, so that
every thread holding ``t_p`` has read it: ``attention_backward.replace_terms``).  With it the
destination pass projects nothing either: per edge it adds ``∂s_p ⊗ attr_p`` and ``α'_p ⊗ attr_p``
into the row's ``B``, ``A`` and applies ``W`` once per row (the key path's ``Σ_k B[k] W[k]``);
``∂attr`` (only where autograd asks for it) is :func:`edge_attr_grad_kernel`'s, in CSR order
from ``∂e_p = α'_p g_i + ∂s_p q̃_i``.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.linear import finite_or_zero, split_dot, tf32_parts

from .tiles import flat_head_tile, head_tile


@jit
def edge_weight_tile(w_ptr, K, H, D, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """``W`` as a zero-padded ``[BLOCK_K, BLOCK_H · BLOCK_D]`` tile in its own dtype (columns as
    :func:`~gnnfuse.kernels.tiles.flat_head_tile`): one operand of the projection's matrix product."""
    offs_k = tl.arange(0, BLOCK_K)
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)
    return tl.load(w_ptr + offs_k[:, None] * (H * D) + c_offs[None, :], mask=(offs_k < K)[:, None] & c_mask[None, :],
                   other=0.0)


@jit
def edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype: tl.constexpr, BLOCK_K: tl.constexpr):
    """``attr[eid]`` as a zero-padded ``[E, BLOCK_K]`` tile in ``acc_dtype`` (0 where masked)."""
    offs_k = tl.arange(0, BLOCK_K)
    return tl.load(attr_ptr + eid[:, None] * K + offs_k[None, :], mask=e_mask[:, None] & (offs_k < K)[None, :],
                   other=0.0).to(acc_dtype)


@jit
def _weight_row(w_ptr, k, K, HD, hd_offs, hd_mask, dtype: tl.constexpr, VOLATILE: tl.constexpr = False):
    """``W[k]`` as a zero-padded ``[BLOCK_H, BLOCK_D]`` head tile in ``dtype`` (zero for ``k >= K``).
    ``VOLATILE``: a load the compiler may neither merge with an earlier load of the same row nor move."""
    return tl.load(w_ptr + k * HD + hd_offs, mask=hd_mask & (hd_offs * 0 + k < K), other=0.0,
                   volatile=VOLATILE).to(dtype)


@jit
def _row_term(w_ptr, vectors, u, offs_k, k, K, HD, hd_offs, hd_mask):
    u_k = tl.sum(vectors * _weight_row(w_ptr, k, K, HD, hd_offs, hd_mask, vectors.dtype)[None, :, :], axis=2)
    return tl.where(offs_k[None, None, :] == k, u_k[:, :, None], u)


@jit
def _weight_tile(w_ptr, K, HD, hd_offs, hd_mask, BLOCK_K: tl.constexpr, dtype: tl.constexpr,
                 VOLATILE: tl.constexpr = False):
    """``W`` as a zero-padded ``[BLOCK_K, BLOCK_H, BLOCK_D]`` tile in ``dtype`` (``VOLATILE`` as
    :func:`_weight_row`)."""
    offs_k = tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + offs_k[:, None, None] * HD + hd_offs[None, :, :],
                   mask=(offs_k < K)[:, None, None] & hd_mask[None, :, :], other=0.0, volatile=VOLATILE).to(dtype)


@jit
def rows_edge_terms(w_ptr, vectors, K, HD, hd_offs, hd_mask, BLOCK_K: tl.constexpr, FORM: tl.constexpr):
    """``u[r, h, k] = Σ_d W[k, h, d] · v[r, h, d]`` ``[ROWS, BLOCK_H, BLOCK_K]`` of the rows' vectors
    ``v [ROWS, BLOCK_H, BLOCK_D]`` (``u = W q̃``; ``hd_offs``, ``hd_mask``: the ``[BLOCK_H, BLOCK_D]`` head
    tile).  ``FORM`` 0: a loop over ``K``, one weight row ``W[k]`` live at a time; 1: the same ``BLOCK_K`` steps
    unrolled (the compiler may then issue every row's load at once); 2: one product with the whole ``[BLOCK_K,
    BLOCK_H, BLOCK_D]`` tile, dead once ``u`` is formed (for one row: ``ROWS · BLOCK_K · H · D`` products at once)."""
    offs_k = tl.arange(0, BLOCK_K)
    if FORM == 2:
        w = _weight_tile(w_ptr, K, HD, hd_offs, hd_mask, BLOCK_K, vectors.dtype)
        return tl.permute(tl.sum(w[None, :, :, :] * vectors[:, None, :, :], axis=3), (0, 2, 1))
    u = tl.zeros([vectors.shape[0], vectors.shape[1], BLOCK_K], dtype=vectors.dtype)
    if FORM == 1:
        for k in tl.static_range(BLOCK_K):
            u = _row_term(w_ptr, vectors, u, offs_k, k, K, HD, hd_offs, hd_mask)
    else:
        for k in range(0, K):
            u = _row_term(w_ptr, vectors, u, offs_k, k, K, HD, hd_offs, hd_mask)
    return u


@jit
def _row_value(sums, out, w_ptr, offs_k, k, K, HD, hd_offs, hd_mask):
    s_k = tl.sum(tl.where(offs_k[None, None, :] == k, sums, 0.0), axis=2)                     # [ROWS, BLOCK_H]
    # loaded again, never kept from rows_edge_terms: the compiler would otherwise keep every row W[k]
    # (replicated across the threads of wider tiles) live through a kernel's edge loop (sm_90: the forward
    # row kernel at 218 registers against 72)
    return out + s_k[:, :, None] * _weight_row(w_ptr, k, K, HD, hd_offs, hd_mask, sums.dtype, True)[None, :, :]


@jit
def rows_edge_values(sums, w_ptr, K, HD, hd_offs, hd_mask, BLOCK_K: tl.constexpr, FORM: tl.constexpr):
    """``Σ_k S[r, h, k] W[k, h, :]`` ``[ROWS, BLOCK_H, BLOCK_D]`` of the rows' sums ``S [ROWS, BLOCK_H,
    BLOCK_K]`` (the forward's ``A``, the destination pass's ``B``), ``FORM`` as :func:`rows_edge_terms`; the
    weights are loaded again (volatile), never kept from :func:`rows_edge_terms`."""
    offs_k = tl.arange(0, BLOCK_K)
    if FORM == 2:
        w = _weight_tile(w_ptr, K, HD, hd_offs, hd_mask, BLOCK_K, sums.dtype, True)
        return tl.sum(tl.permute(sums, (0, 2, 1))[:, :, :, None] * w[None, :, :, :], axis=1)
    out = tl.zeros([sums.shape[0], hd_offs.shape[0], hd_offs.shape[1]], dtype=sums.dtype)
    if FORM == 1:
        for k in tl.static_range(BLOCK_K):
            out = _row_value(sums, out, w_ptr, offs_k, k, K, HD, hd_offs, hd_mask)
    else:
        for k in range(0, K):
            out = _row_value(sums, out, w_ptr, offs_k, k, K, HD, hd_offs, hd_mask)
    return out


@jit
def edge_product(a, b, DOT: tl.constexpr):
    """``a @ b`` of float32 operands for the edge features' products: ``DOT`` 2 on the tensor cores in three TF32
    parts (``tf32x3``: the float32 product's error, as :mod:`fusecore.linear`'s held parts), else full float32
    products (``ieee``, on the CUDA cores)."""
    if DOT == 2:
        out = tl.dot(a, b, input_precision="tf32x3")
    else:
        out = tl.dot(a, b, input_precision="ieee")
    return out


@jit
def project_edges(attr_ptr, w_ptr, w_tile, eid, e_mask, K, HD, hd_offs, hd_mask, acc_dtype: tl.constexpr,
                  NUM_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                  DOT: tl.constexpr):
    """``e [NUM_E, BLOCK_H, BLOCK_D]`` of the input edges ``eid [NUM_E]`` (0 where masked).

    ``DOT`` 1 or 2: one matrix product ``attr [NUM_E, BLOCK_K] · w_tile`` (needs ``NUM_E``, ``BLOCK_K``
    and ``BLOCK_H · BLOCK_D`` >= 16 and a 16/32-bit dtype); otherwise ``K`` rank-1 updates (3: unrolled).
    Features and weight both in one 2-byte float: the product of the stored operands on the tensor cores
    (a product of two 2-byte floats is exact in float32, and the sums are float32); otherwise float32
    operands, :func:`edge_product` (``DOT`` 2: three TF32 parts on the tensor cores, else full float32 products).
    """
    if (DOT == 1) or (DOT == 2):
        attr_type = attr_ptr.dtype.element_ty
        if (attr_type == w_tile.dtype) and ((attr_type == tl.bfloat16) or (attr_type == tl.float16)):
            attr = edge_attr_tile(attr_ptr, eid, e_mask, K, attr_type, BLOCK_K)
            e = tl.dot(attr, w_tile, out_dtype=tl.float32).to(acc_dtype)
        else:
            attr = edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype, BLOCK_K)
            e = edge_product(attr, w_tile.to(acc_dtype), DOT)
        e = tl.reshape(e, [NUM_E, BLOCK_H, BLOCK_D])
    else:
        e = tl.zeros([NUM_E, BLOCK_H, BLOCK_D], dtype=acc_dtype)
        if DOT == 3:
            # unrolled over the padded width: every feature column's load in flight at once (the loop over the
            # runtime K waits for each column's load in turn), for more registers
            for k in tl.static_range(BLOCK_K):
                attr_k = tl.load(attr_ptr + eid * K + k, mask=e_mask & (eid * 0 + k < K), other=0.0).to(acc_dtype)
                w_k = tl.load(w_ptr + k * HD + hd_offs, mask=hd_mask & (hd_offs * 0 + k < K), other=0.0).to(acc_dtype)
                e += attr_k[:, None, None] * w_k[None, :, :]
        else:
            for k in range(0, K):
                attr_k = tl.load(attr_ptr + eid * K + k, mask=e_mask, other=0.0).to(acc_dtype)
                w_k = tl.load(w_ptr + k * HD + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
                e += attr_k[:, None, None] * w_k[None, :, :]
    return e


@jit
def store_attr_grad(grad_attr_ptr, w_ptr, w_tile, grad_e, eid, e_mask, K, HD, hd_offs, hd_mask,
                    NUM_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT: tl.constexpr):
    """``∂attr[eid, k] = Σ_{h,d} ∂e[:, h, d] W[k, h, d]`` for every ``k`` (``grad_e [NUM_E, BH, BD]``):
    one product with ``w_tileᵀ`` and a row-wise store (``DOT``), or ``K`` reductions."""
    if DOT:
        offs_k = tl.arange(0, BLOCK_K)
        flat = tl.reshape(grad_e, [NUM_E, BLOCK_H * BLOCK_D])
        grad_attr = edge_product(flat, tl.trans(w_tile).to(flat.dtype), DOT)
        tl.store(grad_attr_ptr + eid[:, None] * K + offs_k[None, :], grad_attr.to(grad_attr_ptr.dtype.element_ty),
                 mask=e_mask[:, None] & (offs_k < K)[None, :])
    else:
        for k in range(0, K):
            w_k = tl.load(w_ptr + k * HD + hd_offs, mask=hd_mask, other=0.0).to(grad_e.dtype)
            grad_k = tl.sum(tl.sum(grad_e * w_k[None, :, :], axis=2), axis=1)
            tl.store(grad_attr_ptr + eid * K + k, grad_k.to(grad_attr_ptr.dtype.element_ty), mask=e_mask)


@jit
def csr_block(dst_ptr, eid_ptr, E, H, D, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The CSR positions ``p`` of block ``program_id`` (and their mask), the head tile, and the positions'
    destinations ``i`` and input edge ids (int64): the start of every per-edge pass in CSR order."""
    pid = tl.program_id(0).to(tl.int64)
    p = pid * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = p < E
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    i = tl.load(dst_ptr + p, mask=p_mask, other=0).to(tl.int64)
    eid = tl.load(eid_ptr + p, mask=p_mask, other=0).to(tl.int64)
    return p, p_mask, offs_h, h_mask, hd_offs, hd_mask, i, eid


@jit
def _csr_block_rows(dst_ptr, eid_ptr, query_ptr, grad_out_ptr, E, H, D, feat_stride, acc_dtype: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """:func:`csr_block`, and the destinations' ``q`` (row stride ``feat_stride``) and ``g`` rows ``[BLOCK_P,
    BLOCK_H, BLOCK_D]`` in ``acc_dtype``."""
    p, p_mask, offs_h, h_mask, hd_offs, hd_mask, i, eid = csr_block(dst_ptr, eid_ptr, E, H, D, BLOCK_P, BLOCK_H,
                                                                    BLOCK_D)
    feat_mask = p_mask[:, None, None] & hd_mask[None, :, :]
    q = tl.load(query_ptr + i[:, None, None] * feat_stride + hd_offs[None, :, :], mask=feat_mask,
                other=0.0).to(acc_dtype)
    g = tl.load(grad_out_ptr + i[:, None, None] * (H * D) + hd_offs[None, :, :], mask=feat_mask,
                other=0.0).to(acc_dtype)
    return p, p_mask, offs_h, h_mask, hd_offs, hd_mask, eid, q, g


@jit
def edge_terms_kernel(
    dst_ptr, eid_ptr, attr_ptr, w_ptr, query_ptr, grad_out_ptr, terms_ptr, E, H, D, K, scale, feat_stride,
    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    EDGE_DOT: tl.constexpr,
):
    """``terms[p] = (t_p, r_p)`` ``[2, H]`` for the CSR positions ``p`` of block ``program_id``:
    ``t_p[h] = Σ_d e_p[h, d] · scale · q[i, h, d]`` and ``r_p[h] = Σ_d e_p[h, d] · g[i, h, d]`` with
    ``i = dst[p]`` the edge's destination and ``e_p = W_e · attr[eid[p]]``.

    Every position projects its edge (:func:`project_edges`) and meets its destination's ``q`` and ``g`` rows,
    gathered per position (cache hits for the block's repeated destinations).

    ``q`` ``[N, H, D]`` is read with row stride ``feat_stride``, ``g`` contiguous; ``terms`` is
    ``[E, 2, H]`` in the accumulation dtype.  Bytes: ``E·K`` features and ``2·E·H`` terms, plus
    ``q`` and ``g`` rows (one per destination in a block, cache hits for the rest)."""
    acc_dtype = terms_ptr.dtype.element_ty
    p, p_mask, offs_h, h_mask, hd_offs, hd_mask, eid, q, g = _csr_block_rows(
        dst_ptr, eid_ptr, query_ptr, grad_out_ptr, E, H, D, feat_stride, acc_dtype, BLOCK_P, BLOCK_H, BLOCK_D)
    w_tile = edge_weight_tile(w_ptr, K, H, D, BLOCK_K, BLOCK_H, BLOCK_D)
    e = project_edges(attr_ptr, w_ptr, w_tile, eid, p_mask, K, H * D, hd_offs, hd_mask, acc_dtype, BLOCK_P, BLOCK_H,
                      BLOCK_D, BLOCK_K, EDGE_DOT)
    # q scaled before the products, as the source pass scales the gathered queries
    t = tl.sum(e * (q * scale), axis=2)
    r = tl.sum(e * g, axis=2)
    offs = p[:, None] * (2 * H) + offs_h[None, :]
    ph_mask = p_mask[:, None] & h_mask[None, :]
    tl.store(terms_ptr + offs, t.to(terms_ptr.dtype.element_ty), mask=ph_mask)
    tl.store(terms_ptr + offs + H, r.to(terms_ptr.dtype.element_ty), mask=ph_mask)


@jit
def edge_weight_grad_kernel(
    sums_ptr, grad_out_ptr, query_ptr, partial_ptr, N, H, D, K, scale, feat_stride, nodes_per_program,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HEADS_FIRST: tl.constexpr = False, CVT: tl.constexpr = False,
):
    """``partial[pid, h, :, :] = (Σ_n A[n, h]ᵀ g[n, h] + scale · Σ_n B[n, h]ᵀ q[n, h])ᵀ`` ``[D, K]`` for head ``h``
    over the nodes ``[pid · nodes_per_program, (pid + 1) · nodes_per_program)`` (``sums [N, 2, H, K]``: ``A`` then
    ``B``; ``g [N, H, D]`` contiguous, ``q`` with row stride ``feat_stride``): two ``[K, BLOCK_N] @ [BLOCK_N, D]``
    products per node block, every byte read once (a head's ``K`` sums and ``D`` features are contiguous), stored
    transposed.  The caller adds the programs' partials: ``∂W [H·D, K]``, the layout of ``lin_edge.weight`` itself
    (no transposed copy of the gradient).

    ``DOT_PRECISION`` "ieee": the products on the CUDA cores in the accumulation dtype (float64 too; sm_90, float32:
    one shared-memory read per multiply-add); "tf32x3" (float32 sums): on the tensor cores through
    :func:`fusecore.linear.split_dot` — the sums split into TF32 parts, ``g`` and ``q`` too unless they come in a
    2-byte float (exact in TF32: two products a pair, not three) — at about float32's accuracy.  ``HEADS_FIRST``:
    the head is ``program_id(0)`` and the node block ``program_id(1)``, so the ``H`` programs of one node block
    run together and share each node's lines of the sums; otherwise the other way round.  ``CVT``: the split by
    the hardware's conversion (:func:`fusecore.linear.tf32_parts`, compiled only)."""
    acc_dtype = partial_ptr.dtype.element_ty
    if HEADS_FIRST:
        h = tl.program_id(0)
        pid = tl.program_id(1).to(tl.int64)
    else:
        pid = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    k_mask = offs_k < K
    d_mask = offs_d < D
    first = pid * nodes_per_program
    last = tl.minimum(first + nodes_per_program, N)
    HK = H * K
    # a feature dtype TF32 holds exactly: the split leaves g and q whole
    exact = grad_out_ptr.dtype.element_ty != tl.float32
    acc_g = tl.zeros([BLOCK_K, BLOCK_D], dtype=acc_dtype)
    acc_q = tl.zeros([BLOCK_K, BLOCK_D], dtype=acc_dtype)
    rem_g = tl.zeros([BLOCK_K, BLOCK_D], dtype=acc_dtype)
    rem_q = tl.zeros([BLOCK_K, BLOCK_D], dtype=acc_dtype)
    for n0 in range(first, last, BLOCK_N):
        n = n0 + offs_n
        n_mask = n < last
        nk_mask = n_mask[:, None] & k_mask[None, :]
        nd_mask = n_mask[:, None] & d_mask[None, :]
        sums = sums_ptr + n[:, None] * (2 * HK) + h * K + offs_k[None, :]
        a = tl.trans(tl.load(sums, mask=nk_mask, other=0.0))
        b = tl.trans(tl.load(sums + HK, mask=nk_mask, other=0.0))
        g = tl.load(grad_out_ptr + n[:, None] * (H * D) + h * D + offs_d[None, :], mask=nd_mask,
                    other=0.0).to(acc_dtype)
        q = tl.load(query_ptr + n[:, None] * feat_stride + h * D + offs_d[None, :], mask=nd_mask,
                    other=0.0).to(acc_dtype)
        if DOT_PRECISION == "tf32x3":
            if exact:
                acc_g, rem_g = split_dot(a, g, g, acc_g, rem_g, True, CVT)
                acc_q, rem_q = split_dot(b, q, q, acc_q, rem_q, True, CVT)
            else:
                g_hi, g_lo = tf32_parts(g, CVT)
                q_hi, q_lo = tf32_parts(q, CVT)
                acc_g, rem_g = split_dot(a, g_hi, g_lo, acc_g, rem_g, False, CVT)
                acc_q, rem_q = split_dot(b, q_hi, q_lo, acc_q, rem_q, False, CVT)
        else:
            acc_g += tl.dot(a, g, input_precision=DOT_PRECISION)
            acc_q += tl.dot(b, q, input_precision=DOT_PRECISION)
    acc = acc_g + finite_or_zero(rem_g) + scale * (acc_q + finite_or_zero(rem_q))
    tl.store(partial_ptr + pid * (K * H * D) + (h * D + offs_d[None, :]) * K + offs_k[:, None], acc,
             mask=k_mask[:, None] & d_mask[None, :])


@jit
def edge_attr_grad_kernel(
    dst_ptr, eid_ptr, w_ptr, query_ptr, grad_out_ptr, terms_ptr, grad_s_ptr, grad_attr_ptr, E, H, D, K, scale,
    feat_stride, BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    EDGE_DOT: tl.constexpr,
):
    """``∂attr[eid[p], k] = Σ_{h,d} ∂e_p[h, d] W[k, h, d]`` for the CSR positions ``p`` of block
    ``program_id``, ``∂e_p = α'_p g_i + ∂s_p · scale · q_i`` per head (``i = dst[p]``; ``α'_p`` from
    ``terms[p, 0]`` as the source pass left it, ``∂s_p`` from its ``grad_s [E, H]``;
    :func:`store_attr_grad`).  Bytes: ``3·E·H`` reads, ``E·K`` writes, ``q`` and ``g`` rows."""
    acc_dtype = terms_ptr.dtype.element_ty
    p, p_mask, offs_h, h_mask, hd_offs, hd_mask, eid, q, g = _csr_block_rows(
        dst_ptr, eid_ptr, query_ptr, grad_out_ptr, E, H, D, feat_stride, acc_dtype, BLOCK_P, BLOCK_H, BLOCK_D)
    HD = H * D
    ph_mask = p_mask[:, None] & h_mask[None, :]
    alpha_kept = tl.load(terms_ptr + p[:, None] * (2 * H) + offs_h[None, :], mask=ph_mask, other=0.0)
    grad_s = tl.load(grad_s_ptr + p[:, None] * H + offs_h[None, :], mask=ph_mask, other=0.0)
    grad_e = alpha_kept[:, :, None] * g + grad_s[:, :, None] * (q * scale)
    w_tile = edge_weight_tile(w_ptr, K, H, D, BLOCK_K, BLOCK_H, BLOCK_D)
    store_attr_grad(grad_attr_ptr, w_ptr, w_tile, grad_e, eid, p_mask, K, HD, hd_offs, hd_mask, BLOCK_P, BLOCK_H,
                    BLOCK_D, BLOCK_K, EDGE_DOT)


# ---------------------------------------------------------------------------------------------------------------------
# GATv2 with edge features (PyG GATv2Conv's ``edge_dim``): ``z_p = fs_j + fd_i + e_p``, ``s_p = Σ_d a_d ·
# LeakyReLU(z_p)_d`` per head, values ``fs_j`` (the edge term in the score only).  ``e_p`` sits inside the LeakyReLU, so
# the row trick above (``u_i = W q̃_i``, valid for the dot score only) does not apply: the forward projects its edges in
# registers (:func:`add_edge_vectors`, one :func:`project_edges` per edge tile).  A training forward keeps what the
# backward needs of ``z_p`` (:func:`save_scores`): the score ``s_p`` (``[E, H]``, for the weights ``exp(s − lse)``) and
# the LeakyReLU's slope per element, one bit (``z_p > 0``; :func:`store_slopes`, ``[E, W]`` int32 words at CSR
# positions, ``W = BLOCK_H · BLOCK_D / 32``: 16 bytes an edge at 8 heads × 16, 1/32 of an ``E×H×D`` float32 tensor).
# With ``c_p = LeakyReLU'(z_p)`` (:func:`slope_factors`) ``LeakyReLU(z_p) = c_p ⊙ (fs_j + fd_i) + c_p ⊙ e_p``, so the
# backward projects nothing: the source pass forms ``∂fs`` and the ``∂a`` terms without ``e_p``, the destination pass
# ``∂fd`` from ``∂z_p = ∂s_p · a ⊙ c_p`` (:func:`slope_grad`), and one CSR-order pass (:func:`gatv2_edge_grad_kernel`)
# ``∂attr``, ``G = Σ_p ∂s_p c_p ⊗ attr_p`` and from it ``∂W_e = a ⊙ G`` and ``e_p``'s share of ``∂a``, ``Σ_k W[k] ⊙
# G[k]``.
# ---------------------------------------------------------------------------------------------------------------------


@jit
def store_slopes(slopes_ptr, pos, e_mask, z, NUM_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                 SLOPE_BITS: tl.constexpr):
    """Store the signs of ``z [NUM_E, BLOCK_H, BLOCK_D]`` (``z > 0``, the LeakyReLU's slope 1) as bits: element ``c =
    h · BLOCK_D + d`` of position ``pos`` is bit ``c % SLOPE_BITS`` of word ``slopes[pos, c // SLOPE_BITS]`` (int32;
    ``SLOPE_BITS = min(32, BLOCK_H · BLOCK_D)``), rows where ``e_mask``."""
    WORDS: tl.constexpr = BLOCK_H * BLOCK_D // SLOPE_BITS
    bits = tl.reshape((z > 0).to(tl.int32), [NUM_E, WORDS, SLOPE_BITS])
    shifts = tl.arange(0, SLOPE_BITS)
    words = tl.sum(bits << shifts[None, None, :], axis=2)  # distinct bits: the sum is their OR
    offs_w = tl.arange(0, WORDS)
    tl.store(slopes_ptr + pos[:, None] * WORDS + offs_w[None, :], words, mask=e_mask[:, None])


@jit
def save_scores(scores_ptr, slopes_ptr, pos, e_mask, s, z, H, offs_h, h_mask, NUM_E: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SLOPE_BITS: tl.constexpr):
    """The forward's GATv2 scores ``s [NUM_E, BLOCK_H]`` into ``scores [E, H]`` and the signs of ``z = fs_j + fd_i +
    e_p`` (:func:`store_slopes`) at the CSR positions ``pos`` (where ``e_mask``): what the backward reads instead of
    projecting the edges again."""
    tl.store(scores_ptr + pos[:, None] * H + offs_h[None, :], s.to(scores_ptr.dtype.element_ty),
             mask=e_mask[:, None] & h_mask[None, :])
    store_slopes(slopes_ptr, pos, e_mask, z, NUM_E, BLOCK_H, BLOCK_D, SLOPE_BITS)


@jit
def slope_factors(slopes_ptr, pos, e_mask, negative_slope, dtype: tl.constexpr, NUM_E: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SLOPE_BITS: tl.constexpr):
    """``c = LeakyReLU'(z)`` ``[NUM_E, BLOCK_H, BLOCK_D]`` in ``dtype`` (1 where the stored bit is set, else
    ``negative_slope``) from the signs :func:`store_slopes` stored at ``pos`` (0 bits where not ``e_mask``)."""
    WORDS: tl.constexpr = BLOCK_H * BLOCK_D // SLOPE_BITS
    offs_w = tl.arange(0, WORDS)
    words = tl.load(slopes_ptr + pos[:, None] * WORDS + offs_w[None, :], mask=e_mask[:, None], other=0)
    shifts = tl.arange(0, SLOPE_BITS)
    bits = (words[:, :, None] >> shifts[None, None, :]) & 1
    positive = tl.reshape(bits, [NUM_E, BLOCK_H, BLOCK_D]) != 0
    return tl.where(positive, 1.0, negative_slope).to(dtype)


@jit
def slope_grad(slopes_ptr, pos, e_mask, grad_s, attn, negative_slope, NUM_E: tl.constexpr, BLOCK_H: tl.constexpr,
               BLOCK_D: tl.constexpr, SLOPE_BITS: tl.constexpr):
    """``∂z = ∂s · a ⊙ LeakyReLU'(z)`` ``[NUM_E, BLOCK_H, BLOCK_D]`` from the stored slopes (:func:`slope_factors`;
    ``grad_s [NUM_E, BLOCK_H]``, ``attn [1, BLOCK_H, BLOCK_D]``), as :func:`~gnnfuse.kernels.scores.score_grad` forms
    it from ``z``: ``(∂s · a) · c``."""
    return (grad_s[:, :, None] * attn) * slope_factors(slopes_ptr, pos, e_mask, negative_slope, grad_s.dtype, NUM_E,
                                                        BLOCK_H, BLOCK_D, SLOPE_BITS)


@jit
def add_edge_vectors(src_term, attr_ptr, w_ptr, w_tile, eid_ptr, pos, e_mask, K, HD, hd_offs, hd_mask,
                     NUM_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                     DOT: tl.constexpr, ADD: tl.constexpr):
    """GATv2's score-side source term with the edge vector added (``ADD``): ``src_term + e_p``, ``e_p = W ·
    attr[eid[pos]]`` projected in registers (:func:`project_edges`; ``pos [NUM_E]`` CSR positions, 0 added where not
    ``e_mask``), ``src_term`` ``[NUM_E or 1, BLOCK_H, BLOCK_D]`` in the accumulation dtype; else ``src_term`` itself.
    Only the score sees the sum: the caller keeps ``fs_j`` as the value."""
    if ADD:
        eid = tl.load(eid_ptr + pos, mask=e_mask, other=0).to(tl.int64)
        src_term = src_term + project_edges(attr_ptr, w_ptr, w_tile, eid, e_mask, K, HD, hd_offs, hd_mask,
                                            src_term.dtype, NUM_E, BLOCK_H, BLOCK_D, BLOCK_K, DOT)
    return src_term


@jit
def gatv2_edge_grad_kernel(
    eid_ptr, slopes_ptr, attn_ptr, attr_ptr, w_ptr, grad_s_ptr, grad_attr_ptr, partial_ptr, E, H, D, K,
    negative_slope, edges_per_program,
    BLOCK_P: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    EDGE_DOT: tl.constexpr, ATTR_GRAD: tl.constexpr, SLOPE_BITS: tl.constexpr,
):
    """GATv2's edge-feature terms over the CSR positions ``[pid · edges_per_program, ...)`` in blocks of ``BLOCK_P``:
    per position ``p`` ``u_p = ∂s_p ⊙ c_p`` (``∂s [E, H]``: the source pass's, in CSR order, dropout and the edge
    factor already in it; ``c_p = LeakyReLU'(z_p)`` from the slopes the forward stored, :func:`slope_factors`;
    ``∂z_p = a ⊙ u_p``), then

    * ``ATTR_GRAD``: ``∂attr[eid[p], k] = Σ_{h,d} ∂z_p[h, d] W[k, h, d]`` (:func:`store_attr_grad`, input order);
    * ``partial[pid, h·D + d, k] = Σ_p attr_p[k] u_p[h, d]``, one ``[BLOCK_K, BLOCK_P] @ [BLOCK_P, BLOCK_H·BLOCK_D]``
      product per block (``EDGE_DOT``, else a broadcast sum) summed in registers; the caller adds the programs'
      partials in a fixed order into ``G [H·D, K]``, from which ``∂W_e = a ⊙ G`` (``lin_edge.weight``'s layout) and
      ``e_p``'s share of ``∂attn``, ``Σ_p ∂s_p c_p ⊙ e_p = Σ_k W[k] ⊙ G[:, k]``.

    Why a pass of its own: every schedule form (light rows, medium rows, super-row pieces merged anywhere) stores
    ``∂s`` (and the forward the slopes) at each CSR position, and from them alone a CSR block forms ``u``, so one
    kernel serves them all; per-row sums as the dot score's ``A``, ``B`` would not help, ``∂z`` depending on ``e_p``
    through the LeakyReLU.  Deterministic, no atomics, no ``[E, H, D]`` buffer.  Bytes: ``E·K`` features (read, and
    written with ``ATTR_GRAD``), ``E·H`` of ``∂s`` and ``E·H·D`` bits of slopes, all but the features (at ``eid``)
    read in order."""
    acc_dtype = grad_s_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    offs_b = tl.arange(0, BLOCK_P)
    offs_k = tl.arange(0, BLOCK_K)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)
    HD = H * D
    w_tile = edge_weight_tile(w_ptr, K, H, D, BLOCK_K, BLOCK_H, BLOCK_D)
    attn = tl.load(attn_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)[None, :, :]
    acc_w = tl.zeros([BLOCK_K, BLOCK_H * BLOCK_D], dtype=acc_dtype)
    first = pid * edges_per_program
    last = tl.minimum(first + edges_per_program, E)
    for p0 in range(first, last, BLOCK_P):
        p = p0 + offs_b
        p_mask = p < last
        eid = tl.load(eid_ptr + p, mask=p_mask, other=0).to(tl.int64)
        grad_s = tl.load(grad_s_ptr + p[:, None] * H + offs_h[None, :], mask=p_mask[:, None] & h_mask[None, :],
                         other=0.0)
        u = grad_s[:, :, None] * slope_factors(slopes_ptr, p, p_mask, negative_slope, acc_dtype, BLOCK_P, BLOCK_H,
                                               BLOCK_D, SLOPE_BITS)
        if ATTR_GRAD:
            store_attr_grad(grad_attr_ptr, w_ptr, w_tile, u * attn, eid, p_mask, K, HD, hd_offs, hd_mask, BLOCK_P,
                            BLOCK_H, BLOCK_D, BLOCK_K, EDGE_DOT)
        attr = edge_attr_tile(attr_ptr, eid, p_mask, K, acc_dtype, BLOCK_K)                        # [BLOCK_P, BLOCK_K]
        flat = tl.reshape(u, [BLOCK_P, BLOCK_H * BLOCK_D])
        if EDGE_DOT:
            acc_w += edge_product(tl.trans(attr), flat, EDGE_DOT)
        else:
            acc_w += tl.sum(attr[:, :, None] * flat[:, None, :], axis=0)
    tl.store(partial_ptr + pid * (HD * K) + c_offs[None, :] * K + offs_k[:, None], acc_w,
             mask=(offs_k < K)[:, None] & c_mask[None, :])
