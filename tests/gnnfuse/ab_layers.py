"""Same-call A/B of gnnfuse layer variants: forward and training step, as called and replayed.

    python3 tests/gnnfuse/ab_layers.py TAG ROW [ROW ...]      ROW = LAYER-DTYPE[:name=value,...]
    e.g. gat-fp32  gat-fp32:LIGHT_LAUNCH_BREAKS=()  tredge-fp32:LIGHT_LAUNCH_PER_CLASS_WITH_EDGES=False

LAYER is ``gat``, ``gatv2``, ``gv2edge`` (``gnnfuse.pyg.GATv2Conv`` with 16 edge features, no self loops added: the
graph has them), ``tr`` (GraphTransformerConv), ``tredge`` (with 16 edge features) or ``agnn``;
DTYPE ``fp32`` or ``bf16``. Each ``name=value`` (a Python literal) sets that module constant of
``gnnfuse.ops`` for the row (``schedule.NAME=value``: of ``gnnfuse.schedule``, e.g.
``schedule.DEFAULT_LIGHT_MAX=32``; ``linear.NAME=value``: of ``fusecore.linear``, e.g.
``linear.STACK_LINEARS=False``), ``matmul_precision='high'`` torch's ``set_float32_matmul_precision`` for the row
(float32 products in TF32, which fusecore.linear follows), or ``max_light_rows=N`` the GPU's light rows per program
(``gnnfuse.schedule.GPU_TILES``); the graph's schedules and launch plans are
rebuilt for every row and the constants restored after it. Each row checks the layer's output against its
first row of the same layer and dtype (a variant changes launches, never values beyond rounding), then times,
as the benchmarks do (``fusecore.timing.measure``): ``fwd`` = the layer without autograd, ``step`` = forward
and backward with the parameters' gradients; ``called`` = back to back, the host's work included (``host`` its
issue time alone), ``graph`` = replayed from a CUDA graph (GPU time); µs, one JSON line per row, with the
share of the gather floor (``floor %``, :func:`floor_bytes`) the replayed time reaches on a GPU. The code
under test is whatever ``PYTHONPATH`` names, so one GPU call can time HEAD against the working tree: here
``git archive HEAD gnnfuse fusecore benchmarks pyproject.toml | tar -x -C .ab_gnn/head`` (an ignored folder,
carried), there ``PYTHONPATH=.ab_gnn/head python3 tests/gnnfuse/ab_layers.py head gat-bf16`` before and after
``PYTHONPATH=. python3 tests/gnnfuse/ab_layers.py tree gat-fp32 gat-fp32:LIGHT_LAUNCH_BREAKS=()``. The graph
is the benchmarks' arxiv-like one (``--graph`` picks another of ``benchmarks.cases.gnn``'s names), the layer's
shape the benchmarks' for that graph (input features, heads, head size: 128, 8, 16 on arxiv-like, 602, 4, 16
on reddit-scale; ``--shape IN,HEADS,DIM`` another).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import sys

import torch

LAYERS = ("gat", "gatv2", "gv2edge", "tr", "tredge", "agnn")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
EDGE_DIM = 16


def parse(row: str) -> tuple[str, str, dict]:
    """``LAYER-DTYPE[:name=value,...]`` as (layer, dtype name, settings); values are Python literals."""
    spec, _, fields = row.partition(":")
    layer, _, dtype = spec.partition("-")
    if layer not in LAYERS or dtype not in DTYPES:
        raise ValueError(f"row {row!r}: expected LAYER-DTYPE with LAYER in {LAYERS} and DTYPE in {tuple(DTYPES)}")
    settings = {}
    for item in filter(None, _split_fields(fields)):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"row {row!r}: {item!r} is not name=value")
        settings[name.strip()] = ast.literal_eval(value.strip())
    return layer, dtype, settings


def _split_fields(fields: str) -> list[str]:
    """Split on commas outside brackets (a tuple value holds commas)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(fields):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(fields[start:i])
            start = i + 1
    parts.append(fields[start:])
    return parts


GPU_TILE_FIELDS = ("max_light_rows",)  # row settings of gnnfuse.schedule.GPU_TILES


def apply(settings: dict):
    """Set ``settings`` on gnnfuse.ops (``NAME``; a per-score dict takes any of the score kinds as keys),
    gnnfuse.schedule (``schedule.NAME``) or the GPU tile limits (``max_light_rows``); returns the function
    restoring them (``matmul_precision``: torch's float32 matmul precision too).  Every setting is checked before
    any is set: a refused one leaves the modules as they were."""
    from fusecore import linear
    from fusecore.linear import MATMUL_PRECISIONS, float32_matmul_precision
    from gnnfuse import ops, schedule

    tiles = schedule.GPU_TILES
    changes = []
    precision = None
    for name, value in settings.items():
        if name == "matmul_precision":
            if value not in MATMUL_PRECISIONS:
                raise ValueError(f"matmul_precision: expected one of {MATMUL_PRECISIONS}, got {value!r}")
            precision = value
            continue
        if name in GPU_TILE_FIELDS:
            tiles = dataclasses.replace(tiles, **{name: int(value)})
            continue
        module, _, constant = name.rpartition(".")
        target = {"": ops, "schedule": schedule, "linear": linear}.get(module)
        if target is None or not hasattr(target, constant) or not constant.isupper():
            raise ValueError(f"{'fusecore' if module == 'linear' else 'gnnfuse'}.{module or 'ops'} has no constant "
                             f"{constant!r}")
        current = getattr(target, constant)
        if isinstance(current, dict):
            # per-pass and per-width constants take all their keys; per-score ones (integer keys, all among
            # ops.LIGHT_KINDS) any of ops.LIGHT_KINDS
            per_score = all(isinstance(key, int) for key in current) and set(current) <= set(ops.LIGHT_KINDS)
            keys = set(value) if isinstance(value, dict) else None
            if keys is None or (not keys <= set(ops.LIGHT_KINDS) if per_score else keys != set(current)):
                expected = f"keys among the scores {ops.LIGHT_KINDS}" if per_score else f"the keys {sorted(current)}"
                raise ValueError(f"{name}: expected a dict with {expected}, got {value!r}")
            passes = set(ops.KERNEL_PASSES)
            if per_score and any(isinstance(entry, dict) and not set(entry) <= passes for entry in value.values()):
                raise ValueError(f"{name}: a per-pass entry takes keys among {ops.KERNEL_PASSES}, got {value!r}")
        changes.append((target, constant, value))
    saved_tiles, schedule.GPU_TILES = schedule.GPU_TILES, tiles
    saved = [(target, constant, getattr(target, constant)) for target, constant, _ in changes]
    for target, constant, value in changes:
        setattr(target, constant, value)
    scope = contextlib.ExitStack()
    if precision is not None:
        scope.enter_context(float32_matmul_precision(precision))

    def restore():
        scope.close()
        schedule.GPU_TILES = saved_tiles
        for target, constant, value in reversed(saved):
            setattr(target, constant, value)

    return restore


def parse_shape(text: str, parser: argparse.ArgumentParser) -> tuple[int, int, int]:
    """``--shape IN,HEADS,DIM`` as three positive ints (a parser error otherwise)."""
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        parser.error(f"--shape: expected three positive ints IN,HEADS,DIM, got {text!r}")
    return shape


def graph_shape(graph_name: str) -> tuple[int, int, int]:
    """(input features, heads, head size) the benchmarks give layers on ``graph_name``."""
    from benchmarks.cases.gnn import FULL, QUICK

    spec = next((s for s in (*FULL, *QUICK) if s.name == graph_name), None)
    return (spec.in_feats, spec.heads, spec.head_dim) if spec else (128, 8, 16)


def build(layer: str, dtype: torch.dtype, graph, num_nodes: int, device: torch.device,
          shape: tuple[int, int, int] = (128, 8, 16)):
    """The layer (``shape`` = input features, heads, head size), its inputs and ``(forward, step)`` closures."""
    in_feats, heads, head_dim = shape
    from gnnfuse import pyg
    from gnnfuse.nn import AGNNConv, GATConv, GATv2Conv, GraphTransformerConv

    gen = torch.Generator(device="cpu").manual_seed(0)
    torch.manual_seed(0)
    module = {"gat": lambda: GATConv(in_feats, head_dim, heads),
              "gatv2": lambda: GATv2Conv(in_feats, head_dim, heads),
              "gv2edge": lambda: pyg.GATv2Conv(in_feats, head_dim, heads, edge_dim=EDGE_DIM, add_self_loops=False),
              "tr": lambda: GraphTransformerConv(in_feats, head_dim, heads=heads),
              "tredge": lambda: GraphTransformerConv(in_feats, head_dim, heads=heads, edge_dim=EDGE_DIM),
              "agnn": AGNNConv}[layer]().to(device, dtype)
    x = torch.randn(num_nodes, in_feats, generator=gen).to(device, dtype).requires_grad_(layer == "agnn")
    with_edges = layer in ("tredge", "gv2edge")
    extra = (torch.randn(graph.num_edges, EDGE_DIM, generator=gen).to(device, dtype),) if with_edges else ()
    params = [*module.parameters(), *([x] if layer == "agnn" else [])]
    call = (lambda: module(x, graph, *extra)) if layer == "gv2edge" else (lambda: module(graph, x, *extra))

    def forward():
        with torch.no_grad():
            return call()

    grad = torch.randn(forward().shape, generator=gen).to(device, dtype)

    def step():
        for p in params:
            p.grad = None
        call().backward(grad)

    return forward, step


def floor_bytes(layer: str, graph, shape: tuple[int, int, int], dtype: torch.dtype, backward: bool) -> int:
    """The layer's gather floor (``gnnfuse.ops.attention_floor_bytes``), as the benchmarks count it: one
    gathered tile per edge (GAT, GATv2, AGNN: one head as wide as the input), keys and values for the
    Transformer, plus the raw edge features with them."""
    from gnnfuse.ops import attention_floor_bytes

    in_feats, heads, head_dim = shape
    if layer == "agnn":
        heads, head_dim = 1, in_feats
    gathered = 2 if layer in ("tr", "tredge") else 1
    return attention_floor_bytes(graph, heads, head_dim, dtype, backward, gathered=gathered,
                                 edge_elements=EDGE_DIM if layer in ("tredge", "gv2edge") else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tag")
    parser.add_argument("rows", nargs="+")
    parser.add_argument("--graph", default="arxiv-like")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shape", default=None, help="IN,HEADS,DIM (default: the benchmarks' shape for --graph)")
    args = parser.parse_args(argv)
    shape = parse_shape(args.shape, parser) if args.shape else graph_shape(args.graph)
    rows = [(row, *parse(row)) for row in args.rows]  # every row parsed before anything runs

    from benchmarks.cases.gnn import _edges
    from fusecore import device_facts
    from fusecore.report import floor_ms
    from fusecore.testing import rel_error, test_device
    from fusecore.timing import measure
    from gnnfuse import Graph

    device = test_device()
    gpu = device.type == "cuda"
    edges, num_nodes = _edges(args.graph, device)
    first: dict[tuple[str, str], torch.Tensor] = {}
    for row, layer, dtype_name, settings in rows:
        restore = apply(settings)
        try:
            graph = Graph(edges, num_nodes)  # fresh schedules and launch plans under the settings
            forward, step = build(layer, DTYPES[dtype_name], graph, num_nodes, device, shape)
            out = forward().float()
            reference = first.setdefault((layer, dtype_name), out)
            error = rel_error(out, reference)
            step()
            result = {"tag": args.tag, "row": row, "rel_error_vs_first": error}
            for _ in range(args.rounds):
                for kind, fn in (("fwd", forward), ("step", step)):
                    called = measure(fn, device=device, back_to_back=gpu, rep_ms=200 if gpu else 1)
                    result.setdefault(f"{kind} called", []).append(round(called.median_ms * 1e3, 1))
                    if gpu:
                        result.setdefault(f"{kind} host", []).append(round(called.host_ms * 1e3, 1))
                        graph_timing = measure(fn, device=device, cuda_graph=True, rep_ms=100)
                        result.setdefault(f"{kind} graph", []).append(round(graph_timing.median_ms * 1e3, 1))
            if gpu:  # the gather floor's share of the replayed time (GPU time), first round
                for kind in ("fwd", "step"):
                    floor = floor_ms(device_facts(device), floor_bytes(layer, graph, shape, DTYPES[dtype_name],
                                                                      kind == "step"))
                    if floor:
                        result[f"{kind} floor %"] = round(100 * floor / (result[f"{kind} graph"][0] * 1e-3), 1)
        except Exception as exc:  # one broken row must not hide the others
            result = {"tag": args.tag, "row": row, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        finally:
            restore()
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
