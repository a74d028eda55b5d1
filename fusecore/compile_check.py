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
catches what the compiler rejects, not an API that an older Triton lacks.  Integer arguments
get Triton's own launch types (``i32``, ``i64``, ``u64`` by value) and every tensor pointer is
taken as 16-byte aligned, the common specialisation of a launch.

How: a :class:`CheckedFunction` is a ``triton.runtime.jit.JITFunction`` (so the compiler
treats it, and calls to it from other kernels, as a jit function) that runs through an
``InterpretedFunction`` when launched or called under the interpreter.  :func:`install`
gives Triton's own ``@jit`` library functions (``tl.sum``, ``tl.sigmoid`` ... and their tensor
member forms) the same double nature.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.errors import InterpreterError
from triton.runtime.interpreter import InterpretedFunction, TensorHandle, _patch_lang
from triton.runtime.jit import JITFunction, mangle_type

ENV_VAR = "FUSEKIT_COMPILE_FOR"



class CompileCheckError(RuntimeError):
    """A kernel that runs under the interpreter does not compile for the checked GPU target."""


def parse_target(text: str) -> GPUTarget:
    """``"sm_90"`` (or ``"90"``) -> ``GPUTarget("cuda", 90, 32)``; a ValueError for anything else."""
    match = re.fullmatch(r"(?:sm_?)?(\d{2,3})a?", text.strip().lower())
    if not match:
        raise ValueError(f"{ENV_VAR}={text!r} is not a CUDA target; expected e.g. sm_90 or sm_80")
    return GPUTarget("cuda", int(match.group(1)), 32)


def _arg_type(value: Any) -> str | None:
    """Triton's signature type of a runtime argument, as a launch on the GPU derives it
    (None: pass the value as a constexpr)."""
    if isinstance(value, (torch.Tensor, bool, int, float)):
        return mangle_type(value)
    return None


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
        # tensor member form (x.sum()): bound for the interpreter; the compiler binds it itself
        if instance is not None and isinstance(getattr(instance, "handle", None), TensorHandle):
            return functools.partial(self.interpreted, instance)
        return self

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any):
        self.check(args, kwargs)
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
            kind = None if param.is_constexpr else _arg_type(value)
            if kind is None:
                signature[name], constexprs[(index,)] = "constexpr", value
            else:
                signature[name] = kind
                if isinstance(value, torch.Tensor):
                    attrs[(index,)] = [["tt.divisibility", 16]]
        key = (tuple(signature.items()), tuple((k, repr(v)) for k, v in constexprs.items()),
               tuple(sorted((k, repr(v)) for k, v in options.items())))
        if key in self._compiled:
            return
        import triton

        try:
            triton.compile(ASTSource(self, signature, constexprs, attrs), target=self.target, options=options)
        except Exception as exc:  # noqa: BLE001 - any compiler failure is the finding
            raise CompileCheckError(
                f"{self.fn.__module__}.{self.fn.__qualname__} runs under the interpreter but does not compile for "
                f"{self.target.backend} sm_{self.target.arch} (launch options {options or 'default'}):\n{exc}"
            ) from exc
        self._compiled.add(key)


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
