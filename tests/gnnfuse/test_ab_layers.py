"""tests/gnnfuse/ab_layers.py, the same-call A/B driver: row parsing, settings applied and restored, a run."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import ab_layers  # noqa: E402
from gnn_testing import planetoid  # noqa: E402

from fusecore import linear  # noqa: E402
from gnnfuse import ops, schedule  # noqa: E402


def test_rows_parse_with_literal_values_and_bracketed_commas():
    assert ab_layers.parse("gat-bf16") == ("gat", "bf16", {})
    assert ab_layers.parse("tredge-fp32:LIGHT_LAUNCH_BREAKS=(4, 16),max_light_rows=4") == (
        "tredge", "fp32", {"LIGHT_LAUNCH_BREAKS": (4, 16), "max_light_rows": 4})
    assert ab_layers.parse('gat-fp32:LIGHT_UNROLLED_WARPS={"forward": 8, "source": None, "destination": 2}')[2] == {
        "LIGHT_UNROLLED_WARPS": {"forward": 8, "source": None, "destination": 2}}
    for bad in ("gcn-fp32", "gat-fp64", "gat-fp32:LIGHT_LAUNCH_BREAKS", "gat-fp32:X=not a literal"):
        with pytest.raises((ValueError, SyntaxError)):
            ab_layers.parse(bad)


def test_settings_are_restored_and_unknown_names_refused():
    breaks, tiles, light_max = ops.LIGHT_LAUNCH_BREAKS, schedule.GPU_TILES, schedule.DEFAULT_LIGHT_MAX
    stacked = linear.STACK_LINEARS
    restore = ab_layers.apply({"LIGHT_LAUNCH_BREAKS": (8,), "max_light_rows": 2, "schedule.DEFAULT_LIGHT_MAX": 32,
                               "linear.STACK_LINEARS": not stacked})
    assert ops.LIGHT_LAUNCH_BREAKS == (8,) and schedule.GPU_TILES.max_light_rows == 2
    assert schedule.DEFAULT_LIGHT_MAX == 32 and linear.STACK_LINEARS is (not stacked)
    restore()
    assert ops.LIGHT_LAUNCH_BREAKS is breaks and schedule.GPU_TILES is tiles and schedule.DEFAULT_LIGHT_MAX == light_max
    assert linear.STACK_LINEARS is stacked
    for bad in ("NO_SUCH_CONSTANT", "schedule.NO_SUCH_CONSTANT", "nn.GATConv", "schedule.build_schedule",
                "linear.linears"):
        with pytest.raises(ValueError, match="no constant"):  # nothing set, the good settings before it neither
            ab_layers.apply({"LIGHT_LAUNCH_BREAKS": (8,), "max_light_rows": 2, bad: 1})
        assert ops.LIGHT_LAUNCH_BREAKS is breaks and schedule.GPU_TILES is tiles
    warps = ops.LIGHT_UNROLLED_WARPS  # a per-pass constant takes a dict with every pass
    for bad in (8, {"forward": 8}, {"forward": 8, "source": 8, "destination": 8, "other": 8}):
        with pytest.raises(ValueError, match="keys"):
            ab_layers.apply({"LIGHT_UNROLLED_WARPS": bad})
    assert ops.LIGHT_UNROLLED_WARPS is warps
    four_byte = ops.LIGHT_LAUNCH_BREAKS_4BYTE  # a per-score constant takes any of the score kinds
    ab_layers.apply({"LIGHT_LAUNCH_BREAKS_4BYTE": {0: (32,), 2: (32,), ops.LIGHT_COSINE: ()}})()
    ab_layers.apply({"LIGHT_LAUNCH_BREAKS_4BYTE": {}})()
    ab_layers.apply({"LIGHT_LAUNCH_BREAKS_4BYTE": {2: {"forward": (8, 32), "source": (32,)}}})()  # per pass
    with pytest.raises(ValueError, match="per-pass entry"):
        ab_layers.apply({"LIGHT_LAUNCH_BREAKS_4BYTE": {2: {"backward": (32,)}}})
    for bad in ((32,), {4: (32,)}, {"forward": (32,)}):
        with pytest.raises(ValueError, match="scores"):
            ab_layers.apply({"LIGHT_LAUNCH_BREAKS_4BYTE": bad})
    assert ops.LIGHT_LAUNCH_BREAKS_4BYTE is four_byte
    nodes = ops.EDGE_WEIGHT_GRAD_NODES  # a per-width constant (keys 2 and 4) takes a dict with both widths
    ab_layers.apply({"EDGE_WEIGHT_GRAD_NODES": {2: 1024, 4: 1024}})()
    for bad in ({2: 1024}, {2: 1024, 4: 1024, 8: 1024}, 1024):
        with pytest.raises(ValueError, match="keys"):
            ab_layers.apply({"EDGE_WEIGHT_GRAD_NODES": bad})
    assert ops.EDGE_WEIGHT_GRAD_NODES is nodes
    restore = ab_layers.apply({"matmul_precision": "high"})  # torch's float32 matmul precision, for the row
    assert torch.get_float32_matmul_precision() == "high" and linear.torch_allows_tf32()
    restore()
    assert torch.get_float32_matmul_precision() == "highest" and not linear.torch_allows_tf32()
    with pytest.raises(ValueError, match="matmul_precision: expected one of"):
        ab_layers.apply({"max_light_rows": 2, "matmul_precision": "tf32"})
    assert schedule.GPU_TILES is tiles and torch.get_float32_matmul_precision() == "highest"


def test_a_run_prints_one_checked_row_per_variant(capsys):
    breaks = ops.LIGHT_LAUNCH_BREAKS
    assert ab_layers.main(["cpu", "gat-fp32", "gat-fp32:LIGHT_LAUNCH_BREAKS=(2, 8)",
                           "--graph", "tiny-power-law", "--rounds", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["row"] for line in lines] == ["gat-fp32", "gat-fp32:LIGHT_LAUNCH_BREAKS=(2, 8)"]
    for line in lines:
        assert "error" not in line and line["rel_error_vs_first"] < 1e-5
        assert len(line["fwd called"]) == len(line["step called"]) == 1
    assert ops.LIGHT_LAUNCH_BREAKS is breaks
    # the layer's shape is the benchmarks' for the graph unless --shape names one
    assert ab_layers.graph_shape("reddit-scale") == (602, 4, 16)
    assert ab_layers.graph_shape("tiny-power-law") == (16, 2, 8)
    assert ab_layers.main(["cpu", "agnn-fp32", "--graph", "tiny-power-law", "--rounds", "1", "--shape", "8,1,8"]) == 0
    assert "error" not in json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit):
        ab_layers.main(["cpu", "gat-fp32", "--shape", "8,2"])


def test_floor_bytes_are_the_benchmarks_floors():
    """ab_layers' gather floor per layer equals the benchmark families' (benchmarks.cases.gnn)."""
    import torch

    from benchmarks.cases import gnn as cases
    from gnnfuse import Graph

    graph = Graph(torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]]), 3)
    spec = cases.GraphSpec("tiny", 16, 2, 8, ())
    families = {"gat": cases.GAT, "gatv2": cases.GATV2, "tr": cases.TRANSFORMER, "tredge": cases.TRANSFORMER_EDGE}
    for dtype in (torch.float32, torch.bfloat16):
        for backward in (False, True):
            for layer, family in families.items():
                want = family.floor(graph, spec, dtype, backward)
                assert ab_layers.floor_bytes(layer, graph, (16, 2, 8), dtype, backward) == want
            agnn = cases.AGNN.floor(graph, cases.GraphSpec("tiny", 16, 1, 16, ()), dtype, backward)
            assert ab_layers.floor_bytes("agnn", graph, (16, 2, 8), dtype, backward) == agnn


def test_host_profile_runs_a_row(capsys):
    """tests/gnnfuse/host_profile.py on a tiny graph: both kinds timed and profiled."""
    import host_profile

    assert host_profile.main(["gatv2-fp32", "--graph", "tiny-power-law", "--calls", "2", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "== gatv2-fp32 fwd: issue" in out and "== gatv2-fp32 step: issue" in out
    assert out.count("ncalls") == 4


def test_host_profile_launch_section_and_primitive_tables(capsys):
    """host_profile.py's --launches, --sections and --primitives tables print (on the CPU the interpreter runs the
    kernels, so no compiled launch is counted there), and --no-cprofile skips the profiler's tables."""
    import host_profile

    args = ["gat-fp32", "--graph", "tiny-power-law", "--calls", "1", "--launches", "--sections", "--primitives",
            "--no-cprofile"]
    assert host_profile.main(args) == 0
    out = capsys.readouterr().out
    assert "== primitives" in out and "torch.empty" in out and "one-node autograd Function, forward + backward" in out
    for kind in ("fwd", "step"):
        assert f"== gat-fp32 {kind}: issue" in out
    assert out.count("issue us/call: as is") == 2 and out.count("sections (inclusive host us per call") == 2
    assert "gnnfuse.ops.attention_forward" in out and "gnnfuse.nn._graph_and_features" in out
    assert "ncalls" not in out


def test_kernel_times_aggregates_by_name_and_runs_a_row(capsys):
    """tests/gnnfuse/kernel_times.py: kernels merged by name, per call, longest first, shares of the total; a run on
    a tiny graph prints one line per kind (no CUDA kernels on the CPU: an empty table)."""
    import kernel_times

    total, table = kernel_times.aggregate([("rows", 30.0, 2), ("light", 10.0, 2), ("rows", 20.0, 2)], calls=2)
    assert total == 30.0
    assert table == [["rows", 2.0, 25.0, 83.3], ["light", 1.0, 5.0, 16.7]]
    assert kernel_times.aggregate([], calls=3) == (0.0, [])
    assert kernel_times.main(["gat-fp32", "--graph", "tiny-power-law", "--calls", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["row"], line["kind"]) for line in lines] == [("gat-fp32", "fwd"), ("gat-fp32", "step")]
    assert all("error" not in line and isinstance(line["kernels"], list) for line in lines)


def test_host_ab_runs_two_versions(monkeypatch, tmp_path, capsys):
    """tests/gnnfuse/host_ab.py imports a second copy of the packages under other names and times both, interleaved
    (kernel launches stubbed here: the interpreter's times are not host times, and this checks the tool runs)."""
    planetoid("cora")  # the tool's graph: skip, as the other Planetoid tests do, where the shared datasets are absent
    import runpy
    import shutil
    from pathlib import Path

    from triton.runtime import interpreter

    root = Path(__file__).resolve().parents[2]
    for name in ("fusecore", "gnnfuse"):
        shutil.copytree(root / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(interpreter.InterpretedFunction, "run", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(sys, "argv", ["host_ab.py", str(tmp_path), "cora", "1", "1", "gat-bf16"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    modules = dict(sys.modules)
    try:
        runpy.run_path(str(root / "tests" / "gnnfuse" / "host_ab.py"), run_name="__main__")
    finally:
        for name in [m for m in sys.modules if m not in modules and m.split(".")[0].endswith("_base")]:
            del sys.modules[name]  # the renamed copies only: this tree's packages stay the ones every test shares
    out = capsys.readouterr().out
    assert "== gat-bf16 fwd: base" in out and "== gat-bf16 step: base" in out and "new/base" in out
