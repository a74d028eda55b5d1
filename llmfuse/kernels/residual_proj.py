"""Instructions 3 and 5: a projection added to the residual stream.

For a tile of BLOCK_N hidden features n of layer l::

    x[b, n] += Σ_k a[b, k] W_l[n, k]          W stacked [L, H, K]

Instruction 3 (output projection): ``a`` = the merged attention [B, Hq·D], ``W`` = W_o (with
``plan.merge_in_o`` each tile merges the attention splits itself: ``MERGE_NS``).
Instruction 5 (down projection):   ``a`` = the MLP activation h [B, I],   ``W`` = W_down.
The two differ only in their operands, so they share this one tile function and kernel.
A tile is (BLOCK_N features, one of ``split_k`` parts of K).  With ``split_k = 1`` each
program owns its features and adds in place (an atomic add by the one writer).  With
``split_k > 1`` (more, shorter tiles: the K loop of a tile is a chain of dependent loads, so
W_down's long rows are split) each part stores its partial sum; the last part of a feature
tile to finish (a semaphore count with acquire-release order, reset by that program) adds the
parts in their fixed order to x — deterministic, and no program waits.

Deferred down-projection sums (``X_FIX``, batch 1, ``plan.defer_down``): W_down's parts (1) add
their partial sums as int64 multiples of 2^-32 into ``fix`` [B, H] (:func:`.matvec.to_fixed`; an
integer sum is exact, so any order gives the same bits) and end — no count, no merge, nothing
waited for; the next layer's Q/K/V tiles read x + fix; its W_o (2, unsplit) writes
``x ← x + from_fixed(fix) + attn W_oᵀ`` and ``fix ← 0`` (x and fix loaded at its start: W_down wrote
them two kernels back, and every program of the kernel between waited for W_down to complete
before this launch could begin).
Bytes: H·K weight elements once, ``a`` (B·K/split_k, from L2) per program, x read and written.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.launch_order import after_previous_kernel, prefetch_rows

from .matvec import from_fixed, k_range, rows_dot, to_fixed

MERGE_PARTS = tl.constexpr(8)  # K parts the last part to finish loads per round


@jit
def residual_proj_span(tile, layer, w_ptr, H, K, split_k, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tile ``tile``'s features n [BLOCK_N] (masked by n < H), its columns [k_start, k_stop) and layer
    ``layer``'s W [H, K]."""
    k_start, k_stop = k_range(tile % split_k, K, split_k, BLOCK_K)
    n = (tile // split_k) * BLOCK_N + tl.arange(0, BLOCK_N)
    layer64 = tl.full([], 0, tl.int64) + layer
    return n, n < H, k_start, k_stop, w_ptr + layer64 * H * K


@jit
def residual_proj_prefetch(tile, layer, w_ptr, H, K, split_k, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           PREFETCH_LINES: tl.constexpr):
    """Ask L2 for the first ``PREFETCH_LINES`` lines of tile ``tile``'s W rows (fusecore/launch_order.py)."""
    n, nmask, k_start, k_stop, w_layer = residual_proj_span(tile, layer, w_ptr, H, K, split_k, BLOCK_N, BLOCK_K)
    prefetch_rows(w_layer + n.to(tl.int64) * K, nmask, k_start, k_stop, PREFETCH_LINES)


@jit
def residual_proj_tile(
    tile, layer, a_ptr, w_ptr, x_ptr, fix_ptr, part_ptr, sem_ptr, B, H, K, split_k,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
    ROW_PREFETCH: tl.constexpr, X_FIX: tl.constexpr, MERGE_NS: tl.constexpr = 0, MERGE_D: tl.constexpr = 1,
):
    """One tile (module docstring); ``X_FIX`` 0: add into x, 1: add into the deferred sums ``fix``,
    2: the unsplit projection that also adds the deferred sums into x and zeroes them.  ``MERGE_NS`` > 0
    (W_o, batch-1 row tiles): ``a`` is merged from the attention splits' partials (``matvec.rows_dot``)."""
    n_tile = tile // split_k
    k_part = tile % split_k
    n, nmask, k_start, k_stop, w_layer = residual_proj_span(tile, layer, w_ptr, H, K, split_k, BLOCK_N, BLOCK_K)
    b = tl.arange(0, BLOCK_B)
    x_off = b[:, None] * H + n[None, :]
    mask = (b < B)[:, None] & nmask[None, :]
    if X_FIX == 2:  # the residual as of two kernels back: issued now, used after the K loop
        x_old = tl.load(x_ptr + x_off, mask=mask, other=0.0, cache_modifier=".cg")
        x_old += from_fixed(tl.load(fix_ptr + x_off, mask=mask, other=0, cache_modifier=".cg"))
    acc = rows_dot(a_ptr, B, K, 0.0, w_ptr, w_layer, n, nmask, k_start, k_stop, False,
                   BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH, False, MERGE_NS, MERGE_D)
    if X_FIX == 1:
        # an integer reduction (no value returned): exact, so the parts' order cannot change the sum
        tl.atomic_add(fix_ptr + x_off, to_fixed(acc), mask=mask, sem="relaxed", scope="gpu")
    elif X_FIX == 2:
        tl.store(x_ptr + x_off, x_old + acc, mask=mask)
        tl.store(fix_ptr + x_off, tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.int64), mask=mask)
    elif split_k == 1:
        # x[b, n] has this one writer: an atomic add (a reduction, no value returned) adds what a
        # load, add and store would (but for subnormal sums, flushed to zero), without waiting for
        # the load's L2 round trip.
        tl.atomic_add(x_ptr + x_off, acc, mask=mask, sem="relaxed", scope="gpu")
    else:
        # The last of the tile's K parts to finish adds all parts in their fixed order:
        # deterministic, and no program waits.
        tl.store(part_ptr + k_part * B * H + x_off, acc, mask=mask)
        tl.debug_barrier()
        finished = tl.atomic_add(sem_ptr + n_tile, 1, sem="acq_rel", scope="gpu")
        if finished == split_k - 1:
            # x and MERGE_PARTS parts per round of loads, issued together (a loop over the parts
            # would wait for one L2 round trip per part)
            x_old = tl.load(x_ptr + x_off, mask=mask, other=0.0, cache_modifier=".cg")
            total = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
            for first in range(0, split_k, MERGE_PARTS):
                for p in tl.static_range(MERGE_PARTS):
                    part = tl.zeros_like(x_off) + first + p  # per lane: the mask stays a tensor of booleans
                    total += tl.load(part_ptr + part * B * H + x_off, mask=mask & (part < split_k), other=0.0,
                                     cache_modifier=".cg")
            tl.store(x_ptr + x_off, x_old + total, mask=mask)
            tl.atomic_xchg(sem_ptr + n_tile, 0, sem="relaxed", scope="gpu")


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer"])
def residual_proj_kernel(
    layer, a_ptr, w_ptr, x_ptr, fix_ptr, part_ptr, sem_ptr, B, H, K, split_k,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
    ROW_PREFETCH: tl.constexpr, X_FIX: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr, MERGE_NS: tl.constexpr = 0, MERGE_D: tl.constexpr = 1,
):
    if USE_PDL:
        residual_proj_prefetch(tl.program_id(0), layer, w_ptr, H, K, split_k, BLOCK_N, BLOCK_K, PREFETCH_LINES)
    tl.static_assert(USE_PDL or (ROW_PREFETCH < 2), "ROW_PREFETCH >= 2 is the PDL wait inside the tile")
    if ROW_PREFETCH < 2:  # 2, 3: the tile waits itself, after its first weight loads (matvec._one_row)
        after_previous_kernel(USE_PDL)
    residual_proj_tile(tl.program_id(0), layer, a_ptr, w_ptr, x_ptr, fix_ptr, part_ptr, sem_ptr, B, H, K, split_k,
                       BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH, X_FIX, MERGE_NS, MERGE_D)
