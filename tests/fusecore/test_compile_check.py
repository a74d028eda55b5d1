"""fusecore.compile_check: interpreted launches also compiled for a GPU target (FUSEKIT_COMPILE_FOR)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusecore.backend import COMPILED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(COMPILED, reason="the check runs under the interpreter, on machines without a GPU")
def test_compiles_each_launch_and_rejects_what_only_the_interpreter_accepts():
    env = {**os.environ, "FUSEKIT_COMPILE_FOR": "sm_90", "PYTHONPATH": str(ROOT)}
    env.pop("FUSEKIT_BACKEND", None)
    script = Path(__file__).parent / "data" / "compile_check_kernels.py"
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rejected: fusecore.compile_check" not in done.stdout  # names the kernel, not the checker
    assert "interpreter_only_kernel" in done.stdout


@pytest.mark.parametrize("text,arch", [("sm_90", 90), ("SM80", 80), ("90a", 90), ("100", 100)])
def test_parse_target(text, arch):
    from fusecore.compile_check import parse_target

    target = parse_target(text)
    assert (target.backend, target.arch, target.warp_size) == ("cuda", arch, 32)


@pytest.mark.parametrize("text", ["hopper", "sm_9", "", "cuda:0"])
def test_parse_target_rejects(text):
    from fusecore.compile_check import parse_target

    with pytest.raises(ValueError, match="FUSEKIT_COMPILE_FOR"):
        parse_target(text)
