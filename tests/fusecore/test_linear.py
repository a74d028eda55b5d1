"""fusecore.linear: column_sum against a float64 oracle at odd sizes, and linear's forward and
gradients against torch.nn.functional.linear (the same kernels of cuBLAS, the bias gradient from
column_sum)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusecore import linear as linear_module
from fusecore.linear import column_sum, linear
from fusecore.testing import assert_close, fresh_generator, poisoned, test_device

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@pytest.fixture
def device():
    return test_device()


@pytest.fixture
def poison(monkeypatch):
    """Every buffer column_sum allocates starts as NaN: an element a kernel skips shows."""
    monkeypatch.setattr(linear_module, "_new", lambda shape, dtype, device: poisoned(shape, dtype, device))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(1, 1), (2, 3), (31, 129), (97, 7), (1000, 128), (3, 300), (613, 257)])
def test_column_sum_matches_float64(device, poison, dtype, rows, cols):
    gen = fresh_generator(device)
    x = torch.randn(rows, cols, generator=gen, device=device).to(dtype)
    out = column_sum(x)
    assert out.dtype == dtype and out.shape == (cols,)
    assert_close(out, x.double().sum(0), dtype=dtype, name="column_sum")


def test_column_sum_strided_rows_out_dtype_and_empty(device, poison):
    gen = fresh_generator(device)
    base = torch.randn(90, 40, generator=gen, device=device)
    x = base[::3, 5:30]  # row stride 120, columns contiguous
    assert_close(column_sum(x), x.double().sum(0), dtype=torch.float32, tol=1e-6)
    half = base.to(torch.bfloat16)
    out = column_sum(half, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out, half.double().sum(0), tol=1e-6, name="float32 output of bfloat16 input")
    transposed = base.t()  # columns strided: copied first
    assert_close(column_sum(transposed), transposed.double().sum(0), dtype=torch.float32, tol=1e-6)
    for shape in ((0, 5), (4, 0)):
        empty = column_sum(torch.empty(shape, device=device))
        assert torch.equal(empty, torch.zeros(shape[1], device=device))


def test_column_sum_rejects_bad_input(device):
    with pytest.raises(ValueError, match="2-D"):
        column_sum(torch.ones(5, device=device))
    with pytest.raises(ValueError, match="must be one of"):
        column_sum(torch.ones(5, 3, dtype=torch.int32, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (5, 11), (2, 3, 13)])
def test_linear_matches_torch(device, dtype, shape):
    gen = fresh_generator(device)
    x = torch.randn(*shape[:-1], 24, generator=gen, device=device).to(dtype)
    x = x if len(shape) > 1 else x.reshape(24)
    weight = torch.randn(shape[-1], 24, generator=gen, device=device).to(dtype)
    bias = torch.randn(shape[-1], generator=gen, device=device).to(dtype)
    grad = torch.randn(*x.shape[:-1], shape[-1], generator=gen, device=device).to(dtype)
    ours = [t.clone().requires_grad_() for t in (x, weight, bias)]
    theirs = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out = linear(*ours)
    assert out.grad_fn is not None and "Linear" in type(out.grad_fn).__name__
    assert torch.equal(out, F.linear(*theirs))  # the same forward call
    out.backward(grad)
    F.linear(*theirs).backward(grad)
    for name, a, b in zip(("x", "weight", "bias"), ours, theirs):
        assert_close(a.grad, b.grad.double(), dtype=dtype, name=f"grad of {name}")


def test_linear_gradients_only_where_asked_and_without_autograd(device):
    gen = fresh_generator(device)
    x = torch.randn(9, 6, generator=gen, device=device)
    weight = torch.randn(4, 6, generator=gen, device=device)
    bias = torch.randn(4, generator=gen, device=device, requires_grad=True)
    linear(x, weight, bias).sum().backward()
    assert weight.grad is None and x.grad is None
    assert_close(bias.grad, torch.full((4,), 9.0, dtype=torch.float64), tol=1e-6)
    with torch.no_grad():
        out = linear(x, weight, bias)
    assert out.grad_fn is None and torch.equal(out, F.linear(x, weight, bias))
    no_bias = linear(x, weight.requires_grad_(), None)
    assert torch.equal(no_bias, F.linear(x, weight))


LINEARS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _oracle(x, weights, biases):
    return [x.double() @ w.double().t() + (0 if b is None else b.double()) for w, b in zip(weights, biases)]


@pytest.mark.parametrize("dtype", LINEARS_DTYPES)
@pytest.mark.parametrize("rows, feats, out, group", [
    (1, 16, 16, 2), (37, 24, 40, 3), (130, 72, 16, 4), (67, 8, 136, 2), (5, 13, 17, 3), (0, 32, 16, 4),
])
@pytest.mark.parametrize("bias", [True, False])
def test_linears_forward_and_gradients(device, poison, dtype, rows, feats, out, group, bias):
    """Every map's output (a column block of one product of the stacked weights) against a float64 oracle,
    and every gradient (through the blocks, autograd adding their gradients) against float64 F.linear."""
    gen = fresh_generator(device)
    x = torch.randn(rows, feats, generator=gen, device=device).to(dtype)
    weights = [(torch.randn(out, feats, generator=gen, device=device) / feats ** 0.5).to(dtype) for _ in range(group)]
    biases = [torch.randn(out, generator=gen, device=device).to(dtype) if bias else None for _ in range(group)]
    grads = [torch.randn(rows, out, generator=gen, device=device).to(dtype) for _ in range(group)]
    leaves = [t.clone().requires_grad_() for t in (x, *weights, *(b for b in biases if b is not None))]
    lx, lw, lb = leaves[0], leaves[1:1 + group], leaves[1 + group:] or [None] * group
    ys = linear_module.linears(lx, lw, lb)
    assert len(ys) == group
    for g, (y, want) in enumerate(zip(ys, _oracle(x, weights, biases))):
        assert y.dtype == dtype and y.shape == (rows, out)
        # column block g of one [rows, group · out] product
        assert y.stride(-1) == 1 and (rows < 2 or y.stride(0) == group * out) and y._base is ys[0]._base
        assert_close(y, want, dtype=dtype, name=f"output {g}")
    torch.autograd.backward(ys, grads)
    ref = [t.detach().double().requires_grad_() for t in leaves]
    rx, rw, rb = ref[0], ref[1:1 + group], ref[1 + group:] or [None] * group
    torch.autograd.backward([F.linear(rx, w, b) for w, b in zip(rw, rb)], [g.double() for g in grads])
    names = ["x"] + [f"weights[{g}]" for g in range(group)] + [f"biases[{g}]" for g in range(group)]
    for name, ours, theirs in zip(names, leaves, ref):
        assert_close(ours.grad, theirs.grad, dtype=dtype, name=f"grad of {name}")


def test_linears_partial_gradients_and_no_autograd(device, poison):
    gen = fresh_generator(device)
    x = torch.randn(45, 32, generator=gen, device=device).to(torch.bfloat16)
    weights = [torch.randn(24, 32, generator=gen, device=device).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    biases = [torch.randn(24, generator=gen, device=device).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    ys = linear_module.linears(x, weights, biases)  # x without gradient; only the second output used
    ys[1].float().square().sum().backward()
    assert x.grad is None
    assert all(torch.count_nonzero(p.grad) == 0 for p in (weights[0], weights[2], biases[0], biases[2]))
    want = 2 * (x.double() @ weights[1].double().t() + biases[1].double())
    assert_close(weights[1].grad, want.t() @ x.double(), dtype=torch.bfloat16, name="grad of weights[1]")
    with torch.no_grad():
        plain = linear_module.linears(x, weights, biases)
    assert all(y.grad_fn is None for y in plain)
    for y, want in zip(plain, _oracle(x, weights, biases)):
        assert_close(y, want, dtype=torch.bfloat16, name="no-grad output")


def test_linears_rejects_bad_input(device):
    x = torch.ones(4, 16, device=device, dtype=torch.bfloat16)
    w = torch.ones(16, 16, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one or more weights"):
        linear_module.linears(x, [])
    with pytest.raises(ValueError, match="as many biases"):
        linear_module.linears(x, [w, w], [None])
    with pytest.raises(ValueError, match=r"weights\[1\] must have shape \[out, in=16\]"):
        linear_module.linears(x, [w, torch.ones(16, 8, device=device, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match=r"biases\[0\] must have shape \[16\]"):
        linear_module.linears(x, [w, w], [torch.ones(3, device=device, dtype=torch.bfloat16), None])
    with pytest.raises(ValueError, match="x must be a tensor"):
        linear_module.linears("x", [w])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linears_stacked_and_per_map_agree(device, poison, monkeypatch, dtype):
    """The default path (one product of the stacked weights, outputs its column blocks) against one product per
    map (STACK_LINEARS off): the same outputs and gradients within the dtype's rounding; a mix of maps with
    and without a bias is never stacked."""
    gen = fresh_generator(device)
    x = torch.randn(53, 24, generator=gen, device=device).to(dtype)
    weights = [(torch.randn(40, 24, generator=gen, device=device) / 5).to(dtype) for _ in range(3)]
    biases = [torch.randn(40, generator=gen, device=device).to(dtype) for _ in range(3)]
    grads = [torch.randn(53, 40, generator=gen, device=device).to(dtype) for _ in range(3)]
    results = []
    for stack in (True, False):
        monkeypatch.setattr(linear_module, "STACK_LINEARS", stack)
        leaves = [t.clone().requires_grad_() for t in (x, *weights, *biases)]
        ys = linear_module.linears(leaves[0], leaves[1:4], leaves[4:])
        assert all((y._base is not None) == stack and y.stride(0) == (120 if stack else 40) for y in ys)
        torch.autograd.backward(ys, grads)
        results.append([*ys, *(t.grad for t in leaves)])
    for i, (a, b) in enumerate(zip(*results)):
        assert_close(a, b.double(), dtype=dtype, name=f"tensor {i}")
    monkeypatch.setattr(linear_module, "STACK_LINEARS", True)
    mixed = linear_module.linears(x, weights[:2], [biases[0], None])
    assert all(y.is_contiguous() for y in mixed)
