"""Numeric test helpers shared by every domain's tests.

* :data:`TOLERANCES` — the one table of relative-error tolerances per dtype;
* :func:`rel_error` — ``‖out − ref‖ / ‖ref‖`` computed in float64;
* :func:`assert_close` — rel_error against the dtype's tolerance, NaN never passes;
* :func:`poisoned` / :func:`assert_all_written` — outputs filled with a sentinel before a
  kernel writes them, and the check that every element was overwritten;
* :func:`fresh_generator` — a torch generator with a new random seed per call, the seed
  recorded so a failure can be replayed (:func:`record_seed`: a failing test's report names it);
* :func:`test_device` — the device kernel tests run on in this kernel mode;
* :func:`record_launches` — a module's kernels replaced by recorders that launch them and log each launch's
  constexprs and options (which kernel ran, in which specialisation);
* :class:`AllocationAudit` — records every tensor an op allocates (launcher buffers, tensors
  saved for backward), so a test can bound memory by construction, on any device;
* :func:`no_host_sync` — fails any host synchronisation inside a block (a value read back to
  the host, ``nonzero``), on the CPU through the interpreter too;
* :func:`pytest_runtest_logreport` — a failure's recorded seeds added to its report, and with
  ``FUSEKIT_FAILURE_LOG`` set, every failure written out the moment it happens (the tests' conftest and
  ``-p fusecore.testing`` load it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import backend

# Relative error ‖out − ref‖ / ‖ref‖ allowed for outputs computed in each dtype against a
# float64 reference.  float32 kernels may use tf32 matrix units (Triton's default for a
# float32 dot on the GPU), hence 2e-3 rather than 1e-5.
TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 2e-3,
    torch.float16: 1e-2,
    torch.bfloat16: 2e-2,
}

# float32 arithmetic without matrix units (elementwise kernels, scans).
STRICT_FLOAT32 = 1e-5


def tolerance(dtype: torch.dtype) -> float:
    try:
        return TOLERANCES[dtype]
    except KeyError:
        raise ValueError(f"no tolerance defined for dtype {dtype}") from None


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖₂ / ‖ref‖₂ in float64 (absolute error when ref is all zeros); NaN → inf."""
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    o = out.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if not torch.isfinite(o).all() and not torch.equal(torch.isfinite(o), torch.isfinite(r)):
        return float("inf")
    finite = torch.isfinite(r)
    if not torch.equal(o[~finite], r[~finite]):
        return float("inf")
    o, r = o[finite], r[finite]
    denom = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    if denom == 0.0:
        return num
    return num / denom


def assert_close(
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype | None = None,
    tol: float | None = None,
    name: str = "output",
) -> float:
    """Assert rel_error(out, ref) <= tol (default: the tolerance of ``dtype`` or out's dtype)."""
    tol = tol if tol is not None else tolerance(dtype or out.dtype)
    err = rel_error(out, ref)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {tol:.1e} (shape {tuple(out.shape)})")
    return err


def poison_value(dtype: torch.dtype):
    """The sentinel written into outputs before a kernel runs: NaN, or the integer maximum."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return True
    return torch.iinfo(dtype).max


def poisoned(shape, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A new tensor filled with :func:`poison_value` (pass it as a kernel's output)."""
    return torch.full(tuple(shape), poison_value(dtype), dtype=dtype, device=device)


def assert_all_written(tensor: torch.Tensor, name: str = "output") -> None:
    """Assert no element still holds the poison value (floats: no NaN left)."""
    if tensor.dtype.is_floating_point:
        left = torch.isnan(tensor)
    elif tensor.dtype == torch.bool:
        return
    else:
        left = tensor == poison_value(tensor.dtype)
    count = int(left.sum())
    if count:
        raise AssertionError(f"{name}: {count} of {tensor.numel()} elements were never written")


def fresh_generator(device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from the OS, fresh inputs on every run; ``FUSEKIT_TEST_SEED`` fixes it.

    ``gen.initial_seed()`` gives the seed to put in failure messages for replay.
    """
    seed = int(os.environ.get("FUSEKIT_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def test_device() -> torch.device:
    """Where kernel tests put their tensors: the GPU when compiled, the CPU under the interpreter."""
    return backend.default_device()


test_device.__test__ = False  # type: ignore[attr-defined]  (not a pytest test)


class _Recorded:
    """A kernel stand-in: ``kernel[grid](*args, **kwargs)`` appends ``(name, kwargs)`` to ``log``, then launches."""

    def __init__(self, kernel, name: str, log: list):
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def recorded(*args, **kwargs):
            self.log.append((self.name, kwargs))
            return launch(*args, **kwargs)

        return recorded


def record_launches(monkeypatch, module, *names: str) -> list[tuple[str, dict]]:
    """Replace each kernel ``names`` of ``module`` (launched there as ``name[grid](...)``) for the rest of the test
    by a recorder that launches it; returns the list every launch appends ``(name, keyword arguments)`` to (the
    constexprs and launch options: which kernel ran, specialised how)."""
    log: list[tuple[str, dict]] = []
    for name in names:
        monkeypatch.setattr(module, name, _Recorded(getattr(module, name), name, log))
    return log


class AllocationAudit(TorchDispatchMode):
    """Context manager recording the element count of every tensor allocated inside it.

    An allocation is an output of a torch operator whose storage is not one of that
    operator's inputs' (views and in-place results are not counted): the buffers a launcher
    creates, the tensors autograd saves, the outputs.  Kernel launches themselves are not
    torch operators; what they write was allocated by one.  ``sizes`` holds
    ``(operator name, elements)`` in order; :attr:`largest` the biggest entry::

        with AllocationAudit() as audit:
            out = op(x); out.sum().backward()
        assert audit.largest[1] <= bound
    """

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.sizes.append((str(func), t.untyped_storage().nbytes() // max(t.element_size(), 1)))
        return out

    def made_by(self, operator: str) -> int:
        """How many of the allocations operator ``operator`` made (``"aten.cat.default"``: the copies a concatenation
        made)."""
        return sum(name == operator for name, _ in self.sizes)

    @property
    def largest(self) -> tuple[str, int]:
        """The biggest allocation seen, ``("", 0)`` if none."""
        return max(self.sizes, key=lambda item: item[1], default=("", 0))


# Tensor methods that read device values back to the host (each a synchronisation on a GPU).
HOST_READS = ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")


class HostSyncError(AssertionError):
    """A host synchronisation happened inside :func:`no_host_sync`."""


@contextlib.contextmanager
def no_host_sync(device: torch.device | str | None = None) -> Iterator[None]:
    """Inside the block, any read of tensor values by the host raises :class:`HostSyncError`.

    Code that only enqueues work (a decode step, a training step, a simulator rollout) must
    pass on every device: the methods in :data:`HOST_READS` and ``torch.nonzero`` are
    refused at the Python level, which catches them on the CPU too, where nothing would
    otherwise wait; on a CUDA ``device`` torch's sync-debug mode also refuses every
    synchronisation made below Python (an allocator or operator that syncs).  Run the code
    once before the block so that one-time work (compilation, cached schedules) is done.
    """

    def refuse(name: str):
        def refused(*args, **kwargs):
            raise HostSyncError(f"host synchronisation inside no_host_sync(): {name}()")

        return refused

    saved = {name: vars(torch.Tensor).get(name) for name in HOST_READS}
    saved_nonzero = torch.nonzero
    on_cuda = device is not None and torch.device(device).type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
    for name in HOST_READS:
        setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
    torch.nonzero = refuse("torch.nonzero")
    if on_cuda:
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        if on_cuda:
            torch.cuda.set_sync_debug_mode(0)
        torch.nonzero = saved_nonzero
        for name, method in saved.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)


# ---------------------------------------------------------------- failures as they happen

FAILURE_LOG_ENV = "FUSEKIT_FAILURE_LOG"


# The pytest user property a test's random seed is recorded under (:func:`record_seed`), and the environment variable
# that replays it (:func:`fresh_generator`).
SEED_PROPERTY = "FUSEKIT_TEST_SEED"


def record_seed(node, generator: torch.Generator) -> torch.Generator:
    """Record ``generator``'s seed on the pytest item ``node`` (its ``user_properties``); if the test fails, its report
    (the terminal's failure section and ``FUSEKIT_FAILURE_LOG``) names ``FUSEKIT_TEST_SEED=<seed>``, which reruns it
    with the same inputs.  Returns ``generator``."""
    node.user_properties.append((SEED_PROPERTY, generator.initial_seed()))
    return generator


def _seed_note(report) -> str:
    """The replay line of each seed :func:`record_seed` put on ``report``'s test ('' without one)."""
    seeds = [value for name, value in getattr(report, "user_properties", ()) if name == SEED_PROPERTY]
    return "".join(f"{SEED_PROPERTY}={seed} reruns this test with the same inputs\n" for seed in seeds)


def pytest_runtest_logreport(report) -> None:
    """A pytest hook: a failed test phase's recorded seeds (:func:`record_seed`) added to its report as a section
    (printed with the failure); with ``$FUSEKIT_FAILURE_LOG`` set to a path, each failed test phase appended there
    (a ``==== <node id> [<phase>]`` line, then its report, at most 4000 characters, and its seeds) and its node id to
    ``<path>.ids``, the moment pytest knows of it.

    GPU runs are cut by a time limit (``timeout N pytest ...``), often before pytest prints its summary,
    which is where failures are named; with this log every failure up to the cut is named and can be
    rerun (``pytest $(cat <path>.ids)``).  Under pytest-xdist only the controller writes (the workers'
    reports reach it, their user properties with them), so each failure is written once.
    """
    if not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    note = _seed_note(report)
    if note and ("fresh seed", note) not in report.sections:
        report.sections.append(("fresh seed", note))
    path = os.environ.get(FAILURE_LOG_ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"==== {report.nodeid} [{report.when}]\n{report.longreprtext[-4000:]}\n{note}")
    with open(path + ".ids", "a", encoding="utf-8") as ids:
        ids.write(report.nodeid + "\n")
