"""GAT's per-edge score term from edge features, formed in CSR order: ``ee_p = attr_{e(p)} · M`` (PyG GATConv's
``edge_dim``: ``M [K, H]`` folds ``lin_edge`` and ``att_edge``), with the self loops' rows PyG fills.

The attention kernels read the term at CSR positions ``p`` (``[P, H]``, the accumulation dtype).
:func:`edge_score_kernel` writes it there directly from the features in the caller's edge order: position ``p``
reads row ``src_edge[p]`` of ``attr [R, K]`` (``-1``: a position the kernel leaves to the loops' fill) and
multiplies by ``M`` in registers — one read of the features and one write of the scores, where a product in input
order, the kept edges' gather, the loops' concatenation and the gather into CSR order moved them four times.

:func:`loop_score_kernel` fills a self loop's position of node ``i`` (``loop_pos[i]``) with the mean (``MEAN``) or
the sum (``ADD``) of the scores of the other positions of ``i``'s CSR row — its incoming kept edges, whose
features PyG's ``fill_value='mean'`` / ``'add'`` reduce, the reduction moved through the linear ``· M`` onto the
``H``-wide scores — or with one row for every loop (``CONST``: ``fill_value · M``).  One program walks
``NODES`` consecutive loop nodes' rows (no atomics: a hub row is one program's loop).

:func:`edge_score_backward_kernel`, from ``∂ee [P, H]`` (CSR order; ``spread [N, H]``: the loop's gradient
``∂ee_{loop(i)}`` divided over (``MEAN``) or given to (``ADD``) each incoming kept edge of ``i``, added per
destination)::

    g_p          = ∂ee_p + spread[dst(p)]
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
    """(positions, their feature rows as int64, whether a feature row is read) of one block of ``BLOCK_P``."""
    offs_p = block * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < P
    rows = tl.load(src_edge_ptr + offs_p, mask=p_mask, other=-1).to(tl.int64)
    return offs_p, rows, p_mask & (rows >= 0)


@jit
def edge_score_kernel(attr_ptr, fold_ptr, src_edge_ptr, out_ptr, P, K: tl.constexpr, H: tl.constexpr,
                      BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr):
    acc_dtype = out_ptr.dtype.element_ty
    offs_p, rows, e_mask = _positions(src_edge_ptr, tl.program_id(0).to(tl.int64), P, BLOCK_P)
    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    acc = tl.zeros([BLOCK_P, BLOCK_H], dtype=acc_dtype)
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        attr = tl.load(attr_ptr + rows[:, None] * K + offs_k[None, :], mask=e_mask[:, None] & k_mask[None, :],
                       other=0.0).to(acc_dtype)
        fold = tl.load(fold_ptr + offs_k[:, None] * H + offs_h[None, :], mask=k_mask[:, None] & h_mask[None, :],
                       other=0.0).to(acc_dtype)
        acc += tl.sum(attr[:, :, None] * fold[None, :, :], axis=1)
    tl.store(out_ptr + offs_p[:, None] * H + offs_h[None, :], acc, mask=e_mask[:, None] & h_mask[None, :])


@jit
def loop_score_kernel(ee_ptr, indptr_ptr, loop_pos_ptr, fill_ptr, num_loops, H: tl.constexpr, MODE: tl.constexpr,
                      NODES: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    acc_dtype = ee_ptr.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    offs_e = tl.arange(0, BLOCK_E)
    if MODE == 0:  # FILL_CONST
        fill = tl.load(fill_ptr + offs_h, mask=h_mask, other=0.0).to(acc_dtype)
    for j in tl.static_range(NODES):
        node = tl.program_id(0).to(tl.int64) * NODES + j
        if node < num_loops:
            pos = tl.load(loop_pos_ptr + node).to(tl.int64)
            if MODE == 0:  # FILL_CONST
                row = fill
            else:
                start = tl.load(indptr_ptr + node).to(tl.int64)
                stop = tl.load(indptr_ptr + node + 1).to(tl.int64)
                acc = tl.zeros([BLOCK_E, BLOCK_H], dtype=acc_dtype)
                for p0 in range(start, stop, BLOCK_E):
                    offs = p0 + offs_e
                    mask = ((offs < stop) & (offs != pos))[:, None] & h_mask[None, :]
                    acc += tl.load(ee_ptr + offs[:, None] * H + offs_h[None, :], mask=mask, other=0.0)
                row = tl.sum(acc, axis=0)
                if MODE == 1:  # FILL_MEAN
                    row = row / tl.maximum(stop - start - 1, 1).to(acc_dtype)
            tl.store(ee_ptr + pos * H + offs_h, row, mask=h_mask)


@jit
def edge_score_backward_kernel(attr_ptr, fold_ptr, src_edge_ptr, dst_ptr, grad_ptr, spread_ptr, grad_attr_ptr,
                               part_ptr, P, K: tl.constexpr, H: tl.constexpr, SPREAD: tl.constexpr,
                               BLOCKS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                               BLOCK_H: tl.constexpr):
    acc_dtype = grad_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    for k0 in tl.static_range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        kh_mask = k_mask[:, None] & h_mask[None, :]
        fold = tl.load(fold_ptr + offs_k[:, None] * H + offs_h[None, :], mask=kh_mask, other=0.0).to(acc_dtype)
        part = tl.zeros([BLOCK_K, BLOCK_H], dtype=acc_dtype)
        for b in range(BLOCKS):
            offs_p, rows, e_mask = _positions(src_edge_ptr, pid * BLOCKS + b, P, BLOCK_P)
            ph_mask = e_mask[:, None] & h_mask[None, :]
            grad = tl.load(grad_ptr + offs_p[:, None] * H + offs_h[None, :], mask=ph_mask, other=0.0)
            if SPREAD:
                dst = tl.load(dst_ptr + offs_p, mask=e_mask, other=0).to(tl.int64)
                grad += tl.load(spread_ptr + dst[:, None] * H + offs_h[None, :], mask=ph_mask, other=0.0)
            pk_mask = e_mask[:, None] & k_mask[None, :]
            grad_attr = tl.sum(grad[:, None, :] * fold[None, :, :], axis=2)
            tl.store(grad_attr_ptr + rows[:, None] * K + offs_k[None, :],
                     grad_attr.to(grad_attr_ptr.dtype.element_ty), mask=pk_mask)
            attr = tl.load(attr_ptr + rows[:, None] * K + offs_k[None, :], mask=pk_mask, other=0.0).to(acc_dtype)
            part += tl.sum(attr[:, :, None] * grad[:, None, :], axis=0)
        tl.store(part_ptr + pid * (K * H) + offs_k[:, None] * H + offs_h[None, :], part, mask=kh_mask)
