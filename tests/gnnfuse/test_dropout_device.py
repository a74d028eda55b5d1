"""Attention dropout drawn from a device-side (seed, offset) pair (fusecore.DevicePhiloxStream).

The kernels read the pair from device memory (gnnfuse.kernels.dropout, DROPOUT_DEVICE), so a
CUDA graph that captures a call draws a fresh mask on every replay (gnnfuse.capture; its GPU
tests are in test_cuda_graph.py).  Here: the device pair gives exactly the masks, outputs and
gradients of a host PhiloxStream at the same seed and offset, in every op and layer with
attention dropout, and the backward regenerates its forward's mask even after the stream moved on.
"""

from __future__ import annotations

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges

from fusecore import DevicePhiloxStream, PhiloxStream, use_reference
from fusecore.testing import TOLERANCES, assert_close
from gnnfuse import Graph, ops
from gnnfuse.nn import GATConv, GATv2Conv, GraphTransformerConv

HEADS, DIM, EDGE_DIM = 3, 4, 2

# op name -> (leaf shapes for (nodes, edges), the op called on (graph, *leaves, **dropout kwargs))
OPS = {
    "gat_attention": (lambda n, e: [(n, HEADS, DIM), (n, HEADS), (n, HEADS)], ops.gat_attention),
    "gat": (lambda n, e: [(n, HEADS, DIM), (1, HEADS, DIM), (1, HEADS, DIM)], ops.gat),
    "gatv2": (lambda n, e: [(n, HEADS, DIM), (n, HEADS, DIM), (1, HEADS, DIM)], ops.gatv2),
    "transformer+edge": (lambda n, e: [(n, HEADS, DIM)] * 3 + [(e, EDGE_DIM), (HEADS * DIM, EDGE_DIM)],
                         ops.transformer_attention),
}


def _run(name, graph, leaves, grad_out, rng, between=None):
    """Output and every leaf gradient of op ``name`` with dropout 0.4 drawn from ``rng``;
    ``between()`` runs after the forward, before the backward."""
    _, op = OPS[name]
    fused = [t.detach().clone().requires_grad_(True) for t in leaves]
    out = op(graph, *fused, dropout=0.4, rng=rng, schedule=SCHEDULES["mixed"])
    if between is not None:
        between()
    return (out.detach(), *torch.autograd.grad(out, fused, grad_out))


@pytest.mark.parametrize("name", list(OPS))
def test_device_pair_draws_the_host_streams_masks(gen, device, name):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    shapes, _ = OPS[name]
    leaves = [torch.randn(shape, generator=gen).to(device) for shape in shapes(29, graph.num_edges)]
    grad_out = torch.randn(29, HEADS, DIM, generator=gen).to(device)
    seed, offset = int(torch.randint(0, 2**62, (1,), generator=gen)), 2**33 + 5
    want = _run(name, graph, leaves, grad_out, PhiloxStream(seed, offset))
    stream = DevicePhiloxStream(seed, device, offset=offset)
    # the stream moves on between forward and backward: the backward keeps its forward's pair
    got = _run(name, graph, leaves, grad_out, stream, between=lambda: stream.take(7))
    assert stream.state.tolist() == [seed, offset + HEADS + 7]
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"{name}: result {i} differs between the device pair and the host stream"
    # the next call draws the next mask, as the host stream's next pair does
    again = _run(name, graph, leaves, grad_out, stream)
    assert torch.equal(again[0], _run(name, graph, leaves, grad_out, PhiloxStream(seed, offset + HEADS + 7))[0])
    assert not torch.equal(again[0], got[0])


LAYERS = {
    "GATConv": (lambda: GATConv(6, DIM, HEADS, attn_drop=0.5, allow_zero_in_degree=True), ()),
    "GATv2Conv": (lambda: GATv2Conv(6, DIM, HEADS, attn_drop=0.5, allow_zero_in_degree=True), ()),
    "GraphTransformerConv": (lambda: GraphTransformerConv(6, DIM, heads=HEADS, dropout=0.5, edge_dim=EDGE_DIM),
                             (EDGE_DIM,)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_take_a_device_stream(gen, device, name):
    make, extra = LAYERS[name]
    graph = Graph(corner_case_edges(gen).to(device), 29)
    layer = make().to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    inputs = (x, *(torch.randn(graph.num_edges, k, generator=gen).to(device) for k in extra))
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    stream = DevicePhiloxStream(seed, device, offset=11)
    got = layer(graph, *inputs, rng=stream)
    want = layer(graph, *inputs, rng=PhiloxStream(seed, 11))
    assert torch.equal(got, want)
    got.sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    want.sum().backward()
    for g, p in zip(grads, layer.parameters()):
        assert torch.equal(g, p.grad)
    with use_reference():  # the reference path reads the pair back (a sync) and draws the same mask
        assert_close(layer(graph, *inputs, rng=DevicePhiloxStream(seed, device, offset=11)), want,
                     tol=TOLERANCES[torch.float32], name=f"{name} reference path")
    layer.eval()  # no dropout: the stream is not drawn from
    layer(graph, *inputs, rng=stream)
    assert stream.state.tolist() == [seed, 11 + HEADS]


def test_rng_errors_are_clear(gen, device):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    x = torch.randn(29, HEADS, DIM, generator=gen).to(device)
    a = torch.randn(1, HEADS, DIM, generator=gen).to(device)
    with pytest.raises(TypeError, match="rng must be a fusecore.PhiloxStream, a fusecore.DevicePhiloxStream"):
        ops.gat(graph, x, a, a, dropout=0.5, rng=torch.tensor([1, 2]))
    other = "cuda" if torch.device(device).type == "cpu" else "cpu"
    if other == "cuda" and not torch.cuda.is_available():
        pytest.skip("no second device to put the stream on")
    with pytest.raises(ValueError, match="rng is a DevicePhiloxStream on"):
        ops.gatv2(graph, x, x, a, dropout=0.5, rng=DevicePhiloxStream(1, other))
