"""Scratch buffers kept across calls, one per stream: what a launch needs zeroed and leaves zeroed, and what a
call's launches fill and read before the call returns.

A launch whose programs count themselves in (``fusecore.grid_sync.last_to_arrive``: the last of a group to
arrive does the group's closing work) needs its counts at zero when it starts.  Zeroing them before every launch
costs a launch of its own (``torch.zeros``: an allocation and a fill kernel, 10-50 µs of host time on the GPU
machines, more than many of the kernels it serves take on the device).  A launch whose last arrival also resets its
count (``tl.atomic_xchg(count, 0)``) leaves the buffer as it found it, so one zeroed buffer serves every later launch
— of any kernel that keeps the same promise — issued on the same stream, where launches run one after another.

:func:`zeroed` keeps such buffers in a caller's dictionary, one per name and stream: launches on different streams may
run at the same time, so they never share one.  While a CUDA graph is being captured it returns a fresh zeroed
buffer, zeroed inside the graph: a graph's replays may run on any stream, beside any other work, and its memory
belongs to the graph.  On the CPU (Triton's interpreter, which runs a launch to its end before returning) one buffer
per name serves every call.

:func:`kept` keeps the other kind: a buffer a call's kernels fill completely and only later launches of the same call
read (never returned, never saved for a backward).  On the GPU machines a ``torch.empty`` costs 3 µs in a hot loop
and 6-9 µs inside a layer's training step (host time, gnnfuse JOURNAL session 53), and the small-graph steps are
host-bound; a kept buffer costs a dictionary lookup.  The same stream rules apply (launches on one stream run one
after another, so the next call's kernels write it only after this call's have read it), plus one key per thread
(two threads issuing on one stream could interleave their calls' launches), a fresh buffer during CUDA-graph
capture and while torch.compile traces, and a bound on what one cache holds (:data:`KEEP_MAX_BYTES`): a kept buffer
is memory no other tensor can use until its owner is dropped, and a large graph's step is bound by its GPU time,
not by its allocations.
"""

from __future__ import annotations

import math
import threading

import torch

__all__ = ["KEEP_MAX_BYTES", "kept", "stream_key", "zeroed"]


def stream_key(device: torch.device) -> int | None:
    """The current stream of ``device`` as an int (its raw handle; 0 for the default stream of any device) for a
    CUDA device; None for any other."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch._C._cuda_getCurrentRawStream(index)


_KEPT: dict = {}  # the buffers of callers that name no cache of their own


def zeroed(cache: dict | None, name: object, size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed 1-D tensor of at least ``size`` elements for one launch that leaves it zeroed again (module doc),
    kept in ``cache`` (None: this module's own) under ``(name, device, stream)`` and returned again to later calls
    on the same stream (a larger one replaces it when a call needs more); a fresh one, not kept, while the current
    stream captures a CUDA graph.  The caller promises that every launch given the buffer zeroes what it changed
    before it ends."""
    if device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing():
        return torch.zeros(max(size, 1), dtype=dtype, device=device)
    cache = _KEPT if cache is None else cache
    key = (name, device, stream_key(device))
    buffer = cache.get(key)
    if buffer is None or buffer.numel() < size or buffer.dtype != dtype:
        buffer = cache[key] = torch.zeros(max(size, 1), dtype=dtype, device=device)
    return buffer


# Bytes one cache keeps at most across its :func:`kept` buffers.  A buffer that would take a cache past it clears
# the cache's kept buffers first; one larger than it on its own is never kept (a fresh ``torch.empty`` each call).
# The arxiv-like graph's GAT training step keeps ~150 MB (its largest buffer the float32 [N, H, D] ∂value, 87 MB);
# the Reddit-scale graph's keep only their small ones.
KEEP_MAX_BYTES = 256 << 20


def _kept_key(key: object) -> bool:
    return isinstance(key, tuple) and len(key) == 7 and key[0] == "kept"


def kept(cache: dict, name: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
         ) -> torch.Tensor:
    """An uninitialised ``shape`` / ``dtype`` tensor on ``device`` that the caller's kernels fill completely and that
    only later launches of the same call read (module doc): kept in ``cache`` under ``(name, shape, dtype, device,
    stream, thread)`` and returned again to later calls that ask for the same there; fresh (not kept) while the
    current stream captures a CUDA graph, while torch.compile traces, and when it alone exceeds
    :data:`KEEP_MAX_BYTES`.  The caller promises that no result of its call and nothing it saves is, or views, the
    buffer, and that two buffers its call needs at once have different names."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > KEEP_MAX_BYTES or torch.compiler.is_compiling() or (
            device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing()):
        return torch.empty(shape, dtype=dtype, device=device)
    key = ("kept", name, shape, dtype, device, stream_key(device), threading.get_ident())
    buffer = cache.get(key)
    if buffer is None:
        held = sum(t.numel() * t.element_size() for k, t in cache.items() if _kept_key(k))
        if held + nbytes > KEEP_MAX_BYTES:
            for k in [k for k in cache if _kept_key(k)]:
                del cache[k]
        buffer = cache[key] = torch.empty(shape, dtype=dtype, device=device)
    return buffer
