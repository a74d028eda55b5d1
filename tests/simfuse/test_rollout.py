"""The fused K-step rollout: equal to K single steps, to the unfused reference, and its policies."""


import numpy as np
import pytest
import torch
import triton.language as tl
from gymnasium.vector import AutoresetMode
from simfuse_testing import ENV_NAMES, MODES, make, to_numpy
from torch import nn

import fusecore
from fusecore.backend import jit
from fusecore.testing import STRICT_FLOAT32, assert_all_written, assert_close, fresh_generator
from simfuse.kernels.rollout import state_row


def _step_by_step(env, actions: torch.Tensor):
    """Step ``env`` through ``actions`` [K, N(, 1)]; return the trajectory as rollout() records it."""
    obs_seq, rew, term, trunc = [], [], [], []
    obs = env.rollout(actions[:0]).next_obs  # the current observation, no step taken
    for a in actions:
        obs_seq.append(obs)
        obs, r, te, tr, _ = env.step(a)
        rew.append(r)
        term.append(te)
        trunc.append(tr)
    return torch.stack(obs_seq), torch.stack(rew), torch.stack(term), torch.stack(trunc), obs


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1", "Acrobot-v1"])
def test_rollout_equals_steps_bitwise(name, mode, device):
    """A K-step random rollout, replayed with step() from the same state and seed, is bit-identical."""
    seed = fresh_generator().initial_seed()
    fused = make(name, 5, max_episode_steps=4, autoreset_mode=mode, device=device)
    stepped = make(name, 5, max_episode_steps=4, autoreset_mode=mode, device=device)
    fused.reset(seed=seed)
    stepped.reset(seed=seed)
    traj = fused.rollout("random", num_steps=7)
    if mode == AutoresetMode.DISABLED:
        # without auto-reset the envs simply keep stepping past the end of an episode
        assert traj.truncated[3:].all()
    obs, rew, term, trunc, next_obs = _step_by_step(stepped, traj.actions)
    assert torch.equal(traj.obs, obs)
    assert torch.equal(traj.rewards, rew)
    assert torch.equal(traj.terminated, term) and torch.equal(traj.truncated, trunc)
    assert torch.equal(traj.next_obs, next_obs)
    assert torch.equal(fused.get_state(), stepped.get_state())
    # and the envs continue identically afterwards
    more = fused.rollout("random", num_steps=3)
    assert torch.equal(more.obs[0], next_obs)


@pytest.mark.parametrize("name", ENV_NAMES)
def test_rollout_matches_reference(name, device):
    """The kernel's rollout against the unfused float64 reference with the same Philox draws."""
    seed = fresh_generator().initial_seed()
    env = make(name, 67, max_episode_steps=6, autoreset_mode="SameStep", device=device)  # lazy-reset blocks
    env.reset(seed=seed)
    traj = env.rollout("random", num_steps=9, record_final_obs=True)
    ref_env = make(name, 67, max_episode_steps=6, autoreset_mode="SameStep", device=device)
    ref_env.reset(seed=seed)
    with fusecore.use_reference():
        ref = ref_env.rollout("random", num_steps=9, record_final_obs=True)
    assert torch.equal(traj.actions, ref.actions)
    assert torch.equal(traj.terminated, ref.terminated) and torch.equal(traj.truncated, ref.truncated)
    assert_close(traj.obs, ref.obs, tol=1e-4, name="obs")
    assert_close(traj.rewards, ref.rewards, tol=STRICT_FLOAT32, name="rewards")
    ended = traj.terminated | traj.truncated
    assert ended.any()
    assert_close(traj.final_obs[ended], ref.final_obs[ended], tol=1e-4, name="final_obs")


def test_given_actions_and_trajectory_fully_written(device):
    """Actions from the caller are used as given; every trajectory element is written."""
    env = make("MountainCarContinuous-v0", 17, device=device)
    env.reset(seed=3)
    gen = fresh_generator()
    actions = (torch.rand((6, 17, 1), generator=gen) * 2 - 1).to(device)
    traj = env.rollout(actions)
    assert torch.equal(traj.actions, actions)
    for field in ("obs", "rewards"):
        assert_all_written(getattr(traj, field), field)
    assert traj.obs.shape == (6, 17, 2) and traj.rewards.shape == (6, 17)
    expected = -0.1 * actions[..., 0] ** 2  # no env reaches the goal within 6 steps of the start
    assert_close(traj.rewards, expected, tol=STRICT_FLOAT32, name="rewards")


def test_random_policy_covers_the_action_space(device):
    env = make("Acrobot-v1", 64, device=device)
    env.reset(seed=11)
    actions = env.rollout("random", num_steps=4).actions
    counts = torch.bincount(actions.flatten().long().cpu(), minlength=3)
    assert counts.sum() == 256 and (counts > 50).all(), counts
    cont = make("Pendulum-v1", 64, device=device)
    cont.reset(seed=11)
    a = cont.rollout("random", num_steps=4).actions
    assert a.shape == (4, 64, 1) and a.min() >= -2.0 and a.max() <= 2.0 and a.std() > 0.8


def test_categorical_sampling_distribution(device):
    """Actions sampled in the kernel follow softmax(logits) (a fixed-logit policy, many draws)."""
    actor = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    with torch.no_grad():
        for p in actor.parameters():
            p.zero_()
        actor[2].bias.copy_(torch.tensor([0.0, 1.0, -1.0]))
    env = make("Acrobot-v1", 256, device=device)
    env.reset(seed=1)
    traj = env.rollout(actor.to(device), num_steps=8)
    freq = torch.bincount(traj.actions.flatten().long().cpu(), minlength=3).double() / traj.actions.numel()
    want = torch.softmax(torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64), 0)
    assert (freq - want).abs().max() < 0.03, (freq, want)


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_stats_only_matches_trajectory(mode, device):
    """Statistics-only rollouts count the episodes, returns and lengths the full trajectory shows."""
    a = make("CartPole-v1", 9, max_episode_steps=12, autoreset_mode=mode, device=device)
    b = make("CartPole-v1", 9, max_episode_steps=12, autoreset_mode=mode, device=device)
    a.reset(seed=21)
    b.reset(seed=21)
    stats = a.rollout("random", num_steps=30, stats_only=True)
    traj = b.rollout("random", num_steps=30)
    ended = to_numpy(traj.terminated | traj.truncated)
    rewards = to_numpy(traj.rewards)
    episodes = np.zeros(9, dtype=np.int64)
    return_sum = np.zeros(9)
    length_sum = np.zeros(9, dtype=np.int64)
    running = np.zeros(9)
    running_len = np.zeros(9, dtype=np.int64)
    pending = np.zeros(9, dtype=bool)
    for t in range(30):
        running += rewards[t]
        running_len += ~pending
        pending = ended[t] if mode == "NextStep" else np.zeros(9, dtype=bool)
        episodes += ended[t]
        return_sum += np.where(ended[t], running, 0)
        length_sum += np.where(ended[t], running_len, 0)
        running[ended[t]] = 0
        running_len[ended[t]] = 0
    assert np.array_equal(to_numpy(stats.episodes), episodes)
    assert np.allclose(to_numpy(stats.return_sum), return_sum)
    assert np.array_equal(to_numpy(stats.length_sum), length_sum)
    assert episodes.sum() > 0
    assert torch.equal(stats.next_obs, traj.next_obs)
    assert abs(stats.mean_return().item() - return_sum.sum() / episodes.sum()) < 1e-9


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_start_states_numbered_per_episode(mode, device):
    """Env i's e-th start state is Philox (seed, i, e) whenever its reset happens: with one-step episodes an env
    resets every step (SAME_STEP) or every other step (NEXT_STEP), twice or more between the kernel's draws of
    the next start states, and a rollout still equals step-by-step stepping."""
    from simfuse import ops, reference
    from simfuse.specs import CARTPOLE

    seed = fresh_generator().initial_seed()
    fused = make("CartPole-v1", 5, max_episode_steps=1, autoreset_mode=mode, device=device)
    stepped = make("CartPole-v1", 5, max_episode_steps=1, autoreset_mode=mode, device=device)
    fused.reset(seed=seed)
    stepped.reset(seed=seed)
    traj = fused.rollout("random", num_steps=9)
    every = 1 if mode == "SameStep" else 2
    for t in range(0, 9, every):
        start = reference.philox_start_state(CARTPOLE, seed, np.arange(5), t // every).T
        assert torch.equal(traj.obs[t].cpu(), start), t
    obs, rew, term, trunc, next_obs = _step_by_step(stepped, traj.actions)
    assert torch.equal(traj.obs, obs) and torch.equal(traj.next_obs, next_obs)
    assert torch.equal(traj.truncated, trunc) and torch.equal(traj.rewards, rew)
    # both ways of drawing start states ahead (two of them, or one and a per-step test) take the same ones
    for two_ahead in (True, False):
        other = make("CartPole-v1", 5, max_episode_steps=1, autoreset_mode=mode, device=device)
        other.reset(seed=seed)
        with ops.tuned(two_start_states_ahead=two_ahead):
            assert torch.equal(other.rollout("random", num_steps=9).obs, traj.obs), two_ahead



@jit
def _state_row_offsets_kernel(out_ptr, n, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    for row in tl.static_range(4):
        tl.store(out_ptr + row * BLOCK + tl.arange(0, BLOCK), state_row(row, n, idx))


def test_state_rows_are_addressed_in_int64(device):
    """The classic rollout's state rows sit ``row · n`` apart: past 715 827 882 envs that product leaves int32
    (``n`` itself still arrives as an int32), so it is formed in int64 — checked on the offsets, compiled or
    under the interpreter (which wraps int32 arithmetic as the GPU does)."""
    for n in (5, 2**30 + 7, 2**31 - 1):
        out = torch.full((4 * 4,), -1, dtype=torch.int64, device=device)
        _state_row_offsets_kernel[(1,)](out, n, BLOCK=4)
        assert out.tolist() == [row * n + i for row in range(4) for i in range(4)], n
