"""What a layer's training call records for autograd: the fused Functions, the projections, views and the
parameters' accumulation — no node whose backward is a device pass of its own over a whole gradient.

Each such node costs a training step launches and memory traffic that no kernel needs: a slice of every row
(``out[:n]``: torch records it even when ``n`` is every row) zero-fills a gradient as large as its input and
copies the incoming one into it (64 µs of the arxiv-like Graph Transformer fp32 step on the H200, session 50).
"""

from __future__ import annotations

import copy

import pytest
import torch

from fusecore.testing import AllocationAudit, test_device
from gnnfuse import Graph, pyg
from gnnfuse.nn import AGNNConv, GATConv, GATv2Conv, GraphTransformerConv

DEVICE = test_device()
CAT = "aten.cat.default"
N, FEATS, HEADS, DIM, EDGE_DIM = 37, 16, 2, 4, 3
# backward passes over a whole [N, ...] gradient that a fused layer has no use for
COPYING_NODES = {"SliceBackward0", "CopySlices", "CloneBackward0", "IndexBackward0", "ExpandBackward0",
                 "ToCopyBackward0", "SelectBackward0", "NarrowBackward0"}
# the nodes each layer records (beyond AccumulateGrad): a new kind here is a new pass over a gradient
EXPECTED = {
    "GATConv": {"GATFunctionBackward", "ViewBackward0", "_LinearBackward"},
    # the stacked projection's one node (fusecore.linear.linears): no concatenation of the weights recorded
    "GATv2Conv": {"GATv2FunctionBackward", "ViewBackward0", "_LinearsBackward"},
    "GraphTransformerConv": {"TransformerAttentionFunctionBackward", "ViewBackward0", "_LinearsBackward"},
    "GraphTransformerConv, edge features": {"TransformerAttentionFunctionBackward", "ViewBackward0",
                                            "_LinearsBackward"},
    "AGNNConv": {"AGNNFunctionBackward", "ViewBackward0", "UnsqueezeBackward0"},
    "pyg.GATConv": {"GATFunctionBackward", "ViewBackward0", "_LinearBackward"},
    "pyg.GATv2Conv": {"GATv2FunctionBackward", "ViewBackward0", "_LinearsBackward"},
    "pyg.TransformerConv": {"TransformerAttentionFunctionBackward", "ViewBackward0", "_LinearsBackward"},
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
    module = module.to(DEVICE)
    with torch.no_grad():
        call(module)  # the graph's schedule is built on the first call
    with AllocationAudit() as counted:
        out = call(module)
    # the stacked weights read as they lie
    assert counted.made_by(CAT) == 0, f"{name} concatenated {counted.made_by(CAT)} tensors"
    kinds = _recorded(out)
    assert not kinds & COPYING_NODES, f"{name} records {sorted(kinds & COPYING_NODES)}"
    assert kinds == EXPECTED[name], f"{name} records {sorted(kinds)}, expected {sorted(EXPECTED[name])}"
    out.backward(torch.randn(out.shape, generator=gen).to(DEVICE))  # the gradients still reach x and every weight
    assert x.grad is not None and torch.isfinite(x.grad).all(), name
    for label, param in module.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), f"{name}: {label}"


STACKED = {  # layer -> (its maps' names in the stacked product's order, a constructor)
    "GATv2Conv": (["fc_src", "fc_dst"], lambda: GATv2Conv(FEATS, DIM, HEADS)),
    "GraphTransformerConv": (["lin_query", "lin_key", "lin_value", "lin_skip"],
                             lambda: GraphTransformerConv(FEATS, DIM, heads=HEADS)),
    "GraphTransformerConv, beta": (["lin_query", "lin_key", "lin_value"],
                                   lambda: GraphTransformerConv(FEATS, DIM, heads=HEADS, beta=True)),
    "pyg.GATv2Conv": (["lin_l", "lin_r"], lambda: pyg.GATv2Conv(FEATS, DIM, heads=HEADS)),
    "pyg.TransformerConv": (["lin_query", "lin_key", "lin_value", "lin_skip"],
                            lambda: pyg.TransformerConv(FEATS, DIM, heads=HEADS)),
}


def _one_buffer(module: torch.nn.Module, names: list[str]) -> bool:
    """Whether the named maps' weights, and their biases, lie one after another in one storage each."""
    maps = [getattr(module, n) for n in names]
    for tensors in ([m.weight for m in maps], [m.bias for m in maps]):
        storage = tensors[0].untyped_storage().data_ptr()
        at = tensors[0].data_ptr()
        for t in tensors:
            if t.data_ptr() != at or t.untyped_storage().data_ptr() != storage:
                return False
            at += t.numel() * t.element_size()
    return True


@pytest.mark.parametrize("name", list(STACKED))
def test_projection_weights_stay_one_buffer(name):
    """The maps a layer stacks keep their weights and biases as blocks of one buffer each (gnnfuse.nn
    ``_StackedProjections``): after construction, a dtype or device change (``Module._apply``) and a state_dict
    loaded in place; the parameters, their order and the state_dict keys are the ecosystem's; a deep copy (its own
    storage per parameter) gives the same output through a copy of the weights."""
    names, build = STACKED[name]
    torch.manual_seed(3)
    module = build()
    keys, order = list(module.state_dict()), [n for n, _ in module.named_parameters()]
    assert _one_buffer(module, names)
    module = module.to(DEVICE, torch.float64)
    assert _one_buffer(module, names) and all(p.dtype == torch.float64 for p in module.parameters())
    other = build().to(DEVICE, torch.float64)
    other.load_state_dict(module.state_dict())
    assert _one_buffer(other, names)
    assert list(other.state_dict()) == keys and [n for n, _ in other.named_parameters()] == order
    gen = torch.Generator().manual_seed(4)
    x, calls = _calls(gen)
    x = x.detach().double()
    edges = torch.randint(0, N, (2, 5 * N), generator=gen).to(DEVICE)
    graph = Graph(edges, N).remove_self_loops().add_self_loops()

    def call(m):
        return m(x, edges) if name.startswith("pyg") else m(graph, x)

    call(module)  # the graph's schedule is built on the first call
    with AllocationAudit() as stacked_cats:
        expected = call(module)
    assert torch.equal(call(other), expected)
    copied = copy.deepcopy(module)
    assert not _one_buffer(copied, names)
    with AllocationAudit() as counted:
        assert torch.equal(call(copied), expected)
    # the weights and the biases, copied into one tensor each
    assert counted.made_by(CAT) == stacked_cats.made_by(CAT) + 2
    half = build().to(DEVICE).to(torch.bfloat16)
    assert _one_buffer(half, names)


@pytest.mark.parametrize("name", ["pyg.TransformerConv", "pyg.GATv2Conv"])
def test_lazy_layer_stacks_once_it_has_its_width(name):
    """PyG's ``in_channels=-1``: the maps take the first call's width, then are stacked like any other's."""
    layer = getattr(pyg, name.split(".")[1])(-1, DIM, heads=HEADS).to(DEVICE)
    gen = torch.Generator().manual_seed(6)
    x, _ = _calls(gen)
    edges = torch.randint(0, N, (2, 5 * N), generator=gen).to(DEVICE)
    layer(x, edges)
    assert _one_buffer(layer, STACKED[name][0])
    layer(x, edges)
    with AllocationAudit() as counted:
        layer(x, edges)
    assert counted.made_by(CAT) == 0
