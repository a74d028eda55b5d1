"""Gymnasium vector environments whose step and K-step rollout are fused GPU kernels.

:class:`FusedVectorEnv` is the ``gymnasium.vector.VectorEnv`` every simfuse classic-control
env subclasses (it only names its :class:`~simfuse.specs.EnvDef` and documents it).  The env
owns, on its device, the float32 state [4, N], the int32 step counters, a uint8 "done at the
previous step" flag and the running episode returns; nothing is copied to the host.

* ``reset(seed=s)`` draws env i's start state from Philox (s, i) — the same on CPU and GPU —
  and numbers it 0; every later reset of env i (automatic, masked, or unseeded) takes its
  next one; ``reset(options={"reset_mask": m})`` resets only the envs where ``m`` is True.
* ``step(actions)`` is one launch of the rollout kernel with K = 1: observations, rewards and
  flags come back as torch tensors on the env's device, without a host synchronisation.
* ``rollout(policy, num_steps=K)`` runs K steps of every env in one launch and returns a
  :class:`Trajectory` (or, with ``stats_only=True``, :class:`EpisodeStats`).

Every step and every rollout step consumes one position of the env's Philox stream for the
policy draws, and start states are numbered per env and episode, so a K-step rollout and K
calls of ``step`` with the rollout's actions agree bit for bit.

Input checking (issue 8): actions of the wrong type, shape, dtype or device raise at once.
Action *values* (out of the action space, NaN) can only be checked by reading them; that is
done on the CPU always and on the GPU only with ``validate=True`` (one host synchronisation
per step).  Without it, out-of-range discrete actions are clamped into range by the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import error, spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from torch import nn

from fusecore import backend
from fusecore.rng import PhiloxStream, check_seed

from . import ops
from .policy import MLPPolicy
from .specs import EnvDef

AUTORESET_IDS = {AutoresetMode.NEXT_STEP: 0, AutoresetMode.SAME_STEP: 1, AutoresetMode.DISABLED: 2}
NO_LIMIT = 2**31 - 1


class _EnvLimit:
    """The default ``max_episode_steps``: the env's own limit (``env_def.max_episode_steps``), as Gymnasium's
    vector envs default to their registration's."""

    def __repr__(self) -> str:
        return "the env's own limit"


ENV_LIMIT: Any = _EnvLimit()
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class Trajectory:
    """K steps of N envs, on the env's device.

    ``obs[t]`` is the observation the action ``actions[t]`` was chosen from; ``rewards[t]``,
    ``terminated[t]``, ``truncated[t]`` are what that step returned; ``next_obs`` is the
    observation after the last step (to bootstrap from).  Shapes: obs [K, N, obs_dim] float32;
    actions [K, N] int32 (discrete) or [K, N, 1] float32; rewards, log_probs, values [K, N]
    float32; terminated, truncated [K, N] bool; final_obs [K, N, obs_dim] (SAME_STEP, when asked:
    the observation before the auto-reset, meaningful where the step ended an episode).
    """

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    next_obs: torch.Tensor
    log_probs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    final_obs: torch.Tensor | None = None


@dataclass
class EpisodeStats:
    """Episodes completed during a statistics-only rollout, per env: count, summed returns and lengths."""

    episodes: torch.Tensor
    return_sum: torch.Tensor
    length_sum: torch.Tensor
    next_obs: torch.Tensor

    def mean_return(self) -> torch.Tensor:
        """Mean return of the completed episodes (a 0-d tensor; NaN if none completed)."""
        return self.return_sum.double().sum() / self.episodes.sum()

    def mean_length(self) -> torch.Tensor:
        """Mean length of the completed episodes (a 0-d tensor; NaN if none completed)."""
        return self.length_sum.double().sum() / self.episodes.sum()


def _env_device(device: torch.device | str | int | None) -> torch.device:
    """The env's device, checked: ``cpu`` (any index: CPU tensors report plain ``cpu``) or an available CUDA
    device (index filled in: CUDA tensors report ``cuda:0``, never ``cuda``)."""
    if device is None:
        device = backend.default_device()
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}") from exc
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got '{device}'")
    if not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} was asked for, but no CUDA device is available")
    index = torch.cuda.current_device() if device.index is None else device.index
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def _from_numpy(array: np.ndarray, name: str) -> torch.Tensor:
    """``array`` as a tensor of the same shape (0-d included), or a clear error naming ``name``."""
    try:
        return torch.from_numpy(np.array(array, copy=True, order="C").astype(array.dtype.newbyteorder("="),
                                                                                copy=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: a numpy array of dtype {array.dtype} cannot be used ({exc})") from exc


def _autoreset_mode(value: AutoresetMode | str) -> AutoresetMode:
    if isinstance(value, AutoresetMode):
        return value
    if isinstance(value, str):
        for mode in AutoresetMode:
            if value.replace("_", "").lower() in (mode.value.lower(), mode.name.replace("_", "").lower()):
                return mode
    raise ValueError(f"autoreset_mode must be one of {[m.value for m in AutoresetMode]} (or AutoresetMode), "
                     f"got {value!r}")


class FusedVectorEnv(VectorEnv):
    """A batch of ``num_envs`` copies of one classic-control env stepped by fused Triton kernels.

    Args:
        num_envs: number of environments, >= 1.
        max_episode_steps: truncation limit (``None``: never truncate; default: the env's own,
            e.g. 500 for CartPole-v1, the registration's value).
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED``
            (or their names).
        device: where the state lives and the kernels run (default: the GPU when compiled,
            else the CPU through the Triton interpreter).  A CPU env in a process whose kernels
            are compiled for the GPU runs the unfused PyTorch reference (same draws, same math).
        validate: check action values (one host synchronisation per step on the GPU); default
            True on the CPU, False on the GPU.
    """

    env_def: EnvDef
    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}
    # the env's constructor parameter as the kernels take it (see simfuse.reference.env_param)
    env_param: float | bool | None = None

    def __init__(
        self,
        num_envs: int = 1,
        max_episode_steps: int | None = ENV_LIMIT,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        device: torch.device | str | None = None,
        validate: bool | None = None,
        render_mode: str | None = None,
    ):
        if getattr(type(self), "env_def", None) is None and "env_def" not in vars(self):
            raise TypeError(f"{type(self).__name__} is abstract: use simfuse.make_vec(env_id, num_envs) or one of "
                            f"the env classes (simfuse.CartPoleVectorEnv ...)")
        if max_episode_steps is ENV_LIMIT:
            max_episode_steps = self.env_def.max_episode_steps
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise TypeError(f"num_envs must be an int, got {type(num_envs).__name__}")
        if num_envs <= 0:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_episode_steps is not None and (
            isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, (int, np.integer))
            or not 1 <= max_episode_steps < NO_LIMIT
        ):
            raise ValueError(f"max_episode_steps must be None or an int in [1, {NO_LIMIT}), got {max_episode_steps!r}")
        if render_mode is not None:
            raise ValueError(f"simfuse envs do not render; render_mode must be None, got {render_mode!r}")
        self.device = _env_device(device)
        self.num_envs = int(num_envs)
        self.max_episode_steps = None if max_episode_steps is None else int(max_episode_steps)
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = None
        if validate is not None and not isinstance(validate, (bool, np.bool_)):
            raise TypeError(f"validate must be a bool or None, got {validate!r}")
        self.validate = (self.device.type == "cpu") if validate is None else bool(validate)

        spec = self.env_def
        low, high = spec.obs_bounds()
        self.single_observation_space = spaces.Box(low, high, dtype=np.float32)
        if spec.discrete:
            self.single_action_space = spaces.Discrete(spec.num_actions)
        else:
            self.single_action_space = spaces.Box(spec.action_low, spec.action_high, shape=(1,), dtype=np.float32)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        n = self.num_envs
        self._state = torch.zeros((4, n), dtype=torch.float32, device=self.device)
        self._steps = torch.zeros(n, dtype=torch.int32, device=self.device)
        self._done = torch.zeros(n, dtype=torch.uint8, device=self.device)
        self._ep_return = torch.zeros(n, dtype=torch.float32, device=self.device)
        self._episode = torch.zeros(n, dtype=torch.int32, device=self.device)  # index of the current start state
        self._rng: PhiloxStream | None = None

    # ------------------------------------------------------------------ Gymnasium API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset all envs (or those in ``options["reset_mask"]``); returns ``(obs [N, obs_dim], {})``.

        Env i's start states are numbered from 0 at ``reset(seed=s)``: the e-th is Philox
        ``(s, stream i, e)``, identical on every device; every later reset (automatic, masked,
        or without a seed) takes the env's next one.
        """
        # Everything is checked before any state changes, so a rejected call leaves the env as it was.
        if seed is not None:
            seed = check_seed(seed)
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; simfuse envs accept only 'reset_mask'")
        if mask is not None:
            mask = self._reset_mask(mask)
            if self._rng is None:
                # the envs left out would step from a state no reset drew (seeded or not)
                raise error.ResetNeeded("reset(options={'reset_mask': ...}) needs a full reset() first")
        super().reset(seed=seed)
        restart = seed is not None or self._rng is None
        if seed is not None:
            self._rng = PhiloxStream(seed)
        elif self._rng is None:
            self._rng = PhiloxStream.from_torch()
        return self._draw_start_states(self._rng.seed, restart, mask), {}

    def step(self, actions):
        """One step of every env: ``(obs, rewards, terminated, truncated, infos)`` as device tensors.

        ``actions``: int tensor/array [N] (discrete) or float tensor/array [N, 1] (continuous).
        SAME_STEP: ``infos["final_obs"]`` [N, obs_dim] holds the observation before the reset
        where ``infos["_final_obs"]`` is True.
        """
        self._require_reset()
        given = self._check_actions(actions, "actions", (self.num_envs,))
        out = self._launch(given.reshape(1, self.num_envs), 1, write_obs=False, write_step=True,
                           write_final=self.autoreset_mode == AutoresetMode.SAME_STEP, write_stats=False)
        infos: dict[str, Any] = {}
        terminated, truncated = out.terminated[0], out.truncated[0]
        if out.final_obs is not None:
            ended = terminated | truncated
            infos = {"final_obs": out.final_obs[0], "_final_obs": ended, "final_info": {}, "_final_info": ended}
        return out.next_obs, out.rewards[0], terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        """Nothing to release: device buffers are freed with the env."""

    def get_state(self) -> torch.Tensor:
        """A copy of the physical state, [N, 4] float32 (unused trailing components are 0)."""
        return self._state.T.clone()

    def set_state(self, state: torch.Tensor | np.ndarray) -> None:
        """Overwrite the physical state with ``state`` [N, 4] (as ``env.unwrapped.state = ...`` in Gymnasium).

        Step counters, episode returns and pending auto-resets are kept; see :meth:`get_state`
        for the layout of each env's components.
        """
        self._require_reset()
        if isinstance(state, np.ndarray):
            state = torch.from_numpy(np.ascontiguousarray(state))
        if not isinstance(state, torch.Tensor) or not state.dtype.is_floating_point:
            raise TypeError(f"state must be a floating-point tensor or array, got {type(state).__name__}")
        if tuple(state.shape) != (self.num_envs, 4):
            raise ValueError(f"state must have shape ({self.num_envs}, 4), got {tuple(state.shape)}")
        self._state.copy_(state.T.to(device=self.device, dtype=torch.float32))

    # ------------------------------------------------------------------ fused rollouts

    def rollout(self, policy: str | torch.Tensor | np.ndarray | MLPPolicy | nn.Sequential = "random",
                num_steps: int | None = None, *, stats_only: bool = False, record_final_obs: bool = False):
        """Run ``num_steps`` steps of every env in one kernel launch.

        ``policy``: ``"random"`` (uniform over the action space); actions [K, N] (discrete)
        or [K, N, 1] (continuous) from the caller; an :class:`~simfuse.policy.MLPPolicy` or an
        actor ``nn.Sequential`` evaluated and sampled in the kernel (log-probabilities, and
        values when the policy has a critic, are recorded).  ``num_steps``: K, an int >= 0
        (with given actions optional, and if given, their K).  Returns a :class:`Trajectory`,
        or :class:`EpisodeStats` with ``stats_only=True`` (nothing per step is written);
        ``record_final_obs=True`` (SAME_STEP, not with ``stats_only``) adds ``final_obs``.
        Both flags are bools.
        """
        self._require_reset()
        # Every argument is checked before anything runs: a rejected call leaves the env as it was.
        given = isinstance(policy, (torch.Tensor, np.ndarray))
        if not given and not isinstance(policy, (str, MLPPolicy, nn.Sequential)):
            raise TypeError(f"policy must be 'random', an action tensor, an MLPPolicy or an nn.Sequential, "
                            f"got {type(policy).__name__}")
        if isinstance(policy, str) and policy != "random":
            raise ValueError(f"policy must be 'random', an action tensor, an MLPPolicy or an nn.Sequential, "
                             f"got {policy!r}")
        if (num_steps is not None or not given) and (
            isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)) or num_steps < 0
        ):
            raise ValueError(f"num_steps must be an int >= 0, got {num_steps!r}")
        for flag, value in (("stats_only", stats_only), ("record_final_obs", record_final_obs)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
        stats_only, record_final_obs = bool(stats_only), bool(record_final_obs)
        if record_final_obs and stats_only:
            raise ValueError("record_final_obs needs a trajectory; with stats_only=True nothing per step is written")
        if given:
            step_shape = (self.num_envs,) if self.env_def.discrete else (self.num_envs, 1)
            if policy.ndim != len(step_shape) + 1:  # e.g. one step's actions: [N] is no [K, N]
                want = ", ".join(["K", *map(str, step_shape)])
                raise ValueError(f"policy must have shape ({want}) (K steps) for {self.num_envs} {self.env_def.name} "
                                 f"envs, got {tuple(policy.shape)}")
            k = int(policy.shape[0])
            if num_steps is not None and num_steps != k:
                raise ValueError(f"num_steps={num_steps} does not match the {k} steps of the given actions")
            kind = self._check_actions(policy, "policy", (k, self.num_envs))
        else:
            k = int(num_steps)
            if isinstance(policy, str):
                kind = policy
            else:
                kind = policy if isinstance(policy, MLPPolicy) else MLPPolicy(policy)
                kind.check_env(self.env_def.obs_dim, self.env_def.num_actions)
        if record_final_obs and self.autoreset_mode != AutoresetMode.SAME_STEP:
            raise ValueError("record_final_obs needs autoreset_mode=SAME_STEP (other modes return the final "
                             "observation as an ordinary one)")
        out = self._launch(kind, k, write_obs=not stats_only, write_step=not stats_only,
                           write_final=record_final_obs, write_stats=stats_only)
        if stats_only:
            return EpisodeStats(out.episodes, out.return_sum, out.length_sum, out.next_obs)
        actions = out.actions if self.env_def.discrete else out.actions.unsqueeze(-1)
        return Trajectory(obs=out.obs, actions=actions, rewards=out.rewards, terminated=out.terminated,
                          truncated=out.truncated, next_obs=out.next_obs, log_probs=out.log_probs,
                          values=out.values, final_obs=out.final_obs)

    # ------------------------------------------------------------------ helpers

    def _draw_start_states(self, key: int, restart: bool, mask: torch.Tensor | None) -> torch.Tensor:
        """Launch the reset kernel (start state 0 of every reset env with ``restart``, else its next one)."""
        return ops.reset(self.env_def, self._state, self._steps, self._done, self._ep_return, self._episode,
                         seed=key, restart=restart, reset_mask=mask)

    def _launch(self, policy, num_steps: int, **writes: bool):
        # the stream's position advances only once the launch has gone through: a rejected or failed call
        # (outputs too large to allocate, say) leaves the env's random position where it was
        key, offset = self._rng.seed, self._rng.offset
        limit = NO_LIMIT if self.max_episode_steps is None else self.max_episode_steps
        out = self._run_kernel(policy, num_steps, key, offset, limit, **writes)
        self._rng.take(num_steps)
        return out

    def _run_kernel(self, policy, num_steps: int, key: int, offset: int, limit: int, **writes: bool):
        """Launch the rollout kernel (the single-step path is K = 1)."""
        return ops.rollout(self.env_def, self._state, self._steps, self._done, self._ep_return, self._episode,
                           seed=key, offset=offset, num_steps=num_steps,
                           autoreset=AUTORESET_IDS[self.autoreset_mode], max_episode_steps=limit,
                           policy=policy, env_param=self.env_param, **writes)

    def _require_reset(self) -> None:
        if self._rng is None:
            raise error.ResetNeeded(f"{type(self).__name__}: call reset() before step() or rollout()")

    def _check_actions(self, actions, name: str, lead: tuple[int, ...]) -> torch.Tensor:
        """Validate actions of shape ``lead`` (+ (1,) for continuous envs); return them on the device."""
        spec = self.env_def
        if isinstance(actions, np.ndarray):
            actions = _from_numpy(actions, name).to(self.device)
        elif not isinstance(actions, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(actions).__name__}")
        if actions.device != self.device:
            raise ValueError(f"{name} is on device '{actions.device}' but the env runs on '{self.device}'")
        shape = lead if spec.discrete else (*lead, 1)
        if tuple(actions.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} for {self.num_envs} {spec.name} envs, "
                             f"got {tuple(actions.shape)}")
        if spec.discrete:
            backend.check_dtypes(INT_DTYPES, **{name: actions})
            if self.validate and actions.numel() and bool(((actions < 0) | (actions >= spec.num_actions)).any()):
                bad = actions[(actions < 0) | (actions >= spec.num_actions)][0].item()
                raise ValueError(f"{name} contains {bad}, outside the Discrete({spec.num_actions}) action space")
            return actions.contiguous()
        backend.check_dtypes(FLOAT_DTYPES, **{name: actions})
        actions = actions.to(torch.float32)
        if self.validate and actions.numel() and not bool(torch.isfinite(actions).all()):
            raise ValueError(f"{name} contains NaN or infinite values")
        return actions.reshape(lead).contiguous()

    def _reset_mask(self, mask) -> torch.Tensor:
        if isinstance(mask, np.ndarray):
            mask = _from_numpy(mask, "options['reset_mask']").to(self.device)
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"options['reset_mask'] must be a bool tensor or numpy array, got {type(mask).__name__}")
        backend.check_dtypes((torch.bool,), **{"options['reset_mask']": mask})
        if tuple(mask.shape) != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must have shape ({self.num_envs},), got {tuple(mask.shape)}")
        if mask.device != self.device:
            raise ValueError(f"options['reset_mask'] is on '{mask.device}' but the env runs on '{self.device}'")
        if self.validate and not bool(mask.any()):
            raise ValueError("options['reset_mask'] must contain at least one True value")
        return mask.contiguous().view(torch.uint8)

    def __repr__(self) -> str:
        name = self.spec.id if self.spec is not None else self.env_def.name
        return f"{type(self).__name__}({name}, num_envs={self.num_envs}, device={self.device})"
