"""Tile sweep of fusecore.linear.weight_grad (``gradᵀ x``, a float32 linear map's ∂W over a graph's rows: tensor
cores in three TF32 parts, the rows split among programs) on the GPU machine, beside torch's float32 product
(cuBLAS, what the layers' backward ran before).

    python3 tests/fusecore/weight_grad_sweep.py [--quick]

Every row: the median µs of CUDA-graph replays (``fusecore.timing``), the share of the memory floor (both operands
read once, the output written once, at the device's copy bandwidth) and the largest error against a float64
product relative to its largest magnitude.  Configurations are ``BLOCK_M,BLOCK_N,BLOCK_R,warps,stages,programs per
SM`` (the ``WEIGHT_GRAD_*`` constants).  A tuning tool: the layers' A/B is ``tests/gnnfuse/ab_layers.py``.
"""

from __future__ import annotations

import json
import sys

import torch

from fusecore import linear as L
from fusecore.device import device_facts
from fusecore.timing import measure

# BLOCK_M, BLOCK_N, BLOCK_R, warps, stages, programs per SM
CONFIGS = [(64, 64, 32, 4, 3, 2), (64, 64, 32, 4, 3, 3), (64, 64, 32, 4, 4, 3), (128, 64, 32, 8, 3, 2),
           (128, 64, 32, 8, 3, 1), (64, 128, 32, 8, 3, 2), (128, 128, 32, 8, 3, 1), (64, 64, 64, 4, 2, 2),
           (64, 32, 32, 4, 3, 4), (32, 64, 32, 4, 3, 4)]
# name: (rows, M = ∂y's width, N = the input's width)
SHAPES = {
    "TR / TR+EF dW arxiv 512x128": (169_343, 512, 128),
    "GATv2 dW arxiv 256x128": (169_343, 256, 128),
    "GAT dW arxiv 128x128": (169_343, 128, 128),
}
SETTINGS = ("WEIGHT_GRAD_BLOCK_M", "WEIGHT_GRAD_BLOCK_N", "WEIGHT_GRAD_BLOCK_R", "WEIGHT_GRAD_WARPS",
            "WEIGHT_GRAD_STAGES", "WEIGHT_GRAD_PROGRAMS_PER_SM")


def _row(label: str, impl: str, fn, want: torch.Tensor, floor_us: float, **extra) -> None:
    out = fn()
    error = (out.double() - want).abs().max().item() / want.abs().max().item()
    us = measure(fn, cuda_graph=True, rep_ms=40).median_ms * 1e3
    print(json.dumps({"shape": label, "impl": impl, "us": round(us, 1), "floor %": round(100 * floor_us / us, 1),
                      "rel error": float(f"{error:.2e}"), **extra}), flush=True)


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    device = torch.device("cuda")
    bandwidth = device_facts(device).peak.bandwidth
    gen = torch.Generator(device=device).manual_seed(5)
    saved = {name: getattr(L, name) for name in SETTINGS}
    print(f"# {torch.cuda.get_device_name()} — fusecore.linear.weight_grad sweep; defaults {saved}", flush=True)
    for label, (rows, m, n) in SHAPES.items():
        grad = torch.randn(rows, m, device=device, generator=gen)
        x = torch.randn(rows, n, device=device, generator=gen)
        want = grad.double().t() @ x.double()
        floor_us = (rows * (m + n) + m * n) * 4 / bandwidth * 1e6
        _row(label, "torch float32 (cuBLAS)", lambda g=grad, x=x: g.t() @ x, want, floor_us)
        for config in CONFIGS[:2] if quick else CONFIGS:
            try:
                for name, value in zip(SETTINGS, config):
                    setattr(L, name, value)
                _row(label, "weight_grad", lambda g=grad, x=x: L.weight_grad(g, x), want, floor_us,
                     config=",".join(map(str, config)))
            except Exception as error:  # out of shared memory or registers for this tile: say so and go on
                print(json.dumps({"shape": label, "config": str(config), "failed": str(error)[:160]}), flush=True)
            finally:
                for name, value in saved.items():
                    setattr(L, name, value)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
