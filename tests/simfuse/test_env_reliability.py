"""Issue 8 for simfuse: rejected calls leave the env untouched, determinism, and properties over sizes and modes."""

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from hypothesis import given, settings
from hypothesis import strategies as st
from simfuse_testing import ENV_NAMES, MODES, make
from torch import nn

import simfuse
from fusecore.testing import test_device


def _trajectory_fields(traj) -> list[torch.Tensor]:
    return [t for t in (traj.obs, traj.actions, traj.rewards, traj.terminated, traj.truncated, traj.next_obs,
                        traj.log_probs, traj.values, traj.final_obs) if t is not None]


def _assert_same(a, b) -> None:
    for x, y in zip(_trajectory_fields(a), _trajectory_fields(b), strict=True):
        assert torch.equal(x, y)


def test_rejected_calls_leave_the_env_untouched(device):
    """Every bad call raises before any state or random position changes: the env continues as if none was made."""
    env = make("Acrobot-v1", 5, autoreset_mode="Disabled", device=device, validate=True)
    twin = make("Acrobot-v1", 5, autoreset_mode="Disabled", device=device, validate=True)
    for e in (env, twin):
        e.reset(seed=31)
        e.rollout("random", num_steps=3)
    state = env.get_state()
    bad_calls = [
        (ValueError, lambda: env.step(np.array([0, 1, 3, 0, 1]))),                       # outside Discrete(3)
        (ValueError, lambda: env.step(np.array([0, 1, -1, 0, 1]))),
        (ValueError, lambda: env.step(np.zeros(4, dtype=np.int64))),                     # shape
        (TypeError, lambda: env.step(np.zeros(5, dtype=np.float32))),                    # dtype
        (ValueError, lambda: env.step(torch.zeros(5, dtype=torch.int64, device="meta"))),  # device
        (TypeError, lambda: env.step([0, 1, 2, 0, 1])),
        (ValueError, lambda: env.rollout(torch.full((4, 5), 9, dtype=torch.int32, device=device))),
        (ValueError, lambda: env.rollout("random", num_steps=-2)),
        (ValueError, lambda: env.rollout(nn.Sequential(nn.Linear(6, 4)), num_steps=2)),  # 4 logits for 3 actions
        (ValueError, lambda: env.reset(seed=4, options={"reset_mask": np.ones(4, dtype=bool)})),
        (ValueError, lambda: env.reset(seed=4, options={"reset_mask": np.zeros(5, dtype=bool)})),
        (TypeError, lambda: env.reset(seed=4, options={"reset_mask": np.ones(5, dtype=np.int8)})),
        (ValueError, lambda: env.reset(seed=4, options={"mask": np.ones(5, dtype=bool)})),
        (TypeError, lambda: env.reset(seed=4, options=["reset_mask"])),
        (TypeError, lambda: env.reset(seed=2.5)),
        (ValueError, lambda: env.reset(seed=2**63)),
    ]
    for exc, call in bad_calls:
        with pytest.raises(exc):
            call()
        assert torch.equal(env.get_state(), state)
    _assert_same(env.rollout("random", num_steps=4), twin.rollout("random", num_steps=4))
    obs, _ = env.reset(options={"reset_mask": np.array([True, False, True, False, False])})
    twin_obs, _ = twin.reset(options={"reset_mask": np.array([True, False, True, False, False])})
    assert torch.equal(obs, twin_obs)


def test_step_before_reset_and_bad_construction():
    with pytest.raises(gymnasium.error.ResetNeeded, match="call reset"):
        make("CartPole-v1", 2).step(np.zeros(2, dtype=np.int64))
    with pytest.raises(gymnasium.error.ResetNeeded, match="needs a full reset"):
        make("CartPole-v1", 2).reset(options={"reset_mask": np.ones(2, dtype=bool)})
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"num_envs must be >= 1, got {bad}"):
            make("Pendulum-v1", bad)
    with pytest.raises(TypeError, match="num_envs must be an int, got str"):
        simfuse.PendulumVectorEnv(num_envs="8")
    with pytest.raises(ValueError, match="autoreset_mode must be one of"):
        make("Pendulum-v1", 2, autoreset_mode=3)
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        make("Pendulum-v1", 2, device="meta")
    with pytest.raises(TypeError, match="sutton_barto_reward must be a bool"):
        make("CartPole-v1", 2, sutton_barto_reward="yes")
    with pytest.raises(ValueError, match="g must be a finite number"):
        make("Pendulum-v1", 2, g=float("nan"))
    with pytest.raises(TypeError, match="g must be a real number, got str"):
        make("Pendulum-v1", 2, g="9.8")
    assert make("Pendulum-v1", 2, g=np.float32(9.8)).env_param == pytest.approx(9.8)


def test_api_boundary_corner_cases(device):
    """Session 38's audit: each case once failed (aliased output, device spelling, first masked reset with a
    seed, random position moved by a failed rollout, classic envs never truncating, loose checks)."""
    # reset()'s observation is a fresh tensor, also for one tile-state env (its [2L, 1] state transposed is
    # contiguous already): stepping or editing it leaves the other alone
    for name in ("PendulumChain-v0", "OscillatorSwarm-v0", "CartPole-v1"):
        env = make(name, 1, device=device)
        obs, _ = env.reset(seed=0)
        kept = obs.clone()
        env.step(np.ones((1, 1), np.float32) if name != "CartPole-v1" else np.ones(1, np.int64))
        assert torch.equal(obs, kept), name
        state = env.get_state()
        obs.zero_()
        assert torch.equal(env.get_state(), state), name
    # "cpu:0" is the CPU: the env steps with CPU inputs
    env = make("CartPole-v1", 2, device="cpu:0")
    assert env.device == torch.device("cpu")
    env.reset(seed=0)
    env.step(np.array([0, 1]))
    env.reset(options={"reset_mask": np.array([True, False])})
    for bad in ("tpu", "cuda:99" if torch.cuda.is_available() else "cuda", 3.5):
        with pytest.raises(ValueError, match="device"):
            make("CartPole-v1", 2, device=bad)
    # a masked reset before any full reset is refused, seeded or not
    with pytest.raises(gymnasium.error.ResetNeeded, match="needs a full reset"):
        make("Pendulum-v1", 3, device=device).reset(seed=0, options={"reset_mask": np.array([True, False, False])})
    # a rollout that fails (here: outputs far too large to allocate) leaves the random position where it was
    env, twin = make("CartPole-v1", 3, device=device), make("CartPole-v1", 3, device=device)
    env.reset(seed=5)
    twin.reset(seed=5)
    with pytest.raises((RuntimeError, MemoryError)):
        env.rollout("random", num_steps=10**12)
    _assert_same(env.rollout("random", num_steps=3), twin.rollout("random", num_steps=3))
    # the classes truncate at their own limit, as Gymnasium's vector envs and simfuse.make_vec do
    assert simfuse.CartPoleVectorEnv(2, device=device).max_episode_steps == 500
    assert simfuse.PendulumVectorEnv(2, device=device).max_episode_steps == 200
    assert simfuse.AcrobotVectorEnv(2, device=device, max_episode_steps=None).max_episode_steps is None
    with pytest.raises(TypeError, match="abstract"):
        simfuse.FusedVectorEnv(2)
    with pytest.raises(TypeError, match="validate must be a bool"):
        make("CartPole-v1", 2, validate="no")
    env = make("CartPole-v1", 1, device=device)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(1,\).*got \(\)"):  # a 0-d array is not an [N] batch
        env.step(np.array(1))
    big_endian = env.step(np.array([1], dtype=">i8"))[0]  # converted to native order, then used
    assert big_endian.shape == (1, 4)
    with pytest.raises(TypeError, match="actions"):
        env.step(np.array([object()]))


def test_same_seed_same_mlp_rollouts(device):
    """Two envs, one seed: identical trajectories (actions, log-probs, values) run to run."""
    torch.manual_seed(0)
    actor = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2)).to(device)
    critic = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    policy = simfuse.MLPPolicy(actor, critic, precision="tf32")
    runs = []
    for _ in range(2):
        env = make("CartPole-v1", 21, max_episode_steps=6, autoreset_mode="SameStep", device=device)
        env.reset(seed=99)
        runs.append(env.rollout(policy, num_steps=9, record_final_obs=True))
    _assert_same(*runs)


# A handful of examples per run: each costs a few interpreted kernel launches.
@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(ENV_NAMES), num_envs=st.sampled_from([1, 2, 3, 5, 7, 13, 31, 64, 67]),
       extra_envs=st.integers(1, 9), num_steps=st.integers(0, 6), limit=st.integers(1, 5),
       mode=st.sampled_from(MODES), seed=st.integers(0, 2**63 - 1))
def test_rollout_properties(name, num_envs, extra_envs, num_steps, limit, mode, seed):
    """For any env count, K, step limit, autoreset mode and seed:

    * a fused rollout equals K calls of step() with its actions, bit for bit;
    * env i's trajectory depends only on (seed, i): a larger batch with the same seed starts
      with the same trajectories (so the same seed gives the same episodes run to run);
    * the flags follow the autoreset mode (NEXT_STEP: the step after an episode end is a reset
      with reward 0 and no flags; truncation exactly when the episode reaches the limit).
    """
    device = test_device()
    kwargs = {"max_episode_steps": limit, "autoreset_mode": mode, "device": device}
    fused, stepped, bigger = make(name, num_envs, **kwargs), make(name, num_envs, **kwargs), \
        make(name, num_envs + extra_envs, **kwargs)
    for e in (fused, stepped, bigger):
        e.reset(seed=seed)
    traj = fused.rollout("random", num_steps=num_steps)
    wide = bigger.rollout("random", num_steps=num_steps)
    assert traj.obs.shape == (num_steps, num_envs, fused.env_def.obs_dim)
    for field in ("obs", "actions", "rewards", "terminated", "truncated"):
        assert torch.equal(getattr(wide, field)[:, :num_envs], getattr(traj, field)), field
    assert torch.equal(wide.next_obs[:num_envs], traj.next_obs)
    obs = stepped.rollout(traj.actions[:0]).next_obs
    length = torch.zeros(num_envs, dtype=torch.int64)
    pending = torch.zeros(num_envs, dtype=torch.bool)
    for t in range(num_steps):
        assert torch.equal(obs, traj.obs[t])
        obs, reward, terminated, truncated, _ = stepped.step(traj.actions[t])
        assert torch.equal(reward, traj.rewards[t])
        assert torch.equal(terminated, traj.terminated[t]) and torch.equal(truncated, traj.truncated[t])
        terminated, truncated = terminated.cpu(), truncated.cpu()
        if mode == AutoresetMode.NEXT_STEP:
            assert not (terminated | truncated)[pending].any() and (reward.cpu()[pending] == 0).all()
            length = torch.where(pending, 0, length + 1)
            assert torch.equal(truncated, ~pending & (length >= limit))
            pending = terminated | truncated
        else:
            length += 1
            assert torch.equal(truncated, length >= limit)
            if mode == AutoresetMode.SAME_STEP:
                length[terminated | truncated] = 0
    assert torch.equal(obs, traj.next_obs)


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(ENV_NAMES), num_envs=st.sampled_from([1, 2, 5, 11, 67]), warmup=st.integers(0, 4),
       seed=st.integers(0, 2**63 - 1), data=st.data())
def test_reset_mask_properties(name, num_envs, warmup, seed, data):
    """reset(options={"reset_mask": m}) redraws exactly the masked envs from the Philox oracle and keeps the rest."""
    from simfuse import reference
    from simfuse.specs import ENV_DEFS

    mask = np.array(data.draw(st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)), dtype=bool)
    env = make(name, num_envs, autoreset_mode="Disabled", device=test_device(), validate=True)
    env.reset(seed=seed)
    env.rollout("random", num_steps=warmup)
    before = env.get_state()
    if not mask.any():
        with pytest.raises(ValueError, match="at least one True"):
            env.reset(options={"reset_mask": mask})
        assert torch.equal(env.get_state(), before)
        return
    obs, _ = env.reset(options={"reset_mask": mask})
    after = env.get_state()
    chosen = torch.from_numpy(mask)
    fresh = reference.philox_start_state(ENV_DEFS[name], seed, np.arange(num_envs), 1).T  # each env's second
    assert torch.equal(after.cpu()[chosen], fresh[chosen])
    assert torch.equal(after[~chosen.to(after.device)], before[~chosen.to(before.device)])
    assert obs.shape == (num_envs, ENV_DEFS[name].obs_dim)
