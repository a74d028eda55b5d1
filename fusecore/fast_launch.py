"""Launching compiled Triton kernels with less host time per call.

``kernel[grid](*args)`` of a ``triton.jit`` function re-derives, on every call, the argument
specialisation (dtypes, 16-byte alignment of every pointer, integer classes), rebuilds the
cache key from it, checks the kernel's globals and builds launch metadata, before Triton's
launcher runs.  A GNN layer's training step makes dozens of launches, and that host time is
part of what keeps it host-bound.

:class:`FastJITFunction` (what :func:`fusecore.backend.jit` returns when compiling) keeps
Triton's path for the first launch of each *specialisation* and records how Triton calls
the compiled kernel's launcher.  Later launches with the same specialisation call that
launcher directly.  The specialisation key is computed by :func:`arg_key` and is at least as
fine as Triton's own:

===========================  ================================================================
argument                     what the key keeps
===========================  ================================================================
CUDA tensor                  dtype, whether ``data_ptr()`` is a multiple of 16
int                          ``== 1``, multiple of 16, fits int32, needs uint64
float                        nothing (Triton passes every float as fp32)
bool, None                   the value
``tl.constexpr`` parameter   the value
launch options               (``num_warps=`` ...) the values, in the order given
current CUDA device          the index
===========================  ================================================================

Anything else (host tensors, tuples, numpy scalars, unhashable values), launch hooks
installed (a profiler), or tracing by ``torch.compile`` takes Triton's own path, every time.
The launcher is called with the current stream, the grid of this call and this call's
arguments, tensors as their addresses (as Triton's launcher accepts them; it then skips the
per-pointer driver query that tells device from host memory, which the key has settled), so
CUDA-graph capture, streams and PDL launches behave as with Triton's path.  Options Triton
reads from its environment at launch (``TRITON_DEBUG``) are those of the specialisation's
first launch.

Measured on the H200 machine (Triton 3.6, session 7; host time to issue one launch, hot loop):
Triton's path 17-19 µs with 3 tensor arguments, 25-26 µs with 15 tensors in 38 arguments;
the launcher alone, given tensors, 7.7 / 11.8 µs, given their addresses 7.1 / 8.1 µs.  In a GAT
layer (bf16, ogbn-arxiv-sized graph, 19 launches per training step) the host time per call
went from 459 to 377 µs for the forward and from 1961 to 1769 µs for the training step (same
process, tree 290ae31).

:func:`launch_profile` counts the launches of each compiled kernel inside a block and the host
time they took (what a training step spends issuing kernels, kernel by kernel).

``FUSEKIT_FAST_LAUNCH=0`` in the environment, or :func:`set_fast_launch` at run time, turns
the direct path off: every launch then goes through Triton's own path.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

_SLOW = object()  # an arg_key result: this argument's specialisation is not handled here
_Tensor = torch.Tensor
_enabled = os.environ.get("FUSEKIT_FAST_LAUNCH", "1").strip() not in ("0", "false", "False", "")
_first_launch = threading.RLock()


def fast_launch_enabled() -> bool:
    """Whether compiled kernels launch through the recorded launcher (see the module doc)."""
    return _enabled


def set_fast_launch(enabled: bool) -> None:
    """Turn the direct launch path on or off for the whole process."""
    global _enabled
    _enabled = bool(enabled)


@dataclass
class LaunchStats:
    """One kernel's launches inside a :func:`launch_profile` block and the host time they took."""

    launches: int = 0
    host_s: float = 0.0


_profile: dict[str, LaunchStats] | None = None


@contextlib.contextmanager
def launch_profile() -> Iterator[dict[str, LaunchStats]]:
    """Count compiled launches and their host time (seconds, wall clock), kernel by kernel.

    ``with launch_profile() as stats: step()`` fills ``stats`` (kernel name ->
    :class:`LaunchStats`): how many launches each kernel made and how long the host spent
    issuing them, Triton's path and the direct path alike (not the GPU time).  Costs one
    timer pair per launch inside the block and nothing outside it.
    """
    global _profile
    previous, _profile = _profile, {}
    try:
        yield _profile
    finally:
        _profile = previous


def arg_key(value: Any, host_tensors: bool = False) -> Any:
    """The part of a non-constexpr argument's specialisation the launch cache keys on.

    Returns ``_SLOW`` for arguments whose specialisation is not mirrored here, and for tensors
    in host memory; their launches take Triton's own path.  (The direct path passes tensors'
    addresses, and Triton's launcher then skips its driver query that tells device from host
    memory: host tensors go to Triton's path, where that check raises its clear error.
    ``host_tensors=True`` lets them through, for tests of the launch protocol on CPU machines.)
    """
    kind = type(value)
    if kind is _Tensor:
        if value.is_cuda or host_tensors:
            return (value.dtype, value.data_ptr() & 15 == 0)
        return _SLOW
    if kind is int:
        return (value == 1, value & 15 == 0, -0x80000000 <= value <= 0x7FFFFFFF, value >= 0x8000000000000000)
    if isinstance(value, _Tensor):  # nn.Parameter and other subclasses
        if value.is_cuda or host_tensors:
            return (value.dtype, value.data_ptr() & 15 == 0)
        return _SLOW
    if kind is float:
        return float
    if value is None or kind is bool:
        return value
    return _SLOW


_hook_owner: list = []  # where this Triton keeps its launch hooks, found on first use


def _hooks_active() -> bool:
    """Whether launch hooks (a profiler's) are installed: they need Triton's own launch path."""
    if not _hook_owner:
        try:
            from triton import knobs

            _hook_owner.append(knobs.runtime)
        except ImportError:  # Triton < 3.4 keeps them on CompiledKernel
            from triton.compiler import CompiledKernel

            _hook_owner.append(CompiledKernel)
    owner = _hook_owner[0]
    for hook in (owner.launch_enter_hook, owner.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):  # an empty HookChain calls nothing
            return True
    return False


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


class _Recorded:
    """How Triton called one specialisation's launcher: what to repeat on later launches."""

    __slots__ = ("kernel", "launcher", "lead", "all_params")

    def __init__(self, kernel: Any, launcher: Any, lead: tuple, all_params: bool):
        self.kernel = kernel
        self.launcher = launcher
        self.lead = lead  # what Triton passes between the stream and the kernel arguments
        self.all_params = all_params  # constexpr parameters passed too (Triton >= 3.3)


def _current_device(driver: Any):
    """The driver's ``get_current_device``, or, where that is ``torch.cuda.current_device`` (3.0 µs a call on
    the H100 machine's host in session 21, ``tests/gnnfuse/host_profile.py --primitives``), the query it ends
    in, ``torch._C._cuda_getDevice``, without torch.cuda's per-call initialisation check.  The direct path
    runs only after a first launch through Triton's path, so CUDA is initialised by then."""
    query = driver.get_current_device
    raw = getattr(torch._C, "_cuda_getDevice", None)
    if raw is not None and query is getattr(torch.cuda, "current_device", None):
        return raw
    return query


def _binder(params: list[inspect.Parameter], constexpr: tuple[bool, ...], host_tensors: bool = False):
    """``bind(*args, **kwargs) -> (values, full, runtime, key, options)`` or ``None``, for one kernel signature.

    Generated code, so Python's own call binding places the arguments and applies the
    defaults (it raises ``TypeError`` for a missing or doubled argument): ``values`` in
    parameter order; ``full`` the same with every tensor replaced by its address, and
    ``runtime`` only its non-constexpr entries (what a launcher is passed, with or without the
    constexprs); ``key`` :func:`arg_key` of each runtime argument and the value of each
    constexpr; ``options`` the remaining keywords (``num_warps=`` ...).  ``None`` when an
    argument's specialisation is not handled here (:func:`arg_key` gives ``_SLOW``).  A plain
    tensor, int or float is keyed inline (as :func:`arg_key` keys it), a tensor's address read once
    (what one function call per argument cost, most of the direct path's host time with many arguments).
    """
    namespace: dict[str, Any] = {"__fl_key": arg_key, "__fl_T": _Tensor, "__fl_S": _SLOW, "__fl_host": host_tensors}
    signature, lines, full, runtime, keys = [], [], [], [], []
    for i, (param, is_constexpr) in enumerate(zip(params, constexpr)):
        name = param.name
        if param.default is inspect.Parameter.empty:
            signature.append(name)
        else:
            namespace[f"__fl_default{i}"] = param.default
            signature.append(f"{name}=__fl_default{i}")
        if is_constexpr:
            full.append(name)
            keys.append(name)
            continue
        device = "" if host_tensors else f" and {name}.is_cuda"
        lines += [
            f"    if type({name}) is __fl_T{device}:",
            f"        a{i} = {name}.data_ptr()",
            f"        k{i} = ({name}.dtype, a{i} & 15 == 0)",
            f"    elif type({name}) is int:",  # arg_key's int key, inline
            f"        a{i} = {name}",
            f"        k{i} = ({name} == 1, {name} & 15 == 0, -0x80000000 <= {name} <= 0x7FFFFFFF, "
            f"{name} >= 0x8000000000000000)",
            f"    elif type({name}) is float:",
            f"        a{i} = {name}",
            f"        k{i} = float",
            "    else:",
            f"        k{i} = __fl_key({name}, __fl_host)",
            f"        if k{i} is __fl_S:",
            "            return None",
            f"        a{i} = {name}.data_ptr() if isinstance({name}, __fl_T) else {name}",
        ]
        full.append(f"a{i}")
        runtime.append(f"a{i}")
        keys.append(f"k{i}")

    def tuple_of(items: list[str]) -> str:
        return f"({', '.join(items)},)" if items else "()"

    values = tuple_of([p.name for p in params])
    source = "\n".join([
        f"def bind({', '.join(signature + ['**__fl_options'])}):", *lines,
        f"    return {values}, {tuple_of(full)}, {tuple_of(runtime)}, {tuple_of(keys)}, __fl_options", "",
    ])
    exec(source, namespace)  # noqa: S102 - the kernel's own parameter names, checked by Triton
    return namespace["bind"]


def _install_into(base: type) -> type:
    """Build the JITFunction subclass (Triton's class is known only once Triton is imported)."""

    class FastJITFunction(base):
        """A ``triton.jit`` function whose repeated launches skip Triton's per-call dispatch.

        Everything else (compilation, ``run``, ``warmup``, use as a called helper inside
        other kernels, ``torch.compile``'s handling of Triton kernels) is Triton's own.
        """

        def _fast_setup(self, driver: Any = None, host_tensors: bool = False) -> None:
            """Per-function tables, built at the first launch (``driver``: Triton's active one;
            ``host_tensors``: see :func:`arg_key`)."""
            params = list(self.signature.parameters.values())
            self._fast_names = tuple(p.name for p in params)
            self._fast_constexpr = tuple(bool(kp.is_constexpr) for kp in self.params)
            self._fast_runtime = tuple(i for i, c in enumerate(self._fast_constexpr) if not c)
            self._fast_bind = _binder(params, self._fast_constexpr, host_tensors)
            self._fast_entries: dict[tuple, _Recorded | None] = {}
            if driver is None:
                from triton.runtime import driver as drivers

                driver = drivers.active
            self._fast_driver = driver
            self._fast_device = _current_device(driver)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if _profile is None:
                    return self._fast_launch(grid, args, kwargs)
                return self._profiled(grid, args, kwargs)

            return launch

        def _profiled(self, grid, args: tuple, kwargs: dict):
            start = time.perf_counter()
            try:
                return self._fast_launch(grid, args, kwargs)
            finally:
                stats = _profile.setdefault(self.fn.__name__, LaunchStats())
                stats.launches += 1
                stats.host_s += time.perf_counter() - start

        def _slow(self, grid, args, kwargs):
            return self.run(*args, grid=grid, warmup=False, **kwargs)

        def _fast_launch(self, grid, args: tuple, kwargs: dict):
            if not _enabled or _compiling() or _hooks_active():
                return self._slow(grid, args, kwargs)
            if not hasattr(self, "_fast_entries"):
                self._fast_setup()
            try:
                bound = self._fast_bind(*args, **kwargs)
            except TypeError:  # a missing or doubled argument: Triton's path raises its error
                return self._slow(grid, args, kwargs)
            if bound is None:  # an argument whose specialisation is not mirrored here
                return self._slow(grid, args, kwargs)
            values, full, runtime, key, options = bound
            driver = self._fast_driver
            device = self._fast_device()
            key = (device, *key, *options.items()) if options else (device, *key)
            try:
                entry = self._fast_entries.get(key, _SLOW)
            except TypeError:  # an unhashable constexpr or option value
                return self._slow(grid, args, kwargs)
            if entry is _SLOW:
                return self._first_launch(key, grid, args, kwargs, values)
            if entry is None:
                return self._slow(grid, args, kwargs)
            if callable(grid):
                grid = grid(dict(zip(self._fast_names, values)))
            size = len(grid)
            # tensors as addresses: Triton's launcher would ask the driver to check each pointer again
            entry.launcher(
                grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1,
                driver.get_current_stream(device), *entry.lead, *(full if entry.all_params else runtime),
            )
            return entry.kernel

        def _first_launch(self, key: tuple, grid, args: tuple, kwargs: dict, values: list):
            """Launch through Triton's path, recording how it calls the compiled launcher."""
            with _first_launch:
                kernel = self.run(*args, grid=grid, warmup=True, **kwargs)  # compiles, does not launch
                if kernel is None:  # asynchronous compilation: keep Triton's path for this key
                    self._fast_entries[key] = None
                    return self._slow(grid, args, kwargs)
                launcher = kernel.run
                attribute = "_run" if isinstance(inspect.getattr_static(type(kernel), "run", None), property) else "run"
                calls: list[tuple] = []

                def recorder(*call_args):
                    calls.append(call_args)
                    return launcher(*call_args)

                setattr(kernel, attribute, recorder)
                try:
                    result = self._slow(grid, args, kwargs)
                finally:
                    setattr(kernel, attribute, launcher)
                stream = self._fast_driver.get_current_stream(key[0])
                self._fast_entries[key] = self._recorded(result, kernel, launcher, calls, values, stream)
                return result

        def _recorded(self, result, kernel, launcher, calls: list[tuple], values: list, stream) -> _Recorded | None:
            """The recorded call, if it has the layout the direct path repeats; else None."""
            if result is not kernel or len(calls) != 1 or calls[0][3] != stream:
                return None
            call = calls[0]
            for all_params in (True, False):
                passed = values if all_params else [values[i] for i in self._fast_runtime]
                lead = len(call) - 4 - len(passed)
                if lead >= 0 and all(a is b for a, b in zip(call[4 + lead:], passed)):
                    return _Recorded(kernel, launcher, tuple(call[4:4 + lead]), all_params)
            return None

    FastJITFunction.__name__ = FastJITFunction.__qualname__ = "FastJITFunction"
    return FastJITFunction


_classes: dict[type, type] = {}


def fast(function: Any) -> Any:
    """Make a freshly decorated ``triton.jit`` function launch through the direct path."""
    base = type(function)
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = _install_into(base)
    function.__class__ = cls
    return function
