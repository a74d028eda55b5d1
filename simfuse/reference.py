"""Unfused PyTorch versions of the simfuse environments: the test oracle and the timing baseline.

* :func:`env_step`, :func:`env_observe`, :func:`start_state` — each env's dynamics on a
  ``[4, N]`` state tensor in any float dtype (float64 for the oracle), the same equations as
  the kernels in :mod:`simfuse.kernels` and Gymnasium's classic-control sources;
* :func:`rollout` — the fused rollout's exact semantics (policies, Philox draws from the
  numpy oracle of :mod:`fusecore.rng`, auto-reset modes, statistics) one step at a time: what
  the kernel must reproduce;
* :func:`unfused_step` / :func:`unfused_random_rollout` — what a user writes without fusion:
  one launch sequence per step, ``torch.rand`` for actions and start states.  The baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fusecore.rng import normal_reference, uniform_reference

from .specs import EnvDef

RESET_TAG = 1 << 32
POLICY_TAG = 2 << 32
NEXT_STEP, SAME_STEP, DISABLED = 0, 1, 2
# Gymnasium's defaults of the constructor parameters: CartPole's sutton_barto_reward, Pendulum's g.
DEFAULT_PARAMS = {0: False, 1: 10.0}


def env_param(env: EnvDef, value: float | bool | None = None) -> float:
    """The one float the kernels take for an env's constructor parameter.

    CartPole-v1: 1.0 with ``sutton_barto_reward``, else 0.0; Pendulum-v1: the coefficient
    3 g / (2 l) = 1.5 g of its dynamics (``g``, default 10); other envs: 0.0.  ``None`` means
    Gymnasium's default.
    """
    value = DEFAULT_PARAMS.get(env.kernel_id) if value is None else value
    if env.kernel_id == 0:
        return 1.0 if value else 0.0
    if env.kernel_id == 1:
        return 1.5 * float(value)
    return 0.0


def start_state(env: EnvDef, u: torch.Tensor) -> torch.Tensor:
    """Start states [4, N] from uniforms ``u`` [4, N] in [0, 1) (Gymnasium's reset distributions)."""
    zero = torch.zeros_like(u[0])
    if env.kernel_id == 0:
        return u * 0.1 - 0.05
    if env.kernel_id == 1:
        return torch.stack([u[0] * (2 * math.pi) - math.pi, u[1] * 2.0 - 1.0, zero, zero])
    if env.kernel_id == 4:
        return u * 0.2 - 0.1
    return torch.stack([u[0] * 0.2 - 0.6, zero, zero, zero])


def philox_start_state(env: EnvDef, seed: int, env_ids: np.ndarray, index) -> torch.Tensor:
    """Start states [4, len(env_ids)] float32 number ``index`` (an int or one per env), bit-identical to the kernels'.

    Env i's e-th start state (e = 0 at ``reset(seed=...)``) is Philox (seed, RESET_TAG + i, e).
    """
    u = uniform_reference(seed, np.asarray(env_ids, dtype=np.int64) + RESET_TAG, np.asarray(index, dtype=np.int64))
    u32 = torch.from_numpy(np.ascontiguousarray(u.T))
    # float32 arithmetic in the kernel's order: u * width + low, each rounded to float32
    if env.kernel_id == 0:
        return u32 * np.float32(0.1) - np.float32(0.05)
    if env.kernel_id == 1:
        zero = torch.zeros_like(u32[0])
        return torch.stack([u32[0] * np.float32(2 * math.pi) - np.float32(math.pi),
                            u32[1] * np.float32(2.0) - np.float32(1.0), zero, zero])
    if env.kernel_id == 4:
        return u32 * np.float32(0.2) - np.float32(0.1)
    zero = torch.zeros_like(u32[0])
    return torch.stack([u32[0] * np.float32(0.2) - np.float32(0.6), zero, zero, zero])


def _cartpole(s: torch.Tensor, a: torch.Tensor, sutton_barto_reward: float):
    x, x_dot, theta, theta_dot = s
    force = torch.where(a > 0.5, 10.0, -10.0).to(s.dtype)
    costheta, sintheta = torch.cos(theta), torch.sin(theta)
    temp = (force + 0.05 * theta_dot**2 * sintheta) / 1.1
    thetaacc = (9.8 * sintheta - costheta * temp) / (0.5 * (4.0 / 3.0 - 0.1 * costheta**2 / 1.1))
    xacc = temp - 0.05 * thetaacc * costheta / 1.1
    new = torch.stack([x + 0.02 * x_dot, x_dot + 0.02 * xacc, theta + 0.02 * theta_dot, theta_dot + 0.02 * thetaacc])
    limit = 12 * 2 * math.pi / 360
    terminated = (new[0].abs() > 2.4) | (new[2].abs() > limit)
    if sutton_barto_reward:
        return new, -terminated.to(s.dtype), terminated
    return new, torch.ones_like(x), terminated


def _pendulum(s: torch.Tensor, a: torch.Tensor, gravity_coef: float):
    th, thdot = s[0], s[1]
    u = a.clamp(-2.0, 2.0)
    normalized = torch.remainder(th + math.pi, 2 * math.pi) - math.pi
    costs = normalized**2 + 0.1 * thdot**2 + 0.001 * u**2
    newthdot = (thdot + (gravity_coef * torch.sin(th) + 3.0 * u) * 0.05).clamp(-8.0, 8.0)
    new = torch.stack([th + newthdot * 0.05, newthdot, s[2], s[3]])
    return new, -costs, torch.zeros_like(th, dtype=torch.bool)


def _move(position, velocity, accel):
    velocity = (velocity + accel).clamp(-0.07, 0.07)
    position = (position + velocity).clamp(-1.2, 0.6)
    velocity = torch.where((position == -1.2) & (velocity < 0), torch.zeros_like(velocity), velocity)
    return position, velocity


def _mountain_car(s: torch.Tensor, a: torch.Tensor, _param: float):
    position, velocity = _move(s[0], s[1], (a - 1.0) * 0.001 + torch.cos(3 * s[0]) * -0.0025)
    terminated = (position >= 0.5) & (velocity >= 0)
    return torch.stack([position, velocity, s[2], s[3]]), -torch.ones_like(position), terminated


def _mountain_car_continuous(s: torch.Tensor, a: torch.Tensor, _param: float):
    force = a.clamp(-1.0, 1.0)
    position, velocity = _move(s[0], s[1], force * 0.0015 - 0.0025 * torch.cos(3 * s[0]))
    terminated = (position >= 0.45) & (velocity >= 0)
    reward = torch.where(terminated, 100.0, 0.0).to(s.dtype) - a * a * 0.1
    return torch.stack([position, velocity, s[2], s[3]]), reward, terminated


def _acrobot_dsdt(y: torch.Tensor, torque: torch.Tensor) -> torch.Tensor:
    theta1, theta2, dtheta1, dtheta2 = y
    d1 = 3.5 + torch.cos(theta2)
    d2 = 1.25 + 0.5 * torch.cos(theta2)
    phi2 = 4.9 * torch.cos(theta1 + theta2 - math.pi / 2)
    phi1 = (-0.5 * dtheta2**2 * torch.sin(theta2) - dtheta2 * dtheta1 * torch.sin(theta2)
            + 14.7 * torch.cos(theta1 - math.pi / 2) + phi2)
    ddtheta2 = (torque + d2 / d1 * phi1 - 0.5 * dtheta1**2 * torch.sin(theta2) - phi2) / (1.25 - d2**2 / d1)
    ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
    return torch.stack([dtheta1, dtheta2, ddtheta1, ddtheta2])


def _wrap(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2):
        x = torch.where(x > math.pi, x - 2 * math.pi, x)
    for _ in range(2):
        x = torch.where(x < -math.pi, x + 2 * math.pi, x)
    return x


def _acrobot(s: torch.Tensor, a: torch.Tensor, _param: float):
    torque, dt = a - 1.0, 0.2
    k1 = _acrobot_dsdt(s, torque)
    k2 = _acrobot_dsdt(s + dt / 2 * k1, torque)
    k3 = _acrobot_dsdt(s + dt / 2 * k2, torque)
    k4 = _acrobot_dsdt(s + dt * k3, torque)
    y = s + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    new = torch.stack([_wrap(y[0]), _wrap(y[1]), y[2].clamp(-4 * math.pi, 4 * math.pi),
                       y[3].clamp(-9 * math.pi, 9 * math.pi)])
    terminated = -torch.cos(new[0]) - torch.cos(new[1] + new[0]) > 1.0
    reward = torch.where(terminated, 0.0, -1.0).to(s.dtype)
    return new, reward, terminated


_STEPS = {0: _cartpole, 1: _pendulum, 2: _mountain_car, 3: _mountain_car_continuous, 4: _acrobot}


def env_step(env: EnvDef, state: torch.Tensor, action: torch.Tensor, param: float | bool | None = None):
    """One step of every env: ``state`` [4, N], ``action`` [N] (float; discrete as the index).

    ``param``: the env's constructor parameter (see :func:`env_param`; None: the default).
    Returns ``(new_state [4, N], reward [N], terminated [N] bool)`` in ``state``'s dtype.
    """
    return _STEPS[env.kernel_id](state, action.to(state.dtype), env_param(env, param))


def env_observe(env: EnvDef, state: torch.Tensor) -> torch.Tensor:
    """Observations [N, obs_dim] of a state [4, N]."""
    if env.kernel_id == 0:
        return state.T.clone()
    if env.kernel_id == 1:
        return torch.stack([torch.cos(state[0]), torch.sin(state[0]), state[1]], dim=1)
    if env.kernel_id == 4:
        s = state
        return torch.stack([torch.cos(s[0]), torch.sin(s[0]), torch.cos(s[1]), torch.sin(s[1]), s[2], s[3]], dim=1)
    return state[:2].T.clone()


def autoreset_flags(reward, terminated, truncated, length, done_prev, autoreset: int):
    """The auto-reset modes (see :mod:`simfuse.kernels.episode`); returns
    ``(reward, terminated, truncated, steps, done_prev, resetting)``."""
    if autoreset == NEXT_STEP:
        resetting = done_prev
        reward = torch.where(resetting, torch.zeros_like(reward), reward)
        terminated, truncated = terminated & ~resetting, truncated & ~resetting
    elif autoreset == SAME_STEP:
        resetting = terminated | truncated
    else:
        resetting = torch.zeros_like(terminated)
    steps = torch.where(resetting, torch.zeros_like(length), length)
    return reward, terminated, truncated, steps, terminated | truncated, resetting


def track_episode(ep_return, episodes, return_sum, length_sum, reward, ended, length) -> torch.Tensor:
    """Accumulate the return; count ended episodes into the statistics (in place); return the new running return."""
    ep_return = ep_return + reward
    episodes += ended.to(torch.int32)
    return_sum += torch.where(ended, ep_return, torch.zeros_like(ep_return))
    length_sum += torch.where(ended, length, torch.zeros_like(length))
    return torch.where(ended, torch.zeros_like(ep_return), ep_return)


@dataclass
class RolloutOutputs:
    """What one rollout produced: trajectory [K, N(, obs_dim)], next observation, statistics."""

    obs: torch.Tensor | None
    actions: torch.Tensor | None
    rewards: torch.Tensor | None
    terminated: torch.Tensor | None
    truncated: torch.Tensor | None
    log_probs: torch.Tensor | None
    values: torch.Tensor | None
    final_obs: torch.Tensor | None
    next_obs: torch.Tensor
    episodes: torch.Tensor | None
    return_sum: torch.Tensor | None
    length_sum: torch.Tensor | None


_ACTIVATIONS = {0: torch.tanh, 1: torch.relu, 2: lambda x: x}


def mlp_forward(shape, x: torch.Tensor) -> torch.Tensor:
    """An MLP described by a :class:`simfuse.policy.MLPShape` evaluated in ``x``'s dtype."""
    for i, layer in enumerate(shape.linears):
        x = x @ layer.weight.detach().T.to(x.dtype)
        if layer.bias is not None:
            x = x + layer.bias.detach().to(x.dtype)
        if i < shape.hidden:
            x = _ACTIVATIONS[(shape.activations >> (2 * i)) & 3](x)
    return x


def sample_categorical(logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF samples of softmax(``logits``) [N, n] with uniforms ``u`` [N] (the kernel's rule).

    a = #{j < n − 1 : F_j ≤ u F_{n−1}} with F the running sum of exp(logits − max);
    returns (actions [N] int64, log-probabilities [N]).
    """
    weights = torch.exp(logits - logits.max(1, keepdim=True).values)
    cdf = torch.cumsum(weights, 1)
    target = u.to(logits.dtype) * cdf[:, -1]
    action = (cdf[:, :-1] <= target[:, None]).sum(1)
    return action, torch.log_softmax(logits, 1).gather(1, action[:, None])[:, 0]


def rollout(
    env: EnvDef,
    state: torch.Tensor,
    steps: torch.Tensor,
    done: torch.Tensor,
    ep_return: torch.Tensor,
    episode: torch.Tensor,
    *,
    seed: int,
    offset: int,
    num_steps: int,
    autoreset: int,
    max_episode_steps: int,
    policy,
    env_param: float | bool | None = None,
    dtype: torch.dtype = torch.float64,
) -> RolloutOutputs:
    """The fused rollout's semantics step by step (see :mod:`simfuse.kernels.rollout`).

    ``state`` [4, N], ``steps`` [N] int32, ``done`` [N] uint8, ``ep_return`` [N] float32 and
    ``episode`` [N] int32 (index of each env's current start state) are updated in place.
    ``policy``: ``"random"``, an action tensor [K, N] (or [K, N, 1]), or a
    :class:`simfuse.policy.MLPPolicy`.  ``env_param``: the env's constructor parameter (None:
    the default).  Draws come from the numpy Philox oracle.
    """
    n, device = state.shape[1], state.device
    ids = np.arange(n, dtype=np.int64)
    s = state.to(dtype)
    cnt = steps.clone()
    done_prev = done.bool().clone()
    ret = ep_return.to(dtype)
    obs_l, act_l, rew_l, term_l, trunc_l, lp_l, val_l, fin_l = [], [], [], [], [], [], [], []
    episodes = torch.zeros(n, dtype=torch.int32, device=device)
    return_sum = torch.zeros(n, dtype=dtype, device=device)
    length_sum = torch.zeros(n, dtype=torch.int32, device=device)
    for t in range(num_steps):
        position = offset + t
        o = env_observe(env, s)
        log_prob = value = None
        if isinstance(policy, str):
            u = torch.from_numpy(uniform_reference(seed, ids + POLICY_TAG, position // 4)[:, position % 4]).to(device)
            if env.discrete:
                a = torch.clamp(torch.floor(u * env.num_actions), max=env.num_actions - 1).to(dtype)
            else:
                a = (np.float32(env.action_low) + u * np.float32(env.action_high - env.action_low)).to(dtype)
        elif isinstance(policy, torch.Tensor):
            a = policy[t].reshape(n).to(dtype)
            if env.discrete:
                a = a.clamp(0, env.num_actions - 1)
        else:
            out = mlp_forward(policy.actor_shape, o)
            if env.discrete:
                u = torch.from_numpy(uniform_reference(seed, ids + POLICY_TAG, position // 4)[:, position % 4])
                a, log_prob = sample_categorical(out[:, : env.num_actions], u.to(device))
                a = a.to(dtype)
            else:
                z = normal_reference(seed, ids + POLICY_TAG, position // 4)[:, position % 4]
                z = torch.from_numpy(z).to(device, dtype)
                a = out[:, 0] + math.exp(policy.log_std_value()) * z
                log_prob = -0.5 * z * z - policy.log_std_value() - 0.5 * math.log(2 * math.pi)
            if policy.critic_shape is not None:
                value = mlp_forward(policy.critic_shape, o)[:, 0]
        obs_l.append(o)
        act_l.append(a)
        lp_l.append(log_prob)
        val_l.append(value)
        new, reward, terminated = env_step(env, s, a, env_param)
        length = cnt + 1
        reward, terminated, truncated, cnt, done_prev, resetting = autoreset_flags(
            reward, terminated, length >= max_episode_steps, length, done_prev, autoreset)
        if autoreset == SAME_STEP:
            fin_l.append(env_observe(env, new))
        if bool(resetting.any()):
            fresh = philox_start_state(env, seed, ids, (episode + 1).cpu().numpy()).to(device, dtype)
            new = torch.where(resetting[None, :], fresh, new)
            episode += resetting.to(episode.dtype)
        s = new
        ret = track_episode(ret, episodes, return_sum, length_sum, reward, terminated | truncated, length)
        rew_l.append(reward)
        term_l.append(terminated)
        trunc_l.append(truncated)
    state.copy_(s.to(state.dtype))
    steps.copy_(cnt)
    done.copy_(done_prev.to(done.dtype))
    ep_return.copy_(ret.to(ep_return.dtype))

    def stack(items):
        return torch.stack(items) if items and items[0] is not None else None

    return RolloutOutputs(
        obs=stack(obs_l), actions=stack(act_l), rewards=stack(rew_l), terminated=stack(term_l),
        truncated=stack(trunc_l), log_probs=stack(lp_l), values=stack(val_l), final_obs=stack(fin_l),
        next_obs=env_observe(env, s), episodes=episodes, return_sum=return_sum, length_sum=length_sum,
    )


def unfused_step(env: EnvDef, state: torch.Tensor, steps: torch.Tensor, action: torch.Tensor,
                 max_episode_steps: int, generator: torch.Generator | None = None):
    """One unfused SAME_STEP step as a user writes it in PyTorch: dynamics, flags, ``torch.rand`` resets.

    Returns ``(state, steps, obs [N, obs_dim], reward, terminated, truncated)``.
    """
    new, reward, terminated = env_step(env, state, action)
    steps = steps + 1
    truncated = steps >= max_episode_steps
    done = terminated | truncated
    fresh = start_state(env, torch.rand(state.shape, device=state.device, dtype=state.dtype, generator=generator))
    new = torch.where(done[None, :], fresh, new)
    steps = torch.where(done, torch.zeros_like(steps), steps)
    return new, steps, env_observe(env, new), reward, terminated, truncated


def unfused_random_rollout(env: EnvDef, state: torch.Tensor, steps: torch.Tensor, num_steps: int,
                           max_episode_steps: int, generator: torch.Generator | None = None, step_fn=None):
    """K unfused steps with uniform random actions, the trajectory written as the fused kernel writes it.

    ``step_fn`` replaces :func:`unfused_step` (for example by its ``torch.compile``'d version).
    Returns ``(obs [K, N, obs_dim], actions [K, N], rewards, terminated, truncated)``.
    """
    step_fn = step_fn or unfused_step
    n = state.shape[1]
    obs = torch.empty((num_steps, n, env.obs_dim), device=state.device, dtype=state.dtype)
    actions = torch.empty((num_steps, n), device=state.device, dtype=state.dtype)
    rewards = torch.empty((num_steps, n), device=state.device, dtype=state.dtype)
    terminated = torch.empty((num_steps, n), device=state.device, dtype=torch.bool)
    truncated = torch.empty((num_steps, n), device=state.device, dtype=torch.bool)
    current = env_observe(env, state)
    for t in range(num_steps):
        u = torch.rand(n, device=state.device, dtype=state.dtype, generator=generator)
        if env.discrete:
            a = torch.floor(u * env.num_actions)
        else:
            a = env.action_low + u * (env.action_high - env.action_low)
        obs[t] = current
        actions[t] = a
        state, steps, current, rewards[t], terminated[t], truncated[t] = step_fn(
            env, state, steps, a, max_episode_steps, generator)
    return obs, actions, rewards, terminated, truncated


# ----------------------------------------------------------------------------- the pendulum chain

CHAIN_RESET_STREAM = 16


def chain_start_angles(seed: int, env_ids: np.ndarray, index, num_links: int) -> torch.Tensor:
    """Start angles [len(env_ids), num_links] float32 number ``index`` (an int or one per env), as the kernel's."""
    ids = np.asarray(env_ids, dtype=np.int64)[:, None]
    links = np.arange(num_links, dtype=np.int64)[None, :]
    index = np.asarray(index, dtype=np.int64)
    u = uniform_reference(seed, ids + ((CHAIN_RESET_STREAM + links) << 32), index[:, None] if index.ndim else index)
    u = u[..., 0]
    return torch.from_numpy(u) * np.float32(1.0) - np.float32(0.5)


def chain_step(theta: torch.Tensor, omega: torch.Tensor, action: torch.Tensor):
    """One step of every chain (see :mod:`simfuse.kernels.chain`): θ, ω [N, L], action [N]."""
    torque = torch.zeros_like(theta)
    torque[:, 0] = 2.0 * action.to(theta.dtype).clamp(-1.0, 1.0)
    alpha = -10.0 * torch.sin(theta) + 2.0 * (theta.mean(1, keepdim=True) - theta) - 0.05 * omega + torque
    omega = omega + 0.05 * alpha
    theta = theta + 0.05 * omega
    normalized = torch.remainder(theta + math.pi, 2 * math.pi) - math.pi
    return theta, omega, -(normalized**2).mean(1)


def swarm_step(x: torch.Tensor, v: torch.Tensor, action: torch.Tensor):
    """One step of every oscillator swarm (see :mod:`simfuse.kernels.swarm`): x, v [N, S], action [N].

    Written as a user writes it in PyTorch: about fifteen elementwise kernels over [N, S].
    """
    force = 2.0 * action.to(x.dtype).clamp(-1.0, 1.0)
    accel = -4.0 * x - 2.0 * (x - x.mean(1, keepdim=True)) - 0.1 * v + force[:, None]
    v = v + 0.05 * accel
    x = x + 0.05 * v
    return x, v, -(x * x).mean(1)


# the tile-state models of simfuse.kernels.chain (its MODEL constexpr)
TILE_MODELS = {0: chain_step, 1: swarm_step}


def chain_rollout(state: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, ep_return: torch.Tensor,
                  episode: torch.Tensor, *,
                  seed: int, offset: int, num_steps: int, autoreset: int, max_episode_steps: int, policy,
                  model: int = 0, dtype: torch.dtype = torch.float64) -> RolloutOutputs:
    """The chain kernel's rollout semantics step by step; ``state`` [N, 2L] etc. updated in place.

    ``model``: 0 PendulumChain-v0, 1 OscillatorSwarm-v0 (:data:`TILE_MODELS`).
    """
    step_fn = TILE_MODELS[model]
    n, links = state.shape[0], state.shape[1] // 2
    device = state.device
    ids = np.arange(n, dtype=np.int64)
    theta, omega = state[:, :links].to(dtype), state[:, links:].to(dtype)
    cnt, done_prev, ret = steps.clone(), done.bool().clone(), ep_return.to(dtype)
    obs_l, act_l, rew_l, trunc_l, fin_l = [], [], [], [], []
    episodes = torch.zeros(n, dtype=torch.int32, device=device)
    return_sum = torch.zeros(n, dtype=dtype, device=device)
    length_sum = torch.zeros(n, dtype=torch.int32, device=device)
    for t in range(num_steps):
        position = offset + t
        if isinstance(policy, torch.Tensor):
            a = policy[t].reshape(n).to(dtype)
        else:
            u = torch.from_numpy(uniform_reference(seed, ids + POLICY_TAG, position // 4)[:, position % 4]).to(device)
            a = (u * np.float32(2.0) - np.float32(1.0)).to(dtype)
        obs_l.append(torch.cat([theta, omega], 1))
        act_l.append(a)
        new_theta, new_omega, reward = step_fn(theta, omega, a)
        length = cnt + 1
        never = torch.zeros_like(length, dtype=torch.bool)
        reward, _, truncated, cnt, done_prev, resetting = autoreset_flags(
            reward, never, length >= max_episode_steps, length, done_prev, autoreset)
        if autoreset == SAME_STEP:
            fin_l.append(torch.cat([new_theta, new_omega], 1))
        if bool(resetting.any()):
            fresh = chain_start_angles(seed, ids, (episode + 1).cpu().numpy(), links).to(device, dtype)
            episode += resetting.to(episode.dtype)
            new_theta = torch.where(resetting[:, None], fresh, new_theta)
            new_omega = torch.where(resetting[:, None], torch.zeros_like(new_omega), new_omega)
        theta, omega = new_theta, new_omega
        ret = track_episode(ret, episodes, return_sum, length_sum, reward, truncated, length)
        rew_l.append(reward)
        trunc_l.append(truncated)
    state.copy_(torch.cat([theta, omega], 1).to(state.dtype))
    steps.copy_(cnt)
    done.copy_(done_prev.to(done.dtype))
    ep_return.copy_(ret.to(ep_return.dtype))

    def stack(items):
        return torch.stack(items) if items else None

    truncated_all = stack(trunc_l)
    return RolloutOutputs(
        obs=stack(obs_l), actions=stack(act_l), rewards=stack(rew_l),
        terminated=None if truncated_all is None else torch.zeros_like(truncated_all), truncated=truncated_all,
        log_probs=None, values=None, final_obs=stack(fin_l), next_obs=torch.cat([theta, omega], 1),
        episodes=episodes, return_sum=return_sum, length_sum=length_sum,
    )


def chain_unfused_random_rollout(state: torch.Tensor, steps: torch.Tensor, num_steps: int, max_episode_steps: int,
                                 write_obs: bool = True, generator: torch.Generator | None = None, model: int = 0):
    """The unfused baseline of the tile-state models: K steps of PyTorch ops, ``torch.rand`` actions and resets.

    ``state`` [N, 2L]; ``model`` as for :func:`chain_rollout`; returns the observations
    [K, N, 2L] (or None), rewards and truncation flags [K, N].
    """
    n, links = state.shape[0], state.shape[1] // 2
    theta, omega = state[:, :links], state[:, links:]
    obs = torch.empty((num_steps, n, 2 * links), device=state.device, dtype=state.dtype) if write_obs else None
    rewards = torch.empty((num_steps, n), device=state.device, dtype=state.dtype)
    truncated = torch.empty((num_steps, n), device=state.device, dtype=torch.bool)
    for t in range(num_steps):
        a = torch.rand(n, device=state.device, dtype=state.dtype, generator=generator) * 2 - 1
        if obs is not None:
            obs[t, :, :links] = theta
            obs[t, :, links:] = omega
        theta, omega, rewards[t] = TILE_MODELS[model](theta, omega, a)
        steps = steps + 1
        truncated[t] = steps >= max_episode_steps
        fresh = torch.rand(theta.shape, device=state.device, dtype=state.dtype, generator=generator) - 0.5
        theta = torch.where(truncated[t, :, None], fresh, theta)
        omega = torch.where(truncated[t, :, None], torch.zeros_like(omega), omega)
        steps = torch.where(truncated[t], torch.zeros_like(steps), steps)
    return obs, rewards, truncated
