"""Compile-time dispatch to one environment's reset / step / observe functions.

Every classic-control env fits one register layout: a state of four float32 vectors
``s0..s3`` (unused slots carried as zeros), an action as one float32 vector (discrete
actions as their index), an observation of up to six float32 vectors ``o0..o5``.  ``ENV``
is a ``tl.constexpr`` id (an env's :attr:`simfuse.specs.EnvDef.kernel_id`, see
:data:`simfuse.specs.ENV_DEFS`), so each compiled kernel
contains only its own environment's arithmetic.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.rng import uniform4

from .acrobot import acrobot_observe, acrobot_reset, acrobot_step
from .cartpole import cartpole_observe, cartpole_reset, cartpole_step
from .mountain_car import (
    continuous_mountain_car_step,
    mountain_car_observe,
    mountain_car_reset,
    mountain_car_step,
)
from .pendulum import pendulum_observe, pendulum_reset, pendulum_step

CARTPOLE: tl.constexpr = tl.constexpr(0)
PENDULUM: tl.constexpr = tl.constexpr(1)
MOUNTAIN_CAR: tl.constexpr = tl.constexpr(2)
MOUNTAIN_CAR_CONTINUOUS: tl.constexpr = tl.constexpr(3)
ACROBOT: tl.constexpr = tl.constexpr(4)

# Random-number streams: env i draws its start states from stream i + RESET_TAG at the global
# step position (its policy noise from stream i + POLICY_TAG, see .draws).
RESET_TAG: tl.constexpr = tl.constexpr(1 << 32)


@jit
def env_reset(seed, env_index, position, ENV: tl.constexpr):
    """Start state of env ``env_index`` (int64 vector) from Philox (seed, RESET_TAG + i, position)."""
    u0, u1, u2, u3 = uniform4(seed, env_index + RESET_TAG, position)
    if ENV == CARTPOLE:
        s0, s1, s2, s3 = cartpole_reset(u0, u1, u2, u3)
    elif ENV == PENDULUM:
        s0, s1, s2, s3 = pendulum_reset(u0, u1, u2, u3)
    elif ENV == ACROBOT:
        s0, s1, s2, s3 = acrobot_reset(u0, u1, u2, u3)
    else:
        s0, s1, s2, s3 = mountain_car_reset(u0, u1, u2, u3)
    return s0, s1, s2, s3


@jit
def env_step(s0, s1, s2, s3, action, env_param, ENV: tl.constexpr):
    """One step of the dynamics; returns (s0, s1, s2, s3, reward, terminated).

    ``env_param``: CartPole's Sutton-Barto reward switch (0 / 1), Pendulum's 3 g / (2 l);
    unused by the other envs.
    """
    if ENV == CARTPOLE:
        s0, s1, s2, s3, reward, terminated = cartpole_step(s0, s1, s2, s3, action, env_param)
    elif ENV == PENDULUM:
        s0, s1, s2, s3, reward, terminated = pendulum_step(s0, s1, s2, s3, action, env_param)
    elif ENV == MOUNTAIN_CAR:
        s0, s1, s2, s3, reward, terminated = mountain_car_step(s0, s1, s2, s3, action)
    elif ENV == MOUNTAIN_CAR_CONTINUOUS:
        s0, s1, s2, s3, reward, terminated = continuous_mountain_car_step(s0, s1, s2, s3, action)
    else:
        s0, s1, s2, s3, reward, terminated = acrobot_step(s0, s1, s2, s3, action)
    return s0, s1, s2, s3, reward, terminated


@jit
def env_observe(s0, s1, s2, s3, ENV: tl.constexpr):
    """Observation of the state as six float32 vectors (slots past the env's obs size are zero)."""
    if ENV == CARTPOLE:
        o0, o1, o2, o3, o4, o5 = cartpole_observe(s0, s1, s2, s3)
    elif ENV == PENDULUM:
        o0, o1, o2, o3, o4, o5 = pendulum_observe(s0, s1, s2, s3)
    elif ENV == ACROBOT:
        o0, o1, o2, o3, o4, o5 = acrobot_observe(s0, s1, s2, s3)
    else:
        o0, o1, o2, o3, o4, o5 = mountain_car_observe(s0, s1, s2, s3)
    return o0, o1, o2, o3, o4, o5


@jit
def obs_tile(o0, o1, o2, o3, o4, o5, COLS: tl.constexpr):
    """Stack six [BLOCK] vectors into a [BLOCK, COLS] tile (columns >= 6 are zero)."""
    col = tl.arange(0, COLS)[None, :]
    tile = tl.where(col == 0, o0[:, None], 0.0)
    tile = tl.where(col == 1, o1[:, None], tile)
    tile = tl.where(col == 2, o2[:, None], tile)
    tile = tl.where(col == 3, o3[:, None], tile)
    tile = tl.where(col == 4, o4[:, None], tile)
    tile = tl.where(col == 5, o5[:, None], tile)
    return tile
