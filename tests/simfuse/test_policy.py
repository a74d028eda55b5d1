"""In-kernel MLP policies of any depth, width and activation mix; the categorical head up to 64 actions."""

import copy
import math

import pytest
import torch
import triton.language as tl
from simfuse_testing import make
from torch import nn

import fusecore
from fusecore.backend import jit
from fusecore.plan import next_power_of_2
from fusecore.testing import assert_all_written, assert_close, fresh_generator, poisoned
from simfuse import MLPPolicy, reference
from simfuse.kernels.policy import sample_categorical
from simfuse.policy import MAX_DISCRETE_ACTIONS, MAX_HIDDEN_LAYERS, MAX_WIDTH
from simfuse.specs import ENV_DEFS

# (env, actor, critic, precision): deep, unequal, mixed, identity-activated and linear networks
CASES = {
    "cartpole-mixed-ieee": ("CartPole-v1",
                            lambda: nn.Sequential(nn.Linear(4, 24), nn.ReLU(), nn.Linear(24, 40), nn.Tanh(),
                                                  nn.Linear(40, 7), nn.Linear(7, 2)),
                            lambda: nn.Sequential(nn.Linear(4, 1)), "ieee"),
    "acrobot-deep-bf16": ("Acrobot-v1",
                          lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 48), nn.ReLU(),
                                                nn.Linear(48, 8), nn.Tanh(), nn.Linear(8, 33), nn.ReLU(),
                                                nn.Linear(33, 3)),
                          lambda: nn.Sequential(nn.Linear(6, 20), nn.ReLU(), nn.Linear(20, 1)), "bf16"),
    "cartpole-2x24-tf32": ("CartPole-v1",
                           lambda: nn.Sequential(nn.Linear(4, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                                                 nn.Linear(24, 2)),
                           lambda: nn.Sequential(nn.Linear(4, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                                                 nn.Linear(24, 1)), "tf32"),
    "pendulum-2x24-fp16": ("Pendulum-v1",
                           lambda: nn.Sequential(nn.Linear(3, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(),
                                                 nn.Linear(24, 1)),
                           lambda: nn.Sequential(nn.Linear(3, 24), nn.ReLU(), nn.Linear(24, 1)), "fp16"),
    "pendulum-linear-ieee": ("Pendulum-v1", lambda: nn.Sequential(nn.Linear(3, 1)),
                             lambda: nn.Sequential(nn.Linear(3, 12), nn.Tanh(), nn.Linear(12, 12, bias=False),
                                                   nn.Tanh(), nn.Linear(12, 1)), "ieee"),
}
# tf32 / fp16 operands carry 11-bit mantissas, bf16 8-bit ones (the interpreter too: fusecore's
# backend gives it the GPU's bfloat16 rounding and products); ieee is float32 throughout.  bf16:
# every layer's activations are rounded, and a small output of a random net (cancellation) makes
# the tail heavy — 40 draws of acrobot-deep-bf16 on the interpreter: median 4e-3, largest 3.0e-2,
# and one draw of 3.1e-2 in a full run; 6e-2 is twice the largest seen.
TOLERANCE = {"ieee": 1e-4, "tf32": 5e-3, "bf16": 6e-2, "fp16": 5e-3}


@pytest.mark.parametrize("case", list(CASES))
def test_mlp_of_any_shape_matches_pytorch(case, device):
    """log π(a|o) and V(o) from the kernel equal the float64 PyTorch modules on the recorded observations."""
    name, make_actor, make_critic, precision = CASES[case]
    torch.manual_seed(fresh_generator().initial_seed())
    actor, critic = make_actor().to(device), make_critic().to(device)
    policy = MLPPolicy(actor, critic, log_std=-0.3, precision=precision)
    env = make(name, 13, max_episode_steps=4, autoreset_mode="SameStep", device=device)
    env.reset(seed=7)
    traj = env.rollout(policy, num_steps=5)
    assert_all_written(traj.log_probs, "log_probs")
    assert_all_written(traj.values, "values")
    with torch.no_grad():
        obs = traj.obs.double().cpu()
        out = copy.deepcopy(actor).double().cpu()(obs)
        values = copy.deepcopy(critic).double().cpu()(obs)[..., 0]
    if ENV_DEFS[name].discrete:
        logp = torch.distributions.Categorical(logits=out).log_prob(traj.actions.long().cpu())
    else:
        logp = torch.distributions.Normal(out[..., 0], math.exp(-0.3)).log_prob(traj.actions.double().cpu()[..., 0])
    assert_close(traj.log_probs.cpu(), logp, tol=TOLERANCE[precision], name="log_probs")
    assert_close(traj.values.cpu(), values, tol=TOLERANCE[precision], name="values")
    # the unfused reference with the same Philox draws takes (almost) the same actions
    ref_env = make(name, 13, max_episode_steps=4, autoreset_mode="SameStep", device=device)
    ref_env.reset(seed=7)
    with fusecore.use_reference():
        ref = ref_env.rollout(policy, num_steps=5)
    if ENV_DEFS[name].discrete:
        # From the same first observations: a uniform within the products' rounding of a CDF
        # step may pick the neighbour (rare in float32, a few percent with bf16 operands).
        agree = (traj.actions[0] == ref.actions[0]).float().mean().item()
        assert agree >= (0.9 if precision == "ieee" else 0.75), agree
    else:
        assert_close(traj.actions, ref.actions, tol=TOLERANCE[precision], name="actions")


@jit
def _categorical_kernel(logits_ptr, u_ptr, action_ptr, log_prob_ptr, rows,
                        NUM_ACTIONS: tl.constexpr, A_PAD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    col = tl.arange(0, A_PAD)
    inside = row < rows
    logits = tl.load(logits_ptr + row[:, None] * NUM_ACTIONS + col[None, :],
                     mask=inside[:, None] & (col[None, :] < NUM_ACTIONS), other=0.0)
    u = tl.load(u_ptr + row, mask=inside, other=0.0)
    action, log_prob = sample_categorical(logits, u, NUM_ACTIONS, A_PAD)
    tl.store(action_ptr + row, action, mask=inside)
    tl.store(log_prob_ptr + row, log_prob, mask=inside)


def _sample(logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n = logits.shape
    action = poisoned((rows,), torch.float32, logits.device)
    log_prob = poisoned((rows,), torch.float32, logits.device)
    _categorical_kernel[(fusecore.cdiv(rows, 32),)](logits, u, action, log_prob, rows, NUM_ACTIONS=n,
                                                    A_PAD=max(16, next_power_of_2(n)), BLOCK=32)
    assert_all_written(action, "action")
    assert_all_written(log_prob, "log_prob")
    return action, log_prob


@pytest.mark.parametrize("num_actions", [2, 5, 37, MAX_DISCRETE_ACTIONS])
def test_categorical_head_matches_torch_distributions(num_actions, device):
    """Inverse-CDF samples equal the float64 rule; log-probs equal torch.distributions.Categorical's."""
    gen = fresh_generator()
    rows = 67
    logits = (torch.randn((rows, num_actions), generator=gen) * 3).to(device)
    u = torch.rand(rows, generator=gen).to(device)
    action, log_prob = _sample(logits, u)
    want_action, _ = reference.sample_categorical(logits.double().cpu(), u.double().cpu())
    assert (action.cpu().long() == want_action).float().mean().item() > 0.95, gen.initial_seed()
    assert int(action.max()) < num_actions and int(action.min()) >= 0
    want_logp = torch.distributions.Categorical(logits=logits.double().cpu()).log_prob(action.long().cpu())
    assert_close(log_prob.cpu(), want_logp, tol=1e-5, name="log_prob")


def test_categorical_head_samples_softmax(device):
    """Frequencies of 4,096 kernel samples from one row of 9 logits follow softmax (4 standard errors)."""
    gen = fresh_generator()
    row = torch.randn(9, generator=gen)
    logits = row.expand(4096, 9).contiguous().to(device)
    action, _ = _sample(logits, torch.rand(4096, generator=gen).to(device))
    freq = torch.bincount(action.long().cpu(), minlength=9).double() / 4096
    want = torch.softmax(row.double(), 0)
    assert ((freq - want).abs() <= 4 * (want * (1 - want) / 4096).sqrt() + 1e-3).all(), (freq, want)


def test_policy_rejects_unsupported_networks():
    def wide(width):
        return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 2))

    deep = [nn.Linear(4, 8)] + [m for _ in range(MAX_HIDDEN_LAYERS) for m in (nn.Tanh(), nn.Linear(8, 8))]
    deep += [nn.Tanh(), nn.Linear(8, 2)]
    with pytest.raises(ValueError, match=f"width {MAX_WIDTH + 1}; the in-kernel MLP supports widths up to"):
        MLPPolicy(wide(MAX_WIDTH + 1))
    MLPPolicy(wide(MAX_WIDTH))
    with pytest.raises(ValueError, match=f"{MAX_HIDDEN_LAYERS + 1} hidden layers; .* at most {MAX_HIDDEN_LAYERS}"):
        MLPPolicy(nn.Sequential(*deep))
    with pytest.raises(ValueError, match=r"actor\[0\] is a Tanh that does not follow a Linear"):
        MLPPolicy(nn.Sequential(nn.Tanh(), nn.Linear(4, 2)))
    with pytest.raises(ValueError, match=r"actor\[2\] is a ReLU that does not follow a Linear"):
        MLPPolicy(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.ReLU(), nn.Linear(8, 2)))
    with pytest.raises(ValueError, match="must end with an nn.Linear"):
        MLPPolicy(nn.Sequential(nn.Linear(4, 2), nn.Tanh()))
    with pytest.raises(ValueError, match="a Linear with 8 outputs feeds one with 9 inputs"):
        MLPPolicy(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(9, 2)))
    with pytest.raises(TypeError, match="must be a torch.nn.Sequential"):
        MLPPolicy(nn.Linear(4, 2))
    with pytest.raises(ValueError, match="critic must have 1 output"):
        MLPPolicy(wide(8), nn.Sequential(nn.Linear(4, 2)))
    with pytest.raises(ValueError, match="critic takes 3 inputs but the actor 4"):
        MLPPolicy(wide(8), nn.Sequential(nn.Linear(3, 1)))
    with pytest.raises(ValueError, match="precision must be one of"):
        MLPPolicy(wide(8), precision="fp8")
    with pytest.raises(ValueError, match="at most 64 actions, got Discrete\\(65\\)"):
        MLPPolicy(nn.Sequential(nn.Linear(4, 65))).check_env(4, 65)
