"""Compile every interpreted kernel launch for a real GPU target too: GPU compile errors on a CPU machine.

The Triton interpreter is more permissive than the compiler: Python control flow on tensor
values, loop-carried values that change dtype, block shapes that are not powers of two, or
calls the NVIDIA backend cannot lower run fine on the CPU and fail only on the GPU.  With

    FUSEKIT_COMPILE_FOR=sm_90 python -m pytest tests/gnnfuse -x -q

(or ``sm_80``, ``sm_100`` ...) every kernel launch made under the interpreter is, in addition,
compiled for that target — Triton frontend, LLVM and ``ptxas``, exactly as on the GPU, with the
argument types, ``constexpr`` values and launch options (``num_warps``, ``num_stages``,
``maxnreg`` ...) of that launch — before it runs through the interpreter as usual.  A failure
raises :class:`CompileCheckError` naming the kernel and target, with Triton's message.  Each
distinct specialisation is compiled once per process (and Triton's on-disk cache keeps it
across runs).

The check uses the Triton installed here, which may be newer than the GPU machine's: it
catches what the compiler rejects, not an API that an older Triton lacks.  Arguments are
specialised as a GPU launch specialises them (Triton's own routine): integers get their launch
types (``i32``, ``i64``, ``u64`` by value), an integer equal to 1 becomes a constexpr, and an
integer that is a multiple of 16 or a tensor whose address is gets ``tt.divisibility`` 16 —
without that the compiled code and its register count differ from the GPU's (a gnnfuse row
kernel: 199 registers reported against the 96 the H100's profiler counted).

With ``FUSEKIT_COMPILE_REPORT=<file.jsonl>`` as well, each compiled specialisation appends one
line to that file: the kernel, its launch options and constexprs, and what ``ptxas`` allotted —
registers per thread, local memory per thread (spills and stack), static shared memory — with
the occupancy those imply on the target (:func:`occupancy`), and the tensor-core operands it reads
from shared memory without a swizzle, i.e. with bank conflicts (:func:`unswizzled_dot_operands`).
``python -m fusecore.compile_check <file.jsonl>`` prints them as a table, spilling kernels first:
register pressure, spills and conflicted operands of every kernel a test touches, read on a CPU
machine.  With ``FUSEKIT_COMPILE_DUMP=<folder>`` each
specialisation's compiler stages (TTIR, TTGIR — layouts, shared-memory buffers and their
swizzling, pipelining —, LLVM IR and PTX) are written there as ``<kernel>.<hash>.<stage>``, with
its constexprs and launch options in ``<kernel>.<hash>.txt``: what the compiler made of a kernel,
read without a GPU.  With ``FUSEKIT_COMPILE_ONLY=1`` launches are compiled (and reported, dumped) but
not run: outputs keep whatever they were allocated with, so only code whose launches do not depend on
earlier kernels' values gets through — a layer's forward and backward does; it is the way to read the
resources that the GPU machine's Triton gives (installed beside this one, e.g. ``pip install --target``
of its version and ``PYTHONPATH`` on it, where that version's interpreter cannot run against this
machine's packages).  ``python -m fusecore.compile_check --compare BEFORE AFTER`` compares two such
folders specialisation by specialisation, PTX with debug info stripped: proof that a refactor left
the compiled kernels unchanged.

How: a :class:`CheckedFunction` is a ``triton.runtime.jit.JITFunction`` (so the compiler
treats it, and calls to it from other kernels, as a jit function) that runs through an
``InterpretedFunction`` when launched or called under the interpreter.  :func:`install`
gives Triton's own ``@jit`` library functions (``tl.sum``, ``tl.sigmoid`` ... and their tensor
member forms) the same double nature.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.runtime.errors import InterpreterError
from triton.runtime.interpreter import InterpretedFunction, TensorHandle, _patch_lang
from triton.runtime.jit import JITFunction, mangle_type

from .device import REGISTER_ALLOCATION_UNIT, REGISTERS_PER_SM

try:  # Triton's own launch specialisation (integers == 1, divisibility by 16)
    from triton._C.libtriton import native_specialize_impl as _native_specialize
except ImportError:  # pragma: no cover - older Triton
    _native_specialize = None

ENV_VAR = "FUSEKIT_COMPILE_FOR"
REPORT_ENV_VAR = "FUSEKIT_COMPILE_REPORT"
DUMP_ENV_VAR = "FUSEKIT_COMPILE_DUMP"
COMPILE_ONLY_ENV_VAR = "FUSEKIT_COMPILE_ONLY"
# the compiler stages written per specialisation with FUSEKIT_COMPILE_DUMP (those the target has)
DUMPED_STAGES = ("ttir", "ttgir", "llir", "ptx")

# Per-SM limits of the sm_80 .. sm_100 multiprocessors (CUDA programming guide, compute
# capability table): the registers (fusecore.device); 64 resident warps and 32 resident blocks (sm_80
# and sm_90); 228 KiB of shared memory, 1 KiB of it reserved per block.
MAX_WARPS_PER_SM = 64
MAX_BLOCKS_PER_SM = 32
SHARED_PER_SM = 228 * 1024
SHARED_RESERVED_PER_BLOCK = 1024



class CompileCheckError(RuntimeError):
    """A kernel that runs under the interpreter does not compile for the checked GPU target."""


def parse_target(text: str) -> GPUTarget:
    """``"sm_90"`` (or ``"90"``) -> ``GPUTarget("cuda", 90, 32)``; a ValueError for anything else."""
    match = re.fullmatch(r"(?:sm_?)?(\d{2,3})a?", text.strip().lower())
    if not match:
        raise ValueError(f"{ENV_VAR}={text!r} is not a CUDA target; expected e.g. sm_90 or sm_80")
    return GPUTarget("cuda", int(match.group(1)), 32)


@dataclass(frozen=True)
class KernelResources:
    """What ``ptxas`` allotted one compiled specialisation, and the occupancy that implies.

    ``registers`` per thread; ``local_bytes`` per thread of local memory (register spills and
    stack arrays: each access is a round trip through L1/L2); ``shared_bytes`` of static plus
    Triton's dynamic shared memory per block; ``blocks_per_sm`` and ``warps_per_sm`` the
    resident blocks and warps one multiprocessor can hold (of 64 warps); ``unswizzled_dot_operands``
    the shared-memory buffers that feed tensor-core operands without a swizzle (:func:`unswizzled_dot_operands`).
    """

    kernel: str
    target: str
    num_warps: int
    num_stages: int
    constexprs: str
    registers: int
    local_bytes: int
    shared_bytes: int
    blocks_per_sm: int
    warps_per_sm: int
    unswizzled_dot_operands: str = ""


def occupancy(registers: int, shared_bytes: int, num_warps: int) -> int:
    """Resident blocks per SM for a block of ``num_warps`` warps using ``registers`` per thread
    and ``shared_bytes`` of shared memory: the least of the register, shared-memory, warp and
    block limits (0 when one block does not fit)."""
    regs_per_warp = -(-max(registers, 1) * 32 // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    by_registers = REGISTERS_PER_SM // (regs_per_warp * num_warps)
    by_shared = SHARED_PER_SM // (shared_bytes + SHARED_RESERVED_PER_BLOCK)
    return min(by_registers, by_shared, MAX_WARPS_PER_SM // num_warps, MAX_BLOCKS_PER_SM)


_SWIZZLED_SHARED = re.compile(r"^#(\w+) = #ttg\.swizzled_shared<\{vec = (\d+), perPhase = (\d+), "
                              r"maxPhase = (\d+), order = \[([\d, ]+)\]", re.M)
_DOT_OPERAND_LOAD = re.compile(r"ttg\.local_load [^:]*: !ttg\.memdesc<([\dx]+)x([a-z]+\d+), #(\w+)[^>]*> -> "
                               r"tensor<[^>]*#ttg\.dot_op<\{opIdx = (\d), parent = #mma")
_ELEMENT_BITS = re.compile(r"[a-z]+(\d+)")
BANK_LINE_BYTES = 128  # 32 banks of 4 bytes
ROWS_PER_READ = 8  # a tensor-core operand read (ldmatrix pattern): 8 rows of 16 bytes per phase


def unswizzled_dot_operands(ttgir: str) -> list[str]:
    """The tensor-core operands of a kernel (``ttg.local_load`` into a ``#ttg.dot_op`` layout whose
    parent is an ``#mma`` layout, in TTGIR; a float32 ``ieee`` product runs on CUDA cores, parent
    ``#blocked``, and is not examined) read from a shared-memory buffer whose ``swizzled_shared``
    encoding has no swizzle (``maxPhase = 1``), with the bank conflict that implies when the
    buffer's contiguous rows are ``pitch`` bytes apart: an 8-row read of 16 bytes per row meets
    ``min(8, 128 / gcd(pitch, 128))`` distinct bank groups, so ``8 / that``-way conflicts (pitch
    16 B: none; 64 B: 4-way; any multiple of 128 B: 8-way).  One string per conflicting operand,
    e.g. ``"opIdx 0 16x128xf32 order [1, 0]: pitch 512 B, ~8-way"``.

    Triton gives a buffer no swizzle when it cannot pick one layout for all its readers, e.g. a
    pipelined chunk that feeds ``tl.dot`` and an elementwise reduction (``tl.sum(x * x)``) too; a
    second load of the chunk for the other reader gets the operand its swizzle back.  Hopper's
    ``nvmma_shared`` (wgmma) buffers are not examined.
    """
    encodings = {name: (int(max_phase), [int(i) for i in order.split(",")])
                 for name, _vec, _per, max_phase, order in _SWIZZLED_SHARED.findall(ttgir)}
    found = []
    for shape, dtype, encoding, op_idx in _DOT_OPERAND_LOAD.findall(ttgir):
        if encoding not in encodings or encodings[encoding][0] != 1:
            continue
        order = encodings[encoding][1]
        dims = [int(d) for d in shape.split("x")]
        bits = _ELEMENT_BITS.fullmatch(dtype)
        if bits is None or len(order) != len(dims):
            continue
        pitch = dims[order[0]] * int(bits.group(1)) // 8
        groups = min(ROWS_PER_READ, BANK_LINE_BYTES // math.gcd(pitch, BANK_LINE_BYTES))
        ways = ROWS_PER_READ // max(groups, 1)
        if ways > 1:
            found.append(f"opIdx {op_idx} {shape}x{dtype} order {order}: pitch {pitch} B, ~{ways}-way")
    return found


def _cuobjdump() -> str | None:
    """The ``cuobjdump`` shipped with Triton's NVIDIA backend (or on PATH); None if absent."""
    try:
        import triton.backends.nvidia as nvidia

        bundled = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def resources(compiled: Any, name: str, target: GPUTarget, constexprs: dict) -> KernelResources:
    """Read registers, local and shared memory of a ``triton.compile`` result from its cubin."""
    tool = _cuobjdump()
    if tool is None:
        raise CompileCheckError(f"{REPORT_ENV_VAR} needs cuobjdump (Triton's NVIDIA backend ships one): not found")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        text = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    usage = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", text)
    if usage is None:
        raise CompileCheckError(f"cuobjdump printed no resource usage for {name}:\n{text}")
    registers, stack, static_shared, local = map(int, usage.groups())
    meta = compiled.metadata
    shared = static_shared + int(getattr(meta, "shared", 0) or 0)
    blocks = occupancy(registers, shared, meta.num_warps)
    return KernelResources(
        kernel=name, target=f"sm_{target.arch}", num_warps=meta.num_warps, num_stages=meta.num_stages,
        constexprs=", ".join(f"{k}={v}" for k, v in constexprs.items()), registers=registers,
        local_bytes=local + stack, shared_bytes=shared, blocks_per_sm=blocks, warps_per_sm=blocks * meta.num_warps,
        unswizzled_dot_operands="; ".join(unswizzled_dot_operands(str(compiled.asm.get("ttgir", "")))))


def _record(entry: KernelResources) -> None:
    path = os.environ.get(REPORT_ENV_VAR, "").strip()
    if path:
        with open(path, "a") as out:  # one short line per write: concurrent test workers append safely
            out.write(json.dumps(asdict(entry)) + "\n")


def format_report(entries: list[KernelResources]) -> str:
    """A table of compiled specialisations: spilling kernels first, then by registers (most first);
    then the tensor-core operands read from unswizzled shared memory, per specialisation."""
    rows = sorted({e for e in entries}, key=lambda e: (-e.local_bytes, -e.registers, e.kernel))
    head = f"{'kernel':44} {'warps':>5} {'regs':>4} {'local B':>7} {'smem KiB':>8} {'warps/SM':>8}  constexprs"
    lines = [head, "-" * len(head)]
    for e in rows:
        lines.append(f"{e.kernel[-44:]:44} {e.num_warps:5d} {e.registers:4d} {e.local_bytes:7d} "
                     f"{e.shared_bytes / 1024:8.1f} {e.warps_per_sm:8d}  {e.constexprs}")
    spilling = sum(e.local_bytes > 0 for e in rows)
    conflicted = [e for e in rows if e.unswizzled_dot_operands]
    lines.append(f"{len(rows)} specialisations, {spilling} with local memory (spills or stack), "
                 f"{len(conflicted)} with tensor-core operands in unswizzled shared memory")
    for e in conflicted:
        lines.append(f"  {e.kernel} [{e.constexprs}]: {e.unswizzled_dot_operands}")
    return "\n".join(lines)


def _specialize(value: Any, param: Any) -> tuple[str, bool] | None:
    """``(type, divisible by 16)`` of a runtime argument as a GPU launch specialises it: an
    integer equal to 1 becomes the constexpr 1 (type ``"constexpr"``), an integer multiple of 16
    and a tensor whose address is a multiple of 16 get ``tt.divisibility`` 16 (unless the
    parameter opts out with ``do_not_specialize`` / ``do_not_specialize_on_alignment``).
    Without these the compiled code, and its register count, would differ from the GPU's.
    None: pass the value as a constexpr."""
    if not isinstance(value, (torch.Tensor, bool, int, float)):
        return None
    if _native_specialize is None:  # an older Triton: the type alone, tensors assumed aligned
        return mangle_type(value), isinstance(value, torch.Tensor)
    kind, spec = _native_specialize(BaseBackend, value, bool(getattr(param, "is_const", False)),
                                    not getattr(param, "do_not_specialize", False),
                                    not getattr(param, "do_not_specialize_on_alignment", False))
    return kind, spec == "D"


class CheckedFunction(JITFunction):
    """A kernel (or device function) compiled for ``target`` at each new launch specialisation,
    then run through the Triton interpreter."""

    target: GPUTarget

    def __init__(self, fn, target: GPUTarget, **kwargs: Any):
        super().__init__(fn, **kwargs)
        self.target = target
        self.interpreted = InterpretedFunction(fn)
        self._compiled: set = set()

    def __call__(self, *args: Any, **kwargs: Any):
        """A device-function call inside an interpreted kernel.  Triton's own
        ``InterpretedFunction.__call__`` patches ``triton.language`` with interpreter semantics and
        never undoes it, which would break every later compile: patch and restore here."""
        scope = _patch_lang(self.fn)
        try:
            return self.interpreted.rewrite()(*args, **kwargs)
        except Exception as exc:
            raise InterpreterError(repr(exc)) from exc
        finally:
            scope.restore()

    def __get__(self, instance: Any, owner: type | None = None):
        # tensor member form (x.sum()): bound for the interpreter through __call__, which undoes its
        # patching of triton.language (the InterpretedFunction's own call leaves tl.zeros & co.
        # patched, and every later compile then fails); the compiler binds it itself
        if instance is not None and isinstance(getattr(instance, "handle", None), TensorHandle):
            return functools.partial(self, instance)
        return self

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any):
        self.check(args, kwargs)
        if os.environ.get(COMPILE_ONLY_ENV_VAR, "").strip() not in ("", "0"):
            return None  # compiled, not run: the launch's outputs stay as they were allocated
        return self.interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)

    def check(self, args: tuple, kwargs: dict) -> None:
        """Compile this launch's specialisation for the target (once); raise CompileCheckError."""
        values = dict(zip(self.arg_names, args))
        values.update({k: v for k, v in kwargs.items() if k in self.arg_names})
        options = {k: v for k, v in kwargs.items() if k not in self.arg_names}
        signature, constexprs, attrs = {}, {}, {}
        for index, (name, param) in enumerate(zip(self.arg_names, self.params)):
            if name not in values:
                if not param.has_default:
                    raise CompileCheckError(f"{self.fn.__qualname__} launched without its argument {name!r}")
                values[name] = param.default
            value = values[name]
            spec = None if param.is_constexpr else _specialize(value, param)
            if spec is None or spec[0] == "constexpr":
                signature[name], constexprs[(index,)] = "constexpr", value
            else:
                signature[name] = spec[0]
                if spec[1]:
                    attrs[(index,)] = [["tt.divisibility", 16]]
        key = (tuple(signature.items()), tuple((k, repr(v)) for k, v in constexprs.items()),
               tuple(sorted(attrs)), tuple(sorted((k, repr(v)) for k, v in options.items())))
        if key in self._compiled:
            return
        import triton

        try:
            compiled = triton.compile(ASTSource(self, signature, constexprs, attrs), target=self.target,
                                      options=options)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is the finding
            raise CompileCheckError(
                f"{self.fn.__module__}.{self.fn.__qualname__} runs under the interpreter but does not compile for "
                f"{self.target.backend} sm_{self.target.arch} (launch options {options or 'default'}):\n{exc}"
            ) from exc
        self._compiled.add(key)
        names = [self.arg_names[i[0]] for i in constexprs]
        shown = dict(zip(names, constexprs.values()))
        name = f"{self.fn.__module__}.{self.fn.__qualname__}"
        if os.environ.get(REPORT_ENV_VAR, "").strip():
            _record(resources(compiled, name, self.target, shown))
        folder = os.environ.get(DUMP_ENV_VAR, "").strip()
        if folder:
            dump_stages(compiled, name, shown, options, Path(folder))


def dump_stages(compiled: Any, name: str, constexprs: dict, options: dict, folder: Path) -> list[Path]:
    """Write the :data:`DUMPED_STAGES` of a ``triton.compile`` result into ``folder`` as
    ``<name>.<hash>.<stage>`` and a ``.txt`` naming its constexprs and options; return the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name}.{compiled.hash[:12]}"
    paths = [folder / f"{stem}.txt"]
    listed = ", ".join(f"{k}={v}" for k, v in constexprs.items())
    paths[0].write_text(f"{name}\nconstexprs: {listed}\noptions: {options or 'default'}\n")
    for stage in DUMPED_STAGES:
        if stage in compiled.asm:
            paths.append(folder / f"{stem}.{stage}")
            paths[-1].write_text(str(compiled.asm[stage]))
    return paths


_DEBUG_LABEL = re.compile(r"^\$L__(tmp|func_begin|func_end)\d*:$")
_LOCATION = re.compile(r" loc\([^()]*(\([^()]*\))?\)")


def normalized_ptx(ptx: str) -> str:
    """PTX without what moves when only source lines move: ``.loc`` / ``.file`` directives, the
    ``.section .debug_*`` blocks, debug labels, comments and blank lines."""
    kept, in_debug_section = [], False
    for line in ptx.splitlines():
        stripped = line.strip()
        if in_debug_section:
            in_debug_section = stripped != "}"
            continue
        if stripped.startswith(".section") and ".debug" in stripped:
            in_debug_section = True
            continue
        if stripped.startswith((".loc", ".file")) or _DEBUG_LABEL.match(stripped):
            continue
        code = line.split("//")[0].rstrip()
        if code.strip():
            kept.append(code)
    return "\n".join(kept)


def dump_index(folder: Path) -> dict[str, set[str]]:
    """The specialisations of a ``FUSEKIT_COMPILE_DUMP`` folder: key = kernel, constexprs, launch
    options and argument types (the TTIR signature, locations stripped); value = the hashes of their
    normalized PTX (:func:`normalized_ptx`; a set, as one key may be dumped by several runs)."""
    table: dict[str, set[str]] = {}
    for txt in sorted(Path(folder).glob("*.txt")):
        ptx, ttir = txt.with_suffix(".ptx"), txt.with_suffix(".ttir")
        if not ptx.is_file() or not ttir.is_file():
            continue
        head = next((line for line in ttir.read_text().splitlines() if "tt.func public" in line), "")
        key = txt.read_text() + "signature: " + _LOCATION.sub("", head).strip()
        digest = hashlib.sha256(normalized_ptx(ptx.read_text()).encode()).hexdigest()
        table.setdefault(key, set()).add(digest)
    return table


@dataclass(frozen=True)
class DumpComparison:
    """Two ``FUSEKIT_COMPILE_DUMP`` folders compared (:func:`compare_dumps`): the specialisations
    only one has, those both have with a different normalized PTX, and how many match."""

    only_before: list[str]
    only_after: list[str]
    differing: list[str]
    same: int

    def report(self) -> str:
        def name(key: str) -> str:
            return " | ".join(key.splitlines()[:2])

        lines = [f"{self.same} specialisations with the same PTX (debug info stripped), {len(self.differing)} "
                 f"differing, {len(self.only_before)} only before, {len(self.only_after)} only after"]
        for title, keys in (("DIFFERING", self.differing), ("only before", self.only_before),
                            ("only after", self.only_after)):
            lines += [f"  {title}: {name(key)}" for key in keys]
        return "\n".join(lines)


def compare_dumps(before: Path, after: Path) -> DumpComparison:
    """Whether a change left compiled kernels alone: every specialisation both dump folders hold
    (same kernel, constexprs, options and argument types) compared by its PTX with debug info
    stripped.  A refactor that moves code between files, or removes an unused option, should leave
    ``differing`` empty."""
    old, new = dump_index(before), dump_index(after)
    return DumpComparison(only_before=sorted(set(old) - set(new)), only_after=sorted(set(new) - set(old)),
                          differing=sorted(k for k in set(old) & set(new) if old[k] != new[k]),
                          same=sum(old[k] == new[k] for k in set(old) & set(new)))


def install(target: GPUTarget) -> None:
    """Turn Triton's own ``@jit`` library functions into :class:`CheckedFunction`\\ s (both their
    module attributes and their tensor member forms), whichever mode they were created in."""
    import triton.language.core as core

    converted: dict[Any, CheckedFunction] = {}

    def checked(fn):
        if fn not in converted:
            converted[fn] = CheckedFunction(fn, target)
        return converted[fn]

    names = [n for n in list(sys.modules) if n == "triton.language" or n.startswith("triton.language.")]
    for name in names:
        module = sys.modules.get(name)
        for attr, value in list(vars(module).items()) if module is not None else ():
            if isinstance(value, (InterpretedFunction, JITFunction)) and not isinstance(value, CheckedFunction):
                setattr(module, attr, checked(value.fn))
    for attr, value in list(vars(core.tensor).items()):
        if isinstance(value, JITFunction) and not isinstance(value, CheckedFunction):
            setattr(core.tensor, attr, checked(value.fn))
            continue
        # interpreter-mode member forms are plain wrappers closing over an InterpretedFunction
        for cell in getattr(value, "__closure__", None) or ():
            inner = cell.cell_contents
            if isinstance(inner, InterpretedFunction):
                setattr(core.tensor, attr, checked(inner.fn))


def main(argv: list[str]) -> int:
    """``python -m fusecore.compile_check FILE.jsonl``: print the resource report written under
    ``FUSEKIT_COMPILE_REPORT=FILE.jsonl``.  ``python -m fusecore.compile_check --compare BEFORE
    AFTER``: compare two ``FUSEKIT_COMPILE_DUMP`` folders (:func:`compare_dumps`); exit status 1
    when a specialisation both hold compiles to a different PTX."""
    if len(argv) == 3 and argv[0] == "--compare":
        comparison = compare_dumps(Path(argv[1]), Path(argv[2]))
        print(comparison.report())
        return 1 if comparison.differing else 0
    if len(argv) != 1:
        print(f"usage: {REPORT_ENV_VAR}=FILE.jsonl {ENV_VAR}=sm_90 python -m pytest ...; "
              "then python -m fusecore.compile_check FILE.jsonl\n"
              f"   or: python -m fusecore.compile_check --compare BEFORE AFTER  (two {DUMP_ENV_VAR} folders)",
              file=sys.stderr)
        return 2
    lines = Path(argv[0]).read_text().splitlines()
    print(format_report([KernelResources(**json.loads(line)) for line in lines if line.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
