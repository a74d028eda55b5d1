"""The weight-streaming probe's kernels (tests/llmfuse/tma_probe.py) compute y = W x, under the interpreter too:
a last tile past the rows (TMA and masked loads give zeros there; its stores are masked), and tiles split evenly
and unevenly over persistent programs, more programs than tiles among them.  Outputs start as NaN."""

import pytest
import tma_probe as probe
import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from fusecore.testing import test_device


@pytest.mark.parametrize("n, k, block_n, block_k", [(40, 512, 8, 128), (37, 96, 16, 32), (1, 64, 8, 64)])
def test_one_launch_kernels_compute_w_x(n, k, block_n, block_k, gen):
    device = test_device()
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16).to(device)
    x = torch.randn(k, generator=gen).to(device)
    expected = (w.double() @ x.double()).cpu()
    grid = ((n + block_n - 1) // block_n,)
    for launch in (lambda y: probe.rows_reg[grid](w, x, y, n, k, BLOCK_N=block_n, BLOCK_K=block_k),
                   lambda y: probe.rows_tma[grid](TensorDescriptor.from_tensor(w, [block_n, block_k]), x, y, n, k,
                                                  BLOCK_N=block_n, BLOCK_K=block_k, STAGES=3)):
        y = torch.full((n,), float("nan"), device=device)
        launch(y)
        torch.testing.assert_close(y.cpu().double(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("tiles, programs", [(5, 2), (3, 4), (6, 3)])
def test_persistent_kernels_walk_every_tile_once(tiles, programs, gen):
    """Programs take tiles p, p + P, ...: more programs than tiles, uneven shares, and even ones."""
    device = test_device()
    block_n, block_k, k = 8, 128, 512
    n = tiles * block_n
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16).to(device)
    x = torch.randn(k, generator=gen).to(device)
    expected = (w.double() @ x.double()).cpu()
    desc = TensorDescriptor.from_tensor(w, [block_n, block_k])
    for launch in (lambda y: probe.persistent_reg[(programs,)](w, x, y, tiles, k, BLOCK_N=block_n, BLOCK_K=block_k,
                                                               CHUNKS=k // block_k),
                   lambda y: probe.persistent_tma[(programs,)](desc, x, y, tiles, BLOCK_N=block_n, BLOCK_K=block_k,
                                                               CHUNKS=k // block_k, STAGES=3)):
        y = torch.full((n,), float("nan"), device=device)
        launch(y)
        torch.testing.assert_close(y.cpu().double(), expected, rtol=1e-5, atol=1e-4)
