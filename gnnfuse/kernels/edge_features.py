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
(:func:`row_edge_terms`, once per row)::

    q̃_i · e_p              = Σ_k attr_p[k] u_i[k, h]                       (score)
    Σ_p α_p e_p[h, :]       = Σ_k A_i[k, h] W[k, h, :],  A_i[k, h] = Σ_p α_p[h] attr_p[k]   (values)

so per edge only ``K·H`` products remain (instead of the ``K·H·D`` of a projection) and the
``W`` terms are applied once per row.  Kernels that gather per edge from many rows (light
tiles, the backward's source pass) project with :func:`project_edges`.

Backward, with ``∂e_p = α'_p g_i + ∂s_p q̃_i`` per head (value path + key path, ``i`` the
edge's destination; see :mod:`gnnfuse.kernels.attention_backward`)::

    ∂attr_p[k] = Σ_{h,d} ∂e_p[h, d] W[k, h, d]                         (:func:`store_attr_grad`)
    ∂W[k, h, :] = Σ_p attr_p[k] ∂e_p[h, :]
                = Σ_i A_i[k, h] g_i[h, :] + B_i[k, h] q̃_i[h, :]
    A_i[k, h] = Σ_{p -> i} attr_p[k] α'_p[h],   B_i[k, h] = Σ_{p -> i} attr_p[k] ∂s_p[h]

(in a row kernel ``∂attr_p[k] = Σ_h α'_p[h] z_i[k, h] + ∂s_p[h] u_i[k, h]`` with
``z_i = W g_i`` like ``u_i``, and the key path's ``Σ_p ∂s_p e_p = Σ_k B_i[k, h] W[k, h, :]``),
so the weight gradient needs only the per-destination ``[N, K, H]`` sums ``A``, ``B``
(of :func:`attr_outer` terms, written by the destination pass, one writer per row) and a
reduction over nodes on the host (two plain matrix products) — deterministic, no atomics, no
``E×H×D`` buffer.
"""

import triton.language as tl

from fusecore.backend import jit

from .tiles import flat_head_tile


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
def row_edge_terms(w_heads, row_vector):
    """``Σ_d W[k, h, d] · v[h, d]`` ``[BLOCK_K, BLOCK_H]`` of one row's ``[BLOCK_H, BLOCK_D]`` vector
    ``v`` (``u = W q̃``, ``z = W g``; ``w_heads`` from :func:`edge_weight_heads`)."""
    return tl.sum(w_heads * row_vector[None, :, :], axis=2)


@jit
def edge_weight_heads(w_ptr, K, HD, hd_offs, hd_mask, acc_dtype: tl.constexpr, BLOCK_K: tl.constexpr):
    """``W`` as a zero-padded ``[BLOCK_K, BLOCK_H, BLOCK_D]`` tile in ``acc_dtype`` (per-head layout)."""
    offs_k = tl.arange(0, BLOCK_K)
    return tl.load(w_ptr + offs_k[:, None, None] * HD + hd_offs[None, :, :],
                   mask=(offs_k < K)[:, None, None] & hd_mask[None, :, :], other=0.0).to(acc_dtype)


@jit
def project_edges(attr_ptr, w_ptr, w_tile, eid, e_mask, K, HD, hd_offs, hd_mask, acc_dtype: tl.constexpr,
                  NUM_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                  DOT: tl.constexpr):
    """``e [NUM_E, BLOCK_H, BLOCK_D]`` of the input edges ``eid [NUM_E]`` (0 where masked).

    ``DOT``: one matrix product ``attr [NUM_E, BLOCK_K] · w_tile`` (needs ``NUM_E``, ``BLOCK_K``
    and ``BLOCK_H · BLOCK_D`` >= 16 and a 16/32-bit dtype); otherwise ``K`` rank-1 updates.
    """
    if DOT:
        attr = edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype, BLOCK_K)
        # float32 operands whatever the storage dtype, full float32 products ("ieee", not tf32):
        # the projection is a small share of the work and the result must match PyG's float32 GEMM
        e = tl.reshape(tl.dot(attr, w_tile.to(acc_dtype), input_precision="ieee"), [NUM_E, BLOCK_H, BLOCK_D])
    else:
        e = tl.zeros([NUM_E, BLOCK_H, BLOCK_D], dtype=acc_dtype)
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
        grad_attr = tl.dot(flat, tl.trans(w_tile).to(flat.dtype), input_precision="ieee")
        tl.store(grad_attr_ptr + eid[:, None] * K + offs_k[None, :], grad_attr.to(grad_attr_ptr.dtype.element_ty),
                 mask=e_mask[:, None] & (offs_k < K)[None, :])
    else:
        for k in range(0, K):
            w_k = tl.load(w_ptr + k * HD + hd_offs, mask=hd_mask, other=0.0).to(grad_e.dtype)
            grad_k = tl.sum(tl.sum(grad_e * w_k[None, :, :], axis=2), axis=1)
            tl.store(grad_attr_ptr + eid * K + k, grad_k.to(grad_attr_ptr.dtype.element_ty), mask=e_mask)


@jit
def attr_outer(attr_ptr, eid, e_mask, alpha, grad_s, K, acc_dtype: tl.constexpr, BLOCK_K: tl.constexpr):
    """``(attr[eid_e, k] · alpha[e, h], attr[eid_e, k] · grad_s[e, h])`` per edge, each ``[E, BLOCK_K,
    BLOCK_H]`` (0 where masked), from one read of the features: summed over a row's edges they
    give ``A`` and ``B``."""
    attr = edge_attr_tile(attr_ptr, eid, e_mask, K, acc_dtype, BLOCK_K)[:, :, None]
    return attr * alpha[:, None, :], attr * grad_s[:, None, :]
