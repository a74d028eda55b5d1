"""Host time of gnnfuse layers: what a forward and a training step spend issuing their work.

    python3 tests/gnnfuse/host_profile.py ROW [ROW ...] [--graph NAME] [--calls N] [--top K]

ROW as in ``ab_layers.py`` (``gat-bf16``, ``tr-fp32:NAME=value`` ...).  For each row and each of ``fwd``
(the layer without autograd) and ``step`` (forward and backward with the parameters' gradients): the issue
time per call of ``N`` calls back to back (the host's work alone; on a GPU the kernels run behind it), the
wall time per call including the final synchronisation (on a GPU: ``max(host, GPU)`` when one of them
dominates), then a cProfile of ``N`` more calls, the top ``K`` functions by own time and by cumulative
time.  A step whose issue time exceeds its GPU time (``ab_layers.py``'s ``graph`` column) is host-bound:
this says where that host time goes.  ``--launches`` adds, without the profiler's distortion: each compiled
kernel's launches per call and host µs per launch (:func:`fusecore.fast_launch.launch_profile`), and the issue
time again with the compiled launches stubbed out at two depths (``launcher``: everything but the driver
launch itself runs; ``launch``: the whole launch call is a no-op, but for prepared launches, ``fusecore.fast_launch.
prepare``, which still key their dynamic arguments), so the launches' share of the host time is
measured rather than inferred; ``--primitives`` times single host operations the layers repeat (current
device and stream, ``torch.empty``, the compile check) in a hot loop, and the floor torch's autograd engine
sets under any one-node layer (a Function with a GAT layer's leaves and no device work, forward and step);
``--sections`` the inclusive host
time per call of the layer path's main functions (:data:`SECTIONS`, timers patched in).  On the CPU
(Triton's interpreter) the kernels run inside the issue time, so there the numbers only check that the tool
runs.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import ab_layers  # noqa: E402


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--graph", default="arxiv-like")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--top", type=int, default=28)
    parser.add_argument("--launches", action="store_true", help="per-kernel launch host time and stubbed issue times")
    parser.add_argument("--primitives", action="store_true", help="hot-loop cost of single host operations")
    parser.add_argument("--sections", action="store_true",
                        help="inclusive host µs per call of the layer path's main functions (timers, no profiler)")
    parser.add_argument("--no-cprofile", action="store_true", help="skip the cProfile tables")
    args = parser.parse_args(argv)
    rows = [(row, *ab_layers.parse(row)) for row in args.rows]

    from benchmarks.cases.gnn import _edges
    from fusecore.testing import test_device
    from gnnfuse import Graph

    device = test_device()
    if args.primitives:
        _primitives(device)
    edges, num_nodes = _edges(args.graph, device)
    for row, layer, dtype_name, settings in rows:
        restore = ab_layers.apply(settings)
        try:
            graph = Graph(edges, num_nodes)
            forward, step = ab_layers.build(layer, ab_layers.DTYPES[dtype_name], graph, num_nodes, device,
                                            ab_layers.graph_shape(args.graph))
            for kind, fn in (("fwd", forward), ("step", step)):
                for _ in range(min(20, args.calls)):  # compile, build the schedule and launch plans, settle
                    fn()
                issue, wall = _timed_calls(fn, args.calls, device)
                print(f"== {row} {kind}: issue {issue:.1f} us/call, wall {wall:.1f} us/call", flush=True)
                if args.launches:
                    _launch_table(fn, args.calls, device)
                if args.sections:
                    _section_table(fn, args.calls, device)
                if args.no_cprofile:
                    continue
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(args.calls):
                    fn()
                profile.disable()
                _synchronize(device)
                for key in ("tottime", "cumulative"):
                    out = io.StringIO()
                    pstats.Stats(profile, stream=out).sort_stats(key).print_stats(args.top)
                    text = out.getvalue()
                    print(text[text.index("ncalls"):] if "ncalls" in text else text, flush=True)
        finally:
            restore()
    return 0


def _timed_calls(fn, calls: int, device: torch.device) -> tuple[float, float]:
    """(issue µs, wall µs) per call of ``calls`` calls back to back, from a synchronised start."""
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter()
    _synchronize(device)
    done = time.perf_counter()
    return 1e6 * (issued - start) / calls, 1e6 * (done - start) / calls


def _issue_us(fn, calls: int, device: torch.device) -> float:
    return _timed_calls(fn, calls, device)[0]


def _issue_us_patched(fn, calls: int, device: torch.device, patches: list[tuple]) -> float:
    """:func:`_issue_us` with ``(owner, attribute, value)`` set for the measurement and restored after it."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        return _issue_us(fn, calls, device)
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _launch_table(fn, calls: int, device: torch.device) -> None:
    """Per-kernel launches and host time, then the issue time with launches stubbed out."""
    from fusecore import fast_launch

    with fast_launch.launch_profile() as stats:
        for _ in range(calls):
            fn()
    _synchronize(device)
    total = sum(s.host_s for s in stats.values())
    count = sum(s.launches for s in stats.values())
    print(f"   launches: {count / calls:.1f}/call, {1e6 * total / calls:.1f} us/call of host "
          f"({1e6 * total / max(count, 1):.1f} us each)")
    for name, s in sorted(stats.items(), key=lambda kv: -kv[1].host_s):
        print(f"     {name:44s} {s.launches / calls:5.1f}/call {1e6 * s.host_s / max(s.launches, 1):7.1f} us each")
    classes = tuple(fast_launch._classes.values())
    with warnings.catch_warnings():  # isinstance over every object touches deprecated module attributes
        warnings.simplefilter("ignore")
        kernels = [o for o in gc.get_objects() if isinstance(o, classes) and hasattr(o, "_fast_entries")]
    baseline = _issue_us(fn, calls, device)
    # depth "launcher": the direct path runs up to the driver launch; depth "launch": the launch call does nothing
    without_driver = _issue_us_patched(fn, calls, device, [(entry, "launcher", _noop) for k in kernels
                                                           for entry in k._fast_entries.values() if entry is not None])
    # prepared launches (fusecore.fast_launch.prepare) skip _fast_launch: at this depth they run up to the driver
    without_launch = _issue_us_patched(fn, calls, device, [(cls, "_fast_launch", _noop) for cls in classes] + [
        (entry, "launcher", _noop) for k in kernels for entry in k._fast_entries.values() if entry is not None])
    print(f"   issue us/call: as is {baseline:.1f}; driver launch stubbed {without_driver:.1f}; "
          f"whole launch stubbed {without_launch:.1f}", flush=True)


# (module, attribute) of the functions --sections times, inclusive of what they call
SECTIONS = (
    ("gnnfuse.nn", "_graph_and_features"), ("gnnfuse.nn", "_project_all"), ("fusecore.linear", "linear"),
    ("torch", "cat"), ("torch.nn.functional", "linear"), ("gnnfuse.ops", "transformer_attention"),
    ("gnnfuse.ops", "gat"), ("gnnfuse.ops", "gatv2"), ("gnnfuse.ops", "agnn"),
    ("gnnfuse.ops", "_apply"), ("gnnfuse.ops", "attention_forward"), ("gnnfuse.ops", "attention_backward"),
    ("gnnfuse.ops", "_function_features"), ("gnnfuse.ops", "edge_weight_grad"), ("gnnfuse.ops", "_new_output"),
    ("fusecore.backend", "check_devices"), ("fusecore.backend", "check_dtypes"), ("fusecore.linear", "column_sum"),
    ("torch", "empty"), ("torch.autograd", "backward"),
)


def _section_table(fn, calls: int, device: torch.device) -> None:
    """Inclusive host µs per call of :data:`SECTIONS` and of all compiled launches together."""
    import importlib

    from fusecore import fast_launch

    totals: dict[str, list] = {}

    def timer(label, original):
        cell = totals.setdefault(label, [0, 0.0])

        def timed(*a, **k):
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                cell[0] += 1
                cell[1] += time.perf_counter() - start
        return timed

    patches = []
    for module_name, attribute in SECTIONS:
        module = importlib.import_module(module_name)
        patches.append((module, attribute, timer(f"{module_name}.{attribute}", getattr(module, attribute))))
    patches += [(cls, "_fast_launch", timer("compiled launches", cls._fast_launch))
                for cls in fast_launch._classes.values()]
    wall = _issue_us_patched(fn, calls, device, patches)
    print(f"   sections (inclusive host us per call; issue {wall:.1f} us/call with the timers on):")
    for label, (count, seconds) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        if count:
            print(f"     {label:44s} {count / calls:5.1f}/call {1e6 * seconds / calls:8.1f} us", flush=True)


def _noop(*args) -> None:
    return None


def _primitives(device: torch.device) -> None:
    """Hot-loop host cost (µs) of single operations the layers repeat."""
    n = 20000 if device.type == "cuda" else 2000
    shape = (169_343, 8, 16)

    def timed(label: str, op) -> None:
        for _ in range(200):
            op()
        start = time.perf_counter()
        for _ in range(n):
            op()
        print(f"   {label:48s} {1e6 * (time.perf_counter() - start) / n:7.2f} us", flush=True)

    print("== primitives (hot loop, us per call)")
    timed("python call", _noop)
    timed("torch.compiler.is_compiling()", torch.compiler.is_compiling)
    if device.type == "cuda":
        from triton.runtime import driver

        active = driver.active
        timed("torch.cuda.current_device()", torch.cuda.current_device)
        timed("torch._C._cuda_getDevice()", torch._C._cuda_getDevice)
        timed("triton driver get_current_device()", active.get_current_device)
        timed("triton driver get_current_stream(0)", lambda: active.get_current_stream(0))
        timed("torch.cuda.current_stream()", torch.cuda.current_stream)
    timed("torch.empty(169343x8x16 bf16)", lambda: torch.empty(shape, dtype=torch.bfloat16, device=device))
    timed("torch.empty((0,), fp32)", lambda: torch.empty((0,), device=device))
    x = torch.empty(shape, dtype=torch.bfloat16, device=device)
    timed("tensor.data_ptr()", x.data_ptr)
    timed("tensor.reshape(N, 128)", lambda: x.reshape(shape[0], 128))
    timed("tensor.stride(0)", lambda: x.stride(0))
    timed("tensor.contiguous() (already)", x.contiguous)
    _engine_floor(device, timed)


class _Trivial(torch.autograd.Function):
    """One autograd node with a GAT layer's four parameter leaves (W, attn_l, attn_r, bias) and its saved
    tensors, but no device work: its forward returns a view of a preallocated output, its backward the
    preallocated gradients.  Its training step's host time is what torch's autograd engine costs a layer
    whose forward and backward are one node each (:func:`_engine_floor`)."""

    @staticmethod
    def forward(ctx, x, *leaves):  # type: ignore[override]
        ctx.save_for_backward(x, *leaves)
        ctx.grads = _Trivial.grads
        return _Trivial.out.view_as(_Trivial.out)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.saved_tensors  # noqa: B018 - unpacked as a real backward does
        return (None, *ctx.grads)


def _engine_floor(device: torch.device, timed) -> None:
    """Host µs of a forward and a training step (forward + ``backward(grad)``, the leaves' gradients reset
    first, as ``ab_layers.build``'s step does) of :class:`_Trivial`: the floor under any one-node layer's step."""
    shapes = [(128, 128), (1, 8, 16), (1, 8, 16), (128,)]
    leaves = [torch.zeros(s, device=device, requires_grad=True) for s in shapes]
    _Trivial.grads = [torch.zeros(s, device=device) for s in shapes]
    _Trivial.out = torch.zeros(64, 8, 16, device=device)
    x = torch.zeros(64, 128, device=device)
    grad = torch.zeros(64, 8, 16, device=device)

    def forward():
        with torch.no_grad():
            return _Trivial.apply(x, *leaves)

    def step():
        for leaf in leaves:
            leaf.grad = None
        _Trivial.apply(x, *leaves).backward(grad)

    timed("one-node autograd Function, forward (no_grad)", forward)
    timed("one-node autograd Function, forward + backward", step)


if __name__ == "__main__":
    sys.exit(main())
