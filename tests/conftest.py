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
def gen():
    """A fresh CPU generator per test (seed printed on failure through its repr in asserts)."""
    return fusecore.testing.fresh_generator()
