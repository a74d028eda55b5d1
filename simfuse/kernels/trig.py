"""sin and cos of one float32 angle with one shared range reduction, branch-free.

``tl.sin`` and ``tl.cos`` are libdevice's ``sinf`` / ``cosf``: each reduces its argument on
its own, through float-to-int conversions (a quarter-rate pipe) and behind a branch to the
Payne-Hanek path for |x| ≥ 105615.  In a rollout that branch splits every step into basic
blocks the compiler cannot schedule across, and on the 4,096-env rollout (one warp per
scheduler, latency-bound) the two calls were about a fifth of the step.  Here::

    k = round(x · 2/π)                    (a fused add of 1.5 · 2²³: no conversion instruction)
    r = x − k c₁ − k c₂ − k c₃            (Cody-Waite, π/2 = c₁ + c₂ + c₃, each a fused multiply-add)
    sin r = r + r z (s₁ + z (s₂ + z s₃)),  cos r = 1 − z/2 + z² (c₁' + z (c₂' + z c₃')),  z = r²
    (sin x, cos x) = (sin r, cos r) rotated by the quadrant k mod 4

with Cephes' ``sinf`` / ``cosf`` minimax coefficients on |r| ≤ π/4: about 25 instructions
for both, no branch.  Accuracy against float64: ≤ 1.3 ulp (absolute ≤ 1e-7) for
|x| ≤ 10⁵, which holds every classic-control angle (the tests hold each step to 1e-5 relative
against Gymnasium); absolute ≤ 1e-6 up to |x| = 6.5 · 10⁶, and larger arguments, where
float32 no longer resolves an angle to half a radian, are clamped to ±6.5 · 10⁶ (NaN stays
NaN).  Explicit fused multiply-adds (``tl.fma``; the kernels are compiled with contraction
off) round the same way compiled and under the interpreter, so both give the same bits.
Memory traffic: none (registers only).
"""

import triton.language as tl

from fusecore.backend import jit

TWO_OVER_PI: tl.constexpr = tl.constexpr(0.6366197723675814)
# 1.5 · 2²³: adding it rounds a float32 of magnitude < 2²² to an integer, kept in the low mantissa bits
ROUNDER: tl.constexpr = tl.constexpr(12582912.0)
# |x| 2/π < 2²² there; float32 resolves angles that large to no better than half a radian
LIMIT: tl.constexpr = tl.constexpr(6.5e6)
# π/2 in three parts (Cephes' DP1..DP3 for π/4, doubled); the first two have few significant bits
PIO2_1: tl.constexpr = tl.constexpr(1.5703125)
PIO2_2: tl.constexpr = tl.constexpr(4.837512969970703125e-4)
PIO2_3: tl.constexpr = tl.constexpr(7.549789954891882e-8)


@jit
def sincos(x):
    """(sin x, cos x) for a float32 tensor ``x``; see the module docstring for the accuracy."""
    # beyond ±LIMIT the rounding trick no longer yields the quadrant (NaN stays NaN)
    x = tl.minimum(tl.maximum(x, -LIMIT, propagate_nan=tl.PropagateNan.ALL), LIMIT,
                   propagate_nan=tl.PropagateNan.ALL)
    shifted = tl.fma(x, TWO_OVER_PI, ROUNDER)
    k = shifted - ROUNDER
    quadrant = shifted.to(tl.int32, bitcast=True) & 3
    r = tl.fma(k, -PIO2_1, x)
    r = tl.fma(k, -PIO2_2, r)
    r = tl.fma(k, -PIO2_3, r)
    z = r * r
    sin_poly = tl.fma(tl.fma(z, -1.9515295891e-4, 8.3321608736e-3), z, -1.6666654611e-1)
    sin_r = tl.fma(r * z, sin_poly, r)
    cos_poly = tl.fma(tl.fma(z, 2.443315711809948e-5, -1.388731625493765e-3), z, 4.166664568298827e-2)
    cos_r = tl.fma(z * z, cos_poly, tl.fma(z, -0.5, 1.0))
    odd = (quadrant & 1) != 0
    sin_base = tl.where(odd, cos_r, sin_r)
    cos_base = tl.where(odd, sin_r, cos_r)
    sin_x = tl.where((quadrant & 2) != 0, -sin_base, sin_base)
    cos_x = tl.where(((quadrant + 1) & 2) != 0, -cos_base, cos_base)
    return sin_x, cos_x
