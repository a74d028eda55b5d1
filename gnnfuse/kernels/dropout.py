"""Attention dropout regenerated from the counter-based RNG: nothing is stored.

The weight of the edge at CSR position ``p`` and head ``h`` is kept when
``uniform(seed, stream=p, position=offset + h) >= dropout_p`` (:mod:`fusecore.rng`) and then
scaled by ``1 / (1 − dropout_p)``.  The forward and both backward passes call
:func:`attention_dropout` with the same counters, so they agree bit for bit; the oracle is
:func:`gnnfuse.reference.dropout_keep_mask`.

Where ``(seed, offset)`` comes from is the kernels' constexpr ``DROPOUT``:

* ``DROPOUT_OFF`` (0) — no dropout;
* ``DROPOUT_HOST`` (1) — the two scalars as passed (a :class:`fusecore.PhiloxStream`'s pair);
* ``DROPOUT_DEVICE`` (2) — the ``seed`` argument points to the int64 pair a
  :class:`fusecore.DevicePhiloxStream` handed the call (:func:`fusecore.rng.load_seed_pair`):
  captured in a CUDA graph, every replay reads the pair the graph's own ``take`` wrote, so each
  replay draws a fresh mask, and the backward, reading the same pair, regenerates it.

Each kernel calls :func:`dropout_seed` once, before its edge loop (two int64 loads per program).

A per-edge factor on the attention (DGL GATConv's ``edge_weight``: ``α'_p = dropout(α_p) · w_p``) rides
beside the mask: ``FACTOR`` kernels multiply each kept weight by ``factor[p]`` (:func:`edge_factor`,
``factor`` ``[E]`` in the accumulation dtype, in CSR order for the forward and the weights pass, in reverse-CSR
order for the source pass), and the source pass with ``FACTOR_GRAD`` stores ``∂L/∂w_p = Σ_h dropout(α_p)[h]
<g_i, val_j>[h]`` at the edge's reverse-CSR position (:func:`store_factor_grad`).
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.rng import load_seed_pair, uniform4

DROPOUT_OFF = 0
DROPOUT_HOST = 1
DROPOUT_DEVICE = 2


@jit
def dropout_seed(seed, rng_offset, DROPOUT: tl.constexpr):
    """The launch's ``(seed, offset)``: read from the device pair ``seed`` points to with
    ``DROPOUT_DEVICE``, else the scalars themselves."""
    if DROPOUT == 2:
        seed, rng_offset = load_seed_pair(seed)
    return seed, rng_offset


@jit
def attention_dropout(weight, stream, position, seed, dropout_p, keep_scale):
    """``weight · keep_scale`` where kept, else 0; ``stream`` and ``position`` broadcast to ``weight``."""
    stream = stream.to(tl.int64)
    position = position.to(tl.int64)
    uniform, _, _, _ = uniform4(seed, stream + position * 0, position + stream * 0)
    return tl.where(uniform >= dropout_p, weight * keep_scale, 0.0)


@jit
def edge_factor(weight, pos, mask, factor_ptr, FACTOR: tl.constexpr):
    """``weight · factor[pos]`` with ``FACTOR`` (``pos`` and ``mask`` broadcast to ``weight``; 0 where not
    ``mask``), else ``weight`` itself."""
    if FACTOR:
        weight = weight * tl.load(factor_ptr + pos, mask=mask, other=0.0).to(weight.dtype)
    return weight


@jit
def store_factor_grad(grad_factor_ptr, kept, g_dot_val, pos, mask, FACTOR_GRAD: tl.constexpr, AXIS: tl.constexpr):
    """With ``FACTOR_GRAD``: ``grad_factor[pos] = Σ_h kept[..., h] · g_dot_val[..., h]`` (heads on axis ``AXIS``,
    the last), the per-edge factor's gradient from the weights before the factor (``kept``, 0 at masked heads)."""
    if FACTOR_GRAD:
        grad = tl.sum(kept * g_dot_val, axis=AXIS)
        tl.store(grad_factor_ptr + pos, grad.to(grad_factor_ptr.dtype.element_ty), mask=mask)
