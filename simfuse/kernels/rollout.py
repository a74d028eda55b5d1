"""The fused rollout: K environment steps, the policy, the random numbers and the auto-reset in one launch.

Program p owns envs ``[p BLOCK, (p + 1) BLOCK)``.  It loads each env's state (four float32),
step counter, "done at the previous step" flag, running episode return and episode index
once, runs ``num_steps`` steps with everything in registers, and stores them back once.
Step t of env i, at global random position p = offset + t:

1. o_t = observe(s_t); the action a_t is the caller's (POLICY 1), uniform (0) or sampled from
   the MLP (2).  Both draw lane p % 4 of Philox (seed, POLICY_TAG + i, p // 4) (uniforms, or
   Box-Muller normals for a Gaussian head): one Philox call per four steps;
2. (s', r_t, terminated_t) = step(s_t, a_t); steps += 1; truncated_t = steps >= max_episode_steps;
3. auto-reset: NEXT_STEP (0): an env done at step t − 1 is reset instead of stepped (r = 0,
   flags False); SAME_STEP (1): an env done at step t is reset after the step, its final
   observation optionally written; DISABLED (2): no reset.  Env i's e-th start state (e = 0
   at ``reset(seed=...)``) is Philox (seed, RESET_TAG + i, e): it does not depend on when the
   reset happens, so every env's next start state is drawn ahead, with the policy draws (one
   Philox call per four steps, off the step's dependency chain instead of one per step or a
   branch per step), and drawn again only for an env that resets twice before the next draw
   (TWO_AHEAD, NEXT_STEP: the next two are drawn, enough since a reset step is never
   followed by another, and no step needs a test).

With GROUPED (random policy) the steps whose positions share one Philox call run as an
unrolled group of four: one basic block per group for the compiler to schedule.  Per
CartPole step that is ~150 SASS instructions on sm_90 (down from ~250 with libdevice sin/cos
and per-step draws).

Written per env-step (each optional): o_t [K, N, OBS_DIM] (4 OBS_DIM B), a_t [K, N] (4 B),
r_t (4 B), terminated_t and truncated_t (1 B each), log π(a_t | o_t) and V(o_t) (4 B each),
the final observation (SAME_STEP); per env once: 28 B of state read and written, the next
observation, and the episode statistics (completed episodes, their returns and lengths).
With only statistics written the kernel moves O(N) bytes whatever K: compute-bound.

The single-step launcher is this kernel with K = 1 and the caller's actions, so ``step()``
and ``rollout()`` share every line of the dynamics and agree bit for bit on one random stream.
"""

import triton.language as tl

from fusecore.backend import jit

from .dispatch import env_observe, env_reset, env_step, obs_tile
from .draws import policy_draws, select_draw
from .episode import NEXT_STEP, autoreset_flags, load_counters, store_counters, store_step, track_episode
from .policy import column, mlp_forward, sample_categorical, sample_gaussian

RANDOM: tl.constexpr = tl.constexpr(0)
GIVEN: tl.constexpr = tl.constexpr(1)
MLP: tl.constexpr = tl.constexpr(2)
DISABLED: tl.constexpr = tl.constexpr(2)


@jit
def state_row(row, n, idx):
    """Offsets of row ``row`` of the [4, n] state (env-contiguous rows) for env ids ``idx``, in int64: ``row · n``
    exceeds 2**31 from 715 827 882 envs on (``n`` arrives as an int32 below 2**31)."""
    return (tl.full([], 0, tl.int64) + n) * row + idx


@jit
def store_pair(at, a, b, mask):
    """Write (a, b) to ``at`` and ``at + 1``: joined, each env's pair is one 8-byte store."""
    col = tl.arange(0, 2)[None, :]
    tl.store(at[:, None] + col, tl.join(a, b), mask=mask[:, None])


@jit
def store_obs(ptr, row, mask, o0, o1, o2, o3, o4, o5, OBS_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """Write observations of rows ``row`` (int64 [BLOCK]) into a row-major [*, OBS_DIM] float32 tensor.

    With a warp or more of envs, the components are joined along a new innermost axis, which
    keeps each env's values in its own thread: one 16-byte (OBS_DIM 4) or 8-byte (2, 6) store
    per env and pair, with no shuffle of the tile through shared memory.  With fewer envs than
    a warp has lanes, the joined tile would hold one value per lane and be shuffled into place
    first, so component stores (one instruction each) are cheaper; odd sizes store them too.
    """
    at = ptr + row * OBS_DIM
    if (BLOCK >= 32) & (OBS_DIM == 4):
        tile = tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), [BLOCK, 4])
        tl.store(at[:, None] + tl.arange(0, 4)[None, :], tile, mask=mask[:, None])
    elif (BLOCK >= 32) & (OBS_DIM == 2):
        store_pair(at, o0, o1, mask)
    elif (BLOCK >= 32) & (OBS_DIM == 6):
        store_pair(at, o0, o1, mask)
        store_pair(at + 2, o2, o3, mask)
        store_pair(at + 4, o4, o5, mask)
    else:
        tl.store(at, o0, mask=mask)
        if OBS_DIM > 1:
            tl.store(at + 1, o1, mask=mask)
        if OBS_DIM > 2:
            tl.store(at + 2, o2, mask=mask)
        if OBS_DIM > 3:
            tl.store(at + 3, o3, mask=mask)
        if OBS_DIM > 4:
            tl.store(at + 4, o4, mask=mask)
        if OBS_DIM > 5:
            tl.store(at + 5, o5, mask=mask)


@jit
def rollout_step(
    t, draw, s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum, pending_action,
    episode, r0, r1, r2, r3, q0, q1, q2, q3, stale, idx, mask, n, num_steps, max_episode_steps, seed, env_param,
    action_low, action_high,
    given_actions_ptr, obs_out_ptr, action_out_ptr, reward_out_ptr, terminated_out_ptr, truncated_out_ptr,
    log_prob_out_ptr, value_out_ptr, final_obs_out_ptr,
    actor_w_in_ptr, actor_b_in_ptr, actor_w_hid_ptr, actor_b_hid_ptr, actor_w_out_ptr, actor_b_out_ptr,
    critic_w_in_ptr, critic_b_in_ptr, critic_w_hid_ptr, critic_b_hid_ptr, critic_w_out_ptr, critic_b_out_ptr,
    log_std_ptr,
    ENV: tl.constexpr, OBS_DIM: tl.constexpr, NUM_ACTIONS: tl.constexpr, POLICY: tl.constexpr,
    AUTORESET: tl.constexpr, WRITE_OBS: tl.constexpr, WRITE_STEP: tl.constexpr, WRITE_FINAL: tl.constexpr,
    WRITE_STATS: tl.constexpr, HAS_CRITIC: tl.constexpr, D_PAD: tl.constexpr,
    A_HIDDEN: tl.constexpr, A_ACTS: tl.constexpr, A_WIDTH: tl.constexpr, A_PAD: tl.constexpr,
    C_HIDDEN: tl.constexpr, C_ACTS: tl.constexpr, C_WIDTH: tl.constexpr, C_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, FAST: tl.constexpr, AHEAD: tl.constexpr, TWO_AHEAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Step ``t`` of the rollout (steps 1-3 of the module docstring) with this step's policy draw.

    ``r0..r3``: each env's next start state, drawn ahead (episode index ``episode`` + 1),
    ``q0..q3`` the one after (TWO_AHEAD, NEXT_STEP only); ``stale``: envs that used ``r``
    since it was drawn.  Returns the carried values (state,
    counters, statistics, the next given action, episode indices, next start states, stale).
    """
    row = tl.cast(t, tl.int64) * n + idx  # int64: K N may exceed 2**31
    o0, o1, o2, o3, o4, o5 = env_observe(s0, s1, s2, s3, ENV)
    log_prob = tl.zeros([BLOCK], dtype=tl.float32)
    if POLICY == GIVEN:
        action = pending_action
        # The next step's action is loaded one step ahead, so that its memory latency
        # overlaps this step's dynamics instead of stalling the next one.
        has_next = (tl.zeros([BLOCK], dtype=tl.int32) + t + 1) < num_steps
        pending_action = tl.load(given_actions_ptr + row + n, mask=mask & has_next, other=0).to(tl.float32)
        if NUM_ACTIONS > 0:
            action = tl.minimum(tl.maximum(action, 0.0), NUM_ACTIONS - 1.0)
    elif POLICY == RANDOM:
        if NUM_ACTIONS > 0:
            action = tl.minimum(tl.floor(draw * NUM_ACTIONS), NUM_ACTIONS - 1.0)
        else:
            action = action_low + draw * (action_high - action_low)
    else:
        x = obs_tile(o0, o1, o2, o3, o4, o5, D_PAD)
        out = mlp_forward(x, actor_w_in_ptr, actor_b_in_ptr, actor_w_hid_ptr, actor_b_hid_ptr,
                          actor_w_out_ptr, actor_b_out_ptr, A_HIDDEN, A_ACTS, D_PAD, A_WIDTH, A_PAD,
                          DOT_PRECISION, FAST)
        if NUM_ACTIONS > 0:
            action, log_prob = sample_categorical(out, draw, NUM_ACTIONS, A_PAD)
        else:
            action, log_prob = sample_gaussian(out, tl.load(log_std_ptr), draw, A_PAD)
        # The action reaches the dynamics through memory (this step's log-prob slot, an
        # L1 round trip between two barriers).  Taken from the sampling's reductions
        # directly, it leads the compiler to keep the whole env state in the tensor
        # cores' row layout, where the four threads sharing an accumulator row each
        # repeat the env's dynamics: about twice the instructions per step.
        # (FAST: the tensor-core precisions; "ieee" products keep plain layouts.)
        if FAST:
            tl.store(log_prob_out_ptr + row, action, mask=mask)
            tl.debug_barrier()
            action = tl.load(log_prob_out_ptr + row, mask=mask, other=0.0)
            tl.debug_barrier()
        tl.store(log_prob_out_ptr + row, log_prob, mask=mask)
        if HAS_CRITIC:
            value = column(
                mlp_forward(x, critic_w_in_ptr, critic_b_in_ptr, critic_w_hid_ptr, critic_b_hid_ptr,
                            critic_w_out_ptr, critic_b_out_ptr, C_HIDDEN, C_ACTS, D_PAD, C_WIDTH, C_PAD,
                            DOT_PRECISION, FAST),
                0, C_PAD,
            )
            tl.store(value_out_ptr + row, value, mask=mask)
    if WRITE_OBS:
        store_obs(obs_out_ptr, row, mask, o0, o1, o2, o3, o4, o5, OBS_DIM, BLOCK)
        tl.store(action_out_ptr + row, action.to(action_out_ptr.dtype.element_ty), mask=mask)

    n0, n1, n2, n3, reward, terminated = env_step(s0, s1, s2, s3, action, env_param, ENV)
    length = steps + 1
    truncated = length >= max_episode_steps
    reward, terminated, truncated, steps, done_prev, resetting = autoreset_flags(
        reward, terminated, truncated, length, done_prev, AUTORESET)
    if WRITE_FINAL:
        f0, f1, f2, f3, f4, f5 = env_observe(n0, n1, n2, n3, ENV)
        store_obs(final_obs_out_ptr, row, mask, f0, f1, f2, f3, f4, f5, OBS_DIM, BLOCK)
    if AUTORESET == DISABLED:
        s0, s1, s2, s3 = n0, n1, n2, n3
    else:
        if not AHEAD:
            # float32 MLP products keep their operand tiles in registers: no start state is
            # carried across steps (it spilled them), it is drawn when some env resets
            start0, start1, start2, start3 = n0, n1, n2, n3
            if tl.max((resetting & mask).to(tl.int32), axis=0) > 0:
                start0, start1, start2, start3 = env_reset(seed, idx, episode + 1, ENV)
        elif (AUTORESET == NEXT_STEP) & TWO_AHEAD:
            # A reset step is never followed by another, so an env resets at most twice in the
            # four steps between draws: its second start state is the one after, no test.
            start0 = tl.where(stale, q0, r0)
            start1 = tl.where(stale, q1, r1)
            start2 = tl.where(stale, q2, r2)
            start3 = tl.where(stale, q3, r3)
        else:
            # A second reset of an env since the start states were drawn (an episode of one or
            # two steps): draw again for every env, from the indices as they are now.
            if tl.max((resetting & stale & mask).to(tl.int32), axis=0) > 0:
                r0, r1, r2, r3 = env_reset(seed, idx, episode + 1, ENV)
                stale = tl.zeros([BLOCK], dtype=tl.int1)
            start0, start1, start2, start3 = r0, r1, r2, r3
        s0 = tl.where(resetting, start0, n0)
        s1 = tl.where(resetting, start1, n1)
        s2 = tl.where(resetting, start2, n2)
        s3 = tl.where(resetting, start3, n3)
        episode += resetting.to(tl.int32)
        stale = stale | resetting

    ep_return, episodes, return_sum, length_sum = track_episode(
        ep_return, episodes, return_sum, length_sum, reward, terminated | truncated, length, WRITE_STATS)
    if WRITE_STEP:
        store_step(reward_out_ptr, terminated_out_ptr, truncated_out_ptr, row, mask, reward, terminated, truncated)
    return (s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum, pending_action,
            episode, r0, r1, r2, r3, stale)


@jit
def run_steps(
    begin, end, s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum, pending_action,
    episode, idx, mask, n, offset, num_steps, max_episode_steps, seed, env_param, action_low, action_high,
    given_actions_ptr, obs_out_ptr, action_out_ptr, reward_out_ptr, terminated_out_ptr, truncated_out_ptr,
    log_prob_out_ptr, value_out_ptr, final_obs_out_ptr,
    actor_w_in_ptr, actor_b_in_ptr, actor_w_hid_ptr, actor_b_hid_ptr, actor_w_out_ptr, actor_b_out_ptr,
    critic_w_in_ptr, critic_b_in_ptr, critic_w_hid_ptr, critic_b_hid_ptr, critic_w_out_ptr, critic_b_out_ptr,
    log_std_ptr,
    ENV: tl.constexpr, OBS_DIM: tl.constexpr, NUM_ACTIONS: tl.constexpr, POLICY: tl.constexpr,
    AUTORESET: tl.constexpr, WRITE_OBS: tl.constexpr, WRITE_STEP: tl.constexpr, WRITE_FINAL: tl.constexpr,
    WRITE_STATS: tl.constexpr, HAS_CRITIC: tl.constexpr, D_PAD: tl.constexpr,
    A_HIDDEN: tl.constexpr, A_ACTS: tl.constexpr, A_WIDTH: tl.constexpr, A_PAD: tl.constexpr,
    C_HIDDEN: tl.constexpr, C_ACTS: tl.constexpr, C_WIDTH: tl.constexpr, C_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, FAST: tl.constexpr, AHEAD: tl.constexpr, TWO_AHEAD: tl.constexpr,
    STRIDE: tl.constexpr, BLOCK: tl.constexpr,
):
    """Steps ``begin`` .. ``end`` − 1, ``STRIDE`` per iteration; returns the carried values.

    STRIDE 4 (``begin`` at a position ≡ 0 mod 4, ``end − begin`` a multiple of 4): one Philox
    call per iteration and the four steps unrolled, step j taking lane j.  STRIDE 1: one step
    per iteration; the four draws of a Philox call are kept until the position reaches the next
    multiple of 4 (one call per four steps here too, behind a uniform test).  The next start
    state of every env is drawn at the same points, ahead of any reset (module docstring, 3),
    and with TWO_AHEAD (NEXT_STEP only) also the one after, instead of a per-step test.
    """
    # Gaussian heads draw normals, every other policy uniforms.
    normal_draws: tl.constexpr = (POLICY == MLP) & (NUM_ACTIONS == 0)
    d0 = tl.zeros([BLOCK], dtype=tl.float32)
    d1 = d0
    d2 = d0
    d3 = d0
    r0 = d0
    r1 = d0
    r2 = d0
    r3 = d0
    q0 = d0
    q1 = d0
    q2 = d0
    q3 = d0
    stale = tl.zeros([BLOCK], dtype=tl.int1)
    ahead: tl.constexpr = (AUTORESET != DISABLED) & AHEAD
    second: tl.constexpr = (AUTORESET == NEXT_STEP) & AHEAD & TWO_AHEAD
    for first in range(begin, end, STRIDE):
        position = offset + first
        if STRIDE == 4:
            d0, d1, d2, d3 = policy_draws(seed, idx, position // 4, normal_draws)
            if ahead:
                r0, r1, r2, r3 = env_reset(seed, idx, episode + 1, ENV)
                stale = tl.zeros([BLOCK], dtype=tl.int1)
            if second:
                q0, q1, q2, q3 = env_reset(seed, idx, episode + 2, ENV)
        elif (first == begin) | (position % 4 == 0):
            if POLICY != GIVEN:
                d0, d1, d2, d3 = policy_draws(seed, idx, position // 4, normal_draws)
            if ahead:
                r0, r1, r2, r3 = env_reset(seed, idx, episode + 1, ENV)
                stale = tl.zeros([BLOCK], dtype=tl.int1)
            if second:
                q0, q1, q2, q3 = env_reset(seed, idx, episode + 2, ENV)
        for j in tl.static_range(STRIDE):
            draw = select_draw(d0, d1, d2, d3, j if STRIDE == 4 else position % 4)
            (s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum, pending_action,
             episode, r0, r1, r2, r3, stale) = rollout_step(
                first + j, draw, s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum,
                pending_action, episode, r0, r1, r2, r3, q0, q1, q2, q3, stale, idx, mask, n, num_steps,
                max_episode_steps, seed, env_param, action_low, action_high, given_actions_ptr, obs_out_ptr,
                action_out_ptr, reward_out_ptr, terminated_out_ptr, truncated_out_ptr, log_prob_out_ptr,
                value_out_ptr, final_obs_out_ptr,
                actor_w_in_ptr, actor_b_in_ptr, actor_w_hid_ptr, actor_b_hid_ptr, actor_w_out_ptr,
                actor_b_out_ptr, critic_w_in_ptr, critic_b_in_ptr, critic_w_hid_ptr, critic_b_hid_ptr,
                critic_w_out_ptr, critic_b_out_ptr, log_std_ptr,
                ENV, OBS_DIM, NUM_ACTIONS, POLICY, AUTORESET, WRITE_OBS, WRITE_STEP, WRITE_FINAL, WRITE_STATS,
                HAS_CRITIC, D_PAD, A_HIDDEN, A_ACTS, A_WIDTH, A_PAD, C_HIDDEN, C_ACTS, C_WIDTH, C_PAD,
                DOT_PRECISION, FAST, AHEAD, TWO_AHEAD, BLOCK)
    return s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum, pending_action, episode


# Integer arguments equal to 1 would be specialised into constants: keep them runtime values.
@jit(do_not_specialize=["n", "num_steps", "max_episode_steps", "seed", "offset"])
def rollout_kernel(
    state_ptr, steps_ptr, done_ptr, ep_return_ptr, episode_ptr,
    given_actions_ptr,
    obs_out_ptr, action_out_ptr, reward_out_ptr, terminated_out_ptr, truncated_out_ptr,
    log_prob_out_ptr, value_out_ptr, final_obs_out_ptr, next_obs_out_ptr,
    episodes_ptr, return_sum_ptr, length_sum_ptr,
    actor_w_in_ptr, actor_b_in_ptr, actor_w_hid_ptr, actor_b_hid_ptr, actor_w_out_ptr, actor_b_out_ptr,
    critic_w_in_ptr, critic_b_in_ptr, critic_w_hid_ptr, critic_b_hid_ptr, critic_w_out_ptr, critic_b_out_ptr,
    log_std_ptr, action_low, action_high, env_param,
    n, num_steps, max_episode_steps, seed, offset,
    ENV: tl.constexpr, OBS_DIM: tl.constexpr, NUM_ACTIONS: tl.constexpr,
    POLICY: tl.constexpr, AUTORESET: tl.constexpr,
    WRITE_OBS: tl.constexpr, WRITE_STEP: tl.constexpr, WRITE_FINAL: tl.constexpr, WRITE_STATS: tl.constexpr,
    HAS_CRITIC: tl.constexpr, D_PAD: tl.constexpr,
    A_HIDDEN: tl.constexpr, A_ACTS: tl.constexpr, A_WIDTH: tl.constexpr, A_PAD: tl.constexpr,
    C_HIDDEN: tl.constexpr, C_ACTS: tl.constexpr, C_WIDTH: tl.constexpr, C_PAD: tl.constexpr,
    DOT_PRECISION: tl.constexpr, FAST: tl.constexpr,
    GROUPED: tl.constexpr, AHEAD: tl.constexpr, TWO_AHEAD: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    s0 = tl.load(state_ptr + idx, mask=mask, other=0.0)
    s1 = tl.load(state_ptr + state_row(1, n, idx), mask=mask, other=0.0)
    s2 = tl.load(state_ptr + state_row(2, n, idx), mask=mask, other=0.0)
    s3 = tl.load(state_ptr + state_row(3, n, idx), mask=mask, other=0.0)
    steps, done_prev, ep_return, episodes, return_sum, length_sum = load_counters(
        steps_ptr, done_ptr, ep_return_ptr, idx, mask, BLOCK)
    episode = tl.load(episode_ptr + idx, mask=mask, other=0)
    pending_action = tl.zeros([BLOCK], dtype=tl.float32)
    if POLICY == GIVEN:
        has_first = (tl.zeros([BLOCK], dtype=tl.int32) + num_steps) > 0
        pending_action = tl.load(given_actions_ptr + idx, mask=mask & has_first, other=0).to(tl.float32)

    # GROUPED (random policy): the steps whose positions share one Philox call run as one
    # unrolled group of four, each with its own lane and no test (phase 1); the steps before
    # the first aligned position (phase 0) and after the last whole group (phase 2) run one at
    # a time.  Otherwise all steps run one at a time (phase 0).
    single_end = num_steps
    grouped_end = num_steps
    if GROUPED:
        single_end = tl.minimum((4 - offset % 4) % 4, num_steps)
        grouped_end = single_end + (num_steps - single_end) // 4 * 4
    for phase in tl.static_range(1 + 2 * GROUPED):
        if phase == 0:
            begin = 0
            end = single_end
        elif phase == 1:
            begin = single_end
            end = grouped_end
        else:
            begin = grouped_end
            end = num_steps
        (s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum, pending_action,
         episode) = run_steps(
            begin, end, s0, s1, s2, s3, steps, done_prev, ep_return, episodes, return_sum, length_sum,
            pending_action, episode, idx, mask, n, offset, num_steps, max_episode_steps, seed, env_param, action_low,
            action_high, given_actions_ptr, obs_out_ptr, action_out_ptr, reward_out_ptr, terminated_out_ptr,
            truncated_out_ptr, log_prob_out_ptr, value_out_ptr, final_obs_out_ptr,
            actor_w_in_ptr, actor_b_in_ptr, actor_w_hid_ptr, actor_b_hid_ptr, actor_w_out_ptr, actor_b_out_ptr,
            critic_w_in_ptr, critic_b_in_ptr, critic_w_hid_ptr, critic_b_hid_ptr, critic_w_out_ptr,
            critic_b_out_ptr, log_std_ptr,
            ENV, OBS_DIM, NUM_ACTIONS, POLICY, AUTORESET, WRITE_OBS, WRITE_STEP, WRITE_FINAL, WRITE_STATS,
            HAS_CRITIC, D_PAD, A_HIDDEN, A_ACTS, A_WIDTH, A_PAD, C_HIDDEN, C_ACTS, C_WIDTH, C_PAD,
            DOT_PRECISION, FAST, AHEAD, TWO_AHEAD, 4 if phase == 1 else 1, BLOCK)

    tl.store(state_ptr + idx, s0, mask=mask)
    tl.store(state_ptr + state_row(1, n, idx), s1, mask=mask)
    tl.store(state_ptr + state_row(2, n, idx), s2, mask=mask)
    tl.store(state_ptr + state_row(3, n, idx), s3, mask=mask)
    store_counters(steps_ptr, done_ptr, ep_return_ptr, episodes_ptr, return_sum_ptr, length_sum_ptr, idx, mask,
                   steps, done_prev, ep_return, episodes, return_sum, length_sum, WRITE_STATS)
    tl.store(episode_ptr + idx, episode, mask=mask)
    o0, o1, o2, o3, o4, o5 = env_observe(s0, s1, s2, s3, ENV)
    store_obs(next_obs_out_ptr, idx, mask, o0, o1, o2, o3, o4, o5, OBS_DIM, BLOCK)


@jit(do_not_specialize=["n", "seed"])
def reset_kernel(
    state_ptr, steps_ptr, done_ptr, ep_return_ptr, episode_ptr, reset_mask_ptr, obs_out_ptr,
    n, seed,
    ENV: tl.constexpr, OBS_DIM: tl.constexpr, HAS_MASK: tl.constexpr, RESTART: tl.constexpr, BLOCK: tl.constexpr,
):
    """Draw start states (all envs, or those with ``reset_mask`` set) and write every env's observation.

    A reset env draws its next start state (episode index + 1), or start state 0 with RESTART
    (a new seed).
    """
    pid = tl.program_id(0)
    idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    episode = tl.zeros([BLOCK], dtype=tl.int32)
    if not RESTART:
        episode = tl.load(episode_ptr + idx, mask=mask, other=0) + 1
    r0, r1, r2, r3 = env_reset(seed, idx, episode, ENV)
    if HAS_MASK:
        chosen = tl.load(reset_mask_ptr + idx, mask=mask, other=0) != 0
        episode = tl.where(chosen, episode, tl.load(episode_ptr + idx, mask=mask, other=0))
        r0 = tl.where(chosen, r0, tl.load(state_ptr + idx, mask=mask, other=0.0))
        r1 = tl.where(chosen, r1, tl.load(state_ptr + state_row(1, n, idx), mask=mask, other=0.0))
        r2 = tl.where(chosen, r2, tl.load(state_ptr + state_row(2, n, idx), mask=mask, other=0.0))
        r3 = tl.where(chosen, r3, tl.load(state_ptr + state_row(3, n, idx), mask=mask, other=0.0))
        steps = tl.where(chosen, 0, tl.load(steps_ptr + idx, mask=mask, other=0))
        done = tl.where(chosen, 0, tl.load(done_ptr + idx, mask=mask, other=0))
        ep_return = tl.where(chosen, 0.0, tl.load(ep_return_ptr + idx, mask=mask, other=0.0))
    else:
        steps = tl.zeros([BLOCK], dtype=tl.int32)
        done = tl.zeros([BLOCK], dtype=tl.uint8)
        ep_return = tl.zeros([BLOCK], dtype=tl.float32)
    tl.store(state_ptr + idx, r0, mask=mask)
    tl.store(state_ptr + state_row(1, n, idx), r1, mask=mask)
    tl.store(state_ptr + state_row(2, n, idx), r2, mask=mask)
    tl.store(state_ptr + state_row(3, n, idx), r3, mask=mask)
    tl.store(steps_ptr + idx, steps, mask=mask)
    tl.store(done_ptr + idx, done, mask=mask)
    tl.store(ep_return_ptr + idx, ep_return, mask=mask)
    tl.store(episode_ptr + idx, episode, mask=mask)
    o0, o1, o2, o3, o4, o5 = env_observe(r0, r1, r2, r3, ENV)
    store_obs(obs_out_ptr, idx, mask, o0, o1, o2, o3, o4, o5, OBS_DIM, BLOCK)
