"""Grid-wide barriers and dependency counts in device memory, for persistent kernels.

Programs of one launch that depend on each other's results (llmfuse's looped decode kernel,
whose stages follow the layers) order themselves through counts in device memory instead of
kernel boundaries.  A barrier is split in two so that a program can do independent work in
between (prefetching the next stage's weights while slower programs finish the current stage):

* :func:`signal` (arrive) — a CTA barrier (so the stores of all the program's threads are
  ordered before it), then one atomic add of 1 to the count with release order at GPU
  scope; it returns the count before, so the last program to arrive knows it need not
  wait (nor prefetch);
* :func:`wait_for` — spin reading the count (volatile loads) until it reaches the target,
  then one acquire read and a CTA barrier.  With ``POLL_SLEEP`` (nanoseconds, compiled
  only) a thread that saw the count short of its target sleeps that long before it reads
  again (``nanosleep``): every waiting program polls the same cache line while the stage it
  waits for streams its weights through the same L2, and fewer polls leave that L2 slice to
  the weights (the back-off CUB's decoupled look-back uses); a wait then ends up to about
  ``POLL_SLEEP`` later than the count is reached.

The same pair also serves finer dependencies than a whole-grid barrier (the attention of
one KV head waits only for the Q/K/V tiles of that head's group in llmfuse).  A wait that does not end
within ``max_polls`` reads raises a timeout flag and goes on, so a broken grid shows up as
an error rather than a hung GPU.

Counts only grow within a launch (the host zeroes them before each launch), so the target
of grid barrier ``index`` is ``(index + 1) · num_programs`` and no reset is needed.
Correct only when all programs are co-resident (grid ≤ what the device holds at once;
see :func:`fusecore.plan.persistent_grid`).  Under the interpreter programs run one after
another, so a kernel that waits on other programs runs there with a single program, whose
waits end at once (or its programs in an order that respects the counts).

A program that must not wait at all uses :func:`last_to_arrive` instead: every party stores its
share, then counts itself in, and only the last one to arrive (which sees everyone's stores) goes
on to combine them — a split-K sum's last part, the last piece of a split graph row.

An acquire whose value is unused may be deleted by the compiler: :mod:`fusecore.kernel_lint`
checks for it, and :func:`wait_for` uses its acquire read's value.
"""

import triton.language as tl

from .backend import jit


@jit
def signal(count_ptr):
    """Add 1 to a count in device memory after all this program's threads' stores; the count before."""
    tl.debug_barrier()
    return tl.atomic_add(count_ptr, 1, sem="release", scope="gpu")


@jit
def last_to_arrive(count_ptr, parties):
    """Count this program in at ``count_ptr`` after all its threads' stores; whether it is the last of ``parties``.

    A CTA barrier, then one atomic add with acquire-release order at GPU scope: the release publishes this
    program's stores, and in the program that returns true the acquire makes every other party's stores
    (made before their own arrival) visible to its later loads — read them with ``cache_modifier=".cg"`` (L2),
    as the multiprocessor's L1 may hold older lines.  Nobody waits.  The count is not reset here: the caller
    resets it (``tl.atomic_xchg(count_ptr, 0)`` in the last program) or zeroes it before each launch."""
    tl.debug_barrier()
    return tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == parties - 1


@jit
def load_acquire(ptr):
    """One int32 read with acquire order at GPU scope (``ld.acquire.gpu``: inline PTX, compiled only)."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@jit
def sleep_ns(ns):
    """Suspend the calling thread for about ``ns`` nanoseconds (``nanosleep``: inline PTX, compiled only)."""
    return tl.inline_asm_elementwise("nanosleep.u32 $1;\n\tmov.u32 $0, 0;", "=r,r", [ns], dtype=tl.int32,
                                     is_pure=False, pack=1)


@jit
def wait_for(count_ptr, target, max_polls, timeout_ptr, ACQUIRE_LOADS: tl.constexpr, POLL_SLEEP: tl.constexpr):
    """Wait until ``count >= target``, then order this program's later loads after the signalled stores.

    Polls with plain volatile loads (served by L2) rather than atomics, which would queue
    behind each other and behind the signals on the one counter; one acquire read after the
    count is reached provides the ordering (and drops the multiprocessor's L1 lines, which may
    hold what other programs have since rewritten).  With ``ACQUIRE_LOADS`` (compiled only) the polls
    are acquire loads themselves, so no program adds an RMW to the counter's queue at all.
    Gives up after ``max_polls`` reads (seconds, where a real wait takes microseconds) and
    raises ``timeout_ptr[0]``.  ``POLL_SLEEP`` > 0: sleep that many nanoseconds between reads.
    """
    if ACQUIRE_LOADS:
        seen = load_acquire(count_ptr)
        polls = 0
        while (seen < target) & (polls < max_polls):
            if POLL_SLEEP > 0:
                sleep_ns(tl.full([], POLL_SLEEP, tl.int32))
            seen = load_acquire(count_ptr)
            polls += 1
    else:
        seen = tl.load(count_ptr, volatile=True)
        polls = 0
        while (seen < target) & (polls < max_polls):
            if POLL_SLEEP > 0:
                sleep_ns(tl.full([], POLL_SLEEP, tl.int32))
            seen = tl.load(count_ptr, volatile=True)
            polls += 1
        # The acquire read.  Its value decides the timeout below: Triton 3.6 turns an acquire add of
        # 0 into an ld.acquire and deletes it when the value is unused (it did, in every wait of the
        # kernels the H200 ran in session 3), leaving only relaxed polls and no acquire at all.
        seen = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
    if seen < target:
        tl.atomic_xchg(timeout_ptr, 1)
    tl.debug_barrier()


@jit
def _sum_rows(src_ptr, src_rows, lo, hi, dst_ptr, dst_rows, dst_row, count, W,
              BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr):
    """``dst[k, dst_row, :W] = Σ_{r in lo:hi} src[k, r, :W]`` for ``k < count`` (``src [count, src_rows, W]``,
    ``dst [count, dst_rows, W]``, contiguous), added in row order, read through L2 (``.cg``)."""
    acc_dtype = tl.float64 if src_ptr.dtype.element_ty == tl.float64 else tl.float32
    offs_p = tl.arange(0, BLOCK_P)
    for k in range(0, count):
        src = src_ptr + k * src_rows * W  # a partial buffer holds fewer than 2^31 elements
        dst = dst_ptr + (k * dst_rows + dst_row) * W
        for w0 in range(0, W, BLOCK_W):
            offs_w = w0 + tl.arange(0, BLOCK_W)
            w_mask = offs_w < W
            acc = tl.zeros([BLOCK_P, BLOCK_W], dtype=acc_dtype)
            for r0 in range(lo, hi, BLOCK_P):
                r = r0 + offs_p
                acc += tl.load(src + r[:, None].to(tl.int64) * W + offs_w[None, :],
                               mask=(r < hi)[:, None] & w_mask[None, :], other=0.0, cache_modifier=".cg").to(acc_dtype)
            tl.store(dst + offs_w, tl.sum(acc, axis=0).to(dst_ptr.dtype.element_ty), mask=w_mask)


@jit
def sum_partials(pid, programs, part_ptr, count, W, group_ptr, out_ptr, count_ptr,
                 GROUP: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr):
    """Finish a launch's column sums of per-program partials inside the launch: ``out[k, :W] = Σ_p part[k, p, :W]``
    for ``k < count`` (``part [count, programs, W]`` contiguous, in the accumulation dtype; ``out [count, W]`` in its
    own dtype, rounded once), with no reduction launch after it.  Every program of the launch calls this once, after
    storing its partial rows ``part[:, pid]``.

    Two levels, each finished by the last program to arrive (:func:`last_to_arrive`): the last of each group of
    ``GROUP`` consecutive programs sums the group's rows into ``group [count, groups, W]`` (the accumulation dtype),
    and the last group to finish sums those into ``out``.  One program never reads more than ``max(GROUP, groups)``
    rows per column, so a launch of 10⁴ programs ends with two short sums rather than one long one.  The order of
    addition is fixed (rows in order), whatever order the programs arrive in: deterministic.  ``count_ptr``: ``groups
    + 1`` int32 counts, zero when the launch starts; each is set back to zero by the program that finishes it, so
    they are zero again when the launch ends (:func:`fusecore.scratch.zeroed`)."""
    groups = (programs + GROUP - 1) // GROUP
    g = pid // GROUP
    first = g * GROUP
    size = tl.minimum(programs - first, GROUP)
    if last_to_arrive(count_ptr + g, size.to(tl.int32)):
        tl.atomic_xchg(count_ptr + g, 0, sem="relaxed", scope="gpu")
        _sum_rows(part_ptr, programs, first, first + size, group_ptr, groups, g, count, W, BLOCK_P, BLOCK_W)
        if last_to_arrive(count_ptr + groups, groups.to(tl.int32)):
            tl.atomic_xchg(count_ptr + groups, 0, sem="relaxed", scope="gpu")
            _sum_rows(group_ptr, groups, 0, groups, out_ptr, 1, 0, count, W, BLOCK_P, BLOCK_W)
