"""GATv2 with edge features (PyG GATv2Conv's ``edge_dim``): ``ops.gatv2(..., edge_attr, edge_weight)`` against the
float64 reference under every schedule form, and ``gnnfuse.pyg.GATv2Conv(edge_dim=...)`` against PyG's layer holding
the same state_dict.

The edge vector ``e_p = W_e attr_p`` sits inside the LeakyReLU (``s = a · LeakyReLU(fs_j + fd_i + e_p)``, values
``fs_j``): every kernel forming the score projects its edges in registers (light tiles, row kernels, super-row pieces,
the backward's source pass, the attention-weights pass), and ``∂attr`` / ``∂W_e`` come from one CSR-order pass over the
source pass's ``∂s`` and LeakyReLU slopes (one bit per element, stored by the source pass; the destination pass reads
them too).  Graphs: the corner-case graph (a super node, self loops, duplicate edges, isolated nodes), a
graph with zero in-degree nodes, edgeless and empty graphs.
"""

from __future__ import annotations

import pytest
import test_attention_family as family
import torch
import triton
import triton.language as tl
from gnn_testing import SCHEDULES, corner_case_edges
from test_attention_family import OPS, check_op, make_leaves

from fusecore import PhiloxStream, use_reference
from fusecore.backend import jit
from fusecore.testing import TOLERANCES, assert_close
from gnnfuse import Graph, ops, reference
from gnnfuse import pyg as fused
from gnnfuse.kernels.edge_features import slope_grad, store_slopes

NAME = "gatv2+edge"


def _graph(gen, device, **kwargs) -> Graph:
    num_nodes = kwargs.get("num_nodes", 29)
    return Graph(corner_case_edges(gen, **kwargs).to(device), num_nodes)


def _leaves(graph, heads, dim, dtype, device, gen, edge_dim=None):
    leaves = make_leaves(OPS[NAME], graph, heads, dim, dtype, device, gen)
    if edge_dim is not None:  # another feature width than the registry's
        leaves[3] = torch.randn(graph.num_edges, edge_dim, generator=gen).to(device, dtype)
        leaves[4] = torch.randn(heads * dim, edge_dim, generator=gen).to(device, dtype)
    return leaves


# ------------------------------------------------------------------------------------------------------------- the op


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_every_schedule_matches_reference(gen, device, schedule):
    """Light rows only (tile form, two width classes), medium rows only (with and without light rows), super-row
    pieces (per-row and per-lane state), the automatic schedule: output and the gradients of fs, fd, a, edge_attr
    and edge_weight against the float64 reference."""
    graph = _graph(gen, device)
    check_op(NAME, graph, _leaves(graph, 3, 5, torch.float32, device, gen), gen, schedule=SCHEDULES[schedule])


@pytest.mark.parametrize("edge_dim", [1, 17])
@pytest.mark.parametrize("schedule", ["light", "super"])
def test_edge_feature_widths(gen, device, schedule, edge_dim):
    """One raw feature (a 16-wide padded tile, 15 columns masked) and 17 (two 16-column halves of a 32-wide tile)."""
    graph = _graph(gen, device)
    leaves = _leaves(graph, 2, 8, torch.float32, device, gen, edge_dim=edge_dim)
    check_op(NAME, graph, leaves, gen, schedule=SCHEDULES[schedule])


@pytest.mark.parametrize("schedule", ["light", "super"])
def test_slopes_of_several_words(gen, device, schedule):
    """A head tile of 4 × 32 elements: the source pass's LeakyReLU slopes in four int32 words an edge (the bits of
    the last word's top element included), read back by the destination pass and the edge-gradient pass."""
    graph = _graph(gen, device)
    check_op(NAME, graph, _leaves(graph, 4, 29, torch.float32, device, gen), gen, schedule=SCHEDULES[schedule])


@jit
def _slopes_round_trip_kernel(z_ptr, grad_s_ptr, attn_ptr, slopes_ptr, out_ptr, E, H, D, negative_slope,
                              NUM_E: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                              SLOPE_BITS: tl.constexpr):
    """``z [E, H, D]``'s slopes stored, then ``∂z`` formed from them into ``out``."""
    pos = tl.arange(0, NUM_E)
    e_mask = pos < E
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    hd = offs_h[:, None] * D + offs_d[None, :]
    hd_mask = (offs_h < H)[:, None] & (offs_d < D)[None, :]
    mask = e_mask[:, None, None] & hd_mask[None, :, :]
    z = tl.load(z_ptr + pos[:, None, None] * (H * D) + hd[None, :, :], mask=mask, other=0.0)
    store_slopes(slopes_ptr, pos, e_mask, z, NUM_E, BLOCK_H, BLOCK_D, SLOPE_BITS)
    grad_s = tl.load(grad_s_ptr + pos[:, None] * H + offs_h[None, :], mask=e_mask[:, None] & (offs_h < H)[None, :],
                     other=0.0)
    attn = tl.load(attn_ptr + hd, mask=hd_mask, other=0.0)[None, :, :]
    grad_z = slope_grad(slopes_ptr, pos, e_mask, grad_s, attn, negative_slope, NUM_E, BLOCK_H, BLOCK_D,
                        SLOPE_BITS)
    tl.store(out_ptr + pos[:, None, None] * (H * D) + hd[None, :, :], grad_z, mask=mask)


@pytest.mark.parametrize("heads,dim", [(1, 1), (2, 8), (3, 5), (8, 16)])
def test_slope_bits_round_trip(device, heads, dim):
    """``store_slopes`` then ``slope_grad`` (kernels/edge_features.py) on a tile of signs, against torch: every
    element's slope (bit 31 of a word too), masked positions left unwritten."""
    gen = torch.Generator().manual_seed(heads * 100 + dim)
    num_e, edges = 16, 13
    block_h, block_d = triton.next_power_of_2(heads), triton.next_power_of_2(dim)
    bits = min(32, block_h * block_d)
    words = block_h * block_d // bits
    z = torch.randn(edges, heads, dim, generator=gen)
    z[z.abs() < 0.3] = 0.0  # zeros take the negative slope, as LeakyReLU's derivative there
    grad_s = torch.randn(edges, heads, generator=gen)
    attn = torch.randn(heads, dim, generator=gen)
    slopes = torch.full((num_e, words), -7, dtype=torch.int32)
    out = torch.full((edges, heads, dim), float("nan"))
    z, grad_s, attn, slopes, out = (t.to(device) for t in (z, grad_s, attn, slopes, out))
    _slopes_round_trip_kernel[(1,)](z, grad_s, attn, slopes, out, edges, heads, dim, 0.2, NUM_E=num_e,
                                    BLOCK_H=block_h, BLOCK_D=block_d, SLOPE_BITS=bits)
    expected = grad_s[:, :, None] * attn * torch.where(z > 0, 1.0, 0.2)
    assert torch.equal(out.cpu(), expected.cpu())
    assert torch.all(slopes[edges:].cpu() == -7)


@pytest.mark.parametrize("unrolled", [True, False], ids=["rank-1 unrolled", "rank-1 loop"])
def test_gpu_row_blocks_and_rank_one_projection(gen, device, monkeypatch, unrolled):
    """Row-kernel edge blocks of 8 under the interpreter (the GPU's in the forward's row kernel with edge features: no
    matrix product, the projection as K rank-1 updates, unrolled over the padded width or a loop over K,
    ``ops.GATV2_ROW_PROJECTION_UNROLLED``) and the edge-gradient pass over many programs of few positions each (its
    partials summed over programs)."""
    monkeypatch.setattr(ops, "GATV2_ROW_PROJECTION_UNROLLED", {4: unrolled, 2: unrolled})
    monkeypatch.setattr(ops, "row_max_edges", lambda inputs, kernel_pass: 8)
    monkeypatch.setattr(ops, "EDGE_TERMS_BLOCK_INTERPRETED", 16)
    monkeypatch.setattr(ops, "GATV2_EDGE_GRAD_EDGES", 32)
    graph = _graph(gen, device)
    check_op(NAME, graph, _leaves(graph, 3, 5, torch.float32, device, gen), gen, schedule=SCHEDULES["mixed"])


@pytest.mark.parametrize("frozen", [3, 4], ids=["edge_attr data", "edge_weight frozen"])
def test_edge_gradients_only_where_asked(gen, device, frozen):
    graph = _graph(gen, device)
    leaves = _leaves(graph, 2, 8, torch.float32, device, gen)
    check_op(NAME, graph, leaves, gen, schedule=SCHEDULES["mixed"], frozen=(frozen,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_accumulate_in_float32(gen, device, dtype):
    family.test_half_precision_inputs_accumulate_in_float32(gen, device, NAME, dtype)


def test_float64_gradcheck(gen, device):
    family.test_float64_gradcheck(gen, device, NAME)


def test_attention_dropout_is_regenerated_in_backward(gen, device):
    """The counter RNG's mask regenerated in the backward passes and in the edge-gradient pass (through ∂s)."""
    family.test_attention_dropout_is_regenerated_in_backward(gen, device, NAME)


@pytest.mark.parametrize("merged", [True, False, "capped"], ids=["merged inside", "merge launches", "too many pieces"])
@pytest.mark.parametrize("mixed", [True, False], ids=["one launch", "two launches"])
def test_row_launch_of_pieces_and_medium_rows(gen, device, monkeypatch, mixed, merged):
    """Super-row pieces and medium rows in one row launch or two, merged inside or by merge launches (no edge sums
    to merge: GATv2's edge gradients are the CSR-order pass's)."""
    family.test_row_launch_of_pieces_and_medium_rows(gen, device, monkeypatch, NAME, mixed, merged)


def test_every_output_and_scratch_element_is_written(gen, device, monkeypatch):
    family.test_every_output_and_scratch_element_is_written(gen, device, monkeypatch, NAME)


def test_zero_in_degree_edgeless_and_empty_graphs(gen, device):
    """Zero in-degree rows (zeros, and a duplicate edge), an edgeless graph (zero gradients, ``∂W_e`` zeros of
    ``[H·D, K]``), an empty graph."""
    family.test_zero_in_degree_single_node_and_edgeless_graphs(gen, device, NAME)
    edgeless = Graph(torch.zeros(2, 0, dtype=torch.long, device=device), 4)
    leaves = [t.requires_grad_(True) for t in _leaves(edgeless, 2, 3, torch.float32, device, gen)]
    grads = torch.autograd.grad(OPS[NAME].fused(edgeless, *leaves).sum(), leaves[3:])
    assert grads[0].shape == (0, 3) and grads[1].shape == (6, 3) and torch.all(grads[1] == 0)
    graph = Graph(torch.tensor([[0, 1, 2, 2], [1, 1, 1, 1]]).to(device), 4)  # a duplicate edge
    check_op(NAME, graph, _leaves(graph, 2, 3, torch.float32, device, gen), gen)


def test_forward_and_backward_are_bitwise_reproducible(gen, device):
    """No atomics: ∂attr and ∂W_e (per-program partials, summed in a fixed order) bit-identical between runs; a call
    without autograd gives the training call's output bit for bit."""
    family.test_forward_and_backward_are_bitwise_reproducible(gen, device, NAME)
    graph = _graph(gen, device)
    leaves = [t.requires_grad_(True) for t in _leaves(graph, 3, 5, torch.float32, device, gen)]
    trained = OPS[NAME].fused(graph, *leaves, dropout=0.3, rng=PhiloxStream(11), schedule=SCHEDULES["mixed"])
    with torch.no_grad():
        out = OPS[NAME].fused(graph, *leaves, dropout=0.3, rng=PhiloxStream(11), schedule=SCHEDULES["mixed"])
    assert torch.equal(out, trained.detach())


@pytest.mark.parametrize("schedule", ["light", "super"])
def test_attention_weights_match_reference(gen, device, schedule):
    graph = _graph(gen, device)
    leaves = _leaves(graph, 3, 5, torch.float32, device, gen)
    out, alpha = OPS[NAME].fused(graph, *leaves, schedule=SCHEDULES[schedule], return_attention=True)
    ref = reference.gatv2_reference(graph.to("cpu"), *(t.double().cpu() for t in leaves), negative_slope=0.15,
                                    weights="softmax")
    assert alpha.shape == (graph.num_edges, 3)
    assert_close(out, ref[0], tol=TOLERANCES[torch.float32], name="out")
    assert_close(alpha, ref[2], tol=TOLERANCES[torch.float32], name="attention weights")


def test_reference_path_takes_the_edge_term(gen, device):
    """``fusecore.reference`` mode: ops.gatv2 with edge features runs gnnfuse.reference's oracle."""
    graph = _graph(gen, device)
    leaves = _leaves(graph, 2, 4, torch.float32, device, gen)
    fused = OPS[NAME].fused(graph, *leaves)
    with use_reference():
        unfused = OPS[NAME].fused(graph, *leaves)
    assert_close(fused, unfused, tol=TOLERANCES[torch.float32], name="reference path")


def test_bad_edge_arguments_raise_clear_errors(gen, device):
    graph = _graph(gen, device)
    fs, fd, attn, attr, weight = _leaves(graph, 3, 5, torch.float32, device, gen)
    with pytest.raises(ValueError, match="edge_attr and edge_weight must be given together"):
        ops.gatv2(graph, fs, fd, attn, attr)
    with pytest.raises(ValueError, match="edge_attr and edge_weight must be given together"):
        ops.gatv2(graph, fs, fd, attn, edge_weight=weight)
    with pytest.raises(ValueError, match=r"edge_attr must have shape \[num_edges="):
        ops.gatv2(graph, fs, fd, attn, attr[:-1], weight)
    with pytest.raises(ValueError, match=r"edge_attr must have shape \[num_edges="):
        ops.gatv2(graph, fs, fd, attn, attr[:, :0], weight[:, :0])
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[heads \* head_dim, edge_dim\]"):
        ops.gatv2(graph, fs, fd, attn, attr, weight[:, :2])
    with pytest.raises(ValueError, match=r"edge_weight must have shape \[heads \* head_dim, edge_dim\]"):
        ops.gatv2(graph, fs, fd, attn, attr, weight.t())
    with pytest.raises(TypeError, match="edge_attr"):
        ops.gatv2(graph, fs, fd, attn, attr.long(), weight)
    with pytest.raises(TypeError, match="edge_weight"):
        ops.gatv2(graph, fs, fd, attn, attr, weight.to(torch.int32))
    if device != "cpu" and torch.device(device).type != "cpu":
        with pytest.raises(ValueError, match="edge_attr"):
            ops.gatv2(graph, fs, fd, attn, attr.cpu(), weight)


# ---------------------------------------------------------------------------------------------------------- the layer

torch_geometric = pytest.importorskip("torch_geometric")
PyG = torch_geometric.nn
from test_pyg import C, F, N, _check, _leaf, check_edge_features  # noqa: E402  (PyG's helpers, after the importorskip)


@pytest.mark.parametrize("share_weights", [False, True], ids=["lin_l lin_r", "shared"])
@pytest.mark.parametrize("fill", ["mean", "add", "max", "min", "mul", 0.5, "tensor"])
def test_layer_matches_pyg(fill, share_weights, gen, device):
    """PyG GATv2Conv's ``edge_dim`` with self loops (their rows from ``fill_value``, PyG's ``add_self_loops``):
    output, attention weights (PyG's edge order), gradients of x, edge_attr and every parameter (lin_edge too).
    Without self loops, one feature and bipartite pairs: test_pyg.py (its edge-feature tests take both layers)."""
    check_edge_features("GATv2Conv", fill, gen, device, share_weights=share_weights, residual=not share_weights)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_layer_against_pyg_in_float64(dtype, gen, device, monkeypatch):
    """The layer in ``dtype`` against PyG's in float64 on the same rounded parameters and inputs, with PyG's
    intermediates rounded to ``dtype`` where the layer stores them in ``dtype``: the node projections (forward hooks on
    ``lin_l`` / ``lin_r``) and the self loops' edge features, the ``'mean'`` of each node's incoming features
    (PyG's ``add_self_loops`` as the layer module calls it, wrapped).  Left in float64, either rounding moves
    LeakyReLU arguments across zero and the per-edge ``∂edge_attr`` by up to ~14% in any implementation (the node
    projections alone made this test fail for 6 of 80 random draws, the loop features for 3 of 150 after them;
    0 of 500 with both rounded)."""
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen).to(dtype)
    attr = torch.randn(edges.shape[1], 4, generator=gen).to(dtype)
    ours = fused.GATv2Conv(F, C, heads=2, edge_dim=4).to(dtype)
    theirs = PyG.GATv2Conv(F, C, heads=2, edge_dim=4).double()
    theirs.load_state_dict({k: v.double() for k, v in ours.state_dict().items()}, strict=True)
    for lin in (theirs.lin_l, theirs.lin_r):
        lin.register_forward_hook(lambda module, args, out: out.to(dtype).double())
    module = __import__(type(theirs).__module__, fromlist=["add_self_loops"])
    add_loops = module.add_self_loops

    def add_rounded_loops(*args, **kwargs):
        looped, looped_attr = add_loops(*args, **kwargs)
        return looped, looped_attr.to(dtype).double()  # the kept rows are dtype's values already

    monkeypatch.setattr(module, "add_self_loops", add_rounded_loops)
    ours = ours.to(device)
    xo, xt = _leaf(x, device), _leaf(x.double(), "cpu")
    ao, at = _leaf(attr, device), _leaf(attr.double(), "cpu")
    out, ref = ours(xo, edges.to(device), ao), theirs(xt, edges, at)
    tol = TOLERANCES[dtype]
    assert_close(out, ref, tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device, dtype))
    ref.backward(grad)
    assert_close(ao.grad, at.grad, tol=tol, name="grad edge_attr")
    assert_close(ours.lin_edge.weight.grad, theirs.lin_edge.weight.grad, tol=tol, name="grad lin_edge.weight")
    assert_close(xo.grad, xt.grad, tol=tol, name="grad x")


def test_state_dict_and_lazy_in_channels_with_edge_dim(gen, device):
    """PyG's parameter names and shapes with ``edge_dim`` (``lin_edge.weight [H·C, edge_dim]``, no bias; strict loads
    both ways) and a lazy ``in_channels=-1`` layer with edge features against PyG's lazy layer."""
    ours = fused.GATv2Conv(F, C, heads=3, edge_dim=2, residual=True)
    theirs = PyG.GATv2Conv(F, C, heads=3, edge_dim=2, residual=True)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
        k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(theirs.state_dict(), strict=True)
    theirs.load_state_dict(ours.state_dict(), strict=True)
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    attr = torch.randn(edges.shape[1], 2, generator=gen, dtype=torch.float64)
    lazy = fused.GATv2Conv(-1, C, heads=2, edge_dim=2, negative_slope=0.25).double().to(device)
    lazy(x.to(device), edges.to(device), attr.to(device))  # materializes
    pyg_lazy = PyG.GATv2Conv(-1, C, heads=2, edge_dim=2, negative_slope=0.25).double()
    with torch.no_grad():
        pyg_lazy(x, edges, attr)
    pyg_lazy.load_state_dict(lazy.state_dict(), strict=True)
    xo, xt = _leaf(x, device), _leaf(x, "cpu")
    ao, at = _leaf(attr, device), _leaf(attr, "cpu")
    _check(lazy, pyg_lazy, lazy(xo, edges.to(device), ao), pyg_lazy(xt, edges, at),
           [("x", xo, xt), ("edge_attr", ao, at)], gen)


def test_layer_edge_attr_errors(gen, device):
    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen).to(device)
    layer = fused.GATv2Conv(F, C, heads=2, edge_dim=3).to(device)
    # no edge_attr: no edge term (PyG's edge_update adds it only given edge_attr), as zero features give
    zeros = torch.zeros(edges.shape[1], 3, device=device)
    assert_close(layer(x, edges), layer(x, edges, zeros), tol=TOLERANCES[torch.float32],
                 name="no edge_attr")  # the kernel forms differ (light tiles with edges): rounding only
    with pytest.raises(ValueError, match="edge_attr"):
        layer(x, edges, torch.randn(edges.shape[1] + 1, 3, device=device))
    with pytest.raises(TypeError, match="edge_attr has dtype"):
        layer(x, edges, torch.randn(edges.shape[1], 3, device=device, dtype=torch.float64))
