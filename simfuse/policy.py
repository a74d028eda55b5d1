"""Policies for fused rollouts: MLPs from ``torch.nn.Sequential`` packed for the kernel.

:class:`MLPPolicy` takes an actor ``nn.Sequential`` of ``nn.Linear`` layers, each but the
last optionally followed by ``nn.Tanh`` or ``nn.ReLU`` (mixed freely; a Linear followed
directly by a Linear is an identity activation), of any widths up to :data:`MAX_WIDTH` and
up to :data:`MAX_HIDDEN_LAYERS` hidden layers, and optionally a critic of the same kind with
one output (its own depth, widths and activations).  For a discrete env the actor's outputs
are the logits of a categorical distribution over up to :data:`MAX_DISCRETE_ACTIONS` actions;
for a continuous one its single output is the mean of a Gaussian whose log standard
deviation is ``log_std`` (a float or a one-element parameter).

The weights are re-packed (transposed, zero-padded to powers of two >= 16, in the dtype of
``precision``) on every call of :meth:`packed`, a few small device ops without any host
synchronisation, so a policy trained between rollouts is always used with its current weights.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn

from fusecore.plan import next_power_of_2

MAX_DISCRETE_ACTIONS = 64
MAX_HIDDEN_LAYERS = 8
MAX_WIDTH = 256
# precision -> (dtype of the packed weights, tl.dot input precision for float32 operands)
PRECISIONS = {"ieee": (torch.float32, "ieee"), "tf32": (torch.float32, "tf32"),
              "bf16": (torch.bfloat16, "tf32"), "fp16": (torch.float16, "tf32")}
ACTIVATION_CODES = {nn.Tanh: 0, nn.ReLU: 1}
IDENTITY = 2


def _pad(size: int) -> int:
    """Padded size of an MLP dimension: a power of two, at least 16 (``tl.dot``'s minimum)."""
    return max(16, next_power_of_2(size))


@dataclass(frozen=True)
class MLPShape:
    """The kernel's view of one network: hidden layers, their activation codes, padded sizes.

    ``activations`` packs 2 bits per hidden layer (layer l in bits 2l, 2l+1): 0 tanh, 1 ReLU,
    2 identity.  ``width`` is the padded width P of every hidden layer (the input size's pad
    for a network without hidden layers); ``in_pad`` and ``out_pad`` pad the input and output.
    """

    linears: tuple[nn.Linear, ...]
    hidden: int
    activations: int
    in_features: int
    out_features: int
    in_pad: int
    width: int
    out_pad: int


def parse_mlp(net: nn.Sequential, name: str) -> MLPShape:
    """Check that ``net`` is a Sequential the kernel evaluates and describe it; ValueError/TypeError if not."""
    if not isinstance(net, nn.Sequential):
        raise TypeError(f"{name} must be a torch.nn.Sequential of Linear and Tanh/ReLU layers, "
                        f"got {type(net).__name__}")
    modules = list(net)
    kinds = [type(m).__name__ for m in modules]
    linears: list[nn.Linear] = []
    codes: list[int] = []
    for position, module in enumerate(modules):
        if isinstance(module, nn.Linear):
            if linears and len(codes) < len(linears):
                codes.append(IDENTITY)  # Linear directly after Linear
            linears.append(module)
        elif type(module) in ACTIVATION_CODES:
            if len(codes) == len(linears):
                raise ValueError(f"{name}[{position}] is a {type(module).__name__} that does not follow a Linear "
                                 f"layer; layers: {kinds}")
            codes.append(ACTIVATION_CODES[type(module)])
        else:
            raise ValueError(f"{name}[{position}] is a {type(module).__name__}; the in-kernel MLP takes only "
                             f"nn.Linear, nn.Tanh and nn.ReLU layers: {kinds}")
    if not linears or not isinstance(modules[-1], nn.Linear):
        raise ValueError(f"{name} must end with an nn.Linear layer (the output), got layers {kinds}")
    for prev, nxt in zip(linears, linears[1:]):
        if prev.out_features != nxt.in_features:
            raise ValueError(f"{name}: a Linear with {prev.out_features} outputs feeds one with {nxt.in_features} "
                             f"inputs")
    hidden = len(linears) - 1
    if hidden > MAX_HIDDEN_LAYERS:
        raise ValueError(f"{name} has {hidden} hidden layers; the in-kernel MLP supports at most {MAX_HIDDEN_LAYERS}")
    widths = [m.out_features for m in linears[:-1]]
    widest = max([linears[0].in_features, linears[-1].out_features, *widths])
    if widest > MAX_WIDTH:
        raise ValueError(f"{name} has a layer of width {widest}; the in-kernel MLP supports widths up to {MAX_WIDTH}")
    in_pad = _pad(linears[0].in_features)
    return MLPShape(
        linears=tuple(linears), hidden=hidden, activations=sum(c << (2 * i) for i, c in enumerate(codes)),
        in_features=linears[0].in_features, out_features=linears[-1].out_features, in_pad=in_pad,
        width=_pad(max(widths)) if widths else in_pad, out_pad=_pad(linears[-1].out_features),
    )


def _pack_matrix(weight: torch.Tensor, rows: int, cols: int, dtype: torch.dtype, device) -> torch.Tensor:
    """W [out, in] -> zero-padded W.T [rows, cols] in ``dtype``."""
    packed = torch.zeros((rows, cols), dtype=dtype, device=device)
    packed[: weight.shape[1], : weight.shape[0]] = weight.detach().T.to(device=device, dtype=dtype)
    return packed


def _pack_bias(layer: nn.Linear, cols: int, device) -> torch.Tensor:
    packed = torch.zeros(cols, dtype=torch.float32, device=device)
    if layer.bias is not None:
        packed[: layer.out_features] = layer.bias.detach().to(device=device, dtype=torch.float32)
    return packed


def pack_mlp(shape: MLPShape, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Kernel weights (W_in, b_in, W_hid, b_hid, W_out, b_out) of one network (see :mod:`simfuse.kernels.policy`)."""
    p, layers = shape.width, shape.linears
    if shape.hidden == 0:
        w_out = _pack_matrix(layers[0].weight, shape.in_pad, shape.out_pad, dtype, device)
        b_out = _pack_bias(layers[0], shape.out_pad, device)
        return w_out, b_out, w_out, b_out, w_out, b_out  # the input and hidden slots are unused
    w_in = _pack_matrix(layers[0].weight, shape.in_pad, p, dtype, device)
    b_in = _pack_bias(layers[0], p, device)
    middle = layers[1:-1]
    if middle:
        w_hid = torch.stack([_pack_matrix(m.weight, p, p, dtype, device) for m in middle])
        b_hid = torch.stack([_pack_bias(m, p, device) for m in middle])
    else:  # the hidden-to-hidden slot is unused: any tensor fills it
        w_hid, b_hid = w_in, b_in
    w_out = _pack_matrix(layers[-1].weight, p, shape.out_pad, dtype, device)
    return w_in, b_in, w_hid.contiguous(), b_hid.contiguous(), w_out, _pack_bias(layers[-1], shape.out_pad, device)


class MLPPolicy:
    """An actor (and optional critic) MLP evaluated and sampled inside the rollout kernel.

    Args:
        actor: ``nn.Sequential`` mapping observations [B, obs_dim] to logits [B, n] (discrete)
            or the action mean [B, 1] (continuous).
        critic: optional ``nn.Sequential`` mapping observations to values [B, 1]; when given,
            rollouts also return V(o_t).  Its layers need not mirror the actor's.
        log_std: log standard deviation of the Gaussian head (continuous envs): a finite real
            number, or a one-element tensor (e.g. a trained ``nn.Parameter``, read on the device).
        precision: ``"ieee"`` (float32 products, log-probabilities exact to ~1e-6), ``"tf32"``
            (tensor cores, float32 operands rounded to 10-bit mantissas), ``"bf16"`` or
            ``"fp16"`` (16-bit weights and activations, float32 accumulation; the fastest).
            The fast modes use the GPU's approximate tanh; log-probabilities within ~1e-2.
    """

    def __init__(self, actor: nn.Sequential, critic: nn.Sequential | None = None,
                 log_std: float | torch.Tensor = 0.0, precision: str = "ieee"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        self.precision = precision
        self.weight_dtype, self.dot_precision = PRECISIONS[precision]
        self.actor, self.critic = actor, critic
        self.actor_shape = parse_mlp(actor, "actor")
        self.critic_shape = parse_mlp(critic, "critic") if critic is not None else None
        if self.critic_shape is not None:
            if self.critic_shape.out_features != 1:
                raise ValueError(f"critic must have 1 output (the value), got {self.critic_shape.out_features}")
            if self.critic_shape.in_features != self.actor_shape.in_features:
                raise ValueError(f"critic takes {self.critic_shape.in_features} inputs but the actor "
                                 f"{self.actor_shape.in_features}: both read the observation")
        if isinstance(log_std, torch.Tensor):
            if log_std.numel() != 1:
                raise ValueError(f"log_std must be a float or a one-element tensor, got shape {tuple(log_std.shape)}")
        elif isinstance(log_std, bool) or not isinstance(log_std, numbers.Real):
            raise TypeError(f"log_std must be a real number or a one-element tensor, got {type(log_std).__name__}")
        elif not math.isfinite(log_std):
            # a tensor is read on the device (no host synchronisation), a number can be checked here
            raise ValueError(f"log_std must be finite, got {log_std!r}")
        self.log_std = log_std
        self.obs_dim = self.actor_shape.in_features
        self.out_dim = self.actor_shape.out_features

    @property
    def fast(self) -> bool:
        """Whether the kernel may use approximate transcendentals (every precision but "ieee")."""
        return self.precision != "ieee"

    def check_env(self, obs_dim: int, num_actions: int) -> None:
        """Raise ValueError unless the actor fits an env with ``obs_dim`` and ``num_actions`` (0: continuous)."""
        if self.obs_dim != obs_dim:
            raise ValueError(f"policy expects observations of size {self.obs_dim}, the env has {obs_dim}")
        if num_actions > MAX_DISCRETE_ACTIONS:
            raise ValueError(f"the in-kernel categorical head supports at most {MAX_DISCRETE_ACTIONS} actions, "
                             f"got Discrete({num_actions})")
        want = num_actions if num_actions > 0 else 1
        if self.out_dim != want:
            kind = f"{num_actions} logits" if num_actions > 0 else "1 output (the Gaussian mean)"
            raise ValueError(f"policy's actor has {self.out_dim} outputs, the env needs {kind}")

    def log_std_tensor(self, device: torch.device) -> torch.Tensor:
        """The log standard deviation as a one-element float32 tensor on ``device`` (no host read)."""
        if isinstance(self.log_std, torch.Tensor):
            return self.log_std.detach().reshape(1).to(device=device, dtype=torch.float32)
        return torch.full((1,), float(self.log_std), dtype=torch.float32, device=device)

    def log_std_value(self) -> float:
        """The Gaussian head's log standard deviation as a Python float (one host read if a tensor)."""
        return float(self.log_std.detach().reshape(()).item()) if isinstance(self.log_std, torch.Tensor) \
            else float(self.log_std)

    def packed(self, device: torch.device) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
        """Kernel weights (W_in, b_in, W_hid, b_hid, W_out, b_out) of the actor and the critic."""
        actor = pack_mlp(self.actor_shape, self.weight_dtype, device)
        critic = pack_mlp(self.critic_shape, self.weight_dtype, device) if self.critic_shape is not None else None
        return actor, critic
