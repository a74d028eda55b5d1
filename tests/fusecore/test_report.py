"""fusecore.timing and fusecore.report: timing, records, floors, JSON lines, the table."""

import json
from types import SimpleNamespace

import pytest
import torch

from benchmarks.__main__ import compare
from fusecore.device import DeviceFacts, Peak, device_facts, lookup_peak
from fusecore.report import Record, environment, floor_ms, format_table, read_jsonl, set_speedups, write_jsonl
from fusecore.timing import Timing, host_probe_us, measure, peak_memory

FAKE = DeviceFacts("fake", "cuda", 100, 0, 0, (9, 0), Peak(2e12, {"bfloat16": 1e15}, "test"))


def test_floor_is_the_larger_of_memory_and_compute_time():
    assert floor_ms(FAKE, bytes_moved=2e9) == pytest.approx(1.0)
    assert floor_ms(FAKE, flops=1e12) == pytest.approx(1.0)
    assert floor_ms(FAKE, bytes_moved=2e9, flops=4e12) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="flop_dtype 'float64'"):  # not a bytes-only floor without a word
        floor_ms(FAKE, flops=1e12, flop_dtype="float64")
    assert floor_ms(device_facts("cpu"), bytes_moved=1e9) is None


def test_peak_table_lookup():
    assert lookup_peak("NVIDIA H200").bandwidth == pytest.approx(4.28e12)
    assert "measured" in lookup_peak("NVIDIA H100 80GB HBM3").source
    assert lookup_peak("NVIDIA H100 PCIe").source == "datasheet"
    assert lookup_peak("Some Future GPU") is None
    assert lookup_peak("NVIDIA GH200 480GB") is None  # whole model names: not the H200's measured figures
    assert lookup_peak("NVIDIA H200").flops["tf32"] == 494e12  # SXM datasheet, dense (378e12 is the PCIe part's)
    assert FAKE.flops(torch.bfloat16) == 1e15
    with pytest.raises(ValueError):
        device_facts("meta")


def test_measure_on_cpu_is_labelled_not_gpu():
    calls = []
    timing = measure(lambda: calls.append(1), device="cpu", rep_ms=5)
    assert not timing.gpu_time and timing.method.endswith("(cpu)")
    assert len(calls) >= 4  # warm-up plus at least three timed runs
    assert 0 <= timing.p20_ms <= timing.median_ms <= timing.p80_ms
    assert peak_memory(lambda: None, "cpu") is None
    with pytest.raises(ValueError, match="cuda_graph"):
        measure(lambda: None, device="cpu", cuda_graph=True)


def _record(case, impl, ms, gpu=True):
    return Record.from_timing("core", case, impl, Timing(ms, ms * 0.9, ms * 1.1, gpu, "test"), device="cpu",
                              bytes_moved=1e6, params={"n": 3})


def test_record_roundtrip_speedups_table_and_compare(tmp_path):
    records = [_record("a", "base", 2.0), _record("a", "fused", 0.5), _record("b", "fused", 1.0)]
    set_speedups(records, "base")
    assert records[1].speedup == pytest.approx(4.0) and records[1].baseline == "base"
    assert records[2].speedup is None
    env = records[0].env
    for key in ("gpu", "driver", "torch", "triton", "commit", "date", "kernel_mode"):
        assert key in env
    path = write_jsonl(records, tmp_path / "r.jsonl", append=False)
    back = read_jsonl(path)
    assert [r.case for r in back] == ["a", "a", "b"] and back[1].speedup == pytest.approx(4.0)
    assert json.loads(path.read_text().splitlines()[0])["params"] == {"n": 3}
    table = format_table(records)
    assert "4.00x" in table and "fused" in table and len(table.splitlines()) == 5
    slower = [_record("a", "fused", 0.8)]
    text, regressions = compare(slower, back)
    assert regressions == 1 and "REGRESSION" in text
    (tmp_path / "bad.jsonl").write_text("{not json}\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_jsonl(tmp_path / "bad.jsonl")


def test_environment_names_versions():
    env = environment("cpu")
    assert env["torch"] == torch.__version__
    assert env["gpu"].startswith("cpu")


@pytest.mark.gpu
def test_gpu_timing_and_peak_memory():
    x = torch.randn(1 << 24, device="cuda")
    timing = measure(lambda: x.mul(2.0), rep_ms=20)
    assert timing.gpu_time and timing.median_ms > 0
    graphed = measure(lambda: x.mul(2.0), rep_ms=20, cuda_graph=True)
    assert graphed.gpu_time and graphed.method == "do_bench_cudagraph"
    peak = peak_memory(lambda: x.mul(2.0))
    assert peak >= x.numel() * 4
    facts = device_facts()
    assert facts.sm_count > 0 and facts.l2_bytes > 0 and facts.smem_per_block_bytes > 0


def test_commit_comes_from_fusekit_commit_when_set(monkeypatch):
    """A tree copied to a GPU machine may carry a stale .git: the run's FUSEKIT_COMMIT wins."""
    from fusecore import report

    report._git_commit.cache_clear()
    monkeypatch.setenv("FUSEKIT_COMMIT", "abc1234")
    try:
        assert report.environment()["commit"] == "abc1234"
    finally:
        report._git_commit.cache_clear()


def test_back_to_back_needs_cuda_and_excludes_graphs():
    with pytest.raises(ValueError, match="CUDA"):
        measure(lambda: None, device="cpu", back_to_back=True)
    with pytest.raises(ValueError, match="exclude"):
        measure(lambda: None, device="cpu", back_to_back=True, cuda_graph=True)


def test_batch_size_spans_about_two_milliseconds():
    from fusecore.timing import batch_size

    assert batch_size(0.01) == 200 and batch_size(5.0) == 2 and batch_size(0.0) == 10_000
    assert batch_size(1e-6) == 10_000


def test_host_ms_lands_in_the_record_params():
    timed = Record.from_timing("core", "c", "i", Timing(1.0, 0.9, 1.1, True, "back-to-back x2", host_ms=0.25),
                               device="cpu", params={"n": 1})
    assert timed.params == {"n": 1, "host_ms": 0.25}
    assert _record("a", "b", 1.0).params == {"n": 3}


@pytest.mark.gpu
def test_gpu_back_to_back_counts_host_work():
    """A call whose host work (a sleep) exceeds its GPU work is timed at least at the sleep."""
    import time as _time

    x = torch.randn(1 << 10, device="cuda")

    def slow_issue():
        _time.sleep(2e-4)
        return x.mul(2.0)

    timing = measure(slow_issue, rep_ms=20, back_to_back=True)
    assert timing.method.startswith("back-to-back") and timing.host_ms >= 0.2 and timing.median_ms >= 0.2
    fast = measure(lambda: x.mul(2.0), rep_ms=20, back_to_back=True)
    assert fast.median_ms < timing.median_ms


def test_host_probe_times_a_fixed_python_loop(monkeypatch):
    """host_probe_us: the median of its runs of a fixed pure-Python loop, in µs; at least one run."""
    from fusecore import timing

    probe = host_probe_us(repeats=3)
    assert 0.0 < probe < 1e6
    ticks = iter(range(0, 10_000, 10))  # each perf_counter call 10 "seconds" later: every run 10 s
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    monkeypatch.setattr(timing, "HOST_PROBE_ADDITIONS", 3)
    assert host_probe_us(repeats=0) == 10e6


def test_measure_refuses_budgets_that_give_no_samples():
    """rep_ms=0 with min_cpu_reps=0 once ended in statistics' 'at least two data points' (session 38's audit)."""
    for kwargs, name in (({"rep_ms": 0, "min_cpu_reps": 0}, "min_cpu_reps"), ({"rep_ms": float("nan")}, "rep_ms"),
                         ({"warmup_ms": -1}, "warmup_ms"), ({"min_cpu_reps": 1.5}, "min_cpu_reps")):
        with pytest.raises(ValueError, match=name):
            measure(lambda: None, device="cpu", **kwargs)


def test_write_jsonl_writes_nothing_when_a_record_cannot_be_written(tmp_path):
    """A record whose params JSON cannot hold (a torch.dtype) once raised after the records before it were written,
    and with append=False after the file had been emptied: the file is left as it was."""
    good = Record("core", "c", "impl", 1.0, 0.9, 1.1, False, "m")
    bad = Record("core", "c", "impl", 1.0, 0.9, 1.1, False, "m", params={"dtype": torch.float32})
    path = tmp_path / "results.jsonl"
    write_jsonl([good], path)
    before = path.read_text()
    for append in (True, False):
        with pytest.raises(TypeError, match="not JSON serializable"):
            write_jsonl([good, bad], path, append=append)
        assert path.read_text() == before
    assert len(read_jsonl(path)) == 1
