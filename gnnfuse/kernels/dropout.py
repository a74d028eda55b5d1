"""Attention dropout regenerated from the counter-based RNG: nothing is stored.

The weight of the edge at CSR position ``p`` and head ``h`` is kept when
``uniform(seed, stream=p, position=offset + h) >= dropout_p`` (:mod:`fusecore.rng`) and then
scaled by ``1 / (1 − dropout_p)``.  The forward and both backward passes call
:func:`attention_dropout` with the same counters, so they agree bit for bit; the oracle is
:func:`gnnfuse.reference.dropout_keep_mask`.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.rng import uniform4


@jit
def attention_dropout(weight, stream, position, seed, dropout_p, keep_scale):
    """``weight · keep_scale`` where kept, else 0; ``stream`` and ``position`` broadcast to ``weight``."""
    stream = stream.to(tl.int64)
    position = position.to(tl.int64)
    uniform, _, _, _ = uniform4(seed, stream + position * 0, position + stream * 0)
    return tl.where(uniform >= dropout_p, weight * keep_scale, 0.0)
