"""Tile sweep of fusecore.linear.product (float32 operands, tensor cores in three TF32 parts) on the GPU
machine, at the products of gnnfuse's float32 layers, beside torch's float32 product (cuBLAS).

    python3 tests/fusecore/product_sweep.py [--quick]

Every row: the median µs of CUDA-graph replays (``fusecore.timing``), the share of the memory floor
(operands read once, output written once, at the device's copy bandwidth) and the largest error against a
float64 product relative to its largest magnitude, torch's beside it.  Configurations are
``BLOCK_M,BLOCK_N,BLOCK_K,warps,stages`` of the slice kernel (the split rows also vary ``SPLIT_TILES_PER_SM``)
and ``BLOCK_M,BLOCK_N,warps,stages,flatten,programs per SM`` of the persistent row-block kernel and
``BLOCK_M,BLOCK_N,warps,stages,programs per SM,HELD_SUMS[,HELD_CHUNK_K]`` of the held-parts kernel (reductions
of at most ``HELD_MAX_K``), set on the module's constants.  A tuning tool: the benchmark case is ``core/linears``.
"""

from __future__ import annotations

import json
import sys

import torch

from fusecore import linear as L
from fusecore.device import device_facts
from fusecore.timing import measure

# slice kernel (product_kernel): BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
CONFIGS = [(128, 64, 32, 4, 3)]
# persistent row-block kernel (product_rows_kernel): BLOCK_M, BLOCK_N, warps, stages, flatten, programs per SM,
# FLOAT32_PRODUCT
ROWS_CONFIGS = [
    (128, 64, 4, 4, True, 2, "tf32x3"), (128, 64, 4, 4, True, 2, "bf16x6"), (128, 64, 4, 4, True, 3, "tf32x3"),
    (128, 64, 4, 5, True, 2, "tf32x3"), (128, 32, 4, 4, True, 3, "tf32x3"), (128, 64, 4, 4, False, 2, "tf32x3"),
    (256, 64, 8, 3, True, 1, "tf32x3"), (128, 128, 8, 4, True, 1, "bf16x6"),
]
# held-parts kernel (product_held_kernel, reductions up to HELD_MAX_K): BLOCK_M, BLOCK_N, warps, stages, programs per
# SM, HELD_SUMS[, HELD_CHUNK_K].  The chunk sets how often the tensor cores wait: Triton 3.6 waits for each of a
# chunk's three products before the next (sm_90 TTGIR: 12 waits a row block at 32, 6 at 64, 3 at 128); compiled on
# the CPU (session 47), 128 x 64 at 8 warps with 64-deep chunks in 2 stages takes 241 registers and 161 KiB without
# spilling, 64 x 64 at 4 warps in 3 stages 255 registers and 145 KiB; 128-deep chunks spill.
HELD_CONFIGS = [(128, 64, 8, 3, 1, 1), (128, 64, 8, 2, 1, 1, 64), (64, 64, 4, 3, 1, 1, 64), (64, 64, 4, 2, 2, 1, 64),
                (128, 64, 8, 3, 1, 2), (64, 64, 4, 2, 2, 2), (64, 128, 4, 3, 1, 1), (64, 64, 4, 2, 2, 1)]
# name: (M, K, N, a transposed, b a transposed view) — a [M, K] @ b [K, N]; the layers' forward reads b = Wᵀ
SHAPES = {
    "GAT fwd arxiv 128->128": (169_343, 128, 128, False, True),
    "GATv2 fwd arxiv 128->256": (169_343, 128, 256, False, True),
    "TR fwd arxiv 128->512": (169_343, 128, 512, False, True),
    "TR fwd arxiv 128->512, b row-major": (169_343, 128, 512, False, False),
    "TR dx arxiv 512->128": (169_343, 512, 128, False, False),
}
SETTINGS = ("PRODUCT_BLOCK_M", "PRODUCT_BLOCK_N", "PRODUCT_BLOCK_K", "PRODUCT_WARPS", "PRODUCT_STAGES",
            "SPLIT_TILES_PER_SM", "SPLIT_MIN_K", "FLOAT32_PRODUCT", "ROWS_KERNEL", "ROWS_BLOCK_M", "ROWS_BLOCK_N",
            "ROWS_WARPS", "ROWS_STAGES", "ROWS_FLATTEN", "ROWS_PROGRAMS_PER_SM", "HELD_KERNEL", "HELD_BLOCK_M",
            "HELD_BLOCK_N", "HELD_WARPS", "HELD_STAGES", "HELD_PROGRAMS_PER_SM", "HELD_SUMS", "HELD_CHUNK_K")


def _row(label: str, impl: str, fn, want: torch.Tensor, floor_us: float, **extra) -> None:
    out = fn()
    error = (out.double() - want).abs().max().item() / want.abs().max().item()
    us = measure(fn, cuda_graph=True, rep_ms=40).median_ms * 1e3
    print(json.dumps({"shape": label, "impl": impl, "us": round(us, 1), "floor %": round(100 * floor_us / us, 1),
                      "rel error": float(f"{error:.2e}"), **extra}), flush=True)


def _sweep(label: str, a: torch.Tensor, b: torch.Tensor, transposed: bool, quick: bool, bandwidth: float,
           saved: dict) -> None:
    (m, k), n = a.shape, b.shape[1]
    want = a.double() @ b.double()
    floor_us = (m * k + k * n + m * n) * 4 / bandwidth * 1e6
    _row(label, "torch float32 (cuBLAS)", lambda: a @ b, want, floor_us)
    configs = CONFIGS[:1] if quick else CONFIGS
    splits = [(L.SPLIT_TILES_PER_SM, L.SPLIT_MIN_K)]
    if transposed:  # the ∂W products: their reduction over the rows is split
        splits = [(2, 1024), (4, 1024)]
    rows = [] if transposed else [(cfg, None) for cfg in (ROWS_CONFIGS[:1] if quick else ROWS_CONFIGS)]
    held = [] if transposed or k > L.HELD_MAX_K else [(cfg, "held") for cfg in (HELD_CONFIGS[:1] if quick
                                                                                  else HELD_CONFIGS)]
    for config, split in [*[(cfg, sp) for cfg in configs for sp in splits], *rows, *held]:
        try:
            L.HELD_KERNEL = split == "held"
            if split == "held":
                (L.HELD_BLOCK_M, L.HELD_BLOCK_N, L.HELD_WARPS, L.HELD_STAGES, L.HELD_PROGRAMS_PER_SM,
                 L.HELD_SUMS) = config[:6]
                L.HELD_CHUNK_K = config[6] if len(config) > 6 else saved["HELD_CHUNK_K"]
                impl, extra = "product (held parts)", {"config": ",".join(map(str, config))}
            elif split is not None or transposed:
                bm, bn, bk, warps, stages = config
                L.ROWS_KERNEL = False
                L.PRODUCT_BLOCK_M, L.PRODUCT_BLOCK_N, L.PRODUCT_BLOCK_K = bm, bn, bk
                L.PRODUCT_WARPS, L.PRODUCT_STAGES = warps, stages
                L.SPLIT_TILES_PER_SM, L.SPLIT_MIN_K = split
                impl, extra = "product (slices)", {"config": ",".join(map(str, config)),
                                                   "split": f"{split[0]},{split[1]}" if transposed else None}
            else:
                bm, bn, warps, stages, flatten, per_sm, L.FLOAT32_PRODUCT = config
                L.ROWS_KERNEL = True
                L.ROWS_BLOCK_M, L.ROWS_BLOCK_N, L.ROWS_WARPS = bm, bn, warps
                L.ROWS_STAGES, L.ROWS_FLATTEN, L.ROWS_PROGRAMS_PER_SM = stages, flatten, per_sm
                impl, extra = "product (row blocks)", {"config": ",".join(map(str, config))}
            _row(label, impl, lambda: L.product(a, b), want, floor_us, **extra)
        except Exception as error:  # out of shared memory for this tile: say so and go on
            print(json.dumps({"shape": label, "config": str(config), "failed": str(error)[:160]}), flush=True)
        finally:
            for name, value in saved.items():
                setattr(L, name, value)


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    device = torch.device("cuda")
    bandwidth = device_facts(device).peak.bandwidth
    gen = torch.Generator(device=device).manual_seed(3)
    saved = {name: getattr(L, name) for name in SETTINGS}
    print(f"# {torch.cuda.get_device_name()} — fusecore.linear.product sweep; defaults {saved}", flush=True)
    for label, (m, k, n, transposed, b_transposed) in SHAPES.items():
        if quick:
            m, k = (min(m, 4096), k) if not transposed else (m, min(k, 8192))
        a = torch.randn(k, m, device=device, generator=gen).t() if transposed else \
            torch.randn(m, k, device=device, generator=gen)
        b = (torch.randn(n, k, device=device, generator=gen).t() if b_transposed else
             torch.randn(k, n, device=device, generator=gen)) / k ** 0.5
        _sweep(label, a, b, transposed, quick, bandwidth, saved)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
