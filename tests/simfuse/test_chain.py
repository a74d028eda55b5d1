"""The configurable-complexity envs (PendulumChain-v0, OscillatorSwarm-v0): kernel vs reference, fused vs stepped."""

import numpy as np
import pytest
import torch
from simfuse_testing import MODES

import fusecore
import simfuse
from fusecore.testing import STRICT_FLOAT32, assert_all_written, assert_close, fresh_generator
from simfuse import reference

SIZE_ARGUMENT = {"PendulumChain-v0": "num_links", "OscillatorSwarm-v0": "num_particles"}


@pytest.mark.parametrize("name,num_links", [("PendulumChain-v0", 1), ("PendulumChain-v0", 5), ("PendulumChain-v0", 16),
                                            ("OscillatorSwarm-v0", 3), ("OscillatorSwarm-v0", 40)])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_chain_matches_reference(name, num_links, mode, device):
    seed = fresh_generator().initial_seed()
    kwargs = {SIZE_ARGUMENT[name]: num_links, "max_episode_steps": 4, "autoreset_mode": mode, "device": device}
    env, ref_env = simfuse.make_vec(name, 7, **kwargs), simfuse.make_vec(name, 7, **kwargs)
    obs, _ = env.reset(seed=seed)
    expected = reference.chain_start_angles(seed, np.arange(7), 0, num_links)
    assert torch.equal(obs[:, :num_links].cpu(), expected) and not obs[:, num_links:].any()
    ref_env.reset(seed=seed)
    same_step = mode.name == "SAME_STEP"
    traj = env.rollout("random", num_steps=9, record_final_obs=same_step)
    with fusecore.use_reference():
        ref = ref_env.rollout("random", num_steps=9, record_final_obs=same_step)
    for field in ("obs", "actions", "rewards"):
        assert_all_written(getattr(traj, field), field)
    assert traj.obs.shape == (9, 7, 2 * num_links)
    assert torch.equal(traj.actions, ref.actions)
    assert torch.equal(traj.truncated, ref.truncated) and not traj.terminated.any()
    assert traj.truncated.any()
    assert_close(traj.obs, ref.obs, tol=STRICT_FLOAT32, name="obs")
    assert_close(traj.rewards, ref.rewards, tol=STRICT_FLOAT32, name="rewards")
    assert_close(traj.next_obs, ref.next_obs, tol=STRICT_FLOAT32, name="next_obs")
    if same_step:
        ended = traj.truncated
        assert_close(traj.final_obs[ended], ref.final_obs[ended], tol=STRICT_FLOAT32, name="final_obs")


@pytest.mark.parametrize("name", list(SIZE_ARGUMENT))
def test_chain_rollout_equals_steps_and_stats(name, device):
    kwargs = {SIZE_ARGUMENT[name]: 3, "max_episode_steps": 5, "device": device}
    env, stepped, counted = (simfuse.make_vec(name, 6, **kwargs) for _ in range(3))
    for e in (env, stepped, counted):
        e.reset(seed=8)
    traj = env.rollout("random", num_steps=12)
    for t in range(12):
        obs, reward, _, truncated, _ = stepped.step(traj.actions[t])
        assert torch.equal(reward, traj.rewards[t]) and torch.equal(truncated, traj.truncated[t])
    assert torch.equal(obs, traj.next_obs)
    stats = counted.rollout("random", num_steps=12, stats_only=True)
    assert torch.equal(stats.episodes, traj.truncated.sum(0).to(torch.int32))
    assert torch.equal(stats.length_sum, 5 * stats.episodes)


def test_chain_rejects_bad_arguments(device):
    with pytest.raises(ValueError, match="num_links"):
        simfuse.make_vec("PendulumChain-v0", 2, num_links=0, device=device)
    with pytest.raises(ValueError, match=r"num_particles must be an int in \[1, 256\].*got 257"):
        simfuse.make_vec("OscillatorSwarm-v0", 2, num_particles=257, device=device)
    env = simfuse.make_vec("PendulumChain-v0", 2, num_links=2, device=device)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="policy='random' or an action tensor"):
        env.rollout(torch.nn.Sequential(torch.nn.Linear(4, 1)), 2)
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        env.set_state(torch.zeros(2, 3))


def test_tile_state_envs_refuse_more_state_than_their_offsets_address():
    """The tile-state kernels form ``L · N`` and ``row · N`` in int32: an env whose 2L · N state values reach 2**31
    is refused when made, naming the two arguments, instead of writing through wrapped offsets."""
    num_envs = 2**31 // (2 * 256)
    with pytest.raises(ValueError, match="fewer envs or a smaller num_links"):
        simfuse.make_vec("PendulumChain-v0", num_envs, num_links=256)
    with pytest.raises(ValueError, match="smaller num_particles"):
        simfuse.make_vec("OscillatorSwarm-v0", num_envs, num_particles=256)
