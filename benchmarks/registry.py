"""The one registration interface through which each domain contributes benchmark cases.

A case is a function ``run(ctx: Context) -> None`` registered with :func:`case`.  It builds
its inputs (small when ``ctx.quick``), checks the fused output against its baseline with
``ctx.check`` and times each implementation with ``ctx.time``; the harness collects the
records, computes speedups over the case's baseline, prints the table and writes JSON and
plots.  Cases never time or format anything themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fusecore import backend
from fusecore.report import Record
from fusecore.testing import rel_error
from fusecore.timing import host_probe_us, measure, peak_memory

DOMAINS = ("core", "gnn", "sim", "llm")


@dataclass
class Case:
    domain: str
    name: str
    baseline: str
    run: Callable[[Context], None]
    description: str = ""
    headline: bool = True


_CASES: list[Case] = []


def case(domain: str, name: str, *, baseline: str, description: str = "", headline: bool = True):
    """Decorator registering ``run(ctx)`` as benchmark case ``domain/name``.

    ``baseline`` names the implementation speedups are computed against (the unfused
    PyTorch reference, usually).  ``headline=False`` marks a tuning sweep or a breakdown
    (variants of fusekit against its own default): recorded and plotted like every case,
    left out of the README's headline table, which compares fusekit with other code.
    """
    if domain not in DOMAINS:
        raise ValueError(f"domain must be one of {DOMAINS}, got {domain!r}")

    def register(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        if any(c.domain == domain and c.name == name for c in _CASES):
            raise ValueError(f"benchmark case {domain}/{name} registered twice")
        _CASES.append(Case(domain, name, baseline, fn, description or (fn.__doc__ or "").strip(), headline))
        return fn

    return register


def cases() -> list[Case]:
    return list(_CASES)


class CheckFailed(AssertionError):
    pass


@dataclass
class Context:
    """What a case gets: the size mode, the device, and the timing / checking services."""

    quick: bool
    device: torch.device
    case: Case
    records: list[Record] = field(default_factory=list)
    checks: list[tuple[str, float, float]] = field(default_factory=list)
    # Under the interpreter each timed call is slow; keep the budget small there.
    rep_ms: float = 100.0
    # do_bench_cudagraph captures a graph of rep_ms worth of calls and replays it 10 times (the
    # median is over those replays): 25 ms per replay keeps a replayed row near 0.3 s and its
    # median as stable as the called rows' (each replay averages many calls already).
    replay_rep_ms: float = 25.0
    # Called with each record as soon as it is timed (the harness saves the run so far: a case
    # cut short by a time limit keeps the rows it measured).
    on_record: Callable[[Record], None] | None = None
    # ``--graph``: the graphs the gnn layer cases run (None: all).  Every record of such a run carries
    # ``params["graphs_selected"]``, so that a merge replaces only those graphs' rows of its case
    # (:func:`benchmarks.__main__.merge`).
    graphs: tuple[str, ...] | None = None

    @property
    def gpu(self) -> bool:
        return self.device.type == "cuda" and backend.COMPILED

    def time(
        self,
        implementation: str,
        fn: Callable[[], object],
        *,
        bytes_moved: float | None = None,
        flops: float | None = None,
        flop_dtype: str = "bfloat16",
        cuda_graph: bool = False,
        back_to_back: bool = False,
        memory: bool = False,
        params: dict | None = None,
        variant: str | None = None,
    ) -> Record:
        """Time ``fn`` (median of many runs) and add a record for ``implementation``.

        ``back_to_back`` (GPU): wall time per call of calls issued one after another, the
        host's launch work included (``fusecore.timing.measure``); the CPU times every call so.

        Every row that is not a replay records the host's speed just before and just after its
        measurement, ``params["host_probe_us"]`` (:func:`fusecore.timing.host_probe_us`): as-called
        rows of host-bound calls follow it.

        ``variant`` extends the case name (for example a size or dtype) so one case can emit
        several rows; records of one (case, variant) share a baseline.
        """
        on_gpu = self.device.type == "cuda"
        if not on_gpu:
            rep_ms = min(self.rep_ms, 20.0)
        else:
            rep_ms = min(self.rep_ms, self.replay_rep_ms) if cuda_graph else self.rep_ms
        # the host's speed around a row whose time can include the host's issue work (not a replay)
        probe = None if cuda_graph and on_gpu else host_probe_us()
        timing = measure(
            fn,
            device=self.device,
            rep_ms=rep_ms,
            warmup_ms=25.0 if on_gpu else 0.0,
            cuda_graph=cuda_graph and on_gpu,
            back_to_back=back_to_back and on_gpu,
            min_cpu_reps=1 if self.quick else 3,
        )
        if probe is not None:
            probe = [round(probe, 1), round(host_probe_us(), 1)]
        peak = peak_memory(fn, self.device) if (memory and on_gpu) else None
        name = self.case.name if variant is None else f"{self.case.name}[{variant}]"
        params = dict(params or {})
        if probe is not None:
            params["host_probe_us"] = probe
        if self.graphs is not None:
            params["graphs_selected"] = list(self.graphs)
        record = Record.from_timing(
            self.case.domain, name, implementation, timing,
            device=self.device, bytes_moved=bytes_moved, flops=flops, flop_dtype=flop_dtype,
            peak_memory_bytes=peak, params=params,
        )
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)
        return record

    def check(self, what: str, out: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
        """Assert ``rel_error(out, ref) <= tol``; failures stop the case and are reported."""
        err = rel_error(out, ref)
        self.checks.append((what, err, tol))
        if not err <= tol:
            raise CheckFailed(f"{self.case.domain}/{self.case.name}: {what}: relative error {err:.3e} > {tol:.1e}")
        return err


PlotFn = Callable[[list[Record], "object"], list]
_PLOTS: list[tuple[str, PlotFn]] = []


def plot(domain: str):
    """Decorator registering ``fn(records, out_dir) -> [paths]``, a domain's own plot
    (the simfuse complexity curve, llmfuse ms/token against batch).  It receives all records
    of the run and draws from those of its domain; matplotlib is imported by the caller."""

    def register(fn: PlotFn) -> PlotFn:
        _PLOTS.append((domain, fn))
        return fn

    return register


def plots() -> list[tuple[str, PlotFn]]:
    return list(_PLOTS)
