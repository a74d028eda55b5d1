"""DGL GATConv's ``edge_weight``: a per-edge factor on the attention after its softmax and dropout,
``out_i = Σ_j dropout(α_ij) · w_ij · Wh_j``, loaded per edge by the fused forward and source pass.

The oracle is written here in float64 from the inputs (the scores per input edge, a softmax over each
destination's edges with ``index_add``, the dropout mask of :func:`gnnfuse.reference.dropout_keep_mask` mapped to
the input order, DGL's multiply by ``w``), and torch's autograd through it gives every gradient, ``∂w`` included.
float64 checks use a LeakyReLU slope of 0.25 and dropout 0.5, which float32 holds exactly (the compiled kernels
take their scalars in float32: gnnfuse README).
"""

from __future__ import annotations

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges, gat_oracle, input_order_keep_mask, poison_op_outputs

from fusecore import PhiloxStream, use_reference
from fusecore.testing import TOLERANCES, assert_all_written, assert_close
from gnnfuse import Graph, ops
from gnnfuse.nn import GATConv

SLOPE = 0.25
P = 0.5


def oracle(edges, num_nodes, wh_src, el, er, weight, keep=None):
    """DGL's GATConv message passing in float64: ``(out [N, H, D], α' [E, H])``, input edge order."""
    return gat_oracle(edges, num_nodes, wh_src, el, er, SLOPE, keep=keep, dropout=P, weight=weight)


def keep_mask(graph: Graph, heads: int, seed: int) -> torch.Tensor:
    """The forward's dropout mask ``[E, H]`` in the graph's input edge order."""
    return input_order_keep_mask(graph, heads, P, seed)


def leaves(gen, num_nodes, num_edges, heads, dim, dtype):
    """``wh [N, H, D]`` in ``dtype``, ``el`` / ``er`` in the accumulation dtype, ``w [E]`` (float32 unless float64),
    signed and spread so that no factor is 1."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    weight = r(num_edges) * 1.5
    return [r(num_nodes, heads, dim).to(dtype), r(num_nodes, heads).to(acc), r(num_nodes, heads).to(acc),
            weight.to(acc)]


def check_against_oracle(graph, edges, num_nodes, inputs, run, gen, tol, keep=None, created=None):
    """Run ``run(*leaves)`` (leaves on the graph's device, requiring gradients) and the oracle on the same
    values in float64; compare outputs and every gradient for one random upstream gradient."""
    ours = [t.clone().to(graph.device).requires_grad_(True) for t in inputs]
    theirs = [t.detach().double().clone().requires_grad_(True) for t in inputs]
    out = run(*ours)
    if created is not None:
        assert_all_written(created[-1])
    ref, _ = oracle(edges, num_nodes, *theirs, keep=keep)
    assert_close(out.double().cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(out.device, out.dtype))
    ref.backward(grad)
    for name, a, b in zip(("wh", "el", "er", "edge_weight"), ours, theirs):
        assert a.grad is not None and a.grad.dtype == a.dtype, name
        assert_close(a.grad.double().cpu(), b.grad, tol=tol, name=f"grad {name}")


@pytest.mark.parametrize("schedule", ["auto", "light", "medium", "super", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_gat_attention_with_edge_weight_matches_the_oracle(schedule, dtype, gen, device):
    """Corner-case graph (super node, self loops, duplicate edges, isolated nodes) under every bucket kind."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, dtype)

    def run(wh, el, er, weight):
        return ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_weight=weight,
                                 schedule=SCHEDULES[schedule])

    check_against_oracle(graph, edges, num_nodes, inputs, run, gen, TOLERANCES[dtype])


@pytest.mark.parametrize("schedule", ["light", "super", "mixed"])
def test_edge_weight_after_the_dropout(schedule, gen, device, monkeypatch):
    """With attention dropout the factor multiplies the kept, rescaled weight: forward and every gradient against
    the oracle with the forward's own mask; every output and scratch buffer written."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    keep = keep_mask(graph, heads, seed)
    assert 0 < int(keep.sum()) < keep.numel()
    created = poison_op_outputs(monkeypatch)

    def run(wh, el, er, weight):
        return ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_weight=weight, dropout=P,
                                 rng=PhiloxStream(seed), schedule=SCHEDULES[schedule])

    check_against_oracle(graph, edges, num_nodes, inputs, run, gen, TOLERANCES[torch.float64], keep=keep,
                         created=created)


@pytest.mark.parametrize("unrolled", [True, False])
def test_both_light_forms(unrolled, gen, device, monkeypatch):
    """The light rows' unrolled and tile forms (forward and source pass) both apply the factor and its gradient."""
    for name in ("LIGHT_FORWARD_UNROLLED", "LIGHT_SOURCE_UNROLLED"):
        monkeypatch.setattr(ops, name, unrolled)
    num_nodes, heads, dim = 29, 2, 8
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    inputs = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))

    def run(wh, el, er, weight):
        return ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, edge_weight=weight, dropout=P,
                                 rng=PhiloxStream(seed), schedule=SCHEDULES["light"])

    check_against_oracle(graph, edges, num_nodes, inputs, run, gen, TOLERANCES[torch.float64],
                         keep=keep_mask(graph, heads, seed))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_unit_edge_weight_changes_nothing(dtype, gen, device):
    """Multiplying by 1.0 is exact: output and feature gradients equal a call without ``edge_weight`` bit for
    bit, and ``∂w`` is the sum over heads of ``α' <g, Wh_j>``."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, _ = [t.to(device) for t in leaves(gen, num_nodes, edges.shape[1], heads, dim, dtype)]
    grad = torch.randn(num_nodes, heads, dim, generator=gen).to(device, dtype)
    results = []
    for weight in (None, torch.ones(edges.shape[1], device=device, dtype=el.dtype, requires_grad=True)):
        ins = [t.clone().requires_grad_(True) for t in (wh, el, er)]
        out = ops.gat_attention(graph, *ins, negative_slope=SLOPE, dropout=P, rng=PhiloxStream(5), edge_weight=weight)
        out.backward(grad)
        results.append((out, *(t.grad for t in ins), weight))
    for a, b, what in zip(results[0][:4], results[1][:4], ("output", "∂wh", "∂el", "∂er")):
        assert torch.equal(a, b), what
    weight = results[1][4]
    _, alpha = ops.gat_attention(graph, wh, el, er, negative_slope=SLOPE, dropout=P, rng=PhiloxStream(5),
                                 return_attention=True)
    src, dst = edges[0].to(device), edges[1].to(device)
    expected = (alpha.double()[:, :, None] * grad.double()[dst] * wh.double()[src]).sum((1, 2))
    assert_close(weight.grad.double(), expected, tol=TOLERANCES[dtype], name="∂w at w = 1")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gat_op_with_projection_bias_and_edge_weight(dtype, gen, device):
    """``ops.gat`` projecting ``x`` itself, with a bias as ``out_add``: every gradient, ``∂w`` included."""
    num_nodes, heads, dim, feats = 29, 3, 4, 16
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)

    values = [r(num_nodes, feats), r(heads * dim, feats, scale=0.25), r(1, heads, dim), r(1, heads, dim),
              r(heads * dim), r(edges.shape[1], scale=1.5)]
    ours = [t.clone().to(device).requires_grad_(True) for t in values]
    theirs = [t.double().clone().requires_grad_(True) for t in values]
    out = ops.gat(graph, ours[0], ours[2], ours[3], weight=ours[1], out_add=ours[4], edge_weight=ours[5],
                  negative_slope=SLOPE)
    x, weight, attn_l, attn_r, bias, w = theirs
    wh = (x @ weight.t()).view(num_nodes, heads, dim)
    ref, _ = oracle(edges, num_nodes, wh, (wh * attn_l).sum(-1), (wh * attn_r).sum(-1), w)
    ref = ref + bias.view(heads, dim)
    tol = TOLERANCES[dtype]
    assert_close(out.double().cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device, dtype))
    ref.backward(grad)
    for name, a, b in zip(("x", "weight", "attn_l", "attn_r", "bias", "edge_weight"), ours, theirs):
        assert_close(a.grad.double().cpu(), b.grad, tol=tol, name=f"grad {name}")


def test_only_the_edge_weight_needs_a_gradient(gen, device):
    """A weight learned on its own (features frozen): the backward still runs and gives ``∂w`` alone."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, w = leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)
    weight = w.clone().to(device).requires_grad_(True)
    out = ops.gat_attention(graph, wh.to(device), el.to(device), er.to(device), negative_slope=SLOPE,
                            edge_weight=weight)
    theirs = w.clone().requires_grad_(True)
    ref, _ = oracle(edges, num_nodes, wh, el, er, theirs)
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    assert_close(weight.grad.cpu(), theirs.grad, tol=TOLERANCES[torch.float64], name="∂w")


def test_attention_weights_carry_the_edge_weight(gen, device):
    """``return_attention``: the aggregation's weights (dropout and factor applied) sum the messages to the
    output; ``attention_dropout=False`` gives the softmax alone."""
    num_nodes, heads, dim = 29, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    wh, el, er, w = [t.to(device) for t in leaves(gen, num_nodes, edges.shape[1], heads, dim, torch.float64)]
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    kw = {"negative_slope": SLOPE, "dropout": P, "edge_weight": w, "return_attention": True}
    out, used = ops.gat_attention(graph, wh, el, er, rng=PhiloxStream(seed), **kw)
    _, softmax = ops.gat_attention(graph, wh, el, er, rng=PhiloxStream(seed), attention_dropout=False, **kw)
    keep = keep_mask(graph, heads, seed)
    ref_out, ref_used = oracle(edges, num_nodes, wh.cpu(), el.cpu(), er.cpu(), w.cpu(), keep=keep)
    tol = TOLERANCES[torch.float64]
    assert_close(used.cpu(), ref_used, tol=tol, name="aggregation weights")
    assert_close(out.cpu(), ref_out, tol=tol, name="output")
    assert_close(softmax.cpu(), oracle(edges, num_nodes, wh.cpu(), el.cpu(), er.cpu(),
                                       torch.ones_like(w.cpu()))[1], tol=tol, name="softmax")
    with use_reference():
        reference_pair = ops.gat_attention(graph, wh, el, er, rng=PhiloxStream(seed), **kw)
    for ours, theirs, what in zip((out, used), reference_pair, ("output", "weights")):
        assert_close(ours, theirs, tol=tol, name=f"{what} against the reference path")


def test_gatconv_takes_dgls_edge_weight(gen, device):
    """The layer against DGL's formula with its own parameters (a linear residual, which carries the bias): output,
    ``get_attention``'s ``α' [E, H, 1]`` with the factor in it, and the gradients of the input, the parameters and
    the weight."""
    num_nodes, feats, heads, dim = 29, 6, 3, 4
    edges = corner_case_edges(gen, num_nodes)
    graph = Graph(edges.to(device), num_nodes)
    layer = GATConv(feats, dim, heads, negative_slope=SLOPE, residual=True, allow_zero_in_degree=True)
    layer = layer.double().to(device)
    x = torch.randn(num_nodes, feats, generator=gen, dtype=torch.float64)
    w = torch.randn(edges.shape[1], generator=gen, dtype=torch.float64)
    ours_x, ours_w = x.clone().to(device).requires_grad_(True), w.clone().to(device).requires_grad_(True)
    out, attention = layer(graph, ours_x, ours_w, get_attention=True)
    assert tuple(attention.shape) == (edges.shape[1], heads, 1) and not attention.requires_grad
    params = {n: p.detach().cpu().clone().requires_grad_(True) for n, p in layer.named_parameters()}
    theirs_x, theirs_w = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    wh = (theirs_x @ params["fc.weight"].t()).view(num_nodes, heads, dim)
    el, er = (wh * params["attn_l"]).sum(-1), (wh * params["attn_r"]).sum(-1)
    ref, alpha = oracle(edges, num_nodes, wh, el, er, theirs_w)
    residual = theirs_x @ params["res_fc.weight"].t() + params["res_fc.bias"]
    ref = ref + residual.view(num_nodes, heads, dim)
    tol = TOLERANCES[torch.float64]
    assert_close(out.cpu(), ref, tol=tol, name="output")
    assert_close(attention.squeeze(-1).cpu(), alpha.detach(), tol=tol, name="get_attention")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    assert_close(ours_x.grad.cpu(), theirs_x.grad, tol=tol, name="grad feat")
    assert_close(ours_w.grad.cpu(), theirs_w.grad, tol=tol, name="grad edge_weight")
    for name, p in layer.named_parameters():
        assert_close(p.grad.cpu(), params[name].grad, tol=tol, name=f"grad {name}")


def test_gatconv_bipartite_with_edge_weight(gen, device):
    """A ``(feat_src, feat_dst)`` call: ``el`` from the sources, ``er`` from the destinations, the factor per edge."""
    n_src, n_dst, feats, heads, dim, num_edges = 13, 7, 5, 2, 4, 40
    src = torch.randint(0, n_src, (num_edges,), generator=gen)
    dst = torch.randint(0, n_dst, (num_edges,), generator=gen)
    dst[:n_dst] = torch.arange(n_dst)
    edges = torch.stack([src, dst])
    layer = GATConv(feats, dim, heads, negative_slope=SLOPE).double().to(device)
    x_src = torch.randn(n_src, feats, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, feats, generator=gen, dtype=torch.float64)
    w = torch.randn(num_edges, generator=gen, dtype=torch.float64)
    ours_w = w.clone().to(device).requires_grad_(True)
    out = layer(edges.to(device), (x_src.to(device), x_dst.to(device)), ours_w)
    fc = layer.fc.weight.detach().cpu()
    wh_src = (x_src @ fc.t()).view(n_src, heads, dim)
    wh_dst = (x_dst @ fc.t()).view(n_dst, heads, dim)
    el = (wh_src * layer.attn_l.detach().cpu()).sum(-1)
    er = (wh_dst * layer.attn_r.detach().cpu()).sum(-1)
    er = torch.cat([er, er.new_zeros(n_src - n_dst, heads)])
    theirs_w = w.clone().requires_grad_(True)
    ref, _ = oracle(edges, n_src, wh_src, el, er, theirs_w)
    ref = ref[:n_dst] + layer.bias.detach().cpu().view(heads, dim)
    tol = TOLERANCES[torch.float64]
    assert_close(out.cpu(), ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    assert_close(ours_w.grad.cpu(), theirs_w.grad, tol=tol, name="grad edge_weight")


def test_empty_graph_and_zero_weights(device):
    graph = Graph(torch.zeros(2, 0, dtype=torch.int64, device=device), 4)
    x = torch.randn(4, 2, 3, device=device)
    s = torch.randn(4, 2, device=device)
    out = ops.gat_attention(graph, x, s, s, edge_weight=torch.empty(0, device=device))
    assert torch.equal(out, torch.zeros_like(out))
    graph = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]], device=device), 3)
    out = ops.gat_attention(graph, x[:3], s[:3], s[:3], edge_weight=torch.zeros(3, device=device))
    assert torch.equal(out, torch.zeros_like(out))


def test_bad_edge_weights_are_refused(device):
    graph = Graph(torch.tensor([[0, 1, 2], [1, 2, 0]], device=device), 3)
    x, s = torch.randn(3, 2, 4, device=device), torch.randn(3, 2, device=device)
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[num_edges\] = \[3\].*got \[3, 1\]"):
        ops.gat_attention(graph, x, s, s, edge_weight=torch.ones(3, 1, device=device))
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[num_edges\] = \[3\].*got \[4\]"):
        ops.gat_attention(graph, x, s, s, edge_weight=torch.ones(4, device=device))
    with pytest.raises(TypeError, match="edge_weight"):
        ops.gat_attention(graph, x, s, s, edge_weight=torch.ones(3, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match="edge_weight must be a tensor"):
        ops.gat_attention(graph, x, s, s, edge_weight=[1.0, 1.0, 1.0])
    layer = GATConv(4, 3, 2).to(device)
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[num_edges\] = \[3\]"):
        layer(graph, torch.randn(3, 4, device=device), torch.ones(2, device=device))
    with pytest.raises(ValueError, match=r"edge_weight must have shape"):
        ops.gat(graph, x, torch.ones(1, 2, 4, device=device), torch.ones(1, 2, 4, device=device),
                edge_weight=torch.ones(2, device=device))


@pytest.mark.gpu
def test_captured_training_with_a_learned_edge_weight(gen, device):
    """``gnnfuse.capture(layer, graph, x, w)``: the factor's reorder and its gradient's scatter replay in the CUDA
    graphs; three SGD steps (attention dropout on) follow the layer as called, ``∂w`` included."""
    import gnnfuse
    from fusecore import DevicePhiloxStream

    graph = Graph(corner_case_edges(gen).to(device), 29)
    torch.manual_seed(0)
    layer = GATConv(6, 4, 2, attn_drop=0.5, allow_zero_in_degree=True).to(device)
    twin = GATConv(6, 4, 2, attn_drop=0.5, allow_zero_in_degree=True).to(device)
    twin.load_state_dict(layer.state_dict())
    weight = torch.rand(graph.num_edges, generator=gen).to(device).requires_grad_(True)
    weight_twin = weight.detach().clone().requires_grad_(True)
    x = torch.randn(29, 6, generator=gen).to(device)
    captured = gnnfuse.capture(layer, graph, x, weight, rng=DevicePhiloxStream(9, device=device))
    host = PhiloxStream(9)
    for _ in range(3):  # the warm-up drew from the stream too: advance the host twin as far
        host.take(2)
    for step in range(3):
        x = torch.randn(29, 6, generator=gen).to(device)
        grad = torch.randn(29, 2, 4, generator=gen).to(device)
        captured(x, weight).backward(grad)
        twin(graph, x, weight_twin, rng=host).backward(grad)
        tol = TOLERANCES[torch.float32]
        assert_close(weight.grad, weight_twin.grad, tol=tol, name=f"step {step} ∂w")
        for (name, p), q in zip(layer.named_parameters(), twin.parameters()):
            assert_close(p.grad, q.grad, tol=tol, name=f"step {step} grad {name}")
        with torch.no_grad():
            for p, q in ((weight, weight_twin), *zip(layer.parameters(), twin.parameters())):
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
                p.grad = q.grad = None
