"""Every step of every env against Gymnasium's own float64 environment, in each autoreset mode.

From the same state and the same action, each step's observation and reward must agree
with Gymnasium's to float32 accuracy and the termination flag exactly; truncation must come
at ``max_episode_steps``; auto-resets must draw the Philox start states of the oracle.
"""

import zlib

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from simfuse_testing import ENV_NAMES, MODES, gym_env, gym_step, make, random_actions, to_numpy, wide_states

from fusecore.testing import STRICT_FLOAT32, assert_close
from simfuse import reference
from simfuse.specs import ENV_DEFS

NUM_ENVS = 11
MAX_STEPS = 5
STEPS = 9
# One step's relative error against float64.  Acrobot chains four derivative evaluations
# (RK4) with velocities up to 9π, which amplifies float32 rounding about tenfold.
TOLERANCE = {name: STRICT_FLOAT32 for name in ENV_NAMES} | {"Acrobot-v1": 1e-4}


def reset_obs(name: str, seed: int, env_ids: np.ndarray, index) -> np.ndarray:
    """Observations of start state number ``index`` (per env) of ``env_ids``."""
    spec = ENV_DEFS[name]
    return to_numpy(reference.env_observe(spec, reference.philox_start_state(spec, seed, env_ids, index)))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("name", ENV_NAMES)
def test_steps_match_gymnasium(name, mode, device):
    _match_gymnasium(name, mode, device, {})


@pytest.mark.parametrize("name,kwargs", [("CartPole-v1", {"sutton_barto_reward": True}),
                                         ("Pendulum-v1", {"g": 9.81}), ("Pendulum-v1", {"g": 3.7})])
def test_constructor_arguments_match_gymnasium(name, kwargs, device):
    """Gymnasium's non-default constructor arguments: CartPoleEnv(sutton_barto_reward), PendulumEnv(g)."""
    _match_gymnasium(name, AutoresetMode.SAME_STEP, device, kwargs)


def _match_gymnasium(name, mode, device, kwargs):
    rng = np.random.default_rng(zlib.crc32(f"{name}/{mode.name}/{sorted(kwargs.items())}".encode()))
    seed = int(rng.integers(2**31))
    env = make(name, NUM_ENVS, max_episode_steps=MAX_STEPS, autoreset_mode=mode, device=device, **kwargs)
    oracle = gym_env(name, **kwargs)
    obs, _ = env.reset(seed=seed)
    spec = ENV_DEFS[name]
    # start states bit-identical to the numpy Philox oracle; observations to float32 accuracy
    assert torch.equal(env.get_state().cpu(), reference.philox_start_state(spec, seed, np.arange(NUM_ENVS), 0).T)
    assert_close(obs.cpu(), torch.from_numpy(reset_obs(name, seed, np.arange(NUM_ENVS), 0)), tol=STRICT_FLOAT32,
                 name="reset obs")
    start = wide_states(name, NUM_ENVS, rng)
    start[::3] = to_numpy(env.get_state())[::3]  # keep a few Philox start states
    env.set_state(torch.from_numpy(start).float())
    episode = np.zeros(NUM_ENVS, dtype=np.int64)  # index of each env's current start state
    length = np.zeros(NUM_ENVS, dtype=np.int64)
    pending = np.zeros(NUM_ENVS, dtype=bool)  # NEXT_STEP: reset at this step
    seen_terminated = seen_truncated = 0
    for _ in range(STEPS):
        before = to_numpy(env.get_state())
        actions = random_actions(name, NUM_ENVS, rng)
        obs, rewards, terminated, truncated, infos = env.step(actions)
        assert obs.device == rewards.device == terminated.device == env.device
        assert terminated.dtype == truncated.dtype == torch.bool and obs.dtype == rewards.dtype == torch.float32
        fresh = reset_obs(name, seed, np.arange(NUM_ENVS), episode + 1)
        want_obs = np.zeros((NUM_ENVS, ENV_DEFS[name].obs_dim))
        want_rew = np.zeros(NUM_ENVS)
        want_term = np.zeros(NUM_ENVS, dtype=bool)
        want_trunc = np.zeros(NUM_ENVS, dtype=bool)
        for i in range(NUM_ENVS):
            if pending[i]:
                want_obs[i], length[i] = fresh[i], 0
                episode[i] += 1
                continue
            a = actions[i] if ENV_DEFS[name].discrete else actions[i, 0]
            want_obs[i], want_rew[i], want_term[i] = gym_step(name, oracle, before[i], a)
            length[i] += 1
            want_trunc[i] = length[i] >= MAX_STEPS
        ended = want_term | want_trunc
        seen_terminated += int(want_term.sum())
        seen_truncated += int(want_trunc.sum())
        assert np.array_equal(to_numpy(terminated), want_term), (to_numpy(terminated), want_term)
        assert np.array_equal(to_numpy(truncated), want_trunc), (to_numpy(truncated), want_trunc)
        assert_close(rewards.cpu(), torch.from_numpy(want_rew), tol=STRICT_FLOAT32, name="rewards")
        if mode == AutoresetMode.SAME_STEP:
            assert np.array_equal(to_numpy(infos["_final_obs"]), ended)
            final = to_numpy(infos["final_obs"])[ended]
            assert_close(torch.from_numpy(final), torch.from_numpy(want_obs[ended]), tol=TOLERANCE[name],
                         name="final_obs")
            want_obs[ended] = fresh[ended]
            length[ended] = 0
            episode[ended] += 1
        assert_close(obs.cpu(), torch.from_numpy(want_obs), tol=TOLERANCE[name], name="obs")
        if mode == AutoresetMode.NEXT_STEP:
            pending = ended
        elif mode == AutoresetMode.DISABLED and ended.any():
            obs, _ = env.reset(options={"reset_mask": torch.from_numpy(ended).to(device)})
            fresh = reset_obs(name, seed, np.arange(NUM_ENVS), episode + 1)
            assert_close(obs[torch.from_numpy(ended)].cpu(), torch.from_numpy(fresh[ended]), tol=STRICT_FLOAT32,
                         name="masked reset obs")
            length[ended] = 0
            episode[ended] += 1
    # the wide start states make episodes end both ways within the run
    assert seen_truncated > 0
    assert seen_terminated > 0 or name == "Pendulum-v1"
