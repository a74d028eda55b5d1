"""Benchmark records, the roofline floor, JSON lines and the table printer.

Every measurement in fusekit becomes one :class:`Record`: what was run (domain, case,
implementation), how long it took (median and spread), what it had to move and compute
(bytes, FLOPs), the floor those imply on this device and the fraction of it reached, the
peak memory, and where it ran (GPU, driver, torch / triton versions, git commit, date).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import backend
from .device import DeviceFacts, device_facts
from .timing import Timing


def floor_ms(
    facts: DeviceFacts, bytes_moved: float | None = None, flops: float | None = None, flop_dtype: str = "bfloat16"
) -> float | None:
    """The roofline floor in ms: max(bytes / bandwidth, flops / rate); None when the device has no peak
    entry.  FLOPs given for a dtype the device's entry has no rate for raise ValueError: a floor of the bytes
    alone would understate it (and overstate the fraction reached) without a word."""
    terms = []
    if bytes_moved and facts.bandwidth:
        terms.append(bytes_moved / facts.bandwidth)
    rate = facts.flops(flop_dtype) if flops else None
    if flops and facts.peak is not None and not rate:
        raise ValueError(f"flop_dtype {flop_dtype!r}: the peak table has no rate for it on {facts.name} "
                         f"(rates for {sorted(facts.peak.flops)})")
    if flops and rate:
        terms.append(flops / rate)
    return max(terms) * 1e3 if terms else None


@functools.cache
def _git_commit() -> str:
    """``FUSEKIT_COMMIT`` when set (a copy of the tree whose ``.git`` is absent or stale, as on
    a remote GPU machine), else ``git rev-parse HEAD`` plus ``-dirty`` for uncommitted changes."""
    if os.environ.get("FUSEKIT_COMMIT"):
        return os.environ["FUSEKIT_COMMIT"]
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        commit = out.stdout.strip()
        if commit:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root, capture_output=True, text=True, timeout=5,
            ).stdout.strip()
            return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


@functools.cache
def _driver_version() -> str:
    if not torch.cuda.is_available():
        return "none"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def environment(device: torch.device | str | None = None) -> dict:
    """Where a measurement ran: device name, driver, versions, kernel mode, commit, date."""
    facts = device_facts(device)
    return {
        "gpu": facts.name,
        "driver": _driver_version() if facts.kind == "cuda" else "none",
        "cuda": torch.version.cuda or "none",
        "torch": torch.__version__,
        "triton": backend.triton.__version__,
        "kernel_mode": backend.KERNEL_MODE,
        "commit": _git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass
class Record:
    """One benchmark measurement (see the module docstring)."""

    domain: str
    case: str
    implementation: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    gpu_time: bool
    method: str
    bytes_moved: float | None = None
    flops: float | None = None
    floor_ms: float | None = None
    fraction_of_floor: float | None = None
    peak_memory_bytes: int | None = None
    baseline: str | None = None
    speedup: float | None = None
    params: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    @classmethod
    def from_timing(
        cls,
        domain: str,
        case: str,
        implementation: str,
        timing: Timing,
        *,
        device: torch.device | str | None = None,
        bytes_moved: float | None = None,
        flops: float | None = None,
        flop_dtype: str = "bfloat16",
        peak_memory_bytes: int | None = None,
        params: dict | None = None,
    ) -> Record:
        facts = device_facts(device)
        floor = floor_ms(facts, bytes_moved, flops, flop_dtype) if timing.gpu_time else None
        fraction = floor / timing.median_ms if floor and timing.median_ms > 0 else None
        return cls(
            domain=domain,
            case=case,
            implementation=implementation,
            median_ms=timing.median_ms,
            p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms,
            gpu_time=timing.gpu_time,
            method=timing.method,
            bytes_moved=bytes_moved,
            flops=flops,
            floor_ms=floor,
            fraction_of_floor=fraction,
            peak_memory_bytes=peak_memory_bytes,
            params=dict(params or {}) | ({} if timing.host_ms is None else {"host_ms": timing.host_ms}),
            env=environment(device),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def set_speedups(records: Sequence[Record], baseline: str) -> None:
    """Fill ``speedup`` (baseline median / own median) for records sharing a (domain, case)."""
    base = {(r.domain, r.case): r for r in records if r.implementation == baseline}
    for r in records:
        ref = base.get((r.domain, r.case))
        if ref is not None and r.median_ms > 0:
            r.baseline = baseline
            r.speedup = ref.median_ms / r.median_ms


def write_jsonl(records: Iterable[Record], path: str | os.PathLike, append: bool = True) -> Path:
    """Appends ``records`` to ``path`` as JSON lines (``append=False``: replaces the file).  Every record is
    serialized first: one JSON cannot hold (a ``torch.dtype`` in ``params``) raises with the file untouched."""
    lines = "".join(record.to_json() + "\n" for record in records)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w") as fh:
        fh.write(lines)
    return path


def read_jsonl(path: str | os.PathLike) -> list[Record]:
    records = []
    with Path(path).open() as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(Record(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a fusekit benchmark record ({exc})") from exc
    return records


def _fmt_ms(value: float) -> str:
    if value >= 100:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.3f}"
    return f"{value:.4f}"


def _fmt_bytes(value: float | None) -> str:
    if not value:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return "-"


def format_table(records: Sequence[Record]) -> str:
    """A fixed-width table: domain, case, implementation, median (spread), speedup, floor fraction."""
    headers = ["domain", "case", "implementation", "median ms", "±spread", "speedup", "moved", "floor %", "peak mem"]
    rows = []
    for r in records:
        unit = "" if r.gpu_time else " (cpu)"
        rows.append([
            r.domain,
            r.case,
            r.implementation,
            _fmt_ms(r.median_ms) + unit,
            _fmt_ms(r.p80_ms - r.p20_ms),
            f"{r.speedup:.2f}x" if r.speedup is not None and math.isfinite(r.speedup) else "-",
            _fmt_bytes(r.bytes_moved),
            f"{100 * r.fraction_of_floor:.1f}" if r.fraction_of_floor is not None else "-",
            _fmt_bytes(r.peak_memory_bytes),
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)
    return "\n".join(lines)
