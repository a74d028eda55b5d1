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

**Prepared launches** (:func:`prepare`) go one step further where a caller repeats a launch whose arguments are
mostly the same from call to call: the fixed ones (a graph schedule's row lists, counts, tile sizes and flags) are
keyed and turned into addresses once, and a launch keys only the ones that change (features, outputs, scalars).  A
gnnfuse attention launch has 55 arguments, 22-25 of them changing: on a CPU machine (a stand-in launcher) 17 µs a
launch keyed whole against 8 prepared.  On the H200 machine (session 47, ``tests/gnnfuse/host_ab.py``, the layers'
as-called host time per call, HEAD against the prepared launches interleaved in one process, arxiv-like): GAT fp32
forward 254 -> 223 µs, training step 1484 -> 1331; GATv2 bf16 290 -> 261 / 2090 -> 1857; Graph Transformer bf16
618 -> 560 / 2067 -> 1932; GAT bf16 276 -> 249 / 1315 -> 1207 (benchmarks/results/H200/gnn-host-ab-prepared.s47c2.log).

:func:`launch_profile` counts the launches of each compiled kernel inside a block and the host
time they took (what a training step spends issuing kernels, kernel by kernel), prepared launches included.

``FUSEKIT_FAST_LAUNCH=0`` in the environment, or :func:`set_fast_launch` at run time, turns
the direct path off: every launch then goes through Triton's own path.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
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


def _key_lines(i: int, name: str, host_tensors: bool, unhandled: str) -> list[str]:
    """Generated code setting ``a{i}`` (what the launcher is passed: a tensor's address, else the value) and ``k{i}``
    (:func:`arg_key`, inline for plain tensors, ints and floats) for the runtime argument ``name``; ``unhandled``:
    the statement run where :func:`arg_key` gives ``_SLOW``."""
    device = "" if host_tensors else f" and {name}.is_cuda"
    return [
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
        f"            {unhandled}",
        f"        a{i} = {name}.data_ptr() if isinstance({name}, __fl_T) else {name}",
    ]


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
        lines += _key_lines(i, name, host_tensors, "return None")
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


def _entry_key(device: Any, keys: tuple, options: dict) -> tuple:
    """The key of a specialisation's recorded launch: the device, the binder's argument keys, the launch options."""
    return (device, *keys, *options.items()) if options else (device, *keys)


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
            self._fast_host = host_tensors
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
            key = _entry_key(device, key, options)
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

        def _entry_for(self, args: tuple, kwargs: dict):
            """The recorded launch of ``kernel[grid](*args, **kwargs)``'s specialisation on the current device: a
            :class:`_Recorded`, ``None`` (it takes Triton's path), or ``_SLOW`` (none yet, or not keyed here)."""
            if not hasattr(self, "_fast_entries"):
                return _SLOW
            try:
                bound = self._fast_bind(*args, **kwargs)
            except TypeError:
                return _SLOW
            if bound is None:
                return _SLOW
            key = _entry_key(self._fast_device(), bound[3], bound[4])
            try:
                return self._fast_entries.get(key, _SLOW)
            except TypeError:
                return _SLOW

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


# ---------------------------------------------------------------------------------------------------------------
# Prepared launches: the arguments that stay the same from call to call keyed once


CHECK_PREPARED = os.environ.get("FUSEKIT_CHECK_PREPARED", "").strip() not in ("", "0", "false", "False")


class PreparedLaunchError(RuntimeError):
    """A prepared launch's fixed tensor no longer lies where it did when the launch was prepared."""


def prepare(kernel: Any, grid: tuple[int, ...], dynamic: tuple[str, ...], /, **fixed: Any):
    """``launch(*values)``: ``kernel[grid](...)`` with the parameters named in ``dynamic`` taken from ``values`` (in
    that order) and every other argument from ``fixed`` (parameters by name, their defaults where left out, and
    launch options such as ``num_warps``).

    ``prepare(k, (n,), ("x_ptr", "scale"), y_ptr=y, BLOCK=64, num_warps=4)(x, 0.5)`` launches exactly as
    ``k[(n,)](x, y, 0.5, BLOCK=64, num_warps=4)`` (parameters ``x_ptr, y_ptr, scale, BLOCK``).  For a compiled
    kernel (:func:`fast`) the fixed arguments' share of the specialisation key (:func:`arg_key`) and the fixed
    tensors' addresses are computed here, once; a launch keys only its ``values``, and its first launch of each
    specialisation takes the kernel's own path (:class:`FastJITFunction`, which records the launcher).  That is
    what a layer's launches repeat on every call: the schedule's row lists, counts, tile sizes and flags are fixed
    per schedule, only the features, outputs and scalars change (a 55-argument attention launch keyed whole costs
    ~17 µs of host time on a CPU machine's Python; prepared with 22 of them changing, ~8).  Launch hooks (a
    profiler), ``torch.compile`` tracing, the direct path turned off (:func:`set_fast_launch`), an argument
    :func:`arg_key` does not handle, or a kernel that is not compiled here (the interpreter,
    :mod:`fusecore.compile_check`) launch through ``kernel[grid]`` with the full argument list, every time.

    A fixed tensor is launched at the address it had here: it must outlive the launch object and never be resized
    or re-pointed (``set_``) — the schedule's own tensors, say.  ``FUSEKIT_CHECK_PREPARED=1`` (or
    :data:`CHECK_PREPARED`) checks every fixed tensor's address on every direct launch and raises
    :class:`PreparedLaunchError` where one moved (a launch through ``kernel[grid]`` passes the tensors themselves).
    Raises ``TypeError`` for a name that is not a parameter, a parameter named twice or given nowhere, and a
    ``grid`` that is not a tuple of ints.
    """
    function = getattr(kernel, "fn", kernel)
    while hasattr(function, "fn") and not inspect.isfunction(function):
        function = function.fn
    parameters = list(inspect.signature(function).parameters.values())
    names = [p.name for p in parameters]
    dynamic = tuple(dynamic)
    for name in dynamic:
        if name not in names:
            raise TypeError(f"prepare: {name!r} in dynamic is not a parameter of {function.__name__}")
        if name in fixed:
            raise TypeError(f"prepare: {name!r} is both dynamic and fixed")
    if len(set(dynamic)) != len(dynamic):
        raise TypeError(f"prepare: dynamic names a parameter twice: {dynamic}")
    for p in parameters:
        if p.name not in fixed and p.name not in dynamic and p.default is inspect.Parameter.empty:
            raise TypeError(f"prepare: parameter {p.name!r} of {function.__name__} is neither fixed nor dynamic")
    if isinstance(grid, list):
        grid = tuple(grid)
    if not (isinstance(grid, tuple) and 1 <= len(grid) <= 3 and all(type(g) is int for g in grid)):
        raise TypeError(f"prepare: grid must be a tuple of 1-3 ints, got {grid!r}")
    options = {k: v for k, v in fixed.items() if k not in names}
    template = [fixed[p.name] if p.name in fixed else p.default for p in parameters]
    slots = tuple(names.index(name) for name in dynamic)

    def full(values: tuple) -> list:
        args = list(template)
        for slot, value in zip(slots, values):
            args[slot] = value
        return args

    def plain(*values: Any):
        if len(values) != len(slots):
            raise TypeError(f"{function.__name__}: prepared launch takes {len(slots)} arguments "
                            f"{dynamic}, got {len(values)}")
        return kernel[grid](*full(values), **options)

    if type(kernel) not in _classes.values():
        return plain
    if not hasattr(kernel, "_fast_entries"):
        kernel._fast_setup()
    return _prepared_direct(kernel, grid, dynamic, slots, template, options, full, plain)


def _prepared_direct(kernel: Any, grid: tuple[int, ...], dynamic: tuple[str, ...], slots: tuple[int, ...],
                     template: list, options: dict, full, plain):
    """The generated launch of :func:`prepare` for a compiled kernel (``plain`` where a fixed argument's
    specialisation is not handled here)."""
    constexpr = kernel._fast_constexpr
    host_tensors = kernel._fast_host
    namespace: dict[str, Any] = {
        "__fl_key": arg_key, "__fl_T": _Tensor, "__fl_S": _SLOW, "__fl_host": host_tensors,
        "__fl_mod": sys.modules[__name__], "__fl_plain": plain,
        "__fl_device": kernel._fast_device, "__fl_stream": kernel._fast_driver.get_current_stream,
    }
    entries: dict[tuple, Any] = {}
    fixed_tensors: list[tuple[_Tensor, int]] = []
    full_items: list[str] = []
    runtime_items: list[str] = []
    dynamic_lines: list[str] = []
    dynamic_keys: list[str] = []
    for index, (value, is_constexpr) in enumerate(zip(template, constexpr)):
        if index in slots:
            name = f"d{slots.index(index)}"
            if is_constexpr:
                full_items.append(name)
                dynamic_keys.append(name)
            else:
                dynamic_lines += _key_lines(index, name, host_tensors,
                                            f"return __fl_plain({', '.join(f'd{j}' for j in range(len(slots)))})")
                full_items.append(f"a{index}")
                runtime_items.append(f"a{index}")
                dynamic_keys.append(f"k{index}")
            continue
        constant = f"__fl_c{index}"
        if is_constexpr:
            namespace[constant] = value
            full_items.append(constant)
            continue
        key = arg_key(value, host_tensors)
        if key is _SLOW:
            return plain
        if isinstance(value, _Tensor):
            address = value.data_ptr()
            fixed_tensors.append((value, address))
            namespace[constant] = address
        else:
            namespace[constant] = value
        full_items.append(constant)
        runtime_items.append(constant)
    values = ", ".join(f"d{j}" for j in range(len(slots)))
    grid3 = (*grid, 1, 1)[:3]

    def tuple_of(items: list[str]) -> str:
        return f"({', '.join(items)},)" if items else "()"

    body = [
        "    if not __fl_mod._enabled or __fl_mod._compiling() or __fl_mod._hooks_active():",
        f"        return __fl_plain({values})",
        "    if __fl_mod.CHECK_PREPARED:",
        "        __fl_check()",
        *dynamic_lines,
        "    device = __fl_device()",
        f"    key = (device, {', '.join(dynamic_keys)})" if dynamic_keys else "    key = (device,)",
        "    try:",
        "        entry = __fl_entries.get(key, __fl_S)",
        "    except TypeError:",
        f"        return __fl_plain({values})",
        "    if entry is __fl_S:",
        f"        return __fl_first(key, ({values}{',' if len(slots) == 1 else ''}))",
        "    if entry is None:",
        f"        return __fl_plain({values})",
        "    if entry.all_params:",
        f"        entry.launcher({grid3[0]}, {grid3[1]}, {grid3[2]}, __fl_stream(device), *entry.lead, "
        f"*{tuple_of(full_items)})",
        "    else:",
        f"        entry.launcher({grid3[0]}, {grid3[1]}, {grid3[2]}, __fl_stream(device), *entry.lead, "
        f"*{tuple_of(runtime_items)})",
        "    return entry.kernel",
    ]
    # launch: inside a launch_profile block, core timed and counted as the kernel's launches
    packed = f"({values}{',' if len(slots) == 1 else ''})"
    source = "\n".join([f"def core({values}):", *body, "", f"def launch({values}):",
                        "    if __fl_mod._profile is not None:", f"        return __fl_timed(core, {packed})",
                        *body, ""])

    def check() -> None:
        for tensor, address in fixed_tensors:
            if tensor.data_ptr() != address:
                raise PreparedLaunchError(
                    f"{kernel.fn.__name__}: a fixed tensor of a prepared launch moved from {address:#x} to "
                    f"{tensor.data_ptr():#x} (resized or re-pointed after prepare)")

    def first(key: tuple, values: tuple):
        args = tuple(full(values))
        result = kernel._fast_launch(grid, args, options)
        entries[key] = entry = kernel._entry_for(args, options)
        if entry is _SLOW:
            entries[key] = None
        return result

    def timed(core, values: tuple):
        """``core(*values)`` counted and timed in the open :func:`launch_profile` block (once: a launch that went
        through ``kernel[grid]`` was counted there)."""
        stats = _profile.setdefault(kernel.fn.__name__, LaunchStats())
        before = stats.launches
        start = time.perf_counter()
        try:
            return core(*values)
        finally:
            if stats.launches == before:
                stats.launches += 1
                stats.host_s += time.perf_counter() - start

    namespace.update({"__fl_entries": entries, "__fl_check": check, "__fl_first": first, "__fl_timed": timed})
    exec(source, namespace)  # noqa: S102 - generated from the kernel's own parameter positions
    launch = namespace["launch"]
    launch.__name__ = f"prepared_{kernel.fn.__name__}"
    launch.entries = entries
    return launch
