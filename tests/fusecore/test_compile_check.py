"""fusecore.compile_check: interpreted launches also compiled for a GPU target (FUSEKIT_COMPILE_FOR)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fusecore.backend import COMPILED

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(COMPILED, reason="the check runs under the interpreter, on machines without a GPU")
def test_compiles_each_launch_and_rejects_what_only_the_interpreter_accepts(tmp_path):
    report, dump = tmp_path / "resources.jsonl", tmp_path / "stages"
    env = {**os.environ, "FUSEKIT_COMPILE_FOR": "sm_90", "FUSEKIT_COMPILE_REPORT": str(report),
           "FUSEKIT_COMPILE_DUMP": str(dump), "PYTHONPATH": str(ROOT)}
    env.pop("FUSEKIT_BACKEND", None)
    script = Path(__file__).parent / "data" / "compile_check_kernels.py"
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rejected: fusecore.compile_check" not in done.stdout  # names the kernel, not the checker
    assert "interpreter_only_kernel" in done.stdout

    # the resource report: one line per compiled specialisation (good_kernel once, though launched twice)
    from fusecore.compile_check import KernelResources, format_report

    entries = [KernelResources(**json.loads(line)) for line in report.read_text().splitlines()]
    assert [e.kernel.rsplit(".", 1)[-1] for e in entries] == ["good_kernel"] + ["square_sum_dot_kernel"] * 2
    good, read_once, loaded_twice = entries
    # the operand chunk with two readers has no swizzle (Triton 3.9 lays the [16, 128] float32 chunk
    # out column-major: a 64-byte pitch, ~4-way conflicts); loaded a second time for the sum of
    # squares, it has one
    assert "SECOND_LOAD=0" in read_once.constexprs
    conflict = r"opIdx 0 16x128xf32 order \[\d, \d\]: pitch \d+ B, ~[2-8]-way"
    assert re.fullmatch(conflict, read_once.unswizzled_dot_operands), read_once
    assert "SECOND_LOAD=1" in loaded_twice.constexprs and loaded_twice.unswizzled_dot_operands == ""
    assert good.unswizzled_dot_operands == ""
    assert (good.target, good.num_warps, good.constexprs) == ("sm_90", 2, "BLOCK=16")
    assert 0 < good.registers <= 255 and good.local_bytes == 0 and good.warps_per_sm == 64
    # the stages of that one specialisation, read without a GPU
    stages = sorted(p.name.rsplit(".", 1)[-1] for p in dump.glob("*good_kernel*"))
    assert stages == ["llir", "ptx", "ttgir", "ttir", "txt"], stages
    ptx = next(dump.glob("*good_kernel*.ptx")).read_text()
    assert ".target sm_90" in ptx and "BLOCK=16" in next(dump.glob("*good_kernel*.txt")).read_text()
    assert "ttg.num-warps" in next(dump.glob("*good_kernel*.ttgir")).read_text()
    table = format_report(entries)
    assert "good_kernel" in table
    assert "3 specialisations, 0 with local memory (spills or stack), 1 with tensor-core operands" in table
    assert "square_sum_dot_kernel [SECOND_LOAD=0, BM=16, BN=32, BK=128]: opIdx 0 16x128xf32" in table
    shown = subprocess.run([sys.executable, "-m", "fusecore.compile_check", str(report)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "good_kernel" in shown.stdout, shown.stdout + shown.stderr


@pytest.mark.parametrize("registers, shared, warps, blocks", [
    (32, 0, 4, 16),           # the 64-warp limit
    (128, 0, 4, 4),           # 128 regs x 32 lanes x 4 warps = 16 K of the 64 K registers
    (255, 0, 8, 1),           # 255 rounds up to 8,160 per warp: one 8-warp block
    (40, 100 * 1024, 4, 2),   # 101 KiB with the per-block reserve: two blocks in 228 KiB
    (16, 0, 1, 32),           # the 32-block limit
    (64, 240 * 1024, 4, 0),   # does not fit
])
def test_occupancy(registers, shared, warps, blocks):
    from fusecore.compile_check import occupancy

    assert occupancy(registers, shared, warps) == blocks


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


def test_unswizzled_dot_operands_reads_the_encoding_and_pitch():
    """The TTGIR reading of fusecore.compile_check.unswizzled_dot_operands on the two encodings the
    llmfuse batch-8 gate/up tile had (Triton 3.9, sm_90): the x chunk's buffer with one reader too
    many (no swizzle, 512-byte rows: the 8-way conflict Nsight Compute measured), and swizzled."""
    from fusecore.compile_check import unswizzled_dot_operands

    def ttgir(max_phase: int, order: str, shape: str) -> str:
        encoding = f"{{vec = 1, perPhase = 1, maxPhase = {max_phase}, order = [{order}]}}"
        return (f"#shared = #ttg.swizzled_shared<{encoding}>\n"
                f"#shared1 = #ttg.swizzled_shared<{{vec = 8, perPhase = 1, maxPhase = 8, order = [1, 0]}}>\n"
                f"%out = ttg.local_load %x token %t : !ttg.memdesc<{shape}, #shared, #smem, mutable> -> "
                f"tensor<{shape}, #ttg.dot_op<{{opIdx = 0, parent = #mma, kWidth = 2}}>> loc(#loc1)\n"
                f"%w = ttg.local_load %y token %t : !ttg.memdesc<64x128xbf16, #shared1, #smem, mutable> -> "
                f"tensor<64x128xbf16, #ttg.dot_op<{{opIdx = 1, parent = #mma, kWidth = 2}}>> loc(#loc2)\n"
                f"%s = ttg.local_load %x token %t : !ttg.memdesc<{shape}, #shared, #smem, mutable> -> "
                f"tensor<{shape}, #blocked1> loc(#loc3)\n")

    assert unswizzled_dot_operands(ttgir(1, "1, 0", "16x128xf32")) == [
        "opIdx 0 16x128xf32 order [1, 0]: pitch 512 B, ~8-way"]
    assert unswizzled_dot_operands(ttgir(1, "1, 0", "16x32xbf16")) == [
        "opIdx 0 16x32xbf16 order [1, 0]: pitch 64 B, ~4-way"]
    assert unswizzled_dot_operands(ttgir(1, "1, 0", "16x8xbf16")) == []  # 16-byte rows: no conflict
    assert unswizzled_dot_operands(ttgir(4, "1, 0", "16x128xf32")) == []  # swizzled
    # a CUDA-core product (float32 ieee: the operand layouts' parent is blocked) is not a tensor-core read
    assert unswizzled_dot_operands(ttgir(1, "1, 0", "16x128xf32").replace("#mma", "#blocked")) == []
