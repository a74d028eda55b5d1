"""Instruction 2: decode attention over the KV cache, split along the sequence (GQA), with
the splits merged by the last program of each group.

A tile is (row b, KV head h, split s).  It reads K and V of slots
``[s·split_len, (s+1)·split_len) ∩ [kv_start[b], t]`` of head h **once** for all
``G = Hq / Hkv`` query heads of its group (the G queries are the rows of a ``tl.dot``) and
keeps the online-softmax state per query head::

    m  = max_j score_j,   l = Σ_j exp(score_j − m),   acc = Σ_j exp(score_j − m) v_j
    score_j = q · k_j / sqrt(D)

It writes the normalized partial ``acc / l`` and its logsumexp ``m + log l`` (−inf for an
empty split), then counts itself done on the group's semaphore (an atomic add with
acquire-release order).  The program that finishes last merges the group's splits by
logsumexp (the math of :func:`fusecore.softmax.merge_partials`), ``MERGE_SPLITS`` splits per
round of loads::

    attn = Σ_s exp(lse_s − lse) out_s,   lse = log Σ_s exp(lse_s)

writes ``attn`` [B, Hq, D] and resets the semaphore to 0 for the next use.  No other
program waits, so the scheme is correct in any execution order (the interpreter's
sequential one included).
Bytes: 2 · B · Hkv · (t + 1) · D cache elements, plus q, the partials and attn.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.launch_order import after_previous_kernel, prefetch_rows
from fusecore.softmax import online_rescale

from .matvec import mma


@jit
def attention_span(tile, layer, kv_start_ptr, slot_ptr, B, HKV, S, n_splits, split_len):
    """Tile ``tile``'s split, (row, KV head) index bh, KV head, row b, its slots [lo, hi) and the cache
    row of its (layer, b, KV head) slot 0 (``base``: the slots of a head are contiguous [S, D] rows)."""
    split = tile % n_splits
    bh = tile // n_splits
    kv_head = bh % HKV
    b = bh // HKV
    lo = tl.maximum(split * split_len, tl.load(kv_start_ptr + b))
    hi = tl.minimum((split + 1) * split_len, tl.load(slot_ptr) + 1)
    layer64 = tl.full([], 0, tl.int64) + layer
    return split, bh, kv_head, b, lo, hi, ((layer64 * B + b) * HKV + kv_head) * S


@jit
def prefetch_span(k_cache_ptr, v_cache_ptr, base, lo, hi, D, PREFETCH_LINES: tl.constexpr):
    """Ask L2 for the K and V slots [lo, hi) of the head whose slot 0 is cache row ``base`` (contiguous
    [hi − lo, D] blocks), at most ``PREFETCH_LINES`` lines of each (fusecore/launch_order.py).  A
    prefetch only moves lines into L2, which is coherent: a line the Q/K/V tiles write later is not
    read stale."""
    if PREFETCH_LINES > 0:
        one = tl.full([1], True, tl.int1)
        prefetch_rows(k_cache_ptr + base * D + tl.zeros([1], tl.int64), one, lo * D, hi * D, PREFETCH_LINES)
        prefetch_rows(v_cache_ptr + base * D + tl.zeros([1], tl.int64), one, lo * D, hi * D, PREFETCH_LINES)


@jit
def attention_prefetch(tile, layer, k_cache_ptr, v_cache_ptr, kv_start_ptr, slot_ptr, B, HKV, D, S, n_splits,
                       split_len, PREFETCH_LINES: tl.constexpr):
    """:func:`prefetch_span` of tile ``tile``'s slots (the slot and first valid slot are set before a step
    starts)."""
    if PREFETCH_LINES > 0:
        split, bh, kv_head, b, lo, hi, base = attention_span(tile, layer, kv_start_ptr, slot_ptr, B, HKV, S,
                                                            n_splits, split_len)
        prefetch_span(k_cache_ptr, v_cache_ptr, base, lo, hi, D, PREFETCH_LINES)


@jit
def decode_attention_tile(
    tile, layer, q_ptr, k_cache_ptr, v_cache_ptr, kv_start_ptr, slot_ptr, part_ptr, lse_ptr, attn_ptr, sem_ptr,
    B, HQ, HKV, D, S, n_splits, split_len, sm_scale,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MERGE_SPLITS: tl.constexpr, DOT_PREC: tl.constexpr,
):
    split, bh, kv_head, b, lo, hi, base = attention_span(tile, layer, kv_start_ptr, slot_ptr, B, HKV, S, n_splits,
                                                        split_len)
    attend_span(split, bh, kv_head, b, lo, hi, base, q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, lse_ptr, attn_ptr,
                sem_ptr, HQ, HKV, D, n_splits, sm_scale, BLOCK_G, BLOCK_S, BLOCK_D, BLOCK_M, MERGE_SPLITS, DOT_PREC)


@jit
def attend_span(
    split, bh, kv_head, b, lo, hi, base, q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, lse_ptr, attn_ptr, sem_ptr,
    HQ, HKV, D, n_splits, sm_scale,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MERGE_SPLITS: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """The attention tile of :func:`attention_span`'s ``(split, bh, kv_head, b, lo, hi, base)``: a launch
    that read the span before its waits passes it here, so no load of the slot is left between a
    wait and the K / V loads."""
    G = HQ // HKV

    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q_heads = kv_head * G + g
    gd_mask = gmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + (b * HQ + q_heads)[:, None] * D + d[None, :], mask=gd_mask, other=0.0,
                cache_modifier=".cg")

    m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for s0 in range(lo, hi, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        smask = s < hi
        kv_off = (base + s)[:, None] * D + d[None, :]
        kv_mask = smask[:, None] & dmask[None, :]
        # K and V of the block issued together: one L2 round trip, not two
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0, cache_modifier=".cg")
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0, cache_modifier=".cg")
        scores = mma(q, tl.trans(k), DOT_PREC) * sm_scale
        scores = tl.where(smask[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = online_rescale(m, m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + mma(p, v, DOT_PREC)
        m = m_new

    nonempty = l > 0.0
    out = acc / tl.where(nonempty, l, 1.0)[:, None]
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, l, 1.0)), float("-inf"))
    row = (b * HQ + q_heads) * n_splits
    tl.store(part_ptr + (row + split)[:, None] * D + d[None, :], out, mask=gd_mask)
    tl.store(lse_ptr + row + split, lse, mask=gmask)

    merge_if_last(bh, kv_head, b, part_ptr, lse_ptr, attn_ptr, sem_ptr, HQ, HKV, D, n_splits, BLOCK_D, BLOCK_M,
                  MERGE_SPLITS)


@jit
def merge_if_last(bh, kv_head, b, part_ptr, lse_ptr, attn_ptr, sem_ptr, HQ, HKV, D, n_splits,
                  BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MERGE_SPLITS: tl.constexpr):
    """After a split stored its partials: count it done on the (row, KV head) ``bh``'s semaphore; the
    last split to finish merges all of them into ``attn`` and resets the semaphore (module docstring)."""
    G = HQ // HKV
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    # The last split of this (row, KV head) to finish merges all of them.
    tl.debug_barrier()
    finished = tl.atomic_add(sem_ptr + bh, 1, sem="acq_rel", scope="gpu")
    if finished == n_splits - 1:
        # MERGE_SPLITS splits of the group's BLOCK_M (>= G) query heads per round of loads: the
        # partials of a round are read at once, not one dependent L2 round trip per split.
        gm = tl.arange(0, BLOCK_M)
        gm_mask = gm < G
        row_m = (b * HQ + kv_head * G + gm) * n_splits
        top = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        denom = tl.zeros([BLOCK_M], dtype=tl.float32)
        merged = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        sp = tl.arange(0, MERGE_SPLITS)
        for first in range(0, n_splits, MERGE_SPLITS):
            gs_mask = gm_mask[:, None] & (first + sp < n_splits)[None, :]
            gs = row_m[:, None] + first + sp[None, :]  # [G, splits] index of (query head, split)
            lse_s = tl.load(lse_ptr + gs, mask=gs_mask, other=float("-inf"), cache_modifier=".cg")
            part_s = tl.load(part_ptr + gs[:, :, None] * D + d[None, None, :],
                             mask=gs_mask[:, :, None] & dmask[None, None, :], other=0.0, cache_modifier=".cg")
            top_new = tl.maximum(top, tl.max(lse_s, axis=1))
            safe = tl.where(top_new == float("-inf"), 0.0, top_new)
            rescale = online_rescale(top, safe)
            weight = tl.where(lse_s == float("-inf"), 0.0, tl.exp(lse_s - safe[:, None]))
            merged = merged * rescale[:, None] + tl.sum(weight[:, :, None] * part_s, axis=1)
            denom = denom * rescale + tl.sum(weight, axis=1)
            top = top_new
        merged = merged / tl.where(denom > 0.0, denom, 1.0)[:, None]
        tl.store(attn_ptr + (b * HQ + kv_head * G + gm)[:, None] * D + d[None, :], merged,
                 mask=gm_mask[:, None] & dmask[None, :])
        tl.atomic_xchg(sem_ptr + bh, 0, sem="relaxed", scope="gpu")


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer", "S", "n_splits", "split_len"])
def decode_attention_kernel(
    layer, q_ptr, k_cache_ptr, v_cache_ptr, kv_start_ptr, slot_ptr, part_ptr, lse_ptr, attn_ptr, sem_ptr,
    B, HQ, HKV, D, S, n_splits, split_len, sm_scale,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MERGE_SPLITS: tl.constexpr, DOT_PREC: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr,
):
    # the span (from the slot, set before the step) read before the wait: no slot load after it
    split, bh, kv_head, b, lo, hi, base = attention_span(tl.program_id(0), layer, kv_start_ptr, slot_ptr, B, HKV, S,
                                                        n_splits, split_len)
    if USE_PDL:
        prefetch_span(k_cache_ptr, v_cache_ptr, base, lo, hi, D, PREFETCH_LINES)
    after_previous_kernel(USE_PDL)
    attend_span(split, bh, kv_head, b, lo, hi, base, q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, lse_ptr, attn_ptr,
                sem_ptr, HQ, HKV, D, n_splits, sm_scale, BLOCK_G, BLOCK_S, BLOCK_D, BLOCK_M, MERGE_SPLITS, DOT_PREC)


# --- one-block splits, old slots loaded before the waits (plan.attn_preload; the fused Q/K/V + attention
# launch at batch 1), merged as above or by W_o (plan.merge_in_o) ---


@jit
def preload_block(k_cache_ptr, v_cache_ptr, base, lo, hi, slot, D, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """K and V [BLOCK_S, BLOCK_D] of slots ``lo + i`` in [lo, hi) but ``slot`` (zeros elsewhere): a split
    that is one block.  Cache slots other than the step's own were written by earlier steps, so a
    tile loads them before it waits for its Q/K/V tiles, and only the new slot after."""
    s = lo + tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    mask = ((s < hi) & (s != slot))[:, None] & (d < D)[None, :]
    off = (base + s)[:, None] * D + d[None, :]
    # evict_last: the loads a launch with PDL may make before its wait that are not a weight's
    # (tests/llmfuse/compile_sm90.py check_pdl_order); the next step reads these slots again
    k = tl.load(k_cache_ptr + off, mask=mask, other=0.0, eviction_policy="evict_last")
    v = tl.load(v_cache_ptr + off, mask=mask, other=0.0, eviction_policy="evict_last")
    return k, v


@jit
def attend_block(
    split, bh, kv_head, b, lo, hi, base, slot, k, v, q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, lse_ptr,
    attn_ptr, sem_ptr, HQ, HKV, D, n_splits, sm_scale,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MERGE_SPLITS: tl.constexpr, DOT_PREC: tl.constexpr, MERGE_IN_O: tl.constexpr,
):
    """The attention tile of a one-block split whose old slots :func:`preload_block` loaded (``k``, ``v``):
    the step's own slot ``slot`` (when in [lo, hi)) and the G queries loaded now, then one softmax over
    the block.  Writes the split's normalized partial ``out`` and its logsumexp (−inf for an empty
    split), as :func:`attend_span`; then, as it, counts itself done and merges the splits if last
    (:func:`merge_if_last`), or with ``MERGE_IN_O`` takes no count: the next launch (W_o,
    kernels/matvec.py ``merged_chunk``) merges the splits after this launch completes."""
    G = HQ // HKV
    g = tl.arange(0, BLOCK_G)
    gmask = g < G
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q_heads = kv_head * G + g
    gd_mask = gmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + (b * HQ + q_heads)[:, None] * D + d[None, :], mask=gd_mask, other=0.0,
                cache_modifier=".cg")
    slot_vec = tl.zeros_like(d) + slot  # per lane: the mask stays a tensor of booleans
    new_mask = dmask & (slot_vec >= lo) & (slot_vec < hi)
    k_new = tl.load(k_cache_ptr + (base + slot) * D + d, mask=new_mask, other=0.0, cache_modifier=".cg")
    v_new = tl.load(v_cache_ptr + (base + slot) * D + d, mask=new_mask, other=0.0, cache_modifier=".cg")
    s = lo + tl.arange(0, BLOCK_S)
    new = (s == slot)[:, None]
    k = tl.where(new, k_new[None, :], k)
    v = tl.where(new, v_new[None, :], v)
    scores = mma(q, tl.trans(k), DOT_PREC) * sm_scale
    scores = tl.where((s < hi)[None, :], scores, float("-inf"))
    m = tl.max(scores, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(scores - m_safe[:, None])
    l = tl.sum(p, axis=1)
    acc = mma(p, v, DOT_PREC)
    nonempty = l > 0.0
    out = acc / tl.where(nonempty, l, 1.0)[:, None]
    lse = tl.where(nonempty, m_safe + tl.log(tl.where(nonempty, l, 1.0)), float("-inf"))
    row = (b * HQ + q_heads) * n_splits
    tl.store(part_ptr + (row + split)[:, None] * D + d[None, :], out, mask=gd_mask)
    tl.store(lse_ptr + row + split, lse, mask=gmask)
    if not MERGE_IN_O:
        merge_if_last(bh, kv_head, b, part_ptr, lse_ptr, attn_ptr, sem_ptr, HQ, HKV, D, n_splits, BLOCK_D, BLOCK_M,
                      MERGE_SPLITS)
