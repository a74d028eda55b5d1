"""Attention weights handed back by the fused ops and layers (DGL's ``get_attention``, PyG's
``return_attention_weights``), against an oracle written here and against PyG's layers.

The oracle forms every score from the inputs in float64 (``[E, H, D]`` edge vectors and all), takes the
softmax over each destination's incoming edges with ``scatter_reduce`` / ``index_add`` (nothing of
gnnfuse.reference), and keeps the caller's edge order.  The weights come from one pass after the fused
forward (``gnnfuse.ops.attention_weights``), so the tests also check that asking for them leaves the
forward's output and gradients unchanged, and that the dropout they carry is the forward's own.

The kernels take their scalar arguments (LeakyReLU slope, score scale, dropout probability and keep scale)
as float32 on the GPU, so the float64 checks use values float32 holds exactly — slope 0.25, head size 4
(scale 1/2), dropout 0.5 — and hold at float64's tolerance compiled as well as interpreted.
"""

from __future__ import annotations

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges, planetoid, poison_op_outputs

from fusecore import DevicePhiloxStream, PhiloxStream, use_reference
from fusecore.testing import TOLERANCES, assert_all_written, assert_close
from gnnfuse import Graph, ops, reference
from gnnfuse.nn import GATConv, GATv2Conv, GraphTransformerConv

EDGE_DIM = 4
SLOPE = 0.25  # exact in float32 (the GPU's scalar arguments), as are the head size 4's scale 1/2 and dropout 0.5


def softmax_by_destination(scores: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """``[E, H]`` softmax of float64 ``scores`` over the edges of each destination (input order kept)."""
    index = dst[:, None].expand_as(scores)
    row_max = torch.full((num_nodes, scores.shape[1]), -torch.inf, dtype=scores.dtype)
    row_max = row_max.scatter_reduce(0, index, scores, "amax")
    exp = torch.exp(scores - row_max[dst])
    total = torch.zeros(num_nodes, scores.shape[1], dtype=scores.dtype).index_add(0, dst, exp)
    return exp / total[dst]


def _leaky(z, slope):
    return torch.where(z > 0, z, z * slope)


def oracle_scores(kind: str, src, dst, leaves: list[torch.Tensor]) -> torch.Tensor:
    """Float64 ``[E, H]`` scores of op ``kind`` per input edge ``src -> dst``."""
    x = [t.double().cpu() for t in leaves]
    if kind == "gat":
        wh, el, er = x
        return _leaky(el[src] + er[dst], SLOPE)
    if kind == "gat+projection":
        feat, weight, attn_l, attn_r = x
        wh = (feat @ weight.t()).view(feat.shape[0], attn_l.shape[-2], attn_l.shape[-1])
        return _leaky((wh * attn_l).sum(-1)[src] + (wh * attn_r).sum(-1)[dst], SLOPE)
    if kind == "gatv2":
        fs, fd, attn = x
        return (_leaky(fs[src] + fd[dst], SLOPE) * attn).sum(-1)
    if kind.startswith("transformer"):
        q, k = x[0], x[1]
        keys = k[src]
        if kind == "transformer+edge":
            attr, weight = x[3], x[4]
            keys = keys + (attr @ weight.t()).view(keys.shape)
        return (q[dst] * keys).sum(-1) / q.shape[-1] ** 0.5
    h, beta = x
    h = h if h.dim() == 3 else h.unsqueeze(1)
    unit = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return beta.reshape(()) * (unit[src] * unit[dst]).sum(-1)


def leaves_for(kind: str, num_nodes: int, num_edges: int, heads: int, dim: int, dtype, gen) -> list[torch.Tensor]:
    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    if kind == "gat":
        return [r(num_nodes, heads, dim), r(num_nodes, heads).to(torch.float32 if dtype != torch.float64 else dtype),
                r(num_nodes, heads).to(torch.float32 if dtype != torch.float64 else dtype)]
    if kind == "gat+projection":
        return [r(num_nodes, 16), r(heads * dim, 16) / 4, r(1, heads, dim), r(1, heads, dim)]
    if kind == "gatv2":
        return [r(num_nodes, heads, dim), r(num_nodes, heads, dim), r(1, heads, dim)]
    if kind == "transformer":
        return [r(num_nodes, heads, dim) for _ in range(3)]
    if kind == "transformer+edge":
        return [r(num_nodes, heads, dim) for _ in range(3)] + [r(num_edges, EDGE_DIM), r(heads * dim, EDGE_DIM) / 2]
    if kind == "agnn":
        return [r(num_nodes, dim), r(1).abs() + 0.5]
    return [r(num_nodes, heads, dim), r(1).abs() + 0.5]  # agnn per head


def run_op(kind: str, graph, leaves, **kw):
    if kind == "gat":
        return ops.gat_attention(graph, *leaves, negative_slope=SLOPE, **kw)
    if kind == "gat+projection":
        feat, weight, attn_l, attn_r = leaves
        return ops.gat(graph, feat, attn_l, attn_r, weight=weight, negative_slope=SLOPE, **kw)
    if kind == "gatv2":
        return ops.gatv2(graph, *leaves, negative_slope=SLOPE, **kw)
    if kind.startswith("transformer"):
        return ops.transformer_attention(graph, *leaves, **kw)
    kw.pop("attention_dropout", None)
    kw.pop("dropout", None)
    kw.pop("rng", None)
    return ops.agnn(graph, *leaves, **kw)


KINDS = ["gat", "gat+projection", "gatv2", "transformer", "transformer+edge", "agnn", "agnn-heads"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_weights_match_the_oracle_on_the_corner_case_graph(kind, dtype, gen, device, monkeypatch):
    """Super node, self loops, duplicate edges, isolated nodes; every weight written, rows summing to 1."""
    if dtype == torch.bfloat16 and kind == "gat+projection":
        pytest.skip("the projection's bf16 rounding is the projection tests' subject")
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    leaves = leaves_for(kind, num_nodes, edges.shape[1], heads, dim, dtype, gen)
    graph = Graph(edges.to(device), num_nodes)
    created = poison_op_outputs(monkeypatch)
    out, alpha = run_op(kind, graph, [t.to(device) for t in leaves], return_attention=True)
    assert_all_written(created[-1])
    value_dtype = dtype
    assert alpha.dtype == value_dtype and not alpha.requires_grad
    expected_heads = 1 if kind == "agnn" else heads
    assert tuple(alpha.shape) == (edges.shape[1], expected_heads)
    src, dst = edges[0], edges[1]
    expected = softmax_by_destination(oracle_scores(kind, src, dst, leaves), dst, num_nodes)
    assert_close(alpha.cpu(), expected, tol=TOLERANCES[dtype], name=f"{kind} attention weights")
    sums = torch.zeros(num_nodes, expected_heads, dtype=torch.float64).index_add(0, dst, alpha.double().cpu())
    has_edges = torch.bincount(dst, minlength=num_nodes) > 0
    assert_close(sums[has_edges], torch.ones_like(sums[has_edges]), tol=TOLERANCES[dtype], name="row sums")
    # asking for the weights leaves the forward's output as it is
    plain = run_op(kind, graph, [t.to(device) for t in leaves])
    assert torch.equal(out, plain)


@pytest.mark.parametrize("schedule", ["light", "super", "mixed"])
def test_weights_do_not_depend_on_the_schedule(schedule, gen, device):
    """The forward's lse comes from different kernels per schedule (pieces merged for super rows)."""
    num_nodes, heads, dim = 29, 2, 8
    edges = corner_case_edges(gen, num_nodes)
    leaves = leaves_for("transformer+edge", num_nodes, edges.shape[1], heads, dim, torch.float32, gen)
    graph = Graph(edges.to(device), num_nodes)
    _, alpha = run_op("transformer+edge", graph, [t.to(device) for t in leaves], return_attention=True,
                      schedule=SCHEDULES[schedule])
    expected = softmax_by_destination(oracle_scores("transformer+edge", edges[0], edges[1], leaves), edges[1],
                                      num_nodes)
    assert_close(alpha.cpu(), expected, tol=TOLERANCES[torch.float32], name=f"weights under '{schedule}'")


@pytest.mark.parametrize("kind", ["gat", "gatv2", "transformer+edge"])
def test_weights_carry_the_forwards_dropout(kind, gen, device):
    """``attention_dropout=True``: the softmax times the forward's keep mask / (1 − p), the mask being the
    one the aggregation used (the output equals the weights' sum over the messages); False: the softmax."""
    num_nodes, heads, dim, p = 29, 3, 4, 0.5
    edges = corner_case_edges(gen, num_nodes)
    leaves = [t.to(device) for t in leaves_for(kind, num_nodes, edges.shape[1], heads, dim, torch.float64, gen)]
    graph = Graph(edges.to(device), num_nodes)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    out, dropped = run_op(kind, graph, leaves, dropout=p, rng=PhiloxStream(seed), return_attention=True)
    same, softmax = run_op(kind, graph, leaves, dropout=p, rng=PhiloxStream(seed), return_attention=True,
                           attention_dropout=False)
    assert torch.equal(out, same)
    keep_csr = reference.dropout_keep_mask(graph, heads, p, seed, 0).cpu()
    keep = torch.empty_like(keep_csr)
    keep[graph.csr_eid.long().cpu()] = keep_csr
    assert_close(dropped.cpu(), torch.where(keep, softmax.cpu() / (1 - p), 0.0), tol=TOLERANCES[torch.float64],
                 name="dropped weights")
    assert 0 < int(keep.sum()) < keep.numel()
    # the output is Σ_j α_ij m_ij with the dropped weights: the mask is the forward's own
    if kind == "gat":
        messages = leaves[0].cpu()[edges[0]]
    elif kind == "gatv2":
        messages = leaves[0].cpu()[edges[0]]
    else:
        messages = leaves[2].cpu()[edges[0]] + (leaves[3].cpu() @ leaves[4].cpu().t()).view(-1, heads, dim)
    summed = torch.zeros(num_nodes, heads, dim, dtype=torch.float64).index_add(
        0, edges[1], dropped.cpu()[:, :, None] * messages)
    assert_close(out.cpu(), summed, tol=TOLERANCES[torch.float64], name="output from the dropped weights")


def test_weights_under_a_device_pair_are_the_host_pairs(gen, device):
    """Dropout drawn from a :class:`fusecore.DevicePhiloxStream` (the pair read on the device, as under CUDA-graph
    capture): the weights pass reads the same pair as the forward, so the weights equal a host stream's."""
    num_nodes, heads, dim = 29, 2, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    leaves = [t.to(device) for t in leaves_for("gatv2", num_nodes, edges.shape[1], heads, dim, torch.float64, gen)]
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    host = run_op("gatv2", graph, leaves, dropout=0.5, rng=PhiloxStream(seed), return_attention=True)
    on_device = run_op("gatv2", graph, leaves, dropout=0.5, rng=DevicePhiloxStream(seed, device=device),
                       return_attention=True)
    for ours, theirs in zip(on_device, host):
        assert torch.equal(ours, theirs)


def test_reference_path_returns_the_same_weights(gen, device):
    num_nodes, heads, dim = 29, 2, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    for kind in KINDS:
        leaves = [t.to(device) for t in leaves_for(kind, num_nodes, edges.shape[1], heads, dim, torch.float64, gen)]
        kw = {"dropout": 0.5, "rng": PhiloxStream(11), "return_attention": True}
        fused = run_op(kind, graph, leaves, **kw)
        with use_reference():
            oracle = run_op(kind, graph, leaves, **{**kw, "rng": PhiloxStream(11)})
        for ours, theirs, what in zip(fused, oracle, ("output", "weights")):
            assert_close(ours, theirs, tol=TOLERANCES[torch.float64], name=f"{kind} {what} against the reference path")


def test_training_with_weights_requested_keeps_the_gradients(gen, device):
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    leaves = [t.to(device) for t in leaves_for("gatv2", num_nodes, edges.shape[1], heads, dim, torch.float64, gen)]
    grads = []
    for ask in (False, True):
        inputs = [t.clone().requires_grad_(True) for t in leaves]
        result = ops.gatv2(graph, *inputs, negative_slope=SLOPE, dropout=0.5, rng=PhiloxStream(3), return_attention=ask)
        out = result[0] if ask else result
        if ask:
            assert not result[1].requires_grad
        out.backward(torch.ones_like(out))
        grads.append([t.grad for t in inputs])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_empty_and_edgeless_graphs(device):
    for num_nodes in (0, 5):
        graph = Graph(torch.zeros(2, 0, dtype=torch.int64, device=device), num_nodes)
        out, alpha = ops.transformer_attention(graph, *(torch.randn(num_nodes, 2, 3, device=device),) * 3,
                                               return_attention=True)
        assert tuple(alpha.shape) == (0, 2) and tuple(out.shape) == (num_nodes, 2, 3)


def test_bad_switches_are_refused(device):
    graph = Graph(torch.tensor([[0, 1], [1, 0]], device=device), 2)  # every node has an incoming edge
    x = torch.randn(2, 1, 4, device=device)
    with pytest.raises(TypeError, match="return_attention must be a bool"):
        ops.transformer_attention(graph, x, x, x, return_attention="yes")
    with pytest.raises(TypeError, match="attention_dropout must be a bool"):
        ops.gatv2(graph, x, x, torch.ones(1, 1, 4, device=device), return_attention=True, attention_dropout=None)
    layer = GATConv(4, 3, 2).to(device)
    with pytest.raises(TypeError, match="get_attention must be a bool"):
        layer(graph, torch.randn(2, 4, device=device), None, "yes")


def test_layers_return_dgl_and_pyg_shaped_weights(gen, device):
    data_edges = corner_case_edges(gen)
    graph = Graph(data_edges.to(device), 29)
    x = torch.randn(29, 6, generator=gen).to(device)
    for layer in (GATConv(6, 4, 3, allow_zero_in_degree=True),
                  GATv2Conv(6, 4, 3, share_weights=True, allow_zero_in_degree=True)):
        layer = layer.to(device).eval()
        out, attention = layer(graph, x, get_attention=True)
        assert tuple(attention.shape) == (data_edges.shape[1], 3, 1)
        assert torch.equal(out, layer(graph, x))
    conv = GraphTransformerConv(6, 4, heads=2).to(device).eval()
    edge_index = data_edges.to(device)
    out, (returned_index, alpha) = conv(edge_index, x, return_attention_weights=True)
    assert returned_index is edge_index and tuple(alpha.shape) == (data_edges.shape[1], 2)
    _, (from_graph, _) = conv(graph, x, return_attention_weights=True)
    assert torch.equal(from_graph.cpu(), data_edges)
    assert torch.equal(out, conv(edge_index, x))



@pytest.mark.parametrize("graph_name", ["corner", "cora"])
def test_gatconv_weights_match_pygs(graph_name, gen, device):
    """PyG's GATConv (weights copied, its default self loops) returns the same weights, edge for edge."""
    torch_geometric = pytest.importorskip("torch_geometric")
    if graph_name == "cora":
        data = planetoid("cora")
        x, edge_index = data.x, data.edge_index
    else:
        edge_index = corner_case_edges(gen)
        x = torch.randn(29, 11, generator=gen)
    layer = GATConv(x.shape[1], 5, 3, negative_slope=0.15).to(device)
    pyg = torch_geometric.nn.GATConv(x.shape[1], 5, heads=3, negative_slope=0.15)
    with torch.no_grad():
        pyg.lin.weight.copy_(layer.fc.weight)
        pyg.att_src.copy_(layer.attn_l)
        pyg.att_dst.copy_(layer.attn_r)
    pyg = pyg.double()
    graph = Graph(edge_index.to(device), x.shape[0]).remove_self_loops().add_self_loops()
    _, attention = layer(graph, x.to(device), get_attention=True)
    _, (pyg_index, pyg_alpha) = pyg(x.double(), edge_index, return_attention_weights=True)
    assert torch.equal(graph.edge_index.cpu(), pyg_index)
    assert_close(attention.squeeze(-1).cpu(), pyg_alpha, tol=TOLERANCES[torch.float32], name="GATConv weights")


def test_graph_transformer_weights_match_pygs(gen, device):
    """PyG's TransformerConv (its state_dict loaded) with edge features, in training: both return the
    softmax before dropout."""
    torch_geometric = pytest.importorskip("torch_geometric")
    edge_index = corner_case_edges(gen)
    x = torch.randn(29, 7, generator=gen)
    edge_attr = torch.randn(edge_index.shape[1], 3, generator=gen)
    pyg = torch_geometric.nn.TransformerConv(7, 4, heads=3, edge_dim=3, dropout=0.3)
    layer = GraphTransformerConv(7, 4, heads=3, edge_dim=3, dropout=0.3)
    layer.load_state_dict(pyg.state_dict(), strict=True)
    layer = layer.to(device)
    pyg = pyg.double()
    _, (index, alpha) = layer(edge_index.to(device), x.to(device), edge_attr.to(device),
                              return_attention_weights=True)
    _, (pyg_index, pyg_alpha) = pyg(x.double(), edge_index, edge_attr.double(), return_attention_weights=True)
    assert torch.equal(index.cpu(), pyg_index)
    assert_close(alpha.cpu(), pyg_alpha, tol=TOLERANCES[torch.float32], name="TransformerConv weights")
