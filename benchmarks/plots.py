"""PNG plots of a run: speedup per case and fraction of the floor, plus each domain's own."""

from __future__ import annotations

from pathlib import Path

from fusecore.report import Record

from .registry import plots as domain_plots


def _bar(records: list[Record], value, ylabel: str, title: str, path: Path, log: bool = False) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{r.domain}/{r.case}\n{r.implementation}", value(r)) for r in records if value(r) is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows) + 2), 4.5))
    ax.bar(range(len(rows)), [v for _, v in rows], color="#3b6ea8")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([label for label, _ in rows], rotation=75, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(records: list[Record], out_dir: Path) -> list[Path]:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib not installed: no plots (pip install 'fusekit[bench]')")
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = "GPU" if any(r.gpu_time for r in records) else "CPU interpreter, not GPU times"
    fused = [r for r in records if r.speedup is not None and r.implementation != r.baseline]
    paths = [
        _bar(fused, lambda r: r.speedup, "speedup over baseline (x)", f"fusekit speedups ({gpu})",
             out_dir / "speedup.png", log=True),
        _bar(records, lambda r: None if r.fraction_of_floor is None else 100 * r.fraction_of_floor,
             "% of the roofline floor", f"fraction of the floor ({gpu})", out_dir / "floor_fraction.png"),
    ]
    for _domain, fn in domain_plots():
        paths.extend(fn(records, out_dir) or [])
    return [p for p in paths if p is not None]
