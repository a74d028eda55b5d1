"""fusecore.compiler: device functions that only change what the compiler may assume."""

import pytest
import torch
import triton.language as tl

from fusecore.backend import jit
from fusecore.compiler import unhoisted
from fusecore.testing import test_device


@jit
def _strided_rows(src_ptr, out_ptr, int_ptr, n, rows, BLOCK: tl.constexpr):
    # out[r, i] = src[r * n + i] for i < n, with the row stride re-derived in every trip
    idx = tl.arange(0, BLOCK)
    for r in range(rows):
        stride = unhoisted(n, int_ptr)
        tl.store(out_ptr + r * stride + idx, tl.load(src_ptr + r * stride + idx, mask=idx < n), mask=idx < n)


@pytest.mark.parametrize("n", [1, 7, 16])
def test_unhoisted_is_the_identity(n):
    device = test_device()
    src = torch.randn(3 * n, device=device)
    out = torch.full_like(src, float("nan"))
    _strided_rows[(1,)](src, out, torch.zeros(1, dtype=torch.int32, device=device), n, 3, BLOCK=16)
    assert torch.equal(out, src)
