"""The graph object: CSR by destination, reverse CSR by source, degree statistics, schedules.

A :class:`Graph` is built once from a PyG-style ``edge_index`` ``[2, E]`` (row 0 sources,
row 1 destinations), a ``(src, dst)`` pair, a scipy sparse matrix (``A[u, v] != 0`` is the
edge ``u -> v``), a PyG ``Data`` or a DGL graph (read through ``edges()`` /
``num_nodes()``, DGL is never imported).  It owns:

* the **CSR by destination** — ``indptr [N + 1]``, ``csr_src [E]`` (source of each incoming
  edge, edges of one destination contiguous, in input order within a row) and
  ``csr_eid [E]`` (the input edge id at each CSR position).  The forward pass and the
  aggregation run over it.  "Edge position" everywhere in gnnfuse means the CSR position.
* the **reverse CSR by source** — ``rev_indptr [N + 1]``, ``rev_dst [E]`` and ``rev_pos [E]``
  (the CSR position of each outgoing edge), so the backward pass accumulates gradients of
  source features per source row, without atomics;
* degree statistics and per-(feature shape, dtype, device) :class:`~gnnfuse.schedule.Schedule`
  objects, cached in a :class:`fusecore.PlanCache` on the graph.

Indices are int32 where every value fits (node ids < 2³¹, edge positions < 2³¹) and int64
otherwise; kernels widen them to int64 before any address arithmetic.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from fusecore import PlanCache

INT32_LIMIT = 2**31 - 1


def narrowest_index_dtype(max_value: int) -> torch.dtype:
    """The narrowest index dtype (int32 or int64) that holds every value in ``[0, max_value]``."""
    if max_value < 0:
        raise ValueError(f"max_value must be >= 0, got {max_value}")
    return torch.int32 if max_value <= INT32_LIMIT else torch.int64


def _check_index_tensor(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of node ids, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer node ids (int32 or int64), got dtype {t.dtype}")
    return t


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
        src = _check_index_tensor("src", source[0])
        dst = _check_index_tensor("dst", source[1])
        if src.dim() != 1 or dst.dim() != 1 or src.shape != dst.shape:
            raise ValueError(
                f"(src, dst) must be two 1-D tensors of equal length, got shapes "
                f"{tuple(src.shape)} and {tuple(dst.shape)}"
            )
        if src.device != dst.device:
            raise ValueError(f"src is on '{src.device}' but dst is on '{dst.device}'")
        return src, dst, None
    if hasattr(source, "tocoo") and hasattr(source, "shape"):  # scipy sparse matrix or array
        coo = source.tocoo()
        rows, cols = coo.shape
        if rows != cols:
            raise ValueError(f"a sparse adjacency matrix must be square, got shape {coo.shape}")
        src = torch.as_tensor(coo.row.astype("int64"))
        dst = torch.as_tensor(coo.col.astype("int64"))
        return src, dst, int(rows)
    if hasattr(source, "edge_index") and isinstance(getattr(source, "edge_index", None), torch.Tensor):
        src, dst, _ = _edges_from(source.edge_index)
        num_nodes = getattr(source, "num_nodes", None)
        return src, dst, int(num_nodes) if num_nodes is not None else None
    edges = getattr(source, "edges", None)
    num_nodes_fn = getattr(source, "num_nodes", None)
    if callable(edges) and callable(num_nodes_fn):  # a DGL graph, through its public methods
        src, dst = edges()
        return _check_index_tensor("src", src), _check_index_tensor("dst", dst), int(num_nodes_fn())
    raise TypeError(
        "graph must be a gnnfuse.Graph, an edge_index tensor [2, E], a (src, dst) pair, a scipy "
        f"sparse matrix, a PyG Data or a DGL graph; got {type(source).__name__}"
    )


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
        if num_nodes is None:
            num_nodes = carried
        src = src.reshape(-1).to(torch.int64)
        dst = dst.reshape(-1).to(torch.int64)
        num_edges = int(src.numel())
        if num_nodes is None:
            num_nodes = int(torch.maximum(src.max(), dst.max()).item()) + 1 if num_edges else 0
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
            raise ValueError(f"num_nodes must be an int >= 0, got {num_nodes!r}")
        if num_edges:
            low = int(torch.minimum(src.min(), dst.min()).item())
            high = int(torch.maximum(src.max(), dst.max()).item())
            if low < 0 or high >= num_nodes:
                bad = low if low < 0 else high
                raise ValueError(
                    f"edge_index holds node id {bad}, outside [0, num_nodes) = [0, {num_nodes}); "
                    "node ids must be >= 0 and < num_nodes"
                )
        if index_dtype not in (None, torch.int32, torch.int64):
            raise ValueError(f"index_dtype must be None, torch.int32 or torch.int64, got {index_dtype}")
        self.num_nodes = num_nodes
        self.num_edges = num_edges
        self.device = src.device
        node_dtype = index_dtype or narrowest_index_dtype(max(num_nodes - 1, 0))
        pos_dtype = index_dtype or narrowest_index_dtype(num_edges)
        self.index_dtype = pos_dtype if pos_dtype == torch.int64 else node_dtype

        # CSR by destination; a stable sort keeps input order within a row.
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
        return Graph((src, dst), self.num_nodes)

    def remove_self_loops(self) -> Graph:
        """A new graph without edges ``i -> i``."""
        keep = self._src != self._dst
        return Graph((self._src[keep], self._dst[keep]), self.num_nodes)

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
            order = reverse_cuthill_mckee((adjacency + adjacency.T).tocsr(), symmetric_mode=True)
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
        from .schedule import ScheduleOptions, build_schedule

        options = options or ScheduleOptions()
        key = (num_heads, head_dim, str(dtype), str(self.device), options)
        return self.schedules.get(key, lambda: build_schedule(self, num_heads, head_dim, dtype, options))

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


# Graphs built from edge tensors, PyG Data or DGL graphs, keyed by the source object's id.  A
# weak reference proves the object is still the same one (an id can be reused after it dies)
# and the tensor version counter shows it was not modified in place.
_GRAPH_CACHE: dict[tuple, tuple[Any, Graph]] = {}
_GRAPH_CACHE_SIZE = 16


def _version_of(source: Any) -> Any:
    tensor = source if isinstance(source, torch.Tensor) else getattr(source, "edge_index", None)
    return tensor._version if isinstance(tensor, torch.Tensor) else None


def as_graph(source: Any, num_nodes: int | None = None) -> Graph:
    """``source`` as a :class:`Graph`: returned as is when it already is one, otherwise built
    once and cached while ``source`` (an edge_index tensor, a PyG Data, a DGL graph) lives
    unmodified, so repeated layer calls with the same edge tensor do not rebuild the CSR."""
    if isinstance(source, Graph):
        if num_nodes is not None and num_nodes != source.num_nodes:
            raise ValueError(f"num_nodes={num_nodes} but the graph has {source.num_nodes} nodes")
        return source
    try:
        ref = weakref.ref(source)
    except TypeError:  # tuples, scipy matrices without weakref support: build every time
        return Graph(source, num_nodes)
    key = (id(source), _version_of(source), num_nodes)
    hit = _GRAPH_CACHE.get(key)
    if hit is not None and hit[0]() is source:
        return hit[1]
    graph = Graph(source, num_nodes)
    if len(_GRAPH_CACHE) >= _GRAPH_CACHE_SIZE:
        _GRAPH_CACHE.pop(next(iter(_GRAPH_CACHE)))
    _GRAPH_CACHE[key] = (ref, graph)
    return graph
