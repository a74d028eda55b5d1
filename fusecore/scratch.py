"""Scratch buffers kept across launches, one per stream: what a launch needs zeroed and leaves zeroed.

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
"""

from __future__ import annotations

import torch

__all__ = ["stream_key", "zeroed"]


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
