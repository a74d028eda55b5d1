"""Prefetch of the next stage's weights into L2 while a grid barrier is pending.

Weights do not depend on the activations a barrier protects, so after arriving at a
barrier a program that still has to wait reads a slice of the weights the next stage
will stream: program ``p`` reads elements ``[start + p·CHUNK, start + (p+1)·CHUNK)`` of a
contiguous weight array (masked to its ``n`` elements), so the grid pulls ``P·CHUNK``
elements into the shared L2, where the next stage's tiles — whichever program runs them
— find them.  Triton has no prefetch instruction, so the values are summed and returned;
the caller keeps the sum alive with a store behind a condition that never holds, which
the compiler cannot prove false.
"""

import triton.language as tl

from fusecore.backend import jit


@jit
def prefetch_flat(w_ptr, n, start, pid, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Read elements [start + pid·CHUNK, start + (pid+1)·CHUNK) ∩ [0, n) of w; their float32 sum."""
    first = start + pid.to(tl.int64) * CHUNK
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, CHUNK, BLOCK):
        idx = first + off + tl.arange(0, BLOCK)
        total += tl.load(w_ptr + idx, mask=idx < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    return tl.sum(total, axis=0)
