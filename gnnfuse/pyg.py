"""PyG's attention convolutions, fused: drop-in replacements for ``torch_geometric.nn``'s layers.

* :class:`GATConv` — ``torch_geometric.nn.GATConv`` (edge features through ``edge_dim`` included);
* :class:`GATv2Conv` — ``torch_geometric.nn.GATv2Conv`` (edge features through ``edge_dim`` included);
* :class:`TransformerConv` — ``torch_geometric.nn.TransformerConv``;
* :class:`AGNNConv` — ``torch_geometric.nn.AGNNConv``.

Each takes PyG's constructor arguments, has PyG's parameter names and shapes (a PyG state_dict loads
unchanged, and this layer's loads into PyG's) and PyG's call, ``conv(x, edge_index, ...)`` with ``x`` a
``[N, F]`` tensor or a bipartite pair ``(x_src, x_dst)`` and ``edge_index`` an int ``[2, E]`` tensor (or a
:class:`gnnfuse.Graph`, or a ``torch.sparse`` adjacency ``adj_t``, below), so a PyG model changes its import and
nothing else.  The attention runs in the fused kernels of :mod:`gnnfuse.ops` (the same as :mod:`gnnfuse.nn`'s
DGL-style layers): no ``[E, H, C]`` tensor, only a logsumexp per (node, head) stored, attention dropout regenerated
in backward from the counter-based RNG.

What PyG does on every call and these layers do once: the CSR of ``edge_index`` is built on the first call and
cached while the tensor lives unmodified (:func:`gnnfuse.as_graph`), and so is the self-looped graph of
``add_self_loops=True`` (PyG's ``remove_self_loops`` then ``add_self_loops``, :meth:`gnnfuse.Graph.pyg_self_loops`).
The edge order is PyG's: the edges that are not self loops in input order, then one loop per node, so the
attention weights returned with ``return_attention_weights=True`` are PyG's edge for edge.

GATConv, GATv2Conv and TransformerConv take PyG's lazy ``in_channels=-1`` (or ``(-1, -1)``): their maps are
``nn.LazyLinear`` until the first call's features (or a loaded state_dict) give them their width, then initialized
as PyG does.  TransformerConv's ``in_channels`` may be a pair of different widths (``lin_key`` / ``lin_value`` over
the sources', ``lin_query`` / ``lin_skip`` over the destinations'; bipartite calls only).

``edge_index`` may also be PyG's transposed sparse adjacency ``adj_t``, a ``torch.sparse`` COO or CSR tensor
``[N, N]`` (``[N_dst, N_src]`` with a pair) whose stored entry ``adj_t[i, j]`` is the edge ``j -> i``, taken as
PyG's layers take it: every stored entry is an edge whatever its value (explicit zeros too), in storage order
(``to_edge_index``: ``edge_attr`` row ``k`` is the ``k``-th entry's).  With ``add_self_loops=True`` PyG's
``remove_self_loops`` / ``add_self_loops`` of a sparse tensor rebuild it coalesced: duplicate entries merged, edges
sorted by destination then source, one loop per node below ``min(N_dst, N_src)`` at its place
(:meth:`gnnfuse.Graph.pyg_sparse_self_loops`); they take no ``edge_attr`` (PyG's assertion fails: refused here).
Without self loops a COO tensor must be coalesced (PyG reads its ``indices()``).  ``return_attention_weights=True``
returns PyG's ``(out, (adj, α))``: ``adj`` the adjacency the attention ran over, in the input's layout, with ``α [E',
H]`` as its values (``set_sparse_value``; TransformerConv returns the tensor as passed).  A CSR ``adj_t`` is the
CSR by destination already: :meth:`gnnfuse.Graph.from_adj_t` takes it without a sort; the graph is cached per
tensor while it lives unmodified (:func:`gnnfuse.graph.as_graph_of_adj_t`), the self-looped one on it.

GATConv takes PyG's ``x = (x_src, None)``: no destination term in the score and no residual; the destinations
counted as PyG's ``propagate`` counts them (``size[1]``, else a sparse ``adj_t``'s rows, else ``N_src``), the self
loops over ``min(size)`` (else ``N_src``) nodes; a lazy layer's destinations' map stays lazy.  GATv2Conv and
TransformerConv refuse it (PyG's fail: an assertion, ``lin_query(None)``).

Heterogeneous graphs: the layers work in PyG's ``HeteroConv`` (a call per edge type, ``edge_attr_dict`` passed as
``edge_attr``) and ``to_hetero``.  ``to_hetero`` (``torch_geometric.nn.fx.Transformer``) treats a module as a
message-passing layer — copied per edge type, the copies' outputs summed (``aggr``) per destination type — only if
``isinstance(module, MessagePassing)`` (``is_message_passing_op``); any other module it copies per edge type with
edge-level outputs, wrong for a convolution.  So where PyG is installed each layer is an instance of its class's
``MessagePassing`` subclass (:func:`_message_passing_class`, ``GATConv._as_message_passing``; built on the first
layer made, which imports PyG; the plain class without PyG): it runs MessagePassing's ``__init__`` (its
``__setstate__``, which ``copy.deepcopy`` calls, reads what that stores) and keeps the fused ``forward``.  The
MessagePassing features a fused layer cannot honour refuse rather than being ignored: the message hooks
(``register_message_forward_hook`` and the others; so ``to_hetero_with_bases``, which weights each message by its
edge type through one, fails by name, as it does with PyG's own attention layers) and ``explain = True`` (PyG's
explainers mask the messages; ``explain = False`` leaves a layer out).

Differences from PyG, all refused with a clear error: ``torch_sparse.SparseTensor`` adjacencies (pass
``adj_t.to_torch_sparse_csr_tensor()``), CSC / BSR layouts and sparse adjacencies with dense dimensions (PyG reads
their values as edge features: pass ``edge_attr``), PyG's message hooks and explainers, ``torch.jit.script`` (PyG
scripts its AGNNConv, not its GATConv, GATv2Conv or TransformerConv; ``torch.compile`` runs these layers eagerly
inside a compiled model), ``dropout=1.0`` (every attention weight dropped) and ``uint8`` / ``bool`` ``edge_index``
tensors (PyG's GAT layers happen to take them).  ``edge_attr`` passed to a
layer built without ``edge_dim`` is ignored (as PyG's GATConv and TransformerConv do; PyG's GATv2Conv asserts), and
GATConv / GATv2Conv built with ``edge_dim`` but called without ``edge_attr`` run without the edge term, as PyG's
(TransformerConv refuses, where PyG's asserts).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from fusecore import DevicePhiloxStream, PhiloxStream, backend
from fusecore.rows import gather_rows

from . import ops
from .edge_score import LoopFill, edge_score_csr
from .graph import Graph, SelfLooped, as_graph, as_graph_of_adj_t, check_adj_t
from .nn import (
    GraphTransformerConv,
    _bipartite,
    _check_features,
    _first_rows,
    _graph_and_features,
    _lazy,
    _lazy_widths,
    _linear,
    _positive_int,
    _project,
    _project_all,
    _StackedProjections,
)
from .schedule import ScheduleOptions

__all__ = ["AGNNConv", "GATConv", "GATv2Conv", "TransformerConv"]

_FILL_REDUCTIONS = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min", "mul": "prod"}


def _glorot(t: torch.Tensor) -> None:
    """PyG's ``glorot``: uniform in ``±sqrt(6 / (size(-2) + size(-1)))``."""
    bound = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-bound, bound)


def _reset_linear(linear: nn.Module) -> None:
    """PyG's ``Linear(weight_initializer='glorot')``: a glorot weight and a bias uniform in ``±1/sqrt(in)`` (a lazy
    map: at its materialization, :meth:`_PyGHeadsConv._materialize`)."""
    if _lazy(linear):
        return
    _glorot(linear.weight)
    if linear.bias is not None:
        bound = 1.0 / math.sqrt(linear.weight.size(1))
        with torch.no_grad():
            linear.bias.uniform_(-bound, bound)


def _in_channels(value: Any, lazy: bool = False) -> tuple[int | None, int | None]:
    """PyG's ``in_channels``: an int, or a pair (sources, destinations); ``-1`` (lazy: the width of the first input)
    as None where ``lazy`` allows it, else refused."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"in_channels must be an int or a pair (source, destination), got {value!r}")
        pair = tuple(value)
    else:
        pair = (value, value)
    if any(backend.is_int(v) and v == -1 for v in pair) and not lazy:
        raise ValueError("in_channels=-1 (lazy initialization) is not supported by this layer: give the input "
                         "feature size")
    return tuple(None if backend.is_int(v) and v == -1 else _positive_int("in_channels", v) for v in pair)


def _check_fill_value(value: Any) -> Any:
    if isinstance(value, str) and value in _FILL_REDUCTIONS or isinstance(value, torch.Tensor) or (
            isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise ValueError(f"fill_value must be a float, a tensor or one of {sorted(_FILL_REDUCTIONS)}, got {value!r}")


def _fill_rows(fill: torch.Tensor, width: int) -> torch.Tensor:
    """A tensor ``fill_value`` as PyG's ``add_self_loops`` reads it (``compute_loop_attr``): made 2-D (a leading dim
    added to one of another rank), to be expanded to the self loops' ``[L, width]`` edge features.  Returns ``[1,
    width]`` (one row for every loop) or ``[R, width]`` (a row per loop: :meth:`_Call.with_loops` checks ``R = L``);
    a tensor that cannot expand so refused by name."""
    rows = fill if fill.dim() == 2 else fill.unsqueeze(0)
    if rows.dim() == 1:  # a 0-d fill: [1], which expands as [1, 1]
        rows = rows.view(1, -1)
    if rows.dim() != 2 or rows.shape[1] not in (1, width):
        raise ValueError(f"fill_value of shape {list(fill.shape)} does not expand to the self loops' edge features "
                         f"[num_nodes, edge_dim={width}] (PyG's add_self_loops: a scalar, [edge_dim], [1, edge_dim] or "
                         f"[num_nodes, edge_dim])")
    return rows.expand(rows.shape[0], width)


def _want(name: str, value: Any) -> bool:
    """PyG's ``return_attention_weights``: None or a bool (numpy's too); True asks for the weights."""
    if value is None:
        return False
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool or None, got {value!r}")
    return bool(value)


def _sparse_adjacency(edge_index: Any) -> torch.Tensor | None:
    """``edge_index`` when it is PyG's transposed sparse adjacency ``adj_t`` (a ``torch.sparse`` tensor), None for an
    ``edge_index`` tensor or a Graph; a ``torch_sparse.SparseTensor`` refused by name."""
    if isinstance(edge_index, torch.Tensor):
        return None if edge_index.layout == torch.strided else edge_index
    if type(edge_index).__name__ == "SparseTensor" or (hasattr(edge_index, "storage")
                                                       and callable(getattr(edge_index, "csr", None))):
        raise TypeError("edge_index is a torch_sparse.SparseTensor, which these layers do not take: pass "
                        "adj_t.to_torch_sparse_csr_tensor() (the same transposed adjacency as a torch.sparse CSR "
                        "tensor, taken as PyG's layers take it) or an edge_index [2, num_edges]")
    return None


def _adj_t_graph(adj: torch.Tensor, x: Any, self_loops: bool) -> Graph:
    """The graph of PyG's transposed sparse adjacency ``adj`` (``adj[i, j]`` stored: the edge ``j -> i``), cached
    per tensor (:func:`gnnfuse.graph.as_graph_of_adj_t`), checked against ``x``: ``[N, N]`` for a tensor ``x [N,
    F]``, ``[N_dst, N_src]`` for a pair.  A COO tensor must be coalesced unless ``self_loops`` (PyG reads its
    ``indices()``, which needs one; adding self loops coalesces it first)."""
    check_adj_t(adj, "edge_index (a sparse adjacency adj_t)")
    pair = isinstance(x, (tuple, list)) and len(x) == 2
    x_src, x_dst = x if pair else (x, x)
    if all(isinstance(t, torch.Tensor) and t.dim() >= 1 for t in (x_src, x_dst)):
        want = (x_dst.shape[0], x_src.shape[0])
        if tuple(adj.shape) != want:
            expected = (f"[N_dst, N_src] = {list(want)} (the rows of x_dst and x_src)" if pair
                        else f"[N, N] = {list(want)} (the rows of x; a bipartite adjacency takes x as a pair)")
            raise ValueError(f"edge_index is a sparse adjacency adj_t of shape {list(adj.shape)}, expected {expected}: "
                             "adj_t[i, j] is the edge j -> i")
    if adj.layout == torch.sparse_coo and not adj.is_coalesced() and not self_loops:
        raise ValueError("edge_index is an uncoalesced sparse COO tensor: PyG's layers read its indices(), which need "
                         "a coalesced one (only adding self loops coalesces it first); pass edge_index.coalesce()")
    return as_graph_of_adj_t(adj)


def _sparse_weights(adj: torch.Tensor, looped: Graph | None, alpha: torch.Tensor) -> torch.Tensor:
    """PyG's ``set_sparse_value``: the adjacency the attention ran over with ``α [E, H]`` as its values, in
    ``adj``'s layout, shape ``[N_dst, N_src, H]``: ``adj`` itself (``looped`` None) or the self-looped graph's
    coalesced edges (PyG's ``add_self_loops`` of a sparse tensor)."""
    size = (*adj.shape, *alpha.shape[1:])
    if looped is None:
        if adj.layout == torch.sparse_coo:
            return torch.sparse_coo_tensor(adj.indices(), alpha, size, device=alpha.device).coalesce()
        return torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(), alpha, size, device=alpha.device)
    if adj.layout == torch.sparse_coo:  # sorted by (destination, source), no duplicates: coalesced as built
        return torch.sparse_coo_tensor(looped.edge_index.flip(0), alpha, size, device=alpha.device,
                                       is_coalesced=True)
    return torch.sparse_csr_tensor(looped.indptr[: adj.shape[0] + 1].long(), looped.csr_src.long(), alpha, size,
                                   device=alpha.device)


# The widest rows whose 'mean' / 'add' loop rows come from edge_score_csr's per-destination sums (an identity map:
# a [P, C] product and its [C, C] tile per program); wider rows take torch's segment_reduce.
LOOP_SUM_MAX_WIDTH = 64


def _loop_reduction(values: torch.Tensor, loops: SelfLooped, fill_value: str) -> torch.Tensor:
    """``[N, C]`` (``[L, C]``, the loop nodes', for ``'mean'`` / ``'add'``): per node, ``fill_value``'s reduction of
    the rows of ``values [E, C]`` (input order) over its incoming kept edges (0 without any), in float32 for 2-byte
    values (float64 for float64), differentiable.  ``'mean'`` / ``'add'`` of rows up to :data:`LOOP_SUM_MAX_WIDTH`
    wide: :func:`gnnfuse.edge_score.edge_score_csr` with the identity for ``M`` (its kernel sums each destination run
    of the rows it places in CSR order, one atomic per run: torch's ``segment_reduce`` took 1.28 ms for the
    arxiv-like graph's ``[1.35 M, 16]`` rows on the H200, one thread per segment and column walking a hub's 10⁴
    rows), the loops' rows read back from their CSR positions; otherwise a segmented reduction of the kept edges'
    rows sorted by destination.  (GATConv's ``'mean'`` and ``'add'`` fills reach the scores, not the features.)"""
    acc = torch.float64 if values.dtype == torch.float64 else torch.float32
    reduction = _FILL_REDUCTIONS[fill_value]
    if reduction in ("sum", "mean") and values.shape[1] <= LOOP_SUM_MAX_WIDTH:
        graph = loops.graph
        identity = torch.eye(values.shape[1], dtype=acc, device=values.device)
        fill = LoopFill("add" if reduction == "sum" else "mean", loops.loop_pos, graph.csr_dst, loops.kept_in_degree,
                        graph.num_nodes)
        return gather_rows(edge_score_csr(values, identity, loops.csr_input, fill), loops.loop_pos)
    counts = loops.kept_in_degree
    segments = gather_rows(values, loops.kept_by_dst).to(acc)
    reduced = torch.segment_reduce(segments, reduction, lengths=counts, unsafe=True)
    return torch.where((counts > 0)[:, None], reduced, 0.0)


class _Call:
    """One layer call's graph and inputs, PyG's way: ``x`` a tensor or a pair ``(x_src, x_dst)``; the graph over
    ``n = max(N_src, N_dst)`` node ids (both sides padded to ``n`` rows, padding rows without edges), self-looped
    when asked (PyG's edge order, cached on the graph: ``loops``, a :class:`gnnfuse.graph.SelfLooped`, None when no
    loops were added).  A sparse ``edge_index`` (PyG's ``adj_t``, kept as ``adj``): ``base`` its graph and the
    self-looped graph PyG's sparse ``add_self_loops`` forms (``sparse_loops``; ``loops`` None).

    ``x = (x_src, None)`` where ``dst_optional`` (GATConv's, as PyG's): ``x_dst`` None and the destinations counted
    as PyG's ``propagate`` counts them (:meth:`_missing_dst_rows`)."""

    def __init__(self, x: Any, edge_index: Any, size: Any, in_channels: tuple[int, int] | None,
                 dtype: torch.dtype | None, add_self_loops: bool, dst_optional: bool = False) -> None:
        self.adj = _sparse_adjacency(edge_index)
        self.pair = isinstance(x, (tuple, list))
        if self.pair:
            if len(x) != 2:
                raise ValueError(f"x must be a tensor or a pair (x_src, x_dst) of tensors, got {len(x)} items")
            x_src, x_dst = x
            if x_dst is None and not dst_optional:
                raise ValueError("x = (x_src, None): this layer needs the destinations' features, as PyG's does "
                                 "(its GATv2Conv asserts x_dst is not None; only GATConv takes (x_src, None))")
            widths = (None, None) if in_channels is None else in_channels
            _check_features(x_src, "x_src", widths[0], dtype)  # before gnnfuse.nn's checks, which name feat_src
            if x_dst is not None:
                _check_features(x_dst, "x_dst", widths[1], dtype)
        else:
            if in_channels is not None and None not in in_channels and in_channels[0] != in_channels[1]:
                raise ValueError(f"in_channels={in_channels} (sources and destinations of different widths) takes x "
                                 "as a pair (x_src, x_dst)")
            x_src = x_dst = x
        self.n_src, self.n_dst = (t.shape[0] if isinstance(t, torch.Tensor) and t.dim() else 0 for t in (x_src, x_dst))
        if self.pair and x_dst is None:
            self.n_dst = self._missing_dst_rows(size)
        elif size is not None and (not isinstance(size, (tuple, list)) or tuple(size) != (self.n_src, self.n_dst)):
            raise ValueError(f"size must be None or (N_src, N_dst) = {(self.n_src, self.n_dst)} (the rows of x), "
                             f"got {size!r}")
        self.n = max(self.n_src, self.n_dst)
        if self.adj is not None:
            edge_index = _adj_t_graph(self.adj, x, add_self_loops)
        if self.pair:
            base = as_graph(edge_index, self.n)
        else:
            base = _graph_and_features(edge_index, x, in_channels[0] if in_channels else None, dtype, True, "x")
        self.base = base
        self.sparse_loops = self.adj is not None and add_self_loops
        self.loops = base.pyg_self_loops(min(self.n_src, self.n_dst)) if add_self_loops and not self.sparse_loops \
            else None
        if self.sparse_loops:  # PyG's remove_self_loops / add_self_loops of a sparse tensor: coalesced
            self.graph = base.pyg_sparse_self_loops(min(self.n_src, self.n_dst))
        else:
            self.graph = base if self.loops is None else self.loops.graph
        if self.pair:  # the bipartite checks of gnnfuse.nn (dtypes, devices, edges within both sets: one host sync)
            stand_in = x_dst  # without x_dst: an empty [N_dst, 0] for the destinations' count (the edges' check)
            if x_dst is None:
                stand_in = x_src.new_empty((self.n_dst, 0))
            _bipartite(self.graph, (x_src, stand_in), None, dtype, True)
        self.x_src, self.x_dst = x_src, x_dst

    def _missing_dst_rows(self, size: Any) -> int:
        """PyG's destination count for ``x = (x_src, None)``: ``propagate``'s ``size_i``, the adjacency's rows for a
        sparse ``adj_t`` (``_check_input``), else ``size[1]``, else the sources' count (``_collect``'s ``size_i``
        falling back to ``size_j``).  ``size[0]`` must be ``N_src`` (``_set_size``)."""
        if size is not None and (not isinstance(size, (tuple, list)) or len(size) != 2 or size[0] != self.n_src
                                 or not (size[1] is None or backend.is_int(size[1]) and size[1] >= 0)):
            raise ValueError(f"size must be None or (N_src, N_dst) with N_src = {self.n_src} (the rows of x_src), "
                             f"got {size!r}")
        wanted = None if size is None else size[1]
        if self.adj is not None:
            if self.adj.dim() != 2 or self.adj.shape[1] != self.n_src or wanted not in (None, self.adj.shape[0]):
                raise ValueError(f"edge_index is a sparse adjacency adj_t of shape {list(self.adj.shape)}, expected "
                                 f"[N_dst, N_src] with N_src = {self.n_src} (the rows of x_src)"
                                 + ("" if wanted is None else f" and N_dst = {wanted} (size[1])"))
            return int(self.adj.shape[0])
        return self.n_src if wanted is None else int(wanted)

    def pad(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` with zero rows appended up to the graph's ``n`` rows (differentiable)."""
        if t.shape[0] == self.n:
            return t
        return torch.cat([t, t.new_zeros((self.n - t.shape[0], *t.shape[1:]))])

    def check_edge_attr(self, edge_attr: Any, width: int, dtype: torch.dtype) -> torch.Tensor:
        """``edge_attr [E, width]`` (or ``[E]`` when ``width`` is 1) in ``edge_index``'s order (a sparse adjacency's:
        its stored entries in storage order, PyG's ``to_edge_index``), checked."""
        if self.sparse_loops:
            raise ValueError("edge_attr with a sparse adjacency needs add_self_loops=False: PyG's remove_self_loops / "
                             "add_self_loops take no edge_attr with a torch.sparse adjacency (they coalesce it, "
                             "merging duplicate entries); pass an edge_index [2, num_edges] for self loops with edge "
                             "features")
        if not isinstance(edge_attr, torch.Tensor):
            raise ValueError(f"edge_attr must be a [num_edges, edge_dim={width}] tensor, got {edge_attr!r}")
        if edge_attr.dim() == 1 and width == 1:
            edge_attr = edge_attr.view(-1, 1)
        if edge_attr.dim() != 2 or tuple(edge_attr.shape) != (self.base.num_edges, width):
            raise ValueError(f"edge_attr must have shape [num_edges, edge_dim] = {[self.base.num_edges, width]}, "
                             f"got {list(edge_attr.shape)}")
        if edge_attr.dtype != dtype:
            raise TypeError(f"edge_attr has dtype {edge_attr.dtype} but the layer's parameters are {dtype}")
        if edge_attr.device != self.base.device:
            raise ValueError(f"edge_attr is on device '{edge_attr.device}' but the graph is on '{self.base.device}'")
        return edge_attr

    def with_loops(self, values: torch.Tensor, fill: str | torch.Tensor) -> torch.Tensor:
        """Per-edge ``values [E, C]`` (input order) on the self-looped graph, as PyG's ``add_self_loops`` forms edge
        features: the kept edges' rows, then one row per loop — ``fill`` a ``[C]`` row for every loop, or a reduction
        (``'mean'``, ``'add'``, ``'max'``, ``'min'``, ``'mul'``) of the loop node's incoming kept edges' rows (0 for a
        node without any).  ``values`` itself without loops."""
        if self.loops is None:
            return values
        kept = gather_rows(values, self.loops.kept)
        num_loops = self.graph.num_edges - self.loops.kept.numel()
        if isinstance(fill, str):
            loop_rows = _loop_reduction(values, self.loops, fill)[:num_loops].to(values.dtype)
        else:
            rows = _fill_rows(fill.to(values.device, values.dtype), values.shape[1])
            if rows.shape[0] not in (1, num_loops):
                raise ValueError(f"fill_value has {rows.shape[0]} rows but the graph gets {num_loops} self loops: a "
                                 "tensor fill_value is one row for every loop, or a row per node")
            loop_rows = rows.expand(num_loops, values.shape[1])
        return torch.cat([kept, loop_rows])

    def weights(self, edge_index: Any, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """PyG's ``(edge_index, α)``: the edge_index as passed (a tensor, no loops added), else the graph's; for a
        sparse adjacency PyG's ``(adj, α)``, ``adj`` the adjacency the attention ran over (self-looped and coalesced,
        or as passed) in its layout with ``α`` as values (``set_sparse_value``)."""
        if self.adj is not None:
            return _sparse_weights(self.adj, self.graph if self.sparse_loops else None, attention), attention
        if self.loops is None and isinstance(edge_index, torch.Tensor):
            return edge_index, attention
        return self.graph.edge_index, attention


_MESSAGE_HOOKS = ("propagate", "message", "aggregate", "message_and_aggregate", "edge_update")


def _pyg_message_passing() -> type | None:
    """``torch_geometric.nn.MessagePassing``, imported on the first layer built (PyG is optional: None without it)."""
    try:
        from torch_geometric.nn.conv import MessagePassing
    except ImportError:
        return None
    return MessagePassing


def _refuse_hook(name: str) -> Any:
    def register(self: nn.Module, hook: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.{name}: a fused layer forms no per-edge messages and runs no "
                                  "propagate(), so PyG's message-passing hooks would never run (to_hetero_with_bases "
                                  "and the attention explainer need them): use PyG's own layer there")
    register.__name__ = name
    return register


def _refuse_explain(self: nn.Module, value: Any) -> None:
    if value:
        raise NotImplementedError(f"{type(self).__name__}: PyG's explainers mask the per-edge messages of "
                                  "propagate(), which a fused layer does not form: set conv.explain = False to leave "
                                  "it out of an explanation, or explain the model built from PyG's layers")
    self.__dict__["_explain"] = value


_MESSAGE_PASSING_CLASSES: dict[type, type] = {}


def _message_passing_class(cls: type) -> type:
    """``cls`` as a ``torch_geometric.nn.MessagePassing`` subclass (built once per class, when PyG is installed;
    ``cls`` itself without PyG): PyG's ``to_hetero`` (and ``ToHeteroMessagePassing``) find message-passing layers by
    ``isinstance(module, MessagePassing)`` (``torch_geometric.nn.fx.is_message_passing_op``), and replicate any other
    module per edge type without aggregating per destination type.  The class runs MessagePassing's ``__init__``
    (the layer's ``super().__init__()`` reaches it, and it ``nn.Module``'s; PyG's ``__setstate__``, which
    ``copy.deepcopy`` calls, reads what it stores) and keeps this layer's ``forward``; the MessagePassing features
    a fused layer cannot honour (message hooks, explainers' edge masks) refuse with an error instead of being
    ignored."""
    if "_fused_class" in cls.__dict__:
        return cls
    if cls not in _MESSAGE_PASSING_CLASSES:
        base = _pyg_message_passing()
        namespace = {"__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}._as_message_passing",
                     "__doc__": cls.__doc__,
                     "_fused_class": cls, "explain": property(lambda self: self.__dict__.get("_explain"),
                                                              _refuse_explain)}
        for stage in _MESSAGE_HOOKS:
            for kind in ("forward_pre_hook", "forward_hook"):
                name = f"register_{stage}_{kind}"
                namespace[name] = _refuse_hook(name)
        _MESSAGE_PASSING_CLASSES[cls] = cls if base is None else type(cls.__name__, (cls, base), namespace)
    return _MESSAGE_PASSING_CLASSES[cls]


class _MessagePassingClass:
    """The class attribute ``_as_message_passing``: on a layer class, its MessagePassing subclass
    (:func:`_message_passing_class`), whose ``__qualname__`` names it (``GATConv._as_message_passing``) so that
    pickle finds it (PyG's ``Inspector``, in a layer's state, holds the class)."""

    def __get__(self, instance: Any, owner: type) -> type:
        return _message_passing_class(owner)


class _PyGLayer:
    """What makes the layers of this module PyG message-passing layers where PyG is installed: each is built as an
    instance of its class's ``MessagePassing`` subclass (:func:`_message_passing_class`: ``isinstance(conv,
    GATConv)`` holds, ``type(conv)`` is that subclass, ``GATConv._as_message_passing``), which PyG's ``to_hetero``
    needs."""

    _as_message_passing = _MessagePassingClass()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(_message_passing_class(cls))


class _PyGHeadsConv(_PyGLayer, nn.Module):
    """What PyG's GATConv and GATv2Conv share: arguments, the residual ``res`` and output ``bias``, head
    concatenation or mean."""

    def __init__(self, in_channels: Any, out_channels: int, heads: int, concat: bool, negative_slope: float,
                 dropout: float, add_self_loops: bool, edge_dim: int | None, fill_value: Any, bias: bool,
                 residual: bool) -> None:
        super().__init__()
        self._in_pair = _in_channels(in_channels, lazy=True)
        self.in_channels = in_channels
        self.out_channels = _positive_int("out_channels", out_channels)
        self.heads = _positive_int("heads", heads)
        self.concat = bool(concat)
        self.negative_slope = ops._check_negative_slope(negative_slope)
        self.dropout = ops._check_dropout(dropout)
        self.add_self_loops = bool(add_self_loops)
        self.edge_dim = None if edge_dim is None else _positive_int("edge_dim", edge_dim)
        self.fill_value = _check_fill_value(fill_value)
        self.residual = bool(residual)

    def _register_res_and_bias(self, bias: bool) -> None:
        """The residual ``res`` and output ``bias``, registered after the subclass's maps and attention vectors as
        PyG registers them: ``parameters()`` and ``state_dict()`` then list PyG's names in PyG's order (an
        optimizer's state_dict holds its state by position, so a PyG checkpoint resumes with this layer)."""
        total = self.out_channels * (self.heads if self.concat else 1)
        if self.residual:
            self.res = _linear(self._in_pair[1], total, bias=False)
        else:
            self.register_parameter("res", None)
        if bias:
            self.bias = nn.Parameter(torch.empty(total))
        else:
            self.register_parameter("bias", None)

    def _dropout(self) -> float:
        return self.dropout if self.training else 0.0

    def _sides(self) -> tuple[tuple[nn.Module | None, ...], tuple[nn.Module | None, ...]]:
        """The linear maps that read the sources' features and those that read the destinations'."""
        raise NotImplementedError

    def _stack_projections(self) -> None:
        """Nothing here: a layer with maps stacked in one buffer (``gnnfuse.nn._StackedProjections``) stacks them
        again once its lazy maps have their widths."""

    def _materialize(self, x: Any) -> None:
        """PyG's lazy ``in_channels=-1``: each map still without its input width takes it from the first call's
        features (``x`` or ``(x_src, x_dst)``; a map shared by both sides from the sources'), initialized as PyG
        initializes it then; ``_in_pair`` (the widths the calls are checked against) from the maps' weights, once
        known (also after a state_dict loaded into a lazy layer)."""
        if None not in self._in_pair:
            return
        xs, xd = (x[0], x[1]) if isinstance(x, (tuple, list)) and len(x) == 2 else (x, x)
        src_maps, dst_maps = self._sides()
        if xd is None:  # PyG's (x_src, None): the destinations' own maps stay lazy
            dst_maps = tuple(m for m in dst_maps if m is not None and not _lazy(m))
        widths = _lazy_widths(((xs, src_maps), (xd, dst_maps)), init=_reset_linear)  # PyG's glorot
        if widths is not None:
            self._in_pair = tuple(widths)
            self._stack_projections()

    def _reset_shared(self) -> None:
        if self.res is not None and not _lazy(self.res):
            _glorot(self.res.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _finish(self, out: torch.Tensor, call: _Call, added: bool) -> torch.Tensor:
        """Heads concatenated ``[N_dst, H·C]`` or averaged ``[N_dst, C]``, then the residual of ``x_dst`` and the
        bias, unless the kernel's store ``added`` them (concatenated heads)."""
        out = _first_rows(out, call.n_dst)
        out = out.reshape(call.n_dst, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        if added:
            return out
        if self.res is not None and call.x_dst is not None:  # PyG's (x_src, None): no residual
            out = out + self.res(call.x_dst)
        if self.bias is not None:
            out = out + self.bias
        return out

    def _out_add(self, call: _Call) -> torch.Tensor | None:
        """The residual and bias as the fused kernel's ``out_add`` (added in its store): with concatenated heads on
        an ordinary call; None otherwise (:meth:`_finish` adds them)."""
        if not self.concat or call.pair:
            return None
        if self.res is None:
            return self.bias
        res = self.res(call.x_dst)
        return res if self.bias is None else res + self.bias

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"


class GATConv(_PyGHeadsConv):
    r"""Graph attention layer (Veličković et al., 2018), fused; ``torch_geometric.nn.GATConv``'s interface.

    For node ``i`` with incoming edges ``j -> i`` (self loops added unless ``add_self_loops=False``) and heads
    ``h`` (``C = out_channels``)::

        xs_j = lin(x_j),  xd_i = lin(x_i)          [H, C]   (lin_src / lin_dst when in_channels is a pair)
        e_ijh = LeakyReLU(att_src[h] · xs_j[h] + att_dst[h] · xd_i[h] + att_edge[h] · lin_edge(edge_attr_ij)[h])
        α_ijh = dropout(softmax_j e_ijh)
        out_i = Σ_j α_ijh xs_j[h]   concatenated [H·C] (concat) or averaged [C];  + res(x_i) + bias

    Parameters are PyG's (names and shapes; a PyG GATConv state_dict loads unchanged): ``lin.weight [H·C, F]``
    (or ``lin_src`` / ``lin_dst``), ``att_src`` / ``att_dst`` ``[1, H, C]``, with ``edge_dim``
    ``lin_edge.weight [H·C, edge_dim]`` and ``att_edge [1, H, C]``, with ``residual`` ``res.weight``, and ``bias``
    ``[H·C]`` (concat) or ``[C]``.

    ``forward(x, edge_index, edge_attr=None, size=None, return_attention_weights=None)``: ``x [N, F]`` (float16 /
    bfloat16 / float32 / float64, the parameters' dtype) or ``(x_src, x_dst)`` (``x_dst`` None as in PyG: module
    docstring); ``edge_index [2, E]`` (or a sparse ``adj_t``: module docstring); ``edge_attr [E, edge_dim]`` in
    ``edge_index``'s order (the self loops' rows from ``fill_value``, as PyG).  Returns ``[N_dst, H·C]`` or ``[N_dst,
    C]``; with ``return_attention_weights=True`` PyG's ``(out, (edge_index, α [E', H]))``, ``edge_index`` the
    self-looped edges (PyG's order) and ``α`` the weights the aggregation used (after dropout in training), no
    gradient.  The edge features' term is one ``[E, H]`` score per edge, ``edge_attr · M`` with ``M [edge_dim, H]``
    folded from ``lin_edge`` and ``att_edge`` (PyG forms ``lin_edge(edge_attr)`` ``[E, H·C]`` first); the kernels add it
    to the score and its gradient is the backward's per-edge score gradient.  The projection and node scores of an
    ordinary call are fused as in :class:`gnnfuse.nn.GATConv`; the residual and bias of concatenated heads are added in
    the kernel's store.
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value: float | torch.Tensor | str = "mean",
        bias: bool = True,
        residual: bool = False,
    ) -> None:
        super().__init__(in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops, edge_dim,
                         fill_value, bias, residual)
        width = self.heads * self.out_channels
        if isinstance(in_channels, (tuple, list)):
            self.lin = None
            self.lin_src = _linear(self._in_pair[0], width, bias=False)
            self.lin_dst = _linear(self._in_pair[1], width, bias=False)
        else:
            self.lin = _linear(self._in_pair[0], width, bias=False)
            self.lin_src = self.lin_dst = None
        self.att_src = nn.Parameter(torch.empty(1, self.heads, self.out_channels))
        self.att_dst = nn.Parameter(torch.empty(1, self.heads, self.out_channels))
        if self.edge_dim is not None:
            self.lin_edge = nn.Linear(self.edge_dim, width, bias=False)
            self.att_edge = nn.Parameter(torch.empty(1, self.heads, self.out_channels))
        else:
            self.lin_edge = None
            self.register_parameter("att_edge", None)
        self._register_res_and_bias(bias)
        self.reset_parameters()

    def _sides(self) -> tuple[tuple[nn.Module | None, ...], tuple[nn.Module | None, ...]]:
        return (self.lin, self.lin_src), (self.lin, self.lin_dst, self.res)  # one lin reads both sides

    def reset_parameters(self) -> None:
        """PyG's initialization: glorot weights and attention vectors, a zero bias."""
        for linear in (self.lin, self.lin_src, self.lin_dst, self.lin_edge):
            if linear is not None and not _lazy(linear):
                _glorot(linear.weight)
        for att in (self.att_src, self.att_dst, self.att_edge):
            if att is not None:
                _glorot(att)
        self._reset_shared()

    def _edge_score(self, call: _Call, edge_attr: Any, dtype: torch.dtype) -> torch.Tensor | None:
        """``[E', H]`` in the self-looped graph's CSR order (``ops.gat``'s ``edge_score_order='csr'``):
        ``att_edge · lin_edge(edge_attr)`` per edge and head, as ``edge_attr · M`` with ``M [K, H]`` folded from the
        two parameters in the accumulation dtype (no ``[E, H·C]`` tensor), formed by
        :func:`gnnfuse.edge_score.edge_score_csr` at the CSR positions; the self loops' rows from ``fill_value``: a
        constant's score, or the mean / sum of the node's incoming kept edges' scores (linear in the features, so
        PyG's reduction of the features moves onto the ``H``-wide scores); ``'max'`` / ``'min'`` / ``'mul'`` reduce
        the features as PyG does, before the product.  None without ``edge_dim`` (PyG ignores ``edge_attr`` then) or
        without ``edge_attr`` (PyG's ``edge_update`` adds the term only given both: ``to_hetero`` passes None for an
        edge type missing from ``edge_attr_dict``)."""
        if self.lin_edge is None or edge_attr is None:
            return None
        attr = call.check_edge_attr(edge_attr, self.edge_dim, dtype)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        fold = (self.lin_edge.weight.view(self.heads, self.out_channels, self.edge_dim).to(acc)
                * self.att_edge.view(self.heads, self.out_channels, 1).to(acc)).sum(dim=1).t()  # [K, H]
        fill, graph, loops = self.fill_value, call.graph, call.loops
        if loops is None:
            return edge_score_csr(attr, fold, graph.csr_eid)
        rows = None if isinstance(fill, str) else _fill_rows(torch.as_tensor(fill, dtype=acc, device=attr.device),
                                                             self.edge_dim)
        if (isinstance(fill, str) and _FILL_REDUCTIONS[fill] not in ("sum", "mean")
                or rows is not None and rows.shape[0] != 1):  # a reduction PyG forms on the features, or row per node
            return edge_score_csr(call.with_loops(attr, fill if rows is None else rows), fold, graph.csr_eid)
        fill_row = None
        if isinstance(fill, str):
            mode = _FILL_REDUCTIONS[fill].replace("sum", "add")
        else:
            mode, fill_row = "const", rows[0] @ fold
        return edge_score_csr(attr, fold, loops.csr_input, LoopFill(mode, loops.loop_pos, graph.csr_dst,
                                                                     loops.kept_in_degree, graph.num_nodes, fill_row))

    @backend.eager_under_compile
    def forward(
        self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], edge_index: Any, edge_attr: Any = None,
        size: tuple[int, int] | None = None, return_attention_weights: bool | None = None, *,
        schedule: ScheduleOptions | None = None, rng: PhiloxStream | DevicePhiloxStream | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        want = _want("return_attention_weights", return_attention_weights)
        self._materialize(x)
        weight = (self.lin if self.lin is not None else self.lin_src).weight
        call = _Call(x, edge_index, size, self._in_pair, weight.dtype, self.add_self_loops, dst_optional=True)
        edge_score = self._edge_score(call, edge_attr, weight.dtype)
        shape = (-1, self.heads, self.out_channels)
        common = dict(negative_slope=self.negative_slope, dropout=self._dropout(), rng=rng, schedule=schedule,
                      return_attention=want, edge_score=edge_score, edge_score_order="csr")
        add = None
        if not call.pair and self.lin is not None:  # the projection and node scores fused (gnnfuse.nn.GATConv's path)
            add = self._out_add(call)
            h = call.x_src
            if ops.fuses_projection(h, weight, self.heads, self.out_channels):
                first, projected = h, {"weight": weight}
            else:
                first, projected = _project(self.lin, h).view(shape), {}
            result = ops.gat(call.graph, first, self.att_src, self.att_dst, out_add=add, **common, **projected)
        else:  # a pair, or lin_src / lin_dst: each side projected by its own weight
            src_lin, dst_lin = (self.lin, self.lin) if self.lin is not None else (self.lin_src, self.lin_dst)
            xs = _project(src_lin, call.x_src).view(shape)
            el = (xs * self.att_src).sum(dim=-1)
            if call.x_dst is None:  # PyG's (x_src, None): the scores without a destination term
                er = el.new_zeros((call.n, self.heads))
            else:
                er = call.pad(((_project(dst_lin, call.x_dst).view(shape)) * self.att_dst).sum(dim=-1))
            result = ops.gat_attention(call.graph, call.pad(xs), call.pad(el), er, **common)
        out, attention = result if want else (result, None)
        out = self._finish(out, call, add is not None)
        return (out, call.weights(edge_index, attention)) if want else out


class GATv2Conv(_StackedProjections, _PyGHeadsConv):
    r"""GATv2 (Brody et al., 2022), fused; ``torch_geometric.nn.GATv2Conv``'s interface.

    For node ``i`` with incoming edges ``j -> i`` (self loops added unless ``add_self_loops=False``) and heads
    ``h``::

        xl_j = lin_l(x_j),  xr_i = lin_r(x_i)                     [H, C]
        e_ijh = att[h] · LeakyReLU(xl_j[h] + xr_i[h] + lin_edge(edge_attr_ij)[h])   (the last term with edge_dim)
        α_ijh = dropout(softmax_j e_ijh)
        out_i = Σ_j α_ijh xl_j[h]   concatenated [H·C] (concat) or averaged [C];  + res(x_i) + bias

    Parameters are PyG's (a PyG GATv2Conv state_dict loads unchanged): ``lin_l``, ``lin_r`` (``Linear(F, H·C,
    bias=bias)``; one module under both names with ``share_weights``), ``att [1, H, C]``, ``res`` (no bias) with
    ``residual``, ``bias`` ``[H·C]`` or ``[C]``, with ``edge_dim`` ``lin_edge.weight [H·C, edge_dim]`` (no bias).
    ``forward(x, edge_index, edge_attr=None, return_attention_weights=None)`` as :class:`GATConv`'s: ``edge_attr
    [E, edge_dim]`` in ``edge_index``'s order, the self loops' rows from ``fill_value`` as PyG forms them (``[N,
    edge_dim]``, the only per-edge tensor formed here), ignored without ``edge_dim`` (as PyG).  The edge term is an
    ``[H, C]`` vector per edge inside the LeakyReLU: the forward kernels project it in registers
    (:func:`gnnfuse.ops.gatv2`'s ``edge_attr``, ``edge_weight``; the backward reads the training forward's scores and
    LeakyReLU slope bits), never the ``[E, H·C]`` ``lin_edge(edge_attr)``.  With concatenated heads on an ordinary
    call the residual and bias are added in the kernels' store (``ops.gatv2``'s ``out_add``), as :class:`GATConv`
    does.
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value: float | torch.Tensor | str = "mean",
        bias: bool = True,
        share_weights: bool = False,
        residual: bool = False,
    ) -> None:
        super().__init__(in_channels, out_channels, heads, concat, negative_slope, dropout, add_self_loops, edge_dim,
                         fill_value, bias, residual)
        self.share_weights = bool(share_weights)
        width = self.heads * self.out_channels
        self.lin_l = _linear(self._in_pair[0], width, bias=bias)
        self.lin_r = self.lin_l if self.share_weights else _linear(self._in_pair[1], width, bias=bias)
        self.att = nn.Parameter(torch.empty(1, self.heads, self.out_channels))
        self.lin_edge = None if self.edge_dim is None else nn.Linear(self.edge_dim, width, bias=False)
        self._register_res_and_bias(bias)
        self.reset_parameters()
        self._stack_projections()

    def _projection_maps(self) -> list[nn.Module]:
        return [] if self.share_weights else [self.lin_l, self.lin_r]

    def _sides(self) -> tuple[tuple[nn.Module | None, ...], tuple[nn.Module | None, ...]]:
        return (self.lin_l,), (self.lin_r, self.res)

    def reset_parameters(self) -> None:
        """PyG's initialization: glorot weights and attention vector, PyG Linear's biases, a zero output bias."""
        _reset_linear(self.lin_l)
        if not self.share_weights:
            _reset_linear(self.lin_r)
        if self.lin_edge is not None:
            _glorot(self.lin_edge.weight)
        _glorot(self.att)
        self._reset_shared()

    def _edge_features(self, call: _Call, edge_attr: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(edge_attr [E', edge_dim], lin_edge.weight)`` on the call's (self-looped) graph, input order: the loops'
        rows from ``fill_value`` (:meth:`_Call.with_loops`, a constant or the reduction of the node's incoming kept
        edges' rows, PyG's ``add_self_loops``); ``(None, None)`` without ``edge_dim`` or without ``edge_attr`` (PyG's
        ``edge_update`` adds the term only given ``edge_attr``: ``to_hetero`` passes None for an edge type missing from
        ``edge_attr_dict``)."""
        if self.lin_edge is None or edge_attr is None:
            return None, None
        weight = self.lin_edge.weight
        attr = call.check_edge_attr(edge_attr, self.edge_dim, weight.dtype)
        fill = self.fill_value
        if not isinstance(fill, str):
            fill = torch.as_tensor(fill, dtype=attr.dtype, device=attr.device)
        return call.with_loops(attr, fill), weight

    @backend.eager_under_compile
    def forward(
        self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], edge_index: Any, edge_attr: Any = None,
        return_attention_weights: bool | None = None, *,
        schedule: ScheduleOptions | None = None, rng: PhiloxStream | DevicePhiloxStream | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        want = _want("return_attention_weights", return_attention_weights)
        self._materialize(x)
        call = _Call(x, edge_index, None, self._in_pair, self.lin_l.weight.dtype, self.add_self_loops)
        shape = (-1, self.heads, self.out_channels)
        if call.pair:
            xl = call.pad(_project(self.lin_l, call.x_src).view(shape))
            xr = call.pad(_project(self.lin_r, call.x_dst).view(shape))
        elif self.share_weights:
            xl = xr = _project(self.lin_l, call.x_src).view(shape)
        else:
            xl, xr = (y.view(shape) for y in _project_all([self.lin_l, self.lin_r], call.x_src))
        edge_attr, edge_weight = self._edge_features(call, edge_attr)
        add = self._out_add(call)
        result = ops.gatv2(call.graph, xl, xr, self.att, edge_attr, edge_weight, negative_slope=self.negative_slope,
                           dropout=self._dropout(), rng=rng, schedule=schedule, return_attention=want, out_add=add)
        out, attention = result if want else (result, None)
        out = self._finish(out, call, add is not None)
        return (out, call.weights(edge_index, attention)) if want else out


class TransformerConv(_PyGLayer, GraphTransformerConv):
    r"""Graph Transformer layer (Shi et al., 2021), fused; ``torch_geometric.nn.TransformerConv``'s interface.

    :class:`gnnfuse.nn.GraphTransformerConv` (the math, parameters and guarantees are documented there) with PyG's
    call: ``forward(x, edge_index, edge_attr=None, return_attention_weights=None)``, ``x [N, F]`` or ``(x_src,
    x_dst)``, ``edge_attr [E, edge_dim]`` in ``edge_index``'s order.  Like PyG's, the layer adds no self loops and
    ignores ``edge_attr`` when built without ``edge_dim``.  ``edge_index`` may be a sparse ``adj_t`` (module
    docstring; the attention weights come back beside the tensor as passed, as PyG's).  ``in_channels`` a pair of
    different widths takes ``x`` as a pair ``(x_src, x_dst)``.
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
        super().__init__(in_channels, out_channels, heads, concat, beta, dropout, edge_dim, bias, root_weight)
        self.in_channels = in_channels

    @backend.eager_under_compile
    def forward(
        self, x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], edge_index: Any, edge_attr: Any = None,
        return_attention_weights: bool | None = None, *,
        schedule: ScheduleOptions | None = None, rng: PhiloxStream | DevicePhiloxStream | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        want = _want("return_attention_weights", return_attention_weights)
        if isinstance(x, (tuple, list)) and len(x) == 2 and x[1] is None:
            raise ValueError("x = (x_src, None): TransformerConv needs the destinations' features (the queries and "
                             "the root term read them; PyG's layer fails on lin_query(None) too)")
        if self.lin_edge is not None and edge_attr is None:
            raise ValueError(f"edge_attr is required: the layer was built with edge_dim={self.edge_dim} (PyG's "
                             "TransformerConv asserts it too; its GATConv and GATv2Conv run without the edge term)")
        adj = _sparse_adjacency(edge_index)
        graph = edge_index if adj is None else _adj_t_graph(adj, x, False)
        self._check_inputs(x, graph, edge_attr)
        result = super().forward(graph, tuple(x) if isinstance(x, list) else x,
                                 edge_attr if self.lin_edge is not None else None, want or None,
                                 schedule=schedule, rng=rng)
        if want and adj is not None:  # PyG returns the sparse adjacency as passed, with α [E, H] beside it
            return result[0], (edge_index, result[1][1])
        return result

    def _check_inputs(self, x: Any, graph: Any, edge_attr: Any) -> None:
        """``x`` (or ``(x_src, x_dst)``) and ``edge_attr`` checked under PyG's names before
        :class:`gnnfuse.nn.GraphTransformerConv`'s checks, which name them ``feat`` and ``edge_feat``."""
        if None in self._widths:
            self._take_width(x)
        src_width, dst_width = self._widths
        dtype = self.lin_query.weight.dtype
        if isinstance(x, (tuple, list)) and len(x) == 2:
            _check_features(x[0], "x_src", src_width, dtype)
            _check_features(x[1], "x_dst", dst_width, dtype)
            device = x[1].device
        elif src_width is not None and src_width != dst_width:
            raise ValueError(f"in_channels={self.in_channels} (sources and destinations of different widths) takes x "
                             "as a pair (x_src, x_dst)")
        else:
            _check_features(x, "x", dst_width, dtype)
            device = x.device
        if self.lin_edge is None:
            return
        if not isinstance(edge_attr, torch.Tensor):
            raise ValueError(f"edge_attr must be a [num_edges, edge_dim={self.edge_dim}] tensor, got {edge_attr!r}")
        num_edges = graph.num_edges if isinstance(graph, Graph) else (
            graph.shape[1] if isinstance(graph, torch.Tensor) and graph.dim() == 2 and graph.shape[0] == 2 else None)
        if num_edges is not None and tuple(edge_attr.shape) != (num_edges, self.edge_dim):
            raise ValueError(f"edge_attr must have shape [num_edges, edge_dim] = {[num_edges, self.edge_dim]}, got "
                             f"{list(edge_attr.shape)}")
        if edge_attr.dtype != dtype:
            raise TypeError(f"edge_attr has dtype {edge_attr.dtype} but the layer's parameters are {dtype}")
        if edge_attr.device != device:
            raise ValueError(f"edge_attr is on device '{edge_attr.device}' but x is on '{device}'")

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"


class AGNNConv(_PyGLayer, nn.Module):
    r"""Attention-based graph neural network propagation (Thekumparampil et al., 2018), fused;
    ``torch_geometric.nn.AGNNConv``'s interface::

        out_i = Σ_{j->i} α_ij x_j,     α_i· = softmax_j (β · cos(x_i, x_j))

    over the graph with self loops (PyG's, unless ``add_self_loops=False``).  ``beta``: a parameter of shape
    ``[1]`` initialized to 1 (``requires_grad=True``), else a buffer of ones.  ``forward(x, edge_index)``:
    ``x [N, F]``; returns ``[N, F]``.  The fused kernel is the Graph Transformer's with unit rows as queries and
    keys (:func:`gnnfuse.ops.agnn`).
    """

    def __init__(self, requires_grad: bool = True, add_self_loops: bool = True) -> None:
        super().__init__()
        self.requires_grad = bool(requires_grad)
        self.add_self_loops = bool(add_self_loops)
        if self.requires_grad:
            self.beta = nn.Parameter(torch.empty(1))
        else:
            self.register_buffer("beta", torch.ones(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.requires_grad:
            with torch.no_grad():
                self.beta.fill_(1.0)

    @backend.eager_under_compile
    def forward(self, x: torch.Tensor, edge_index: Any, *, schedule: ScheduleOptions | None = None) -> torch.Tensor:
        if isinstance(x, (tuple, list)):
            raise TypeError("AGNNConv takes one feature tensor x [N, F], as PyG's")
        call = _Call(x, edge_index, None, None, None, self.add_self_loops)
        if x.dim() != 2:
            raise ValueError(f"x must have shape [num_nodes, features], got {tuple(x.shape)}")
        beta = self.beta if self.beta.dtype == x.dtype else self.beta.to(x.dtype)
        return ops.agnn(call.graph, x, beta, schedule=schedule)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"
