"""fusecore.testing: the numeric helpers every domain's tests rely on."""

import math
from types import SimpleNamespace

import pytest
import torch

from fusecore.testing import (
    TOLERANCES,
    AllocationAudit,
    HostSyncError,
    assert_all_written,
    assert_close,
    fresh_generator,
    no_host_sync,
    poisoned,
    record_launches,
    rel_error,
    tolerance,
)


def test_rel_error_basics():
    ref = torch.tensor([3.0, 4.0])
    assert rel_error(ref, ref) == 0.0
    assert rel_error(ref + torch.tensor([0.0, 0.5]), ref) == pytest.approx(0.1)
    assert rel_error(torch.tensor([0.0, 1e-3]), torch.zeros(2)) == pytest.approx(1e-3)
    assert math.isinf(rel_error(torch.tensor([float("nan"), 4.0]), ref))
    inf = torch.tensor([float("inf"), 1.0])
    assert rel_error(inf, inf) == 0.0
    assert math.isinf(rel_error(torch.tensor([float("-inf"), 1.0]), inf))
    with pytest.raises(ValueError, match="shape mismatch"):
        rel_error(torch.zeros(2), torch.zeros(3))


def test_assert_close_uses_dtype_tolerance():
    ref = torch.ones(100, dtype=torch.float64)
    assert_close((ref * (1 + 1e-3)).to(torch.bfloat16), ref)
    with pytest.raises(AssertionError, match="relative error"):
        assert_close((ref * 1.1).to(torch.float32), ref)
    with pytest.raises(AssertionError):
        assert_close(torch.full((100,), float("nan")), ref)
    assert set(TOLERANCES) >= {torch.float32, torch.float16, torch.bfloat16}
    with pytest.raises(ValueError):
        tolerance(torch.int32)


def test_poison_and_written_check():
    t = poisoned((4,), torch.float32, "cpu")
    with pytest.raises(AssertionError, match="4 of 4"):
        assert_all_written(t)
    t[:3] = 1.0
    with pytest.raises(AssertionError, match="1 of 4"):
        assert_all_written(t)
    t[3] = 0.0
    assert_all_written(t)
    i = poisoned((2,), torch.int32, "cpu")
    with pytest.raises(AssertionError):
        assert_all_written(i)


def test_fresh_generator_is_fresh_unless_fixed(monkeypatch):
    monkeypatch.delenv("FUSEKIT_TEST_SEED", raising=False)
    seeds = {fresh_generator().initial_seed() for _ in range(5)}
    assert len(seeds) > 1
    monkeypatch.setenv("FUSEKIT_TEST_SEED", "42")
    assert fresh_generator().initial_seed() == 42


def test_allocation_audit_counts_new_storage_not_views():
    x = torch.zeros(10, 4)
    with AllocationAudit() as audit:
        view = x[:, :2]  # a view: no allocation
        x.add_(1.0)  # in place: no allocation
        y = torch.empty(7, 3)  # 21 elements
        z = view.sum(dim=1)  # 10 elements
    assert sorted(size for _, size in audit.sizes) == [10, 21]
    assert audit.largest[1] == 21 and "empty" in audit.largest[0]
    assert audit.made_by("aten.empty.memory_format") == 1 and audit.made_by("aten.cat.default") == 0
    assert y.shape == (7, 3) and z.shape == (10,)
    with AllocationAudit() as nothing:
        pass
    assert nothing.largest == ("", 0)


def test_no_host_sync_refuses_host_reads_and_lets_launches_through():
    from fusecore.demo import langevin
    from fusecore.testing import test_device

    device = test_device()
    x = torch.randn(37, device=device)
    v = torch.zeros_like(x)
    langevin(x, v, 3, seed=1)  # the first call compiles
    with no_host_sync(device):
        x2, v2, _ = langevin(x, v, 3, seed=1)  # only enqueues work
        y = x2 * 2 + v2
    reads = [
        lambda: y.sum().item(), lambda: y.tolist(), lambda: y.cpu(), lambda: bool(y[0] > 0),
        lambda: int(y[0]), lambda: float(y[0]), lambda: torch.nonzero(y), lambda: y.nonzero(),
        lambda: range(10)[torch.tensor(2)],
    ]
    for read in reads:
        with pytest.raises(HostSyncError), no_host_sync(device):
            read()
    # everything is restored on the way out, also after a failure
    assert y.sum().item() == pytest.approx(float(y.sum())) and torch.nonzero(y >= y).shape == (37, 1)


def test_failure_log_names_each_failure_as_it_happens(tmp_path):
    """FUSEKIT_FAILURE_LOG: a pytest run writes each failed phase (call, setup) with its report and node
    id when it happens, and nothing for passing or skipped tests; unset, nothing is written.  A failing test's
    recorded seed is named in the log and in the terminal's report."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture\n"
        "def broken():\n    raise RuntimeError('fixture broke')\n\n"
        "def test_passes():\n    pass\n\n"
        "def test_fails():\n    assert 1 + 1 == 3, 'arithmetic'\n\n"
        "def test_setup_fails(broken):\n    pass\n\n"
        "@pytest.mark.skip(reason='skipped')\n"
        "def test_skipped():\n    assert False\n\n"
        "@pytest.fixture\n"
        "def gen(request):\n"
        "    from fusecore import testing\n"
        "    return testing.record_seed(request.node, testing.fresh_generator())\n\n"
        "def test_random_fails(gen):\n    assert False, 'drawn'\n"
    )
    log = tmp_path / "failures.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "FUSEKIT_TEST_SEED": "4242"}
    env.pop("PYTEST_XDIST_WORKER", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "fusecore.testing", "-p", "no:cacheprovider",
               "test_sample.py"]
    unset = subprocess.run(command, cwd=tmp_path, env={k: v for k, v in env.items() if k != "FUSEKIT_FAILURE_LOG"},
                           capture_output=True, text=True, timeout=300)
    assert unset.returncode == 1 and not log.exists()
    run = subprocess.run(command, cwd=tmp_path, env={**env, "FUSEKIT_FAILURE_LOG": str(log)},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert (tmp_path / "failures.txt.ids").read_text().splitlines() == [
        "test_sample.py::test_fails", "test_sample.py::test_setup_fails", "test_sample.py::test_random_fails"]
    text = log.read_text()
    assert "==== test_sample.py::test_fails [call]" in text and "arithmetic" in text
    assert "==== test_sample.py::test_setup_fails [setup]" in text and "fixture broke" in text
    assert "test_passes" not in text and "test_skipped" not in text
    # a test drawing from a recorded generator: its seed in the log and in the terminal's failure report, once each
    assert text.count("FUSEKIT_TEST_SEED=4242 reruns this test") == 1
    assert run.stdout.count("FUSEKIT_TEST_SEED=4242 reruns this test") == 1, run.stdout


def test_record_launches_logs_each_launch_and_launches_it(monkeypatch):
    """record_launches: every ``kernel[grid](...)`` of the named kernels is logged (name, keyword arguments) in launch
    order and still runs, with its grid; the kernels are restored with the test's monkeypatch."""
    ran = []

    class Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: ran.append((self.name, grid, args, kwargs)) or self.name

    first, second = Kernel("first"), Kernel("second")
    module = SimpleNamespace(first=first, second=second, other=Kernel("other"))
    with monkeypatch.context() as patch:
        log = record_launches(patch, module, "first", "second")
        assert module.first[(3,)](1, 2, BLOCK=16) == "first"
        assert module.second[(1, 2)](X=1) == "second"
        module.first[(4,)](5)
        module.other[(1,)]()
        assert log == [("first", {"BLOCK": 16}), ("second", {"X": 1}), ("first", {})]
        assert ran[:3] == [("first", (3,), (1, 2), {"BLOCK": 16}), ("second", (1, 2), (), {"X": 1}),
                           ("first", (4,), (5,), {})]
    assert module.first is first and module.second is second
