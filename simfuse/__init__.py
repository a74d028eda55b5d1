"""simfuse: fused multi-step GPU simulators for RL data collection, as Gymnasium vector envs.

Importing simfuse registers ``simfuse/<EnvId>`` with Gymnasium for every env, so::

    import gymnasium, simfuse
    envs = gymnasium.make_vec("simfuse/CartPole-v1", num_envs=4096,
                              vectorization_mode="vector_entry_point", device="cuda")
    envs = simfuse.make_vec("CartPole-v1", num_envs=4096)          # the same
    obs, info = envs.reset(seed=0)
    traj = envs.rollout("random", num_steps=256)                  # 256 steps, one launch
"""

from __future__ import annotations

from typing import Any

import gymnasium

import fusecore  # noqa: F401  (fixes the kernel mode before any simfuse kernel is defined)

from .envs import (
    AcrobotVectorEnv,
    CartPoleVectorEnv,
    MountainCarContinuousVectorEnv,
    MountainCarVectorEnv,
    OscillatorSwarmVectorEnv,
    PendulumChainVectorEnv,
    PendulumVectorEnv,
)
from .policy import MLPPolicy
from .vector import EpisodeStats, FusedVectorEnv, Trajectory

NAMESPACE = "simfuse"
ENV_CLASSES: dict[str, type] = {
    "CartPole-v1": CartPoleVectorEnv,
    "Pendulum-v1": PendulumVectorEnv,
    "MountainCar-v0": MountainCarVectorEnv,
    "MountainCarContinuous-v0": MountainCarContinuousVectorEnv,
    "Acrobot-v1": AcrobotVectorEnv,
    "PendulumChain-v0": PendulumChainVectorEnv,
    "OscillatorSwarm-v0": OscillatorSwarmVectorEnv,
}
# the configurable-complexity simulators: no reward threshold, 200 steps per episode
TILE_STATE_ENVS = (PendulumChainVectorEnv, OscillatorSwarmVectorEnv)


def _register() -> None:
    for name, cls in ENV_CLASSES.items():
        env_id = f"{NAMESPACE}/{name}"
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            id=env_id,
            vector_entry_point=f"{cls.__module__}:{cls.__name__}",
            max_episode_steps=200 if cls in TILE_STATE_ENVS else cls.env_def.max_episode_steps,
            reward_threshold=None if cls in TILE_STATE_ENVS else cls.env_def.reward_threshold,
        )


def make_vec(env_id: str, num_envs: int = 1, **kwargs: Any) -> FusedVectorEnv:
    """``gymnasium.make_vec("simfuse/<env_id>", num_envs, vectorization_mode="vector_entry_point", **kwargs)``.

    ``env_id`` with or without the ``simfuse/`` namespace; ``kwargs`` go to the env
    (``device``, ``autoreset_mode``, ``max_episode_steps``, ``validate``; ``num_links`` for
    PendulumChain-v0, ``num_particles`` for OscillatorSwarm-v0).
    """
    if not isinstance(env_id, str):
        raise TypeError(f"env_id must be a str such as 'CartPole-v1', got {type(env_id).__name__}")
    name = env_id.split("/", 1)[1] if env_id.startswith(f"{NAMESPACE}/") else env_id
    if name not in ENV_CLASSES:
        raise ValueError(f"unknown simfuse env {env_id!r}; available: {sorted(ENV_CLASSES)}")
    return gymnasium.make_vec(f"{NAMESPACE}/{name}", num_envs=num_envs, vectorization_mode="vector_entry_point",
                              **kwargs)


_register()

__all__ = [
    "ENV_CLASSES", "AcrobotVectorEnv", "CartPoleVectorEnv", "EpisodeStats", "FusedVectorEnv", "MLPPolicy",
    "MountainCarContinuousVectorEnv", "MountainCarVectorEnv", "OscillatorSwarmVectorEnv", "PendulumChainVectorEnv",
    "PendulumVectorEnv", "Trajectory", "make_vec",
]
