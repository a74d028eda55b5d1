"""PNG plots of a run: speedup and fraction of the floor of fusekit's fastest row per case (the
README table's selection), plus each domain's own."""

from __future__ import annotations

from pathlib import Path

from fusecore.report import Record

from .registry import plots as domain_plots


def _bar(records: list[Record], value, ylabel: str, title: str, path: Path, log: bool = False) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{r.domain}/{r.case}: {r.implementation}", value(r)) for r in records if value(r) is not None]
    if not rows:
        return None
    # horizontal bars, one line per row: readable labels however many cases a domain has
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.2 * len(rows) + 1.2)))
    ax.barh(range(len(rows)), [v for _, v in rows], color="#3b6ea8")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_xscale("log")
    ax.grid(axis="x", alpha=0.3)
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
    from .readme import headline

    out_dir.mkdir(parents=True, exist_ok=True)
    timed = [r for r in records if r.gpu_time]
    gpu = timed[-1].env.get("gpu", "GPU") if timed else "CPU interpreter, not GPU times"
    # one bar per case variant: fusekit's fastest like-for-like row, as in the README's table (every
    # row of every implementation stays in the JSON; a bar per row made plots thousands of pixels wide)
    best = [h.best for h in headline(records)]
    paths = [
        _bar(best, lambda r: r.speedup, "speedup over the case's baseline (x)",
             f"fusekit speedups, fastest per case ({gpu})", out_dir / "speedup.png", log=True),
        _bar(best, lambda r: None if r.fraction_of_floor is None else 100 * r.fraction_of_floor,
             "% of the roofline floor", f"fraction of the floor, fusekit's fastest per case ({gpu})",
             out_dir / "floor_fraction.png"),
    ]
    for _domain, fn in domain_plots():
        paths.extend(fn(records, out_dir) or [])
    return [p for p in paths if p is not None]
