"""Instructions 1 and 2 of one layer in one launch: the Q/K/V tiles, then the attention tiles.

Programs ``0 .. qkv_tiles − 1`` run :func:`.qkv_rope.qkv_rope_tile` and then count themselves
done on their KV head's group (:func:`fusecore.grid_sync.signal`: a CTA barrier, then an atomic
add with release order); programs ``qkv_tiles ..`` run :func:`.decode_attention.attend_span`
after waiting (:func:`fusecore.grid_sync.wait_for`, acquire) until the count of their own group
reaches the layer's target.  So attention on one KV head starts as soon as that head's
Q/K/V tiles are written, and the launch boundary between the two instructions — a few
microseconds of launch latency and tail per layer at batch 1 — is gone.

A group's count is ``(G + 2) · pair blocks per head · QKV_SPLIT`` per layer (the G query
heads, its K and V head; every K part signals, a block's last part after its epilogue);
counts accumulate over the layers of a step, so layer ``l`` waits for ``(l + 1)`` times
that and the host zeroes the counts once per step.  A program waits only for programs of
lower index, which the GPU dispatches first (the forward-progress order that decoupled
look-back scans rely on), so the grid need not be co-resident; under the interpreter the
programs run in index order and every wait ends at once.  The looped kernel uses the same
two helpers between its first two stages.
With ``ATTN_PRELOAD`` (``plan.attn_preload``) a split is one block: its tile loads the split's cache
slots bar the step's own into registers before its waits (earlier steps wrote them), and the new slot
and the queries after; with ``MERGE_IN_O`` (``plan.merge_in_o``) it also stores its partial and
logsumexp without a count: W_o's tiles merge the splits (kernels/matvec.py ``merged_chunk``).
Bytes: those of the two instructions; the counts are (1 + Hkv) int32.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.grid_sync import signal, wait_for
from fusecore.launch_order import after_previous_kernel

from .decode_attention import attend_block, attend_span, attention_span, prefetch_span, preload_block
from .qkv_rope import qkv_prefetch, qkv_rope_tile


@jit
def signal_qkv_group(tile, count_ptr, HQ, HKV, D, BLOCK_P: tl.constexpr, QKV_SPLIT: tl.constexpr):
    """Count Q/K/V tile ``tile`` done on the count of its KV head's group, ``count_ptr[group]``."""
    head = tile // QKV_SPLIT // tl.cdiv(D // 2, BLOCK_P)
    group = tl.where(head < HQ, head // (HQ // HKV), tl.where(head < HQ + HKV, head - HQ, head - HQ - HKV))
    signal(count_ptr + group)


@jit
def wait_qkv_group(attn_tile, layer, count_ptr, HQ, HKV, D, n_splits, max_polls, timeout_ptr,
                   BLOCK_P: tl.constexpr, QKV_SPLIT: tl.constexpr, ACQUIRE_LOADS: tl.constexpr,
                   POLL_SLEEP: tl.constexpr):
    """Wait until every Q/K/V tile of layer ``layer`` in the KV head group of attention tile
    ``attn_tile`` has counted itself done."""
    group_tiles = (HQ // HKV + 2) * tl.cdiv(D // 2, BLOCK_P) * QKV_SPLIT
    kv_head = (attn_tile // n_splits) % HKV
    wait_for(count_ptr + kv_head, (layer + 1) * group_tiles, max_polls, timeout_ptr, ACQUIRE_LOADS, POLL_SLEEP)


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer", "S", "n_splits", "split_len", "max_polls"])
def qkv_attention_kernel(
    layer, x_ptr, fix_ptr, norm_ptr, w_ptr, bias_ptr, inv_freq_ptr, kv_start_ptr, slot_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, pair_part_ptr, pair_sq_ptr, pair_sem_ptr,
    part_ptr, lse_ptr, attn_ptr, sem_ptr, count_ptr, timeout_ptr,
    B, H, HQ, HKV, D, S, eps, n_splits, split_len, sm_scale, max_polls,
    HAS_BIAS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MERGE_SPLITS: tl.constexpr, DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, QKV_SPLIT: tl.constexpr,
    SQ_LOAD: tl.constexpr, ACQUIRE_LOADS: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr,
    ATTN_PREFETCH_LINES: tl.constexpr, X_FIX: tl.constexpr, ATTN_PRELOAD: tl.constexpr = False,
    MERGE_IN_O: tl.constexpr = False,
):
    pid = tl.program_id(0)
    qkv_tiles = (HQ + 2 * HKV) * tl.cdiv(D // 2, BLOCK_P) * QKV_SPLIT
    tl.static_assert(USE_PDL or (ROW_PREFETCH < 2), "ROW_PREFETCH >= 2 is the PDL wait inside the tile")
    if pid < qkv_tiles:
        if USE_PDL:
            qkv_prefetch(pid, layer, w_ptr, H, HQ, HKV, D, BLOCK_P, BLOCK_K, QKV_SPLIT, PREFETCH_LINES)
        if ROW_PREFETCH < 2:  # 2, 3: the tile waits itself, after its first weight loads (matvec._one_row)
            after_previous_kernel(USE_PDL)
        qkv_rope_tile(pid, layer, x_ptr, fix_ptr, norm_ptr, w_ptr, bias_ptr, inv_freq_ptr, kv_start_ptr, slot_ptr,
                      q_ptr, k_cache_ptr, v_cache_ptr, pair_part_ptr, pair_sq_ptr, pair_sem_ptr,
                      B, H, HQ, HKV, D, S, eps, HAS_BIAS, BLOCK_B, BLOCK_P, BLOCK_K, DOT_PREC, ROW_PREFETCH,
                      QKV_SPLIT, SQ_LOAD, X_FIX)
        signal_qkv_group(pid, count_ptr, HQ, HKV, D, BLOCK_P, QKV_SPLIT)
    else:
        # the span (from the slot, set before the step) read before the waits, so no slot load is left
        # between the waits and the K / V loads; the cache slots it covers do not depend on this
        # launch's Q/K/V tiles (bar the new slot, which L2 keeps coherent): into L2 before the waits
        split, bh, kv_head, b, lo, hi, base = attention_span(pid - qkv_tiles, layer, kv_start_ptr, slot_ptr, B, HKV,
                                                            S, n_splits, split_len)
        if ATTN_PRELOAD:
            # one block per split: its old slots into registers before the waits, the new one after
            # (kernels/decode_attention.py attend_block)
            slot = tl.load(slot_ptr)
            k_old, v_old = preload_block(k_cache_ptr, v_cache_ptr, base, lo, hi, slot, D, BLOCK_S, BLOCK_D)
        else:
            prefetch_span(k_cache_ptr, v_cache_ptr, base, lo, hi, D, ATTN_PREFETCH_LINES)
        after_previous_kernel(USE_PDL)
        wait_qkv_group(pid - qkv_tiles, layer, count_ptr, HQ, HKV, D, n_splits, max_polls, timeout_ptr,
                       BLOCK_P, QKV_SPLIT, ACQUIRE_LOADS, 0)  # back-to-back polls, as timed
        if ATTN_PRELOAD:
            attend_block(split, bh, kv_head, b, lo, hi, base, slot, k_old, v_old, q_ptr, k_cache_ptr, v_cache_ptr,
                         part_ptr, lse_ptr, attn_ptr, sem_ptr, HQ, HKV, D, n_splits, sm_scale, BLOCK_G, BLOCK_S,
                         BLOCK_D, BLOCK_M, MERGE_SPLITS, DOT_PREC, MERGE_IN_O)
        else:
            attend_span(split, bh, kv_head, b, lo, hi, base, q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, lse_ptr,
                        attn_ptr, sem_ptr, HQ, HKV, D, n_splits, sm_scale, BLOCK_G, BLOCK_S, BLOCK_D, BLOCK_M,
                        MERGE_SPLITS, DOT_PREC)
