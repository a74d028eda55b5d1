"""Every decode kernel compiles for sm_90 (H100/H200) with the arguments a step passes — checked
on machines without a GPU, where the other tests only run the kernels through the interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

import fusecore

SCRIPT = Path(__file__).with_name("compile_sm90.py")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(fusecore.COMPILED, reason="with a GPU the kernels are compiled and run by the other tests")
@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_all_decode_kernels_compile_for_sm90():
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[2]), "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "kernel variants for sm_90" in run.stdout
