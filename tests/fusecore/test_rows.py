"""fusecore.rows: the row gather and scatter against torch's own ops (exact: they move values) at odd
sizes and widths, every dtype, both index dtypes, with their gradients; outputs poisoned before the kernels write."""

from __future__ import annotations

import pytest
import torch

from fusecore import rows as rows_module
from fusecore.backend import use_reference
from fusecore.rows import gather_rows, scatter_rows
from fusecore.testing import assert_all_written, fresh_generator, poisoned, test_device

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SIZES = [(1, 1, 1), (7, 3, 5), (97, 31, 8), (613, 389, 16), (50, 50, 33), (1000, 1203, 2)]  # (S, R, C)


@pytest.fixture
def device():
    return test_device()


@pytest.fixture
def poison(monkeypatch):
    """Every buffer the kernels fill whole starts as NaN (-1 for integers): a row a kernel skips shows."""
    monkeypatch.setattr(rows_module, "_new", lambda shape, dtype, device: poisoned(shape, dtype, device))


def _values(shape, dtype, gen, device):
    return torch.randn(shape, generator=gen, device=device).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sources, rows, cols", SIZES)
def test_gather_rows_equals_index_select(device, poison, dtype, sources, rows, cols):
    gen = fresh_generator(device)
    src = _values((sources, cols), dtype, gen, device)
    index = torch.randint(0, sources, (rows,), generator=gen, device=device)
    want = src.index_select(0, index)
    for index_dtype in (torch.int32, torch.int64):
        got = gather_rows(src, index.to(index_dtype), injective=False)
        assert_all_written(got, "gather_rows")
        assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sources, rows, cols", SIZES)
def test_scatter_rows_and_the_gathers_gradient(device, poison, dtype, sources, rows, cols):
    """An injective index (a permutation when it names every row, a subset otherwise): the scatter puts each row
    where the index says and zeros elsewhere, and is the injective gather's gradient."""
    gen = fresh_generator(device)
    rows = min(rows, sources)
    index = torch.randperm(sources, generator=gen, device=device)[:rows]
    src = _values((rows, cols), dtype, gen, device)
    want = torch.zeros(sources, cols, dtype=dtype, device=device).index_copy_(0, index, src)
    for index_dtype in (torch.int32, torch.int64):
        got = scatter_rows(src, index.to(index_dtype), sources)
        assert_all_written(got, "scatter_rows")
        assert torch.equal(got, want)
    table = _values((sources, cols), dtype, gen, device).requires_grad_(True)
    (grad,) = torch.autograd.grad(gather_rows(table, index.int()), table, src)
    assert torch.equal(grad, want)
    leaf = src.clone().requires_grad_(True)
    upstream = _values((sources, cols), dtype, gen, device)
    (grad,) = torch.autograd.grad(scatter_rows(leaf, index, sources), leaf, upstream)
    assert torch.equal(grad, upstream.index_select(0, index))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sources, rows, cols", SIZES)
def test_repeating_gathers_gradient_adds(device, dtype, sources, rows, cols):
    """Repeated indices (``injective=False``): the gradient sums the rows that met (compared in float64)."""
    gen = fresh_generator(device)
    index = torch.randint(0, sources, (rows,), generator=gen, device=device)
    table = _values((sources, cols), dtype, gen, device).requires_grad_(True)
    spread = _values((rows, cols), dtype, gen, device)
    (grad,) = torch.autograd.grad(gather_rows(table, index, injective=False), table, spread)
    want = torch.zeros(sources, cols, dtype=torch.float64, device=device).index_add_(0, index, spread.double())
    torch.testing.assert_close(grad.double(), want, rtol=1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-6,
                               atol=1e-2)


def test_empty_one_dimensional_strided_and_reference(device):
    gen = fresh_generator(device)
    src = _values((9, 4), torch.float32, gen, device)
    empty = torch.empty(0, dtype=torch.int64, device=device)
    assert gather_rows(src, empty).shape == (0, 4)
    for index_dtype in (torch.int32, torch.int64):  # torch's index_copy_ (the fallback) takes int64 only
        assert torch.equal(scatter_rows(src[:0], empty.to(index_dtype), 5), torch.zeros(5, 4, device=device))
    assert gather_rows(src[:, :0], torch.tensor([1, 2], device=device)).shape == (2, 0)
    index = torch.tensor([8, 0, 3, 3], device=device)
    assert torch.equal(gather_rows(src[:, 0], index), src[index, 0])  # 1-D: torch's own gather
    strided = src.t().contiguous().t()  # column-major: made row-major first
    assert torch.equal(gather_rows(strided, index, injective=False), src[index])
    with use_reference():
        assert torch.equal(gather_rows(src, index, injective=False), src[index])


def test_bad_arguments_are_refused_by_name(device):
    src = torch.zeros(4, 3, device=device)
    with pytest.raises(ValueError, match="index must be a 1-D int32 or int64"):
        gather_rows(src, torch.zeros(2, device=device))
    with pytest.raises(ValueError, match="index must be a 1-D"):
        gather_rows(src, torch.zeros(2, 1, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="src must be a 1-D or 2-D"):
        gather_rows(torch.zeros(2, 2, 2, device=device), torch.zeros(1, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="one entry per row of src"):
        scatter_rows(src, torch.zeros(3, dtype=torch.int64, device=device), 9)
    with pytest.raises(ValueError, match="at most num_rows"):
        scatter_rows(src, torch.arange(4, device=device), 3)
