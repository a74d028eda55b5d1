"""Per-node attention terms of GAT, both sides in one read of the projected features.

For every node ``n`` and head ``h``::

    el[n, h] = Σ_d Wh[n, h, d] · attn_l[h, d]        (the node as an edge source)
    er[n, h] = Σ_d Wh[n, h, d] · attn_r[h, d]        (the node as an edge destination)

computed once per node — the fused attention then reads ``el`` / ``er`` per edge instead of
recomputing dot products of width D.  Bytes: ``N·H·D`` features read once, ``2·N·H``
scores written (in the accumulation dtype of ``el``).
"""

import triton.language as tl

from fusecore.backend import jit

from .tiles import head_tile


@jit
def node_scores_kernel(
    wh_ptr, attn_l_ptr, attn_r_ptr, el_ptr, er_ptr, num_nodes, H, D,
    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    acc_dtype = el_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    offs_r = pid * ROWS + tl.arange(0, ROWS)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    r_mask = offs_r < num_nodes
    attn_l = tl.load(attn_l_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    attn_r = tl.load(attn_r_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    wh = tl.load(
        wh_ptr + offs_r[:, None, None] * (H * D) + hd_offs[None, :, :],
        mask=r_mask[:, None, None] & hd_mask[None, :, :], other=0.0,
    ).to(acc_dtype)
    rh_offs = offs_r[:, None] * H + offs_h[None, :]
    rh_mask = r_mask[:, None] & h_mask[None, :]
    tl.store(el_ptr + rh_offs, tl.sum(wh * attn_l[None, :, :], axis=2), mask=rh_mask)
    tl.store(er_ptr + rh_offs, tl.sum(wh * attn_r[None, :, :], axis=2), mask=rh_mask)
