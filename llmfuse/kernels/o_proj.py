"""Instruction 3: output projection + residual add.

For a tile of BLOCK_N output features n:  ``x[b, n] += Σ_j attn[b, j] W_o[n, j]`` with
``attn`` [B, Hq·D] the merged attention of instruction 2.
Bytes: W_o once (H · Hq D elements), attn (B Hq D float32, from L2), x read and written.
"""

import triton.language as tl

from fusecore.backend import jit

from .matvec import rows_dot


@jit
def o_proj_tile(
    tile, layer, attn_ptr, w_ptr, x_ptr, B, H, K,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
):
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < H
    layer64 = tl.full([], 0, tl.int64) + layer
    acc = rows_dot(attn_ptr, B, K, 0.0, w_ptr, w_ptr + layer64 * H * K, n, nmask, False,
                   BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
    b = tl.arange(0, BLOCK_B)
    x_off = b[:, None] * H + n[None, :]
    mask = (b < B)[:, None] & nmask[None, :]
    x_old = tl.load(x_ptr + x_off, mask=mask, other=0.0, cache_modifier=".cg")
    tl.store(x_ptr + x_off, x_old + acc, mask=mask)


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer"])
def o_proj_kernel(
    layer, attn_ptr, w_ptr, x_ptr, B, H, K,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
):
    o_proj_tile(tl.program_id(0), layer, attn_ptr, w_ptr, x_ptr, B, H, K, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
