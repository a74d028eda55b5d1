"""sin and cos of one float32 angle with one shared range reduction, branch-free.

``tl.sin`` and ``tl.cos`` are libdevice's ``sinf`` / ``cosf``: each reduces its argument on
its own, through float-to-int conversions (a quarter-rate pipe) and behind a branch to the
Payne-Hanek path for |x| ≥ 105615.  In a rollout that branch splits every step into basic
blocks the compiler cannot schedule across, and on the 4,096-env rollout (one warp per
scheduler, latency-bound) the two calls were about a fifth of the step.  Here::

    k = round(x · 2/π)                    (float add of 1.5 · 2²³: no conversion instruction)
    r = ((x − k c₁) − k c₂) − k c₃        (Cody-Waite, π/2 = c₁ + c₂ + c₃; k c₁, k c₂ exact
                                           for |k| < 2¹³, so r is accurate to |x| ≈ 10⁴)
    sin r = r + r z (s₁ + z (s₂ + z s₃)),  cos r = 1 − z/2 + z² (c₁' + z (c₂' + z c₃')),  z = r²
    (sin x, cos x) = (sin r, cos r) rotated by the quadrant k mod 4

with Cephes' ``sinf`` / ``cosf`` minimax coefficients on |r| ≤ π/4.  About 30 float32 add /
multiply / select instructions for both, no branch.  Accuracy against float64: ≤ 2 ulp of
the result (absolute ≤ 6e-8) for |x| ≤ 10⁴ — where every classic-control angle lives (the
tests hold it to 1e-5 relative per step against Gymnasium); beyond, an absolute error of
about |x| · 3e-11 from the reduction.  Only float adds and multiplies (no fused multiply-add:
the kernels are compiled with contraction off), so the interpreter on the CPU computes the
same bits as the GPU.  Memory traffic: none (registers only).
"""

import triton.language as tl

from fusecore.backend import jit

TWO_OVER_PI: tl.constexpr = tl.constexpr(0.6366197723675814)
# 1.5 · 2²³: adding it rounds a float32 of magnitude < 2²² to an integer, kept in the low mantissa bits
ROUNDER: tl.constexpr = tl.constexpr(12582912.0)
# π/2 in three parts (Cephes' DP1..DP3 for π/4, doubled); the first two have few significant bits
PIO2_1: tl.constexpr = tl.constexpr(1.5703125)
PIO2_2: tl.constexpr = tl.constexpr(4.837512969970703125e-4)
PIO2_3: tl.constexpr = tl.constexpr(7.549789954891882e-8)


@jit
def sincos(x):
    """(sin x, cos x) for a float32 tensor ``x``; see the module docstring for the accuracy."""
    shifted = x * TWO_OVER_PI + ROUNDER
    k = shifted - ROUNDER
    quadrant = shifted.to(tl.int32, bitcast=True) & 3
    r = x - k * PIO2_1
    r = r - k * PIO2_2
    r = r - k * PIO2_3
    z = r * r
    sin_r = r + (r * z) * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4))
    cos_r = (1.0 - 0.5 * z) + (z * z) * (4.166664568298827e-2 + z * (-1.388731625493765e-3
                                                                     + z * 2.443315711809948e-5))
    odd = (quadrant & 1) != 0
    sin_base = tl.where(odd, cos_r, sin_r)
    cos_base = tl.where(odd, sin_r, cos_r)
    sin_x = tl.where((quadrant & 2) != 0, -sin_base, sin_base)
    cos_x = tl.where(((quadrant + 1) & 2) != 0, -cos_base, cos_base)
    return sin_x, cos_x
