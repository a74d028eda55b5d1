"""Online-softmax / logsumexp helpers shared by every split-and-merge attention kernel.

Attention over a set that is processed in pieces — the incoming edges of a graph's heavy
node split over several programs, a long KV cache split along the sequence — keeps per
piece the running maximum ``m``, the sum ``s = Σ exp(score − m)`` and the weighted sum
``acc = Σ exp(score − m) v``.  Pieces merge exactly through their logsumexp
``lse = m + log s``:  ``out = Σ_p exp(lse_p − lse) out_p`` with ``lse = logsumexp_p lse_p``.

The kernel helper (elementwise, any shape) and the host-side merge used by launchers and as
the tests' oracle live here once.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .backend import is_int, jit

NEG_INF = float("-inf")


@jit
def online_rescale(m_old, m_new):
    """exp(m_old − m_new) with the empty state (m_old = −inf) giving 0 instead of NaN."""
    return tl.where(m_old == float("-inf"), 0.0, tl.exp(m_old - m_new))


@jit
def online_update(m, total, s):
    """One step of an elementwise online softmax: ``(m_new, rescale, p, total_new)`` for running max
    ``m`` and sum ``total`` meeting scores ``s`` (same shape): ``p = exp(s − m_new)``, ``rescale =
    exp(m − m_new)`` (the factor for everything accumulated so far), a state that has seen only
    ``−inf`` staying empty (0, not NaN)."""
    m_new = tl.maximum(m, s)
    m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
    rescale = tl.exp(m - m_safe)
    p = tl.exp(s - m_safe)
    return m_new, rescale, p, total * rescale + p


def merge_partials(out: torch.Tensor, lse: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge normalized partial attention outputs along ``dim`` by their logsumexp.

    ``out``: [..., P, ..., D] partial outputs, each already divided by its own sum;
    ``lse``: the same shape without the trailing D.  Pieces with ``lse = -inf`` (empty) get
    zero weight; a row whose pieces are all empty gives zeros and ``lse = -inf``.
    Returns ``(merged_out, merged_lse)`` with ``dim`` reduced; ``dim`` counts ``lse``'s axes (``-1``: its last,
    ``out``'s second to last).
    """
    if not (isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor) and out.dim() == lse.dim() + 1
            and out.shape[:-1] == lse.shape):
        raise ValueError("merge_partials: out must have lse's shape "
                         f"{list(getattr(lse, 'shape', [lse]))} plus a last axis (the features), "
                         f"got {list(getattr(out, 'shape', [out]))}")
    if not is_int(dim) or not -lse.dim() <= dim < lse.dim():
        raise ValueError(f"merge_partials: dim must be an int in [{-lse.dim()}, {lse.dim()}), got {dim!r}")
    dim = int(dim) % lse.dim()  # out's axis too (a negative dim would count from out's feature axis)
    total = torch.logsumexp(lse, dim=dim, keepdim=True)
    weight = torch.exp(lse - total)
    weight = torch.where(torch.isfinite(total), weight, torch.zeros_like(weight))
    merged = (weight.unsqueeze(-1) * out).sum(dim=dim)
    return merged, total.squeeze(dim)
