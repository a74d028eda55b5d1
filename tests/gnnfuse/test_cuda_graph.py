"""gnnfuse.capture: a layer on a fixed graph replayed from CUDA graphs, against the layer as called."""

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges

import gnnfuse
from fusecore import DevicePhiloxStream, PhiloxStream
from fusecore.testing import TOLERANCES, assert_close
from gnnfuse import Graph
from gnnfuse.nn import AGNNConv, GATConv, GATv2Conv, GraphTransformerConv


def test_capture_refuses_what_a_replay_cannot_do(gen):
    graph = Graph(corner_case_edges(gen), 29)
    x = torch.randn(29, 6, generator=gen)
    with pytest.raises(TypeError, match="layer must be a gnnfuse.nn or gnnfuse.pyg layer"):
        gnnfuse.capture(torch.nn.Linear(6, 4), graph, x)
    with pytest.raises(TypeError, match="inputs must be"):
        gnnfuse.capture(GATConv(6, 4, 2), graph)
    with pytest.raises(ValueError, match="warmup"):
        gnnfuse.capture(GATConv(6, 4, 2), graph, x, warmup=0)
    with pytest.raises(ValueError, match=r"inputs\[0\] on 'cpu'"):
        gnnfuse.capture(GATConv(6, 4, 2), graph, x)
    with pytest.raises(TypeError, match="rng must be a fusecore.DevicePhiloxStream"):
        gnnfuse.capture(GATConv(6, 4, 2, attn_drop=0.1), graph, x, rng=PhiloxStream(1))  # a graph would freeze it


def _graph_and_twins(make, gen, device):
    """The corner-case graph and two copies of one layer: one to capture, one called as usual."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    torch.manual_seed(0)
    captured = make().to(device)
    called = make().to(device)
    called.load_state_dict(captured.state_dict())
    return graph, captured, called


LAYERS = {
    "GATConv": (lambda: GATConv(6, 4, 2, allow_zero_in_degree=True), None),
    "GATv2Conv": (lambda: GATv2Conv(6, 4, 2, allow_zero_in_degree=True), None),
    "GraphTransformerConv": (lambda: GraphTransformerConv(6, 4, heads=2, edge_dim=3), 3),
    "AGNNConv": (lambda: AGNNConv(allow_zero_in_degree=True), None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(LAYERS))
def test_captured_training_matches_the_layer_as_called(gen, device, name):
    # Three SGD steps on fresh inputs each: outputs, input and parameter gradients and the updated
    # parameters of the captured layer follow the layer as called (every bucket kind in the graph).
    make, edge_dim = LAYERS[name]
    graph, layer, twin = _graph_and_twins(make, gen, device)
    width = 6
    input_grad = name == "AGNNConv"

    def inputs():
        feat = torch.randn(29, width, generator=gen).to(device).requires_grad_(input_grad)
        extra = () if edge_dim is None else (torch.randn(graph.num_edges, edge_dim, generator=gen).to(device),)
        return (feat, *extra)

    captured = gnnfuse.capture(layer, graph, *inputs(), schedule=SCHEDULES["mixed"])
    assert all(p.grad is None for p in layer.parameters())  # the warm-up leaves .grad alone
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (captured, twin)]
    for _ in range(3):
        sample = inputs()
        twin_sample = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in sample)
        out = captured(*sample)
        want = twin(graph, *twin_sample, schedule=SCHEDULES["mixed"])
        assert_close(out, want, tol=TOLERANCES[torch.float32], name=f"{name} output")
        grad = torch.randn(want.shape, generator=gen).to(device)
        out.backward(grad)
        want.backward(grad)
        if input_grad:
            assert_close(sample[0].grad, twin_sample[0].grad, tol=TOLERANCES[torch.float32], name="input grad")
        for (pname, p), q in zip(layer.named_parameters(), twin.parameters()):
            assert_close(p.grad, q.grad, tol=TOLERANCES[torch.float32], name=f"{name} grad {pname}")
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad():  # inference through the training-mode graphs; eval mode runs as called
        sample = inputs()
        assert_close(captured(*sample), twin(graph, *sample), tol=TOLERANCES[torch.float32], name="no_grad")
        captured.eval()
        twin.eval()
        assert_close(captured(*sample), twin(graph, *sample), tol=TOLERANCES[torch.float32], name="eval")


@pytest.mark.gpu
def test_captured_outputs_are_copies_and_stale_backward_is_refused(gen, device):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    layer = GATConv(6, 4, 2, allow_zero_in_degree=True).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    captured = gnnfuse.capture(layer, graph, x)
    first = captured(x)
    kept = first.detach().clone()
    second = captured(torch.randn(29, 6, generator=gen).to(device))
    assert torch.equal(first.detach(), kept)  # a later replay leaves an earlier output alone
    with pytest.raises(RuntimeError, match="called again before the backward"):
        first.sum().backward()
    second.sum().backward()  # the latest call's backward is fine
    assert all(p.grad is not None for p in layer.parameters())
    with pytest.raises(ValueError, match="inputs like its capture's samples"):
        captured(x.requires_grad_(True))  # an input gradient the graphs do not form
    with pytest.raises(ValueError, match="inputs like its capture's samples"):
        captured(x.detach()[:20])


DROPOUT_LAYERS = {
    "GATConv": (lambda: GATConv(6, 4, 2, attn_drop=0.6, allow_zero_in_degree=True), None),
    "GATv2Conv": (lambda: GATv2Conv(6, 4, 2, attn_drop=0.6, allow_zero_in_degree=True), None),
    "GraphTransformerConv": (lambda: GraphTransformerConv(6, 4, heads=2, dropout=0.6, edge_dim=3), 3),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(DROPOUT_LAYERS))
def test_captured_attention_dropout_draws_a_fresh_mask_per_replay(gen, device, name):
    # The same input replayed three times: each replay's output and gradients are those of the
    # layer as called with a host PhiloxStream at the device stream's seed and offset before the
    # replay (so its backward regenerated its own forward's mask), and the replays differ.
    make, edge_dim = DROPOUT_LAYERS[name]
    graph, layer, twin = _graph_and_twins(make, gen, device)
    heads = 2
    sample = (torch.randn(29, 6, generator=gen).to(device),
              *(() if edge_dim is None else (torch.randn(graph.num_edges, edge_dim, generator=gen).to(device),)))
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    stream = DevicePhiloxStream(seed, device, offset=100)
    captured = gnnfuse.capture(layer, graph, *sample, schedule=SCHEDULES["mixed"], rng=stream, warmup=2)
    assert captured.rng is stream
    assert stream.state.tolist() == [seed, 100 + 2 * heads]  # the warm-up drew; the capture ran nothing
    outputs = []
    for replay in range(3):
        offset = 100 + (2 + replay) * heads
        out = captured(*sample)
        want = twin(graph, *sample, schedule=SCHEDULES["mixed"], rng=PhiloxStream(seed, offset))
        assert stream.state.tolist() == [seed, offset + heads]
        assert_close(out, want, tol=TOLERANCES[torch.float32], name=f"{name} replay {replay}")
        grad = torch.randn(want.shape, generator=gen).to(device)
        out.backward(grad)
        want.backward(grad)
        for (pname, p), q in zip(layer.named_parameters(), twin.parameters()):
            assert_close(p.grad, q.grad, tol=TOLERANCES[torch.float32], name=f"{name} replay {replay} grad {pname}")
        layer.zero_grad()
        twin.zero_grad()
        outputs.append(out.detach())
    assert not torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[1], outputs[2])
    default = gnnfuse.capture(make().to(device), graph, *sample)  # a stream seeded from torch's generator
    assert isinstance(default.rng, DevicePhiloxStream)
    assert not torch.equal(default(*sample), default(*sample))
