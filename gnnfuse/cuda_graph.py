"""A gnnfuse layer on one fixed graph, captured as CUDA graphs: forward and backward replayed.

Called as usual, a layer's step on a graph like ogbn-arxiv spends more host time issuing its
launches (Triton's launch path, torch's ops, the autograd engine) than the GPU spends running
them (``JOURNAL.md``, sessions 4-6).  Full-graph training repeats the same launches on the same
graph every step, so :func:`capture` records them once — the forward and the backward, each
one CUDA graph (``torch.cuda.make_graphed_callables``) — and every later call replays them:

    captured = gnnfuse.capture(GATConv(128, 16, 8).cuda(), graph, x)   # warm-up + capture
    for x in batches:                      # same shapes, dtypes and device as the sample
        loss = loss_fn(captured(x))        # forward: copy x in, replay, a copy of the output out
        loss.backward()                    # backward: replayed; parameter gradients as usual
        optimizer.step()                   # in place: the replays read the updated parameters

Autograd semantics are the layer's: gradients reach the inputs that require them and the
layer's parameters (``captured.parameters()`` are the layer's own), which an optimizer may
update in place between steps.

Attention dropout in training draws its mask from a :class:`fusecore.DevicePhiloxStream`
(``captured.rng``; the ``rng`` argument, default one seeded from torch's generator): its
``(seed, offset)`` pair lives on the device and the captured forward advances it, so every
replay draws a fresh mask — the one the layer as called draws from a
:class:`fusecore.PhiloxStream` at the same seed and offset — and its backward regenerates that
mask.  The warm-up calls draw from the stream too.  Feature dropout (torch's RNG, whose CUDA
generator graphs replay with fresh offsets) replays fine.  What a replay cannot change is
refused or made explicit:

* a host :class:`fusecore.PhiloxStream` as ``rng`` (a graph would freeze its pair) — ``TypeError``;
* a layer switched to the other mode (``train()`` / ``eval()``) than at capture runs as called;
* each replay overwrites the state the previous call saved for its backward: a backward through
  an output of an earlier call raises ``RuntimeError`` instead of returning wrong gradients.
  Outputs themselves are copies and stay valid.

Inputs must keep the sample's shapes, dtypes, device and ``requires_grad`` (``ValueError``
otherwise); the graph is fixed, and the parameters must change in place only (optimizers and
``load_state_dict`` do; moving or converting the layer after the capture does not: capture again).
torch warns once that the parameters' gradient accumulators live on the capture stream (it
orders the streams itself).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fusecore import DevicePhiloxStream

from . import pyg
from .graph import as_graph
from .nn import AGNNConv, GATConv, GATv2Conv, GraphTransformerConv
from .schedule import ScheduleOptions

# PyG's layers take (x, edge_index, ...): the graph second
PYG_LAYERS = (pyg.GATConv, pyg.GATv2Conv, pyg.TransformerConv, pyg.AGNNConv)
CAPTURABLE = (GATConv, GATv2Conv, GraphTransformerConv, AGNNConv, *PYG_LAYERS)


def _attention_dropout(layer: nn.Module) -> float:
    """The attention dropout probability the layer applies in training (DGL's ``attn_drop_p``, PyG's ``dropout``)."""
    if hasattr(layer, "attn_drop_p"):
        return layer.attn_drop_p
    return getattr(layer, "dropout", 0.0)


def _call(layer: nn.Module, graph: Any, inputs: tuple, options: dict):
    """``layer(graph, *inputs)``, or PyG's order ``layer(inputs[0], graph, *inputs[1:])`` for a :mod:`gnnfuse.pyg`
    layer."""
    if isinstance(layer, PYG_LAYERS):
        return layer(inputs[0], graph, *inputs[1:], **options)
    return layer(graph, *inputs, **options)


def _signature(tensor: torch.Tensor) -> tuple:
    return tuple(tensor.shape), tensor.dtype, tensor.device, tensor.requires_grad


class _Bound(nn.Module):
    """``layer(graph, *inputs)`` as a module of tensor inputs alone (what make_graphed_callables takes)."""

    def __init__(self, layer: nn.Module, graph: Any, schedule: ScheduleOptions | None,
                 rng: DevicePhiloxStream | None) -> None:
        super().__init__()
        self.layer = layer
        self.graph = graph
        self.schedule = schedule
        self.options = {"schedule": schedule} if rng is None else {"schedule": schedule, "rng": rng}

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return _call(self.layer, self.graph, inputs, self.options)


class _Fresh(torch.autograd.Function):
    """A copy of a replay's output that refuses a backward once a later replay has overwritten
    the state it depends on (``owner.replays`` counts replays)."""

    @staticmethod
    def forward(ctx, owner, out):  # type: ignore[override]
        ctx.owner, ctx.replay = owner, owner.replays
        return out.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.owner.replays != ctx.replay:
            raise RuntimeError(
                "gnnfuse.capture: the captured layer was called again before the backward of an earlier "
                "output; a replay overwrites the state that backward needs (call backward first)"
            )
        return None, grad


class CapturedLayer(nn.Module):
    """A gnnfuse layer bound to one graph, replayed from CUDA graphs (built by :func:`capture`).

    ``forward(*inputs)`` takes the layer's tensor inputs after the graph (``feat``, and
    ``edge_feat`` for a GraphTransformerConv with ``edge_dim``) and returns what the layer
    returns, as a fresh tensor.  ``rng``: the device stream the replays' attention dropout draws
    from (None without attention dropout in the captured mode)."""

    def __init__(self, layer: nn.Module, graphed: _Bound, training: bool, inputs: tuple[torch.Tensor, ...],
                 rng: DevicePhiloxStream | None) -> None:
        super().__init__()
        self.layer = layer
        self.rng = rng
        # kept out of the module tree: its training flag stays at the capture's mode, so that
        # make_graphed_callables always replays; this module decides when to (the layer's mode)
        self.__dict__["_graphed"] = graphed
        self.captured_training = training
        self.replays = 0
        self.signature = [_signature(t) for t in inputs]

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.layer.training != self.captured_training:
            return _call(self.layer, self._graphed.graph, inputs, {"schedule": self._graphed.schedule})
        signature = [_signature(t) if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs]
        if signature != self.signature:
            raise ValueError(
                "the captured layer takes inputs like its capture's samples (shape, dtype, device, requires_grad): "
                f"{self.signature}, got {signature}"
            )
        self.replays += 1
        return _Fresh.apply(self, self._graphed(*inputs))


def capture(
    layer: nn.Module, graph: Any, *inputs: torch.Tensor, schedule: ScheduleOptions | None = None, warmup: int = 3,
    rng: DevicePhiloxStream | None = None,
) -> CapturedLayer:
    """Capture ``layer(graph, *inputs)``'s forward and backward as CUDA graphs (module doc).

    ``layer``: a :mod:`gnnfuse.nn` layer, called ``layer(graph, *inputs)``, or a :mod:`gnnfuse.pyg` layer, called
    in PyG's order ``layer(inputs[0], graph, *inputs[1:])``, on a CUDA device, in the mode (train / eval) it will be
    replayed in; ``graph``: anything the layer takes (a :class:`gnnfuse.Graph`, ``edge_index``,
    PyG ``Data``, DGL graph), fixed from now on; ``inputs``: sample tensors (``feat [N, in]``,
    and ``edge_feat [E, edge_dim]`` where the layer has one) with the shapes, dtypes and
    ``requires_grad`` of every later call; ``schedule``: forwarded to the layer;
    ``warmup``: eager iterations before the capture (they build the graph's schedule and
    compile the kernels).  The warm-up runs forward and backward but leaves ``.grad`` untouched.
    ``rng``: a :class:`fusecore.DevicePhiloxStream` on the inputs' device for the attention dropout
    of a layer in training (default: one seeded from torch's generator); unused otherwise.
    """
    if not isinstance(layer, CAPTURABLE):
        names = ", ".join(f"{cls.__module__}.{cls.__name__}" for cls in CAPTURABLE)
        raise TypeError(f"layer must be a gnnfuse.nn or gnnfuse.pyg layer ({names}), got {type(layer).__name__}")
    if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError("inputs must be one or more sample tensors (feat, and edge_feat where the layer takes it)")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup must be an int >= 1, got {warmup!r}")
    if rng is not None and not isinstance(rng, DevicePhiloxStream):
        raise TypeError(
            f"rng must be a fusecore.DevicePhiloxStream or None, got {type(rng).__name__} (a host stream's "
            "(seed, offset) ints would be frozen into the graph: every replay would draw the same dropout mask)"
        )
    for index, tensor in enumerate(inputs):
        if tensor.device.type != "cuda":
            raise ValueError(f"inputs[{index}] on '{tensor.device}': capture records CUDA graphs, CUDA tensors only")
    if layer.training and _attention_dropout(layer) > 0:
        rng = rng or DevicePhiloxStream.from_torch(inputs[0].device)
        if rng.device != inputs[0].device:
            raise ValueError(f"rng is on '{rng.device}' but the inputs are on '{inputs[0].device}'")
    else:
        rng = None
    graph = as_graph(graph, inputs[0].shape[0]) if isinstance(graph, torch.Tensor) else as_graph(graph)
    bound = _Bound(layer, graph, schedule, rng)
    bound.train(layer.training)
    with torch.enable_grad():  # the backward graph is captured too, even when called under no_grad
        graphed = torch.cuda.make_graphed_callables(bound, inputs, num_warmup_iters=warmup, allow_unused_input=True)
    return CapturedLayer(layer, graphed, layer.training, inputs, rng)
