"""Gymnasium's classic-control environments as fused vector envs (float32 state on the device).

Each class docstring is the environment's specification, as in Gymnasium; the dynamics are
in :mod:`simfuse.kernels` (one file per env) and match ``gymnasium/envs/classic_control``
equation for equation.  Common to all: ``reset(seed=s)`` draws env i's start state from
Philox (s, i) (the distribution is Gymnasium's, the draws are not numpy's); truncation at
``max_episode_steps`` (by default the env's own, the registration's value) is computed in the kernel; autoreset modes
NEXT_STEP, SAME_STEP and DISABLED.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .. import specs
from ..vector import FusedVectorEnv


class CartPoleVectorEnv(FusedVectorEnv):
    """CartPole-v1: balance a pole on a cart (Barto, Sutton & Anderson 1983).

    ## Action space
    ``Discrete(2)``: 0 pushes the cart left, 1 right, with a force of 10 N.

    ## Observation space
    ``Box([-4.8, -inf, -0.418, -inf], [4.8, inf, 0.418, inf], (4,), float32)``: cart position,
    cart velocity, pole angle (rad), pole angular velocity.

    ## Dynamics
    Euler integration with τ = 0.02 s, g = 9.8, cart mass 1.0, pole mass 0.1, half-length 0.5
    (see :mod:`simfuse.kernels.cartpole`).

    ## Reward
    +1 for every step, including the terminating one.  With ``sutton_barto_reward=True``
    (as Gymnasium 1.x's ``CartPoleEnv(sutton_barto_reward=True)``): 0 for every step and −1
    for the terminating one.

    ## Starting state
    All four components uniform in [-0.05, 0.05).

    ## Episode end
    Termination: |pole angle| > 12° (0.2095 rad) or |cart position| > 2.4.
    Truncation: 500 steps (``max_episode_steps``, the default; as the registration).  Reward threshold 475.

    ## Arguments
    ``sutton_barto_reward`` (bool, default False), then those of every simfuse env
    (:class:`~simfuse.vector.FusedVectorEnv`).
    """

    env_def = specs.CARTPOLE

    def __init__(self, num_envs: int = 1, *args: Any, sutton_barto_reward: bool = False, **kwargs: Any):
        if not isinstance(sutton_barto_reward, bool):
            raise TypeError(f"sutton_barto_reward must be a bool, got {type(sutton_barto_reward).__name__}")
        super().__init__(num_envs, *args, **kwargs)
        self.env_param = sutton_barto_reward


class PendulumVectorEnv(FusedVectorEnv):
    """Pendulum-v1: swing a pendulum up and keep it upright.

    ## Action space
    ``Box(-2.0, 2.0, (1,), float32)``: the torque; values outside are clipped by the dynamics.

    ## Observation space
    ``Box([-1, -1, -8], [1, 1, 8], (3,), float32)``: cos θ, sin θ, angular velocity θ̇.

    ## Dynamics
    θ̇' = clip(θ̇ + (3 g / (2 l) sin θ + 3 / (m l²) u) dt, -8, 8), θ' = θ + θ̇' dt with g = 10
    (the ``g`` argument), m = l = 1, dt = 0.05 (see :mod:`simfuse.kernels.pendulum`).

    ## Reward
    −(norm(θ)² + 0.1 θ̇² + 0.001 u²), norm(θ) the angle in [−π, π); in [−16.27, 0].

    ## Starting state
    θ uniform in [−π, π), θ̇ uniform in [−1, 1).

    ## Episode end
    No termination; truncation at 200 steps.

    ## Arguments
    ``g`` (float, default 10.0): the acceleration of gravity, as Gymnasium's
    ``PendulumEnv(g=...)``; then those of every simfuse env (:class:`~simfuse.vector.FusedVectorEnv`).
    """

    env_def = specs.PENDULUM

    def __init__(self, num_envs: int = 1, *args: Any, g: float = 10.0, **kwargs: Any):
        if isinstance(g, bool) or not isinstance(g, numbers.Real):
            raise TypeError(f"g must be a real number, got {type(g).__name__}")
        if not math.isfinite(g):
            raise ValueError(f"g must be a finite number, got {g!r}")
        super().__init__(num_envs, *args, **kwargs)
        self.env_param = float(g)


class MountainCarVectorEnv(FusedVectorEnv):
    """MountainCar-v0: drive an under-powered car up the right hill (Moore 1990).

    ## Action space
    ``Discrete(3)``: 0 accelerate left, 1 do not accelerate, 2 accelerate right.

    ## Observation space
    ``Box([-1.2, -0.07], [0.6, 0.07], (2,), float32)``: position, velocity.

    ## Dynamics
    v' = clip(v + (a − 1) 0.001 − 0.0025 cos(3x), −0.07, 0.07), x' = clip(x + v', −1.2, 0.6);
    the velocity is zeroed when the car hits the left wall (see :mod:`simfuse.kernels.mountain_car`).

    ## Reward
    −1 every step.

    ## Starting state
    Position uniform in [−0.6, −0.4), velocity 0.

    ## Episode end
    Termination: position ≥ 0.5 (and velocity ≥ 0).  Truncation: 200 steps.  Threshold −110.
    """

    env_def = specs.MOUNTAIN_CAR


class MountainCarContinuousVectorEnv(FusedVectorEnv):
    """MountainCarContinuous-v0: the mountain car with a continuous force.

    ## Action space
    ``Box(-1.0, 1.0, (1,), float32)``: the force, clipped to [−1, 1] by the dynamics.

    ## Observation space
    ``Box([-1.2, -0.07], [0.6, 0.07], (2,), float32)``: position, velocity.

    ## Dynamics
    v' = clip(v + 0.0015 f − 0.0025 cos(3x), −0.07, 0.07), x' = clip(x + v', −1.2, 0.6), the
    velocity zeroed at the left wall (see :mod:`simfuse.kernels.mountain_car`).

    ## Reward
    −0.1 a² per step (a the unclipped action), +100 on reaching the goal.

    ## Starting state
    Position uniform in [−0.6, −0.4), velocity 0.

    ## Episode end
    Termination: position ≥ 0.45 and velocity ≥ 0.  Truncation: 999 steps.  Threshold 90.
    """

    env_def = specs.MOUNTAIN_CAR_CONTINUOUS


class AcrobotVectorEnv(FusedVectorEnv):
    """Acrobot-v1: swing the tip of a two-link chain above a height (Sutton 1996).

    ## Action space
    ``Discrete(3)``: torque −1, 0 or +1 on the joint between the links.

    ## Observation space
    ``Box([-1, -1, -1, -1, -4π, -9π], [1, 1, 1, 1, 4π, 9π], (6,), float32)``: cos θ1, sin θ1,
    cos θ2, sin θ2, θ̇1, θ̇2.

    ## Dynamics
    The "book" equations of motion, one RK4 step of 0.2 s, angles wrapped into [−π, π],
    velocities clipped (see :mod:`simfuse.kernels.acrobot`).

    ## Reward
    −1 every step that does not terminate, 0 on the terminating step.

    ## Starting state
    θ1, θ2, θ̇1, θ̇2 uniform in [−0.1, 0.1).

    ## Episode end
    Termination: −cos θ1 − cos(θ1 + θ2) > 1.  Truncation: 500 steps.  Threshold −100.
    """

    env_def = specs.ACROBOT
