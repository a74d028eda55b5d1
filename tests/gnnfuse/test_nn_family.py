"""gnnfuse.nn GATv2Conv, GraphTransformerConv and AGNNConv against PyG's layers with the same weights.

PyG runs in float64 on the CPU (the oracle); the fused layers run on the kernel device in
float32.  Outputs and the gradients of the input features, edge features and every weight
are compared.
"""

import copy

import pytest
import torch
from gnn_testing import corner_case_edges, planetoid

from fusecore import use_reference
from fusecore.testing import TOLERANCES, assert_close
from gnnfuse import Graph
from gnnfuse.nn import AGNNConv, GATv2Conv, GraphTransformerConv

torch_geometric = pytest.importorskip("torch_geometric")
TOL = TOLERANCES[torch.float32]


def with_self_loops(edge_index: torch.Tensor, num_nodes: int, device) -> Graph:
    """The edge set PyG's GATv2Conv / AGNNConv use by default: self loops removed, one added per node."""
    return Graph(edge_index.to(device), num_nodes).remove_self_loops().add_self_loops()


def compare(name, out, ref, gen, pairs):
    """Output, then gradients: ``pairs`` of (label, fused tensor, PyG tensor) read after backward."""
    assert_close(out, ref, tol=TOL, name=f"{name} output")
    grad = torch.randn(out.shape, generator=gen)
    out.backward(grad.to(out.device))
    ref.backward(grad.double())
    for label, ours, theirs in pairs():
        if theirs.grad is None:  # a parameter the layer does not use (PyG keeps lin_skip without root_weight)
            assert ours.grad is None, f"{name}: {label} has a gradient but PyG's has none"
        elif label == "lin_key.bias":
            # The key bias adds q_i·b to every score of row i: softmax cancels it, its true gradient is 0.
            assert ours.grad.abs().max() < 1e-4 * out.abs().max(), f"{name}: grad lin_key.bias is not ~0"
        else:
            assert_close(ours.grad, theirs.grad, tol=TOL, name=f"{name} grad {label}")


def bias_away_from_the_kink(layer: GATv2Conv, x: torch.Tensor, edge_index: torch.Tensor, gen) -> torch.Tensor:
    """A source bias b for ``fc_src`` that keeps every pre-activation z = W_s x_j + b + W_d x_i (+ b_d)
    of the graph (self loops included) well away from LeakyReLU's kink at 0.

    A z within float32 rounding of 0 takes one slope in the kernel and the other in the float64
    oracle, and its edge's gradient then differs by (1 - slope) x its size: with ~10⁵
    pre-activations on Cora that happened in about one run in five.  Per channel, b is the
    middle of the widest gap between the values −z(b=0) within ±0.5 of a random draw, so the
    nearest pre-activation is far above float32 rounding (the gaps are ~1e-4 on Cora)."""
    with torch.no_grad():  # on the CPU, wherever the layer lives
        xd = x.double().cpu()
        src_w = layer.fc_src.weight.double().cpu()
        dst = xd @ (src_w if layer.share_weights else layer.fc_dst.weight.double().cpu()).T
        if not layer.share_weights:
            dst = dst + layer.fc_dst.bias.double().cpu()
        nodes = torch.arange(x.shape[0])
        src_i = torch.cat([edge_index[0].cpu(), nodes])
        dst_i = torch.cat([edge_index[1].cpu(), nodes])
        z0 = (xd @ src_w.T)[src_i] + dst[dst_i]  # [E + N, H·F] without the source bias
        uses = 2.0 if layer.share_weights else 1.0  # a shared projection adds its bias on both sides
        draw = torch.randn(z0.shape[1], generator=gen, dtype=torch.float64)
        bias = torch.empty_like(draw)
        for c in range(z0.shape[1]):
            kinks = torch.sort(-z0[:, c] / uses).values  # the biases that put some z on the kink
            near = kinks[(kinks > draw[c] - 0.5) & (kinks < draw[c] + 0.5)]
            bounds = torch.cat([(draw[c] - 0.5).view(1), near, (draw[c] + 0.5).view(1)])
            widest = int(torch.argmax(bounds[1:] - bounds[:-1]))
            bias[c] = (bounds[widest] + bounds[widest + 1]) / 2
    return bias.float()


def gatv2_against_pyg(layer: GATv2Conv, x: torch.Tensor, edge_index: torch.Tensor, device, gen):
    heads, out_feats = layer._num_heads, layer._out_feats
    pyg = torch_geometric.nn.GATv2Conv(
        x.shape[1], out_feats, heads=heads, negative_slope=layer.negative_slope, share_weights=layer.share_weights,
    )
    with torch.no_grad():
        pyg.lin_l.weight.copy_(layer.fc_src.weight)
        pyg.lin_l.bias.copy_(bias_away_from_the_kink(layer, x, edge_index, gen))
        layer.fc_src.bias.copy_(pyg.lin_l.bias)
        if not layer.share_weights:
            pyg.lin_r.weight.copy_(layer.fc_dst.weight)
            pyg.lin_r.bias.copy_(layer.fc_dst.bias)
        pyg.att.copy_(layer.attn)
        pyg.bias.zero_()  # DGL's GATv2Conv has no output bias: its bias lives in fc_src / fc_dst
    pyg = pyg.double()
    x_dev = x.clone().to(device).requires_grad_(True)
    out = layer(with_self_loops(edge_index, x.shape[0], device), x_dev)
    x64 = x.double().requires_grad_(True)
    ref = pyg(x64, edge_index).view(-1, heads, out_feats)

    def pairs():
        yield "x", x_dev, x64
        yield "fc_src.weight", layer.fc_src.weight, pyg.lin_l.weight
        yield "fc_src.bias", layer.fc_src.bias, pyg.lin_l.bias
        yield "attn", layer.attn, pyg.att
        if not layer.share_weights:
            yield "fc_dst.weight", layer.fc_dst.weight, pyg.lin_r.weight

    compare("GATv2Conv", out, ref, gen, pairs)


@pytest.mark.parametrize("share_weights", [False, True])
def test_gatv2conv_matches_pyg_on_corner_case_graph(gen, device, share_weights):
    layer = GATv2Conv(11, 5, 3, negative_slope=0.15, share_weights=share_weights).to(device)
    gatv2_against_pyg(layer, torch.randn(29, 11, generator=gen), corner_case_edges(gen), device, gen)


def test_gatv2conv_matches_pyg_on_cora(gen, device):
    data = planetoid("cora")
    layer = GATv2Conv(data.x.shape[1], 4, 2).to(device)
    gatv2_against_pyg(layer, data.x, data.edge_index, device, gen)


def transformer_against_pyg(x, edge_index, edge_attr, device, gen, **options):
    """A PyG TransformerConv's state_dict loaded unchanged into GraphTransformerConv, both run."""
    pyg = torch_geometric.nn.TransformerConv(x.shape[1], 4, **options)
    layer = GraphTransformerConv(x.shape[1], 4, **options)
    layer.load_state_dict(pyg.state_dict(), strict=True)
    layer = layer.to(device)
    pyg = pyg.double()
    x_dev = x.clone().to(device).requires_grad_(True)
    e_dev = None if edge_attr is None else edge_attr.clone().to(device).requires_grad_(True)
    graph = Graph(edge_index.to(device), x.shape[0])
    out = layer(graph, x_dev, e_dev)
    x64 = x.double().requires_grad_(True)
    e64 = None if edge_attr is None else edge_attr.double().requires_grad_(True)
    ref = pyg(x64, edge_index, e64)
    with torch.no_grad():  # inference: a plain root term is added in the kernel's store
        assert_close(layer(graph, x_dev, e_dev), ref, name="GraphTransformerConv output without autograd")

    def pairs():
        yield "x", x_dev, x64
        if e_dev is not None:
            yield "edge_attr", e_dev, e64
        for name, param in layer.named_parameters():
            yield name, param, pyg.get_parameter(name)

    compare(f"GraphTransformerConv {options}", out, ref, gen, pairs)


@pytest.mark.parametrize("options", [
    {"heads": 3, "edge_dim": 6},
    {"heads": 2, "concat": False, "beta": True, "edge_dim": 3},
    {"heads": 1, "root_weight": False, "bias": False},
])
def test_graph_transformer_matches_pyg_on_corner_case_graph(gen, device, options):
    edges = corner_case_edges(gen)
    edge_attr = torch.randn(edges.shape[1], options["edge_dim"], generator=gen) if "edge_dim" in options else None
    transformer_against_pyg(torch.randn(29, 7, generator=gen), edges, edge_attr, device, gen, **options)


def test_graph_transformer_matches_pyg_on_cora_with_edge_features(gen, device):
    data = planetoid("cora")
    edge_attr = torch.randn(data.edge_index.shape[1], 5, generator=gen)
    transformer_against_pyg(data.x, data.edge_index, edge_attr, device, gen, heads=2, edge_dim=5, beta=True)


@pytest.mark.parametrize("learn_beta, graph_name", [(True, "corner cases"), (False, "corner cases"), (True, "cora")])
def test_agnnconv_matches_pyg(gen, device, learn_beta, graph_name):
    if graph_name == "cora":
        data = planetoid("cora")
        edges, x = data.edge_index, data.x[:, :16]  # AGNN attends over the input itself: a narrow slice
    else:
        edges, x = corner_case_edges(gen), torch.randn(29, 6, generator=gen)
    pyg = torch_geometric.nn.AGNNConv(requires_grad=learn_beta).double()
    layer = AGNNConv(init_beta=0.7, learn_beta=learn_beta).to(device)
    with torch.no_grad():
        pyg.beta.fill_(0.7)
    x_dev = x.clone().to(device).requires_grad_(True)
    out = layer(with_self_loops(edges, x.shape[0], device), x_dev)
    x64 = x.double().requires_grad_(True)
    ref = pyg(x64, edges)

    def pairs():
        yield "x", x_dev, x64
        if learn_beta:
            yield "beta", layer.beta, pyg.beta

    compare("AGNNConv", out, ref, gen, pairs)
    assert isinstance(layer.beta, torch.nn.Parameter) == learn_beta
    assert set(layer.state_dict()) == {"beta"}


def test_state_dict_layouts_are_dgl_and_pyg():
    shapes = {k: tuple(v.shape) for k, v in GATv2Conv(10, 4, 3, residual=True).state_dict().items()}
    assert shapes == {
        "fc_src.weight": (12, 10), "fc_src.bias": (12,), "fc_dst.weight": (12, 10), "fc_dst.bias": (12,),
        "attn": (1, 3, 4), "res_fc.weight": (12, 10), "res_fc.bias": (12,),
    }
    shared = GATv2Conv(12, 4, 3, residual=True, bias=False, share_weights=True)
    assert shared.fc_dst is shared.fc_src and "res_fc.weight" not in shared.state_dict()
    pyg = torch_geometric.nn.TransformerConv(8, 5, heads=2, beta=True, edge_dim=3)
    ours = GraphTransformerConv(8, 5, heads=2, beta=True, edge_dim=3)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
        k: tuple(v.shape) for k, v in pyg.state_dict().items()
    }


def test_layers_residual_activation_dropout_and_reference_path(gen, device):
    edges = corner_case_edges(gen).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    layers = [
        GATv2Conv(6, 2, 3, residual=True, activation=torch.relu, allow_zero_in_degree=True, attn_drop=0.3),
        GraphTransformerConv(6, 3, heads=2, dropout=0.3),
        AGNNConv(allow_zero_in_degree=True),
    ]
    for layer in layers:
        layer = layer.to(device).eval()
        out = layer(edges, x)
        with use_reference():
            ref = layer(edges, x)
        assert_close(out, ref, name=f"{type(layer).__name__} vs reference path")
        if isinstance(layer, AGNNConv):
            continue
        layer.train()
        assert not torch.equal(layer(edges, x), layer(edges, x)), "attention dropout is drawn per call"


def test_bf16_layers(gen, device):
    edges = corner_case_edges(gen).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    edge_feat = torch.randn(edges.shape[1], 2, generator=gen).to(device)
    for layer, args in ((GATv2Conv(6, 4, 2, allow_zero_in_degree=True), ()),
                        (GraphTransformerConv(6, 4, heads=2, edge_dim=2), (edge_feat,))):
        layer = layer.to(device)
        ref = layer(edges, x, *args)
        out = layer.to(torch.bfloat16)(edges, x.bfloat16(), *(a.bfloat16() for a in args))
        assert out.dtype == torch.bfloat16
        assert_close(out, ref, tol=TOLERANCES[torch.bfloat16], name=type(layer).__name__)


def test_bf16_layers_with_stacked_projections(gen, device, monkeypatch):
    """GATv2's two and the Transformer's four projections as one product (fusecore.linear.linears), read by
    the attention in place and their gradients stored into one buffer (gnnfuse.ops._packed_columns).  Output
    against the float32 layer; output and every gradient against the same bfloat16 layer with one product per
    projection (fusecore.linear.STACK_LINEARS off; bfloat16's own rounding puts GATv2's ∂fc_dst 5-7% from
    float32's either way)."""
    from fusecore import linear as linear_module
    from gnnfuse import ops

    packed = []
    gradient = ops._packed_gradient
    monkeypatch.setattr(ops, "_packed_gradient",
                        lambda base, packing: packed.append(packing) or gradient(base, packing))
    edges = corner_case_edges(gen).to(device)
    x = torch.randn(29, 16, generator=gen).to(device)
    tol = TOLERANCES[torch.bfloat16]
    layers = ((GATv2Conv(16, 8, 2, allow_zero_in_degree=True), 2), (GraphTransformerConv(16, 8, heads=2), 4))
    for layer, group in layers:
        layer = layer.to(device)
        name = type(layer).__name__
        grad = torch.randn(29, 16, generator=gen).to(device).bfloat16()
        runs = []
        for stacked in (True, False):
            monkeypatch.setattr(linear_module, "STACK_LINEARS", stacked)
            packed.clear()
            low = copy.deepcopy(layer).to(torch.bfloat16)
            low_x = x.bfloat16().requires_grad_()
            out = low(edges, low_x)
            out.backward(grad.view(out.shape))
            assert len(packed) == stacked and (not stacked or sum(o is not None for o in packed[0][2]) == group), (
                f"{name}: {packed}")
            runs.append((out, low_x.grad, dict(low.named_parameters())))
        assert_close(runs[0][0], layer(edges, x), tol=tol, name=f"{name} vs float32")
        assert torch.equal(runs[0][0], runs[1][0]), f"{name}: the blocks read in place give the same output"
        assert_close(runs[0][1], runs[1][1], tol=tol, name=f"{name} grad of feat")
        for key, param in runs[0][2].items():
            if key != "lin_key.bias":  # softmax cancels it: its gradient is ~0 in both
                assert_close(param.grad, runs[1][2][key].grad, tol=tol, name=f"{name} grad of {key}")


def test_layer_errors_are_clear(gen, device):
    edges = corner_case_edges(gen).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    for layer in (GATv2Conv(6, 4, 2), AGNNConv()):
        with pytest.raises(ValueError, match="0-in-degree"):
            layer.to(device)(edges, x)
    with pytest.raises(ValueError, match="in_feats=6"):
        GATv2Conv(6, 4, 2, allow_zero_in_degree=True).to(device)(edges, x[:, :5])
    transformer = GraphTransformerConv(6, 4, edge_dim=2).to(device)
    with pytest.raises(ValueError, match="edge_feat must be a"):
        transformer(edges, x)
    with pytest.raises(ValueError, match=r"edge_feat must have shape \[num_edges, edge_dim\]"):
        transformer(edges, x, torch.ones(3, 2, device=device))
    with pytest.raises(ValueError, match="no edge_dim"):
        GraphTransformerConv(6, 4).to(device)(edges, x, torch.ones(edges.shape[1], 2, device=device))
    with pytest.raises(ValueError, match="heads"):
        GraphTransformerConv(6, 4, heads=0)
    with pytest.raises(ValueError, match="dropout"):
        GraphTransformerConv(6, 4, dropout=1.0)
    with pytest.raises(ValueError, match="init_beta"):
        AGNNConv(init_beta="one")
    with pytest.raises(ValueError, match="negative_slope must be a finite float"):
        GATv2Conv(6, 4, 2, negative_slope="x")
    with pytest.raises(TypeError, match="activation must be callable"):
        GATv2Conv(6, 4, 2, activation=3)
    with pytest.raises(TypeError, match="feat has dtype int64; expected one of"):
        GraphTransformerConv(6, 4).to(device)(edges, x.long())


def test_every_layer_takes_graph_edge_index_and_pyg_data(gen, device):
    from torch_geometric.data import Data

    edges = corner_case_edges(gen).to(device)
    x = torch.randn(29, 6, generator=gen).to(device)
    edge_feat = torch.randn(edges.shape[1], 2, generator=gen).to(device)
    for layer, extra in ((GATv2Conv(6, 3, 2, allow_zero_in_degree=True), ()),
                         (GraphTransformerConv(6, 3, heads=2, edge_dim=2), (edge_feat,)),
                         (AGNNConv(allow_zero_in_degree=True), ())):
        layer = layer.to(device)
        expected = layer(Graph(edges, 29), x, *extra)
        assert torch.equal(layer(edges, x, *extra), expected)
        assert torch.equal(layer(Data(edge_index=edges, num_nodes=29), x, *extra), expected)
