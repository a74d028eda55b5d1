"""The looped persistent decode kernel: every layer's five instructions and the LM head in
one launch ("kernel looping").

Schedule (stage numbers are global, ``5 · layer + k``)::

    for layer in 0 .. L-1:
        k=0  qkv_rope_tile          over (Hq + 2 Hkv) · ceil(D/2 / BLOCK_P) tiles   → q, cache
        k=1  decode_attention_tile  over B · Hkv · n_splits tiles                   → attn
        k=2  residual_proj_tile     over ceil(H / BLOCK_N) tiles (attn, W_o)        → x
        k=3  gate_up_tile           over ceil(I / BLOCK_N) tiles                    → h
        k=4  residual_proj_tile     over ceil(H / BLOCK_N) tiles (h, W_down)        → x
    stage 5L: lm_head_tile          over ceil(V / BLOCK_V) tiles          → greedy or sampled winners (+ logits)

Program ``p`` of ``P`` runs tiles ``p, p + P, p + 2P, ...`` of each stage and then passes
a grid barrier (a counter in device memory, :mod:`.grid_barrier`) before the next stage:
the kernel boundaries of the per-layer path become counter waits, and the weights stay
stacked [L, ...] behind one pointer each.  Between arriving and waiting, a program that
is not the last to arrive prefetches a ``PREFETCH``-element slice of the weights of the
next weight-reading stage into L2 (:mod:`.prefetch`): W_o after qkv, W_gate_up after
attention and (its next slice) after o_proj, W_down after gate_up, the next layer's
W_qkv (or the LM head) after down.

The tiles are the same ``@jit`` functions the per-layer kernels launch, so both paths
compute identical values.  Stages ``>= stop_stage`` are skipped, which lets the tests
compare the kernel with the Python interpreter of this schedule (:mod:`llmfuse.looped`)
after any stage.  With ``P = 1`` (the interpreter, where programs run one after another)
every wait ends at once.
Bytes: the sum of the six instructions' bytes over all layers — the whole model once.
"""

import triton.language as tl

from fusecore.backend import jit

from .decode_attention import decode_attention_tile
from .gate_up import gate_up_tile
from .grid_barrier import grid_arrive, grid_wait
from .lm_head import lm_head_tile
from .prefetch import prefetch_flat
from .qkv_rope import qkv_rope_tile
from .residual_proj import residual_proj_tile

STAGES_PER_LAYER = 5


@jit
def _barrier(counter_ptr, index, pid, nprog, sink, w_ptr, n, start, max_polls,
             PREFETCH: tl.constexpr, PREFETCH_BLOCK: tl.constexpr):
    """Arrive at barrier ``index``, prefetch w[start + pid·PREFETCH ...] unless last, wait; the new sink."""
    before = grid_arrive(counter_ptr)
    if PREFETCH > 0:
        if before + 1 < (index + 1) * nprog:
            sink += prefetch_flat(w_ptr, n, start, pid, PREFETCH, PREFETCH_BLOCK)
    grid_wait(counter_ptr, index, nprog, max_polls)
    return sink


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["B", "S", "n_splits", "split_len", "stop_stage", "max_polls"])
def looped_decode_kernel(
    x_ptr, attn_norm_ptr, wqkv_ptr, bqkv_ptr, inv_freq_ptr, kv_start_ptr, slot_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, lse_ptr, attn_ptr, sem_ptr, wo_ptr, mlp_norm_ptr, w_gate_up_ptr,
    h_ptr, w_down_ptr, final_norm_ptr, head_ptr, logits_ptr, best_ptr, best_idx_ptr, seed_ptr, inv_temp_ptr,
    counter_ptr,
    L, B, H, HQ, HKV, D, S, I, V, eps, n_splits, split_len, sm_scale, n_vocab_tiles, stop_stage, max_polls,
    HAS_BIAS: tl.constexpr, WRITE_LOGITS: tl.constexpr, SAMPLE: tl.constexpr, BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PREC: tl.constexpr,
    PREFETCH: tl.constexpr, PREFETCH_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    qkv_tiles = (HQ + 2 * HKV) * tl.cdiv(D // 2, BLOCK_P)
    attn_tiles = B * HKV * n_splits
    hidden_tiles = tl.cdiv(H, BLOCK_N)
    mlp_tiles = tl.cdiv(I, BLOCK_N)
    qkv_size = (HQ + 2 * HKV) * D * H  # elements of one layer's matrices
    wo_size = H * HQ * D
    gate_up_size = 2 * I * H
    down_size = H * I
    slice_size = nprog.to(tl.int64) * PREFETCH
    sink = tl.zeros([], dtype=tl.float32)
    for layer in range(L):
        stage = layer * 5
        layer64 = tl.full([], 0, tl.int64) + layer
        if stage < stop_stage:
            for tile in range(pid, qkv_tiles, nprog):
                qkv_rope_tile(tile, layer, x_ptr, attn_norm_ptr, wqkv_ptr, bqkv_ptr, inv_freq_ptr, kv_start_ptr,
                              slot_ptr, q_ptr, k_cache_ptr, v_cache_ptr, B, H, HQ, HKV, D, S, eps,
                              HAS_BIAS, BLOCK_B, BLOCK_P, BLOCK_K, DOT_PREC)
            sink = _barrier(counter_ptr, stage, pid, nprog, sink, wo_ptr + layer64 * wo_size, wo_size, 0,
                            max_polls, PREFETCH, PREFETCH_BLOCK)
        if stage + 1 < stop_stage:
            for tile in range(pid, attn_tiles, nprog):
                decode_attention_tile(tile, layer, q_ptr, k_cache_ptr, v_cache_ptr, kv_start_ptr, slot_ptr,
                                      part_ptr, lse_ptr, attn_ptr, sem_ptr, B, HQ, HKV, D, S, n_splits,
                                      split_len, sm_scale, BLOCK_G, BLOCK_S, BLOCK_D, DOT_PREC)
            sink = _barrier(counter_ptr, stage + 1, pid, nprog, sink, w_gate_up_ptr + layer64 * gate_up_size,
                            gate_up_size, 0, max_polls, PREFETCH, PREFETCH_BLOCK)
        if stage + 2 < stop_stage:
            for tile in range(pid, hidden_tiles, nprog):
                residual_proj_tile(tile, layer, attn_ptr, wo_ptr, x_ptr, B, H, HQ * D,
                                   BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
            sink = _barrier(counter_ptr, stage + 2, pid, nprog, sink, w_gate_up_ptr + layer64 * gate_up_size,
                            gate_up_size, slice_size, max_polls, PREFETCH, PREFETCH_BLOCK)
        if stage + 3 < stop_stage:
            for tile in range(pid, mlp_tiles, nprog):
                gate_up_tile(tile, layer, x_ptr, mlp_norm_ptr, w_gate_up_ptr, h_ptr, B, H, I, eps,
                             BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
            sink = _barrier(counter_ptr, stage + 3, pid, nprog, sink, w_down_ptr + layer64 * down_size, down_size,
                            0, max_polls, PREFETCH, PREFETCH_BLOCK)
        if stage + 4 < stop_stage:
            for tile in range(pid, hidden_tiles, nprog):
                residual_proj_tile(tile, layer, h_ptr, w_down_ptr, x_ptr, B, H, I, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC)
            if layer + 1 < L:
                sink = _barrier(counter_ptr, stage + 4, pid, nprog, sink, wqkv_ptr + (layer64 + 1) * qkv_size,
                                qkv_size, 0, max_polls, PREFETCH, PREFETCH_BLOCK)
            else:
                sink = _barrier(counter_ptr, stage + 4, pid, nprog, sink, head_ptr, V * H, 0, max_polls,
                                PREFETCH, PREFETCH_BLOCK)
    if L * 5 < stop_stage:
        for tile in range(pid, n_vocab_tiles, nprog):
            lm_head_tile(tile, x_ptr, final_norm_ptr, head_ptr, logits_ptr, best_ptr, best_idx_ptr, seed_ptr,
                         inv_temp_ptr, slot_ptr, B, H, V, n_vocab_tiles, eps, WRITE_LOGITS, SAMPLE, BLOCK_B, BLOCK_V,
                         BLOCK_K, DOT_PREC)
    if stop_stage < 0:  # never true: keeps the prefetch loads from being optimized away
        tl.store(counter_ptr + 2, sink.to(tl.int32))
