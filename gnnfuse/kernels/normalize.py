"""AGNN's row normalization and its backward, one per-node kernel each (no chain of small torch ops).

AGNN's score is ``β cos(h_i, h_j) = q_i · k_j`` with unit rows ``ĥ = h · r``,
``r = 1 / max(‖h‖, ε)`` per node and head (``torch.nn.functional.normalize``), ``q = β ĥ`` and
``k = ĥ`` (the attention kernels form ``k_j = h_j r_j`` from the gathered values and ``q_i = h_i c_i``
from the row's values, :func:`~gnnfuse.kernels.scores.gather_queries`: neither is stored).

:func:`normalize_kernel` writes ``r [N, H]`` and ``c = β r [N, H]`` from one read of ``h``.
:func:`normalize_backward_kernel` turns the attention's gradients ``∂v``, ``∂k``, ``∂q`` into::

    ∂ĥ = β ∂q + ∂k
    ∂h = ∂v + r (∂ĥ − ĥ (ĥ · ∂ĥ))      (ĥ · ∂ĥ dropped where ‖h‖ <= ε: the clamp passes no gradient to ‖h‖)
    ∂β = Σ_{n, h} ∂q · ĥ                (per-program partial sums, added by the launcher)

Bytes: forward ``N·H·D`` read, ``2 N·H`` written; backward four ``N·H·D`` reads, one written.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.grid_sync import sum_partials

from .tiles import node_rows


@jit
def _unit_rows(h_ptr, pid, num_nodes, H, D, eps, acc_dtype: tl.constexpr, ROWS: tl.constexpr, BLOCK_H: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """(h, ‖h‖, r, feat_offs, feat_mask, rh_offs, rh_mask) of the program's ``ROWS`` nodes."""
    _, _, feat_offs, feat_mask, rh_offs, rh_mask = node_rows(pid, num_nodes, H, D, ROWS, BLOCK_H, BLOCK_D)
    h = tl.load(h_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    norm = tl.sqrt(tl.sum(h * h, axis=2))
    return h, norm, 1.0 / tl.maximum(norm, eps), feat_offs, feat_mask, rh_offs, rh_mask


@jit
def normalize_kernel(h_ptr, beta_ptr, inverse_norm_ptr, query_scale_ptr, num_nodes, H, D, eps,
                     ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    acc_dtype = inverse_norm_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    _, _, r, _, _, rh_offs, rh_mask = _unit_rows(h_ptr, pid, num_nodes, H, D, eps, acc_dtype, ROWS, BLOCK_H, BLOCK_D)
    beta = tl.load(beta_ptr).to(acc_dtype)
    tl.store(inverse_norm_ptr + rh_offs, r, mask=rh_mask)
    tl.store(query_scale_ptr + rh_offs, beta * r, mask=rh_mask)


@jit
def normalize_backward_kernel(h_ptr, beta_ptr, grad_value_ptr, grad_key_ptr, grad_query_ptr, grad_h_ptr,
                              part_beta_ptr, group_ptr, grad_beta_ptr, count_ptr, num_nodes, H, D, eps, programs,
                              ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
                              SUM_P: tl.constexpr, SUM_W: tl.constexpr):
    acc_dtype = grad_key_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    h, norm, r, feat_offs, feat_mask, _, _ = _unit_rows(h_ptr, pid, num_nodes, H, D, eps, acc_dtype, ROWS, BLOCK_H,
                                                        BLOCK_D)
    beta = tl.load(beta_ptr).to(acc_dtype)
    unit = h * r[:, :, None]
    grad_query = tl.load(grad_query_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    grad_unit = beta * grad_query + tl.load(grad_key_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    radial = tl.where(norm > eps, tl.sum(unit * grad_unit, axis=2), 0.0)
    grad_h = tl.load(grad_value_ptr + feat_offs, mask=feat_mask, other=0.0).to(acc_dtype)
    grad_h += r[:, :, None] * (grad_unit - unit * radial[:, :, None])
    tl.store(grad_h_ptr + feat_offs, grad_h.to(grad_h_ptr.dtype.element_ty), mask=feat_mask)
    part_beta = tl.sum(tl.sum(tl.sum(grad_query * unit, axis=2), axis=1), axis=0)
    tl.store(part_beta_ptr + pid, part_beta.to(part_beta_ptr.dtype.element_ty))
    # ∂β = Σ_p part_beta[p], finished by the launch's last programs (fusecore.grid_sync.sum_partials), in β's dtype
    sum_partials(pid, programs, part_beta_ptr, 1, 1, group_ptr, grad_beta_ptr, count_ptr, GROUP, SUM_P, SUM_W)
