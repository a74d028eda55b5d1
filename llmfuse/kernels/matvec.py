"""Shared building blocks of the decode kernels: RMS scale of the residual, a row-tile GEMV.

``inv_rms``: ``r_b = 1 / sqrt(mean_k x[b, k]² + eps)`` for the rows of a [B, K] float32
residual — every program that fuses an RMSNorm recomputes it (B·K·4 bytes, L2-resident)
instead of waiting for another launch.

``rows_dot``: ``acc[b, n] = Σ_k x̂[b, k] W[rows[n], k]`` for one tile of weight rows (W
row-major [N, K]), with ``x̂ = x · r_b · g_k`` when an RMSNorm is fused (``HAS_NORM``).
Decode is memory-bound: each weight element is read exactly once by one program, so the
whole launch moves N·K·bytes(W) plus the tiny activations.  Batch 1 reduces with an
elementwise multiply and row sums in fp32; batches > 1 pad the batch to ``BLOCK_B`` ≥ 16
and use ``tl.dot`` through :func:`mma` (fp32 accumulation; ``DOT_PREC`` = "ieee" runs the
product in float32: float32 weights, and the interpreter, whose dot cannot take bf16).
Activations are loaded with ``.cg`` (bypassing L1) because in the looped kernel other
multiprocessors wrote them during the same launch.
"""

import triton.language as tl

from fusecore.backend import jit


@jit
def mma(a, b, DOT_PREC: tl.constexpr):
    """a @ b with float32 accumulation: in float32 for DOT_PREC "ieee", else in b's dtype (tensor cores)."""
    if DOT_PREC == "ieee":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a.to(b.dtype), b)
    return out


@jit
def inv_rms(x_ptr, B, K, eps, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_B] float32 1/sqrt(mean(x²) + eps) of rows 0..B-1 of a contiguous [B, K] float32 x."""
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    sumsq = tl.zeros([BLOCK_B], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x_ptr + b[:, None] * K + k[None, :], mask=bmask[:, None] & (k[None, :] < K), other=0.0,
                     cache_modifier=".cg").to(tl.float32)
        sumsq += tl.sum(xv * xv, axis=1)
    return 1.0 / tl.sqrt(sumsq / K + eps)


@jit
def rows_dot(
    x_ptr, B, K, scale, g_ptr, w_ptr, rows, row_mask,
    HAS_NORM: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    """[BLOCK_B, BLOCK_N] float32 x̂ · W[rows]ᵀ for contiguous x [B, K] and W [N, K] (see module doc)."""
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < K
        xv = tl.load(x_ptr + b[:, None] * K + k[None, :], mask=bmask[:, None] & kmask[None, :], other=0.0,
                     cache_modifier=".cg").to(tl.float32)
        if HAS_NORM:
            g = tl.load(g_ptr + k, mask=kmask, other=0.0).to(tl.float32)
            xv = xv * scale[:, None] * g[None, :]
        wv = tl.load(w_rows + k[None, :], mask=row_mask[:, None] & kmask[None, :], other=0.0)
        if BLOCK_B == 1:
            acc += tl.sum(wv.to(tl.float32) * xv, axis=1)[None, :]
        else:
            acc += mma(xv, tl.trans(wv), DOT_PREC)
    return acc
