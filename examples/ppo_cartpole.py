"""PPO on CartPole-v1 trained entirely on the device from fused rollouts.

Each update collects ``--num-steps`` steps of ``--num-envs`` envs in ONE kernel launch: the
actor MLP is evaluated and sampled inside the kernel, which also writes the log-probabilities,
the critic's values and the pre-reset final observations (to bootstrap truncated episodes).
The PPO update is plain PyTorch on the same device; nothing goes through the host except the
printed numbers.

    PYTHONPATH=. python examples/ppo_cartpole.py                 # GPU: 4,096 envs, stops at 475
    PYTHONPATH=. python examples/ppo_cartpole.py --max-seconds 120   # ... or after 2 minutes
    PYTHONPATH=. python examples/ppo_cartpole.py --cpu-small     # CPU (Triton interpreter): small, slow

Evaluation: ``--eval-envs`` fresh envs run 500 steps with the current (stochastic) policy; the
score is the mean return of each env's first episode.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import fusecore
import simfuse


def mlp(out: int, hidden: int, std: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, out))
    for layer in net:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, 2**0.5)
            nn.init.zeros_(layer.bias)
    nn.init.orthogonal_(net[-1].weight, std)
    return net


def evaluate(policy: simfuse.MLPPolicy, num_envs: int, num_steps: int, seed: int, device: torch.device) -> float:
    """Mean return of the first episode of ``num_envs`` envs under the sampling policy (``num_steps`` at most)."""
    env = simfuse.make_vec("CartPole-v1", num_envs, device=device, autoreset_mode="SameStep")
    env.reset(seed=seed)
    traj = env.rollout(policy, num_steps=num_steps)
    done = (traj.terminated | traj.truncated).int()
    in_first_episode = (torch.cumsum(done, 0) - done) == 0
    return (traj.rewards * in_first_episode).sum(0).mean().item()


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--num-steps", type=int, default=32, help="rollout length K per update (one launch)")
    parser.add_argument("--updates", type=int, default=300, help="maximum number of PPO updates")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-envs", type=int, default=1024)
    parser.add_argument("--eval-steps", type=int, default=500, help="evaluation horizon (500: a whole episode)")
    parser.add_argument("--target", type=float, default=475.0, help="stop once the evaluation return reaches it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", default="tf32", choices=["ieee", "tf32", "bf16", "fp16"],
                        help="in-kernel MLP products (PPO's ratio tolerates the rounding of the fast modes)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop after the first evaluation past this wall-clock budget")
    parser.add_argument("--cpu-small", action="store_true",
                        help="the small CPU configuration: 32 envs x 32 steps, 40 updates, 32 eval envs")
    args = parser.parse_args(argv)
    if args.cpu_small:
        args.num_envs, args.num_steps, args.updates, args.eval_envs, args.minibatches = 32, 32, 40, 32, 4
        args.lr, args.eval_every = 2.5e-3, 10

    device = fusecore.default_device()
    torch.manual_seed(args.seed)
    actor, critic = mlp(2, args.hidden, 0.01).to(device), mlp(1, args.hidden, 1.0).to(device)
    policy = simfuse.MLPPolicy(actor, critic, precision=args.precision)
    optimizer = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=args.lr, eps=1e-5)
    env = simfuse.make_vec("CartPole-v1", args.num_envs, device=device, autoreset_mode="SameStep")
    env.reset(seed=args.seed)
    batch = args.num_envs * args.num_steps
    minibatch = batch // args.minibatches
    print(f"PPO CartPole-v1 on {device} ({fusecore.backend.describe()}): {args.num_envs} envs x "
          f"{args.num_steps} steps per fused rollout")
    started, env_steps, score = time.perf_counter(), 0, float("nan")
    for update in range(1, args.updates + 1):
        traj = env.rollout(policy, num_steps=args.num_steps, record_final_obs=True)
        env_steps += batch
        with torch.no_grad():
            # bootstrap truncated episodes from the value of their final observation
            final_values = critic(traj.final_obs)[..., 0]
            rewards = traj.rewards + args.gamma * final_values * traj.truncated
            ended = (traj.terminated | traj.truncated).float()
            next_value = critic(traj.next_obs)[..., 0]
            advantages = torch.zeros_like(rewards)
            running = torch.zeros_like(next_value)
            for t in reversed(range(args.num_steps)):
                following = next_value if t == args.num_steps - 1 else traj.values[t + 1]
                delta = rewards[t] + args.gamma * following * (1 - ended[t]) - traj.values[t]
                running = delta + args.gamma * args.gae_lambda * (1 - ended[t]) * running
                advantages[t] = running
            returns = advantages + traj.values
        obs, actions = traj.obs.reshape(batch, 4), traj.actions.reshape(batch).long()
        old_log_probs, advantages, returns = traj.log_probs.reshape(batch), advantages.reshape(batch), \
            returns.reshape(batch)
        for _ in range(args.epochs):
            order = torch.randperm(batch, device=device)
            for start in range(0, batch, minibatch):
                idx = order[start:start + minibatch]
                log_probs = torch.log_softmax(actor(obs[idx]), -1).gather(1, actions[idx, None])[:, 0]
                ratio = torch.exp(log_probs - old_log_probs[idx])
                adv = advantages[idx]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - args.clip, 1 + args.clip) * adv).mean()
                value_loss = 0.5 * (critic(obs[idx])[:, 0] - returns[idx]).pow(2).mean()
                optimizer.zero_grad()
                (policy_loss + 0.5 * value_loss).backward()
                nn.utils.clip_grad_norm_([*actor.parameters(), *critic.parameters()], 0.5)
                optimizer.step()
        if update % args.eval_every == 0 or update == args.updates:
            score = evaluate(policy, args.eval_envs, args.eval_steps, seed=10_000 + update, device=device)
            elapsed = time.perf_counter() - started
            print(f"update {update:4d}  env-steps {env_steps:>11,}  eval return {score:7.1f}  "
                  f"{elapsed:7.1f} s  ({env_steps / elapsed:,.0f} env-steps/s incl. training)")
            if score >= args.target:
                print(f"reached {score:.1f} >= {args.target} after {env_steps:,} env-steps in {elapsed:.1f} s")
                break
            if args.max_seconds is not None and elapsed > args.max_seconds:
                print(f"stopped at the time budget ({args.max_seconds:.0f} s) with eval return {score:.1f}")
                break
    return score


if __name__ == "__main__":
    main()
