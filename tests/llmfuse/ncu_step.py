"""One eager per-layer decode step of the Llama-3.2-1B shape (random bf16 weights, context 512), for
Nsight Compute on the GPU machine: three warm-up steps (compiles), then one step between
``cudaProfilerStart`` and ``cudaProfilerStop``.

    ncu --clock-control none --profile-from-start off \\
        --kernel-name regex:'qkv_rope|decode_attention|residual_proj|gate_up' --launch-count 5 \\
        --set detailed python3 tests/llmfuse/ncu_step.py 8 '{"square_sum_load": false}'

Arguments: the batch, then optionally the plan fields (``make_plan`` tuning) as JSON.
"""

import json
import sys

import torch

from benchmarks.cases.llm import LLAMA_3_2_1B
from llmfuse import ops
from llmfuse import reference as ref
from llmfuse.weights import random_weights


def main(argv: list[str]) -> None:
    batch = int(argv[0])
    tuning = json.loads(argv[1]) if len(argv) > 1 else {}
    cfg, device, dtype, context = LLAMA_3_2_1B, torch.device("cuda"), torch.bfloat16, 512
    gen = torch.Generator(device=device).manual_seed(0)
    w = random_weights(cfg, dtype=dtype, device=device, generator=gen)
    inv_freq = cfg.rope_inv_freq().to(device)
    slots = context + 8
    cache = ref.KVCache.empty(cfg, batch, slots, dtype=dtype, device=device)
    cache.k.normal_(0.0, 0.5, generator=gen)
    cache.v.normal_(0.0, 0.5, generator=gen)
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device=device, generator=gen)
    plan = ops.make_plan(cfg, batch, slots, dtype, device, **tuning)
    print(plan, plan.tiles(cfg), flush=True)
    buf = ops.DecodeBuffers.allocate(cfg, plan, dtype, device)
    buf.slot.fill_(context)
    with torch.no_grad():
        for _ in range(3):
            ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=False, write_logits=True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        ops.fused_step(w, cfg, cache, buf, plan, inv_freq, tokens, looped=False, write_logits=True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:])
