"""Device functions that steer the Triton compiler where its default choice costs registers.

:func:`unhoisted` — an integer the compiler cannot prove loop-invariant, so offsets built from
it inside a loop are recomputed where they are used instead of being hoisted out of the loop
and held in registers across it (a tile of int64 offsets held across a step loop costs two
registers per element per thread).
"""

import triton.language as tl

from .backend import jit


@jit
def unhoisted(n, ptr):
    """``n`` (an integer scalar >= 0), passed through a masked load that reads nothing.

    ``ptr`` is any valid pointer to an integer type; since ``n < 0`` never holds, the load is masked off and
    returns 0, so the value is ``n`` — but the compiler must assume it may differ per use.
    Moves no bytes.
    """
    return n + tl.load(ptr, mask=n < 0, other=0)
