"""Compile every llmfuse decode kernel for an H100/H200 (sm_90) on a machine without a GPU.

Run as a script (``python tests/llmfuse/compile_sm90.py [--all]``): it makes torch report a CUDA
device *before* fusecore is imported, so ``fusecore.jit`` hands out compiled-mode kernels;
the launchers of :mod:`llmfuse.ops` then run against recorders that compile each kernel
with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` (frontend, LLVM and ptxas) with
the exact arguments and constexprs a decode step passes, instead of launching it.  A
failure prints the kernel and the compiler's error and exits non-zero.

``--report MODEL BATCH [--looped] [TUNING_JSON ...]`` (MODEL ``1b`` or ``8b``: Llama-3.2-1B / 3.1-8B shapes with two
layers and a short vocabulary, which change no kernel's code) compiles the per-layer step of the GPU plan
an H100/H200 gets at context 512 (``make_plan`` with a 132-SM device), once per tuning (``'{}'``: the
default), and prints what ptxas allotted each kernel — registers, local memory, warps per SM
(:func:`fusecore.compile_check.resources`) — so a plan variant's occupancy is known before a GPU run
(session 8: the fused Q/K/V + attention launch of Llama-3.2-1B 223 registers, as ncu counted on the H200).
"""

import json
import re
import sys

import torch

torch.cuda.is_available = lambda: True  # must precede the first fusecore import

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import fusecore  # noqa: E402
import llmfuse.ops as ops  # noqa: E402
from fusecore import compile_check  # noqa: E402
from fusecore.device import DeviceFacts  # noqa: E402
from llmfuse import reference as ref  # noqa: E402
from llmfuse.config import LlamaConfig  # noqa: E402
from llmfuse.weights import random_weights  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int64: "*i64",
           torch.int32: "*i32"}
KERNELS = ("embed_kernel", "qkv_rope_kernel", "decode_attention_kernel", "qkv_attention_kernel",
           "residual_proj_kernel", "gate_up_kernel", "lm_head_kernel", "pick_kernel", "looped_decode_kernel")


# Kernels whose programs read device memory before their PDL wait: the attention tiles read the
# step's slot and their row's first valid slot (set by the host before the step) to find the cache
# slots they prefetch.
READS_BEFORE_WAIT = {"decode_attention_kernel", "qkv_attention_kernel"}


def check_pdl_order(name: str, ptx: str, prefetches: bool, weights_early: bool, residual_early: bool = False,
                    cache_early: bool = False) -> None:
    """A kernel launched with programmatic dependent launch must not write, nor (bar the slot reads
    of READS_BEFORE_WAIT) read, device memory before ``griddepcontrol.wait``, and its weight prefetches
    (``prefetch.global.L2``) must come before it, not be sunk below it.  ``weights_early`` (ROW_PREFETCH
    2 or 3, ``plan.pdl_weights``): the first wait must follow weight loads (``evict_first``), and the only
    loads before it are those and the norm weights' — never an activation (``.cg``: x, attn, h, q) but,
    with ``residual_early`` (W_o with ``plan.defer_down``: X_FIX 2), its x and deferred-sum loads, which
    W_down wrote two kernels back; with ``cache_early`` (the fused Q/K/V + attention launch with
    ``plan.attn_preload``) the attention tiles' loads of old cache slots (``evict_last``), which earlier steps
    wrote."""
    lines = [line.strip() for line in ptx.splitlines()]
    wait = next((i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")), None)
    if wait is None:
        raise AssertionError(f"{name}: no griddepcontrol.wait in a PDL launch")
    # memory instructions by name: ``red.`` not inside the ``shared.`` of an mbarrier or shared-memory instruction
    early = [line for line in lines[:wait] if re.search(r"(?<![\w.])(st\.global|atom\.|red\.|ld\.global)", line)]
    if name in READS_BEFORE_WAIT:
        early = [line for line in early if not line.startswith("ld.global.b64")]
    if cache_early:
        early = [line for line in early if not (re.match(r"(@%?\w+\s+)?ld\.global", line) and "evict_last" in line)]
    if weights_early:
        loads = [line for line in early if re.match(r"(@%?\w+\s+)?ld\.global", line)]
        if not any("evict_first" in line for line in loads):
            raise AssertionError(f"{name}: no weight load before griddepcontrol.wait with pdl_weights")
        early = [line for line in early if line not in loads or (".cg" in line and not residual_early)]
    if early:
        raise AssertionError(f"{name}: memory accesses before griddepcontrol.wait: {early[:4]}")
    if prefetches and not any("prefetch.global.L2" in line for line in lines[:wait]):
        raise AssertionError(f"{name}: no prefetch.global.L2 before griddepcontrol.wait")


class CompileInsteadOfLaunch:
    """Stands in for a kernel in llmfuse.ops: ``kernel[grid](*args)`` compiles for sm_90 (and, when
    ``resources`` is a list, appends what ptxas allotted each new specialisation to it)."""

    compiled: set = set()
    resources: list | None = None

    def __init__(self, kernel, name: str):
        self.kernel, self.name = kernel, name

    def __getitem__(self, grid):
        def compile_only(*args, **kwargs):
            values = {param._param.name: param._param.default for param in self.kernel.params
                      if param._param.default is not param._param.empty}  # the kernel's own defaults
            values.update(zip(self.kernel.arg_names, args))
            values.update(kwargs)
            signature, constexprs, attrs = {}, {}, {}
            for index, (name, param) in enumerate(zip(self.kernel.arg_names, self.kernel.params)):
                value = values[name]
                # the launch-time specialization: 16-aligned pointers, integers divisible by 16
                if not param.is_constexpr and (isinstance(value, torch.Tensor) or (
                        isinstance(value, int) and value % 16 == 0 and not param.do_not_specialize)):
                    attrs[(index,)] = [["tt.divisibility", 16]]
                if param.is_constexpr:
                    signature[name], constexprs[(index,)] = "constexpr", value
                elif isinstance(value, torch.Tensor):
                    signature[name] = POINTER[value.dtype]
                elif isinstance(value, float):
                    signature[name] = "fp32"
                else:
                    signature[name] = "i64" if abs(int(value)) >= 2**31 else "i32"
            key = (self.name, tuple(signature.items()), tuple(constexprs.items()), tuple(attrs),
                   values.get("num_warps"), values.get("num_stages"), values.get("maxnreg"))
            if key not in self.compiled:
                source = ASTSource(fn=self.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
                compiled = triton.compile(source, target=TARGET, options={
                    k: values[k] for k in ("num_warps", "num_stages", "maxnreg") if k in values})
                if self.resources is not None:
                    named = {name: values[name] for name, param in zip(self.kernel.arg_names, self.kernel.params)
                             if param.is_constexpr}
                    self.resources.append(compile_check.resources(compiled, self.name, TARGET, named))
                if values.get("USE_PDL"):
                    check_pdl_order(self.name, compiled.asm["ptx"], values.get("PREFETCH_LINES", 0) > 0,
                                    values.get("ROW_PREFETCH", 0) >= 2, values.get("X_FIX", 0) == 2,
                                    bool(values.get("ATTN_PRELOAD")))
                self.compiled.add(key)

        return compile_only


# --report: Llama shapes (benchmarks/cases/llm.py) with two layers and a short vocabulary; the slots of
# context 512 (as the decode case), which set the attention splits and so the plan's tiles per launch
REPORT_MODELS = {"1b": dict(hidden_size=2048, intermediate_size=8192, head_dim=64),
                 "8b": dict(hidden_size=4096, intermediate_size=14336, head_dim=128)}
REPORT_SLOTS = 520


def report(model: str, batch: int, tunings: list[dict], looped: bool = False) -> int:
    """Print the resources of every kernel of one per-layer step of the GPU plan, per tuning (``looped``:
    of the looped step instead — the embedding and the looped kernel)."""
    cfg = LlamaConfig(vocab_size=1003, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
                      **REPORT_MODELS[model])
    w = random_weights(cfg, dtype=torch.bfloat16)
    for tuning in tunings:
        CompileInsteadOfLaunch.compiled, CompileInsteadOfLaunch.resources = set(), []
        plan = ops.make_plan(cfg, batch, REPORT_SLOTS, torch.bfloat16, torch.device("cuda"), **tuning)
        buf = ops.DecodeBuffers.allocate(cfg, plan, torch.bfloat16, torch.device("cpu"))
        cache = ref.KVCache.empty(cfg, batch, REPORT_SLOTS, dtype=torch.bfloat16, device="cpu")
        ops.fused_step(w, cfg, cache, buf, plan, cfg.rope_inv_freq(), torch.zeros(batch, dtype=torch.int64),
                       looped=looped, write_logits=True)
        print(f"== Llama {model}, batch {batch}, {'looped' if looped else 'per-layer'} step, "
              f"tuning {tuning or 'default'}: tiles {plan.tiles(cfg)}")
        print(compile_check.format_report(CompileInsteadOfLaunch.resources))
    return 0


def main(argv: list[str]) -> int:
    """Default: the looped kernel (it inlines every instruction's tile function) in bf16 at batch 1
    (row-sum GEMV) and 8 (tensor cores) and the per-layer kernels at batch 1 (with PDL: the order of
    prefetches, wait and accesses checked); ``--all``: also every per-layer kernel at the other
    batches, batch 64 and float32."""
    full = "--all" in argv
    assert fusecore.COMPILED, "fusecore was imported before torch.cuda.is_available was patched"
    for name in KERNELS:
        setattr(ops, name, CompileInsteadOfLaunch(getattr(ops, name), name))
    ops.check_step_inputs = lambda *tensors: None  # the tensors stay on the CPU: nothing is launched
    h100 = DeviceFacts("NVIDIA H100 80GB HBM3", "cuda", 132, 50 << 20, 227 << 10, (9, 0))
    ops.device_facts = lambda device: h100
    if argv[:1] == ["--report"]:
        looped = "--looped" in argv
        argv = [arg for arg in argv if arg != "--looped"]
        if len(argv) < 3 or argv[1] not in REPORT_MODELS:
            print(f"usage: compile_sm90.py --report {{{','.join(REPORT_MODELS)}}} BATCH [--looped] [TUNING_JSON ...]")
            return 2
        return report(argv[1], int(argv[2]), [json.loads(text) for text in argv[3:]] or [{}], looped)
    configs = [
        (LlamaConfig(vocab_size=1003, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=2, head_dim=64), torch.bfloat16,
         (1, 8, 64) if full else (1, 8)),
        (LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                     num_attention_heads=6, num_key_value_heads=2, head_dim=8, attention_bias=True,
                     model_type="qwen2"), torch.float32, (1, 3)),
    ]
    for cfg, dtype, batches in configs if full else configs[:1]:
        w = random_weights(cfg, dtype=dtype)
        # batch 1 twice: PDL with the first weight chunk (W_o: two) loaded before each tile's wait, and without
        for batch, pdl_weights in [(1, True)] * (1 in batches) + [(batch, False) for batch in batches]:
            # batch 8 also compiles the K-split residual projections (the 1B and 8B shapes split K)
            # and the barrier polls by acquire loads (inline PTX), per-layer kernels (--all) with
            # programmatic dependent launch; batches 1 and 8 Q/K/V and attention in one launch;
            # batch 1 the looped path as one-tile programs ordered by dependency (dataflow, refused
            # above batch 1), batch 8 the persistent looped schedule; both with a sleep between polls
            # PDL with prefetched weight and cache lines (each PDL kernel's PTX checked: nothing read or
            # written before its wait but the prefetches and the attention tiles' slot reads)
            plan = ops.make_plan(cfg, batch, 40, dtype, torch.device("cuda"), looped_programs=h100.sm_count,
                                 split_k=2 if batch == 8 else None, acquire_loads=batch in (1, 8),
                                 pdl=batch in (1, 8), fuse_attention=batch < 64, dataflow=batch == 1,
                                 poll_sleep_ns=128 if batch < 64 else 0, wait_prefetch=8 if batch < 64 else 0,
                                 attn_prefetch=batch < 64, pdl_weights=int(pdl_weights),
                                 pdl_weights_o=2 * pdl_weights, defer_down=pdl_weights)
            buf = ops.DecodeBuffers.allocate(cfg, plan, dtype, torch.device("cpu"))
            cache = ref.KVCache.empty(cfg, batch, 40, dtype=dtype, device="cpu")
            tokens = torch.zeros(batch, dtype=torch.int64)
            for looped in (False, True) if full or batch == 1 else (True,):
                try:
                    # batch 1 compiles the greedy LM head, other batches the sampling one
                    ops.fused_step(w, cfg, cache, buf, plan, cfg.rope_inv_freq(), tokens, looped=looped,
                                   write_logits=True, sample=batch > 1)
                except Exception as exc:
                    print(f"FAILED: {dtype} batch {batch} looped={looped}: {type(exc).__name__}: {exc}")
                    return 1
    print(f"compiled {len(CompileInsteadOfLaunch.compiled)} kernel variants for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
