"""Bipartite layer calls — ``(feat_src, feat_dst)`` pairs and DGL blocks, the inputs of sampled mini-batch
training — against PyG's layers with the same weights, in float64, output, attention weights and every gradient.

Sources and destinations are two node sets (edge ``j -> i`` from source ``j < N_src`` to destination ``i < N_dst``);
the layers run the fused ops over ``max(N_src, N_dst)`` node ids with both sides padded and keep the destinations'
rows.  float64 with a LeakyReLU slope of 0.25 and head size 4 (scale 1/2): values float32 holds exactly, as the
compiled kernels take their scalars in float32 (gnnfuse README).
"""

from __future__ import annotations

import pytest
import torch

from fusecore.testing import TOLERANCES, assert_close
from gnnfuse import Graph
from gnnfuse.nn import GATConv, GATv2Conv, GraphTransformerConv

TOL = TOLERANCES[torch.float64]
F, H, C = 7, 3, 4


def bipartite_edges(gen: torch.Generator, n_src: int, n_dst: int, num_edges: int = 70) -> torch.Tensor:
    """Random edges with every destination reached (DGL's zero-in-degree check) and a heavy destination 0."""
    src = torch.randint(0, n_src, (num_edges,), generator=gen)
    dst = torch.randint(0, n_dst, (num_edges,), generator=gen)
    dst[:n_dst] = torch.arange(n_dst)
    dst[n_dst: n_dst + num_edges // 4] = 0
    return torch.stack([src, dst])


class FakeBlock:
    """What the layers read of a DGL block (DGL is never imported): its edges in its own id spaces and the
    sizes of its two node sets."""

    is_block = True

    def __init__(self, edges: torch.Tensor, n_src: int, n_dst: int):
        self._edges, self._n_src, self._n_dst = edges, n_src, n_dst

    def edges(self):
        return self._edges[0], self._edges[1]

    def num_src_nodes(self) -> int:
        return self._n_src

    def num_dst_nodes(self) -> int:
        return self._n_dst

    def num_nodes(self) -> int:
        return self._n_src + self._n_dst


def compare(out, ref, pairs, gen):
    assert_close(out, ref, tol=TOL, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(out.device).view(out.shape))
    ref.backward(grad)
    for label, ours, theirs in pairs:
        assert_close(ours.grad, theirs.grad, tol=TOL, name=f"grad {label}")


def _inputs(gen, device, n_src, n_dst):
    edges = bipartite_edges(gen, n_src, n_dst)
    x_src = torch.randn(n_src, F, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, F, generator=gen, dtype=torch.float64)
    ours = [t.clone().to(device).requires_grad_(True) for t in (x_src, x_dst)]
    theirs = [t.clone().requires_grad_(True) for t in (x_src, x_dst)]
    return edges, ours, theirs


@pytest.mark.parametrize("sizes", [(23, 11), (9, 17)])
def test_gatconv_pair_matches_pygs(sizes, gen, device):
    torch_geometric = pytest.importorskip("torch_geometric")
    edges, ours, theirs = _inputs(gen, device, *sizes)
    layer = GATConv(F, C, H, negative_slope=0.25, residual=True).double().to(device)
    pyg = torch_geometric.nn.GATConv(F, C, heads=H, negative_slope=0.25, add_self_loops=False,
                                     residual=True).double()
    with torch.no_grad():
        pyg.lin.weight.copy_(layer.fc.weight)
        pyg.att_src.copy_(layer.attn_l)
        pyg.att_dst.copy_(layer.attn_r)
        pyg.res.weight.copy_(layer.res_fc.weight)
        layer.res_fc.bias.copy_(torch.randn(H * C, generator=gen, dtype=torch.float64))
        pyg.bias.copy_(layer.res_fc.bias)  # DGL's linear residual carries the bias
    out, attention = layer(edges.to(device), tuple(ours), get_attention=True)
    ref, (_, ref_attention) = pyg(tuple(theirs), edges, return_attention_weights=True)
    assert out.shape == (sizes[1], H, C) and attention.shape == (edges.shape[1], H, 1)
    assert_close(attention.squeeze(-1), ref_attention, tol=TOL, name="attention")
    compare(out.reshape(sizes[1], -1), ref, [("x_src", ours[0], theirs[0]), ("x_dst", ours[1], theirs[1]),
                                              ("fc.weight", layer.fc.weight, pyg.lin.weight),
                                              ("attn_l", layer.attn_l, pyg.att_src),
                                              ("attn_r", layer.attn_r, pyg.att_dst)], gen)


@pytest.mark.parametrize("sizes", [(23, 11), (9, 17)])
def test_gatv2conv_pair_matches_pygs(sizes, gen, device):
    torch_geometric = pytest.importorskip("torch_geometric")
    edges, ours, theirs = _inputs(gen, device, *sizes)
    layer = GATv2Conv(F, C, H, negative_slope=0.25).double().to(device)
    pyg = torch_geometric.nn.GATv2Conv(F, C, heads=H, negative_slope=0.25, add_self_loops=False).double()
    with torch.no_grad():
        pyg.lin_l.weight.copy_(layer.fc_src.weight)
        layer.fc_src.bias.copy_(torch.randn(H * C, generator=gen, dtype=torch.float64))
        pyg.lin_l.bias.copy_(layer.fc_src.bias)
        pyg.lin_r.weight.copy_(layer.fc_dst.weight)
        pyg.lin_r.bias.copy_(layer.fc_dst.bias)
        pyg.att.copy_(layer.attn)
        pyg.bias.zero_()
    out = layer(edges.to(device), tuple(ours))
    ref = pyg(tuple(theirs), edges)
    compare(out.reshape(sizes[1], -1), ref, [("x_src", ours[0], theirs[0]), ("x_dst", ours[1], theirs[1]),
                                              ("fc_src.weight", layer.fc_src.weight, pyg.lin_l.weight),
                                              ("fc_dst.weight", layer.fc_dst.weight, pyg.lin_r.weight),
                                              ("attn", layer.attn, pyg.att)], gen)


@pytest.mark.parametrize("options", [{"heads": 3, "edge_dim": 3}, {"heads": 2, "concat": False, "beta": True},
                                     {"heads": 1, "root_weight": False, "edge_dim": 2}])
def test_graph_transformer_pair_matches_pygs(options, gen, device):
    torch_geometric = pytest.importorskip("torch_geometric")
    edges, ours, theirs = _inputs(gen, device, 19, 13)
    pyg = torch_geometric.nn.TransformerConv(F, C, **options).double()
    layer = GraphTransformerConv(F, C, **options).double()
    layer.load_state_dict(pyg.state_dict(), strict=True)
    layer = layer.to(device)
    attr = (torch.randn(edges.shape[1], options["edge_dim"], generator=gen, dtype=torch.float64)
            if "edge_dim" in options else None)
    out, (index, alpha) = layer(edges.to(device), tuple(ours), None if attr is None else attr.to(device),
                                return_attention_weights=True)
    ref, (_, ref_alpha) = pyg(tuple(theirs), edges, attr, return_attention_weights=True)
    assert torch.equal(index.cpu(), edges)
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    pairs = [("x_src", ours[0], theirs[0]), ("x_dst", ours[1], theirs[1])]
    pairs += [(name, p, pyg.get_parameter(name)) for name, p in layer.named_parameters() if p.grad is not None
              or pyg.get_parameter(name).grad is not None]
    assert_close(out, ref, tol=TOL, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(device))
    ref.backward(grad)
    for label, mine, other in pairs:
        if other.grad is None:
            assert mine.grad is None, f"{label} has a gradient but PyG's has none"
        elif label == "lin_key.bias":  # cancelled by the softmax: ~0 on both sides
            assert mine.grad.abs().max() < 1e-9 * out.abs().max()
        else:
            assert_close(mine.grad, other.grad, tol=TOL, name=f"grad {label}")


def test_dgl_block_takes_its_first_sources_as_destinations(gen, device):
    """A DGL block with one feature tensor: DGL's GATConv uses ``feat[:num_dst_nodes()]`` as the destinations';
    the result equals the explicit pair's, and the block's ``num_nodes()`` (both sets) is not the node count."""
    n_src, n_dst = 21, 8
    edges = bipartite_edges(gen, n_src, n_dst)
    x = torch.randn(n_src, F, generator=gen, dtype=torch.float64).to(device)
    layer = GATConv(F, C, H, negative_slope=0.25).double().to(device)
    block = FakeBlock(edges.to(device), n_src, n_dst)
    out = layer(block, x)
    assert out.shape == (n_dst, H, C)
    assert torch.equal(out, layer(edges.to(device), (x, x[:n_dst])))
    assert torch.equal(out, layer(block, (x, x[:n_dst])))
    v2 = GATv2Conv(F, C, H, negative_slope=0.25).double().to(device)
    assert torch.equal(v2(block, x), v2(Graph(edges.to(device), n_src), (x, x[:n_dst])))


def test_bipartite_errors_are_clear(gen, device):
    n_src, n_dst = 12, 5
    edges = bipartite_edges(gen, n_src, n_dst, 30).to(device)
    x_src, x_dst = torch.randn(n_src, F, device=device), torch.randn(n_dst, F, device=device)
    layer = GATConv(F, C, H).to(device)
    with pytest.raises(ValueError, match="destinations < 4"):
        layer(edges, (x_src, x_dst[:4]))  # edges into destination 4, which feat_dst lacks
    with pytest.raises(ValueError, match="3 source and 5 destination nodes"):
        layer(FakeBlock(edges, 3, n_dst), (x_src, x_dst))
    with pytest.raises(TypeError, match="feat_dst of type list"):
        layer(edges, (x_src, [1.0]))
    with pytest.raises(ValueError, match="in_feats=7"):
        layer(edges, (x_src, torch.randn(n_dst, F + 1, device=device)))
    lonely = torch.cat([edges, torch.tensor([[0], [n_dst]], device=device)], dim=1)  # destination 5 of 6
    with pytest.raises(ValueError, match="0-in-degree"):
        layer(lonely[:, :-1], (x_src, torch.randn(n_dst + 1, F, device=device)))
    allowed = GATConv(F, C, H, allow_zero_in_degree=True).to(device)
    out = allowed(lonely[:, :-1], (x_src, torch.randn(n_dst + 1, F, device=device)))
    assert out.shape == (n_dst + 1, H, C) and torch.equal(out[n_dst], torch.zeros_like(out[n_dst]))


@pytest.mark.parametrize("heads", [None, 2])
def test_agnnconv_pair_matches_dgls_formula(heads, gen, device):
    """DGL's bipartite AGNNConv (PyG's takes no pair): ``α_ij = softmax_j β cos(h_dst_i, h_src_j)`` and
    ``out_i = Σ_j α_ij h_src_j``, the oracle written here in float64 and differentiated by autograd."""
    from gnnfuse.nn import AGNNConv

    n_src, n_dst = 16, 9
    edges = bipartite_edges(gen, n_src, n_dst)
    feature = (heads, C) if heads else (C,)
    x_src = torch.randn(n_src, *feature, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, *feature, generator=gen, dtype=torch.float64)
    layer = AGNNConv(init_beta=1.5).double().to(device)
    ours = [t.clone().to(device).requires_grad_(True) for t in (x_src, x_dst)]
    out = layer(edges.to(device), tuple(ours))
    beta = torch.tensor([1.5], dtype=torch.float64, requires_grad=True)
    theirs = [t.clone().requires_grad_(True) for t in (x_src, x_dst)]
    hs, hd = (t.reshape(t.shape[0], -1, C) for t in theirs)
    src, dst = edges
    cos = (hs[src] * hd[dst]).sum(-1) / (hs[src].norm(dim=-1) * hd[dst].norm(dim=-1))
    scores = beta * cos
    row_max = torch.full((n_dst, scores.shape[1]), -torch.inf, dtype=torch.float64).scatter_reduce(
        0, dst[:, None].expand_as(scores), scores.detach(), "amax")
    exp = torch.exp(scores - row_max[dst])
    alpha = exp / torch.zeros(n_dst, scores.shape[1], dtype=torch.float64).index_add(0, dst, exp)[dst]
    ref = torch.zeros(n_dst, *hs.shape[1:], dtype=torch.float64).index_add(0, dst, alpha[:, :, None] * hs[src])
    ref = ref.reshape(n_dst, *feature)
    compare(out, ref, [("x_src", ours[0], theirs[0]), ("x_dst", ours[1], theirs[1]), ("beta", layer.beta, beta)],
            gen)


def test_a_block_given_one_tensor_drops_features_once(gen, device):
    """DGL drops a block's features once and takes the destinations' as the first rows of the result (one mask
    for both sides); a pair is two tensors, each dropped on its own."""
    n_src, n_dst = 14, 6
    edges = bipartite_edges(gen, n_src, n_dst, 40).to(device)
    x = torch.randn(n_src, F, generator=gen, dtype=torch.float64).to(device)
    for layer in (GATConv(F, C, H, feat_drop=0.5), GATv2Conv(F, C, H, feat_drop=0.5)):
        layer = layer.double().to(device)
        calls = []

        def recording(t, calls=calls):
            calls.append(t.shape[0])
            return t * 2.0

        layer.feat_drop.forward = recording
        layer(FakeBlock(edges, n_src, n_dst), x)
        assert calls == [n_src]
        calls.clear()
        layer(edges, (x, x[:n_dst]))
        assert calls == [n_src, n_dst]


def test_a_graph_of_the_wrong_size_is_named(gen, device):
    n_src, n_dst = 10, 4
    edges = bipartite_edges(gen, n_src, n_dst, 20).to(device)
    layer = GATConv(F, C, H).to(device)
    with pytest.raises(ValueError, match=r"must span max\(N_src, N_dst\) = 10 node ids"):
        layer(Graph(edges, 12), (torch.randn(n_src, F, device=device), torch.randn(n_dst, F, device=device)))
