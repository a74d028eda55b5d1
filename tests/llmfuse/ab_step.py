"""Same-call A/B of decode-step plans on the GPU: ms per step of plan variants, per-layer path, CUDA graph.

    python3 tests/llmfuse/ab_step.py TAG ROW [ROW ...]        ROW = MODEL:BATCH:field=value,... (ints or strings)
    e.g. 1B:1:  1B:1:acquire_loads=1  8B:1:pdl_weights=2      (MODEL 1B or 8B: benchmarks/cases/llm.py)
    1B:8:looped=1,dataflow_maxnreg=128                        (looped=1: the looped path, as the decode case)

Each row builds ``make_plan(..., **fields)`` for random bf16 weights of the model (seed 0, as the decode
case) at context 512, checks the step's logits against the first row of its model and batch (within
sqrt(2) times the rounding bound, :func:`llmfuse.ops.rounding_tolerance`), replays the step from a CUDA
graph 64 times (the decode case's settle replays) and times it as the benchmarks do (``fusecore.timing``,
``do_bench_cudagraph``; TAG ``compile``: only the first step, which fills Triton's cache, so several
processes can compile rows in parallel before one process times them); one JSON line per row: median /
p20 / p80 ms, % of the floor, relative logits error, compile seconds.  The code under test is whatever
``PYTHONPATH`` names, so one GPU call can time
HEAD against the working tree — on the development machine ``git archive HEAD llmfuse fusecore benchmarks
pyproject.toml | tar -x -C .ab_llm/head`` (an ignored folder, carried to the GPU machine), there
``PYTHONPATH=.ab_llm/head python3 tests/llmfuse/ab_step.py head 1B:1:`` before and after
``PYTHONPATH=. python3 tests/llmfuse/ab_step.py new 1B:1: ...`` (session 8's calls).
"""

import json
import sys
import time

import torch

from benchmarks.cases.llm import LLAMA_3_1_8B, LLAMA_3_2_1B, _settle, _tolerances, step_bytes
from fusecore.device import lookup_peak
from fusecore.timing import measure
from llmfuse import ops
from llmfuse import reference as ref
from llmfuse.weights import random_weights

MODELS = {"1B": LLAMA_3_2_1B, "8B": LLAMA_3_1_8B}
CONTEXT, SLOTS = 512, 520


def parse(row: str) -> tuple[str, int, dict[str, int | str]]:
    """``MODEL:BATCH:field=value,...`` as (model, batch, plan fields): integers, or strings (``dot_prec=ieee``)."""
    model, batch, fields = row.split(":")
    return model, int(batch), {k: int(v) if v.lstrip("-").isdigit() else v
                               for k, v in (kv.split("=") for kv in fields.split(",") if kv)}


def time_row(w, cfg, inv_freq, inputs: dict, batch: int, tuning: dict[str, int], timed: bool = True) -> dict:
    """One row: its plan's step checked against the first plan timed on ``inputs``, settled and timed
    (``looped`` in ``tuning``, not a plan field: the looped path instead of the per-layer launches)."""
    device = w.wqkv.device
    start = time.time()
    shown = dict(tuning)
    tuning = dict(tuning)
    looped = bool(tuning.pop("looped", 0))
    with torch.no_grad():
        plan = ops.make_plan(cfg, batch, SLOTS, w.dtype, device, **tuning)
        buf = ops.DecodeBuffers.allocate(cfg, plan, w.dtype, device)
        buf.slot.fill_(CONTEXT)
        buf.logits.fill_(float("nan"))

        def step():
            return ops.fused_step(w, cfg, inputs["cache"], buf, plan, inv_freq, inputs["tokens"], looped=looped,
                                  write_logits=True)

        step()
        torch.cuda.synchronize()
        compile_s = time.time() - start
        rel = None
        if inputs["logits"] is None:
            inputs["logits"] = buf.logits.clone()
        else:
            rel = float((buf.logits - inputs["logits"]).norm() / inputs["logits"].norm())
        timed_out = looped and ops.looped_timed_out(buf)
        if not timed:  # compile only (TAG "compile"): fills Triton's cache for a later timing process
            return dict(batch=batch, tuning=shown, compile_s=round(compile_s, 1), timed_out=timed_out)
        _settle(step)
        timing = measure(step, device=device, rep_ms=25.0, cuda_graph=True)
    floor_ms = step_bytes(cfg, w, batch, CONTEXT) / lookup_peak(torch.cuda.get_device_name()).bandwidth * 1e3
    return dict(batch=batch, tuning=shown, ms=round(timing.median_ms, 4), p20=round(timing.p20_ms, 4),
                p80=round(timing.p80_ms, 4), floor_pct=round(100 * floor_ms / timing.median_ms, 1), rel=rel,
                ok=not timed_out and (rel is None or rel <= 2**0.5 * _tolerances(cfg, plan, w.dtype)[0]),
                compile_s=round(compile_s, 1))


def main(tag: str, rows: list[str]) -> int:
    device = torch.device("cuda")
    state: dict = {}
    failed = 0
    for row in rows:
        model, batch, tuning = parse(row)
        cfg = MODELS[model]
        if state.get("model") != model:  # one model's weights at a time
            state.clear()
            torch.cuda.empty_cache()
            gen = torch.Generator(device=device).manual_seed(0)
            state.update(model=model, gen=gen, inputs={}, inv_freq=cfg.rope_inv_freq().to(device),
                         w=random_weights(cfg, dtype=torch.bfloat16, device=device, generator=gen))
        if batch not in state["inputs"]:
            cache = ref.KVCache.empty(cfg, batch, SLOTS, dtype=torch.bfloat16, device=device)
            cache.k.normal_(0.0, 0.5, generator=state["gen"])
            cache.v.normal_(0.0, 0.5, generator=state["gen"])
            tokens = torch.randint(0, cfg.vocab_size, (batch,), device=device, generator=state["gen"])
            state["inputs"][batch] = {"cache": cache, "tokens": tokens, "logits": None}
        record = time_row(state["w"], cfg, state["inv_freq"], state["inputs"][batch], batch, tuning,
                          timed=tag != "compile")
        print(json.dumps({"tag": tag, "model": model, **record}), flush=True)
        failed += not record.get("ok", True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
