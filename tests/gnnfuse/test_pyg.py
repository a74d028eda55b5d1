"""gnnfuse.pyg — PyG's GATConv, GATv2Conv, TransformerConv and AGNNConv as drop-in fused layers — against
torch_geometric's own layers holding the same state_dict: outputs, attention weights (edge for edge, PyG's
self-looped edge order) and the gradients of the inputs, edge features and every parameter by name.

float64 on the corner-case graph (self loops, duplicate edges, a super node, isolated nodes) with a LeakyReLU
slope of 0.25 and head size 4: values float32 holds exactly, as the compiled kernels take their scalars in
float32 (gnnfuse README).  float32 and bfloat16 against PyG run in float64 on the same rounded inputs, at
fusecore.testing's tolerances; the real Cora graph in float32.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from gnn_testing import corner_case_edges, planetoid

from fusecore.testing import TOLERANCES, assert_close, rel_error
from gnnfuse import Graph
from gnnfuse import pyg as fused

torch_geometric = pytest.importorskip("torch_geometric")
PyG = torch_geometric.nn

TOL = TOLERANCES[torch.float64]
F, H, C, N = 7, 3, 4, 29


def _pair(cls_name: str, *args, gen: torch.Generator | None = None, device="cpu", **kwargs):
    """(ours on ``device``, PyG's) float64 layers built with the same arguments, PyG's holding our state_dict (a
    strict load); with ``gen`` every bias drawn nonzero first (PyG initializes the output bias to 0, which would
    hide a missing add)."""
    ours = getattr(fused, cls_name)(*args, **kwargs).double()
    theirs = getattr(PyG, cls_name)(*args, **kwargs).double()
    if gen is not None:
        with torch.no_grad():
            for name, p in ours.named_parameters():
                if name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    theirs.load_state_dict(ours.state_dict(), strict=True)
    return ours.to(device), theirs


def _check(ours, theirs, out, ref, inputs, gen, tol=TOL):
    """Outputs equal; then one backward of a random cotangent through both, every input's and every parameter's
    gradient equal (parameters matched by name)."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert_close(out, ref.to(out.dtype), tol=tol, name="output")
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    out.backward(grad.to(out.device, out.dtype))
    ref.backward(grad.to(ref.dtype))
    for label, mine, other in inputs:
        assert_close(mine.grad, other.grad.to(mine.grad.dtype), tol=tol, name=f"grad {label}")
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        other = theirs_params[name].grad
        if other is None:  # a parameter the layer does not use (TransformerConv's lin_skip without root_weight)
            assert p.grad is None, f"{name} has a gradient where PyG's has none"
            continue
        assert p.grad is not None, f"{name} got no gradient"
        if other.abs().max() < 1e-10:  # zero in exact arithmetic (the keys' bias under a softmax): rounding only
            assert p.grad.abs().max() < tol, f"grad {name}: {p.grad} where PyG's is zero"
            continue
        assert_close(p.grad, other.to(p.grad.dtype), tol=tol, name=f"grad {name}")


def _leaf(t, device):
    return t.clone().to(device).requires_grad_(True)


LAYERS = [
    ("GATConv", dict(heads=H)),
    ("GATConv", dict(heads=H, concat=False, residual=True)),
    ("GATConv", dict(heads=2, residual=True, add_self_loops=False)),
    ("GATConv", dict(heads=H, bias=False)),
    ("GATv2Conv", dict(heads=H, residual=True)),
    ("GATv2Conv", dict(heads=2, share_weights=True, concat=False)),
    ("GATv2Conv", dict(heads=H, add_self_loops=False, bias=False)),
    ("TransformerConv", dict(heads=H)),
    ("TransformerConv", dict(heads=2, concat=False, beta=True)),
    ("TransformerConv", dict(heads=H, root_weight=False)),
]


@pytest.mark.parametrize("cls_name,kwargs", LAYERS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(LAYERS)])
def test_layers_match_pyg_with_the_same_state_dict(cls_name, kwargs, gen, device):
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    slope = {} if cls_name == "TransformerConv" else {"negative_slope": 0.25}
    ours, theirs = _pair(cls_name, F, C, gen=gen, device=device, **kwargs, **slope)
    xo, xt = _leaf(x, device), _leaf(x, "cpu")
    out, (ei, alpha) = ours(xo, edges.to(device), return_attention_weights=True)
    ref, (ref_ei, ref_alpha) = theirs(xt, edges, return_attention_weights=True)
    assert torch.equal(ei.cpu(), ref_ei), "attention edge_index differs from PyG's (self-loop order)"
    assert alpha.shape == ref_alpha.shape and not alpha.requires_grad
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    _check(ours, theirs, out, ref, [("x", xo, xt)], gen)


def test_agnn_matches_pyg(gen, device):
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    for kwargs in (dict(), dict(add_self_loops=False), dict(requires_grad=False)):
        ours, theirs = _pair("AGNNConv", **kwargs, device=device)
        if kwargs.get("requires_grad", True):
            with torch.no_grad():
                ours.beta.fill_(1.5)
                theirs.beta.fill_(1.5)
        xo, xt = _leaf(x, device), _leaf(x, "cpu")
        _check(ours, theirs, ours(xo, edges.to(device)), theirs(xt, edges), [("x", xo, xt)], gen)


FILLS = ["mean", "add", "max", "min", "mul", 0.5, "tensor"]


@pytest.mark.parametrize("fill", FILLS)
def test_gat_edge_features_match_pyg(fill, gen, device):
    """PyG GATConv's ``edge_dim``: the edge term folded to one score per edge and head and formed in CSR order, the
    self loops' rows from ``fill_value`` as PyG's ``add_self_loops`` forms them (the mean / sum of the scores, a
    constant's score, or the features' max / min / product); gradients of edge_attr, lin_edge and att_edge."""
    check_edge_features("GATConv", fill, gen, device, residual=True)


def check_edge_features(cls_name: str, fill, gen, device, **kwargs) -> None:
    """Layer ``cls_name`` with 3 edge features and self loops filled per ``fill`` (a name, a float or "tensor")
    against PyG's with the same state_dict: output, attention weights and every gradient (edge_attr's too)."""
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    attr = torch.randn(edges.shape[1], 3, generator=gen, dtype=torch.float64)
    fill_value = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64) if fill == "tensor" else fill
    ours, theirs = _pair(cls_name, F, C, heads=H, negative_slope=0.25, edge_dim=3, fill_value=fill_value,
                         gen=gen, device=device, **kwargs)
    if isinstance(fill_value, torch.Tensor):
        ours.fill_value = fill_value.to(device)
    xo, xt = _leaf(x, device), _leaf(x, "cpu")
    ao, at = _leaf(attr, device), _leaf(attr, "cpu")
    out, (ei, alpha) = ours(xo, edges.to(device), ao, return_attention_weights=True)
    ref, (ref_ei, ref_alpha) = theirs(xt, edges, at, return_attention_weights=True)
    assert torch.equal(ei.cpu(), ref_ei)
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    _check(ours, theirs, out, ref, [("x", xo, xt), ("edge_attr", ao, at)], gen)


@pytest.mark.parametrize("cls_name", ["GATConv", "GATv2Conv"])
def test_gat_edge_features_without_self_loops_and_one_dim(cls_name, gen, device):
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    attr = torch.randn(edges.shape[1], generator=gen, dtype=torch.float64)
    ours, theirs = _pair(cls_name, F, C, heads=2, negative_slope=0.25, edge_dim=1, add_self_loops=False,
                         device=device)
    xo, xt = _leaf(x, device), _leaf(x, "cpu")
    ao, at = _leaf(attr, device), _leaf(attr, "cpu")
    _check(ours, theirs, ours(xo, edges.to(device), ao), theirs(xt, edges, at), [("x", xo, xt), ("edge_attr", ao, at)],
           gen)


@pytest.mark.parametrize("cls_name", ["GATConv", "GATv2Conv"])
def test_tensor_fill_values_of_every_shape_pyg_takes(cls_name, gen, device):
    """A tensor ``fill_value`` as PyG's ``add_self_loops`` reads it (2-D, a leading dim added otherwise, expanded to
    the loops' ``[N, edge_dim]`` rows): a row ``[1, edge_dim]``, ``[1, 1]``, a 0-d tensor, per-node rows ``[N,
    edge_dim]``; a shape that does not expand is refused naming fill_value."""
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    attr = torch.randn(edges.shape[1], 3, generator=gen, dtype=torch.float64)
    for fill in (torch.tensor([[0.5, -1.0, 2.0]]), torch.tensor([[0.75]]), torch.tensor(-0.5),
                 torch.randn(N, 3, generator=gen)):
        fill = fill.double()
        ours, theirs = _pair(cls_name, F, C, heads=2, negative_slope=0.25, edge_dim=3, fill_value=fill, gen=gen)
        ours.fill_value = fill.to(device)
        with torch.no_grad():
            out = ours.to(device)(x.to(device), edges.to(device), attr.to(device))
            assert_close(out, theirs(x, edges, attr), tol=TOL, name=f"fill_value of shape {list(fill.shape)}")
    ours = getattr(fused, cls_name)(F, C, edge_dim=3, fill_value=torch.ones(2, 3)).to(device)
    with pytest.raises(ValueError, match="fill_value"):
        ours(x.float().to(device), edges.to(device), attr.float().to(device))


def test_edge_attr_is_ignored_without_edge_dim_as_in_pyg(gen, device):
    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64).to(device)
    attr = torch.randn(edges.shape[1], 5, generator=gen, dtype=torch.float64).to(device)
    for cls_name in ("GATConv", "GATv2Conv", "TransformerConv"):
        layer = getattr(fused, cls_name)(F, C, heads=2).double().to(device)
        assert torch.equal(layer(x, edges, attr), layer(x, edges))


@pytest.mark.parametrize("sizes", [(23, 11), (9, 17)])
@pytest.mark.parametrize("cls_name,kwargs", [
    ("GATConv", dict(heads=H, residual=True)),
    ("GATConv", dict(heads=H, add_self_loops=False)),
    ("GATv2Conv", dict(heads=2)),
    ("TransformerConv", dict(heads=2)),
])
def test_bipartite_pairs_match_pyg(sizes, cls_name, kwargs, gen, device):
    n_src, n_dst = sizes
    src = torch.randint(0, n_src, (60,), generator=gen)
    dst = torch.randint(0, n_dst, (60,), generator=gen)
    edges = torch.stack([src, dst])
    x_src = torch.randn(n_src, F, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, F, generator=gen, dtype=torch.float64)
    slope = {} if cls_name == "TransformerConv" else {"negative_slope": 0.25}
    ours, theirs = _pair(cls_name, F, C, gen=gen, device=device, **kwargs, **slope)
    so, do_, st, dt = _leaf(x_src, device), _leaf(x_dst, device), _leaf(x_src, "cpu"), _leaf(x_dst, "cpu")
    out, (ei, alpha) = ours((so, do_), edges.to(device), return_attention_weights=True)
    ref, (ref_ei, ref_alpha) = theirs((st, dt), edges, return_attention_weights=True)
    assert torch.equal(ei.cpu(), ref_ei)
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    _check(ours, theirs, out, ref, [("x_src", so, st), ("x_dst", do_, dt)], gen)


# PyG's own 'mean' / 'add' fill indexes out of bounds when N_dst > N_src (its scatter is sized min(N_src, N_dst)
# while the destinations reach N_dst): those pairs run with a constant fill only
@pytest.mark.parametrize("cls_name", ["GATConv", "GATv2Conv"])
@pytest.mark.parametrize("sizes,fill", [((23, 11), "mean"), ((23, 11), "add"), ((23, 11), 0.5), ((9, 17), 0.5)])
def test_bipartite_edge_features_match_pyg(sizes, fill, cls_name, gen, device):
    """``edge_dim`` on a bipartite pair: loops on the first ``min(N_src, N_dst)`` nodes only, their rows from
    ``fill_value`` (GATConv: the CSR-order score kernels with loop nodes fewer than the graph's; GATv2Conv: the
    loops' feature rows, projected by the attention kernels)."""
    n_src, n_dst = sizes
    edges = torch.stack([torch.randint(0, n_src, (60,), generator=gen), torch.randint(0, n_dst, (60,), generator=gen)])
    x_src = torch.randn(n_src, F, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, F, generator=gen, dtype=torch.float64)
    attr = torch.randn(60, 3, generator=gen, dtype=torch.float64)
    ours, theirs = _pair(cls_name, F, C, heads=H, negative_slope=0.25, edge_dim=3, fill_value=fill, gen=gen,
                         device=device)
    so, do_, st, dt = _leaf(x_src, device), _leaf(x_dst, device), _leaf(x_src, "cpu"), _leaf(x_dst, "cpu")
    ao, at = _leaf(attr, device), _leaf(attr, "cpu")
    out, (ei, alpha) = ours((so, do_), edges.to(device), ao, return_attention_weights=True)
    ref, (ref_ei, ref_alpha) = theirs((st, dt), edges, at, return_attention_weights=True)
    assert torch.equal(ei.cpu(), ref_ei)
    assert_close(alpha, ref_alpha, tol=TOL, name="attention")
    _check(ours, theirs, out, ref, [("x_src", so, st), ("x_dst", do_, dt), ("edge_attr", ao, at)], gen)


def test_gat_with_source_and_destination_weights(gen, device):
    """``in_channels`` a pair: ``lin_src`` / ``lin_dst``, on a pair of different widths and on one tensor."""
    n_src, n_dst = 13, 8
    edges = torch.stack([torch.randint(0, n_src, (40,), generator=gen), torch.randint(0, n_dst, (40,), generator=gen)])
    x_src = torch.randn(n_src, 6, generator=gen, dtype=torch.float64)
    x_dst = torch.randn(n_dst, 5, generator=gen, dtype=torch.float64)
    ours, theirs = _pair("GATConv", (6, 5), C, heads=2, negative_slope=0.25, residual=True, device=device)
    so, do_, st, dt = _leaf(x_src, device), _leaf(x_dst, device), _leaf(x_src, "cpu"), _leaf(x_dst, "cpu")
    _check(ours, theirs, ours((so, do_), edges.to(device)), theirs((st, dt), edges),
           [("x_src", so, st), ("x_dst", do_, dt)], gen)
    square, theirs_square = _pair("GATConv", (F, F), C, heads=2, negative_slope=0.25, device=device)
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    xo, xt = _leaf(x, device), _leaf(x, "cpu")
    _check(square, theirs_square, square(xo, edges.to(device)), theirs_square(xt, edges), [("x", xo, xt)], gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls_name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_low_precision_against_pyg_in_float64(dtype, cls_name, gen, device):
    """The layer in ``dtype`` against PyG's in float64 on the same rounded inputs and parameters: the output at
    the dtype's tolerance; each gradient within the tolerance or within twice the error of PyG's own layer run in
    ``dtype`` (bfloat16's rounding of GATv2's LeakyReLU argument moves its gradients by a few percent in any
    implementation)."""
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, 16, generator=gen).to(dtype)
    ours = getattr(fused, cls_name)(16, 8, heads=2).to(dtype)
    theirs = getattr(PyG, cls_name)(16, 8, heads=2).double()
    theirs.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    theirs_low = copy.deepcopy(theirs).to(dtype)
    ours = ours.to(device)
    cotangent = torch.randn(N, 16, generator=gen, dtype=torch.float64)
    runs = []
    for layer, dev in ((ours, device), (theirs, "cpu"), (theirs_low, "cpu")):
        leaf = x.detach().to(dev, next(layer.parameters()).dtype).clone().requires_grad_(True)
        out = layer(leaf, edges.to(dev))
        out.backward(cotangent.to(dev, out.dtype))
        grads = {"x": leaf.grad, **{k: p.grad for k, p in layer.named_parameters() if p.grad is not None}}
        runs.append((out, grads))
    (out, grads), (ref, ref_grads), (low, low_grads) = runs
    tol = TOLERANCES[dtype]
    assert out.dtype == dtype
    assert_close(out, ref.to(out.dtype), tol=tol, name="output")
    assert set(grads) == set(ref_grads), (set(grads), set(ref_grads))
    for name, grad in grads.items():
        if name == "lin_key.bias":  # zero in exact arithmetic (softmax cancels it): rounding only
            continue
        pyg_error = rel_error(low_grads[name].double(), ref_grads[name])
        assert_close(grad.double().cpu(), ref_grads[name], tol=max(tol, 2 * pyg_error),
                     name=f"grad {name} (PyG's own {dtype} error {pyg_error:.2e})")


@pytest.mark.parametrize("cls_name,kwargs", [("GATConv", dict(heads=8)), ("GATv2Conv", dict(heads=4)),
                                             ("TransformerConv", dict(heads=4)), ("AGNNConv", None)])
def test_cora_float32_matches_pyg(cls_name, kwargs, gen, device):
    data = planetoid("cora")
    x = data.x[:, :64].contiguous()
    args = () if kwargs is None else (64, 8)
    ours = getattr(fused, cls_name)(*args, **(kwargs or {}))
    theirs = getattr(PyG, cls_name)(*args, **(kwargs or {})).double()
    theirs.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    ours = ours.to(device)
    xo, xt = _leaf(x, device), _leaf(x.double(), "cpu")
    _check(ours, theirs, ours(xo, data.edge_index.to(device)), theirs(xt, data.edge_index), [("x", xo, xt)], gen,
           tol=TOLERANCES[torch.float32])


@pytest.mark.parametrize("cls_name", ["GATConv", "GATv2Conv", "TransformerConv"])
def test_attention_dropout_weights_are_those_aggregated(cls_name, gen, device):
    """In training, the returned α is the one the output aggregated: for GATConv and GATv2Conv after dropout (as
    PyG returns), for TransformerConv before it (PyG's ``_alpha``)."""
    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64).to(device)
    extra = dict(root_weight=False) if cls_name == "TransformerConv" else {}
    layer = getattr(fused, cls_name)(F, C, heads=2, dropout=0.5, bias=False, **extra).double().to(device)
    layer.train()
    out, (ei, alpha) = layer(x, edges, return_attention_weights=True)
    values = (layer.lin if cls_name == "GATConv" else layer.lin_l if cls_name == "GATv2Conv" else layer.lin_value)(x)
    values = values.view(N, 2, C)
    manual = torch.zeros(N, 2, C, dtype=torch.float64, device=device).index_add_(
        0, ei[1], alpha.unsqueeze(-1) * values[ei[0]])
    if cls_name == "TransformerConv":
        assert_close(alpha.sum(), torch.tensor(2.0 * torch.unique(ei[1]).numel(), dtype=torch.float64,
                                               device=device), tol=TOL, name="softmax rows")
        assert not torch.allclose(out, manual.reshape(N, -1))  # dropout applied to the output, not to α
    else:
        assert_close(out, manual.reshape(N, -1), tol=TOL, name="output vs Σ α' x_j")
        assert (alpha == 0).any() and layer.training
    layer.eval()
    assert torch.equal(layer(x, edges), layer(x, edges))


def test_training_steps_match_pyg_with_the_import_swapped(gen, device):
    """A two-layer PyG model, built from either module, trained three SGD steps: the same losses."""
    data_edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 3, (N,), generator=gen)

    class Net(torch.nn.Module):
        def __init__(self, nn):
            super().__init__()
            self.conv1 = nn.GATConv(F, C, heads=2, negative_slope=0.25, edge_dim=2)
            self.conv2 = nn.TransformerConv(2 * C, 3, heads=1)

        def forward(self, x, edge_index, edge_attr):
            return self.conv2(torch.relu(self.conv1(x, edge_index, edge_attr)), edge_index)

    attr = torch.randn(data_edges.shape[1], 2, generator=gen, dtype=torch.float64)
    ours, theirs = Net(fused).double(), Net(PyG).double()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    ours = ours.to(device)
    losses = []
    for model, dev in ((ours, device), (theirs, "cpu")):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(dev), data_edges.to(dev), attr.to(dev)),
                                                     labels.to(dev))
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0] == pytest.approx(losses[1], rel=1e-9, abs=1e-12)


def test_state_dicts_are_pygs():
    for cls_name, args, kwargs in [
        ("GATConv", (F, C), dict(heads=H, edge_dim=2, residual=True)),
        ("GATConv", ((F, 5), C), dict(heads=H, concat=False)),
        ("GATv2Conv", (F, C), dict(heads=H, residual=True)),
        ("GATv2Conv", (F, C), dict(heads=H, share_weights=True, bias=False)),
        ("GATv2Conv", (F, C), dict(heads=H, edge_dim=3)),
        ("TransformerConv", (F, C), dict(heads=H, beta=True, edge_dim=3)),
        ("AGNNConv", (), dict()),
        ("AGNNConv", (), dict(requires_grad=False)),
    ]:
        ours = getattr(fused, cls_name)(*args, **kwargs)
        theirs = getattr(PyG, cls_name)(*args, **kwargs)
        assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == {
            k: tuple(v.shape) for k, v in theirs.state_dict().items()}, cls_name
        ours.load_state_dict(theirs.state_dict(), strict=True)
        assert repr(ours) == repr(theirs)


PARAMETER_ORDER_LAYERS = [
    ("GATConv", (F, C), dict(heads=2, edge_dim=3, residual=True)),
    ("GATConv", ((F, 5), C), dict(heads=2, concat=False, residual=True)),
    ("GATv2Conv", (F, C), dict(heads=2, edge_dim=3, residual=True)),
    ("GATv2Conv", (F, C), dict(heads=1, share_weights=True, concat=False)),
    ("TransformerConv", (F, C), dict(heads=2, beta=True, edge_dim=3)),
]


@pytest.mark.parametrize("cls_name,args,kwargs", PARAMETER_ORDER_LAYERS,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(PARAMETER_ORDER_LAYERS)])
def test_parameters_and_state_dict_keys_come_in_pygs_order(cls_name, args, kwargs):
    """``parameters()`` and ``state_dict()`` list PyG's names in PyG's order (an optimizer's state is by position)."""
    ours = getattr(fused, cls_name)(*args, **kwargs)
    theirs = getattr(PyG, cls_name)(*args, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_an_optimizer_checkpoint_of_pygs_layer_resumes_training(gen, device):
    """A PyG checkpoint (model and Adam state_dicts) resumes with the swapped import: the next step is PyG's."""
    edges = corner_case_edges(gen, N)
    x = torch.randn(N, F, generator=gen, dtype=torch.float64)
    ours, theirs = _pair("GATConv", F, C, heads=2, residual=True, negative_slope=0.25, gen=gen, device=device)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=0.05)
    theirs(x, edges).square().sum().backward()
    opt_theirs.step()
    ours.load_state_dict(theirs.state_dict())
    opt_ours = torch.optim.Adam(ours.parameters(), lr=0.05)
    opt_ours.load_state_dict(copy.deepcopy(opt_theirs.state_dict()))  # as saved: torch shares the state tensors
    for opt, layer, dev in ((opt_theirs, theirs, "cpu"), (opt_ours, ours, device)):
        opt.zero_grad()
        layer(x.to(dev), edges.to(dev)).square().sum().backward()
        opt.step()
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert_close(mine[name].detach(), p.detach(), tol=TOL, name=f"resumed {name}")


@pytest.mark.parametrize("cls_name", ["GATConv", "GATv2Conv"])
def test_no_destination_nodes_with_concatenated_heads(cls_name, gen, device):
    """No destination rows (an empty graph, or a pair with ``x_dst [0, F]``): PyG's empty ``[0, H·C]`` output."""
    x = torch.randn(5, F, generator=gen, dtype=torch.float64)
    empty = torch.zeros(2, 0, dtype=torch.long)
    ours, theirs = _pair(cls_name, F, C, heads=2, gen=gen, device=device)
    for inputs in (x[:0], (x, x[:0])):
        mine = inputs.to(device) if isinstance(inputs, torch.Tensor) else tuple(t.to(device) for t in inputs)
        out, (ei, alpha) = ours(mine, empty.to(device), return_attention_weights=True)
        ref, (ref_ei, ref_alpha) = theirs(inputs, empty, return_attention_weights=True)
        assert out.shape == ref.shape == (0, 2 * C)
        assert torch.equal(ei.cpu(), ref_ei) and alpha.shape == ref_alpha.shape


def test_the_self_looped_graph_is_built_once_per_edge_tensor(gen, device):
    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen).to(device)
    layer = fused.GATConv(F, C, heads=2).to(device)
    from gnnfuse.graph import as_graph

    base = as_graph(edges, N)
    layer(x, edges)
    loops = base.pyg_self_loops()
    looped, kept = loops.graph, loops.kept
    layer(x, edges)
    assert base.pyg_self_loops().graph is looped
    assert looped.num_edges == kept.numel() + N and looped.num_nodes == N
    assert not (edges[0, kept] == edges[1, kept]).any()
    # per CSR position: the input edge it came from (-1 at the loops), and where each node's loop sits
    eid = looped.csr_eid.long()
    want = torch.where(eid < kept.numel(), kept[eid.clamp(max=max(kept.numel() - 1, 0))], -1)
    assert torch.equal(loops.csr_input.long(), want)
    assert torch.equal(eid[loops.loop_pos.long()], kept.numel() + torch.arange(N, device=device))
    edges[0, 0] = (edges[0, 0] + 1) % N  # edited in place: a new graph, new loops
    assert as_graph(edges, N) is not base
    layer(x, edges)


def test_a_gnnfuse_graph_and_an_empty_graph(gen, device):
    x = torch.randn(5, F, generator=gen, dtype=torch.float64)
    empty = torch.zeros(2, 0, dtype=torch.long)
    for kwargs in (dict(), dict(add_self_loops=False)):
        ours, theirs = _pair("GATConv", F, C, heads=2, negative_slope=0.25, gen=gen, device=device, **kwargs)
        assert_close(ours(x.to(device), empty.to(device)), theirs(x, empty), tol=TOL, name="empty graph")
        graph = Graph(empty.to(device), 5)
        assert_close(ours(x.to(device), graph), theirs(x, empty), tol=TOL, name="gnnfuse.Graph")


@pytest.mark.parametrize("cls_name,in_channels,kwargs", [
    ("GATConv", -1, dict(heads=H, residual=True)),
    ("GATConv", (-1, -1), dict(heads=2, residual=True)),
    ("GATv2Conv", -1, dict(heads=2, residual=True)),
    ("GATv2Conv", (-1, -1), dict(heads=2, share_weights=True)),
    ("TransformerConv", -1, dict(heads=2, beta=True)),
    ("TransformerConv", (-1, -1), dict(heads=2)),
])
def test_lazy_in_channels_as_pyg(cls_name, in_channels, kwargs, gen, device):
    """PyG's ``in_channels=-1``: the maps take the width of the first call's features, with PyG's initialization
    (glorot for GAT's maps, torch's Linear default for the Transformer's: the weights' spread matches); PyG's lazy
    layer, called once, loads our state_dict and gives the same outputs and gradients; a lazy layer loads a
    materialized PyG state_dict before any call; a later call of another width is refused by name."""
    pair = isinstance(in_channels, tuple)
    n_src, n_dst = (13, 9) if pair else (N, N)
    widths = (6, 5) if pair and cls_name != "TransformerConv" and not kwargs.get("share_weights") else (F, F)
    edges = torch.stack([torch.randint(0, n_src, (50,), generator=gen), torch.randint(0, n_dst, (50,), generator=gen)])
    xs = torch.randn(n_src, widths[0], generator=gen, dtype=torch.float64)
    xd = torch.randn(n_dst, widths[1], generator=gen, dtype=torch.float64)
    x_ours = (_leaf(xs, device), _leaf(xd, device)) if pair else _leaf(xs, device)
    x_theirs = (_leaf(xs, "cpu"), _leaf(xd, "cpu")) if pair else _leaf(xs, "cpu")
    slope = {} if cls_name == "TransformerConv" else {"negative_slope": 0.25}
    ours = getattr(fused, cls_name)(in_channels, C, **slope, **kwargs).double().to(device)
    theirs = getattr(PyG, cls_name)(in_channels, C, **slope, **kwargs).double()
    assert repr(ours) == repr(theirs)
    ours(x_ours, edges.to(device))  # materializes
    with torch.no_grad():
        theirs(x_theirs, edges)
        for name, p in ours.named_parameters():
            if name.endswith("weight") and p.dim() == 2:  # glorot: ±sqrt(6 / (fan_in + fan_out)), else ±1/sqrt(fan_in)
                bound = math.sqrt(6.0 / sum(p.shape)) if cls_name != "TransformerConv" else 1 / math.sqrt(p.shape[1])
                assert p.abs().max() <= bound and p.std() > 0.3 * bound
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    theirs.load_state_dict(ours.state_dict(), strict=True)
    for p in ours.parameters():
        p.grad = None
    inputs = ([("x_src", x_ours[0], x_theirs[0]), ("x_dst", x_ours[1], x_theirs[1])] if pair
              else [("x", x_ours, x_theirs)])
    _check(ours, theirs, ours(x_ours, edges.to(device)), theirs(x_theirs, edges), inputs, gen)
    fresh = getattr(fused, cls_name)(in_channels, C, **slope, **kwargs).double()
    fresh.load_state_dict(theirs.state_dict(), strict=True)
    fresh = fresh.to(device)
    with torch.no_grad():
        assert_close(fresh(x_ours, edges.to(device)), theirs(x_theirs, edges), tol=TOL, name="loaded lazy layer")
    wrong = torch.randn(n_src, widths[0] + 1, dtype=torch.float64, device=device)
    with pytest.raises(ValueError, match="in_feats"):
        ours((wrong, x_ours[1]) if pair else wrong, edges.to(device))


def test_errors_are_clear(gen, device):
    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen).to(device)
    layer = fused.GATConv(F, C, heads=2).to(device)
    with pytest.raises(ValueError, match="x_dst"):  # GATConv takes (x_src, None) as PyG's (test_pyg_hetero)
        fused.GATv2Conv(F, C).to(device)((x, None), edges)
    with pytest.raises(ValueError, match="size"):
        layer(x, edges, size=(N, N + 1))
    with pytest.raises(ValueError, match="fill_value"):
        fused.GATConv(F, C, fill_value="median")
    with pytest.raises(TypeError, match="return_attention_weights"):
        layer(x, edges, return_attention_weights="yes")
    with pytest.raises(ValueError, match=r"in_feats=7|in_channels|x must have shape"):
        layer(x[:, :5], edges)
    with pytest.raises(TypeError, match="dtype"):
        layer(x.double(), edges)
    with pytest.raises(ValueError, match="node id"):
        layer(x[:10], edges)
    with_edges = fused.GATConv(F, C, heads=2, edge_dim=3).to(device)
    with pytest.raises(ValueError, match="edge_attr"):
        with_edges(x, edges, torch.randn(edges.shape[1] + 1, 3, device=device))
    with pytest.raises(ValueError, match="edge_dim"):  # PyG's asserts it (GATConv runs without: test_pyg_hetero)
        fused.TransformerConv(F, C, edge_dim=3).to(device)(x, edges)
    with pytest.raises(ValueError, match="sources <"):
        layer((x[:5], x), edges)
    with pytest.raises(ValueError, match="as a pair"):
        fused.GATConv((F, 5), C).to(device)(x, edges)
    with pytest.raises(TypeError, match="one feature tensor"):
        fused.AGNNConv()((x, x), edges)


def test_errors_name_pygs_arguments(gen, device):
    """Bad features or edge features are refused naming PyG's arguments (``x``, ``x_src``, ``x_dst``, ``edge_attr``),
    not the DGL-style layers' (``feat``, ``edge_feat``)."""
    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen).to(device)
    attr = torch.randn(edges.shape[1], 3, generator=gen).to(device)
    transformer = fused.TransformerConv(F, C, heads=2, edge_dim=3).to(device)
    with pytest.raises(ValueError, match=r"^x must have shape \[num_nodes, in_feats=7\]"):
        transformer(x[:, :5], edges, attr)
    with pytest.raises(TypeError, match="^x has dtype"):
        transformer(x.double(), edges, attr)
    with pytest.raises(ValueError, match=r"^edge_attr must have shape \[num_edges, edge_dim\]"):
        transformer(x, edges, attr[1:])
    with pytest.raises(TypeError, match="^edge_attr has dtype"):
        transformer(x, edges, attr.double())
    with pytest.raises(ValueError, match="^edge_attr must be a"):
        transformer(x, edges, attr.tolist())
    with pytest.raises(TypeError, match="^x_dst has dtype"):
        transformer((x, x.double()), edges, attr)
    with pytest.raises(ValueError, match=r"^x_dst must have shape"):
        transformer((x, x[:, :5]), edges, attr)
    with pytest.raises(ValueError, match=r"takes x as a pair \(x_src, x_dst\)"):
        fused.TransformerConv((F, 5), C).to(device)(x, edges)
    for layer in (fused.GATConv(F, C, heads=2), fused.GATv2Conv(F, C, heads=2)):
        layer = layer.to(device)
        with pytest.raises(TypeError, match="^x_src has dtype"):
            layer((x.double(), x), edges)
        with pytest.raises(TypeError, match="^x_dst has dtype"):
            layer((x, x.double()), edges)
        with pytest.raises(TypeError, match="^x_src must be a torch.Tensor"):
            layer(([0.0] * F, x), edges)


CAPTURED = {
    "GATConv": (lambda: fused.GATConv(F, C, heads=2, dropout=0.5, edge_dim=3), 3),
    "GATv2Conv": (lambda: fused.GATv2Conv(F, C, heads=2, dropout=0.5), None),
    "TransformerConv": (lambda: fused.TransformerConv(F, C, heads=2, dropout=0.5, edge_dim=3), 3),
    "AGNNConv": (lambda: fused.AGNNConv(), None),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CAPTURED))
def test_gnnfuse_capture_replays_pyg_layers(name, gen, device):
    """``gnnfuse.capture(conv, edge_index, x[, edge_attr])`` calls a PyG layer in PyG's order: each replay (training,
    attention dropout from a device stream) equals the layer as called with a host stream at the same seed and
    offset, gradients included, and the replays draw fresh masks."""
    import gnnfuse
    from fusecore import DevicePhiloxStream, PhiloxStream

    make, edge_dim = CAPTURED[name]
    edges = corner_case_edges(gen, N).to(device)
    torch.manual_seed(0)
    layer, twin = make().to(device), make().to(device)
    twin.load_state_dict(layer.state_dict())
    sample = (torch.randn(N, F, generator=gen).to(device).requires_grad_(name == "AGNNConv"),
              *(() if edge_dim is None else (torch.randn(edges.shape[1], edge_dim, generator=gen).to(device),)))
    dropout = name != "AGNNConv"
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    stream = DevicePhiloxStream(seed, device, offset=0) if dropout else None
    captured = gnnfuse.capture(layer, edges, *sample, rng=stream, warmup=2)
    outputs = []
    for _ in range(3):
        options = {"rng": PhiloxStream(seed, int(stream.state[1]))} if dropout else {}
        out = captured(*sample)
        want = twin(sample[0], edges, *sample[1:], **options)
        assert_close(out, want, tol=TOLERANCES[torch.float32], name=f"{name} replay")
        grad = torch.randn(want.shape, generator=gen).to(device)
        out.backward(grad)
        want.backward(grad)
        for (pname, p), q in zip(layer.named_parameters(), twin.parameters()):
            assert_close(p.grad, q.grad, tol=TOLERANCES[torch.float32], name=f"{name} grad {pname}")
        layer.zero_grad()
        twin.zero_grad()
        outputs.append(out.detach())
    if dropout:
        assert not torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("cls_name", ["GATConv", "GATv2Conv", "TransformerConv", "AGNNConv"])
def test_a_model_with_pyg_layers_runs_under_torch_compile(cls_name, gen, device):
    """PyG users compile their models: a model around the fused layer under ``torch.compile`` gives the eager
    model's output and gradients (the layer itself runs as called: ``fusecore.backend.eager_under_compile``).
    Inductor on the GPU; on the CPU ``aot_eager`` (dynamo and aot_autograd without code generation)."""
    import fusecore

    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen).to(device)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pre = torch.nn.Linear(F, 16)
            self.conv = fused.AGNNConv() if cls_name == "AGNNConv" else getattr(fused, cls_name)(16, 8, heads=2)
            self.post = torch.nn.Linear(16, 3)

        def forward(self, x, edge_index):
            return self.post(torch.relu(self.conv(torch.relu(self.pre(x)), edge_index)))

    torch.manual_seed(0)
    model = Net().to(device)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="inductor" if fusecore.COMPILED else "aot_eager")
    for _ in range(2):
        out, want = compiled(x, edges), eager(x, edges)
        assert_close(out, want, tol=TOLERANCES[torch.float32], name="compiled output")
        out.square().sum().backward()
        want.square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            if name == "conv.lin_key.bias":  # zero in exact arithmetic (the softmax cancels it): rounding only
                assert p.grad.abs().max() < TOLERANCES[torch.float32]
                continue
            assert_close(p.grad, q.grad, tol=TOLERANCES[torch.float32], name=f"compiled grad {name}")
        model.zero_grad()
        eager.zero_grad()
    torch._dynamo.reset()


def test_a_model_with_dgl_style_layers_runs_under_torch_compile(gen, device):
    """The same for :mod:`gnnfuse.nn`'s layers, ``layer(graph, feat)``."""
    import fusecore
    from gnnfuse.nn import GATConv as DGLGATConv
    from gnnfuse.nn import GraphTransformerConv

    edges = corner_case_edges(gen, N).to(device)
    x = torch.randn(N, F, generator=gen).to(device)
    torch.manual_seed(0)
    convs = torch.nn.ModuleList([DGLGATConv(F, 4, 2, allow_zero_in_degree=True), GraphTransformerConv(8, 4)]).to(device)
    eager = copy.deepcopy(convs)

    def run(layers, x):
        return layers[1](edges, torch.relu(layers[0](edges, x)).reshape(N, -1)).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(run, backend="inductor" if fusecore.COMPILED else "aot_eager")
    loss, want = compiled(convs, x), run(eager, x)
    assert_close(loss, want, tol=TOLERANCES[torch.float32], name="compiled loss")
    loss.backward()
    want.backward()
    for (name, p), q in zip(convs.named_parameters(), eager.parameters()):
        assert_close(p.grad, q.grad, tol=TOLERANCES[torch.float32], name=f"compiled grad {name}")
    torch._dynamo.reset()
