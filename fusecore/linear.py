"""A linear map whose bias gradient is summed by a kernel of its own, and that column sum.

``linear(x, weight, bias)`` is ``torch.nn.functional.linear`` — ``y = x Wᵀ + b`` over the last axis of
``x [..., in]`` with ``weight [out, in]``, ``bias [out]`` — with the same forward and the same ``∂x = ∂y W``
and ``∂W = ∂yᵀ x`` (cuBLAS, as torch's own backward), but ``∂b = Σ_n ∂y_n`` from :func:`column_sum`
instead of torch's reduction: for a bfloat16 ``[169 343, 128]`` gradient that reduction ran at 10% of
the H100's DRAM bandwidth (137 µs a bias, Nsight Compute; four of them were a quarter of a Graph
Transformer layer's training step).  Where autograd records nothing, or under ``torch.compile``
(whose own reduction is generated), it is ``F.linear`` itself.

``column_sum(x [R, C])`` is ``x.sum(0)`` in two launches of one Triton kernel: per-program partial
sums over slabs of rows in float32 (float64 for float64 input), written ``[P, C]``, then the
partials' sum, stored in the output dtype — deterministic (no atomics), one rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton.language as tl
from torch.autograd.function import once_differentiable

from .backend import check_devices, jit, reference_enabled
from .device import device_facts
from .plan import cdiv, next_power_of_2

# First stage: [BLOCK_R, BLOCK_C] tiles of COLUMN_TILE elements (32 float32 accumulators a thread at
# COLUMN_WARPS warps), up to COLUMN_BLOCK_MAX columns per program (more: a second grid axis), about
# PROGRAMS_PER_SM programs per multiprocessor.  Second stage (the partials, at most PROGRAMS_PER_SM × SMs
# rows): FINAL_BLOCK_C columns per program, so that it runs on several multiprocessors — one program
# over 482 × 128 partials took 28 µs on an H100 (ncu, session 11), as long as the first stage.  With these
# settings (benchmarks core/column_sum, H100, [169 343, 128]): 34.6 µs in bfloat16 (42% of the copy floor)
# and 48.9 in float32 (59%), against torch's .sum(0) at 139.8 and 176.1 µs.
COLUMN_TILE = 8192
COLUMN_WARPS = 8
COLUMN_BLOCK_MAX = 128
PROGRAMS_PER_SM = 4
FINAL_BLOCK_C = 16
SUM_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@jit
def column_sum_kernel(x_ptr, out_ptr, R, C, stride_r, rows_per_program,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, F64: tl.constexpr):
    """``out[p, c] = Σ x[r, c]`` over rows ``r`` of slab ``p`` (``rows_per_program`` rows from
    ``p · rows_per_program``), columns of block ``program_id(1)``; accumulated per tile element (no
    reduction across threads inside the loop), summed once at the end."""
    pid = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
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
    tl.store(out_ptr + pid * C + offs_c, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=c_mask)


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A kernel's output buffer (the tests fill it with poison first)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _tiling(rows: int, cols: int, programs: int, block_c_max: int = COLUMN_BLOCK_MAX) -> tuple[int, int, int]:
    """(block_r, block_c, rows_per_program) of a launch over ``rows`` in at most ``programs`` slabs."""
    block_c = min(block_c_max, next_power_of_2(cols))
    block_r = max(1, min(COLUMN_TILE // block_c, next_power_of_2(cdiv(rows, programs))))
    return block_r, block_c, cdiv(cdiv(rows, programs), block_r) * block_r


def _launch(x: torch.Tensor, out: torch.Tensor, block_r: int, block_c: int, rows_per_program: int) -> None:
    rows, cols = x.shape
    column_sum_kernel[(cdiv(rows, rows_per_program), cdiv(cols, block_c))](
        x, out, rows, cols, x.stride(0), rows_per_program,
        BLOCK_R=block_r, BLOCK_C=block_c, F64=x.dtype == torch.float64, num_warps=COLUMN_WARPS,
    )


def column_sum(x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x.sum(0)`` of a 2-D ``x [R, C]`` (float16/bfloat16/float32/float64; rows may be strided),
    accumulated in float32 (float64 for float64) and returned ``[C]`` in ``out_dtype`` (default
    ``x.dtype``); zeros when ``R == 0``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"column_sum: x must be a 2-D tensor [rows, columns], got {getattr(x, 'shape', x)!r}")
    if x.dtype not in SUM_DTYPES:
        raise ValueError(f"column_sum: x must be one of {SUM_DTYPES}, got {x.dtype}")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rows, cols = x.shape
    if rows == 0 or cols == 0 or reference_enabled():
        return x.sum(0, dtype=acc).to(out_dtype)
    check_devices(x=x)
    if x.stride(1) != 1:
        x = x.contiguous()
    block_r, block_c, rows_per_program = _tiling(rows, cols, PROGRAMS_PER_SM * device_facts(x.device).sm_count)
    partial = _new((cdiv(rows, rows_per_program), cols), acc, x.device)
    _launch(x, partial, block_r, block_c, rows_per_program)
    out = _new((1, cols), out_dtype, x.device)
    _launch(partial, out, *_tiling(partial.shape[0], cols, 1, FINAL_BLOCK_C))
    return out[0]


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad @ weight
        if ctx.needs_input_grad[1]:
            grad_w = grad2.t() @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = column_sum(grad2)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, weight, bias)`` (``x [..., in]``, ``weight [out, in]``, ``bias
    [out]``, one dtype; returns ``[..., out]``) with the bias gradient from :func:`column_sum` (module
    doc).  A module's forward hooks do not see this call: it takes the parameters, not the module."""
    records = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    if not records or bias is None or torch.compiler.is_compiling() or reference_enabled():
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)
