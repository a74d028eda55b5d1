"""Instruction 3: merge the attention splits, output projection, residual add.

For a tile of BLOCK_N output features n, looping over query heads h::

    w_s   = exp(lse[b, h, s] − max_s lse[b, h, s])          (0 for empty splits)
    a_bh  = Σ_s w_s · out[b, h, s] / Σ_s w_s                 (logsumexp merge, fusecore.softmax)
    x[b, n] += Σ_h a_bh · W_o[n, hD:(h+1)D]

Each program re-merges the (small, L2-resident) partials it needs instead of waiting for a
merge launch.  Bytes: W_o once (H · Hq D elements), the partials B·Hq·splits·(D+1) float32
per program from L2, x read and written.
"""

import triton.language as tl

from fusecore.backend import jit

from .matvec import mma


@jit
def o_proj_tile(
    tile, layer, part_ptr, lse_ptr, w_ptr, x_ptr,
    B, H, HQ, D, n_splits,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SPLIT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < H
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    sp = tl.arange(0, BLOCK_SPLIT)
    spmask = sp < n_splits
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    K = HQ * D
    layer64 = tl.full([], 0, tl.int64) + layer
    w_rows = w_ptr + layer64 * H * K + n.to(tl.int64)[:, None] * K
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    for h in range(HQ):
        row = (b[:, None] * HQ + h) * n_splits + sp[None, :]
        lse = tl.load(lse_ptr + row, mask=bmask[:, None] & spmask[None, :], other=float("-inf"),
                      cache_modifier=".cg")
        top = tl.max(lse, axis=1)
        top = tl.where(top == float("-inf"), 0.0, top)
        weight = tl.exp(lse - top[:, None])
        denom = tl.sum(weight, axis=1)
        part = tl.load(part_ptr + row[:, :, None] * D + d[None, None, :],
                       mask=(bmask[:, None] & spmask[None, :])[:, :, None] & dmask[None, None, :], other=0.0,
                       cache_modifier=".cg")
        a = tl.sum(part * weight[:, :, None], axis=1) / tl.where(denom > 0.0, denom, 1.0)[:, None]
        wv = tl.load(w_rows + h * D + d[None, :], mask=nmask[:, None] & dmask[None, :], other=0.0)
        if BLOCK_B == 1:
            acc += tl.sum(wv.to(tl.float32) * a, axis=1)[None, :]
        else:
            acc += mma(a, tl.trans(wv), DOT_PREC)
    x_off = b[:, None] * H + n[None, :]
    mask = bmask[:, None] & nmask[None, :]
    x_old = tl.load(x_ptr + x_off, mask=mask, other=0.0, cache_modifier=".cg")
    tl.store(x_ptr + x_off, x_old + acc, mask=mask)


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer", "n_splits"])
def o_proj_kernel(
    layer, part_ptr, lse_ptr, w_ptr, x_ptr, B, H, HQ, D, n_splits,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SPLIT: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    o_proj_tile(tl.program_id(0), layer, part_ptr, lse_ptr, w_ptr, x_ptr, B, H, HQ, D, n_splits,
                BLOCK_B, BLOCK_N, BLOCK_D, BLOCK_SPLIT, DOT_PREC)
