"""PendulumChain-v0: the configurable-complexity simulator, a chain of L coupled pendulums."""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from .. import ops
from ..specs import EnvDef
from ..vector import AUTORESET_IDS, FusedVectorEnv

MAX_LINKS = 256


class PendulumChainVectorEnv(FusedVectorEnv):
    """PendulumChain-v0: L pendulums coupled through their mean angle, driven at the first.

    The state size (2L) and the arithmetic per step grow with ``num_links``, the knob that
    reproduces Gleeson et al.'s curve of fusion speedup against a simulator's memory traffic.

    ## Action space
    ``Box(-1.0, 1.0, (1,), float32)``: a torque 2a on pendulum 0 (clipped to [-1, 1]).

    ## Observation space
    ``Box(-inf, inf, (2L,), float32)``: the angles θ_0..θ_{L-1}, then the velocities ω_0..ω_{L-1}.

    ## Dynamics
    Semi-implicit Euler with dt = 0.05: α_j = −10 sin θ_j + 2 (θ̄ − θ_j) − 0.05 ω_j + 2a [j = 0]
    with θ̄ the mean angle (see :mod:`simfuse.kernels.chain`).

    ## Reward
    −(1/L) Σ_j norm(θ_j)², norm(θ) the angle in [−π, π): keep every pendulum hanging still.

    ## Starting state
    θ_j uniform in [−0.5, 0.5), ω_j = 0.

    ## Episode end
    No termination; truncation at 200 steps.

    Args:
        num_links: L, the number of pendulums, 1 <= L <= 256 (other arguments as for every
            simfuse env).
    """

    def __init__(self, num_envs: int = 1, num_links: int = 8, max_episode_steps: int | None = 200,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 device: torch.device | str | None = None, validate: bool | None = None,
                 render_mode: str | None = None):
        if isinstance(num_links, bool) or not isinstance(num_links, (int, np.integer)) \
                or not 1 <= num_links <= MAX_LINKS:
            raise ValueError(f"num_links must be an int in [1, {MAX_LINKS}], got {num_links!r}")
        self.num_links = int(num_links)
        self.env_def = EnvDef("PendulumChain-v0", -1, 2 * self.num_links, (-math.inf,) * 2 * self.num_links,
                              (math.inf,) * 2 * self.num_links, 0, -1.0, 1.0, 200, None)
        super().__init__(num_envs, max_episode_steps, autoreset_mode, device, validate, render_mode)
        self._state = torch.zeros((self.num_envs, 2 * self.num_links), dtype=torch.float32, device=self.device)

    def get_state(self) -> torch.Tensor:
        """A copy of the state, [N, 2L] float32: angles then velocities."""
        return self._state.clone()

    def set_state(self, state: torch.Tensor | np.ndarray) -> None:
        """Overwrite the state with ``state`` [N, 2L] (angles then velocities)."""
        self._require_reset()
        if isinstance(state, np.ndarray):
            state = torch.from_numpy(np.ascontiguousarray(state))
        if not isinstance(state, torch.Tensor) or not state.dtype.is_floating_point:
            raise TypeError(f"state must be a floating-point tensor or array, got {type(state).__name__}")
        if tuple(state.shape) != tuple(self._state.shape):
            raise ValueError(f"state must have shape {tuple(self._state.shape)}, got {tuple(state.shape)}")
        self._state.copy_(state.to(device=self.device, dtype=torch.float32))

    def rollout(self, policy="random", num_steps: int | None = None, *, stats_only: bool = False,
                record_final_obs: bool = False):
        """As :meth:`FusedVectorEnv.rollout`, with ``"random"`` or given torques only (no MLP policy)."""
        if not isinstance(policy, (str, torch.Tensor, np.ndarray)):
            raise TypeError(f"PendulumChain-v0 rollouts take policy='random' or an action tensor, "
                            f"got {type(policy).__name__}")
        return super().rollout(policy, num_steps, stats_only=stats_only, record_final_obs=record_final_obs)

    def _draw_start_states(self, key: int, position: int, mask: torch.Tensor | None) -> torch.Tensor:
        return ops.chain_reset(self._state, self._steps, self._done, self._ep_return, seed=key, position=position,
                               reset_mask=mask)

    def _run_kernel(self, policy, num_steps: int, key: int, offset: int, limit: int, **writes: bool):
        return ops.chain_rollout(self._state, self._steps, self._done, self._ep_return, seed=key, offset=offset,
                                 num_steps=num_steps, autoreset=AUTORESET_IDS[self.autoreset_mode],
                                 max_episode_steps=limit, policy=policy, **writes)
