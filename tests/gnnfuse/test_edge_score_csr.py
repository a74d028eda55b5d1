"""gnnfuse.edge_score.edge_score_csr: GAT's per-edge score term formed from edge features straight in the self-looped
graph's CSR order, the loops' rows filled by the mean / sum of the node's kept edges' scores or a constant.

The oracle follows PyG's own order of operations in float64: the self loops' *features* first (``add_self_loops``'
``fill_value``: the mean / sum of each node's incoming kept edges' features, or the constant), then
``features · M`` per input edge of the looped graph, then the permutation into CSR order — so the kernels' moving
of the reduction onto the scores is checked, not assumed.  Gradients of the features, ``M`` and the constant's
score row come from autograd through the oracle.
"""

from __future__ import annotations

import pytest
import torch
from gnn_testing import corner_case_edges, poison_op_outputs

from fusecore.testing import TOLERANCES, assert_all_written, assert_close, test_device
from gnnfuse import Graph
from gnnfuse import edge_score as edge_score_module
from gnnfuse.edge_score import LoopFill, edge_score_csr

DTYPES = (torch.float32, torch.bfloat16, torch.float64)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(11)


def _oracle(attr, fold, fill_row_features, graph, loops, mode, num_loops):
    """ee [P, H] in float64, CSR order of ``loops.graph`` (``fill_row_features [K]`` for ``'const'``)."""
    attr = attr.double()
    kept = loops.kept.cpu()
    kept_attr = attr[kept]
    dst = graph.edge_index[1].cpu()[kept]
    if mode == "const":
        loop_attr = fill_row_features.double().expand(num_loops, attr.shape[1])
    else:
        sums = torch.zeros(graph.num_nodes, attr.shape[1], dtype=torch.float64).index_add(0, dst, kept_attr)
        counts = torch.bincount(dst, minlength=graph.num_nodes).clamp(min=1)
        loop_attr = (sums / counts[:, None] if mode == "mean" else sums)[:num_loops]
    looped_attr = torch.cat([kept_attr, loop_attr])
    return (looped_attr @ fold.double())[loops.graph.csr_eid.long().cpu()]


def _fill(loops, looped: Graph, mode, fill_row=None):
    return LoopFill(mode, loops.loop_pos, looped.csr_dst, loops.kept_in_degree, looped.num_nodes, fill_row)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["mean", "add", "const"])
@pytest.mark.parametrize("k, h, num_loops", [(3, 2, None), (1, 1, None), (17, 3, 20), (33, 8, None), (5, 5, 1)])
def test_loops_filled_as_pyg_fills_the_features(dtype, mode, k, h, num_loops, gen, monkeypatch):
    """Forward and every gradient against the float64 oracle: corner-case edges (a super node, input self loops
    that are dropped, duplicates, isolated nodes), widths across the feature chunk (17, 33 > 16), loops on every
    node or on the first ``num_loops`` (a bipartite call); outputs poisoned."""
    device = test_device()
    created = poison_op_outputs(monkeypatch)
    n = 29
    edges = corner_case_edges(gen, n)
    graph = Graph(edges.to(device), n)
    loops = graph.pyg_self_loops(num_loops)
    looped = loops.graph
    num_loops = n if num_loops is None else num_loops
    attr = torch.randn(edges.shape[1], k, generator=gen, dtype=torch.float64)
    fold = torch.randn(k, h, generator=gen, dtype=torch.float64)
    fill_features = torch.randn(k, generator=gen, dtype=torch.float64)
    attr_o, fold_o, fill_o = (t.clone().requires_grad_(True) for t in (attr, fold, fill_features))
    ref = _oracle(attr_o, fold_o, fill_o, graph, loops, mode, num_loops)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    attr_k = attr.to(dtype).to(device).requires_grad_(True)
    fold_k = fold.to(acc).to(device).requires_grad_(True)
    fill_k = fill_features.to(acc).to(device).requires_grad_(True)
    fill_row = fill_k @ fold_k if mode == "const" else None
    ee = edge_score_csr(attr_k, fold_k, loops.csr_input, _fill(loops, looped, mode, fill_row))
    assert ee.dtype == acc and ee.shape == (looped.num_edges, h)
    assert_all_written(ee, "edge scores")
    # 2-byte features are rounded before the kernel sees them: compare with the oracle of the rounded features
    tol = TOLERANCES[acc]
    ref_rounded = _oracle(attr.to(dtype), fold, fill_features, graph, loops, mode, num_loops)
    assert_close(ee.double().cpu(), ref_rounded, tol=tol, name="ee")
    upstream = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    wanted = [attr_k, fold_k] + ([fill_k] if mode == "const" else [])
    got = torch.autograd.grad(ee, wanted, upstream.to(acc).to(device))
    assert all(t is not None for t in created)
    refs = torch.autograd.grad(ref, [attr_o, fold_o] + ([fill_o] if mode == "const" else []), upstream)
    grad_tol = TOLERANCES[dtype] if dtype != torch.float64 else tol
    for name, g, r in zip(("∂attr", "∂fold", "∂fill"), got, refs):
        assert_close(g.double().cpu(), r, tol=grad_tol, name=name)
    assert got[0].dtype == dtype and got[1].dtype == acc


def test_without_loops_every_position_reads_its_edge(gen, monkeypatch):
    device = test_device()
    poison_op_outputs(monkeypatch)
    edges = corner_case_edges(gen, 23)
    graph = Graph(edges.to(device), 23)
    attr = torch.randn(edges.shape[1], 6, generator=gen, dtype=torch.float64, requires_grad=True)
    fold = torch.randn(6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    ee = edge_score_csr(attr.to(device), fold.to(device), graph.csr_eid)
    ref = (attr @ fold)[graph.csr_eid.long().cpu()]
    assert_close(ee.cpu(), ref, tol=TOLERANCES[torch.float64], name="ee")
    upstream = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    for g, r in zip(torch.autograd.grad(ee, [attr, fold], upstream.to(device)),
                    torch.autograd.grad(ref, [attr, fold], upstream)):
        assert_close(g.cpu(), r, tol=TOLERANCES[torch.float64])


def test_empty_graph_many_backward_blocks_and_the_torch_path(gen, monkeypatch):
    """No edges (loops only); blocks of 16 positions (a hub's run across blocks) and more positions than one
    backward program holds (the ∂M partials summed): the kernels against the torch form the reference mode runs,
    and that form against the float64 oracle."""
    device = test_device()
    graph = Graph(torch.zeros(2, 0, dtype=torch.int64, device=device), 4)
    loops = graph.pyg_self_loops()
    attr = torch.zeros(0, 3, dtype=torch.float64, device=device, requires_grad=True)
    fold = torch.randn(3, 2, generator=gen, dtype=torch.float64).to(device).requires_grad_(True)
    ee = edge_score_csr(attr, fold, loops.csr_input, _fill(loops, loops.graph, "mean"))
    assert torch.equal(ee, torch.zeros(4, 2, dtype=torch.float64, device=device))
    (g,) = torch.autograd.grad(ee.sum(), fold)
    assert torch.equal(g, torch.zeros_like(fold))
    monkeypatch.setattr(edge_score_module, "SCORE_BLOCK_P", 16)
    monkeypatch.setattr(edge_score_module, "BACKWARD_BLOCKS", 2)
    edges = torch.randint(0, 40, (2, 300), generator=gen)
    edges[1, :100] = 0  # a hub whose run of positions crosses several blocks (each block's run sums added)
    graph = Graph(edges.to(device), 40)
    loops = graph.pyg_self_loops()
    attr = torch.randn(300, 5, generator=gen, dtype=torch.float64).to(device).requires_grad_(True)
    fold = torch.randn(5, 3, generator=gen, dtype=torch.float64).to(device).requires_grad_(True)
    upstream = torch.randn(loops.graph.num_edges, 3, generator=gen, dtype=torch.float64).to(device)
    results = []
    for reference in (False, True):
        monkeypatch.setattr(edge_score_module.backend, "reference_enabled", lambda r=reference: r)
        ee = edge_score_csr(attr, fold, loops.csr_input, _fill(loops, loops.graph, "mean"))
        results.append((ee, *torch.autograd.grad(ee, [attr, fold], upstream)))
    for a, b in zip(*results):
        assert_close(a, b, tol=TOLERANCES[torch.float64])
    ref = _oracle(attr.detach().cpu(), fold.detach().cpu(), None, graph, loops, "mean", 40)
    assert_close(results[0][0].cpu(), ref.detach(), tol=TOLERANCES[torch.float64], name="ee")


def test_bad_arguments_are_refused_by_name(gen):
    device = test_device()
    graph = Graph(torch.tensor([[0, 1], [1, 0]], device=device), 2)
    loops = graph.pyg_self_loops()
    attr, fold = torch.zeros(2, 3, device=device), torch.zeros(3, 2, device=device)
    mean = _fill(loops, loops.graph, "mean")
    cases = [
        ((torch.zeros(2, device=device), fold, loops.csr_input, None), "attr must be a float tensor"),
        ((attr, torch.zeros(4, 2, device=device), loops.csr_input, None), "fold must be a float tensor"),
        ((attr, fold, loops.csr_input.float(), None), "src_edge must be a 1-D int32 or int64"),
        ((attr, fold, loops.csr_input, _fill(loops, loops.graph, "max")), "loops.mode must be one of"),
        ((attr, fold, loops.csr_input[:3], mean), "loops do not fit the graph"),
        ((attr, fold, loops.csr_input, _fill(loops, loops.graph, "mean", torch.zeros(2, device=device))),
         "fill_row goes with mode 'const'"),
        ((attr, fold, loops.csr_input, _fill(loops, loops.graph, "const", torch.zeros(3, device=device))),
         r"fill_row must have shape \[H\]"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            edge_score_csr(*args)
