"""MountainCar-v0 and MountainCarContinuous-v0 dynamics in float32 (Gymnasium, line for line).

Discrete (``MountainCarEnv.step``), action a ∈ {0, 1, 2}::

    v' = clip(v + (a − 1) 0.001 − 0.0025 cos(3 x), −0.07, 0.07)
    x' = clip(x + v', −1.2, 0.6);   v' = 0 if x' = −1.2 and v' < 0
    terminated = x' ≥ 0.5 and v' ≥ 0;   reward = −1

Continuous (``Continuous_MountainCarEnv.step``), action a ∈ ℝ, force f = clip(a, −1, 1)::

    v' = clip(v + 0.0015 f − 0.0025 cos(3 x), −0.07, 0.07),  x' as above
    terminated = x' ≥ 0.45 and v' ≥ 0;   reward = 100 [terminated] − 0.1 a²  (a unclipped)

Start state: x ~ U[−0.6, −0.4), v = 0; observation = (x, v).  Per env-step: 8 B of
observation + 4 B reward + 2 B flags (+ 4 B action).
"""

import triton.language as tl

from fusecore.backend import jit

from .trig import sincos


@jit
def mountain_car_reset(u0, u1, u2, u3):
    """Start state: position 0.2 u0 − 0.6, velocity 0."""
    zero = tl.zeros_like(u0)
    return u0 * 0.2 - 0.6, zero, zero, zero


@jit
def _move(position, velocity, accel):
    velocity = tl.minimum(tl.maximum(velocity + accel, -0.07), 0.07)
    position = tl.minimum(tl.maximum(position + velocity, -1.2), 0.6)
    velocity = tl.where((position == -1.2) & (velocity < 0.0), 0.0, velocity)
    return position, velocity


@jit
def mountain_car_step(position, velocity, s2, s3, action):
    """Discrete step, action in {0, 1, 2} (float); returns (x, v, -, -, reward, terminated)."""
    _sin, cos3x = sincos(3.0 * position)
    position, velocity = _move(position, velocity, (action - 1.0) * 0.001 + cos3x * -0.0025)
    terminated = (position >= 0.5) & (velocity >= 0.0)
    reward = tl.zeros_like(position) - 1.0
    return position, velocity, s2, s3, reward, terminated


@jit
def continuous_mountain_car_step(position, velocity, s2, s3, action):
    """Continuous step, force ``action`` (float); returns (x, v, -, -, reward, terminated)."""
    force = tl.minimum(tl.maximum(action, -1.0), 1.0)
    _sin, cos3x = sincos(3.0 * position)
    position, velocity = _move(position, velocity, force * 0.0015 - 0.0025 * cos3x)
    terminated = (position >= 0.45) & (velocity >= 0.0)
    reward = tl.where(terminated, 100.0, 0.0) - action * action * 0.1
    return position, velocity, s2, s3, reward, terminated


@jit
def mountain_car_observe(position, velocity, s2, s3):
    """Observation (position, velocity)."""
    zero = tl.zeros_like(position)
    return position, velocity, zero, zero, zero, zero
