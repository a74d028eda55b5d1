"""Fused multi-step Langevin integrator: the demonstration kernel of the fusecore core.

Each element i is an independent damped, noisy oscillator, integrated for K steps by
semi-implicit Euler::

    a        = -omega² x_t - gamma v_t
    v_{t+1}  = v_t + dt a + sigma sqrt(dt) xi_{i,t}        xi ~ N(0, 1), Philox(seed, i, offset + t)
    x_{t+1}  = x_t + dt v_{t+1}
    energy_i = (1/K) Σ_t ½ (v_{t+1}² + omega² x_{t+1}²)

All K steps run in one launch with the state in registers; the step itself is a separate
``@jit`` helper (:func:`langevin_step`) and the noise comes from :mod:`fusecore.rng`, so the
kernel exercises helper calls and the counter-based RNG in both kernel modes.

Memory traffic: 8 bytes read (x, v) and 12 written (x, v, energy) per element, whatever K —
an unfused loop moves O(K) times that.
"""

import triton.language as tl

from ..backend import jit
from ..rng import normal4


@jit
def langevin_step(x, v, xi, dt, omega2, gamma, noise_scale):
    """One semi-implicit Euler step of the damped noisy oscillator; returns (x', v')."""
    accel = -omega2 * x - gamma * v
    v = v + dt * accel + noise_scale * xi
    x = x + dt * v
    return x, v


@jit
def langevin_kernel(
    x_ptr, v_ptr, x_out_ptr, v_out_ptr, energy_ptr,
    n, steps, dt, omega2, gamma, noise_scale, seed, offset,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    x = tl.load(x_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    energy = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(steps):
        xi, _, _, _ = normal4(seed, idx, offset + t)
        x, v = langevin_step(x, v, xi, dt, omega2, gamma, noise_scale)
        energy += 0.5 * (v * v + omega2 * x * x)
    tl.store(x_out_ptr + idx, x, mask=mask)
    tl.store(v_out_ptr + idx, v, mask=mask)
    tl.store(energy_ptr + idx, energy / tl.maximum(steps, 1).to(tl.float32), mask=mask)
