"""What a layer's training call records for autograd: the fused Functions, the projections, views and the
parameters' accumulation — no node whose backward is a device pass of its own over a whole gradient.

Each such node costs a training step launches and memory traffic that no kernel needs: a slice of every row
(``out[:n]``: torch records it even when ``n`` is every row) zero-fills a gradient as large as its input and
copies the incoming one into it (64 µs of the arxiv-like Graph Transformer fp32 step on the H200, session 50).
"""

from __future__ import annotations

import pytest
import torch

from fusecore.testing import test_device
from gnnfuse import Graph, pyg
from gnnfuse.nn import AGNNConv, GATConv, GATv2Conv, GraphTransformerConv

DEVICE = test_device()
N, FEATS, HEADS, DIM, EDGE_DIM = 37, 16, 2, 4, 3
# backward passes over a whole [N, ...] gradient that a fused layer has no use for
COPYING_NODES = {"SliceBackward0", "CopySlices", "CloneBackward0", "IndexBackward0", "ExpandBackward0",
                 "ToCopyBackward0", "SelectBackward0", "NarrowBackward0"}
# the nodes each layer records (beyond AccumulateGrad): a new kind here is a new pass over a gradient
EXPECTED = {
    "GATConv": {"GATFunctionBackward", "ViewBackward0", "_LinearBackward"},
    "GATv2Conv": {"GATv2FunctionBackward", "ViewBackward0", "_LinearBackward", "CatBackward0"},
    "GraphTransformerConv": {"TransformerAttentionFunctionBackward", "ViewBackward0", "_LinearBackward",
                             "CatBackward0"},
    "GraphTransformerConv, edge features": {"TransformerAttentionFunctionBackward", "ViewBackward0",
                                            "_LinearBackward", "CatBackward0"},
    "AGNNConv": {"AGNNFunctionBackward", "ViewBackward0", "UnsqueezeBackward0"},
    "pyg.GATConv": {"GATFunctionBackward", "ViewBackward0", "_LinearBackward"},
    "pyg.GATv2Conv": {"GATv2FunctionBackward", "ViewBackward0", "_LinearBackward", "CatBackward0"},
    "pyg.TransformerConv": {"TransformerAttentionFunctionBackward", "ViewBackward0", "_LinearBackward",
                            "CatBackward0"},
    "pyg.AGNNConv": {"AGNNFunctionBackward", "ViewBackward0", "UnsqueezeBackward0"},
}


def _recorded(out: torch.Tensor) -> set[str]:
    """The kinds of node in ``out``'s autograd graph, AccumulateGrad left out."""
    kinds, seen, stack = set(), set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kinds.add(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return kinds - {"AccumulateGrad"}


def _calls(gen: torch.Generator):
    edge_index = torch.randint(0, N, (2, 5 * N), generator=gen)
    graph = Graph(edge_index.to(DEVICE), N).remove_self_loops().add_self_loops()
    x = torch.randn(N, FEATS, generator=gen).to(DEVICE).requires_grad_()
    attr = torch.randn(graph.num_edges, EDGE_DIM, generator=gen).to(DEVICE)
    edges = edge_index.to(DEVICE)
    return x, {
        "GATConv": (GATConv(FEATS, DIM, HEADS), lambda m: m(graph, x)),
        "GATv2Conv": (GATv2Conv(FEATS, DIM, HEADS), lambda m: m(graph, x)),
        "GraphTransformerConv": (GraphTransformerConv(FEATS, DIM, heads=HEADS), lambda m: m(graph, x)),
        "GraphTransformerConv, edge features": (GraphTransformerConv(FEATS, DIM, heads=HEADS, edge_dim=EDGE_DIM),
                                                lambda m: m(graph, x, attr)),
        "AGNNConv": (AGNNConv(), lambda m: m(graph, x)),
        "pyg.GATConv": (pyg.GATConv(FEATS, DIM, heads=HEADS), lambda m: m(x, edges)),
        "pyg.GATv2Conv": (pyg.GATv2Conv(FEATS, DIM, heads=HEADS), lambda m: m(x, edges)),
        "pyg.TransformerConv": (pyg.TransformerConv(FEATS, DIM, heads=HEADS), lambda m: m(x, edges)),
        "pyg.AGNNConv": (pyg.AGNNConv(), lambda m: m(x, edges)),
    }


@pytest.mark.parametrize("name", list(EXPECTED))
def test_training_call_records_no_pass_over_a_whole_gradient(name):
    gen = torch.Generator().manual_seed(5)
    x, calls = _calls(gen)
    module, call = calls[name]
    out = call(module.to(DEVICE))
    kinds = _recorded(out)
    assert not kinds & COPYING_NODES, f"{name} records {sorted(kinds & COPYING_NODES)}"
    assert kinds == EXPECTED[name], f"{name} records {sorted(kinds)}, expected {sorted(EXPECTED[name])}"
    out.backward(torch.randn(out.shape, generator=gen).to(DEVICE))  # the gradients still reach x and every weight
    assert x.grad is not None and torch.isfinite(x.grad).all(), name
    for label, param in module.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), f"{name}: {label}"
