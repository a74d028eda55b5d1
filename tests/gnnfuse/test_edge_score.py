"""GAT's per-edge score term (PyG GATConv's ``edge_dim``): ``s_ijh = LeakyReLU(el_j[h] + er_i[h] + ee_ijh)``, the
term ``ee [E, H]`` given per input edge, added by the fused forward, source-pass and weights kernels (``EDGE_SCORE``).

The oracle is written here in float64 from the inputs (the scores per input edge, a softmax over each destination's
edges with ``index_add``, the dropout mask of :func:`gnnfuse.reference.dropout_keep_mask` mapped to the input order,
DGL's ``edge_weight`` factor where combined), and torch's autograd through it gives every gradient, ``∂ee`` included.
float64 checks use a LeakyReLU slope of 0.25 and dropout 0.5, which float32 holds exactly (the compiled kernels take
their scalars in float32: gnnfuse README).
"""

from __future__ import annotations

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges, gat_oracle, input_order_keep_mask, poison_op_outputs

from fusecore import PhiloxStream, use_reference
from fusecore.testing import TOLERANCES, assert_all_written, assert_close
from gnnfuse import Graph, ops

SLOPE = 0.25
P = 0.5


def oracle(edges, num_nodes, wh_src, el, er, edge_score, keep=None, weight=None):
    """PyG's GATConv message passing with an edge term, in float64: ``(out [N, H, D], α' [E, H])``, input edge order
    (``keep``: the dropout mask, ``weight``: DGL's per-edge factor after it)."""
    return gat_oracle(edges, num_nodes, wh_src, el, er, SLOPE, edge_score=edge_score, keep=keep, dropout=P,
                      weight=weight)


def keep_mask(graph: Graph, heads: int, seed: int) -> torch.Tensor:
    """The forward's dropout mask ``[E, H]`` in the graph's input edge order."""
    return input_order_keep_mask(graph, heads, P, seed)


def leaves(gen, num_nodes, num_edges, heads, dim, dtype):
    """``wh [N, H, D]`` and ``ee [E, H]`` in ``dtype``, ``el`` / ``er`` in the accumulation dtype; the term spread
    (scale 1.5) so that it moves edges across the LeakyReLU's kink."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return [r(num_nodes, heads, dim).to(dtype), r(num_nodes, heads).to(acc), r(num_nodes, heads).to(acc),
            (r(num_edges, heads) * 1.5).to(dtype)]


def check_against_oracle(graph, edges, num_nodes, inputs, run, gen, tol, keep=None, weight=None, created=None,
                         names=("wh", "el", "er", "edge_score")):
    """Run ``run(*leaves)`` (leaves on the graph's device, requiring gradients) and the oracle on the same values in
    float64; compare outputs and every gradient for one random upstream gradient."""
    ours = [t.clone().to(graph.device).requires_grad_(True) for t in inputs]
    theirs = [t.detach().double().clone().requires_grad_(True) for t in inputs]
    out = run(*ours)
    if created is not None:
        assert_all_written(created[-1])
    ref, _ = oracle(edges, num_nodes, *theirs, keep=keep, weight=weight)
    assert_close(out.double().cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(out.device, out.dtype))
    ref.backward(grad)
    for name, a, b in zip(names, ours, theirs):
        assert a.grad is not None and a.grad.dtype == a.dtype and a.grad.shape == a.shape, name
        assert_all_written(a.grad, f"grad {name}")
        assert_close(a.grad.double().cpu(), b.grad, tol=tol, name=f"grad {name}")


@pytest.mark.parametrize("schedule", ["auto", "light", "medium", "super", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_gat_attention_with_edge_score_matches_the_oracle(schedule, dtype, gen, device):
    """Corner-case graph (super node, self loops, duplicate edges, isolated nodes) under every bucket kind; the term
    in the features' dtype (bfloat16 too: its gradient comes back in it)."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, dtype)

    def run(wh, el, er, score):
        return ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_score=score,
                                 schedule=SCHEDULES[schedule])

    check_against_oracle(graph, edges, num_nodes, inputs, run, gen, TOLERANCES[dtype])


@pytest.mark.parametrize("with_weight", [False, True], ids=["alone", "with edge_weight"])
@pytest.mark.parametrize("schedule", ["light", "super", "mixed"])
def test_edge_score_with_dropout(schedule, with_weight, gen, device, monkeypatch):
    """With attention dropout (and DGL's factor after it) the term still enters before the softmax: forward and every
    gradient against the oracle with the forward's own mask; every output and scratch buffer written."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    weight = torch.randn(edges.shape[1], generator=gen, dtype=torch.float64) * 1.5 if with_weight else None
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    keep = keep_mask(graph, heads, seed)
    assert 0 < int(keep.sum()) < keep.numel()
    created = poison_op_outputs(monkeypatch)

    def run(wh, el, er, score):
        return ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_score=score, dropout=P,
                                 rng=PhiloxStream(seed), schedule=SCHEDULES[schedule],
                                 edge_weight=None if weight is None else weight.to(device))

    check_against_oracle(graph, edges, num_nodes, inputs, run, gen, TOLERANCES[torch.float64], keep=keep,
                         weight=weight, created=created)


def test_edge_score_and_a_learned_edge_weight(gen, device):
    """Both per-edge inputs learned at once: ``∂ee`` and ``∂w`` (and the features') against the oracle."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    inputs.append(torch.randn(edges.shape[1], generator=gen, dtype=torch.float64) * 1.5)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    keep = keep_mask(graph, heads, seed)
    ours = [t.clone().to(device).requires_grad_(True) for t in inputs]
    theirs = [t.clone().requires_grad_(True) for t in inputs]
    out = ops.gat_attention(graph, *ours[:3], negative_slope=SLOPE, edge_score=ours[3], edge_weight=ours[4], dropout=P,
                            rng=PhiloxStream(seed))
    ref, _ = oracle(edges, num_nodes, *theirs[:4], keep=keep, weight=theirs[4])
    tol = TOLERANCES[torch.float64]
    assert_close(out.cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    for name, a, b in zip(("wh", "el", "er", "edge_score", "edge_weight"), ours, theirs):
        assert_close(a.grad.cpu(), b.grad, tol=tol, name=f"grad {name}")


@pytest.mark.parametrize("unrolled", [True, False])
def test_both_light_forms(unrolled, gen, device, monkeypatch):
    """The light rows' unrolled and tile forms (forward and source pass) both add the term and give its gradient."""
    for name in ("LIGHT_FORWARD_UNROLLED", "LIGHT_SOURCE_UNROLLED"):
        monkeypatch.setattr(ops, name, unrolled)
    num_nodes, heads, dim = 29, 2, 8
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))

    def run(wh, el, er, score):
        return ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_score=score, dropout=P,
                                 rng=PhiloxStream(seed), schedule=SCHEDULES["light"])

    check_against_oracle(graph, edges, num_nodes, inputs, run, gen, TOLERANCES[torch.float64],
                         keep=keep_mask(graph, heads, seed))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_zero_edge_score_changes_nothing(dtype, gen, device):
    """Adding 0.0 is exact: output and every other gradient equal a call without ``edge_score`` bit for bit (both
    ops, with dropout and DGL's factor), and ``∂ee`` is ``∂L/∂z`` of the term-free scores."""
    num_nodes, heads, dim, feats = 29, 3, 4, 8
    edges = corner_case_edges(gen, num_nodes)
    num_edges = edges.shape[1]
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, _ = [t.to(device) for t in leaves(gen, num_nodes, num_edges, heads, dim, dtype)]
    weight = torch.rand(num_edges, generator=gen).to(device) + 0.5
    x = torch.randn(num_nodes, feats, generator=gen).to(device, dtype)
    fc = (torch.randn(heads * dim, feats, generator=gen) * 0.3).to(device, dtype)
    attn = [torch.randn(1, heads, dim, generator=gen).to(device, dtype) for _ in range(2)]
    grad = torch.randn(num_nodes, heads, dim, generator=gen).to(device, dtype)
    kw = {"negative_slope": SLOPE, "dropout": P, "edge_weight": weight}

    def attention(score, wh, el, er):
        return ops.gat_attention(graph, wh, el, er, edge_score=score, rng=PhiloxStream(5), **kw)

    def projected(score, x, attn_l, attn_r, fc):
        return ops.gat(graph, x, attn_l, attn_r, weight=fc, edge_score=score, rng=PhiloxStream(5), **kw)

    for op, tensors in ((attention, (wh, el, er)), (projected, (x, *attn, fc))):
        results = []
        for score in (None, torch.zeros(num_edges, heads, device=device, dtype=dtype, requires_grad=True)):
            ins = [t.clone().requires_grad_(True) for t in tensors]
            out = op(score, *ins)
            out.backward(grad)
            results.append((out, *(t.grad for t in ins)))
            if score is not None:
                assert score.grad is not None and score.grad.dtype == dtype
        for index, (a, b) in enumerate(zip(*results)):
            assert torch.equal(a, b), f"{op.__name__}: result {index}"
    # ∂ee at 0 against the oracle's ∂z (gat_attention's leaves)
    zeros = torch.zeros(num_edges, heads, dtype=torch.float64, requires_grad=True)
    keep = keep_mask(graph, heads, 5)
    ref, _ = oracle(edges, num_nodes, wh.double().cpu(), el.double().cpu(), er.double().cpu(), zeros, keep=keep,
                    weight=weight.double().cpu())
    ref.backward(grad.double().cpu())
    score = torch.zeros(num_edges, heads, device=device, dtype=dtype, requires_grad=True)
    attention(score, wh, el, er).backward(grad)
    assert_close(score.grad.double().cpu(), zeros.grad, tol=TOLERANCES[dtype], name="∂ee at ee = 0")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_gat_op_with_projection_bias_and_edge_score(dtype, gen, device):
    """``ops.gat`` projecting ``x`` itself (bfloat16: the projection and node scores in one kernel), with a bias as
    ``out_add``: every gradient, the projection's weight and ``∂ee`` included.  In bfloat16 the op's ``Wh`` is the
    projection rounded to bfloat16, and so is the oracle's (rounding passed through by autograd): against the exact
    ``Wh`` the sharper softmax the term gives amplifies that rounding in ``∂attn_r`` up to 0.14 (20 seeds)."""
    num_nodes, heads, dim, feats = 29, 3, 4, 16
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    values = [r(num_nodes, feats), r(heads * dim, feats, scale=0.25), r(1, heads, dim), r(1, heads, dim),
              r(heads * dim), r(edges.shape[1], heads, scale=1.5)]
    ours = [t.clone().to(device).requires_grad_(True) for t in values]
    theirs = [t.double().clone().requires_grad_(True) for t in values]
    out = ops.gat(graph, ours[0], ours[2], ours[3], weight=ours[1], out_add=ours[4], edge_score=ours[5],
                  negative_slope=SLOPE)
    x, weight, attn_l, attn_r, bias, score = theirs
    wh = x @ weight.t()
    if dtype == torch.bfloat16:
        wh = wh + (wh.to(dtype).double() - wh).detach()
    wh = wh.view(num_nodes, heads, dim)
    ref, _ = oracle(edges, num_nodes, wh, (wh * attn_l).sum(-1), (wh * attn_r).sum(-1), score)
    ref = ref + bias.view(heads, dim)
    tol = TOLERANCES[dtype]
    assert_close(out.double().cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device, dtype))
    ref.backward(grad)
    for name, a, b in zip(("x", "weight", "attn_l", "attn_r", "bias", "edge_score"), ours, theirs):
        assert a.grad.dtype == a.dtype, name
        assert_close(a.grad.double().cpu(), b.grad, tol=tol, name=f"grad {name}")


@pytest.mark.parametrize("schedule", ["light", "super"])
def test_gat_op_without_projection(schedule, gen, device):
    """``ops.gat`` from ``wh`` and the attention vectors, with dropout: ``∂wh``, ``∂attn_l``, ``∂attn_r``, ``∂ee``."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    values = [torch.randn(num_nodes, heads, dim, generator=gen, dtype=torch.float64),
              torch.randn(1, heads, dim, generator=gen, dtype=torch.float64),
              torch.randn(1, heads, dim, generator=gen, dtype=torch.float64),
              torch.randn(edges.shape[1], heads, generator=gen, dtype=torch.float64) * 1.5]
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    ours = [t.clone().to(device).requires_grad_(True) for t in values]
    theirs = [t.clone().requires_grad_(True) for t in values]
    out = ops.gat(graph, *ours[:3], edge_score=ours[3], negative_slope=SLOPE, dropout=P, rng=PhiloxStream(seed),
                  schedule=SCHEDULES[schedule])
    wh, attn_l, attn_r, score = theirs
    ref, _ = oracle(edges, num_nodes, wh, (wh * attn_l).sum(-1), (wh * attn_r).sum(-1), score,
                    keep=keep_mask(graph, heads, seed))
    tol = TOLERANCES[torch.float64]
    assert_close(out.cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    for name, a, b in zip(("wh", "attn_l", "attn_r", "edge_score"), ours, theirs):
        assert_close(a.grad.cpu(), b.grad, tol=tol, name=f"grad {name}")


@pytest.mark.parametrize("op", ["gat_attention", "gat"])
def test_only_the_edge_score_needs_a_gradient(op, gen, device):
    """A term learned on its own (features and attention frozen): the backward still runs and gives ``∂ee`` alone."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, score = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    ours = score.clone().to(device).requires_grad_(True)
    theirs = score.clone().requires_grad_(True)
    if op == "gat":
        attn_l, attn_r = (torch.randn(1, heads, dim, generator=gen, dtype=torch.float64) for _ in range(2))
        out = ops.gat(graph, wh.to(device), attn_l.to(device), attn_r.to(device), negative_slope=SLOPE,
                      edge_score=ours)
        el, er = (wh * attn_l).sum(-1), (wh * attn_r).sum(-1)
    else:
        out = ops.gat_attention(graph, wh.to(device), el.to(device), er.to(device), negative_slope=SLOPE,
                                edge_score=ours)
    assert out.requires_grad
    ref, _ = oracle(edges, num_nodes, wh, el, er, theirs)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    assert_close(ours.grad.cpu(), theirs.grad, tol=TOLERANCES[torch.float64], name="∂ee")


def test_attention_weights_carry_the_edge_score(gen, device):
    """``return_attention``: the aggregation's weights (term, dropout and factor applied) and, with
    ``attention_dropout=False``, the softmax of the scores with the term; ``ops.gat`` too; the reference path
    agrees."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, score = [t.to(device) for t in leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)]
    w = torch.randn(edges.shape[1], generator=gen, dtype=torch.float64).to(device)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    kw = {"negative_slope": SLOPE, "dropout": P, "edge_weight": w, "edge_score": score, "return_attention": True}
    out, used = ops.gat_attention(graph, wh, el, er, rng=PhiloxStream(seed), **kw)
    _, softmax = ops.gat_attention(graph, wh, el, er, rng=PhiloxStream(seed), attention_dropout=False, **kw)
    keep = keep_mask(graph, heads, seed)
    cpu = [t.cpu() for t in (wh, el, er, score)]
    ref_out, ref_used = oracle(edges, num_nodes, *cpu, keep=keep, weight=w.cpu())
    tol = TOLERANCES[torch.float64]
    assert_close(used.cpu(), ref_used, tol=tol, name="aggregation weights")
    assert_close(out.cpu(), ref_out, tol=tol, name="output")
    assert_close(softmax.cpu(), oracle(edges, num_nodes, *cpu)[1], tol=tol, name="softmax")
    with use_reference():
        reference_pair = ops.gat_attention(graph, wh, el, er, rng=PhiloxStream(seed), **kw)
    for ours, theirs, what in zip((out, used), reference_pair, ("output", "weights")):
        assert_close(ours, theirs, tol=tol, name=f"{what} against the reference path")
    attn_l, attn_r = (torch.randn(1, heads, dim, generator=gen, dtype=torch.float64).to(device) for _ in range(2))
    out, used = ops.gat(graph, wh, attn_l, attn_r, rng=PhiloxStream(seed), **kw)
    el, er = (wh * attn_l).sum(-1).cpu(), (wh * attn_r).sum(-1).cpu()
    ref_out, ref_used = oracle(edges, num_nodes, wh.cpu(), el, er, score.cpu(), keep=keep, weight=w.cpu())
    assert_close(used.cpu(), ref_used, tol=tol, name="ops.gat's weights")
    assert_close(out.cpu(), ref_out, tol=tol, name="ops.gat's output")


@pytest.mark.parametrize("op", ["gat_attention", "gat"])
def test_reference_path_takes_the_edge_score(op, gen, device):
    """Under ``use_reference()`` both ops add the term (in the input edge order) and are differentiable in it."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, score = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    attn_l, attn_r = (torch.randn(1, heads, dim, generator=gen, dtype=torch.float64) for _ in range(2))
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    ours = score.clone().to(device).requires_grad_(True)
    theirs = score.clone().requires_grad_(True)
    with use_reference():
        if op == "gat":
            out = ops.gat(graph, wh.to(device), attn_l.to(device), attn_r.to(device), negative_slope=SLOPE,
                          dropout=P, rng=PhiloxStream(seed), edge_score=ours)
            el, er = (wh * attn_l).sum(-1), (wh * attn_r).sum(-1)
        else:
            out = ops.gat_attention(graph, wh.to(device), el.to(device), er.to(device), negative_slope=SLOPE,
                                    dropout=P, rng=PhiloxStream(seed), edge_score=ours)
    ref, _ = oracle(edges, num_nodes, wh, el, er, theirs, keep=keep_mask(graph, heads, seed))
    tol = TOLERANCES[torch.float64]
    assert_close(out.cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    assert_close(ours.grad.cpu(), theirs.grad, tol=tol, name="∂ee")


def test_edge_order_duplicates_self_loops_and_zero_in_degree(gen, device):
    """A hand-made graph out of CSR order: two copies of one edge with different terms (each its own softmax entry and
    its own gradient), self loops, a node with out-edges and no in-edges (0 and its gradients from its out-edges
    alone) and an isolated node (zeros, zero gradients)."""
    edges = torch.tensor([[2, 0, 1, 1, 0, 2, 3, 0],
                          [1, 1, 2, 2, 2, 2, 3, 3]])  # 0 -> 1 and 1 -> 2 twice over; 3 -> 3, 2 -> 2 loops; 4 isolated
    edges = torch.cat([edges, torch.tensor([[1], [2]])], dim=1)
    num_nodes, heads, dim = 5, 2, 4
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)

    def run(wh, el, er, score):
        out = ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_score=score)
        assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[4], torch.zeros_like(out[4]))
        return out

    check_against_oracle(graph, edges, num_nodes, inputs, run, gen, TOLERANCES[torch.float64])


def test_launch_plans_keyed_on_the_edge_score(gen, device):
    """One graph (one schedule, its cached launch plans) called without, with and again without the term: each call
    matches its own oracle, so no plan made for one kind of call runs the other."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float32)
    tol = TOLERANCES[torch.float32]
    for with_score in (False, True, False):

        def run(wh, el, er, score, with_score=with_score):
            return ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE,
                                     edge_score=score if with_score else None)

        if with_score:
            check_against_oracle(graph, edges, num_nodes, inputs, run, gen, tol)
        else:
            check_against_oracle(graph, edges, num_nodes, [*inputs[:3], torch.zeros_like(inputs[3])], run, gen, tol,
                                 names=("wh", "el", "er"))


def test_empty_graph(device):
    graph = Graph(torch.zeros(2, 0, dtype=torch.int64, device=device), 4)
    x = torch.randn(4, 2, 3, device=device, requires_grad=True)
    s = torch.randn(4, 2, device=device)
    score = torch.empty(0, 2, device=device, requires_grad=True)
    out = ops.gat_attention(graph, x, s, s, edge_score=score)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert score.grad is not None and tuple(score.grad.shape) == (0, 2)
    assert torch.equal(x.grad, torch.zeros_like(x))
    out = ops.gat(graph, x, torch.ones(1, 2, 3, device=device), torch.ones(1, 2, 3, device=device),
                  edge_score=torch.empty(0, 2, device=device))
    assert torch.equal(out, torch.zeros_like(out))


def test_bad_edge_scores_are_refused(device, monkeypatch):
    """Wrong shape, dtype or type, or another device: refused by name before anything is allocated or launched."""
    graph = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]], device=device), 3)
    x, s = torch.randn(3, 2, 4, device=device), torch.randn(3, 2, device=device)
    attn = torch.ones(1, 2, 4, device=device)
    created = poison_op_outputs(monkeypatch)
    for call in (lambda score: ops.gat_attention(graph, x, s, s, edge_score=score),
                 lambda score: ops.gat(graph, x, attn, attn, edge_score=score)):
        with pytest.raises(ValueError, match=r"edge_score must have shape \[num_edges, heads\] = \[3, 2\].*got \[3\]"):
            call(torch.ones(3, device=device))
        with pytest.raises(ValueError, match=r"must have shape \[num_edges, heads\] = \[3, 2\].*got \[3, 3\]"):
            call(torch.ones(3, 3, device=device))
        with pytest.raises(ValueError, match=r"edge_score must have shape .*got \[4, 2\]"):
            call(torch.ones(4, 2, device=device))
        with pytest.raises(ValueError, match=r"edge_score must have shape .*got \[3, 2, 1\]"):
            call(torch.ones(3, 2, 1, device=device))
        with pytest.raises(TypeError, match="edge_score"):
            call(torch.ones(3, 2, dtype=torch.int64, device=device))
        with pytest.raises(TypeError, match="edge_score must be a tensor"):
            call([[0.0, 0.0]] * 3)
        with pytest.raises(ValueError, match="edge_score"):
            call(torch.ones(3, 2, device="meta"))
    for order in ("CSR", None, 1):
        with pytest.raises(ValueError, match=r"edge_score_order must be one of \('input', 'csr'\)"):
            ops.gat(graph, x, attn, attn, edge_score=s, edge_score_order=order)
        with pytest.raises(ValueError, match="edge_score_order"):
            ops.gat_attention(graph, x, s, s, edge_score=s, edge_score_order=order)
    assert created == [], "a refused call allocated outputs"


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("op", ["gat_attention", "gat"])
def test_edge_score_in_csr_order(op, reference, gen, device):
    """``edge_score_order='csr'``: the term given at the graph's CSR positions gives the output of the same term in
    input order, and its gradient comes back at the CSR positions (the input order's gradient permuted), on the
    kernels and on the reference path."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, score = (t.to(device) for t in leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64))
    attn_l, attn_r = (torch.randn(1, heads, dim, generator=gen, dtype=torch.float64).to(device) for _ in range(2))
    eid = graph.csr_eid.long()
    grad = torch.randn(num_nodes, heads, dim, generator=gen, dtype=torch.float64).to(device)
    results = []
    for order, term in (("input", score), ("csr", score[eid])):
        leaf = term.clone().requires_grad_(True)
        with use_reference(reference):
            if op == "gat":
                out = ops.gat(graph, wh, attn_l, attn_r, negative_slope=SLOPE, edge_score=leaf, edge_score_order=order)
            else:
                out = ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_score=leaf,
                                        edge_score_order=order)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    (out_in, grad_in), (out_csr, grad_csr) = results
    tol = TOLERANCES[torch.float64]
    assert_close(out_csr, out_in, tol=tol, name="output")
    assert_close(grad_csr, grad_in[eid], tol=tol, name="∂ee at the CSR positions")
