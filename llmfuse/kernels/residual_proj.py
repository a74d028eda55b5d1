"""Instructions 3 and 5: a projection added to the residual stream.

For a tile of BLOCK_N hidden features n of layer l::

    x[b, n] += Σ_k a[b, k] W_l[n, k]          W stacked [L, H, K]

Instruction 3 (output projection): ``a`` = the merged attention [B, Hq·D], ``W`` = W_o.
Instruction 5 (down projection):   ``a`` = the MLP activation h [B, I],   ``W`` = W_down.
The two differ only in their operands, so they share this one tile function and kernel.
A tile is (BLOCK_N features, one of ``split_k`` parts of K).  With ``split_k = 1`` each
program owns its features and adds in place (deterministic, the default); with
``split_k > 1`` (opt-in: more tiles for the 16-row tensor-core tiles of large batches) the
parts add into x with float32 atomics, whose order — hence the last bits — may vary
between runs.
Bytes: H·K weight elements once, ``a`` (B·K/split_k, from L2) per program, x read and written.
"""

import triton.language as tl

from fusecore.backend import jit

from .matvec import rows_dot


@jit
def residual_proj_tile(
    tile, layer, a_ptr, w_ptr, x_ptr, B, H, K, split_k,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
):
    n_tile = tile // split_k
    k_part = tile % split_k
    k_len = tl.cdiv(tl.cdiv(K, split_k), BLOCK_K) * BLOCK_K
    k_start = k_part * k_len
    k_stop = tl.minimum(k_start + k_len, K)
    n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < H
    layer64 = tl.full([], 0, tl.int64) + layer
    acc = rows_dot(a_ptr, B, K, 0.0, w_ptr, w_ptr + layer64 * H * K, n, nmask, k_start, k_stop, False,
                   BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
    b = tl.arange(0, BLOCK_B)
    x_off = b[:, None] * H + n[None, :]
    mask = (b < B)[:, None] & nmask[None, :]
    if split_k == 1:
        x_old = tl.load(x_ptr + x_off, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(x_ptr + x_off, x_old + acc, mask=mask)
    else:
        tl.atomic_add(x_ptr + x_off, acc, mask=mask, sem="relaxed", scope="gpu")


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer"])
def residual_proj_kernel(
    layer, a_ptr, w_ptr, x_ptr, B, H, K, split_k,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
):
    residual_proj_tile(tl.program_id(0), layer, a_ptr, w_ptr, x_ptr, B, H, K, split_k,
                       BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
