"""Launchers of the simfuse kernels: shapes and dtypes checked, outputs allocated, grid chosen.

:func:`rollout` launches :func:`simfuse.kernels.rollout.rollout_kernel` (K steps, one launch)
and :func:`reset` the reset kernel; under ``fusecore.use_reference()`` both run the unfused
PyTorch semantics of :mod:`simfuse.reference` instead.  Compiled kernels are built with
floating-point contraction off (``enable_fp_fusion=False``) so that start states, drawn as
``u * width + low`` from Philox uniforms, are bit-identical on the GPU, under the
interpreter and in the numpy oracle.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np
import torch

from fusecore import backend
from fusecore.device import device_facts
from fusecore.plan import cdiv, next_power_of_2

from . import reference
from .specs import EnvDef

POLICY_IDS = {"random": 0, "given": 1, "mlp": 2}


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Launch choices of the rollout kernels (the ``sim/tuning`` and ``sim/chain`` benchmarks compare variants).

    ``group_random_draws``: the random policy's steps run in unrolled groups of four that
    share one Philox call (else one step per loop iteration, with a test for the next call);
    ``two_start_states_ahead``: NEXT_STEP rollouts draw each env's next two start states
    every four steps (a reset step is never followed by another, so two suffice) instead of
    one and a per-step test for an env that resets twice (None: below 64 envs per program,
    where the kernel is latency-bound; measured on an H200, CUDA-graph replays: 1.08x at
    4,096 envs, 0.93x at 1 M);
    ``env_block`` / ``env_warps``: envs per program and warps for the random and given
    policies; ``mlp_block`` / ``mlp_warps``: the same for MLP policies (None: automatic);
    ``chain_links_per_thread``: the most links (particles) of one env a thread of the
    tile-state kernel holds (:func:`chain_launch`).
    """

    group_random_draws: bool = True
    two_start_states_ahead: bool | None = None
    env_block: int | None = None
    env_warps: int | None = None
    mlp_block: int | None = None
    mlp_warps: int | None = None
    chain_links_per_thread: int = 32


_tuning = Tuning()


@contextlib.contextmanager
def tuned(**overrides) -> Iterator[Tuning]:
    """Context manager: launch with some :class:`Tuning` fields replaced (benchmark variants)."""
    global _tuning
    previous = _tuning
    _tuning = dataclasses.replace(previous, **overrides)
    try:
        yield _tuning
    finally:
        _tuning = previous


# MLP launches measured on an H200 (2x64 actor+critic, CartPole-v1, sim/tuning): precision ->
# (most envs per program, warps at that size).  float32 "ieee" products run on the CUDA cores
# with the operand tiles in registers: beyond 16 envs per program they spill (128 x 4 warps:
# 14x slower).  tf32: 64 envs x 2 warps is 1.11x faster than 128 x 4; bf16 / fp16: 128 x 4.
MLP_LAUNCH = {"ieee": (16, 2), "tf32": (64, 2), "bf16": (128, 4), "fp16": (128, 4)}


def block_size(num_envs: int, device: torch.device, mlp: bool = False, precision: str | None = None) -> int:
    """Envs per program: 128 (one per thread, 4 warps) unless that leaves schedulers idle.

    The K steps of one env are sequential, so with few envs the kernel is latency-bound: the
    block shrinks (down to 16 envs, half a warp) until there are about four programs per
    multiprocessor, one per warp scheduler.  Not below 16: measured on an H200 (4,096 envs),
    8 envs per program (512 one-warp programs for 528 schedulers) ran 0.10-0.21 ms from run
    to run, as some schedulers got two warps, while 16 (two programs per multiprocessor)
    ran a steady 0.113 ms.  The MLP policy needs 16 rows for ``tl.dot`` and takes at most
    :data:`MLP_LAUNCH`'s envs per program for its ``precision``.
    """
    chosen = _tuning.mlp_block if mlp else _tuning.env_block
    if chosen is not None:
        return chosen
    floor = 16
    cap = MLP_LAUNCH[precision][0] if mlp else 128
    if device.type != "cuda":
        return max(floor, min(cap, next_power_of_2(num_envs)))
    sms = device_facts(device).sm_count
    block = cap
    while block > floor and cdiv(num_envs, block) < 4 * sms:
        block //= 2
    return block


def _use_reference(tensor: torch.Tensor) -> bool:
    """The reference path when asked for, or when the kernels cannot run on the tensor's device."""
    return backend.reference_enabled() or tensor.device.type not in backend.kernel_devices()


def _launch_options(block: int, mlp: bool = False, precision: str | None = None) -> dict:
    if mlp and _tuning.mlp_warps is not None:
        warps = _tuning.mlp_warps
    elif not mlp and _tuning.env_warps is not None:
        warps = _tuning.env_warps
    elif mlp and block == MLP_LAUNCH[precision][0]:
        warps = MLP_LAUNCH[precision][1]
    else:
        warps = max(1, min(4, block // 32))
    return {"num_warps": warps, "enable_fp_fusion": False}


def reset(env: EnvDef, state: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, ep_return: torch.Tensor,
          episode: torch.Tensor, *, seed: int, restart: bool, reset_mask: torch.Tensor | None = None
          ) -> torch.Tensor:
    """Draw start states for all envs (or where ``reset_mask``), in place; return observations [N, obs_dim].

    A reset env takes start state ``episode + 1`` (int32 [N], then incremented), or start state
    0 with ``restart`` (a new seed).
    """
    n = state.shape[1]
    if _use_reference(state):
        chosen = torch.ones(n, dtype=torch.bool, device=state.device) if reset_mask is None else reset_mask.bool()
        index = torch.zeros_like(episode) if restart else episode + 1
        fresh = reference.philox_start_state(env, seed, np.arange(n), index.cpu().numpy()).to(state.device)
        state.copy_(torch.where(chosen[None, :], fresh, state))
        episode.copy_(torch.where(chosen, index, episode))
        steps.masked_fill_(chosen, 0)
        done.masked_fill_(chosen, 0)
        ep_return.masked_fill_(chosen, 0.0)
        return reference.env_observe(env, state)
    from .kernels.rollout import reset_kernel

    obs = torch.empty((n, env.obs_dim), dtype=torch.float32, device=state.device)
    block = block_size(n, state.device)
    reset_kernel[(cdiv(n, block),)](
        state, steps, done, ep_return, episode, reset_mask if reset_mask is not None else done, obs,
        n, seed,
        ENV=env.kernel_id, OBS_DIM=env.obs_dim, HAS_MASK=reset_mask is not None, RESTART=restart,
        BLOCK=block, **_launch_options(block),
    )
    return obs


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
    env_param: float | None = None,
    write_obs: bool = True,
    write_step: bool = True,
    write_final: bool = False,
    write_stats: bool = False,
) -> reference.RolloutOutputs:
    """Run ``num_steps`` steps of every env in one launch; env buffers are updated in place.

    ``state`` [4, N] float32, ``steps`` [N] int32, ``done`` [N] uint8, ``ep_return`` [N] float32,
    ``episode`` [N] int32 (the index of each env's current start state).
    ``policy``: ``"random"``; a [K, N] action tensor (int for discrete envs, float32 for
    continuous ones); or a :class:`simfuse.policy.MLPPolicy`.  ``env_param``: the env's
    constructor parameter (:func:`simfuse.reference.env_param`; None: Gymnasium's default).
    Returns a :class:`~simfuse.reference.RolloutOutputs` whose trajectory fields are ``None``
    unless asked for; flags are ``torch.bool``.
    """
    n, device = state.shape[1], state.device
    param = reference.env_param(env, env_param)
    if _use_reference(state):
        out = reference.rollout(env, state, steps, done, ep_return, episode, seed=seed, offset=offset,
                                num_steps=num_steps,
                                autoreset=autoreset, max_episode_steps=max_episode_steps, policy=policy,
                                env_param=env_param, dtype=torch.float32)
        return _select_reference(out, env, write_obs, write_step, write_final, write_stats)
    backend.check_devices(state=state, steps=steps, done=done, ep_return=ep_return, episode=episode,
                          actions=policy if isinstance(policy, torch.Tensor) else None)
    from .kernels.rollout import rollout_kernel

    k = num_steps
    f32 = {"dtype": torch.float32, "device": device}
    if isinstance(policy, str):
        kind, given, mlp = "random", state, None
    elif isinstance(policy, torch.Tensor):
        kind, given, mlp = "given", policy.contiguous(), None
    else:
        kind, given, mlp = "mlp", state, policy
    action_dtype = torch.int32 if env.discrete else torch.float32
    obs = torch.empty((k, n, env.obs_dim), **f32) if write_obs else None
    actions = torch.empty((k, n), dtype=action_dtype, device=device) if write_obs else None
    rewards = torch.empty((k, n), **f32) if write_step else None
    terminated = torch.empty((k, n), dtype=torch.uint8, device=device) if write_step else None
    truncated = torch.empty((k, n), dtype=torch.uint8, device=device) if write_step else None
    log_probs = torch.empty((k, n), **f32) if mlp is not None else None
    values = torch.empty((k, n), **f32) if mlp is not None and mlp.critic is not None else None
    final_obs = torch.empty((k, n, env.obs_dim), **f32) if write_final else None
    next_obs = torch.empty((n, env.obs_dim), **f32)
    episodes = torch.empty(n, dtype=torch.int32, device=device) if write_stats else None
    return_sum = torch.empty(n, **f32) if write_stats else None
    length_sum = torch.empty(n, dtype=torch.int32, device=device) if write_stats else None

    if mlp is not None:
        actor, critic = mlp.packed(device)
        a_shape, c_shape = mlp.actor_shape, mlp.critic_shape or mlp.actor_shape
        critic = critic if critic is not None else actor
        dims = {"D_PAD": a_shape.in_pad, "A_HIDDEN": a_shape.hidden, "A_ACTS": a_shape.activations,
                "A_WIDTH": a_shape.width, "A_PAD": a_shape.out_pad, "C_HIDDEN": c_shape.hidden,
                "C_ACTS": c_shape.activations, "C_WIDTH": c_shape.width, "C_PAD": c_shape.out_pad,
                "DOT_PRECISION": mlp.dot_precision, "FAST": mlp.fast}
        log_std = mlp.log_std_tensor(device)  # read by the kernel: no host synchronisation
    else:
        actor = critic = (state,) * 6
        dims = {"D_PAD": 16, "A_HIDDEN": 0, "A_ACTS": 0, "A_WIDTH": 16, "A_PAD": 16, "C_HIDDEN": 0, "C_ACTS": 0,
                "C_WIDTH": 16, "C_PAD": 16, "DOT_PRECISION": "ieee", "FAST": False}
        log_std = state
    dummy = state
    if n:
        precision = None if mlp is None else mlp.precision
        block = block_size(n, device, mlp=mlp is not None, precision=precision)
        rollout_kernel[(cdiv(n, block),)](
            state, steps, done, ep_return, episode,
            given,
            _or(obs, dummy), _or(actions, dummy), _or(rewards, dummy), _or(terminated, dummy), _or(truncated, dummy),
            _or(log_probs, dummy), _or(values, dummy), _or(final_obs, dummy), next_obs,
            _or(episodes, dummy), _or(return_sum, dummy), _or(length_sum, dummy),
            *actor, *critic,
            log_std, float(env.action_low), float(env.action_high), param,
            n, k, max_episode_steps, seed, offset,
            ENV=env.kernel_id, OBS_DIM=env.obs_dim, NUM_ACTIONS=env.num_actions,
            POLICY=POLICY_IDS[kind], AUTORESET=autoreset,
            WRITE_OBS=write_obs, WRITE_STEP=write_step, WRITE_FINAL=write_final, WRITE_STATS=write_stats,
            HAS_CRITIC=mlp is not None and mlp.critic is not None,
            GROUPED=kind == "random" and _tuning.group_random_draws,
            # MLP policies below 64 envs per program carry no start states from step to step: they
            # take registers the operand tiles need (final run: float32 products 12x slower, tf32
            # and bf16 1.15x slower at 4,096 envs; unchanged at 64 envs per program and more)
            AHEAD=mlp is None or (mlp.fast and block >= 64),
            TWO_AHEAD=block < 64 if _tuning.two_start_states_ahead is None else _tuning.two_start_states_ahead,
            BLOCK=block,
            **dims, **_launch_options(block, mlp=mlp is not None, precision=precision),
        )
    as_bool = (lambda t: None if t is None else t.view(torch.bool))
    return reference.RolloutOutputs(
        obs=obs, actions=actions, rewards=rewards, terminated=as_bool(terminated), truncated=as_bool(truncated),
        log_probs=log_probs, values=values, final_obs=final_obs, next_obs=next_obs,
        episodes=episodes, return_sum=return_sum, length_sum=length_sum,
    )


def _or(tensor: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    return dummy if tensor is None else tensor


def _select_reference(out: reference.RolloutOutputs, env: EnvDef, write_obs: bool, write_step: bool,
                      write_final: bool, write_stats: bool) -> reference.RolloutOutputs:
    """Give the reference's outputs the kernel's dtypes and drop what was not asked for."""
    action_dtype = torch.int32 if env.discrete else torch.float32
    f32 = (lambda t: None if t is None else t.to(torch.float32))
    return reference.RolloutOutputs(
        obs=f32(out.obs) if write_obs else None,
        actions=out.actions.to(action_dtype) if write_obs else None,
        rewards=f32(out.rewards) if write_step else None,
        terminated=out.terminated if write_step else None,
        truncated=out.truncated if write_step else None,
        log_probs=f32(out.log_probs), values=f32(out.values),
        final_obs=f32(out.final_obs) if write_final else None,
        next_obs=f32(out.next_obs),
        episodes=out.episodes if write_stats else None,
        return_sum=f32(out.return_sum) if write_stats else None,
        length_sum=out.length_sum if write_stats else None,
    )


def chain_launch(num_links: int) -> tuple[int, dict]:
    """Envs per program and launch options of the tile-state kernel: one warp, the link axis within threads.

    The [L_PAD, BLOCK] tiles put an env's links in the registers of one thread, up to
    ``chain_links_per_thread`` (32) of them, and 2, 4 or 8 threads of the warp share 64, 128 or
    256: a step's two row sums are in-thread additions (then at most three shuffles) and its
    per-env work (policy draw, flags, counters) is done once per env.  32 links per thread
    take 150-250 registers (sm_90) and no spills; 64 spill (0.8-0.9 KB of stack); 16 (~140
    registers) measured 1.17x slower than 32 at S = 64 on an H200 (1.312 ms against 1.126).  The
    previous layout ([BLOCK, L] tiles, links across 16 threads) took 18-30 SASS instructions
    per element-step and measured 1.6-2.6 ps per element-step on an H200 (S = 16 .. 256).
    """
    links = next_power_of_2(num_links)
    threads_per_env = max(1, links // _tuning.chain_links_per_thread)
    return 32 // threads_per_env, {"num_warps": 1, "enable_fp_fusion": False}


def chain_reset(state: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, ep_return: torch.Tensor,
                episode: torch.Tensor, *, seed: int, restart: bool, reset_mask: torch.Tensor | None = None
                ) -> torch.Tensor:
    """Draw tile-state start states (all, or where ``reset_mask``) in place; return observations [N, 2L].

    ``state`` [2L, N] float32 (env-contiguous rows); ``episode`` and ``restart`` as for :func:`reset`.
    """
    links, n = state.shape[0] // 2, state.shape[1]
    if _use_reference(state):
        state = state.T
        chosen = torch.ones(n, dtype=torch.bool, device=state.device) if reset_mask is None else reset_mask.bool()
        index = torch.zeros_like(episode) if restart else episode + 1
        fresh = reference.chain_start_angles(seed, np.arange(n), index.cpu().numpy(), links).to(state.device)
        fresh = torch.cat([fresh, torch.zeros_like(fresh)], 1)
        state.copy_(torch.where(chosen[:, None], fresh, state))
        episode.copy_(torch.where(chosen, index, episode))
        steps.masked_fill_(chosen, 0)
        done.masked_fill_(chosen, 0)
        ep_return.masked_fill_(chosen, 0.0)
        return state.clone()
    from .kernels.chain import chain_reset_kernel

    block, options = chain_launch(links)
    chain_reset_kernel[(cdiv(n, block),)](
        state, steps, done, ep_return, episode, reset_mask if reset_mask is not None else done, n, seed,
        L=links, HAS_MASK=reset_mask is not None, RESTART=restart, BLOCK=block,
        **options,
    )
    # a copy: [2L, 1]ᵀ is already contiguous, and .contiguous() would return the state itself
    return state.T.clone(memory_format=torch.contiguous_format)


def chain_rollout(state: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, ep_return: torch.Tensor,
                  episode: torch.Tensor, *,
                  seed: int, offset: int, num_steps: int, autoreset: int, max_episode_steps: int, policy,
                  model: int = 0, write_obs: bool = True, write_step: bool = True, write_final: bool = False,
                  write_stats: bool = False) -> reference.RolloutOutputs:
    """K steps of every env of a tile-state model in one launch (``state`` [2L, N] float32, updated in place).

    ``model``: 0 PendulumChain-v0, 1 OscillatorSwarm-v0; ``policy``: ``"random"`` or float32
    actions [K, N]; outputs as for :func:`rollout` (observations [K, N, 2L]).
    """
    links, n = state.shape[0] // 2, state.shape[1]
    device, k = state.device, num_steps
    if _use_reference(state):
        out = reference.chain_rollout(state.T, steps, done, ep_return, episode, seed=seed, offset=offset, num_steps=k,
                                      autoreset=autoreset, max_episode_steps=max_episode_steps, policy=policy,
                                      model=model, dtype=torch.float32)
        return _select_reference(out, _CHAIN_LIKE, write_obs, write_step, write_final, write_stats)
    backend.check_devices(state=state, steps=steps, done=done, ep_return=ep_return, episode=episode,
                          actions=policy if isinstance(policy, torch.Tensor) else None)
    from .kernels.chain import chain_rollout_kernel

    f32 = {"dtype": torch.float32, "device": device}
    # observations are stored link-major, [K, 2L, N] and [2L, N], as the kernel's tiles hold them
    # (a row-major store would lead the compiler to spread each env's links over threads in the
    # step loop too); they are returned as [K, N, 2L] and [N, 2L] views
    obs = torch.empty((k, 2 * links, n), **f32).transpose(1, 2) if write_obs else None
    actions = torch.empty((k, n), **f32) if write_obs else None
    rewards = torch.empty((k, n), **f32) if write_step else None
    terminated = torch.empty((k, n), dtype=torch.uint8, device=device) if write_step else None
    truncated = torch.empty((k, n), dtype=torch.uint8, device=device) if write_step else None
    final_obs = torch.empty((k, 2 * links, n), **f32).transpose(1, 2) if write_final else None
    next_obs = torch.empty((2 * links, n), **f32).T
    episodes = torch.empty(n, dtype=torch.int32, device=device) if write_stats else None
    return_sum = torch.empty(n, **f32) if write_stats else None
    length_sum = torch.empty(n, dtype=torch.int32, device=device) if write_stats else None
    given = isinstance(policy, torch.Tensor)
    if n:
        block, options = chain_launch(links)
        chain_rollout_kernel[(cdiv(n, block),)](
            state, steps, done, ep_return, episode, policy.contiguous() if given else state,
            _or(obs, state), _or(actions, state), _or(rewards, state), _or(terminated, state), _or(truncated, state),
            _or(final_obs, state), next_obs, _or(episodes, state), _or(return_sum, state), _or(length_sum, state),
            n, k, max_episode_steps, seed, offset,
            L=links, L_PAD=next_power_of_2(links), MODEL=model, GIVEN=given, AUTORESET=autoreset,
            WRITE_OBS=write_obs,
            WRITE_STEP=write_step, WRITE_FINAL=write_final, WRITE_STATS=write_stats, BLOCK=block,
            **options,
        )
    as_bool = (lambda t: None if t is None else t.view(torch.bool))
    return reference.RolloutOutputs(
        obs=obs, actions=actions, rewards=rewards, terminated=as_bool(terminated), truncated=as_bool(truncated),
        log_probs=None, values=None, final_obs=final_obs, next_obs=next_obs,
        episodes=episodes, return_sum=return_sum, length_sum=length_sum,
    )


_CHAIN_LIKE = EnvDef("PendulumChain", -1, 0, (), (), 0, -1.0, 1.0, 0, None)
