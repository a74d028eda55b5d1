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


@pytest.mark.skipif(fusecore.COMPILED, reason="with a GPU the kernels are compiled and run by the other tests")
@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_report_gives_each_kernel_of_the_1b_step_its_registers_and_occupancy():
    """``--report 1b 1``: the H100/H200 batch-1 plan of the Llama-3.2-1B shape (192 Q/K/V + 72 attention
    tiles in one launch) and, per kernel of its step, registers within the hardware's 255 and at least one
    resident program per SM."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[2]), "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, str(SCRIPT), "--report", "1b", "1", "{}"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "'qkv': 192, 'attention': 72" in run.stdout
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines() if line.endswith("USE_PDL=True")
            or "USE_PDL=True," in line}
    for kernel in ("qkv_attention_kernel", "residual_proj_kernel", "gate_up_kernel", "lm_head_kernel"):
        warps, registers, warps_per_sm = int(rows[kernel][1]), int(rows[kernel][2]), int(rows[kernel][5])
        assert 0 < registers <= 255 and warps_per_sm >= warps, rows[kernel]


@pytest.mark.skipif(fusecore.COMPILED, reason="with a GPU the kernels are compiled and run by the other tests")
@pytest.mark.skipif(not PTXAS.exists(), reason="triton's bundled ptxas is missing")
def test_report_of_the_looped_step_gives_the_looped_kernel_one_row():
    """``--report 1b 8 --looped``: the looped step (embedding, looped kernel, token pick) of the batch-8 plan;
    the looped kernel, one budget for all its tiles, within the hardware's 255 registers."""
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[2]), "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, str(SCRIPT), "--report", "1b", "8", "--looped"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "looped step" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("looped_decode_kernel")]
    assert len(rows) == 1 and 0 < int(rows[0][2]) <= 255, rows


def test_pdl_order_check_names_memory_instructions_not_substrings():
    """``check_pdl_order`` flags a global access before ``griddepcontrol.wait`` (here a ``red.`` reduction), not
    shared-memory instructions whose ``shared.`` merely contains ``red.`` (an mbarrier's, a ``cp.async`` copy's)."""
    code = (
        "import compile_sm90 as c\n"
        "ok = ['mbarrier.init.shared.b64 [%r1], 1;', 'mbarrier.arrive.expect_tx.shared.b64 _, [%r2], 4096;',\n"
        "      'cp.async.cg.shared.global [%r3], [%rd1], 16;', 'griddepcontrol.wait;', 'ld.global.b32 %r4, [%rd2];']\n"
        "c.check_pdl_order('k', '\\n'.join(ok), False, False)\n"
        "red = ['@%p1 red.relaxed.gpu.global.add.f32 [%rd3], %f1;']\n"
        "try:\n"
        "    c.check_pdl_order('k', '\\n'.join(red + ok), False, False)\n"
        "except AssertionError as e:\n"
        "    print('flagged:', e)\n")
    env = {**os.environ, "PYTHONPATH": f"{SCRIPT.parent}{os.pathsep}{SCRIPT.parents[2]}"}
    env.pop("TRITON_INTERPRET", None)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "flagged: k: memory accesses before griddepcontrol.wait" in run.stdout and "red.relaxed" in run.stdout
