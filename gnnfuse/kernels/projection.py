"""GAT's projection with its node scores in the epilogue: ``Wh`` and ``el``, ``er`` from one read of ``x``.

(:func:`projection_scores_kernel`.)  For nodes ``n``, heads ``h`` and lanes ``d``::

    Wh[n, h, d] = Σ_f x[n, f] · W[h·D + d, f]                   (rounded to Wh's dtype)
    el[n, h]    = Σ_d Wh[n, h, d] · attn_l[h, d]                (from the rounded Wh, as
    er[n, h]    = Σ_d Wh[n, h, d] · attn_r[h, d]                 the node-score kernel reads it)

One program owns ``BLOCK_M`` nodes and every column (``BLOCK_H · BLOCK_D``, the heads padded to
powers of two): the product is a ``tl.dot`` over ``BLOCK_F``-wide slices of the input, and the
scores are per-head sums of the accumulator tile before it leaves registers.  Bytes: ``x`` read
once, ``W`` once per program (from L2), ``Wh`` and the two ``[N, H]`` scores written once — the
same as the projection alone, where a separate node-score pass reads ``Wh`` again.

Rows that are not 16 bytes apart (``ROW_CLASSES`` > 1: a 2-byte input of 602 features has rows 1204 bytes
apart, so a row's start is only 4-byte aligned and a plain load of it is split into 4-byte or 2-byte pieces): row
``r`` starts ``r · stride`` elements in, and every ``ROW_CLASSES``-th row starts at the same offset modulo 16 bytes.
A program takes ``BLOCK_M`` rows of one class ``c`` (``r = i · ROW_CLASSES + c``), in which columns
``first = (−c · stride) mod ROW_VEC`` onwards start 16 bytes aligned in every row: the product walks that aligned
body ``[first, first + body)`` (``body`` a multiple of ``ROW_VEC``, the elements of 16 bytes) with 16-byte loads,
and adds the at most ``2 · ROW_VEC − 2`` columns before and after it as one more ``tl.dot`` of ``2 · ROW_VEC``
gathered columns.  ``W`` comes transposed, ``[F, H·D]``, so its slices load 16 bytes at a time too.  The same
sums, in another order.

float32 with a short reduction (:func:`projection_scores_held_kernel`): fusecore.linear's held-parts
product (``W``'s column block split into its TF32 parts once per program and held in shared memory
while the program walks row blocks), its column blocks whole heads wide, so each block's heads get
their scores in the block's own epilogue.
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.linear import held_parts, held_rows

from .tiles import flat_head_tile, head_tile


@jit
def projection_scores_kernel(
    x_ptr, w_ptr, attn_l_ptr, attn_r_ptr, wh_ptr, el_ptr, er_ptr, num_nodes, F, stride_x, H, D,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr, ROW_CLASSES: tl.constexpr = 1, ROW_VEC: tl.constexpr = 8,
):
    """``x [N, F]`` (row stride ``stride_x``, unit column stride), ``W [H·D, F]`` contiguous,
    ``attn_l``, ``attn_r`` ``H·D`` contiguous, ``Wh [N, H, D]`` contiguous, ``el``, ``er`` ``[N, H]``
    in the accumulation dtype (float32; float64 for float64 inputs); ``PRECISION`` the ``tl.dot``
    input precision (``"tf32x3"`` for float32: fusecore.linear.dot_precision).  ``ROW_CLASSES`` > 1 (module
    docstring): ``x`` 16-byte aligned, ``ROW_CLASSES · stride_x`` elements a multiple of 16 bytes, ``ROW_VEC``
    the elements of 16 bytes, ``F >= 2 · ROW_VEC``, ``w`` given as ``Wᵀ [F, H·D]`` contiguous, the grid
    ``ROW_CLASSES · cdiv(cdiv(N, ROW_CLASSES), BLOCK_M)``."""
    acc_dtype = el_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    if ROW_CLASSES == 1:
        offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        first = 0
        body = F
        body_rows = offs_m * stride_x
    else:
        cls = pid % ROW_CLASSES
        offs_m = (pid // ROW_CLASSES * BLOCK_M + tl.arange(0, BLOCK_M)) * ROW_CLASSES + cls
        first = (ROW_VEC - cls * stride_x % ROW_VEC) % ROW_VEC  # this class's first 16-byte aligned column
        body = (F - first) // ROW_VEC * ROW_VEC  # F >= 2 · ROW_VEC > first
        body_rows = tl.multiple_of(offs_m * stride_x + first, ROW_VEC)
    m_mask = offs_m < num_nodes
    c_offs, c_mask = flat_head_tile(H, D, BLOCK_H, BLOCK_D)  # a row of W, a column of Wh's [H·D]
    offs_f = tl.arange(0, BLOCK_F)
    acc = tl.zeros((BLOCK_M, BLOCK_H * BLOCK_D), dtype=acc_dtype)
    for f0 in range(0, F, BLOCK_F):  # (body > F - 2 · ROW_VEC: at most one more trip, masked)
        f = f0 + offs_f
        f_mask = f < body
        a = tl.load(x_ptr + body_rows[:, None] + f[None, :], mask=m_mask[:, None] & f_mask[None, :], other=0.0)
        if ROW_CLASSES == 1:
            b = tl.load(w_ptr + c_offs[None, :] * F + f[:, None], mask=f_mask[:, None] & c_mask[None, :], other=0.0)
        else:  # Wᵀ: 16-byte loads along its rows (W's own rows start anywhere when F is not a multiple of 8)
            b = tl.load(w_ptr + (first + f)[:, None] * (H * D) + c_offs[None, :],
                        mask=f_mask[:, None] & c_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if ROW_CLASSES > 1:  # the columns before and after the aligned body, gathered
        t = tl.arange(0, 2 * ROW_VEC)
        col = tl.where(t < first, t, t + body)
        t_mask = col < F
        a = tl.load(x_ptr + offs_m[:, None] * stride_x + col[None, :], mask=m_mask[:, None] & t_mask[None, :],
                    other=0.0)
        b = tl.load(w_ptr + col[:, None] * (H * D) + c_offs[None, :], mask=t_mask[:, None] & c_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    wh = acc.to(wh_ptr.dtype.element_ty)
    tl.store(wh_ptr + offs_m[:, None] * (H * D) + c_offs[None, :], wh, mask=m_mask[:, None] & c_mask[None, :])
    # the scores from the rounded Wh: the values the attention and the backward read
    wh3 = tl.reshape(wh.to(acc_dtype), (BLOCK_M, BLOCK_H, BLOCK_D))
    _, _, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    attn_l = tl.load(attn_l_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    attn_r = tl.load(attn_r_ptr + hd_offs, mask=hd_mask, other=0.0).to(acc_dtype)
    offs_h = tl.arange(0, BLOCK_H)  # (head_tile's own offs_h / h_mask here compile to other PTX)
    rh_offs = offs_m[:, None] * H + offs_h[None, :]
    rh_mask = m_mask[:, None] & (offs_h[None, :] < H)
    tl.store(el_ptr + rh_offs, tl.sum(wh3 * attn_l[None, :, :], axis=2), mask=rh_mask)
    tl.store(er_ptr + rh_offs, tl.sum(wh3 * attn_r[None, :, :], axis=2), mask=rh_mask)


@jit
def projection_scores_held_kernel(
    x_ptr, w_ptr, attn_l_ptr, attn_r_ptr, wh_ptr, el_ptr, er_ptr, num_nodes, F, stride_x, H,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
    STAGES: tl.constexpr, SUMS: tl.constexpr, CVT: tl.constexpr,
):
    """float32 ``x [N, F]`` (row stride ``stride_x``, unit column stride, ``F ≤ CHUNKS · CHUNK``), ``W [H·D, F]``
    contiguous, ``attn_l``, ``attn_r`` ``H·D`` contiguous, ``Wh [N, H, D]`` contiguous, ``el``, ``er`` float32
    ``[N, H]``; ``D`` a power of two dividing ``BLOCK_N``, which divides ``H·D``.  Program ``(c, p)`` owns columns
    ``[c · BLOCK_N, (c + 1) · BLOCK_N)`` — heads ``c · BLOCK_N / D`` onwards — holds their TF32 parts of ``Wᵀ``
    (fusecore.linear ``held_parts``) and walks row blocks ``p, p + P, …`` ``STAGES`` deep (``held_rows``;
    ``SUMS`` and ``CVT`` as fusecore.linear's ``product_held_kernel``); each block's scores are its heads' sums of
    the product tile."""
    HEADS: tl.constexpr = BLOCK_N // D
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_h = pid_n * HEADS + tl.arange(0, HEADS)
    # b = Wᵀ [F, H·D] read in place: b[k, n] = W[n, k]
    hi0, lo0, hi1, lo1, hi2, lo2, hi3, lo3 = held_parts(w_ptr, F, offs_n, offs_n < H * D, 1, F, CHUNK, CHUNKS, CVT)
    for tile in tl.range(tl.program_id(1), tl.cdiv(num_nodes, BLOCK_M), tl.num_programs(1), num_stages=STAGES):
        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        m_mask = offs_m < num_nodes
        acc = held_rows(x_ptr, offs_m, m_mask, F, stride_x, 1, hi0, lo0, hi1, lo1, hi2, lo2, hi3, lo3,
                        BLOCK_M, BLOCK_N, CHUNK, CHUNKS, SUMS, CVT)
        tl.store(wh_ptr + offs_m[:, None] * (H * D) + offs_n[None, :], acc, mask=m_mask[:, None])
        wh3 = tl.reshape(acc, (BLOCK_M, HEADS, D))
        attn_l = tl.reshape(tl.load(attn_l_ptr + offs_n), (HEADS, D))  # in the loop: no registers held across it
        attn_r = tl.reshape(tl.load(attn_r_ptr + offs_n), (HEADS, D))
        rh_offs = offs_m[:, None] * H + offs_h[None, :]
        tl.store(el_ptr + rh_offs, tl.sum(wh3 * attn_l[None, :, :], axis=2), mask=m_mask[:, None])
        tl.store(er_ptr + rh_offs, tl.sum(wh3 * attn_r[None, :, :], axis=2), mask=m_mask[:, None])
