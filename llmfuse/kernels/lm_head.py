"""Instruction 6: final RMSNorm → LM head → per-tile winner for greedy decoding or for
sampling (Gumbel-max), and optionally the logits.

For a tile of BLOCK_N vocabulary rows v::

    logits[b, v]   = (x_b / sqrt(mean(x_b²) + eps) · g_final) · W_head[v]
    score[b, v]    = logits[b, v]                                   greedy
                   = logits[b, v] / T − log(−log u[b, v])           SAMPLE (temperature T)
    best[b, tile]  = max_v score[b, v],   best_idx[b, tile] = its first argmax

With ``u`` uniform on (0, 1), ``argmax_v score`` is an exact draw from softmax(logits / T)
(the Gumbel-max trick), so sampling needs no softmax, no sort and no logits in memory:
only an argmax over the ``ceil(V / BLOCK_N)`` tile winners (ties resolve to the lowest
index, as ``torch.argmax``).  ``u`` is Philox (fusecore.rng) at key ``seed``, stream
``b·V + v`` and position = the cache slot of the step, so every row, token and step draws
fresh numbers and a step can be replayed; seed, 1/T and slot are read from device memory
so one CUDA graph serves any of them.  Logits are written only when ``WRITE_LOGITS``
(top-k / top-p sampling on the host, tests), saving B·V·4 bytes.
Bytes: V H weight elements once, x from L2, winners B·tiles·8.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.launch_order import after_previous_kernel, prefetch_rows
from fusecore.rng import philox_words, word_to_open_uniform

from .matvec import rows_dot


@jit
def lm_head_prefetch(tile, w_ptr, H, V, BLOCK_N: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    """Ask L2 for the first ``PREFETCH_LINES`` lines of tile ``tile``'s vocabulary rows (fusecore/launch_order.py)."""
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    prefetch_rows(w_ptr + n.to(tl.int64) * H, n < V, 0, H, PREFETCH_LINES)


@jit
def lm_head_tile(
    tile, x_ptr, norm_ptr, w_ptr, logits_ptr, best_ptr, best_idx_ptr, seed_ptr, inv_temp_ptr, slot_ptr,
    B, H, V, n_tiles, eps,
    WRITE_LOGITS: tl.constexpr, SAMPLE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, SQ_LOAD: tl.constexpr,
):
    n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < V
    logits = rows_dot(x_ptr, B, H, eps, norm_ptr, w_ptr, n, nmask, 0, H, True, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC,
                      ROW_PREFETCH, SQ_LOAD)
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    if WRITE_LOGITS:
        tl.store(logits_ptr + b[:, None].to(tl.int64) * V + n[None, :], logits,
                 mask=bmask[:, None] & nmask[None, :])
    score = logits
    if SAMPLE:
        stream = b[:, None].to(tl.int64) * V + n[None, :]
        position = tl.load(slot_ptr) + tl.zeros_like(stream)
        word, _, _, _ = philox_words(tl.load(seed_ptr), stream, position)
        score = logits * tl.load(inv_temp_ptr) - tl.log(-tl.log(word_to_open_uniform(word)))
    masked = tl.where(nmask[None, :], score, float("-inf"))
    best = tl.max(masked, axis=1)
    best_idx = tl.argmax(masked, axis=1)
    tl.store(best_ptr + b * n_tiles + tile, best, mask=bmask)
    tl.store(best_idx_ptr + b * n_tiles + tile, tile * BLOCK_N + best_idx, mask=bmask)


@jit
def lm_head_kernel(
    x_ptr, norm_ptr, w_ptr, logits_ptr, best_ptr, best_idx_ptr, seed_ptr, inv_temp_ptr, slot_ptr,
    B, H, V, n_tiles, eps,
    WRITE_LOGITS: tl.constexpr, SAMPLE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, SQ_LOAD: tl.constexpr,
    USE_PDL: tl.constexpr,
    PREFETCH_LINES: tl.constexpr,
):
    if USE_PDL:
        lm_head_prefetch(tl.program_id(0), w_ptr, H, V, BLOCK_N, PREFETCH_LINES)
    tl.static_assert(USE_PDL or (ROW_PREFETCH < 2), "ROW_PREFETCH >= 2 is the PDL wait inside the tile")
    if ROW_PREFETCH < 2:  # 2, 3: the tile waits itself, after its first weight loads (matvec._one_row)
        after_previous_kernel(USE_PDL)
    lm_head_tile(tl.program_id(0), x_ptr, norm_ptr, w_ptr, logits_ptr, best_ptr, best_idx_ptr, seed_ptr,
                 inv_temp_ptr, slot_ptr, B, H, V, n_tiles, eps, WRITE_LOGITS, SAMPLE, BLOCK_B, BLOCK_N, BLOCK_K,
                 DOT_PREC, ROW_PREFETCH, SQ_LOAD)


@jit
def pick_kernel(best_ptr, best_idx_ptr, tokens_ptr, n_tiles, BLOCK_T: tl.constexpr, USE_PDL: tl.constexpr):
    """tokens[b] = best_idx[b, t*] with t* the first tile of the largest ``best[b, :]`` (one program per
    row, all of a row's tile winners in one round of loads): the step's argmax or sampled token."""
    if USE_PDL:
        after_previous_kernel(USE_PDL)
    b = tl.program_id(0)
    t = tl.arange(0, BLOCK_T)
    best = tl.load(best_ptr + b * n_tiles + t, mask=t < n_tiles, other=float("-inf"), cache_modifier=".cg")
    idx = tl.load(best_idx_ptr + b * n_tiles + t, mask=t < n_tiles, other=0, cache_modifier=".cg")
    top = tl.argmax(best, axis=0, tie_break_left=True)
    tl.store(tokens_ptr + b, tl.sum(tl.where(t == top, idx, 0), axis=0).to(tl.int64))
