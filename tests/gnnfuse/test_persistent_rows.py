"""The forward row kernel as a persistent grid (ops.ROW_PERSISTENT_PROGRAMS_PER_SM, kernels/attention_forward.py).

Each program walks the items p, p + G, p + 2G, ... of its launch and loads the next items' ranges and first source
ids ahead; per item the arithmetic is the one-program-per-item kernel's, so outputs and logsumexps must be equal bit
for bit (dropout included: its counters are per edge, not per program), at grids smaller than, equal to and larger
than the item count, for medium rows and super-row pieces alike, and every output written (poisoned buffers).
"""

from types import SimpleNamespace

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges, poison_op_outputs

from fusecore import PhiloxStream, use_reference
from fusecore.testing import assert_all_written, assert_close, test_device
from gnnfuse import Graph, ops


def _graph(gen: torch.Generator, device: torch.device) -> Graph:
    """Corner cases (a super node, self loops, duplicates, isolated nodes) and 40 more rows of degrees 5-40."""
    base = corner_case_edges(gen, num_nodes=60, num_edges=300)
    degrees = torch.randint(5, 41, (40,), generator=gen)
    dst = torch.repeat_interleave(torch.arange(20, 60), degrees)
    src = torch.randint(0, 60, (dst.numel(),), generator=gen)
    return Graph(torch.cat([base, torch.stack([src, dst])], dim=1).to(device), 60)


def _run(kind: str, graph: Graph, inputs: tuple, schedule, dropout: float):
    rng = PhiloxStream(seed=7) if dropout else None
    if kind == "gat":
        wh, el, er = inputs
        return ops.gat_attention(graph, wh, el, er, dropout=dropout, rng=rng, schedule=schedule)
    if kind == "gatv2":
        fs, fd, attn = inputs
        return ops.gatv2(graph, fs, fd, attn, dropout=dropout, rng=rng, schedule=schedule)
    if kind == "agnn":
        feat, beta = inputs
        return ops.agnn(graph, feat, beta, schedule=schedule)
    q, k, v, *edge = inputs
    return ops.transformer_attention(graph, q, k, v, *edge, dropout=dropout, rng=rng, schedule=schedule)


def _inputs(kind: str, graph: Graph, gen: torch.Generator, dtype: torch.dtype, device: torch.device) -> tuple:
    n, heads, dim = graph.num_nodes, 2, 5

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    if kind == "gat":
        return rand(n, heads, dim), rand(n, heads), rand(n, heads)
    if kind == "gatv2":
        return rand(n, heads, dim), rand(n, heads, dim), rand(1, heads, dim)
    if kind == "agnn":
        return rand(n, heads, dim), torch.tensor([1.3], device=device, dtype=dtype)
    q, k, v = rand(n, heads, dim), rand(n, heads, dim), rand(n, heads, dim)
    if kind == "transformer-edges":
        return q, k, v, rand(graph.num_edges, 3), rand(heads * dim, 3)
    return q, k, v


@pytest.mark.parametrize("kind", ["gat", "gatv2", "transformer", "transformer-edges", "agnn"])
@pytest.mark.parametrize("schedule", ["medium", "super", "mixed"])
def test_persistent_rows_equal_one_program_per_item(gen, monkeypatch, kind, schedule):
    device = test_device()
    graph = _graph(gen, device)
    options = SCHEDULES[schedule]
    dtype = torch.float32
    inputs = _inputs(kind, graph, gen, dtype, device)
    dropout = 0.3 if kind in ("gat", "transformer") else 0.0
    with torch.no_grad():
        want = _run(kind, graph, inputs, options, dropout)
        with use_reference():
            ref = _run(kind, graph, inputs, options, 0.0)
    if not dropout:
        assert_close(want, ref)  # the float32 tolerance of fusecore.testing.TOLERANCES
    sched = graph.schedule(2, 5, dtype, options)
    items = max(sched.incoming.medium[0].numel(), sched.incoming.num_pieces)
    assert items > 3  # the grids below are smaller than the item count
    for programs in (1, 2, 3, items, items + 5):
        with monkeypatch.context() as patch:
            patch.setattr(ops, "device_facts", lambda _: SimpleNamespace(sm_count=1))
            patch.setattr(ops, "ROW_PERSISTENT_PROGRAMS_PER_SM", programs)
            sched.launches.clear()
            created = poison_op_outputs(patch)
            with torch.no_grad():
                got = _run(kind, graph, inputs, options, dropout)
            plans = [plan for key, plan in sched.launches.items() if key[0] == "forward"]
        assert torch.equal(got, want), (kind, schedule, programs)
        for buffer in created:
            if buffer.numel():
                assert_all_written(buffer)
        assert plans and all(meta["PERSISTENT"] for plan in plans for _, meta in plan[1])
    sched.launches.clear()


def test_persistent_rows_gradients_and_bfloat16(gen, monkeypatch):
    """The training path (the forward storing its float32 output for the backward) and 2-byte values."""
    device = test_device()
    graph = _graph(gen, device)
    options = SCHEDULES["mixed"]
    for dtype in (torch.float32, torch.bfloat16):
        wh, el, er = (t.requires_grad_(True) for t in _inputs("gat", graph, gen, dtype, device))
        out = ops.gat_attention(graph, wh, el, er, schedule=options)
        g = torch.randn(out.shape, generator=gen).to(device, dtype)
        grads = torch.autograd.grad(out, (wh, el, er), g)
        with monkeypatch.context() as patch:
            patch.setattr(ops, "device_facts", lambda _: SimpleNamespace(sm_count=1))
            patch.setattr(ops, "ROW_PERSISTENT_PROGRAMS_PER_SM", 2)
            graph.schedule(2, 5, dtype, options).launches.clear()
            got = ops.gat_attention(graph, wh, el, er, schedule=options)
            got_grads = torch.autograd.grad(got, (wh, el, er), g)
        assert torch.equal(got, out)
        for a, b in zip(got_grads, grads):
            assert torch.equal(a, b)
        graph.schedule(2, 5, dtype, options).launches.clear()


def test_persistent_grid_only_for_rows_that_load_ahead(monkeypatch):
    """The persistent grid needs the indices loaded ahead (``PREFETCH`` >= 1); off by default."""
    from gnnfuse.kernels.scores import SCORE_GAT

    feats, scale = torch.zeros(4, 2, 3), torch.zeros(4, 2)
    inputs = ops.AttentionInputs(SCORE_GAT, scale, scale, feats)
    monkeypatch.setattr(ops, "device_facts", lambda _: SimpleNamespace(sm_count=3))
    assert ops.ROW_PERSISTENT_PROGRAMS_PER_SM is None or ops._row_programs(None, inputs, 1) is not None
    monkeypatch.setattr(ops, "ROW_PERSISTENT_PROGRAMS_PER_SM", 4)
    assert ops._row_programs(None, inputs, 1) == 12
    assert ops._row_programs(None, inputs, 0) is None
    monkeypatch.setattr(ops, "ROW_PERSISTENT_PROGRAMS_PER_SM", None)
    assert ops._row_programs(None, inputs, 2) is None
