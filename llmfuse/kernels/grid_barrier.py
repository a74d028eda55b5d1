"""Grid-wide barrier through a counter in device memory, for the looped persistent kernel.

The barrier is split in two so that a program can do independent work in between
(prefetching the next stage's weights while slower programs finish the current stage):

* :func:`grid_arrive` — a CTA barrier (so the stores of all the program's threads are
  ordered before the arrival), then one atomic add of 1 to ``counter`` with release order
  at GPU scope; it returns the count before, so the last program to arrive knows it need
  not wait (nor prefetch);
* :func:`grid_wait` — spin reading the counter (volatile loads) until all ``num_programs``
  programs have arrived at barrier number ``index``, then one acquire read and a CTA barrier.

A wait that does not end within ``max_polls`` reads sets the timeout flag ``counter[1]``
and goes on, so a broken grid shows up as an error rather than a hung GPU.

The counter only grows within a launch (the host zeroes it before each launch), so the
target of barrier ``index`` is ``(index + 1) · num_programs`` and no reset between barriers
is needed.  Correct only when all programs are co-resident (grid ≤ what the device holds
at once; see ``fusecore.plan.persistent_grid``).  Under the interpreter programs run one
after another, so the looped kernel runs there with a single program, whose waits end at
once.
"""

import triton.language as tl

from fusecore.backend import jit


@jit
def grid_arrive(counter_ptr):
    """Count this program as arrived (after all its threads' stores); the count before it."""
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@jit
def grid_wait(counter_ptr, index, num_programs, max_polls):
    """Wait until all ``num_programs`` programs arrived at barrier ``index`` (0, 1, 2, ...).

    Gives up after ``max_polls`` reads of the counter (seconds, where a real wait takes
    microseconds) and raises the flag ``counter_ptr[1]``: a grid that is not co-resident
    then ends with an error the host can read instead of hanging the device.
    """
    target = (index + 1) * num_programs
    # Poll with plain volatile loads (served by L2) rather than atomics, which would queue
    # behind each other and behind the arrivals on the one counter; one acquire RMW after
    # the count is reached orders this program's later loads after the other programs' stores.
    seen = tl.load(counter_ptr, volatile=True)
    polls = 0
    while (seen < target) & (polls < max_polls):
        seen = tl.load(counter_ptr, volatile=True)
        polls += 1
    if seen < target:
        tl.atomic_xchg(counter_ptr + 1, 1)
    tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
