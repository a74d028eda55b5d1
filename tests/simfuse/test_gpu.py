"""No host synchronisation per step (every device), and, on the GPU, compiled results equal to the CPU oracle."""

import numpy as np
import pytest
import torch
from torch import nn

import simfuse
from fusecore.testing import HostSyncError, no_host_sync
from simfuse import reference
from simfuse.specs import ENV_DEFS


def test_step_and_rollouts_never_synchronise(device):
    """With validate=False (the GPU default) step() and rollout() only enqueue work (MLP weights and a
    learned log-std included): no value is read back to the host (on the CPU too, through the interpreter)."""
    n = 4096 if device.type == "cuda" else 64
    env = simfuse.make_vec("CartPole-v1", n, device=device, autoreset_mode="SameStep", validate=False)
    env.reset(seed=0)
    actions = torch.randint(0, 2, (n,), device=device)
    given = torch.randint(0, 2, (8, n), device=device)
    actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2)).to(device)
    critic = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    policy = simfuse.MLPPolicy(actor, critic)
    pendulum = simfuse.make_vec("Pendulum-v1", n // 4, device=device, validate=False)
    pendulum.reset(seed=0)
    gaussian = simfuse.MLPPolicy(nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 1)).to(device),
                                 log_std=nn.Parameter(torch.zeros((), device=device)), precision="bf16")

    def work():
        pendulum.rollout(gaussian, num_steps=4)
        for _ in range(3):
            env.step(actions)
        env.rollout("random", num_steps=16)
        env.rollout(given)
        env.rollout(policy, num_steps=8, record_final_obs=True)
        env.rollout("random", num_steps=16, stats_only=True)

    work()  # compile every kernel variant first
    with no_host_sync(device):
        work()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ENV_DEFS))
def test_gpu_start_states_equal_cpu_oracle(name, device):
    """reset(seed) on the GPU gives bit for bit the start states of the numpy oracle (CPU)."""
    env = simfuse.make_vec(name, 100_003, device=device)
    env.reset(seed=12345)
    expected = reference.philox_start_state(ENV_DEFS[name], 12345, np.arange(100_003), 0).T
    assert torch.equal(env.get_state().cpu(), expected)


@pytest.mark.gpu
def test_large_rollout_matches_small_one(device):
    """One million envs: env i's trajectory depends only on (seed, i), whatever N and the block size."""
    big = simfuse.make_vec("Acrobot-v1", 1 << 20, device=device)
    small = simfuse.make_vec("Acrobot-v1", 37, device=device)
    big.reset(seed=3)
    small.reset(seed=3)
    a = big.rollout("random", num_steps=20)
    b = small.rollout("random", num_steps=20)
    assert torch.equal(a.actions[:, :37], b.actions)
    assert torch.equal(a.obs[:, :37], b.obs) and torch.equal(a.rewards[:, :37], b.rewards)


@pytest.mark.gpu
def test_same_seed_same_episodes_on_cpu_and_gpu(device):
    """A GPU rollout and the CPU reference of the same seed: identical actions and flags, obs to float32."""
    import fusecore

    gpu = simfuse.make_vec("CartPole-v1", 64, max_episode_steps=40, device=device)
    cpu = simfuse.make_vec("CartPole-v1", 64, max_episode_steps=40, device="cpu")
    gpu.reset(seed=77)
    cpu.reset(seed=77)
    traj = gpu.rollout("random", num_steps=30)
    with fusecore.use_reference():
        ref = cpu.rollout("random", num_steps=30)
    assert torch.equal(traj.actions.cpu(), ref.actions)
    assert torch.equal(traj.terminated.cpu(), ref.terminated) and torch.equal(traj.truncated.cpu(), ref.truncated)
    fusecore.testing.assert_close(traj.obs.cpu(), ref.obs, tol=1e-4, name="obs")


@pytest.mark.gpu
def test_validate_switch_reads_actions_on_the_gpu(device):
    """validate=True checks action values on the GPU (one host synchronisation, which no_host_sync reports)."""
    env = simfuse.make_vec("MountainCar-v0", 256, device=device, validate=True)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside the Discrete"):
        env.step(torch.full((256,), 3, device=device))
    actions = torch.ones(256, dtype=torch.int64, device=device)
    env.step(actions)
    with pytest.raises(HostSyncError), no_host_sync(device):
        env.step(actions)


@pytest.mark.gpu
def test_tile_state_env_on_the_gpu_equals_the_oracle_and_small_runs(device):
    """OscillatorSwarm-v0 with 40 particles (two threads of a warp per env, padding rows) on the GPU: start
    states bit for bit the numpy oracle's, and env i's rollout, resets included, independent of N."""
    n, particles = 20_011, 40
    kwargs = {"num_particles": particles, "max_episode_steps": 4, "device": device}
    big = simfuse.make_vec("OscillatorSwarm-v0", n, **kwargs)
    small = simfuse.make_vec("OscillatorSwarm-v0", 37, **kwargs)
    big.reset(seed=9)
    small.reset(seed=9)
    expected = reference.chain_start_angles(9, np.arange(n), 0, particles)
    assert torch.equal(big.get_state()[:, :particles].cpu(), expected)
    a = big.rollout("random", num_steps=9)
    b = small.rollout("random", num_steps=9)
    assert a.truncated.any()
    assert torch.equal(a.obs[:, :37], b.obs) and torch.equal(a.rewards[:, :37], b.rewards)
    assert torch.equal(a.next_obs[:37], b.next_obs)
