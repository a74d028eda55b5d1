"""The simfuse environments: Gymnasium's classic-control set and the configurable-complexity simulators."""

from .chain import OscillatorSwarmVectorEnv, PendulumChainVectorEnv
from .classic import (
    AcrobotVectorEnv,
    CartPoleVectorEnv,
    MountainCarContinuousVectorEnv,
    MountainCarVectorEnv,
    PendulumVectorEnv,
)

__all__ = [
    "AcrobotVectorEnv", "CartPoleVectorEnv", "MountainCarContinuousVectorEnv", "MountainCarVectorEnv",
    "OscillatorSwarmVectorEnv", "PendulumChainVectorEnv", "PendulumVectorEnv",
]
