"""Property-based tests (hypothesis) over random small graphs — isolated nodes, duplicate edges,
self loops, a hub — and random head counts and sizes: the Graph's CSR / reverse CSR / edge
maps, the schedules' coverage, and the fused GAT against the float64 reference."""

import torch
from gnn_testing import SCHEDULES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusecore import PhiloxStream
from fusecore.testing import TOLERANCES, assert_close, test_device
from gnnfuse import Graph, ScheduleOptions, ops
from gnnfuse.reference import gat_attention_reference


@st.composite
def graphs(draw, max_nodes: int = 24, min_nodes: int = 0):
    """``(edge_index [2, E] int64, num_nodes)``: random edges among the first nodes (the rest
    isolated), optionally a hub receiving many edges, one self loop per node, duplicates."""
    num_nodes = draw(st.integers(min_nodes, max_nodes))
    if num_nodes == 0:
        return torch.zeros(2, 0, dtype=torch.int64), 0
    active = draw(st.integers(1, num_nodes))
    node = st.integers(0, active - 1)
    pairs = draw(st.lists(st.tuples(node, node), max_size=3 * max_nodes))
    if draw(st.booleans()):  # a hub: one node receives from many
        hub = draw(node)
        pairs += [(draw(node), hub) for _ in range(draw(st.integers(5, 4 * max_nodes)))]
    if draw(st.booleans()):
        pairs += [(i, i) for i in range(active)]
    if pairs and draw(st.booleans()):
        pairs += pairs[: draw(st.integers(1, len(pairs)))]
    edges = torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2).t()
    order = torch.randperm(edges.shape[1], generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16))))
    return edges[:, order].contiguous(), num_nodes


schedule_options = st.builds(
    ScheduleOptions,
    light_max_degree=st.one_of(st.none(), st.integers(-1, 64)),
    split_degree=st.one_of(st.none(), st.integers(0, 40)),
    piece_edges=st.one_of(st.none(), st.integers(1, 20)),
)


@settings(max_examples=60, deadline=None)
@given(graph=graphs(), index_dtype=st.sampled_from([None, torch.int32, torch.int64]))
def test_csr_reverse_csr_and_edge_maps_hold_every_edge_once(graph, index_dtype):
    edges, n = graph
    g = Graph(edges, n, index_dtype=index_dtype)
    e = edges.shape[1]
    assert (g.num_nodes, g.num_edges) == (n, e) and torch.equal(g.edge_index, edges)
    dtypes = {g.indptr.dtype, g.csr_src.dtype, g.csr_eid.dtype, g.rev_pos.dtype, g.rev_dst.dtype}
    assert dtypes == {index_dtype or torch.int32}
    src, dst = edges
    eid = g.csr_eid.long()
    # CSR: a permutation of the input edges, grouped by destination, input order within a row
    assert torch.equal(torch.sort(eid).values, torch.arange(e))
    assert torch.equal(src[eid], g.csr_src.long()) and torch.equal(dst[eid], g.csr_dst.long())
    in_degree = torch.bincount(dst, minlength=n)
    assert torch.equal(g.in_degree, in_degree)
    assert torch.equal(g.indptr.long(), torch.cat([torch.zeros(1, dtype=torch.long), in_degree.cumsum(0)]))
    assert torch.equal(g.csr_dst.long(), torch.repeat_interleave(torch.arange(n), in_degree))
    same_row = g.csr_dst[1:] == g.csr_dst[:-1]
    assert torch.all(eid[1:][same_row] > eid[:-1][same_row])
    # reverse CSR: every CSR position once, grouped by source, destinations through the map
    rev = g.rev_pos.long()
    out_degree = torch.bincount(src, minlength=n)
    assert torch.equal(torch.sort(rev).values, torch.arange(e))
    assert torch.equal(g.rev_indptr.long(), torch.cat([torch.zeros(1, dtype=torch.long), out_degree.cumsum(0)]))
    assert torch.equal(g.csr_src.long()[rev], torch.repeat_interleave(torch.arange(n), out_degree))
    assert torch.equal(g.rev_dst.long(), g.csr_dst.long()[rev])
    # within a source row, CSR order is kept (destinations increase)
    same_src = g.csr_src.long()[rev][1:] == g.csr_src.long()[rev][:-1]
    assert torch.all(rev[1:][same_src] > rev[:-1][same_src])
    assert g.has_zero_in_degree() == bool((in_degree == 0).any())


class _DGLLike:
    def __init__(self, src, dst, n):
        self._edges, self._n = (src, dst), n

    def edges(self):
        return self._edges

    def num_nodes(self):
        return self._n


@settings(max_examples=30, deadline=None)
@given(graph=graphs())
def test_every_input_kind_builds_the_same_csr(graph):
    import numpy as np
    import scipy.sparse as sp
    from torch_geometric.data import Data

    edges, n = graph
    ref = Graph(edges, n)
    src, dst = edges
    weights = np.ones(edges.shape[1])  # COO keeps duplicate entries: each one an edge
    others = [
        Graph((src.int(), dst.int()), n), Graph(edges.t().contiguous().t(), n), Graph(_DGLLike(src, dst, n)),
        Graph(Data(edge_index=edges, num_nodes=n)), Graph(sp.coo_matrix((weights, (src.numpy(), dst.numpy())), (n, n))),
    ]
    for g in others:
        assert (g.num_nodes, g.num_edges) == (n, ref.num_edges)
        for name in ("indptr", "csr_src", "rev_indptr", "rev_dst", "in_degree", "out_degree"):
            assert torch.equal(getattr(g, name).long(), getattr(ref, name).long()), name


@settings(max_examples=60, deadline=None)
@given(graph=graphs(min_nodes=1), options=schedule_options, heads=st.integers(1, 6), dim=st.integers(1, 70))
def test_schedules_cover_every_row_once_with_its_own_edge_range(graph, options, heads, dim):
    edges, n = graph
    g = Graph(edges, n)
    schedule = g.schedule(heads, dim, torch.float32, options)
    for buckets, degree, indptr in ((schedule.incoming, g.in_degree, g.indptr),
                                    (schedule.outgoing, g.out_degree, g.rev_indptr)):
        lists = [(rows, starts, stops) for _, rows, starts, stops in buckets.light] + [buckets.medium]
        rows = torch.cat([r.long() for r, _, _ in lists] + [buckets.super_rows.long()])
        assert torch.equal(torch.sort(rows).values, torch.arange(n))
        for r, starts, stops in lists:
            assert torch.equal(starts.long(), indptr[r.long()].long())
            assert torch.equal(stops.long(), indptr[r.long() + 1].long())
        for width, light, _, _ in buckets.light:
            assert width & (width - 1) == 0 and int(degree[light.long()].max()) <= width
        medium_degree = degree[buckets.medium[0].long()]
        assert torch.all(medium_degree[:-1] >= medium_degree[1:])  # longest rows start first
        ptr = buckets.super_piece_ptr.tolist()
        for s, row in enumerate(buckets.super_rows.long().tolist()):
            starts = buckets.piece_start[ptr[s]:ptr[s + 1]].tolist()
            stops = buckets.piece_stop[ptr[s]:ptr[s + 1]].tolist()
            assert starts[0] == int(indptr[row]) and stops[-1] == int(indptr[row + 1]) and starts[1:] == stops[:-1]
            assert max(b - a for a, b in zip(starts, stops)) <= buckets.piece_edges
            assert torch.all(buckets.piece_row[ptr[s]:ptr[s + 1]] == row)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    graph=graphs(max_nodes=16, min_nodes=1),
    heads=st.integers(1, 5),
    dim=st.integers(1, 9),
    schedule=st.sampled_from(sorted(SCHEDULES)),
    dropout=st.sampled_from([0.0, 0.3]),
    seed=st.integers(0, 2**31 - 1),
)
def test_fused_gat_matches_the_float64_reference(graph, heads, dim, schedule, dropout, seed):
    edges, n = graph
    device = test_device()
    g = Graph(edges.to(device), n)
    gen = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(shape, generator=gen).to(device).requires_grad_(True)
              for shape in ((n, heads, dim), (1, heads, dim), (1, heads, dim))]
    out = ops.gat(g, *leaves, dropout=dropout, rng=PhiloxStream(seed, offset=3), schedule=SCHEDULES[schedule])
    grad_out = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, leaves, grad_out.to(device))
    refs = [t.detach().cpu().double().requires_grad_(True) for t in leaves]
    el, er = (refs[0] * refs[1]).sum(-1), (refs[0] * refs[2]).sum(-1)
    ref, _ = gat_attention_reference(g.to("cpu"), refs[0], el, er, dropout=dropout, seed=seed, offset=3)
    ref_grads = torch.autograd.grad(ref, refs, grad_out.double())
    tol = TOLERANCES[torch.float32]
    assert_close(out, ref, tol=tol, name="out")
    assert_close(grads[0], ref_grads[0], tol=tol, name="grad wh")
    # ∂attn = Σ_edges ∂score · wh: on rows with equal scores (duplicate edges, one neighbour) the
    # terms cancel to 0 exactly, so the error is bounded by rounding of the terms, ‖g‖·‖wh‖.
    terms = float(grad_out.double().norm() * refs[0].detach().norm())
    for name, got, expected in zip(("attn_l", "attn_r"), grads[1:], ref_grads[1:]):
        error = float((got.cpu().double() - expected).norm())
        assert error <= tol * float(expected.norm()) + 1e-5 * terms, f"grad {name}: error {error:.3e}"
