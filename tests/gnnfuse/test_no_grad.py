"""Calls autograd records nothing for skip the autograd Function (gnnfuse.ops._apply), same results.

Every fused op is called three ways on the same inputs: with gradients recorded (the Function's
``apply``), under ``torch.no_grad()`` and under ``torch.inference_mode()`` (its ``forward`` called
directly) — the outputs must be identical, bit for bit (the same kernels run), only the recorded
call may carry a ``grad_fn``, and the recorded call's gradients must still flow.
"""

from __future__ import annotations

import pytest
import torch
from gnn_testing import corner_case_edges

from fusecore.testing import fresh_generator, test_device
from gnnfuse import Graph, ops

DEVICE = test_device()
HEADS, DIM, EDGE_DIM = 2, 8, 3


def _calls(n: int, num_edges: int, dtype: torch.dtype, gen: torch.Generator):
    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype).requires_grad_()

    wh, el, er = leaf(n, HEADS, DIM), leaf(n, HEADS), leaf(n, HEADS)
    attn = leaf(1, HEADS, DIM)
    x, weight = leaf(n, 16), leaf(HEADS * DIM, 16)
    bias = leaf(HEADS * DIM)
    edge_attr, edge_weight = leaf(num_edges, EDGE_DIM), leaf(HEADS * DIM, EDGE_DIM)
    return {
        "gat_attention": lambda g: ops.gat_attention(g, wh, el, er),
        "gat": lambda g: ops.gat(g, wh, attn, attn * 0.5, out_add=bias),
        "gat, projected": lambda g: ops.gat(g, x, attn, attn * 0.5, weight=weight, out_add=bias),
        "node_scores": lambda g: ops.node_scores(wh, attn, attn * 0.5)[0],
        "gatv2": lambda g: ops.gatv2(g, wh, wh * 0.5, attn),
        "transformer, edge features": lambda g: ops.transformer_attention(g, wh, wh * 0.5, wh * 0.25, edge_attr,
                                                                          edge_weight, out_add=wh * 0.1),
        "agnn": lambda g: ops.agnn(g, wh, torch.ones(1, device=DEVICE, dtype=dtype, requires_grad=True)),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unrecorded_calls_skip_autograd_with_identical_outputs(dtype):
    gen = fresh_generator()
    n = 29
    graph = Graph(corner_case_edges(gen, n).to(DEVICE), n)
    for name, call in _calls(n, graph.num_edges, dtype, gen).items():
        recorded = call(graph)
        assert recorded.grad_fn is not None, name
        recorded.float().sum().backward()
        with torch.no_grad():
            plain = call(graph)
        with torch.inference_mode():
            inference = call(graph)
        for other in (plain, inference):
            assert other.grad_fn is None and not other.requires_grad, name
            assert torch.equal(other, recorded.detach()), f"{name}: differs from the recorded call"


def test_inputs_without_gradients_skip_autograd_with_grad_mode_on():
    gen = fresh_generator()
    n = 17
    graph = Graph(corner_case_edges(gen, n).to(DEVICE), n)
    wh = torch.randn(n, HEADS, DIM, generator=gen).to(DEVICE)
    el, er = torch.randn(n, HEADS, generator=gen).to(DEVICE), torch.randn(n, HEADS, generator=gen).to(DEVICE)
    out = ops.gat_attention(graph, wh, el, er)
    assert torch.is_grad_enabled() and out.grad_fn is None
    assert torch.equal(out, ops.gat_attention(graph, wh, el, er.requires_grad_()).detach())
