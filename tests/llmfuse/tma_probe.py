"""Weight streaming on the H200 for batch-1 decode: registers (a chunk ahead) against TMA copies, GPU only.

    python3 tests/llmfuse/tma_probe.py launch       one launch per matrix (as the per-layer kernels)
    python3 tests/llmfuse/tma_probe.py persistent   one launch of 1 or 2 persistent programs per SM (a looped kernel)

Standalone kernels, not llmfuse's: ``y = W x`` for a bf16 W [N, K] of a Llama-3.2-1B instruction's shape (Q/K/V
3072 x 2048, W_o 2048 x 2048, gate/up 16384 x 2048, W_down 2048 x 8192) and a float32 x, each tile ``block_n``
rows, products summed elementwise over ``block_k``-column chunks and across the chunk once at the end (as
``llmfuse.kernels.matvec._one_row``).  ``reg``: the next chunk's loads issued before the current chunk is used
(two chunks in registers); ``tma``: a host-side TMA descriptor, the chunk loop software-pipelined ``stages`` deep
by Triton (``tl.range(num_stages=...)``: ``stages - 1`` chunks in flight in shared memory, few registers).
``launch``: 20 launches of one grid (a program per tile) replayed from a CUDA graph, the weights of 16 layers in
turn (so they come from HBM); ``persistent``: one launch of ``per_sm`` x SMs programs, each walking its tiles'
chunks as one flattened loop (with TMA pipelined across tile boundaries), over 4 layers' weights.  Each row
checks ``y`` against ``W.float() @ x`` and prints µs and the share of the bandwidth floor (N·K·2 bytes at
4.28 TB/s).  The kernels are ``fusecore.backend.jit``'s, so ``tests/llmfuse/test_tma_probe.py`` runs them under the
interpreter.  Measured in session 35 (llmfuse/JOURNAL.md, ``benchmarks/results/H200/llm-tma-probe-*.s35c*.log``).
"""

import functools
import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fusecore.backend import jit

SHAPES = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}
FLOOR_BYTES_PER_US = 4.28e6


@jit
def rows_reg(w_ptr, x_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One tile of BLOCK_N rows, the next chunk's loads before the current chunk's products."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = w_ptr + n.to(tl.int64)[:, None] * K
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    w = tl.load(rows + k[None, :], mask=(n < N)[:, None], other=0.0, eviction_policy="evict_first")
    x = tl.load(x_ptr + k, cache_modifier=".cg")
    for k0 in range(0, K, BLOCK_K):
        kn = k0 + BLOCK_K + k
        w_next = tl.load(rows + kn[None, :], mask=(n < N)[:, None] & (kn < K)[None, :], other=0.0,
                         eviction_policy="evict_first")
        x_next = tl.load(x_ptr + kn, mask=kn < K, other=0.0, cache_modifier=".cg")
        acc += w.to(tl.float32) * x[None, :]
        w, x = w_next, x_next
    tl.store(y_ptr + n, tl.sum(acc, axis=1), mask=n < N)


@jit
def rows_tma(desc, x_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """One tile of BLOCK_N rows through TMA copies, the chunk loop pipelined STAGES deep."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        w = desc.load([tl.program_id(0) * BLOCK_N, k0])
        x = tl.load(x_ptr + k0 + tl.arange(0, BLOCK_K), cache_modifier=".cg")
        acc += w.to(tl.float32) * x[None, :]
    tl.store(y_ptr + n, tl.sum(acc, axis=1), mask=n < N)


@jit
def persistent_reg(w_ptr, x_ptr, y_ptr, tiles, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   CHUNKS: tl.constexpr):
    """Tiles pid, pid + P, ... of BLOCK_N rows as one loop over (tile, chunk), a chunk ahead in registers."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    total = (tiles - pid + progs - 1) // progs * CHUNKS
    nn = tl.arange(0, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    zero = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.int32)  # masks as tensors (the interpreter takes no scalar mask)
    w = tl.load(w_ptr + (pid * BLOCK_N + nn).to(tl.int64)[:, None] * K + kk[None, :], mask=zero < total, other=0.0)
    x = tl.load(x_ptr + kk, cache_modifier=".cg")
    for it in range(0, total):
        nxt = it + 1
        tile_next = pid + (nxt // CHUNKS) * progs
        k_next = (nxt % CHUNKS) * BLOCK_K
        w_next = tl.load(w_ptr + (tile_next * BLOCK_N + nn).to(tl.int64)[:, None] * K + (k_next + kk)[None, :],
                         mask=zero + nxt < total, other=0.0, eviction_policy="evict_first")
        x_next = tl.load(x_ptr + k_next + kk, cache_modifier=".cg")
        acc += w.to(tl.float32) * x[None, :]
        if it % CHUNKS == CHUNKS - 1:
            tl.store(y_ptr + (pid + (it // CHUNKS) * progs) * BLOCK_N + nn, tl.sum(acc, axis=1))
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        w, x = w_next, x_next


@jit
def persistent_tma(desc, x_ptr, y_ptr, tiles, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr,
                   STAGES: tl.constexpr):
    """Tiles pid, pid + P, ... of BLOCK_N rows as one loop over (tile, chunk), TMA copies pipelined STAGES deep
    across tile boundaries."""
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    total = (tiles - pid + progs - 1) // progs * CHUNKS
    nn = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for it in tl.range(0, total, num_stages=STAGES):
        tile = pid + (it // CHUNKS) * progs
        k0 = (it % CHUNKS) * BLOCK_K
        w = desc.load([tile * BLOCK_N, k0])
        x = tl.load(x_ptr + k0 + tl.arange(0, BLOCK_K), cache_modifier=".cg")
        acc += w.to(tl.float32) * x[None, :]
        if it % CHUNKS == CHUNKS - 1:
            tl.store(y_ptr + tile * BLOCK_N + nn, tl.sum(acc, axis=1))
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)


def replayed_us(fn, reps: int) -> float:
    """µs per call of ``fn``, ``reps`` calls captured in one CUDA graph (median replay, do_bench)."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    return triton.testing.do_bench(graph.replay, warmup=50, rep=300) * 1000 / reps


def row(fn, y, ref, floor_us, reps, **fields) -> None:
    """One JSON line: ``fn``'s first call checked against ``ref`` (largest absolute error), then timed."""
    y.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    err = (y - ref).abs().max().item()
    us = replayed_us(fn, reps)
    print(json.dumps({**fields, "us": round(us, 3), "floor_pct": round(100 * floor_us / us, 1), "err": err}),
          flush=True)


def _rotating(launcher, operands: list, turn: list, *args, **meta) -> None:
    """``launcher`` on the next of ``operands`` (the layers' weights or descriptors in turn, from HBM)."""
    turn[0] = (turn[0] + 1) % len(operands)
    launcher(operands[turn[0]], *args, **meta)


def launch() -> None:
    torch.manual_seed(0)
    layers = 16
    for name, (N, K) in SHAPES.items():
        weights = [torch.randn(N, K, device="cuda").to(torch.bfloat16) for _ in range(layers)]
        x = torch.randn(K, device="cuda")
        y = torch.empty(N, device="cuda")
        ref = weights[0].float() @ x
        floor_us = N * K * 2 / FLOOR_BYTES_PER_US
        for bn in (8, 16):
            grid = (triton.cdiv(N, bn),)
            for bk in (256, 512, 1024):
                fn = functools.partial(_rotating, rows_reg[grid], weights, [-1], x, y, N, K, BLOCK_N=bn, BLOCK_K=bk,
                                       num_warps=4)
                row(fn, y, ref, floor_us, 20, shape=name, kind="reg", block_n=bn, block_k=bk)
            for bk in (128, 256):
                descs = [TensorDescriptor.from_tensor(w, [bn, bk]) for w in weights]
                for stages in (2, 3, 4, 6, 8):
                    fn = functools.partial(_rotating, rows_tma[grid], descs, [-1], x, y, N, K, BLOCK_N=bn, BLOCK_K=bk,
                                           STAGES=stages, num_warps=4)
                    row(fn, y, ref, floor_us, 20, shape=name, kind="tma", block_n=bn, block_k=bk, stages=stages)
        del weights


def persistent() -> None:
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    layers = 4
    for name in ("gate_up", "down", "qkv"):
        N, K = SHAPES[name]
        w = torch.randn(layers * N, K, device="cuda").to(torch.bfloat16)  # the layers back to back
        x = torch.randn(K, device="cuda")
        y = torch.empty(layers * N, device="cuda")
        ref = w.float() @ x
        floor_us = layers * N * K * 2 / FLOOR_BYTES_PER_US
        shape = f"{name}_{layers}L"
        for bn in (8, 16):
            tiles = layers * N // bn
            for bk in (256, 512):
                for per_sm, warps in ((1, 4), (1, 8), (2, 4)):
                    fn = functools.partial(persistent_reg[(sms * per_sm,)], w, x, y, tiles, K, BLOCK_N=bn,
                                           BLOCK_K=bk, CHUNKS=K // bk, num_warps=warps)
                    row(fn, y, ref, floor_us, 10, shape=shape, kind="reg", block_n=bn, block_k=bk, per_sm=per_sm,
                        warps=warps)
            for bk in (128, 256):
                desc = TensorDescriptor.from_tensor(w, [bn, bk])
                for stages in (3, 5, 8):
                    for per_sm in (1, 2):
                        fn = functools.partial(persistent_tma[(sms * per_sm,)], desc, x, y, tiles, BLOCK_N=bn,
                                               BLOCK_K=bk, CHUNKS=K // bk, STAGES=stages, num_warps=4)
                        row(fn, y, ref, floor_us, 10, shape=shape, kind="tma", block_n=bn, block_k=bk, stages=stages,
                            per_sm=per_sm, warps=4)
        del w


if __name__ == "__main__":
    {"launch": launch, "persistent": persistent}[sys.argv[1]]()
