"""Compile the per-layer kernels of one Llama-3.2-1B-shaped layer for sm_90 on a machine without a
GPU and write their compiler stages (fusecore.compile_check.dump_stages: TTIR, TTGIR, LLVM IR,
PTX), with registers, local memory, shared memory and programs per SM:

    PYTHONPATH=. python tests/llmfuse/ttgir_sm90.py 8 '{"square_sum_load": false}' qkv_rope,gate_up /tmp/ir

Arguments: the batch, the plan fields (``make_plan`` tuning) as JSON, the launches (qkv_rope,
attention, o_proj, gate_up, down) and the output folder.  The plan is the one a 132-SM H200 gets.
Read the shared-memory encodings (``#ttg.swizzled_shared``) of the pipelined buffers
(``ttg.local_alloc``) in the TTGIR: the round-2 bank conflicts of llmfuse/JOURNAL.md were one without a swizzle.
"""

import json
import sys
from pathlib import Path

import compile_sm90  # noqa: I001  (patches torch.cuda.is_available before fusecore is imported)
import torch
import triton

from fusecore.compile_check import dump_stages, resources
from fusecore.device import DeviceFacts
from llmfuse import ops
from llmfuse import reference as ref
from llmfuse.config import LlamaConfig
from llmfuse.weights import random_weights


def main(argv: list[str]) -> None:
    batch, tuning = int(argv[0]), json.loads(argv[1])
    launches, out = argv[2].split(","), Path(argv[3])
    out.mkdir(parents=True, exist_ok=True)
    compiled = []
    compile_for_sm90 = triton.compile

    def capture(source, target=None, options=None):
        kernel = compile_for_sm90(source, target=target, options=options)
        compiled.append((source.fn.__name__, kernel))
        return kernel

    compile_sm90.triton.compile = capture
    for name in compile_sm90.KERNELS:
        setattr(ops, name, compile_sm90.CompileInsteadOfLaunch(getattr(ops, name), name))
    h200 = DeviceFacts("NVIDIA H200", "cuda", 132, 60 << 20, 227 << 10, (9, 0))
    ops.device_facts = lambda device: h200
    # one layer of Llama-3.2-1B (a small vocabulary: the LM head is not compiled here)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=2048, intermediate_size=8192, num_hidden_layers=1,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64)
    w = random_weights(cfg, dtype=torch.bfloat16)
    plan = ops.make_plan(cfg, batch, 520, torch.bfloat16, torch.device("cuda"), **tuning)
    buf = ops.DecodeBuffers.allocate(cfg, plan, torch.bfloat16, torch.device("cpu"))
    cache = ref.KVCache.empty(cfg, batch, 520, dtype=torch.bfloat16, device="cpu")
    inv_freq = cfg.rope_inv_freq()
    calls = {"qkv_rope": lambda: ops.qkv_rope(w, cfg, 0, cache, buf, plan, inv_freq),
             "attention": lambda: ops.decode_attention(cfg, 0, cache, buf, plan),
             "o_proj": lambda: ops.o_proj(w, cfg, 0, buf, plan),
             "gate_up": lambda: ops.gate_up(w, cfg, 0, buf, plan),
             "down": lambda: ops.down_proj(w, cfg, 0, buf, plan)}
    for launch in launches:
        calls[launch]()
    for name, kernel in compiled:
        used = resources(kernel, name, compile_sm90.TARGET, {})
        print(f"{name}: {used.registers} registers, {used.local_bytes} B local, {used.shared_bytes} B shared, "
              f"{used.num_warps} warps, {used.blocks_per_sm} programs per SM")
        dump_stages(kernel, name, {}, tuning, out)


if __name__ == "__main__":
    main(sys.argv[1:])
