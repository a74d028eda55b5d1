"""The configurable-complexity simulators, state [N, 2L] held as tiles: PendulumChain-v0 and OscillatorSwarm-v0."""

from __future__ import annotations

import math

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from .. import ops
from ..specs import EnvDef
from ..vector import AUTORESET_IDS, FusedVectorEnv

MAX_LINKS = 256


class TileStateVectorEnv(FusedVectorEnv):
    """Envs whose state is 2L float32 per env (L set by the caller), stepped by :mod:`simfuse.kernels.chain`.

    Subclasses name the ``model`` (the kernel's MODEL constexpr), the env id and the noun of L
    (``size_name``, the constructor argument that sets it).  L ≤ 256: the kernel keeps each
    env's 2L values in registers, and larger tiles would spill.
    """

    model: int
    env_id: str
    size_name: str

    def __init__(self, num_envs: int, size: int, max_episode_steps: int | None, autoreset_mode: AutoresetMode | str,
                 device: torch.device | str | None, validate: bool | None, render_mode: str | None):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= MAX_LINKS:
            raise ValueError(f"{self.size_name} must be an int in [1, {MAX_LINKS}] (the state is held in registers), "
                             f"got {size!r}")
        self.size = int(size)
        self.env_def = EnvDef(self.env_id, -1, 2 * self.size, (-math.inf,) * 2 * self.size,
                              (math.inf,) * 2 * self.size, 0, -1.0, 1.0, 200, None)
        # the tile kernels' offsets L · N and row · N are int32 products: refused before anything is allocated
        if isinstance(num_envs, (int, np.integer)) and not isinstance(num_envs, bool) \
                and 2 * self.size * int(num_envs) >= 2**31:
            raise ValueError(f"{self.env_id}: {int(num_envs)} envs of {2 * self.size} state values each exceed the "
                             f"kernels' 32-bit offsets (at most 2**31 - 1 values in all): use fewer envs or a "
                             f"smaller {self.size_name}")
        super().__init__(num_envs, max_episode_steps, autoreset_mode, device, validate, render_mode)
        # [2L, N]: each link's values env-contiguous, as the kernel's tiles load them
        self._state = torch.zeros((2 * self.size, self.num_envs), dtype=torch.float32, device=self.device)

    def get_state(self) -> torch.Tensor:
        """A copy of the state, [N, 2L] float32: positions (angles) then velocities."""
        return self._state.T.clone()

    def set_state(self, state: torch.Tensor | np.ndarray) -> None:
        """Overwrite the state with ``state`` [N, 2L] (positions or angles, then velocities)."""
        self._require_reset()
        if isinstance(state, np.ndarray):
            state = torch.from_numpy(np.ascontiguousarray(state))
        if not isinstance(state, torch.Tensor) or not state.dtype.is_floating_point:
            raise TypeError(f"state must be a floating-point tensor or array, got {type(state).__name__}")
        if tuple(state.shape) != (self.num_envs, 2 * self.size):
            raise ValueError(f"state must have shape {(self.num_envs, 2 * self.size)}, got {tuple(state.shape)}")
        self._state.copy_(state.T.to(device=self.device, dtype=torch.float32))

    def rollout(self, policy="random", num_steps: int | None = None, *, stats_only: bool = False,
                record_final_obs: bool = False):
        """As :meth:`FusedVectorEnv.rollout`, with ``"random"`` or given actions only (no MLP policy)."""
        if not isinstance(policy, (str, torch.Tensor, np.ndarray)):
            raise TypeError(f"{self.env_id} rollouts take policy='random' or an action tensor, "
                            f"got {type(policy).__name__}")
        return super().rollout(policy, num_steps, stats_only=stats_only, record_final_obs=record_final_obs)

    def _draw_start_states(self, key: int, restart: bool, mask: torch.Tensor | None) -> torch.Tensor:
        return ops.chain_reset(self._state, self._steps, self._done, self._ep_return, self._episode, seed=key,
                               restart=restart, reset_mask=mask)

    def _run_kernel(self, policy, num_steps: int, key: int, offset: int, limit: int, **writes: bool):
        return ops.chain_rollout(self._state, self._steps, self._done, self._ep_return, self._episode, seed=key,
                                 offset=offset,
                                 num_steps=num_steps, autoreset=AUTORESET_IDS[self.autoreset_mode],
                                 max_episode_steps=limit, policy=policy, model=self.model, **writes)


class PendulumChainVectorEnv(TileStateVectorEnv):
    """PendulumChain-v0: L pendulums coupled through their mean angle, driven at the first.

    The state size (2L) and the arithmetic per step grow with ``num_links``.  Each link costs
    a sine and a floor per step, so the fused kernel is compute-bound: its fusion speedup
    falls as L grows (the contrast to :class:`OscillatorSwarmVectorEnv` in the benchmark).

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

    model = 0
    env_id = "PendulumChain-v0"
    size_name = "num_links"

    def __init__(self, num_envs: int = 1, num_links: int = 8, max_episode_steps: int | None = 200,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 device: torch.device | str | None = None, validate: bool | None = None,
                 render_mode: str | None = None):
        super().__init__(num_envs, num_links, max_episode_steps, autoreset_mode, device, validate, render_mode)
        self.num_links = self.size


class OscillatorSwarmVectorEnv(TileStateVectorEnv):
    """OscillatorSwarm-v0: S particles on springs to the origin and to their centre of mass, pushed together.

    The configurable-complexity simulator of the fusion-speedup curve: its state (2S floats
    per env) grows with ``num_particles`` while the arithmetic per state element stays a few
    additions and multiplications, so the unfused PyTorch step's memory traffic grows with S
    and the fused kernel's cost per element stays small (see :mod:`simfuse.kernels.swarm`).

    ## Action space
    ``Box(-1.0, 1.0, (1,), float32)``: a force 2a on every particle (clipped to [-1, 1]).

    ## Observation space
    ``Box(-inf, inf, (2S,), float32)``: the positions x_0..x_{S-1}, then the velocities v_0..v_{S-1}.

    ## Dynamics
    Semi-implicit Euler with dt = 0.05: α_j = −4 x_j − 2 (x_j − c) − 0.1 v_j + 2a, with c the
    mean position; v_j' = v_j + dt α_j, x_j' = x_j + dt v_j'.

    ## Reward
    −(1/S) Σ_j x_j'²: gather the swarm at the origin.

    ## Starting state
    x_j uniform in [−0.5, 0.5), v_j = 0.

    ## Episode end
    No termination; truncation at 200 steps.

    Args:
        num_particles: S, 1 <= S <= 256 (other arguments as for every simfuse env).
    """

    model = 1
    env_id = "OscillatorSwarm-v0"
    size_name = "num_particles"

    def __init__(self, num_envs: int = 1, num_particles: int = 8, max_episode_steps: int | None = 200,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 device: torch.device | str | None = None, validate: bool | None = None,
                 render_mode: str | None = None):
        super().__init__(num_envs, num_particles, max_episode_steps, autoreset_mode, device, validate, render_mode)
        self.num_particles = self.size
