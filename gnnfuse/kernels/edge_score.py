"""GAT's per-edge score term from edge features, formed in CSR order: ``ee_p = attr_{e(p)} · M`` (PyG GATConv's
``edge_dim``: ``M [K, H]`` folds ``lin_edge`` and ``att_edge``), with the self loops' rows PyG fills.

The attention kernels read the term at CSR positions ``p`` (``[P, H]``, the accumulation dtype).
:func:`edge_score_kernel` writes it there directly from the features in the caller's edge order: position ``p``
reads row ``src_edge[p]`` of ``attr [R, K]`` (``-1``: a loop's position, left to :func:`loop_score_kernel`) and
multiplies by ``M`` as one ``tl.dot`` per block of positions (IEEE float32 / float64 products: the FMA units, exact
as a float32 product; the kernel is bound by the feature rows it gathers) — one read of the features and one
write of the scores, where a product in input order, the kept edges' gather, the loops' concatenation and the gather
into CSR order moved them four times.

With ``SUMS`` it also adds each destination's scores into ``sums [N, H]`` (the self loops' ``'mean'`` / ``'add'``
fill: PyG reduces the incoming kept edges' features, and the reduction moves through the linear ``· M`` onto the
``H``-wide scores).  Positions are sorted by destination, so a block's scores are summed per destination in
registers first (a segmented scan, :func:`_segmented_add`) and one atomic add per destination run and head leaves
the block: a hub row of ``d`` edges costs ``≈ d / BLOCK_P`` atomics on its address, not ``d``.

:func:`loop_score_kernel` then writes every loop's row, node ``i``'s at ``loop_pos[i]``: ``sums[i] / max(c_i, 1)``
(``MEAN``, ``c_i`` the node's kept in-degree), ``sums[i]`` (``ADD``) or one row for all (``CONST``:
``fill_value · M``) — element-wise over loop nodes and heads.

:func:`edge_score_backward_kernel`, from ``∂ee [P, H]`` (CSR order), adds to each kept edge the share of its
destination's loop gradient (``SPREAD``: ``MEAN`` divides ``∂ee_{loop(i)}`` over ``i``'s ``c_i`` kept edges, ``ADD``
gives it to each; the loop's position is inside ``i``'s own row, so the read is a cache hit)::

    g_p          = ∂ee_p + ∂ee_{loop(dst(p))} / c_dst(p)     (MEAN; without "/ c" for ADD; dst(p) < L only)
    ∂attr_{e(p)} = g_p Mᵀ                   (stored at the feature's own row: the caller's edge order)
    ∂M           = Σ_p attr_{e(p)}ᵀ g_p      (per-program partials [programs, K·H], summed by the launcher)
"""

import triton.language as tl

from fusecore.backend import jit

# MODE of loop_score_kernel (compared as literals inside the kernel: Triton reads no plain globals)
FILL_CONST = 0
FILL_MEAN = 1
FILL_ADD = 2


@jit
def _positions(src_edge_ptr, block, P, BLOCK_P: tl.constexpr):
    """(positions, whether inside ``[0, P)``, their feature rows as int64, whether a feature row is read) of one
    block of ``BLOCK_P`` positions."""
    offs_p = block * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < P
    rows = tl.load(src_edge_ptr + offs_p, mask=p_mask, other=-1).to(tl.int64)
    return offs_p, p_mask, rows, p_mask & (rows >= 0)


@jit
def _fold_tile(fold_ptr, offs_k, K: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr, acc_dtype: tl.constexpr):
    """``M[offs_k, :]`` as ``[BLOCK_K, BLOCK_H]`` (zero outside ``K × H``) and the head offsets / mask."""
    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    fold = tl.load(fold_ptr + offs_k[:, None] * H + offs_h[None, :], mask=(offs_k < K)[:, None] & h_mask[None, :],
                   other=0.0).to(acc_dtype)
    return fold, offs_h, h_mask


@jit
def _segmented_add(value_a, start_a, value_b, start_b):
    """Combine of a segmented inclusive sum: a run restarts where ``start`` is set."""
    return tl.where(start_b != 0, value_b, value_a + value_b), start_a | start_b


@jit
def edge_score_kernel(attr_ptr, fold_ptr, src_edge_ptr, out_ptr, dst_ptr, sums_ptr, P, K: tl.constexpr,
                      H: tl.constexpr, SUMS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK_H: tl.constexpr):
    acc_dtype = out_ptr.dtype.element_ty
    block = tl.program_id(0).to(tl.int64)
    offs_p, p_mask, rows, e_mask = _positions(src_edge_ptr, block, P, BLOCK_P)
    acc = tl.zeros([BLOCK_P, BLOCK_H], dtype=acc_dtype)
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        fold, offs_h, h_mask = _fold_tile(fold_ptr, offs_k, K, H, BLOCK_H, acc_dtype)
        attr = tl.load(attr_ptr + rows[:, None] * K + offs_k[None, :], mask=e_mask[:, None] & (offs_k < K)[None, :],
                       other=0.0).to(acc_dtype)
        acc += tl.dot(attr, fold, input_precision="ieee", out_dtype=acc_dtype)
    tl.store(out_ptr + offs_p[:, None] * H + offs_h[None, :], acc, mask=e_mask[:, None] & h_mask[None, :])
    if SUMS:  # per destination run of the block (loops' rows hold zeros: no feature row was read)
        dst = tl.load(dst_ptr + offs_p, mask=p_mask, other=-1)
        before = tl.load(dst_ptr + offs_p - 1, mask=p_mask & (offs_p > block * BLOCK_P), other=-1)
        after = tl.load(dst_ptr + offs_p + 1, mask=(offs_p + 1 < P) & (offs_p + 1 < (block + 1) * BLOCK_P),
                        other=-1)
        starts = tl.broadcast_to((dst != before).to(tl.int32)[:, None], (BLOCK_P, BLOCK_H))
        run_sums, _ = tl.associative_scan((acc, starts), 0, _segmented_add)
        last = p_mask & (dst != after)
        tl.atomic_add(sums_ptr + dst.to(tl.int64)[:, None] * H + offs_h[None, :], run_sums,
                      mask=last[:, None] & h_mask[None, :], sem="relaxed")


@jit
def loop_score_kernel(ee_ptr, sums_ptr, counts_ptr, loop_pos_ptr, fill_ptr, num_loops, H: tl.constexpr,
                      MODE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr):
    acc_dtype = ee_ptr.dtype.element_ty
    nodes = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = nodes < num_loops
    offs_h = tl.arange(0, BLOCK_H)
    mask = n_mask[:, None] & (offs_h < H)[None, :]
    pos = tl.load(loop_pos_ptr + nodes, mask=n_mask, other=0).to(tl.int64)
    if MODE == 0:  # FILL_CONST
        rows = tl.broadcast_to(tl.load(fill_ptr + offs_h, mask=offs_h < H, other=0.0).to(acc_dtype)[None, :],
                               (BLOCK_N, BLOCK_H))
    else:
        rows = tl.load(sums_ptr + nodes[:, None] * H + offs_h[None, :], mask=mask, other=0.0)
        if MODE == 1:  # FILL_MEAN
            counts = tl.load(counts_ptr + nodes, mask=n_mask, other=1)
            rows = rows / tl.maximum(counts, 1).to(acc_dtype)[:, None]
    tl.store(ee_ptr + pos[:, None] * H + offs_h[None, :], rows, mask=mask)


@jit
def edge_score_backward_kernel(attr_ptr, fold_ptr, src_edge_ptr, dst_ptr, loop_pos_ptr, counts_ptr, grad_ptr,
                               grad_attr_ptr, part_ptr, P, num_loops, K: tl.constexpr, H: tl.constexpr,
                               SPREAD: tl.constexpr,
                               BLOCKS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                               BLOCK_H: tl.constexpr):
    acc_dtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        fold, offs_h, h_mask = _fold_tile(fold_ptr, offs_k, K, H, BLOCK_H, acc_dtype)
        fold_t = tl.trans(fold)
        part = tl.zeros([BLOCK_K, BLOCK_H], dtype=acc_dtype)
        for b in range(BLOCKS):
            offs_p, _, rows, e_mask = _positions(src_edge_ptr, pid * BLOCKS + b, P, BLOCK_P)
            ph_mask = e_mask[:, None] & h_mask[None, :]
            grad = tl.load(grad_ptr + offs_p[:, None] * H + offs_h[None, :], mask=ph_mask, other=0.0)
            if SPREAD != 0:  # FILL_MEAN or FILL_ADD
                dst = tl.load(dst_ptr + offs_p, mask=e_mask, other=0).to(tl.int64)
                looped = e_mask & (dst < num_loops)
                loop_pos = tl.load(loop_pos_ptr + dst, mask=looped, other=0).to(tl.int64)
                share = tl.load(grad_ptr + loop_pos[:, None] * H + offs_h[None, :],
                                mask=looped[:, None] & h_mask[None, :], other=0.0)
                if SPREAD == 1:  # FILL_MEAN
                    counts = tl.load(counts_ptr + dst, mask=looped, other=1)
                    share = share / tl.maximum(counts, 1).to(acc_dtype)[:, None]
                grad += share
            pk_mask = e_mask[:, None] & k_mask[None, :]
            grad_attr = tl.dot(grad, fold_t, input_precision="ieee", out_dtype=acc_dtype)
            tl.store(grad_attr_ptr + rows[:, None] * K + offs_k[None, :],
                     grad_attr.to(grad_attr_ptr.dtype.element_ty), mask=pk_mask)
            attr = tl.load(attr_ptr + rows[:, None] * K + offs_k[None, :], mask=pk_mask, other=0.0).to(acc_dtype)
            part += tl.dot(tl.trans(attr), grad, input_precision="ieee", out_dtype=acc_dtype)
        tl.store(part_ptr + pid * (K * H) + offs_k[:, None] * H + offs_h[None, :], part,
                 mask=k_mask[:, None] & h_mask[None, :])
