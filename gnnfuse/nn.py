"""User-facing layers on the fused attention kernels.

* :class:`GATConv` and :class:`GATv2Conv` — DGL's layers, parameters and state_dict;
* :class:`GraphTransformerConv` — PyG's TransformerConv (a PyG state_dict loads unchanged);
* :class:`AGNNConv` — DGL's AGNNConv (parameter ``beta``).

All take the same graph inputs: a :class:`gnnfuse.Graph`, an ``edge_index [2, E]`` tensor (its
Graph cached while the tensor lives), a PyG ``Data`` or a DGL graph.  The layers with attention
dropout (all but AGNN) take a keyword ``rng`` in ``forward``: the :class:`fusecore.PhiloxStream`
or :class:`fusecore.DevicePhiloxStream` the mask is drawn from (default: a stream seeded from
torch's generator on every call); :func:`gnnfuse.capture` passes a device stream.

The projections of GATv2Conv (``fc_src``, ``fc_dst``) and GraphTransformerConv (``lin_query``,
``lin_key``, ``lin_value``, ``lin_skip``) run through :func:`fusecore.linear.linear`, which takes
their parameters (so those sub-modules' own forward hooks do not run) and sums the bias
gradients with a kernel of its own: torch's reduction was a quarter of the Transformer's step.  A
layer's projections of one input are one product of the stacked weights (:func:`fusecore.linear.linears`):
the input is read once, and the attention ops read the outputs, column blocks of that product, in place and
store their gradients into one buffer, whose backward is one product for the input's gradient and one for
the weights'.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from fusecore import DevicePhiloxStream, PhiloxStream, backend
from fusecore.linear import linear, linears, stack_parameters

from . import ops
from .graph import Graph, NodeCountError, as_graph
from .schedule import ScheduleOptions

ZERO_IN_DEGREE_MESSAGE = (
    "There are 0-in-degree nodes in the graph, output for those nodes will be invalid. "
    "This is harmful for some applications, causing silent performance regression. "
    "Adding self-loop on the input graph by calling `g = g.add_self_loops()` (gnnfuse.Graph) "
    "or `g = dgl.add_self_loop(g)` will resolve the issue. Setting ``allow_zero_in_degree`` "
    "to be `True` when constructing this module will suppress the check and let the code run."
)


def _project(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` from its parameters, bias gradient by :func:`fusecore.linear.linear`."""
    return linear(x, module.weight, module.bias)


def _project_all(modules: list[nn.Linear], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``[m(x) for m in modules]`` as one :func:`fusecore.linear.linears` call: one product of the stacked
    weights whose column blocks are the outputs, which the attention ops read in place and whose gradients
    they store into one buffer (``gnnfuse.ops._packed_columns``)."""
    return linears(x, [m.weight for m in modules], [m.bias for m in modules])


def _positive_int(name: str, value: Any) -> int:
    if not backend.is_int(value) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _activation(value: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    if value is not None and not callable(value):
        raise TypeError(f"activation must be callable or None, got {type(value).__name__}")
    return value


def _lazy(module: Any) -> bool:
    """Whether ``module`` is a linear map whose input width is still unknown (PyG's ``in_channels=-1``, not yet
    called nor loaded)."""
    return isinstance(module, nn.modules.lazy.LazyModuleMixin) and module.has_uninitialized_params()


def _linear(in_features: int | None, out_features: int, bias: bool) -> nn.Module:
    """``nn.Linear``, or ``nn.LazyLinear`` for a lazy width (``None``), whose weight takes its shape from the first
    input (:func:`_lazy_widths`) or from a loaded state_dict."""
    if in_features is None:
        return nn.LazyLinear(out_features, bias=bias)
    return nn.Linear(in_features, out_features, bias=bias)


def _lazy_widths(sides: Any, init: Callable[[nn.Module], None] | None = None) -> list[int | None] | None:
    """PyG's lazy ``in_channels=-1``: ``sides`` pairs ``(feat, maps)``; each map still without its width takes that of
    ``feat [N, F]`` (torch's lazy hook, run on no rows: the weight is created in the map's dtype and device and
    initialized as ``nn.Linear`` is, then by ``init`` where given).  Returns each side's width (from its maps'
    weights: also right after a state_dict loaded into a lazy layer; None for a side without maps), or None when a
    lazy map's ``feat`` is not such a tensor (the call's own checks then name it)."""
    widths: list[int | None] = []
    for feat, maps in sides:
        width = None
        for module in maps:
            if module is None:
                continue
            if _lazy(module):
                if not isinstance(feat, torch.Tensor) or feat.dim() != 2:
                    return None
                with torch.no_grad():
                    module(feat[:0])
                if init is not None:
                    init(module)
            width = module.weight.shape[1]
        widths.append(width)
    return widths


def _check_features(feat: Any, feat_name: str, in_feats: int | None, param_dtype: torch.dtype | None) -> None:
    """``feat [N, in_feats]`` (any width when ``in_feats`` is None) in the layer's dtype."""
    backend.check_dtypes(ops.FLOAT_DTYPES, **{feat_name: feat})
    if feat.dim() < 2:
        raise ValueError(f"{feat_name} must have shape [num_nodes, ...features], got {tuple(feat.shape)}")
    if in_feats is not None and (feat.dim() != 2 or feat.shape[1] != in_feats):
        raise ValueError(f"{feat_name} must have shape [num_nodes, in_feats={in_feats}], got {tuple(feat.shape)}")
    if param_dtype is not None and feat.dtype != param_dtype:
        raise TypeError(
            f"{feat_name} has dtype {feat.dtype} but the layer's parameters are {param_dtype}; "
            f"convert one of them (e.g. layer.to({feat.dtype}))"
        )


def _graph_and_features(
    graph: Any, feat: Any, in_feats: int | None, param_dtype: torch.dtype | None, allow_zero_in_degree: bool,
    feat_name: str = "feat",
) -> Graph:
    """Check ``feat [N, in_feats]`` (any width when ``in_feats`` is None) against the layer's
    dtype and the graph; return the graph as a :class:`Graph` (cached for edge tensors).  A graph
    that carries no node count (an edge tensor or pair, a Data without ``x`` or ``num_nodes``) has
    ``feat``'s rows as nodes, as in PyG."""
    if (isinstance(graph, torch.Tensor) and graph.dtype.is_floating_point and isinstance(feat, torch.Tensor)
            and not feat.dtype.is_floating_point):
        raise TypeError("the graph is a float tensor and feat an integer one: the arguments are (graph, feat), "
                        "graph first (PyG's convolutions take (x, edge_index))")
    _check_features(feat, feat_name, in_feats, param_dtype)
    num_nodes = feat.shape[0]
    try:
        graph = as_graph(graph, num_nodes)
    except NodeCountError as exc:
        raise ValueError(f"{feat_name} has {num_nodes} rows but the graph has num_nodes={exc.graph_nodes}") from exc
    if feat.device != graph.device:
        raise ValueError(f"{feat_name} is on device '{feat.device}' but the graph is on '{graph.device}'")
    if not allow_zero_in_degree and graph.has_zero_in_degree():
        raise ValueError(ZERO_IN_DEGREE_MESSAGE)
    return graph


def _is_pair(feat: Any) -> bool:
    return isinstance(feat, (tuple, list)) and len(feat) == 2


def _bipartite(
    graph: Any, feat: Any, in_feats: int | None, param_dtype: torch.dtype | None, allow_zero_in_degree: bool,
) -> tuple[Graph, torch.Tensor, torch.Tensor, int, bool] | None:
    """A bipartite call: ``feat = (feat_src, feat_dst)`` (DGL's and PyG's pair; sources and destinations two
    node sets, edge ``j -> i`` from source ``j < N_src`` to destination ``i < N_dst``), or one tensor on a DGL
    block (``is_block``: its destinations are its first ``num_dst_nodes()`` sources, as DGL takes them).  Returns
    ``(graph, feat_src, feat_dst, N_dst)`` with ``graph`` over ``N = max(N_src, N_dst)`` node ids, the layers
    padding both sides to ``N`` rows (padding rows have no edges) and keeping the first ``N_dst`` output rows,
    None for an ordinary call.  The zero-in-degree check covers the destinations only.  A fifth element,
    ``shared``, says the destinations' features are the sources' first rows (a block given one tensor): a layer
    then derives them after its feature dropout, as DGL does (one mask for both)."""
    shared = not _is_pair(feat)
    if shared:
        if not (isinstance(feat, torch.Tensor) and getattr(graph, "is_block", False) is True):
            return None
        feat = (feat, feat[: _check_count(graph.num_dst_nodes(), "num_dst_nodes()")])
    feat_src, feat_dst = feat
    for name, t in (("feat_src", feat_src), ("feat_dst", feat_dst)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"a bipartite call takes (feat_src, feat_dst) tensors, got {name} of type "
                            f"{type(t).__name__}")
    n_src, n_dst = feat_src.shape[0] if feat_src.dim() else 0, feat_dst.shape[0] if feat_dst.dim() else 0
    if callable(getattr(graph, "num_src_nodes", None)) and callable(getattr(graph, "num_dst_nodes", None)):
        counts = (_check_count(graph.num_src_nodes(), "num_src_nodes()"),
                  _check_count(graph.num_dst_nodes(), "num_dst_nodes()"))
        if counts != (n_src, n_dst):
            raise ValueError(f"the graph has {counts[0]} source and {counts[1]} destination nodes but feat_src has "
                             f"{n_src} rows and feat_dst {n_dst}")
        graph = graph.edges()  # a DGL block: its own id spaces, read as a (src, dst) pair
    size = max(n_src, n_dst)
    if isinstance(graph, Graph) and graph.num_nodes != size:
        raise ValueError(f"a bipartite call's Graph must span max(N_src, N_dst) = {size} node ids (feat_src has "
                         f"{n_src} rows, feat_dst {n_dst}), got one of {graph.num_nodes} nodes")
    built = _graph_and_features(graph, feat_src if n_src == size else feat_dst, None, None, True)
    for name, t in (("feat_src", feat_src), ("feat_dst", feat_dst)):
        _check_features(t, name, in_feats, param_dtype)
        if t.device != built.device:
            raise ValueError(f"{name} is on device '{t.device}' but the graph is on '{built.device}'")
    # sources and destinations within their sets, and (unless allowed) every destination with an incoming edge:
    # one host sync for the three checks
    checks = [built.out_degree[n_src:].any(), built.in_degree[n_dst:].any()]
    if not allow_zero_in_degree and n_dst:
        checks.append((built.in_degree[:n_dst] == 0).any())
    outside_src, outside_dst, *zero_in = torch.stack(checks).tolist()
    if outside_src or outside_dst:
        raise ValueError(f"the graph's edges must run from sources < {n_src} (feat_src's rows) to destinations < "
                         f"{n_dst} (feat_dst's rows)")
    if any(zero_in):
        raise ValueError(ZERO_IN_DEGREE_MESSAGE)
    return built, feat_src, feat_dst, n_dst, shared


def _check_count(value: Any, name: str) -> int:
    if not backend.is_int(value) or value < 0:
        raise ValueError(f"the graph's {name} must be an int >= 0, got {value!r}")
    return int(value)


def _first_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t[:n]``, or ``t`` itself when it has ``n`` rows: torch records a slice of every row too, and that
    slice's backward zero-fills a gradient as large as ``t`` and copies the whole incoming gradient into it
    (two device passes over ``[N, H, D]`` a training step: 64 µs of the arxiv-like Transformer fp32 step on the
    H200, session 50)."""
    return t if t.shape[0] == n else t[:n]


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``n`` (differentiable; ``t`` itself when it has ``n``)."""
    if t.shape[0] == n:
        return t
    return torch.cat([t, t.new_zeros((n - t.shape[0], *t.shape[1:]))])


class _StackedProjections:
    """A layer whose maps of one input are one product of their stacked weights (:func:`_project_all`) keeps those
    maps' weights, and their biases, as blocks of one buffer each (:func:`fusecore.linear.stack_parameters`; the same
    Parameter objects, PyG's and DGL's state_dict layouts unchanged), so the product reads them as they lie: no
    concatenation launches a call.  Stacked again after ``Module._apply`` (``.to()``, ``.half()`` give each parameter
    storage of its own) and once a lazy map has its width.  Whatever else gives a parameter storage of its own
    (``load_state_dict(assign=True)``, ``copy.deepcopy``) costs the layer a copy of the weights a call, not
    correctness."""

    def _projection_maps(self) -> list[nn.Linear]:
        """The maps :func:`_project_all` stacks on an ordinary call, in its order."""
        raise NotImplementedError

    def _stack_projections(self) -> None:
        maps = self._projection_maps()
        if len(maps) > 1:
            stack_parameters([m.weight for m in maps])
            if all(m.bias is not None for m in maps):
                stack_parameters([m.bias for m in maps])

    def _apply(self, fn: Callable, recurse: bool = True) -> Any:
        module = super()._apply(fn, recurse)  # type: ignore[misc]
        self._stack_projections()
        return module


class _DGLHeadsConv(nn.Module):
    """What DGL's GATConv and GATv2Conv share: argument checks, feature dropout, the residual
    (``res_fc``: a Linear when ``in_feats != H·D``, else identity), the activation and the
    zero-in-degree switch."""

    def __init__(
        self, in_feats: int, out_feats: int, num_heads: int, feat_drop: float, attn_drop: float,
        negative_slope: float, residual: bool, activation: Callable[[torch.Tensor], torch.Tensor] | None,
        allow_zero_in_degree: bool, bias: bool,
    ) -> None:
        super().__init__()
        self._in_feats = _positive_int("in_feats", in_feats)
        self._out_feats = _positive_int("out_feats", out_feats)
        self._num_heads = _positive_int("num_heads", num_heads)
        self.attn_drop_p = ops._check_dropout(attn_drop, "attn_drop")
        self.negative_slope = ops._check_negative_slope(negative_slope)
        self._allow_zero_in_degree = bool(allow_zero_in_degree)
        self.feat_drop = nn.Dropout(ops._check_dropout(feat_drop, "feat_drop"))
        width = out_feats * num_heads
        if residual:
            self.res_fc = nn.Linear(in_feats, width, bias=bias) if in_feats != width else nn.Identity()
        else:
            self.register_buffer("res_fc", None)
        self.activation = _activation(activation)

    def _reset(self, *weights: torch.Tensor, biases: tuple[torch.Tensor | None, ...] = ()) -> None:
        """DGL's initialization: Xavier-normal with the ReLU gain (the residual's too), zero biases."""
        gain = nn.init.calculate_gain("relu")
        if isinstance(self.res_fc, nn.Linear):
            weights, biases = (*weights, self.res_fc.weight), (*biases, self.res_fc.bias)
        for weight in weights:
            nn.init.xavier_normal_(weight, gain=gain)
        for bias in biases:
            if bias is not None:
                nn.init.constant_(bias, 0)

    def set_allow_zero_in_degree(self, set_value: bool) -> None:
        self._allow_zero_in_degree = bool(set_value)

    def _graph(self, graph: Any, feat: torch.Tensor, param_dtype: torch.dtype) -> Graph:
        return _graph_and_features(graph, feat, self._in_feats, param_dtype, self._allow_zero_in_degree)

    def _feat_dropout(self, feat: torch.Tensor) -> torch.Tensor:
        """``feat_drop(feat)``; the input itself when the probability is 0 (no module call)."""
        return feat if self.feat_drop.p == 0 else self.feat_drop(feat)

    def _dropout(self) -> float:
        return self.attn_drop_p if self.training else 0.0

    def _finish(self, out: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Residual of the (dropped-out) input, activation (an output bias is the op's ``out_add``)."""
        if self.res_fc is not None:
            out = out + self.res_fc(h).view(h.shape[0], -1, self._out_feats)
        return out if self.activation is None else self.activation(out)

    def _finish_with_attention(self, result, h: torch.Tensor, get_attention: bool):
        """:meth:`_finish` of the op's output; with ``get_attention`` DGL's pair ``(out, α [E, H, 1])``."""
        if not get_attention:
            return self._finish(result, h)
        out, attention = result
        return self._finish(out, h), attention.unsqueeze(-1)

    def extra_repr(self) -> str:
        return (
            f"in_feats={self._in_feats}, out_feats={self._out_feats}, num_heads={self._num_heads}, "
            f"attn_drop={self.attn_drop_p}, negative_slope={self.negative_slope}"
        )


def _flag(name: str, value: Any) -> bool:
    """A bool switch of a layer's forward (numpy's bool too), named in the error otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return bool(value)


class GATConv(_DGLHeadsConv):
    r"""Graph attention layer (Veličković et al., 2018), fused; DGL's GATConv interface.

    For node ``i`` with incoming edges ``j -> i`` and heads ``h``::

        Wh_j    = fc(feat_drop(x_j)).view(H, D)
        e_ijh   = LeakyReLU(attn_l[h] · Wh_j[h] + attn_r[h] · Wh_i[h])
        α_ijh   = attn_drop(softmax_j e_ijh)  (· edge_weight[ij] when given)
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
    dropout is drawn from the counter-based RNG and regenerated in backward.  For inputs with
    16-byte aligned rows, and large float16 / bfloat16 inputs of any row width from 16 features
    (:func:`gnnfuse.ops.fuses_projection`), the projection and the node scores
    ``attn_l · Wh``, ``attn_r · Wh`` are one kernel too; float32 projections are products on the
    tensor cores in three TF32 parts (:mod:`fusecore.linear`, float32's accuracy).  ``fc.weight`` is
    read directly, so hooks registered on the ``fc`` module do not run.

    ``forward(graph, feat, get_attention=True)`` returns ``(out, α)`` as DGL does: ``α [E, H, 1]`` in
    ``feat``'s dtype and the graph's input edge order (DGL's edge ids), the weights the aggregation used
    (with attention dropout in training: masked and scaled).  The fused forward stores none: one pass
    over the edges forms them from its logsumexp afterwards (``gnnfuse.ops.attention_weights``); they
    carry no gradient.

    ``forward(graph, feat, edge_weight)``: DGL's per-edge factor ``[E]`` (the graph's edge order, any float
    dtype) multiplies each edge's attention after the softmax and its dropout (not renormalized), as DGL does;
    the kernels load it per edge beside the dropout mask (no ``[E, H]`` tensor), its gradient comes from the
    backward's source pass, and ``get_attention=True`` returns the weights with it applied.  A graph that
    carries no node count (an edge tensor, a ``(src, dst)`` pair, a ``Data`` without ``x`` / ``num_nodes``)
    has ``feat``'s rows as nodes.

    Bipartite calls, as DGL's (sampled mini-batch training): ``forward(block, feat)`` on a DGL block (its
    destinations are its first ``num_dst_nodes()`` sources) or ``forward(graph, (feat_src, feat_dst))`` with
    edges from ``N_src`` source to ``N_dst`` destination nodes (an edge_index, a ``(src, dst)`` pair, a block or
    a :class:`gnnfuse.Graph` over ``max(N_src, N_dst)`` ids); returns the destinations' ``[N_dst, H, D]``.  The
    fused ops run over ``max(N_src, N_dst)`` ids, both sides padded with rows that have no edges.
    ``fc`` projects both sides, ``el`` comes from the sources, ``er`` and the residual from the destinations.
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
        super().__init__(in_feats, out_feats, num_heads, feat_drop, attn_drop, negative_slope, residual, activation,
                         allow_zero_in_degree, bias)
        self.fc = nn.Linear(in_feats, out_feats * num_heads, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, num_heads, out_feats))
        # As in DGL: a linear residual carries the bias, otherwise an explicit output bias.
        self.has_linear_res = isinstance(self.res_fc, nn.Linear)
        self.has_explicit_bias = bool(bias) and not self.has_linear_res
        if self.has_explicit_bias:
            self.bias = nn.Parameter(torch.empty(num_heads * out_feats))
        else:
            self.register_buffer("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DGL's initialization: Xavier-normal with the ReLU gain, zero biases."""
        self._reset(self.fc.weight, self.attn_l, self.attn_r, biases=(self.bias,))

    @backend.eager_under_compile
    def forward(self, graph: Any, feat: torch.Tensor, edge_weight: torch.Tensor | None = None,
                get_attention: bool = False, *, schedule: ScheduleOptions | None = None,
                rng: PhiloxStream | DevicePhiloxStream | None = None,
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        pair = _bipartite(graph, feat, self._in_feats, self.fc.weight.dtype, self._allow_zero_in_degree)
        if pair is not None:
            return self._bipartite_forward(*pair, get_attention, schedule, rng, edge_weight)
        graph = self._graph(graph, feat, self.fc.weight.dtype)
        h = self._feat_dropout(feat)
        # Aligned rows (or many 2-byte rows, read by alignment class): the projection and the node scores in one
        # kernel, inside the op's one autograd node (ops.fuses_projection); else fc's product is fusecore.linear's,
        # outside the op (the op's own torch product was no faster as called on the H200: gnn/layer_host,
        # gnnfuse/JOURNAL.md session 7).  The bias is added in the kernel's store (in training into a second, final
        # output).
        weight = self.fc.weight
        if ops.fuses_projection(h, weight, self._num_heads, self._out_feats):
            first, projected = h, {"weight": weight}
        else:
            first, projected = _project(self.fc, h).view(feat.shape[0], self._num_heads, self._out_feats), {}
        out = ops.gat(
            graph, first, self.attn_l, self.attn_r, negative_slope=self.negative_slope, dropout=self._dropout(),
            rng=rng, schedule=schedule, out_add=self.bias, return_attention=_flag("get_attention", get_attention),
            edge_weight=edge_weight, **projected,
        )
        return self._finish_with_attention(out, h, get_attention)

    def _bipartite_forward(self, graph: Graph, feat_src: torch.Tensor, feat_dst: torch.Tensor, n_dst: int,
                           shared: bool, get_attention: bool, schedule, rng, edge_weight: torch.Tensor | None):
        """DGL's bipartite GATConv: ``fc`` on both sides, ``el`` from the sources, ``er`` from the destinations,
        the residual of the destinations; both sides padded to the graph's node ids (:func:`_bipartite`)."""
        shape = (-1, self._num_heads, self._out_feats)
        h_src = self._feat_dropout(feat_src)
        h_dst = _first_rows(h_src, n_dst) if shared else self._feat_dropout(feat_dst)
        wh_src = _project(self.fc, h_src).view(shape)
        wh_dst = _first_rows(wh_src, n_dst) if shared else _project(self.fc, h_dst).view(shape)
        el, er = ops.node_scores(wh_src, self.attn_l, self.attn_r)
        er = _first_rows(er, n_dst) if shared else ops.node_scores(wh_dst, self.attn_l, self.attn_r)[1]
        n = graph.num_nodes
        out = ops.gat_attention(
            graph, _rows(wh_src, n), _rows(el, n), _rows(er, n), negative_slope=self.negative_slope,
            dropout=self._dropout(), rng=rng, schedule=schedule,
            return_attention=_flag("get_attention", get_attention), edge_weight=edge_weight,
        )
        out, attention = out if get_attention else (out, None)
        out = _first_rows(out, n_dst)
        if self.bias is not None:
            out = out + self.bias.view(1, self._num_heads, self._out_feats)
        return self._finish_with_attention((out, attention) if get_attention else out, h_dst, get_attention)


class GATv2Conv(_StackedProjections, _DGLHeadsConv):
    r"""GATv2 (Brody et al., 2022, "How Attentive are Graph Attention Networks?"), fused; DGL's
    GATv2Conv interface.

    For node ``i`` with incoming edges ``j -> i`` and heads ``h``::

        fs_j    = fc_src(feat_drop(x_j)).view(H, D)        fd_i = fc_dst(feat_drop(x_i)).view(H, D)
        e_ijh   = attn[h] · LeakyReLU(fs_j[h] + fd_i[h])
        α_ijh   = attn_drop(softmax_j e_ijh)
        out_i   = Σ_j α_ijh fs_j[h]  (+ res_fc(x_i)), then activation

    Parameters are DGL's (its state_dict loads unchanged): ``fc_src`` / ``fc_dst``
    (``Linear(in_feats, H·D, bias=bias)``; with ``share_weights`` one module under both
    names), ``attn (1, H, D)``, ``res_fc`` (``Linear(in_feats, H·D, bias=bias)`` when
    ``residual`` and ``in_feats != H·D``, else identity).  As in DGL, ``bias`` is the bias of
    the projections; there is no separate output bias.

    ``forward(graph, feat)``: ``feat`` ``[N, in_feats]``; returns ``[N, H, D]``.  The ``[E, H, D]``
    edge vectors of the score exist only in registers; only the logsumexp per (node, head) is
    stored, attention dropout is regenerated in backward from the counter-based RNG.
    ``get_attention=True`` returns ``(out, α [E, H, 1])`` as for :class:`GATConv`.

    Bipartite calls, as DGL's (sampled mini-batch training): ``forward(block, feat)`` on a DGL block (its
    destinations are its first ``num_dst_nodes()`` sources) or ``forward(graph, (feat_src, feat_dst))`` with
    edges from ``N_src`` source to ``N_dst`` destination nodes (an edge_index, a ``(src, dst)`` pair, a block or
    a :class:`gnnfuse.Graph` over ``max(N_src, N_dst)`` ids); returns the destinations' ``[N_dst, H, D]``.  The
    fused ops run over ``max(N_src, N_dst)`` ids, both sides padded with rows that have no edges.
    ``fc_src`` projects the sources, ``fc_dst`` the destinations.
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
        share_weights: bool = False,
    ) -> None:
        super().__init__(in_feats, out_feats, num_heads, feat_drop, attn_drop, negative_slope, residual, activation,
                         allow_zero_in_degree, bias)
        self.share_weights = bool(share_weights)
        self.bias = bool(bias)
        width = out_feats * num_heads
        self.fc_src = nn.Linear(in_feats, width, bias=bias)
        self.fc_dst = self.fc_src if share_weights else nn.Linear(in_feats, width, bias=bias)
        self.attn = nn.Parameter(torch.empty(1, num_heads, out_feats))
        self.reset_parameters()
        self._stack_projections()

    def _projection_maps(self) -> list[nn.Linear]:
        return [] if self.share_weights else [self.fc_src, self.fc_dst]

    def reset_parameters(self) -> None:
        """DGL's initialization: Xavier-normal with the ReLU gain, zero biases."""
        linears = [self.fc_src] if self.share_weights else [self.fc_src, self.fc_dst]
        self._reset(*(linear.weight for linear in linears), self.attn, biases=tuple(linear.bias for linear in linears))

    @backend.eager_under_compile
    def forward(self, graph: Any, feat: torch.Tensor, get_attention: bool = False, *,
                schedule: ScheduleOptions | None = None, rng: PhiloxStream | DevicePhiloxStream | None = None,
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        pair = _bipartite(graph, feat, self._in_feats, self.fc_src.weight.dtype, self._allow_zero_in_degree)
        if pair is not None:
            graph, feat_src, feat_dst, n_dst, shared = pair
            n, shape = graph.num_nodes, (-1, self._num_heads, self._out_feats)
            h_src = self._feat_dropout(feat_src)
            h_dst = _first_rows(h_src, n_dst) if shared else self._feat_dropout(feat_dst)
            out = ops.gatv2(
                graph, _rows(_project(self.fc_src, h_src).view(shape), n),
                _rows(_project(self.fc_dst, h_dst).view(shape), n), self.attn, negative_slope=self.negative_slope,
                dropout=self._dropout(), rng=rng, schedule=schedule,
                return_attention=_flag("get_attention", get_attention),
            )
            out = (_first_rows(out[0], n_dst), out[1]) if get_attention else _first_rows(out, n_dst)
            return self._finish_with_attention(out, h_dst, get_attention)
        graph = self._graph(graph, feat, self.fc_src.weight.dtype)
        shape = (feat.shape[0], self._num_heads, self._out_feats)
        h = self._feat_dropout(feat)
        if self.share_weights:
            feat_src = feat_dst = _project(self.fc_src, h).view(shape)
        else:
            feat_src, feat_dst = (y.view(shape) for y in _project_all([self.fc_src, self.fc_dst], h))
        out = ops.gatv2(
            graph, feat_src, feat_dst, self.attn, negative_slope=self.negative_slope, dropout=self._dropout(),
            rng=rng, schedule=schedule, return_attention=_flag("get_attention", get_attention),
        )
        return self._finish_with_attention(out, h, get_attention)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, share_weights={self.share_weights}"


def _transformer_widths(in_channels: Any) -> tuple[Any, tuple[int | None, int | None]]:
    """PyG TransformerConv's ``in_channels``: an int, or a pair (sources' width for ``lin_key`` / ``lin_value``,
    destinations' for ``lin_query`` / ``lin_skip``), ``-1`` a lazy width (None).  Returns ``(in_channels as given,
    (source width, destination width))``."""
    pair = isinstance(in_channels, (tuple, list))
    if pair and len(in_channels) != 2:
        raise ValueError(f"in_channels must be an int or a pair (source, destination), got {in_channels!r}")
    values = tuple(in_channels) if pair else (in_channels, in_channels)
    widths = tuple(None if backend.is_int(v) and v == -1 else _positive_int("in_channels", v) for v in values)
    if pair:
        return values, widths
    return (-1 if widths[0] is None else widths[0]), widths


class GraphTransformerConv(_StackedProjections, nn.Module):
    r"""Graph Transformer layer (Shi et al., 2021), fused; PyG TransformerConv's interface.

    For node ``i`` with incoming edges ``j -> i`` and heads ``h`` (``C = out_channels``)::

        q_i = lin_query(x_i),  k_j = lin_key(x_j),  v_j = lin_value(x_j)    each viewed [H, C]
        e_ij = lin_edge(edge_attr_ij)                                        (when edge_dim is set)
        α_ijh = dropout(softmax_j (q_i[h] · (k_j[h] + e_ij[h]) / √C))
        m_i = Σ_j α_ijh (v_j[h] + e_ij[h])             concatenated [H·C] (concat) or head mean [C]
        out_i = m_i + lin_skip(x_i)                      (root_weight, no beta)
        out_i = β_i lin_skip(x_i) + (1 − β_i) m_i,  β_i = sigmoid(lin_beta([m_i, r_i, m_i − r_i]))   (beta)

    Parameter names and shapes are PyG's, so a ``torch_geometric.nn.TransformerConv``
    state_dict loads unchanged: ``lin_query``, ``lin_key``, ``lin_value`` (``bias=bias``),
    ``lin_edge`` (no bias, when ``edge_dim``), ``lin_skip`` (``[H·C or C, in]``, ``bias=bias``;
    created even when ``root_weight`` is False, as in PyG), ``lin_beta`` (``[1, 3·(H·C or C)]``,
    when ``beta`` and ``root_weight``).  Like PyG's, the layer adds no self loops.  ``in_channels=-1``
    (PyG's lazy width): the four maps over the node features take the first call's width.  ``in_channels`` a pair
    ``(in_src, in_dst)`` (either may be ``-1``), as PyG's: ``lin_key`` / ``lin_value`` read ``in_src`` features,
    ``lin_query`` / ``lin_skip`` ``in_dst``; of two different widths the layer takes bipartite calls only (each
    side then projected on its own, not as one product).

    ``forward(graph, feat, edge_feat=None)``: ``feat [N, in_channels]``; ``edge_feat
    [E, edge_dim]`` in the order of the graph's input edges (required when ``edge_dim`` is
    set); returns ``[N, H·C]`` (concat) or ``[N, C]``.  The edge projection
    ``lin_edge(edge_feat)`` is fused too (recomputed in registers, gradients to ``edge_feat``
    and ``lin_edge.weight``): no ``[E, H·C]`` tensor exists; only the logsumexp per (node,
    head) is stored.  Unlike PyG's ``forward(x, edge_index, edge_attr)`` the graph comes first
    (as in the other gnnfuse layers).  ``return_attention_weights=True`` returns PyG's
    ``(out, (edge_index, α))``: ``edge_index`` the tensor passed (else the graph's input edges
    ``[2, E]``), ``α [E, H]`` the softmax before dropout, as PyG's, formed after the forward from its
    logsumexp (no gradient).  Bipartite calls as PyG's, ``forward(edge_index, (x_src, x_dst))`` (or a DGL
    block): queries and the root term from ``x_dst``, keys and values from ``x_src``; returns the destinations'
    rows.
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        dropout: float = 0.0,
        edge_dim: int | None = None,
        bias: bool = True,
        root_weight: bool = True,
    ) -> None:
        super().__init__()
        self.in_channels, self._widths = _transformer_widths(in_channels)
        src_width, dst_width = self._widths
        self.out_channels = _positive_int("out_channels", out_channels)
        self.heads = _positive_int("heads", heads)
        self.beta = bool(beta) and bool(root_weight)
        self.root_weight = bool(root_weight)
        self.concat = bool(concat)
        self.dropout = ops._check_dropout(dropout, "dropout")
        self.edge_dim = None if edge_dim is None else _positive_int("edge_dim", edge_dim)
        width = heads * out_channels
        self.lin_key = _linear(src_width, width, bias=bias)
        self.lin_query = _linear(dst_width, width, bias=bias)
        self.lin_value = _linear(src_width, width, bias=bias)
        if edge_dim is not None:
            self.lin_edge = nn.Linear(edge_dim, width, bias=False)
        else:
            self.register_parameter("lin_edge", None)
        out_width = width if concat else out_channels
        self.lin_skip = _linear(dst_width, out_width, bias=bias)
        if self.beta:
            self.lin_beta = nn.Linear(3 * out_width, 1, bias=False)
        else:
            self.register_parameter("lin_beta", None)
        self.reset_parameters()
        self._stack_projections()

    def _plain_root(self) -> bool:
        """A root term the kernels add in their store (concatenated heads, no gate), projected with q, k, v as one
        product; a gated or head-averaged one is used outside the attention: its own product."""
        return self.root_weight and self.concat and self.lin_beta is None

    def _projection_maps(self) -> list[nn.Linear]:
        # keys and values stay adjacent, for the bipartite call's product of the two
        return [self.lin_query, self.lin_key, self.lin_value] + ([self.lin_skip] if self._plain_root() else [])

    def _take_width(self, feat: Any) -> None:
        """A lazy layer (``in_channels=-1``): the maps still without a width take the first call's (``feat`` or the
        pair's sources for the keys and values, its destinations for the queries and the root term), initialized as
        ``nn.Linear`` is (PyG's default too); the width calls are checked against from then on (also after a
        state_dict loaded into the lazy layer)."""
        x_src, x_dst = feat if isinstance(feat, (tuple, list)) and len(feat) == 2 else (feat, feat)
        widths = _lazy_widths(((x_src, (self.lin_key, self.lin_value)), (x_dst, (self.lin_query, self.lin_skip))))
        if widths is not None:
            self._widths = tuple(widths)
            self._stack_projections()

    def reset_parameters(self) -> None:
        """PyTorch's default Linear initialization (PyG's Linear default is the same Kaiming-uniform)."""
        for module in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip, self.lin_beta):
            if module is not None:
                module.reset_parameters()

    @backend.eager_under_compile
    def forward(
        self, graph: Any, feat: torch.Tensor, edge_feat: torch.Tensor | None = None,
        return_attention_weights: bool | None = None, *,
        schedule: ScheduleOptions | None = None, rng: PhiloxStream | DevicePhiloxStream | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        want_attention = return_attention_weights is not None and _flag("return_attention_weights",
                                                                        return_attention_weights)
        given = graph
        if None in self._widths:
            self._take_width(feat)
        src_width, dst_width = self._widths
        dtype = self.lin_query.weight.dtype
        pair = _bipartite(graph, feat, src_width if src_width == dst_width else None, dtype, True)
        if pair is None:
            if src_width != dst_width:
                raise ValueError(f"in_channels={self.in_channels} (sources and destinations of different widths) takes "
                                 "feat as a pair (feat_src, feat_dst)")
            graph = _graph_and_features(graph, feat, dst_width, dtype, True)
            x_src = x_dst = feat
            n_dst = feat.shape[0]
        else:
            graph, x_src, x_dst, n_dst, _ = pair
            if src_width != dst_width:
                _check_features(x_src, "feat_src", src_width, dtype)
                _check_features(x_dst, "feat_dst", dst_width, dtype)
            feat = x_dst
        shape = (-1, self.heads, self.out_channels)
        edge_weight = None
        if self.lin_edge is not None:
            if not isinstance(edge_feat, torch.Tensor):
                raise ValueError(f"edge_feat must be a [num_edges, edge_dim={self.edge_dim}] tensor, got {edge_feat!r}")
            if tuple(edge_feat.shape) != (graph.num_edges, self.edge_dim):
                raise ValueError(
                    f"edge_feat must have shape [num_edges, edge_dim] = {[graph.num_edges, self.edge_dim]}, "
                    f"got {list(edge_feat.shape)}"
                )
            if edge_feat.dtype != feat.dtype:
                raise TypeError(f"edge_feat has dtype {edge_feat.dtype} but feat has {feat.dtype}: they must share "
                                "one dtype (the layer's)")
            if edge_feat.device != feat.device:
                raise ValueError(f"edge_feat is on device '{edge_feat.device}' but feat is on '{feat.device}'")
            edge_weight = self.lin_edge.weight
        elif edge_feat is not None:
            raise ValueError("edge_feat was given but the layer has no edge_dim (construct it with edge_dim=...)")
        dropout = self.dropout if self.training else 0.0
        plain_root = self._plain_root()
        if pair is None:
            query, key, value, *rest = _project_all(self._projection_maps(), feat)
            root = rest[0] if rest else (_project(self.lin_skip, feat) if self.root_weight else None)
            root_add = root.view(shape) if plain_root else None
        else:  # PyG's bipartite call: queries and the root term from x_dst, keys and values from x_src
            n = graph.num_nodes
            query = _rows(_project(self.lin_query, x_dst), n)
            key, value = (_rows(t, n) for t in _project_all([self.lin_key, self.lin_value], x_src))
            root = _project(self.lin_skip, x_dst) if self.root_weight else None
            root_add = None  # added below, to the destinations' rows
        out = ops.transformer_attention(
            graph, query.view(shape), key.view(shape), value.view(shape), edge_feat, edge_weight,
            dropout=dropout, rng=rng, schedule=schedule, out_add=root_add, return_attention=want_attention,
            attention_dropout=False,
        )
        if want_attention:
            out, attention = out
        out = _first_rows(out, n_dst)
        out = out.reshape(n_dst, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if root is not None and root_add is None:
            if self.lin_beta is not None:
                gate = torch.sigmoid(self.lin_beta(torch.cat([out, root, out - root], dim=-1)))
                out = gate * root + (1 - gate) * out
            else:
                out = out + root
        if want_attention:
            # PyG's pair: the edge_index as passed (a tensor), else the graph's input edges [2, E]
            edge_index = given if isinstance(given, torch.Tensor) else graph.edge_index
            return out, (edge_index, attention)
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}, beta={self.beta}, "
            f"dropout={self.dropout}, edge_dim={self.edge_dim}, root_weight={self.root_weight}"
        )


class AGNNConv(nn.Module):
    r"""Attention-based graph neural network propagation (Thekumparampil et al., 2018), fused;
    DGL's AGNNConv interface::

        out_i = Σ_{j->i} α_ij h_j,     α_i· = softmax_j (β · cos(h_i, h_j))

    ``beta``: a learnable parameter of shape ``[1]`` (``learn_beta``) or a buffer, initialized
    to ``init_beta``.  Like DGL's (and unlike PyG's, which adds self loops), the layer uses the
    graph as given.  ``forward(graph, feat)``: ``feat [N, D]`` (or ``[N, H, D]``); returns the
    same shape.  The cosine is a dot product of unit rows, so the fused kernel is the Graph
    Transformer's with ``q = β ĥ``, ``k = ĥ``, ``v = h``.  Bipartite calls as DGL's (a block, or
    ``(feat_src, feat_dst)``): ``α_ij = softmax_j β cos(h_dst_i, h_src_j)``, ``out_i = Σ_j α_ij h_src_j``.
    """

    def __init__(self, init_beta: float = 1.0, learn_beta: bool = True, allow_zero_in_degree: bool = False) -> None:
        super().__init__()
        if isinstance(init_beta, (bool, np.bool_)) or not isinstance(init_beta, numbers.Real):
            raise ValueError(f"init_beta must be a float, got {init_beta!r}")
        self._allow_zero_in_degree = bool(allow_zero_in_degree)
        self.init_beta = float(init_beta)
        if learn_beta:
            self.beta = nn.Parameter(torch.tensor([self.init_beta]))
        else:
            self.register_buffer("beta", torch.tensor([self.init_beta]))

    def set_allow_zero_in_degree(self, set_value: bool) -> None:
        self._allow_zero_in_degree = bool(set_value)

    @backend.eager_under_compile
    def forward(self, graph: Any, feat: torch.Tensor, *, schedule: ScheduleOptions | None = None) -> torch.Tensor:
        pair = _bipartite(graph, feat, None, None, self._allow_zero_in_degree)
        if pair is not None:
            return self._bipartite_forward(*pair, schedule)
        graph = _graph_and_features(graph, feat, None, None, self._allow_zero_in_degree)
        # as DGL's: a float32 beta serves features of any float dtype (cast in the graph, so its gradient is beta's)
        beta = self.beta if self.beta.dtype == feat.dtype else self.beta.to(feat.dtype)
        return ops.agnn(graph, feat, beta, schedule=schedule)

    def _bipartite_forward(self, graph: Graph, feat_src: torch.Tensor, feat_dst: torch.Tensor, n_dst: int,
                           shared: bool, schedule) -> torch.Tensor:
        """DGL's bipartite AGNNConv, ``α_ij = softmax_j β cos(h_dst_i, h_src_j)``, ``out_i = Σ_j α_ij h_src_j``: the
        fused dot-product attention with queries ``β ĥ_dst``, keys ``ĥ_src`` and values ``h_src`` (scale 1), the
        unit rows formed by torch (``ops.agnn`` forms them from one feature tensor, which a pair is not)."""
        if feat_src.shape[1:] != feat_dst.shape[1:]:
            raise ValueError(f"feat_src and feat_dst must have the same feature shape, got {tuple(feat_src.shape)} "
                             f"and {tuple(feat_dst.shape)}")
        if feat_src.dtype != feat_dst.dtype:
            raise TypeError(f"feat_src has dtype {feat_src.dtype} but feat_dst has {feat_dst.dtype}")
        beta = self.beta if self.beta.dtype == feat_src.dtype else self.beta.to(feat_src.dtype)
        n, heads = graph.num_nodes, (feat_src.shape[1] if feat_src.dim() == 3 else 1)
        shape = (-1, heads, feat_src.shape[-1])
        unit_src = nn.functional.normalize(feat_src.reshape(shape), dim=-1, eps=ops.NORMALIZE_EPS)
        unit_dst = _first_rows(unit_src, n_dst) if shared else nn.functional.normalize(feat_dst.reshape(shape), dim=-1,
                                                                           eps=ops.NORMALIZE_EPS)
        out = ops.transformer_attention(
            graph, _rows(beta * unit_dst, n), _rows(unit_src, n), _rows(feat_src.reshape(shape), n), scale=1.0,
            schedule=schedule,
        )
        return _first_rows(out, n_dst).reshape(n_dst, *feat_dst.shape[1:])

    def extra_repr(self) -> str:
        return f"init_beta={self.init_beta}, learn_beta={isinstance(self.beta, nn.Parameter)}"
