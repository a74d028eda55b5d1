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
[N, 2L] state several times (one kernel per operation), the fused rollout keeps the
[BLOCK, L] tiles in registers and writes 8L B of observation (or nothing but statistics) per
env-step.  That is the knob for Gleeson et al.'s curve of fusion speedup against memory traffic.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.rng import uniform4

from .draws import policy_draws, select_draw
from .episode import autoreset_flags, load_counters, store_counters, store_step, track_episode
from .swarm import swarm_step

RESET_STREAM: tl.constexpr = tl.constexpr(16)
PI: tl.constexpr = tl.constexpr(3.141592653589793)
TWO_PI: tl.constexpr = tl.constexpr(6.283185307179586)
DISABLED: tl.constexpr = tl.constexpr(2)
# the tile-state models this kernel runs (MODEL)
PENDULUM_CHAIN: tl.constexpr = tl.constexpr(0)
OSCILLATOR_SWARM: tl.constexpr = tl.constexpr(1)


@jit
def chain_tile(n, L: tl.constexpr, L_PAD: tl.constexpr, BLOCK: tl.constexpr):
    """This program's chains: (env ids, env mask, link ids [1, L_PAD], tile mask, offsets of θ in [N, 2L])."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    col = tl.arange(0, L_PAD)[None, :]
    return idx, mask, col, mask[:, None] & (col < L), idx[:, None] * (2 * L) + col


@jit
def chain_reset(seed, idx, episode, L: tl.constexpr, L_PAD: tl.constexpr):
    """Start angles [BLOCK, L_PAD] of episode ``episode`` (int32 [BLOCK]): U[−0.5, 0.5), one Philox stream per link."""
    col = tl.arange(0, L_PAD)[None, :].to(tl.int64)
    stream = idx[:, None] + ((RESET_STREAM + col) << 32)
    u, _u1, _u2, _u3 = uniform4(seed, stream, episode[:, None] + tl.zeros_like(stream))
    return tl.where(col < L, u * 1.0 - 0.5, 0.0)  # padding columns stay zero


@jit
def chain_step(theta, omega, action, L: tl.constexpr, L_PAD: tl.constexpr):
    """One step of every chain: θ, ω [BLOCK, L_PAD], action [BLOCK]; returns (θ', ω', reward)."""
    col = tl.arange(0, L_PAD)[None, :]
    valid = col < L
    mean = tl.sum(tl.where(valid, theta, 0.0), axis=1) / L
    torque = tl.where(col == 0, 2.0 * tl.minimum(tl.maximum(action, -1.0), 1.0)[:, None], 0.0)
    alpha = -10.0 * tl.sin(theta) + 2.0 * (mean[:, None] - theta) - 0.05 * omega + torque
    omega = tl.where(valid, omega + 0.05 * alpha, 0.0)
    theta = tl.where(valid, theta + 0.05 * omega, 0.0)
    shifted = theta + PI
    normalized = shifted - tl.floor(shifted / TWO_PI) * TWO_PI - PI
    reward = -tl.sum(tl.where(valid, normalized * normalized, 0.0), axis=1) / L
    return theta, omega, reward


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

    State [N, 2L] row-major (θ then ω, or x then v); the same semantics as the classic rollout.
    """
    idx, mask, col, tile_mask, base = chain_tile(n, L, L_PAD, BLOCK)
    theta = tl.load(state_ptr + base, mask=tile_mask, other=0.0)
    omega = tl.load(state_ptr + base + L, mask=tile_mask, other=0.0)
    steps, done_prev, ep_return, episodes, return_sum, length_sum = load_counters(
        steps_ptr, done_ptr, ep_return_ptr, idx, mask, BLOCK)
    episode = tl.load(episode_ptr + idx, mask=mask, other=0)
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
        if WRITE_OBS:
            obs_at = row[:, None] * (2 * L) + col
            tl.store(obs_out_ptr + obs_at, theta, mask=tile_mask)
            tl.store(obs_out_ptr + obs_at + L, omega, mask=tile_mask)
            tl.store(action_out_ptr + row, action, mask=mask)
        if MODEL == OSCILLATOR_SWARM:
            new_theta, new_omega, reward = swarm_step(theta, omega, action, L, L_PAD)
        else:
            new_theta, new_omega, reward = chain_step(theta, omega, action, L, L_PAD)
        length = steps + 1
        never = tl.zeros([BLOCK], dtype=tl.int1)  # the chain never terminates
        reward, terminated, truncated, steps, done_prev, resetting = autoreset_flags(
            reward, never, length >= max_episode_steps, length, done_prev, AUTORESET)
        if WRITE_FINAL:
            final_at = row[:, None] * (2 * L) + col
            tl.store(final_obs_out_ptr + final_at, new_theta, mask=tile_mask)
            tl.store(final_obs_out_ptr + final_at + L, new_omega, mask=tile_mask)
        # start states are L Philox calls per env: drawn, and selected element by element, only
        # when some env of the block resets
        theta = new_theta
        omega = new_omega
        if tl.max((resetting & mask).to(tl.int32), axis=0) > 0:
            theta = tl.where(resetting[:, None], chain_reset(seed, idx, episode + 1, L, L_PAD), new_theta)
            omega = tl.where(resetting[:, None], 0.0, new_omega)
        episode += resetting.to(tl.int32)
        ep_return, episodes, return_sum, length_sum = track_episode(
            ep_return, episodes, return_sum, length_sum, reward, truncated, length, WRITE_STATS)
        if WRITE_STEP:
            store_step(reward_out_ptr, terminated_out_ptr, truncated_out_ptr, row, mask, reward, terminated, truncated)
    tl.store(state_ptr + base, theta, mask=tile_mask)
    tl.store(state_ptr + base + L, omega, mask=tile_mask)
    store_counters(steps_ptr, done_ptr, ep_return_ptr, episodes_ptr, return_sum_ptr, length_sum_ptr, idx, mask,
                   steps, done_prev, ep_return, episodes, return_sum, length_sum, WRITE_STATS)
    tl.store(episode_ptr + idx, episode, mask=mask)
    tl.store(next_obs_out_ptr + base, theta, mask=tile_mask)
    tl.store(next_obs_out_ptr + base + L, omega, mask=tile_mask)


@jit(do_not_specialize=["n", "seed"])
def chain_reset_kernel(state_ptr, steps_ptr, done_ptr, ep_return_ptr, episode_ptr, reset_mask_ptr, n, seed,
                       L: tl.constexpr, L_PAD: tl.constexpr, HAS_MASK: tl.constexpr, RESTART: tl.constexpr,
                       BLOCK: tl.constexpr):
    """Draw start states (all envs, or those with ``reset_mask`` set): the next one, or number 0 with RESTART."""
    idx, mask, col, tile_mask, base = chain_tile(n, L, L_PAD, BLOCK)
    chosen = mask
    if HAS_MASK:
        chosen = mask & (tl.load(reset_mask_ptr + idx, mask=mask, other=0) != 0)
    episode = tl.zeros([BLOCK], dtype=tl.int32)
    if not RESTART:
        episode = tl.load(episode_ptr + idx, mask=mask, other=0) + 1
    theta = chain_reset(seed, idx, episode, L, L_PAD)
    write = tile_mask & chosen[:, None]
    tl.store(state_ptr + base, theta, mask=write)
    tl.store(state_ptr + base + L, tl.zeros_like(theta), mask=write)
    tl.store(steps_ptr + idx, tl.zeros([BLOCK], dtype=tl.int32), mask=chosen)
    tl.store(done_ptr + idx, tl.zeros([BLOCK], dtype=tl.uint8), mask=chosen)
    tl.store(ep_return_ptr + idx, tl.zeros([BLOCK], dtype=tl.float32), mask=chosen)
    tl.store(episode_ptr + idx, episode, mask=chosen)
