"""The simfuse environments: Gymnasium's classic-control set and the coupled-pendulum chain."""

from .chain import PendulumChainVectorEnv
from .classic import (
    AcrobotVectorEnv,
    CartPoleVectorEnv,
    MountainCarContinuousVectorEnv,
    MountainCarVectorEnv,
    PendulumVectorEnv,
)

__all__ = [
    "AcrobotVectorEnv", "CartPoleVectorEnv", "MountainCarContinuousVectorEnv", "MountainCarVectorEnv",
    "PendulumChainVectorEnv", "PendulumVectorEnv",
]
