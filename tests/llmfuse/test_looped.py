"""The looped persistent kernel against the Python interpreter of its schedule, stopped after
every stage; on the GPU, the full persistent grid and CUDA-graph capture of both paths."""

import dataclasses

import pytest
import torch

import fusecore
from fusecore.testing import STRICT_FLOAT32, assert_close, rel_error, test_device
from llmfuse import ops
from llmfuse import reference as ref
from llmfuse.config import LlamaConfig
from llmfuse.kernels.looped import STAGES_PER_LAYER
from llmfuse.looped import interpret_schedule, stage_name
from llmfuse.weights import random_weights

CFG = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5)


def _state(cfg, w, batch, slots, dtype, gen, device, looped_programs=None, n_splits=3, split_k=None, **tuning):
    """Plan, buffers (x embedded), a cache prefilled up to slot ``slots - 3`` and the step's tokens."""
    plan = ops.make_plan(cfg, batch, slots, dtype, torch.device(device), n_splits=n_splits,
                         looped_programs=looped_programs, split_k=split_k, **tuning)
    buf = ops.DecodeBuffers.allocate(cfg, plan, dtype, torch.device(device))
    cache = ref.KVCache.empty(cfg, batch, slots, dtype=dtype, device=device)
    prompt = torch.randint(0, cfg.vocab_size, (batch, slots - 3), generator=gen).to(device)
    kv_start = ((torch.arange(batch) * 3) % 7).to(device)  # rows left-padded by 0..6 slots
    ref.forward(w, cfg, prompt, cache, 0, kv_start)
    buf.kv_start.copy_(kv_start)
    buf.slot.fill_(slots - 3)
    tokens = torch.randint(0, cfg.vocab_size, (batch,), generator=gen).to(device)
    ops.embed(w, tokens, buf)
    return plan, buf, cache, tokens


def _snapshot(buf, cache):
    return {"x": buf.x, "q": buf.q, "part": buf.part, "lse": buf.lse, "attn": buf.attn, "h": buf.h,
            "logits": buf.logits,
            "k_cache": cache.k, "v_cache": cache.v}


# attention blocks and merge rounds smaller than the plan's (several per tile), and the dataflow
# schedule's done counts a 128-byte line apart (spread_counts)
SMALL_BLOCKS = {"block_s": 16, "merge_splits": 2}


# row-sum tiles; tensor-core tiles with split K (the Q/K/V and gate/up K splits: test_kernels.py,
# and the GPU tests below, whose default plans split them); the persistent kernel and the
# dependency-ordered schedule (dataflow)
@pytest.mark.parametrize("batch, split_k, tuning", [
    (1, 1, {}), (9, 2, {}), (1, 1, SMALL_BLOCKS), (9, 2, {**SMALL_BLOCKS, "dataflow": True, "spread_counts": True}),
    (1, 1, {"dataflow": True})])
def test_looped_kernel_matches_interpreter_after_every_stage(batch, split_k, tuning, gen):
    device = test_device()
    w = random_weights(CFG, dtype=torch.float32, device=device, generator=gen, std=0.1)
    plan, buf0, cache0, _ = _state(CFG, w, batch, 19, torch.float32, gen, device, looped_programs=1,
                                   split_k=split_k, **tuning)
    inv_freq = CFG.rope_inv_freq().to(device)
    total = STAGES_PER_LAYER * CFG.num_hidden_layers + 1
    for stop in range(total + 1):
        kbuf = ops.DecodeBuffers(**{k: v.clone() for k, v in buf0.__dict__.items()})
        ibuf = ops.DecodeBuffers(**{k: v.clone() for k, v in buf0.__dict__.items()})
        kcache, icache = (ref.KVCache(cache0.k.clone(), cache0.v.clone()) for _ in range(2))
        ops.looped_decode(w, CFG, kcache, kbuf, plan, inv_freq, write_logits=True, stop_stage=stop)
        interpret_schedule(w, CFG, icache, ibuf, plan, inv_freq, stop_stage=stop)
        where = "nothing run" if stop == 0 else f"after {stage_name(stop - 1, CFG.num_hidden_layers)}"
        for name, got in _snapshot(kbuf, kcache).items():
            assert_close(got, _snapshot(ibuf, icache)[name], torch.float32, tol=1e-4, name=f"{name} {where}")
    assert torch.equal(kbuf.best_idx, ibuf.best_idx)
    assert torch.equal(ops.greedy_tokens(kbuf), ibuf.logits.argmax(-1))
    assert not ops.looped_timed_out(kbuf)


DEEP_CFG = LlamaConfig(**{**CFG.__dict__, "num_hidden_layers": 6})


# tensor-core tiles, without and with split K; the looped path as the persistent kernel and as
# one-tile programs ordered by dependency (dataflow)
@pytest.mark.parametrize("batch, split_k, dataflow", [(3, 1, False), (9, 2, False), (1, 1, True), (5, 2, True)])
def test_looped_equals_per_layer_over_many_layers(batch, split_k, dataflow, gen):
    """Both paths run the same tile functions on the same values in the same order, so under the
    interpreter they agree bit for bit after every layer of a deep model at batch > 1.  Compiled,
    each kernel gets its own code and may order float32 sums differently: then they may differ
    by what independent bf16 roundings explain (sqrt(2) times ops.rounding_tolerance)."""
    device = test_device()
    dtype = torch.bfloat16
    w = random_weights(DEEP_CFG, dtype=dtype, device=device, generator=gen, std=0.1)
    plan, buf0, cache0, tokens = _state(DEEP_CFG, w, batch, 19, dtype, gen, device, split_k=split_k,
                                        dataflow=dataflow)
    inv_freq = DEEP_CFG.rope_inv_freq().to(device)
    results = {}
    for looped in (False, True):
        buf = ops.DecodeBuffers(**{k: v.clone() for k, v in buf0.__dict__.items()})
        buf.logits.fill_(float("nan"))
        cache = ref.KVCache(cache0.k.clone(), cache0.v.clone())
        ops.fused_step(w, DEEP_CFG, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
        assert not ops.looped_timed_out(buf)
        results[looped] = {"logits": buf.logits, "x": buf.x, "h": buf.h, "k_cache": cache.k, "v_cache": cache.v}
    if fusecore.COMPILED:
        tol = 2**0.5 * ops.rounding_tolerance(DEEP_CFG, plan, dtype)
        assert_close(results[True]["logits"], results[False]["logits"], tol=tol, name="looped vs per-layer")
    else:
        for name, per_layer in results[False].items():
            assert torch.equal(results[True][name], per_layer), f"looped {name} differs from per-layer"


@pytest.mark.skipif(fusecore.COMPILED, reason="needs the interpreter's one-program-after-another order")
def test_barrier_that_cannot_complete_raises_the_timeout_flag(gen, monkeypatch):
    """Two programs under the interpreter run one after another: the first can never see the
    second arrive.  Instead of hanging, each wait gives up after BARRIER_MAX_POLLS reads and the
    launch reports it."""
    device = test_device()
    w = random_weights(CFG, dtype=torch.float32, device=device, generator=gen)
    plan, buf, cache, _ = _state(CFG, w, 1, 8, torch.float32, gen, device, looped_programs=2)
    monkeypatch.setattr(ops, "BARRIER_MAX_POLLS", 3)
    assert not ops.looped_timed_out(buf)
    ops.looped_decode(w, CFG, cache, buf, plan, CFG.rope_inv_freq().to(device), True, stop_stage=2)
    assert ops.looped_timed_out(buf)


def test_dataflow_schedule_is_chosen_at_any_batch_and_by_default_up_to_batch_8_on_the_gpu():
    for batch in (1, 8, 9):
        plan = ops.make_plan(CFG, batch, 8, torch.float32, torch.device(test_device()), dataflow=True)
        assert plan.dataflow
        default = ops.make_plan(CFG, batch, 8, torch.float32, torch.device(test_device()))
        assert default.dataflow == (fusecore.COMPILED and batch <= 8)
        assert default.poll_sleep_ns == (1024 if fusecore.COMPILED and batch == 1 else 0)
        # session 9: the dataflow schedule's counts a line apart, acquire-load polls, PDL around its launch
        for field in ("spread_counts", "looped_acquire_loads", "looped_pdl"):
            assert getattr(default, field) == (fusecore.COMPILED and batch <= 8), field
        # acquire-load polls in the per-layer fused Q/K/V + attention launch at batch 1 (session 38)
        assert default.acquire_loads == (fusecore.COMPILED and batch == 1)


def test_looped_rejects_bad_stop_stage(gen):
    device = test_device()
    w = random_weights(CFG, dtype=torch.float32, device=device, generator=gen)
    plan, buf, cache, _ = _state(CFG, w, 1, 8, torch.float32, gen, device)
    with pytest.raises(ValueError, match="stop_stage"):
        ops.looped_decode(w, CFG, cache, buf, plan, CFG.rope_inv_freq(), True, stop_stage=99)


GPU_CFG = LlamaConfig(vocab_size=1003, hidden_size=256, intermediate_size=688, num_hidden_layers=3,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 5, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_full_grid_looped_equals_per_layer_and_reference(batch, dtype, gen):
    """The full persistent grid (all SMs, real barriers) against per-layer launches and the reference.

    Both paths run the same tile functions, but each kernel is compiled on its own, so the
    compiler may lay reductions out differently: sums in another order.  In float32 that
    moves the logits by ~1e-7 relative; in bfloat16 a last-bit change of an fp32 sum can
    flip the rounding of a bf16 activation, hence the bound of ops.rounding_tolerance.
    A race between programs would instead make repeated
    launches disagree with each other, which is checked bit for bit.
    """
    device = test_device()
    w = random_weights(GPU_CFG, dtype=dtype, device=device, generator=torch.Generator(device).manual_seed(0))
    plan, buf, cache, tokens = _state(GPU_CFG, w, batch, 300, dtype, gen, device, n_splits=None, dataflow=False)
    inv_freq = GPU_CFG.rope_inv_freq().to(device)
    scratch = ops.DecodeBuffers(**{k: v.clone() for k, v in buf.__dict__.items()})
    programs = ops.looped_decode(w, GPU_CFG, ref.KVCache(cache.k.clone(), cache.v.clone()), scratch, plan, inv_freq,
                                 write_logits=True)
    assert programs > 1, "the GPU runs the full persistent grid"
    lbuf = ops.DecodeBuffers(**{k: v.clone() for k, v in buf.__dict__.items()})
    lcache = ref.KVCache(cache.k.clone(), cache.v.clone())
    ops.fused_step(w, GPU_CFG, cache, buf, plan, inv_freq, tokens, looped=False, write_logits=True)
    runs = []
    for _ in range(5):  # repeated launches also reuse the barrier counter and the attention semaphores
        ops.fused_step(w, GPU_CFG, lcache, lbuf, plan, inv_freq, tokens, looped=True, write_logits=True)
        runs.append(lbuf.logits.clone())
    for i, again in enumerate(runs[1:], 1):
        assert torch.equal(again, runs[0]), f"looped launch {i} differs from launch 0: a race"
    assert not ops.looped_timed_out(lbuf)
    tol = STRICT_FLOAT32 if dtype == torch.float32 else 2**0.5 * ops.rounding_tolerance(GPU_CFG, plan, dtype)
    assert_close(lbuf.logits, buf.logits, torch.float32, tol=tol, name="looped vs per-layer logits")
    rcache = ref.KVCache(cache.k.clone(), cache.v.clone())
    expected = ref.forward(w.to(dtype=torch.float32), GPU_CFG, tokens[:, None], rcache, 297,
                           buf.kv_start)[:, 0]
    assert_close(buf.logits, expected, dtype, name="fused vs reference logits")


def _copy(buf, cache):
    return ops.DecodeBuffers(**{k: v.clone() for k, v in buf.__dict__.items()}), ref.KVCache(cache.k.clone(),
                                                                                           cache.v.clone())


def _rows_over(got: torch.Tensor, want: torch.Tensor, tol: float) -> tuple[float, list[int]]:
    """Relative error over all of a [B, ...] tensor, and the rows b whose own relative error exceeds ``tol``."""
    rows = [b for b in range(got.shape[0]) if rel_error(got[b], want[b]) > tol]
    return rel_error(got, want), rows


def _first_divergence(cfg, w, plan, buf0, cache0, tokens, inv_freq, tol) -> str:
    """The first stage after which the dataflow schedule's buffers differ from the persistent kernel's
    (the looped schedule that passes every GPU check) by more than ``tol``, and in which rows."""
    persistent = dataclasses.replace(plan, dataflow=False)
    total = STAGES_PER_LAYER * cfg.num_hidden_layers + 1
    for stop in range(1, total + 1):
        states = []
        for schedule in (plan, persistent):
            buf, cache = _copy(buf0, cache0)
            ops.embed(w, tokens, buf)
            ops.looped_decode(w, cfg, cache, buf, schedule, inv_freq, write_logits=True, stop_stage=stop)
            layer = min(stop - 1, total - 2) // STAGES_PER_LAYER
            states.append({"x": buf.x, "q": buf.q, "attn": buf.attn, "h": buf.h.float(), "logits": buf.logits,
                           "k_cache": cache.k[layer].float(), "v_cache": cache.v[layer].float()})
        wrong = {name: _rows_over(got, states[1][name], tol) for name, got in states[0].items()}
        wrong = {name: (err, rows) for name, (err, rows) in wrong.items() if err > tol}
        if wrong:
            found = ", ".join(f"{name} rel. error {err:.2e} in rows {rows}" for name, (err, rows) in wrong.items())
            return f"first differs from the persistent kernel after {stage_name(stop - 1, cfg.num_hidden_layers)}: " \
                   f"{found}"
    return "no stage differs from the persistent kernel beyond the tolerance"


def _check_dataflow_on_gpu(cfg, batch, slots, n_splits, split_k, gen):
    """Three launches of the dataflow schedule: bitwise equal, no wait timed out, logits within the
    rounding bound of the per-layer launches.  A failure says which of these broke and where the
    dataflow schedule first departs from the persistent one (race: launches differ; timeouts: a
    wait gave up, i.e. a program waited for one not yet dispatched; neither: deterministic)."""
    device = test_device()
    dtype = torch.bfloat16
    w = random_weights(cfg, dtype=dtype, device=device, generator=torch.Generator(device).manual_seed(0), std=0.1)
    plan, buf0, cache0, tokens = _state(cfg, w, batch, slots, dtype, gen, device, n_splits=n_splits, split_k=split_k,
                                        dataflow=True)
    inv_freq = cfg.rope_inv_freq().to(device)
    buf, cache = _copy(buf0, cache0)
    ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=False, write_logits=True)
    dbuf, dcache = _copy(buf0, cache0)
    runs = []
    for _ in range(3):  # repeated launches also reuse the counts and every last-finisher semaphore
        ops.fused_step(w, cfg, dcache, dbuf, plan, inv_freq, tokens, looped=True, write_logits=True)
        runs.append(dbuf.logits.clone())
    tol = 2**0.5 * ops.rounding_tolerance(cfg, plan, dtype)
    timed_out = ops.looped_timed_out(dbuf)
    differing = [i for i, again in enumerate(runs[1:], 1) if not torch.equal(again, runs[0])]
    err, rows = _rows_over(runs[0], buf.logits, tol)
    if timed_out or differing or err > tol:
        where = _first_divergence(cfg, w, plan, buf0, cache0, tokens, inv_freq, tol)
        pytest.fail(f"dataflow, batch {batch}: timed out {timed_out}; launches "
                    f"{differing} differ from launch 0; logits vs per-layer rel. error {err:.3e} (tolerance "
                    f"{tol:.1e}) in rows {rows}; {where}")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 5, 8, 9])  # row sums; tensor-core tiles, Q/K/V and gate/up split along K
def test_gpu_dataflow_kernel_equals_per_layer_and_is_reproducible(batch, gen):
    """One-tile programs waiting on counts of lower-index programs (plan.dataflow, kernels/looped.py) with
    the real grid (thousands of programs, not all resident), the plan's own splits."""
    _check_dataflow_on_gpu(GPU_CFG, batch, 300, None, None, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [5, 9])
def test_gpu_dataflow_on_the_configuration_that_failed(batch, gen):
    """The 6-layer test configuration whose logits were wrong on the H200 at batch 9 (session 3's final
    run, 0.14) and 5 (its rerun, 0.32): K split 2, one attention split, more programs than fit at once."""
    _check_dataflow_on_gpu(DEEP_CFG, batch, 19, 3, 2, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("looped", [False, True])
@pytest.mark.parametrize("batch", [1, 5, 64])  # row sums, tensor-core tiles (compiles shared with above)
def test_gpu_default_plan_is_bitwise_reproducible(looped, batch, gen):
    """Issue 8: the same step twice gives identical logits (no order-dependent atomics anywhere)."""
    device = test_device()
    w = random_weights(GPU_CFG, dtype=torch.bfloat16, device=device, generator=torch.Generator(device).manual_seed(2))
    plan, buf, cache, tokens = _state(GPU_CFG, w, batch, 200, torch.bfloat16, gen, device, n_splits=None)
    inv_freq = GPU_CFG.rope_inv_freq().to(device)
    logits = []
    for _ in range(2):
        ops.fused_step(w, GPU_CFG, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
        logits.append(buf.logits.clone())
    assert torch.equal(logits[0], logits[1])


@pytest.mark.gpu
@pytest.mark.parametrize("looped", [False, True])
def test_gpu_decode_step_is_cuda_graph_capturable(looped, gen):
    device = test_device()
    w = random_weights(GPU_CFG, dtype=torch.bfloat16, device=device, generator=torch.Generator(device).manual_seed(1))
    plan, buf, cache, tokens = _state(GPU_CFG, w, 4, 64, torch.bfloat16, gen, device, n_splits=None)
    inv_freq = GPU_CFG.rope_inv_freq().to(device)
    eager = ops.fused_step(w, GPU_CFG, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
    eager_logits = buf.logits.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.fused_step(w, GPU_CFG, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.fused_step(w, GPU_CFG, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
    buf.logits.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    assert torch.equal(buf.logits, eager_logits)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 5])  # row sums; tensor-core tiles with Q/K/V and gate/up split along K
@pytest.mark.parametrize("looped, tuning", [
    (False, {"pdl": True}),
    (False, {"pdl": True, "wait_prefetch": 32, "attn_prefetch": True}),
    (False, {"pdl": True, "pdl_weights": 1, "fuse_attention": True, "attn_prefetch": True}),
    (False, {"pdl": True, "pdl_weights": 1, "fuse_attention": False}),
    (False, {"pdl": True, "pdl_weights": 2, "pdl_weights_o": 2, "fuse_attention": True}),
    (False, {"pdl": True, "pdl_weights": 1, "pdl_weights_o": 2, "fuse_attention": True, "defer_down": True}),
    (False, {"fuse_attention": True, "attn_prefetch": True}),
    (True, {"dataflow": True, "wait_prefetch": 32, "attn_prefetch": True}),
])
def test_gpu_prefetch_before_wait_changes_no_value(batch, looped, tuning, gen):
    """Programmatic dependent launch with weights and cache slots prefetched into L2 before each wait
    (fusecore/launch_order.py), batch-1 row tiles loading their first weight chunk before their own
    wait (pdl_weights), and the dataflow schedule's prefetch before its waits: the logits equal
    the same path's without them bit for bit (the prefetch moves no value and the tile code is the
    same), eager and replayed from a CUDA graph (the graph keeps the programmatic edges; each kernel
    still waits before it reads or writes), and repeated steps agree (no race).  ``defer_down`` (batch-1
    row tiles only) against itself without PDL: W_o reads x and the deferred sums before its wait."""
    if tuning.get("defer_down") and batch > 1:
        pytest.skip("defer_down is for batch-1 row tiles")
    device = test_device()
    w = random_weights(GPU_CFG, dtype=torch.bfloat16, device=device, generator=torch.Generator(device).manual_seed(3))
    # the same path without PDL or prefetch (batch 1 on the GPU has both by default)
    base = {"pdl": False, "pdl_weights": False, "wait_prefetch": 0, "attn_prefetch": False,
            **{k: v for k, v in tuning.items() if k in ("dataflow", "fuse_attention", "defer_down")}}
    plain, buf0, cache0, tokens = _state(GPU_CFG, w, batch, 300, torch.bfloat16, gen, device, n_splits=None, **base)
    plan = dataclasses.replace(plain, **tuning)
    inv_freq = GPU_CFG.rope_inv_freq().to(device)
    buf, cache = _copy(buf0, cache0)
    ops.fused_step(w, GPU_CFG, cache, buf, plain, inv_freq, tokens, looped=looped, write_logits=True)
    expected = buf.logits.clone()
    buf, cache = _copy(buf0, cache0)
    runs = []
    for _ in range(3):
        ops.fused_step(w, GPU_CFG, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
        runs.append(buf.logits.clone())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.fused_step(w, GPU_CFG, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
    for _ in range(3):
        buf.logits.fill_(float("nan"))
        graph.replay()
        runs.append(buf.logits.clone())
    assert not ops.looped_timed_out(buf)
    for i, logits in enumerate(runs):
        assert torch.equal(logits, expected), f"run {i} (3+: CUDA graph replays): rel. error " \
                                              f"{rel_error(logits, expected):.2e} against the plan without prefetch"
