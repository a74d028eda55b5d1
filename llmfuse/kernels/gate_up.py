"""Instruction 4: RMSNorm → gate and up projections → SiLU(gate) · up.

For a tile of BLOCK_N MLP features n::

    x̂        = x_b / sqrt(mean(x_b²) + eps) · g_mlp
    h[b, n]  = SiLU(x̂ · W_gate[n]) · (x̂ · W_up[n]),   SiLU(z) = z / (1 + e^{−z})

``W_gate_up`` is [2I, H] (gate rows, then up rows).  A tile is (BLOCK_N features, one of
``MLP_SPLIT`` parts of K); with ``MLP_SPLIT > 1`` the last part of a feature block to finish
adds the parts in order and applies SiLU · up (:func:`.matvec.rows_dot_pair_split`).
Bytes: 2 I H weight elements once, x from L2, h written (B I elements, weight dtype).
"""

import triton.language as tl

from fusecore.backend import jit
from fusecore.launch_order import after_previous_kernel, prefetch_rows

from .matvec import k_range, rows_dot_pair_split


@jit
def gate_up_span(tile, layer, w_ptr, H, I, BLOCK_N: tl.constexpr, MLP_SPLIT: tl.constexpr):
    """Tile ``tile``'s features n [BLOCK_N] (masked by n < I; gate rows n, up rows n + I) and layer
    ``layer``'s W_gate_up [2I, H]."""
    n = (tile // MLP_SPLIT) * BLOCK_N + tl.arange(0, BLOCK_N)
    layer64 = tl.full([], 0, tl.int64) + layer
    return n, n < I, w_ptr + layer64 * 2 * I * H


@jit
def gate_up_prefetch(tile, layer, w_ptr, H, I, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MLP_SPLIT: tl.constexpr,
                     PREFETCH_LINES: tl.constexpr):
    """Ask L2 for the first ``PREFETCH_LINES`` lines of tile ``tile``'s gate and up rows (fusecore/launch_order.py)."""
    n, nmask, w_layer = gate_up_span(tile, layer, w_ptr, H, I, BLOCK_N, MLP_SPLIT)
    k_start, k_stop = k_range(tile % MLP_SPLIT, H, MLP_SPLIT, BLOCK_K)
    prefetch_rows(w_layer + n.to(tl.int64) * H, nmask, k_start, k_stop, PREFETCH_LINES)
    prefetch_rows(w_layer + (n + I).to(tl.int64) * H, nmask, k_start, k_stop, PREFETCH_LINES)


@jit
def gate_up_tile(
    tile, layer, x_ptr, norm_ptr, w_ptr, h_ptr, part_ptr, sq_ptr, sem_ptr, B, H, I, eps,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
    ROW_PREFETCH: tl.constexpr, MLP_SPLIT: tl.constexpr, SQ_LOAD: tl.constexpr,
):
    block = tile // MLP_SPLIT
    n, nmask, w_layer = gate_up_span(tile, layer, w_ptr, H, I, BLOCK_N, MLP_SPLIT)
    g_layer = norm_ptr + (tl.full([], 0, tl.int64) + layer) * H
    last, gate, up = rows_dot_pair_split(x_ptr, x_ptr, B, H, eps, g_layer, w_layer, n, n + I, nmask,
                                         tile % MLP_SPLIT, 2 * I, block, part_ptr, sq_ptr, sem_ptr, MLP_SPLIT, BLOCK_B,
                                         BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH, SQ_LOAD, False)
    if last:
        h = gate / (1.0 + tl.exp(-gate)) * up
        b = tl.arange(0, BLOCK_B)
        tl.store(h_ptr + b[:, None] * I + n[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=(b < B)[:, None] & nmask[None, :])


# Sizes that change from call to call are not specialized: one compile serves them all.
@jit(do_not_specialize=["layer"])
def gate_up_kernel(
    layer, x_ptr, norm_ptr, w_ptr, h_ptr, part_ptr, sq_ptr, sem_ptr, B, H, I, eps,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
    ROW_PREFETCH: tl.constexpr, MLP_SPLIT: tl.constexpr, SQ_LOAD: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr,
):
    if USE_PDL:
        gate_up_prefetch(tl.program_id(0), layer, w_ptr, H, I, BLOCK_N, BLOCK_K, MLP_SPLIT, PREFETCH_LINES)
    tl.static_assert(USE_PDL or (ROW_PREFETCH < 2), "ROW_PREFETCH >= 2 is the PDL wait inside the tile")
    if ROW_PREFETCH < 2:  # 2, 3: the tile waits itself, after its first weight loads (matvec._one_row)
        after_previous_kernel(USE_PDL)
    gate_up_tile(tl.program_id(0), layer, x_ptr, norm_ptr, w_ptr, h_ptr, part_ptr, sq_ptr, sem_ptr, B, H, I, eps,
                 BLOCK_B, BLOCK_N, BLOCK_K, DOT_PREC, ROW_PREFETCH, MLP_SPLIT, SQ_LOAD)
