"""benchmarks.collect: a GPU run's files merged into a results folder."""

import pytest

from benchmarks.collect import collect, main, plot_name
from fusecore.report import Record, read_jsonl, set_speedups, write_jsonl


def _rows(case: str, ms: float, commit: str) -> list[Record]:
    env = {"commit": commit, "gpu": "NVIDIA H100 80GB HBM3"}
    rows = [Record("gnn", f"{case}[x]", impl, m, m, m, True, "do_bench", env=env)
            for impl, m in (("PyG eager", 4 * ms), ("fused (gnnfuse)", ms))]
    set_speedups(rows, "PyG eager")
    return rows


def test_collect_merges_by_case_copies_logs_and_names_plots(tmp_path):
    results, run = tmp_path / "results", tmp_path / "run"
    (results / "H100").mkdir(parents=True)
    run.mkdir()
    write_jsonl(_rows("gatconv", 1.0, "old") + _rows("agnnconv", 2.0, "old"), results / "H100" / "gnn.jsonl",
                append=False)
    llm = Record("llm", "decode[y]", "fused per-layer kernels", 1.0, 1.0, 1.0, True, "do_bench",
                 env={"commit": "new", "gpu": "NVIDIA H100 80GB HBM3"})
    write_jsonl(_rows("gatconv", 0.5, "new") + [llm], run / "results.jsonl", append=False)  # mixed domains
    (run / "gnn-bench.log").write_text("log\n")
    written = collect(run, "H100", "s8", results=results)
    merged = read_jsonl(results / "H100" / "gnn.jsonl")
    by_case = {(r.case, r.implementation): r for r in merged}
    assert len(merged) == 4
    assert by_case[("gatconv[x]", "fused (gnnfuse)")].median_ms == 0.5  # the rerun case replaced
    assert by_case[("agnnconv[x]", "fused (gnnfuse)")].env["commit"] == "old"  # the other case kept
    assert [r.case for r in read_jsonl(results / "H100" / "llm.jsonl")] == ["decode[y]"]  # filed by domain
    assert (results / "H100" / "gnn-bench.s8.log").read_text() == "log\n"
    assert results / "H100" / "gnn-bench.s8.log" in written
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:  # plots redrawn from the merged rows under the folder's names
        assert (results / "H100" / "gnn-speedup.png").stat().st_size > 0
    with pytest.raises(FileNotFoundError, match="does not exist"):
        collect(tmp_path / "missing", "H100", "s8", results=results)
    assert main([str(run), "--gpu", "H100", "--tag", "s9", "--results", str(results)]) == 0
    assert (results / "H100" / "gnn-bench.s9.log").exists() and len(read_jsonl(results / "H100" / "gnn.jsonl")) == 4


@pytest.mark.parametrize("domain, name, expected", [
    ("gnn", "speedup.png", "gnn-speedup.png"),
    ("gnn", "floor_fraction.png", "gnn-floor_fraction.png"),
    ("llm", "llm_ms_per_token.png", "llm-ms-per-token.png"),
    ("sim", "sim-complexity.png", "sim-complexity.png"),
])
def test_plot_names_match_the_committed_folders(domain, name, expected):
    assert plot_name(domain, name) == expected


def test_a_run_on_some_graphs_replaces_only_their_rows(tmp_path):
    """``--graph``: rows carrying ``params["graphs_selected"]`` replace the rows of their case on the graphs
    they ran; the case's other graphs keep theirs, and a case run whole still replaces all of its rows."""
    from benchmarks.__main__ import merge

    def rows(case, graphs, commit, selected=None):
        out = []
        for g in graphs:
            params = {"graph": g, **({"graphs_selected": selected} if selected else {})}
            out.append(Record("gnn", f"{case}[{g},fp32,fwd]", "fused (gnnfuse)", 1.0, 1.0, 1.0, True, "do_bench",
                              params=params, env={"commit": commit}))
        return out

    old = rows("gatconv", ("cora", "arxiv-like", "reddit-scale"), "old") + rows("agnnconv", ("cora",), "old")
    merged = merge(rows("gatconv", ("arxiv-like",), "new", ["arxiv-like"]), old)
    assert sorted((r.case, r.env["commit"]) for r in merged) == [
        ("agnnconv[cora,fp32,fwd]", "old"), ("gatconv[arxiv-like,fp32,fwd]", "new"),
        ("gatconv[cora,fp32,fwd]", "old"), ("gatconv[reddit-scale,fp32,fwd]", "old")]
    whole = merge(rows("gatconv", ("arxiv-like",), "new"), old)
    assert sorted(r.case for r in whole) == ["agnnconv[cora,fp32,fwd]", "gatconv[arxiv-like,fp32,fwd]"]


def test_collect_refuses_rows_of_another_device_and_leaves_failed_cases_out(tmp_path):
    """A results folder holds one GPU's times: interpreter rows and another GPU's are refused before anything
    is written; the rows of a case that failed its checks replace nothing (session 38's audit)."""
    from benchmarks.__main__ import merge

    results, run = tmp_path / "results", tmp_path / "run"
    (results / "H100").mkdir(parents=True)
    run.mkdir()
    old = _rows("gatconv", 1.0, "old")
    write_jsonl(old, results / "H100" / "gnn.jsonl", append=False)
    cpu = Record("gnn", "gatconv[x]", "fused (gnnfuse)", 9.0, 9.0, 9.0, False, "cpu", env={"gpu": "cpu"})
    h200 = Record("gnn", "gatconv[x]", "fused (gnnfuse)", 0.4, 0.4, 0.4, True, "do_bench",
                  env={"gpu": "NVIDIA H200"})
    for row, words in ((cpu, "not GPU time"), (h200, "NVIDIA H200")):
        write_jsonl([row], run / "results.jsonl", append=False)
        with pytest.raises(ValueError, match=words):
            collect(run, "H100", "s8", results=results)
        assert [r.median_ms for r in read_jsonl(results / "H100" / "gnn.jsonl")] == [r.median_ms for r in old]
    failed = _rows("gatconv", 0.5, "new")
    for r in failed:
        r.params["case_failed"] = "CHECK FAILED"
    assert [r.env["commit"] for r in merge(failed, old)] == ["old", "old"]
