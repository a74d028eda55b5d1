"""Shared test configuration: GPU-only tests are skipped where kernels are not compiled."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fusecore  # noqa: E402  (fixes the kernel mode before any test module defines kernels)
from fusecore.testing import pytest_runtest_logreport  # noqa: E402, F401  (FUSEKIT_FAILURE_LOG: failures as they happen)

DATASETS = Path(os.environ.get("FUSEKIT_DATASETS", ROOT.parent / "shared" / "datasets"))


def pytest_report_header(config):
    return f"fusekit: {fusecore.backend.describe()}; datasets: {DATASETS if DATASETS.exists() else 'absent'}"


def pytest_collection_modifyitems(config, items):
    if fusecore.COMPILED:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with compiled Triton kernels")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """The device kernel tests run on: CUDA when compiled, CPU under the interpreter."""
    return fusecore.testing.test_device()


@pytest.fixture
def gen(request):
    """A fresh CPU generator per test; a failing test's report names its seed (``FUSEKIT_TEST_SEED=<seed>`` reruns
    it with the same inputs: :func:`fusecore.testing.record_seed`)."""
    return fusecore.testing.record_seed(request.node, fusecore.testing.fresh_generator())


def _global_switches() -> dict[str, object]:
    """Process-wide switches a test could leave set and so change every later test in its process (an xdist
    worker runs many): the reference path, torch.compile's tracing flag, autocast, float32 matmul precision."""
    import torch

    return {
        "fusecore.reference_enabled()": fusecore.reference_enabled(),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling(),
        "torch.is_autocast_enabled('cpu')": torch.is_autocast_enabled("cpu"),
        "torch.is_autocast_enabled('cuda')": torch.is_autocast_enabled("cuda"),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
    }


@pytest.fixture(autouse=True)
def _no_global_switch_left_set():
    """Fail the test that changes one of :func:`_global_switches` without restoring it (a compiled GPU run had one
    xdist worker's later tests all on the reference path, session 26), and restore it for the next."""
    before = _global_switches()
    yield
    after = _global_switches()
    if after != before:
        import torch

        fusecore.set_reference(before["fusecore.reference_enabled()"])
        torch.set_float32_matmul_precision(before["torch.get_float32_matmul_precision()"])
        torch.set_grad_enabled(before["torch.is_grad_enabled()"])
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        pytest.fail(f"the test left process-wide switches changed (before, after): {changed}")
