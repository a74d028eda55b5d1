"""llmfuse: ms per decode step (one token per row) of Llama-3.2-1B and Llama-3.1-8B shapes.

Random bf16 weights of the real shapes, batch 1 / 8 / 64, context 512 / 4096 (the cache
holds random keys and values up to the context; the step writes slot ``context``).
Implementations: HF transformers eager (1B, batch 1 and 8, context 512 only: it needs its
own copy of the weights and a dynamic cache), the reference decoder eager, the reference
decoder under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA graphs; 1B,
batch 1 and 8, context 512 only — the TARGETS.md reference points — because each compile
of the unrolled decoder takes tens of seconds of the ~5 minute budget), the fused
per-layer kernels under a CUDA graph and the looped kernel under a CUDA graph (the plan's
looped schedule: dependency-ordered one-tile programs up to batch 8, the persistent grid above).
Floor: the weight bytes plus the KV-cache bytes one step must read.  Quick mode: a tiny
config through the interpreter.
"""

from __future__ import annotations

import torch

from benchmarks.registry import Context, case, plot
from fusecore.device import device_facts
from fusecore.testing import STRICT_FLOAT32
from llmfuse import ops
from llmfuse import reference as ref
from llmfuse.config import LlamaConfig
from llmfuse.weights import LlamaWeights, random_weights


def _llama3(factor: float, **shape) -> LlamaConfig:
    """A Llama 3.x config: 128 256-token vocabulary, 32 query / 8 KV heads, llama3 RoPE scaling."""
    return LlamaConfig(
        vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        max_position_embeddings=131072, **shape,
    )


LLAMA_3_2_1B = _llama3(32.0, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, head_dim=64,
                       tie_word_embeddings=True)
LLAMA_3_1_8B = _llama3(8.0, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
                       tie_word_embeddings=False)
TINY = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                   num_attention_heads=6, num_key_value_heads=2, head_dim=8)

# (model, batch, context) where the slow-to-build baselines run: the TARGETS.md reference points.
COMPILED_AT = {("Llama-3.2-1B", 1, 512), ("Llama-3.2-1B", 8, 512)}
HF_AT = {("Llama-3.2-1B", 1, 512), ("Llama-3.2-1B", 8, 512)}
ORACLE_AT = {(1, 512), (8, 512), (64, 512), (1, 16), (3, 16)}  # (batch, context) checked against float32


def step_bytes(cfg: LlamaConfig, w: LlamaWeights, batch: int, context: int) -> int:
    """Fewest bytes one decode step moves: every weight a step uses, once, plus the K and V of
    context + 1 slots.  An untied embedding table is only gathered (B rows), so it counts B rows
    (TARGETS.md counts the whole 16 GB of the 8B model, a 7% looser floor)."""
    kv = 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * (context + 1) * cfg.head_dim
    size = w.wqkv.element_size()
    unread_embedding = 0 if cfg.tie_word_embeddings else (cfg.vocab_size - batch) * cfg.hidden_size * size
    return w.nbytes() - unread_embedding + kv * size


# Replays of a step, captured in a CUDA graph, before its CUDA-graph timed row (the fused paths and the
# compiled reference).  H200, session 7 (llmfuse/JOURNAL.md, session 7): the first CUDA-graph timing of a
# process (the Llama-3.1-8B step) ran 4.237 / 4.271 / 4.282 ms, every later one 4.12-4.16 (the same
# plan, a new plan, fresh weights), with the SM and memory clocks, power and temperatures steady and no
# throttle reason; a bulk copy of the weights, 2 s idle or 64 eager steps before it changed nothing,
# 64 graph replays did.  The harness warms a CUDA-graph timing with one call and five replays (~25 ms
# of an 8B step); each row should time the steady state of a decode loop.
SETTLE_REPLAYS = 64


def _settle(step, *, replays_itself: bool = False) -> None:
    """Capture ``step`` in a CUDA graph (on a side stream, as the harness does) and replay it
    SETTLE_REPLAYS times; no timing.  ``replays_itself``: ``step`` already replays its own CUDA
    graph (torch.compile's reduce-overhead mode), which cannot run inside another capture: call
    it SETTLE_REPLAYS times instead."""
    if replays_itself:
        for _ in range(SETTLE_REPLAYS):
            step()
        torch.cuda.synchronize()
        return
    with torch.cuda.stream(torch.cuda.Stream()):
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for _ in range(SETTLE_REPLAYS):
            graph.replay()
        torch.cuda.synchronize()


def _tolerances(cfg: LlamaConfig, plan: ops.DecodePlan, dtype: torch.dtype) -> tuple[float, float]:
    """(fused vs float32 reference, looped vs per-layer) relative logits tolerances.

    bf16: the rounding bound of :func:`llmfuse.ops.rounding_tolerance`, and sqrt(2) times it
    between the two fused paths.  They run the same tile functions in the same order (bitwise
    equal under the interpreter, tests/llmfuse/test_looped.py), but each kernel is compiled on
    its own, so float32 sums may come out in another order and a last-bit difference flips the
    rounding of a bf16 activation (which later layers amplify into independent roundings).
    float32 (quick mode, the interpreter): no activation is rounded below float32.
    """
    if dtype == torch.float32:
        return 1e-3, STRICT_FLOAT32
    bound = ops.rounding_tolerance(cfg, plan, dtype)
    return bound, 2**0.5 * bound


def _hf_model(cfg: LlamaConfig, device: torch.device, dtype: torch.dtype):
    import transformers

    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, tie_word_embeddings=cfg.tie_word_embeddings,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    with torch.device(device):
        return transformers.LlamaForCausalLM(hf_cfg).to(dtype).eval()


def _hf_bytes(cfg: LlamaConfig, batch: int, context: int) -> int:
    """Device bytes HF eager needs at a point: bf16 weights, its own KV cache, and prefill's largest
    activations (the MLP's intermediates and one layer's attention inputs; logits of the last token only)."""
    weights = cfg.hidden_size * (cfg.vocab_size * (1 if cfg.tie_word_embeddings else 2)) + cfg.num_hidden_layers * (
        cfg.hidden_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
        + cfg.num_attention_heads * cfg.head_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size)
    cache = 2 * cfg.num_hidden_layers * batch * context * cfg.num_key_value_heads * cfg.head_dim
    prefill = batch * context * (3 * cfg.intermediate_size + 4 * cfg.hidden_size)
    return 2 * (weights + cache + prefill)


def _time_hf(ctx: Context, cfg: LlamaConfig, batch: int, context: int, nbytes: int, params: dict, variant: str):
    need = _hf_bytes(cfg, batch, context)
    torch.cuda.empty_cache()  # what torch's allocator keeps cached (the float32 oracle's weights) is free to HF
    free = torch.cuda.mem_get_info(ctx.device)[0]
    if need > 0.9 * free:
        print(f"[skip] {variant}: HF transformers eager needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
        return
    try:
        model = _hf_model(cfg, ctx.device, torch.bfloat16)
    except ImportError:
        return
    gen = torch.Generator(device=ctx.device).manual_seed(3)
    prompt = torch.randint(0, cfg.vocab_size, (batch, context), device=ctx.device, generator=gen)
    token = torch.randint(0, cfg.vocab_size, (batch, 1), device=ctx.device, generator=gen)
    with torch.no_grad():
        try:
            past = model(prompt, use_cache=True, logits_to_keep=1).past_key_values
        except torch.cuda.OutOfMemoryError:  # the estimate above is an estimate: report, go on
            print(f"[skip] {variant}: HF transformers eager ran out of memory in prefill (~{need / 2**30:.1f} GiB "
                  f"estimated, {free / 2**30:.1f} GiB free)")
            return

        def hf_step():
            model(token, past_key_values=past, use_cache=True)
            past.crop(-1)  # drop the token just appended: every call sees the same context

        ctx.time("HF transformers eager", hf_step, bytes_moved=nbytes, params=params, variant=variant)


@case("llm", "decode", baseline="reference decoder eager")
def decode_case(ctx: Context) -> None:
    """ms per decode step: HF eager, reference eager / compiled, fused per-layer and looped kernels.

    HF eager and the compiled reference are timed at the TARGETS.md points (``HF_AT``,
    ``COMPILED_AT``); the ``llm/baseline_grid_*`` cases time them at every point of the grid."""
    _decode_grid(ctx, every_point=False)


def _grid_case(model: str, tag: str, context: int) -> None:
    """Register ``llm/baseline_grid_{tag}_ctx{context}``: the decode case with HF eager and the
    compiled reference at every batch of one model and context."""

    def run(ctx: Context) -> None:
        _decode_grid(ctx, every_point=True, only=model, only_context=context)

    run.__doc__ = (f"The decode case with HF eager and the compiled reference at batch 1, 8 and 64, {model}, "
                   f"context {context}: the issue's full baseline grid is the four ``llm/baseline_grid_*`` cases. "
                   "Each point compiles the reference anew (a static cache per shape) and builds an HF model, "
                   "so one case takes minutes (one per GPU call); HF eager is skipped, with a message, where "
                   "its weights, cache and prefill do not fit beside ours.")
    case("llm", f"baseline_grid_{tag}_ctx{context}", baseline="reference decoder eager", headline=False)(run)


for _model, _tag in (("Llama-3.2-1B", "1b"), ("Llama-3.1-8B", "8b")):
    for _context in (512, 4096):
        _grid_case(_model, _tag, _context)


def _decode_grid(ctx: Context, every_point: bool, only: str | None = None, only_context: int | None = None) -> None:
    dtype = torch.bfloat16 if ctx.gpu else torch.float32
    if ctx.quick:
        models = [("tiny", TINY, [1, 3], [16])]
    else:
        models = [("Llama-3.2-1B", LLAMA_3_2_1B, [1, 8, 64], [512, 4096]),
                  ("Llama-3.1-8B", LLAMA_3_1_8B, [1, 8, 64], [512, 4096])]
        models = [(name, cfg, batches, [c for c in contexts if only_context in (None, c)])
                  for name, cfg, batches, contexts in models if only in (None, name)]
    for name, cfg, batches, contexts in models:
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        w = random_weights(cfg, dtype=dtype, device=ctx.device, generator=gen)
        inv_freq = cfg.rope_inv_freq().to(ctx.device)
        for context in contexts:
            for batch in batches:
                _decode_variant(ctx, name, cfg, w, inv_freq, batch, context, gen, every_point)
        del w
        if ctx.gpu:
            torch.cuda.empty_cache()


def _decode_variant(ctx: Context, name: str, cfg: LlamaConfig, w: LlamaWeights, inv_freq: torch.Tensor,
                    batch: int, context: int, gen: torch.Generator, every_point: bool = False) -> None:
    slots = context + 8
    variant = f"{name},B={batch},ctx={context}"
    params = {"model": name, "batch": batch, "context": context, "dtype": str(w.dtype)}
    nbytes = step_bytes(cfg, w, batch, context)
    cache = ref.KVCache.empty(cfg, batch, slots, dtype=w.dtype, device=ctx.device)
    cache.k.normal_(0.0, 0.5, generator=gen)
    cache.v.normal_(0.0, 0.5, generator=gen)
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device=ctx.device, generator=gen)
    plan = ops.make_plan(cfg, batch, slots, w.dtype, ctx.device)
    buf = ops.DecodeBuffers.allocate(cfg, plan, w.dtype, ctx.device)
    buf.slot.fill_(context)
    decoder = ref.ReferenceDecoder(w, cfg, batch, slots, cache=cache)
    slot = torch.full((), context, dtype=torch.int64, device=ctx.device)

    with torch.no_grad():
        logits = {}
        for looped in (False, True):
            buf.logits.fill_(float("nan"))
            ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
            logits[looped] = buf.logits.clone()
        if ops.looped_timed_out(buf):
            raise RuntimeError(f"{variant}: the looped kernel timed out at a grid barrier")
        oracle_tol, paths_tol = _tolerances(cfg, plan, w.dtype)
        ctx.check(f"{variant} looped vs per-layer logits", logits[True], logits[False], paths_tol)
        if (batch, context) in ORACLE_AT:
            # Oracle: the reference decoder in float32 on the same (bf16-valued) weights and cache.
            w32 = w.to(dtype=torch.float32)
            cache32 = ref.KVCache(cache.k.float(), cache.v.float())
            oracle = ref.ReferenceDecoder(w32, cfg, batch, slots, cache=cache32).step_at(tokens, slot).float()
            for looped, path in ((False, "per-layer"), (True, "looped")):
                ctx.check(f"{variant} {path} logits vs float32 reference", logits[looped], oracle, oracle_tol)
            del w32, cache32, oracle

        if ctx.gpu and (every_point or (name, batch, context) in HF_AT):
            _time_hf(ctx, cfg, batch, context, nbytes, params, variant)
            torch.cuda.empty_cache()  # the HF model and its cache, gone with _time_hf's frame
        ctx.time("reference decoder eager", lambda: decoder.step_at(tokens, slot), bytes_moved=nbytes,
                 params=params, variant=variant)
        if ctx.gpu and (every_point or (name, batch, context) in COMPILED_AT):
            _time_compiled(ctx, decoder, tokens, slot, nbytes, params, variant)
        # Timed with the logits written (as checked above): one compile per kernel and batch; the
        # B·V·4 bytes of logits are < 2% of the floor's bytes and are not counted in it.
        for looped, label in ((False, "fused per-layer kernels"), (True, "looped kernel")):
            label += " (CUDA graph)" if ctx.gpu else ""

            def step(looped=looped):
                return ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)

            if ctx.gpu:
                _settle(step)
            ctx.time(label, step, bytes_moved=nbytes, cuda_graph=True, params=params, variant=variant)


def _time_compiled(ctx: Context, decoder, tokens: torch.Tensor, slot: torch.Tensor, nbytes: int, params: dict,
                   variant: str) -> None:
    """The reference decoder under torch.compile with CUDA graphs; skipped, with a message, where its
    compiled step runs out of device memory beside our cache and buffers (Llama-3.1-8B at batch 64,
    context 4096 on an 80 GB card: session 10)."""
    compiled = decoder.compiled_step_at()
    try:
        for _ in range(3):  # compile, record the CUDA graph, replay
            compiled(tokens, slot)
    except torch.cuda.OutOfMemoryError as exc:
        print(f"[skip] {variant}: reference decoder torch.compile ran out of device memory "
              f"({str(exc).splitlines()[0][:160]})")
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        return
    _settle(lambda: compiled(tokens, slot), replays_itself=True)  # the steady state, as the fused rows
    ctx.time("reference decoder torch.compile (CUDA graphs)", lambda: compiled(tokens, slot),
             bytes_moved=nbytes, params=params, variant=variant)
    torch._dynamo.reset()  # the compiled step and its graphs go with this frame


def instruction_bytes(cfg: LlamaConfig, w: LlamaWeights, batch: int, context: int) -> dict[str, int]:
    """Fewest bytes each instruction of one layer (and the LM head) must move: its weights, and
    for attention the K and V of ``context + 1`` slots."""
    size = w.wqkv.element_size()
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    kv = 2 * batch * cfg.num_key_value_heads * (context + 1) * d
    return {"qkv_rope": cfg.qkv_rows * h * size, "decode_attention": kv * size,
            "o_proj": h * cfg.num_attention_heads * d * size, "gate_up": 2 * i * h * size, "down_proj": h * i * size,
            "lm_head": cfg.vocab_size * h * size}


# (batch, plan fields other than the default) of the breakdown: the default plans.
BREAKDOWN_PLANS: list[tuple[int, dict[str, int]]] = [(1, {}), (8, {})]


@case("llm", "instruction_breakdown", baseline="whole step, per-layer kernels", headline=False)
def instruction_breakdown_case(ctx: Context) -> None:
    """Each fused instruction alone: its launches for all layers (one CUDA graph), against its floor;
    with the default plan at batch 1 also the looped kernel stopped after 0, 1, ... stages."""
    dtype = torch.bfloat16 if ctx.gpu else torch.float32
    name, cfg, context, variants = ("tiny", TINY, 16, [(1, {}), (3, {})]) if ctx.quick else (
        "Llama-3.2-1B", LLAMA_3_2_1B, 512, BREAKDOWN_PLANS)
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    w = random_weights(cfg, dtype=dtype, device=ctx.device, generator=gen)
    inv_freq = cfg.rope_inv_freq().to(ctx.device)
    slots = context + 8
    layers = range(cfg.num_hidden_layers)
    for batch, tuning in variants:
        variant = f"B={batch}" + "".join(f" {k}={v}" for k, v in tuning.items())
        params = {"model": name, "batch": batch, "context": context, "dtype": str(dtype), "plan": variant}
        cache = ref.KVCache.empty(cfg, batch, slots, dtype=dtype, device=ctx.device)
        cache.k.normal_(0.0, 0.5, generator=gen)
        cache.v.normal_(0.0, 0.5, generator=gen)
        tokens = torch.randint(0, cfg.vocab_size, (batch,), device=ctx.device, generator=gen)
        plan = ops.make_plan(cfg, batch, slots, dtype, ctx.device, **tuning)
        buf = ops.DecodeBuffers.allocate(cfg, plan, dtype, ctx.device)
        buf.slot.fill_(context)
        ops.embed(w, tokens, buf)
        floors = instruction_bytes(cfg, w, batch, context)
        launches = {
            "qkv_rope": lambda: [ops.qkv_rope(w, cfg, layer, cache, buf, plan, inv_freq) for layer in layers],
            "decode_attention": lambda: [ops.decode_attention(cfg, layer, cache, buf, plan) for layer in layers],
            "o_proj": lambda: [ops.o_proj(w, cfg, layer, buf, plan) for layer in layers],
            "gate_up": lambda: [ops.gate_up(w, cfg, layer, buf, plan) for layer in layers],
            "down_proj": lambda: [ops.down_proj(w, cfg, layer, buf, plan) for layer in layers],
            "lm_head": lambda: ops.lm_head(w, cfg, buf, plan, write_logits=True),
        }
        if plan.fuse_attention:
            floors["qkv_attention"] = floors["qkv_rope"] + floors["decode_attention"]
            launches["qkv_attention"] = lambda: [buf.counter.zero_()] + [
                ops.qkv_attention(w, cfg, layer, cache, buf, plan, inv_freq) for layer in layers]
        with torch.no_grad():
            ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=False, write_logits=True)
            expected = ref.ReferenceDecoder(w.to(dtype=torch.float32), cfg, batch, slots,
                                            cache=ref.KVCache(cache.k.float(), cache.v.float()))
            reference = expected.step_at(tokens, torch.full((), context, device=ctx.device)).float()
            ctx.check(f"{variant} per-layer step vs float32 reference", buf.logits, reference,
                      _tolerances(cfg, plan, dtype)[0])
            ctx.time("whole step, per-layer kernels", lambda: ops.fused_step(
                w, cfg, cache, buf, plan, inv_freq, tokens, looped=False, write_logits=True),
                bytes_moved=step_bytes(cfg, w, batch, context), cuda_graph=True, params=params,
                variant=variant)
            for instruction, launch in launches.items():
                count = 1 if instruction == "lm_head" else cfg.num_hidden_layers
                ctx.time(f"{instruction} x{count}", launch, bytes_moved=floors[instruction] * count, cuda_graph=True,
                         params={**params, "instruction": instruction}, variant=variant)
            if not tuning and batch == 1:
                _looped_prefixes(ctx, cfg, w, cache, buf, plan, inv_freq, floors, params, variant)


def _looped_prefixes(ctx: Context, cfg: LlamaConfig, w: LlamaWeights, cache: ref.KVCache, buf: ops.DecodeBuffers,
                     plan: ops.DecodePlan, inv_freq: torch.Tensor, floors: dict[str, int], params: dict,
                     variant: str) -> None:
    """The looped kernel stopped after its first s stages (one launch each, CUDA graph): s = 0 is
    the launch alone, differences between prefixes are what each stage costs inside the loop
    (against the per-layer launches of the same instruction)."""
    per_stage = [floors[name] for name in ("qkv_rope", "decode_attention", "o_proj", "gate_up", "down_proj")]
    stage_bytes = per_stage * cfg.num_hidden_layers + [floors["lm_head"]]
    total = len(stage_bytes)
    for stop in sorted({0, 1, 2, 3, 4, 5, 10, total - 1, total}):
        ctx.time(f"looped, first {stop} stages", lambda stop=stop: ops.looped_decode(
            w, cfg, cache, buf, plan, inv_freq, write_logits=True, stop_stage=stop),
            bytes_moved=max(1, sum(stage_bytes[:stop])), cuda_graph=True,
            params={**params, "looped_stages": stop}, variant=variant)


# Plan variants timed against the default plan (Llama-3.2-1B, context 512), each one or two
# fields away from it.  Earlier rounds on the H200 (ms per step, per-layer path): batch 1 with 4
# warps (8 warps 1.11 against 0.99); batch 2 by row sums (1.32; padded tensor-core tiles 1.38);
# batch 8 by tensor-core tiles of 64 rows (row sums 3.06, 16-row tiles 2.35, 8 warps 1.78);
# batch 64 with 4 warps and 64-row tiles (16-row tiles 6.55, 8 warps 2.67); barrier prefetch
# and programmatic dependent launch lost everywhere, acquire-load barrier polls made no
# difference.  Session 3 (mid run 1): batch 1 pipelined 256-wide tiles 0.951, unpipelined
# 512-wide 0.961, pipelined 512-wide 1.045 (then 255 registers); W_o unsplit 0.076 ms per 16
# layers against 0.123 in 4 parts; Q/K/V in 4 K parts at batch 8: 1.272 (1 part 1.361, 2 1.327,
# 8 1.315), at batch 64: 1.970 (1 part 2.029, 8 2.166).
# Session 3 (mid run 2): row_prefetch=False 1.024 against 0.942 at batch 1, fuse_attention=True
# 0.935, the looped path as dependency-ordered tiles 1.248 (persistent kernel 1.83); gate/up in one
# K part 1.303 / 2.010 against 1.305 / 1.986 in two at batch 8 / 64.
# Session 4 (H200, every wait ending in an acquire read): batch 1 per-layer 0.9425, with acquire-load
# polls 0.9381; looped (dependency-ordered tiles) 1.306 with back-to-back polls, 1.224 with a 1 µs
# sleep between polls (now the default at batch 1); batch 8 per-layer 1.297, looped persistent
# kernel 1.568, dependency-ordered tiles 1.502 (now the looped default up to batch 8).
# Session 5 (H200, first call): programmatic dependent launch alone 0.9351 against 0.9425 at batch 1
# (1.327 against 1.300 at batch 8); with each program's weight rows asked of L2 before its wait
# 0.9423 (8 lines per row) and 1.039 (32 lines: all 2048 columns of a batch-1 tile); attention tiles
# prefetching their cache slots 0.9340; the dataflow schedule prefetching before its waits 1.218
# against 1.227 (batch 8: 1.647 against 1.498).
# Second call: batch 1 default 0.9427; PDL + attention prefetch 0.9368; Q/K/V chunks of 512 columns
# 0.9136 (1024: 0.9882, 254 registers), W_o chunks of 1024 0.9073 (512: 0.9105), W_down chunks of
# 512 0.9520, every chunk 512 wide 0.9533.  Batch 8 default 1.302; 4 pipeline stages 1.453, 2 1.504;
# Q/K/V chunks of 256 1.424; fused Q/K/V + attention (with the slots prefetched) 1.307.
# Third call: batch 1 default 0.9401; Q/K/V chunks 512 + W_o chunks 1024 0.8942, with PDL and the
# attention tiles' slots prefetched 0.8661 (the new default: see llmfuse.ops.make_plan); the same
# with 4-pair Q/K/V blocks 0.8971 (1024-wide Q/K/V chunks 0.9334), the down projection in 8 or 2
# K parts 0.9164 / 0.9225 (4: 0.8942), gate/up in 2 K parts 0.9664.  Batch 8 default 1.304; 32-row
# tiles 1.622, 4 down / W_o K parts 1.330, gate/up in 4 K parts 1.415.  Llama-3.1-8B batch 1:
# default 4.386, the wider chunks 4.491, with PDL and the slots prefetched 4.498.
# Fourth call: batch 1 default (PDL, slots prefetched, wide Q/K/V and W_o chunks) 0.8676; without
# PDL and prefetch 0.8892; the session-4 default 0.9302; 4 weight lines prefetched before each wait
# 0.8645; 4 or 2 attention splits 0.8990 / 0.9287 (9: the default); gate/up chunks of 128 columns
# 0.8473 (now the default where its tiles fit one wave), of 64 1.083; looped 1.240, without the
# attention prefetch 1.239.  Llama-3.1-8B batch 1: default (PDL, slots prefetched) 4.327, session 4's
# 4.378.
# Fifth call: batch 1 with the final defaults 0.8515 against session 4's 0.9371 (llmfuse/JOURNAL.md).
# Session 5, round 2 (batch 8; ncu of the per-layer step: the Q/K/V launch at 13.8% of the DRAM
# bandwidth and 77% of L1, half its shared-memory wavefronts excessive: the pipelined float32 x
# chunk read unswizzled by the tensor-core operand).  First call: batch 8 default 1.306; 9 attention
# splits 1.313, 3 splits 1.301; 2 warps per program everywhere 1.310 (Q/K/V 0.231 against 0.290 ms
# per 16 layers, the weight-streaming launches slower); Q/K/V tiles of 2 · 32 rows in 8 K parts
# 1.211; 2 · 16 rows in 8 parts of one 256-column chunk 1.459.  Second call (2 · 32-row Q/K/V tiles
# in 8 parts, every x chunk loaded twice: 1.186): the session-5 default 1.304; x chunks loaded once
# 1.208; Q/K/V in 2 warps 1.152, in 4 K parts 1.132, in 16 1.222; attention in 2 warps 1.178, LM
# head 1.193; looped 1.254; batch 64 2.170 against 2.009 with x chunks loaded once; Llama-3.1-8B
# batch 8 5.145 against 6.511.
# Third call (tree 43cd8c5): Q/K/V in 4 K parts with one x load 1.186; with two (the final default)
# 1.135; the second call's default 1.181; the session-5 default 1.301; Q/K/V in 2 warps 1.180,
# attention in 2 warps 1.180, Q/K/V in 2 K parts 1.194, Q/K/V and attention in one launch (slots
# prefetched) 1.217, W_o in 4 K parts 1.183, in 16 1.200; looped 1.246.  Llama-3.1-8B batch 8: 4 K
# parts with one load 5.156, 8 parts with two (the final default: 512-column parts) 5.114, the
# session-5 default 6.470.
# Session 6 (H200; ncu of the batch-1 step first: every per-layer launch at 10-19% achieved occupancy,
# the Q/K/V + attention launch at 21% of the DRAM bandwidth, W_o 29%, each kernel's first weight round
# trip waiting for the previous kernel's end).  Call 1 (tree ed764fb + rows): batch 1 default 0.8442;
# 17 or 33 attention splits of 32 / 16 slots 0.8498 / 0.8596; Q/K/V and attention in two launches
# 0.8539.  Batch 8 default 1.125; the second x load one chunk ahead (square_sum_load 2) 1.139 (Q/K/V
# and gate/up) / 1.137 (gate/up); Q/K/V x loaded once 1.176; session-5 default 1.298; looped 1.197.
# Batch 64: 1.992, x loaded twice 2.106.  8B batch 8: 5.077, session-5 default 6.441.
# Call 2: batch-1 row tiles loading their first weight chunk before their own PDL wait (pdl_weights)
# 0.8001 against 0.8441; with the down projection in 2 / 8 K parts 0.8433 / 0.8292, W_down chunks of
# 512 0.8263, Q/K/V and attention in two launches 0.8037.  8B batch 1 4.241 against 4.307.
# Call 3 (pdl_weights the default): 0.8037; W_o's first two chunks before the wait (pdl_weights_o 2)
# 0.7995; every instruction's first two 0.9519; W_down unsplit in 1024-column chunks 0.8177 (with
# pdl_weights_o 2: 0.8129); Q/K/V in 2 K parts of 256-column chunks 0.8360; no pdl_weights 0.8459.
# 8B batch 1 4.246, pdl_weights_o 2 4.237.
# Call 4 (the residual update of unsplit projections a single-writer atomic add, the K-part merge in
# one round of loads, the attention span and RoPE inputs read before the waits), against the llmfuse
# of a2bd5e9 in the same call: batch 1 0.7939 against 0.8083, 8B 4.275 against 4.290, batch 8 1.131
# against 1.132; pdl_weights_o 2 0.7926 (8B 4.269; now the default), down in 8 / 2 K parts 0.8147 /
# 0.8371, 5 attention splits 0.8053, Q/K/V and attention in two launches 0.7939; batch 8 with W_o and
# W_down in 4 K parts 1.157.
# Call 5: batch 1 default 0.7940, Q/K/V tiles of 4 pairs 0.8078.  8B batch 1 4.273; W_o in 512-column
# chunks 4.220, gate/up in 128-column chunks 4.195, W_down in 2 K parts 4.273, W_o 512 with 2 K parts
# 4.213.  Call 6: batch 1 default 0.7909, without pdl_weights / pdl_weights_o 0.8410, pdl_weights_o 1
# 0.7931; batch 8 1.132 (session-5 tiles 1.299).  8B batch 1 with both W_o 512 and gate/up 128 4.218,
# gate/up 128 alone 4.190 (now the default), W_o 512 alone 4.214, session-5 chunks 4.263, the
# session-5 batch-1 plan 4.339.  Call 7 (after the fix of the no-PDL plans): batch 1 0.7909; 8B 4.185.
# Calls 8-9 (8B rows only, so the 8B default was the first row timed in the process: 4.236 / 4.233,
# the same plan re-timed later in the process 4.130 / 4.132): gate/up in 64-column chunks 5.390,
# W_down in 2 / 8 K parts 4.132-4.136 / 4.152, W_o in 512-column chunks 4.162, W_down in 512-column
# chunks 4.167, W_o one chunk before its wait 4.136-4.140, Q/K/V in 512-column chunks 4.477.
# Session 7 (H200).  Call 1 (the step's embedding and count reset in one Triton launch, against HEAD's
# llmfuse in the same call): batch 1 0.7796 / 0.7812 against 0.7835 / 0.7851, batch 8 1.118 against
# 1.127, 8B batch 1 4.124 against 4.133 / 4.136; the attention tiles' first K / V block loaded into
# registers before their waits 0.7848 (unfused 0.7890), the Q/K/V tiles' first two weight chunks
# before their wait 0.7826, both 0.7894 (8B: 4.629).  Call 2: W_down's parts adding into the deferred
# sums (defer_down) 0.7715 / 0.7711 against 0.7778 / 0.7800 (now the default where W_down fits one
# wave); 8B 4.171 / 4.171 against 4.137 / 4.136.  Call 5 (the greedy pick in one launch against the
# argmax + gather + cast of torch, same call): batch 1 0.7635 against 0.7717 / 0.7729, batch 8 1.112 /
# 1.113 against 1.125 / 1.123, 8B 4.134 against 4.136; 8B with W_down in 2 K parts (one wave) 4.260
# deferred, 4.249 merged, against 4.264 / 4.134 for the default timed before / after them: not taken.
OLD_BATCH8 = {"block_p": 16, "qkv_split": 4, "square_sum_load": 0, "square_sum_load_qkv": 0}
# The batch-1 defaults against the plan without the weight loads before the wait (the session-5
# default but for the latency fixes of sessions 6 and 7) and without the deferred W_down sums.
SESSION5_BATCH1 = {"pdl_weights": 0, "pdl_weights_o": 0}
PLAN_SWEEP: list[tuple[int, bool, dict[str, int]]] = [
    (1, False, {"defer_down": False}), (1, False, SESSION5_BATCH1), (8, False, OLD_BATCH8),
]
# Llama-3.1-8B: its batch-1 gate/up chunks of session 5 (block_k: 256 columns); the deferred W_down sums
SESSION5_CHUNKS_8B = {"block_k_gate_up": 0}
PLAN_SWEEP_8B: list[tuple[int, bool, dict[str, int]]] = [
    (1, False, {"defer_down": True}), (1, False, {**SESSION5_BATCH1, **SESSION5_CHUNKS_8B}),
]
QUICK_PLAN_SWEEP = [(1, False, {"row_prefetch": False}), (3, False, {"block_b": 4}),
                    (3, False, {"fuse_attention": True}), (3, True, {}), (1, True, {"dataflow": True})]


def _sweep_variant(ctx: Context, cfg: LlamaConfig, w: LlamaWeights, inv_freq: torch.Tensor, name: str, context: int,
                   slots: int, sms: int, batch: int, looped: bool, tuning: dict, state: dict,
                   failures: list[str], prefix: str = "") -> None:
    """Check one plan variant against the batch's default plan (the first run) and time it."""
    dtype = w.dtype
    cache, tokens = state["cache"], state["tokens"]
    label = ("looped" if looped else "per-layer") + ", " + (
        " ".join(f"{k}={v}" for k, v in tuning.items()) or "default plan")
    tuning = dict(tuning)
    if "programs_per_sm" in tuning:
        tuning["looped_programs"] = tuning.pop("programs_per_sm") * sms
    with torch.no_grad():
        try:
            plan = ops.make_plan(cfg, batch, slots, dtype, ctx.device, **tuning)
            buf = ops.DecodeBuffers.allocate(cfg, plan, dtype, ctx.device)
            buf.slot.fill_(context)
            buf.logits.fill_(float("nan"))
            ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=looped, write_logits=True)
            if ops.looped_timed_out(buf):
                raise RuntimeError("the looped kernel timed out at a grid barrier")
        except Exception as exc:  # noqa: BLE001  (reported at the end; the other variants still run)
            failures.append(f"{prefix}B={batch} {label}: {type(exc).__name__}: {exc}")
            return
        tol = _tolerances(cfg, plan, dtype)[0]
        if state["logits"] is None:
            state["logits"], state["tol"] = buf.logits.clone(), tol
        else:
            # two plans round at different points: independent errors, added in quadrature
            ctx.check(f"{prefix}B={batch} {label} vs default plan", buf.logits, state["logits"],
                      (tol**2 + state["tol"]**2) ** 0.5 if dtype != torch.float32 else STRICT_FLOAT32)
        params = {"model": name, "batch": batch, "context": context, "dtype": str(dtype), "plan": label}
        ctx.time(label, lambda: ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=looped,
                                               write_logits=True),
                 bytes_moved=step_bytes(cfg, w, batch, context), cuda_graph=True, params=params,
                 variant=f"{prefix}B={batch}")


@case("llm", "plan_sweep", baseline="per-layer, default plan", headline=False)
def plan_sweep_case(ctx: Context) -> None:
    """ms per decode step under other plans than the default (A/B tuning of block sizes and splits).

    A variant that fails to build or run is reported at the end; the others are still timed."""
    dtype = torch.bfloat16 if ctx.gpu else torch.float32
    context = 16 if ctx.quick else 512
    # (model, config, rows, variant prefix): the 1B rows keep their session-4 variant names
    models = [("tiny", TINY, QUICK_PLAN_SWEEP, "")] if ctx.quick else [
        ("Llama-3.2-1B", LLAMA_3_2_1B, PLAN_SWEEP, ""), ("Llama-3.1-8B", LLAMA_3_1_8B, PLAN_SWEEP_8B, "8B,")]
    failures = []
    for name, cfg, sweep, prefix in models:
        if sweep:
            _sweep_model(ctx, name, cfg, sweep, prefix, dtype, context, failures)
    if failures:
        raise RuntimeError("plan variants that failed:\n  " + "\n  ".join(failures))


def _sweep_model(ctx: Context, name: str, cfg: LlamaConfig, sweep: list, prefix: str, dtype: torch.dtype,
                 context: int, failures: list[str]) -> None:
    """The rows of one model: each batch's default plan first, then its variants in order."""
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    w = random_weights(cfg, dtype=dtype, device=ctx.device, generator=gen)
    inv_freq = cfg.rope_inv_freq().to(ctx.device)
    slots = context + 8
    sms = device_facts(ctx.device).sm_count
    states = {}
    for batch, looped, tuning in sweep:  # in order: variants that might break the device go last
        if batch not in states:  # the batch's inputs, and its default plan first
            cache = ref.KVCache.empty(cfg, batch, slots, dtype=dtype, device=ctx.device)
            cache.k.normal_(0.0, 0.5, generator=gen)
            cache.v.normal_(0.0, 0.5, generator=gen)
            tokens = torch.randint(0, cfg.vocab_size, (batch,), device=ctx.device, generator=gen)
            states[batch] = {"cache": cache, "tokens": tokens, "logits": None, "tol": 0.0}
            _sweep_variant(ctx, cfg, w, inv_freq, name, context, slots, sms, batch, False, {}, states[batch],
                           failures, prefix)
        _sweep_variant(ctx, cfg, w, inv_freq, name, context, slots, sms, batch, looped, tuning, states[batch],
                       failures, prefix)
    del w, states
    if ctx.gpu:
        torch.cuda.empty_cache()


@plot("llm")
def ms_per_token_plot(records, out_dir):
    """ms per decode step against batch, one panel per (model, context), one line per implementation."""
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.domain == "llm" and r.params.get("batch")]
    panels = sorted({(r.params["model"], r.params["context"]) for r in rows})
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    for ax, (model, context) in zip(axes[0], panels):
        mine = [r for r in rows if r.params["model"] == model and r.params["context"] == context]
        for impl in sorted({r.implementation for r in mine}):
            pts = sorted((r.params["batch"], r.median_ms) for r in mine if r.implementation == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("ms per decode step")
        ax.set_title(f"{model}, context {context}", fontsize=9)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    path = out_dir / "llm_ms_per_token.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]
