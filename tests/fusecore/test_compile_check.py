"""fusecore.compile_check: interpreted launches also compiled for a GPU target (FUSEKIT_COMPILE_FOR)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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

    # the same kernels compiled from a copy whose every line moved down: same PTX once debug info is
    # stripped (the locations differ), one specialisation fewer (the test kernel not launched)
    moved = tmp_path / "moved.py"
    moved.write_text("# a line that moves every kernel down\n" + script.read_text().replace(
        "    for second_load in (0, 1):", "    for second_load in (0,):"))
    env["FUSEKIT_COMPILE_DUMP"] = str(tmp_path / "moved_stages")
    env.pop("FUSEKIT_COMPILE_REPORT")
    done = subprocess.run([sys.executable, str(moved)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    raw = [next((tmp_path / d).glob("*good_kernel*.ptx")).read_text() for d in ("stages", "moved_stages")]
    assert raw[0] != raw[1]  # line numbers in the debug info
    compared = subprocess.run([sys.executable, "-m", "fusecore.compile_check", "--compare", str(dump),
                               str(tmp_path / "moved_stages")], env=env, capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert compared.stdout.startswith("2 specialisations with the same PTX (debug info stripped), 0 differing, "
                                      "1 only before, 0 only after"), compared.stdout
    assert "only before: __main__.square_sum_dot_kernel | constexprs: SECOND_LOAD=1" in compared.stdout


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


def test_compare_dumps_finds_a_changed_instruction(tmp_path):
    """fusecore.compile_check.compare_dumps on hand-written dump folders: debug info and comments do
    not count, an instruction does; the argument types are part of a specialisation's identity."""
    from fusecore.compile_check import compare_dumps, normalized_ptx

    body = ".visible .entry k(\n.param .u64 p\n)\n{\n\tld.global.f32 %f1, [%rd1];\n\tret;\n}\n"
    debug = '.file 1 "k.py"\n.loc 1 7 0\n$L__tmp3:\n.section .debug_info\n{\n.b8 1\n}\n'
    assert normalized_ptx(body + debug) == normalized_ptx(".loc 1 9 0 // moved\n" + body)

    def dump(folder: str, kernels: dict[str, tuple[str, str]]) -> Path:
        path = tmp_path / folder
        path.mkdir()
        for stem, (arg_type, ptx) in kernels.items():
            (path / f"{stem}.txt").write_text(f"m.{stem.split('.')[0]}\nconstexprs: B=16\noptions: default\n")
            (path / f"{stem}.ttir").write_text(f'  tt.func public @k(%p: {arg_type} loc("p"(#loc))) {{\n')
            (path / f"{stem}.ptx").write_text(ptx)
        return path

    before = dump("before", {"k.aaa": ("!tt.ptr<f32>", body + debug), "k.bbb": ("!tt.ptr<f16>", body),
                             "gone.ccc": ("i32", body)})
    after = dump("after", {"k.ddd": ("!tt.ptr<f32>", body.replace("ld.global", "ld.global.nc")),
                           "k.eee": ("!tt.ptr<f16>", ".loc 1 1 0\n" + body), "new.fff": ("i32", body)})
    result = compare_dumps(before, after)
    assert result.same == 1 and len(result.differing) == 1 and "f32" in result.differing[0]
    assert [k.splitlines()[0] for k in result.only_before] == ["m.gone"]
    assert [k.splitlines()[0] for k in result.only_after] == ["m.new"]
    assert "1 specialisations with the same PTX" in result.report() and "DIFFERING: m.k" in result.report()


def test_arguments_are_specialised_as_a_gpu_launch_does():
    """Integers equal to 1 become constexprs; multiples of 16 and 16-byte-aligned tensors get
    tt.divisibility 16, unless the parameter opts out — as Triton's launcher specialises them."""
    from types import SimpleNamespace

    from fusecore.compile_check import _specialize

    plain = SimpleNamespace(is_const=False, do_not_specialize=False, do_not_specialize_on_alignment=False)
    x = torch.zeros(64)
    assert _specialize(1, plain)[0] == "constexpr"
    assert _specialize(32, plain) == ("i32", True) and _specialize(17, plain) == ("i32", False)
    assert _specialize(2**40, plain) == ("i64", True)
    assert _specialize(x, plain) == ("*fp32", True) and _specialize(x[1:], plain) == ("*fp32", False)
    assert _specialize(1.5, plain) == ("fp32", False) and _specialize(True, plain) == ("u1", False)
    assert _specialize(None, plain) is None and _specialize("text", plain) is None
    unspecialised = SimpleNamespace(is_const=False, do_not_specialize=True, do_not_specialize_on_alignment=True)
    assert _specialize(1, unspecialised) == ("i32", False) and _specialize(32, unspecialised) == ("i32", False)
    assert _specialize(x, unspecialised) == ("*fp32", False)


@pytest.mark.skipif(COMPILED, reason="the check runs under the interpreter, on machines without a GPU")
def test_compile_only_compiles_and_reports_without_running(tmp_path):
    """FUSEKIT_COMPILE_ONLY=1: each launch is compiled and reported, and not interpreted (its output
    keeps the value it was allocated with)."""
    report = tmp_path / "resources.jsonl"
    env = {**os.environ, "FUSEKIT_COMPILE_FOR": "sm_90", "FUSEKIT_COMPILE_REPORT": str(report),
           "FUSEKIT_COMPILE_ONLY": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{Path(__file__).parent / 'data'}"}
    env.pop("FUSEKIT_BACKEND", None)
    code = ("import torch\n"
            "from compile_check_kernels import good_kernel\n"
            "x, out = torch.randn(13), torch.full((1,), float('nan'))\n"
            "good_kernel[(1,)](x, out, 13, BLOCK=16, num_warps=2)\n"
            "print('untouched' if out.isnan().all() else 'written')\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "untouched"
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    assert [e["kernel"].rsplit(".", 1)[-1] for e in entries] == ["good_kernel"] and 0 < entries[0]["registers"] <= 255


def test_register_cap_is_the_largest_count_that_keeps_the_programs_resident():
    """fusecore.device.register_cap against this module's occupancy: under the cap the programs fit together,
    8 registers more (the allocation step) and one of them no longer does, unless the cap is the 255 ceiling."""
    from fusecore.compile_check import occupancy
    from fusecore.device import MAX_REGISTERS_PER_THREAD, register_cap

    assert register_cap(8, 4) == 64  # fusecore.linear's column sums: 4 programs of 8 warps
    assert register_cap(4, 1) == MAX_REGISTERS_PER_THREAD
    for warps in (1, 2, 4, 8, 16, 32):
        for programs in range(1, min(32, 64 // warps) + 1):  # the warp and block limits
            cap = register_cap(warps, programs)
            assert cap % 8 == 0 or cap == MAX_REGISTERS_PER_THREAD
            assert occupancy(cap, 0, warps) >= programs
            if cap < MAX_REGISTERS_PER_THREAD:
                assert occupancy(cap + 8, 0, warps) < programs
    for bad in ((0, 1), (8, 0), (8.0, 4), (True, 4)):
        with pytest.raises(ValueError, match="register_cap"):
            register_cap(*bad)
    with pytest.raises(ValueError, match="exceed"):
        register_cap(32, 64)
