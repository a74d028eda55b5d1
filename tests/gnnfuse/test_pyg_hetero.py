"""gnnfuse.pyg in PyG's heterogeneous workflows, against the same models built from torch_geometric's own layers
holding the same weights: ``HeteroConv`` (a conv per edge type, ``edge_attr_dict`` passed through) and ``to_hetero``
(the FX transform of a homogeneous model: it finds message-passing layers by ``isinstance(module, MessagePassing)``,
which the fused layers are where PyG is installed), with PyG's lazy ``(-1, -1)`` widths; GATConv's ``(x_src, None)``
pairs (no destination term, the destinations counted as PyG's ``propagate`` counts them).  float32, at
fusecore.testing's tolerance; tiny graphs.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from fusecore.testing import TOLERANCES, assert_close, test_device
from gnnfuse import pyg as fused

torch_geometric = pytest.importorskip("torch_geometric")
PyG = torch_geometric.nn
from torch_geometric.data import HeteroData  # noqa: E402

TOL = TOLERANCES[torch.float32]
DEV = test_device()  # the GPU when compiled (the kernels refuse host tensors there), else the CPU
SIZES = {"paper": (14, 5), "author": (9, 3), "inst": (5, 4)}
EDGE_TYPES = [("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "rev_writes", "author"),
              ("inst", "employs", "author")]


def _hetero_data(gen: torch.Generator, with_inst: bool = True, edge_dim: int | None = None) -> HeteroData:
    """Papers citing papers (self loops and duplicates by chance), authors writing papers and the reverse type, and
    (``with_inst``) institutes employing authors: a node type without incoming edges."""
    data = HeteroData()
    for name, (n, f) in SIZES.items():
        if with_inst or name != "inst":
            data[name].x = torch.randn(n, f, generator=gen)
    counts = {"cites": 40, "writes": 25, "employs": 10}
    for src, rel, dst in EDGE_TYPES:
        if rel == "rev_writes" or (rel == "employs" and not with_inst):
            continue
        e = counts[rel]
        data[src, rel, dst].edge_index = torch.stack([torch.randint(0, SIZES[src][0], (e,), generator=gen),
                                                      torch.randint(0, SIZES[dst][0], (e,), generator=gen)])
    data["paper", "rev_writes", "author"].edge_index = data["author", "writes", "paper"].edge_index.flip(0)
    if edge_dim is not None:
        for store in data.edge_stores:
            store.edge_attr = torch.randn(store.edge_index.shape[1], edge_dim, generator=gen)
    return data.to(DEV)


def _same_weights(ours: torch.nn.Module, theirs: torch.nn.Module, gen: torch.Generator) -> None:
    """PyG's model holds ours' weights (a strict load), every bias drawn nonzero first (PyG initializes the output
    biases to 0, which would hide a missing add)."""
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
    theirs.load_state_dict(ours.state_dict(), strict=True)


def _leaves(tensors: dict) -> dict:
    return {k: v.clone().requires_grad_(True) for k, v in tensors.items()}


def _compare(ours: torch.nn.Module, theirs: torch.nn.Module, data: HeteroData, gen: torch.Generator,
             edge_attr: bool = False, **call) -> None:
    """One call initializes the lazy widths of both models; then, with the same weights, the outputs per node type
    and, after one backward of a random cotangent, the gradients of the node (and edge) features and of every
    parameter (matched by name) equal."""
    ours.to(DEV), theirs.to(DEV)

    def run(model):
        xs = _leaves(data.x_dict)
        extra = {"edge_attr": _leaves(data.edge_attr_dict)} if edge_attr else {}
        return model(xs, data.edge_index_dict, *extra.values(), **call), {"x": xs, **extra}

    run(ours), run(theirs)
    _same_weights(ours, theirs, gen)
    (out, mine), (ref, other) = run(ours), run(theirs)
    assert sorted(out) == sorted(ref), (sorted(out), sorted(ref))
    loss_o, loss_t = 0, 0
    for key in ref:
        assert out[key].shape == ref[key].shape, (key, out[key].shape, ref[key].shape)
        assert_close(out[key], ref[key], tol=TOL, name=f"output {key}")
        cot = torch.randn(ref[key].shape, generator=gen).to(DEV)
        loss_o, loss_t = loss_o + (out[key] * cot).sum(), loss_t + (ref[key] * cot).sum()
    loss_o.backward()
    loss_t.backward()
    for kind in mine:
        for key, leaf in mine[kind].items():
            if other[kind][key].grad is None:  # a type no output reads (an edge type of a destination left out)
                assert leaf.grad is None or leaf.grad.abs().max() == 0, (kind, key)
                continue
            assert_close(leaf.grad, other[kind][key].grad, tol=TOL, name=f"grad {kind} {key}")
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        theirs_grad = theirs_params[name].grad
        if theirs_grad is None or theirs_grad.abs().max() < 1e-5:  # unused, or zero in exact arithmetic (rounding)
            assert p.grad is None or p.grad.abs().max() < 1e-4, f"{name}: a gradient where PyG's has none"
            continue
        assert_close(p.grad, theirs_grad, tol=TOL, name=f"grad {name}")


def _hetero_conv(mod, convs: dict, aggr: str):
    with warnings.catch_warnings():  # PyG warns of the node type without incoming edges
        warnings.simplefilter("ignore")
        return PyG.HeteroConv({et: make(mod) for et, make in convs.items()}, aggr=aggr)


def _gat(mod):
    return mod.GATConv((-1, -1), 4, heads=2, add_self_loops=False)


def _gatv2(mod):
    return mod.GATv2Conv((-1, -1), 4, heads=2, add_self_loops=False)


def _transformer(mod):
    return mod.TransformerConv((-1, -1), 4, heads=2)


MIXED = {
    EDGE_TYPES[0]: lambda mod: mod.GATConv(-1, 4, heads=2, negative_slope=0.25),  # self loops on one node type
    EDGE_TYPES[1]: _gatv2,
    EDGE_TYPES[2]: _transformer,
    EDGE_TYPES[3]: lambda mod: mod.GATConv((-1, -1), 4, heads=2, add_self_loops=False, residual=True),
}
HETERO_CONVS = {
    "gat-sum": ({et: _gat for et in EDGE_TYPES}, "sum"),
    "gatv2-mean": ({et: _gatv2 for et in EDGE_TYPES}, "mean"),
    "transformer-max": ({et: _transformer for et in EDGE_TYPES}, "max"),
    "mixed-cat": (MIXED, "cat"),
}


@pytest.mark.parametrize("case", list(HETERO_CONVS))
def test_hetero_conv_matches_pyg(case, gen):
    convs, aggr = HETERO_CONVS[case]
    data = _hetero_data(gen)
    ours, theirs = _hetero_conv(fused, convs, aggr), _hetero_conv(PyG, convs, aggr)
    _compare(ours, theirs, data, gen)


def test_hetero_conv_passes_edge_attr_dict(gen):
    """``edge_attr_dict`` reaches each edge type's layer as ``edge_attr`` (GATConv's self loops' rows from its
    ``fill_value``, as PyG's)."""
    convs = {
        EDGE_TYPES[0]: lambda mod: mod.GATConv(-1, 4, heads=2, edge_dim=3),
        EDGE_TYPES[1]: lambda mod: mod.GATConv((-1, -1), 4, heads=2, edge_dim=3, add_self_loops=False),
        EDGE_TYPES[2]: lambda mod: mod.TransformerConv((-1, -1), 4, heads=2, edge_dim=3),
        EDGE_TYPES[3]: lambda mod: mod.TransformerConv((-1, -1), 4, heads=2, edge_dim=3, beta=True),
    }
    data = _hetero_data(gen, edge_dim=3)
    ours, theirs = _hetero_conv(fused, convs, "sum"), _hetero_conv(PyG, convs, "sum")

    class Call(torch.nn.Module):  # HeteroConv takes the edge features as the keyword edge_attr_dict
        def __init__(self, conv):
            super().__init__()
            self.conv = conv

        def forward(self, x_dict, edge_index_dict, edge_attr_dict):
            return self.conv(x_dict, edge_index_dict, edge_attr_dict=edge_attr_dict)

    _compare(Call(ours), Call(theirs), data, gen, edge_attr=True)


def test_hetero_conv_with_a_destination_type_without_features(gen):
    """A node type absent from ``x_dict`` reaches its incoming edge types' layers as ``(x_src, None)``: GATConv
    computes no destination term and, as PyG's, returns the sources' count of rows (PyG's ``propagate``)."""
    data = _hetero_data(gen, with_inst=False)
    del data["author"].x
    convs = {EDGE_TYPES[0]: _gat, EDGE_TYPES[2]: _gat}
    ours, theirs = _hetero_conv(fused, convs, "sum"), _hetero_conv(PyG, convs, "sum")
    _compare(ours, theirs, data, gen)


def test_hetero_conv_attention_weights_fail_as_in_pyg(gen):
    """HeteroConv passes ``return_attention_weights_dict`` through, and then cannot group the ``(out, (edge_index,
    α))`` tuples: PyG's layers and these fail alike."""
    data = _hetero_data(gen, with_inst=False)
    for mod in (PyG, fused):
        conv = _hetero_conv(mod, {et: _gat for et in data.edge_types}, "sum").to(DEV)
        with pytest.raises(TypeError, match="expected Tensor"):
            conv(data.x_dict, data.edge_index_dict, return_attention_weights_dict={et: True for et in data.edge_types})


def _to_hetero(mod, first, second, data, aggr, edge_attr=False):
    class GNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = first(mod)
            self.conv2 = second(mod)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    class EdgeGNN(GNN):
        def forward(self, x, edge_index, edge_attr):
            return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index)

    return PyG.to_hetero((EdgeGNN if edge_attr else GNN)(), data.metadata(), aggr=aggr)


TO_HETERO = {
    "gat-gat-sum": (_gat, _gat, "sum"),
    "gatv2-transformer-mean": (_gatv2, _transformer, "mean"),
    "transformer-gatv2-max": (_transformer, _gatv2, "max"),
}


@pytest.mark.parametrize("case", list(TO_HETERO))
def test_to_hetero_matches_pyg(case, gen):
    """A two-layer model (every node type receives edges: PyG's to_hetero refuses a second layer reading a type
    the first did not update)."""
    first, second, aggr = TO_HETERO[case]
    data = _hetero_data(gen, with_inst=False)
    ours, theirs = (_to_hetero(mod, first, second, data, aggr) for mod in (fused, PyG))
    assert all(isinstance(m, PyG.MessagePassing) for m in ours.conv1.values())
    _compare(ours, theirs, data, gen)


def test_to_hetero_with_edge_features_and_pyg_sequential(gen):
    data = _hetero_data(gen, with_inst=False, edge_dim=3)

    def first(mod):
        return mod.GATConv((-1, -1), 4, heads=2, add_self_loops=False, edge_dim=3)

    ours, theirs = (_to_hetero(mod, first, _transformer, data, "sum", edge_attr=True) for mod in (fused, PyG))
    _compare(ours, theirs, data, gen, edge_attr=True)

    def sequential(mod):
        return PyG.Sequential("x, edge_index", [(_transformer(mod), "x, edge_index -> x"), torch.nn.ReLU(),
                                                (_gat(mod), "x, edge_index -> x")])

    ours, theirs = (PyG.to_hetero(sequential(mod), data.metadata(), aggr="sum") for mod in (fused, PyG))
    _compare(ours, theirs, data, gen)


@pytest.mark.parametrize("name", ["GATConv", "GATv2Conv"])
def test_to_hetero_with_edge_features_of_some_edge_types(name, gen):
    """to_hetero passes None for an edge type missing from ``edge_attr_dict``: GATConv and GATv2Conv then run without
    the edge term, as PyG's (their ``edge_update`` adds it only given ``edge_attr``), self loops too."""
    data = _hetero_data(gen, with_inst=False, edge_dim=3)
    del data["author", "writes", "paper"].edge_attr

    def first(mod):
        return getattr(mod, name)((-1, -1), 4, heads=2, add_self_loops=False, edge_dim=3)

    def second(mod):
        return getattr(mod, name)(-1, 4, heads=2, add_self_loops=False, edge_dim=3)

    ours, theirs = (_to_hetero(mod, first, second, data, "sum", edge_attr=True) for mod in (fused, PyG))
    _compare(ours, theirs, data, gen, edge_attr=True)
    ours, theirs = (getattr(mod, name)(5, 4, heads=2, edge_dim=3).to(DEV) for mod in (fused, PyG))
    _same_weights(ours, theirs, gen)
    x, edges = data["paper"].x, data["paper", "cites", "paper"].edge_index
    assert_close(ours(x, edges), theirs(x, edges), tol=TOL)


def test_layers_are_message_passing_and_copy_and_pickle(gen):
    """Built as MessagePassing subclasses of their classes (what to_hetero looks for), deep-copied (to_hetero
    copies a layer per edge type) and pickled whole; the MessagePassing features a fused layer cannot honour
    refuse (to_hetero_with_bases registers a message hook: PyG's own attention layers fail there too)."""
    x, edges = torch.randn(6, 3, generator=gen).to(DEV), torch.tensor([[0, 1, 2, 5], [1, 2, 3, 0]], device=DEV)
    for layer in (fused.GATConv(3, 4, heads=2), fused.GATv2Conv(-1, 4), fused.TransformerConv((-1, -1), 4),
                  fused.AGNNConv()):
        layer.to(DEV)
        assert isinstance(layer, PyG.MessagePassing) and isinstance(layer, getattr(fused, type(layer).__name__))
        want = layer(x, edges)
        for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
            assert type(clone) is type(layer)
            assert torch.equal(clone(x, edges), want)
        with pytest.raises(NotImplementedError, match="message-passing hooks"):
            layer.register_message_forward_hook(lambda *args: None)
        layer.explain = False  # PyG's way to leave a layer out of an explanation
        with pytest.raises(NotImplementedError, match="explain"):
            layer.explain = True
    data = _hetero_data(gen, with_inst=False)

    class GNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = _gat(fused)

        def forward(self, x, edge_index):
            return self.conv(x, edge_index)

    with pytest.raises(NotImplementedError, match="to_hetero_with_bases"):
        PyG.to_hetero_with_bases(GNN(), data.metadata(), num_bases=2, in_channels={"x": 4})


# GATConv's (x_src, None): PyG computes no destination term and no residual; its propagate counts the destinations
# as size[1], else the sources (a sparse adjacency: its rows); the self loops cover min(size) (else N_src) nodes.
NO_DST = [
    ("pair", dict(add_self_loops=False), None),
    ("pair", dict(add_self_loops=False), (12, 7)),
    ("pair", dict(residual=True, negative_slope=0.25), None),
    ("pair", dict(), (12, 20)),
    ("shared", dict(concat=False), (12, 7)),
    ("edge_dim", dict(edge_dim=3, fill_value="add"), (12, 7)),
    ("edge_dim", dict(edge_dim=3, add_self_loops=False), None),
]


@pytest.mark.parametrize("maps,kwargs,size", NO_DST, ids=[str(i) for i in range(len(NO_DST))])
def test_gat_without_destination_features_matches_pyg(maps, kwargs, size, gen):
    n_src, n_dst = 12, (size or (12, 12))[1]
    edges = torch.stack([torch.randint(0, n_src, (30,), generator=gen),
                         torch.randint(0, min(n_src, n_dst), (30,), generator=gen)])
    edges[:, :4] = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]])  # self loops, removed and re-added
    edges = edges.to(DEV)
    in_channels = 5 if maps == "shared" else (5, -1)
    ours, theirs = (m.GATConv(in_channels, 4, heads=2, **kwargs).to(DEV) for m in (fused, PyG))
    attr = torch.randn(edges.shape[1], 3, generator=gen).to(DEV) if "edge_dim" in kwargs else None
    if maps != "shared":  # PyG's lin_dst stays lazy without x_dst: materialized here by a call with one
        for layer in (ours, theirs):
            layer((torch.randn(n_src, 5, device=DEV), torch.randn(n_dst, 6, device=DEV)), edges, attr)
    _same_weights(ours, theirs, gen)
    x = torch.randn(n_src, 5, generator=gen).to(DEV)
    xo, xt = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    extra = {} if size is None else {"size": size}
    out, (ei, alpha) = ours((xo, None), edges, attr, return_attention_weights=True, **extra)
    ref, (ref_ei, ref_alpha) = theirs((xt, None), edges, attr, return_attention_weights=True, **extra)
    assert out.shape == ref.shape and torch.equal(ei, ref_ei)
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    assert_close(out, ref, tol=TOL)
    cot = torch.randn(ref.shape, generator=gen).to(DEV)
    (out * cot).sum().backward()
    (ref * cot).sum().backward()
    assert_close(xo.grad, xt.grad, tol=TOL, name="grad x_src")
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        if theirs_params[name].grad is None:  # lin_dst, att_dst and res: unused without x_dst
            assert p.grad is None, name
        else:
            assert_close(p.grad, theirs_params[name].grad, tol=TOL, name=f"grad {name}")


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")  # PyG's remove_self_loops
def test_gat_without_destination_features_sparse_and_lazy(gen):
    """A sparse ``adj_t`` gives the destinations' count (its rows); a lazy layer's first call with ``(x_src,
    None)`` leaves the destinations' map lazy, as PyG's, until a call with ``x_dst``."""
    edges = torch.stack([torch.randint(0, 12, (30,), generator=gen), torch.randint(0, 7, (30,), generator=gen)])
    adj = torch.sparse_coo_tensor(edges.flip(0), torch.ones(30), (7, 12)).coalesce().to(DEV)
    layer = fused.GATConv((-1, -1), 4, heads=2).to(DEV)
    x = torch.randn(12, 5, generator=gen).to(DEV)
    assert layer((x, None), adj).shape == (7, 8)
    assert layer.lin_src.weight.shape == (8, 5) and isinstance(layer.lin_dst.weight, torch.nn.UninitializedParameter)
    theirs = PyG.GATConv((5, 6), 4, heads=2).to(DEV)
    theirs.lin_src.load_state_dict(layer.lin_src.state_dict())
    theirs.att_src.data.copy_(layer.att_src)
    assert_close(layer((x, None), adj), theirs((x, None), adj), tol=TOL)
    assert layer((x, torch.randn(7, 6, generator=gen).to(DEV)), adj).shape == (7, 8)
    assert layer.lin_dst.weight.shape == (8, 6)


def test_without_destination_features_errors(gen):
    x, edges = torch.randn(6, 3, generator=gen).to(DEV), torch.tensor([[0, 1, 2], [1, 2, 3]], device=DEV)
    with pytest.raises(ValueError, match="GATv2Conv asserts"):
        fused.GATv2Conv(3, 4).to(DEV)((x, None), edges)
    with pytest.raises(ValueError, match="lin_query"):
        fused.TransformerConv(3, 4).to(DEV)((x, None), edges)
    gat = fused.GATConv(3, 4, add_self_loops=False).to(DEV)
    with pytest.raises(ValueError, match="N_src = 6"):
        gat((x, None), edges, size=(5, 4))
    with pytest.raises(ValueError, match="destinations < 3"):
        gat((x, None), edges, size=(6, 3))


def test_pyg_stays_optional():
    """Importing gnnfuse.pyg imports no torch_geometric; the first layer built does (to be a MessagePassing), and
    without PyG the layers are their plain classes and run."""
    script = """
import sys, torch
import gnnfuse.pyg as fused
assert "torch_geometric" not in sys.modules
if sys.argv[1] == "without":
    sys.modules["torch_geometric"] = None  # import torch_geometric raises ImportError
from fusecore.testing import test_device
dev = test_device()
layer = fused.GATConv((-1, -1), 4, heads=2, add_self_loops=False).to(dev)
if sys.argv[1] == "without":
    assert type(layer) is fused.GATConv
    x = (torch.randn(5, 3, device=dev), torch.randn(4, 2, device=dev))
    assert layer(x, torch.tensor([[0, 4], [3, 1]], device=dev)).shape == (4, 8)
else:
    from torch_geometric.nn import MessagePassing
    assert isinstance(layer, MessagePassing) and type(layer) is fused.GATConv._as_message_passing
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for case in ("with", "without"):
        done = subprocess.run([sys.executable, "-c", script, case], capture_output=True, text=True, timeout=300,
                              env=env)
        assert done.returncode == 0, (case, done.stderr[-2000:])
