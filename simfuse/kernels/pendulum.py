"""Pendulum-v1 dynamics in float32: Gymnasium ``PendulumEnv.step``, line for line.

State ``(θ, θ̇)``; action a torque u, clipped to [-2, 2]::

    cost = norm(θ)² + 0.1 θ̇² + 0.001 u²            norm(θ) = ((θ + π) mod 2π) − π
    θ̇'   = clip(θ̇ + (3 g / (2 l) sin θ + 3 / (m l²) u) dt, −8, 8)
    θ'   = θ + θ̇' dt                                 (m = l = 1, dt = 0.05; g = 10 by default)

The launcher passes the coefficient 3 g / (2 l) = 1.5 g (15 for Gymnasium's default g = 10,
``PendulumEnv(g=...)``).

reward = −cost, never terminates (truncated at 200 steps by the registration).
Observation ``(cos θ, sin θ, θ̇)``; start θ ~ U[−π, π), θ̇ ~ U[−1, 1).  Per env-step:
12 B of observation + 4 B reward + 2 B flags (+ 4 B action).
"""

import triton.language as tl

from fusecore.backend import jit

from .trig import sincos

PI: tl.constexpr = tl.constexpr(3.141592653589793)
TWO_PI: tl.constexpr = tl.constexpr(6.283185307179586)
INV_TWO_PI: tl.constexpr = tl.constexpr(1.0 / 6.283185307179586)


@jit
def pendulum_reset(u0, u1, u2, u3):
    """Start state from uniforms in [0, 1): θ = 2π u0 − π, θ̇ = 2 u1 − 1."""
    zero = tl.zeros_like(u0)
    return u0 * TWO_PI - PI, u1 * 2.0 - 1.0, zero, zero


@jit
def pendulum_step(th, thdot, s2, s3, action, gravity_coef):
    """One step for torque ``action`` (float) with ``gravity_coef`` = 3 g / (2 l).

    Returns (θ, θ̇, -, -, reward, terminated).
    """
    u = tl.minimum(tl.maximum(action, -2.0), 2.0)
    shifted = th + PI
    normalized = shifted - tl.floor(shifted * INV_TWO_PI) * TWO_PI - PI
    costs = normalized * normalized + 0.1 * (thdot * thdot) + 0.001 * (u * u)
    sin_th, _cos_th = sincos(th)
    newthdot = thdot + (gravity_coef * sin_th + 3.0 * u) * 0.05
    newthdot = tl.minimum(tl.maximum(newthdot, -8.0), 8.0)
    newth = th + newthdot * 0.05
    never = tl.zeros_like(th) != 0.0  # Pendulum has no terminal state
    return newth, newthdot, s2, s3, -costs, never


@jit
def pendulum_observe(th, thdot, s2, s3):
    """Observation (cos θ, sin θ, θ̇)."""
    zero = tl.zeros_like(th)
    sin_th, cos_th = sincos(th)
    return cos_th, sin_th, thdot, zero, zero, zero
