"""Grid-wide barrier through a counter in device memory, for the looped persistent kernel.

Every program arrives by adding 1 to ``counter`` (release, GPU scope) after a CTA barrier
(so the stores of all its threads are ordered before the arrival), then spins reading the
counter (acquire) until all ``num_programs`` programs have arrived at barrier number
``index`` — the counter only grows within a launch, so the target is
``(index + 1) · num_programs`` and no reset between barriers is needed.  Correct only when
all programs are co-resident (grid ≤ what the device holds at once; see
``fusecore.plan.persistent_grid``).  Under the interpreter programs run one after another,
so the looped kernel is run there with a single program, for which the wait is empty.
"""

import triton.language as tl

from fusecore.backend import jit


@jit
def grid_barrier(counter_ptr, index, num_programs):
    """Wait until all ``num_programs`` programs reached barrier ``index`` (0, 1, 2, ...)."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    target = (index + 1) * num_programs
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()
