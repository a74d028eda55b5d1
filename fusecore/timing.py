"""Timing: median of many runs after warm-up, with device events, optionally under CUDA graphs.

On a CUDA device :func:`measure` uses ``triton.testing.do_bench`` (CUDA events, L2 flushed
between runs, warm-up before timing) or ``do_bench_cudagraph`` when ``cuda_graph=True``
(launch overhead removed by replaying a captured graph).  On the CPU it falls back to a
wall-clock loop and marks the result ``gpu_time=False`` so nobody mistakes interpreter
times for GPU times.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .backend import triton


@dataclass(frozen=True)
class Timing:
    """Median and spread (20th / 80th percentile) of one measurement, in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    gpu_time: bool
    method: str

    @property
    def spread_ms(self) -> float:
        return self.p80_ms - self.p20_ms


def _on_cuda(device: torch.device | str | None) -> bool:
    if device is None:
        return torch.cuda.is_available()
    return torch.device(device).type == "cuda"


def measure(
    fn: Callable[[], object],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    cuda_graph: bool = False,
    min_cpu_reps: int = 3,
) -> Timing:
    """Time ``fn()`` and return its median and spread.

    ``device`` says where ``fn`` runs (default: CUDA when available).  ``warmup_ms`` and
    ``rep_ms`` are the warm-up and measurement budgets in milliseconds, as in
    ``triton.testing.do_bench``.  ``cuda_graph=True`` captures ``fn`` in a CUDA graph and
    times replays (fn must be capturable: static shapes, no host syncs).
    """
    if _on_cuda(device):
        quantiles = [0.5, 0.2, 0.8]
        if cuda_graph:
            with torch.cuda.stream(torch.cuda.Stream()):
                med, lo, hi = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, quantiles=quantiles)
            method = "do_bench_cudagraph"
        else:
            med, lo, hi = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=quantiles)
            method = "do_bench"
        return Timing(float(med), float(lo), float(hi), gpu_time=True, method=method)

    if cuda_graph:
        raise ValueError("cuda_graph=True needs a CUDA device")
    fn()  # warm-up: first-call costs (interpreter rewrite, allocations) stay out
    samples: list[float] = []
    budget_end = time.perf_counter() + rep_ms / 1e3
    while len(samples) < min_cpu_reps or time.perf_counter() < budget_end:
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
        if len(samples) >= 1000:
            break
    samples.sort()
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else samples * 9
    return Timing(statistics.median(samples), q[1], q[7], gpu_time=False, method="perf_counter (cpu)")


def peak_memory(fn: Callable[[], object], device: torch.device | str | None = None) -> int | None:
    """Peak bytes allocated by torch on the CUDA device while ``fn()`` runs (None on CPU).

    Counts what ``fn`` allocates above what was already live, so inputs prepared beforehand
    are not charged to it.
    """
    if not _on_cuda(device):
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)
