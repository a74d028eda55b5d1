"""Instruction 0: the embedding rows of the step's tokens into the float32 residual stream, and the
step's dependency counts set to zero, in one launch::

    x[b, :] = float32(E[tokens[b], :])        E [V, H] (weight dtype), tokens [B] int64
    fix[b, :] = 0                              the deferred down-projection sums (kernels/residual_proj.py)
    counts[0 : n_counts] = 0

One program per row (program 0 also zeroes the counts the fused Q/K/V + attention launches
accumulate over a step's layers).  With ``USE_PDL`` the program lets the next kernel (layer 0's
first launch, whose programs load weights before their own wait) be scheduled at once: its
weight loads overlap this launch.  Token ids are checked by the callers (llmfuse.model).
Bytes: B H weight elements read, B H float32 and B H int64 written.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.launch_order import after_previous_kernel


@jit
def embed_kernel(tokens_ptr, table_ptr, x_ptr, fix_ptr, count_ptr, H, n_counts,
                 BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:  # launched without PDL (the first kernel of a step) the wait returns at once; then the
        after_previous_kernel(USE_PDL)  # next kernel may be scheduled
    b = tl.program_id(0)
    row = tl.load(tokens_ptr + b)
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        values = tl.load(table_ptr + row * H + h, mask=h < H, other=0.0)
        tl.store(x_ptr + b * H + h, values.to(tl.float32), mask=h < H)
        tl.store(fix_ptr + b * H + h, tl.zeros([BLOCK_H], dtype=tl.int64), mask=h < H)
    if b == 0:
        c = tl.arange(0, BLOCK_C)
        tl.store(count_ptr + c, tl.zeros([BLOCK_C], dtype=tl.int32), mask=c < n_counts)
