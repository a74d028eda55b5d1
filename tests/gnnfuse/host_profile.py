"""Host time of gnnfuse layers: what a forward and a training step spend issuing their work.

    python3 tests/gnnfuse/host_profile.py ROW [ROW ...] [--graph NAME] [--calls N] [--top K]

ROW as in ``ab_layers.py`` (``gat-bf16``, ``tr-fp32:NAME=value`` ...).  For each row and each of ``fwd``
(the layer without autograd) and ``step`` (forward and backward with the parameters' gradients): the issue
time per call of ``N`` calls back to back (the host's work alone; on a GPU the kernels run behind it), the
wall time per call including the final synchronisation (on a GPU: ``max(host, GPU)`` when one of them
dominates), then a cProfile of ``N`` more calls, the top ``K`` functions by own time and by cumulative
time.  A step whose issue time exceeds its GPU time (``ab_layers.py``'s ``graph`` column) is host-bound:
this says where that host time goes.  On the CPU (Triton's interpreter) the kernels run inside the issue
time, so there the numbers only check that the tool runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
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
    args = parser.parse_args(argv)
    rows = [(row, *ab_layers.parse(row)) for row in args.rows]

    from benchmarks.cases.gnn import _edges
    from fusecore.testing import test_device
    from gnnfuse import Graph

    device = test_device()
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
                _synchronize(device)
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                issued = time.perf_counter()
                _synchronize(device)
                done = time.perf_counter()
                print(f"== {row} {kind}: issue {1e6 * (issued - start) / args.calls:.1f} us/call, "
                      f"wall {1e6 * (done - start) / args.calls:.1f} us/call", flush=True)
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


if __name__ == "__main__":
    sys.exit(main())
