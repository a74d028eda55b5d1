"""``python -m benchmarks``: every fused kernel against its baseline and peers, one table.

    python -m benchmarks --quick                 # small sizes; CPU: an interpreter smoke run
    python -m benchmarks --domain gnn --out DIR  # full sizes of one domain, JSON + PNG in DIR
    python -m benchmarks --compare OLD.jsonl     # flag regressions against an earlier run
    python -m benchmarks --domain sim --case chain --merge-into benchmarks/results/H200/sim.jsonl
                                                 # replace only the cases that ran in a results file
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

from fusecore import backend
from fusecore.report import Record, format_table, read_jsonl, set_speedups, write_jsonl

from . import cases as case_pkg
from .plots import write_plots
from .registry import CheckFailed, Context, cases

DOMAIN_ALIASES = {"core": "core", "gnn": "gnn", "sim": "sim", "llm": "llm"}


def _progress(items, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, file=sys.stderr, leave=False)
    except ImportError:
        return items


def compare(new: list[Record], old: list[Record], threshold: float = 0.10) -> tuple[str, int]:
    """Lines comparing medians of matching (domain, case, implementation); count regressions."""
    index = {(r.domain, r.case, r.implementation): r for r in old}
    lines, regressions = [], 0
    for r in new:
        prev = index.get((r.domain, r.case, r.implementation))
        if prev is None or prev.median_ms <= 0:
            continue
        change = r.median_ms / prev.median_ms - 1.0
        flag = ""
        if r.gpu_time == prev.gpu_time and change > threshold:
            flag, regressions = "  REGRESSION", regressions + 1
        lines.append(
            f"{r.domain}/{r.case} {r.implementation}: {prev.median_ms:.4f} -> {r.median_ms:.4f} ms "
            f"({100 * change:+.1f}%){flag}"
        )
    return "\n".join(lines), regressions


def merge(new: list[Record], old: list[Record]) -> list[Record]:
    """``old`` with every row of a case that ``new`` ran (same domain and case name, any
    parameters) replaced by ``new``'s rows: a partial rerun updates a results file without
    mixing two runs' rows of one case.  A case run on some graphs only (``--graph``: its rows carry
    ``params["graphs_selected"]``) replaces only the rows of the graphs it ran (``params["graph"]``),
    the case's other graphs keep theirs.  Each row keeps its own ``env`` (commit, date, versions).  Rows of a
    case that failed its checks or raised (``params["case_failed"]``) are left out: they replace nothing."""
    new = [r for r in new if not r.params.get("case_failed")]

    def name(r: Record) -> tuple[str, str]:
        return r.domain, r.case.split("[")[0]

    def graph(r: Record) -> tuple[str, str, object]:
        return *name(r), r.params.get("graph")

    rerun = {name(r) for r in new if not r.params.get("graphs_selected")}
    rerun_graphs = {graph(r) for r in new if r.params.get("graphs_selected")}
    return [r for r in old if name(r) not in rerun and graph(r) not in rerun_graphs] + list(new)


def _saver(done: list[Record], ctx: Context, baseline: str, path: Path):
    """``on_record`` for a case: rewrite ``path`` with the finished cases' records and this case's so far."""

    def save(_record: Record) -> None:
        set_speedups(ctx.records, baseline)
        write_jsonl([*done, *ctx.records], path, append=False)

    return save


def select_cases(candidates: list, domains: set[str] | None, patterns: list[str] | None) -> list:
    """The cases of ``domains`` (None: all) that ``--case`` selects: each pattern that is some case's full name
    selects that case alone, any other every case whose name contains it; no patterns select all."""
    in_domains = [c for c in candidates if domains is None or c.domain in domains]
    names = {c.name for c in in_domains}
    if not patterns:
        return in_domains
    return [c for c in in_domains if any(c.name == p if p in names else p in c.name for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (CPU: interpreter smoke run)")
    parser.add_argument("--domain", action="append", choices=sorted(DOMAIN_ALIASES),
                        help="run only these domains (repeatable); default: all")
    parser.add_argument("--case", action="append",
                        help="run only cases whose name contains this (repeatable); a case's full name selects "
                             "that case alone (gatconv, not gatconv_tf32 too)")
    parser.add_argument("--graph", action="append", metavar="NAME",
                        help="the gnn layer cases on this graph only (repeatable; e.g. arxiv-like); a merge then "
                             "replaces only these graphs' rows of the cases that ran")
    parser.add_argument("--out", type=Path, help="directory for results.jsonl and PNG plots")
    parser.add_argument("--compare", type=Path, help="earlier results.jsonl to compare against")
    parser.add_argument("--merge-into", type=Path, metavar="FILE",
                        help="after the run, replace the rows of the cases that ran in this results file")
    args = parser.parse_args(argv)

    case_pkg.load_all(sorted({DOMAIN_ALIASES[d] for d in args.domain}) if args.domain else None)
    for name, reason in case_pkg.SKIPPED.items():
        print(f"[skip] domain {name}: {reason}")
    selected = select_cases(cases(), {DOMAIN_ALIASES[d] for d in args.domain} if args.domain else None, args.case)
    device = backend.default_device()
    print(f"fusekit benchmarks: {len(selected)} cases, {'quick' if args.quick else 'full'} sizes, "
          f"{backend.describe()}, device {device}")
    if not backend.COMPILED:
        print("NOTE: no GPU: kernels run through the Triton interpreter; times below are CPU "
              "interpreter times, not GPU times — this run checks correctness.")

    records: list[Record] = []
    failures: list[str] = []
    started = time.perf_counter()
    for c in _progress(selected, "cases"):
        ctx = Context(quick=args.quick, device=device, case=c, graphs=tuple(args.graph) if args.graph else None)
        if args.out:  # the run so far, after every record: a run killed mid-case keeps what it measured
            ctx.on_record = _saver(records, ctx, c.baseline, args.out / "results.jsonl")
        t0 = time.perf_counter()
        try:
            c.run(ctx)
            status = "ok"
        except CheckFailed as exc:
            status, _ = "CHECK FAILED", failures.append(str(exc))
        except Exception as exc:  # a broken case must not hide the others' results
            status, _ = "ERROR", failures.append(f"{c.domain}/{c.name}: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        set_speedups(ctx.records, c.baseline)
        if status != "ok":  # kept in the run's output, but never merged over a results file's rows (merge)
            for r in ctx.records:
                r.params["case_failed"] = status
        records.extend(ctx.records)
        worst = max((err / tol for _, err, tol in ctx.checks), default=0.0)
        print(f"[{status}] {c.domain}/{c.name}: {len(ctx.records)} records, {len(ctx.checks)} checks "
              f"(worst error {worst:.2g} of tolerance), {time.perf_counter() - t0:.1f} s")
        # Each case's rows as soon as it ends, so a run cut short (a time limit) keeps what finished.
        if len(selected) > 1 and ctx.records:
            print(format_table(ctx.records), flush=True)
        if args.out:
            write_jsonl(records, args.out / "results.jsonl", append=False)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    print()
    print(format_table(records))
    print(f"\n{len(records)} records in {time.perf_counter() - started:.1f} s")

    if args.out:
        path = write_jsonl(records, args.out / "results.jsonl", append=False)
        pngs = write_plots(records, args.out)
        print(f"wrote {path} and {len(pngs)} plots to {args.out}")
    if args.merge_into:
        kept = read_jsonl(args.merge_into) if args.merge_into.exists() else []
        merged = merge(records, kept)
        write_jsonl(merged, args.merge_into, append=False)
        print(f"merged {len(records)} rows into {args.merge_into} ({len(merged)} rows)")
    if args.compare:
        text, regressions = compare(records, read_jsonl(args.compare))
        print("\ncompared with", args.compare, "\n" + text)
        if regressions:
            failures.append(f"{regressions} regressions against {args.compare}")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
