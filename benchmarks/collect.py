"""File a GPU run's output into ``benchmarks/results/<gpu>/`` (run from the repository root).

    python -m benchmarks.collect RUN_DIR --gpu H100 --tag s8

``RUN_DIR`` holds what a run on the GPU machine wrote: ``*.jsonl`` result files (the
``results.jsonl`` of ``python -m benchmarks --out``, any domains, under any names) and
``<name>.log`` logs.  Each domain's rows replace, in ``<gpu>/<domain>.jsonl``, the rows of the
cases that ran (the other cases keep their earlier runs: :func:`benchmarks.__main__.merge`); each
merged domain's plots are redrawn from its merged file as ``<domain>-<plot>.png``; logs are
copied as ``<name>.<tag>.log``.  Then ``python -m benchmarks.readme`` regenerates the README's section (and
``python -m benchmarks.targets`` the gnnfuse and llmfuse READMEs' targets tables, from the H200 records).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from fusecore.device import names_model
from fusecore.report import read_jsonl, write_jsonl

from .__main__ import merge
from .plots import write_plots

RESULTS = Path(__file__).resolve().parent / "results"


def plot_name(domain: str, name: str) -> str:
    """A plot's file name in a results folder: the suite's plots prefixed by their domain
    (``gnn-speedup.png``), a domain's own plot under its own name (``sim-complexity.png``;
    ``llm_ms_per_token.png`` as ``llm-ms-per-token.png``)."""
    for sep in ("-", "_"):
        if name.startswith(domain + sep):
            return f"{domain}-{name[len(domain) + 1:].replace('_', '-')}"
    return f"{domain}-{name}"


def collect(run_dir: Path, gpu: str, tag: str, results: Path = RESULTS) -> list[Path]:
    """Merge, redraw and copy as the module docstring says; returns the files written."""
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    dest = results / gpu
    dest.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    by_domain: dict[str, list] = {}
    for source in sorted(run_dir.glob("*.jsonl")):
        for row in read_jsonl(source):
            # a folder holds one GPU's times: refuse interpreter rows and another device's (before writing anything)
            device = str(row.env.get("gpu", ""))
            if not row.gpu_time or not names_model(device, gpu):
                raise ValueError(f"{source}: row {row.domain}/{row.case} ({row.implementation}) was timed on "
                                 f"{device!r}{'' if row.gpu_time else ' (not GPU time)'}, not on a {gpu}: "
                                 f"it does not belong in results/{gpu}")
            by_domain.setdefault(row.domain, []).append(row)
    for domain, rows in by_domain.items():
        target = dest / f"{domain}.jsonl"
        merged = merge(rows, read_jsonl(target) if target.exists() else [])
        written.append(write_jsonl(merged, target, append=False))
        with tempfile.TemporaryDirectory() as tmp:
            for plot in write_plots([r for r in merged if r.domain == domain], Path(tmp)):
                written.append(Path(shutil.copy(plot, dest / plot_name(domain, plot.name))))
    for log in sorted(run_dir.glob("*.log")):
        written.append(Path(shutil.copy(log, dest / f"{log.stem}.{tag}.log")))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="what the GPU run wrote (*.jsonl, *.log)")
    parser.add_argument("--gpu", required=True, help="results folder name, e.g. H100 or H200")
    parser.add_argument("--tag", required=True, help="session tag for the logs, e.g. s8")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results root (default: benchmarks/results)")
    args = parser.parse_args(argv)
    for path in collect(args.run_dir, args.gpu, args.tag, results=args.results):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
