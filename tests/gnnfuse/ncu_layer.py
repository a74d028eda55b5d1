"""One forward and one training step of a gnnfuse layer on the arxiv-like graph, for Nsight Compute on
the GPU machine: three warm-up rounds (compiles, schedules, launch plans), then one forward (no
autograd) and one step (forward + backward with the parameters' gradients) between
``cudaProfilerStart`` and ``cudaProfilerStop``: the forward's kernels come first, then the step's.

    ncu --clock-control none --profile-from-start off --set detailed \\
        python3 tests/gnnfuse/ncu_layer.py gat-bf16

The row is ``ab_layers.py``'s ``LAYER-DTYPE[:name=value,...]`` (same layers, graph and settings).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from ab_layers import DTYPES, apply, build, graph_shape, parse  # noqa: E402


def main(argv: list[str]) -> int:
    from benchmarks.cases.gnn import _edges
    from gnnfuse import Graph

    layer, dtype_name, settings = parse(argv[0])
    graph_name = argv[1] if len(argv) > 1 else "arxiv-like"
    device = torch.device("cuda")
    apply(settings)
    edges, num_nodes = _edges(graph_name, device)
    graph = Graph(edges, num_nodes)
    forward, step = build(layer, DTYPES[dtype_name], graph, num_nodes, device, graph_shape(graph_name))
    for _ in range(3):
        forward()
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    forward()
    torch.cuda.synchronize()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {argv[0]} on {graph_name}: one forward, then one step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
