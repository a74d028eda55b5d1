"""The fused GAT attention (gnnfuse.ops) against the unfused float64 reference."""

import pytest
import torch
from gnn_testing import SCHEDULES, corner_case_edges, planetoid, poison_op_outputs

from fusecore import PhiloxStream
from fusecore.testing import TOLERANCES, assert_all_written, assert_close
from gnnfuse import Graph, ops
from gnnfuse.reference import dropout_keep_mask, gat_attention_reference


def random_inputs(gen, n, heads, dim, dtype, device, scale=1.0):
    wh = (torch.randn(n, heads, dim, generator=gen) * scale).to(device=device, dtype=dtype)
    el = (torch.randn(n, heads, generator=gen) * 2).to(device)
    er = (torch.randn(n, heads, generator=gen) * 2).to(device)
    return wh, el, er


def check_against_reference(graph, wh, el, er, gen, *, schedule=None, dropout=0.0, rng_seed=0, tol=None):
    """Forward, lse and the three gradients of the fused op against the float64 reference."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (wh, el, er)]
    rng = PhiloxStream(rng_seed, offset=5)
    out = ops.gat_attention(graph, *leaves, dropout=dropout, rng=rng, schedule=schedule)
    assert out.dtype == wh.dtype and out.shape == wh.shape
    grad_out = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
    grads = torch.autograd.grad(out, leaves, grad_out)
    refs = [t.detach().cpu().double().requires_grad_(True) for t in (wh, el, er)]
    ref_out, _ = gat_attention_reference(
        graph.to("cpu"), *refs, dropout=dropout, seed=rng_seed, offset=5
    )
    ref_grads = torch.autograd.grad(ref_out, refs, grad_out.cpu().double())
    tol = tol or TOLERANCES[wh.dtype]
    assert_close(out, ref_out, tol=tol, name="out")
    for name, g, r in zip(("wh", "el", "er"), grads, ref_grads):
        assert_close(g, r, tol=tol, name=f"grad {name}")


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_schedule_matches_reference(gen, device, schedule):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, el, er = random_inputs(gen, 29, 3, 5, torch.float32, device)
    check_against_reference(graph, wh, el, er, gen, schedule=SCHEDULES[schedule])


@pytest.mark.parametrize("heads, dim", [(1, 1), (2, 16), (5, 3)])
def test_any_head_count_and_size(gen, device, heads, dim):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, el, er = random_inputs(gen, 29, heads, dim, torch.float32, device)
    check_against_reference(graph, wh, el, er, gen, schedule=SCHEDULES["mixed"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_accumulate_in_float32(gen, device, dtype):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, el, er = random_inputs(gen, 29, 4, 8, dtype, device)
    check_against_reference(graph, wh, el, er, gen, schedule=SCHEDULES["mixed"])


def test_float64_gradcheck(gen, device):
    graph = Graph(corner_case_edges(gen, num_nodes=9, num_edges=20).to(device), 9)
    wh, el, er = random_inputs(gen, 9, 2, 3, torch.float64, device)
    inputs = [t.double().requires_grad_(True) for t in (wh, el, er)]
    for schedule in (SCHEDULES["light"], SCHEDULES["super"]):
        def fused(w, a, b, schedule=schedule):
            return ops.gat_attention(graph, w, a, b, schedule=schedule)

        assert torch.autograd.gradcheck(fused, inputs, eps=1e-6, atol=1e-7, fast_mode=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bfloat16: the unrolled light forward
def test_attention_dropout_mask_is_regenerated_not_stored(gen, device, dtype):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, el, er = random_inputs(gen, 29, 3, 4, dtype, device)
    check_against_reference(graph, wh, el, er, gen, dropout=0.4, rng_seed=123, schedule=SCHEDULES["mixed"])
    keep = dropout_keep_mask(graph.to("cpu"), 3, 0.4, 123, 5)
    assert 0.45 < keep.float().mean().item() < 0.75
    a = ops.gat_attention(graph, wh, el, er, dropout=0.4, rng=PhiloxStream(123, offset=5))
    b = ops.gat_attention(graph, wh, el, er, dropout=0.4, rng=PhiloxStream(123, offset=8))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# the backward's source pass in tile form or unrolled (the default)
@pytest.mark.parametrize("source_unrolled", [False, True])
def test_every_output_and_scratch_element_is_written(gen, device, monkeypatch, dtype, source_unrolled):
    monkeypatch.setattr(ops, "LIGHT_SOURCE_UNROLLED", source_unrolled)
    created = poison_op_outputs(monkeypatch)
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, el, er = random_inputs(gen, 29, 3, 5, dtype, device)
    leaves = [t.requires_grad_(True) for t in (wh, el, er)]
    out = ops.gat_attention(graph, *leaves, schedule=SCHEDULES["mixed"])
    out.sum().backward()
    assert len(created) >= 8  # out, lse, partials, three gradients, ∂z and backward partials
    for i, t in enumerate(created):
        if t.dtype == torch.float32 and t.dim() == 2 and t.shape[0] == 29:
            t = torch.where(torch.isneginf(t), 0.0, t)  # lse is -inf for rows without edges
        assert_all_written(t, name=f"buffer {i} {tuple(t.shape)}")


def test_zero_in_degree_rows_single_node_and_edgeless_graphs(gen, device):
    wh, el, er = random_inputs(gen, 4, 2, 3, torch.float32, device)
    graph = Graph(torch.tensor([[0, 1], [1, 1]]).to(device), 4)  # nodes 0, 2, 3 receive nothing
    out, lse = ops.gat_forward(graph, wh, el, er, 0.2, 0.0, 0, 0, None)
    assert torch.all(out[[0, 2, 3]] == 0) and torch.all(torch.isneginf(lse[[0, 2, 3]]))
    alpha = torch.softmax(torch.nn.functional.leaky_relu(el[[0, 1]] + er[1], 0.2), 0)
    assert_close(out[1], (alpha[:, :, None] * wh[[0, 1]]).sum(0), tol=1e-5)
    single = Graph(torch.tensor([[0], [0]]).to(device), 1)
    assert_close(ops.gat_attention(single, wh[:1], el[:1], er[:1]), wh[:1], tol=1e-6)
    edgeless = Graph(torch.zeros(2, 0, dtype=torch.long, device=device), 4)
    x = wh.clone().requires_grad_(True)
    out = ops.gat_attention(edgeless, x, el, er)
    out.sum().backward()
    assert torch.all(out == 0) and torch.all(x.grad == 0)
    empty = Graph(torch.zeros(2, 0, dtype=torch.long, device=device), 0)
    assert ops.gat_attention(empty, wh[:0], el[:0], er[:0]).shape == (0, 2, 3)


def test_int64_index_path_gives_identical_results(gen, device):
    edges = corner_case_edges(gen).to(device)
    wh, el, er = random_inputs(gen, 29, 2, 4, torch.float32, device)
    narrow = ops.gat_attention(Graph(edges, 29), wh, el, er, schedule=SCHEDULES["mixed"])
    wide_graph = Graph(edges, 29, index_dtype=torch.int64)
    assert wide_graph.indptr.dtype == torch.int64
    wide = ops.gat_attention(wide_graph, wh, el, er, schedule=SCHEDULES["mixed"])
    assert torch.equal(narrow, wide)


def test_gat_with_attention_vectors_and_noncontiguous_inputs(gen, device):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    base = torch.randn(29, 5, 3, generator=gen).to(device)
    wh = base.transpose(1, 2)  # [29, 3, 5], not contiguous
    attn_l = torch.randn(1, 3, 5, generator=gen).to(device)
    attn_r = torch.randn(1, 3, 5, generator=gen).to(device)
    out = ops.gat(graph, wh, attn_l, attn_r, negative_slope=0.1)
    el, er = (wh * attn_l).sum(-1), (wh * attn_r).sum(-1)
    ref, _ = gat_attention_reference(graph, wh.double(), el.double(), er.double(), negative_slope=0.1)
    assert_close(out, ref)


def test_gat_projecting_its_input_matches_projection_then_gat(gen, device):
    # ops.gat with weight (the layer's path: projection, scores and attention in one autograd node)
    # against F.linear then ops.gat, in float64: output and every gradient, with (H, D) attention
    # vectors and a per-node addend given as [N, H·D] (their gradients come back in those shapes).
    graph = Graph(corner_case_edges(gen).to(device), 29)
    x = torch.randn(29, 7, generator=gen, dtype=torch.float64).to(device)
    leaves = [t.to(device) for t in (torch.randn(15, 7, generator=gen, dtype=torch.float64),
                                    torch.randn(3, 5, generator=gen, dtype=torch.float64),
                                    torch.randn(3, 5, generator=gen, dtype=torch.float64),
                                    torch.randn(29, 15, generator=gen, dtype=torch.float64))]
    grad = torch.randn(29, 3, 5, generator=gen, dtype=torch.float64).to(device)
    results = []
    for fused in (True, False):
        inputs = [t.detach().clone().requires_grad_(True) for t in (x, *leaves)]
        x_in, weight, attn_l, attn_r, add = inputs
        if fused:
            out = ops.gat(graph, x_in, attn_l, attn_r, out_add=add, weight=weight)
        else:
            wh = torch.nn.functional.linear(x_in, weight).view(29, 3, 5)
            out = ops.gat(graph, wh, attn_l, attn_r, out_add=add)
        out.backward(grad)
        results.append([out, *(t.grad for t in inputs)])
    for got, want in zip(*results):
        assert got.shape == want.shape
        assert_close(got, want, tol=TOLERANCES[torch.float64])
    with pytest.raises(ValueError, match="weight must have shape"):
        ops.gat(graph, x, leaves[1], leaves[2], weight=leaves[0][:, :6])
    with pytest.raises(ValueError, match="input x"):
        ops.gat(graph, x[:28], leaves[1], leaves[2], weight=leaves[0])


def test_bad_inputs_raise_clear_errors(gen, device):
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, el, er = random_inputs(gen, 29, 3, 5, torch.float32, device)
    with pytest.raises(ValueError, match="num_nodes=29"):
        ops.gat_attention(graph, wh[:28], el[:28], er[:28])
    with pytest.raises(ValueError, match="heads, head_dim"):
        ops.gat_attention(graph, wh.reshape(29, 15), el, er)
    with pytest.raises(ValueError, match="el must have shape"):
        ops.gat_attention(graph, wh, el[:, :2], er)
    with pytest.raises(TypeError, match="wh has dtype int32"):
        ops.gat_attention(graph, wh.int(), el, er)
    with pytest.raises(ValueError, match="dropout"):
        ops.gat_attention(graph, wh, el, er, dropout=1.0)
    with pytest.raises(ValueError, match="attn_l"):
        ops.gat(graph, wh, torch.ones(1, 3, 4), torch.ones(1, 3, 5))
    if device.type == "cpu":
        return
    with pytest.raises(ValueError, match="device"):
        ops.gat_attention(graph, wh.cpu(), el.cpu(), er.cpu())


@pytest.mark.parametrize("name", ["cora", "citeseer"])
def test_real_planetoid_graphs(gen, device, name):
    data = planetoid(name)
    graph = Graph(data.edge_index.to(device), data.num_nodes).add_self_loops()
    wh, el, er = random_inputs(gen, data.num_nodes, 2, 4, torch.float32, device)
    check_against_reference(graph, wh, el, er, gen)


@pytest.mark.gpu
def test_peak_memory_stays_far_below_one_edge_feature_tensor(gen, device):
    from gnnfuse.datasets import power_law_graph

    n, e, heads, dim = 20_000, 400_000, 4, 32
    graph = Graph(power_law_graph(n, e, 20_000, seed=1).to(device), n)
    wh, el, er = (t.requires_grad_(True) for t in random_inputs(gen, n, heads, dim, torch.float32, device))
    graph.schedule(heads, dim, torch.float32)  # built outside the measured region
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = ops.gat_attention(graph, wh, el, er, dropout=0.1)
    out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    edge_feature_bytes = e * heads * dim * 4
    node_feature_bytes = n * heads * dim * 4
    # O(N·H·D + E·H): outputs, gradients, ∂z [E, H]; never one E×H×D tensor.
    assert peak < 8 * node_feature_bytes + 3 * e * heads * 4 < edge_feature_bytes / 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_node_scores_kernel_and_its_gradients(gen, device, dtype):
    wh = torch.randn(37, 3, 5, generator=gen).to(device, dtype).requires_grad_(True)
    attn_l = torch.randn(1, 3, 5, generator=gen).to(device, dtype).requires_grad_(True)
    attn_r = torch.randn(1, 3, 5, generator=gen).to(device, dtype).requires_grad_(True)
    el, er = ops.node_scores(wh, attn_l, attn_r)
    assert el.dtype == er.dtype == torch.float32
    leaves = [t.detach().cpu().double().requires_grad_(True) for t in (wh, attn_l, attn_r)]
    ref_el, ref_er = (leaves[0] * leaves[1]).sum(-1), (leaves[0] * leaves[2]).sum(-1)
    tol = TOLERANCES[dtype]
    assert_close(el, ref_el, tol=tol, name="el")
    assert_close(er, ref_er, tol=tol, name="er")
    g_el, g_er = torch.randn(37, 3, generator=gen), torch.randn(37, 3, generator=gen)
    grads = torch.autograd.grad((el, er), (wh, attn_l, attn_r), (g_el.to(device), g_er.to(device)))
    ref_grads = torch.autograd.grad((ref_el, ref_er), leaves, (g_el.double(), g_er.double()))
    for name, g, r in zip(("wh", "attn_l", "attn_r"), grads, ref_grads):
        assert g.dtype == dtype
        assert_close(g, r, tol=tol, name=f"grad {name}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gat_op_gradients_including_attention_vectors(gen, device, dtype):
    """Forward and every gradient of the GAT op with an output bias (training: the output with the
    bias is the kernels' second store, the bias gradient the δ kernel's column sums)."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    leaves = [torch.randn(shape, generator=gen).to(device, dtype).requires_grad_(True)
              for shape in ((29, 3, 5), (1, 3, 5), (1, 3, 5), (15,))]
    out = ops.gat(graph, *leaves[:3], dropout=0.3, rng=PhiloxStream(9), schedule=SCHEDULES["mixed"],
                  out_add=leaves[3])
    assert out.dtype == dtype
    grad_out = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad(out, leaves, grad_out.to(device, dtype))
    refs = [t.detach().cpu().double().requires_grad_(True) for t in leaves]
    el, er = (refs[0] * refs[1]).sum(-1), (refs[0] * refs[2]).sum(-1)
    ref, _ = gat_attention_reference(graph.to("cpu"), refs[0], el, er, dropout=0.3, seed=9, offset=0)
    ref = ref + refs[3].view(3, 5)
    ref_grads = torch.autograd.grad(ref, refs, grad_out.double())
    assert_close(out, ref, tol=TOLERANCES[dtype])
    for name, g, r in zip(("wh", "attn_l", "attn_r", "bias"), grads, ref_grads):
        assert g.dtype == dtype and g.shape == r.shape
        assert_close(g, r, tol=TOLERANCES[dtype], name=f"grad {name}")


@pytest.mark.parametrize("schedule", ["mixed", "super"])
def test_forward_and_backward_are_bitwise_reproducible(gen, device, schedule):
    """No atomics: the same inputs and dropout seed give bit-identical outputs and gradients run to run."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, el, er = random_inputs(gen, 29, 3, 5, torch.float32, device)
    grad_out = torch.randn(29, 3, 5, generator=gen).to(device)
    runs = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_(True) for t in (wh, el, er)]
        out = ops.gat_attention(graph, *leaves, dropout=0.3, rng=PhiloxStream(11), schedule=SCHEDULES[schedule])
        runs.append((out.detach(), *torch.autograd.grad(out, leaves, grad_out)))
    for name, a, b in zip(("out", "grad wh", "grad el", "grad er"), *runs):
        assert torch.equal(a, b), f"{name} differs between identical runs"


def test_output_term_is_added_in_the_store_or_after_the_op(gen, device):
    """``out_add`` (a layer's bias, or a per-node root term) is fused into the forward's store when
    no gradient flows and added after the attention when one does: the same values either way (the
    "mixed" schedule stores from light tiles, whole rows and the merge of split rows), and its
    gradient is ``Σ_n g_n`` (bias, from the backward's δ kernel) or ``g`` (per node), also when it
    is the only input that needs one; the other gradients are those of the op without it."""
    graph = Graph(corner_case_edges(gen).to(device), 29)
    wh, attn_l, attn_r = (torch.randn(shape, generator=gen).to(device) for shape in ((29, 3, 5), (1, 3, 5), (1, 3, 5)))
    upstream = torch.randn(29, 3, 5, generator=gen).to(device)
    options = SCHEDULES["mixed"]
    plain = ops.gat(graph, wh, attn_l, attn_r, schedule=options).detach()
    plain_t = ops.transformer_attention(graph, wh, attn_l.expand(29, 3, 5), wh, schedule=options).detach()
    leaf = wh.clone().requires_grad_(True)
    ops.gat(graph, leaf, attn_l, attn_r, schedule=options).backward(upstream)
    plain_grad = leaf.grad
    for add in (torch.randn(15, generator=gen).to(device), torch.randn(29, 15, generator=gen).to(device)):
        expected = plain + add.view(-1, 3, 5)
        expected_add_grad = upstream.reshape(add.shape) if add.dim() == 2 else upstream.sum(0).reshape(add.shape)
        with torch.no_grad():
            assert_close(ops.gat(graph, wh, attn_l, attn_r, schedule=options, out_add=add), expected, tol=1e-6)
            fused_t = ops.transformer_attention(graph, wh, attn_l.expand(29, 3, 5), wh, schedule=options, out_add=add)
            assert_close(fused_t, plain_t + add.view(-1, 3, 5), tol=1e-6)
        for wh_grad in (True, False):
            leaf = wh.clone().requires_grad_(wh_grad)
            add_leaf = add.clone().requires_grad_(True)
            out = ops.gat(graph, leaf, attn_l, attn_r, schedule=options, out_add=add_leaf)
            assert_close(out, expected, tol=1e-6)
            out.backward(upstream)
            assert_close(add_leaf.grad, expected_add_grad, tol=1e-5)
            if wh_grad:
                assert_close(leaf.grad, plain_grad, tol=1e-6)
        value = wh.clone().requires_grad_(True)
        add_leaf = add.clone().requires_grad_(True)
        out_t = ops.transformer_attention(graph, wh, attn_l.expand(29, 3, 5), value, schedule=options,
                                          out_add=add_leaf)
        assert_close(out_t, plain_t + add.view(-1, 3, 5), tol=1e-6)
        out_t.backward(upstream)
        assert_close(add_leaf.grad, expected_add_grad, tol=1e-5)
        assert value.grad is not None and torch.isfinite(value.grad).all()
    with pytest.raises(ValueError, match=r"out_add must be a bias of shape \[H·D\] = \[15\].*or a per-node term"):
        ops.gat(graph, wh, attn_l, attn_r, out_add=torch.ones(7, device=device))
