"""The cross-domain suite end to end: the quick run, JSON records, plots, --compare, the README section."""

import json

import pytest
import torch

import fusecore.testing
from benchmarks import readme, registry
from benchmarks.__main__ import main
from benchmarks.registry import DOMAINS, cases
from fusecore.report import read_jsonl


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    code = main(["--quick", "--out", str(out)])
    return code, out


def test_quick_suite_passes_and_covers_every_domain(quick_run, capsys):
    code, out = quick_run
    assert code == 0
    records = read_jsonl(out / "results.jsonl")
    assert {r.domain for r in records} == set(DOMAINS)
    registered = {(c.domain, c.name) for c in cases()}
    assert {(r.domain, r.case.split("[")[0]) for r in records} == registered
    for r in records:
        assert r.median_ms > 0 and r.p20_ms <= r.median_ms <= r.p80_ms
        assert r.env["torch"] and r.env["triton"] and r.env["date"] and r.env["gpu"]
    # every case compares something against its baseline (peers timed at their own sizes may stand alone)
    for domain, name in registered:
        rows = [r for r in records if r.domain == domain and r.case.split("[")[0] == name]
        assert any(r.speedup is not None and r.implementation != r.baseline for r in rows), f"{domain}/{name}"
    try:
        import matplotlib  # noqa: F401

        assert (out / "speedup.png").stat().st_size > 0
        if any(h.best.fraction_of_floor is not None for h in readme.headline(records)):  # GPU runs only
            assert (out / "floor_fraction.png").stat().st_size > 0
    except ImportError:
        pass


def test_compare_flags_a_regression(quick_run, tmp_path):
    _, out = quick_run
    lines = (out / "results.jsonl").read_text().splitlines()
    faster = []
    for line in lines:
        row = json.loads(line)
        if row["domain"] == "core":
            row["median_ms"] /= 100.0  # an old run 100x faster: today is a regression
        faster.append(json.dumps(row))
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join(faster) + "\n")
    assert main(["--quick", "--domain", "core", "--compare", str(old)]) == 1


def test_readme_results_section_is_generated_from_committed_results():
    text = readme.render()
    assert text.startswith(readme.BEGIN) and text.endswith(readme.END)
    assert readme.main(["--check"]) == 0, "README.md is stale: run python -m benchmarks.readme"


def test_headline_leaves_out_sweeps_and_compares_with_other_code(monkeypatch):
    """A case registered with headline=False (a tuning sweep) gives no headline row; a case's
    row shows its baseline and fusekit's fastest implementation."""
    from benchmarks import registry
    from fusecore.report import Record

    readme._sweep_cases()  # registers every case
    monkeypatch.setattr(registry, "_CASES", registry.cases())
    registry.case("core", "test_sweep", baseline="default", headline=False)(lambda ctx: None)
    registry.case("core", "test_headline", baseline="torch loop")(lambda ctx: None)

    def record(case: str, implementation: str, ms: float, baseline: str) -> Record:
        return Record("core", case, implementation, ms, ms, ms, True, "do_bench", baseline=baseline)

    rows = readme._headline([
        record("test_headline[x]", "torch loop", 4.0, "torch loop"),
        record("test_headline[x]", "fused kernel", 1.0, "torch loop"),
        record("test_sweep[x]", "default", 2.0, "default"),
        record("test_sweep[x]", "fused variant", 1.0, "default"),
    ])
    assert len(rows) == 3, rows
    assert "test_headline[x]" in rows[2] and "fused kernel (1.000)" in rows[2] and "4.00x" in rows[2]


def test_a_run_cut_short_keeps_the_cases_that_finished(tmp_path, monkeypatch, capsys):
    """A GPU run killed by its time limit (here: a case that exits the process) still leaves the
    earlier cases' rows in results.jsonl and their table in the log, and the rows the killed case
    had timed before it ended."""
    import benchmarks.__main__ as bench_main
    from benchmarks import cases as case_pkg
    from benchmarks.registry import Case

    case_pkg.load_all(["core"])
    core = [c for c in cases() if c.domain == "core"]

    def killed(ctx):
        ctx.time("none", lambda: None)
        ctx.time("timed before the limit", lambda: None)
        raise SystemExit("time limit")

    monkeypatch.setattr(bench_main, "cases", lambda: [*core, Case("core", "killed", "none", killed)])
    with pytest.raises(SystemExit):
        bench_main.main(["--quick", "--domain", "core", "--out", str(tmp_path)])
    kept = read_jsonl(tmp_path / "results.jsonl")
    assert kept and {r.case.split("[")[0] for r in kept} == {c.name for c in core} | {"killed"}
    partial = [r for r in kept if r.case == "killed"]
    assert [r.implementation for r in partial] == ["none", "timed before the limit"]
    assert partial[1].speedup is not None  # against the case's baseline, timed before it
    assert "fused (fusecore)" in capsys.readouterr().out


def test_merge_into_replaces_only_the_cases_that_ran(quick_run, tmp_path):
    _, out = quick_run
    committed = tmp_path / "core.jsonl"
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    core = [r for r in rows if r["domain"] == "core"]
    other = [r for r in rows if r["domain"] != "core"][:3]
    for r in core:
        r["env"] = {**r["env"], "commit": "old"}
    committed.write_text("".join(json.dumps(r) + "\n" for r in core + other))
    assert main(["--quick", "--domain", "core", "--merge-into", str(committed)]) == 0
    merged = read_jsonl(committed)
    assert [r.case for r in merged[:len(other)]] == [r["case"] for r in other]  # the others kept, in order
    fresh = merged[len(other):]
    assert {r.case for r in fresh} == {r["case"] for r in core} and all(r.env["commit"] != "old" for r in fresh)


def test_replayed_rows_get_the_short_replay_budget(monkeypatch):
    """On a GPU, a cuda_graph=True row is measured with Context.replay_rep_ms (a replay averages
    many calls already), a called row with rep_ms; a case may lower either."""
    import torch

    from benchmarks import registry
    from fusecore.timing import Timing

    seen = []

    def fake_measure(fn, *, rep_ms, cuda_graph, **kwargs):
        seen.append((cuda_graph, rep_ms))
        return Timing(1.0, 1.0, 1.0, gpu_time=True, method="fake")

    monkeypatch.setattr(registry, "measure", fake_measure)
    monkeypatch.setattr(registry.Record, "from_timing", classmethod(lambda cls, *a, **k: None))
    case = registry.Case("core", "budget", "x", lambda ctx: None)
    ctx = registry.Context(quick=False, device=torch.device("cuda"), case=case)
    ctx.time("called", lambda: None)
    ctx.time("replayed", lambda: None, cuda_graph=True)
    ctx.rep_ms = 10.0
    ctx.time("replayed, short case", lambda: None, cuda_graph=True)
    assert seen == [(False, 100.0), (True, ctx.replay_rep_ms), (True, 10.0)] and ctx.replay_rep_ms < 100.0


def test_called_rows_record_the_host_probe_and_replayed_rows_do_not(monkeypatch):
    """Context.time records the host's speed (fusecore.timing.host_probe_us) just before and after
    every row that is not a replay, beside the case's own params, which it leaves unchanged."""
    import torch

    from benchmarks import registry
    from fusecore.timing import Timing

    probes = iter([101.0, 102.0, 103.0, 104.0])
    monkeypatch.setattr(registry, "host_probe_us", lambda: next(probes))
    monkeypatch.setattr(registry, "measure", lambda fn, **kwargs: Timing(1.0, 1.0, 1.0, gpu_time=True, method="fake"))
    monkeypatch.setattr(registry, "peak_memory", lambda fn, device: None)
    seen = []
    monkeypatch.setattr(registry.Record, "from_timing",
                        classmethod(lambda cls, *a, params=None, **k: seen.append(params)))
    case = registry.Case("core", "probe", "x", lambda ctx: None)
    ctx = registry.Context(quick=False, device=torch.device("cuda"), case=case)
    own = {"graph": "g"}
    ctx.time("called", lambda: None, params=own)
    ctx.time("replayed", lambda: None, cuda_graph=True, params=own)
    ctx.time("back to back", lambda: None, back_to_back=True)
    assert seen == [{"graph": "g", "host_probe_us": [101.0, 102.0]}, own, {"host_probe_us": [103.0, 104.0]}]
    assert own == {"graph": "g"}


def test_gatconv_bf16_runs_time_the_fused_projection_component():
    """The quick suite runs GATConv in float32 only; in bfloat16 the layer fuses its projection and
    node scores (gnnfuse.ops.fuses_projection), and the case times that kernel as a component row."""
    from benchmarks.cases import gnn as cases
    from gnnfuse import Graph

    case = next(c for c in registry.cases() if c.domain == "gnn" and c.name == "gatconv")
    ctx = registry.Context(quick=True, device=fusecore.testing.test_device(), case=case)
    spec = cases.QUICK[0]
    edges, n = cases._edges(spec.name, ctx.device)
    cases._gatconv_runs(ctx, spec, Graph(edges, n), torch.bfloat16, torch.Generator().manual_seed(0))
    rows = {(r.implementation, r.case) for r in ctx.records}
    assert ("fused projection + node scores", f"gatconv[{spec.name},bf16,fwd,parts]") in rows
    assert ctx.checks and all(err <= tol for _, err, tol in ctx.checks)


def test_graph_option_runs_the_layer_cases_on_those_graphs_only(monkeypatch):
    """``--graph NAME``: the gnn layer cases skip the other graphs, their records carry the selection (which the
    merge reads), and a name no case knows is refused."""
    from benchmarks.cases import gnn as cases

    case = next(c for c in registry.cases() if c.domain == "gnn" and c.name == "gatconv")
    ran = []
    monkeypatch.setattr(cases, "_edges", lambda name, device: (torch.zeros(2, 0, dtype=torch.long), 1))

    def run(ctx, spec, graph, dtype, gen):
        ran.append((spec.name, dtype))
        ctx.time("fused (gnnfuse)", lambda: None, params={"graph": spec.name})

    ctx = registry.Context(quick=False, device=torch.device("cpu"), case=case, graphs=("arxiv-like",))
    monkeypatch.setattr(registry, "host_probe_us", lambda: 1.0)
    cases._run_graphs(ctx, cases.FULL, run)
    assert ran == [("arxiv-like", torch.float32), ("arxiv-like", torch.bfloat16)]
    assert all(r.params["graphs_selected"] == ["arxiv-like"] for r in ctx.records)
    ctx = registry.Context(quick=False, device=torch.device("cpu"), case=case, graphs=("arxiv",))
    with pytest.raises(ValueError, match=r"--graph \['arxiv'\]: no such graph"):
        cases._run_graphs(ctx, cases.FULL, run)


def test_case_option_takes_a_full_name_alone_and_a_part_of_one_as_a_pattern():
    from benchmarks.__main__ import select_cases

    gnn = [c.name for c in select_cases(registry.cases(), {"gnn"}, ["gatconv"])]
    assert gnn == ["gatconv"]
    both = {c.name for c in select_cases(registry.cases(), {"gnn"}, ["gatconv", "conv_tf32"])}
    assert both == {"gatconv", "gatconv_tf32", "transformerconv_tf32"}
    pattern = {c.name for c in select_cases(registry.cases(), {"gnn"}, ["atconv"])}
    assert {"gatconv", "gatconv_tf32", "pyg_gatconv"} <= pattern
    assert select_cases(registry.cases(), {"gnn"}, None) == [c for c in registry.cases() if c.domain == "gnn"]
