"""Policies for fused rollouts: an MLP from ``torch.nn.Sequential`` packed for the kernel.

:class:`MLPPolicy` takes an actor ``nn.Sequential(Linear, act, Linear[, act, Linear, act], Linear)``
(one or two hidden layers of equal width, ``act`` all ``Tanh`` or all ``ReLU``) and, optionally,
a critic of the same shape with one output.  For a discrete env the actor's outputs are the
logits of a categorical distribution; for a continuous one its single output is the mean of
a Gaussian whose log standard deviation is ``log_std`` (a float or a one-element parameter).

The weights are re-packed (transposed, zero-padded to powers of two >= 16, float32) on every
call of :meth:`packed`, a few small device ops without any host synchronisation, so a policy
trained between rollouts is always used with its current weights.
"""

from __future__ import annotations

import torch
from torch import nn

from fusecore.plan import next_power_of_2

MAX_DISCRETE_ACTIONS = 4


def _pad(size: int) -> int:
    """Padded size of an MLP dimension: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, next_power_of_2(size))


def _layers(net: nn.Sequential, name: str) -> tuple[list[nn.Linear], str]:
    if not isinstance(net, nn.Sequential):
        raise TypeError(f"{name} must be a torch.nn.Sequential of Linear and Tanh/ReLU layers, "
                        f"got {type(net).__name__}")
    modules = list(net)
    linears, acts = modules[0::2], modules[1::2]
    if not all(isinstance(m, nn.Linear) for m in linears) or len(linears) != len(acts) + 1:
        raise ValueError(f"{name} must alternate Linear and activation layers, starting and ending with Linear; "
                         f"got {[type(m).__name__ for m in modules]}")
    if len(linears) not in (2, 3):
        raise ValueError(f"{name} must have one or two hidden layers (2 or 3 Linear layers), got {len(linears)}")
    kinds = {type(a) for a in acts}
    if kinds == {nn.Tanh}:
        activation = "tanh"
    elif kinds == {nn.ReLU}:
        activation = "relu"
    else:
        raise ValueError(f"{name}'s activations must be all nn.Tanh or all nn.ReLU, "
                         f"got {sorted(k.__name__ for k in kinds)}")
    width = linears[0].out_features
    if len(linears) == 3 and (linears[1].in_features != width or linears[1].out_features != width):
        shapes = [(m.in_features, m.out_features) for m in linears]
        raise ValueError(f"{name}'s hidden layers must have equal width, got {shapes}")
    return linears, activation


class MLPPolicy:
    """An actor (and optional critic) MLP evaluated and sampled inside the rollout kernel.

    Args:
        actor: ``nn.Sequential`` mapping observations [B, obs_dim] to logits [B, n] (discrete)
            or the action mean [B, 1] (continuous).
        critic: optional ``nn.Sequential`` of the same layer structure mapping observations
            to values [B, 1]; when given, rollouts also return V(o_t).
        log_std: log standard deviation of the Gaussian head (continuous envs).
        precision: ``"ieee"`` (float32 products, log-probabilities exact to ~1e-6) or
            ``"tf32"`` (tensor cores, ~8x faster on the GPU, log-probabilities within ~1e-3).
    """

    def __init__(self, actor: nn.Sequential, critic: nn.Sequential | None = None,
                 log_std: float | torch.Tensor = 0.0, precision: str = "ieee"):
        if precision not in ("ieee", "tf32"):
            raise ValueError(f"precision must be 'ieee' or 'tf32', got {precision!r}")
        self.precision = precision
        actor_layers, self.activation = _layers(actor, "actor")
        self.actor, self.critic = actor, critic
        self.two_hidden = len(actor_layers) == 3
        self.obs_dim = actor_layers[0].in_features
        self.hidden = actor_layers[0].out_features
        self.out_dim = actor_layers[-1].out_features
        if critic is not None:
            critic_layers, critic_act = _layers(critic, "critic")
            shape = [(m.in_features, m.out_features) for m in critic_layers]
            expected = [(m.in_features, m.out_features) for m in actor_layers[:-1]] + [(self.hidden, 1)]
            if critic_act != self.activation or shape != expected:
                raise ValueError(f"critic must mirror the actor's hidden layers and activation with one output: "
                                 f"expected {expected} ({self.activation}), got {shape} ({critic_act})")
        if isinstance(log_std, torch.Tensor) and log_std.numel() != 1:
            raise ValueError(f"log_std must be a float or a one-element tensor, got shape {tuple(log_std.shape)}")
        self.log_std = log_std
        self.activation_id = 0 if self.activation == "tanh" else 1
        self.d_pad, self.h_pad, self.a_pad = _pad(self.obs_dim), _pad(self.hidden), _pad(self.out_dim)

    def check_env(self, obs_dim: int, num_actions: int) -> None:
        """Raise ValueError unless the actor fits an env with ``obs_dim`` and ``num_actions`` (0: continuous)."""
        if self.obs_dim != obs_dim:
            raise ValueError(f"policy expects observations of size {self.obs_dim}, the env has {obs_dim}")
        want = num_actions if num_actions > 0 else 1
        if self.out_dim != want:
            kind = f"{num_actions} logits" if num_actions > 0 else "1 output (the Gaussian mean)"
            raise ValueError(f"policy's actor has {self.out_dim} outputs, the env needs {kind}")
        if num_actions > MAX_DISCRETE_ACTIONS:
            raise ValueError(f"the in-kernel categorical head supports at most {MAX_DISCRETE_ACTIONS} actions, "
                             f"got {num_actions}")

    def log_std_value(self) -> float:
        """The Gaussian head's log standard deviation as a Python float (one host read if a tensor)."""
        return float(self.log_std.detach().reshape(()).item()) if isinstance(self.log_std, torch.Tensor) \
            else float(self.log_std)

    def actor_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(m.weight.detach(), m.bias.detach()) for m in self.actor if isinstance(m, nn.Linear)]

    def critic_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        assert self.critic is not None
        return [(m.weight.detach(), m.bias.detach()) for m in self.critic if isinstance(m, nn.Linear)]

    def _pack(self, layers: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> tuple[torch.Tensor, ...]:
        dims = [self.d_pad, self.h_pad] + ([self.h_pad] if self.two_hidden else []) + [self.a_pad]
        packed: list[torch.Tensor] = []
        for (w, b), rows, cols in zip(layers, dims[:-1], dims[1:]):
            wt = torch.zeros((rows, cols), dtype=torch.float32, device=device)
            wt[: w.shape[1], : w.shape[0]] = w.T.to(device=device, dtype=torch.float32)
            bp = torch.zeros(cols, dtype=torch.float32, device=device)
            bp[: b.shape[0]] = b.to(device=device, dtype=torch.float32)
            packed += [wt.contiguous(), bp]
        if not self.two_hidden:  # the kernel's hidden-to-hidden slot is unused: any tensor fills it
            packed[2:2] = [packed[0], packed[1]]
        return tuple(packed)

    def packed(self, device: torch.device) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
        """Kernel weights (W_in, b_in, W_hid, b_hid, W_out, b_out) of the actor and the critic."""
        actor = self._pack(self.actor_layers(), device)
        critic = self._pack(self.critic_layers(), device) if self.critic is not None else None
        return actor, critic
