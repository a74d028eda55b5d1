"""The configurable-complexity simulator: a chain of L pendulums coupled through their mean angle.

Env i holds L angles θ_j and angular velocities ω_j (state size 2L, set by the caller) and
one action a ∈ [−1, 1], a torque 2a on pendulum 0.  One semi-implicit Euler step (dt = 0.05)::

    θ̄   = (1/L) Σ_j θ_j
    α_j = −10 sin θ_j + 2 (θ̄ − θ_j) − 0.05 ω_j + 2 a [j = 0]
    ω_j' = ω_j + dt α_j,    θ_j' = θ_j + dt ω_j'
    r   = −(1/L) Σ_j norm(θ_j')²,   norm(θ) = ((θ + π) mod 2π) − π

No termination (truncation by the step limit).  Start state θ_j ~ U[−0.5, 0.5), ω_j = 0, with
θ_j of env i in its e-th episode drawn from Philox (seed, stream i + ((16 + j) << 32), e).  Observation:
(θ_0..θ_{L−1}, ω_0..ω_{L−1}).

The arithmetic and the bytes per step both grow with L: an unfused step reads and writes the
[N, 2L] state several times (one kernel per operation), the fused rollout keeps the state in
registers and writes 8L B of observation (or nothing but statistics) per env-step.  That is
the knob for Gleeson et al.'s curve of fusion speedup against memory traffic.

Layout (this file runs both tile-state models, :mod:`.swarm`'s too): a program is one warp
and holds [L_PAD, BLOCK] tiles whose link axis runs within a thread: up to 32 links of an env
in one thread's registers (BLOCK = 32 envs), 2, 4 or 8 threads of the warp sharing the
links of L_PAD = 64, 128 or 256 (BLOCK = 16, 8, 4).  So a step's two row sums are in-thread
additions (then at most three shuffles) and the per-env work of a step (a quarter of a Philox
call for the policy, flags, counters, statistics: ~60 instructions) is done once per env.
Memory is link-major to match: the state [2L, N] and the observations [K, 2L, N] (returned
as [K, N, 2L] views), so each warp's access to one link is a single line, and a row-major
store would lead the compiler to spread the links over threads in the step loop as well.
Resets come only from truncation, so the steps at which some env of the block resets are
known from the counters (:func:`steps_to_reset`): no other step tests anything across envs,
and at those steps the start states are drawn link by link (:func:`store_start_states`).
Counted in the sm_90 SASS of the step loop (triton 3.6 and 3.9 alike, OscillatorSwarm-v0,
statistics only): 65 instructions per env-step at L = 1, 22 per element-step at 4, 10 at 16,
8 at 32, 8.5 at 64 (two threads per env); 152-250 registers from L = 32 on, no spills.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.compiler import unhoisted
from fusecore.rng import uniform4

from .draws import policy_draws, select_draw
from .episode import NEXT_STEP, SAME_STEP, autoreset_flags, load_counters, store_counters, store_step, track_episode
from .swarm import swarm_step

RESET_STREAM: tl.constexpr = tl.constexpr(16)
PI: tl.constexpr = tl.constexpr(3.141592653589793)
TWO_PI: tl.constexpr = tl.constexpr(6.283185307179586)
DISABLED: tl.constexpr = tl.constexpr(2)
# the tile-state models this kernel runs (MODEL)
PENDULUM_CHAIN: tl.constexpr = tl.constexpr(0)
OSCILLATOR_SWARM: tl.constexpr = tl.constexpr(1)


@jit
def chain_envs(n, BLOCK: tl.constexpr):
    """This program's env ids (int64 [BLOCK]) and mask."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return idx, idx < n


@jit
def row_offsets(first_row, row_stride, idx, L_PAD: tl.constexpr):
    """Offsets [L_PAD, BLOCK] (int64) of rows ``first_row + j`` and columns ``idx`` of a [*, N] tensor.

    ``row_stride`` is N.  The state [2L, N] and the trajectory's
    observations [K, 2L, N] are stored link-major, so each warp's access to one link is one
    line and a thread's registers hold its env's links.
    """
    link = tl.arange(0, L_PAD)[:, None].to(tl.int64)
    return (first_row + link) * row_stride + idx[None, :]


@jit
def store_rows(ptr, at, at_omega, theta, omega, tile_mask):
    """Store θ and ω tiles at offsets ``at`` and ``at_omega`` (the rows L further on)."""
    tl.store(ptr + at, theta, mask=tile_mask)
    tl.store(ptr + at_omega, omega, mask=tile_mask)


@jit
def store_start_states(state_ptr, seed, idx, episode, chosen, n, L: tl.constexpr):
    """Write start state number ``episode`` (int32 [BLOCK]) of the ``chosen`` envs into the [2L, N] state.

    θ_j ~ U[−0.5, 0.5) from Philox (seed, stream i + ((16 + j) << 32), episode), ω_j = 0.  One
    link per iteration of a loop: a single Philox call is live at a time, where drawing a
    whole [L, BLOCK] tile at once keeps L of them in registers (spills from L = 64 on).
    """
    for j in range(L):
        link = tl.cast(j, tl.int64)  # int64: 2L N may exceed 2**31
        u, _u1, _u2, _u3 = uniform4(seed, idx + ((RESET_STREAM + link) << 32), episode)
        tl.store(state_ptr + link * n + idx, u * 1.0 - 0.5, mask=chosen)
        tl.store(state_ptr + (L + link) * n + idx, tl.zeros_like(u), mask=chosen)


@jit
def chain_step(theta, omega, action, L: tl.constexpr, L_PAD: tl.constexpr):
    """One step of every chain: θ, ω [L_PAD, BLOCK], action [BLOCK]; returns (θ', ω', reward)."""
    link = tl.arange(0, L_PAD)[:, None]
    valid = link < L
    mean = tl.sum(tl.where(valid, theta, 0.0), axis=0) * (1.0 / L)
    torque = tl.where(link == 0, 2.0 * tl.minimum(tl.maximum(action, -1.0), 1.0)[None, :], 0.0)
    alpha = -10.0 * tl.sin(theta) + 2.0 * (mean[None, :] - theta) - 0.05 * omega + torque
    omega = tl.where(valid, omega + 0.05 * alpha, 0.0)
    theta = tl.where(valid, theta + 0.05 * omega, 0.0)
    shifted = theta + PI
    normalized = shifted - tl.floor(shifted / TWO_PI) * TWO_PI - PI
    reward = -tl.sum(tl.where(valid, normalized * normalized, 0.0), axis=0) * (1.0 / L)
    return theta, omega, reward


@jit
def steps_to_reset(steps, done_prev, mask, max_episode_steps, num_steps, AUTORESET: tl.constexpr):
    """Steps from the next one until the first env of the block resets (at most ``num_steps``), from its counters.

    The tile-state models never terminate, so each env's resets follow from its step counter
    alone: NEXT_STEP resets the step after the truncation (at once when ``done_prev``),
    SAME_STEP at the truncation step itself, DISABLED never.
    """
    to_truncation = tl.maximum(max_episode_steps - 1 - steps, 0)
    if AUTORESET == NEXT_STEP:
        ahead = tl.where(done_prev, 0, tl.minimum(to_truncation, num_steps) + 1)
    elif AUTORESET == SAME_STEP:
        ahead = to_truncation
    else:
        ahead = tl.zeros_like(steps) + num_steps
    return tl.min(tl.where(mask, tl.minimum(ahead, num_steps), num_steps), axis=0)


@jit(do_not_specialize=["n", "num_steps", "max_episode_steps", "seed", "offset"])
def chain_rollout_kernel(
    state_ptr, steps_ptr, done_ptr, ep_return_ptr, episode_ptr, given_actions_ptr,
    obs_out_ptr, action_out_ptr, reward_out_ptr, terminated_out_ptr, truncated_out_ptr, final_obs_out_ptr,
    next_obs_out_ptr,
    episodes_ptr, return_sum_ptr, length_sum_ptr,
    n, num_steps, max_episode_steps, seed, offset,
    L: tl.constexpr, L_PAD: tl.constexpr, MODEL: tl.constexpr, GIVEN: tl.constexpr, AUTORESET: tl.constexpr,
    WRITE_OBS: tl.constexpr, WRITE_STEP: tl.constexpr, WRITE_FINAL: tl.constexpr, WRITE_STATS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """K steps of BLOCK envs of a tile-state model (MODEL: PendulumChain-v0 or OscillatorSwarm-v0).

    State [2L, N] (θ then ω, or x then v, env-contiguous rows); observations [*, N, 2L]; the
    same semantics as the classic rollout.  Start states (L Philox calls per env) are drawn
    only at the steps where some env of the block resets, known ahead from the counters
    (:func:`steps_to_reset`), so the other steps test nothing across envs.
    """
    idx, mask = chain_envs(n, BLOCK)
    link = tl.arange(0, L_PAD)[:, None]
    tile_mask = (link < L) & mask[None, :]
    theta = tl.zeros([L_PAD, BLOCK], dtype=tl.float32)
    omega = theta
    if n > 0:  # (always) offsets computed in a region of their own are not kept for the stores at the end
        at = row_offsets(0, n, idx, L_PAD)
        theta = tl.load(state_ptr + at, mask=tile_mask, other=0.0)
        omega = tl.load(state_ptr + at + L * n, mask=tile_mask, other=0.0)
    steps, done_prev, ep_return, episodes, return_sum, length_sum = load_counters(
        steps_ptr, done_ptr, ep_return_ptr, idx, mask, BLOCK)
    episode = tl.load(episode_ptr + idx, mask=mask, other=0)
    next_reset = steps_to_reset(steps, done_prev, mask, max_episode_steps, num_steps, AUTORESET)
    d0 = tl.zeros([BLOCK], dtype=tl.float32)
    d1 = d0
    d2 = d0
    d3 = d0
    for t in range(num_steps):
        position = offset + t
        row = tl.cast(t, tl.int64) * n + idx  # int64: K N may exceed 2**31
        if GIVEN:
            action = tl.load(given_actions_ptr + row, mask=mask, other=0.0)
        else:
            if (t == 0) | (position % 4 == 0):
                d0, d1, d2, d3 = policy_draws(seed, idx, position // 4, False)
            action = select_draw(d0, d1, d2, d3, position % 4) * 2.0 - 1.0
        if WRITE_OBS | WRITE_FINAL:
            row_stride = unhoisted(n, steps_ptr)
        if WRITE_OBS:
            at = row_offsets(tl.cast(t, tl.int64) * (2 * L), row_stride, idx, L_PAD)
            store_rows(obs_out_ptr, at, at + L * row_stride, theta, omega, tile_mask)
            tl.store(action_out_ptr + row, action, mask=mask)
        if MODEL == OSCILLATOR_SWARM:
            theta, omega, reward = swarm_step(theta, omega, action, L, L_PAD)
        else:
            theta, omega, reward = chain_step(theta, omega, action, L, L_PAD)
        length = steps + 1
        never = tl.zeros([BLOCK], dtype=tl.int1)  # the chain never terminates
        reward, terminated, truncated, steps, done_prev, resetting = autoreset_flags(
            reward, never, length >= max_episode_steps, length, done_prev, AUTORESET)
        if WRITE_FINAL:
            at = row_offsets(tl.cast(t, tl.int64) * (2 * L), row_stride, idx, L_PAD)
            store_rows(final_obs_out_ptr, at, at + L * row_stride, theta, omega, tile_mask)
        if t == next_reset:
            # the fresh start states go through this program's columns of the state buffer
            # (rewritten at the end anyway): drawn link by link, loaded as a tile
            store_start_states(state_ptr, seed, idx, episode + 1, resetting & mask, n, L)
            tl.debug_barrier()  # the tile's threads read values other threads of the warp wrote
            at = row_offsets(0, unhoisted(n, steps_ptr), idx, L_PAD)
            theta = tl.where(resetting[None, :], tl.load(state_ptr + at, mask=tile_mask, other=0.0), theta)
            omega = tl.where(resetting[None, :], 0.0, omega)
            episode += resetting.to(tl.int32)
            next_reset = t + 1 + steps_to_reset(steps, done_prev, mask, max_episode_steps, num_steps, AUTORESET)
        ep_return, episodes, return_sum, length_sum = track_episode(
            ep_return, episodes, return_sum, length_sum, reward, truncated, length, WRITE_STATS)
        if WRITE_STEP:
            store_step(reward_out_ptr, terminated_out_ptr, truncated_out_ptr, row, mask, reward, terminated, truncated)
    at = row_offsets(0, n, idx, L_PAD)
    store_rows(state_ptr, at, at + L * n, theta, omega, tile_mask)
    store_counters(steps_ptr, done_ptr, ep_return_ptr, episodes_ptr, return_sum_ptr, length_sum_ptr, idx, mask,
                   steps, done_prev, ep_return, episodes, return_sum, length_sum, WRITE_STATS)
    tl.store(episode_ptr + idx, episode, mask=mask)
    store_rows(next_obs_out_ptr, at, at + L * n, theta, omega, tile_mask)


@jit(do_not_specialize=["n", "seed"])
def chain_reset_kernel(state_ptr, steps_ptr, done_ptr, ep_return_ptr, episode_ptr, reset_mask_ptr, n, seed,
                       L: tl.constexpr, HAS_MASK: tl.constexpr, RESTART: tl.constexpr, BLOCK: tl.constexpr):
    """Draw start states (all envs, or those with ``reset_mask`` set): the next one, or number 0 with RESTART."""
    idx, mask = chain_envs(n, BLOCK)
    chosen = mask
    if HAS_MASK:
        chosen = mask & (tl.load(reset_mask_ptr + idx, mask=mask, other=0) != 0)
    episode = tl.zeros([BLOCK], dtype=tl.int32)
    if not RESTART:
        episode = tl.load(episode_ptr + idx, mask=mask, other=0) + 1
    store_start_states(state_ptr, seed, idx, episode, chosen, n, L)
    tl.store(steps_ptr + idx, tl.zeros([BLOCK], dtype=tl.int32), mask=chosen)
    tl.store(done_ptr + idx, tl.zeros([BLOCK], dtype=tl.uint8), mask=chosen)
    tl.store(ep_return_ptr + idx, tl.zeros([BLOCK], dtype=tl.float32), mask=chosen)
    tl.store(episode_ptr + idx, episode, mask=chosen)
