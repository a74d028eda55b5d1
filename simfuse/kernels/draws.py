"""Policy random numbers: one Philox call serves four consecutive steps.

The policy draw of env i at global step position p is lane p mod 4 of Philox
(seed, POLICY_TAG + i, p div 4): a uniform in [0, 1), or a standard normal (Box-Muller) for a
Gaussian head.  Every rollout kernel (classic envs and the tile-state models) draws this way,
so one Philox-4x32-10 call (about 70 instructions) is spent per four env-steps, and a K-step
rollout and K single steps read the same numbers.  Registers only: no memory traffic.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.rng import normal4, uniform4

# env i's policy stream is i + POLICY_TAG (start states use other streams)
POLICY_TAG: tl.constexpr = tl.constexpr(2 << 32)


@jit
def policy_draws(seed, idx, group, NORMAL: tl.constexpr):
    """The four policy draws of positions 4 group .. 4 group + 3 for env ids ``idx`` (int64).

    Uniforms in [0, 1), or standard normals (Box-Muller) when ``NORMAL``.
    """
    if NORMAL:
        d0, d1, d2, d3 = normal4(seed, idx + POLICY_TAG, group)
    else:
        d0, d1, d2, d3 = uniform4(seed, idx + POLICY_TAG, group)
    return d0, d1, d2, d3


@jit
def select_draw(d0, d1, d2, d3, lane):
    """Lane ``lane`` (0..3, a scalar) of four draws."""
    return tl.where(lane == 0, d0, tl.where(lane == 1, d1, tl.where(lane == 2, d2, d3)))
