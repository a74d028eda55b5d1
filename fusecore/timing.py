"""Timing: median of many runs after warm-up, with device events, optionally under CUDA graphs.

On a CUDA device :func:`measure` uses ``triton.testing.do_bench`` (CUDA events, L2 flushed
between runs, warm-up before timing) or ``do_bench_cudagraph`` when ``cuda_graph=True``
(launch overhead removed by replaying a captured graph).  ``back_to_back=True`` times what a
training or decode loop sees instead: calls issued one after another with no flush and no
synchronisation between them, wall clock per call over batches of calls, so the host's launch
work counts wherever it exceeds the GPU's (do_bench's L2 flush between runs hides up to tens
of microseconds of it).  On the CPU :func:`measure` falls back to a wall-clock loop and marks
the result ``gpu_time=False`` so nobody mistakes interpreter times for GPU times.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .backend import triton


@dataclass(frozen=True)
class Timing:
    """Median and spread (20th / 80th percentile) of one measurement, in milliseconds.

    ``host_ms``: for back-to-back timing, the median time the host spent issuing one call
    (returning from ``fn``), beside ``median_ms``, the wall time per call once the GPU is done."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    gpu_time: bool
    method: str
    host_ms: float | None = None

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
    back_to_back: bool = False,
    min_cpu_reps: int = 3,
) -> Timing:
    """Time ``fn()`` and return its median and spread.

    ``device`` says where ``fn`` runs (default: CUDA when available).  ``warmup_ms`` and
    ``rep_ms`` are the warm-up and measurement budgets in milliseconds, as in
    ``triton.testing.do_bench``.  ``cuda_graph=True`` captures ``fn`` in a CUDA graph and
    times replays (fn must be capturable: static shapes, no host syncs).  ``back_to_back=True``
    (CUDA only): wall clock per call of calls issued one after another (see the module
    docstring), with the host's issue time per call in ``host_ms``.
    """
    for name, value in (("warmup_ms", warmup_ms), ("rep_ms", rep_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number of milliseconds >= 0, got {value!r}")
    if isinstance(min_cpu_reps, bool) or not isinstance(min_cpu_reps, int) or min_cpu_reps < 1:
        raise ValueError(f"min_cpu_reps must be an int >= 1 (a median needs samples), got {min_cpu_reps!r}")
    if cuda_graph and back_to_back:
        raise ValueError("cuda_graph and back_to_back exclude each other: a replay has no host launch work")
    if back_to_back:
        if not _on_cuda(device):
            raise ValueError("back_to_back=True needs a CUDA device (on the CPU every call is back to back)")
        return _back_to_back(fn, torch.device(device or "cuda"), warmup_ms, rep_ms)
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
    lo, hi = _quantiles(samples)
    return Timing(statistics.median(samples), lo, hi, gpu_time=False, method="perf_counter (cpu)")


BATCH_MS = 2.0  # wall time of one batch of back-to-back calls: long against a synchronisation
MIN_BATCHES = 10


def batch_size(per_call_ms: float, batch_ms: float = BATCH_MS, most: int = 10_000) -> int:
    """Calls per batch so one batch lasts about ``batch_ms`` (at least 2: one call's pipeline
    ramp and final synchronisation are shared by the batch)."""
    if per_call_ms <= 0:
        return most
    return max(2, min(most, round(batch_ms / per_call_ms)))


def _back_to_back(fn: Callable[[], object], device: torch.device, warmup_ms: float, rep_ms: float) -> Timing:
    clock = time.perf_counter
    torch.cuda.synchronize(device)
    start, calls = clock(), 0
    while calls < 3 or (clock() - start) * 1e3 < warmup_ms:
        fn()
        calls += 1
    torch.cuda.synchronize(device)
    n = batch_size((clock() - start) * 1e3 / calls)
    walls: list[float] = []
    issues: list[float] = []
    budget_end = clock() + rep_ms / 1e3
    while len(walls) < MIN_BATCHES or clock() < budget_end:
        torch.cuda.synchronize(device)
        t0 = clock()
        for _ in range(n):
            fn()
        t1 = clock()
        torch.cuda.synchronize(device)
        t2 = clock()
        issues.append((t1 - t0) * 1e3 / n)
        walls.append((t2 - t0) * 1e3 / n)
    lo, hi = _quantiles(walls)
    return Timing(statistics.median(walls), lo, hi, gpu_time=True, method=f"back-to-back x{n}",
                  host_ms=statistics.median(issues))


def _quantiles(samples: list[float]) -> tuple[float, float]:
    """20th and 80th percentiles."""
    if len(samples) == 1:
        return samples[0], samples[0]
    q = statistics.quantiles(sorted(samples), n=10, method="inclusive")
    return q[1], q[7]


HOST_PROBE_ADDITIONS = 20_000  # one probe run: this many integer additions in a Python loop (~0.5-1.5 ms)


def host_probe_us(repeats: int = 5) -> float:
    """The host's current speed: median µs of ``repeats`` runs of a fixed pure-Python loop
    (:data:`HOST_PROBE_ADDITIONS` integer additions), no torch and no device involved.

    An as-called time of a host-bound call (a layer whose launches take longer to issue than the
    GPU takes to run them) scales with how fast the host runs Python at that moment, and the
    GPU machines' hosts do not run at one speed: in session 29 this loop's time on the H200
    machine switched between two levels about 1.9x apart within one process, seconds apart, and the
    issue time of a GAT forward followed it (gnnfuse/JOURNAL.md, "Session 29").  The benchmark
    harness records this probe beside every row it does not replay (``params["host_probe_us"]``,
    before and after the measurement), so a row taken in the slow state can be told from one
    taken in the fast state.
    """
    samples = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        total = 0
        for i in range(HOST_PROBE_ADDITIONS):
            total += i
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)


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
