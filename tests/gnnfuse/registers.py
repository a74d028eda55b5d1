"""sm_90 resources of a gnnfuse layer's kernels, read on a CPU machine, row by row of ``ab_layers.py``.

    FUSEKIT_COMPILE_FOR=sm_90 FUSEKIT_COMPILE_ONLY=1 PYTHONPATH=. python3 tests/gnnfuse/registers.py ROW [ROW ...]

ROW is ``ab_layers.py``'s ``LAYER-DTYPE[:name=value,...]``.  Each row's layer runs one forward and one
training step on a power-law graph of ``--nodes`` nodes whose rows fall in every class the GPU's schedule
makes (light widths, medium rows, split super rows), with the GPU's tiles, multiprocessor count and
row-kernel defaults; every launch is compiled for sm_90 and not run (``FUSEKIT_COMPILE_ONLY``: outputs stay
as allocated, so the numbers are about code, never values), and the row's specialisations are printed as
``python -m fusecore.compile_check`` prints them: registers, local memory (spills), shared memory, resident
warps per multiprocessor.  To read what the GPU machine's Triton allots (its version may differ from the
local one's), put that version first on ``PYTHONPATH``: ``pip install --no-deps --target /tmp/t36
triton==3.6.0`` and ``PYTHONPATH=/tmp/t36:.`` (session 12: the GAT bf16 layer's registers read that way
equal Nsight Compute's on the H200, kernel for kernel).  A candidate A/B row can so be screened for
registers and occupancy before a GPU call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(__file__))
from ab_layers import DTYPES, apply, build, parse, parse_shape  # noqa: E402

H100_SMS = 132


def power_law_edges(num_nodes: int, seed: int = 0) -> torch.Tensor:
    """Edges ``[2, E]`` of a graph whose in-degrees fall like ``P(d >= x) ~ 1 / x`` up to 1000 (mean ~7.5,
    as the arxiv-like graph's 8), so at the default size every light width class is large enough to keep
    its own code (a class smaller than the device's share joins the next), with medium rows and split
    super rows."""
    gen = torch.Generator().manual_seed(seed)
    degree = (1.0 / torch.rand(num_nodes, generator=gen).clamp_min(1e-3)).long().clamp(1, 1000)
    dst = torch.repeat_interleave(torch.arange(num_nodes), degree)
    src = torch.randint(0, num_nodes, (dst.numel(),), generator=gen)
    return torch.stack([src, dst])


def gpu_like():
    """Make the CPU schedule the GPU's: its tiles, multiprocessor count, per-lane row-kernel defaults,
    row-kernel edge-block caps and the edge-feature gradient passes' blocks."""
    from gnnfuse import ops, schedule

    schedule.INTERPRETER_TILES = schedule.GPU_TILES
    ops.EDGE_TERMS_BLOCK_INTERPRETED = 0  # the GPU's blocks (by value dtype)
    ops.EDGE_WEIGHT_GRAD_NODES_INTERPRETED = 0  # the GPU's node blocks (by feature dtype)
    schedule.device_facts = lambda _device: SimpleNamespace(sm_count=H100_SMS)

    def gpu_lanes(sched, score, kernel_pass, dtype):
        if sched.edge_lanes is not None:
            return sched.edge_lanes
        if kernel_pass == "forward":
            return score in (ops.FORWARD_LANE_SCORES_BF16 if dtype == torch.bfloat16 else ops.FORWARD_LANE_SCORES)
        return score in ops.BACKWARD_LANE_SCORES

    ops.row_kernel_lanes = gpu_lanes

    ops.row_max_edges = ops.gpu_row_max_edges


def checked_kernels():
    """Every compile-checked kernel of gnnfuse and fusecore loaded so far."""
    from fusecore.compile_check import CheckedFunction

    found = []
    for name, module in list(sys.modules.items()):
        if name.startswith(("gnnfuse", "fusecore")) and module is not None:
            found += [v for v in vars(module).values() if isinstance(v, CheckedFunction)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--nodes", type=int, default=60000)
    parser.add_argument("--shape", default="128,8,16", help="IN,HEADS,DIM of the layer (default 128,8,16)")
    parser.add_argument("--forward", action="store_true", help="the forward's kernels alone (no training step)")
    args = parser.parse_args(argv)
    shape = parse_shape(args.shape, parser)
    if os.environ.get("FUSEKIT_COMPILE_FOR", "").strip() != "sm_90" or \
            os.environ.get("FUSEKIT_COMPILE_ONLY", "").strip() in ("", "0"):
        print("registers.py: set FUSEKIT_COMPILE_FOR=sm_90 and FUSEKIT_COMPILE_ONLY=1 (see the module docstring)",
              file=sys.stderr)
        return 2
    rows = [parse(row) for row in args.rows]  # every row checked before any runs
    from fusecore.compile_check import KernelResources, format_report
    from gnnfuse import Graph

    gpu_like()
    edges = power_law_edges(args.nodes)
    report = Path(os.environ.get("FUSEKIT_COMPILE_REPORT") or tempfile.mkstemp(suffix=".jsonl")[1])
    os.environ["FUSEKIT_COMPILE_REPORT"] = str(report)
    import triton

    print(f"triton {triton.__version__}, {args.nodes} nodes, {edges.shape[1]} edges")
    for row, (layer, dtype_name, settings) in zip(args.rows, rows):
        restore = apply(settings)
        try:
            for kernel in checked_kernels():
                kernel._compiled.clear()  # report this row's specialisations, even those an earlier row had
            done = len(report.read_text().splitlines()) if report.exists() else 0
            graph = Graph(edges, args.nodes)  # fresh schedules and launch plans under the row's settings
            forward, step = build(layer, DTYPES[dtype_name], graph, graph.num_nodes, torch.device("cpu"), shape)
            (forward if args.forward else step)()
            lines = report.read_text().splitlines()[done:]
        finally:
            restore()
        print(f"== {row}")
        print(format_report([KernelResources(**json.loads(line)) for line in lines if line.strip()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
