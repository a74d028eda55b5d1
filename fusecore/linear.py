"""A linear map whose bias gradient is summed by a kernel of its own, and that column sum.

``linear(x, weight, bias)`` is ``torch.nn.functional.linear`` — ``y = x Wᵀ + b`` over the last axis of
``x [..., in]`` with ``weight [out, in]``, ``bias [out]`` — with the same forward and the same ``∂x = ∂y W``
and ``∂W = ∂yᵀ x`` (cuBLAS, as torch's own backward), but ``∂b = Σ_n ∂y_n`` from :func:`column_sum`
instead of torch's reduction: for a bfloat16 ``[169 343, 128]`` gradient that reduction ran at 10% of
the H100's DRAM bandwidth (137 µs a bias, Nsight Compute; four of them were a quarter of a Graph
Transformer layer's training step).  Where autograd records nothing, or under ``torch.compile``
(whose own reduction is generated), it is ``F.linear`` itself.

``column_sum(x [R, C])`` is ``x.sum(0)`` in one launch of a Triton kernel: per-program partial
sums over slabs of rows in float32 (float64 for float64 input), then the partials' sum, finished by the
launch's last programs to arrive and stored in the output dtype — deterministic (no atomics), one rounding.  A few rows
(at most :data:`ONE_PASS_ROWS`, as a split product's partials) are summed in one launch over column blocks.

``linears(x, weights, biases)`` is ``tuple(linear(x, w, b) for w, b in zip(weights, biases))`` — maps of
one input, as a layer's query, key, value and skip projections — computed as **one** product with the
weights stacked, ``y = x [W_0; W_1; …]ᵀ + [b_0; b_1; …]``, the outputs returned as column blocks of ``y``
(views ``y[..., a_g : b_g]``, row stride the total width): ``x`` is read once, one launch instead of one per
map, and the backward is one ``∂x`` product, one ``∂W`` product and one bias column sum over the whole
``∂y``.  A consumer that takes the blocks' base ``y`` itself as its autograd input can store every block's
gradient in place into one ``∂y`` (gnnfuse's attention ops do); through the views, autograd gives each block a
zero-filled ``∂y`` of its own and adds them.  The stacking is inside the one autograd Function of the product (no
concatenation nodes), and parameters kept as consecutive blocks of one buffer (:func:`stack_parameters`, as gnnfuse's
layers keep their maps) are read as the stacked weight where they lie: no copy, no launch.  (A grouped Triton launch
writing one tensor per map, ``x`` read once, was measured before this and removed: 122.9 µs for four ``[169 343,
128]`` bfloat16 maps on an H200 against 113.1 for four cuBLAS products and 67.2 for the stacked one.)

**float32 products on the tensor cores.**  For float32 operands ``linear``'s forward (rows 16-byte aligned)
is :func:`product`, a Triton kernel whose products are TF32 tensor-core products in three parts
(:data:`FLOAT32_PRODUCT`, Triton's ``input_precision="tf32x3"``): each operand split into a TF32 part and
a TF32 remainder, ``a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi``, accumulated in float32.  Each product keeps
~21 of float32's 24 mantissa bits (the split and the dropped ``a_lo·b_lo``), so a sum over ``K`` terms
carries about the error float32's own rounding gives it (``tests/fusecore/test_linear.py`` compares both
against float64 on the GPU).  Where the reduction is at most :data:`HELD_MAX_K` deep (a graph layer's input
features), :func:`product_held_kernel` splits each program's column block of ``b`` into its two parts once and holds
them in shared memory while it walks row blocks of ``a`` (13-16% faster at the layers' shapes on the H200; with the
hardware's TF32 split, :data:`HELD_SPLIT`, 15% faster again; since session 30 its remainders' products keep an
accumulator of their own, :data:`HELD_SUMS`, at torch's cuBLAS float32 error); otherwise the row-block or slice
kernels, Triton's tf32x3 per slice.  Kernels of other modules take the same split through
:func:`split_dot` (one product's TF32 parts into a big and a remainder accumulator; two products where one
operand is exact in TF32, a widened 2-byte float: gnnfuse's edge-weight gradient).  torch's float32 product
is cuBLAS on the FP32 units, compute-bound for a graph layer's shapes (four ``[169 343, 128]`` maps: 551 µs on
the H200, where moving the bytes takes ~100).  That is the float32 of torch's default,
``torch.get_float32_matmul_precision() == "highest"``.  Where the user lets torch's own products round to TF32
(``"high"``, ``"medium"``, ``allow_tf32`` or ``fp32_precision = "tf32"``: :func:`torch_allows_tf32`), ``linear``
and ``matmul`` are torch's (cuBLAS's one TF32 product, faster there than :func:`product`'s: :func:`_tf32_is_torchs`),
and :func:`product` itself and the kernels that fuse a product with more work take one TF32 product
(:func:`dot_precision`, :data:`FLOAT32_FOLLOWS_TORCH`), at TF32's error (H200, arxiv-like float32 forwards
under ``"high"`` against the same at ``"highest"``: Graph Transformer 3.0e-4 with cuBLAS's products, GAT 9.6e-4
relative; ``benchmarks/results/H200/gnn-ab-tf32*.s46c*.log``).
The gradients' products (:func:`matmul`) stay torch's unless :data:`BACKWARD_PRODUCTS` is set (measured
slower or equal on the H100, the sweep below; on the H200 in session 26 the Transformer fp32 step's GPU time 2.6%
lower with it — ∂W split over the rows, 369 against cuBLAS's 430 µs — but its host time higher: not the
default).  ``FLOAT32_PRODUCT = None`` keeps torch's everywhere.  The interpreter
computes the same tiles in exact float32 (it has no TF32).  ``∂W = ∂yᵀ x`` sums over the rows: with few
output tiles the rows are split among programs whose float32 partials :func:`column_sum` adds.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
import triton.language as tl
from torch.autograd.function import once_differentiable

from . import backend
from .backend import check_devices, jit, on_kernel_device, reference_enabled
from .device import device_facts, register_cap
from .grid_sync import sum_partials
from .plan import PlanCache, cdiv, next_power_of_2
from .scratch import zeroed

# First stage: [BLOCK_R, BLOCK_C] tiles of COLUMN_TILE elements (32 float32 accumulators a thread at
# COLUMN_WARPS warps), up to COLUMN_BLOCK_MAX columns per program (more: a second grid axis), about
# PROGRAMS_PER_SM programs per multiprocessor.  Until session 48 a second launch summed the partials (at most
# PROGRAMS_PER_SM × SMs rows), FINAL_BLOCK_C columns per program, so that it ran on several multiprocessors — one
# program over 482 × 128 partials took 28 µs on an H100 (ncu, session 11), as long as the first stage; now the
# launch's last programs finish them in two levels (SUM_GROUP below), none reading more than ~32 rows a column,
# and FINAL_BLOCK_C is the narrowest column block of a one-pass sum (ONE_PASS_ROWS).  The two-launch form (4
# programs per multiprocessor) measured (benchmarks core/column_sum, H100, [169 343, 128]): 34.6 µs in bfloat16
# (42% of the copy floor) and 48.9 in float32 (59%), against torch's .sum(0) at 139.8 and 176.1 µs.  The slabs are
# counted per column block since session 37: a wider x (the Transformer's four stacked biases, [169 343, 512], 4
# column blocks) had PROGRAMS_PER_SM slabs per multiprocessor in each block, 1764 programs in two waves; its two sums
# in a bf16 step took 69.4 µs, 55.5 with a quarter of the slabs (H200, kernel times, session 37 call 5; ncu: 2.5
# TB/s, 53% of DRAM).
COLUMN_TILE = 8192
COLUMN_WARPS = 8
COLUMN_BLOCK_MAX = 128
FINAL_BLOCK_C = 16
# The slabs' sums are finished inside the launch by its last programs to arrive (fusecore.grid_sync.sum_partials):
# groups of SUM_GROUP slabs, SUM_TILE partial elements added at a time (a group's 32 rows of 128 columns in one
# round of loads): a launch fewer per sum, 10-50 µs of host time on the GPU machines.  The finishing code holds 80
# registers a thread in the float32 first stage on sm_90 (Triton 3.6; 64 without it), so 4 programs of 8 warps no
# longer fit a multiprocessor: at PROGRAMS_PER_SM 4 the slabs ran in two waves.  H200, GPU time of one sum replayed
# from a CUDA graph (session 49 calls 4-5, `[169 343, C]`, µs; the two-launch form of session 47 first):
#     float32 C = 512   83.2 | one launch, 4 a multiprocessor 146.7, capped at 64 registers 103.0 | 3: 88.4 | 2: 86.6
#     float32 C = 256   47.6 |                                  83.6,                          59.9 | 3: 51.4 | 2: 49.8
#     float32 C = 128   27.6 |                                  51.3,                          37.4 | 3: 32.0 | 2: 30.0
#     bfloat16 C = 128  14.0 |                                  18.5,                          19.0 | 3: 17.1 | 2: 15.5
#     bfloat16 C = 512  53.7 |                                  59.4,                          52.7 | 3: 51.0 | 2: 50.0
# (SUM_TILE 4096 against 2048 and SUM_GROUP 16 against 32 within 0.5 µs.)  So 2 programs a multiprocessor, under the
# register cap that keeps them resident together (128 a thread: no specialisation spills under it, float64 and tiles
# of 8 columns included, with Triton 3.6 or 3.9; tests/fusecore/test_linear.py checks the residency for sm_90).
PROGRAMS_PER_SM = 2
SUM_GROUP = 32
SUM_TILE = 4096
# At most this many rows: one launch, each program all rows of a block of columns (the first stage's slabs would be
# a row each, its partials a copy of x: a split float32 product's 33 × [512, 128] partials took 24 µs in two launches
# on an H200, session 26).
ONE_PASS_ROWS = 64
SUM_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@jit
def column_sum_kernel(x_ptr, out_ptr, R, C, stride_r, rows_per_program, part_ptr, group_ptr, count_ptr, slabs,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, F64: tl.constexpr, FINISH: tl.constexpr = False,
                      GROUP: tl.constexpr = 1, SUM_P: tl.constexpr = 1):
    """``out[p, c] = Σ x[r, c]`` over rows ``r`` of slab ``p`` (``rows_per_program`` rows from
    ``p · rows_per_program``), columns of block ``program_id(1)``; accumulated per tile element (no
    reduction across threads inside the loop), summed once at the end.  With ``FINISH`` the ``slabs`` programs of a
    column block store their sums as partial rows instead (``part``: column block ``b``'s ``[slabs, width]`` from
    ``b · slabs · BLOCK_C``) and the last of them to arrive finish ``out[0, c] = Σ_p`` of them in this launch
    (:func:`fusecore.grid_sync.sum_partials`; ``group``, ``count_ptr``: its first level and counts, per column block
    at ``b · groups · BLOCK_C`` and ``b · (groups + 1)``)."""
    pid = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    offs_c = block * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = offs_c < C
    if F64:
        acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float64)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
    start = pid * rows_per_program
    stop = tl.minimum(start + rows_per_program, R)
    offs_r = tl.arange(0, BLOCK_R)
    for r0 in range(start, stop, BLOCK_R):
        rows = r0 + offs_r
        mask = (rows < stop)[:, None] & c_mask[None, :]
        acc += tl.load(x_ptr + rows[:, None] * stride_r + offs_c[None, :], mask=mask, other=0.0).to(acc.dtype)
    total = tl.sum(acc, axis=0)
    if FINISH:
        width = tl.minimum(C - block * BLOCK_C, BLOCK_C)
        groups = (slabs + GROUP - 1) // GROUP
        part = part_ptr + block * slabs * BLOCK_C
        local = tl.arange(0, BLOCK_C)
        tl.store(part + pid * width + local, total, mask=local < width)
        sum_partials(pid, slabs, part, 1, width, group_ptr + block * groups * BLOCK_C, out_ptr + block * BLOCK_C,
                     count_ptr + block * (groups + 1), GROUP, SUM_P, BLOCK_C)
    else:
        tl.store(out_ptr + pid * C + offs_c, total.to(out_ptr.dtype.element_ty), mask=c_mask)


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A kernel's output buffer (the tests fill it with poison first)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _tiling(rows: int, cols: int, programs: int, block_c_max: int = COLUMN_BLOCK_MAX) -> tuple[int, int, int]:
    """(block_r, block_c, rows_per_program) of a launch of at most about ``programs`` programs in all: slabs of
    ``rows`` per column block, ``programs`` shared among the column blocks (at least one slab each)."""
    block_c = min(block_c_max, next_power_of_2(cols))
    programs = max(1, programs // cdiv(cols, block_c))
    block_r = max(1, min(COLUMN_TILE // block_c, next_power_of_2(cdiv(rows, programs))))
    return block_r, block_c, cdiv(cdiv(rows, programs), block_r) * block_r


def _launch(x: torch.Tensor, out: torch.Tensor, block_r: int, block_c: int, rows_per_program: int,
            finish: tuple | None = None) -> None:
    """One launch of :func:`column_sum_kernel`; ``finish``: ``(part, group, counts, meta)`` of its ``FINISH`` form."""
    rows, cols = x.shape
    slabs = cdiv(rows, rows_per_program)
    part, group, counts, meta = finish or (out, out, out, {})
    column_sum_kernel[(slabs, cdiv(cols, block_c))](
        x, out, rows, cols, x.stride(0), rows_per_program, part, group, counts, slabs,
        BLOCK_R=block_r, BLOCK_C=block_c, F64=x.dtype == torch.float64, num_warps=COLUMN_WARPS, **meta,
    )


def column_sum(x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x.sum(0)`` of a 2-D ``x [R, C]`` (float16/bfloat16/float32/float64; rows may be strided),
    accumulated in float32 (float64 for float64) and returned ``[C]`` in ``out_dtype`` (default
    ``x.dtype``); zeros when ``R == 0``.  Where autograd records (``x`` requires grad), its gradient is
    ``x.sum(0)``'s (:class:`_ColumnSum`)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"column_sum: x must be a 2-D tensor [rows, columns], got {getattr(x, 'shape', x)!r}")
    if x.dtype not in SUM_DTYPES:
        raise ValueError(f"column_sum: x must be one of {SUM_DTYPES}, got {x.dtype}")
    if out_dtype is not None and out_dtype not in SUM_DTYPES:
        raise ValueError(f"column_sum: out_dtype must be None or one of {SUM_DTYPES}, got {out_dtype!r}")
    if x.requires_grad and torch.is_grad_enabled():
        return _ColumnSum.apply(x, out_dtype)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows, cols = x.shape
    if rows == 0 or cols == 0 or reference_enabled():
        return x.sum(0, dtype=acc).to(out_dtype)
    check_devices(x=x)
    if x.stride(1) != 1:
        x = x.contiguous()
    sms = device_facts(x.device).sm_count
    if rows <= ONE_PASS_ROWS:  # column blocks of FINAL_BLOCK_C up to COLUMN_BLOCK_MAX, one per SM or more
        block_c_max = min(COLUMN_BLOCK_MAX, max(FINAL_BLOCK_C, next_power_of_2(cdiv(cols, sms))))
        out = _new((1, cols), out_dtype, x.device)
        _launch(x, out, *_tiling(rows, cols, 1, block_c_max))
        return out[0]
    # slabs of rows per column block, their sums finished by the launch's last programs (SUM_GROUP slabs a group)
    block_r, block_c, rows_per_program = _tiling(rows, cols, PROGRAMS_PER_SM * sms)
    slabs, blocks = cdiv(rows, rows_per_program), cdiv(cols, block_c)
    groups = cdiv(slabs, SUM_GROUP)
    out = _new((1, cols), out_dtype, x.device)
    _launch(x, out, block_r, block_c, rows_per_program, (
        _new((blocks, slabs, block_c), acc, x.device), _new((blocks, groups, block_c), acc, x.device),
        zeroed(None, "column sums", blocks * (groups + 1), torch.int32, x.device),
        {"FINISH": True, "GROUP": SUM_GROUP, "SUM_P": max(1, SUM_TILE // block_c),
         "maxnreg": register_cap(COLUMN_WARPS, PROGRAMS_PER_SM)}))
    return out[0]


class _ColumnSum(torch.autograd.Function):
    """:func:`column_sum` of an ``x`` that requires grad: ``∂x[r, c] = ∂out[c]`` (``x.sum(0)``'s gradient)."""

    @staticmethod
    def forward(ctx, x, out_dtype):  # type: ignore[override]
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return column_sum(x, out_dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad.to(ctx.dtype).expand(ctx.shape), None


# float32 products (module doc): "tf32x3" (Triton's three-part TF32 product), or None for torch's own float32
# product.  Tiles: BLOCK_M × BLOCK_N outputs (BLOCK_N at most the padded width), BLOCK_K-deep slices, PRODUCT_WARPS
# warps, PRODUCT_STAGES slices in flight; the column blocks of one row block are neighbours in the launch order (x
# read once from DRAM).  A product with fewer than SPLIT_TILES_PER_SM output tiles per multiprocessor and a long
# reduction (∂W = ∂yᵀ x over the rows) splits the reduction into slices of at least SPLIT_MIN_K, up to that many
# programs per multiprocessor.  BACKWARD_PRODUCTS: linear's ∂x and ∂W (and :func:`matmul`) through :func:`product`
# too; off, they are torch's.
# H100 sweeps (session 16 calls 2 and 3, tests/fusecore/product_sweep.py, µs, cuBLAS float32 → tf32x3 at its best
# tile, 128 × 64 × 32, 4 warps, 3 stages): [169 343, 128] → 128 157 → 141, → 256 312 → 270, → 512 617 → 530; ∂x
# 512 → 128 517 → 488; ∂W [512, N]@[N, 128] 426 → 383 (split 2, 1024); but rows of 602 float32 (2408 bytes: not
# 16-byte aligned) 418 → 587 at best and their ∂W 808 → 1054 (cuBLAS kept there: :func:`_aligned_rows`); the
# gradients' few-percent gains lost to the layers' steps in call 2's A/B (BACKWARD_PRODUCTS off).  A pre-split form
# (the weight split into TF32 parts once in memory, only ``a`` split in the kernel) was slower at every tile and
# 3-10x less accurate (call 3), and was removed.
FLOAT32_PRODUCT: str | None = "tf32x3"
# Where the user lets torch's own float32 products use TF32 (torch.set_float32_matmul_precision("high"), ...:
# torch_allows_tf32), linear and matmul are torch's (cuBLAS's TF32 product: _tf32_is_torchs) and product and the
# fused kernels take one TF32 product ("tf32") instead of FLOAT32_PRODUCT's three; False keeps FLOAT32_PRODUCT
# whatever torch is set to.
FLOAT32_FOLLOWS_TORCH = True
BACKWARD_PRODUCTS = False
PRODUCT_BLOCK_M = 128
PRODUCT_BLOCK_N = 64
PRODUCT_BLOCK_K = 32
PRODUCT_WARPS = 4
PRODUCT_STAGES = 3
SPLIT_TILES_PER_SM = 2
SPLIT_MIN_K = 1024
# Products not split (ROWS_KERNEL): product_rows_kernel, persistent over row blocks, ROWS_BLOCK_M × ROWS_BLOCK_N
# tiles reduced over PRODUCT_BLOCK_K slices, ROWS_WARPS warps, the flattened loop (ROWS_FLATTEN) ROWS_STAGES slices
# deep, ROWS_PROGRAMS_PER_SM programs per multiprocessor in all (spread over the column blocks).  H100 (session 16
# calls 5-6, b [K, N] row-major): [169 343, 128] → 128 / 256 / 512 and ∂x 512 → 128 in 126 / 239 / 471 / 457 µs
# against 140 / 270 / 527 / 489 for the slice kernel (cuBLAS float32 155 / 307 / 638 / 520); bf16x6 (three
# bfloat16 parts, six products) 117 / 218 / 426 / 402 at errors 1.4-2.0e-7.  In the layers (b = W viewed
# transposed) the two kernels tied (Transformer fp32 forward 986.8 / 986.8 µs, GATv2 581 / 585) and bf16x6 lost
# (1043): the sweep's b layout is not the layers'.  In the layers (call 7, same call) 128 × 128 tiles at 8 warps, one
# program per multiprocessor: GATv2 fp32 forward 584.6 → 577.1 µs, Transformer fp32 985.3 → 964.0 (outputs bitwise
# equal to the 128 × 64 defaults'), hence these defaults; in the sweep's layout that tile lost (189.7 against
# 132.8).  Triton lowers tf32x3 to three wgmma per slice, each waited on before the next, with b split in registers
# and written back to shared memory (ttgir): ~30% of the copy floor.
ROWS_KERNEL = True
ROWS_BLOCK_M = 128
ROWS_BLOCK_N = 128
ROWS_WARPS = 8
ROWS_STAGES = 4
ROWS_FLATTEN = True
ROWS_PROGRAMS_PER_SM = 1
PRECISIONS = ("tf32x3", "bf16x6")  # bf16x6: each operand in three bfloat16 parts, six products (measured above)

# Reductions at most HELD_MAX_K deep (a graph layer's input features) in "tf32x3": product_held_kernel, which splits
# its column block of b into TF32 parts once and holds them in shared memory for every row block it walks (Triton's
# tf32x3 splits b again for every slice, writes both parts back to shared memory and waits on each of the three
# wgmma); a is split in registers.  HELD_BLOCK_M × HELD_BLOCK_N tiles, the reduction in HELD_CHUNK_K-deep chunks
# (at most HELD_MAX_K / HELD_CHUNK_K of them, coded out: a chunk's parts are values, not memory), HELD_WARPS warps,
# HELD_STAGES row blocks' loads in flight, HELD_PROGRAMS_PER_SM programs per multiprocessor in all (one wave: rounded
# down per column block).  Only where the held parts and the pipelined row blocks fit the device's shared memory
# (:func:`held_tiling`).  HELD_SUMS: how the parts' products are summed — the tensor cores' own float32 accumulation
# loses bits that an add on the CUDA cores keeps, so 2 (each chunk's three products from zero, then added: Triton's
# own tf32x3 order) is as accurate as the row-block kernel, 1 (a second accumulator for the remainders' products) as
# torch's cuBLAS float32; summing all three into one accumulator (measured as SUMS 0, removed) was twice that, and
# could not keep an infinite input's remainders (inf · 0) out of its result.  H200, session 25 (call 2; its rows now in
# tests/fusecore/product_sweep.py; b the layers' transposed weight; µs, relative error against float64):
# [169 343, 128] → 128 / 256 / 512 with the defaults 86.4 / 164.5 / 325.9 at 1.9-2.2e-7, against the row-block
# kernel 103.0 / 192.0 / 374.3 (same errors) and
# cuBLAS 157.8 / 289.2 / 631.7 (4.9-5.4e-7); 64 × 128 tiles at 4 warps: SUMS 0 80.4 / 150.5 / 291.4 (1.1e-6),
# SUMS 1 83.9 / 155.5 / 297.3 (5.4-6.2e-7), SUMS 2 129.2 / 238.2 / 448.3 (255 registers: spills).  In the layers
# (replayed, HEAD's row-block kernel in the same calls): Transformer fp32 forward 785.2 against 844.1 µs, GATv2 fp32
# 525.3 against 563.7.  GAT's fused projection (all 128 columns and the node scores in one program) on these parts:
# 140 µs with SUMS 2, 115 with SUMS 1, against its slice kernel's 118 — not taken (session 26's projection keeps each
# program's 64 columns: gnnfuse/kernels/projection.py).  The non-finite guards (:func:`finite_or_zero`, NaN through
# :func:`tf32_parts`) came after these timings and cost 13-15% (session 26, H200, kernel times: 512 columns 378 µs,
# 256 columns 190); the hardware's split (HELD_SPLIT, session 26 call 6) more than took it back: 318 at 512 columns,
# GAT's projection with its scores 94 (its slice kernel 122).  Column blocks of 128 (a's split half as often) were
# slower everywhere (session 27, H100, kernel times: 512 columns 316 µs with 128 × 64 blocks, 530 with 64 × 128, 476
# with 32 × 128 in 4 stages; GATv2's 256 columns 162 against 274; GAT's projection 93 against 150).
HELD_KERNEL = True
HELD_MAX_K = 128
HELD_CHUNK_K = 32
HELD_BLOCK_M = 128
HELD_BLOCK_N = 64
HELD_WARPS = 8
HELD_STAGES = 3
HELD_PROGRAMS_PER_SM = 1
# HELD_SUMS 1 since session 30: at the error of torch's own float32 product (cuBLAS, which the PyG layers use:
# 5.4-6.2e-7 against its 4.9-5.4e-7 relative to float64), and faster (H200, session 30 call 1, same call,
# replayed: arxiv-like GAT fp32 forward 347.3 against 355.5 µs, step 1043.4 against 1049.4; call 4: Transformer fp32
# forward 743.7 against 773.1, step 2307.2 against 2336.5, GATv2 fp32 forward 508.4 against 522.5, step 1830.4
# against 1846.3).  2 stays for callers who want the row-block kernel's 2e-7.
HELD_SUMS = 1  # 1: the remainders' products in an accumulator of their own; 2: per chunk from zero, then added
# The TF32 split of the compiled held kernels (tf32_parts): "cvt", the hardware's conversion (Transformer fp32's
# [169 343, 128] → 512 product on an H200, session 26 call 6: 318 against 379 µs), or "bits", integer operations.
HELD_SPLIT = "cvt"


@jit
def _slices(a_ptr, b_ptr, offs_m, m_mask, offs_n, n_mask, k_start, k_stop, stride_am, stride_ak, stride_bk, stride_bn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """``Σ_k a[offs_m, k] · b[k, offs_n]`` over ``k ∈ [k_start, k_stop)`` in ``BLOCK_K``-deep slices, float32
    ``[BLOCK_M, BLOCK_N]`` (masked rows, columns and reduction tail read as zeros)."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_stop, BLOCK_K):
        k = k0 + offs_k
        k_mask = k < k_stop
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@jit
def product_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, k_per_split,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cs, stride_cm,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr):
    """``c[s, m, n] = Σ_k a[m, k] · b[k, n] (+ bias[n])`` over the reduction slice ``k ∈ [s · k_per_split,
    (s + 1) · k_per_split)`` of split ``s = program_id(2)``; ``a``, ``b`` with any strides, ``c`` float32 with
    unit column stride; output columns of block ``program_id(0)``, rows of block ``program_id(1)``; ``tl.dot`` in
    ``PRECISION`` (module doc)."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1).to(tl.int64)
    pid_s = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_start = pid_s * k_per_split
    k_stop = tl.minimum(k_start + k_per_split, K)
    acc = _slices(a_ptr, b_ptr, offs_m, m_mask, offs_n, n_mask, k_start, k_stop, stride_am, stride_ak, stride_bk,
                  stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    tl.store(c_ptr + pid_s * stride_cs + offs_m[:, None] * stride_cm + offs_n[None, :], acc,
             mask=m_mask[:, None] & n_mask[None, :])


@jit
def product_rows_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, STAGES: tl.constexpr, FLATTEN: tl.constexpr):
    """``c[m, n] = Σ_k a[m, k] · b[k, n] (+ bias[n])``, persistent: program ``(n, p)`` owns column block ``n`` and
    walks row blocks ``p, p + P, …`` (``P = num_programs(1)``), each reduced over ``BLOCK_K``-deep slices; with
    ``FLATTEN`` the compiler flattens the row-block and slice loops into one and pipelines it ``STAGES`` deep, so
    the next row block's loads are in flight while this one's last product and store run (a graph layer's
    reduction, K = 128, is four slices: too short to pipeline on its own)."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    for tile in tl.range(tl.program_id(1), tl.cdiv(M, BLOCK_M), tl.num_programs(1), num_stages=STAGES,
                         flatten=FLATTEN):
        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        m_mask = offs_m < M
        acc = _slices(a_ptr, b_ptr, offs_m, m_mask, offs_n, n_mask, 0, K, stride_am, stride_ak, stride_bk, stride_bn,
                      BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
        if HAS_BIAS:
            acc += bias[None, :]
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


@jit
def tf32_parts(x, CVT: tl.constexpr = False):
    """``(hi, lo)``: ``hi`` = float32 ``x`` rounded to TF32 (10 fraction bits; to nearest, ties away from zero;
    infinities kept, NaN as the quiet NaN ``0x7FC00000``, which the tensor cores, reading 19 bits, still see as NaN),
    ``lo = x - hi`` exactly; the tensor cores read ``hi`` exactly and ``lo`` to 11 significant bits.  ``CVT``: ``hi``
    by the hardware's conversion (``cvt.rna.tf32.f32``, inline PTX, compiled only; the rounding of Triton's own
    tf32x3), ``lo`` NaN where ``x`` is not finite (the held kernels' remainder guard drops it); it rounds the values
    within 2^-11 of the largest float to infinity, and a NaN whose payload lies only in the 13 bits TF32 drops (a
    hand-made signalling NaN: no arithmetic makes one) reads as infinity.  Else by integer operations on the bits,
    which truncate where rounding would overflow and keep every NaN, ``lo`` 0 where ``x`` is not finite.  A select
    per element to keep those NaN too cost the hardware split 10% (session 26: 354 against 318 µs)."""
    if CVT:
        hi = tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,f", [x], dtype=tl.uint32, is_pure=True,
                                       pack=1).to(tl.float32, bitcast=True)
        return hi, x - hi
    bits = x.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    hi = tl.where(magnitude < 0x7F7FF000, (bits + 0x1000) & 0xFFFFE000, bits & 0xFFFFE000)
    hi = tl.where(magnitude > 0x7F800000, 0x7FC00000, hi).to(tl.float32, bitcast=True)
    return hi, tl.where(magnitude < 0x7F800000, x - hi, 0.0)


@jit
def finite_or_zero(x):
    """``x`` where finite, else 0: the remainders' products of an infinite input (``±inf · 0`` is NaN, ``+inf`` and
    ``-inf`` parts cancel to NaN) — its ``hi · hi`` product carries the infinity (or NaN) as torch's product has it."""
    return tl.where(tl.abs(x) < float("inf"), x, 0.0)


@jit
def split_dot(a, b_hi, b_lo, big, small, B_EXACT: tl.constexpr, CVT: tl.constexpr = False):
    """Adds the float32 product ``a @ b`` on the tensor cores at about float32's accuracy to the accumulators ``(big,
    small)``, returned: ``a`` (float32 ``[M, K]``) is split into TF32 parts here (:func:`tf32_parts`), ``b`` comes
    as its parts ``(b_hi, b_lo)`` (``[K, N]``); ``a_hi·b_hi`` goes to ``big`` and the remainders' products ``a_lo·b_hi
    + a_hi·b_lo`` to ``small`` (the order of the held kernels' ``SUMS`` 1).  ``B_EXACT``: ``b`` is exact in TF32
    (a widened float16 / bfloat16, or ``b_hi`` itself), ``b_lo`` is not read and ``a_hi·b_lo`` is left out: two
    products instead of three.  The caller's result is ``big + finite_or_zero(small)`` once, after its last
    product.  Every shape must suit ``tl.dot`` (each dimension >= 16)."""
    a_hi, a_lo = tf32_parts(a, CVT)
    small = tl.dot(a_lo, b_hi, small, input_precision="tf32")
    if not B_EXACT:
        small = tl.dot(a_hi, b_lo, small, input_precision="tf32")
    big = tl.dot(a_hi, b_hi, big, input_precision="tf32")
    return big, small


@jit
def _held_chunk_parts(b_ptr, k0, K, offs_n, n_mask, stride_bk, stride_bn, CHUNK: tl.constexpr, CVT: tl.constexpr):
    """The TF32 parts of ``b[k0 : k0 + CHUNK, offs_n]`` (rows past ``K`` and masked columns zero)."""
    offs_k = k0 + tl.arange(0, CHUNK)
    b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                mask=(offs_k < K)[:, None] & n_mask[None, :], other=0.0)
    return tf32_parts(b, CVT)


@jit
def held_parts(b_ptr, K, offs_n, n_mask, stride_bk, stride_bn, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
               CVT: tl.constexpr = False):
    """The TF32 parts of float32 ``b[:K, offs_n]`` (``K ≤ CHUNKS · CHUNK``, ``CHUNKS`` ≤ 4) for :func:`held_rows`:
    ``(hi_0, lo_0, …, hi_3, lo_3)``, chunk ``j`` rows ``[j · CHUNK, (j + 1) · CHUNK)`` (rows past ``K`` and masked
    columns zero; chunks past ``CHUNKS`` repeat chunk 0 and are never read; ``CVT`` as :func:`tf32_parts`).
    Computed before a loop, the parts stay in shared memory for all of it."""
    hi0, lo0 = _held_chunk_parts(b_ptr, 0, K, offs_n, n_mask, stride_bk, stride_bn, CHUNK, CVT)
    hi1, lo1, hi2, lo2, hi3, lo3 = hi0, lo0, hi0, lo0, hi0, lo0
    if CHUNKS > 1:
        hi1, lo1 = _held_chunk_parts(b_ptr, CHUNK, K, offs_n, n_mask, stride_bk, stride_bn, CHUNK, CVT)
    if CHUNKS > 2:
        hi2, lo2 = _held_chunk_parts(b_ptr, 2 * CHUNK, K, offs_n, n_mask, stride_bk, stride_bn, CHUNK, CVT)
    if CHUNKS > 3:
        hi3, lo3 = _held_chunk_parts(b_ptr, 3 * CHUNK, K, offs_n, n_mask, stride_bk, stride_bn, CHUNK, CVT)
    return hi0, lo0, hi1, lo1, hi2, lo2, hi3, lo3


@jit
def _held_chunk(a_ptr, offs_m, m_mask, k0, K, stride_am, stride_ak, b_hi, b_lo, big, small,
                CHUNK: tl.constexpr, SUMS: tl.constexpr, CVT: tl.constexpr):
    """Adds chunk ``[k0, k0 + CHUNK)`` of ``a[offs_m] @ b`` to the accumulators ``(big, small)``: ``a_hi·b_hi`` to
    ``big`` and the remainders' products ``a_lo·b_hi + a_hi·b_lo`` to ``small`` (``SUMS`` 1), or the chunk's
    remainders' products summed from zero, then its ``a_hi·b_hi`` onto them, then that added to ``big`` (``SUMS`` 2,
    Triton's tf32x3 order); non-finite remainder sums count as 0 (:func:`finite_or_zero`: an infinite input's
    ``inf · 0`` remainders, and the ``+inf`` and ``-inf`` parts of a weight that rounds up, must not reach the
    result).  Measured on an H200 (session 26, Transformer fp32's [169 343, 128] → 512 product, µs): that guard
    costs 22 µs of 349 (without it 327); guarding instead only where ``b`` holds a non-finite element, with ``a``'s
    non-finite elements entering ``a_hi · b_lo`` as 0 (a select per element of ``a``), cost more (393)."""
    offs_k = k0 + tl.arange(0, CHUNK)
    a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak,
                mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)
    if SUMS == 1:
        big, small = split_dot(a, b_hi, b_lo, big, small, False, CVT)
    else:
        a_hi, a_lo = tf32_parts(a, CVT)
        part = tl.dot(a_lo, b_hi, tl.zeros_like(big), input_precision="tf32")
        part = finite_or_zero(tl.dot(a_hi, b_lo, part, input_precision="tf32"))
        big += tl.dot(a_hi, b_hi, part, input_precision="tf32")
    return big, small


@jit
def held_rows(a_ptr, offs_m, m_mask, K, stride_am, stride_ak, hi0, lo0, hi1, lo1, hi2, lo2, hi3, lo3,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
              SUMS: tl.constexpr, CVT: tl.constexpr = False):
    """``a[offs_m, :K] @ b`` as float32 ``[BLOCK_M, BLOCK_N]`` from :func:`held_parts`' parts of ``b``: ``a`` (float32,
    masked rows zero) split into TF32 parts in registers, ``a_hi·b_hi + (a_lo·b_hi + a_hi·b_lo)`` on the tensor
    cores (module doc), ``SUMS`` as :data:`HELD_SUMS`, ``CVT`` as :func:`tf32_parts`."""
    big = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    small = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    big, small = _held_chunk(a_ptr, offs_m, m_mask, 0, K, stride_am, stride_ak, hi0, lo0, big, small, CHUNK, SUMS,
                             CVT)
    if CHUNKS > 1:
        big, small = _held_chunk(a_ptr, offs_m, m_mask, CHUNK, K, stride_am, stride_ak, hi1, lo1, big, small,
                                 CHUNK, SUMS, CVT)
    if CHUNKS > 2:
        big, small = _held_chunk(a_ptr, offs_m, m_mask, 2 * CHUNK, K, stride_am, stride_ak, hi2, lo2, big, small,
                                 CHUNK, SUMS, CVT)
    if CHUNKS > 3:
        big, small = _held_chunk(a_ptr, offs_m, m_mask, 3 * CHUNK, K, stride_am, stride_ak, hi3, lo3, big, small,
                                 CHUNK, SUMS, CVT)
    if SUMS == 1:
        big += finite_or_zero(small)
    return big


@jit
def product_held_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
                        HAS_BIAS: tl.constexpr, STAGES: tl.constexpr, SUMS: tl.constexpr, CVT: tl.constexpr):
    """``c[m, n] = Σ_k a[m, k] · b[k, n] (+ bias[n])`` for ``K ≤ CHUNKS · CHUNK`` (``CHUNKS`` ≤ 4), products in three
    TF32 parts: program ``(n, p)`` splits column block ``n`` of ``b`` into its parts once (:func:`held_parts`, held in
    shared memory across the loop) and walks row blocks ``p, p + P, …`` (``P = num_programs(1)``), ``STAGES`` deep
    (:func:`held_rows`; ``CVT`` as :func:`tf32_parts`)."""
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    hi0, lo0, hi1, lo1, hi2, lo2, hi3, lo3 = held_parts(b_ptr, K, offs_n, n_mask, stride_bk, stride_bn, CHUNK, CHUNKS,
                                                        CVT)
    for tile in tl.range(tl.program_id(1), tl.cdiv(M, BLOCK_M), tl.num_programs(1), num_stages=STAGES):
        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        m_mask = offs_m < M
        acc = held_rows(a_ptr, offs_m, m_mask, K, stride_am, stride_ak, hi0, lo0, hi1, lo1, hi2, lo2, hi3, lo3,
                        BLOCK_M, BLOCK_N, CHUNK, CHUNKS, SUMS, CVT)
        if HAS_BIAS:
            acc += bias[None, :]
        tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :], acc, mask=m_mask[:, None] & n_mask[None, :])


HELD_SPLITS = ("bits", "cvt")


def held_split() -> int:
    """The held kernels' ``CVT`` constexpr: :data:`HELD_SPLIT` where the kernels are compiled (the interpreter runs
    no inline PTX)."""
    if HELD_SPLIT not in HELD_SPLITS:
        raise ValueError(f"fusecore.linear.HELD_SPLIT must be one of {HELD_SPLITS}, got {HELD_SPLIT!r}")
    return 0 if backend.INTERPRET else HELD_SPLITS.index(HELD_SPLIT)


def uses_product(*tensors: torch.Tensor | None) -> bool:
    """Whether products of these float32 tensors run as :func:`product` (:data:`FLOAT32_PRODUCT` set, every
    tensor float32 on a device the kernels run on, not under the reference backend, ``torch.compile`` or
    autocast — whose products of float32 tensors are torch's, in its lower dtype)."""
    if FLOAT32_PRODUCT is None or reference_enabled() or torch.compiler.is_compiling():
        return False
    first = None
    for t in tensors:  # a loop of attribute reads: this runs on every float32 layer call, some twice
        if t is None:
            continue
        if t.dtype != torch.float32 or not on_kernel_device(t):
            return False
        if first is None:
            first = t
    return first is None or not torch.is_autocast_enabled(first.device.type)


def torch_allows_tf32() -> bool:
    """Whether torch's own float32 matrix products may round their operands to TF32: the user's choice through
    ``torch.set_float32_matmul_precision("high")`` (or ``"medium"``), ``torch.backends.cuda.matmul.allow_tf32 =
    True`` or ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` (the global ``torch.backends.fp32_precision``
    shows through the latter).  The newer attribute is read where torch has it: once a program has set the new
    API, reading the legacy flag raises."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    if precision is not None:
        return precision == "tf32"
    return bool(matmul.allow_tf32)


MATMUL_PRECISIONS = ("highest", "high", "medium")  # torch.set_float32_matmul_precision's values


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` (``"highest"``, ``"high"``, ``"medium"``) within, the
    previous setting restored after: a test's or a benchmark's TF32 rows.  In a process that has set torch's newer
    API (``torch.backends.cuda.matmul.fp32_precision``; torch then refuses the legacy calls), that attribute instead:
    ``"ieee"`` for ``"highest"``, else ``"tf32"``."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"float32_matmul_precision: expected one of {MATMUL_PRECISIONS}, got {precision!r}")
    try:
        before = torch.get_float32_matmul_precision()
    except RuntimeError:  # the newer API is in use
        matmul = torch.backends.cuda.matmul
        before = matmul.fp32_precision
        matmul.fp32_precision = "ieee" if precision == "highest" else "tf32"
        try:
            yield
        finally:
            matmul.fp32_precision = before
        return
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def dot_precision(dtype: torch.dtype) -> str:
    """The ``input_precision`` of a kernel's ``tl.dot`` over operands of ``dtype`` where the kernel follows
    :data:`FLOAT32_PRODUCT`: for float32 (callers check :func:`uses_product` first) ``"tf32"`` where torch's own
    products may use TF32 (:func:`torch_allows_tf32`, with :data:`FLOAT32_FOLLOWS_TORCH`), else that setting;
    Triton's default ``"tf32"`` for other dtypes (16-bit operands are exact on the tensor cores whatever it says)."""
    if FLOAT32_PRODUCT is not None and FLOAT32_PRODUCT not in PRECISIONS:
        raise ValueError(f"fusecore.linear.FLOAT32_PRODUCT must be one of {PRECISIONS} or None, "
                         f"got {FLOAT32_PRODUCT!r}")
    if dtype != torch.float32 or FLOAT32_PRODUCT is None:
        return "tf32"
    if FLOAT32_FOLLOWS_TORCH and torch_allows_tf32():
        return "tf32"
    return "tf32x3" if backend.INTERPRET else FLOAT32_PRODUCT  # the interpreter's products are exact anyway


def _aligned_rows(x: torch.Tensor) -> bool:
    """Whether ``x``'s rows are contiguous and start 16 bytes apart from a 16-byte boundary (vector loads): the
    forward products of other inputs stay torch's (module doc's sweep: 602-float rows lost 40%)."""
    return x.stride(-1) == 1 and (x.dim() < 2 or x.stride(-2) % 4 == 0) and x.data_ptr() % 16 == 0


def _splits(tiles: int, k: int, device: torch.device) -> int:
    """How many slices :func:`product` cuts a reduction of length ``k`` into over ``tiles`` output tiles."""
    sms = device_facts(device).sm_count
    if tiles >= SPLIT_TILES_PER_SM * sms or k < 2 * SPLIT_MIN_K:
        return 1
    return max(1, min(cdiv(SPLIT_TILES_PER_SM * sms, tiles), k // SPLIT_MIN_K))


def held_tiling(m: int, k: int, n: int, precision: str, device: torch.device) -> tuple[int, int, int, int, int] | None:
    """``(BLOCK_M, BLOCK_N, CHUNK, CHUNKS, programs)`` of :func:`product_held_kernel` for ``[m, k] @ [k, n]``, or
    None where it does not apply: :data:`HELD_KERNEL` off, not "tf32x3", a reduction deeper than
    :data:`HELD_MAX_K`, or held parts and pipelined row blocks beyond the device's shared memory per block."""
    if HELD_SUMS not in (1, 2):
        raise ValueError(f"fusecore.linear.HELD_SUMS must be 1 or 2, got {HELD_SUMS!r}")
    if not HELD_KERNEL or precision != "tf32x3" or k > HELD_MAX_K:
        return None
    # kept per shape and setting: a layer asks on every call (~10 µs of host time to derive)
    key = (m, k, n, device, HELD_CHUNK_K, HELD_BLOCK_M, HELD_BLOCK_N, HELD_STAGES, HELD_PROGRAMS_PER_SM)
    return _held_tilings.get(key, lambda: _derive_held_tiling(m, k, n, device))


_held_tilings = PlanCache(256)


def _derive_held_tiling(m: int, k: int, n: int, device: torch.device) -> tuple[int, int, int, int, int] | None:
    chunk = max(16, min(HELD_CHUNK_K, next_power_of_2(k)))
    chunks = cdiv(k, chunk)
    if chunks > 4:
        return None
    block_n = max(16, min(HELD_BLOCK_N, next_power_of_2(n)))
    block_m = max(16, min(HELD_BLOCK_M, next_power_of_2(m)))
    facts = device_facts(device)
    depth = chunks * chunk
    # the held parts, the row blocks in flight and the store's staging tile, float32, and 1 KB for barriers
    shared = 4 * (2 * depth * block_n + max(1, HELD_STAGES - 1) * block_m * depth + block_m * block_n) + 1024
    if facts.kind != "cpu" and shared > facts.smem_per_block_bytes:
        return None
    # one wave: programs per column block rounded down (rounded up, the last few would run after the rest)
    programs = min(cdiv(m, block_m), max(1, HELD_PROGRAMS_PER_SM * facts.sm_count // cdiv(n, block_n)))
    return block_m, block_n, chunk, chunks, programs


def product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ bias)`` for float32 ``a [M, K]``, ``b [K, N]`` (any strides: transposed views are read in
    place) and ``bias [N]``: float32 ``[M, N]``, products in :data:`FLOAT32_PRODUCT` precision (module doc).
    A long reduction over few output tiles is split into slices (:func:`_splits`) whose float32 partials
    :func:`column_sum` adds (no atomics: the same result on every run)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and (bias is None or isinstance(bias, torch.Tensor))):
        raise TypeError(f"product: a, b and bias must be tensors (bias may be None), got {type(a).__name__}, "
                        f"{type(b).__name__} and {type(bias).__name__}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"product: expected a [M, K] and b [K, N], got {list(a.shape)} and {list(b.shape)}")
    if bias is not None and tuple(bias.shape) != (b.shape[1],):
        raise ValueError(f"product: bias must have shape [{b.shape[1]}], got {list(bias.shape)}")
    if not uses_product(a, b, bias):
        raise ValueError("product: a, b and bias must be float32 tensors on a device the kernels run on, with "
                         f"FLOAT32_PRODUCT set; got {a.dtype} / {b.dtype} on {a.device} / {b.device}")
    check_devices(a=a, b=b, bias=bias)
    if bias is not None:
        bias = bias.contiguous()  # the kernels read bias[n] at offset n (a strided bias had been read wrong)
    (m, k), n = a.shape, b.shape[1]
    if m == 0 or n == 0 or k == 0:
        out = torch.zeros((m, n), dtype=torch.float32, device=a.device)
        return out if bias is None else out + bias
    precision = dot_precision(torch.float32)
    held = held_tiling(m, k, n, precision, a.device)
    if held is not None:
        block_m, block_n, chunk, chunks, programs = held
        out = _new((m, n), torch.float32, a.device)
        product_held_kernel[(cdiv(n, block_n), programs)](
            a, b, bias, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), n,
            BLOCK_M=block_m, BLOCK_N=block_n, CHUNK=chunk, CHUNKS=chunks, HAS_BIAS=bias is not None,
            STAGES=HELD_STAGES, SUMS=HELD_SUMS, CVT=held_split(), num_warps=HELD_WARPS,
        )
        return out
    block_n = max(16, min(PRODUCT_BLOCK_N, next_power_of_2(n)))
    block_m = max(16, min(PRODUCT_BLOCK_M, next_power_of_2(m)))
    tiles = cdiv(m, block_m) * cdiv(n, block_n)
    splits = _splits(tiles, k, a.device)
    if ROWS_KERNEL and splits == 1:
        block_n = max(16, min(ROWS_BLOCK_N, next_power_of_2(n)))
        block_m = max(16, min(ROWS_BLOCK_M, next_power_of_2(m)))
        column_blocks = cdiv(n, block_n)
        sms = device_facts(a.device).sm_count
        programs = min(cdiv(m, block_m), max(1, ROWS_PROGRAMS_PER_SM * sms // column_blocks))  # one wave
        out = _new((m, n), torch.float32, a.device)
        product_rows_kernel[(column_blocks, programs)](
            a, b, bias, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), n,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=PRODUCT_BLOCK_K, HAS_BIAS=bias is not None,
            PRECISION=precision, STAGES=ROWS_STAGES, FLATTEN=ROWS_FLATTEN, num_warps=ROWS_WARPS,
        )
        return out
    k_per_split = cdiv(cdiv(k, splits), PRODUCT_BLOCK_K) * PRODUCT_BLOCK_K
    splits = cdiv(k, k_per_split)
    out = _new((splits, m, n) if splits > 1 else (m, n), torch.float32, a.device)
    product_kernel[(cdiv(n, block_n), cdiv(m, block_m), splits)](
        a, b, bias if splits == 1 else None, out, m, n, k, k_per_split,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), m * n, n,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=PRODUCT_BLOCK_K, HAS_BIAS=bias is not None and splits == 1,
        PRECISION=precision, num_warps=PRODUCT_WARPS, num_stages=PRODUCT_STAGES,
    )
    if splits == 1:
        return out
    total = column_sum(out.view(splits, m * n)).view(m, n)
    return total if bias is None else total + bias


def _tf32_is_torchs() -> bool:
    """Whether the products :func:`linear` and :func:`matmul` would run as :func:`product` are torch's instead:
    where torch's own float32 products may use TF32 (:func:`torch_allows_tf32`, with :data:`FLOAT32_FOLLOWS_TORCH`),
    cuBLAS's one TF32 product is the faster (session 46, H200, the Graph Transformer fp32 under "high", replayed
    µs: forward 562 / step 1812 with cuBLAS's products, 602 / 1851 with :func:`product`'s "tf32" row-block kernel,
    722 / 2266 at "highest"; ``benchmarks/results/H200/gnn-ab-tf32.s46c3.log``).  Kernels that fuse a product with
    more work (gnnfuse's GAT projection and node scores) keep theirs, in "tf32" (:func:`dot_precision`)."""
    return FLOAT32_FOLLOWS_TORCH and torch_allows_tf32()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of 2-D tensors, a gradient's product: :func:`product` where :data:`BACKWARD_PRODUCTS` is on and
    it applies (:func:`uses_product`: float32; not under TF32, :func:`_tf32_is_torchs`), else torch's."""
    return product(a, b) if BACKWARD_PRODUCTS and uses_product(a, b) and not _tf32_is_torchs() else a @ b


def _takes_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`linear`'s forward runs :func:`product`: float32 (:func:`uses_product`) with 16-byte aligned
    rows (:func:`_aligned_rows`), and not under TF32 (:func:`_tf32_is_torchs`)."""
    return uses_product(x, weight, bias) and _aligned_rows(x) and not _tf32_is_torchs()


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through :func:`product` where :func:`_takes_product`."""
    if not _takes_product(x, weight, bias):
        return F.linear(x, weight, bias)
    if x.dim() == 2:
        return product(x, weight.t(), bias)
    return product(x.reshape(-1, x.shape[-1]), weight.t(), bias).view(*x.shape[:-1], weight.shape[0])


class _Linears(torch.autograd.Function):
    """:func:`linear` of maps' stacked weights, taking the maps' parameters themselves (``x``, the number of maps,
    the weights, then the biases, if any): the stacking (:func:`stacked`: no copy for parameters kept as views of one
    buffer) happens inside, and the backward returns each parameter's gradient as its block of the stacked one, so
    the projections cost autograd this one node, not one more for each concatenation."""

    @staticmethod
    def forward(ctx, x, maps, *params):  # type: ignore[override]
        weight = stacked(params[:maps])
        bias = stacked(params[maps:]) if len(params) > maps else None
        ctx.save_for_backward(x, *params)  # a parameter changed in place before the backward is refused there
        ctx.weight, ctx.maps = weight, maps
        return _forward(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, *params = ctx.saved_tensors
        maps, needs, weight = ctx.maps, ctx.needs_input_grad, ctx.weight
        sizes = [w.shape[0] for w in params[:maps]]
        rows = math.prod(grad.shape[:-1])
        grad2 = grad.reshape(rows, grad.shape[-1])
        grad_x = None
        if needs[0]:
            grad_x = matmul(grad2, weight)
            grad_x = grad_x if grad.dim() == 2 else grad_x.view(*grad.shape[:-1], weight.shape[1])
        grads = [None] * len(params)
        if any(needs[2:2 + maps]):
            grads[:maps] = matmul(grad2.t(), x.reshape(rows, x.shape[-1])).split(sizes)
        if any(needs[2 + maps:]):
            grads[maps:] = column_sum(grad2).split(sizes)
        return grad_x, None, *(g if need else None for g, need in zip(grads, needs[2:]))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _forward(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        rows = math.prod(grad.shape[:-1])  # not -1: a reshape of 0 elements to [-1, 0] is ambiguous
        grad2 = grad.reshape(rows, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = matmul(grad2, weight)
            grad_x = grad_x if grad.dim() == 2 else grad_x.view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            grad_w = matmul(grad2.t(), x.reshape(rows, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = column_sum(grad2)
        return grad_x, grad_w, grad_b


def linears(x: torch.Tensor, weights: Sequence[torch.Tensor],
            biases: Sequence[torch.Tensor | None] | None = None) -> tuple[torch.Tensor, ...]:
    """``tuple(F.linear(x, W_g, b_g) for g)``: maps ``weights[g] [out, in]`` with ``biases[g] [out]`` (or
    None) of one input ``x [..., in]``, outputs ``[..., out_g]`` in ``x``'s dtype.  For two or more maps
    whose weights (and biases: all or none) share a dtype and device, one :func:`linear` of the stacked
    weights, the outputs its column blocks (views with unit column stride and the total width as row
    stride; module doc); else each map is :func:`linear`."""
    for name, value in (("weights", weights), ("biases", biases)):  # a tensor would be iterated as its rows
        if isinstance(value, torch.Tensor):
            raise TypeError(f"linears: {name} must be a list or tuple of tensors"
                            f"{' or None' if name == 'biases' else ''}, got a Tensor of shape {list(value.shape)}")
    weights = tuple(weights)
    biases = tuple(biases) if biases is not None else (None,) * len(weights)
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise ValueError(f"linears: x must be a tensor [..., in], got {getattr(x, 'shape', x)!r}")
    if len(weights) == 0 or len(biases) != len(weights):
        raise ValueError(f"linears: expected one or more weights and as many biases, got {len(weights)} weights "
                         f"and {len(biases)} biases")
    for g, (w, b) in enumerate(zip(weights, biases)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] != x.shape[-1]:
            raise ValueError(f"linears: weights[{g}] must have shape [out, in={x.shape[-1]}], "
                             f"got {list(getattr(w, 'shape', [w]))}")
        if b is not None and (not isinstance(b, torch.Tensor) or tuple(b.shape) != (w.shape[0],)):
            raise ValueError(f"linears: biases[{g}] must have shape [{w.shape[0]}], "
                             f"got {list(getattr(b, 'shape', [b]))}")
    if _stackable(weights, biases):
        sizes = [w.shape[0] for w in weights]
        params = (*weights, *(b for b in biases if b is not None))
        records = torch.is_grad_enabled() and (x.requires_grad or any(t.requires_grad for t in params))
        if (records and x.dtype == params[0].dtype and not torch.compiler.is_compiling()
                and not reference_enabled() and not torch.is_autocast_enabled(x.device.type)):
            return _Linears.apply(x, len(weights), *params).split(sizes, dim=-1)
        join = torch.cat if records else stacked  # recorded (autocast, the reference): autograd's own cat
        bias = None if biases[0] is None else join(biases)
        return linear(x, join(weights), bias).split(sizes, dim=-1)
    return tuple(linear(x, w, b) for w, b in zip(weights, biases))


def stacked(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(tensors)`` along the first axis, without a copy (nor a launch) where the tensors already lie one
    after another in one storage, as the blocks of one buffer of :func:`stack_parameters` do: then a tensor over
    that memory.  Not differentiable: for where autograd records nothing (a :func:`linears` Function's forward, a
    call without gradients)."""
    alias = None if torch.compiler.is_compiling() else _alias(tensors)
    return torch.cat(tensors) if alias is None else alias


def _alias(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One tensor over ``tensors`` (one dtype, device and trailing shape) where they are contiguous and each starts
    where the one before ends within the first one's storage (else None): their concatenation, as it lies.  (~5 µs
    of host time for four weights, a concatenation's launch ~11 on the GPU machines.)"""
    first = tensors[0]
    at, size, rows = first.data_ptr(), first.element_size(), 0
    for t in tensors:
        if t.data_ptr() != at or not t.is_contiguous():
            return None
        at += t.numel() * size
        rows += t.shape[0]
    try:  # within the first one's storage, so the others lie in it too
        return first.detach().as_strided((rows, *first.shape[1:]), first.stride())
    except RuntimeError:  # past its end: neighbouring storages, not one
        return None


def stack_parameters(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """Keep ``tensors`` (parameters of one dtype, device and trailing shape: the weights, or the biases, of the maps
    :func:`linears` computes as one product) as consecutive blocks of one new buffer, their values kept: each one's
    ``.data`` becomes its block (the same Parameter objects, so optimizers, ``state_dict`` and ``load_state_dict``
    see no difference), and :func:`linears` then reads them as one stacked tensor without a copy
    (:func:`stacked`).  Returns the buffer, or None (nothing changed) where the tensors are not all initialized
    tensors of one dtype, device and trailing shape.  Anything that gives a parameter storage of its own later
    (``load_state_dict(assign=True)``, ``copy.deepcopy``, a parametrization) leaves :func:`linears` copying again:
    correct, one launch more a call; modules call this again after ``Module._apply`` (``.to()``, ``.half()``).
    Tensors already stacked so are left as they are."""
    tensors = list(tensors)
    if len(tensors) < 2 or any(isinstance(t, torch.nn.parameter.UninitializedParameter) or not isinstance(
            t, torch.Tensor) for t in tensors):
        return None
    first = tensors[0]
    if len({(t.dtype, t.device, tuple(t.shape[1:])) for t in tensors}) != 1:
        return None
    already = _alias(tensors)
    if already is not None:  # already blocks of one buffer (share_memory() keeps them so): left as they are
        return already
    with torch.no_grad():
        buffer = torch.cat([t.detach().reshape(-1, *first.shape[1:]) for t in tensors])
        start = 0
        for t in tensors:
            t.data = buffer[start:start + t.shape[0]]
            start += t.shape[0]
    return buffer


# linears as one product of the stacked weights (module doc).  H200, [169 343, 128] → 4 × 128 in bfloat16,
# session 14 (CUDA graphs, µs, four products / one): forward 113.5 / 67.2, ∂x 154.1 / 63.4, ∂W 120.2 / 68.1;
# two maps 58.3 / 41.6, 70.9 / 40.5, 65.5 / 47.5; float32, four maps 646.8 / 551.4, 681.0 / 562.9, 518.8 / 436.8
# (benchmarks/results/H200/core-linears-probe.s14c1.log).
STACK_LINEARS = True


def _stackable(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]) -> bool:
    """Whether :func:`linears` computes the maps as one product of stacked weights (:data:`STACK_LINEARS`):
    two or more maps, all with a bias or none, every parameter of one dtype and device."""
    params = [*weights, *(b for b in biases if b is not None)]
    return (STACK_LINEARS and len(weights) > 1 and len({b is None for b in biases}) == 1
            and len({(t.dtype, t.device) for t in params}) == 1)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)`` (``x [..., in]``, ``weight [out, in]``, ``bias
    [out]``, one dtype; returns ``[..., out]``) with the bias gradient from :func:`column_sum` (module
    doc).  A module's forward hooks do not see this call: it takes the parameters, not the module.  Arguments of
    other types, shapes or (outside autocast) dtypes raise TypeError / ValueError naming the argument."""
    if torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    # one expression of attribute reads (a layer calls this every step: ~0.5 µs of host time)
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and len(shape := weight.shape) == 2
            and x.ndim and shape[1] == x.shape[-1]
            and (bias is None or (isinstance(bias, torch.Tensor) and bias.shape == shape[:1]))):
        _refuse_linear(x, weight, bias)
    records = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if reference_enabled() or torch.is_autocast_enabled(x.device.type):
        return F.linear(x, weight, bias)  # autocast: torch's product in autocast's dtype, its own backward
    if weight.dtype != (dtype := x.dtype) or (bias is not None and bias.dtype != dtype):
        _refuse_linear(x, weight, bias)
    if not records:
        return _forward(x, weight, bias)
    if bias is None and not _takes_product(x, weight):
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


def _refuse_linear(x: object, weight: object, bias: object) -> None:
    """Raises the TypeError / ValueError naming what :func:`linear` was given wrong (its checks failed)."""
    for name, value in (("x", x), ("weight", weight)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"linear: {name} must be a torch.Tensor, got {type(value).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"linear: bias must be None or a torch.Tensor, got {type(bias).__name__}")
    if x.dim() == 0:
        raise ValueError(f"linear: x must be a tensor [..., in] of at least one dimension, got shape {list(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"linear: weight must have shape [out, in={x.shape[-1]}], got {list(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"linear: bias must have shape [{weight.shape[0]}], got {list(bias.shape)}")
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None and value.dtype != x.dtype:
            raise TypeError(f"linear: {name} has dtype {str(value.dtype).replace('torch.', '')} but x has "
                            f"{str(x.dtype).replace('torch.', '')}: x, weight and bias must share a dtype")
