"""gnnfuse.nn.GATConv against PyG's GATConv (weights copied) and DGL's parameter layout."""

import pytest
import torch
from gnn_testing import corner_case_edges, planetoid

from fusecore import use_reference
from fusecore.testing import TOLERANCES, assert_close, no_host_sync
from gnnfuse import Graph
from gnnfuse.nn import GATConv

torch_geometric = pytest.importorskip("torch_geometric")


def pyg_twin(layer: GATConv, heads: int, out_feats: int, in_feats: int):
    """PyG's GATConv with our weights; PyG's default self loops (remove, then add one per node)."""
    pyg = torch_geometric.nn.GATConv(in_feats, out_feats, heads=heads, negative_slope=layer.negative_slope)
    with torch.no_grad():
        pyg.lin.weight.copy_(layer.fc.weight)
        pyg.att_src.copy_(layer.attn_l)
        pyg.att_dst.copy_(layer.attn_r)
        pyg.bias.copy_(torch.randn(heads * out_feats))
        layer.bias.copy_(pyg.bias)
    return pyg.double()


def compare_with_pyg(layer, x, edge_index, device, gen):
    heads, out_feats = layer._num_heads, layer._out_feats
    pyg = pyg_twin(layer, heads, out_feats, x.shape[1])
    graph = Graph(edge_index.to(device), x.shape[0]).remove_self_loops().add_self_loops()
    x_dev = x.detach().clone().to(device).requires_grad_(True)
    out = layer(graph, x_dev)
    x64 = x.detach().double().requires_grad_(True)
    ref = pyg(x64, edge_index).view(-1, heads, out_feats)
    assert_close(out, ref, name="GATConv output")
    with torch.no_grad():  # inference: the bias is added in the kernel's store
        assert_close(layer(graph, x_dev), ref, name="GATConv output without autograd")
    grad = torch.randn(out.shape, generator=gen)
    out.backward(grad.to(device))
    ref.backward(grad.double())
    tol = TOLERANCES[torch.float32]
    assert_close(x_dev.grad, x64.grad, tol=tol, name="grad x")
    assert_close(layer.fc.weight.grad, pyg.lin.weight.grad, tol=tol, name="grad fc.weight")
    assert_close(layer.attn_l.grad, pyg.att_src.grad, tol=tol, name="grad attn_l")
    assert_close(layer.attn_r.grad, pyg.att_dst.grad, tol=tol, name="grad attn_r")
    assert_close(layer.bias.grad, pyg.bias.grad, tol=tol, name="grad bias")


def test_matches_pyg_on_corner_case_graph(gen, device):
    edges = corner_case_edges(gen)
    layer = GATConv(11, 5, 3, negative_slope=0.15).to(device)
    x = torch.randn(29, 11, generator=gen)
    compare_with_pyg(layer, x, edges, device, gen)


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_matches_pyg_on_planetoid(gen, device, name):
    data = planetoid(name)
    layer = GATConv(data.x.shape[1], 8, 2).to(device)
    compare_with_pyg(layer, data.x, data.edge_index, device, gen)


def test_dgl_state_dict_layout_loads_unchanged():
    plain = GATConv(10, 4, 3)
    assert {k: tuple(v.shape) for k, v in plain.state_dict().items()} == {
        "fc.weight": (12, 10), "attn_l": (1, 3, 4), "attn_r": (1, 3, 4), "bias": (12,),
    }
    linear_res = GATConv(10, 4, 3, residual=True)
    assert {k: tuple(v.shape) for k, v in linear_res.state_dict().items()} == {
        "fc.weight": (12, 10), "attn_l": (1, 3, 4), "attn_r": (1, 3, 4),
        "res_fc.weight": (12, 10), "res_fc.bias": (12,),
    }
    identity_res = GATConv(12, 4, 3, residual=True, bias=False)
    assert set(identity_res.state_dict()) == {"fc.weight", "attn_l", "attn_r"}
    # A DGL-made state dict (same names and shapes) loads strictly into a fresh layer.
    fresh = GATConv(10, 4, 3, residual=True)
    fresh.load_state_dict({k: torch.randn(v.shape) for k, v in linear_res.state_dict().items()}, strict=True)


def test_residual_activation_and_reference_path(gen, device):
    edges = corner_case_edges(gen).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    for layer in (GATConv(6, 2, 3, residual=True, activation=torch.relu, allow_zero_in_degree=True),
                  GATConv(6, 3, 2, residual=True, allow_zero_in_degree=True)):
        layer = layer.to(device)
        out = layer(edges, x)
        with use_reference():
            ref = layer(edges, x)
        assert_close(out, ref, name="residual layer vs reference path")


def test_graph_inputs_are_cached_and_interchangeable(gen, device):
    from torch_geometric.data import Data

    edges = corner_case_edges(gen).to(device)
    layer = GATConv(6, 2, 2, allow_zero_in_degree=True).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    out = layer(edges, x)
    from gnnfuse.graph import as_graph

    assert as_graph(edges, 29) is as_graph(edges, 29)
    assert torch.equal(layer(Data(edge_index=edges, num_nodes=29), x), out)
    assert torch.equal(layer(Graph(edges, 29), x), out)


def test_bf16_layer(gen, device):
    edges = corner_case_edges(gen).to(device)
    layer = GATConv(6, 4, 2, allow_zero_in_degree=True).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    ref = layer(edges, x)
    out = layer.to(torch.bfloat16)(edges, x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert_close(out, ref, tol=TOLERANCES[torch.bfloat16])


def test_attention_dropout_only_in_training(gen, device):
    edges = corner_case_edges(gen).to(device)
    layer = GATConv(6, 4, 2, attn_drop=0.5, allow_zero_in_degree=True).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    layer.eval()
    assert torch.equal(layer(edges, x), layer(edges, x))
    layer.train()
    assert not torch.equal(layer(edges, x), layer(edges, x))


def test_layer_errors_are_clear(gen, device):
    edges = corner_case_edges(gen).to(device)
    layer = GATConv(6, 4, 2).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    with pytest.raises(ValueError, match="0-in-degree"):
        layer(edges, x)
    layer.set_allow_zero_in_degree(True)
    with pytest.raises(ValueError, match="in_feats=6"):
        layer(edges, x[:, :5])
    with pytest.raises(ValueError, match="num_nodes"):
        layer(Graph(edges, 29), x[:20])
    with pytest.raises(ValueError, match="node id"):
        layer(edges, x[:20])
    with pytest.raises(TypeError, match="dtype"):
        layer(edges, x.double())
    with pytest.raises(ValueError, match="num_heads"):
        GATConv(6, 4, 0)
    with pytest.raises(ValueError, match="attn_drop"):
        GATConv(6, 4, 2, attn_drop=1.5)


@pytest.mark.gpu
def test_forward_is_capturable_in_a_cuda_graph(gen, device):
    edges = corner_case_edges(gen).to(device)
    graph = Graph(edges, 29)
    layer = GATConv(6, 4, 2, allow_zero_in_degree=True).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    with torch.no_grad():
        expected = layer(graph, x)  # first call builds the schedule (host work) outside the capture
        side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graph asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer(graph, x)
        torch.cuda.current_stream().wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            captured = layer(graph, x)
        cuda_graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)


def _training_step(layer, graph, x, grad, schedule=None):
    layer(graph, x, schedule=schedule).backward(grad)
    return [p.grad for p in layer.parameters()] + [x.grad]


def _clear_grads(layer, x):
    for t in [*layer.parameters(), x]:
        t.grad = None


def test_second_call_does_no_schedule_work_and_no_host_sync(gen, device, monkeypatch):
    # A schedule is built (with its host syncs) once per graph and feature shape; every later
    # training step only launches kernels, so nothing in it waits for the device (host reads of
    # tensor values refused at the Python level by fusecore.testing.no_host_sync).
    graph = Graph(corner_case_edges(gen).to(device), 29).add_self_loops()
    layer = GATConv(6, 4, 2).to(device)  # the zero-in-degree check too is answered once per graph
    x = torch.randn(29, 6, generator=gen).to(device).requires_grad_(True)
    grad = torch.randn(29, 2, 4, generator=gen).to(device)
    first = [g.clone() for g in _training_step(layer, graph, x, grad)]
    built, hits = graph.schedules.misses, graph.schedules.hits

    def refuse(*args, **kwargs):
        raise AssertionError("host work inside a training step after the first")

    import gnnfuse.schedule

    monkeypatch.setattr(gnnfuse.schedule, "build_schedule", refuse)
    _clear_grads(layer, x)
    with no_host_sync():
        second = _training_step(layer, graph, x, grad)
    monkeypatch.undo()
    assert graph.schedules.misses == built and graph.schedules.hits > hits
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_training_step_is_capturable_in_a_cuda_graph(gen, device):
    # Every launch kind (light classes, medium rows, super-row pieces and their merges) inside one
    # captured forward + backward; a replay after new inputs are copied in gives the eager result.
    from gnn_testing import SCHEDULES

    schedule = SCHEDULES["mixed"]
    graph = Graph(corner_case_edges(gen).to(device), 29)
    layer = GATConv(6, 4, 2, allow_zero_in_degree=True).to(device)
    x = torch.randn(29, 6, generator=gen).to(device).requires_grad_(True)
    grad = torch.randn(29, 2, 4, generator=gen).to(device)
    new_x = torch.randn(29, 6, generator=gen).to(device)
    with torch.no_grad():
        x_eager = new_x.clone().requires_grad_(True)
    expected = [g.clone() for g in _training_step(layer, graph, x_eager, grad, schedule)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            _clear_grads(layer, x)
            _training_step(layer, graph, x, grad, schedule)
    torch.cuda.current_stream().wait_stream(side)
    _clear_grads(layer, x)
    cuda_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(cuda_graph):
        captured = _training_step(layer, graph, x, grad, schedule)
    with torch.no_grad():
        x.copy_(new_x)
    cuda_graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, expected):
        assert_close(got, want, tol=TOLERANCES[torch.float32])
