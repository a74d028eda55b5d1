"""Instruction 1: RMSNorm → fused Q/K/V projection → RoPE → KV-cache append.

For row ``b`` at cache slot ``t`` (RoPE position ``p_b = t − kv_start[b]``)::

    x̂      = x_b / sqrt(mean(x_b²) + eps) · g_attn
    y      = x̂ W_qkvᵀ (+ b_qkv)                 W_qkv [(Hq + 2 Hkv) D, H]
    head h of y, pair j ∈ [0, D/2):  (y_j, y_{j+D/2}) rotated by angle p_b · inv_freq_j for
    Q and K heads; V heads are copied.
    q[b, h]            ← rotated query heads (float32 [B, Hq, D])
    k_cache[l, b, h, t] ← rotated key heads;  v_cache[l, b, h, t] ← value heads

A tile is (head, block of BLOCK_P pairs, one of ``QKV_SPLIT`` parts of K): the pair block
owns both halves of every pair it rotates, so RoPE needs no exchange between pair blocks.
With ``QKV_SPLIT > 1`` (more and shorter programs: a head has few pair blocks, so without
a K split there are fewer programs than multiprocessors at batch >= 3) each part stores its
partial sums ``Σ x g W`` and ``Σ x²`` over its columns; the last part of a pair block to
finish (a semaphore count, acquire-release, reset by that program) adds the parts in their
fixed order — deterministic, no program waits — scales by the RMS and runs the RoPE and
cache-append epilogue.  Bytes: W_qkv once ((Hq + 2 Hkv) D H elements), x (B H float32, per
program from L2), q and the new K/V rows (plus the parts' partial sums through L2).
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.launch_order import after_previous_kernel, prefetch_rows

from .matvec import k_range, rows_dot_pair_split


@jit
def qkv_span(tile, layer, w_ptr, H, HQ, HKV, D, BLOCK_P: tl.constexpr, QKV_SPLIT: tl.constexpr):
    """Tile ``tile``'s head, pair indices j [BLOCK_P] (masked by j < D/2), the rows of the pairs' two
    halves in W_qkv and layer ``layer``'s W_qkv [(HQ + 2 HKV) D, H]."""
    half = D // 2
    pair_tiles = tl.cdiv(half, BLOCK_P)
    pair_block = tile // QKV_SPLIT
    head = pair_block // pair_tiles
    j = (pair_block % pair_tiles) * BLOCK_P + tl.arange(0, BLOCK_P)
    rows_lo = head * D + j
    layer64 = tl.full([], 0, tl.int64) + layer
    return head, j, j < half, rows_lo, rows_lo + half, w_ptr + layer64 * (HQ + 2 * HKV) * D * H


@jit
def qkv_prefetch(tile, layer, w_ptr, H, HQ, HKV, D, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
                 QKV_SPLIT: tl.constexpr, PREFETCH_LINES: tl.constexpr):
    """Ask L2 for the first ``PREFETCH_LINES`` lines of tile ``tile``'s W_qkv rows (fusecore/launch_order.py)."""
    head, j, jmask, rows_lo, rows_hi, w_layer = qkv_span(tile, layer, w_ptr, H, HQ, HKV, D, BLOCK_P, QKV_SPLIT)
    k_start, k_stop = k_range(tile % QKV_SPLIT, H, QKV_SPLIT, BLOCK_K)
    prefetch_rows(w_layer + rows_lo.to(tl.int64) * H, jmask, k_start, k_stop, PREFETCH_LINES)
    prefetch_rows(w_layer + rows_hi.to(tl.int64) * H, jmask, k_start, k_stop, PREFETCH_LINES)


@jit
def qkv_rope_tile(
    tile, layer, x_ptr, fix_ptr, norm_ptr, w_ptr, bias_ptr, inv_freq_ptr, kv_start_ptr, slot_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, sq_ptr, sem_ptr,
    B, H, HQ, HKV, D, S, eps,
    HAS_BIAS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, QKV_SPLIT: tl.constexpr, SQ_LOAD: tl.constexpr,
    X_FIX: tl.constexpr,
):
    """One Q/K/V tile (module docstring); ``X_FIX``: x is the stored x plus the deferred down-projection
    sums at ``fix_ptr`` (kernels/matvec.py ``from_fixed``)."""
    pair_block = tile // QKV_SPLIT
    head, j, jmask, rows_lo, rows_hi, w_layer = qkv_span(tile, layer, w_ptr, H, HQ, HKV, D, BLOCK_P, QKV_SPLIT)
    layer64 = tl.full([], 0, tl.int64) + layer
    g_layer = norm_ptr + layer64 * H
    # RoPE's inputs do not depend on the projection (the slot and first valid slots are set before a
    # step): loaded before the K loop, so the epilogue waits for no further L2 round trip
    slot = tl.load(slot_ptr)
    b = tl.arange(0, BLOCK_B)
    pos = (slot - tl.load(kv_start_ptr + b, mask=b < B, other=0)).to(tl.float32)
    freq = tl.load(inv_freq_ptr + j, mask=jmask, other=0.0)
    last, lo, hi = rows_dot_pair_split(x_ptr, fix_ptr, B, H, eps, g_layer, w_layer, rows_lo, rows_hi, jmask,
                                       tile % QKV_SPLIT, (HQ + 2 * HKV) * D, pair_block, part_ptr, sq_ptr, sem_ptr,
                                       QKV_SPLIT, BLOCK_B, BLOCK_P, BLOCK_K, DOT_PREC, ROW_PREFETCH, SQ_LOAD, X_FIX)
    if last:
        _rope_append(lo, hi, layer64, head, j, jmask, slot, pos, freq, bias_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                     B, HQ, HKV, D, S, HAS_BIAS, BLOCK_B)


@jit
def _rope_append(lo, hi, layer64, head, j, jmask, slot, pos, freq, bias_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                 B, HQ, HKV, D, S, HAS_BIAS: tl.constexpr, BLOCK_B: tl.constexpr):
    """The epilogue of a pair block at cache slot ``slot``: bias, RoPE of Q and K heads (positions ``pos``
    [BLOCK_B], frequencies ``freq`` of the pairs j), q stored, K / V rows appended to the cache."""
    half = D // 2
    b = tl.arange(0, BLOCK_B)
    bmask = b < B
    mask = bmask[:, None] & jmask[None, :]
    rows_lo = head * D + j
    if HAS_BIAS:
        b_layer = bias_ptr + layer64 * (HQ + 2 * HKV) * D
        lo += tl.load(b_layer + rows_lo, mask=jmask, other=0.0).to(tl.float32)[None, :]
        hi += tl.load(b_layer + rows_lo + half, mask=jmask, other=0.0).to(tl.float32)[None, :]
    angle = pos[:, None] * freq[None, :]
    cos = tl.cos(angle)
    sin = tl.sin(angle)
    rotate = head < HQ + HKV
    out_lo = tl.where(rotate, lo * cos - hi * sin, lo)
    out_hi = tl.where(rotate, hi * cos + lo * sin, hi)

    q_off = b[:, None] * (HQ * D) + head * D + j[None, :]
    head_vec = head + tl.zeros_like(j)  # per-lane copy: masks stay tensors
    is_q = (head_vec < HQ)[None, :]
    tl.store(q_ptr + q_off, out_lo, mask=mask & is_q)
    tl.store(q_ptr + q_off + half, out_hi, mask=mask & is_q)
    is_k = ((head_vec >= HQ) & (head_vec < HQ + HKV))[None, :]
    is_v = (head_vec >= HQ + HKV)[None, :]
    kv_head = tl.where(head < HQ + HKV, head - HQ, head - HQ - HKV)
    c_off = (((layer64 * B + b[:, None]) * HKV + kv_head) * S + slot) * D + j[None, :]
    tl.store(k_cache_ptr + c_off, out_lo.to(k_cache_ptr.dtype.element_ty), mask=mask & is_k)
    tl.store(k_cache_ptr + c_off + half, out_hi.to(k_cache_ptr.dtype.element_ty), mask=mask & is_k)
    tl.store(v_cache_ptr + c_off, out_lo.to(v_cache_ptr.dtype.element_ty), mask=mask & is_v)
    tl.store(v_cache_ptr + c_off + half, out_hi.to(v_cache_ptr.dtype.element_ty), mask=mask & is_v)


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer", "S"])
def qkv_rope_kernel(
    layer, x_ptr, fix_ptr, norm_ptr, w_ptr, bias_ptr, inv_freq_ptr, kv_start_ptr, slot_ptr,
    q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, sq_ptr, sem_ptr,
    B, H, HQ, HKV, D, S, eps,
    HAS_BIAS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr, ROW_PREFETCH: tl.constexpr, QKV_SPLIT: tl.constexpr, SQ_LOAD: tl.constexpr,
    X_FIX: tl.constexpr, USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr,
):
    if USE_PDL:
        qkv_prefetch(tl.program_id(0), layer, w_ptr, H, HQ, HKV, D, BLOCK_P, BLOCK_K, QKV_SPLIT, PREFETCH_LINES)
    tl.static_assert(USE_PDL or (ROW_PREFETCH < 2), "ROW_PREFETCH >= 2 is the PDL wait inside the tile")
    if ROW_PREFETCH < 2:  # 2, 3: the tile waits itself, after its first weight loads (matvec._one_row)
        after_previous_kernel(USE_PDL)
    qkv_rope_tile(
        tl.program_id(0), layer, x_ptr, fix_ptr, norm_ptr, w_ptr, bias_ptr, inv_freq_ptr, kv_start_ptr, slot_ptr,
        q_ptr, k_cache_ptr, v_cache_ptr, part_ptr, sq_ptr, sem_ptr, B, H, HQ, HKV, D, S, eps,
        HAS_BIAS, BLOCK_B, BLOCK_P, BLOCK_K, DOT_PREC, ROW_PREFETCH, QKV_SPLIT, SQ_LOAD, X_FIX,
    )
