"""gnnfuse.Graph: CSR / reverse CSR against independent constructions, inputs, checks, schedules."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from gnn_testing import SCHEDULES, corner_case_edges

from gnnfuse import Graph, ScheduleOptions, as_graph
from gnnfuse.graph import narrowest_index_dtype


class FakeDGLGraph:
    """Exposes only the public methods gnnfuse reads from a DGL graph."""

    def __init__(self, src, dst, n):
        self._src, self._dst, self._n = src, dst, n

    def edges(self):
        return self._src, self._dst

    def num_nodes(self):
        return self._n


def test_csr_and_reverse_csr_hold_every_edge(gen):
    edges = corner_case_edges(gen)
    n = 29
    g = Graph(edges, n)
    src, dst = edges[0].numpy(), edges[1].numpy()
    np.testing.assert_array_equal(g.indptr.numpy(), np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))]))
    # The CSR holds exactly the input edges, grouped by destination, input order kept in a row.
    eid = g.csr_eid.long()
    assert torch.equal(edges[0, eid], g.csr_src.long())
    assert torch.equal(edges[1, eid], g.csr_dst.long())
    for row in range(n):
        lo, hi = int(g.indptr[row]), int(g.indptr[row + 1])
        assert torch.all(edges[1, eid[lo:hi]] == row)
        assert torch.all(eid[lo:hi][1:] > eid[lo:hi][:-1])
    # Reverse CSR: every CSR position once, grouped by source, destinations via the map.
    np.testing.assert_array_equal(g.rev_indptr.numpy(), np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))]))
    assert torch.equal(torch.sort(g.rev_pos.long()).values, torch.arange(g.num_edges))
    assert torch.equal(g.rev_dst.long(), g.csr_dst.long()[g.rev_pos.long()])
    for row in range(n):
        lo, hi = int(g.rev_indptr[row]), int(g.rev_indptr[row + 1])
        assert torch.all(g.csr_src[g.rev_pos[lo:hi].long()] == row)
    assert g.in_degree.tolist() == np.bincount(dst, minlength=n).tolist()
    assert g.index_dtype == torch.int32


def test_every_input_kind_gives_the_same_graph(gen):
    edges = corner_case_edges(gen)
    n = 29
    ref = Graph(edges, n)
    from torch_geometric.data import Data

    matrix = sp.coo_matrix((np.ones(edges.shape[1]), (edges[0].numpy(), edges[1].numpy())), shape=(n, n))
    others = [
        Graph((edges[0], edges[1]), n),
        Graph(Data(edge_index=edges, num_nodes=n)),
        Graph(FakeDGLGraph(edges[0], edges[1], n)),
        Graph(edges.int(), n),
    ]
    for g in others:
        assert g.num_nodes == n and g.num_edges == ref.num_edges
        assert torch.equal(g.indptr, ref.indptr) and torch.equal(g.csr_src, ref.csr_src)
    # scipy sums duplicates only on conversion to CSR; COO keeps every entry.
    g = Graph(matrix)
    assert g.num_nodes == n and torch.equal(g.in_degree, ref.in_degree)


def test_num_nodes_default_and_empty_graphs():
    g = Graph(torch.tensor([[0, 4], [1, 1]]))
    assert g.num_nodes == 5 and g.in_degree.tolist() == [0, 2, 0, 0, 0]
    empty = Graph(torch.zeros(2, 0, dtype=torch.long))
    assert empty.num_nodes == 0 and empty.num_edges == 0
    no_edges = Graph(torch.zeros(2, 0, dtype=torch.long), num_nodes=4)
    assert no_edges.indptr.tolist() == [0, 0, 0, 0, 0] and no_edges.has_zero_in_degree()


@pytest.mark.parametrize(
    "edges, num_nodes, error, words",
    [
        (torch.tensor([[0, -1], [1, 1]]), 3, ValueError, "-1"),
        (torch.tensor([[0, 3], [1, 1]]), 3, ValueError, "num_nodes"),
        (torch.tensor([[0, 1, 2]]), None, ValueError, "[2, E]"),
        (torch.tensor([[0.0, 1.0], [1.0, 0.0]]), None, TypeError, "integer"),
        (torch.tensor([[0, 1], [1, 0]]), -2, ValueError, "num_nodes"),
        ("edges", None, TypeError, "str"),
    ],
)
def test_bad_edges_raise_clear_errors(edges, num_nodes, error, words):
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")):
        Graph(edges, num_nodes)


def test_self_loop_helpers_match_pyg(gen):
    from torch_geometric.utils import add_self_loops, remove_self_loops

    edges = corner_case_edges(gen)
    n = 29
    g = Graph(edges, n).remove_self_loops().add_self_loops()
    pyg, _ = add_self_loops(remove_self_loops(edges)[0], num_nodes=n)
    assert torch.equal(g.in_degree, torch.bincount(pyg[1], minlength=n))
    assert int((g.csr_src == g.csr_dst).sum()) == n


def test_index_dtype_switches_to_int64_beyond_int32():
    assert narrowest_index_dtype(2**31 - 1) == torch.int32
    assert narrowest_index_dtype(2**31) == torch.int64
    g = Graph(torch.tensor([[0, 1], [1, 0]]), index_dtype=torch.int64)
    assert g.indptr.dtype == g.csr_src.dtype == g.rev_pos.dtype == torch.int64


def test_schedule_is_cached_per_shape_and_dtype(gen):
    g = Graph(corner_case_edges(gen), 29)
    first = g.schedule(4, 8, torch.float32)
    assert g.schedule(4, 8, torch.float32) is first
    assert g.schedules.hits == 1 and g.schedules.misses == 1
    assert g.schedule(4, 8, torch.bfloat16) is not first
    assert g.schedules.misses == 2


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_buckets_cover_every_row_once(gen, name):
    g = Graph(corner_case_edges(gen), 29)
    schedule = g.schedule(3, 5, torch.float32, SCHEDULES[name])
    for buckets, degree, indptr in ((schedule.incoming, g.in_degree, g.indptr),
                                    (schedule.outgoing, g.out_degree, g.rev_indptr)):
        lists = [(r, a, b) for _, r, a, b in buckets.light] + [buckets.medium]
        rows = [r.long() for r, _, _ in lists] + [buckets.super_rows.long()]
        assert torch.equal(torch.sort(torch.cat(rows)).values, torch.arange(29))
        for r, starts, stops in lists:  # the ranges beside the rows are the rows' CSR ranges
            assert torch.equal(starts.long(), indptr[r.long()].long())
            assert torch.equal(stops.long(), indptr[r.long() + 1].long())
        for width, light, _, _ in buckets.light:
            assert int(degree[light.long()].max()) <= width
        # pieces of each super row are contiguous and tile its edge range exactly
        for s, row in enumerate(buckets.super_rows.long().tolist()):
            first, last = buckets.super_piece_ptr[s], buckets.super_piece_ptr[s + 1]
            starts = buckets.piece_start[first:last].tolist()
            stops = buckets.piece_stop[first:last].tolist()
            assert starts[0] == int(indptr[row]) and stops[-1] == int(indptr[row + 1])
            assert starts[1:] == stops[:-1]
            assert max(b - a for a, b in zip(starts, stops)) <= buckets.piece_edges
    if name == "super":
        assert schedule.incoming.counts()["super"] > 0 and schedule.incoming.counts()["medium"] > 0
    if name == "light":
        assert schedule.incoming.counts()["light"] == 29


def test_schedule_options_are_checked():
    with pytest.raises(ValueError, match="light_max_degree"):
        ScheduleOptions(light_max_degree=65)
    with pytest.raises(ValueError, match="piece_edges"):
        ScheduleOptions(piece_edges=0)


def test_as_graph_caches_by_tensor_and_sees_in_place_edits():
    edges = torch.tensor([[0, 1, 2], [1, 2, 0]])
    first = as_graph(edges)
    assert as_graph(edges) is first
    edges[0, 0] = 2
    rebuilt = as_graph(edges)
    assert rebuilt is not first and rebuilt.csr_src.tolist() == [2, 2, 1]


def test_light_width_classes_split_by_degree_and_merge_when_small():
    from gnnfuse.schedule import _light_classes

    degree = torch.tensor([0, 1, 2, 3, 4, 5, 9, 16, 17])
    separate = _light_classes(degree, 16, lambda width: 1)
    assert [(w, sorted(r.tolist())) for w, r in separate] == [
        (1, [0, 1]), (2, [2]), (4, [3, 4]), (8, [5]), (16, [6, 7])
    ]
    merged = _light_classes(degree, 16, lambda width: 3)
    assert [(w, sorted(r.tolist())) for w, r in merged] == [(2, [0, 1, 2]), (8, [3, 4, 5]), (16, [6, 7])]


@pytest.mark.parametrize("method", ["rcm", "degree"])
def test_reordered_graph_gives_the_same_results_relabelled(gen, method):
    from gnnfuse.reference import gat_attention_reference

    graph = Graph(corner_case_edges(gen), 29)
    relabelled, perm = graph.reordered(method)
    assert torch.equal(torch.sort(perm).values, torch.arange(29))
    wh = torch.randn(29, 2, 3, generator=gen, dtype=torch.float64)
    el, er = torch.randn(2, 29, 2, generator=gen, dtype=torch.float64)
    out, _ = gat_attention_reference(graph, wh, el, er)
    moved, _ = gat_attention_reference(relabelled, wh[perm], el[perm], er[perm])
    assert torch.allclose(moved, out[perm])
    if method == "degree":
        assert torch.all(relabelled.in_degree[:-1] >= relabelled.in_degree[1:])
    with pytest.raises(ValueError, match="method"):
        graph.reordered("random")
