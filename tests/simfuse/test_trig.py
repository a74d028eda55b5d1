"""simfuse.kernels.trig.sincos: the shared range reduction against float64 sin and cos."""

import math

import numpy as np
import torch
import triton.language as tl

from fusecore.backend import jit
from fusecore.testing import fresh_generator
from simfuse.kernels.trig import sincos


@jit
def sincos_kernel(x_ptr, sin_ptr, cos_ptr, n, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    sin_x, cos_x = sincos(tl.load(x_ptr + idx, mask=mask, other=0.0))
    tl.store(sin_ptr + idx, sin_x, mask=mask)
    tl.store(cos_ptr + idx, cos_x, mask=mask)


def _sincos(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    sin_x, cos_x = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    block = 1024
    sincos_kernel[(-(-x.numel() // block),)](x, sin_x, cos_x, x.numel(), BLOCK=block)
    return sin_x.double().cpu().numpy(), cos_x.double().cpu().numpy()


def test_sincos_within_two_ulp_of_float64(device):
    """Angles up to 1e5 rad (every classic-control angle lives far inside): within 2 ulp, 1e-7 absolute."""
    gen = fresh_generator()
    x = torch.cat([(torch.rand(3000, generator=gen) * 2 - 1) * 4.0, (torch.rand(997, generator=gen) * 2 - 1) * 1e5,
                   torch.tensor([0.0, -0.0, math.pi / 4, -math.pi / 2, 1e-30])]).to(device)
    sin_x, cos_x = _sincos(x)
    exact = x.double().cpu().numpy()
    for got, want in ((sin_x, np.sin(exact)), (cos_x, np.cos(exact))):
        error = np.abs(got - want)
        assert error.max() < 1e-7, error.max()
        ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
        assert (error <= 2 * ulp + 1e-30).mean() > 0.999


def test_sincos_nan_and_huge_arguments(device):
    """NaN stays NaN; arguments beyond ±6.5e6 rad are clamped there, so the result stays a unit vector."""
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -3e7, 6.5e6], device=device)
    sin_x, cos_x = _sincos(x)
    assert np.isnan(sin_x[0]) and np.isnan(cos_x[0])
    assert np.allclose(sin_x[1:] ** 2 + cos_x[1:] ** 2, 1.0, atol=1e-6)
    assert sin_x[1] == sin_x[3] == sin_x[5] and sin_x[2] == sin_x[4] == -sin_x[1]
