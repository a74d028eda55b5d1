"""The looped persistent decode kernel: every layer's five instructions and the LM head in
one launch ("kernel looping").

Schedule (stage numbers are global, ``5 · layer + k``)::

    for layer in 0 .. L-1:
        k=0  qkv_rope_tile          over (Hq + 2 Hkv) · ceil(D/2 / BLOCK_P) · QKV_SPLIT tiles → q, cache
        k=1  decode_attention_tile  over B · Hkv · n_splits tiles                   → attn
        k=2  residual_proj_tile     over ceil(H / BLOCK_N) · o_split tiles (attn, W_o)  → x
        k=3  gate_up_tile           over ceil(I / BLOCK_N) · MLP_SPLIT tiles            → h
        k=4  residual_proj_tile     over ceil(H / BLOCK_N) · split_k tiles (h, W_down)  → x
    stage 5L: lm_head_tile          over ceil(V / BLOCK_V) tiles          → greedy or sampled winners (+ logits)

Program ``p`` of ``P`` runs tiles ``p, p + P, p + 2P, ...`` of each stage.  The kernel
boundaries of the per-layer path become waits on counts in device memory
(:mod:`fusecore.grid_sync`): after attention, o_proj, gate_up and down a grid barrier (4 per
layer, counted by ``barrier``); between qkv and attention only a per-KV-head count — an
attention tile waits for the Q/K/V tiles of its own head group (:mod:`.qkv_attention`), so
attention on one group overlaps the projections of the others.  Between arriving and
waiting at a barrier, a program that is not the last to arrive prefetches a ``PREFETCH``-element slice of the
next weight-reading stage's weights into L2 (:mod:`.prefetch`): W_o after attention,
W_gate_up after o_proj, W_down after gate_up, the next layer's W_qkv (or the LM head)
after down.  The weights stay stacked [L, ...] behind one pointer each.

The tiles are the same ``@jit`` functions the per-layer kernels launch, so both paths
compute identical values.  Stages ``>= stop_stage`` are skipped, which lets the tests
compare the kernel with the Python interpreter of this schedule (:mod:`llmfuse.looped`)
after any stage.  With ``P = 1`` (the interpreter, where programs run one after another)
every wait ends at once.  ``POLL_SLEEP`` (compiled only): nanoseconds a waiting thread sleeps
between two reads of a count (:func:`fusecore.grid_sync.wait_for`).  ``attn_width`` = Hq · D, W_o's K,
is an argument (not computed in the kernel) so that it is specialized like the per-layer
launch's: a multiple of 16 lets the attention rows be copied 16 bytes at a time, bypassing L1.

With ``DATAFLOW`` the same tiles run as one launch of one-tile programs ordered by
dependency instead of a persistent grid with barriers.  Program ``p`` runs exactly one
tile: programs ``l · T .. (l + 1) · T − 1`` are layer ``l``'s tiles in the order of the
per-layer path — Q/K/V, attention, o_proj, gate_up, down (``T`` tiles per layer) — and the
LM head's tiles follow the last layer.  Before its tile a program waits
(:func:`fusecore.grid_sync.wait_for`) until the tiles it reads from have counted
themselves done (:func:`fusecore.grid_sync.signal`, after their stores)::

    Q/K/V of layer l      all down tiles of layer l − 1   (x complete)
    attention             the Q/K/V tiles of its KV head's group (:mod:`.qkv_attention`)
    o_proj                all attention tiles of layer l  (every group merged)
    gate_up               all o_proj tiles                (x complete)
    down                  all gate_up tiles               (h complete)
    LM head               all down tiles of the last layer

Every count accumulates over the step (targets ``(l + 1) ·`` tiles), and every buffer a tile
writes is read again only by tiles that transitively wait for all of its earlier readers,
so no tile overwrites what a slower one still reads.  ``tests/llmfuse/test_dataflow_hazards.py``
checks this on a trace of this kernel (every access, barrier and wait of every program):
every two accesses of an element by different programs, one a write, are ordered through the
counts and the last-finisher semaphores, and a CTA barrier separates a program's stores from
each release and each wait from the program's first access.  A program waits only for programs of
lower index, which the GPU dispatches first, so the grid need not be co-resident (unlike
the persistent looped kernel), and each tile keeps the registers of its own branch: there
is no loop over layers that keeps values alive across stages.  Waiting programs sit on
multiprocessors freed by the previous stage's finished tiles, so a stage starts as soon
as its inputs are complete, with no kernel boundary (launch latency, drain) in between.
Under the interpreter programs run in index order and every wait ends at once; stages
``>= stop_stage`` are skipped here too.  Weights and old cache slots depend on no tile, so a
program first asks L2 for the first ``WAIT_PREFETCH`` lines of each of its weight rows (an
attention tile: ``ATTN_PREFETCH`` lines of its K and V slots; :mod:`fusecore.launch_order`) and only
then waits: the next stage's weights stream while the current one finishes (compiled only).

Bytes: the sum of the six instructions' bytes over all layers — the whole model once.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.grid_sync import signal, wait_for
from fusecore.launch_order import after_previous_kernel

from .decode_attention import attention_prefetch, decode_attention_tile
from .gate_up import gate_up_prefetch, gate_up_tile
from .lm_head import lm_head_prefetch, lm_head_tile
from .prefetch import prefetch_flat
from .qkv_attention import signal_qkv_group, wait_qkv_group
from .qkv_rope import qkv_prefetch, qkv_rope_tile
from .residual_proj import residual_proj_prefetch, residual_proj_tile

STAGES_PER_LAYER = 5
DONE_COUNTS = 4  # DATAFLOW: tiles finished so far of attention, o_proj, gate_up and down
COUNT_LINE = 32  # int32 counts per 128-byte line (DONE_STRIDE with plan.spread_counts)


@jit
def _barrier(counter_ptr, index, pid, nprog, sink, w_ptr, n, start, max_polls, timeout_ptr,
             PREFETCH: tl.constexpr, PREFETCH_BLOCK: tl.constexpr, ACQUIRE_LOADS: tl.constexpr,
             POLL_SLEEP: tl.constexpr):
    """Grid barrier number ``index``: arrive, prefetch w[start + pid·PREFETCH ...] unless last, wait.

    Returns the prefetch sink."""
    target = (index + 1) * nprog
    before = signal(counter_ptr)
    if PREFETCH > 0:
        if before + 1 < target:
            sink += prefetch_flat(w_ptr, n, start, pid, PREFETCH, PREFETCH_BLOCK)
    wait_for(counter_ptr, target, max_polls, timeout_ptr, ACQUIRE_LOADS, POLL_SLEEP)
    return sink


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["B", "S", "n_splits", "split_len", "stop_stage", "max_polls"])
def looped_decode_kernel(
    x_ptr, attn_norm_ptr, wqkv_ptr, bqkv_ptr, inv_freq_ptr, kv_start_ptr, slot_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, pair_part_ptr, pair_sq_ptr, pair_sem_ptr, part_ptr, lse_ptr, attn_ptr, sem_ptr,
    proj_part_ptr, proj_sem_ptr, wo_ptr,
    mlp_norm_ptr, w_gate_up_ptr,
    h_ptr, w_down_ptr, final_norm_ptr, head_ptr, logits_ptr, best_ptr, best_idx_ptr, seed_ptr, inv_temp_ptr,
    counter_ptr, timeout_ptr,
    L, B, H, HQ, HKV, D, S, I, V, eps, n_splits, split_len, sm_scale, n_vocab_tiles, stop_stage, max_polls,
    o_split, split_k, attn_width,
    HAS_BIAS: tl.constexpr, WRITE_LOGITS: tl.constexpr, SAMPLE: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, MERGE_SPLITS: tl.constexpr, BLOCK_V: tl.constexpr,
    DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, QKV_SPLIT: tl.constexpr, MLP_SPLIT: tl.constexpr,
    PREFETCH: tl.constexpr, PREFETCH_BLOCK: tl.constexpr, ACQUIRE_LOADS: tl.constexpr, POLL_SLEEP: tl.constexpr,
    DATAFLOW: tl.constexpr, WAIT_PREFETCH: tl.constexpr, ATTN_PREFETCH: tl.constexpr, SQ_LOAD: tl.constexpr,
    SQ_LOAD_QKV: tl.constexpr, DONE_STRIDE: tl.constexpr, USE_PDL: tl.constexpr,
):
    # USE_PDL: launched with programmatic dependent launch after the embedding, which writes x and zeroes
    # the counts: every program waits for it before anything else (compiled only)
    after_previous_kernel(USE_PDL)
    pid = tl.program_id(0)
    qkv_tiles = (HQ + 2 * HKV) * tl.cdiv(D // 2, BLOCK_P) * QKV_SPLIT
    attn_tiles = B * HKV * n_splits
    o_tiles = tl.cdiv(H, BLOCK_N) * o_split
    down_tiles = tl.cdiv(H, BLOCK_N) * split_k
    mlp_tiles = tl.cdiv(I, BLOCK_N) * MLP_SPLIT
    qkv_size = (HQ + 2 * HKV) * D * H  # elements of one layer's matrices
    wo_size = H * attn_width
    gate_up_size = 2 * I * H
    down_size = H * I
    if DATAFLOW:
        per_layer = qkv_tiles + attn_tiles + o_tiles + mlp_tiles + down_tiles
        group_count = counter_ptr + 1  # [Hkv] Q/K/V tiles finished per KV head group
        # [DONE_COUNTS] attention, o_proj, gate_up, down tiles finished, DONE_STRIDE apart (1: after the group
        # counts; COUNT_LINE: from the next line on, a line each)
        done = counter_ptr + tl.cdiv(1 + HKV, DONE_STRIDE) * DONE_STRIDE
        layer = pid // per_layer
        tile = pid % per_layer
        stage = layer * 5
        if layer >= L:
            if L * 5 < stop_stage:
                lm_head_prefetch(pid - L * per_layer, head_ptr, H, V, BLOCK_V, WAIT_PREFETCH)
                wait_for(done + 3 * DONE_STRIDE, L * down_tiles, max_polls, timeout_ptr, ACQUIRE_LOADS, POLL_SLEEP)
                lm_head_tile(pid - L * per_layer, x_ptr, final_norm_ptr, head_ptr, logits_ptr, best_ptr, best_idx_ptr,
                             seed_ptr, inv_temp_ptr, slot_ptr, B, H, V, n_vocab_tiles, eps, WRITE_LOGITS, SAMPLE,
                             BLOCK_B, BLOCK_V, BLOCK_K, DOT_PREC, ROW_PREFETCH, SQ_LOAD)
        elif tile < qkv_tiles:
            if stage < stop_stage:
                qkv_prefetch(tile, layer, wqkv_ptr, H, HQ, HKV, D, BLOCK_P, BLOCK_K, QKV_SPLIT, WAIT_PREFETCH)
                wait_for(done + 3 * DONE_STRIDE, layer * down_tiles, max_polls, timeout_ptr, ACQUIRE_LOADS,
                         POLL_SLEEP)
                qkv_rope_tile(tile, layer, x_ptr, x_ptr, attn_norm_ptr, wqkv_ptr, bqkv_ptr, inv_freq_ptr, kv_start_ptr,
                              slot_ptr, q_ptr, k_cache_ptr, v_cache_ptr, pair_part_ptr, pair_sq_ptr, pair_sem_ptr,
                              B, H, HQ, HKV, D, S, eps, HAS_BIAS, BLOCK_B, BLOCK_P, BLOCK_K, DOT_PREC, ROW_PREFETCH,
                              QKV_SPLIT, SQ_LOAD_QKV, False)
                signal_qkv_group(tile, group_count, HQ, HKV, D, BLOCK_P, QKV_SPLIT)
        elif tile < qkv_tiles + attn_tiles:
            if stage + 1 < stop_stage:
                attn_tile = tile - qkv_tiles
                attention_prefetch(attn_tile, layer, k_cache_ptr, v_cache_ptr, kv_start_ptr, slot_ptr, B, HKV, D, S,
                                   n_splits, split_len, ATTN_PREFETCH)
                wait_qkv_group(attn_tile, layer, group_count, HQ, HKV, D, n_splits, max_polls, timeout_ptr,
                               BLOCK_P, QKV_SPLIT, ACQUIRE_LOADS, POLL_SLEEP)
                decode_attention_tile(attn_tile, layer, q_ptr, k_cache_ptr, v_cache_ptr, kv_start_ptr, slot_ptr,
                                      part_ptr, lse_ptr, attn_ptr, sem_ptr, B, HQ, HKV, D, S, n_splits,
                                      split_len, sm_scale, BLOCK_G, BLOCK_S, BLOCK_D, BLOCK_M, MERGE_SPLITS,
                                          DOT_PREC)
                signal(done)
        elif tile < qkv_tiles + attn_tiles + o_tiles:
            if stage + 2 < stop_stage:
                residual_proj_prefetch(tile - qkv_tiles - attn_tiles, layer, wo_ptr, H, attn_width, o_split, BLOCK_N,
                                       BLOCK_K, WAIT_PREFETCH)
                wait_for(done, (layer + 1) * attn_tiles, max_polls, timeout_ptr, ACQUIRE_LOADS, POLL_SLEEP)
                residual_proj_tile(tile - qkv_tiles - attn_tiles, layer, attn_ptr, wo_ptr, x_ptr, x_ptr, proj_part_ptr,
                                   proj_sem_ptr, B, H, attn_width, o_split, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC,
                                   ROW_PREFETCH, 0)
                signal(done + DONE_STRIDE)
        elif tile < qkv_tiles + attn_tiles + o_tiles + mlp_tiles:
            if stage + 3 < stop_stage:
                gate_up_prefetch(tile - qkv_tiles - attn_tiles - o_tiles, layer, w_gate_up_ptr, H, I, BLOCK_N,
                                 BLOCK_K, MLP_SPLIT, WAIT_PREFETCH)
                wait_for(done + DONE_STRIDE, (layer + 1) * o_tiles, max_polls, timeout_ptr, ACQUIRE_LOADS,
                         POLL_SLEEP)
                gate_up_tile(tile - qkv_tiles - attn_tiles - o_tiles, layer, x_ptr, mlp_norm_ptr, w_gate_up_ptr, h_ptr,
                             pair_part_ptr, pair_sq_ptr, pair_sem_ptr, B, H, I, eps, BLOCK_B, BLOCK_N, BLOCK_K,
                             DOT_PREC,
                             ROW_PREFETCH, MLP_SPLIT, SQ_LOAD)
                signal(done + 2 * DONE_STRIDE)
        else:
            if stage + 4 < stop_stage:
                residual_proj_prefetch(tile - qkv_tiles - attn_tiles - o_tiles - mlp_tiles, layer, w_down_ptr, H, I,
                                       split_k, BLOCK_N, BLOCK_K, WAIT_PREFETCH)
                wait_for(done + 2 * DONE_STRIDE, (layer + 1) * mlp_tiles, max_polls, timeout_ptr, ACQUIRE_LOADS,
                         POLL_SLEEP)
                residual_proj_tile(tile - qkv_tiles - attn_tiles - o_tiles - mlp_tiles, layer, h_ptr, w_down_ptr, x_ptr,
                                   x_ptr, proj_part_ptr, proj_sem_ptr, B, H, I, split_k, BLOCK_B, BLOCK_N, BLOCK_K,
                                   DOT_PREC, ROW_PREFETCH, 0)
                signal(done + 3 * DONE_STRIDE)
    else:
        nprog = tl.num_programs(0)
        sink = tl.zeros([], dtype=tl.float32)
        for layer in range(L):
            stage = layer * 5
            layer64 = tl.full([], 0, tl.int64) + layer
            if stage < stop_stage:
                for tile in range(pid, qkv_tiles, nprog):
                    qkv_rope_tile(tile, layer, x_ptr, x_ptr, attn_norm_ptr, wqkv_ptr, bqkv_ptr, inv_freq_ptr,
                                  kv_start_ptr, slot_ptr, q_ptr, k_cache_ptr, v_cache_ptr, pair_part_ptr, pair_sq_ptr,
                                  pair_sem_ptr, B, H, HQ, HKV, D, S, eps, HAS_BIAS, BLOCK_B, BLOCK_P, BLOCK_K,
                                  DOT_PREC, ROW_PREFETCH, QKV_SPLIT, SQ_LOAD_QKV, False)
                    # no grid barrier after this stage: each tile signals its KV head's group
                    signal_qkv_group(tile, counter_ptr + 1, HQ, HKV, D, BLOCK_P, QKV_SPLIT)
            if stage + 1 < stop_stage:
                for tile in range(pid, attn_tiles, nprog):
                    wait_qkv_group(tile, layer, counter_ptr + 1, HQ, HKV, D, n_splits, max_polls, timeout_ptr,
                                   BLOCK_P, QKV_SPLIT, ACQUIRE_LOADS, POLL_SLEEP)
                    decode_attention_tile(tile, layer, q_ptr, k_cache_ptr, v_cache_ptr, kv_start_ptr, slot_ptr,
                                          part_ptr, lse_ptr, attn_ptr, sem_ptr, B, HQ, HKV, D, S, n_splits,
                                          split_len, sm_scale, BLOCK_G, BLOCK_S, BLOCK_D, BLOCK_M, MERGE_SPLITS,
                                          DOT_PREC)
                sink = _barrier(counter_ptr, layer * 4, pid, nprog, sink, wo_ptr + layer64 * wo_size, wo_size, 0,
                                max_polls, timeout_ptr, PREFETCH, PREFETCH_BLOCK, ACQUIRE_LOADS, POLL_SLEEP)
            if stage + 2 < stop_stage:
                for tile in range(pid, o_tiles, nprog):
                    residual_proj_tile(tile, layer, attn_ptr, wo_ptr, x_ptr, x_ptr, proj_part_ptr, proj_sem_ptr, B, H,
                                       attn_width, o_split, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH, 0)
                sink = _barrier(counter_ptr, layer * 4 + 1, pid, nprog, sink, w_gate_up_ptr + layer64 * gate_up_size,
                                gate_up_size, 0, max_polls, timeout_ptr, PREFETCH, PREFETCH_BLOCK,
                                ACQUIRE_LOADS, POLL_SLEEP)
            if stage + 3 < stop_stage:
                for tile in range(pid, mlp_tiles, nprog):
                    gate_up_tile(tile, layer, x_ptr, mlp_norm_ptr, w_gate_up_ptr, h_ptr, pair_part_ptr, pair_sq_ptr,
                                 pair_sem_ptr, B, H, I, eps, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH,
                                 MLP_SPLIT, SQ_LOAD)
                sink = _barrier(counter_ptr, layer * 4 + 2, pid, nprog, sink, w_down_ptr + layer64 * down_size,
                                down_size, 0, max_polls, timeout_ptr, PREFETCH, PREFETCH_BLOCK,
                                ACQUIRE_LOADS, POLL_SLEEP)
            if stage + 4 < stop_stage:
                for tile in range(pid, down_tiles, nprog):
                    residual_proj_tile(tile, layer, h_ptr, w_down_ptr, x_ptr, x_ptr, proj_part_ptr, proj_sem_ptr, B, H,
                                       I, split_k, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH, 0)
                if layer + 1 < L:
                    sink = _barrier(counter_ptr, layer * 4 + 3, pid, nprog, sink, wqkv_ptr + (layer64 + 1) * qkv_size,
                                    qkv_size, 0, max_polls, timeout_ptr, PREFETCH, PREFETCH_BLOCK,
                                    ACQUIRE_LOADS, POLL_SLEEP)
                else:
                    sink = _barrier(counter_ptr, layer * 4 + 3, pid, nprog, sink, head_ptr, V * H, 0, max_polls,
                                    timeout_ptr, PREFETCH, PREFETCH_BLOCK, ACQUIRE_LOADS, POLL_SLEEP)
        if L * 5 < stop_stage:
            for tile in range(pid, n_vocab_tiles, nprog):
                lm_head_tile(tile, x_ptr, final_norm_ptr, head_ptr, logits_ptr, best_ptr, best_idx_ptr, seed_ptr,
                             inv_temp_ptr, slot_ptr, B, H, V, n_vocab_tiles, eps, WRITE_LOGITS, SAMPLE, BLOCK_B,
                             BLOCK_V,
                             BLOCK_K, DOT_PREC, ROW_PREFETCH, SQ_LOAD)
        if stop_stage < 0:  # never true: keeps the prefetch loads from being optimized away
            tl.store(timeout_ptr + 1, sink.to(tl.int32))
