"""gnnfuse.pyg with PyG's torch.sparse adjacencies (``adj_t``, COO or CSR, ``adj_t[i, j]`` stored: the edge j -> i),
against torch_geometric's own layers holding the same state_dict: outputs, the gradients of the features, edge
features and every parameter, and the attention weights as PyG returns them (``(adj, α)``, ``adj`` the adjacency
the attention ran over in the input's layout with α as values; TransformerConv: the tensor as passed).  Also
TransformerConv with ``in_channels`` a pair of different widths.

What PyG does with a sparse adjacency, matched here: every stored entry is an edge (its value is ignored, explicit
zeros included); without self loops the edges are the tensor's in storage order (``to_edge_index``), duplicate
entries of a CSR separate edges; with self loops (``remove_self_loops`` then ``add_self_loops`` of a sparse tensor)
the adjacency is coalesced — duplicates merged, edges sorted by destination then source, one loop per node below
``min(N_dst, N_src)``; an uncoalesced COO tensor is taken only then (PyG reads ``indices()`` otherwise, which needs a
coalesced one); ``edge_attr`` only without self loops (PyG's sparse ``remove_self_loops`` asserts it is None).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from gnn_testing import corner_case_edges
from test_pyg import TOL, _check, _leaf, _pair

from fusecore.testing import assert_close
from gnnfuse import pyg as fused
from gnnfuse.graph import Graph, as_graph_of_adj_t

torch_geometric = pytest.importorskip("torch_geometric")
PyG = torch_geometric.nn

F, H, C, N = 7, 3, 4, 29
LAYOUTS = ["coo", "coo-uncoalesced", "csr", "csr-duplicates"]

pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks")


def _adjacency(edges: torch.Tensor, shape: tuple[int, int], layout: str, gen: torch.Generator) -> torch.Tensor:
    """``adj_t [N_dst, N_src]`` of ``edges [2, E]`` (row 0 sources) with random nonzero values (ignored by the
    layers): ``coo`` coalesced; ``coo-uncoalesced`` the edges in input order, duplicates kept; ``csr`` coalesced;
    ``csr-duplicates`` the edges grouped by destination in input order (duplicates kept, sources unsorted in a row)."""
    values = torch.rand(edges.shape[1], generator=gen, dtype=torch.float64) + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        coo = torch.sparse_coo_tensor(edges.flip(0), values, shape)
        if layout == "coo":
            return coo.coalesce()
        if layout == "coo-uncoalesced":
            return coo
        if layout == "csr":
            return coo.coalesce().to_sparse_csr()
        order = torch.sort(edges[1], stable=True)[1]
        crow = torch.zeros(shape[0] + 1, dtype=torch.int64)
        crow[1:] = torch.cumsum(torch.bincount(edges[1], minlength=shape[0]), 0)
        return torch.sparse_csr_tensor(crow, edges[0, order], values[order], shape)


def _copy(adj: torch.Tensor) -> torch.Tensor:
    """A separate copy per layer: PyG's ``to_edge_index`` marks an uncoalesced COO tensor coalesced in place."""
    return adj.clone()


def _assert_same_weights(mine, theirs, passed: torch.Tensor, transformer: bool) -> None:
    """PyG's ``(adj, α)``: the same layout, indices and values (α), and α beside them."""
    (adj, alpha), (ref_adj, ref_alpha) = mine, theirs
    assert not alpha.requires_grad
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    if transformer:  # PyG's TransformerConv returns the adjacency as passed
        assert adj is passed
        return
    assert adj.layout == ref_adj.layout and adj.shape == ref_adj.shape, (adj, ref_adj)
    if adj.layout == torch.sparse_coo:
        assert adj.is_coalesced() and ref_adj.is_coalesced()
        assert torch.equal(adj.indices(), ref_adj.indices())
    else:
        assert torch.equal(adj.crow_indices(), ref_adj.crow_indices())
        assert torch.equal(adj.col_indices(), ref_adj.col_indices())
    assert_close(adj.values(), ref_adj.values().detach(), tol=TOL, name="attention as the adjacency's values")


LAYERS = [
    ("GATConv", dict(heads=H, residual=True)),
    ("GATConv", dict(heads=2, concat=False, add_self_loops=False)),
    ("GATv2Conv", dict(heads=2)),
    ("GATv2Conv", dict(heads=2, add_self_loops=False, share_weights=True)),
    ("TransformerConv", dict(heads=2, beta=True)),
]


def _adds_loops(cls_name: str, kwargs: dict) -> bool:
    return cls_name != "TransformerConv" and kwargs.get("add_self_loops", True)


# an uncoalesced COO adjacency only where self loops are added (PyG's other calls fail: test_errors_are_clear)
CASES = [(c, k, layout) for c, k in LAYERS for layout in LAYOUTS if layout != "coo-uncoalesced" or _adds_loops(c, k)]


@pytest.mark.parametrize("cls_name,kwargs,layout", CASES, ids=[f"{c}-{LAYERS.index((c, k))}-{lay}"
                                                                for c, k, lay in CASES])
def test_sparse_adjacency_matches_pyg(cls_name, kwargs, layout, gen, device):
    """The corner-case graph (self loops, duplicate edges, a super node, isolated nodes) as a sparse ``adj_t``."""
    adj = _adjacency(corner_case_edges(gen, N), (N, N), layout, gen)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    slope = {} if cls_name == "TransformerConv" else {"negative_slope": 0.25}
    ours, theirs = _pair(cls_name, F, C, gen=gen, device=device, **kwargs, **slope)
    xo, xt = _leaf(x, device), _leaf(x, "cpu")
    mine_adj = _copy(adj).to(device)
    out, weights = ours(xo, mine_adj, return_attention_weights=True)
    ref, ref_weights = theirs(xt, _copy(adj), return_attention_weights=True)
    _assert_same_weights([w.cpu() if w is not mine_adj else w for w in weights], ref_weights, mine_adj,
                         cls_name == "TransformerConv")
    _check(ours, theirs, out, ref, [("x", xo, xt)], gen)


@pytest.mark.parametrize("layout", ["coo-uncoalesced", "csr-duplicates"])
def test_agnn_with_a_sparse_adjacency(layout, gen, device):
    adj = _adjacency(corner_case_edges(gen, N), (N, N), layout, gen)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    for kwargs in (dict(), dict(add_self_loops=False)):
        if layout == "coo-uncoalesced" and kwargs:
            continue
        ours, theirs = _pair("AGNNConv", **kwargs, device=device)
        with torch.no_grad():
            ours.beta.fill_(1.5)
            theirs.beta.fill_(1.5)
        xo, xt = _leaf(x, device), _leaf(x, "cpu")
        _check(ours, theirs, ours(xo, _copy(adj).to(device)), theirs(xt, _copy(adj)), [("x", xo, xt)], gen)


@pytest.mark.parametrize("layout", ["coo", "csr-duplicates"])
@pytest.mark.parametrize("cls_name", ["GATConv", "TransformerConv"])
def test_edge_features_in_the_adjacency_order(cls_name, layout, gen, device):
    """``edge_attr`` row k belongs to the adjacency's k-th stored entry (PyG's ``to_edge_index`` order); GATConv
    without self loops (PyG takes no edge_attr with a sparse adjacency and self loops)."""
    adj = _adjacency(corner_case_edges(gen, N), (N, N), layout, gen)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    attr = torch.randn(adj._nnz(), 3, generator=gen, dtype=torch.float64)
    extra = dict(add_self_loops=False, negative_slope=0.25) if cls_name == "GATConv" else {}
    ours, theirs = _pair(cls_name, F, C, heads=2, edge_dim=3, gen=gen, device=device, **extra)
    xo, xt = _leaf(x, device), _leaf(x, "cpu")
    ao, at = _leaf(attr, device), _leaf(attr, "cpu")
    out, (_, alpha) = ours(xo, _copy(adj).to(device), ao, return_attention_weights=True)
    ref, (_, ref_alpha) = theirs(xt, _copy(adj), at, return_attention_weights=True)
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    _check(ours, theirs, out, ref, [("x", xo, xt), ("edge_attr", ao, at)], gen)


@pytest.mark.parametrize("sizes", [(23, 11), (9, 17)])
@pytest.mark.parametrize("cls_name,kwargs,layout", [
    ("GATConv", dict(heads=H, residual=True), "coo-uncoalesced"),
    ("GATConv", dict(heads=2, add_self_loops=False), "csr-duplicates"),
    ("GATv2Conv", dict(heads=2), "csr"),
    ("TransformerConv", dict(heads=2), "coo"),
])
def test_bipartite_sparse_adjacency_matches_pyg(sizes, cls_name, kwargs, layout, gen, device):
    """``adj_t [N_dst, N_src]`` with ``x = (x_src, x_dst)``: loops (when added) on the first ``min(N_src, N_dst)``
    nodes, at their sorted places."""
    n_src, n_dst = sizes
    edges = torch.stack([torch.randint(0, n_src, (60,), generator=gen), torch.randint(0, n_dst, (60,), generator=gen)])
    adj = _adjacency(edges, (n_dst, n_src), layout, gen)
    x_src = torch.randn(n_src, F, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, F, generator=gen, dtype=torch.float64)
    # PyG's sparse add_self_loops reduces the adjacency's values with fill_value ('mean' by default) over
    # min(N_src, N_dst) rows, out of bounds when N_dst > N_src: a constant fill (the values are ignored anyway)
    slope = {} if cls_name == "TransformerConv" else {"negative_slope": 0.25, "fill_value": 0.5}
    ours, theirs = _pair(cls_name, F, C, gen=gen, device=device, **kwargs, **slope)
    so, do_, st, dt = _leaf(x_src, device), _leaf(x_dst, device), _leaf(x_src, "cpu"), _leaf(x_dst, "cpu")
    mine_adj = _copy(adj).to(device)
    out, weights = ours((so, do_), mine_adj, return_attention_weights=True)
    ref, ref_weights = theirs((st, dt), _copy(adj), return_attention_weights=True)
    _assert_same_weights([w.cpu() if w is not mine_adj else w for w in weights], ref_weights, mine_adj,
                         cls_name == "TransformerConv")
    _check(ours, theirs, out, ref, [("x_src", so, st), ("x_dst", do_, dt)], gen)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_an_empty_adjacency(layout, gen, device):
    empty = _adjacency(torch.zeros(2, 0, dtype=torch.long), (5, 5), layout, gen)
    x = torch.randn(5, F, generator=gen, dtype=torch.float64)
    for cls_name, kwargs in (("GATConv", dict()), ("GATConv", dict(add_self_loops=False)), ("TransformerConv", {})):
        ours, theirs = _pair(cls_name, F, C, heads=2, gen=gen, device=device, **kwargs)
        out, weights = ours(x.to(device), _copy(empty).to(device), return_attention_weights=True)
        ref, ref_weights = theirs(x, _copy(empty), return_attention_weights=True)
        assert_close(out, ref, tol=TOL, name=f"{cls_name} {kwargs} on an empty adjacency")
        if cls_name == "GATConv":
            _assert_same_weights([w.cpu() for w in weights], ref_weights, None, False)
    agnn = fused.AGNNConv(add_self_loops=False).to(device)
    assert_close(agnn(x.to(device), _copy(empty).to(device)), PyG.AGNNConv(add_self_loops=False)(x, _copy(empty)),
                 tol=TOL, name="AGNNConv on an empty adjacency")


def test_values_are_ignored_and_index_dtypes(gen, device):
    """Only the stored entries count: other values, explicit zeros and int32 CSR indices give the same output."""
    adj = _adjacency(corner_case_edges(gen, N), (N, N), "csr", gen).to(device)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64).to(device)
    zeros = torch.sparse_csr_tensor(adj.crow_indices().int(), adj.col_indices().int(), torch.zeros_like(adj.values()),
                                    adj.shape)
    for layer in (fused.GATConv(F, C, heads=2).double().to(device), fused.TransformerConv(F, C).double().to(device)):
        want = layer(x, adj)
        assert torch.equal(layer(x, zeros), want)
        assert torch.equal(layer(x, adj.to_sparse_coo().coalesce()), want)


def test_the_graph_of_an_adjacency_is_cached_and_a_csr_needs_no_sort(gen, device, monkeypatch):
    edges = corner_case_edges(gen, N)
    adj = _adjacency(edges, (N, N), "csr-duplicates", gen).to(device)
    sorts = []
    with monkeypatch.context() as patch:
        patch.setattr(torch, "sort", lambda *a, _sort=torch.sort, **k: sorts.append(a[0].numel()) or _sort(*a, **k))
        Graph.from_adj_t(adj)
    assert sorts == [edges.shape[1]]  # the reverse CSR's only (an edge_index's graph sorts by destination first)
    x = torch.randn(N, F, generator=gen).to(device)
    layer = fused.GATConv(F, C, heads=2).to(device)
    layer(x, adj)
    base = as_graph_of_adj_t(adj)
    looped = base.pyg_sparse_self_loops(N)
    layer(x, adj)
    assert as_graph_of_adj_t(adj) is base and base.pyg_sparse_self_loops(N) is looped
    # the CSR as given: input order = CSR order, the same CSR as the edges' own graph
    assert torch.equal(base.csr_eid.long().cpu(), torch.arange(edges.shape[1]))
    reference = Graph(edges, N)
    for name in ("indptr", "csr_src", "rev_indptr", "rev_dst"):
        assert torch.equal(getattr(base, name).cpu(), getattr(reference, name)), name
    # the self-looped graph: unique (destination, source) pairs, sorted, one loop per node
    pairs = torch.unique(torch.cat([edges[:, edges[0] != edges[1]], torch.arange(N).repeat(2, 1)], 1).flip(0), dim=1)
    assert torch.equal(looped.edge_index.flip(0).cpu(), pairs)
    assert torch.equal(looped.csr_eid.long().cpu(), torch.arange(pairs.shape[1]))
    adj.col_indices()[0] = (adj.col_indices()[0] + 1) % N  # edited in place: a new graph
    assert as_graph_of_adj_t(adj) is not base
    layer(x, adj)


class SparseTensor:
    """Stands for ``torch_sparse.SparseTensor`` (not installed): the layers refuse it by name."""

    storage = None

    def csr(self):
        raise AssertionError("not to be read")


def test_errors_are_clear(gen, device):
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen).to(device)
    layer = fused.GATConv(F, C, heads=2).to(device)
    coo = _adjacency(edges, (N, N), "coo-uncoalesced", gen).float().to(device)
    for conv in (layer, fused.TransformerConv(F, C).to(device), fused.AGNNConv()):
        with pytest.raises(TypeError, match="to_torch_sparse_csr_tensor"):
            conv(x, SparseTensor())
    with pytest.raises(TypeError, match="to_sparse_csr"):
        layer(x, coo.coalesce().to_sparse_csc())
    with pytest.raises(ValueError, match="dense"):
        layer(x, torch.sparse_coo_tensor(edges.flip(0), torch.ones(edges.shape[1], 3), (N, N, 3)).to(device))
    with pytest.raises(ValueError, match=r"shape \[29, 28\], expected \[N, N\]"):
        layer(x, torch.sparse_coo_tensor(edges.flip(0) % 28, torch.ones(edges.shape[1]), (N, 28)).to(device))
    with pytest.raises(ValueError, match=r"expected \[N_dst, N_src\] = \[10, 29\]"):
        layer((x, x[:10]), coo)
    for conv in (fused.GATConv(F, C, add_self_loops=False), fused.TransformerConv(F, C)):
        with pytest.raises(ValueError, match="uncoalesced"):
            conv.to(device)(x, coo)
    with_edges = fused.GATConv(F, C, heads=2, edge_dim=3).to(device)
    with pytest.raises(ValueError, match="add_self_loops=False"):
        with_edges(x, coo.coalesce(), torch.randn(coo.coalesce()._nnz(), 3, device=device))
    with pytest.raises(ValueError, match="edge_attr"):
        fused.GATConv(F, C, edge_dim=3, add_self_loops=False).to(device)(x, coo.coalesce(), torch.randn(3, 3))
    bad = torch.sparse_csr_tensor(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), torch.ones(2), (2, 2))
    with pytest.raises(ValueError, match="valid CSR"):
        fused.GATConv(F, C)(torch.randn(2, F), bad)


@pytest.mark.parametrize("in_channels,widths,kwargs", [
    ((6, 5), (6, 5), dict(heads=2)),
    ((6, 5), (6, 5), dict(heads=2, concat=False, beta=True, edge_dim=3)),
    ((-1, 5), (6, 5), dict(heads=2)),
    ((-1, -1), (6, 5), dict(heads=2, root_weight=False)),
])
def test_transformer_with_sources_and_destinations_of_different_widths(in_channels, widths, kwargs, gen, device):
    """PyG's ``in_channels=(in_src, in_dst)``: lin_key / lin_value over the sources' width, lin_query / lin_skip
    over the destinations'; PyG's state_dict (names and shapes) loads unchanged; lazy ``-1`` sides take the first
    call's widths."""
    n_src, n_dst = 13, 8
    edges = torch.stack([torch.randint(0, n_src, (40,), generator=gen), torch.randint(0, n_dst, (40,), generator=gen)])
    x_src = torch.randn(n_src, widths[0], generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, widths[1], generator=gen, dtype=torch.float64)
    attr = torch.randn(40, 3, generator=gen, dtype=torch.float64)
    ours = fused.TransformerConv(in_channels, C, **kwargs).double()
    theirs = PyG.TransformerConv(in_channels, C, **kwargs).double()
    assert repr(ours) == repr(theirs)
    so, do_, st, dt = _leaf(x_src, device), _leaf(x_dst, device), _leaf(x_src, "cpu"), _leaf(x_dst, "cpu")
    args, theirs_args = ((attr.to(device),), (attr,)) if "edge_dim" in kwargs else ((), ())
    if -1 in in_channels:
        ours = ours.to(device)
        ours((so, do_), edges.to(device), *args)  # materializes
        with torch.no_grad():
            theirs((st, dt), edges, *theirs_args)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
        k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert ours.lin_key.weight.shape[1] == widths[0] and ours.lin_query.weight.shape[1] == widths[1]
    ours = ours.to(device)
    for p in ours.parameters():
        p.grad = None
    out = ours((so, do_), edges.to(device), *args)
    ref = theirs((st, dt), edges, *theirs_args)
    _check(ours, theirs, out, ref, [("x_src", so, st), ("x_dst", do_, dt)], gen)
    no_edges = edges[:, :0].to(device)
    with pytest.raises(ValueError, match="as a pair"):
        ours(x_src.to(device), no_edges, *args)
    with pytest.raises(ValueError, match="in_feats"):
        ours((x_dst.to(device), x_src.to(device)), no_edges, *args)
    fresh = fused.TransformerConv(in_channels, C, **kwargs).double()
    fresh.load_state_dict(theirs.state_dict(), strict=True)
    with torch.no_grad():
        assert_close(fresh.to(device)((so, do_), edges.to(device), *args), ref, tol=TOL, name="loaded state_dict")
