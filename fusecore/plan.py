"""Persistent grids, balanced work plans over uneven items, and a plan cache.

The three domains share one scheduling problem: a list of work items of uneven cost
(destination rows of different in-degree, batches of environments, the matrix tiles of
successive decoder layers) must be spread over a fixed number of programs so that no
program gets much more than its share.  :func:`make_work_plan` solves it once:

1. an item whose cost exceeds ``max_piece_cost`` is split into equal *pieces* (a heavy
   "super node" of a graph is handled by several programs whose partial results are merged
   afterwards, for attention by a logsumexp combine);
2. the pieces, kept in item order, are cut into ``num_chunks`` contiguous *chunks* of
   nearly equal total cost by prefix sums, so program ``c`` runs pieces
   ``chunk_ptr[c]:chunk_ptr[c + 1]``.

A plan depends only on the costs and the knobs, so it is built on the host once and kept in
a :class:`PlanCache` keyed by the input signature (graph, feature shape, dtype, device).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from .backend import is_int
from .device import device_facts

# Every dimension of a tl.dot operand must be at least this (block sizes of matrix-product tiles).
MIN_DOT = 16


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1): block sizes for ``tl.arange`` over n elements.

    ``n`` is an int (numpy's too); a float is refused rather than truncated (2.5 would give 2 < 2.5)."""
    if not is_int(n):
        raise TypeError(f"n must be an int, got {n!r} of type {type(n).__name__}")
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def persistent_grid(num_work: int, device: torch.device | str | None = None, programs_per_sm: int = 1) -> int:
    """Number of programs for a persistent kernel: enough to fill the device, no more than the work.

    ``programs_per_sm`` programs are placed on each multiprocessor (more hide latency when a
    program's registers allow several to be resident).  Returns at least 1.
    """
    for name, value, lo in (("num_work", num_work, 0), ("programs_per_sm", programs_per_sm, 1)):
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < lo:
            raise ValueError(f"{name} must be >= {lo}, got {value}")
    slots = device_facts(device).sm_count * int(programs_per_sm)
    return max(1, min(int(num_work), slots))


@dataclass(frozen=True)
class WorkPlan:
    """Pieces of uneven work items, grouped into balanced contiguous chunks.

    All tensors are int64 on the CPU (move them once with :meth:`to`).

    ``piece_item[p]``      item of piece ``p``;
    ``piece_start[p]``     first unit of the item's cost range the piece covers;
    ``piece_stop[p]``      one past its last unit;
    ``piece_index[p]``     the piece's rank within its item (0 .. pieces of the item - 1);
    ``item_pieces[i]``     how many pieces item ``i`` was split into (0 for zero-cost items
                           when ``keep_empty`` is False);
    ``chunk_ptr[c]``       chunk ``c`` owns pieces ``chunk_ptr[c] : chunk_ptr[c + 1]``.
    """

    piece_item: torch.Tensor
    piece_start: torch.Tensor
    piece_stop: torch.Tensor
    piece_index: torch.Tensor
    item_pieces: torch.Tensor
    chunk_ptr: torch.Tensor

    @property
    def num_pieces(self) -> int:
        return int(self.piece_item.numel())

    @property
    def num_chunks(self) -> int:
        return int(self.chunk_ptr.numel()) - 1

    def chunk_costs(self) -> torch.Tensor:
        cost = self.piece_stop - self.piece_start
        prefix = torch.zeros(cost.numel() + 1, dtype=torch.int64)
        prefix[1:] = torch.cumsum(cost, 0)
        return prefix[self.chunk_ptr[1:]] - prefix[self.chunk_ptr[:-1]]

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.int64) -> WorkPlan:
        return WorkPlan(*(getattr(self, f).to(device=device, dtype=dtype) for f in self.__dataclass_fields__))


def make_work_plan(
    costs: torch.Tensor,
    *,
    max_piece_cost: int,
    num_chunks: int,
    keep_empty: bool = False,
) -> WorkPlan:
    """Split uneven items into pieces of cost <= ``max_piece_cost`` and balance them over chunks.

    ``costs``: 1-D integer tensor, the cost of each item in units (edges of a row, steps of an
    env batch, tiles of a layer).  Zero-cost items get one empty piece when ``keep_empty``
    (a row with no incoming edge must still write its zero output) and none otherwise.
    Chunks are contiguous in piece order and each holds close to ``total / num_chunks`` units;
    the most a chunk exceeds that share by is one piece's cost.
    """
    if not isinstance(costs, torch.Tensor) or costs.dim() != 1:
        raise ValueError("costs must be a 1-D tensor of item costs")
    if costs.dtype.is_floating_point or costs.dtype == torch.bool:
        raise TypeError(f"costs must be an integer tensor, got {costs.dtype}")
    for name, value in (("max_piece_cost", max_piece_cost), ("num_chunks", num_chunks)):
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    max_piece_cost, num_chunks = int(max_piece_cost), int(num_chunks)
    if not isinstance(keep_empty, bool):  # bool("no") is True
        raise TypeError(f"keep_empty must be True or False, got {keep_empty!r}")
    if costs.dtype.is_complex:
        raise TypeError(f"costs must be an integer tensor, got {costs.dtype}")
    costs = costs.detach().to("cpu", torch.int64)
    if costs.numel() and int(costs.min()) < 0:
        raise ValueError("costs must be non-negative")

    pieces = costs // max_piece_cost + (costs % max_piece_cost != 0).to(torch.int64)  # ceil, without overflow
    if keep_empty:
        pieces = pieces.clamp_min(1)
    total_pieces = int(pieces.sum())
    item_ids = torch.arange(costs.numel(), dtype=torch.int64)
    piece_item = torch.repeat_interleave(item_ids, pieces)
    first_piece = torch.cumsum(pieces, 0) - pieces
    piece_index = torch.arange(total_pieces, dtype=torch.int64) - first_piece[piece_item]
    # Equal split of each item: piece k of an item of cost c with n pieces covers
    # [floor(k c / n), floor((k+1) c / n)).
    item_cost = costs[piece_item]
    item_n = pieces[piece_item].clamp_min(1)
    # floor(k c / n) as k (c // n) + floor(k (c % n) / n): no product above c or n², so costs up to 2**63 - 1
    # split exactly (k · c itself overflows int64 from c · n >= 2**63, e.g. c = 2**50 in 2**19 pieces)
    whole, rest = item_cost // item_n, item_cost % item_n
    piece_start = piece_index * whole + torch.div(piece_index * rest, item_n, rounding_mode="floor")
    piece_stop = (piece_index + 1) * whole + torch.div((piece_index + 1) * rest, item_n, rounding_mode="floor")

    piece_cost = piece_stop - piece_start
    # Each piece also carries a fixed overhead of one unit so that chunks of empty pieces
    # (isolated rows) are balanced too.
    weight = piece_cost + 1
    prefix = torch.cumsum(weight, 0)
    total = int(prefix[-1]) if total_pieces else 0
    targets = torch.div(torch.arange(1, num_chunks, dtype=torch.int64) * total, num_chunks, rounding_mode="floor")
    cuts = torch.searchsorted(prefix, targets, right=True)
    chunk_ptr = torch.cat(
        [torch.zeros(1, dtype=torch.int64), cuts, torch.tensor([total_pieces], dtype=torch.int64)]
    )
    return WorkPlan(piece_item, piece_start, piece_stop, piece_index, pieces, chunk_ptr)


class PlanCache:
    """A small LRU cache of plans keyed by an input signature.

    Owners (a graph, a model, an env batch) hold one and call ``get(key, build)``: the plan is
    built on the first call for a key and reused afterwards.  ``hits`` and ``misses`` let
    tests check that a plan is computed once.
    """

    def __init__(self, maxsize: int = 32):
        if not is_int(maxsize):  # NaN would pass `< 1` and make a cache that never evicts
            raise TypeError(f"PlanCache: maxsize must be an int, got {maxsize!r} of type {type(maxsize).__name__}")
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = int(maxsize)
        self._store: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._store:
                self._store.move_to_end(key)
                self.hits += 1
                return self._store[key]
        value = build()
        with self._lock:
            self.misses += 1
            self._store[key] = value
            self._store.move_to_end(key)
            while len(self._store) > self.maxsize:
                self._store.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._store.clear()

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._store


def tensor_signature(*tensors: torch.Tensor | None) -> tuple:
    """Hashable (shape, dtype, device) signature of tensors, for PlanCache keys."""
    return tuple(
        None if t is None else (tuple(t.shape), str(t.dtype), str(t.device)) for t in tensors
    )
