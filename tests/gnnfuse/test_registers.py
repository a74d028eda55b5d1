"""tests/gnnfuse/registers.py: a layer row's kernels compiled for sm_90 on the CPU, resources printed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusecore.backend import COMPILED

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "registers.py"


@pytest.mark.skipif(COMPILED, reason="compile-only runs under the interpreter, on machines without a GPU")
def test_a_row_prints_its_kernels_resources(tmp_path):
    env = {**os.environ, "FUSEKIT_COMPILE_FOR": "sm_90", "FUSEKIT_COMPILE_ONLY": "1", "PYTHONPATH": str(ROOT),
           "FUSEKIT_COMPILE_REPORT": str(tmp_path / "report.jsonl")}
    env.pop("FUSEKIT_BACKEND", None)
    done = subprocess.run([sys.executable, str(SCRIPT), "gat-bf16", "gat-bf16:LIGHT_SOURCE_UNROLLED=False",
                           "--nodes", "4000"], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    sections = done.stdout.split("== ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["gat-bf16", "gat-bf16:LIGHT_SOURCE_UNROLLED=False"]
    for section in sections:  # every row reports its own specialisations, those of the row before included
        for kernel in ("attention_forward_light_kernel", "attention_backward_src_light_kernel",
                       "attention_forward_rows_kernel", "row_sums_kernel"):
            assert kernel in section, section
        # local memory only where a register cap asks for it: the GAT bf16 source pass at maxnreg 96
        # (ops.LIGHT_UNROLLED_MAXNREG; 8-16 bytes with the GPU's Triton 3.6, more with later ones)
        for line in section.splitlines()[3:]:
            parts = line.split()
            if len(parts) > 4 and parts[1].isdigit():
                assert parts[3] == "0" or ("src_light_kernel" in parts[0] and "UNROLLED=True" in line), line
    # the second row's plans are its own: the source pass in tile form there, unrolled in the first
    source = [[line for line in section.splitlines() if "src_light_kernel" in line] for section in sections]
    assert source[0] and all("UNROLLED=True" in line for line in source[0])
    assert source[1] and all("UNROLLED=False" in line for line in source[1])


def test_it_refuses_to_run_without_compile_only():
    env = {k: v for k, v in os.environ.items() if k != "FUSEKIT_COMPILE_ONLY"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, str(SCRIPT), "gat-bf16"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "FUSEKIT_COMPILE_ONLY=1" in done.stderr
