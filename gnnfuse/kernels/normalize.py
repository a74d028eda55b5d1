"""AGNN's row normalization: its per-node forward kernel, and the backward's share folded into the attention passes.

AGNN's score is ``β cos(h_i, h_j) = q_i · k_j`` with unit rows ``ĥ = h · r``,
``r = 1 / max(‖h‖, ε)`` per node and head (``torch.nn.functional.normalize``), ``q = β ĥ`` and
``k = ĥ`` (the attention kernels form ``k_j = h_j r_j`` from the gathered values and ``q_i = h_i c_i``
from the row's values, :func:`~gnnfuse.kernels.scores.gather_queries`: neither is stored).

:func:`normalize_kernel` writes ``r [N, H]`` and ``c = β r [N, H]`` from one read of ``h``.  Bytes: ``N·H·D`` read,
``2 N·H`` written.

The backward has no kernel of its own.  With ``∂ĥ = β ∂q + ∂k``::

    ∂h = ∂v + r (∂ĥ − ĥ (ĥ · ∂ĥ))      (ĥ · ∂ĥ dropped where ‖h‖ <= ε: the clamp passes no gradient to ‖h‖)
    ∂β = Σ_{n, h} ∂q · ĥ

is linear in ``∂k`` and ``∂q`` apart, so each pass folds its own share as it stores (:func:`unit_grad`): the
source pass stores ``P = ∂v + r (∂k − ĥ (ĥ · ∂k))`` in place of ``∂v`` and ``∂k``, and the destination pass
``∂h = P + c (∂q − ĥ (ĥ · ∂q))`` in place of ``∂q``, with each row's ``Σ_h ∂q · ĥ`` (the terms of ``∂β``).  A piece
of a split row folds its partial the same way (the fold is linear), and the pieces' merge adds ``P`` once.  Where a
per-node kernel read ``h``, ``∂v``, ``∂k``, ``∂q`` and wrote ``∂h`` after the passes (five ``N·H·D`` passes over
memory), the destination pass reads ``P`` and writes ``∂h`` (two), and the source pass writes one gradient instead of
two.
"""

import triton.language as tl

from fusecore.backend import jit

from .tiles import node_rows

# torch.nn.functional.normalize's default eps: the kernels' clamp (normalize_kernel takes it as ops.NORMALIZE_EPS)
UNIT_EPS = tl.constexpr(1e-12)


@jit
def normalize_kernel(h_ptr, beta_ptr, inverse_norm_ptr, query_scale_ptr, num_nodes, H, D, eps,
                     ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    acc_dtype = inverse_norm_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    _, _, feat_offs, feat_mask, rh_offs, rh_mask = node_rows(pid, num_nodes, H, D, ROWS, BLOCK_H, BLOCK_D)
    h = tl.load(h_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    r = 1.0 / tl.maximum(tl.sqrt(tl.sum(h * h, axis=2)), eps)
    beta = tl.load(beta_ptr).to(acc_dtype)
    tl.store(inverse_norm_ptr + rh_offs, r, mask=rh_mask)
    tl.store(query_scale_ptr + rh_offs, beta * r, mask=rh_mask)


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
