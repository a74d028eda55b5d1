"""User-facing layers: :class:`GATConv`, a drop-in for DGL's GATConv on the fused kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import ops
from .graph import Graph, as_graph
from .schedule import ScheduleOptions

ZERO_IN_DEGREE_MESSAGE = (
    "There are 0-in-degree nodes in the graph, output for those nodes will be invalid. "
    "This is harmful for some applications, causing silent performance regression. "
    "Adding self-loop on the input graph by calling `g = g.add_self_loops()` (gnnfuse.Graph) "
    "or `g = dgl.add_self_loop(g)` will resolve the issue. Setting ``allow_zero_in_degree`` "
    "to be `True` when constructing this module will suppress the check and let the code run."
)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _probability(name: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
    return float(value)


class GATConv(nn.Module):
    r"""Graph attention layer (Veličković et al., 2018), fused; DGL's GATConv interface.

    For node ``i`` with incoming edges ``j -> i`` and heads ``h``::

        Wh_j    = fc(feat_drop(x_j)).view(H, D)
        e_ijh   = LeakyReLU(attn_l[h] · Wh_j[h] + attn_r[h] · Wh_i[h])
        α_ijh   = attn_drop(softmax_j e_ijh)
        out_i   = Σ_j α_ijh Wh_j[h]  (+ res_fc(x_i)) (+ bias), then activation

    Parameters and their shapes are DGL's, so a DGL ``GATConv`` state_dict loads unchanged:
    ``fc.weight [H·D, in_feats]``, ``attn_l`` / ``attn_r`` ``(1, H, D)``, ``bias [H·D]``
    (absent when a linear residual carries the bias, as in DGL), ``res_fc.weight
    [H·D, in_feats]`` (and ``res_fc.bias``) when ``residual`` and ``in_feats != H·D``.

    ``forward(graph, feat)``: ``graph`` is a :class:`gnnfuse.Graph`, an ``edge_index [2, E]``
    tensor (its Graph is cached while the tensor lives), a PyG ``Data`` or a DGL graph;
    ``feat`` is ``[N, in_feats]`` (float16 / bfloat16 / float32 / float64, the dtype of the
    layer's parameters).  Returns ``[N, H, D]`` in ``feat``'s dtype.  The attention itself
    runs in one fused kernel that stores only the logsumexp per (node, head); attention
    dropout is drawn from the counter-based RNG and regenerated in backward.
    """

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        num_heads: int,
        feat_drop: float = 0.0,
        attn_drop: float = 0.0,
        negative_slope: float = 0.2,
        residual: bool = False,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
        allow_zero_in_degree: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self._in_feats = _positive_int("in_feats", in_feats)
        self._out_feats = _positive_int("out_feats", out_feats)
        self._num_heads = _positive_int("num_heads", num_heads)
        self.attn_drop_p = _probability("attn_drop", attn_drop)
        self.negative_slope = float(negative_slope)
        self._allow_zero_in_degree = bool(allow_zero_in_degree)
        self.fc = nn.Linear(in_feats, out_feats * num_heads, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.feat_drop = nn.Dropout(_probability("feat_drop", feat_drop))
        self.has_linear_res = False
        self.has_explicit_bias = False
        if residual:
            if in_feats != out_feats * num_heads:
                self.res_fc = nn.Linear(in_feats, num_heads * out_feats, bias=bias)
                self.has_linear_res = True
            else:
                self.res_fc = nn.Identity()
        else:
            self.register_buffer("res_fc", None)
        if bias and not self.has_linear_res:
            self.bias = nn.Parameter(torch.empty(num_heads * out_feats))
            self.has_explicit_bias = True
        else:
            self.register_buffer("bias", None)
        self.activation = activation
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DGL's initialization: Xavier-normal with the ReLU gain, zero biases."""
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_normal_(self.fc.weight, gain=gain)
        nn.init.xavier_normal_(self.attn_l, gain=gain)
        nn.init.xavier_normal_(self.attn_r, gain=gain)
        if self.has_explicit_bias:
            nn.init.constant_(self.bias, 0)
        if isinstance(self.res_fc, nn.Linear):
            nn.init.xavier_normal_(self.res_fc.weight, gain=gain)
            if self.res_fc.bias is not None:
                nn.init.constant_(self.res_fc.bias, 0)

    def set_allow_zero_in_degree(self, set_value: bool) -> None:
        self._allow_zero_in_degree = bool(set_value)

    def _graph_for(self, graph: Any, num_nodes: int) -> Graph:
        if isinstance(graph, torch.Tensor):
            return as_graph(graph, num_nodes)
        graph = as_graph(graph)
        if graph.num_nodes != num_nodes:
            raise ValueError(f"feat has {num_nodes} rows but the graph has num_nodes={graph.num_nodes}")
        return graph

    def forward(self, graph: Any, feat: torch.Tensor, *, schedule: ScheduleOptions | None = None) -> torch.Tensor:
        if not isinstance(feat, torch.Tensor):
            raise TypeError(f"feat must be a torch.Tensor, got {type(feat).__name__}")
        if feat.dim() != 2 or feat.shape[1] != self._in_feats:
            raise ValueError(f"feat must have shape [num_nodes, in_feats={self._in_feats}], got {tuple(feat.shape)}")
        if feat.dtype != self.fc.weight.dtype:
            raise TypeError(
                f"feat has dtype {feat.dtype} but the layer's parameters are {self.fc.weight.dtype}; "
                f"convert one of them (e.g. layer.to({feat.dtype}))"
            )
        graph = self._graph_for(graph, feat.shape[0])
        if feat.device != graph.device:
            raise ValueError(f"feat is on device '{feat.device}' but the graph is on '{graph.device}'")
        if not self._allow_zero_in_degree and graph.has_zero_in_degree():
            raise ValueError(ZERO_IN_DEGREE_MESSAGE)
        num_nodes = feat.shape[0]
        h = self.feat_drop(feat)
        wh = self.fc(h).view(num_nodes, self._num_heads, self._out_feats)
        dropout = self.attn_drop_p if self.training else 0.0
        out = ops.gat(
            graph, wh, self.attn_l, self.attn_r, negative_slope=self.negative_slope, dropout=dropout,
            schedule=schedule,
        )
        if self.res_fc is not None:
            out = out + self.res_fc(h).view(num_nodes, -1, self._out_feats)
        if self.has_explicit_bias:
            out = out + self.bias.view(1, self._num_heads, self._out_feats)
        if self.activation is not None:
            out = self.activation(out)
        return out

    def extra_repr(self) -> str:
        return (
            f"in_feats={self._in_feats}, out_feats={self._out_feats}, num_heads={self._num_heads}, "
            f"attn_drop={self.attn_drop_p}, negative_slope={self.negative_slope}"
        )
