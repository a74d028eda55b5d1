"""AGNN's row normalization, inside the attention kernels: no kernel of its own, forward or backward.

AGNN's score is ``β cos(h_i, h_j) = q_i · k_j`` with unit rows ``ĥ = h · r``,
``r = 1 / max(‖h‖, ε)`` per node and head (``torch.nn.functional.normalize``), ``q = β ĥ`` and
``k = ĥ``.  The forward kernels form the keys from the values they gather, ``k_j = h_j / max(‖h_j‖, ε)``
(:func:`inverse_norms`, in :func:`~gnnfuse.kernels.scores.gather_keys` with ``NORMS``), and each row's query from its
own values, ``q_i = h_i c_i`` with ``c = β r`` (:func:`unit_queries`), storing the row's ``r`` and ``c`` ``[N, H]`` as
they go: the backward and the attention weights read them there (the keys ``h_j r_j``, the queries ``h_i c_i``).
Neither ``ĥ`` nor ``q`` is ever stored.

The backward has no kernel of its own either.  With ``∂ĥ = β ∂q + ∂k``::

    ∂h = ∂v + r (∂ĥ − ĥ (ĥ · ∂ĥ))      (ĥ · ∂ĥ dropped where ‖h‖ <= ε: the clamp passes no gradient to ‖h‖)
    ∂β = Σ_{n, h} ∂q · ĥ

is linear in ``∂k`` and ``∂q`` apart, so each pass folds its own share as it stores (:func:`unit_grad`): the
source pass stores ``P = ∂v + r (∂k − ĥ (ĥ · ∂k))`` in place of ``∂v`` and ``∂k``, and the destination pass
``∂h = P + c (∂q − ĥ (ĥ · ∂q))`` in place of ``∂q``, with each row's ``Σ_h ∂q · ĥ`` (the terms of ``∂β``).  A piece
of a split row folds its partial the same way (the fold is linear), and the pieces' merge adds ``P`` once.  Where a
per-node kernel read ``h``, ``∂v``, ``∂k``, ``∂q`` and wrote ``∂h`` after the passes (five ``N·H·D`` passes over
memory), the destination pass reads ``P`` and writes ``∂h`` (two), and the source pass writes one gradient instead of
two; where a per-node kernel read ``h`` before the forward to write ``r`` and ``c``, nothing does.
"""

import triton.language as tl

from fusecore.backend import jit

UNIT_EPS = tl.constexpr(1e-12)  # torch.nn.functional.normalize's default eps (ops.NORMALIZE_EPS)


@jit
def inverse_norms(h):
    """``r = 1 / max(‖h‖, ε)`` ``[M, BLOCK_H]`` of ``[M, BLOCK_H, BLOCK_D]`` rows (rows and heads masked to 0 give
    ``1 / ε``, never read)."""
    return 1.0 / tl.maximum(tl.sqrt(tl.sum(h * h, axis=2)), UNIT_EPS)


@jit
def unit_queries(value_ptr, beta_ptr, r_ptr, c_ptr, rows, mask, H, FS, offs_h, h_mask, hd_offs, hd_mask,
                 acc_dtype: tl.constexpr):
    """The forward's AGNN queries of rows ``rows [M]`` (where ``mask``; row stride ``FS``): ``q = h c`` ``[M, BLOCK_H,
    BLOCK_D]`` with ``r = 1 / max(‖h‖, ε)`` and ``c = β r``, both stored (``r [N, H]`` at ``r_ptr``, ``c`` at
    ``c_ptr``) for the backward and the attention weights."""
    rh_offs = rows[:, None] * H + offs_h[None, :]
    rh_mask = mask[:, None] & h_mask[None, :]
    h = tl.load(value_ptr + rows[:, None, None] * FS + hd_offs[None, :, :],
                mask=mask[:, None, None] & hd_mask[None, :, :], other=0.0).to(acc_dtype)
    r = inverse_norms(h)
    c = tl.load(beta_ptr).to(acc_dtype) * r
    tl.store(r_ptr + rh_offs, r.to(r_ptr.dtype.element_ty), mask=rh_mask)
    tl.store(c_ptr + rh_offs, c.to(c_ptr.dtype.element_ty), mask=rh_mask)
    return h * c[:, :, None]


@jit
def unit_grad(grad, h, r, c):
    """``(c (grad − ĥ (ĥ · grad)), ĥ · grad)`` per row and head of ``[M, BLOCK_H, BLOCK_D]`` tiles ``grad`` (a
    gradient with respect to ``ĥ``-proportional keys or queries) and ``h`` (the rows' features), ``ĥ = h r``, ``r``
    and ``c`` ``[M, BLOCK_H]``; the radial term dropped where ``‖h‖ <= ε`` (as the normalization's clamp does), the
    returned ``ĥ · grad`` ``[M, BLOCK_H]`` (``∂β``'s terms) never.

    The passes load ``h`` and ``r`` before their edge loop (their latency hidden behind it) and call this after it.
    Two other forms cost occupancy on sm_90 (Triton 3.6, the arxiv-like AGNN's unrolled source light kernel): the
    clamp tested before the loop, or read from ``r`` (``r < 1 / ε``, no second reduction), took it from 62 to 128
    registers (fp32; bf16 48 to 128); and ``h`` and ``r`` loaded after the loop, from 48 to 63 in bf16 (32 resident
    warps a multiprocessor instead of 40: 372.9 → 421.3 µs, session 51 call 3)."""
    unit = h * r[:, :, None]
    dot = tl.sum(unit * grad, axis=2)
    radial = tl.where(tl.sqrt(tl.sum(h * h, axis=2)) > UNIT_EPS, dot, 0.0)
    return c[:, :, None] * (grad - unit * radial[:, :, None]), dot
