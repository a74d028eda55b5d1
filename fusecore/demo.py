"""The demonstration op of the core: K Langevin steps fused into one launch.

:func:`langevin` is the fused op (kernel in :mod:`fusecore.kernels.langevin`);
:func:`langevin_reference` the same math step by step in PyTorch, drawing the identical
Philox noise (the oracle); :func:`langevin_unfused` the per-step PyTorch loop a user would
write with ``torch.randn`` (the timing baseline: same arithmetic, its own noise).
"""

from __future__ import annotations

import math

import torch

from . import backend
from .plan import cdiv
from .rng import check_position, check_seed, normal_reference

BLOCK = 1024


def _check(x: torch.Tensor, v: torch.Tensor, steps: int, dt: float) -> None:
    for name, t in (("x", x), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {t.dtype}")
    if x.shape != v.shape:
        raise ValueError(f"x and v must have the same shape, got {tuple(x.shape)} and {tuple(v.shape)}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if not (dt > 0 and math.isfinite(dt)):
        raise ValueError(f"dt must be a positive finite float, got {dt!r}")


def langevin(
    x: torch.Tensor,
    v: torch.Tensor,
    steps: int,
    *,
    dt: float = 0.01,
    omega: float = 1.0,
    gamma: float = 0.1,
    sigma: float = 0.5,
    seed: int = 0,
    offset: int = 0,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Integrate ``steps`` noisy oscillator steps for every element in one kernel launch.

    ``x``, ``v``: float32 tensors of one shape (any), on the kernel device.  Noise for element
    ``i`` at step ``t`` is Philox ``(seed, stream=i, position=offset + t)``, so running K1 steps
    and then K2 steps with ``offset=K1`` gives exactly the result of K1 + K2 steps.
    ``out``: optional contiguous float32 tensors ``(x_K, v_K, mean_energy)`` to write into.
    Returns ``(x_K, v_K, mean_energy)``, each shaped like ``x``.
    """
    _check(x, v, steps, dt)
    check_seed(seed)
    offset = check_position("offset", offset)
    if offset + steps >= 2**63:
        raise ValueError(f"offset + steps must be < 2**63 (the kernel's int64 positions), got {offset} + {steps}")
    if backend.reference_enabled():
        return langevin_reference(x, v, steps, dt=dt, omega=omega, gamma=gamma, sigma=sigma, seed=seed, offset=offset)
    backend.check_devices(x=x, v=v, **({} if out is None else dict(zip(("out_x", "out_v", "out_energy"), out))))
    from .kernels.langevin import langevin_kernel

    xc, vc = x.contiguous(), v.contiguous()
    if out is None:
        x_out, v_out, energy = torch.empty_like(xc), torch.empty_like(xc), torch.empty_like(xc)
    else:
        x_out, v_out, energy = out
        for name, t in zip(("x", "v", "energy"), out):
            if t.shape != x.shape or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"out {name} must be a contiguous float32 tensor of shape {tuple(x.shape)}")
    n = xc.numel()
    if n:
        langevin_kernel[(cdiv(n, BLOCK),)](
            xc, vc, x_out, v_out, energy,
            n, steps, dt, omega * omega, gamma, sigma * math.sqrt(dt), seed, offset,
            BLOCK=BLOCK,
        )
    return x_out, v_out, energy


def langevin_reference(
    x: torch.Tensor,
    v: torch.Tensor,
    steps: int,
    *,
    dt: float = 0.01,
    omega: float = 1.0,
    gamma: float = 0.1,
    sigma: float = 0.5,
    seed: int = 0,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step-by-step PyTorch version with the same Philox noise (``dtype=float64`` for an oracle)."""
    _check(x, v, steps, dt)
    shape, device = x.shape, x.device
    xs = x.reshape(-1).to(dtype)
    vs = v.reshape(-1).to(dtype)
    energy = torch.zeros_like(xs)
    stream = torch.arange(xs.numel()).numpy()
    omega2, scale = omega * omega, sigma * math.sqrt(dt)
    for t in range(steps):
        xi = torch.from_numpy(normal_reference(seed, stream, offset + t)[..., 0]).to(device=device, dtype=dtype)
        accel = -omega2 * xs - gamma * vs
        vs = vs + dt * accel + scale * xi
        xs = xs + dt * vs
        energy = energy + 0.5 * (vs * vs + omega2 * xs * xs)
    energy = energy / max(steps, 1)
    return xs.reshape(shape), vs.reshape(shape), energy.reshape(shape)


def langevin_unfused(
    x: torch.Tensor, v: torch.Tensor, steps: int, *, dt: float = 0.01, omega: float = 1.0,
    gamma: float = 0.1, sigma: float = 0.5, generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a user writes without fusion: one launch sequence per step, ``torch.randn`` noise."""
    omega2, scale = omega * omega, sigma * math.sqrt(dt)
    energy = torch.zeros_like(x)
    for _ in range(steps):
        xi = torch.randn(x.shape, device=x.device, dtype=x.dtype, generator=generator)
        v = v + dt * (-omega2 * x - gamma * v) + scale * xi
        x = x + dt * v
        energy = energy + 0.5 * (v * v + omega2 * x * x)
    return x, v, energy / max(steps, 1)


def langevin_bytes(n: int) -> int:
    """Fewest bytes the fused op must move: read x, v; write x, v, energy (float32)."""
    return 20 * n
