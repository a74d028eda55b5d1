"""The graph object: CSR by destination, reverse CSR by source, degree statistics, schedules.

A :class:`Graph` is built once from a PyG-style ``edge_index`` ``[2, E]`` (row 0 sources,
row 1 destinations), a ``(src, dst)`` pair, a scipy sparse matrix (``A[u, v] != 0`` is the
edge ``u -> v``), a PyG ``Data`` or a DGL graph (read through ``edges()`` /
``num_nodes()``, DGL is never imported); :meth:`Graph.from_adj_t` reads PyG's transposed ``torch.sparse``
adjacency ``adj_t`` (COO or CSR, ``adj_t[i, j]`` stored: the edge ``j -> i``; a CSR is the CSR by destination
already and is taken without a sort).  It owns:

* the **CSR by destination** — ``indptr [N + 1]``, ``csr_src [E]`` (source of each incoming
  edge, edges of one destination contiguous, in input order within a row) and
  ``csr_eid [E]`` (the input edge id at each CSR position).  The forward pass and the
  aggregation run over it.  "Edge position" everywhere in gnnfuse means the CSR position.
* the **reverse CSR by source** — ``rev_indptr [N + 1]``, ``rev_dst [E]`` and ``rev_pos [E]``
  (the CSR position of each outgoing edge: per-edge data is addressed by it), so the
  backward pass accumulates gradients of source features per source row, without atomics;
* degree statistics and per-(feature shape, dtype, device) :class:`~gnnfuse.schedule.Schedule`
  objects, cached in a :class:`fusecore.PlanCache` on the graph.

Indices are int32 where every value fits (node ids < 2³¹, edge positions < 2³¹) and int64
otherwise (:func:`index_dtypes`); kernels widen them to int64 before any address arithmetic.

Input checks (all before any CSR is built): node ids are int32 / int64 (other integer widths
and floats raise ``TypeError``), ``0 <= id < num_nodes`` (``ValueError`` naming the id),
``edge_index`` is ``[2, E]`` on a device that holds values (not ``meta``), ``num_nodes`` is a
non-negative integer and agrees with the one a Data / DGL / scipy input carries.  Strided,
transposed and otherwise non-contiguous index tensors are read as they are.  A scipy matrix
gives one edge per stored entry that is not zero (explicit zeros and the zero padding of BSR
blocks are not edges; duplicate COO entries are separate edges).
"""

from __future__ import annotations

import numbers
import warnings
import weakref
from typing import Any, NamedTuple

import torch

from fusecore import PlanCache

INT32_LIMIT = 2**31 - 1
INDEX_DTYPES = (torch.int32, torch.int64)


def narrowest_index_dtype(max_value: int) -> torch.dtype:
    """The narrowest index dtype (int32 or int64) that holds every value in ``[0, max_value]``."""
    if max_value < 0:
        raise ValueError(f"max_value must be >= 0, got {max_value}")
    return torch.int32 if max_value <= INT32_LIMIT else torch.int64


def index_dtypes(num_nodes: int, num_edges: int, forced: torch.dtype | None = None) -> tuple[torch.dtype, torch.dtype]:
    """``(node_dtype, position_dtype)`` of a graph's index arrays.

    Node ids (``csr_src``, ``rev_dst``, bucket rows) take values in ``[0, num_nodes)``; edge
    positions (``indptr``, ``rev_pos``, ``csr_eid``, piece ranges) in ``[0, num_edges]``.  Each is
    int32 while its largest value fits, int64 beyond 2³¹ − 1 (``forced`` sets both).
    """
    if forced is not None:
        return forced, forced
    return narrowest_index_dtype(max(num_nodes - 1, 0)), narrowest_index_dtype(num_edges)


def _check_index_tensor(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of node ids, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"{name} is a sparse tensor ({t.layout}); pass its edges as a dense [2, E] edge_index "
                        "(e.g. adjacency.coalesce().indices() for a COO matrix)")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} must hold integer node ids of dtype int32 or int64, got dtype {t.dtype}")
    if t.device.type == "meta":
        raise ValueError(f"{name} is on device 'meta', which holds no node ids; expected a cpu or cuda tensor")
    return t


class NodeCountError(ValueError):
    """A node count given for a graph differs from the one the graph carries (``graph_nodes``)."""

    def __init__(self, message: str, graph_nodes: int) -> None:
        super().__init__(message)
        self.graph_nodes = graph_nodes


def _check_num_nodes(value: Any, what: str = "num_nodes") -> int:
    """``value`` as a Python int >= 0 (any integral number, bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, torch.Tensor)):
        raise TypeError(f"{what} must be an int >= 0, got {value!r} of type {type(value).__name__}")
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise TypeError(f"{what} must be an int >= 0, got a tensor {value!r}")
        value = value.item()
    value = int(value)
    if value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value}")
    return value


def _edge_pair(name: str, src: Any, dst: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked ``(src, dst)``: two 1-D int32 / int64 tensors of one length on one device."""
    src = _check_index_tensor(f"{name} sources", src)
    dst = _check_index_tensor(f"{name} destinations", dst)
    if src.dim() != 1 or dst.dim() != 1 or src.shape != dst.shape:
        raise ValueError(
            f"{name} must give two 1-D tensors of equal length (sources, destinations), got shapes "
            f"{tuple(src.shape)} and {tuple(dst.shape)}"
        )
    if src.device != dst.device:
        raise ValueError(f"{name}: sources are on '{src.device}' but destinations are on '{dst.device}'")
    return src, dst


def _from_scipy(matrix: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Edges of a scipy sparse matrix or array in any format: one per stored nonzero entry."""
    coo = matrix.tocoo()
    if len(coo.shape) != 2 or coo.shape[0] != coo.shape[1]:
        raise ValueError(f"a sparse adjacency matrix must be square (2-D, N x N), got shape {coo.shape}")
    nonzero = coo.data != 0
    src = torch.as_tensor(coo.row[nonzero].astype("int64"))
    dst = torch.as_tensor(coo.col[nonzero].astype("int64"))
    return src, dst, int(coo.shape[0])


def _from_pyg_data(data: Any) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    # Without x or num_nodes PyG guesses max id + 1 and warns: a guess carries no count
    # (the default, or an explicit num_nodes, decides instead).
    src, dst, _ = _edges_from(data.edge_index)
    return src, dst, _data_count(data)


DGL_METHODS = ("edges", "num_nodes")


def _from_dgl_like(graph: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A DGL graph read through its public ``edges()`` and ``num_nodes()`` (DGL is never imported)."""
    missing = [m for m in DGL_METHODS if not callable(getattr(graph, m, None))]
    if missing:
        lacking = " / ".join(m + "()" for m in missing)
        raise TypeError(
            f"{type(graph).__name__} looks like a DGL graph but has no callable {lacking}; "
            "a DGL-like graph needs edges() -> (src, dst) and num_nodes() -> int"
        )
    pair = graph.edges()
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"{type(graph).__name__}.edges() must return (src, dst), got {type(pair).__name__}")
    src, dst = _edge_pair(f"{type(graph).__name__}.edges()", *pair)
    return src, dst, _check_num_nodes(graph.num_nodes(), f"{type(graph).__name__}.num_nodes()")


def _looks_like_dgl(source: Any) -> bool:
    return any(hasattr(source, m) for m in (*DGL_METHODS, "adj_tensors"))


def _edges_from(source: Any) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """(src, dst, num_nodes or None) from any supported graph description."""
    if isinstance(source, torch.Tensor):
        _check_index_tensor("edge_index", source)
        if source.dim() != 2 or source.shape[0] != 2:
            raise ValueError(
                f"edge_index must have shape [2, E] (row 0 sources, row 1 destinations), "
                f"got {tuple(source.shape)}"
            )
        return source[0], source[1], None
    if isinstance(source, (tuple, list)) and len(source) == 2:
        return (*_edge_pair("(src, dst)", source[0], source[1]), None)
    if hasattr(source, "tocoo") and hasattr(source, "shape"):  # scipy sparse matrix or array
        return _from_scipy(source)
    if type(source).__name__ == "HeteroData":
        raise TypeError(
            "a PyG HeteroData holds several edge types; pass one of them, e.g. data['paper', 'cites', "
            "'paper'].edge_index with num_nodes"
        )
    if hasattr(source, "edge_index"):  # PyG Data
        if not isinstance(source.edge_index, torch.Tensor):
            raise TypeError(
                f"{type(source).__name__}.edge_index must be an edge_index tensor [2, E], "
                f"got {type(source.edge_index).__name__}"
            )
        return _from_pyg_data(source)
    if _looks_like_dgl(source):
        return _from_dgl_like(source)
    raise TypeError(
        "graph must be a gnnfuse.Graph, an edge_index tensor [2, E], a (src, dst) pair, a scipy "
        f"sparse matrix, a PyG Data or a DGL graph; got {type(source).__name__}"
    )


def check_adj_t(adj_t: Any, name: str = "adj_t") -> None:
    """``adj_t`` is a 2-D ``torch.sparse`` COO or CSR tensor without dense dimensions, holding indices (not on
    ``meta``), else a ``TypeError`` / ``ValueError`` naming ``name``."""
    if not isinstance(adj_t, torch.Tensor) or adj_t.layout == torch.strided:
        raise TypeError(f"{name} must be a torch.sparse COO or CSR tensor [N_dst, N_src], got "
                        f"{adj_t.layout if isinstance(adj_t, torch.Tensor) else type(adj_t).__name__}")
    if adj_t.layout not in (torch.sparse_coo, torch.sparse_csr):
        raise TypeError(f"{name} has layout {adj_t.layout}: a sparse adjacency must be COO or CSR (as PyG's layers "
                        f"take it); convert it with {name}.to_sparse_csr()")
    if adj_t.dim() != 2 or adj_t.dense_dim() != 0:
        raise ValueError(f"{name} must be a 2-D sparse matrix [N_dst, N_src] without dense or batch dimensions, got "
                         f"shape {tuple(adj_t.shape)} with {adj_t.dense_dim()} dense dimension(s) (edge features go in "
                         "edge_attr)")
    if adj_t.device.type == "meta":
        raise ValueError(f"{name} is on device 'meta', which holds no indices; expected a cpu or cuda tensor")


def _adj_t_edges(adj_t: Any) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(src, dst, csr_order)`` of a checked ``torch.sparse`` COO / CSR adjacency ``adj_t [N_dst, N_src]``."""
    check_adj_t(adj_t)
    rows, cols = adj_t.shape
    if adj_t.layout == torch.sparse_coo:
        indices = adj_t._indices()  # storage order, coalesced or not
        dst, src = indices[0], indices[1]
        if dst.numel() and bool(((dst < 0) | (dst >= rows) | (src < 0) | (src >= cols)).any()):
            raise ValueError(f"adj_t holds an index outside its shape {tuple(adj_t.shape)}")
        return src, dst, False
    crow = _check_index_tensor("adj_t's crow_indices", adj_t.crow_indices())
    src = _check_index_tensor("adj_t's col_indices", adj_t.col_indices())
    nnz = src.numel()
    counts = crow[1:] - crow[:-1]
    if crow.dim() != 1 or crow.numel() != rows + 1 or src.dim() != 1 or bool(
            (crow[0] != 0) | (crow[-1] != nnz) | (counts < 0).any() | ((src < 0) | (src >= cols)).any()):  # one sync
        raise ValueError(f"adj_t is not a valid CSR matrix of shape {tuple(adj_t.shape)}: crow_indices must run from 0 "
                         f"to nnz={nnz} without decreasing and col_indices lie in [0, {cols})")
    dst = torch.repeat_interleave(torch.arange(rows, device=crow.device), counts.long(), output_size=nnz)
    return src, dst, True


class SelfLooped(NamedTuple):
    """:meth:`Graph.pyg_self_loops`'s result."""

    graph: Graph
    kept: torch.Tensor
    kept_by_dst: torch.Tensor
    kept_in_degree: torch.Tensor
    csr_input: torch.Tensor
    loop_pos: torch.Tensor


class Graph:
    """A directed graph in CSR (by destination) and reverse CSR (by source), built once.

    ``Graph(edge_index, num_nodes=None, index_dtype=None)``: ``num_nodes`` defaults to
    ``max id + 1`` (or the number carried by a Data / DGL / scipy input); ``index_dtype``
    forces int32 or int64 indices (default: int32 where they fit).  Edge ``j -> i`` is an
    incoming edge of ``i``.  Duplicate edges are kept (each is its own softmax term, as in
    PyG and DGL); self loops are kept unless removed with :meth:`remove_self_loops`.
    """

    def __init__(
        self,
        edge_index: Any,
        num_nodes: int | None = None,
        *,
        index_dtype: torch.dtype | None = None,
    ) -> None:
        src, dst, carried = _edges_from(edge_index)
        if num_nodes is not None:
            num_nodes = _check_num_nodes(num_nodes)
            if carried is not None and carried != num_nodes:
                raise NodeCountError(
                    f"num_nodes={num_nodes} but the {type(edge_index).__name__} given as the graph has "
                    f"{carried} nodes", carried
                )
        else:
            num_nodes = carried
        self._build(src, dst, num_nodes, index_dtype, csr_order=False)

    def _build(self, src: torch.Tensor, dst: torch.Tensor, num_nodes: int | None, index_dtype: torch.dtype | None,
               csr_order: bool) -> None:
        """The graph of edges ``src[k] -> dst[k]`` in that (input) order; ``csr_order``: ``dst`` is known to be
        non-decreasing, so the input order is the CSR order (``csr_eid`` the identity, no sort)."""
        # copies, never views of the caller's edge tensor: an in-place edit of it must not change this graph's
        # edge_index while its CSR stays as built (nor keep the caller's tensor alive through a cached graph)
        src = src.reshape(-1).to(torch.int64, copy=True)
        dst = dst.reshape(-1).to(torch.int64, copy=True)
        num_edges = int(src.numel())
        if num_nodes is None:
            num_nodes = int(torch.maximum(src.max(), dst.max()).item()) + 1 if num_edges else 0
        if num_edges:
            low = int(torch.minimum(src.min(), dst.min()).item())
            high = int(torch.maximum(src.max(), dst.max()).item())
            if low < 0 or high >= num_nodes:
                bad = low if low < 0 else high
                raise ValueError(
                    f"edge_index holds node id {bad}, outside [0, num_nodes) = [0, {num_nodes}); "
                    "node ids must be >= 0 and < num_nodes"
                )
        if index_dtype not in (None, *INDEX_DTYPES):
            raise ValueError(f"index_dtype must be None, torch.int32 or torch.int64, got {index_dtype}")
        self.num_nodes = num_nodes
        self.num_edges = num_edges
        self.device = src.device
        self._forced_index_dtype = index_dtype  # kept by the graphs derived from this one
        node_dtype, pos_dtype = index_dtypes(num_nodes, num_edges, index_dtype)
        self.index_dtype = pos_dtype if pos_dtype == torch.int64 else node_dtype

        # CSR by destination; a stable sort keeps input order within a row (none needed when sorted already).
        if csr_order:
            csr_dst, csr_eid = dst, torch.arange(num_edges, device=dst.device)
        else:
            csr_dst, csr_eid = torch.sort(dst, stable=True)
        csr_src = src[csr_eid]
        in_degree = torch.bincount(dst, minlength=num_nodes)
        out_degree = torch.bincount(src, minlength=num_nodes)
        self.in_degree = in_degree
        self.out_degree = out_degree
        self.indptr = _indptr(in_degree, pos_dtype)
        self.csr_src = csr_src.to(node_dtype)
        self.csr_dst = csr_dst.to(node_dtype)
        self.csr_eid = csr_eid.to(pos_dtype)
        # Reverse CSR over CSR positions: within a source row, edges stay in CSR order, so
        # the destinations a source row visits are increasing (locality in the backward pass).
        _, rev_pos = torch.sort(csr_src, stable=True)
        self.rev_indptr = _indptr(out_degree, pos_dtype)
        self.rev_pos = rev_pos.to(pos_dtype)
        self.rev_dst = csr_dst[rev_pos].to(node_dtype)
        self._src = src
        self._dst = dst
        self.schedules = PlanCache(maxsize=16)
        self._zero_in_degree: bool | None = None
        self._eid_rev_pos: torch.Tensor | None = None
        self._pyg_loops: dict[int, SelfLooped] = {}
        self._pyg_sparse_loops: dict[int, Graph] = {}

    @classmethod
    def from_adj_t(cls, adj_t: torch.Tensor, num_nodes: int | None = None, *,
                   index_dtype: torch.dtype | None = None) -> Graph:
        """The graph of PyG's transposed sparse adjacency ``adj_t``: a ``torch.sparse`` COO or CSR tensor ``[N_dst,
        N_src]`` whose stored entry ``adj_t[i, j]`` is the edge ``j -> i`` (whatever its value, explicit zeros
        included: PyG's layers read its indices only).  The input edge order is the storage order, PyG's
        ``to_edge_index``: a COO tensor's ``_indices()`` (duplicate entries of an uncoalesced one are separate edges;
        coalesced, row-major), a CSR tensor's rows in turn — already the CSR by destination, taken as is (no sort;
        the reverse CSR still needs one).  ``num_nodes`` (default ``max(N_dst, N_src)``) is the node ids' range: a
        bipartite adjacency spans both sets' ids.  ``as_graph_of_adj_t`` caches the result per tensor."""
        src, dst, csr_order = _adj_t_edges(adj_t)
        span = max(adj_t.shape[0], adj_t.shape[1])
        if num_nodes is None:
            num_nodes = span
        elif _check_num_nodes(num_nodes) < span:
            raise ValueError(f"num_nodes={num_nodes} is smaller than adj_t's shape {tuple(adj_t.shape)}: a graph of "
                             f"adj_t spans max(N_dst, N_src) = {span} node ids")
        graph = cls.__new__(cls)
        graph._build(src, dst, int(num_nodes), index_dtype, csr_order=csr_order)
        return graph

    @property
    def eid_rev_pos(self) -> torch.Tensor:
        """``[E]``: the reverse-CSR position of each input edge (built on first use, then kept): a per-edge
        value the backward's source pass stores in reverse-CSR order reaches the caller's edge order by one gather."""
        if self._eid_rev_pos is None:
            inverse = torch.empty(self.num_edges, dtype=self.rev_pos.dtype, device=self.device)
            inverse[self.csr_eid[self.rev_pos.long()].long()] = torch.arange(
                self.num_edges, dtype=self.rev_pos.dtype, device=self.device)
            self._eid_rev_pos = inverse
        return self._eid_rev_pos

    # ------------------------------------------------------------------ construction helpers

    @property
    def edge_index(self) -> torch.Tensor:
        """The edges ``[2, E]`` (int64) in input order."""
        return torch.stack([self._src, self._dst])

    def to(self, device: torch.device | str) -> Graph:
        """The same graph with its indices on ``device`` (self when already there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        return Graph(self.edge_index.to(device), self.num_nodes, index_dtype=self.index_dtype)

    def add_self_loops(self) -> Graph:
        """A new graph with one self loop ``i -> i`` appended for every node (DGL's
        ``add_self_loop`` / PyG's ``add_self_loops``; existing self loops are kept, so call
        :meth:`remove_self_loops` first for exactly one loop per node, as PyG's GATConv does)."""
        loops = torch.arange(self.num_nodes, device=self.device, dtype=torch.int64)
        src = torch.cat([self._src, loops])
        dst = torch.cat([self._dst, loops])
        return Graph((src, dst), self.num_nodes, index_dtype=self._forced_index_dtype)

    def remove_self_loops(self) -> Graph:
        """A new graph without edges ``i -> i``."""
        keep = self._src != self._dst
        return Graph((self._src[keep], self._dst[keep]), self.num_nodes, index_dtype=self._forced_index_dtype)

    def pyg_self_loops(self, num_loops: int | None = None) -> SelfLooped:
        """The edges PyG's attention convolutions run over with ``add_self_loops=True``: this graph's edges that
        are not self loops, in input order, then one loop ``i -> i`` for each ``i < num_loops`` (default: every
        node; a bipartite call has ``min(N_src, N_dst)``), as PyG's ``remove_self_loops`` then ``add_self_loops``.
        Returns a :class:`SelfLooped`: the new graph (same node count), ``kept`` (int64 ``[E']``, the input positions
        of the edges it kept, for their edge features) and, for the loops' features PyG reduces from each node's
        incoming edges (``fill_value='mean'`` and the like), ``kept_by_dst`` (``kept`` sorted by destination, stable)
        with ``kept_in_degree [N]``, the segments of a segmented reduction; for per-edge values formed straight in the
        new graph's CSR order (:func:`gnnfuse.edge_score.edge_score_csr`), ``csr_input [E' + loops]`` (the input
        position of the edge at each CSR position, ``-1`` at the loops) and ``loop_pos [num_loops]`` (the CSR position
        of node ``i``'s loop), in the new graph's position dtype.  Built once per ``num_loops`` and kept on
        this graph, so a layer called with the same edge tensor again does not rebuild it (the graph of an edge tensor
        is cached while the tensor lives, :func:`as_graph`)."""
        num_loops = self.num_nodes if num_loops is None else _check_num_nodes(num_loops, "num_loops")
        if num_loops > self.num_nodes:
            raise ValueError(f"num_loops={num_loops} exceeds the graph's {self.num_nodes} nodes")
        hit = self._pyg_loops.get(num_loops)
        if hit is None:
            kept = torch.nonzero(self._src != self._dst).reshape(-1)
            loops = torch.arange(num_loops, device=self.device, dtype=torch.int64)
            kept_dst = self._dst[kept]
            src = torch.cat([self._src[kept], loops])
            dst = torch.cat([kept_dst, loops])
            by_dst = kept[torch.sort(kept_dst, stable=True)[1]]
            graph = Graph((src, dst), self.num_nodes, index_dtype=self._forced_index_dtype)
            eid = graph.csr_eid.long()
            pos_dtype = graph.csr_eid.dtype
            lookup = torch.cat([kept, torch.full((num_loops,), -1, dtype=torch.int64, device=self.device)])
            position = torch.empty_like(eid)
            position[eid] = torch.arange(eid.numel(), device=self.device)
            hit = SelfLooped(graph, kept, by_dst, torch.bincount(kept_dst, minlength=self.num_nodes),
                             lookup[eid].to(pos_dtype), position[kept.numel():].to(pos_dtype))
            self._pyg_loops[num_loops] = hit
        return hit

    def pyg_sparse_self_loops(self, num_loops: int | None = None) -> Graph:
        """The edges PyG's attention convolutions run over with ``add_self_loops=True`` when given a ``torch.sparse``
        adjacency (this graph :meth:`from_adj_t`'s): PyG's ``remove_self_loops`` then ``add_self_loops`` on a sparse
        tensor rebuild it with ``to_torch_coo_tensor`` / ``to_torch_csr_tensor``, which coalesce — so the edges that
        are not self loops, one per (destination, source) pair (duplicates merged, as PyG's ``coalesce`` sums
        their values), plus a loop ``i -> i`` for each ``i < num_loops`` (default: every node), ordered by destination
        then source (each loop at its place in its row).  That order is the new graph's input order, its CSR order
        and the order of the sparse tensor PyG returns the attention weights in.  Built once per ``num_loops`` and
        kept on this graph."""
        num_loops = self.num_nodes if num_loops is None else _check_num_nodes(num_loops, "num_loops")
        if num_loops > self.num_nodes:
            raise ValueError(f"num_loops={num_loops} exceeds the graph's {self.num_nodes} nodes")
        hit = self._pyg_sparse_loops.get(num_loops)
        if hit is None:
            n = max(self.num_nodes, 1)
            keep = self._src != self._dst
            loops = torch.arange(num_loops, device=self.device, dtype=torch.int64)
            keys = torch.unique(torch.cat([self._dst[keep] * n + self._src[keep], loops * (n + 1)]))  # sorted
            hit = Graph.__new__(Graph)
            hit._build(keys % n, keys // n, self.num_nodes, self._forced_index_dtype, csr_order=True)
            self._pyg_sparse_loops[num_loops] = hit
        return hit

    def reordered(self, method: str = "rcm") -> tuple[Graph, torch.Tensor]:
        """A relabelled copy laid out for gather locality, and the permutation ``perm``.

        New node ``k`` is old node ``perm[k]``: features follow as ``x[perm]`` and results map
        back as ``out[inverse]`` with ``inverse[perm] = arange(N)``.  ``method``:

        ``"rcm"``     reverse Cuthill-McKee on the symmetrized graph (scipy): neighbours get
                      nearby ids, so the rows one program gathers share cache lines and L2;
        ``"degree"``  by decreasing in-degree: the most gathered rows are packed together.

        Whether it helps depends on the graph (real citation graphs: yes; random power-law
        graphs have no locality to recover); the ``gnn/gat_reorder`` benchmark measures it.
        """
        if method == "rcm":
            import numpy as np
            import scipy.sparse as sp
            from scipy.sparse.csgraph import reverse_cuthill_mckee

            src, dst = self._src.cpu().numpy(), self._dst.cpu().numpy()
            ones = np.ones(src.shape[0], dtype=np.int8)
            adjacency = sp.csr_matrix((ones, (src, dst)), shape=(self.num_nodes, self.num_nodes))
            symmetric = (adjacency + adjacency.T).tocsr()
            # scipy's RCM fails on a 0 x 0 matrix: an empty graph has the empty order
            order = reverse_cuthill_mckee(symmetric, symmetric_mode=True) if self.num_nodes else np.zeros(0)
            perm = torch.from_numpy(order.astype(np.int64)).to(self.device)
        elif method == "degree":
            perm = torch.argsort(self.in_degree, descending=True, stable=True)
        else:
            raise ValueError(f"method must be 'rcm' or 'degree', got {method!r}")
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(self.num_nodes, device=self.device)
        relabelled = Graph((inverse[self._src], inverse[self._dst]), self.num_nodes, index_dtype=self.index_dtype)
        return relabelled, perm

    # ------------------------------------------------------------------ statistics

    def has_zero_in_degree(self) -> bool:
        """Whether some node has no incoming edge (computed once: no device sync per layer call)."""
        if self._zero_in_degree is None:
            self._zero_in_degree = bool((self.in_degree == 0).any()) if self.num_nodes else False
        return self._zero_in_degree

    def degree_stats(self) -> dict[str, float]:
        """Mean and max in-degree / out-degree (what the schedule is chosen from)."""
        if self.num_nodes == 0:
            return {"mean_in": 0.0, "max_in": 0, "max_out": 0}
        return {
            "mean_in": self.num_edges / self.num_nodes,
            "max_in": int(self.in_degree.max()),
            "max_out": int(self.out_degree.max()),
        }

    def schedule(self, num_heads: int, head_dim: int, dtype: torch.dtype, options: Any = None):
        """The :class:`~gnnfuse.schedule.Schedule` for features ``[N, num_heads, head_dim]`` of
        ``dtype`` on this graph's device, built on first use and cached on the graph.

        ``options``: a :class:`~gnnfuse.schedule.ScheduleOptions` forcing thresholds (tests
        use it to force each bucket kind); None chooses automatically.
        """
        # Looked up on every layer call: a key of plain hashables (a graph never changes device).
        key = (num_heads, head_dim, dtype, options)
        return self.schedules.get(key, lambda: self._build_schedule(num_heads, head_dim, dtype, options))

    def _build_schedule(self, num_heads: int, head_dim: int, dtype: torch.dtype, options: Any):
        from .schedule import ScheduleOptions, build_schedule

        return build_schedule(self, num_heads, head_dim, dtype, options or ScheduleOptions())

    def __repr__(self) -> str:
        stats = self.degree_stats()
        return (
            f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, max_in_degree={stats['max_in']}, "
            f"index_dtype={self.index_dtype}, device={self.device})"
        )


def _indptr(degree: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    indptr = torch.zeros(degree.numel() + 1, dtype=torch.int64, device=degree.device)
    indptr[1:] = torch.cumsum(degree, 0)
    return indptr.to(dtype)


# Graphs built from edge tensors, PyG Data, DGL graphs or torch.sparse adjacencies (PyG's adj_t, whose
# indices share the tensor's version counter), keyed by the source object's id and how it was read.
# Weak references prove the objects are still the same ones (an id can be reused after its
# object dies): the source, and for a Data the edge tensor it holds.  The version counters show
# the tensors were not modified in place; a Data's node count is part of the key.  A DGL graph
# can be rewired in place (add_edges / remove_edges) with no counter to show it, so a cached
# graph of one is checked against its edges() on every hit (one comparison on the device).
# Scipy matrices, and tensors made under torch.inference_mode (they keep no version counter),
# are converted on every call.  Entries whose source has died are dropped at every insertion.
_GRAPH_CACHE: dict[tuple, tuple[tuple[weakref.ref, ...], Graph]] = {}
_GRAPH_CACHE_SIZE = 16


def _data_count(data: Any) -> int | None:
    """The node count a PyG Data carries (``num_nodes`` or its features' rows), None when PyG would only guess."""
    with warnings.catch_warnings(record=True) as guessed:
        warnings.simplefilter("always")
        num_nodes = getattr(data, "num_nodes", None)
    if num_nodes is None or any("num_nodes" in str(w.message) for w in guessed):
        return None
    return _check_num_nodes(num_nodes, "the Data's num_nodes")


def _cache_entry(source: Any) -> tuple[tuple, tuple[weakref.ref, ...]] | None:
    """(token, weak references) identifying ``source`` unmodified, or None: do not cache."""
    if isinstance(source, torch.Tensor):
        if source.is_inference():
            return None
        return (id(source), source._version), (weakref.ref(source),)
    if hasattr(source, "tocoo"):
        return None
    edges = getattr(source, "edge_index", None)
    try:
        refs = (weakref.ref(source),)
    except TypeError:  # tuples and other objects without weak references
        return None
    if isinstance(edges, torch.Tensor):
        if edges.is_inference():
            return None
        return (id(source), id(edges), edges._version, _data_count(source)), (*refs, weakref.ref(edges))
    counts = [getattr(source, m, None) for m in ("num_nodes", "num_edges")]
    return (id(source), "dgl", *(c() for c in counts if callable(c))), refs


def _alive(refs: tuple[weakref.ref, ...], objects: tuple[Any, ...]) -> bool:
    return all(ref() is obj for ref, obj in zip(refs, objects))


def _same_dgl_edges(source: Any, graph: Graph) -> bool:
    """Whether a DGL-like ``source`` still has ``graph``'s edges, in the same order (DGL rewires in place)."""
    src, dst, _ = _from_dgl_like(source)
    if src.numel() != graph.num_edges or src.device != graph.device:
        return False
    return bool(((src == graph._src) & (dst == graph._dst)).all())  # one host sync


def _drop_dead_entries() -> None:
    for key in [k for k, (refs, _) in _GRAPH_CACHE.items() if any(ref() is None for ref in refs)]:
        del _GRAPH_CACHE[key]


def _cached(source: Any, num_nodes: int | None, kind: str, build: Any) -> Graph:
    """``build()``'s graph of ``source``, cached while ``source`` lives unmodified (``kind`` tells the readings of one
    object apart)."""
    entry = _cache_entry(source)
    if entry is None:
        return build()
    token, refs = entry
    objects = (source, getattr(source, "edge_index", None))[: len(refs)]
    key = (*token, kind, num_nodes)
    hit = _GRAPH_CACHE.get(key)
    if hit is not None and _alive(hit[0], objects) and (token[1] != "dgl" or _same_dgl_edges(source, hit[1])):
        return hit[1]
    graph = build()
    _drop_dead_entries()
    _GRAPH_CACHE.pop(key, None)
    if len(_GRAPH_CACHE) >= _GRAPH_CACHE_SIZE:
        _GRAPH_CACHE.pop(next(iter(_GRAPH_CACHE)))
    _GRAPH_CACHE[key] = (refs, graph)
    return graph


def as_graph(source: Any, num_nodes: int | None = None) -> Graph:
    """``source`` as a :class:`Graph`: returned as is when it already is one, otherwise built
    once and cached while ``source`` (an edge_index tensor, a PyG Data, a DGL graph) lives
    unmodified, so repeated layer calls with the same edge tensor do not rebuild the CSR."""
    if isinstance(source, Graph):
        if num_nodes is not None and num_nodes != source.num_nodes:
            raise NodeCountError(f"num_nodes={num_nodes} but the graph has {source.num_nodes} nodes", source.num_nodes)
        return source
    return _cached(source, num_nodes, "edges", lambda: Graph(source, num_nodes))


def as_graph_of_adj_t(adj_t: torch.Tensor, num_nodes: int | None = None) -> Graph:
    """:meth:`Graph.from_adj_t`'s graph of PyG's transposed sparse adjacency ``adj_t``, cached as :func:`as_graph`
    caches an edge tensor: while ``adj_t`` lives and its version counter (shared by its indices and values, so any
    in-place edit of the tensor moves it) is unchanged."""
    return _cached(adj_t, num_nodes, "adj_t", lambda: Graph.from_adj_t(adj_t, num_nodes))
