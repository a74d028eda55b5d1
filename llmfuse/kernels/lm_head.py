"""Instruction 6: final RMSNorm → LM head → (optionally) logits, and a per-tile greedy argmax.

For a tile of BLOCK_N vocabulary rows v::

    logits[b, v]   = (x_b / sqrt(mean(x_b²) + eps) · g_final) · W_head[v]
    best[b, tile]  = max_v logits[b, v],   best_idx[b, tile] = its first argmax

Greedy decoding then needs only an argmax over the ``ceil(V / BLOCK_N)`` tile winners
(ties resolve to the lowest index, as ``torch.argmax``).  Logits are written only when
``WRITE_LOGITS`` (sampling, tests), saving B·V·4 bytes on greedy steps.
Bytes: V H weight elements once, x from L2, winners B·tiles·8.
"""

import triton.language as tl

from fusecore.backend import jit

from .matvec import rows_dot


@jit
def lm_head_tile(
    tile, x_ptr, norm_ptr, w_ptr, logits_ptr, best_ptr, best_idx_ptr, B, H, V, n_tiles, eps,
    WRITE_LOGITS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < V
    logits = rows_dot(x_ptr, B, H, eps, norm_ptr, w_ptr, n, nmask, True, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    if WRITE_LOGITS:
        tl.store(logits_ptr + b[:, None].to(tl.int64) * V + n[None, :], logits,
                 mask=bmask[:, None] & nmask[None, :])
    masked = tl.where(nmask[None, :], logits, float("-inf"))
    best = tl.max(masked, axis=1)
    best_idx = tl.argmax(masked, axis=1)
    tl.store(best_ptr + b * n_tiles + tile, best, mask=bmask)
    tl.store(best_idx_ptr + b * n_tiles + tile, tile * BLOCK_N + best_idx, mask=bmask)


@jit
def lm_head_kernel(
    x_ptr, norm_ptr, w_ptr, logits_ptr, best_ptr, best_idx_ptr, B, H, V, n_tiles, eps,
    WRITE_LOGITS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    lm_head_tile(tl.program_id(0), x_ptr, norm_ptr, w_ptr, logits_ptr, best_ptr, best_idx_ptr, B, H, V, n_tiles,
                 eps, WRITE_LOGITS, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
