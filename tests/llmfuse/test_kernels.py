"""Each fused decode instruction against the step of llmfuse.reference it replaces (float64
oracle), at odd sizes, by row sums (batch 1; 2 and 3 as an option) and tensor-core tiles
(batches 3 and 9), outputs poisoned."""

import dataclasses
import math

import pytest
import torch
import triton.language as tl

import fusecore
from fusecore.backend import jit
from fusecore.softmax import merge_partials
from fusecore.testing import assert_all_written, assert_close, poison_value, test_device
from llmfuse import ops
from llmfuse import reference as ref
from llmfuse.config import LlamaConfig
from llmfuse.weights import random_weights

CFG = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
SLOTS = 21
LAYER = 1


def _setup(batch, dtype, gen, bias=False, split_k=None, tuning=None):
    device = test_device()
    cfg = CFG if not bias else LlamaConfig(**{**CFG.__dict__, "attention_bias": True, "model_type": "qwen2"})
    w = random_weights(cfg, dtype=dtype, device="cpu", generator=gen, std=0.1)
    w64 = w.to(dtype=torch.float64)
    wk = w.to(device=device)
    plan = ops.make_plan(cfg, batch, SLOTS, dtype, torch.device(device), n_splits=3, split_k=split_k,
                         **(tuning or {}))
    buf = ops.DecodeBuffers.allocate(cfg, plan, dtype, torch.device(device))
    cache = ref.KVCache.empty(cfg, batch, SLOTS, dtype=dtype, device=device)
    cache.k.normal_(generator=None)
    cache.v.normal_()
    slot = 13
    kv_start = torch.tensor([0, 4, 13, 2, 7] * 4)[:batch]
    buf.slot.fill_(slot)
    buf.kv_start.copy_(kv_start)
    buf.x.copy_(torch.randn(batch, cfg.hidden_size, generator=gen))
    return cfg, w64, wk, plan, buf, cache, slot, kv_start


# (batch, dtype, plan fields): batch 1 by pipelined row tiles (the default) and by the earlier
# row tiles (row_prefetch=False), batches 2 and 3 also by row sums over several rows (block_b <= 8:
# one tile of weights meets every row of x), the others by tensor-core tiles padded to 16 rows
# (the default for batches > 1)
CASES = [(1, torch.float32, {}), (1, torch.bfloat16, {"row_prefetch": False}), (3, torch.float32, {"block_b": 4}),
         (3, torch.bfloat16, {}), (2, torch.float16, {"block_b": 2}), (9, torch.float32, {}),
         (9, torch.bfloat16, {})]


# Q/K/V with K split in parts (16-column chunks: the parts are not empty at hidden size 48), and
# with its own chunk width (block_k_qkv)
@pytest.mark.parametrize("batch, dtype, tuning", CASES + [(1, torch.float32, {"qkv_split": 2, "block_k": 16}),
                                                          (9, torch.bfloat16, {"qkv_split": 3, "block_k": 16}),
                                                          (1, torch.float32, {"block_k_qkv": 16}),
                                                          (9, torch.bfloat16, {"qkv_split": 2, "block_k_qkv": 16}),
                                                          (9, torch.bfloat16, {"square_sum_load_qkv": 0}),
                                                          (9, torch.bfloat16, {"square_sum_load_qkv": 2,
                                                                               "qkv_split": 2, "block_k": 16})])
def test_qkv_rope_append(batch, dtype, tuning, gen):
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, dtype, gen, bias=batch == 3, tuning=tuning)
    buf.q.fill_(poison_value(torch.float32))
    cache.k[LAYER, :, :, slot] = float("nan")
    cache.v[LAYER, :, :, slot] = float("nan")
    before = cache.k.clone()
    inv_freq = cfg.rope_inv_freq().to(buf.x.device)
    ops.qkv_rope(wk, cfg, LAYER, cache, buf, plan, inv_freq)
    assert int(buf.pair_sem.abs().sum()) == 0, "the last K part of each pair block resets its semaphore"
    positions = (slot - kv_start)[:, None]
    q, k, v = ref.qkv_step(w64, cfg, LAYER, buf.x.cpu().double()[:, None], positions, cfg.rope_inv_freq())
    assert_all_written(buf.q, "q")
    assert_all_written(cache.k[LAYER, :, :, slot], "k row")
    assert_close(buf.q.cpu(), q[:, 0].float(), dtype, name="q")
    assert_close(cache.k[LAYER, :, :, slot].cpu(), k[:, 0].to(dtype), dtype, name="k")
    assert_close(cache.v[LAYER, :, :, slot].cpu(), v[:, 0].to(dtype), dtype, name="v")
    other = torch.ones(SLOTS, dtype=torch.bool)
    other[slot] = False
    assert torch.equal(cache.k[:, :, :, other].cpu(), before[:, :, :, other].cpu())


@pytest.mark.parametrize("batch, dtype, tuning", CASES)
def test_decode_attention_splits_merge_to_attention(batch, dtype, tuning, gen):
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, dtype, gen, tuning=tuning)
    buf.q.copy_(torch.randn(buf.q.shape, generator=gen))
    buf.part.fill_(float("nan"))
    buf.lse.fill_(float("nan"))
    buf.attn.fill_(float("nan"))
    ops.decode_attention(cfg, LAYER, cache, buf, plan)
    assert_all_written(buf.part, "partials")
    assert_all_written(buf.lse, "lse")
    assert_all_written(buf.attn, "attn")
    assert int(buf.sem.abs().sum()) == 0, "the last split of each group resets its semaphore"
    # empty splits (past the slot, or before the row's first valid slot) are marked by lse = -inf
    for b in range(batch):
        for s in range(plan.n_splits):
            lo, hi = max(s * plan.split_len, int(kv_start[b])), min((s + 1) * plan.split_len, slot + 1)
            assert bool(torch.isinf(buf.lse[b, :, s]).all()) == (hi <= lo)
    merged, _ = merge_partials(buf.part.cpu().double(), buf.lse.cpu().double(), dim=2)
    expected = ref.attention_step(buf.q.cpu().double()[:, None], cache.k[LAYER].cpu().double(),
                                  cache.v[LAYER].cpu().double(), torch.tensor([slot]), kv_start)
    assert_close(merged.reshape(batch, -1), expected[:, 0], dtype, name="host-merged partials")
    assert_close(buf.attn.cpu().reshape(batch, -1), expected[:, 0], dtype, name="kernel-merged attention")


def test_decode_attention_merges_more_splits_than_one_round(gen):
    """20 splits: the last program merges them in three rounds of 8 (plan.merge_splits); a row
    whose first valid slot leaves splits empty (lse = -inf), and a split past the current slot."""
    slots, slot = 1280, 1201  # 20 splits of 64 slots under the interpreter and compiled
    kv_start = torch.tensor([0, 300])
    plan = ops.make_plan(CFG, 2, slots, torch.float32, torch.device(test_device()), n_splits=20, merge_splits=8)
    assert plan.n_splits == 20 > 2 * plan.merge_splits
    buf = ops.DecodeBuffers.allocate(CFG, plan, torch.float32, torch.device(test_device()))
    cache = ref.KVCache.empty(CFG, 2, slots, dtype=torch.float32, device=test_device())
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    buf.slot.fill_(slot)
    buf.kv_start.copy_(kv_start)
    buf.q.copy_(torch.randn(buf.q.shape, generator=gen))
    buf.attn.fill_(float("nan"))
    ops.decode_attention(CFG, LAYER, cache, buf, plan)
    assert_all_written(buf.attn, "attn")
    expected = ref.attention_step(buf.q.cpu().double()[:, None], cache.k[LAYER].cpu().double(),
                                  cache.v[LAYER].cpu().double(), torch.tensor([slot]), kv_start)
    assert_close(buf.attn.cpu().reshape(2, -1), expected[:, 0], torch.float32, name="attention")


@pytest.mark.parametrize("batch, dtype, tuning, split_k", [(*case, 1) for case in CASES] +
                         [(9, torch.float32, {}, 3), (1, torch.float32, {"block_k_o": 16}, 1),
                          (9, torch.bfloat16, {"block_k_o": 16}, 2), (1, torch.float32, {"block_n_o": 16}, 1),
                          (9, torch.float32, {"block_n_o": 16, "block_k_o": 16}, 3)])
def test_o_proj_adds_residual(batch, dtype, tuning, split_k, gen):
    """split_k > 1: the last K part of each feature tile sums all parts into x.  ``block_n_o``: W_o's tiles
    narrower than the plan's block_n (48 features: three tiles of 16, the last part of each merging)."""
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, dtype, gen, split_k=split_k, tuning=tuning)
    assert plan.split_k == split_k
    assert plan.o_rows() == tuning.get("block_n_o", plan.block_n)
    buf.attn.copy_(torch.randn(buf.attn.shape, generator=gen))
    x0 = buf.x.cpu().double()
    ops.o_proj(wk, cfg, LAYER, buf, plan)
    assert int(buf.proj_sem.abs().sum()) == 0, "the last K part of each tile resets its semaphore"
    expected = ref.o_proj_step(w64, LAYER, buf.attn.cpu().double().reshape(batch, -1), x0)
    assert_close(buf.x.cpu() - x0, expected - x0, dtype, name="o_proj update")


@pytest.mark.parametrize("batch, dtype, tuning", [(1, torch.float32, {}), (9, torch.bfloat16, {"qkv_split": 2})])
def test_qkv_and_attention_in_one_launch_equal_two_launches(batch, dtype, tuning, gen):
    """Both layers of the config through the fused launch (counts accumulating over the layers)
    against qkv_rope + decode_attention: the same tile functions, so bit-identical under the
    interpreter (compiled, each kernel gets its own code: within rounding); no wait gave up."""
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, dtype, gen, tuning=tuning)
    fused = ops.make_plan(cfg, batch, SLOTS, dtype, buf.x.device, n_splits=plan.n_splits, fuse_attention=True,
                          **tuning)
    inv_freq = cfg.rope_inv_freq().to(buf.x.device)
    cache2 = ref.KVCache(cache.k.clone(), cache.v.clone())
    buf2 = ops.DecodeBuffers(**{k: v.clone() for k, v in buf.__dict__.items()})

    def same(got, expected, name):
        if fusecore.COMPILED:
            assert_close(got, expected, dtype, name=name)
        else:
            assert torch.equal(got, expected), name

    buf2.counter.zero_()
    for layer in range(cfg.num_hidden_layers):
        ops.qkv_rope(wk, cfg, layer, cache, buf, plan, inv_freq)
        ops.decode_attention(cfg, layer, cache, buf, plan)
        ops.qkv_attention(wk, cfg, layer, cache2, buf2, fused, inv_freq)
        for name in ("q", "attn"):
            same(getattr(buf2, name), getattr(buf, name), name)
    same(cache2.k, cache.k, "k cache")
    same(cache2.v, cache.v, "v cache")
    assert not ops.looped_timed_out(buf2)


# kv_start: the row's first valid slot (13: every split but the slot's own empty); block_s: slots per split;
# merge_in_o: W_o merges the splits (else the last split to finish, as without attn_preload)
@pytest.mark.parametrize("dtype, kv_start, block_s, merge_in_o", [
    (torch.float32, 0, 8, True), (torch.bfloat16, 4, 8, True), (torch.float32, 13, 8, True),
    (torch.bfloat16, 2, 4, True), (torch.float32, 9, 32, True), (torch.float32, 0, 8, False),
    (torch.bfloat16, 13, 8, False), (torch.float32, 2, 4, False)])
def test_attention_splits_preloaded_and_merged(dtype, kv_start, block_s, merge_in_o, gen):
    """``attn_preload``: the fused launch's attention tiles (one block per split) load the old slots before
    their waits and the new one after; with ``merge_in_o`` they store partials and logsumexps without a
    count and W_o's tiles merge them as they load their K chunks, else the last split to finish merges
    them into ``attn``.  Both layers of the config, against the float64 oracle of each instruction: the
    cache append, each split's partial and logsumexp (−inf exactly for the empty ones), the merged
    attention (never written with ``merge_in_o``) and x after W_o; every count reset, no wait given up."""
    if fusecore.COMPILED:
        block_s = max(16, block_s)  # tl.dot's operands are >= 16 wide on the GPU
    cfg, w64, wk, plan, buf, cache, slot, _ = _setup(1, dtype, gen, tuning={
        "fuse_attention": True, "block_s": block_s, "merge_in_o" if merge_in_o else "attn_preload": True})
    assert plan.attn_preload and plan.merge_in_o == merge_in_o and plan.split_len <= plan.block_s == block_s
    assert plan.n_splits == -(-SLOTS // block_s)
    buf.kv_start.fill_(kv_start)
    inv_freq = cfg.rope_inv_freq().to(buf.x.device)
    buf.counter.zero_()
    buf.attn.fill_(poison_value(torch.float32))
    for layer in range(cfg.num_hidden_layers):
        x0 = buf.x.cpu().double()
        buf.part.fill_(poison_value(torch.float32))
        buf.lse.fill_(poison_value(torch.float32))
        ops.qkv_attention(wk, cfg, layer, cache, buf, plan, inv_freq)
        q, k, v = ref.qkv_step(w64, cfg, layer, x0[:, None], torch.tensor([[slot - kv_start]]), cfg.rope_inv_freq())
        assert_close(buf.q.cpu(), q[:, 0].float(), dtype, name="q")
        assert_close(cache.k[layer, :, :, slot].cpu().double(), k[:, 0], dtype, name="appended k")
        k_all, v_all = cache.k[layer].cpu().double(), cache.v[layer].cpu().double()
        for s in range(plan.n_splits):
            lo, hi = max(s * plan.split_len, kv_start), min((s + 1) * plan.split_len, slot + 1)
            lse = buf.lse[0, :, s].cpu()
            if hi <= lo:
                assert bool(torch.isneginf(lse).all()), f"split {s} is empty: lse -inf"
                continue
            scores = torch.einsum("hd,hsd->hs", buf.q[0].cpu().double(),
                                  k_all[0].repeat_interleave(cfg.group_size, 0)[:, lo:hi]) / math.sqrt(cfg.head_dim)
            weights = torch.softmax(scores, dim=1)
            out = torch.einsum("hs,hsd->hd", weights, v_all[0].repeat_interleave(cfg.group_size, 0)[:, lo:hi])
            assert_close(lse, torch.logsumexp(scores, dim=1).float(), dtype, name=f"split {s} lse")
            assert_close(buf.part[0, :, s].cpu(), out.float(), dtype, name=f"split {s} partial")
        attn = ref.attention_step(buf.q.cpu().double()[:, None], k_all, v_all, torch.tensor([slot]),
                                  torch.tensor([kv_start]))
        if merge_in_o:
            torch.testing.assert_close(buf.attn, torch.full_like(buf.attn, poison_value(torch.float32)), rtol=0,
                                       atol=0, equal_nan=True, msg="the merged attention is never written")
        else:
            assert_close(buf.attn.cpu().reshape(1, -1), attn[:, 0], dtype, name="merged attention")
        ops.o_proj(wk, cfg, layer, buf, plan)
        expected = ref.o_proj_step(w64, layer, attn[:, 0], x0)
        assert_close(buf.x.cpu().double() - x0, expected - x0, dtype, name="x after W_o")
        buf.attn.fill_(poison_value(torch.float32))
    assert int(buf.sem.abs().sum()) == 0 and not ops.looped_timed_out(buf)


def test_preload_and_merge_in_o_steps_equal_the_default_step_within_rounding(gen):
    """A whole step with ``merge_in_o`` (three splits; two on the GPU) and with ``attn_preload`` alone against
    the plan without them: the same logits but for float32 rounding, the same bits on a repeat; bad plans
    are refused at the boundary."""
    device = torch.device(test_device())
    w = random_weights(CFG, dtype=torch.float32, generator=gen, std=0.1).to(device=device)
    shape = ref.KVCache.empty(CFG, 1, SLOTS, dtype=torch.float32, device="cpu").k.shape
    tokens, state = torch.tensor([5], device=device), torch.randn(2, *shape, generator=gen).to(device)
    logits = []
    block_s = 16 if fusecore.COMPILED else 8  # tl.dot's operands are >= 16 wide on the GPU
    for tuning in ({}, {"merge_in_o": True, "block_s": block_s}, {"merge_in_o": True, "block_s": block_s},
                   {"attn_preload": True, "block_s": block_s}):
        plan = ops.make_plan(CFG, 1, SLOTS, torch.float32, device, fuse_attention=True, **tuning)
        assert plan.n_splits == -(-SLOTS // block_s) or not plan.merge_in_o
        buf = ops.DecodeBuffers.allocate(CFG, plan, torch.float32, device)
        cache = ref.KVCache(state[0].clone(), state[1].clone())
        buf.slot.fill_(13)
        buf.kv_start.fill_(3)
        ops.fused_step(w, CFG, cache, buf, plan, CFG.rope_inv_freq().to(device), tokens, looped=False,
                       write_logits=True)
        logits.append(buf.logits.clone())
    assert_close(logits[1].cpu(), logits[0].cpu(), torch.float32, name="merge_in_o logits")
    assert_close(logits[3].cpu(), logits[0].cpu(), torch.float32, name="attn_preload logits")
    assert torch.equal(logits[1], logits[2])
    cpu = torch.device("cpu")
    for bad in ({"merge_in_o": True}, {"merge_in_o": True, "fuse_attention": True, "row_prefetch": False},
                {"merge_in_o": True, "fuse_attention": True, "block_s": 2},
                {"merge_in_o": True, "fuse_attention": True, "block_s": 8, "split_len": 16}):
        with pytest.raises(ValueError, match="merge_in_o needs"):
            ops.make_plan(CFG, 1, SLOTS, torch.float32, cpu, **bad)
    with pytest.raises(ValueError, match="merge_in_o needs"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, merge_in_o=True, fuse_attention=True, block_s=16)
    with pytest.raises(ValueError, match="attn_preload needs"):
        ops.make_plan(CFG, 1, SLOTS, torch.float32, cpu, attn_preload=True)
    with pytest.raises(ValueError, match="attn_preload needs"):
        ops.make_plan(CFG, 1, SLOTS, torch.float32, cpu, attn_preload=True, fuse_attention=True, split_len=64)
    # batch 3's tensor-core tiles preload too (the merge by the last split is batch-independent)
    assert ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, attn_preload=True, fuse_attention=True).attn_preload


# split_k: the down projection's K parts; mlp_split: gate/up K parts (16-column chunks, none empty);
# block_k_gate_up / block_k_down: their own chunk widths
@pytest.mark.parametrize("batch, dtype, tuning, split_k", [(*case, 1) for case in CASES] +
                         [(9, torch.bfloat16, {}, 2), (1, torch.float32, {"mlp_split": 2, "block_k": 16}, 1),
                          (9, torch.bfloat16, {"mlp_split": 3, "block_k": 16}, 1),
                          (1, torch.float32, {"block_k_down": 16, "block_k_gate_up": 16}, 2),
                          (9, torch.bfloat16, {"block_k_down": 32, "block_k_gate_up": 16}, 1),
                          (9, torch.bfloat16, {"square_sum_load": 0}, 1),
                          (9, torch.bfloat16, {"square_sum_load": 2, "block_k": 16}, 1)])
def test_gate_up_silu_and_down_residual(batch, dtype, tuning, split_k, gen):
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, dtype, gen, split_k=split_k, tuning=tuning)
    buf.h.fill_(float("nan"))
    x0 = buf.x.cpu().double()
    ops.gate_up(wk, cfg, LAYER, buf, plan)
    assert int(buf.pair_sem.abs().sum()) == 0, "the last K part of each feature block resets its semaphore"
    assert_all_written(buf.h, "h")
    assert_close(buf.h.cpu(), ref.mlp_step(w64, cfg, LAYER, x0).to(dtype), dtype, name="h")
    h = buf.h.cpu().double()
    ops.down_proj(wk, cfg, LAYER, buf, plan)
    expected = ref.down_step(w64, LAYER, h, x0)
    assert_close(buf.x.cpu() - x0, expected - x0, dtype, name="down update")


@pytest.mark.parametrize("batch, dtype, tuning", CASES + [(9, torch.bfloat16, {"square_sum_load": 0}),
                                                          (9, torch.bfloat16, {"square_sum_load": 2, "block_k": 16})])
def test_lm_head_logits_and_fused_argmax(batch, dtype, tuning, gen):
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, dtype, gen, tuning=tuning)
    buf.logits.fill_(float("nan"))
    ops.lm_head(wk, cfg, buf, plan, write_logits=True)
    assert_all_written(buf.logits, "logits")
    expected = ref.lm_head_step(w64, cfg, buf.x.cpu().double())
    assert_close(buf.logits.cpu(), expected, dtype, name="logits")
    assert torch.equal(ops.greedy_tokens(buf).cpu(), buf.logits.cpu().argmax(-1))
    assert math.isfinite(float(buf.best.max()))


@pytest.mark.parametrize("batch", [1, 3, 9])
def test_lm_head_fused_sampling_is_the_gumbel_max_of_the_reference(batch, gen):
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, torch.float32, gen)
    seed, temperature = 987654321, 0.7
    buf.seed.fill_(seed)
    buf.inv_temperature.fill_(1.0 / temperature)
    ops.lm_head(wk, cfg, buf, plan, write_logits=True, sample=True)
    expected = ref.gumbel_sample(buf.logits.cpu(), temperature, seed, slot)
    assert torch.equal(ops.greedy_tokens(buf).cpu(), expected)
    buf.slot.fill_(slot + 1)  # the next step draws new noise
    ops.lm_head(wk, cfg, buf, plan, write_logits=True, sample=True)
    assert torch.equal(ops.greedy_tokens(buf).cpu(), ref.gumbel_sample(buf.logits.cpu(), temperature, seed, slot + 1))


def test_gumbel_sample_draws_from_the_softmax():
    """20 000 draws (rows of one logit vector, each its own Philox stream) against softmax(logits / T)."""
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, 0.0])
    temperature, rows = 0.8, 20000
    tokens = ref.gumbel_sample(logits.repeat(rows, 1), temperature, seed=5, position=11)
    freq = torch.bincount(tokens, minlength=5).double() / rows
    probs = torch.softmax(logits.double() / temperature, 0)
    assert float((freq - probs).abs().max()) < 4 * math.sqrt(0.25 / rows)  # 4 standard errors


def test_plan_tuning_is_checked():
    cpu = torch.device("cpu")
    tuned = ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, block_b=4, num_stages=3)
    assert tuned.row_sums and tuned.roundings_per_layer == 5
    assert not ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu).row_sums
    assert tuned.launch_options() == {"num_warps": tuned.num_warps, "num_stages": 3}
    warped = ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, num_warps=4, warps_qkv=2, warps_lm_head=8)
    assert [warped.layer_launch_options(name)["num_warps"] for name in
            ("qkv", "attention", "o_proj", "gate_up", "down", "lm_head", "qkv_attention")] == [2, 4, 4, 4, 4, 8, 4]
    with pytest.raises(ValueError, match="powers of two"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, warps_gate_up=3)
    with pytest.raises(ValueError, match="square_sum_load must be 0, 1 or 2"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, square_sum_load=3)
    with pytest.raises(TypeError, match="block_q"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, block_q=16)
    with pytest.raises(ValueError, match="powers of two"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, block_n=48)
    with pytest.raises(ValueError, match="block_b = 2 must be >= the batch 3"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, block_b=2)
    with pytest.raises(ValueError, match="need every block >= 16"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, block_b=16, block_n=8)
    with pytest.raises(ValueError, match="powers of two"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, block_n_o=24)
    with pytest.raises(ValueError, match="need every block >= 16"):
        ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, block_b=16, block_n_o=8)
    # switches given as 0 / 1 (the plan sweeps' rows) are stored as bools: the kernels' static assertions
    # combine some of them and need bools (pdl=1 at batch 8 failed to compile in session 59)
    flags = ops.make_plan(CFG, 1, SLOTS, torch.float32, cpu, fuse_attention=1, row_prefetch=0, n_splits=2)
    assert flags.fuse_attention is True and flags.row_prefetch is False and type(flags.n_splits) is int
    for gpu_only, value in (("pdl", True), ("acquire_loads", True), ("poll_sleep_ns", 128), ("wait_prefetch", 8),
                            ("attn_prefetch", True), ("pdl_weights", 1), ("pdl_weights_o", 2),
                            ("looped_acquire_loads", True), ("looped_pdl", True)):
        with pytest.raises(ValueError, match=f"{gpu_only}={value} needs the compiled kernels"):
            ops.make_plan(CFG, 3, SLOTS, torch.float32, cpu, **{gpu_only: value})
    for name in ("pdl_weights", "pdl_weights_o"):
        with pytest.raises(ValueError, match=f"{name} must be 0, 1 or 2"):
            ops._tuned(ops.make_plan(CFG, 1, SLOTS, torch.float32, cpu), {name: 3, "pdl": True})
    # ROW_PREFETCH of the per-layer launches: the tile's own PDL wait only for batch-1 row tiles with PDL
    one = dataclasses.replace(ops.make_plan(CFG, 1, SLOTS, torch.float32, cpu), pdl=True, pdl_weights=1)
    assert (one.row_tiles("down"), dataclasses.replace(one, pdl_weights=0).row_tiles("down"),
            dataclasses.replace(one, row_prefetch=False).row_tiles("down"),
            dataclasses.replace(one, block_b=4).row_tiles("down"),
            dataclasses.replace(one, pdl=False).row_tiles("down")) == (2, 1, 0, 1, 1)
    # a plan without PDL keeps the (then unused) defaults and builds
    assert ops._tuned(dataclasses.replace(one, pdl_weights_o=2), {"pdl": False}).row_tiles("o_proj") == 1
    two_o = dataclasses.replace(one, pdl_weights_o=2)
    assert (two_o.row_tiles("o_proj"), two_o.row_tiles("gate_up"), dataclasses.replace(
        one, pdl_weights=2).row_tiles("qkv")) == (3, 2, 3)


@pytest.mark.parametrize("batch, dtype", [(1, torch.bfloat16), (3, torch.float32)])
def test_embed_writes_rows_and_zeroes_counts(batch, dtype, gen):
    """x ← the tokens' embedding rows in float32 (poisoned first), every count zeroed, one launch."""
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(batch, dtype, gen)
    tokens = torch.tensor([96, 0, 41][:batch]).to(buf.x.device)
    buf.x.fill_(float("nan"))
    buf.counter.fill_(7)
    ops.embed(wk, tokens, buf)
    assert torch.equal(buf.x.cpu(), wk.embed.cpu()[tokens.cpu()].float())
    assert int(buf.counter.abs().sum()) == 0


def test_greedy_tokens_pick_the_first_best_tile(gen):
    """The token of each row is the winner of its first tile with the largest score (ties: the lower
    tile, as torch.argmax), over 13 tiles (not a power of two); a new tensor per call."""
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(3, torch.float32, gen)
    tiles = 13
    best = torch.randn(3, tiles, generator=gen)
    best[1, 2] = best[1, tiles - 1] = best[1].max() + 1.0  # a tie: tile 2 wins
    buf.best = best.to(buf.x.device)
    buf.best_idx = torch.randint(0, cfg.vocab_size, (3, tiles), generator=gen, dtype=torch.int32).to(buf.x.device)
    first = ops.greedy_tokens(buf)
    expected = buf.best_idx.cpu().gather(1, best.argmax(1, keepdim=True)).squeeze(1).long()
    assert first.dtype == torch.int64 and torch.equal(first.cpu(), expected)
    assert ops.greedy_tokens(buf).data_ptr() != first.data_ptr()


def test_deferred_down_sums_reach_the_next_readers(gen):
    """``defer_down``: W_down (2 K parts, not the last layer) leaves x alone and adds its update into
    ``fix`` (int64 multiples of 2^-32); the next Q/K/V tiles read x + fix; W_o adds fix and its own
    update into x and zeroes fix.  Against the float64 oracle of each step."""
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(1, torch.float32, gen, split_k=2,
                                                            tuning={"defer_down": True})
    unit = 2.0**-32
    buf.h.copy_(torch.randn(buf.h.shape, generator=gen))
    x0 = buf.x.clone()
    ops.down_proj(wk, cfg, 0, buf, plan)
    assert torch.equal(buf.x, x0), "a deferred W_down does not write x"
    x1 = ref.down_step(w64, 0, buf.h.cpu().double(), x0.cpu().double())
    assert_close(x0.cpu().double() + buf.fix.cpu().double() * unit - x0.cpu().double(), x1 - x0.cpu().double(),
                 torch.float32, name="deferred down update")
    assert int(buf.proj_sem.abs().sum()) == 0, "no count is taken"
    # Q/K/V of the next layer see x + fix
    inv_freq = cfg.rope_inv_freq().to(buf.x.device)
    buf.q.fill_(poison_value(torch.float32))
    ops.qkv_rope(wk, cfg, 1, cache, buf, plan, inv_freq)
    q, _, _ = ref.qkv_step(w64, cfg, 1, x1[:, None], (slot - kv_start)[:, None], cfg.rope_inv_freq())
    assert_close(buf.q.cpu(), q[:, 0].float(), torch.float32, name="q from x + fix")
    # W_o adds the deferred sums and its own update, and zeroes them
    buf.attn.copy_(torch.randn(buf.attn.shape, generator=gen))
    ops.o_proj(wk, cfg, 1, buf, plan)
    x2 = ref.o_proj_step(w64, 1, buf.attn.cpu().double().reshape(1, -1), x1)
    assert_close(buf.x.cpu().double() - x0.cpu().double(), x2 - x0.cpu().double(), torch.float32, name="x after W_o")
    assert int(buf.fix.abs().sum()) == 0
    # the last layer's W_down merges into x as without defer_down
    x_before = buf.x.clone()
    ops.down_proj(wk, cfg, cfg.num_hidden_layers - 1, buf, plan)
    assert int(buf.fix.abs().sum()) == 0
    x3 = ref.down_step(w64, cfg.num_hidden_layers - 1, buf.h.cpu().double(), x_before.cpu().double())
    assert_close(buf.x.cpu() - x_before.cpu(), (x3 - x_before.cpu().double()).float(), torch.float32,
                 name="last down update")
    with pytest.raises(ValueError, match="defer_down needs"):
        ops.make_plan(cfg, 3, SLOTS, torch.float32, torch.device("cpu"), defer_down=True)
    # a default defer_down gives way to tuning that leaves no room for it (the batch-1 GPU default)
    assert not ops._tuned(plan, {"row_prefetch": False}).defer_down


def test_deferred_down_sums_change_a_step_by_rounding_only(gen):
    """A whole step (both layers, per-layer path) with ``defer_down`` against the default plan: the same
    logits but for float32 rounding (the deferred sums are exact where the merge adds in float32), the
    same bits on a repeat, and the deferred sums zero at the end."""
    device = torch.device(test_device())
    w = random_weights(CFG, dtype=torch.float32, generator=gen, std=0.1).to(device=device)
    shape = ref.KVCache.empty(CFG, 1, SLOTS, dtype=torch.float32, device="cpu").k.shape
    tokens, state = torch.tensor([5], device=device), torch.randn(2, *shape, generator=gen).to(device)
    logits = []
    for tuning in ({}, {"defer_down": True}, {"defer_down": True}):
        plan = ops.make_plan(CFG, 1, SLOTS, torch.float32, device, split_k=2, **tuning)
        buf = ops.DecodeBuffers.allocate(CFG, plan, torch.float32, device)
        cache = ref.KVCache(state[0].clone(), state[1].clone())
        buf.slot.fill_(13)
        ops.fused_step(w, CFG, cache, buf, plan, CFG.rope_inv_freq().to(device), tokens, looped=False,
                       write_logits=True)
        assert int(buf.fix.abs().sum()) == 0
        logits.append(buf.logits.clone())
    assert_close(logits[1].cpu(), logits[0].cpu(), torch.float32, name="defer_down logits")
    assert torch.equal(logits[1], logits[2])


@pytest.mark.parametrize("scale", [1e4, 1e-6])
def test_decode_attention_is_stable_for_huge_and_tiny_scores(scale, gen):
    """Issue 8 numerics: scores of ~1e4 (exp overflows without the running max) and ~1e-6 (uniform weights)."""
    cfg, w64, wk, plan, buf, cache, slot, kv_start = _setup(3, torch.float32, gen)
    buf.q.copy_(torch.randn(buf.q.shape, generator=gen) * scale)
    ops.decode_attention(cfg, LAYER, cache, buf, plan)
    assert bool(torch.isfinite(buf.attn).all())
    expected = ref.attention_step(buf.q.cpu().double()[:, None], cache.k[LAYER].cpu().double(),
                                  cache.v[LAYER].cpu().double(), torch.tensor([slot]), kv_start)
    assert_close(buf.attn.cpu().reshape(3, -1), expected[:, 0], torch.float32, name="attention")


def test_batch1_gpu_defaults_follow_their_reasons(monkeypatch):
    """The batch-1 GPU plan (computed here for a 132-SM H200 without one): Llama-3.2-1B's Q/K/V +
    attention (264 programs) and W_o (256) launches have <= 2 tiles per SM and get the wider chunks,
    gate/up tiles the narrower ones (8 programs per SM); Llama-3.1-8B's Q/K/V, W_o and W_down keep
    block_k (H200 plan_sweep, sessions 5 and 6: llmfuse/JOURNAL.md); 1B's W_down defers its sums
    (session 7).
    Both get PDL with the attention tiles' slots prefetched and the first weight chunk (W_o: two)
    loaded before each tile's wait; batch 8 none of it, but wider Q/K/V tiles."""
    from fusecore.device import DeviceFacts

    def llama(**shape):
        return LlamaConfig(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, **shape)

    llama_1b = llama(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64)
    llama_8b = llama(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128)
    h200 = DeviceFacts("NVIDIA H200", "cuda", 132, 60 << 20, 227 << 10, (9, 0))
    monkeypatch.setattr(ops, "device_facts", lambda device: h200)
    cuda = torch.device("cuda")
    small = ops.make_plan(llama_1b, 1, 520, torch.bfloat16, cuda)
    assert (small.k_chunk("qkv"), small.k_chunk("o_proj"), small.k_chunk("gate_up"), small.k_chunk("down")) == (
        512, 1024, 128, small.block_k)
    large = ops.make_plan(llama_8b, 1, 520, torch.bfloat16, cuda)
    # 8B: gate/up in 128-column chunks at 8 per SM although its 1792 tiles take two waves (session 6)
    assert (large.k_chunk("qkv"), large.k_chunk("o_proj"), large.k_chunk("gate_up"), large.k_chunk("down")) == (
        large.block_k, large.block_k, 128, large.block_k)
    # W_down's parts add into the deferred sums where its tiles fit one wave at 8 per SM (1B: 1024, 8B: 2048)
    assert (small.tiles(llama_1b)["down"], small.defer_down, large.defer_down) == (1024, True, False)
    # attention splits preloaded where the fused launch is one wave of one-block splits (1B: 192 + 72
    # programs of 64 slots; 8B: 384 + 72, two waves) (session 54)
    assert (small.attn_preload, small.split_len, small.block_s, large.attn_preload) == (True, 64, 64, False)
    # a default that other tuning leaves no room for gives way
    assert not ops.make_plan(llama_1b, 1, 520, torch.bfloat16, cuda, fuse_attention=False).attn_preload
    assert not ops.make_plan(llama_1b, 1, 520, torch.bfloat16, cuda, n_splits=4).attn_preload
    for plan in (small, large):
        assert plan.pdl and plan.attn_prefetch and plan.wait_prefetch == 0 and plan.fuse_attention
        assert plan.pdl_weights == 1 and plan.pdl_weights_o == 2
        assert plan.acquire_loads and plan.block_v == 16 and plan.block_n_o == 0  # session 38
        assert (plan.row_tiles("qkv"), plan.row_tiles("o_proj"), plan.row_tiles("down")) == (2, 3, 2)
    batch8 = ops.make_plan(llama_1b, 8, 520, torch.bfloat16, cuda)
    assert not batch8.pdl and not batch8.attn_prefetch and not batch8.pdl_weights and not batch8.acquire_loads
    assert {batch8.k_chunk(name) for name in ("qkv", "o_proj", "gate_up", "down")} == {batch8.block_k}
    # batch 8 (16-row tensor-core tiles): Q/K/V tiles of 2 · 32 rows in K parts of 512 columns, every
    # x chunk loaded twice (session 5, round 2); batch 64 (64-row tiles) neither
    assert (batch8.block_p, batch8.qkv_split, batch8.tiles(llama_1b)["qkv"]) == (32, 4, 192)
    assert ops.make_plan(llama_8b, 8, 520, torch.bfloat16, cuda).qkv_split == 8
    assert batch8.square_sum_load == batch8.square_sum_load_qkv == 1
    batch64 = ops.make_plan(llama_1b, 64, 520, torch.bfloat16, cuda)
    assert (batch64.block_p, batch64.qkv_split, batch64.square_sum_load, batch64.square_sum_load_qkv) == (
        16, 4, 0, 0)


@pytest.mark.skipif(fusecore.COMPILED, reason="the GPU runs the real wait (test_looped.py)")
def test_weights_loaded_before_the_wait_change_no_value(monkeypatch, gen):
    """pdl_weights 1 and 2 (ROW_PREFETCH 2 and 3: the first one or two weight chunks issued before the
    tile's own PDL wait, then two chunks in flight) through a whole per-layer step with K in three
    chunks: the logits equal the plain pipelined tiles' bit for bit (same products, same order).
    The interpreter has no ``griddepcontrol``: the wait is replaced by nothing here."""
    from llmfuse.kernels import (
        decode_attention,
        embed,
        gate_up,
        lm_head,
        matvec,
        qkv_attention,
        qkv_rope,
        residual_proj,
    )

    @jit
    def no_wait(USE_PDL: tl.constexpr):
        pass

    for module in (decode_attention, embed, gate_up, lm_head, matvec, qkv_attention, qkv_rope, residual_proj):
        monkeypatch.setattr(module, "after_previous_kernel", no_wait)
    cpu = torch.device("cpu")
    w = random_weights(CFG, dtype=torch.float32, generator=gen, std=0.1)
    plain = ops.make_plan(CFG, 1, SLOTS, torch.float32, cpu, block_k=16)
    shape = ref.KVCache.empty(CFG, 1, SLOTS, dtype=torch.float32, device=cpu).k.shape
    tokens, state = torch.tensor([5]), torch.randn(2, *shape, generator=gen)
    logits = []
    for tuning in ({}, {"pdl": True, "pdl_weights": 1}, {"pdl": True, "pdl_weights": 1, "pdl_weights_o": 2},
                   {"pdl": True, "pdl_weights": 2}, {"pdl": True, "pdl_weights": 1, "fuse_attention": True}):
        plan = dataclasses.replace(plain, **tuning)
        buf = ops.DecodeBuffers.allocate(CFG, plan, torch.float32, cpu)
        cache = ref.KVCache(state[0].clone(), state[1].clone())
        buf.slot.fill_(13)
        buf.logits.fill_(float("nan"))
        ops.fused_step(w, CFG, cache, buf, plan, CFG.rope_inv_freq(), tokens, looped=False, write_logits=True)
        logits.append(buf.logits.clone())
    assert plain.k_chunk("o_proj") * 2 < CFG.num_attention_heads * CFG.head_dim  # three or more chunks
    for tuning_logits in logits[1:]:
        assert torch.equal(tuning_logits, logits[0])
