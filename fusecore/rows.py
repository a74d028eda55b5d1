"""Row gathers and scatters of narrow 2-D tensors — per-edge features and scores, ``[E, C]`` with a few to a few
dozen columns — one Triton kernel each, differentiable.

* ``gather_rows(src [S, C], index [R]) -> [R, C]``: ``out[r] = src[index[r]]`` (``src.index_select(0, index)``);
* ``scatter_rows(src [R, C], index [R], num_rows) -> [num_rows, C]``: ``out[index[r]] = src[r]``, every other row
  zero — the gather's adjoint for an ``index`` that names no row twice.

Why kernels of their own: torch 2.11's ``index_select`` of such rows, and ``gather`` with the index broadcast along
the row (torch sends it to the same kernel), ran its ``vectorized_gather_kernel`` at 714-825 µs for ``[1.35 M, 8]``
and ``[1.35 M, 16]`` float32 rows on the H200 (session 42 call 1, ``benchmarks/results/H200/rows-gather.s42c1.log``)
— the gathered bytes take ~25 µs at the copy rate — and a GAT layer with PyG's ``edge_dim`` made two such gathers in
its forward and four in its training step.  Here one program moves ``BLOCK_R`` whole rows; the width ``C`` is a
compile-time constant, so each row's address is known ``C``-element aligned and its columns load as vectors.

The gradient of a gather scatters (``injective=True``: the callers' indices are permutations of the edges or
subsets of them, so no row is written twice and no zero fill is needed where ``index`` covers every row) or adds
(``injective=False``).  Indices are int32 or int64 and their values are **not** checked (that would cost a device
sync per call): they must lie in ``[0, S)`` (``[0, num_rows)`` for the scatters) — the callers build them from a
graph's own edge arrays.  On a device the kernels do not run on (CPU tensors on a GPU machine), under
:func:`fusecore.backend.use_reference`, and for 1-D tensors (torch's one-dimensional gather is fast) the functions
are torch's own ops.
"""

from __future__ import annotations

import torch
import triton.language as tl
from torch.autograd.function import once_differentiable

from .backend import jit, on_kernel_device, reference_enabled
from .plan import cdiv, next_power_of_2

# Elements one program moves (BLOCK_R rows of the column block rounded up to a power of two) and its warps.
ROWS_TILE = 4096
ROWS_WARPS = 4
INDEX_DTYPES = (torch.int32, torch.int64)


@jit
def move_rows_kernel(src_ptr, index_ptr, out_ptr, R, C: tl.constexpr, SCATTER: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    """For the program's ``BLOCK_R`` rows ``r`` (both tensors row-major, ``C`` columns): ``out[r, :] =
    src[index[r], :]`` (a gather), or ``out[index[r], :] = src[r, :]`` with ``SCATTER``."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    row_mask = rows < R
    indexed = tl.load(index_ptr + rows, mask=row_mask, other=0).to(tl.int64)
    mask = row_mask[:, None] & (cols < C)[None, :]
    if SCATTER:
        src_rows = rows
        out_rows = indexed
    else:
        src_rows = indexed
        out_rows = rows
    values = tl.load(src_ptr + src_rows[:, None] * C + cols[None, :], mask=mask)
    tl.store(out_ptr + out_rows[:, None] * C + cols[None, :], values, mask=mask)


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output buffer every row of which a kernel writes (the tests fill it with poison first)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _check(name: str, src: torch.Tensor, index: torch.Tensor) -> None:
    if not isinstance(src, torch.Tensor) or src.dim() not in (1, 2):
        raise ValueError(f"{name}: src must be a 1-D or 2-D tensor, got {getattr(src, 'shape', src)!r}")
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name}: index must be a 1-D int32 or int64 tensor, got "
                         f"{getattr(index, 'dtype', type(index).__name__)} {list(getattr(index, 'shape', []))}")
    if index.device != src.device:
        raise ValueError(f"{name}: index is on '{index.device}' but src is on '{src.device}'")


def _use_kernel(src: torch.Tensor, rows: int) -> bool:
    return src.dim() == 2 and rows > 0 and src.shape[1] > 0 and on_kernel_device(src) and not reference_enabled()


def _launch(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, rows: int, scatter: bool) -> torch.Tensor:
    cols = src.shape[1]
    block_c = next_power_of_2(cols)
    block_r = max(1, min(ROWS_TILE // block_c, next_power_of_2(rows)))
    move_rows_kernel[(cdiv(rows, block_r),)](src, index, out, rows, C=cols, SCATTER=scatter, BLOCK_R=block_r,
                                             BLOCK_C=block_c, num_warps=ROWS_WARPS)
    return out


def _gather(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    if not _use_kernel(src, index.numel()):
        return src.index_select(0, index)
    src = src.contiguous()
    out = _new((index.numel(), src.shape[1]), src.dtype, src.device)
    return _launch(src, index.contiguous(), out, index.numel(), False)


def _scatter(src: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    shape = (num_rows, *src.shape[1:])
    if not _use_kernel(src, index.numel()):
        return src.new_zeros(shape).index_copy_(0, index.to(torch.int64), src)
    src = src.contiguous()
    if index.numel() == num_rows:  # an injective index of num_rows entries names every row
        out = _new(shape, src.dtype, src.device)
    else:
        out = torch.zeros(shape, dtype=src.dtype, device=src.device)
    return _launch(src, index.contiguous(), out, index.numel(), True)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src, index, injective):  # type: ignore[override]
        ctx.save_for_backward(index)
        ctx.num_rows, ctx.injective = src.shape[0], injective
        return _gather(src, index)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        (index,) = ctx.saved_tensors
        if ctx.injective:
            return _scatter(grad, index, ctx.num_rows), None, None
        return grad.new_zeros((ctx.num_rows, *grad.shape[1:])).index_add_(0, index, grad), None, None


class _ScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src, index, num_rows):  # type: ignore[override]
        ctx.save_for_backward(index)
        return _scatter(src, index, num_rows)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        (index,) = ctx.saved_tensors
        return _gather(grad, index), None, None


def gather_rows(src: torch.Tensor, index: torch.Tensor, injective: bool = True) -> torch.Tensor:
    """``src.index_select(0, index)``: ``[R, C]`` rows ``src[index[r]]`` of ``src [S, C]`` (or ``[S]``),
    differentiable in ``src``.  ``injective``: whether ``index`` names each row at most once (then the gradient is a
    scatter, else an ``index_add``).  ``index``: int32/int64, values in ``[0, S)`` (not checked)."""
    _check("gather_rows", src, index)
    return _GatherRows.apply(src, index, bool(injective))


def scatter_rows(src: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``[num_rows, C]`` zeros with row ``index[r]`` set to ``src[r]`` (``src [R, C]`` or ``[R]``), differentiable in
    ``src`` (the gradient is a gather).  ``index``: int32/int64, values distinct and in ``[0, num_rows)`` (not
    checked)."""
    _check("scatter_rows", src, index)
    if index.numel() != src.shape[0] or index.numel() > num_rows:
        raise ValueError(f"scatter_rows: index must have one entry per row of src ({src.shape[0]}) and at most "
                         f"num_rows={num_rows}, got {index.numel()}")
    return _ScatterRows.apply(src, index, int(num_rows))
