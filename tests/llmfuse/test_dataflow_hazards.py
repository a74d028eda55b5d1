"""The dependency-ordered looped schedule (plan.dataflow) is race-free: a happens-before check of a
trace of the real kernel (dataflow_trace.py), at batch 1 (row sums) and at the tensor-core-tile
path with the GPU's block sizes and K splits (the configuration that gave wrong logits on the
H200); and the check itself finds the races it is meant to find."""

import copy

import pytest
import torch
from dataflow_trace import Trace, check_happens_before, trace_launch

import fusecore
from fusecore.testing import test_device
from llmfuse import ops
from llmfuse import reference as ref
from llmfuse.config import LlamaConfig
from llmfuse.weights import random_weights

CFG = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5)
# The plan the H200 ran at batch 9 (make_plan on a CUDA device: 64-row weight tiles, 128-wide K
# chunks, Q/K/V in 4 K parts, gate/up in 2, W_o and W_down in 2; one attention split), and a
# batch-1 row-sum plan with two attention splits and W_down in 2 K parts (the merges).
GPU_BATCH_9 = dict(block_k=128, block_n=64, block_p=16, block_v=128, block_s=64, qkv_split=4, mlp_split=2,
                   o_split=2, split_k=2)
ROW_SUMS = dict(block_s=16, split_k=2)
SLOTS = {9: 19, 1: 40}

pytestmark = pytest.mark.skipif(fusecore.COMPILED, reason="traces the kernel's programs under the interpreter")


def _traced_step(batch: int, n_splits: int, tuning: dict, gen) -> tuple[Trace, ops.DecodePlan]:
    device = torch.device(test_device())
    w = random_weights(CFG, dtype=torch.float32, device=device, generator=gen, std=0.1)
    slots = SLOTS[batch]
    plan = ops.make_plan(CFG, batch, slots, torch.float32, device, n_splits=n_splits, dataflow=True, **tuning)
    buf = ops.DecodeBuffers.allocate(CFG, plan, torch.float32, device)
    cache = ref.KVCache.empty(CFG, batch, slots, dtype=torch.float32, device=device)
    buf.kv_start.copy_((torch.arange(batch) * 3) % 7)
    buf.slot.fill_(slots - 3)
    with trace_launch({**buf.__dict__, "k_cache": cache.k, "v_cache": cache.v}) as trace:
        ops.looped_decode(w, CFG, cache, buf, plan, CFG.rope_inv_freq().to(device), write_logits=True)
    assert not ops.looped_timed_out(buf)
    return trace, plan


@pytest.fixture(scope="module")
def batch9_trace():
    return _traced_step(9, 1, GPU_BATCH_9, torch.Generator().manual_seed(0))


def test_dataflow_schedule_at_the_gpu_plan_of_batch_9_has_no_race(batch9_trace):
    trace, plan = batch9_trace
    tiles = plan.tiles(CFG)
    checked = check_happens_before(trace)
    assert checked["programs"] == CFG.num_hidden_layers * sum(tiles.values()) - (
        CFG.num_hidden_layers - 1) * tiles["lm_head"]
    # every Q/K/V pair block, gate/up block and W_o / W_down feature tile of every layer, and every
    # attention (row, KV head) merges once
    merges_per_layer = (tiles["qkv"] // plan.qkv_split + tiles["gate_up"] // plan.mlp_split
                        + tiles["o_proj"] // plan.o_split + tiles["down"] // plan.split_k + tiles["attention"])
    assert checked["rounds"] == CFG.num_hidden_layers * merges_per_layer
    touched = {e.buffer for events in trace.programs for e in events if e.buffer}
    assert touched >= {"x", "q", "attn", "part", "lse", "h", "pair_part", "pair_sq", "proj_part", "k_cache",
                       "v_cache", "logits", "sem", "pair_sem", "proj_sem", "counter"}


# spread_counts: the done counts a 128-byte line apart (the GPU default up to batch 8, session 9)
@pytest.mark.parametrize("spread_counts", [False, True])
def test_dataflow_schedule_with_row_sums_and_split_attention_has_no_race(spread_counts, gen):
    trace, plan = _traced_step(1, 3, {**ROW_SUMS, "spread_counts": spread_counts}, gen)
    assert plan.n_splits > 1 and plan.row_sums
    assert check_happens_before(trace)["rounds"] > 0


def _program(plan: ops.DecodePlan, layer: int, stage: str, tile: int = 0) -> int:
    tiles = plan.tiles(CFG)
    order = ("qkv", "attention", "o_proj", "gate_up", "down")
    per_layer = sum(tiles[name] for name in order)
    return layer * per_layer + sum(tiles[name] for name in order[: order.index(stage)]) + tile


def _without(trace: Trace, program: int, kind: str, last: bool = False) -> Trace:
    """A copy of the trace with the first (or last) event of ``kind`` of ``program`` removed."""
    mutated = copy.deepcopy(trace)
    events = mutated.programs[program]
    where = [i for i, e in enumerate(events) if e.kind == kind]
    del events[where[-1] if last else where[0]]
    return mutated


def test_the_check_finds_a_missing_wait(batch9_trace):
    trace, plan = batch9_trace
    with pytest.raises(AssertionError, match="race on attn"):
        check_happens_before(_without(trace, _program(plan, 0, "o_proj"), "wait"))
    with pytest.raises(AssertionError, match="also signals it and is not ordered after"):
        check_happens_before(_without(trace, _program(plan, 1, "qkv"), "wait"))


def test_the_check_finds_a_wait_for_one_signal_too_few(batch9_trace):
    trace, plan = batch9_trace
    mutated = copy.deepcopy(trace)
    program = _program(plan, 1, "attention")
    next(e for e in mutated.programs[program] if e.kind == "wait").value -= 1
    with pytest.raises(AssertionError, match=f"program {program} waits on"):
        check_happens_before(mutated)


def test_the_check_finds_a_release_without_a_cta_barrier(batch9_trace):
    trace, plan = batch9_trace
    # the second W_o part finishes last: its epilogue stores x, then signals the o_proj count
    program = _program(plan, 0, "o_proj", tile=plan.o_split - 1)
    with pytest.raises(AssertionError, match="release on counter after stores without a CTA barrier"):
        check_happens_before(_without(trace, program, "barrier", last=True))
