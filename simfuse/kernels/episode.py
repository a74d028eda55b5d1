"""Episode bookkeeping shared by every rollout kernel: auto-reset flags, statistics, stores.

Per env and step, given the step's ``terminated`` and ``truncated`` (step counter reached
the limit) and the flag ``done_prev`` (the episode ended at the previous step):

* NEXT_STEP (0): an env with ``done_prev`` is reset *instead of* stepped: reward 0, both
  flags False, counter 0.  ``done_prev`` becomes terminated | truncated.
* SAME_STEP (1): an env whose episode ends now is reset right after the step; counter 0.
* DISABLED (2): nothing is reset; the caller resets with a mask.

Memory traffic: 4 B reward + 2 B flags per env-step when written; the counters and the
running return are loaded and stored once per launch.
"""

import triton.language as tl

from fusecore.backend import jit

NEXT_STEP: tl.constexpr = tl.constexpr(0)
SAME_STEP: tl.constexpr = tl.constexpr(1)


@jit
def autoreset_flags(reward, terminated, truncated, length, done_prev, AUTORESET: tl.constexpr):
    """Apply the auto-reset mode; returns (reward, terminated, truncated, steps, done_prev, resetting).

    ``length`` is the step counter after this step; ``resetting`` says which envs take a
    fresh start state at the end of this step.
    """
    if AUTORESET == NEXT_STEP:
        resetting = done_prev
        reward = tl.where(resetting, 0.0, reward)
        terminated = terminated & (resetting == 0)
        truncated = truncated & (resetting == 0)
    elif AUTORESET == SAME_STEP:
        resetting = terminated | truncated
    else:
        resetting = tl.zeros_like(terminated)
    steps = tl.where(resetting, 0, length)
    return reward, terminated, truncated, steps, terminated | truncated, resetting


@jit
def track_episode(ep_return, episodes, return_sum, length_sum, reward, ended, length, WRITE_STATS: tl.constexpr):
    """Add the reward to the running return; on episode end count it (when WRITE_STATS) and restart."""
    ep_return = ep_return + reward
    if WRITE_STATS:
        episodes += ended.to(tl.int32)
        return_sum += tl.where(ended, ep_return, 0.0)
        length_sum += tl.where(ended, length, 0)
    ep_return = tl.where(ended, 0.0, ep_return)
    return ep_return, episodes, return_sum, length_sum


@jit
def store_step(reward_ptr, terminated_ptr, truncated_ptr, row, mask, reward, terminated, truncated):
    """Write one step's reward and flags (uint8) at rows ``row``."""
    tl.store(reward_ptr + row, reward, mask=mask)
    tl.store(terminated_ptr + row, terminated.to(tl.uint8), mask=mask)
    tl.store(truncated_ptr + row, truncated.to(tl.uint8), mask=mask)


@jit
def load_counters(steps_ptr, done_ptr, ep_return_ptr, idx, mask, BLOCK: tl.constexpr):
    """Per-env counters (steps, done_prev, running return) and zeroed statistics for this launch."""
    steps = tl.load(steps_ptr + idx, mask=mask, other=0)
    done_prev = tl.load(done_ptr + idx, mask=mask, other=0) != 0
    ep_return = tl.load(ep_return_ptr + idx, mask=mask, other=0.0)
    episodes = tl.zeros([BLOCK], dtype=tl.int32)
    return_sum = tl.zeros([BLOCK], dtype=tl.float32)
    length_sum = tl.zeros([BLOCK], dtype=tl.int32)
    return steps, done_prev, ep_return, episodes, return_sum, length_sum


@jit
def store_counters(steps_ptr, done_ptr, ep_return_ptr, episodes_ptr, return_sum_ptr, length_sum_ptr, idx, mask,
                   steps, done_prev, ep_return, episodes, return_sum, length_sum, WRITE_STATS: tl.constexpr):
    """Store the per-env counters back, and the launch's episode statistics when asked for."""
    tl.store(steps_ptr + idx, steps, mask=mask)
    tl.store(done_ptr + idx, done_prev.to(tl.uint8), mask=mask)
    tl.store(ep_return_ptr + idx, ep_return, mask=mask)
    if WRITE_STATS:
        tl.store(episodes_ptr + idx, episodes, mask=mask)
        tl.store(return_sum_ptr + idx, return_sum, mask=mask)
        tl.store(length_sum_ptr + idx, length_sum, mask=mask)
