"""Projections as one product: the attention ops read column blocks of one ``[N, W]`` output in place and
store their gradients into one ``[N, W]`` gradient (gnnfuse.ops._packed_columns).

GATv2's two sides and the Graph Transformer's queries, keys, values (and root term) computed by
:func:`fusecore.linear.linears` are views of one product; the ops take its base as their autograd input,
the kernels read with the base's row stride and store ``∂fs``/``∂fd`` or ``∂q``/``∂k``/``∂v`` (and ``g`` for
the root term) in place.  Checked against the float64 reference computed from ``x``, the weights and biases
(so the product and its backward are part of what is checked), with every buffer poisoned.
"""

from __future__ import annotations

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges, poison_op_outputs

from fusecore import PhiloxStream
from fusecore.linear import linears
from fusecore.testing import TOLERANCES, assert_all_written, assert_close
from gnnfuse import Graph, ops, reference

HEADS, DIM, FEATS, EDGE_DIM = 3, 5, 11, 3
# op -> number of [H·D] blocks projected together (the root term last)
BLOCKS = {"gatv2": 2, "transformer": 3, "transformer+root": 4, "transformer+edge": 3}


@pytest.fixture
def packed_calls(monkeypatch):
    """The ``packing`` of every attention backward that stored into one ``[N, W]`` gradient."""
    calls = []
    original = ops._packed_gradient

    def spy(base, packing):
        calls.append(packing)
        return original(base, packing)

    monkeypatch.setattr(ops, "_packed_gradient", spy)
    return calls


def _params(gen, blocks: int, dtype, device, extra: int = 0):
    """x [N, F] and stacked weights / biases of ``blocks`` maps of H·D outputs (+ ``extra`` more outputs)."""
    width = HEADS * DIM
    weights = [torch.randn(width, FEATS, generator=gen) / FEATS ** 0.5 for _ in range(blocks)]
    biases = [torch.randn(width, generator=gen) for _ in range(blocks)]
    if extra:
        weights.append(torch.randn(extra, FEATS, generator=gen))
        biases.append(torch.randn(extra, generator=gen))
    return [t.to(device, dtype) for t in weights], [t.to(device, dtype) for t in biases]


def _op(name, graph, blocks, edge, dropout, schedule, rng=None):
    """Run op ``name`` on ``blocks`` (``[N, H·D]`` each, in projection order); returns ``out [N, H, D]``."""
    shape = (graph.num_nodes, HEADS, DIM)
    views = [b.view(shape) for b in blocks]
    if name == "gatv2":
        fs, fd, attn = views[0], views[1], edge
        return ops.gatv2(graph, fs, fd, attn, negative_slope=0.15, dropout=dropout, rng=rng, schedule=schedule)
    edge_attr, edge_weight = edge if name == "transformer+edge" else (None, None)
    return ops.transformer_attention(graph, *views[:3], edge_attr, edge_weight, dropout=dropout, rng=rng,
                                     schedule=schedule, out_add=views[3] if name == "transformer+root" else None)


def _reference(name, graph, blocks, edge, dropout, seed):
    shape = (graph.num_nodes, HEADS, DIM)
    views = [b.reshape(shape) for b in blocks]
    kw = {"dropout": dropout, "seed": seed, "offset": 5}
    if name == "gatv2":
        return reference.gatv2_reference(graph, views[0], views[1], edge, negative_slope=0.15, **kw)[0]
    edge_attr, edge_weight = edge if name == "transformer+edge" else (None, None)
    out = reference.transformer_attention_reference(graph, *views[:3], edge_attr, edge_weight, **kw)[0]
    return out + views[3] if name == "transformer+root" else out


def _edge_leaves(name, graph, gen, dtype, device):
    if name == "gatv2":
        return torch.randn(1, HEADS, DIM, generator=gen).to(device, dtype)
    if name == "transformer+edge":
        return (torch.randn(graph.num_edges, EDGE_DIM, generator=gen).to(device, dtype),
                torch.randn(HEADS * DIM, EDGE_DIM, generator=gen).to(device, dtype))
    return None


def _check_grads(grads, ref_grads, tol: float, scale: float, name: str) -> None:
    """Each gradient against float64, relatively — or absolutely, against ``scale`` (the size of the
    output's gradient), where the true gradient vanishes: the key bias's, ``Σ_j ∂k_j = Σ_i q_i Σ_j ∂s_ij =
    0`` (softmax gradients sum to zero per row)."""
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        label = f"{name} grad of leaf {i} {tuple(r.shape)}"
        if torch.linalg.vector_norm(r).item() < 1e-6 * scale:
            assert torch.linalg.vector_norm(g.double().cpu() - r).item() <= tol * scale, label
        else:
            assert_close(g, r, tol=tol, name=label)


def _leaves(edge):
    return [] if edge is None else [edge] if isinstance(edge, torch.Tensor) else list(edge)


@pytest.mark.parametrize("schedule", ["auto", "light", "medium", "super", "mixed"])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_packed_projections_match_reference(gen, device, monkeypatch, packed_calls, name, schedule):
    """Forward and the gradients of x, every weight and bias (and the edge leaves) against float64, through
    every kind of launch (light classes, medium rows, split rows and their merges), with dropout."""
    created = poison_op_outputs(monkeypatch)
    graph = Graph(corner_case_edges(gen).to(device), 29)
    dtype = torch.float32
    weights, biases = _params(gen, BLOCKS[name], dtype, device)
    x = torch.randn(graph.num_nodes, FEATS, generator=gen).to(device, dtype)
    edge = _edge_leaves(name, graph, gen, dtype, device)
    leaves = [x, *weights, *biases, *_leaves(edge)]
    fused = [t.clone().requires_grad_() for t in leaves]
    fx, fw, fb = fused[0], fused[1:1 + len(weights)], fused[1 + len(weights):1 + 2 * len(weights)]
    fedge = fused[1 + 2 * len(weights):]
    blocks = linears(fx, fw, fb)
    edge_args = fedge[0] if name == "gatv2" else tuple(fedge) if fedge else None
    out = _op(name, graph, blocks, edge_args, 0.3, SCHEDULES[schedule], PhiloxStream(7, offset=5))
    grad_out = torch.randn(out.shape, generator=gen).to(device, dtype)
    grads = torch.autograd.grad(out, fused, grad_out)
    assert len(packed_calls) == 1 and packed_calls[0][2][:BLOCKS[name]] == tuple(
        i * HEADS * DIM for i in range(BLOCKS[name]))
    for buffer in created:
        assert_all_written(buffer)

    refs = [t.detach().cpu().double().requires_grad_() for t in leaves]
    rx, rw, rb = refs[0], refs[1:1 + len(weights)], refs[1 + len(weights):1 + 2 * len(weights)]
    redge = refs[1 + 2 * len(weights):]
    ref_blocks = [rx @ w.t() + b for w, b in zip(rw, rb)]
    ref_out = _reference(name, graph.to("cpu"), ref_blocks, redge[0] if name == "gatv2" else tuple(redge) or None,
                         0.3, 7)
    ref_grads = torch.autograd.grad(ref_out, refs, grad_out.cpu().double())
    tol = TOLERANCES[dtype]
    assert_close(out, ref_out, tol=tol, name=f"{name} out")
    for g, leaf in zip(grads, leaves):
        assert g.shape == leaf.shape and g.dtype == dtype
    _check_grads(grads, ref_grads, tol, torch.linalg.vector_norm(grad_out.double()).item(), name)


@pytest.mark.parametrize("name", ["gatv2", "transformer+root"])
def test_packed_bfloat16_layer_shapes(gen, device, packed_calls, name):
    """bfloat16 with the GPU's feature tile shape (8 heads × 16): the kernels' 16-byte row alignment holds for
    the blocks of a [N, 4 · 128] product too."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    width, blocks_n = 8 * 16, BLOCKS[name]
    x = torch.randn(graph.num_nodes, 24, generator=gen).to(device, torch.bfloat16)
    weights = [(torch.randn(width, 24, generator=gen) / 5).to(device, torch.bfloat16) for _ in range(blocks_n)]
    leaves = [t.clone().requires_grad_() for t in (x, *weights)]
    blocks = linears(leaves[0], leaves[1:])
    shape = (graph.num_nodes, 8, 16)
    views = [b.view(shape) for b in blocks]
    if name == "gatv2":
        attn = torch.randn(1, 8, 16, generator=gen).to(device, torch.bfloat16)
        out = ops.gatv2(graph, views[0], views[1], attn, schedule=SCHEDULES["mixed"])
    else:
        out = ops.transformer_attention(graph, *views[:3], out_add=views[3], schedule=SCHEDULES["mixed"])
    grad_out = torch.randn(out.shape, generator=gen).to(device, torch.bfloat16)
    grads = torch.autograd.grad(out, leaves, grad_out)
    assert len(packed_calls) == 1
    refs = [t.detach().cpu().double().requires_grad_() for t in (x, *weights)]
    # the blocks as the kernels see them: the product rounded to bfloat16 (its gradient passed straight through)
    ref_blocks = [(y + (y.to(torch.bfloat16).double() - y).detach()).view(shape)
                  for y in (refs[0] @ w.t() for w in refs[1:])]
    if name == "gatv2":
        ref = reference.gatv2_reference(graph.to("cpu"), ref_blocks[0], ref_blocks[1], attn.cpu().double())[0]
    else:
        ref = reference.transformer_attention_reference(graph.to("cpu"), *ref_blocks[:3])[0] + ref_blocks[3]
    ref_grads = torch.autograd.grad(ref, refs, grad_out.cpu().double())
    assert_close(out, ref, dtype=torch.bfloat16, name="out")
    _check_grads(grads, ref_grads, TOLERANCES[torch.bfloat16], torch.linalg.vector_norm(grad_out.double()).item(),
                 name)


@pytest.mark.parametrize("name", ["gatv2", "transformer+root", "transformer+edge"])
def test_strided_blocks_without_autograd_equal_contiguous(gen, device, name):
    """Without autograd the column blocks are read in place (no copy) and give exactly what contiguous
    copies of them give: only the addresses differ."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    weights, biases = _params(gen, BLOCKS[name], torch.float32, device)
    x = torch.randn(graph.num_nodes, FEATS, generator=gen).to(device)
    edge = _edge_leaves(name, graph, gen, torch.float32, device)
    with torch.no_grad():
        blocks = linears(x, weights, biases)
        assert all(b.stride(0) == len(blocks) * HEADS * DIM for b in blocks)
        strided = _op(name, graph, blocks, edge, 0.0, SCHEDULES["mixed"])
        contiguous = _op(name, graph, [b.contiguous() for b in blocks], edge, 0.0, SCHEDULES["mixed"])
    assert torch.equal(strided, contiguous)


def test_uncovered_columns_and_other_uses_of_the_product(gen, device, packed_calls):
    """A product with columns the op does not read (used elsewhere in the loss): their share of ∂W, ∂b
    comes from the other use alone (the op's gradient is zero there), and the sums are right."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    weights, biases = _params(gen, 3, torch.float32, device, extra=4)
    x = torch.randn(graph.num_nodes, FEATS, generator=gen).to(device)
    leaves = [t.clone().requires_grad_() for t in (x, *weights, *biases)]
    blocks = linears(leaves[0], leaves[1:5], leaves[5:])
    out = _op("transformer", graph, blocks[:3], None, 0.0, None)
    loss = out.square().sum() + blocks[3].sin().sum() + blocks[0].sum()  # extra columns; a block used twice
    grads = torch.autograd.grad(loss, leaves)
    assert len(packed_calls) == 1 and packed_calls[0][2] == (0, HEADS * DIM, 2 * HEADS * DIM, None)
    refs = [t.detach().cpu().double().requires_grad_() for t in (x, *weights, *biases)]
    rb = [refs[0] @ w.t() + b for w, b in zip(refs[1:5], refs[5:])]
    shape = (graph.num_nodes, HEADS, DIM)
    ref_out = reference.transformer_attention_reference(graph.to("cpu"), *(b.view(shape) for b in rb[:3]))[0]
    ref_loss = ref_out.square().sum() + rb[3].sin().sum() + rb[0].sum()
    ref_grads = torch.autograd.grad(ref_loss, refs)
    _check_grads(grads, ref_grads, TOLERANCES[torch.float32], torch.linalg.vector_norm(ref_grads[0]).item(), "loss")


def test_packed_columns_only_for_disjoint_blocks_of_one_product(device):
    """What is taken as one product's column blocks, and what falls back to the plain path."""
    x = torch.randn(6, FEATS, device=device)
    w = torch.randn(4 * HEADS * DIM, FEATS, device=device, requires_grad=True)
    y = x @ w.t()
    q, k, v, r = (b.view(6, HEADS, DIM) for b in y.split(HEADS * DIM, dim=1))
    assert ops._packed_columns(q, k, v, None) == (y, (0, 15, 30, None))
    assert ops._packed_columns(v, q, r) == (y, (30, 0, 45))
    assert ops._packed_columns(q, q) is None                      # one block twice: gradients must add
    assert ops._packed_columns(q, y[:, 8:23].view(6, HEADS, DIM)) is None   # overlapping columns
    other = (x @ w.t()).view(6, 4, HEADS, DIM)[:, 1]
    assert ops._packed_columns(q, other) is None                  # blocks of two products
    assert ops._packed_columns(q.contiguous(), k) is None         # not a view
    yt = (w @ x.t()).t()                                          # a transposed (non-contiguous) base
    assert ops._packed_columns(*[b.reshape(6, HEADS, DIM) for b in yt.split(HEADS * DIM, dim=1)][:2]) is None
    with torch.no_grad():
        assert ops._packed_columns(q, k) is None                  # nothing to return a gradient to
    frozen = x @ w.detach().t()
    assert ops._packed_columns(*[b.view(6, HEADS, DIM) for b in frozen.split(HEADS * DIM, dim=1)][:2]) is None


def test_shared_gatv2_sides_stay_unpacked(gen, device, packed_calls):
    """GATv2 with shared weights passes one tensor as both sides: not packed (its gradients add up)."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    weights, biases = _params(gen, 1, torch.float32, device)
    x = torch.randn(graph.num_nodes, FEATS, generator=gen).to(device).requires_grad_()
    feat = (x @ weights[0].t() + biases[0]).view(graph.num_nodes, HEADS, DIM)
    attn = torch.randn(1, HEADS, DIM, generator=gen).to(device)
    out = ops.gatv2(graph, feat, feat, attn)
    (grad_x,) = torch.autograd.grad(out.square().sum(), x)
    assert not packed_calls
    rx = x.detach().cpu().double().requires_grad_()
    rf = (rx @ weights[0].cpu().double().t() + biases[0].cpu().double()).view(graph.num_nodes, HEADS, DIM)
    ref = reference.gatv2_reference(graph.to("cpu"), rf, rf, attn.cpu().double())[0]
    assert_close(grad_x, torch.autograd.grad(ref.square().sum(), rx)[0], dtype=torch.float32, name="grad of x")
