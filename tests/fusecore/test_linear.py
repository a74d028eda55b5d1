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
