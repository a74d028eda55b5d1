"""Backend dispatch: where fusekit's Triton kernels run, decided once, before any kernel exists.

fusekit's kernels have one source.  It runs in one of two *kernel modes*:

``compiled``
    Triton compiles the kernels for the CUDA GPU.  Chosen automatically when
    ``torch.cuda.is_available()`` and ``triton`` imports.
``interpret``
    The same kernel source runs through Triton's interpreter on the CPU (numpy
    semantics, programs of a grid executed one after another).  Chosen
    automatically on machines without a GPU, or on request.

The mode is fixed when :mod:`fusecore` is first imported, because Triton decides at
decoration time whether a ``@jit`` function is compiled or interpreted.  Users and tests
never set ``TRITON_INTERPRET`` themselves; they may set ``FUSEKIT_BACKEND`` before the
first import:

====================  =====================================================================
``FUSEKIT_BACKEND``   effect
====================  =====================================================================
unset / ``auto``      ``compiled`` with a CUDA GPU, ``interpret`` without
``compiled``          compiled; an error at import if there is no CUDA GPU
``interpret``         interpreter even where a GPU exists (debugging)
``reference``         the automatic kernel mode, but every op takes its pure-PyTorch
                      reference path (the unfused baseline) until told otherwise
====================  =====================================================================

``FUSEKIT_COMPILE_FOR=sm_90`` (any ``sm_NN``) additionally compiles every launch made under the
interpreter for that GPU, so a CPU machine finds GPU compile errors (:mod:`fusecore.compile_check`).

Independently of the kernel mode, every public op can be switched at run time to its
pure-PyTorch reference implementation with :func:`use_reference` (a context manager) or
:func:`set_reference` — the same math, unfused, for comparison and debugging.
"""

from __future__ import annotations

import contextlib
import importlib
import numbers
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

ENV_VAR = "FUSEKIT_BACKEND"
_VALID = ("auto", "compiled", "interpret", "reference")
MIN_TRITON = (3, 2)


class BackendError(RuntimeError):
    """Raised when the requested backend cannot be used (no GPU, Triton missing or too old)."""


def _parse_version(text: str) -> tuple[int, int]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 2:
        parts.append(0)
    return parts[0], parts[1]


def _requested() -> str:
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in _VALID:
        raise BackendError(
            f"{ENV_VAR}={value!r} is not a known backend; expected one of {', '.join(_VALID)}"
        )
    return value


def _decide_mode(requested: str) -> str:
    has_cuda = torch.cuda.is_available()
    if requested == "compiled":
        if not has_cuda:
            raise BackendError(
                f"{ENV_VAR}=compiled needs a CUDA GPU, but torch.cuda.is_available() is False; "
                f"unset {ENV_VAR} to run the kernels through the Triton interpreter on the CPU"
            )
        return "compiled"
    if requested == "interpret":
        return "interpret"
    return "compiled" if has_cuda else "interpret"


def _import_triton():
    try:
        triton = importlib.import_module("triton")
    except ImportError as exc:  # pragma: no cover - exercised only without triton
        raise BackendError(
            "fusekit needs Triton (>= 3.2) for its kernels: `pip install triton` "
            "(Linux; it is installed with torch's CUDA builds)"
        ) from exc
    if _parse_version(triton.__version__) < MIN_TRITON:
        raise BackendError(
            f"fusekit needs triton >= {MIN_TRITON[0]}.{MIN_TRITON[1]}, found {triton.__version__}: "
            "`pip install -U triton`"
        )
    return triton


def _reinterpret_loaded_triton_language() -> None:
    """Turn Triton's own library functions (``tl.rand``, ``tl.cdiv`` ...) into interpreted ones.

    When ``triton.language`` was imported before ``TRITON_INTERPRET`` was set (another
    library imported it first), its ``@jit`` helpers are compiled-mode objects that the
    interpreter cannot call.  Re-wrapping them in place makes the interpreter work no
    matter who imported Triton first.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    names = [name for name in list(sys.modules) if name == "triton.language" or name.startswith("triton.language.")]
    for name in names:
        module = sys.modules.get(name)
        if module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                setattr(module, attr, InterpretedFunction(value.fn))


def _interpret_bfloat16_as_the_gpu() -> None:
    """Make Triton's interpreter compute bfloat16 as a GPU does: products and rounding.

    The interpreter stores bfloat16 tensors as their uint16 bit patterns, and (Triton 3.9)
    * its ``create_dot`` multiplies those integers: ``tl.dot`` of bfloat16 operands returns ~1e11
      for unit inputs.  The bit patterns are widened to float32 first here, which gives the
      products a GPU's tensor cores form (bfloat16 values, float32 accumulation);
    * its float32 -> bfloat16 cast truncates (rounds toward zero, a bias of half a unit in the
      last place per value), where the GPU's ``cvt.rn.bf16.f32`` and torch round to nearest even.
      The cast rounds to nearest even here (NaN stays NaN);
    * its float64 -> bfloat16 cast converts the value to an integer in bfloat16's uint16 storage
      (garbage); here it rounds the float64 value once to nearest even, as the GPU does.
    So the bfloat16 paths of a kernel run on the CPU as written, bit for bit with torch's own
    rounding, instead of through float32 stand-ins.  Only bfloat16 stored as uint16 is touched:
    an interpreter that computes bfloat16 itself is left alone.

    Not covered: elementwise arithmetic, math functions, comparisons, reductions and casts to
    integers of bfloat16 *values* are still computed on the bit patterns by Triton 3.9's
    interpreter (``x * y`` of two bfloat16 tensors gives ~1e33): kernels convert loaded bfloat16
    to float32 before computing, as every fusekit kernel does.
    """
    import numpy as np
    from triton.runtime import interpreter

    bf16, f32, f64 = triton.language.bfloat16, triton.language.float32, triton.language.float64
    builder = type(interpreter.interpreter_builder)
    if getattr(builder.create_dot, "as_the_gpu", False):
        return
    dot, cast = builder.create_dot, builder.cast_impl

    def widened(handle):
        if handle.dtype == bf16 and handle.data.dtype == np.uint16:
            bits = handle.data.astype(np.uint32) << np.uint32(16)
            return interpreter.TensorHandle(bits.view(np.float32), f32)
        return handle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        out = cast(self, src, dst_type)
        if src.dtype.scalar == f64 and dst_type.scalar == bf16 and out.data.dtype == np.uint16:
            # Triton 3.9 casts float64 into the uint16 storage as an integer (2.5 -> bits 2: garbage).  Rounded to
            # float32 by rounding to odd (inexact results get their last bit set), then to nearest even below: one
            # rounding of the float64 value, as the GPU's cvt.rn.bf16.f64 (float32's own rounding first could make
            # a tie of a value above one: 1 + 2^-8 + 2^-30 would end at 1.0).
            wide = np.asarray(src.data, dtype=np.float64)
            with np.errstate(over="ignore", invalid="ignore"):
                narrow = wide.astype(np.float32)
                inexact = np.isfinite(narrow) & (narrow.astype(np.float64) != wide)
                away = inexact & (np.abs(narrow.astype(np.float64)) > np.abs(wide))
                narrow = np.where(away, np.nextafter(narrow, np.float32(0)), narrow).astype(np.float32)
            bits = narrow.view(np.uint32) | inexact.astype(np.uint32)
            src = interpreter.TensorHandle(bits.view(np.float32).reshape(np.shape(wide)), f32)
            out = cast(self, src, dst_type)
        if src.dtype.scalar == f32 and dst_type.scalar == bf16 and out.data.dtype == np.uint16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            nearest = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
            nan = np.isnan(src.data)
            rounded = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), nearest).astype(np.uint16)
            out = interpreter.TensorHandle(rounded.reshape(np.shape(src.data)), out.dtype)
        return out

    create_dot.as_the_gpu = True
    builder.create_dot, builder.cast_impl = create_dot, cast_impl  # create_fp_trunc & co. call self.cast_impl


REQUESTED = _requested()
KERNEL_MODE = _decide_mode(REQUESTED)
if KERNEL_MODE == "interpret":
    # One place in the project sets this, before any fusekit kernel is defined.
    os.environ["TRITON_INTERPRET"] = "1"
triton = _import_triton()
if KERNEL_MODE == "interpret":
    _reinterpret_loaded_triton_language()
    _interpret_bfloat16_as_the_gpu()

INTERPRET = KERNEL_MODE == "interpret"
COMPILED = KERNEL_MODE == "compiled"

# FUSEKIT_COMPILE_FOR=sm_90: under the interpreter, also compile every launch for that GPU
# (fusecore.compile_check); ignored when the kernels are compiled anyway.
COMPILE_CHECK_TARGET = None
if INTERPRET and os.environ.get("FUSEKIT_COMPILE_FOR", "").strip():
    from . import compile_check

    COMPILE_CHECK_TARGET = compile_check.parse_target(os.environ["FUSEKIT_COMPILE_FOR"])
    compile_check.install(COMPILE_CHECK_TARGET)

_state = threading.local()
_default_reference = REQUESTED == "reference"
_reference_set = False  # whether set_reference was ever called (by any thread)


def jit(fn: Callable | None = None, **kwargs: Any):
    """``triton.jit`` for fusekit kernels and the helpers they call (works in both modes).

    Compiled, the result launches through :mod:`fusecore.fast_launch`: a specialisation's
    first launch takes Triton's path, later ones call the recorded launcher directly.
    """
    if fn is None:
        return lambda f: jit(f, **kwargs)
    if COMPILE_CHECK_TARGET is not None:
        from .compile_check import CheckedFunction

        return CheckedFunction(fn, COMPILE_CHECK_TARGET, **kwargs)
    if INTERPRET:
        from triton.runtime.interpreter import InterpretedFunction

        return InterpretedFunction(fn)
    from .fast_launch import fast

    return fast(triton.jit(fn, **kwargs))


def eager_under_compile(fn: Callable) -> Callable:
    """``fn`` run as called when a ``torch.compile``'d model reaches it (``torch.compiler.disable``: dynamo ends its
    graph before the call and starts a new one after it), not traced into.

    For the public entry points of fused kernels (gnnfuse's layers' ``forward`` and its ops — ``gat``,
    ``gat_attention``, ``gatv2``, ``transformer_attention``, ``agnn``, ``node_scores``, ``edge_score_csr``): traced,
    inductor re-launches each Triton kernel as a kernel of its own graph and types the kernels' Python-float scalars
    float64 (float32 kernels then fail to compile: a loop-carried float32 state re-assigned float64), aot_autograd
    refuses the Functions that store gradients into views of one buffer, and dynamo's fake tensors cannot run the
    host-side index arithmetic of a graph's schedule (``uint64`` products under the interpreter).  ~0.7 µs of host
    time per call outside a compiled region (CPU, torch 2.13); nested wraps add nothing measurable.  The kernels are
    fused already; what a compiled model keeps is its own code before and after the call.
    """
    return torch.compiler.disable(fn)


def autotune(configs: list, key: list[str], **kwargs: Any):
    """``triton.autotune`` when compiled; under the interpreter the first config is used as is.

    Autotuning times candidates on the GPU, which the interpreter cannot do; the first
    config must therefore be a good, valid default everywhere.
    """
    if COMPILED:
        return triton.autotune(configs=configs, key=key, **kwargs)
    first = configs[0]

    def wrap(kernel):
        return _FixedConfig(kernel, dict(first.kwargs))

    return wrap


class _FixedConfig:
    """Interpreter stand-in for an autotuner: launches with one fixed config."""

    def __init__(self, kernel, config_kwargs: dict[str, Any]):
        self.kernel = kernel
        self.config_kwargs = config_kwargs

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            merged = {**self.config_kwargs, **kwargs}
            return self.kernel[grid](*args, **merged)

        return launch


def kernel_devices() -> tuple[str, ...]:
    """Device types whose tensors the fused kernels accept in this kernel mode."""
    return ("cuda",) if COMPILED else ("cpu", "cuda")


def on_kernel_device(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` lies on a device type :func:`kernel_devices` names (read from the tensor's flags: no
    ``torch.device`` object is built, ~1 µs of host time per tensor on a layer's every call)."""
    return tensor.is_cuda or (not COMPILED and tensor.is_cpu)


def default_device() -> torch.device:
    """The device fusekit places new tensors on: the GPU when compiled, else the CPU."""
    return torch.device("cuda") if COMPILED else torch.device("cpu")


def check_devices(**tensors: torch.Tensor | None) -> torch.device:
    """Check that the named tensors share one device the kernels support; return it.

    Raises ``ValueError`` naming the argument and its device: mixed devices, or a device
    the kernels cannot run on in this kernel mode (CPU tensors on a GPU machine, say).
    ``None`` values are skipped.
    """
    device = None
    first = None
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if device is None:
            device, first = tensor.device, name
            # later tensors are compared by their flags and index first (~1 µs less each than a device object)
            where = (tensor.is_cuda, tensor.is_cpu, tensor.get_device())
            if device.type not in kernel_devices():
                hint = (
                    "move it to the GPU (.cuda()), or use the reference path (fusecore.use_reference())"
                    if COMPILED
                    else "fusekit kernels run on 'cpu' (interpreter) or 'cuda'"
                )
                raise ValueError(
                    f"{name} is on device '{device}', which the {KERNEL_MODE} Triton backend does not run "
                    f"on (supported: {', '.join(kernel_devices())}); {hint}"
                )
        elif (tensor.is_cuda, tensor.is_cpu, tensor.get_device()) != where and tensor.device != device:
            raise ValueError(
                f"{name} is on device '{tensor.device}' but {first} is on '{device}': "
                "all tensors of one call must be on the same device"
            )
    if device is None:
        raise ValueError("no tensor given to check_devices")
    return device


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer the API boundaries accept as a count or an id: Python's or numpy's
    (``numbers.Integral``; numpy's bool is not one), not a bool (``True`` is an ``int`` to Python, never a
    count to a user)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_dtypes(allowed: tuple[torch.dtype, ...], same: bool = True, **tensors: torch.Tensor | None) -> torch.dtype:
    """Check that the named tensors have a dtype in ``allowed`` (and, if ``same``, all one dtype).

    Raises ``TypeError`` naming the argument, its dtype and what was expected; returns the dtype.
    ``None`` values are skipped.
    """
    if isinstance(allowed, torch.dtype):  # one dtype given bare
        allowed = (allowed,)
    dtype = None
    first = None
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in allowed:
            names = ", ".join(str(d).replace("torch.", "") for d in allowed)
            raise TypeError(f"{name} has dtype {str(tensor.dtype).replace('torch.', '')}; expected one of {names}")
        if dtype is None:
            dtype, first = tensor.dtype, name
        elif same and tensor.dtype != dtype:
            raise TypeError(
                f"{name} has dtype {str(tensor.dtype).replace('torch.', '')} but {first} has "
                f"{str(dtype).replace('torch.', '')}: the tensors of one call must share a dtype"
            )
    if dtype is None:
        raise ValueError("no tensor given to check_dtypes")
    return dtype


def reference_enabled() -> bool:
    """Whether ops should run their pure-PyTorch reference path instead of the kernels."""
    if not _reference_set:  # no thread has switched it yet: skip the thread-local lookup (every op asks)
        return _default_reference
    return getattr(_state, "reference", _default_reference)


def set_reference(enabled: bool) -> None:
    """Switch this thread's ops to (True) or away from (False) the pure-PyTorch reference path."""
    global _reference_set
    if not isinstance(enabled, bool):  # bool("no") is True: a string must not switch the path on
        raise TypeError(f"enabled must be True or False, got {enabled!r}")
    _reference_set = True
    _state.reference = enabled


@contextlib.contextmanager
def use_reference(enabled: bool = True) -> Iterator[None]:
    """Context manager: run ops through their unfused PyTorch reference inside the block."""
    previous = reference_enabled()
    set_reference(enabled)
    try:
        yield
    finally:
        set_reference(previous)


def describe() -> str:
    """One line saying which backend is active, for logs and benchmark records."""
    ref = ", reference ops" if reference_enabled() else ""
    return f"triton {triton.__version__} ({KERNEL_MODE}{ref}), torch {torch.__version__}"
