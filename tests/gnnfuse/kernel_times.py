"""GPU time of each kernel a gnnfuse layer's forward and training step run, from torch's profiler.

    python3 tests/gnnfuse/kernel_times.py ROW [ROW ...] [--graph NAME] [--calls N]

ROW as in ``ab_layers.py`` (``gat-bf16``, ``tr-fp32:NAME=value`` ...), on the same graph and layer shape.  For
each row and each of ``fwd`` (the layer without autograd) and ``step`` (forward and backward with the
parameters' gradients): three warm-up calls (compiles, schedules, launch plans), then ``N`` calls under
``torch.profiler`` with CUDA activity, and one JSON line: the device time per call summed over every kernel
(``gpu_us``) and each kernel by name (``[name, launches per call, µs per call, % of gpu_us]``, longest
first).  Kernels of one Triton function with different specialisations share its name.  Where
``ab_layers.py``'s ``graph`` column (the replayed call) says how long a call takes on the GPU, this says which
kernel the time goes to, so a change can be aimed at the longest one.  The sum leaves out the gaps between
kernels; eager launches back to back, as here, leave gaps only where the host is late.  On a machine without
CUDA there are no kernels to list (``gpu_us`` 0): the CPU run only checks that the tool runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import ab_layers  # noqa: E402


def aggregate(kernels: Iterable[tuple[str, float, int]], calls: int) -> tuple[float, list[list]]:
    """``(µs per call, [[name, launches per call, µs per call, % of the total], ...])`` from the profiled
    kernels ``(name, total device µs, launches)`` of ``calls`` calls; names merged, longest first."""
    by_name: dict[str, list[float]] = {}
    for name, micros, launches in kernels:
        entry = by_name.setdefault(name, [0.0, 0])
        entry[0] += micros
        entry[1] += launches
    total = sum(micros for micros, _ in by_name.values()) / calls
    table = [[name, round(launches / calls, 2), round(micros / calls, 1),
              round(100 * micros / calls / total, 1) if total else 0.0]
             for name, (micros, launches) in by_name.items()]
    table.sort(key=lambda entry: -entry[2])
    return round(total, 1), table


def profile_kernels(fn, calls: int, cuda: bool) -> tuple[float, list[list]]:
    """Run ``fn`` ``calls`` times under the profiler; :func:`aggregate` of the CUDA kernels it ran."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        if cuda:
            torch.cuda.synchronize()
    kernels = [(evt.key, evt.self_device_time_total, evt.count) for evt in prof.key_averages()
               if evt.device_type == DeviceType.CUDA and evt.self_device_time_total > 0]
    return aggregate(kernels, calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--graph", default="arxiv-like")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--shape", default=None, help="IN,HEADS,DIM (default: the benchmarks' shape for --graph)")
    args = parser.parse_args(argv)
    shape = ab_layers.parse_shape(args.shape, parser) if args.shape else ab_layers.graph_shape(args.graph)
    rows = [(row, *ab_layers.parse(row)) for row in args.rows]

    from benchmarks.cases.gnn import _edges
    from fusecore.testing import test_device
    from gnnfuse import Graph

    device = test_device()
    cuda = device.type == "cuda"
    edges, num_nodes = _edges(args.graph, device)
    for row, layer, dtype_name, settings in rows:
        restore = ab_layers.apply(settings)
        try:
            graph = Graph(edges, num_nodes)
            forward, step = ab_layers.build(layer, ab_layers.DTYPES[dtype_name], graph, num_nodes, device, shape)
            for kind, fn in (("fwd", forward), ("step", step)):
                for _ in range(3):
                    fn()
                if cuda:
                    torch.cuda.synchronize()
                gpu_us, table = profile_kernels(fn, args.calls, cuda)
                print(json.dumps({"row": row, "graph": args.graph, "kind": kind, "gpu_us": gpu_us,
                                  "kernels": table}), flush=True)
        except Exception as exc:  # one broken row must not hide the others
            print(json.dumps({"row": row, "error": f"{type(exc).__name__}: {exc}"[:2000]}), flush=True)
        finally:
            restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
