"""Shared pieces of the simfuse tests: Gymnasium oracles and wide start states."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import torch

import simfuse
from simfuse.specs import ENV_DEFS

ENV_NAMES = list(ENV_DEFS)
MODES = [gymnasium.vector.AutoresetMode.NEXT_STEP, gymnasium.vector.AutoresetMode.SAME_STEP,
         gymnasium.vector.AutoresetMode.DISABLED]


def gym_env(name: str, **kwargs):
    """Gymnasium's own (float64 numpy) environment, unwrapped, built with ``kwargs``: the oracle."""
    return gymnasium.make(name, **kwargs).unwrapped


def gym_step(name: str, env, state: np.ndarray, action):
    """Step Gymnasium's env from ``state`` (our [4] layout); returns (obs, reward, terminated)."""
    s = np.asarray(state, dtype=np.float64)
    if name == "CartPole-v1":
        env.state = s.copy()
        env.steps_beyond_terminated = None
        act = int(action)
    elif name == "Pendulum-v1":
        env.state = s[:2].copy()
        act = np.array([action], dtype=np.float32)
    elif name == "MountainCar-v0":
        env.state = s[:2].copy()
        act = int(action)
    elif name == "MountainCarContinuous-v0":
        env.state = s[:2].copy()
        act = np.array([action], dtype=np.float32)
    else:
        env.state = s.copy()
        act = int(action)
    obs, reward, terminated, _, _ = env.step(act)
    return np.asarray(obs, dtype=np.float64), float(reward), bool(terminated)


def wide_states(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Start states [n, 4] spread over the whole state space, so episodes end within a few steps."""
    u = rng.uniform(-1.0, 1.0, size=(n, 4))
    if name == "CartPole-v1":
        # velocities pointing outwards: most episodes terminate within a few steps
        x, theta = 2.4 * u[:, 0], 0.22 * u[:, 2]
        return np.stack([x, np.sign(x) * np.abs(u[:, 1]) * 3, theta, np.sign(theta) * np.abs(u[:, 3]) * 3], axis=1)
    if name == "Pendulum-v1":
        return np.stack([u[:, 0] * 3 * math.pi, u[:, 1] * 8.0, 0 * u[:, 2], 0 * u[:, 3]], axis=1)
    if name in ("MountainCar-v0", "MountainCarContinuous-v0"):
        # half near the goal moving right, half at the left wall moving left
        right = np.arange(n) % 2 == 0
        pos = np.where(right, 0.5 + 0.1 * u[:, 0], -1.2 + 0.05 * np.abs(u[:, 0]))
        vel = np.where(right, 1.0, -1.0) * np.abs(u[:, 1]) * 0.07
        return np.stack([np.clip(pos, -1.2, 0.6), vel, 0 * u[:, 2], 0 * u[:, 3]], axis=1)
    return u * np.array([math.pi, math.pi, 4 * math.pi, 9 * math.pi])


def random_actions(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Valid actions for n envs as a numpy batch in the action space's shape."""
    spec = ENV_DEFS[name]
    if spec.discrete:
        return rng.integers(0, spec.num_actions, size=n)
    # a little outside the Box, to exercise the dynamics' clipping
    return rng.uniform(1.2 * spec.action_low, 1.2 * spec.action_high, size=(n, 1)).astype(np.float32)


def make(name: str, num_envs: int, **kwargs):
    return simfuse.make_vec(name, num_envs=num_envs, **kwargs)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
