"""gnnfuse: GATConv, GATv2Conv, Graph Transformer and AGNN layers, forward and forward+backward.

Graphs (TARGETS.md): the real Cora, CiteSeer and PubMed structures (:func:`gnnfuse.datasets.default_planetoid_root`;
PubMed with synthetic width-500 features), an arxiv-like power-law graph (169,343 nodes,
1.35 M edges with self loops, 128 input features, 8 heads × 16) and a Reddit-scale one
(233,000 nodes, 23.5 M edges, top in-degree ~425 k, 602 inputs, 4 × 16), generated with a
fixed seed.  Every graph gets one self loop per node, and every implementation runs on the
same edge set (PyG with ``add_self_loops=False``).

Implementations, each the whole layer (projection, scores, softmax, aggregation, bias):
the unfused PyTorch reference (``gnnfuse.reference`` through ``use_reference``), PyG's
GATConv eager, PyG's GATConv under ``torch.compile(dynamic=False)`` (Cora fp32 and
arxiv-like, the graphs TARGETS.md has compiled baselines for: each compile takes tens of
seconds), and gnnfuse's fused GATConv (on the small
Planetoid graphs in fp32 and on the arxiv-like graph in both dtypes also its forward and its
training step replayed as CUDA graphs: GPU time alone, without the host-side launch work those
graphs are bound by as called).  fp32 and bf16;
forward under ``no_grad`` and a training step (forward + backward).  A further row times
the attention op alone (``gnnfuse.ops.gat`` on precomputed projections, no GEMM): the part
the gather floor describes; another the projection GEMM alone.  Floor: the gather
floor of :func:`gnnfuse.ops.gat_floor_bytes`; peak memory is recorded for every run.

``gatv2conv``, ``transformerconv`` and ``agnnconv`` run the same comparison (one shared
runner, :func:`_layer_runs`) for the rest of the family against PyG's GATv2Conv,
TransformerConv and AGNNConv on Cora, PubMed, the arxiv-like and the Reddit-scale graphs
(AGNN: one head over the input features, Cora / PubMed / arxiv-like), compiled PyG in fp32 on
arxiv-like (and Cora for the Transformer, as TARGETS.md), CUDA-graph rows as for GATConv; ``transformerconv[...+edge]``
adds 16 edge features per edge (arxiv-like), projected by ``lin_edge`` and added to keys and
values.  Floors: :func:`gnnfuse.ops.attention_floor_bytes` (keys and values are two gathered
tiles; raw edge features ``E·16`` elements).  AGNN's training step includes the input gradient
(its only weight is β; in a model it sits between linear layers), and at Reddit scale the
unfused reference of the new layers is checked but not timed (0.1-0.6 s per call).

``gat_reorder`` measures whether relabelling nodes for locality (:meth:`gnnfuse.Graph.reordered`:
reverse Cuthill-McKee, or by degree) speeds the fused layer up on PubMed and the arxiv-like graph.

``tiles_reddit``, ``tiles_arxiv`` and ``lanes_backward`` (tuning sweeps, not headline rows) time
the fused attention ops under several tile sizes and warps per program
(``ScheduleOptions(tile_elements, num_warps)``), with and without per-edge-lane state in the row
kernels (``edge_lanes``) and with every row in the row kernel (``light_max_degree=-1``): the A/B
behind the GPU defaults.

``arxiv_launch_*`` (not headline rows) separate host work from GPU time on the arxiv-like graph:
the fused GATConv and its attention op as called and replayed as a CUDA graph (GPU time alone), fp32
and bf16, beside compiled PyG in bf16, and schedule candidates with fewer launches per pass
(``ScheduleOptions.light_widths``), rows of degree up to 64 in light tiles, or bf16 tiles of fp32's
byte size.  ``lanes_gatv2`` times GATv2's forward with per-lane state at Reddit scale.

``captured`` (not headline rows) times the opt-in :func:`gnnfuse.capture` (forward and backward
replayed from CUDA graphs, as a user calls it) beside the same layers as called, arxiv-like.

``gat_edge_weight`` (not a headline row) times DGL GATConv's ``edge_weight`` (a per-edge factor on the attention)
in the fused layer against the unfused reference and the fused layer without it, arxiv-like.

``gat_super_node`` checks the TARGETS.md rule that a node of in-degree 10⁶ costs no more
per edge than a uniform graph (within 2×): both graphs have ~1 M edges.

``gatconv_tf32`` and ``transformerconv_tf32`` (not headline rows) run the fp32 comparison on the arxiv-like graph
under ``torch.set_float32_matmul_precision("high")``: every implementation's float32 products in TF32 (PyG's through
cuBLAS, the fused layers' through fusecore.linear, which follows torch's setting), variants ``...@tf32``; the
layer rows of every case record ``params["tf32"]``.

Quick mode: a 300-node power-law graph with a heavy node, fp32, no torch.compile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from benchmarks.registry import CheckFailed, Context, case
from fusecore import use_reference
from fusecore.linear import float32_matmul_precision, torch_allows_tf32
from fusecore.testing import rel_error, tolerance
from gnnfuse import Graph, ScheduleOptions, capture, ops
from gnnfuse.datasets import load_planetoid, planetoid_available, power_law_graph
from gnnfuse.nn import AGNNConv, GATConv, GATv2Conv, GraphTransformerConv
from gnnfuse.ops import attention_floor_bytes, attention_weights_floor_bytes, gat_floor_bytes


@dataclass(frozen=True)
class GraphSpec:
    name: str
    in_feats: int
    heads: int
    head_dim: int
    compile_pyg: tuple[torch.dtype, ...]  # dtypes timed against torch.compile'd PyG (each compile takes ~tens of s)


FULL = [
    GraphSpec("cora", 1433, 8, 8, (torch.float32,)),
    GraphSpec("citeseer", 3703, 8, 8, ()),
    GraphSpec("pubmed", 500, 8, 8, ()),
    GraphSpec("arxiv-like", 128, 8, 16, (torch.float32, torch.bfloat16)),
    GraphSpec("reddit-scale", 602, 4, 16, ()),
]
QUICK = [GraphSpec("tiny-power-law", 16, 2, 8, ())]
CUDA_GRAPH_MAX_EDGES = 200_000  # the Planetoid graphs
# Graphs whose fused rows are also replayed as a CUDA graph in every dtype: on the arxiv-like graph
# the training step as called is bound by host work (session 5, H200: bf16 GAT ~2.1 ms as called,
# 0.93 ms of GPU time), so its GPU time is reported beside it.
REPLAYED_GRAPHS = ("arxiv-like",)


@functools.cache
def _edges(name: str, device: torch.device) -> tuple[torch.Tensor, int]:
    """Edges with exactly one self loop per node, and the node count (built once per run: the
    Reddit-scale graph takes seconds to generate)."""
    # Edge counts include the self loops, as in TARGETS.md.
    if name == "arxiv-like":
        edges, n = power_law_graph(169_343, 1_350_000, 13_000, seed=0), 169_343
    elif name == "reddit-scale":
        edges, n = power_law_graph(233_000, 23_500_000, 425_000, seed=0), 233_000
    elif name == "tiny-power-law":
        edges, n = power_law_graph(300, 2_400, 400, seed=0), 300
    else:
        data = load_planetoid(name)
        edges, n = data.edge_index, data.num_nodes
    graph = Graph(edges.to(device), n).remove_self_loops().add_self_loops()
    return graph.edge_index, n


def _arxiv_like(ctx: Context) -> tuple[GraphSpec, torch.Tensor, int, Graph]:
    """The single-graph cases' graph: arxiv-like at full size, the tiny power-law graph with ``--quick``; its spec,
    edges, node count and :class:`Graph`."""
    spec = QUICK[0] if ctx.quick else next(s for s in FULL if s.name == "arxiv-like")
    edges, n = _edges(spec.name, ctx.device)
    return spec, edges, n, Graph(edges, n)


def _pyg_twin(layer: GATConv, spec: GraphSpec, dtype: torch.dtype, device: torch.device):
    import torch_geometric

    pyg = torch_geometric.nn.GATConv(spec.in_feats, spec.head_dim, heads=spec.heads, add_self_loops=False)
    with torch.no_grad():
        pyg.lin.weight.copy_(layer.fc.weight)
        pyg.att_src.copy_(layer.attn_l)
        pyg.att_dst.copy_(layer.attn_r)
        pyg.bias.copy_(layer.bias)
    return pyg.to(device=device, dtype=dtype)


def _forward(module_call):
    def run():
        with torch.no_grad():
            return module_call()
    return run


def _train_step(module_call, params, grad):
    def run():
        for p in params:
            p.grad = None
        module_call().backward(grad)
    return run


@dataclass(frozen=True)
class LayerFamily:
    """One fused layer and its PyG twin, for the shared layer benchmark (:func:`_layer_runs`).

    ``build(spec)``: the fused layer; ``twin(layer, spec)``: PyG's layer with the same weights
    on the same edge set (no self loops added); ``floor(graph, spec, dtype, backward)``: the
    gather floor in bytes; ``edge_dim``: width of random edge features passed to both (None:
    no edge features); ``input_grad``: the input features need a gradient in the training step
    (AGNN, whose only weight is β, sits between linear layers in a model); ``reference_max_edges``:
    the unfused reference is timed only on graphs up to this size (it still checks every graph).
    """

    label: str
    build: Callable[[GraphSpec], torch.nn.Module]
    twin: Callable[[torch.nn.Module, GraphSpec], torch.nn.Module]
    floor: Callable[[Graph, GraphSpec, torch.dtype, bool], int]
    edge_dim: int | None = None
    input_grad: bool = False
    reference_max_edges: int | None = None


def _layer_runs(
    ctx: Context, spec: GraphSpec, graph: Graph, dtype: torch.dtype, gen: torch.Generator, family: LayerFamily,
    variant_suffix: str = "",
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, dict]:
    """Check and time the fused layer, the unfused reference, PyG eager (and compiled) on one
    graph in one dtype; returns ``(layer, x, grad, params)`` for family-specific extra rows."""
    n, edges = graph.num_nodes, graph.edge_index
    torch.manual_seed(0)
    layer = family.build(spec).to(device=ctx.device, dtype=dtype)
    pyg = family.twin(layer, spec).to(device=ctx.device, dtype=dtype)
    x = torch.randn(n, spec.in_feats, generator=gen).to(device=ctx.device, dtype=dtype)
    x.requires_grad_(family.input_grad)
    edge_attr = None
    if family.edge_dim is not None:
        edge_attr = torch.randn(graph.num_edges, family.edge_dim, generator=gen).to(device=ctx.device, dtype=dtype)
    extra = () if edge_attr is None else (edge_attr,)
    with torch.no_grad():
        width = layer(graph, x, *extra).reshape(n, -1).shape[1]
    grad = torch.randn(n, width, generator=gen).to(device=ctx.device, dtype=dtype)
    tag = "fp32" if dtype == torch.float32 else "bf16"
    floor_fwd = family.floor(graph, spec, dtype, False)
    floor_train = family.floor(graph, spec, dtype, True)
    params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "in_feats": spec.in_feats,
              "heads": spec.heads, "head_dim": spec.head_dim, "dtype": tag, "edge_dim": family.edge_dim}
    if dtype == torch.float32:  # whether the run let float32 products round to TF32 (torch's and so the layers')
        params["tf32"] = torch_allows_tf32()

    def fused():
        return layer(graph, x, *extra).reshape(n, -1)

    def reference():
        with use_reference():
            return layer(graph, x, *extra).reshape(n, -1)

    def pyg_eager():
        return pyg(x, edges, *extra).reshape(n, -1)

    implementations = [(f"PyG {family.label} eager", pyg_eager)]
    if family.reference_max_edges is None or graph.num_edges <= family.reference_max_edges:
        implementations.insert(0, ("unfused torch (gnnfuse.reference)", reference))
    if dtype in spec.compile_pyg and ctx.gpu:
        # Every variant compiles PyG's forward afresh: dynamo's guards count recompilations of one code
        # object across variants (graphs, dtypes, grad mode), and past its recompile limit (8) it silently
        # runs the function eagerly — session 13 found the Transformer-with-edge-features bf16 "compiled"
        # baseline at eager PyG's time (7.60 against 7.59 ms) for that reason.
        torch._dynamo.reset()
        compiled = torch.compile(pyg, dynamic=False)
        try:  # compile (forward and training graphs) up front; a failure drops only this baseline
            with torch.no_grad():
                compiled(x, edges, *extra)
            _train_step(lambda: compiled(x, edges, *extra).reshape(n, -1), [*pyg.parameters(), x], grad)()
            implementations.append(
                (f"PyG {family.label} torch.compile", lambda: compiled(x, edges, *extra).reshape(n, -1))
            )
        except Exception as exc:  # noqa: BLE001 - report and keep the other implementations
            print(f"[gnn] torch.compile of PyG {family.label} failed on {spec.name} {dtype}: "
                  f"{type(exc).__name__}: {exc}")
    implementations.append(("fused (gnnfuse)", fused))

    inputs = [x] if family.input_grad else []
    layer_params, pyg_params = [*layer.parameters(), *inputs], [*pyg.parameters(), *inputs]
    checked_name, checked = next(iter(layer.named_parameters()))

    def values(call: Callable) -> list[torch.Tensor]:
        """The output, the first parameter's gradient and the input's (where it has one), in float32."""
        with torch.no_grad():
            out = call().float()
        _train_step(call, layer_params, grad)()
        return [out, checked.grad.float().clone(), *(t.grad.float().clone() for t in inputs)]

    tol = tolerance(dtype)
    if params.get("tf32"):
        # TF32 rows: against the reference in full float32, each value within twice the error the reference itself
        # makes under TF32 (a gradient summed over every node amplifies the products' rounding: GAT's ∂attn_l)
        with float32_matmul_precision("highest"):
            expected = values(reference)
        tols = [max(tol, 2 * rel_error(r, e)) for r, e in zip(values(reference), expected)]
    else:
        expected = values(reference)
        tols = [tol] * len(expected)
    ours = values(fused)
    ctx.check(f"{spec.name} {tag} forward vs reference", ours[0], expected[0], tols[0])
    if dtype == torch.float32:  # PyG sums its softmax in the input dtype: a check of the copied weights only
        with torch.no_grad():
            ctx.check(f"{spec.name} {tag} PyG vs reference", pyg_eager().float(), expected[0], tols[0])
    for name, got, want, allowed in zip((checked_name, "x"), ours[1:], expected[1:], tols[1:]):
        ctx.check(f"{spec.name} {tag} grad {name} vs reference", got, want, allowed)

    for impl, call in implementations:
        own = pyg_params if "PyG" in impl else layer_params
        ctx.time(impl, _forward(call), bytes_moved=floor_fwd, memory=True, params=params,
                 variant=f"{spec.name}{variant_suffix},{tag},fwd")
        ctx.time(impl, _train_step(call, own, grad), bytes_moved=floor_train, memory=True, params=params,
                 variant=f"{spec.name}{variant_suffix},{tag},fwd+bwd")
    if (graph.num_edges < CUDA_GRAPH_MAX_EDGES and dtype == torch.float32) or spec.name in REPLAYED_GRAPHS:
        # Small graphs are bound by host-side launch overhead: the same fused forward and training
        # step replayed as a CUDA graph (nothing in them synchronizes with the host); fp32 only,
        # and both dtypes on the graphs of REPLAYED_GRAPHS.
        runs = (("fwd", _forward(fused), floor_fwd), ("fwd+bwd", _train_step(fused, layer_params, grad), floor_train))
        for phase, run, floor in runs:
            _time_replayed(ctx, "fused (gnnfuse), CUDA graph", run, floor, params,
                           f"{spec.name}{variant_suffix},{tag},{phase}")
    return layer, x, grad, params


def _time_replayed(ctx: Context, impl: str, run: Callable, floor: int, params: dict, variant: str) -> None:
    """Time ``run`` replayed as a CUDA graph (GPU time alone: no host work between kernels; the
    harness's replay budget, ``Context.replay_rep_ms``); on the GPU only, and a capture failure is
    reported without losing the other rows."""
    if not ctx.gpu:
        return
    try:
        ctx.time(impl, run, bytes_moved=floor, cuda_graph=True, params=params, variant=variant)
    except Exception as exc:  # noqa: BLE001 - report and keep the other rows
        print(f"[gnn] CUDA graph of {impl} failed on {variant}: {type(exc).__name__}: {exc}")


def _gat_twin(layer: GATConv, spec: GraphSpec):
    with torch.no_grad():
        layer.bias.copy_(torch.randn(layer.bias.shape))
    return _pyg_twin(layer, spec, layer.bias.dtype, layer.bias.device)


def _gat_floor(graph: Graph, spec: GraphSpec, dtype: torch.dtype, backward: bool) -> int:
    return gat_floor_bytes(graph, spec.heads, spec.head_dim, dtype, backward=backward)


GAT = LayerFamily("GATConv", lambda spec: GATConv(spec.in_feats, spec.head_dim, spec.heads), _gat_twin, _gat_floor)


def _gatconv_runs(ctx: Context, spec: GraphSpec, graph: Graph, dtype: torch.dtype, gen: torch.Generator) -> None:
    """Check and time every implementation on one graph in one dtype, plus the component rows."""
    layer, x, grad, params = _layer_runs(ctx, spec, graph, dtype, gen, GAT)
    n, tag = graph.num_nodes, params["dtype"]
    floor_fwd = gat_floor_bytes(graph, spec.heads, spec.head_dim, dtype)
    floor_train = gat_floor_bytes(graph, spec.heads, spec.head_dim, dtype, backward=True)
    # The attention op alone (gnnfuse.ops.gat on precomputed projections): what the gather floor
    # fraction of TARGETS.md is about, without the projection GEMM every implementation shares.
    wh = layer.fc(x).detach().view(n, spec.heads, spec.head_dim).requires_grad_(True)
    attention_params = [wh, layer.attn_l, layer.attn_r]

    def attention_only():
        return ops.gat(graph, wh, layer.attn_l, layer.attn_r)

    # Component rows get their own variant: no layer baseline there, so no misleading speedup.
    ctx.time("fused attention op only (no projection)", _forward(attention_only), bytes_moved=floor_fwd,
             memory=True, params=params, variant=f"{spec.name},{tag},fwd,parts")
    ctx.time("fused attention op only (no projection)", _train_step(attention_only, attention_params,
             grad.view(n, spec.heads, spec.head_dim)), bytes_moved=floor_train, memory=True, params=params,
             variant=f"{spec.name},{tag},fwd+bwd,parts")
    # The projection GEMM alone (shared by every implementation): separates the layer's time
    # into GEMM and attention, e.g. for in_feats not a multiple of 8 in 16-bit types.
    ctx.time("projection GEMM only (fc)", _forward(lambda: layer.fc(x)), params=params,
             variant=f"{spec.name},{tag},fwd,parts")
    if ops.fuses_projection(x, layer.fc.weight, spec.heads, spec.head_dim):
        # where the layer fuses them, it runs this instead of fc and the attention op's node-score pass
        ctx.time("fused projection + node scores", _forward(lambda: ops._projection_scores(
            x, layer.fc.weight, layer.attn_l, layer.attn_r, spec.heads, spec.head_dim)), params=params,
            variant=f"{spec.name},{tag},fwd,parts")


def _run_graphs(ctx: Context, specs: list[GraphSpec], run: Callable,
                dtypes: tuple[torch.dtype, ...] | None = None) -> None:
    """``run(ctx, spec, graph, dtype, gen)`` on every available graph (those of ``ctx.graphs`` when
    set) in fp32 (and bf16 at full size; ``dtypes`` where given); failures are collected so the other graphs are
    still measured."""
    if dtypes is None:
        dtypes = (torch.float32,) if ctx.quick else (torch.float32, torch.bfloat16)
    known = [s.name for s in FULL + QUICK]
    if ctx.graphs is not None and set(ctx.graphs) - set(known):
        raise ValueError(f"--graph {sorted(set(ctx.graphs) - set(known))}: no such graph; "
                         f"the layer cases' graphs are {known}")
    failures: list[str] = []
    for spec in specs:
        if ctx.graphs is not None and spec.name not in ctx.graphs:
            continue
        if spec.name in ("cora", "citeseer", "pubmed") and not planetoid_available(spec.name):
            continue
        edges, n = _edges(spec.name, ctx.device)
        graph = Graph(edges, n)
        gen = torch.Generator(device="cpu").manual_seed(0)
        for dtype in dtypes:
            try:
                run(ctx, spec, graph, dtype, gen)
            except Exception as exc:  # noqa: BLE001 - keep measuring the other graphs, fail at the end
                failures.append(f"{spec.name} {dtype}: {type(exc).__name__}: {exc}")
            if ctx.gpu:
                torch.cuda.empty_cache()
    if failures:
        raise CheckFailed("; ".join(failures))


@case("gnn", "gatconv", baseline="PyG GATConv eager")
def gatconv_case(ctx: Context) -> None:
    """GATConv forward / forward+backward: fused vs unfused reference vs PyG eager / compiled."""
    _run_graphs(ctx, QUICK if ctx.quick else FULL, _gatconv_runs)


def _gatv2_twin(layer: GATv2Conv, spec: GraphSpec):
    import torch_geometric

    pyg = torch_geometric.nn.GATv2Conv(spec.in_feats, spec.head_dim, heads=spec.heads, add_self_loops=False)
    with torch.no_grad():
        pyg.lin_l.weight.copy_(layer.fc_src.weight)
        pyg.lin_l.bias.copy_(layer.fc_src.bias)
        pyg.lin_r.weight.copy_(layer.fc_dst.weight)
        pyg.lin_r.bias.copy_(layer.fc_dst.bias)
        pyg.att.copy_(layer.attn)
        pyg.bias.zero_()  # DGL's GATv2Conv (ours) has its biases in fc_src / fc_dst only
    return pyg


def _transformer_twin(layer: GraphTransformerConv, spec: GraphSpec):
    import torch_geometric

    pyg = torch_geometric.nn.TransformerConv(spec.in_feats, spec.head_dim, heads=spec.heads, edge_dim=layer.edge_dim)
    pyg.load_state_dict({k: v.float().cpu() for k, v in layer.state_dict().items()}, strict=True)
    return pyg


def _agnn_twin(layer: AGNNConv, spec: GraphSpec):
    import torch_geometric

    pyg = torch_geometric.nn.AGNNConv(add_self_loops=False)  # the benchmark graphs have their self loops
    with torch.no_grad():
        pyg.beta.copy_(layer.beta)
    return pyg


def _floor(gathered: int, edge_elements: int = 0):
    def floor(graph: Graph, spec: GraphSpec, dtype: torch.dtype, backward: bool) -> int:
        return attention_floor_bytes(graph, spec.heads, spec.head_dim, dtype, backward,
                                     gathered=gathered, edge_elements=edge_elements)
    return floor


TRANSFORMER_EDGE_DIM = 16
# The unfused reference takes 0.1-0.6 s per call at Reddit scale: checked there, timed on smaller graphs.
REFERENCE_TIMED_EDGES = 5_000_000
GATV2 = LayerFamily("GATv2Conv", lambda spec: GATv2Conv(spec.in_feats, spec.head_dim, spec.heads), _gatv2_twin,
                    _floor(1), reference_max_edges=REFERENCE_TIMED_EDGES)
TRANSFORMER = LayerFamily(
    "TransformerConv", lambda spec: GraphTransformerConv(spec.in_feats, spec.head_dim, heads=spec.heads),
    _transformer_twin, _floor(2), reference_max_edges=REFERENCE_TIMED_EDGES,
)
TRANSFORMER_EDGE = LayerFamily(
    "TransformerConv",
    lambda spec: GraphTransformerConv(spec.in_feats, spec.head_dim, heads=spec.heads, edge_dim=TRANSFORMER_EDGE_DIM),
    _transformer_twin, _floor(2, TRANSFORMER_EDGE_DIM), edge_dim=TRANSFORMER_EDGE_DIM,
)
# AGNN attends over the input features themselves: one head as wide as the input.
AGNN = LayerFamily("AGNNConv", lambda spec: AGNNConv(allow_zero_in_degree=True), _agnn_twin, _floor(1),
                   input_grad=True)


def _family_runs(family: LayerFamily, variant_suffix: str = ""):
    def run(ctx: Context, spec: GraphSpec, graph: Graph, dtype: torch.dtype, gen: torch.Generator) -> None:
        _layer_runs(ctx, spec, graph, dtype, gen, family, variant_suffix)
    return run


def _specs(ctx: Context, names: tuple[str, ...], compiled: dict[str, tuple[torch.dtype, ...]]) -> list[GraphSpec]:
    """The FULL graphs named (quick mode: the tiny graph), with the dtypes timed against compiled PyG."""
    if ctx.quick:
        return QUICK
    return [replace(spec, compile_pyg=compiled.get(spec.name, ())) for spec in FULL if spec.name in names]


LAYER_GRAPHS = ("cora", "pubmed", "arxiv-like", "reddit-scale")
# Compiled PyG where TARGETS.md has compiled baselines (TransformerConv: Cora and arxiv-like), for
# the other layers on arxiv-like, fp32 and bf16 there (TARGETS.md's targets hold for both): each
# compile costs ~20 s of GPU time.
BOTH = (torch.float32, torch.bfloat16)
COMPILED_CORA_ARXIV = {"cora": (torch.float32,), "arxiv-like": BOTH}
COMPILED_ARXIV = {"arxiv-like": BOTH}


@case("gnn", "gatv2conv", baseline="PyG GATv2Conv eager")
def gatv2conv_case(ctx: Context) -> None:
    """GATv2Conv forward / forward+backward: fused vs unfused reference vs PyG eager / compiled."""
    _run_graphs(ctx, _specs(ctx, LAYER_GRAPHS, COMPILED_ARXIV), _family_runs(GATV2))


@case("gnn", "transformerconv", baseline="PyG TransformerConv eager")
def transformerconv_case(ctx: Context) -> None:
    """Graph Transformer forward / forward+backward: fused vs reference vs PyG TransformerConv eager / compiled;
    variants ``+edge``: 16 edge features projected and added to keys and values (arxiv-like)."""
    _run_graphs(ctx, _specs(ctx, LAYER_GRAPHS, COMPILED_CORA_ARXIV), _family_runs(TRANSFORMER))
    _run_graphs(ctx, _specs(ctx, ("arxiv-like",), COMPILED_ARXIV), _edge_runs)


def _edge_runs(ctx: Context, spec: GraphSpec, graph: Graph, dtype: torch.dtype, gen: torch.Generator) -> None:
    _layer_runs(ctx, spec, graph, dtype, gen, TRANSFORMER_EDGE, variant_suffix="+edge")


@case("gnn", "gatconv_tf32", baseline="PyG GATConv eager", headline=False)
def gatconv_tf32_case(ctx: Context) -> None:
    """GATConv fp32 on arxiv-like (quick: the tiny graph) where the user lets torch's float32 products use TF32
    (``torch.set_float32_matmul_precision("high")``): PyG's projections then run cuBLAS's TF32 products and the
    fused layer's (fusecore.linear) one TF32 product instead of three parts; variants ``...@tf32``."""
    with float32_matmul_precision("high"):
        _run_graphs(ctx, _tf32_specs(ctx), _family_runs(GAT, "@tf32"), dtypes=(torch.float32,))


@case("gnn", "transformerconv_tf32", baseline="PyG TransformerConv eager", headline=False)
def transformerconv_tf32_case(ctx: Context) -> None:
    """The Graph Transformer fp32, with and without 16 edge features, under TF32 as :func:`gatconv_tf32_case`."""
    with float32_matmul_precision("high"):
        _run_graphs(ctx, _tf32_specs(ctx), _family_runs(TRANSFORMER, "@tf32"), dtypes=(torch.float32,))
        _run_graphs(ctx, _tf32_specs(ctx), _family_runs(TRANSFORMER_EDGE, "+edge@tf32"), dtypes=(torch.float32,))


def _tf32_specs(ctx: Context) -> list[GraphSpec]:
    return _specs(ctx, ("arxiv-like",), {"arxiv-like": (torch.float32,)})


@case("gnn", "agnnconv", baseline="PyG AGNNConv eager")
def agnnconv_case(ctx: Context) -> None:
    """AGNNConv forward / forward+backward (one head over the input features): fused vs reference vs PyG."""
    graphs = _specs(ctx, ("cora", "pubmed", "arxiv-like"), COMPILED_ARXIV)
    specs = [replace(spec, heads=1, head_dim=spec.in_feats) for spec in graphs]
    _run_graphs(ctx, specs, _family_runs(AGNN))


@case("gnn", "gat_super_node", baseline="uniform graph")
def super_node_case(ctx: Context) -> None:
    """Fused GATConv per edge: one node receiving every edge vs the same number of uniform edges."""
    n, num_edges, heads, head_dim = (1_000, 3_000, 2, 8) if ctx.quick else (100_000, 1_000_000, 8, 16)
    gen = torch.Generator().manual_seed(2)
    uniform = torch.randint(0, n, (2, num_edges), generator=gen)
    heavy = torch.stack([torch.randint(0, n, (num_edges,), generator=gen), torch.zeros(num_edges, dtype=torch.long)])
    torch.manual_seed(0)
    layer = GATConv(heads * head_dim, head_dim, heads, allow_zero_in_degree=True).to(ctx.device)
    x = torch.randn(n, heads * head_dim, generator=gen).to(ctx.device)
    grad = torch.randn(n, heads, head_dim, generator=gen).to(ctx.device)
    layer_params = list(layer.parameters())
    for impl, edges in (("uniform graph", uniform), ("one node of in-degree E", heavy)):
        graph = Graph(edges.to(ctx.device), n)

        def call(graph=graph):
            return layer(graph, x)

        with torch.no_grad():
            out = call()
            with use_reference():
                ctx.check(f"{impl} forward vs reference", out, call(), 2e-3)
        params = {"nodes": n, "edges": num_edges, "heads": heads, "head_dim": head_dim,
                  "max_in_degree": int(graph.in_degree.max())}
        ctx.time(impl, _forward(call), bytes_moved=gat_floor_bytes(graph, heads, head_dim, torch.float32),
                 params=params, variant="fwd")
        ctx.time(impl, _train_step(call, layer_params, grad),
                 bytes_moved=gat_floor_bytes(graph, heads, head_dim, torch.float32, backward=True),
                 params=params, variant="fwd+bwd")


@case("gnn", "gat_reorder", baseline="original order", headline=False)
def reorder_case(ctx: Context) -> None:
    """Fused GATConv forward+backward with nodes relabelled for locality (RCM, by degree) vs as given."""
    specs = QUICK if ctx.quick else [s for s in FULL if s.name in ("pubmed", "arxiv-like")]
    for spec in specs:
        if spec.name == "pubmed" and not planetoid_available(spec.name):
            continue
        edges, n = _edges(spec.name, ctx.device)
        base = Graph(edges, n)
        gen = torch.Generator().manual_seed(3)
        torch.manual_seed(0)
        layer = GATConv(spec.in_feats, spec.head_dim, spec.heads).to(ctx.device)
        x = torch.randn(n, spec.in_feats, generator=gen).to(ctx.device)
        grad = torch.randn(n, spec.heads, spec.head_dim, generator=gen).to(ctx.device)
        with torch.no_grad():
            expected = layer(base, x)
        for impl, method in (("original order", None), ("RCM order", "rcm"), ("degree order", "degree")):
            graph, perm = (base, None) if method is None else base.reordered(method)
            x_in = x if perm is None else x[perm]
            grad_in = grad if perm is None else grad[perm]
            if perm is not None:
                with torch.no_grad():
                    ctx.check(f"{spec.name} {impl} forward", layer(graph, x_in), expected[perm], 2e-3)

            def call(graph=graph, x_in=x_in):
                return layer(graph, x_in)

            params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "order": impl}
            floor_fwd = gat_floor_bytes(graph, spec.heads, spec.head_dim, torch.float32)
            floor_train = gat_floor_bytes(graph, spec.heads, spec.head_dim, torch.float32, backward=True)
            ctx.time(impl, _forward(call), bytes_moved=floor_fwd, params=params, variant=f"{spec.name},fwd")
            ctx.time(impl, _train_step(call, list(layer.parameters()), grad_in), bytes_moved=floor_train,
                     params=params, variant=f"{spec.name},fwd+bwd")


@case("gnn", "attention_weights", baseline="forward", headline=False)
def attention_weights_case(ctx: Context) -> None:
    """The attention weights on request (DGL's ``get_attention``, PyG's ``return_attention_weights``): each
    op's forward alone and the same forward with ``return_attention=True``, as called and replayed as CUDA
    graphs (the replayed rows' difference is the weights pass, :func:`gnnfuse.ops.attention_weights`),
    arxiv-like, fp32 and bf16; the second row's floor adds the pass's,
    :func:`gnnfuse.ops.attention_weights_floor_bytes`.  Checked: the weights of every destination sum
    to 1, and asking for them leaves the output unchanged."""
    spec, edges, n, graph = _arxiv_like(ctx)
    gen = torch.Generator().manual_seed(5)
    heads, dim = spec.heads, spec.head_dim
    dst = graph.edge_index[1].long()  # per input edge
    for dtype in [torch.float32] if ctx.quick else [torch.float32, torch.bfloat16]:
        tag = "fp32" if dtype == torch.float32 else "bf16"

        def rand(*shape):
            return torch.randn(*shape, generator=gen).to(device=ctx.device, dtype=dtype)

        a, b, c = rand(n, heads, dim), rand(n, heads, dim), rand(n, heads, dim)
        vec_l, vec_r = rand(1, heads, dim), rand(1, heads, dim)
        attr, weight = rand(graph.num_edges, TRANSFORMER_EDGE_DIM), rand(heads * dim, TRANSFORMER_EDGE_DIM) / 4
        beta = torch.ones(1, device=ctx.device, dtype=dtype)
        table = {  # name: (call(**kw), floor of the weights pass)
            "gat": (lambda **kw: ops.gat(graph, a, vec_l, vec_r, **kw),
                    attention_weights_floor_bytes(graph, heads, dim, dtype, node_terms=True)),
            "gatv2": (lambda **kw: ops.gatv2(graph, a, b, vec_l, **kw),
                      attention_weights_floor_bytes(graph, heads, dim, dtype)),
            "transformer": (lambda **kw: ops.transformer_attention(graph, a, b, c, **kw),
                            attention_weights_floor_bytes(graph, heads, dim, dtype)),
            "transformer+edge": (lambda **kw: ops.transformer_attention(graph, a, b, c, attr, weight, **kw),
                                 attention_weights_floor_bytes(graph, heads, dim, dtype,
                                                               edge_elements=TRANSFORMER_EDGE_DIM)),
            "agnn": (lambda **kw: ops.agnn(graph, a, beta, **kw),
                     attention_weights_floor_bytes(graph, heads, dim, dtype)),
        }
        for name, (call, floor) in table.items():
            variant = f"{spec.name},{tag},{name}"
            params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "op": name}
            with torch.no_grad():
                out, alpha = call(return_attention=True)
                sums = torch.zeros(n, heads, device=ctx.device).index_add(0, dst, alpha.float())
                has_edges = graph.in_degree > 0
                ctx.check(f"{variant} weights sum to 1", sums[has_edges], torch.ones_like(sums[has_edges]),
                          2e-3 if dtype == torch.float32 else 3e-2)
                ctx.check(f"{variant} output unchanged", out, call(), 1e-12)  # bit for bit in practice
            forward = attention_floor_bytes(graph, heads, dim, dtype, gathered=2 if "transformer" in name else 1,
                                            edge_elements=TRANSFORMER_EDGE_DIM if name.endswith("edge") else 0)
            ctx.time("forward", _forward(call), bytes_moved=forward, params=params, variant=variant, memory=True)
            ctx.time("forward + attention weights", _forward(lambda call=call: call(return_attention=True)),
                     bytes_moved=forward + floor, params=params, variant=variant, memory=True)
            _time_replayed(ctx, "forward + attention weights, CUDA graph",
                           _forward(lambda call=call: call(return_attention=True)), forward + floor, params, variant)
            _time_replayed(ctx, "forward, CUDA graph", _forward(call), forward, params, variant)


@case("gnn", "gat_edge_weight", baseline="unfused torch (gnnfuse.reference)", headline=False)
def gat_edge_weight_case(ctx: Context) -> None:
    """DGL GATConv's ``edge_weight`` (a per-edge factor on the attention after its softmax and dropout): the fused
    GATConv with a learned ``[E]`` weight against the unfused reference (what DGL's GATConv computes, ``[E, H]``
    attention and ``[E, H, D]`` messages materialized) and against the fused layer without it, forward and training
    step (``∂w`` included), as called and replayed as CUDA graphs, arxiv-like, fp32 and bf16.  Floors:
    :func:`gnnfuse.ops.attention_floor_bytes` with ``edge_factor``.  Checked against the reference: the output and
    the gradients of ``w`` and ``fc.weight``."""
    spec, edges, n, graph = _arxiv_like(ctx)
    gen = torch.Generator().manual_seed(7)
    for dtype in [torch.float32] if ctx.quick else [torch.float32, torch.bfloat16]:
        tag = "fp32" if dtype == torch.float32 else "bf16"
        torch.manual_seed(0)
        layer = GATConv(spec.in_feats, spec.head_dim, spec.heads).to(device=ctx.device, dtype=dtype)
        x = torch.randn(n, spec.in_feats, generator=gen).to(device=ctx.device, dtype=dtype)
        weight = torch.rand(graph.num_edges, generator=gen).to(ctx.device).requires_grad_(True)
        grad = torch.randn(n, spec.heads, spec.head_dim, generator=gen).to(device=ctx.device, dtype=dtype)
        params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "heads": spec.heads,
                  "head_dim": spec.head_dim, "dtype": tag}
        variant = f"{spec.name},{tag}"

        def weighted():
            return layer(graph, x, weight)

        def plain():
            return layer(graph, x)

        def reference():
            with use_reference():
                return layer(graph, x, weight)

        trained = [*layer.parameters(), weight]
        tol = 2e-3 if dtype == torch.float32 else 2e-2
        with torch.no_grad():
            ctx.check(f"{variant} forward vs reference", weighted().float(), reference().float(), tol)
        _train_step(reference, trained, grad)()
        expected = [weight.grad.float().clone(), layer.fc.weight.grad.float().clone()]
        _train_step(weighted, trained, grad)()
        for name, ours, theirs in zip(("edge_weight", "fc.weight"), (weight.grad, layer.fc.weight.grad), expected):
            ctx.check(f"{variant} grad {name} vs reference", ours.float(), theirs, tol)
        floors = {flag: (attention_floor_bytes(graph, spec.heads, spec.head_dim, dtype, edge_factor=flag),
                         attention_floor_bytes(graph, spec.heads, spec.head_dim, dtype, True, edge_factor=flag))
                  for flag in (False, True)}
        rows = [("unfused torch (gnnfuse.reference)", reference, trained, True),
                ("fused (gnnfuse)", weighted, trained, True),
                ("fused (gnnfuse), no edge_weight", plain, list(layer.parameters()), False)]
        for impl, call, own, flag in rows:
            forward, step = floors[flag]
            ctx.time(impl, _forward(call), bytes_moved=forward, memory=True, params=params, variant=f"{variant},fwd")
            ctx.time(impl, _train_step(call, own, grad), bytes_moved=step, memory=True, params=params,
                     variant=f"{variant},fwd+bwd")
            if impl.startswith("fused"):
                _time_replayed(ctx, f"{impl}, CUDA graph", _forward(call), forward, params, f"{variant},fwd")
                _time_replayed(ctx, f"{impl}, CUDA graph", _train_step(call, own, grad), step, params,
                               f"{variant},fwd+bwd")


def _tiles(tile_elements: int, warps: int) -> tuple[str, ScheduleOptions]:
    return f"tiles {tile_elements}, {warps} warps", ScheduleOptions(tile_elements=tile_elements, num_warps=warps)


# (label, ScheduleOptions): the GPU default first, then the candidates of the A/B.
TILE_VARIANTS = (_tiles(4096, 4), _tiles(4096, 8), _tiles(8192, 8), _tiles(8192, 4), _tiles(2048, 4))
ROWS_ONLY = ("row kernel only (no light tiles)", ScheduleOptions(light_max_degree=-1))
LANES = ("state per edge lane", ScheduleOptions(edge_lanes=True))
DEFAULT = ("default schedule", None)
LANES_8_WARPS = ("state per edge lane, 8 warps", ScheduleOptions(edge_lanes=True, num_warps=8))


def _attention_ops(spec: GraphSpec, n: int, graph: Graph, dtype: torch.dtype, gen: torch.Generator, names):
    """{name: (call(schedule) -> out, leaves)} of the fused attention ops on random projections of
    ``spec``'s shape (no layer, no GEMM: the part the schedule changes)."""
    heads, dim, device = spec.heads, spec.head_dim, graph.device

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)

    a, b, c = rand(n, heads, dim), rand(n, heads, dim), rand(n, heads, dim)
    vec_l, vec_r = rand(1, heads, dim), rand(1, heads, dim)
    table = {
        "gat": (lambda s: ops.gat(graph, a, vec_l, vec_r, schedule=s), [a, vec_l, vec_r]),
        "gatv2": (lambda s: ops.gatv2(graph, a, b, vec_l, schedule=s), [a, b, vec_l]),
        "transformer": (lambda s: ops.transformer_attention(graph, a, b, c, schedule=s), [a, b, c]),
    }
    if "transformer+edge" in names:  # E x 16 random features take seconds to draw at Reddit scale
        attr, weight = rand(graph.num_edges, TRANSFORMER_EDGE_DIM).detach(), rand(heads * dim, TRANSFORMER_EDGE_DIM)
        table["transformer+edge"] = (lambda s: ops.transformer_attention(graph, a, b, c, attr, weight, schedule=s),
                                     [a, b, c, weight])
    return {name: table[name] for name in names}


def _tile_runs(ctx: Context, spec: GraphSpec, names: tuple[str, ...], dtypes, variants,
               train: tuple[str, ...] = ()) -> None:
    """Time each op's forward under each ``(label, ScheduleOptions)`` of ``variants`` (and its
    training step, edge features as data, under the labels in ``train``), checking each variant
    against the default schedule."""
    edges, n = _edges(spec.name, ctx.device)
    graph = Graph(edges, n)
    gen = torch.Generator().manual_seed(4)
    variants = variants[:2] if ctx.quick else variants
    for dtype in dtypes:
        tag = "fp32" if dtype == torch.float32 else "bf16"
        for name, (call, leaves) in _attention_ops(spec, n, graph, dtype, gen, names).items():
            gathered = 2 if name.startswith("transformer") else 1
            edge_elements = TRANSFORMER_EDGE_DIM if name == "transformer+edge" else 0
            floors = [attention_floor_bytes(graph, spec.heads, spec.head_dim, dtype, phase, gathered=gathered,
                                            edge_elements=edge_elements) for phase in (False, True)]
            grad = torch.randn(n, spec.heads, spec.head_dim, generator=gen).to(device=ctx.device, dtype=dtype)
            params = {"graph": spec.name, "op": name, "dtype": tag}
            with torch.no_grad():
                expected = call(None).float()
            for label, schedule in variants:
                with torch.no_grad():
                    ctx.check(f"{spec.name} {name} {tag} {label}", call(schedule).float(), expected,
                              2e-3 if dtype == torch.float32 else 2e-2)
                ctx.time(label, _forward(lambda s=schedule: call(s)), bytes_moved=floors[0], params=params,
                         variant=f"{spec.name},{name},{tag},fwd")
                if label in train:
                    ctx.time(label, _train_step(lambda s=schedule: call(s), leaves, grad), bytes_moved=floors[1],
                             params=params, variant=f"{spec.name},{name},{tag},fwd+bwd")
            if ctx.gpu:
                torch.cuda.empty_cache()


@case("gnn", "tiles_reddit", baseline="tiles 4096, 4 warps", headline=False)
def tiles_reddit_case(ctx: Context) -> None:
    """A/B of the forward row kernel's online-softmax form, tile size and warps per program: GAT
    attention forward at Reddit scale, fp32 and bf16 (why bf16 is not faster than fp32 there)."""
    spec = QUICK[0] if ctx.quick else next(s for s in FULL if s.name == "reddit-scale")
    dtypes = [torch.float32] if ctx.quick else [torch.float32, torch.bfloat16]
    _tile_runs(ctx, spec, ("gat",), dtypes, (TILE_VARIANTS[0], LANES, LANES_8_WARPS, *TILE_VARIANTS[1:]))


@case("gnn", "tiles_arxiv", baseline="tiles 4096, 4 warps", headline=False)
def tiles_arxiv_case(ctx: Context) -> None:
    """A/B on the arxiv-like graph: the row kernel's online-softmax form, tile size and warps per
    program, and every row in the row kernel (no light tiles), for the attention forward of GAT,
    GATv2 and the Graph Transformer in fp32 (GAT also bf16); forward+backward of the default and
    the per-lane form, and of every variant of the Graph Transformer with edge features."""
    if ctx.quick:  # the interpreter smoke run: one op, two variants
        _tile_runs(ctx, QUICK[0], ("transformer+edge",), [torch.float32], (TILE_VARIANTS[0], LANES))
        return
    # Each variant compiles every width class of every op: few variants keep it near two minutes.
    spec = next(s for s in FULL if s.name == "arxiv-like")
    variants = (TILE_VARIANTS[0], LANES, *TILE_VARIANTS[1:3], ROWS_ONLY)
    lanes_ab = (TILE_VARIANTS[0][0], LANES[0])
    _tile_runs(ctx, spec, ("gat", "gatv2", "transformer"), [torch.float32], variants, train=lanes_ab)
    _tile_runs(ctx, spec, ("gat",), [torch.bfloat16], (TILE_VARIANTS[0], LANES, *TILE_VARIANTS[1:3]))
    edge_variants = (TILE_VARIANTS[0], LANES, TILE_VARIANTS[1], ROWS_ONLY)
    _tile_runs(ctx, spec, ("transformer+edge",), [torch.float32], edge_variants,
               train=tuple(label for label, _ in edge_variants))


FEWER_WARPS = (_tiles(4096, 2), _tiles(2048, 2), TILE_VARIANTS[4])  # TILE_VARIANTS[4]: 2048, 4 warps


@case("gnn", "warps_arxiv_bf16", baseline="tiles 4096, 4 warps", headline=False)
def warps_arxiv_bf16_case(ctx: Context) -> None:
    """A/B of fewer threads per program for the latency-bound bf16 forward on the arxiv-like graph
    (the 3x-compiled-PyG forward needs its GPU time from 0.32 to <= 0.29 ms): the GAT attention op
    under 2 warps per program (4096- and 2048-element tiles) and 2048-element tiles with 4 warps
    against the default, forward and forward+backward, as called and replayed as a CUDA graph."""
    spec, edges, n, graph = _arxiv_like(ctx)
    dtype = torch.float32 if ctx.quick else torch.bfloat16
    gen = torch.Generator().manual_seed(4)
    call, leaves = _attention_ops(spec, n, graph, dtype, gen, ("gat",))["gat"]
    floors = [gat_floor_bytes(graph, spec.heads, spec.head_dim, dtype, phase) for phase in (False, True)]
    grad = torch.randn(n, spec.heads, spec.head_dim, generator=gen).to(device=ctx.device, dtype=dtype)
    tag = "fp32" if dtype == torch.float32 else "bf16"
    params = {"graph": spec.name, "op": "gat", "dtype": tag}
    with torch.no_grad():
        expected = call(None).float()
    variants = (TILE_VARIANTS[0], *FEWER_WARPS)
    for label, schedule in variants[:2] if ctx.quick else variants:
        with torch.no_grad():
            ctx.check(f"{spec.name} gat {tag} {label}", call(schedule).float(), expected,
                      2e-3 if dtype == torch.float32 else 2e-2)
        phases = (("fwd", _forward(lambda s=schedule: call(s)), floors[0]),
                  ("fwd+bwd", _train_step(lambda s=schedule: call(s), leaves, grad), floors[1]))
        for phase, run, floor in phases:
            ctx.time(label, run, bytes_moved=floor, params=params, variant=f"{tag},{phase}")
            _time_replayed(ctx, label + REPLAYED, run, floor, params, f"{tag},{phase}")


@case("gnn", "lanes_gatv2", baseline="default schedule", headline=False)
def lanes_gatv2_case(ctx: Context) -> None:
    """A/B of the per-edge-lane online softmax in GATv2's forward row kernel at Reddit scale, where
    the row kernel dominates, bf16 and fp32 (measured in session 4 on the H200: 1.57x in bf16, 0.96x
    in fp32, so it became GATv2's bf16 default; "default schedule" is now the per-lane form in bf16)."""
    spec = QUICK[0] if ctx.quick else next(s for s in FULL if s.name == "reddit-scale")
    dtypes = [torch.float32] if ctx.quick else [torch.bfloat16, torch.float32]
    _tile_runs(ctx, spec, ("gatv2",), dtypes, (DEFAULT, LANES))


@case("gnn", "lanes_backward", baseline="default schedule", headline=False)
def lanes_backward_case(ctx: Context) -> None:
    """A/B of the backward row kernels' per-edge-lane sums (``ScheduleOptions(edge_lanes=True)``:
    both passes per lane) against the default (per-lane forward only, for GAT and the dot score):
    training step of the GAT and Graph Transformer attention on the arxiv-like graph, fp32."""
    spec = QUICK[0] if ctx.quick else next(s for s in FULL if s.name == "arxiv-like")
    names = ("gat",) if ctx.quick else ("gat", "transformer")
    _tile_runs(ctx, spec, names, [torch.float32], (DEFAULT, LANES), train=(DEFAULT[0], LANES[0]))


LAUNCH_REP_MS = 200.0  # the as-called rows of arxiv_launch are host-bound at times: more samples, a stable median
LIGHT_WIDTHS = ("light widths 4, 16", ScheduleOptions(light_widths=(4, 16)))
LIGHT_ONE_WIDTH = ("light width 16 only", ScheduleOptions(light_widths=(16,)))
LIGHT_UP_TO_64 = ("light rows up to degree 64", ScheduleOptions(light_max_degree=64))
LIGHT_FEW_UP_TO_64 = ("light widths 4, 16, 64", ScheduleOptions(light_max_degree=64, light_widths=(4, 16, 64)))
REPLAYED = ", CUDA graph"


@dataclass
class LaunchSetup:
    """The GATConv layer, inputs and floors of one dtype on the arxiv-like graph (arxiv_launch cases)."""

    spec: GraphSpec
    graph: Graph
    layer: GATConv
    x: torch.Tensor
    grad: torch.Tensor
    floors: list[int]
    params: dict


def _launch_setup(ctx: Context, dtype: torch.dtype) -> LaunchSetup:
    """Layer and inputs of one dtype, its forward checked against the unfused reference."""
    if ctx.gpu:
        ctx.rep_ms = LAUNCH_REP_MS
    spec, edges, n, graph = _arxiv_like(ctx)
    gen = torch.Generator().manual_seed(5)
    tag = "fp32" if dtype == torch.float32 else "bf16"
    torch.manual_seed(0)
    layer = GATConv(spec.in_feats, spec.head_dim, spec.heads).to(device=ctx.device, dtype=dtype)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(layer.bias.shape))
    x = torch.randn(n, spec.in_feats, generator=gen).to(device=ctx.device, dtype=dtype)
    grad = torch.randn(n, spec.heads, spec.head_dim, generator=gen).to(device=ctx.device, dtype=dtype)
    with torch.no_grad():
        fused = layer(graph, x).float()
        with use_reference():
            ctx.check(f"{tag} layer forward vs reference", fused, layer(graph, x).float(),
                      2e-3 if dtype == torch.float32 else 2e-2)
    floors = [gat_floor_bytes(graph, spec.heads, spec.head_dim, dtype, phase) for phase in (False, True)]
    params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "dtype": tag}
    return LaunchSetup(spec, graph, layer, x, grad, floors, params)


def _layer_phases(setup: LaunchSetup, train: bool) -> list[tuple[str, Callable, int]]:
    layer, graph, x = setup.layer, setup.graph, setup.x
    phases = [("fwd", _forward(lambda: layer(graph, x)), setup.floors[0])]
    if train:
        phases.append(("fwd+bwd", _train_step(lambda: layer(graph, x), list(layer.parameters()), setup.grad),
                       setup.floors[1]))
    return phases


def _launch_rows(ctx: Context, dtype: torch.dtype, train: bool) -> None:
    """The layer as called and replayed, then the attention-op candidates; a failing candidate
    does not stop the others (failures reported at the end)."""
    setup = _launch_setup(ctx, dtype)
    tag = setup.params["dtype"]
    for phase, run, floor in _layer_phases(setup, train):
        ctx.time(DEFAULT[0], run, bytes_moved=floor, params=setup.params, variant=f"layer,{tag},{phase}")
        _time_replayed(ctx, DEFAULT[0] + REPLAYED, run, floor, setup.params, f"layer,{tag},{phase}")
    failures = _launch_variants(ctx, setup, dtype, train)
    if ctx.gpu:
        torch.cuda.empty_cache()
    if failures:
        raise CheckFailed("; ".join(failures))


# Three cases (all run by --case arxiv_launch, in this order: bf16 candidates, the compiled baseline,
# fp32), so a time limit hit late costs only the last one's rows (a case's table is printed when it ends).
@case("gnn", "arxiv_launch_bf16", baseline="default schedule", headline=False)
def arxiv_launch_bf16_case(ctx: Context) -> None:
    """Host work against GPU time on the arxiv-like graph, bf16: is the fused GAT bound by its launches?

    Rows ``layer,bf16,<phase>``: the fused GATConv as called ("default schedule": host work and
    GPU work overlapped as in use) and replayed as a CUDA graph (GPU time alone), forward and
    forward+backward.  Rows ``op,bf16,<phase>``: the attention op alone (``ops.gat`` with the bias
    added in its store, as the layer's inference forward does) under the default schedule and
    candidates with fewer launches or larger tiles (``light_widths=(4, 16)`` and ``(16,)``: two or
    one light launches per pass instead of five, more masked edge slots; ``light_max_degree=64``:
    rows of degree 17-64 in one-row light tiles instead of the row kernel, whose per-lane state
    takes ~200 registers, 2 programs per SM; both together; ``tile_elements=8192``: the same
    bytes per bf16 tile as an fp32 one), each as called and replayed.  Timing budget 200 ms per
    row as called (host jitter), 25 ms replayed (ten replays of a graph of that many calls).
    Quick mode: fp32 on the tiny graph."""
    _launch_rows(ctx, torch.float32 if ctx.quick else torch.bfloat16, train=True)


@case("gnn", "arxiv_launch_compiled", baseline="default schedule", headline=False)
def arxiv_launch_compiled_case(ctx: Context) -> None:
    """The bf16 target's baseline in the same run: PyG GATConv under torch.compile in bf16 on the
    arxiv-like graph, forward and forward+backward, beside the fused layer as called (quick mode:
    PyG eager in fp32 on the tiny graph, no torch.compile)."""
    dtype = torch.float32 if ctx.quick else torch.bfloat16
    setup = _launch_setup(ctx, dtype)
    pyg = _pyg_twin(setup.layer, setup.spec, dtype, ctx.device)
    label = "PyG GATConv eager" if ctx.quick else "PyG GATConv torch.compile"
    if not ctx.quick:
        pyg = torch.compile(pyg, dynamic=False)
    x, edges, n, tag = setup.x, setup.graph.edge_index, setup.graph.num_nodes, setup.params["dtype"]
    compiled = (("fwd", _forward(lambda: pyg(x, edges)), setup.floors[0]),
                ("fwd+bwd", _train_step(lambda: pyg(x, edges), list(pyg.parameters()), setup.grad.reshape(n, -1)),
                 setup.floors[1]))
    for (phase, run, floor), (_, fused, _) in zip(compiled, _layer_phases(setup, train=True)):
        ctx.time(DEFAULT[0], fused, bytes_moved=floor, params=setup.params, variant=f"layer,{tag},{phase}")
        ctx.time(label, run, bytes_moved=floor, params=setup.params, variant=f"layer,{tag},{phase}")


@case("gnn", "arxiv_launch_fp32", baseline="default schedule", headline=False)
def arxiv_launch_fp32_case(ctx: Context) -> None:
    """As ``arxiv_launch_bf16`` in fp32, forward only, with the candidates that need no new
    compiled specialisation (the light-width ones)."""
    _launch_rows(ctx, torch.float32, train=False)


@case("gnn", "layer_host", baseline="layer (fc, then ops.gat)", headline=False)
def layer_host_case(ctx: Context) -> None:
    """Host work of the GATConv call, arxiv-like, bf16 and fp32: the layer (``fc`` as its own module,
    a view, then ``ops.gat``) against the opt-in one-autograd-node form of the same call
    (``ops.gat(graph, x, attn_l, attn_r, weight=fc.weight)``: the projection inside the op's node, four
    autograd nodes fewer per training step), forward and forward+backward, as called and replayed as
    a CUDA graph (the GPU work is the same; only the host's differs).  Quick mode: fp32, tiny graph."""
    for dtype in [torch.float32] if ctx.quick else [torch.bfloat16, torch.float32]:
        setup = _launch_setup(ctx, dtype)
        layer, graph, x, tag = setup.layer, setup.graph, setup.x, setup.params["dtype"]

        def one_node():
            return ops.gat(graph, x, layer.attn_l, layer.attn_r, out_add=layer.bias, weight=layer.fc.weight)

        with torch.no_grad():
            ctx.check(f"{tag} one-node call vs layer", one_node().float(), layer(graph, x).float(),
                      2e-3 if dtype == torch.float32 else 2e-2)
        params = list(layer.parameters())
        for label, call in (("layer (fc, then ops.gat)", lambda: layer(graph, x)),
                            ("ops.gat with weight (one autograd node)", one_node)):
            phases = (("fwd", _forward(call), setup.floors[0]),
                      ("fwd+bwd", _train_step(call, params, setup.grad), setup.floors[1]))
            for phase, run, floor in phases:
                ctx.time(label, run, bytes_moved=floor, params=setup.params, variant=f"{tag},{phase}")
                _time_replayed(ctx, label + REPLAYED, run, floor, setup.params, f"{tag},{phase}")


def _launch_variants(ctx: Context, setup: LaunchSetup, dtype: torch.dtype, train: bool) -> list[str]:
    """The attention-op rows of the arxiv_launch cases: default schedule and candidates, each as
    called and replayed (with ``train`` also forward+backward); returns the failures of
    candidates, each failing alone so the others are still measured."""
    spec, layer, graph, params, floors = setup.spec, setup.layer, setup.graph, setup.params, setup.floors
    tag = params["dtype"]
    n = graph.num_nodes
    wh = layer.fc(setup.x).detach().view(n, spec.heads, spec.head_dim).requires_grad_(True)
    leaves = [wh, layer.attn_l, layer.attn_r, layer.bias]

    def call(schedule):
        return ops.gat(graph, wh, layer.attn_l, layer.attn_r, schedule=schedule, out_add=layer.bias)

    with torch.no_grad():
        expected = call(None).float()
    # (variant, also forward+backward): fp32 only the launch-count candidates (no new compiles);
    # every compiled specialisation costs GPU time, so the rest in bf16 only.
    variants = [(DEFAULT, train), (LIGHT_WIDTHS, train), (LIGHT_ONE_WIDTH, train)]
    if dtype == torch.bfloat16:
        variants += [(LIGHT_UP_TO_64, train), (LIGHT_FEW_UP_TO_64, False), (TILE_VARIANTS[3], False)]  # tiles 8192
    if ctx.quick:  # the interpreter smoke run: two variants
        variants = variants[:2]
    failures = []
    for (label, schedule), train in variants:
        try:
            with torch.no_grad():
                ctx.check(f"{tag} op {label}", call(schedule).float(), expected,
                          2e-3 if dtype == torch.float32 else 2e-2)
            phases = [("fwd", _forward(lambda s=schedule: call(s)), floors[0])]
            if train:
                phases.append(("fwd+bwd", _train_step(lambda s=schedule: call(s), leaves, setup.grad), floors[1]))
            for phase, run, floor in phases:
                ctx.time(label, run, bytes_moved=floor, params=params, variant=f"op,{tag},{phase}")
                _time_replayed(ctx, label + REPLAYED, run, floor, params, f"op,{tag},{phase}")
        except Exception as exc:  # noqa: BLE001 - keep measuring the other candidates, fail at the end
            failures.append(f"{tag} op {label}: {type(exc).__name__}: {exc}")
    return failures


# gnnfuse.capture rows: (family, dtypes, also compiled PyG captured the same way).  GATConv only: in
# session 6's first calls (H200) GATv2 bf16 and the Graph Transformer were within 0-15% captured
# (GPU-bound), so they are not timed again; compiled PyG (~25 s of compile each) in bf16, the target row.
CAPTURED_LAYERS = ((GAT, torch.bfloat16, True), (GAT, torch.float32, False))


class _PygCall(torch.nn.Module):
    """``pyg(x, edge_index)`` with the edges fixed, as a module of one tensor input (what
    ``torch.cuda.make_graphed_callables`` takes); ``call`` is the torch.compile'd layer."""

    def __init__(self, pyg: torch.nn.Module, call: Callable, edges: torch.Tensor) -> None:
        super().__init__()
        self.pyg = pyg
        self.__dict__["call"] = call  # the compiled wrapper of self.pyg: its parameters are pyg's
        self.edges = edges

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(x, self.edges)


@case("gnn", "captured", baseline="fused (gnnfuse)", headline=False)
def captured_case(ctx: Context) -> None:
    """Full-graph training on a fixed graph with ``gnnfuse.capture`` (forward and backward replayed
    from CUDA graphs, as a user calls it: inputs copied in, output copied out, parameter gradients
    accumulated by autograd) beside the same layer as called, arxiv-like GATConv, forward and
    forward+backward; the captured output is checked against the layer's.  Like for like in bf16:
    PyG GATConv under torch.compile as called and captured the same way
    (``torch.cuda.make_graphed_callables`` with the edges fixed), and both replayed as one CUDA
    graph per call (GPU time); a capture PyG does not allow is reported as the finding instead of
    its rows.  Reported apart from the default rows (opt-in).  CUDA graphs need a GPU: on the CPU
    (quick mode) the case's smoke rows are GATConv as called against the unfused reference on the
    tiny graph."""
    if not ctx.gpu:
        _captured_smoke_rows(ctx)
        return
    spec = next(s for s in FULL if s.name == "arxiv-like")
    edges, n = _edges(spec.name, ctx.device)
    graph = Graph(edges, n)
    gen = torch.Generator().manual_seed(7)
    failures = []
    for family, dtype, with_pyg in CAPTURED_LAYERS:
        tag = "fp32" if dtype == torch.float32 else "bf16"
        try:
            torch.manual_seed(0)
            layer = family.build(spec).to(device=ctx.device, dtype=dtype)
            x = torch.randn(n, spec.in_feats, generator=gen).to(device=ctx.device, dtype=dtype)
            captured = capture(layer, graph, x)
            with torch.no_grad():
                want = layer(graph, x).float()
                ctx.check(f"{family.label} {tag} captured vs as called", captured(x).float(), want,
                          2e-3 if dtype == torch.float32 else 2e-2)
            grad = torch.randn(want.shape, generator=gen).to(device=ctx.device, dtype=dtype)
            floors = [family.floor(graph, spec, dtype, phase) for phase in (False, True)]
            params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "dtype": tag}
            calls = [("fused (gnnfuse)", lambda: layer(graph, x), list(layer.parameters()), grad),
                     ("fused, gnnfuse.capture", lambda: captured(x), list(layer.parameters()), grad)]
            if with_pyg:
                calls += _captured_pyg_calls(family, layer, spec, edges, x, grad.reshape(n, -1))
            for impl, call, leaves, call_grad in calls:
                for phase, run, floor in (("fwd", _forward(call), floors[0]),
                                          ("fwd+bwd", _train_step(call, leaves, call_grad), floors[1])):
                    variant = f"{family.label},{tag},{phase}"
                    ctx.time(impl, run, bytes_moved=floor, params=params, variant=variant)
                    if impl in ("fused (gnnfuse)", f"PyG {family.label} torch.compile"):
                        _time_replayed(ctx, impl + REPLAYED, run, floor, params, variant)
        except Exception as exc:  # noqa: BLE001 - keep measuring the other layers, fail at the end
            failures.append(f"{family.label} {tag}: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()
    if failures:
        raise CheckFailed("; ".join(failures))


def _captured_pyg_calls(family: LayerFamily, layer: torch.nn.Module, spec: GraphSpec, edges: torch.Tensor,
                        x: torch.Tensor, grad: torch.Tensor) -> list[tuple]:
    """(impl, call, leaves, grad) of compiled PyG as called and captured like ``gnnfuse.capture``
    (its parameters, outputs ``[N, H·D]``); the capture's failure is printed as the finding."""
    pyg = family.twin(layer, spec).to(device=x.device, dtype=x.dtype)
    compiled = torch.compile(pyg, dynamic=False)
    label = f"PyG {family.label} torch.compile"
    leaves = list(pyg.parameters())
    calls = [(label, lambda: compiled(x, edges), leaves, grad)]
    try:
        graphed = torch.cuda.make_graphed_callables(_PygCall(pyg, compiled, edges), (x,), allow_unused_input=True)
        calls.append((label + ", captured", lambda: graphed(x).clone(), leaves, grad))
    except Exception as exc:  # noqa: BLE001 - a capture PyG does not allow is the finding
        print(f"[gnn] captured: {label} could not be captured: {type(exc).__name__}: {exc}")
    return calls


def _captured_smoke_rows(ctx: Context) -> None:
    spec = QUICK[0]
    edges, n = _edges(spec.name, ctx.device)
    graph = Graph(edges, n)
    layer = GAT.build(spec).to(ctx.device)
    x = torch.randn(n, spec.in_feats, generator=torch.Generator().manual_seed(7)).to(ctx.device)
    params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "dtype": "fp32"}

    def reference():
        with use_reference():
            return layer(graph, x)

    for impl, call in (("fused (gnnfuse)", lambda: layer(graph, x)), ("unfused torch (gnnfuse.reference)", reference)):
        ctx.time(impl, _forward(call), params=params, variant="GATConv,fp32,fwd")


def _pyg_drop_in_runs(ctx: Context, name: str, checked: str) -> None:
    """The PyG drop-in ``gnnfuse.pyg.<name>`` against ``torch_geometric.nn.<name>`` holding the same state_dict
    (eager and under ``torch.compile``), called as PyG's layer is, ``conv(x, edge_index[, edge_attr])`` with PyG's
    defaults (``add_self_loops=True``: PyG removes and re-adds the self loops on every call, the drop-in once per
    edge tensor); without edge features and with ``edge_dim=16``.  Forward and training step (every parameter's
    and the edge features' gradients), as called and replayed as CUDA graphs, arxiv-like, fp32 and bf16.  Floors:
    :func:`gnnfuse.ops.attention_floor_bytes` with the raw edge features read per edge.  Checked against PyG in
    fp32: the output and ``checked``'s and (with edge features) ``edge_attr``'s gradients."""
    import torch_geometric

    from gnnfuse import pyg as fused_pyg

    spec, edges, n, graph = _arxiv_like(ctx)
    gen = torch.Generator().manual_seed(11)
    for dtype in [torch.float32] if ctx.quick else [torch.float32, torch.bfloat16]:
        tag = "fp32" if dtype == torch.float32 else "bf16"
        for edge_dim in (None, 16):
            torch.manual_seed(0)
            kwargs = dict(heads=spec.heads, edge_dim=edge_dim)
            layer = getattr(fused_pyg, name)(spec.in_feats, spec.head_dim, **kwargs)
            with torch.no_grad():
                layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen))
            pyg = getattr(torch_geometric.nn, name)(spec.in_feats, spec.head_dim, **kwargs)
            pyg.load_state_dict(layer.state_dict())
            layer, pyg = (m.to(device=ctx.device, dtype=dtype) for m in (layer, pyg))
            x = torch.randn(n, spec.in_feats, generator=gen).to(device=ctx.device, dtype=dtype)
            extra = ()
            if edge_dim is not None:
                extra = (torch.randn(graph.num_edges, edge_dim, generator=gen).to(device=ctx.device, dtype=dtype)
                         .requires_grad_(True),)
            grad = torch.randn(n, spec.heads * spec.head_dim, generator=gen).to(device=ctx.device, dtype=dtype)
            params = {"graph": spec.name, "nodes": n, "edges": graph.num_edges, "in_feats": spec.in_feats,
                      "heads": spec.heads, "head_dim": spec.head_dim, "dtype": tag, "edge_dim": edge_dim}
            variant = f"{spec.name},{tag}" + ("" if edge_dim is None else f",edge_dim={edge_dim}")
            rows = [(f"PyG {name} eager", lambda: pyg(x, edges, *extra), [*pyg.parameters(), *extra])]
            if ctx.gpu and not ctx.quick:
                torch._dynamo.reset()  # see _layer_runs: each variant compiles afresh
                compiled = torch.compile(pyg, dynamic=False)
                try:
                    with torch.no_grad():
                        compiled(x, edges, *extra)
                    _train_step(lambda: compiled(x, edges, *extra), [*pyg.parameters(), *extra], grad)()
                    rows.append((f"PyG {name} torch.compile", lambda: compiled(x, edges, *extra),
                                 [*pyg.parameters(), *extra]))
                except Exception as exc:  # noqa: BLE001 - report and keep the other rows
                    print(f"[gnn] torch.compile of PyG {name} failed on {variant}: {type(exc).__name__}: {exc}")
            trained = [*layer.parameters(), *extra]
            rows.append(("fused (gnnfuse.pyg)", lambda: layer(x, edges, *extra), trained))
            if dtype == torch.float32:
                with torch.no_grad():
                    ctx.check(f"{variant} forward vs PyG", layer(x, edges, *extra).float(),
                              pyg(x, edges, *extra).float(), 2e-3)
                _train_step(rows[0][1], rows[0][2], grad)()
                expected = [t.grad.float().clone() for t in [pyg.get_parameter(checked), *extra]]
                _train_step(rows[-1][1], trained, grad)()
                for what, ours, theirs in zip((checked, "edge_attr"), [layer.get_parameter(checked), *extra],
                                              expected):
                    ctx.check(f"{variant} grad {what} vs PyG", ours.grad.float(), theirs, 2e-3)
            edge_elements = edge_dim or 0
            forward = attention_floor_bytes(graph, spec.heads, spec.head_dim, dtype, edge_elements=edge_elements)
            step = attention_floor_bytes(graph, spec.heads, spec.head_dim, dtype, True, edge_elements=edge_elements)
            for impl, call, own in rows:
                ctx.time(impl, _forward(call), bytes_moved=forward, memory=True, params=params,
                         variant=f"{variant},fwd")
                ctx.time(impl, _train_step(call, own, grad), bytes_moved=step, memory=True, params=params,
                         variant=f"{variant},fwd+bwd")
            _time_replayed(ctx, "fused (gnnfuse.pyg), CUDA graph", _forward(rows[-1][1]), forward, params,
                           f"{variant},fwd")
            _time_replayed(ctx, "fused (gnnfuse.pyg), CUDA graph", _train_step(rows[-1][1], trained, grad), step,
                           params, f"{variant},fwd+bwd")
            if ctx.gpu:
                torch.cuda.empty_cache()


@case("gnn", "pyg_gatconv", baseline="PyG GATConv eager", headline=False)
def pyg_gatconv_case(ctx: Context) -> None:
    """:class:`gnnfuse.pyg.GATConv` against PyG's GATConv (:func:`_pyg_drop_in_runs`): with ``edge_dim=16`` PyG
    projects the edge features to ``[E, H·C]``, the drop-in folds ``lin_edge`` and ``att_edge`` to one score per
    edge and head."""
    _pyg_drop_in_runs(ctx, "GATConv", "lin.weight")


@case("gnn", "pyg_gatv2conv", baseline="PyG GATv2Conv eager", headline=False)
def pyg_gatv2conv_case(ctx: Context) -> None:
    """:class:`gnnfuse.pyg.GATv2Conv` against PyG's GATv2Conv (:func:`_pyg_drop_in_runs`): with ``edge_dim=16``
    PyG forms ``x_i + x_j + lin_edge(e)`` as an ``[E, H, C]`` tensor; the drop-in projects each edge's features
    inside the attention kernels, in registers."""
    _pyg_drop_in_runs(ctx, "GATv2Conv", "lin_l.weight")
