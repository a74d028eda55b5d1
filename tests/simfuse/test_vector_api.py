"""The Gymnasium contract of the simfuse vector envs, seeding, and errors at the API boundary."""

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from simfuse_testing import ENV_NAMES, make, random_actions, to_numpy

import simfuse
from fusecore.testing import fresh_generator
from simfuse import reference
from simfuse.specs import ENV_DEFS


@pytest.mark.parametrize("name", ENV_NAMES)
def test_gymnasium_vector_contract(name, device):
    """make_vec through Gymnasium's registry; spaces, metadata, shapes, dtypes, observations in space."""
    env = gymnasium.make_vec(f"simfuse/{name}", num_envs=3, vectorization_mode="vector_entry_point", device=device)
    spec = ENV_DEFS[name]
    reference_env = gymnasium.make(name)
    assert isinstance(env, gymnasium.vector.VectorEnv) and env.num_envs == 3
    assert env.spec.id == f"simfuse/{name}" and env.max_episode_steps == spec.max_episode_steps
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert env.single_observation_space == reference_env.observation_space
    assert env.single_action_space == reference_env.action_space
    assert env.observation_space.shape == (3, spec.obs_dim)
    assert env.action_space == gymnasium.vector.utils.batch_space(env.single_action_space, 3)
    obs, info = env.reset(seed=0)
    assert info == {} and obs.shape == (3, spec.obs_dim) and obs.dtype == torch.float32
    assert env.observation_space.contains(to_numpy(obs))
    env.action_space.seed(0)
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert reward.shape == terminated.shape == truncated.shape == (3,)
        assert obs.device.type == device.type
    assert repr(env).startswith(f"{type(env).__name__}(simfuse/{name}")
    env.close()
    assert env.closed


def test_make_vec_shortcut_and_kwargs(device):
    env = simfuse.make_vec("Pendulum-v1", num_envs=2, autoreset_mode="SameStep", max_episode_steps=7, device=device)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP and env.max_episode_steps == 7
    assert simfuse.make_vec("simfuse/Acrobot-v1", 1, device=device).num_envs == 1
    with pytest.raises(ValueError, match="unknown simfuse env"):
        simfuse.make_vec("LunarLander-v3")


def test_seeding_reproducible_and_device_independent(device):
    """The same seed gives the same episodes; env i's start state depends only on (seed, i)."""
    seed = fresh_generator().initial_seed()
    a, b = make("CartPole-v1", 6, device=device), make("CartPole-v1", 11, device=device)
    obs_a, _ = a.reset(seed=seed)
    obs_b, _ = b.reset(seed=seed)
    assert torch.equal(obs_a, obs_b[:6])
    expected = reference.philox_start_state(ENV_DEFS["CartPole-v1"], seed, np.arange(6), 0).T
    assert torch.equal(obs_a.cpu(), expected)  # the CPU numpy oracle: the same bits as the kernel
    assert torch.equal(a.rollout("random", num_steps=20).obs, b.rollout("random", num_steps=20).obs[:, :6])
    other, _ = a.reset(seed=seed + 1)
    assert not torch.equal(other, obs_a)
    again, _ = a.reset(seed=seed)
    assert torch.equal(again, obs_a)


def test_step_accepts_numpy_and_torch_of_any_int_dtype(device):
    env = make("MountainCar-v0", 4, device=device)
    env.reset(seed=2)
    out_np = env.step(np.array([0, 1, 2, 1]))[0]
    env.reset(seed=2)
    out_t = env.step(torch.tensor([0, 1, 2, 1], dtype=torch.int8, device=device))[0]
    assert torch.equal(out_np, out_t)


def test_bad_input_raises_clear_errors(device):
    with pytest.raises(ValueError, match="num_envs must be >= 1"):
        make("CartPole-v1", 0, device=device)
    with pytest.raises(TypeError, match="num_envs must be an int"):
        simfuse.CartPoleVectorEnv(num_envs=2.0)
    with pytest.raises(ValueError, match="autoreset_mode must be one of"):
        make("CartPole-v1", 2, autoreset_mode="sometimes", device=device)
    with pytest.raises(ValueError, match="max_episode_steps"):
        make("CartPole-v1", 2, max_episode_steps=0, device=device)
    with pytest.raises(ValueError, match="render_mode"):
        make("CartPole-v1", 2, render_mode="human", device=device)
    env = make("CartPole-v1", 4, device=device, validate=True)  # value checks also on the GPU
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step(np.zeros(4, dtype=np.int64))
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.rollout("random", num_steps=2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        env.step(np.zeros(5, dtype=np.int64))
    with pytest.raises(TypeError, match="actions has dtype float32; expected one of int8"):
        env.step(np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="outside the Discrete"):
        env.step(np.array([0, 1, 2, 0]))
    with pytest.raises(TypeError, match="torch.Tensor or numpy array"):
        env.step([0, 1, 0, 1])
    with pytest.raises(ValueError, match="is on device 'meta'"):
        env.step(torch.zeros(4, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="num_steps must be an int"):
        env.rollout("random", num_steps=-1)
    with pytest.raises(ValueError, match="policy must be 'random'"):
        env.rollout("greedy", num_steps=1)
    with pytest.raises(ValueError, match="does not match"):
        env.rollout(torch.zeros((3, 4), dtype=torch.int64, device=device), num_steps=2)
    with pytest.raises(ValueError, match="record_final_obs"):
        env.rollout("random", num_steps=1, record_final_obs=True)
    with pytest.raises(ValueError, match="unknown reset options"):
        env.reset(options={"low": -0.1})
    with pytest.raises(TypeError, match="has dtype int64; expected one of bool"):
        env.reset(options={"reset_mask": np.ones(4, dtype=np.int64)})
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        env.reset(options={"reset_mask": np.ones(3, dtype=bool)})
    with pytest.raises(ValueError, match="at least one True"):
        env.reset(options={"reset_mask": np.zeros(4, dtype=bool)})
    with pytest.raises(ValueError, match="seed must be in"):
        env.reset(seed=-1)
    with pytest.raises(ValueError, match="policy expects observations of size 3"):
        env.rollout(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)), 1)
    with pytest.raises(ValueError, match=r"actor\[1\] is a Dropout; the in-kernel MLP takes only"):
        env.rollout(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(), torch.nn.Linear(8, 2)), 1)
    cont = make("Pendulum-v1", 2, device=device, validate=True)
    cont.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(2, 1\)"):
        cont.step(np.zeros(2, dtype=np.float32))
    with pytest.raises(TypeError, match="actions has dtype int64; expected one of float16"):
        cont.step(np.zeros((2, 1), dtype=np.int64))
    with pytest.raises(ValueError, match="NaN"):
        cont.step(np.full((2, 1), np.nan, dtype=np.float32))


def test_validation_switch_and_clamping(device):
    """With validate=False (the GPU default) action values are not read; the kernel clamps them."""
    loose = make("Acrobot-v1", 3, validate=False, device=device)
    strict = make("Acrobot-v1", 3, device=device)
    loose.reset(seed=4)
    strict.reset(seed=4)
    out = loose.step(torch.tensor([7, -3, 1], device=device))[0]
    assert torch.equal(out, strict.step(torch.tensor([2, 0, 1], device=device))[0])


def test_reset_mask_resets_only_masked_envs(device):
    env = make("Acrobot-v1", 5, autoreset_mode="Disabled", device=device)
    env.reset(seed=9)
    env.rollout("random", num_steps=3)
    before = env.get_state()
    mask = torch.tensor([True, False, True, False, False], device=device)
    obs, _ = env.reset(options={"reset_mask": mask})
    after = env.get_state()
    assert torch.equal(after[~mask], before[~mask])
    fresh = reference.philox_start_state(ENV_DEFS["Acrobot-v1"], 9, np.arange(5), 1).T  # start state 1 of each env
    assert torch.equal(after[mask].cpu(), fresh[mask.cpu()])
    assert obs.shape == (5, 6)


def test_set_state_validates(device):
    env = make("CartPole-v1", 3, device=device)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(3, 4\)"):
        env.set_state(torch.zeros(3, 2))
    actions = random_actions("CartPole-v1", 3, np.random.default_rng(0))
    env.set_state(np.zeros((3, 4)))
    obs = env.step(actions)[0]
    assert torch.isfinite(obs).all()


def test_rollout_checks_num_steps_given_with_actions(device):
    """rollout(actions, num_steps=x): a num_steps that is no int >= 0 is named as such, not as a step mismatch."""
    env = make("CartPole-v1", 3, device=device)
    env.reset(seed=0)
    state = env.get_state()
    actions = torch.zeros((2, 3), dtype=torch.int64, device=device)
    for bad in ("2", 2.0, True, -1, [2]):
        with pytest.raises(ValueError, match=r"num_steps must be an int >= 0, got"):
            env.rollout(actions, num_steps=bad)
    with pytest.raises(ValueError, match="num_steps=1 does not match the 2 steps"):
        env.rollout(actions, num_steps=1)
    assert torch.equal(env.get_state(), state)
    assert env.rollout(actions, num_steps=np.int64(2)).obs.shape == (2, 3, 4)


def test_rollout_action_shape_error_names_the_steps_axis(device):
    """Actions shaped for step() ([N] or [N, 1]) given to rollout(): the message asks for [K, N] (+ [1]), not [N, N]."""
    env = make("CartPole-v1", 3, device=device)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"policy must have shape \(K, 3\) \(K steps\) for 3 CartPole-v1 envs, "
                                         r"got \(3,\)"):
        env.rollout(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"policy must have shape \(K, 3\) .*got \(\)"):
        env.rollout(np.array(1))
    with pytest.raises(ValueError, match=r"policy must have shape \(2, 3\) for 3 CartPole-v1 envs, got \(2, 4\)"):
        env.rollout(np.zeros((2, 4), dtype=np.int64))
    cont = make("Pendulum-v1", 2, device=device)
    cont.reset(seed=0)
    with pytest.raises(ValueError, match=r"policy must have shape \(K, 2, 1\) \(K steps\) .*got \(2, 1\)"):
        cont.rollout(np.zeros((2, 1), dtype=np.float32))


def test_rollout_checks_policy_type_before_num_steps(device):
    """rollout(<not a policy>) names the policy, even without num_steps (it used to complain about num_steps)."""
    env = make("CartPole-v1", 3, device=device)
    env.reset(seed=0)
    for bad in ([[0, 1, 0]], None, 3):
        with pytest.raises(TypeError, match="policy must be 'random', an action tensor, an MLPPolicy or an "
                                            "nn.Sequential, got"):
            env.rollout(bad)


def test_rollout_flags_must_be_bools(device):
    """stats_only / record_final_obs take bools; a truthy string or both flags at once is refused, not guessed."""
    env = make("CartPole-v1", 3, autoreset_mode="SameStep", device=device)
    env.reset(seed=0)
    state = env.get_state()
    with pytest.raises(TypeError, match="stats_only must be a bool, got str"):
        env.rollout("random", num_steps=2, stats_only="no")
    with pytest.raises(TypeError, match="record_final_obs must be a bool, got int"):
        env.rollout("random", num_steps=2, record_final_obs=1)
    with pytest.raises(ValueError, match="record_final_obs.*stats_only"):
        env.rollout("random", num_steps=2, stats_only=True, record_final_obs=True)
    assert torch.equal(env.get_state(), state)
    assert env.rollout("random", num_steps=1, stats_only=np.bool_(True)).episodes.shape == (3,)


def test_mlp_policy_checks_log_std():
    """MLPPolicy(log_std=...) takes a finite real number or a one-element float tensor, checked at construction."""
    actor = torch.nn.Sequential(torch.nn.Linear(3, 1))
    for bad, exc, message in (("0.5", TypeError, "log_std must be a real number or a one-element tensor, got str"),
                              (None, TypeError, "got NoneType"), (True, TypeError, "got bool"),
                              (float("nan"), ValueError, "log_std must be finite, got nan"),
                              (float("inf"), ValueError, "log_std must be finite, got inf")):
        with pytest.raises(exc, match=message):
            simfuse.MLPPolicy(actor, log_std=bad)
    assert simfuse.MLPPolicy(actor, log_std=np.float32(-0.5)).log_std_value() == -0.5
    assert simfuse.MLPPolicy(actor, log_std=-1).log_std_value() == -1.0


def test_make_vec_rejects_a_non_string_id():
    """simfuse.make_vec(<not a str>) raises a TypeError naming env_id, not an AttributeError from str methods."""
    with pytest.raises(TypeError, match="env_id must be a str"):
        simfuse.make_vec(simfuse.CartPoleVectorEnv, 2)
