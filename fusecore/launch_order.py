"""Programmatic dependent launch (Hopper's grid dependency control) and L2 prefetch, for kernels
launched one after another in a stream.

A kernel launched with ``launch_pdl=True`` may be scheduled before the kernel ahead of it in
the stream has finished: its programs take multiprocessors that are free, or free up during
the previous kernel's last wave, instead of waiting for that kernel to end and for their own
launch.  A program first issues what does not depend on the previous kernel — typically
:func:`prefetch_rows`, which asks L2 for the first ``PREFETCH_LINES`` 128-byte lines of rows
it will stream (``prefetch.global.L2``: no value comes back, nothing is written) — then calls
:func:`after_previous_kernel`: ``griddepcontrol.wait`` until the previous kernel has completed
and its memory is visible, and only then ``griddepcontrol.launch_dependents``, which lets the
next kernel be scheduled.  Only after the wait may the program read what the previous kernel
wrote, or write anything.  Allowing the next kernel only after the wait keeps the prefetching
one kernel ahead (a trigger before the wait would let a chain of one-wave kernels launch and
prefetch many kernels ahead, more than L2 holds); the next kernel only starts once every
program of this one has started, so it never takes a slot from this kernel's remaining
programs.  Neither helper changes a value: a prefetch only moves lines into L2, which is
coherent, and the wait and trigger only order launches.

Compiled only (inline PTX, sm_90+): under the interpreter call them with ``PREFETCH_LINES = 0``
and ``USE_PDL = False`` (constexprs), where they do nothing.  Users: llmfuse's per-layer decode
kernels and its dependency-ordered looped schedule (prefetch before its waits).
"""

import triton.language as tl

from fusecore.backend import jit

LINE_BYTES = tl.constexpr(128)  # an L2 line: the unit of prefetch.global.L2


@jit
def _prefetch_line(ptr, on):
    """``prefetch.global.L2 [ptr]`` where ``on`` is non-zero (inline PTX, compiled only); returns 0."""
    return tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\t@p prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;\n\t}",
        "=r,l,r", [ptr, on], dtype=tl.int32, is_pure=False, pack=1)


@jit
def prefetch_rows(w_rows, row_mask, k_start, k_stop, PREFETCH_LINES: tl.constexpr):
    """Ask L2 for columns [k_start, k_stop) of the weight rows ``w_rows`` (pointers to the rows'
    element 0, [ROWS]; rows where ``row_mask`` is false are skipped), at most ``PREFETCH_LINES``
    lines of 128 bytes per row.  Compiled only: call it under a constexpr that the interpreter
    never sees."""
    if PREFETCH_LINES > 0:
        line = LINE_BYTES // (w_rows.dtype.element_ty.primitive_bitwidth // 8)  # elements per line
        k = k_start + tl.arange(0, PREFETCH_LINES) * line
        on = row_mask[:, None] & (k < k_stop)[None, :]
        _prefetch_line(w_rows[:, None] + k[None, :], on.to(tl.int32))


@jit
def after_previous_kernel(USE_PDL: tl.constexpr):
    """With USE_PDL: wait for the previous kernel's completion, then let the next kernel be scheduled."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
