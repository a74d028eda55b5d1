"""Shared building blocks of the decode kernels: a row-tile GEMV with the RMSNorm folded in.

``rows_dot`` computes, for one tile of weight rows (W row-major [N, K]) and the B rows of a
contiguous activation x [B, K]::

    acc[b, n] = Σ_k x̂[b, k] W[rows[n], k]
    x̂[b, k]  = x[b, k] · g_k · r_b,   r_b = 1 / sqrt(mean_k x[b, k]² + eps)   (HAS_NORM)
              = x[b, k]                                                       (otherwise)

The RMS scale ``r_b`` is constant along k, so it factors out of the sum: the loop
accumulates ``Σ x g W`` and ``Σ x²`` in the same pass over x and multiplies by ``r_b`` at
the end — every program reads its x rows once and waits for no other program.
``rows_dot_pair`` does the same for two row sets sharing one pass over x (gate and up
rows; the two halves of the RoPE pairs of a head).

Decode is memory-bound: each weight element is read exactly once by one program, so a
launch moves N·K·bytes(W) plus the activations (from L2).  Batches up to ``SMALL_BATCH``
reduce with elementwise multiplies and row sums in fp32 (any BLOCK_N, so narrow tiles and
many programs): the weight tile is loaded once and every batch row of x meets it in
registers.  Larger batches pad the batch to ``BLOCK_B`` ≥ 16 and use ``tl.dot`` through
:func:`mma` (fp32 accumulation; ``DOT_PREC`` "ieee" runs the product in float32: float32
weights; fusecore makes the interpreter's bf16 products match the GPU's, so the CPU tests run the
bf16 / fp16 tensor-core path as compiled).  Activations are loaded with
``.cg`` (bypassing L1) because in the looped kernel other multiprocessors wrote them
during the same launch; weights, read exactly once per step, with ``evict_first`` so they
do not push the activations (and the looped kernel's prefetched weights) out of L2.

Latency: a program's K loop is a chain of dependent memory round trips (~1 µs each) unless
a chunk's loads are issued before the previous chunk is used.  Triton pipelines the
tensor-core loop's x and W loads (``cp.async`` into shared memory, ``num_stages``) but
neither the loads that meet the dot operands only through a broadcast multiply (the norm
weights g) nor any load of a loop without ``tl.dot``; those are loaded one chunk ahead by
hand (``g_next``; the batch-1 tiles, ``_one_row``).
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.grid_sync import last_to_arrive
from fusecore.launch_order import after_previous_kernel
from fusecore.softmax import online_rescale

SMALL_BATCH = tl.constexpr(8)  # batches up to this use row sums (CUDA cores), larger ones tl.dot
# Deferred down-projection sums (``plan.defer_down``): W_down's K parts add their float32 partial sums
# into an int64 array in units of 2^-32 (an integer sum: exact, so the same in any order), which the
# next readers of x add.  A float32 v with 2^-8 <= |v| < 2^31 is a multiple of 2^-32: converted exactly.
FIXED_POINT = tl.constexpr(4294967296.0)
FIXED_UNIT = tl.constexpr(1.0 / 4294967296.0)


@jit
def to_fixed(v):
    """float32 ``v`` as int64 multiples of 2^-32 (nearest; |v| < 2^31)."""
    return tl.floor(v * FIXED_POINT + 0.5).to(tl.int64)


@jit
def from_fixed(a):
    """int64 multiples of 2^-32 as float32 (one rounding)."""
    return a.to(tl.float32) * FIXED_UNIT


@jit
def mma(a, b, DOT_PREC: tl.constexpr):
    """a @ b with float32 accumulation: in float32 for DOT_PREC "ieee", else in b's dtype (tensor cores)."""
    if DOT_PREC == "ieee":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a.to(b.dtype), b)
    return out


@jit
def _norm_chunk(g_ptr, k0, k_stop, HAS_NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """g[k0 : k0 + BLOCK_K] ∩ [.., k_stop) as float32; ones without HAS_NORM (g_ptr is then not read)."""
    g = tl.full([BLOCK_K], 1.0, dtype=tl.float32)
    if HAS_NORM:
        k = k0 + tl.arange(0, BLOCK_K)
        g = tl.load(g_ptr + k, mask=k < k_stop, other=0.0).to(tl.float32)
    return g


@jit
def _x_chunk(x_ptr, B, K, g, k, kmask, BLOCK_B: tl.constexpr):
    """Columns k (masked by kmask) of a [B, K] x as float32: raw, and times the norm weights g."""
    b = tl.arange(0, BLOCK_B)
    xv = tl.load(x_ptr + b[:, None] * K + k[None, :], mask=(b < B)[:, None] & kmask[None, :], other=0.0,
                 cache_modifier=".cg").to(tl.float32)
    return xv, xv * g[None, :]


@jit
def _small_batch_rows(acc_a, acc_b, sumsq, x_ptr, B, K, g, k, kmask, wa, wb,
                      HAS_NORM: tl.constexpr, PAIR: tl.constexpr, BLOCK_B: tl.constexpr):
    """Row sums for 2..8 batch rows: each row of x is read from L2 and meets the weight tile(s)
    ``wa`` (and ``wb`` when PAIR) already in registers, so the weights are read once for all rows."""
    rows_of_batch = tl.arange(0, BLOCK_B)
    for b in tl.static_range(BLOCK_B):
        in_batch = (tl.zeros_like(k) + b) < B  # per lane: the mask stays a tensor of booleans
        xb = tl.load(x_ptr + b * K + k, mask=kmask & in_batch, other=0.0, cache_modifier=".cg").to(tl.float32)
        sumsq = tl.where(rows_of_batch == b, sumsq + tl.sum(xb * xb, axis=0), sumsq)
        if HAS_NORM:
            xb = xb * g
        hit = rows_of_batch[:, None] == b
        acc_a = tl.where(hit, acc_a + tl.sum(wa * xb[None, :], axis=1)[None, :], acc_a)
        if PAIR:
            acc_b = tl.where(hit, acc_b + tl.sum(wb * xb[None, :], axis=1)[None, :], acc_b)
    return acc_a, acc_b, sumsq


@jit
def _accumulate(acc, xg, wv, BLOCK_B: tl.constexpr, DOT_PREC: tl.constexpr):
    if BLOCK_B == 1:
        acc += tl.sum(wv.to(tl.float32) * xg, axis=1)[None, :]
    else:
        acc += mma(xg, tl.trans(wv), DOT_PREC)
    return acc


@jit
def _square_chunk(x_ptr, B, K, k0, k_stop, SQ_LOAD: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr):
    """x[:, k0 : k0 + BLOCK_K] ∩ [.., k_stop) as one flat float32 vector [BLOCK_B · BLOCK_K] for the sum
    of squares (:func:`_square_sums`), loaded only for ``SQ_LOAD`` 2 on tensor-core tiles; else [1] zeros."""
    if (SQ_LOAD == 2) and (BLOCK_B > SMALL_BATCH):
        i = tl.arange(0, BLOCK_B * BLOCK_K)
        row = i // BLOCK_K
        col = k0 + i % BLOCK_K
        xs = tl.load(x_ptr + row * K + col, mask=(row < B) & (col < k_stop), other=0.0,
                     cache_modifier=".cg").to(tl.float32)
    else:
        xs = tl.zeros([1], dtype=tl.float32)
    return xs


@jit
def _square_sums(sumsq, xv, xs, x_ptr, B, K, k0, k_stop, SQ_LOAD: tl.constexpr, BLOCK_B: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """``sumsq`` [BLOCK_B] plus Σ x² over the chunk ``xv`` = x[:, k0 : k0 + BLOCK_K] (tensor-core tiles).

    ``SQ_LOAD`` 1 loads the chunk a second time for this sum, as one flat vector (a load of its
    own, from L2: every program reads x), so the load that feeds the tensor cores has the product
    as its only reader.  With both readers on one load (``SQ_LOAD`` 0), Triton keeps that load's
    pipelined shared-memory buffer unswizzled, and the float32 dot-operand reads from it conflict
    8 ways (ncu, H200, batch 8: 50% of the Q/K/V launch's shared-memory wavefronts excessive).
    The second load is not pipelined: loaded here, its L2 round trip is waited for in every
    chunk.  ``SQ_LOAD`` 2 takes ``xs``, the flat chunk :func:`_square_chunk` loaded one chunk
    ahead (the caller carries it, like the norm weights), so the round trip overlaps a chunk."""
    if (SQ_LOAD == 2) and (BLOCK_B > 1):
        sumsq += tl.sum(tl.reshape(xs * xs, [BLOCK_B, BLOCK_K]), axis=1)
    elif (SQ_LOAD == 1) and (BLOCK_B > 1):  # a single row is no tensor-core operand
        xs = _square_chunk(x_ptr, B, K, k0, k_stop, 2, BLOCK_B, BLOCK_K)
        sumsq += tl.sum(tl.reshape(xs * xs, [BLOCK_B, BLOCK_K]), axis=1)
    else:
        sumsq += tl.sum(xv * xv, axis=1)
    return sumsq


@jit
def _one_row_weights(g_ptr, w_a, w_b, row_mask, k0, k_stop, HAS_NORM: tl.constexpr, PAIR: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """Chunk [k0, k0 + BLOCK_K) ∩ [.., k_stop) of the weight rows ``w_a`` (and ``w_b`` when PAIR; else
    ``w_a`` again, not reloaded) and of g (float32; ones without HAS_NORM): nothing a step writes."""
    k = k0 + tl.arange(0, BLOCK_K)
    wmask = row_mask[:, None] & (k < k_stop)[None, :]
    wa = tl.load(w_a + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
    wb = wa
    if PAIR:
        wb = tl.load(w_b + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
    return wa, wb, _norm_chunk(g_ptr, k0, k_stop, HAS_NORM, BLOCK_K)


@jit
def merged_chunk(part_ptr, lse_ptr, k0, k_stop, MERGE_NS: tl.constexpr, MERGE_D: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """Columns [k0, k0 + BLOCK_K) ∩ [.., k_stop) of one row of the attention output (k0 and BLOCK_K
    multiples of the head size D), merged from its ``MERGE_NS`` split partials
    (kernels/decode_attention.py ``attend_block``): column k is element ``k % D`` of query head
    ``h = k // D``, whose partials are ``part[h, s, :]`` [Hq, NS, D] with logsumexps ``lse[h, s]``
    [Hq, NS] (float32)::

        x_k = Σ_s exp(lse_s − lse) part[h, s, k % D],   lse = log Σ_s exp(lse_s)

    (:func:`fusecore.softmax.merge_partials`' math; an empty split has lse −inf and weight 0).  Computed
    as [heads, D] tiles, so a logsumexp is loaded once per head, not per column; every split's loads
    are issued before the first is used: one L2 round trip."""
    tl.static_assert(BLOCK_K % MERGE_D == 0, "merged_chunk: chunks of whole heads")
    HEADS: tl.constexpr = BLOCK_K // MERGE_D
    head = k0 // MERGE_D + tl.arange(0, HEADS)
    hmask = head * MERGE_D < k_stop
    d = tl.arange(0, MERGE_D)
    row = head * MERGE_NS
    top = tl.full([HEADS], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([HEADS], dtype=tl.float32)
    merged = tl.zeros([HEADS, MERGE_D], dtype=tl.float32)
    for s in tl.static_range(MERGE_NS):
        lse_s = tl.load(lse_ptr + row + s, mask=hmask, other=float("-inf"), cache_modifier=".cg")
        part_s = tl.load(part_ptr + (row + s)[:, None] * MERGE_D + d[None, :], mask=hmask[:, None], other=0.0,
                         cache_modifier=".cg").to(tl.float32)
        top_new = tl.maximum(top, lse_s)
        safe = tl.where(top_new == float("-inf"), 0.0, top_new)
        rescale = online_rescale(top, safe)
        weight = tl.where(lse_s == float("-inf"), 0.0, tl.exp(lse_s - safe))
        merged = merged * rescale[:, None] + weight[:, None] * part_s
        denom = denom * rescale + weight
        top = top_new
    merged = merged / tl.where(denom > 0.0, denom, 1.0)[:, None]
    return tl.reshape(merged, [BLOCK_K])


@jit
def _one_row_x(x_ptr, fix_ptr, k0, k_stop, X_FIX: tl.constexpr, BLOCK_K: tl.constexpr,
               MERGE_NS: tl.constexpr = 0, MERGE_D: tl.constexpr = 1):
    """Chunk [k0, k0 + BLOCK_K) ∩ [.., k_stop) of one x row as float32 (written by the previous instruction);
    with ``X_FIX`` plus the deferred down-projection sums at ``fix_ptr`` (:func:`from_fixed`); with
    ``MERGE_NS`` > 0 merged from the attention splits' partials at ``x_ptr`` and logsumexps at
    ``fix_ptr`` (:func:`merged_chunk`)."""
    k = k0 + tl.arange(0, BLOCK_K)
    if MERGE_NS > 0:
        xv = merged_chunk(x_ptr, fix_ptr, k0, k_stop, MERGE_NS, MERGE_D, BLOCK_K)
    else:
        xv = tl.load(x_ptr + k, mask=k < k_stop, other=0.0, cache_modifier=".cg").to(tl.float32)
        if X_FIX:
            xv += from_fixed(tl.load(fix_ptr + k, mask=k < k_stop, other=0, cache_modifier=".cg"))
    return xv


@jit
def _one_row_fma(acc_a, acc_b, sumsq, wa, wb, xv, g, PAIR: tl.constexpr):
    """One chunk of :func:`_one_row`: elementwise products into the [BLOCK_N, BLOCK_K] accumulators."""
    sumsq += xv * xv
    xg = (xv * g)[None, :]
    acc_a += wa.to(tl.float32) * xg
    if PAIR:
        acc_b += wb.to(tl.float32) * xg
    return acc_a, acc_b, sumsq


@jit
def _one_row(x_ptr, fix_ptr, g_ptr, w_a, w_b, row_mask, k_start, k_stop, HAS_NORM: tl.constexpr, PAIR: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROW_PREFETCH: tl.constexpr, X_FIX: tl.constexpr,
             MERGE_NS: tl.constexpr = 0, MERGE_D: tl.constexpr = 1):
    """Batch 1, pipelined: (Σ_k x g W[rows_a], Σ_k x g W[rows_b], Σ_k x²) over [k_start, k_stop).

    The next chunk's loads are issued before the current chunk is used, so a program always
    has a chunk in flight while it multiplies; products accumulate elementwise in a
    [BLOCK_N, BLOCK_K] float32 tile and are summed across the chunk dimension once, after
    the loop (a sum across threads every chunk would put two CTA barriers into each
    iteration).  The sum of squares comes back as a [1] tensor (one batch row).
    ``ROW_PREFETCH`` 2 or 3: the program's programmatic-dependent-launch wait
    (fusecore/launch_order.py) is made here, after the weight loads of the first 1 or 2 chunks
    are issued and before any x load: weights and norm weights are never written during a step,
    so their round trip overlaps the previous kernel's tail instead of following it (compiled
    only).  With 3 the loop keeps two chunks in flight, not one (registers for a third chunk).
    ``X_FIX``: x is the stored x plus the deferred sums at ``fix_ptr``; ``MERGE_NS`` > 0: x merged from
    attention split partials (:func:`_one_row_x`)."""
    acc_a = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    sumsq = tl.zeros([BLOCK_K], dtype=tl.float32)
    wa, wb, g = _one_row_weights(g_ptr, w_a, w_b, row_mask, k_start, k_stop, HAS_NORM, PAIR, BLOCK_K)
    if ROW_PREFETCH == 3:
        wa_1, wb_1, g_1 = _one_row_weights(g_ptr, w_a, w_b, row_mask, k_start + BLOCK_K, k_stop, HAS_NORM, PAIR,
                                           BLOCK_K)
        after_previous_kernel(True)
        xv = _one_row_x(x_ptr, fix_ptr, k_start, k_stop, X_FIX, BLOCK_K, MERGE_NS, MERGE_D)
        xv_1 = _one_row_x(x_ptr, fix_ptr, k_start + BLOCK_K, k_stop, X_FIX, BLOCK_K, MERGE_NS, MERGE_D)
        for k0 in range(k_start, k_stop, BLOCK_K):
            wa_2, wb_2, g_2 = _one_row_weights(g_ptr, w_a, w_b, row_mask, k0 + 2 * BLOCK_K, k_stop, HAS_NORM, PAIR,
                                               BLOCK_K)
            xv_2 = _one_row_x(x_ptr, fix_ptr, k0 + 2 * BLOCK_K, k_stop, X_FIX, BLOCK_K, MERGE_NS, MERGE_D)
            acc_a, acc_b, sumsq = _one_row_fma(acc_a, acc_b, sumsq, wa, wb, xv, g, PAIR)
            wa, wb, xv, g = wa_1, wb_1, xv_1, g_1
            wa_1, wb_1, xv_1, g_1 = wa_2, wb_2, xv_2, g_2
    else:
        after_previous_kernel(ROW_PREFETCH == 2)
        xv = _one_row_x(x_ptr, fix_ptr, k_start, k_stop, X_FIX, BLOCK_K, MERGE_NS, MERGE_D)
        for k0 in range(k_start, k_stop, BLOCK_K):
            wa_next, wb_next, g_next = _one_row_weights(g_ptr, w_a, w_b, row_mask, k0 + BLOCK_K, k_stop, HAS_NORM,
                                                        PAIR, BLOCK_K)
            xv_next = _one_row_x(x_ptr, fix_ptr, k0 + BLOCK_K, k_stop, X_FIX, BLOCK_K, MERGE_NS, MERGE_D)
            acc_a, acc_b, sumsq = _one_row_fma(acc_a, acc_b, sumsq, wa, wb, xv, g, PAIR)
            wa, wb, xv, g = wa_next, wb_next, xv_next, g_next
    sumsq_row = tl.zeros([1], dtype=tl.float32) + tl.sum(sumsq, axis=0)
    return tl.sum(acc_a, axis=1)[None, :], tl.sum(acc_b, axis=1)[None, :], sumsq_row


@jit
def rows_dot(
    x_ptr, B, K, eps, g_ptr, w_ptr, rows, row_mask, k_start, k_stop,
    HAS_NORM: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, SQ_LOAD: tl.constexpr,
    MERGE_NS: tl.constexpr = 0, MERGE_D: tl.constexpr = 1,
):
    """[BLOCK_B, BLOCK_N] float32 x̂ · W[rows]ᵀ over columns [k_start, k_stop) of K (see the module
    docstring); a part of K (split-K) only without HAS_NORM, whose scale needs all of x.  ``MERGE_NS`` > 0
    (one batch row, row tiles): x is the attention output merged from ``MERGE_NS`` split partials
    [K / D, NS, D] at ``x_ptr``, followed in the same buffer by their logsumexps [K / D, NS]
    (:func:`merged_chunk`)."""
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    sumsq = tl.zeros([BLOCK_B], dtype=tl.float32)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * K
    tl.static_assert((ROW_PREFETCH < 2) or (BLOCK_B == 1), "ROW_PREFETCH >= 2 (the tile's own PDL wait): batch 1 only")
    tl.static_assert((MERGE_NS == 0) or ((BLOCK_B == 1) and (ROW_PREFETCH > 0)), "MERGE_NS: batch-1 row tiles only")
    if (BLOCK_B == 1) and ROW_PREFETCH:
        acc, unused, sumsq = _one_row(x_ptr, x_ptr + K * MERGE_NS, g_ptr, w_rows, w_rows, row_mask, k_start, k_stop,
                                      HAS_NORM, False, BLOCK_N, BLOCK_K, ROW_PREFETCH, False, MERGE_NS, MERGE_D)
    else:
        g = _norm_chunk(g_ptr, k_start, k_stop, HAS_NORM, BLOCK_K)
        xs = _square_chunk(x_ptr, B, K, k_start, k_stop, SQ_LOAD, BLOCK_B, BLOCK_K)
        for k0 in range(k_start, k_stop, BLOCK_K):
            g_next = _norm_chunk(g_ptr, k0 + BLOCK_K, k_stop, HAS_NORM, BLOCK_K)  # one chunk ahead (module docstring)
            xs_next = _square_chunk(x_ptr, B, K, k0 + BLOCK_K, k_stop, SQ_LOAD, BLOCK_B, BLOCK_K)
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < k_stop
            if (BLOCK_B > 1) and (BLOCK_B <= SMALL_BATCH):
                wv = tl.load(w_rows + k[None, :], mask=row_mask[:, None] & kmask[None, :], other=0.0,
                             eviction_policy="evict_first").to(tl.float32)
                acc, unused, sumsq = _small_batch_rows(acc, acc, sumsq, x_ptr, B, K, g, k, kmask, wv, wv,
                                                       HAS_NORM, False, BLOCK_B)
            else:
                xv, xg = _x_chunk(x_ptr, B, K, g, k, kmask, BLOCK_B)
                wv = tl.load(w_rows + k[None, :], mask=row_mask[:, None] & kmask[None, :], other=0.0,
                             eviction_policy="evict_first")
                acc = _accumulate(acc, xg, wv, BLOCK_B, DOT_PREC)
                sumsq = _square_sums(sumsq, xv, xs, x_ptr, B, K, k0, k_stop, SQ_LOAD, BLOCK_B, BLOCK_K)
            g, xs = g_next, xs_next
    if HAS_NORM:
        acc = acc * rms_scale(sumsq, K, eps)
    return acc


@jit
def rms_scale(sumsq, K, eps):
    """[BLOCK_B, 1] RMSNorm scale r_b = 1 / sqrt(sumsq_b / K + eps) of rows with Σ_k x² = ``sumsq``."""
    return (1.0 / tl.sqrt(sumsq / K + eps))[:, None]


@jit
def rows_dot_pair_sums(
    x_ptr, fix_ptr, B, K, g_ptr, w_ptr, rows_a, rows_b, row_mask, k_start, k_stop,
    HAS_NORM: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, SQ_LOAD: tl.constexpr, X_FIX: tl.constexpr,
):
    """(Σ x g W[rows_a]ᵀ, Σ x g W[rows_b]ᵀ, Σ x²) over columns [k_start, k_stop), not yet scaled by the
    RMS: [BLOCK_B, BLOCK_N], [BLOCK_B, BLOCK_N] and [BLOCK_B] float32, in one pass over x (with
    ``X_FIX``, batch-1 row tiles only: x plus the deferred sums at ``fix_ptr``)."""
    tl.static_assert((not X_FIX) or ((BLOCK_B == 1) and (ROW_PREFETCH > 0)), "X_FIX: batch-1 row tiles only")
    acc_a = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    sumsq = tl.zeros([BLOCK_B], dtype=tl.float32)
    w_a = w_ptr + rows_a.to(tl.int64)[:, None] * K
    w_b = w_ptr + rows_b.to(tl.int64)[:, None] * K
    tl.static_assert((ROW_PREFETCH < 2) or (BLOCK_B == 1), "ROW_PREFETCH >= 2 (the tile's own PDL wait): batch 1 only")
    if (BLOCK_B == 1) and ROW_PREFETCH:
        acc_a, acc_b, sumsq = _one_row(x_ptr, fix_ptr, g_ptr, w_a, w_b, row_mask, k_start, k_stop, HAS_NORM, True,
                                       BLOCK_N, BLOCK_K, ROW_PREFETCH, X_FIX)
    else:
        g = _norm_chunk(g_ptr, k_start, k_stop, HAS_NORM, BLOCK_K)
        xs = _square_chunk(x_ptr, B, K, k_start, k_stop, SQ_LOAD, BLOCK_B, BLOCK_K)
        for k0 in range(k_start, k_stop, BLOCK_K):
            g_next = _norm_chunk(g_ptr, k0 + BLOCK_K, k_stop, HAS_NORM, BLOCK_K)  # one chunk ahead (module docstring)
            xs_next = _square_chunk(x_ptr, B, K, k0 + BLOCK_K, k_stop, SQ_LOAD, BLOCK_B, BLOCK_K)
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < k_stop
            wmask = row_mask[:, None] & kmask[None, :]
            if (BLOCK_B > 1) and (BLOCK_B <= SMALL_BATCH):
                wa = tl.load(w_a + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
                wb = tl.load(w_b + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first").to(tl.float32)
                acc_a, acc_b, sumsq = _small_batch_rows(acc_a, acc_b, sumsq, x_ptr, B, K, g, k, kmask, wa, wb,
                                                        HAS_NORM, True, BLOCK_B)
            else:
                xv, xg = _x_chunk(x_ptr, B, K, g, k, kmask, BLOCK_B)
                wa = tl.load(w_a + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
                wb = tl.load(w_b + k[None, :], mask=wmask, other=0.0, eviction_policy="evict_first")
                acc_a = _accumulate(acc_a, xg, wa, BLOCK_B, DOT_PREC)
                acc_b = _accumulate(acc_b, xg, wb, BLOCK_B, DOT_PREC)
                sumsq = _square_sums(sumsq, xv, xs, x_ptr, B, K, k0, k_stop, SQ_LOAD, BLOCK_B, BLOCK_K)
            g, xs = g_next, xs_next
    return acc_a, acc_b, sumsq


@jit
def k_range(k_part, K, parts, BLOCK_K: tl.constexpr):
    """Columns [k_start, k_stop) of K part ``k_part`` of ``parts``: whole BLOCK_K chunks, the last part shorter."""
    k_len = tl.cdiv(tl.cdiv(K, parts), BLOCK_K) * BLOCK_K
    k_start = k_part * k_len
    return k_start, tl.minimum(k_start + k_len, K)


@jit
def rows_dot_pair_split(
    x_ptr, fix_ptr, B, K, eps, g_ptr, w_ptr, rows_a, rows_b, row_mask, k_part, n_rows, block, part_ptr, sq_ptr,
    sem_ptr, SPLIT: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, SQ_LOAD: tl.constexpr, X_FIX: tl.constexpr,
):
    """:func:`rows_dot_pair` computed by ``SPLIT`` programs, each over K part ``k_part`` of row block ``block``.

    Returns ``(last, a, b)``; only the program with ``last`` true holds the results (the others
    return their own parts).  With ``SPLIT > 1`` each part stores ``Σ x g W`` of its columns
    into ``part_ptr`` ([SPLIT, B, n_rows] float32, at ``rows_a`` / ``rows_b``) and ``Σ x²`` into
    ``sq_ptr`` ([blocks · SPLIT, B]); the last part of the block to finish (a count at
    ``sem_ptr[block]`` with acquire-release order, reset by that program) adds the parts in
    their fixed order — deterministic, and no program waits — and scales by the RMS.  ``X_FIX``: see
    :func:`rows_dot_pair_sums`."""
    k_start, k_stop = k_range(k_part, K, SPLIT, BLOCK_K)
    acc_a, acc_b, sumsq = rows_dot_pair_sums(x_ptr, fix_ptr, B, K, g_ptr, w_ptr, rows_a, rows_b, row_mask, k_start,
                                             k_stop, True, BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH, SQ_LOAD,
                                             X_FIX)
    last = True
    if SPLIT > 1:
        b = tl.arange(0, BLOCK_B)
        bmask = b < B
        mask = bmask[:, None] & row_mask[None, :]
        off_a = b[:, None] * n_rows + rows_a[None, :]
        off_b = b[:, None] * n_rows + rows_b[None, :]
        tl.store(part_ptr + k_part * B * n_rows + off_a, acc_a, mask=mask)
        tl.store(part_ptr + k_part * B * n_rows + off_b, acc_b, mask=mask)
        tl.store(sq_ptr + (block * SPLIT + k_part) * B + b, sumsq, mask=bmask)
        last = last_to_arrive(sem_ptr + block, SPLIT)
        if last:
            acc_a = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
            acc_b = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
            sumsq = tl.zeros([BLOCK_B], dtype=tl.float32)
            for part in tl.static_range(SPLIT):  # unrolled: the loads of all parts in one round
                acc_a += tl.load(part_ptr + part * B * n_rows + off_a, mask=mask, other=0.0, cache_modifier=".cg")
                acc_b += tl.load(part_ptr + part * B * n_rows + off_b, mask=mask, other=0.0, cache_modifier=".cg")
                sumsq += tl.load(sq_ptr + (block * SPLIT + part) * B + b, mask=bmask, other=0.0,
                                 cache_modifier=".cg")
            tl.atomic_xchg(sem_ptr + block, 0, sem="relaxed", scope="gpu")
    scale = rms_scale(sumsq, K, eps)
    return last, acc_a * scale, acc_b * scale
