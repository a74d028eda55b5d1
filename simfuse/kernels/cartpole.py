"""CartPole-v1 dynamics in float32: Gymnasium ``CartPoleEnv.step`` (Euler integrator), line for line.

State ``(x, x_dot, theta, theta_dot)``; action 0 pushes left (force -10 N), 1 right (+10 N)::

    temp      = (F + m_p l θ̇² sin θ) / (m_c + m_p)
    θ̈         = (g sin θ − cos θ · temp) / (l (4/3 − m_p cos² θ / (m_c + m_p)))
    ẍ         = temp − m_p l θ̈ cos θ / (m_c + m_p)
    x' = x + τ ẋ,  ẋ' = ẋ + τ ẍ,  θ' = θ + τ θ̇,  θ̇' = θ̇ + τ θ̈          (τ = 0.02 s)

with g = 9.8, m_c = 1.0, m_p = 0.1, l = 0.5 (half the pole), and termination when
|x'| > 2.4 or |θ'| > 12° (0.2094 rad).  Reward +1 every step; with ``sutton_barto_reward``
(Gymnasium 1.x ``CartPoleEnv(sutton_barto_reward=True)``, as its ``CartPoleVectorEnv``
computes it) 0 every step and −1 on the terminating one.  Start state: four independent
uniforms in [-0.05, 0.05).  Per env-step the rollout moves 16 B of observation + 4 B reward
+ 2 B flags (+ 4 B action): the state itself stays in registers.
"""

import triton.language as tl

from fusecore.backend import jit

from .trig import sincos

INV_TOTAL_MASS: tl.constexpr = tl.constexpr(1.0 / 1.1)
# m_p l / (m_c + m_p) = 0.05 / 1.1 (pole mass times half-length over total mass)
POLEMASS_LENGTH_RATIO: tl.constexpr = tl.constexpr(0.05 / 1.1)
THETA_THRESHOLD: tl.constexpr = tl.constexpr(12 * 2 * 3.141592653589793 / 360)


@jit
def cartpole_reset(u0, u1, u2, u3):
    """Start state from four uniforms in [0, 1): each component ``0.1 u - 0.05``."""
    return u0 * 0.1 - 0.05, u1 * 0.1 - 0.05, u2 * 0.1 - 0.05, u3 * 0.1 - 0.05


@jit
def cartpole_step(x, x_dot, theta, theta_dot, action, sutton_barto_reward):
    """One Euler step for action in {0, 1} (float); returns (x, x_dot, theta, theta_dot, reward, terminated).

    ``sutton_barto_reward`` (float 0 or 1) selects the Sutton-Barto reward.
    """
    force = tl.where(action > 0.5, 10.0, -10.0)
    sintheta, costheta = sincos(theta)
    # Products with 1 / (m_c + m_p) instead of divisions and fused multiply-adds: one division
    # is left on the step's critical path, which bounds small batches.
    temp = tl.fma(0.05 * (theta_dot * theta_dot), sintheta, force) * INV_TOTAL_MASS
    # l (4/3 − m_p cos²θ / (m_c + m_p)) = 2/3 − (m_p l / (m_c + m_p)) cos²θ   (l = 0.5)
    denominator = tl.fma(costheta * costheta, -POLEMASS_LENGTH_RATIO, 2.0 / 3.0)
    thetaacc = tl.fma(-costheta, temp, 9.8 * sintheta) / denominator
    xacc = tl.fma(thetaacc * costheta, -POLEMASS_LENGTH_RATIO, temp)
    x_new = tl.fma(x_dot, 0.02, x)
    x_dot_new = tl.fma(xacc, 0.02, x_dot)
    theta_new = tl.fma(theta_dot, 0.02, theta)
    theta_dot_new = tl.fma(thetaacc, 0.02, theta_dot)
    terminated = (x_new < -2.4) | (x_new > 2.4) | (theta_new < -THETA_THRESHOLD) | (theta_new > THETA_THRESHOLD)
    reward = tl.where(sutton_barto_reward != 0.0, tl.where(terminated, -1.0, 0.0), 1.0)
    return x_new, x_dot_new, theta_new, theta_dot_new, reward, terminated


@jit
def cartpole_observe(x, x_dot, theta, theta_dot):
    """Observation = state: (x, x_dot, theta, theta_dot); the last two slots unused."""
    zero = tl.zeros_like(x)
    return x, x_dot, theta, theta_dot, zero, zero
