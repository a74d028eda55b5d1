"""Instruction 5: down projection + residual add.

For a tile of BLOCK_N hidden features n:  ``x[b, n] += Σ_i h[b, i] W_down[n, i]``.
Bytes: H I weight elements once, h (B I) from L2 per program, x read and written.
"""

import triton.language as tl

from fusecore.backend import jit

from .matvec import rows_dot


@jit
def down_proj_tile(
    tile, layer, h_ptr, w_ptr, x_ptr, B, H, I,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
):
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < H
    layer64 = tl.full([], 0, tl.int64) + layer
    w_layer = w_ptr + layer64 * H * I
    acc = rows_dot(h_ptr, B, I, 0.0, w_ptr, w_layer, n, nmask, False, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
    b = tl.arange(0, BLOCK_B)
    x_off = b[:, None] * H + n[None, :]
    mask = (b < B)[:, None] & nmask[None, :]
    x_old = tl.load(x_ptr + x_off, mask=mask, other=0.0, cache_modifier=".cg")
    tl.store(x_ptr + x_off, x_old + acc, mask=mask)


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer"])
def down_proj_kernel(
    layer, h_ptr, w_ptr, x_ptr, B, H, I,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
):
    down_proj_tile(tl.program_id(0), layer, h_ptr, w_ptr, x_ptr, B, H, I, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
