"""The calls' kept scratch buffers (``gnnfuse.ops._scratch``, ``fusecore.scratch.kept``).

A training step whose scratch buffers were kept from the step before, and poisoned since, must give bit for bit what
the same step gives with fresh (poisoned) buffers, on schedules with split rows (their pieces' partials are scratch
too); nothing a call returns or saves may be, or view, a kept buffer; and the next call must find its buffers kept
(that is the host time saved)."""

from __future__ import annotations

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges

from fusecore.testing import poison_value, poisoned
from gnnfuse import Graph, ops
from gnnfuse.nn import AGNNConv, GATConv, GATv2Conv, GraphTransformerConv

LAYERS = {
    "gat": lambda: GATConv(6, 4, 2, allow_zero_in_degree=True),
    "gatv2": lambda: GATv2Conv(6, 4, 2, allow_zero_in_degree=True),
    "transformer": lambda: GraphTransformerConv(6, 4, heads=2),
    "agnn": lambda: AGNNConv(allow_zero_in_degree=True),
}


def _kept(graph: Graph) -> list[torch.Tensor]:
    """Every kept scratch buffer of ``graph``'s schedules and of the per-node kernels."""
    caches = [schedule.scratch for schedule in graph.schedules._store.values()] + [ops.NODE_SCRATCH]
    return [t for cache in caches for key, t in cache.items() if isinstance(key, tuple) and key[0] == "kept"]


def _step(layer, graph: Graph, x: torch.Tensor, grad: torch.Tensor, schedule):
    for p in layer.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    out = layer(graph, x, schedule=schedule)
    out.backward(grad)
    return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]


def _overlaps(t: torch.Tensor, buffers: list[torch.Tensor]) -> bool:
    lo = t.untyped_storage().data_ptr()
    hi = lo + t.untyped_storage().nbytes()
    return any(b.numel() and lo < b.data_ptr() + b.numel() * b.element_size() and b.data_ptr() < hi
               for b in buffers)


@pytest.mark.parametrize("schedule", ["super", "mixed", "auto"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_kept_scratch_poisoned_between_steps_gives_the_fresh_results(gen, device, name, schedule):
    options = SCHEDULES[schedule]
    edges = corner_case_edges(gen).to(device)
    graph = Graph(edges, 29)
    torch.manual_seed(0)
    layer = LAYERS[name]().to(device)
    feats = 6 if name != "agnn" else 8
    inputs = [(torch.randn(29, feats, generator=gen).to(device),
               torch.randn(29, *layer(graph, torch.zeros(29, feats, device=device), schedule=options).shape[1:],
                           generator=gen).to(device)) for _ in range(2)]
    ops.NODE_SCRATCH.clear()
    _step(layer, graph, *inputs[0], options)
    kept = _kept(graph)
    assert kept, "a training step keeps its scratch buffers"
    first = {id(t) for t in kept}
    for t in kept:  # a call that read anything it did not write first would now read the poison
        t.fill_(poison_value(t.dtype))
    results = _step(layer, graph, *inputs[1], options)
    assert {id(t) for t in _kept(graph)} == first, "the second step found every buffer kept (no allocation)"
    for r in results:
        assert r is None or not _overlaps(r, _kept(graph)), "a result shares memory with a kept buffer"

    # the same step with nothing kept: every buffer fresh and poisoned
    fresh_graph = Graph(edges, 29)
    original = ops._scratch
    try:
        ops._scratch = lambda cache, name_, shape, dtype, dev: poisoned(shape, dtype, dev)
        expected = _step(layer, fresh_graph, *inputs[1], options)
    finally:
        ops._scratch = original
    for index, (got, want) in enumerate(zip(results, expected)):
        assert (got is None) == (want is None), index
        if got is not None:
            assert torch.equal(got, want), f"result {index} differs with kept buffers"
            assert torch.isfinite(got).all(), f"result {index} is not finite"


def test_gat_without_projection_returns_no_kept_buffer(gen, device):
    """``ops.gat`` on projected features (no ``weight``): the feature gradient is the node-score backward's own
    output, so it must be a fresh tensor, not one of the kept buffers it would otherwise be."""
    edges = corner_case_edges(gen).to(device)
    graph = Graph(edges, 29)
    ops.NODE_SCRATCH.clear()
    for dtype in (torch.float32, torch.bfloat16):
        grads = []
        for _ in range(2):
            wh = torch.randn(29, 2, 4, generator=gen).to(device, dtype).requires_grad_()
            attn_l = torch.randn(1, 2, 4, generator=gen).to(device, dtype).requires_grad_()
            attn_r = torch.randn(1, 2, 4, generator=gen).to(device, dtype).requires_grad_()
            out = ops.gat(graph, wh, attn_l, attn_r, schedule=SCHEDULES["super"])
            out.backward(torch.randn(out.shape, generator=gen).to(device, dtype))
            grads.append([wh.grad, attn_l.grad, attn_r.grad])
            kept = _kept(graph)
            assert kept and not any(_overlaps(g, kept) for g in grads[-1])
        assert not any(_overlaps(a, [b]) for a, b in zip(grads[0], grads[1])), "step 2 overwrote step 1's gradients"
