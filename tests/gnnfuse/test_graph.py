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
        # the list of all light rows (one row-sum launch) is the width classes in order, ranges beside
        for joined, parts in zip(buckets.light_all, zip(*lists[:-1])):
            assert torch.equal(joined, torch.cat(parts))
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
    with pytest.raises(ValueError, match="tile_elements must be None or an int >= 256"):
        ScheduleOptions(tile_elements=100)
    with pytest.raises(ValueError, match="num_warps must be a power of two in 1 .. 32, got 6"):
        ScheduleOptions(num_warps=6)
    with pytest.raises(ValueError, match="edge_lanes must be None or a bool, got 1"):
        ScheduleOptions(edge_lanes=1)
    for widths in ((), (4, 2), (3,), (4, 128), [4, 16], (2, 2)):
        with pytest.raises(ValueError, match="light_widths must be None or a non-empty tuple of increasing powers"):
            ScheduleOptions(light_widths=widths)


def test_tile_options_size_the_edge_blocks():
    graph = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3)
    default = graph.schedule(8, 64, torch.float32)
    tuned = graph.schedule(8, 64, torch.float32, ScheduleOptions(tile_elements=default.tiles.tile_elements // 4,
                                                                num_warps=8))
    assert tuned.num_warps == 8 and default.num_warps == 4
    assert tuned.medium_block_e == default.medium_block_e // 4


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
    chosen = _light_classes(degree, 16, lambda width: 1, (4, 16))
    assert [(w, sorted(r.tolist())) for w, r in chosen] == [(4, [0, 1, 2, 3, 4]), (16, [5, 6, 7])]
    # widths above what light_max_degree needs shrink to it
    capped = _light_classes(degree, 6, lambda width: 1, (4, 64))
    assert [(w, sorted(r.tolist())) for w, r in capped] == [(4, [0, 1, 2, 3, 4]), (8, [5])]


def test_light_widths_cap_the_light_rows():
    # rows above the widest light width go to the row kernel, whatever light_max_degree says
    graph = Graph(torch.stack([torch.arange(12) % 4, torch.tensor([0] * 9 + [1, 2, 2])]), 4)
    schedule = graph.schedule(2, 4, torch.float32, ScheduleOptions(light_max_degree=16, light_widths=(2,)))
    assert [(w, r.tolist()) for w, r, _, _ in schedule.incoming.light] == [(2, [1, 2, 3])]
    assert schedule.incoming.medium[0].tolist() == [0] and schedule.light_max_degree == 2


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


# ---------------------------------------------------------------- input validation (issue 8)


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int8, torch.bool, torch.float64])
def test_edge_index_dtypes_other_than_int32_int64_are_refused(dtype):
    edges = torch.tensor([[0, 1], [1, 0]]).to(dtype)
    with pytest.raises(TypeError, match=f"int32 or int64, got dtype {dtype}"):
        Graph(edges)
    with pytest.raises(TypeError, match="sources"):
        Graph((edges[0], edges[1]))


def test_edge_index_on_the_meta_device_is_refused():
    with pytest.raises(ValueError, match="'meta'"):
        Graph(torch.zeros(2, 3, dtype=torch.long, device="meta"))


@pytest.mark.parametrize(
    "num_nodes, error, words",
    [(3.0, TypeError, "num_nodes must be an int"), (True, TypeError, "bool"), ("4", TypeError, "str"),
     (torch.tensor([4, 5]), TypeError, "tensor"), (-1, ValueError, "got -1")],
)
def test_num_nodes_must_be_a_non_negative_integer(num_nodes, error, words):
    with pytest.raises(error, match=words):
        Graph(torch.tensor([[0, 1], [1, 0]]), num_nodes)


def test_num_nodes_accepts_numpy_and_tensor_integers():
    for n in (np.int64(6), torch.tensor(6), np.uint16(6)):
        g = Graph(torch.tensor([[0, 1], [1, 0]]), n)
        assert g.num_nodes == 6 and type(g.num_nodes) is int


def test_num_nodes_disagreeing_with_the_input_is_refused():
    matrix = sp.csr_matrix(np.eye(4))
    with pytest.raises(ValueError, match="num_nodes=5 but the csr_matrix given as the graph has 4 nodes"):
        Graph(matrix, 5)
    with pytest.raises(ValueError, match="FakeDGLGraph"):
        Graph(FakeDGLGraph(torch.tensor([0]), torch.tensor([1]), 3), 7)
    assert Graph(matrix, 4).num_nodes == 4


def test_pyg_data_without_num_nodes_counts_from_the_ids_without_warnings(recwarn):
    from torch_geometric.data import Data

    edges = torch.tensor([[0, 4], [1, 1]])
    assert Graph(Data(edge_index=edges)).num_nodes == 5
    assert Graph(Data(edge_index=edges), 9).num_nodes == 9  # a guessed count does not overrule
    assert Graph(Data(edge_index=edges, x=torch.zeros(7, 2))).num_nodes == 7
    assert not [w for w in recwarn if "num_nodes" in str(w.message)]
    with pytest.raises(TypeError, match="Data.edge_index must be an edge_index tensor"):
        Graph(Data(num_nodes=4))
    with pytest.raises(ValueError, match="node id 4"):
        Graph(Data(edge_index=edges, num_nodes=3))
    from torch_geometric.data import HeteroData

    hetero = HeteroData()
    hetero["paper", "cites", "paper"].edge_index = edges
    with pytest.raises(TypeError, match="HeteroData holds several edge types"):
        Graph(hetero)


class DGLWithoutNumNodes:
    def edges(self):
        return torch.tensor([0]), torch.tensor([1])

    def adj_tensors(self, fmt):
        return torch.tensor([0, 0, 1]), torch.tensor([0]), torch.tensor([0])


class DGLWithBadEdges(FakeDGLGraph):
    def edges(self):
        return self._src


def test_dgl_like_graphs_are_read_by_duck_typing_or_refused_clearly():
    src, dst = torch.tensor([0, 2, 2]), torch.tensor([1, 1, 0])
    g = Graph(FakeDGLGraph(src, dst, 4))
    assert g.num_nodes == 4 and g.in_degree.tolist() == [1, 2, 0, 0]
    with pytest.raises(TypeError, match=r"DGLWithoutNumNodes .* no callable num_nodes\(\)"):
        Graph(DGLWithoutNumNodes())
    with pytest.raises(TypeError, match=r"edges\(\) must return \(src, dst\)"):
        Graph(DGLWithBadEdges(src, dst, 4))
    with pytest.raises(ValueError, match="equal length"):
        Graph(FakeDGLGraph(src, dst[:2], 4))
    with pytest.raises(TypeError, match="int32 or int64"):
        Graph(FakeDGLGraph(src.float(), dst, 4))
    with pytest.raises(TypeError, match=r"num_nodes\(\) must be an int"):
        Graph(FakeDGLGraph(src, dst, 4.5))


SCIPY_FORMATS = ["bsr", "coo", "csc", "csr", "dia", "dok", "lil"]


@pytest.mark.parametrize("kind", ["matrix", "array"])
def test_every_scipy_sparse_format_gives_one_edge_per_nonzero(gen, kind):
    from torch_geometric.utils import from_scipy_sparse_matrix

    n = 12
    dense = (torch.rand(n, n, generator=gen) < 0.3).double().numpy() * np.arange(1, n + 1)
    dense[:, -2:] = 0  # nodes without incoming edges
    base = (sp.coo_matrix if kind == "matrix" else sp.coo_array)(dense)
    pyg, _ = from_scipy_sparse_matrix(sp.coo_matrix(dense))
    ref = Graph(pyg, n)
    for fmt in SCIPY_FORMATS:
        matrix = base.asformat(fmt)
        if fmt == "bsr":
            matrix = matrix.tobsr(blocksize=(4, 4))  # blocks store zeros: not edges
        g = Graph(matrix)
        assert g.num_nodes == n and g.num_edges == ref.num_edges, fmt
        assert torch.equal(g.indptr, ref.indptr) and torch.equal(g.csr_src, ref.csr_src), fmt
    explicit_zero = sp.csr_matrix((np.array([1.0, 0.0]), (np.array([0, 1]), np.array([1, 2]))), shape=(3, 3))
    assert Graph(explicit_zero).edge_index.tolist() == [[0], [1]]
    with pytest.raises(ValueError, match="square"):
        Graph(sp.csr_matrix((3, 4)))


def test_strided_and_transposed_edge_tensors_are_read_as_they_are(gen):
    edges = corner_case_edges(gen)
    ref = Graph(edges, 29)
    transposed = edges.t().contiguous().t()  # [2, E] view of an [E, 2] tensor
    strided = torch.stack([edges, edges], dim=2)[:, :, 1]  # every other element of storage
    assert not transposed.is_contiguous() and not strided.is_contiguous()
    for view in (transposed, strided, (edges[0, :], edges.t()[:, 1])):
        g = Graph(view, 29)
        assert torch.equal(g.indptr, ref.indptr) and torch.equal(g.csr_src, ref.csr_src)
        assert torch.equal(g.rev_pos, ref.rev_pos)


def test_graph_without_edges_and_graph_without_nodes(gen):
    g = Graph(torch.zeros(2, 0, dtype=torch.int32), 5)
    assert g.num_edges == 0 and g.indptr.tolist() == [0] * 6 and g.rev_indptr.tolist() == [0] * 6
    assert g.has_zero_in_degree() and g.degree_stats()["max_in"] == 0
    schedule = g.schedule(2, 3, torch.float32)
    assert schedule.incoming.counts()["super"] == 0
    empty = Graph(torch.zeros(2, 0, dtype=torch.int64))
    assert empty.num_nodes == 0 and not empty.has_zero_in_degree() and empty.degree_stats()["max_in"] == 0
    assert empty.add_self_loops().num_edges == 0
    assert all(empty.reordered(method)[1].numel() == 0 for method in ("rcm", "degree"))


# ---------------------------------------------------------------- the int64 index path


def test_index_dtypes_switch_each_index_at_its_own_limit():
    from gnnfuse.graph import index_dtypes

    limit = 2**31 - 1
    assert index_dtypes(1000, limit) == (torch.int32, torch.int32)
    assert index_dtypes(1000, limit + 1) == (torch.int32, torch.int64)  # > 2^31 edges: positions widen
    assert index_dtypes(limit + 1, 10) == (torch.int32, torch.int32)  # ids 0 .. 2^31 - 1 still fit
    assert index_dtypes(limit + 2, 10) == (torch.int64, torch.int32)
    assert index_dtypes(5, 5, torch.int64) == (torch.int64, torch.int64)


def test_indptr_of_more_than_2_31_edges_is_int64_and_exact():
    from gnnfuse.graph import _indptr, index_dtypes

    # In-degrees of a graph with 3 * 2^30 + 7 edges: offsets past 2^31 must not wrap.
    degree = torch.tensor([2**30, 0, 2**31, 7])
    _, position_dtype = index_dtypes(4, int(degree.sum()))
    indptr = _indptr(degree, position_dtype)
    assert indptr.dtype == torch.int64
    assert indptr.tolist() == [0, 2**30, 2**30, 3 * 2**30, 3 * 2**30 + 7]


def test_work_plan_pieces_of_a_row_beyond_2_31_edges_keep_int64_ranges():
    from gnnfuse.schedule import _buckets

    # One super row whose edge range starts past 2^31 (a fake indptr; no edge arrays needed).
    start = 2**31 + 5
    indptr = torch.tensor([start, start, start + 40], dtype=torch.int64)
    degree = torch.tensor([0, 40])
    buckets = _buckets(degree, indptr, light_max=0, split=16, piece_edges=16, min_piece_edges=1,
                       pieces_wanted=1, node_dtype=torch.int32, min_rows=lambda width: 1)
    assert buckets.super_rows.tolist() == [1] and buckets.piece_start.dtype == torch.int64
    starts, stops = buckets.piece_start.tolist(), buckets.piece_stop.tolist()
    assert starts[0] == start and stops[-1] == start + 40 and starts[1:] == stops[:-1]
    assert len(starts) == 3 and max(b - a for a, b in zip(starts, stops)) <= 16
    light_rows = [(rows.tolist(), lo.tolist(), hi.tolist()) for _, rows, lo, hi in buckets.light]
    assert light_rows == [([0], [start], [start])]


# ---------------------------------------------------------------- the as_graph cache


def test_as_graph_cache_sees_a_replaced_data_edge_index_and_a_grown_dgl_graph():
    from torch_geometric.data import Data

    data = Data(edge_index=torch.tensor([[0, 1], [1, 0]]), num_nodes=3)
    first = as_graph(data)
    assert as_graph(data) is first
    data.edge_index = torch.tensor([[0, 1, 2], [1, 2, 0]])
    assert as_graph(data).num_edges == 3

    class GrowingDGL(FakeDGLGraph):
        def num_edges(self):
            return self._src.numel()

    dgl = GrowingDGL(torch.tensor([0]), torch.tensor([1]), 3)
    assert as_graph(dgl) is as_graph(dgl)
    dgl._src, dgl._dst = torch.tensor([0, 2]), torch.tensor([1, 1])
    assert as_graph(dgl).num_edges == 2
    matrix = sp.csr_matrix(np.eye(3))
    assert as_graph(matrix) is not as_graph(matrix)  # scipy edits are invisible: never cached


def test_row_kernel_lanes_follow_score_pass_and_dtype(monkeypatch):
    # The compiled defaults as measured: per-lane forward state for every score in every dtype (GATv2's
    # float32 since session 13); never in the backward; ScheduleOptions.edge_lanes overrides all.
    from gnnfuse import ops
    from gnnfuse.kernels.scores import SCORE_DOT, SCORE_GAT, SCORE_GATV2

    monkeypatch.setattr(ops.backend, "INTERPRET", False)
    graph = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3)
    auto = graph.schedule(2, 4, torch.float32)
    forward = {(score, dtype): ops.row_kernel_lanes(auto, score, "forward", dtype)
               for score in (SCORE_GAT, SCORE_GATV2, SCORE_DOT) for dtype in (torch.float32, torch.bfloat16)}
    assert forward == {(SCORE_GAT, torch.float32): True, (SCORE_GAT, torch.bfloat16): True,
                       (SCORE_GATV2, torch.float32): True, (SCORE_GATV2, torch.bfloat16): True,
                       (SCORE_DOT, torch.float32): True, (SCORE_DOT, torch.bfloat16): True}
    assert not ops.row_kernel_lanes(auto, SCORE_GAT, "backward", torch.bfloat16)
    forced = graph.schedule(2, 4, torch.float32, ScheduleOptions(edge_lanes=False))
    assert not ops.row_kernel_lanes(forced, SCORE_GAT, "forward", torch.float32)


def test_graph_cache_corner_cases_from_the_session_38_audit():
    """Each case once failed: edge tensors made under inference_mode (no version counter), a DGL-like graph
    rewired in place with the same counts, a Graph viewing the caller's edge tensor, cached graphs whose
    source had died, and a Data whose node count changed."""
    from torch_geometric.data import Data

    with torch.inference_mode():
        inference_edges = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    assert as_graph(inference_edges).num_edges == 4  # converted, not cached (no version counter)
    assert as_graph(Data(edge_index=inference_edges, num_nodes=4)).num_nodes == 4

    class RewiredDGL(FakeDGLGraph):
        def num_edges(self):
            return self._src.numel()

    dgl = RewiredDGL(torch.tensor([0, 1]), torch.tensor([1, 2]), 3)
    first = as_graph(dgl)
    assert as_graph(dgl) is first
    dgl._src[0] = 2  # edge 0 -> 1 becomes 2 -> 1: same node and edge counts
    rewired = as_graph(dgl)
    assert rewired is not first and rewired.edge_index[0].tolist() == [2, 1]

    edges = torch.tensor([[0, 1, 2], [1, 2, 0]])
    g = Graph(edges)
    edges[1, 0] = 2
    assert g.edge_index.tolist() == [[0, 1, 2], [1, 2, 0]]  # its own copy: edge_index and CSR agree
    assert g.edge_index.data_ptr() != edges.data_ptr()

    import gc

    from gnnfuse import graph as graph_module

    for _ in range(3):
        as_graph(torch.tensor([[0, 1], [1, 0]]))  # sources that die at once
    gc.collect()
    as_graph(torch.tensor([[0], [1]]))
    dead = [k for k, (refs, _) in graph_module._GRAPH_CACHE.items() if any(r() is None for r in refs)]
    assert len(dead) <= 1  # the entries of dead sources are dropped at the next insertion

    data = Data(edge_index=torch.tensor([[0, 1], [1, 0]]), num_nodes=2)
    assert as_graph(data).num_nodes == 2
    data.num_nodes = 5
    assert as_graph(data).num_nodes == 5

    forced = Graph(torch.tensor([[0, 1], [1, 0]]), index_dtype=torch.int64)
    assert forced.add_self_loops().index_dtype == forced.remove_self_loops().index_dtype == torch.int64
    with pytest.raises(TypeError, match="sparse tensor"):
        Graph(torch.tensor([[0, 1], [1, 0]]).to_sparse())


def test_eid_rev_pos_inverts_the_reverse_csrs_edge_ids(gen):
    """``eid_rev_pos[e]`` is input edge ``e``'s reverse-CSR position: the reverse CSR's edge ids read back."""
    edges = corner_case_edges(gen)
    graph = Graph(edges, 29)
    rev_eid = graph.csr_eid.long()[graph.rev_pos.long()]
    assert torch.equal(rev_eid[graph.eid_rev_pos.long()], torch.arange(graph.num_edges))
    assert graph.eid_rev_pos is graph.eid_rev_pos  # built once
    empty = Graph(torch.zeros(2, 0, dtype=torch.int64), 3)
    assert empty.eid_rev_pos.numel() == 0
