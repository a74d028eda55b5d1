"""Acrobot-v1 dynamics in float32: Gymnasium ``AcrobotEnv.step`` ("book" equations, RK4, dt = 0.2).

State ``(θ1, θ2, θ̇1, θ̇2)``; action a ∈ {0, 1, 2} applies torque τ = a − 1 at the joint.
With m1 = m2 = 1, l1 = 1, lc1 = lc2 = 0.5, I1 = I2 = 1, g = 9.8::

    d1   = 3.5 + cos θ2                 d2 = 1.25 + 0.5 cos θ2
    φ2   = 4.9 cos(θ1 + θ2 − π/2)
    φ1   = −0.5 θ̇2² sin θ2 − θ̇2 θ̇1 sin θ2 + 14.7 cos(θ1 − π/2) + φ2
    θ̈2   = (τ + d2/d1 φ1 − 0.5 θ̇1² sin θ2 − φ2) / (1.25 − d2²/d1)
    θ̈1   = −(d2 θ̈2 + φ1) / d1

one classical RK4 step of length 0.2, then θ1, θ2 wrapped into [−π, π], θ̇1 clipped to ±4π,
θ̇2 to ±9π.  terminated = −cos θ1 − cos(θ1 + θ2) > 1; reward −1 (0 on the terminal step).
Observation (cos θ1, sin θ1, cos θ2, sin θ2, θ̇1, θ̇2); start state: four U[−0.1, 0.1).
Per env-step: 24 B of observation + 4 B reward + 2 B flags (+ 4 B action).
"""

import triton.language as tl

from fusecore.backend import jit

from .trig import sincos

PI: tl.constexpr = tl.constexpr(3.141592653589793)
TWO_PI: tl.constexpr = tl.constexpr(6.283185307179586)
HALF_PI: tl.constexpr = tl.constexpr(1.5707963267948966)
DT: tl.constexpr = tl.constexpr(0.2)


@jit
def acrobot_reset(u0, u1, u2, u3):
    """Start state: each component 0.2 u − 0.1."""
    return u0 * 0.2 - 0.1, u1 * 0.2 - 0.1, u2 * 0.2 - 0.1, u3 * 0.2 - 0.1


@jit
def _dsdt(theta1, theta2, dtheta1, dtheta2, torque):
    sin2, cos2 = sincos(theta2)
    _sin12, cos12 = sincos(theta1 + theta2 - HALF_PI)
    _sin1, cos1 = sincos(theta1 - HALF_PI)
    d1 = 3.5 + cos2
    d2 = 1.25 + 0.5 * cos2
    phi2 = 4.9 * cos12
    phi1 = -0.5 * (dtheta2 * dtheta2) * sin2 - dtheta2 * dtheta1 * sin2 + 14.7 * cos1 + phi2
    # two divisions (a reciprocal of d1 and one quotient) instead of four; RK4 calls this 4x
    inv_d1 = 1.0 / d1
    ddtheta2 = (torque + d2 * inv_d1 * phi1 - 0.5 * (dtheta1 * dtheta1) * sin2 - phi2) / (1.25 - d2 * d2 * inv_d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) * inv_d1
    return dtheta1, dtheta2, ddtheta1, ddtheta2


@jit
def _wrap(x):
    # Gymnasium's `wrap` loops while outside [-π, π]; one RK4 step moves an angle by less
    # than 3π, so two corrections each way reproduce the loop.
    x = tl.where(x > PI, x - TWO_PI, x)
    x = tl.where(x > PI, x - TWO_PI, x)
    x = tl.where(x < -PI, x + TWO_PI, x)
    x = tl.where(x < -PI, x + TWO_PI, x)
    return x


@jit
def acrobot_step(theta1, theta2, dtheta1, dtheta2, action):
    """One RK4 step for action in {0, 1, 2} (float); returns (θ1, θ2, θ̇1, θ̇2, reward, terminated)."""
    torque = action - 1.0
    h = DT / 2.0
    k1a, k1b, k1c, k1d = _dsdt(theta1, theta2, dtheta1, dtheta2, torque)
    k2a, k2b, k2c, k2d = _dsdt(theta1 + h * k1a, theta2 + h * k1b, dtheta1 + h * k1c, dtheta2 + h * k1d, torque)
    k3a, k3b, k3c, k3d = _dsdt(theta1 + h * k2a, theta2 + h * k2b, dtheta1 + h * k2c, dtheta2 + h * k2d, torque)
    k4a, k4b, k4c, k4d = _dsdt(theta1 + DT * k3a, theta2 + DT * k3b, dtheta1 + DT * k3c, dtheta2 + DT * k3d, torque)
    w = DT / 6.0
    theta1 = _wrap(theta1 + w * (k1a + 2.0 * k2a + 2.0 * k3a + k4a))
    theta2 = _wrap(theta2 + w * (k1b + 2.0 * k2b + 2.0 * k3b + k4b))
    dtheta1 = tl.minimum(tl.maximum(dtheta1 + w * (k1c + 2.0 * k2c + 2.0 * k3c + k4c), -4.0 * PI), 4.0 * PI)
    dtheta2 = tl.minimum(tl.maximum(dtheta2 + w * (k1d + 2.0 * k2d + 2.0 * k3d + k4d), -9.0 * PI), 9.0 * PI)
    _sin1, cos1 = sincos(theta1)
    _sin21, cos21 = sincos(theta2 + theta1)
    terminated = -cos1 - cos21 > 1.0
    reward = tl.where(terminated, 0.0, -1.0)
    return theta1, theta2, dtheta1, dtheta2, reward, terminated


@jit
def acrobot_observe(theta1, theta2, dtheta1, dtheta2):
    """Observation (cos θ1, sin θ1, cos θ2, sin θ2, θ̇1, θ̇2)."""
    sin1, cos1 = sincos(theta1)
    sin2, cos2 = sincos(theta2)
    return cos1, sin1, cos2, sin2, dtheta1, dtheta2
