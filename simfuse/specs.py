"""Static facts of each simfuse environment: sizes, spaces, limits, and the kernel id.

One :class:`EnvDef` per classic-control env, read by the vector envs (spaces, registration),
the launchers (kernel constexprs) and the reference (the same constants in PyTorch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class EnvDef:
    """What a fused classic-control environment is.

    ``num_actions`` > 0: ``Discrete(num_actions)``; 0: a one-dimensional ``Box`` action in
    ``[action_low, action_high]``.  ``obs_low`` / ``obs_high`` bound the observation Box
    exactly as Gymnasium declares it.
    """

    name: str
    kernel_id: int
    obs_dim: int
    obs_low: tuple[float, ...]
    obs_high: tuple[float, ...]
    num_actions: int
    action_low: float
    action_high: float
    max_episode_steps: int
    reward_threshold: float | None

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    def obs_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.obs_low, dtype=np.float32), np.array(self.obs_high, dtype=np.float32)


_CARTPOLE_HIGH = (4.8, math.inf, 12 * 2 * math.pi / 360 * 2, math.inf)
_ACROBOT_HIGH = (1.0, 1.0, 1.0, 1.0, 4 * math.pi, 9 * math.pi)

CARTPOLE = EnvDef("CartPole-v1", 0, 4, tuple(-h for h in _CARTPOLE_HIGH), _CARTPOLE_HIGH, 2, 0.0, 0.0, 500, 475.0)
PENDULUM = EnvDef("Pendulum-v1", 1, 3, (-1.0, -1.0, -8.0), (1.0, 1.0, 8.0), 0, -2.0, 2.0, 200, None)
MOUNTAIN_CAR = EnvDef("MountainCar-v0", 2, 2, (-1.2, -0.07), (0.6, 0.07), 3, 0.0, 0.0, 200, -110.0)
MOUNTAIN_CAR_CONTINUOUS = EnvDef(
    "MountainCarContinuous-v0", 3, 2, (-1.2, -0.07), (0.6, 0.07), 0, -1.0, 1.0, 999, 90.0
)
ACROBOT = EnvDef("Acrobot-v1", 4, 6, tuple(-h for h in _ACROBOT_HIGH), _ACROBOT_HIGH, 3, 0.0, 0.0, 500, -100.0)

ENV_DEFS: dict[str, EnvDef] = {d.name: d for d in (CARTPOLE, PENDULUM, MOUNTAIN_CAR, MOUNTAIN_CAR_CONTINUOUS, ACROBOT)}
