"""Programmatic dependent launch (Hopper's grid dependency control) for the per-layer kernels.

A kernel launched with ``launch_pdl=True`` may be scheduled before the kernel ahead of it in
the stream has finished: its programs take multiprocessors that free up during the previous
kernel's last wave instead of waiting for that kernel to end and for their own launch.  Each
program first waits (``griddepcontrol.wait``) until the previous kernel has completed and its
memory is visible — before it reads or writes anything — and then allows the next kernel to
be scheduled (``griddepcontrol.launch_dependents``).  The next kernel only starts once every
program of this one has started, so it never takes a slot from this kernel's remaining
programs.  Every decode kernel waits before touching memory, so the chain is as ordered as
ordinary launches.  Moves no bytes.
"""

import triton.language as tl

from fusecore.backend import jit


@jit
def after_previous_kernel(USE_PDL: tl.constexpr):
    """With USE_PDL: wait for the previous kernel's completion, then let the next kernel be scheduled."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
