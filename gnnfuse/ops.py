"""Launchers and autograd for the fused attention layers: shapes checked, schedule applied.

Public functions, for users with their own projections (each one autograd op):

* :func:`gat_attention` ``(graph, wh, el, er)`` — GAT given the per-node terms
  ``el = a_l · Wh`` (source side) and ``er = a_r · Wh`` (destination side);
* :func:`gat` ``(graph, wh, attn_l, attn_r)`` — the same with ``el`` / ``er`` computed once per
  node by a kernel, whose backward folds the node scores' gradient into the feature gradient;
* :func:`gatv2` ``(graph, feat_src, feat_dst, attn)`` — GATv2, ``a · LeakyReLU(fs_j + fd_i)``;
* :func:`transformer_attention` ``(graph, q, k, v, edge_attr, edge_weight)`` — the Graph
  Transformer's ``q_i · (k_j + e_ij) / √D`` with edge features projected in registers;
* :func:`agnn` ``(graph, feat, beta)`` — AGNN, ``β cos(h_i, h_j)``.

All run one code path (:class:`AttentionInputs` names the score and its tensors; the
kernels select the score with a constexpr).  Launch sequence of one forward: the light
width classes (one launch for all of them), the medium rows, the super-row pieces and their logsumexp
merge (in training the kernels also store the caller's output, see :func:`_forward_saving`).
Backward: ``δ = <g, out>`` (and an output bias's partial sums), the source pass over the
reverse CSR (light, medium, pieces + sums), the destination pass (light, medium, pieces + sums;
GAT's plain row sums take every light row in one launch) and, for ``gat``, the node-score
epilogue and one reduction of the partial sums.  Small graphs on the GPU use the row kernel
alone: one launch per pass.

Each returns ``out [N, H, D]`` in the dtype of the values and is differentiable in every
tensor argument; nodes without incoming edges get zeros.  Non-finite inputs propagate as in
PyG: a non-finite feature of node ``j`` makes the outputs of ``j``'s receivers non-finite
(for the score inputs, their whole head rows).  Under :func:`fusecore.use_reference` the ops
run :mod:`gnnfuse.reference` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from fusecore import DevicePhiloxStream, PhiloxStream, backend, cdiv, next_power_of_2
from fusecore import linear as linear_module
from fusecore.fast_launch import prepare
from fusecore.linear import column_sum, dot_precision, linear, matmul, uses_product
from fusecore.plan import MIN_DOT
from fusecore.rows import gather_rows, scatter_rows
from fusecore.scratch import zeroed

from .graph import Graph, as_graph
from .kernels.attention_backward import (
    attention_backward_dst_kernel,
    attention_backward_dst_light_kernel,
    attention_backward_src_kernel,
    attention_backward_src_light_kernel,
    row_sum_kernel,
    row_sums_kernel,
)
from .kernels.attention_forward import attention_forward_light_kernel, attention_forward_rows_kernel
from .kernels.attention_weights import attention_weights_kernel
from .kernels.dropout import DROPOUT_DEVICE, DROPOUT_HOST, DROPOUT_OFF
from .kernels.edge_features import (
    edge_attr_grad_kernel,
    edge_terms_kernel,
    edge_weight_grad_kernel,
    gatv2_edge_grad_kernel,
)
from .kernels.merge import lse_merge_kernel, sum_merge_kernel
from .kernels.node_scores import head_dot_kernel, node_scores_backward_kernel, node_scores_kernel
from .kernels.normalize import UNIT_EPS, normalize_kernel
from .kernels.projection import projection_scores_held_kernel, projection_scores_kernel
from .kernels.scores import SCORE_DOT, SCORE_GAT, SCORE_GATV2
from .kernels.tiles import LIGHT_SLOTS, pack_light
from .reference import accumulation_dtype
from .schedule import Buckets, ScheduleOptions

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_PASSES = ("forward", "source", "destination")  # the keys of the per-pass settings below
# The key of the dot score with keys formed from the values (AGNN's cosine, ``keys_from_values``) in the per-score
# tables below (light-launch breaks, float32 warps), apart from the Graph Transformer's dot score (``SCORE_DOT``);
# LIGHT_KINDS: every key they take.
LIGHT_COSINE = max(SCORE_GAT, SCORE_GATV2, SCORE_DOT) + 1
LIGHT_KINDS = (SCORE_GAT, SCORE_GATV2, SCORE_DOT, LIGHT_COSINE)
# The dtypes of the tables kept per float width (4-byte and 2-byte floats).
FLOAT32_DTYPES = (torch.float32,)
TWO_BYTE_DTYPES = (torch.float16, torch.bfloat16)
MERGE_TILE = 4096  # elements of partial results a merge program reads per loop trip
# The same for a merge inside a row kernel (PIECE_MERGE_IN_ROWS): its registers count towards the row kernel's, so a
# smaller tile (sm_90, GAT fp32: a 4096-element tile took the forward row kernel from 69 to 96 registers and the
# pieces' row sums from 64 to 167).
MERGE_TILE_INSIDE = 512
ROW_SUM_MAX_EDGES = 256  # edges per loop trip of the ∂er sum of a medium row or piece (rows only H wide)
ROW_SUM_LIGHT_EDGES = 16  # edge slots per trip of a light row in the ∂er sum of all light rows


def _new_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate a tensor the kernels fill completely (tests replace this with a poisoned fill)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _row_launches(buckets: Buckets, mixed: bool = False, merged: bool = False):
    """(rows, starts, stops, count, pieces) of the row-kernel launches: the medium rows (``pieces`` False) and the
    super pieces (True), or with ``mixed``, where there are both, one launch of the pieces then the medium rows
    (``pieces`` 2, ``Buckets.pieces_then_medium``).  With ``merged`` (the pieces' merge inside their launch,
    :data:`PIECE_MERGE_IN_ROWS`) a launch of pieces alone takes the form 2 too (its partials to the piece buffers,
    the merged rows to the outputs)."""
    rows, starts, stops = buckets.medium
    medium, pieces = rows.numel(), buckets.num_pieces
    if mixed and medium and pieces:
        yield *buckets.pieces_then_medium, pieces + medium, 2
        return
    if medium:
        yield rows, starts, stops, medium, False
    if pieces:
        yield buckets.piece_row, buckets.piece_start, buckets.piece_stop, pieces, 2 if merged else True


# Passes whose split super rows are merged inside the pieces' row-kernel launch, by the last piece of each row to
# finish (a count per super row, zeroed for the call; kernels/merge.py ``last_piece``), instead of in a merge launch
# of their own after it: a launch fewer a pass with super rows ("destination" covers GAT's ∂er row sums too).
# Session 22 (H100, arxiv-like, same call, replayed forward / step µs, on against off): GAT bf16 225.9 / 813 against
# 233.6 / 821, GAT fp32 420.5 / 1218 against 415.5 / 1214 (the one loss), GATv2 bf16 271.3 / 1398 against 279.2 /
# 1430, Transformer bf16 380.0 / 1296 against 389.3 / 1306, with 16 edge features 595.8 / 2580 against 601.9 / 2617.
# With 4096-element merge tiles inside (the separate merge's) the GAT bf16 forward took 282.9 µs: the row kernel's
# registers (69 -> 96 in fp32 on sm_90) cost it occupancy (MERGE_TILE_INSIDE).
PIECE_MERGE_IN_ROWS = {"forward": True, "source": True, "destination": True}
# ... where no row has more pieces than this many trips of the inside merge's tile (MERGE_TILE_INSIDE): one program
# merges a row, a trip at a time, each an L2 round trip, and inside the pieces' launch the last row's merge ends the
# launch.  A pass with a longer row keeps its merge launches (one node of in-degree 10^6: 2110 pieces, 528 trips of 4
# pieces at H·D = 128; the arxiv-like graph's longest row 103 pieces, 26 trips; Reddit-scale's 350, 44 trips).  A guard,
# not a measured win: session 22 (H200, the gat_super_node case, fp32, as called, two runs each) timed that node's
# forward at 0.322 / 0.321 ms with its 528 trips inside and 0.322 / 0.322 with the merge launch.
MERGE_INSIDE_MAX_TRIPS = 64


def _merge_inside(buckets: Buckets, kernel_pass: str, width: int) -> bool:
    """Whether ``kernel_pass`` merges its split rows inside the pieces' launch (:data:`PIECE_MERGE_IN_ROWS`,
    :data:`MERGE_INSIDE_MAX_TRIPS`; ``width``: the widest partial row it merges, in elements)."""
    return PIECE_MERGE_IN_ROWS[kernel_pass] and (
        buckets.max_row_pieces <= MERGE_INSIDE_MAX_TRIPS * _sum_tiles(width, MERGE_TILE_INSIDE)[0])


def _piece_counts(buckets: Buckets, merged: bool, like: torch.Tensor) -> torch.Tensor:
    """The zeroed int32 count per super row of a launch with the merge inside (``like``, never read, otherwise): the
    buckets' buffer for the current stream, which every such launch leaves zeroed (the last piece of a row resets its
    count: ``kernels/merge.py`` ``last_piece``), so no call zeroes it again (:func:`fusecore.scratch.zeroed`)."""
    if not merged:
        return like
    return zeroed(buckets.scratch, "piece counts", buckets.super_rows.numel(), torch.int32, like.device)


# Passes whose row kernel covers the super-row pieces and the medium rows in one launch (the kernels' PIECES=2,
# the pieces first) instead of two: a launch fewer a pass, and the medium rows start while the pieces run.  Session 21
# (H100, arxiv-like, same call, replayed µs, session start against the tree): Graph Transformer bf16 with 16 edge
# features forward 604.6 -> 601.9 (604.7 with these two off in the same tree), training step 2619 -> 2618; without
# edge features forward 393.7 -> 389.0, step 1308.8 -> 1306.1.  The launches a call: forward 4 -> 3, step 16 -> 14
# (host_profile.py; 30-50 µs of host each on that machine); the edge-feature step as called 3118 -> 2991 µs (means of
# four, ±5% host noise).  Call 6 (same call, on against off, replayed forward / step µs): GAT bf16 234.2 / 821 against
# 241.3 / 827, GATv2 bf16 278.9 / 1406 against 281.0 / 1423, AGNN bf16 209.0 / 1131 against 216.1 / 1139, Transformer
# fp32 with edge features 1150 / 4158 against 1176 / 4173; GATv2 fp32 584.6 / 2218 against 577.2 / 2206 (the one loss,
# kept for its launch less).
ROW_LAUNCH_MIXED = {"forward": True, "destination": True}


# Where the compiled row kernels keep per-edge-lane state by default (ScheduleOptions.edge_lanes=None),
# as measured on the H200 (gnn/tiles_reddit, gnn/tiles_arxiv, gnn/lanes_backward, gnn/lanes_gatv2): the
# forward's per-lane online softmax is 1.1-2x faster for GAT and the dot score (2x in bfloat16); for
# GATv2 1.57x in bfloat16 at Reddit scale (5.51 -> 3.52 ms) but 0.96x in float32 (float16 not
# measured); the backward's per-lane sums gain nothing (GAT 0.75x, Transformer 1.01x).  Session 13 (H200,
# same call, replayed forward / step µs), GATv2 float32 with the halved edge blocks of ROW_EDGE_TILES, per-lane
# state on against off: arxiv-like 751.9 / 2265 → 662.5 / 2165, Reddit-scale graph (128 features) 7454 /
# 25176 → 4116 / 21801 — the halved block had doubled the per-trip reductions on long rows (Reddit forward
# 4.25 → 5.06 ms): per-lane state for GATv2 in float32 too.
FORWARD_LANE_SCORES = (SCORE_GAT, SCORE_GATV2, SCORE_DOT)
FORWARD_LANE_SCORES_BF16 = (SCORE_GAT, SCORE_GATV2, SCORE_DOT)
BACKWARD_LANE_SCORES: tuple[int, ...] = ()


def row_kernel_lanes(schedule, score: int, kernel_pass: str, dtype: torch.dtype) -> bool:
    """Whether the row kernel of ``kernel_pass`` ("forward" or "backward") keeps per-lane state for
    ``score`` on features of ``dtype``: the schedule's ``edge_lanes`` when set, else the measured GPU
    default above (under the interpreter, where per-lane state only multiplies the numpy work, the
    per-trip form)."""
    if schedule.edge_lanes is not None:
        return schedule.edge_lanes
    if backend.INTERPRET:
        return False
    if kernel_pass == "forward":
        return score in (FORWARD_LANE_SCORES_BF16 if dtype == torch.bfloat16 else FORWARD_LANE_SCORES)
    return score in BACKWARD_LANE_SCORES


def _dropout_args(dropout_p: float, seed: int | torch.Tensor) -> tuple[float, int]:
    """(keep scale, the kernels' ``DROPOUT`` mode): off, a host ``seed`` int, or ``seed`` the
    int64 device pair of a :class:`fusecore.DevicePhiloxStream` (:mod:`gnnfuse.kernels.dropout`)."""
    if dropout_p <= 0:
        return 1.0, DROPOUT_OFF
    return 1.0 / (1.0 - dropout_p), DROPOUT_DEVICE if isinstance(seed, torch.Tensor) else DROPOUT_HOST


@dataclass(frozen=True)
class AttentionInputs:
    """The tensors of one fused attention call by role (on one device).

    ``score`` is :data:`~gnnfuse.kernels.scores.SCORE_GAT`, ``SCORE_GATV2`` or ``SCORE_DOT``;
    ``src_term`` / ``dst_term`` are the score's two sides (``el`` / ``er`` ``[N, H]``; ``fs`` /
    ``fd``; ``k`` / ``q`` ``[N, H, D]``); ``value`` the aggregated features (``Wh``, ``fs``,
    ``v``); ``attn`` GATv2's ``[H, D]`` vector; ``edge_attr`` ``[E, K]`` (input edge order) and
    ``edge_weight`` ``[K, H, D]``: edge features projected in registers, ``e_p = W_e attr_p``, added to keys and
    values (dot score) or to ``fs_j`` inside GATv2's LeakyReLU (score only, :func:`_gatv2_edges`);
    ``keys_from_values``: the dot score's keys are ``value · src_term`` with ``src_term`` a per-node scale
    ``[N, H]`` (AGNN: one gathered tile per edge instead of two), and the queries ``value · dst_term`` with
    ``dst_term`` a per-node scale ``[N, H]`` too (never stored);
    ``out_add``: ``[H, D]`` or ``[N, H, D]`` added to the output as the forward stores it (a
    layer's bias or root term; in training into a second output, see :func:`_forward_saving`);
    ``edge_factor``: ``[E]`` in CSR order and the accumulation dtype, each edge's attention weight
    multiplied by it after dropout (DGL GATConv's ``edge_weight``, :func:`_edge_factor`);
    ``edge_score``: ``[E, H]`` in CSR order and the accumulation dtype, GAT's per-edge score term
    ``s = LeakyReLU(el_j + er_i + ee_p)`` (PyG GATConv's ``edge_dim``, :func:`_edge_score`; GAT only).

    The ``[N, H, D]`` roles share one row stride (:attr:`feat_stride`), each row's heads and features
    contiguous: separate contiguous tensors, or column blocks of one ``[N, W]`` projection output
    (:func:`_feature_rows`, :func:`_packed_columns`) read in place.
    """

    score: int
    src_term: torch.Tensor
    dst_term: torch.Tensor
    value: torch.Tensor
    attn: torch.Tensor | None = None
    edge_attr: torch.Tensor | None = None
    edge_weight: torch.Tensor | None = None
    negative_slope: float = 0.2
    scale: float = 1.0
    keys_from_values: bool = False
    out_add: torch.Tensor | None = None
    edge_factor: torch.Tensor | None = None
    edge_score: torch.Tensor | None = None

    @property
    def has_edge(self) -> bool:
        return self.edge_attr is not None

    @property
    def edge_dim(self) -> int:
        return 0 if self.edge_attr is None else int(self.edge_attr.shape[1])

    @property
    def feat_stride(self) -> int:
        """The row stride of the ``[N, H, D]`` roles, which the kernels read with one stride."""
        features = [t for t in (self.src_term, self.dst_term, self.value) if t.dim() == 3]
        stride = features[0].stride(0)
        for t in features:
            if not _rows_alike(t) or (t.stride(0) != stride and t.shape[0] > 1):
                raise ValueError(
                    "the [N, H, D] attention inputs must share one row stride with contiguous heads and features, "
                    f"got strides {[tuple(f.stride()) for f in features]}"
                )
        return stride

    def pointers(self) -> tuple[torch.Tensor, ...]:
        """(src_term, dst_term, attn, value, edge_attr, edge_weight) kernel arguments; unused
        roles get a tensor the kernel never reads."""
        unused = self.value  # [N, H, D]: as large as any unused read (attn's H·D elements) at N >= 1
        attn = unused if self.attn is None else self.attn
        attr = unused if self.edge_attr is None else self.edge_attr
        weight = unused if self.edge_weight is None else self.edge_weight
        return self.src_term, self.dst_term, attn, self.value, attr, weight


def _rows_alike(t: torch.Tensor) -> bool:
    """Whether ``t [N, H, D]`` has contiguous heads and features in each row (any row stride)."""
    return t.shape[0] <= 1 or (t.stride(2) == 1 or t.shape[2] == 1) and (t.stride(1) == t.shape[2] or t.shape[1] == 1)


def _feature_rows(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` (``[N, H, D]``) as the kernels read them: unchanged when they already share a row stride
    with contiguous heads and features (column blocks of one projection output, read in place), else
    contiguous copies where needed."""
    if all(_rows_alike(t) for t in tensors) and len({t.stride(0) for t in tensors if t.shape[0] > 1}) <= 1:
        return tensors
    return tuple(t.contiguous() for t in tensors)


def _packed_columns(*views: torch.Tensor | None) -> tuple[torch.Tensor, tuple[int | None, ...]] | None:
    """``(base, column offsets)`` when every given view (None skipped, offset None) is an ``[N, H, D]`` block
    of the columns of one contiguous 2-D tensor ``base [N, W]`` that requires a gradient (a layer's
    projections computed as one product), no two blocks sharing a column; else None.

    An attention Function given ``base`` itself instead of the views returns one ``[N, W]`` gradient with
    the blocks' gradients stored in place, where autograd would otherwise give each view a zero-filled
    ``[N, W]`` gradient of its own and add them up."""
    present = [v for v in views if v is not None]
    if torch.compiler.is_compiling() or not torch.is_grad_enabled() or not present:
        return None
    base = present[0]._base
    if base is None or base.dim() != 2 or not base.is_contiguous() or not base.requires_grad:
        return None
    rows, width = base.shape
    offsets, spans = [], []
    for v in views:
        if v is None:
            offsets.append(None)
            continue
        if v._base is not base or v.dim() != 3 or v.shape[0] != rows or rows < 2:
            return None
        heads, head_dim = v.shape[1], v.shape[2]
        offset = v.storage_offset() - base.storage_offset()
        if v.stride() != (width, head_dim, 1) or not 0 <= offset <= width - heads * head_dim:
            return None
        offsets.append(offset)
        spans.append((offset, offset + heads * head_dim))
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        return None
    return base, tuple(offsets)


def _function_features(heads: int, head_dim: int, views: tuple[torch.Tensor, ...],
                       addend: torch.Tensor | None = None) -> tuple[tuple, tuple | None]:
    """An attention Function's feature arguments and ``packing`` for ``views`` (its ``[N, H, D]`` inputs) and
    a per-node ``addend``: ``((base, None, ...), (H, D, offsets))`` when they are column blocks of one product
    (:func:`_packed_columns`, with the addend if it is one of them too: its offset last, else None), else
    ``(views as the kernels read them, None)``."""
    packed = (_packed_columns(*views, addend) if addend is not None else None) or _packed_columns(*views, None)
    if packed is None:
        return _feature_rows(*views), None
    base, offsets = packed
    return (base,) + (None,) * (len(views) - 1), (heads, head_dim, offsets)


def _column_block(base: torch.Tensor, offset: int, heads: int, head_dim: int) -> torch.Tensor:
    """The ``[N, H, D]`` view of ``base [N, W]``'s columns ``offset : offset + H·D``."""
    return base.as_strided((base.shape[0], heads, head_dim), (base.stride(0), head_dim, 1),
                           base.storage_offset() + offset)


NORMALIZE_EPS = UNIT_EPS.value  # torch.nn.functional.normalize's default eps (AGNN's cosine), one value for all


def _gatv2_edges(inputs: AttentionInputs) -> bool:
    """Whether ``inputs`` are GATv2's with edge features (PyG GATv2Conv's ``edge_dim``): ``e_p`` inside the
    LeakyReLU, so every forward kernel forming the score projects its edges (the light rows in the tile form, the row
    kernels per edge block: never unrolled, :func:`_unrolled`), a training forward stores the scores and LeakyReLU
    slopes the backward reads instead (:func:`_gatv2_saves`), and ``∂attr`` / ``∂W_e`` come from one CSR-order pass
    (:func:`_gatv2_edge_grads`) instead of the dot score's edge terms and per-row sums."""
    return inputs.has_edge and inputs.score == SCORE_GATV2


def _edge_dot(inputs: AttentionInputs, block_h: int, block_d: int) -> bool:
    """Whether the edge projection can be one matrix product per tile of 16 or more edges
    (a head tile of >= 16 elements, not float64); else it runs as K rank-1 updates."""
    return inputs.has_edge and inputs.value.dtype != torch.float64 and block_h * block_d >= MIN_DOT


def _block_k(inputs: AttentionInputs) -> int:
    """The edge-feature tile width: ``K`` padded to a power of two >= 16 (a matrix-product operand)."""
    return max(MIN_DOT, next_power_of_2(inputs.edge_dim))


def _projects(inputs: AttentionInputs, kernel_pass: str) -> bool:
    """Whether ``kernel_pass``'s light kernels project edge features per edge: only the forward's tile form
    does (the unrolled form and the row kernels apply ``W_e`` once per row); the source pass reads the
    per-edge terms of :func:`_edge_terms`, the destination pass sums raw features per row.  Decided per pass, for
    the classes up to :data:`LIGHT_UNROLLED_MAX_WIDTH` (a wider class in the tile form projects as the flags of
    :func:`_edge_flags` ask, within the pass's tile budget).  GATv2 with edge features projects in the forward
    only: a training forward stores its scores and LeakyReLU slopes (:func:`_gatv2_saves`), which the backward reads."""
    return inputs.has_edge and kernel_pass == "forward" and not _unrolled(inputs, kernel_pass)


def _slope_bits(schedule) -> tuple[int, int]:
    """GATv2 with edge features: (bits a word, int32 words an edge) of the LeakyReLU slopes a training forward stores
    per CSR position for the backward (``kernels/edge_features.py`` ``store_slopes``): one bit per element of the
    ``[BLOCK_H, BLOCK_D]`` head tile."""
    width = schedule.block_h * schedule.block_d
    bits = min(32, width)
    return bits, width // bits


def _gatv2_saves(graph: Graph, inputs: AttentionInputs, options: ScheduleOptions | None
                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """GATv2 with edge features, a training forward: ``(scores [E, H]`` in the accumulation dtype, ``slopes [E, W]``
    int32, :func:`_slope_bits`), both in CSR order, which the forward kernels fill (``SAVE``) and the backward reads
    instead of projecting the edges again: the source pass its scores and slopes, the destination pass and the edge
    gradients the slopes.  ``E·H`` floats and ``E·H·D`` bits (1/32 of an ``[E, H, D]`` float32 tensor); None for
    other inputs."""
    if not _gatv2_edges(inputs):
        return None
    _, heads, head_dim = inputs.value.shape
    device = inputs.value.device
    acc = accumulation_dtype(inputs.value.dtype)
    if graph.num_edges == 0:  # no kernel reads or writes them
        return torch.zeros((1, heads), dtype=acc, device=device), torch.zeros((1, 1), dtype=torch.int32, device=device)
    _, words = _slope_bits(graph.schedule(heads, head_dim, inputs.value.dtype, options))
    return (_new_output((graph.num_edges, heads), acc, device),
            _new_output((graph.num_edges, words), torch.int32, device))


# GATv2's edge-feature products of float32 operands (``kernels/edge_features.py`` ``edge_product``), by pass: the
# forward's projection and the edge-gradient pass's ∂attr and Σ attr ⊗ ∂s·c products; 2 on the tensor cores in three
# TF32 parts, 1 full float32 products on the CUDA cores.  H200, arxiv-like, 16 edge features, training step kernel µs
# (session 44 call 2, gnn-gatv2-edge-sweep.s44c2.log): the gradient pass 950.8 (2) against 1958.7 (1) in float32, 937.6
# against 1960.3 in bfloat16 (float32 operands there too); the forward's light kernel 712.8 (2) against 632.7 (1).
GATV2_EDGE_PRODUCT = {"forward": 1, "gradient": 2}


def _edge_flags(inputs: AttentionInputs, block_h: int, block_d: int, edges_per_program: int,
                product_pass: str = "forward") -> dict:
    """BLOCK_K and EDGE_DOT of a launch projecting ``edges_per_program`` edges per tile (GATv2 with edge features:
    :data:`GATV2_EDGE_PRODUCT` of ``product_pass`` for a product)."""
    dot = _edge_dot(inputs, block_h, block_d) and edges_per_program >= MIN_DOT
    if dot and _gatv2_edges(inputs):
        dot = GATV2_EDGE_PRODUCT[product_pass]
    return {"BLOCK_K": _block_k(inputs), "EDGE_DOT": dot}


def _pass_edge_flags(inputs: AttentionInputs, block_h: int, block_d: int, edges_per_program: int,
                     kernel_pass: str) -> dict:
    """The edge-feature constexprs a light launch of ``kernel_pass`` takes: the forward's projection
    (:func:`_edge_flags`), the destination pass's feature width, none for the source pass."""
    if kernel_pass == "forward":
        return _edge_flags(inputs, block_h, block_d, edges_per_program)
    return {"BLOCK_K": _block_k(inputs)} if kernel_pass == "destination" else {}


# The light rows with the edge loop unrolled (kernels/attention_forward.py and attention_backward.py,
# ``UNROLLED``): one [rows, H, D] tile per edge slot (two for GATv2 and the dot score), rows per program as
# for width LIGHT_UNROLLED_ROW_WIDTH whatever the class's width, up to LIGHT_UNROLLED_MAX_ROWS (16 rows of 8
# heads × 16 at the GPU's tiles with one tile a slot, 8 with two).  No barrier and no shared memory (the
# tile form sums its [rows · edges, H, D] tile across warps through shared memory), every gather of the
# program in flight at once.  Which passes and scores (module constants, read at schedule time):
#   forward, session 11 (H100, arxiv-like, same call, replayed forward / training step µs): GAT bf16 298.5 →
#   273.2 (4 rows 330.7, 8 rows 288.6); GAT fp32 at 8 rows 566.5 against 541.0, so GAT float32 keeps the
#   tile form; Graph Transformer bf16 577.5 / 1677 → 538.7 / 1658, fp32 1406 / 3374 → 1375 / 3339; GATv2
#   bf16 439.6 / 1857 → 391.9 / 1830.  AGNN (keys formed from the gathered values; two tiles a slot, 8
#   rows: at 16 it took 255 registers with spills), session 12 (H200, same call): bf16 697.7 / 3152 →
#   283.7 / 2722.
#   backward's source pass (``_src_light_unrolled``) and destination pass (``_dst_light_unrolled``,
#   GATv2 and the dot score), session 12 (H200, same call, replayed training step µs; the tile form was
#   L1-bound, ncu session 11): GAT bf16 885 → 799 (source); Graph Transformer bf16 1492 → 1351 (source)
#   → 1313 (both), fp32 3078 → 2857 (both); GATv2 bf16 1736 → 1742 (source) → 1652 (both), fp32 2888 →
#   2670 (both); GAT fp32 1350 → 1191 (source); AGNN bf16 2722 → 1087, fp32 (forward too) 2486 → 1402.
#   Light rows up to degree 32 (schedule.DEFAULT_LIGHT_MAX=32, a launch break at 32), same call: GAT bf16
#   forward 254.1 → 249.5, step 798 → 796; Graph Transformer bf16 464 → 499, step 1312 → 1360: kept at 16.
#   GATv2's float32 forward unrolled, session 13 (H200, same call, replayed): 873.7 → 843.1 µs, and with the
#   halved row-kernel edge blocks (ROW_EDGE_TILES) 804.2 → 777.1; GAT's float32 forward unrolled 503.7 against
#   503.1 µs, its step 1198.8 against 1206.1: GAT float32 kept the tile form then.  Session 29 (H200, same
#   call, two rounds, replayed µs): GAT's float32 forward unrolled 354.7 / 354.5 against 363.2 / 362.7 (-2.3%), its
#   training step 1051.2 / 1051.5 against 1047.8 / 1048.0 (+0.3%; that forward also stores the output bias's final
#   output): unrolled since.  One form for both keeps a call without autograd bit for bit equal to a recorded one
#   (tests/gnnfuse/test_no_grad.py); the form chosen per final output failed that test.
# Scores unrolled in 2-byte floats: LIGHT_UNROLLED_SCORES (every pass); in float32: per pass,
# LIGHT_UNROLLED_FLOAT32_SCORES.
LIGHT_FORWARD_UNROLLED = True
LIGHT_SOURCE_UNROLLED = True
LIGHT_DESTINATION_UNROLLED = True
LIGHT_UNROLLED_SCORES: tuple[int, ...] = (SCORE_GAT, SCORE_GATV2, SCORE_DOT)
LIGHT_UNROLLED_FLOAT32_SCORES: dict[str, tuple[int, ...]] = {
    "forward": (SCORE_GAT, SCORE_GATV2, SCORE_DOT), "source": (SCORE_GAT, SCORE_GATV2, SCORE_DOT),
    "destination": (SCORE_GATV2, SCORE_DOT),
}
LIGHT_UNROLLED_KEYS_FROM_VALUES = True
LIGHT_UNROLLED_ROW_WIDTH = 2
# rows per program at most, and warps per program (None: the schedule's), by pass.  Session 12 (H200, same
# call, GAT bf16 replayed forward / step µs, default 255 / 799): source pass at 8 rows 808; 8 warps in the
# source pass 898, in the forward and destination passes 287 / 838; 2 warps everywhere 275 / 892.
LIGHT_UNROLLED_MAX_ROWS: dict[str, int] = {"forward": 16, "source": 16, "destination": 16}
# Feature tiles counted per edge slot (rows per program = tile budget // (LIGHT_UNROLLED_ROW_WIDTH · slot
# tiles · H·D)), by pass and score: one for GAT, two for GATv2 and the dot score — and four for GATv2's
# source pass, whose slot holds the destination's term, its LeakyReLU and their gradient terms (150 → 64
# registers on sm_90, Triton 3.6): 4 rows a program instead of 8.  Session 13 (H200, same call,
# replayed, GATv2 bf16): training step 1700 → 1509 µs, forward unchanged.
LIGHT_UNROLLED_SLOT_TILES: dict[str, dict[int, int]] = {
    "forward": {SCORE_GAT: 1, SCORE_GATV2: 2, SCORE_DOT: 2},
    "source": {SCORE_GAT: 1, SCORE_GATV2: 4, SCORE_DOT: 2},
    "destination": {SCORE_GAT: 1, SCORE_GATV2: 2, SCORE_DOT: 2},
}
LIGHT_UNROLLED_WARPS: dict[str, int | None] = {"forward": None, "source": None, "destination": None}
# ... and where LIGHT_UNROLLED_WARPS leaves a pass unset, on 4-byte floats, by score kind (:data:`LIGHT_KINDS`).
# Session 32 (H200, arxiv-like, same call, one round, replayed forward / step µs): the forward's unrolled light rows
# with 8 warps a program: GATv2 fp32 464.4 / 1777.1 against 500.2-500.7 / 1811.6-1812.0 with 4 (2 warps: 564.9 /
# 1875.2), Graph Transformer fp32 723.7 / 2225.6 against 745.0 / 2241.2.  Session 33 (call 2, same call, one round,
# replayed forward / step µs, each against the same row's defaults): AGNN fp32 forward at 8 261.2 / 1271.8 against
# 270.9 / 1281.4, its source pass at 8 271.0 / 1151.7; GATv2 fp32 destination pass at 8 437.9 / 1660.9 against 438.1 /
# 1748.4 (its widest class at 4 warps: 187 registers, 8 resident warps per multiprocessor; at 8: 71 and 24, sm_90,
# Triton 3.6); the Transformer fp32 source pass at 8 723.9 / 2178.4 against 724.4 / 2223.3.  GAT fp32 lost with 8:
# forward 401.4 / 1085.4, source pass 345.7 / 1229.2, against 346.4 / 1035.9.
LIGHT_UNROLLED_FLOAT32_WARPS: dict[str, dict[int, int]] = {
    "forward": {SCORE_GATV2: 8, SCORE_DOT: 8, LIGHT_COSINE: 8},
    "source": {SCORE_DOT: 8, LIGHT_COSINE: 8},
    "destination": {SCORE_GATV2: 8},
}
# ... and on 2-byte floats (float16, bfloat16), by score kind.  Their 4-warp light kernels hold <= 96 registers (>= 20
# resident warps per multiprocessor, sm_90, Triton 3.6), and 8 warps lost almost everywhere (session 33, call 4, same
# call, one round, replayed step µs against each row's defaults): GAT's source pass 991.2 against 714.8, GATv2's
# destination pass 1145.9 against 1128.2, the Transformer's source pass 1214.0 against 1110.1, AGNN's forward pass
# 231.4 against 191.4 µs of forward.  AGNN's source pass alone at 8 (session 34, call 1, same call): step 968.9 against
# 1012.6, forward unchanged (191.8 / 191.4).
LIGHT_UNROLLED_TWO_BYTE_WARPS: dict[str, dict[int, int]] = {
    "forward": {}, "source": {LIGHT_COSINE: 8}, "destination": {},
}
# With edge features the forward's light rows keep the tile form (every edge's features projected on the tensor cores,
# one class a launch) unless this is set: then they run unrolled too (the rows' u = W q̃ once, per slot K·H products
# for the score and the feature sums A, Σ_k A W once per row).  Not the default: slower.  Session 19: with the K steps
# unrolled, 112 registers against 53-64 and ~130 s to compile per specialisation (not timed).  Session 45 (H200,
# arxiv-like, 16 edge features, same call, replayed forward / step µs, gnn-ab-tredge-unrolled-forward.s45c1.log):
# bf16 tile form 558.4 / 2311.3, unrolled with one whole-tile product (EDGE_FORM 2) 794.7 / 2527.3, with a K loop (0)
# 1362.5 / 3106.1; fp32 975.6 / 3653.3 against 1361.1 / 4017.1 (2).
LIGHT_FORWARD_UNROLLED_WITH_EDGES = False
# ... and then how their rows' u = W q̃ and Σ_k A[k] W[k] meet W (``EDGE_FORM``, kernels/edge_features.py
# ``rows_edge_terms``): 1 the K steps unrolled (the ~130 s compiles above), 0 a loop over K (sm_90: 147 registers in
# bf16, 116 in fp32), 2 one product with the whole [K, H, D] tile (96; 76 / 64 at 8 warps; ~20 s a compile).
LIGHT_UNROLLED_EDGE_FORM = 1
# With edge features the destination pass's light rows keep the tile form (all of a program's edges at once, their
# feature sums reduced per row) unless this is set.  Session 18 (H100, arxiv-like, 16 edge features, same call,
# replayed training step µs): tile form 2744 (bf16) / 4350 (fp32) against 2998 / 4572 unrolled, and against
# 2916 / 4842 for session 18's earlier tree whose destination pass still projected every edge; unrolled with the
# rows' sums not counted in the rows per program 3013.
LIGHT_DESTINATION_UNROLLED_WITH_EDGES = False
# ... and a register cap per thread (ptxas ``maxnreg``) per pass and score kind (:data:`LIGHT_KINDS`), in 2-byte floats
# (absent: ptxas's choice), trading registers for resident warps.  The GAT bf16 source pass (113 registers, 24%
# occupancy, 260 µs of the step, ncu session 11) at 96, session 14 (H200, same call, replayed forward / step µs): 248.6
# / 792.6 → 247.7 / 772.0 (it then keeps 8-16 bytes a thread in local memory, Triton 3.6's ptxas); GATv2 bf16's source
# pass at 96 lost, 278.2 / 1290 → 277.9 / 1554.  AGNN bf16's source pass (48 registers, 40 resident warps) at 40 (48
# warps; 24 bytes spilled, sm_90, Triton 3.6), session 52 (call 2, H200, one process, two rounds, replayed step µs,
# gnn-ab-source-register-caps.s52c2.log): 880.2 / 881.3 → 863.4 / 862.1.  The Graph Transformer bf16's (4 warps, 76
# registers, 24 resident warps) at 64 (32 warps; 56 bytes spilled), call 4 (gnn-ab-transformer-caps.s52c4.log): 1086.8
# / 1086.4 → 1053.0 / 1052.6.  These caps are not applied with edge features: the Transformer bf16's source pass with 16
# of them spills 120 bytes at 64 (sm_90, Triton 3.6), not timed.
LIGHT_UNROLLED_MAXNREG: dict[str, dict[int, int]] = {"forward": {},
                                                     "source": {SCORE_GAT: 96, SCORE_DOT: 64, LIGHT_COSINE: 40},
                                                     "destination": {}}
# ... and in 4-byte floats (absent: ptxas's choice).  GAT fp32's source light kernel (a third of its step, 118
# registers, 16 resident warps per multiprocessor) capped at 96 spilled 88 bytes a thread and ran the step slower,
# 1053 against 1042 µs replayed (session 35, call 1, two rounds).  AGNN's (8 warps, 62 registers, 32 resident warps
# per multiprocessor; sm_90, Triton 3.6) at 48 holds 40 without spilling: session 52 (call 1, H200, arxiv-like, one
# process, two rounds, replayed step µs, gnn-ab-agnn-register-caps.s52c1.log) 1015.0 / 1014.7 against 1064.8 / 1065.0;
# call 2 (gnn-ab-source-register-caps.s52c2.log) 1013.1 / 1013.9 against 1063.7 / 1066.3, and at 40 (56 bytes
# spilled, 48 warps) 1043.0 / 1042.9.  The Graph Transformer's (the dot score; 8 warps, 56 registers, 32 warps) at 48
# (40 warps, no spill), same call: 2125.0 / 2125.0 against 2176.9 / 2175.3.  GATv2's (4 warps, 56 registers, 36 warps)
# at 48 (40 warps, 24 bytes spilled) lost: 1596.4 / 1594.7 against 1587.1 / 1588.4.  With 16 edge features the
# Transformer's (64 registers, 32 warps) at 48 (40 warps, 16 bytes spilled), call 4 (gnn-ab-transformer-caps.s52c4.log):
# 3501.9 / 3502.0 against 3538.1 / 3537.4.  Same call, not kept: its forward row kernel at ROW_MAXNREG 96 (103 → 96
# registers, 16 → 20 warps, 16 bytes spilled) 2113.1 / 2111.8 against 2120.9 / 2121.3, at 8 warps 2118.1 / 2118.5.
# Call 1, not kept: AGNN's destination light kernel at 48 (56 → 48 registers, 36 → 40 warps) 1060.9 / 1061.3, at 40
# (8 bytes spilled, 48 warps) 1064.6 / 1061.7; its destination row kernel at 64 (ROW_MAXNREG; 72 → 64, 28 → 32 warps)
# 1072.7 / 1074.2, at 8 warps 1194.4 / 1191.7; its forward row kernel at 8 warps 1132.4 / 1132.2 (forward 327.6
# against 262.3).
LIGHT_UNROLLED_FLOAT32_MAXNREG: dict[str, dict[int, int]] = {"forward": {}, "source": {SCORE_DOT: 48, LIGHT_COSINE: 48},
                                                             "destination": {}}
# Both tables' caps hold for head tiles (BLOCK_H · BLOCK_D) up to this wide, the widths they were measured at (128 and
# 64): a wider tile needs more registers a thread (AGNN fp32 on Cora's 1433 features, a 2048-wide tile: 80 registers,
# 96 bytes spilled at 48; sm_90, Triton 3.6), so it keeps ptxas's choice.
LIGHT_UNROLLED_MAXNREG_MAX_WIDTH = 128
# The widest light class that runs unrolled; wider classes (reachable only through ScheduleOptions: the defaults'
# widest is schedule.DENSE_LIGHT_MAX, 32) keep the tile form, in a launch of their own.  Unrolled, a width-64
# class is 64 gathers of [rows, H, D] per program in straight-line code: the Graph Transformer's width-64 light
# forward had not compiled for sm_90 after 10 minutes on a CPU machine (session 23), and the three compiled
# tests reaching it took 233-332 s each on the H200 machine.
LIGHT_UNROLLED_MAX_WIDTH = 32


def _unrolled(inputs: AttentionInputs, kernel_pass: str, width: int | None = None) -> bool:
    """Whether ``kernel_pass``'s light rows (of class ``width``; None: of the classes up to
    :data:`LIGHT_UNROLLED_MAX_WIDTH`) run with the edge slots unrolled (module constants above)."""
    if width is not None and width > LIGHT_UNROLLED_MAX_WIDTH or _gatv2_edges(inputs):
        return False
    dtype = inputs.value.dtype
    switched = {"forward": LIGHT_FORWARD_UNROLLED, "source": LIGHT_SOURCE_UNROLLED,
                "destination": LIGHT_DESTINATION_UNROLLED}[kernel_pass]
    if not switched:
        return False
    if inputs.has_edge and not {"forward": LIGHT_FORWARD_UNROLLED_WITH_EDGES, "source": True,
                                "destination": LIGHT_DESTINATION_UNROLLED_WITH_EDGES}[kernel_pass]:
        return False
    if inputs.keys_from_values and not LIGHT_UNROLLED_KEYS_FROM_VALUES:
        return False
    if dtype in TWO_BYTE_DTYPES:
        return inputs.score in LIGHT_UNROLLED_SCORES
    return dtype == torch.float32 and inputs.score in LIGHT_UNROLLED_FLOAT32_SCORES[kernel_pass]


def _light_rows(schedule, inputs: AttentionInputs, width: int, light_tiles: int, kernel_pass: str) -> int:
    """Light rows of ``width`` edges per program: a tile near the budget, and with edge features
    at least 16 edges per program, so the projection is a matrix product (``K`` rank-1 updates
    gather each feature column separately: many times the load instructions of the product).
    Unrolled (:func:`_unrolled`): the rows of width :data:`LIGHT_UNROLLED_ROW_WIDTH` for every width."""
    if _unrolled(inputs, kernel_pass, width):
        # tiles a slot holds: forward, keys and values (dot; AGNN's keys scaled from the values, at 16
        # rows 255 registers with spills on sm_90, Triton 3.9), the source term and its LeakyReLU against the row's
        # (GATv2), one (GAT); source pass, g and (GATv2, dot) the destination's term, whose gradient terms
        # add into the row's sums; destination pass, the source's key (or term) and its gradient term (at
        # 16 rows, 168 / 255 registers for dot / GATv2 on sm_90 with Triton 3.9: 8 rows)
        row_elements = LIGHT_UNROLLED_SLOT_TILES[kernel_pass][inputs.score] * schedule.block_h * schedule.block_d
        if inputs.has_edge and kernel_pass != "source":
            # the rows' edge-feature terms: u and A (forward), the sums A, B (destination)
            row_elements += 2 * schedule.block_h * _block_k(inputs)
        tiles = schedule.tiles
        most = max(tiles.max_light_rows, LIGHT_UNROLLED_MAX_ROWS[kernel_pass])
        rows = max(1, min(most, tiles.tile_elements // (LIGHT_UNROLLED_ROW_WIDTH * row_elements)))
        return 1 << (rows.bit_length() - 1)  # a power of two (tl.arange)
    rows = schedule.light_rows_per_program(width, light_tiles * schedule.block_h * schedule.block_d)
    if _projects(inputs, kernel_pass) and _edge_dot(inputs, schedule.block_h, schedule.block_d):
        rows = max(rows, MIN_DOT // width)
    return rows


# Feature tiles held at once per edge slot, by pass and score (before edge features): a light
# program (the row's own terms per edge too) ...
LIGHT_TILES = {
    "forward": {SCORE_GAT: 1, SCORE_GATV2: 2, SCORE_DOT: 3},
    "source": {SCORE_GAT: 2, SCORE_GATV2: 3, SCORE_DOT: 4},
    "destination": {SCORE_GAT: 1, SCORE_GATV2: 2, SCORE_DOT: 2},
}
# ... and the row kernel, which keeps the row's own terms once, so only per-edge tiles count there.
# GATv2's counted twice what they were before session 13, halving its edge blocks (16 / 8 / 16 edges;
# registers on sm_90 168 / 168 / 236 → 80 / 96 / 95, Triton 3.6).  Same call (H200, arxiv-like, replayed
# forward / training step µs): bf16 368.4 / 1700 → 327.0 / 1551, fp32 873.7 / 2685 → 804.2 / 2561.  The
# same halving for GAT's backward (802.5 against 807.7 µs a step) and the Transformer's (bf16 1350 against
# 1341, fp32 2875 against 2873) was within noise: not taken.
ROW_EDGE_TILES = {
    "forward": {SCORE_GAT: 1, SCORE_GATV2: 2, SCORE_DOT: 2},
    "source": {SCORE_GAT: 1, SCORE_GATV2: 4, SCORE_DOT: 2},
    "destination": {SCORE_GAT: 1, SCORE_GATV2: 2, SCORE_DOT: 1},
}

# ... and at most this many edges a block on the GPU, by pass and score (absent: no cap).  A medium row is a
# chain of dependent round trips (its range, the first indices, each block's gathers, the lane merge, the
# stores): bound by rows in flight more than by bytes per trip, so a short block (fewer registers, more
# resident programs, less masked waste on rows of a few dozen edges) wins.  Nsight Compute (session 15, H200,
# GAT bf16 forward on the Reddit-scale graph, 4 heads x 16: 230 640 medium rows of median in-degree 39): the
# row kernel at 64-edge blocks took 2.72 ms at 124 registers, 25% occupancy, 24% of DRAM bandwidth.  Same-call
# A/B (session 15, H200, replayed forward / training step µs, against no cap; `tests/gnnfuse/ab_layers.py`):
# Reddit-scale GAT bf16 2343 / 10 586 -> 1575 / 5060 (source pass at 16 edges: 5142), fp32 2533 / 9517 -> 2196 /
# 7658; Graph Transformer bf16 2493 / 12 681 -> 2113 / 7676 (destination at 32: 8051, at 8: 7817; source at 16:
# 7920), fp32 4564 / 15 810 -> 4098 / 11 874; GATv2 bf16 1980 / 10 275 -> 1469 / 8248 (destination at 32: 9166),
# fp32 2829 / 13 254 -> 2438 / 10 529; arxiv-like (8 x 16) GAT bf16 258.7 / 777.7 -> 223.3 / 739.7, fp32 488.8 /
# 1169 -> 453.0 / 1134, the others within 1%.  Their blocks before the cap: 64 edges (GAT) and 32 at Reddit
# scale, 32 and 16 on arxiv-like.
ROW_MAX_EDGES: dict[str, dict[int, int]] = {
    "forward": {SCORE_GAT: 16, SCORE_GATV2: 16, SCORE_DOT: 16},
    "source": {SCORE_GAT: 8, SCORE_GATV2: 8, SCORE_DOT: 8},
    "destination": {SCORE_GAT: 16, SCORE_GATV2: 16, SCORE_DOT: 16},
}
# AGNN (the dot score with keys from values, one 128-wide head on arxiv-like) keeps its destination pass's
# 32-edge blocks: capped at 16 its training step went 1016 -> 1095 µs in bf16 and 1318 -> 1418 in fp32 (same call).
ROW_MAX_EDGES_KEYS_FROM_VALUES: dict[str, int | None] = {"forward": 16, "source": 8, "destination": None}


def gpu_row_max_edges(inputs: AttentionInputs, kernel_pass: str) -> int | None:
    """The GPU's row-kernel edge-block cap for ``kernel_pass`` (the tables above; None: no cap)."""
    if inputs.keys_from_values:
        return ROW_MAX_EDGES_KEYS_FROM_VALUES[kernel_pass]
    return ROW_MAX_EDGES[kernel_pass].get(inputs.score)


def row_max_edges(inputs: AttentionInputs, kernel_pass: str) -> int | None:
    """:func:`gpu_row_max_edges`, but never under the interpreter, whose larger blocks are what keeps the
    CPU path usable."""
    return None if backend.INTERPRET else gpu_row_max_edges(inputs, kernel_pass)


# The forward row kernel for these scores loads each edge block's source indices one trip ahead
# (``PREFETCH``): the trip's key and value gathers (which the compiler already issues together) then
# wait on no index load of their own.  Nsight Compute (session 13, H200, bf16): the Transformer's medium
# rows take 169 µs of its 482 µs forward, stalled on L1TEX scoreboard 73% of the time at 20% of DRAM
# bandwidth; GAT's 93 µs.  Same call (H200, arxiv-like, replayed forward / training step µs): Transformer
# bf16 471.9 / 1319 → 447.6 / 1296, GAT bf16 253.7 / 797 → 248.4 / 792; the next call, GATv2 bf16 327.8 /
# 1373 → 294.2 / 1340.  AGNN's dot score takes it too (not timed apart).
ROW_PREFETCH_SCORES: tuple[int, ...] = (SCORE_GAT, SCORE_GATV2, SCORE_DOT)
# ... and for these (without edge features) the gathers too, a trip ahead (``PREFETCH`` 2: two trips of
# gathers in flight per program, for their registers: the Transformer bf16's 64 → 80 on sm_90).  Session 13
# (H200, same call, replayed forward / step µs): Transformer bf16 439.3 / 1287 → 382.7 / 1227, GATv2 bf16
# 289.7 / 1336 → 278.3 / 1329, Transformer fp32 (with the backward's prefetch below) 1278 / 2865 → 1114 /
# 2699, AGNN bf16 (the same) 273.5 / 1077 → 249.9 / 1026; GAT bf16 248.0 / 793 → 257.6 / 803: not GAT.
ROW_PREFETCH_GATHER_SCORES: tuple[int, ...] = (SCORE_GATV2, SCORE_DOT)
# ... with edge features too (the trip's edge ids and features still loaded in the trip; 90-96 registers on sm_90
# against 72-80).  Session 19 (H100, arxiv-like, same call, replayed forward / step µs): bf16 768 / 2776 -> 719 /
# 2729, fp32 1256 / 4317 -> 1255 / 4333 (within noise).
ROW_PREFETCH_GATHERS_WITH_EDGES = True


# The backward's row kernels (source and destination passes) for these scores load each edge block's
# indices one trip ahead, as the forward's.  Same call, training step µs: GATv2 bf16 1336 → 1319,
# Transformer bf16 1287 → 1282, GAT bf16 793 → 793 (not taken for GAT).
ROW_BACKWARD_PREFETCH_SCORES: tuple[int, ...] = (SCORE_GATV2, SCORE_DOT)


# The row kernels' warps per program and register cap (ptxas ``maxnreg``), per pass (None / absent: the
# schedule's warps, ptxas's choice).  A medium row is a chain of dependent round trips, so the kernel's
# throughput follows the programs resident per multiprocessor (session 17: a persistent grid of 8 programs per
# multiprocessor walking the rows, each loading the next row's range and first ids ahead, ran the Reddit-scale
# GAT bf16 forward in 2167 µs and at 4 per multiprocessor in 3126, against 1604 with one program per row at 48
# registers, ~10 resident; H100, same call).  Nor did more resident programs help (session 17, H100, same call,
# Reddit-scale forward µs replayed, against 1591-1607 for GAT bf16 at 48 registers / 40 warps per multiprocessor):
# capped at 40 registers (48 warps) 1678, at 32 (64 warps, 32 bytes spilled) 1857, 8 warps a program 2436, 8-edge
# blocks 1946; GAT fp32 at 40 2331 against 2324; Transformer bf16 at 40 2584 against 2317; GATv2 bf16 at 48 1455
# against 1473; on arxiv-like every cap lost (float32 spills: GATv2 577 -> 980, AGNN 338 -> 889).
ROW_WARPS: dict[str, int | None] = {"forward": None, "source": None, "destination": None}
ROW_MAXNREG: dict[str, int | None] = {"forward": None, "source": None, "destination": None}
# ... and where ROW_WARPS leaves a pass unset, on 4-byte floats, by score kind (:data:`LIGHT_KINDS`), for row tiles at
# least ROW_FLOAT32_WARPS_MIN_WIDTH wide (BLOCK_H · BLOCK_D).  Session 32 (H200, arxiv-like, 8 heads × 16, same call,
# one round, replayed forward / step µs): GATv2 fp32 with 8 warps in the forward's row kernel 473.4 / 1784.2 against
# 500.2-500.7 / 1811.6-1812.0 with 4.  There the 4-warp kernel holds 128 registers (16 resident warps per
# multiprocessor; 58 and 32 at 8 warps, sm_90, Triton 3.6).  At Reddit-scale's 4 heads × 16 it holds 56 (36 warps;
# 48 and 40 at 8), the case in which session 17 found 8-warp row programs slower (GAT bf16, Reddit-scale forward 2436
# against 1604 µs, H100); not timed for GATv2 fp32 there, so narrower tiles keep the schedule's warps.
# GATv2 fp32's backward row kernels at 8 warps too, same call, one round each, replayed step µs against the defaults:
# 1734.5 against 1748.4 (session 33, call 2) and 1647.2 against 1661.4 (session 34, call 1).
ROW_FLOAT32_WARPS: dict[str, dict[int, int]] = {"forward": {SCORE_GATV2: 8}, "source": {SCORE_GATV2: 8},
                                                "destination": {SCORE_GATV2: 8}}
ROW_FLOAT32_WARPS_MIN_WIDTH = 128


def _row_options(schedule, kernel_pass: str, inputs: AttentionInputs) -> dict:
    """The row kernel's launch options for ``kernel_pass`` (:data:`ROW_WARPS`, :data:`ROW_FLOAT32_WARPS` for tiles
    at least :data:`ROW_FLOAT32_WARPS_MIN_WIDTH` wide, :data:`ROW_MAXNREG`)."""
    cap = ROW_MAXNREG[kernel_pass]
    wide = schedule.block_h * schedule.block_d >= ROW_FLOAT32_WARPS_MIN_WIDTH
    warps = (ROW_WARPS[kernel_pass] or (wide and _by_kind(ROW_FLOAT32_WARPS, inputs, kernel_pass))
             or schedule.num_warps)
    return {"num_warps": warps, **({"maxnreg": cap} if cap else {})}


def _light_kind(inputs: AttentionInputs) -> int:
    """The key of ``inputs``' score in the per-score tables (:data:`LIGHT_KINDS`): the dot score with keys formed
    from the values (AGNN's cosine) as :data:`LIGHT_COSINE`, else the score."""
    return LIGHT_COSINE if inputs.keys_from_values else inputs.score


def _by_kind(table: dict[str, dict[int, int]], inputs: AttentionInputs, kernel_pass: str,
             dtypes: tuple[torch.dtype, ...] = FLOAT32_DTYPES) -> int | None:
    """The entry (warps per program, a register cap) of a per-pass, per-score-kind table of the kernels on ``dtypes``
    (4-byte floats unless told); None for other dtypes and for kinds the table leaves out."""
    if inputs.value.dtype not in dtypes:
        return None
    return table[kernel_pass].get(_light_kind(inputs))


def _row_edge_options(inputs: AttentionInputs, kernel_pass: str) -> dict:
    """The row kernel's edge-feature constexprs for ``kernel_pass`` (:data:`ROW_EDGE_FORM`, :data:`ROW_ATTR_AHEAD`);
    none without edge features, so those kernels keep one specialisation; GATv2's edge features take neither (its
    row kernels project each edge block, :func:`_row_projection`)."""
    if not inputs.has_edge or _gatv2_edges(inputs):
        return {}
    return {"EDGE_FORM": ROW_EDGE_FORM[kernel_pass], "ATTR_AHEAD": ROW_ATTR_AHEAD[kernel_pass]}


# GATv2's edge features in the forward's row kernel when its edge blocks are too small for a product, by element size
# (:func:`_width_key`): the rank-1 updates unrolled over the padded feature width (every column's load in flight at
# once; EDGE_DOT 3) or a loop over the runtime width.  H200, arxiv-like, 16 edge features, replayed µs (session 44 call
# 4, gnn-ab-gatv2-edge.s44c4.log): float32 forward 1293.7 unrolled against 1434.2 (the row kernel 517.7 against 660.8:
# 126 registers at 8 warps against 80), step 3452.0 against 3494.6; bfloat16 forward 1209.0 against 941.3 (its row
# kernel capped at 96 registers spills unrolled), step 2592.7 against 2446.7.
GATV2_ROW_PROJECTION_UNROLLED: dict[int, bool] = {4: True, 2: False}


def _row_projection(inputs: AttentionInputs, schedule, block_e: int, kernel_pass: str) -> dict:
    """GATv2's edge features in a row kernel of ``block_e`` edges a block: ``BLOCK_K`` and ``EDGE_DOT``
    (:func:`_edge_flags`; :data:`GATV2_ROW_PROJECTION_UNROLLED`) where the pass projects (the forward); none
    otherwise."""
    if not (_gatv2_edges(inputs) and kernel_pass == "forward"):
        return {}
    flags = _edge_flags(inputs, schedule.block_h, schedule.block_d, block_e)
    if not flags["EDGE_DOT"] and GATV2_ROW_PROJECTION_UNROLLED[_width_key(inputs.value)]:
        flags["EDGE_DOT"] = 3
    return flags


def _row_prefetch(inputs: AttentionInputs) -> int:
    """The forward row kernel's ``PREFETCH``: 2 (indices and gathers ahead), 1 (indices), 0."""
    if inputs.score in ROW_PREFETCH_GATHER_SCORES and (ROW_PREFETCH_GATHERS_WITH_EDGES or not inputs.has_edge):
        return 2
    return int(inputs.score in ROW_PREFETCH_SCORES)


# Feature tiles the forward row kernel's per-lane edge-feature sums ``[BLOCK_E, H, K]`` count for (with edge features):
# with one its edge block is 8 on the GPU's tiles.  Session 19 (H100, Nsight Compute, arxiv-like bf16): the row kernel
# at 72 registers took 300 + 47 µs at 8 edges against 363 + 60 at 16 edges and 168 registers (W_e kept live then).
ROW_EDGE_SUM_TILES = 1
# With edge features, how the row kernels (the forward's and the destination pass's) meet ``W_e`` in ``u = W_e q̃``
# and ``Σ_k A[k] W_e[k]`` (``EDGE_FORM``, :func:`gnnfuse.kernels.edge_features.rows_edge_terms`): 0 one weight row
# at a time in a loop over ``K`` (the epilogue's rows volatile: one L2 round trip after another), 2 one product with
# the whole ``[K, H, D]`` tile (loaded again, volatile, for the epilogue: one round trip).  And with the gathers a trip
# ahead (``PREFETCH`` 2) the forward row kernel's edge features too (``ATTR_AHEAD``: features a trip ahead, edge ids
# two); the destination pass's row kernel (indices a trip ahead, ``PREFETCH``) its edge ids with them, so that no
# trip waits on an id load before its feature loads.  Session 20 (H200, arxiv-like + 16 edge features, replayed
# forward / step µs, each call against its own rows): call 1, bf16 685 / 2574 -> 563 / 2440 (forward tile alone 593
# / 2480, destination tile alone 685 / 2557, forward features ahead alone 618 / 2506), fp32 1169 / 4049 -> 1098 /
# 3942; call 3, all four 557 / 2386 against 679 / 2548 for none, the destination's tile off 557 / 2402, its ids ahead
# off 557 / 2407 (fp32 1095 / 3875 against 1165 / 4013, 1095 / 3910, 1095 / 3904).  Ncu (call 3, bf16): forward
# row kernel 141 + 21 µs at 95 registers (H100, session 19, row-at-a-time: 300 + 47 at 72).  sm_90 registers
# 90-96 in bf16 either way (20 warps per multiprocessor; the destination's whole-row kernel 80 -> 96); fp32 96 ->
# 116 (forward), 128 -> 119-122 (destination).
ROW_EDGE_FORM = {"forward": 2, "destination": 2}
ROW_ATTR_AHEAD = {"forward": True, "destination": True}


def _tile_budget(schedule, inputs: AttentionInputs, kernel_pass: str) -> tuple[int, int]:
    """(feature tiles a light program holds at once, edge block of the row kernel) for one pass.

    The schedule sizes tiles for one gathered ``[edges, H, D]`` tile (the GAT forward); a
    kernel holding more at once (GATv2's per-edge destination terms, the dot score's keys and
    values, edge features, output gradients in backward) takes proportionally fewer rows per
    light program and a smaller power-of-two edge block, so its registers stay in budget.
    """
    edge = int(_projects(inputs, kernel_pass))
    light = LIGHT_TILES[kernel_pass][inputs.score] + edge
    per_edge = ROW_EDGE_TILES[kernel_pass][inputs.score]
    if inputs.has_edge and kernel_pass == "forward" and not _gatv2_edges(inputs):
        per_edge += ROW_EDGE_SUM_TILES
    elif _gatv2_edges(inputs) and kernel_pass == "forward":
        per_edge += 1  # the block's projected edges
    block_e = schedule.medium_block_e
    while block_e > 1 and block_e * per_edge > schedule.medium_block_e:
        block_e //= 2
    cap = row_max_edges(inputs, kernel_pass)
    if cap:
        block_e = min(block_e, cap)
    # rows per light program stay a power of two (tl.arange): round the tile count up
    return next_power_of_2(light), block_e


def attention_forward(
    graph: Graph, inputs: AttentionInputs, dropout_p: float, seed: int | torch.Tensor, offset: int,
    options: ScheduleOptions | None, out_dtype: torch.dtype | None = None, final: torch.Tensor | None = None,
    saves: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the fused forward on checked inputs (:class:`AttentionInputs`); returns ``(out, lse)``.

    ``out`` is written in ``out_dtype`` (default: the values' dtype; the backward asks for
    the accumulation dtype so that ``δ = <g, out>`` is not computed from a rounded output).
    ``out_add`` is added to ``out``, or with ``final`` (``[N, H, D]``, any float dtype) ``final``
    gets ``out + out_add`` (or ``out`` alone) in its dtype and ``out`` stays the attention's own.  ``saves``
    (:func:`_gatv2_saves`): filled with GATv2's scores and slopes per CSR position for the backward.
    """

    value = inputs.value
    num_nodes, heads, head_dim = value.shape
    acc = accumulation_dtype(value.dtype)
    out = _new_output(tuple(value.shape), out_dtype or value.dtype, value.device)
    lse = _new_output((num_nodes, heads), acc, value.device)
    if num_nodes == 0:
        return out, lse
    schedule = graph.schedule(heads, head_dim, value.dtype, options)
    keep_scale, use_dropout = _dropout_args(dropout_p, seed)
    scalars = (inputs.negative_slope, inputs.scale, dropout_p, keep_scale, seed, offset)
    tensors = inputs.pointers()
    add = inputs.out_add
    has_add = add is not None
    add, add_stride = (add, add.stride(0) if add.dim() == 3 else 0) if has_add else (lse, 0)
    feat_stride = inputs.feat_stride
    has_final = final is not None
    final = final if has_final else out  # never written without FINAL
    buckets = schedule.incoming
    mixed, merged = ROW_LAUNCH_MIXED["forward"], _merge_inside(buckets, "forward", schedule.block_h * schedule.block_d)
    key = ("forward", _call_kind(inputs, value.dtype, use_dropout), has_add, has_final, mixed, merged)
    light, row_meta, merge_meta = _launch_plan(
        schedule, key, lambda: _forward_plan(schedule, inputs, value.dtype, use_dropout, has_add, has_final, mixed,
                                             merged))
    factor = lse if inputs.edge_factor is None else inputs.edge_factor  # never read without FACTOR
    edge_score = lse if inputs.edge_score is None else inputs.edge_score  # nor this without EDGE_SCORE
    saving = saves is not None
    save = {"SAVE": True, "SLOPE_BITS": _slope_bits(schedule)[0]} if saving else {}
    common = (graph.csr_src, graph.csr_eid, *tensors)
    after = (*scalars, add_stride, feat_stride)
    saved = saves if saving else ()
    for index, (grid, ranges, counts, meta) in enumerate(light):
        where = (key, "light", index, saving)
        prepared = _prepared(schedule, where, light) or _prepare(
            schedule, where, light, attention_forward_light_kernel, grid,
            FORWARD_DYNAMIC + (SAVES_DYNAMIC if saving else ()),
            _light_fixed(ranges, counts, H=heads, D=head_dim, K=inputs.edge_dim, **meta, **save))
        prepared(*common, out, lse, add, final, factor, edge_score, *after, *saved)
    for index, ((rows, starts, stops, count, pieces), meta) in enumerate(
            zip(_row_launches(buckets, mixed, merged), row_meta)):
        num_pieces = buckets.num_pieces if pieces else 0
        if pieces:
            piece_out = _new_output((num_pieces, heads, head_dim), acc, value.device)
            piece_lse = _new_output((num_pieces, heads), acc, value.device)
        else:
            piece_out, piece_lse = out, lse  # never written
        target_out, target_lse = (piece_out, piece_lse) if pieces is True else (out, lse)
        where = (key, "rows", index, saving)
        prepared = _prepared(schedule, where, row_meta) or _prepare(
            schedule, where, row_meta, attention_forward_rows_kernel, (count,),
            FORWARD_DYNAMIC + ROWS_PIECES_DYNAMIC + (SAVES_DYNAMIC if saving else ()),
            _rows_fixed((rows, starts, stops), buckets, H=heads, D=head_dim, K=inputs.edge_dim,
                        num_pieces=num_pieces, **meta, **save))
        prepared(*common, target_out, target_lse, add, final, factor, edge_score, *after, piece_out, piece_lse,
                 _piece_counts(buckets, merged and bool(pieces), lse), *saved)
        if pieces and not merged:
            lse_merge_kernel[(buckets.super_rows.numel(),)](
                buckets.super_piece_ptr, buckets.super_rows, piece_out, piece_lse, out, lse, add, final, heads,
                head_dim, add_stride, **merge_meta,
            )
    return out, lse


# The arguments of the forward kernels' prepared launches (:func:`_prepared`) that change from call to call, in their
# parameters' order: the graph's CSR, the features, outputs, addends and scalars; the schedule's row lists, counts and
# tile switches are fixed.  The row kernel's piece buffers follow, and GATv2's saved scores with ``SAVE``.
FORWARD_DYNAMIC = ("src_ptr", "eid_ptr", "src_term_ptr", "dst_term_ptr", "attn_ptr", "value_ptr", "attr_ptr",
                   "w_edge_ptr", "out_ptr", "lse_ptr", "add_ptr", "final_ptr", "factor_ptr", "edge_score_ptr",
                   "negative_slope", "scale", "dropout_p", "keep_scale", "seed", "rng_offset", "add_stride",
                   "feat_stride")
ROWS_PIECES_DYNAMIC = ("piece_out_ptr", "piece_lse_ptr", "piece_count_ptr")
SAVES_DYNAMIC = ("scores_ptr", "slopes_ptr")
# ... and of the backward's source and destination passes (their light and row kernels)
SOURCE_DYNAMIC = ("rev_dst_ptr", "rev_pos_ptr", "src_term_ptr", "dst_term_ptr", "attn_ptr", "value_ptr", "terms_ptr",
                  "lse_ptr", "grad_out_ptr", "delta_ptr", "grad_value_ptr", "grad_src_ptr", "grad_s_ptr",
                  "factor_ptr", "grad_factor_ptr", "edge_score_ptr", "negative_slope", "scale", "dropout_p",
                  "keep_scale", "seed", "rng_offset", "feat_stride", "grad_stride")
SOURCE_ROWS_DYNAMIC = ("piece_count_ptr", "merged_value_ptr", "merged_src_ptr", "merged_stride")
DESTINATION_DYNAMIC = ("src_ptr", "eid_ptr", "src_term_ptr", "dst_term_ptr", "attn_ptr", "value_ptr", "attr_ptr",
                       "w_edge_ptr", "grad_s_ptr", "terms_ptr", "grad_dst_ptr", "attr_sums_ptr", "negative_slope",
                       "scale", "feat_stride", "grad_stride")
DESTINATION_ROWS_DYNAMIC = ("piece_dst_ptr", "piece_sums_ptr", "piece_count_ptr")
FOLD_DYNAMIC = ("addend_ptr", "beta_part_ptr")  # AGNN's folded normalization (kernels/normalize.py)


def _prepared(schedule, key: tuple, plan):
    """The launch :func:`_prepare` kept under ``key`` from ``plan``, or None (none yet, or from another plan: the
    plans were rebuilt since)."""
    entry = schedule.prepared.get(key)
    return entry[1] if entry is not None and entry[0] is plan else None


def _prepare(schedule, key: tuple, plan, kernel, grid: tuple[int, ...], dynamic: tuple[str, ...], fixed: dict):
    """A launch of ``kernel`` whose arguments but ``dynamic`` are ``fixed`` (:func:`fusecore.fast_launch.prepare`),
    kept on the schedule (``Schedule.prepared``) under ``key`` with the launch plan ``plan`` it was built from; a call
    site looks it up first (``_prepared(schedule, key, plan) or _prepare(...)``: ``fixed`` is built only on the
    first call of its kind).  ``key`` must name everything ``fixed`` depends on besides ``plan`` (the plan's entry,
    the call's switches), and ``fixed`` may hold only the schedule's and the plan's own tensors, ints the schedule
    and the key determine, and constexprs."""
    launch = prepare(kernel, grid, dynamic, **fixed)
    schedule.prepared[key] = (plan, launch)
    return launch


def _light_fixed(ranges: tuple[torch.Tensor, ...], counts: tuple[int, ...], **rest) -> dict:
    """A light launch's fixed arguments: its row lists (``rows_ptr``, ``starts_ptr``, ``stops_ptr``), its row counts
    per width class as ``n0 .. n6``, and ``rest``."""
    return {**dict(zip(("rows_ptr", "starts_ptr", "stops_ptr"), ranges)),
            **{f"n{slot}": count for slot, count in enumerate(counts)}, **rest}


def _rows_fixed(ranges: tuple[torch.Tensor, ...], buckets, **rest) -> dict:
    """A row-kernel launch's fixed arguments: its row lists, ``buckets``' split rows' piece tables, and ``rest``."""
    return {**dict(zip(("rows_ptr", "starts_ptr", "stops_ptr"), ranges)), "piece_super_ptr": buckets.piece_super,
            "piece_ptr": buckets.super_piece_ptr, **rest}


def _call_kind(inputs: AttentionInputs, dtype: torch.dtype, use_dropout: bool) -> tuple:
    """What a launch configuration depends on besides the schedule (its feature shape and dtype)."""
    return (inputs.score, inputs.has_edge, inputs.edge_dim, inputs.keys_from_values, dtype, use_dropout,
            inputs.edge_factor is not None, inputs.edge_score is not None)


def _launch_plan(schedule, key: tuple, build):
    """The launch configuration ``build()`` of one pass for calls of kind ``key``, built on the first
    such call and kept on the schedule (``Schedule.launches``): it depends only on the schedule and the
    call's kind, so later calls skip the tile budgets, grids and keyword dictionaries."""
    plan = schedule.launches.get(key)
    if plan is None:
        plan = schedule.launches[key] = build()
    return plan


def _score_flags(inputs: AttentionInputs) -> dict:
    """The compile-time score switches every attention kernel takes."""
    return {"SCORE": inputs.score, "EDGE": inputs.has_edge, "KEY_SCALE": inputs.keys_from_values}


def _flags(inputs: AttentionInputs, use_dropout: bool) -> dict:
    """:func:`_score_flags` and the dropout switch of the kernels that weight edges by their softmax."""
    return {"DROPOUT": use_dropout, **_score_flags(inputs)}


def _factor_flags(inputs: AttentionInputs, factor_grad: bool = False) -> dict:
    """The per-edge factor's switches (``FACTOR``, ``FACTOR_GRAD``) of the forward and source-pass kernels, left
    out (the kernels' defaults) without a factor."""
    if inputs.edge_factor is None:
        return {}
    return {"FACTOR": True, **({"FACTOR_GRAD": True} if factor_grad else {})}


def _edge_score_flags(inputs: AttentionInputs) -> dict:
    """GAT's per-edge score term's switch (``EDGE_SCORE``) of the forward, source-pass and weights kernels, left out
    (the kernels' default) without the term."""
    return {} if inputs.edge_score is None else {"EDGE_SCORE": True}


# Light width classes start a new launch at these widths (each launch covers the classes between
# two breaks, each class still compiled for its own tile: kernels/tiles.py); () = one launch per pass.
# Session 9 (H100, arxiv-like, GAT bf16 training step, same call): one launch per pass against one per
# class (2, 4, ..., 64) gave 1.66-1.75 ms against 2.16-2.27 as called, 986 against 984 µs replayed.
# Session 10 (H100, same-call A/B, replayed, forward / training step): two launches per pass, the
# narrow classes (1-4) and the wide ones (8-16), against one: GAT bf16 337.5 / 971.8 against
# 347.1 / 984.0 µs, and with the fused projection 326.0 / 963.0 against 336.1 / 973.0; GATv2 fp32
# 880.8 / 3314 against 892.2 / 3353; Graph Transformer bf16 583 / 2255 against 601 / 2317;
# (4, 16) was no better than () (GAT bf16 348.0 / 1000.5).  Half the merged kernel's code per launch
# (the instruction-cache lead of gnnfuse/JOURNAL.md, session 9) fits; not profiled.
# The width-32 class (dense graphs only, schedule.DENSE_LIGHT_MAX) starts a launch of its own, as measured in
# session 17; no other graph has that class, so the break changes nothing there.
LIGHT_LAUNCH_BREAKS: tuple[int, ...] = (8, 32)
# An entry of the two dictionaries below: the breaks of every pass, or a dict of them by pass (:func:`_light_breaks`).
LightBreaks = tuple[int, ...] | dict[str, tuple[int, ...]]
# ... except for these scores in 2-byte floats.  Session 15 (H200, arxiv-like, same call, replayed forward / step
# µs, one launch per pass against (8,)): GAT bf16 258.6 / 777.3 -> 253.2 / 767.7, Graph Transformer bf16 330.7 /
# 1137 -> 327.0 / 1116, AGNN bf16 equal (207 / 1027); GATv2 bf16 259.4 / 1294 -> 262.7 / 1313, GAT fp32 488.8 /
# 1169 -> 489.1 / 1173 and Graph Transformer fp32 1016 / 2564 -> 1026 / 2562 kept their two launches.  One launch
# fewer a pass is also ~20 µs less host work a pass for the host-bound training steps.
LIGHT_LAUNCH_BREAKS_2BYTE: dict[int, LightBreaks] = {SCORE_GAT: (32,), SCORE_DOT: (32,), LIGHT_COSINE: (32,)}
# ... and for these in 4-byte floats.  Session 27 (H200, arxiv-like, same call, replayed forward / step µs, two
# rounds): GAT fp32 with one light launch a pass 362.8, 362.7 / 1047.5, 1048.2 against 362.3, 361.9 / 1052.9, 1052.0
# with (8, 32) — equal GPU time, a launch fewer a forward and a source pass (25-40 µs of host each on the GPU machines,
# where GAT fp32's forward is host-bound as called).  Session 31 (H200, same call, two rounds): AGNN fp32 with one
# light launch a pass 272.8, 272.7 / 1300.0, 1299.8 against 284.0, 284.0 / 1309.5, 1308.5 with (8, 32); the Graph
# Transformer fp32 forward lost with it (753.2, 753.1 against 743.4, 743.7; step 2264.0 against 2305.7), so its dot
# score keeps two launches in the forward and takes one in the backward's passes: session 32 (H200, same call, two
# rounds) forward 746.1, 746.0 against 745.9, 746.3, step 2244.8, 2244.6 against 2296.3, 2297.2.  GATv2 fp32 with one
# launch in every pass: forward 499.8, 499.8 against 505.6, 504.1, but step 1875.3, 1875.7 against 1814.5, 1814.7 —
# one in the forward only.
LIGHT_LAUNCH_BREAKS_4BYTE: dict[int, LightBreaks] = {
    SCORE_GAT: (32,), SCORE_GATV2: {"forward": (32,)}, SCORE_DOT: {"source": (32,), "destination": (32,)},
    LIGHT_COSINE: (32,)}


def _light_breaks(inputs: AttentionInputs, kernel_pass: str = "forward") -> tuple[int, ...]:
    """The widths at which ``inputs``' light classes start a new launch in ``kernel_pass`` (the three constants
    above; the dot score with keys formed from the values looked up as :data:`LIGHT_COSINE`).  An entry of the
    per-score dicts is the breaks of every pass, or a dict of them by pass (:data:`KERNEL_PASSES`), a pass it
    leaves out taking :data:`LIGHT_LAUNCH_BREAKS`."""
    kind = _light_kind(inputs)
    two_byte = inputs.value.dtype in TWO_BYTE_DTYPES
    table = LIGHT_LAUNCH_BREAKS_2BYTE if two_byte else LIGHT_LAUNCH_BREAKS_4BYTE
    breaks = table.get(kind, LIGHT_LAUNCH_BREAKS)
    if isinstance(breaks, dict):
        return breaks.get(kernel_pass, LIGHT_LAUNCH_BREAKS)
    return breaks


# Whether kernels with edge features launch each light class on its own (each over 16-byte aligned row lists, as
# every launch).  The session-9 final run (H100, arxiv-like, CUDA graph) timed the Graph Transformer with 16 edge
# features at 7.985 against 6.777 ms forward+backward in fp32 (session 8, per-class launches) and 1.154 against
# 0.997 ms forward in bf16 with one launch per pass, while its rows per program, registers (sm_90 report: 204 / 124 /
# 96 against at most 194 / 125 / 94 per class) and BLOCK_K / EDGE_DOT were unchanged; per-class launches came back
# then.  Session 19 (H100, arxiv-like, same call, replayed forward / step µs, the forward's light rows in the tile
# form): one launch per pass against one per class, bf16 775 / 2804 against 768 / 2776, fp32 1234 / 4290 against
# 1256 / 4317: per class then in 2-byte floats only.  Session 20 (H200, same call): bf16 one launch per pass 566 /
# 2433 against 561 / 2410 replayed, but the forward's host issue time (host_profile.py, 200 calls, two rows each) 740
# / 732 µs against 950 / 918: four launches fewer are ~200 µs of host on that machine, where the as-called layer is
# host-bound (the forward issues in more than its GPU time) — so one launch per pass in every dtype.
LIGHT_LAUNCH_PER_CLASS_WITH_EDGES = False
# Warps of a light launch in the tile form with edge features, by pass (None: the schedule's, 4).  Session 45 (H200,
# arxiv-like Graph Transformer, 16 edge features, same call, replayed forward / step µs,
# gnn-ab-tredge-tile-warps.s45c3.log): bf16 default 559.1 / 2310.3, forward at 8 warps 673.4 / 2404.5 (48 registers,
# 40 resident warps per multiprocessor against 28-32), at 2 580.6 / 2409.9, destination at 8 558.9 / 3217.5 (128
# registers); fp32 977.9 / 3651.8, forward at 8 1087.2 / 3753.6, at 2 1094.7 / 3778.0.  So the schedule's everywhere.
LIGHT_TILE_WARPS_WITH_EDGES: dict[str, int | None] = {"forward": None, "source": None, "destination": None}


def _light_plan(schedule, inputs: AttentionInputs, buckets: Buckets, kernel_pass: str, flags: dict) -> list:
    """``(grid, (rows, starts, stops), counts, keyword arguments)`` of the light launches of
    ``kernel_pass``: the width classes grouped by :func:`_light_breaks` (one class per launch
    with edge features where :data:`LIGHT_LAUNCH_PER_CLASS_WITH_EDGES` asks for it), each launch over its classes' slice
    of ``buckets.light_all`` with the classes' row counts as ``n0 .. n6``."""

    block_h, block_d = schedule.block_h, schedule.block_d
    light_tiles, _ = _tile_budget(schedule, inputs, kernel_pass)
    projects = _projects(inputs, kernel_pass)
    per_class = projects and LIGHT_LAUNCH_PER_CLASS_WITH_EDGES
    breaks = _light_breaks(inputs, kernel_pass)
    groups: list[list[tuple[int, int, int]]] = []
    for width, rows, _, _ in buckets.light:
        # a launch is unrolled or not as a whole: a class on the other side of LIGHT_UNROLLED_MAX_WIDTH starts one
        if (not groups or per_class or width in breaks
                or _unrolled(inputs, kernel_pass, width) != _unrolled(inputs, kernel_pass, groups[-1][0][0])):
            groups.append([])
        groups[-1].append((width, rows.numel(), _light_rows(schedule, inputs, width, light_tiles, kernel_pass)))
    plan, begin = [], 0
    for group in groups:
        unrolled = _unrolled(inputs, kernel_pass, group[-1][0])
        warps = (unrolled and (LIGHT_UNROLLED_WARPS[kernel_pass]
                               or _by_kind(LIGHT_UNROLLED_FLOAT32_WARPS, inputs, kernel_pass)
                               or _by_kind(LIGHT_UNROLLED_TWO_BYTE_WARPS, inputs, kernel_pass, TWO_BYTE_DTYPES))
                 or (not unrolled and inputs.has_edge and LIGHT_TILE_WARPS_WITH_EDGES[kernel_pass])
                 or schedule.num_warps)
        cap = (unrolled and block_h * block_d <= LIGHT_UNROLLED_MAXNREG_MAX_WIDTH
               and ((not inputs.has_edge and _by_kind(LIGHT_UNROLLED_MAXNREG, inputs, kernel_pass, TWO_BYTE_DTYPES))
                    or _by_kind(LIGHT_UNROLLED_FLOAT32_MAXNREG, inputs, kernel_pass)))
        options = {"num_warps": warps, **({"maxnreg": cap} if cap else {})}
        counts = [0] * LIGHT_SLOTS
        for width, count, _ in group:
            counts[width.bit_length() - 1] = count
        end = begin + sum(counts)
        programs = sum(cdiv(count, per_program) for _, count, per_program in group)
        width, _, per_program = group[0]
        # a launch's slice of the row lists, copied where it does not start 16-byte aligned (a fresh
        # tensor is), so the kernel keeps Triton's divisibility hint on them
        ranges = tuple(t[begin:end] if t[begin:].data_ptr() % 16 == 0 else t[begin:end].clone()
                       for t in buckets.light_all)
        plan.append(((programs,), ranges, tuple(counts), {
            "LIGHT": pack_light({w: r for w, _, r in group}), "BLOCK_H": block_h, "BLOCK_D": block_d, **flags,
            **_pass_edge_flags(inputs, block_h, block_d, per_program * width, kernel_pass), **options,
            "UNROLLED": unrolled,
            **({"EDGE_FORM": LIGHT_UNROLLED_EDGE_FORM} if unrolled and inputs.has_edge and kernel_pass == "forward"
               else {}),
        }))
        begin = end
    return plan


def _forward_plan(schedule, inputs: AttentionInputs, dtype: torch.dtype, use_dropout: bool, has_add: bool,
                  has_final: bool, mixed: bool, merged: bool) -> tuple[list, list, dict]:
    """The forward's launches (:func:`_launch_plan`): light classes, row-kernel launches (medium rows,
    super-row pieces), the pieces' merge (``merged``: inside the pieces' launch)."""
    block_h, block_d = schedule.block_h, schedule.block_d
    flags = _flags(inputs, use_dropout)
    _, row_block_e = _tile_budget(schedule, inputs, "forward")
    flags = {**flags, **_factor_flags(inputs), **_edge_score_flags(inputs)}
    light = _light_plan(schedule, inputs, schedule.incoming, "forward",
                        {**flags, "ADD": has_add, "FINAL": has_final})
    lanes = row_kernel_lanes(schedule, inputs.score, "forward", dtype)
    merge_p = max(1, (MERGE_TILE_INSIDE if merged else MERGE_TILE) // (block_h * block_d))
    rows = [{"BLOCK_E": row_block_e, "BLOCK_H": block_h, "BLOCK_D": block_d, "PIECES": pieces, **flags,
             "BLOCK_K": _block_k(inputs), "LANES": lanes, "ADD": has_add and pieces is not True,
             "FINAL": has_final and pieces is not True, "PREFETCH": _row_prefetch(inputs),
             **_row_edge_options(inputs, "forward"), **_row_projection(inputs, schedule, row_block_e, "forward"),
             **_row_options(schedule, "forward", inputs),
             "MERGE": merged and pieces == 2, "MERGE_P": merge_p}
            for *_, pieces in _row_launches(schedule.incoming, mixed, merged)]
    merge = {"BLOCK_P": merge_p, "BLOCK_H": block_h, "BLOCK_D": block_d, "ADD": has_add, "FINAL": has_final}
    return light, rows, merge


def gat_forward(
    graph: Graph, wh: torch.Tensor, el: torch.Tensor, er: torch.Tensor, negative_slope: float,
    dropout_p: float, seed: int | torch.Tensor, offset: int, options: ScheduleOptions | None,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention_forward` with the GAT score (``el``, ``er`` in the accumulation dtype)."""
    inputs = AttentionInputs(SCORE_GAT, el, er, wh, negative_slope=negative_slope)
    return attention_forward(graph, inputs, dropout_p, seed, offset, options, out_dtype)


def _sum_tiles(width: int, tile: int = MERGE_TILE) -> tuple[int, int]:
    """(pieces, columns) a sum merge (kernels/merge.py ``merge_sums``) reads per loop trip for rows of ``width``
    (``tile`` elements at most, unless one row is wider)."""
    block_w = min(tile, 1024, next_power_of_2(max(1, width)))
    return max(1, tile // block_w), block_w


def _merge_sums(buckets: Buckets, part: torch.Tensor, out: torch.Tensor, add: torch.Tensor | None = None) -> None:
    """``out[row] = Σ`` of the split rows' pieces ``part`` (``+ add[row]``, rows ``out``'s stride apart)."""
    width = part[0].numel()
    block_p, block_w = _sum_tiles(width)
    sum_merge_kernel[(buckets.super_rows.numel(),)](
        buckets.super_piece_ptr, buckets.super_rows, part, out, width, out.stride(0), BLOCK_P=block_p, BLOCK_W=block_w,
        add_ptr=add, ADD=add is not None,
    )


def attention_backward(
    graph: Graph, inputs: AttentionInputs, lse: torch.Tensor, out: torch.Tensor, grad_out: torch.Tensor,
    dropout_p: float, seed: int | torch.Tensor, offset: int, options: ScheduleOptions | None,
    grad_value_dtype: torch.dtype | None = None, edge_grads: tuple[bool, bool] = (True, True),
    bias_parts: torch.Tensor | None = None,
    term_grad_dtypes: tuple[torch.dtype | None, torch.dtype | None] = (None, None),
    grad_targets: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None,
    grad_out_copy: torch.Tensor | None = None, factor_rev: torch.Tensor | None = None,
    grad_factor: torch.Tensor | None = None, score_rev: torch.Tensor | None = None,
    grad_scores: torch.Tensor | None = None, gatv2_saves: tuple[torch.Tensor, torch.Tensor] | None = None,
    bias_sum: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Gradients of the fused attention, without atomics:
    ``(∂value, ∂src-side, ∂dst_term, ∂edge_attr, attr_sums)``.

    ``∂value`` in ``grad_value_dtype`` (default: the values' dtype), the source-side and destination
    gradients in ``term_grad_dtypes`` (default: the accumulation dtype; a caller that only casts them
    names its dtype here and the kernels round once as they store, no cast pass), the rest in the
    accumulation dtype.  The source-side output is ``∂el [N, H]`` (GAT), ``∂k`` (dot) or, for
    GATv2, the per-source-row partial sums of ``∂attn`` ``[N, H, D]`` (the score's share of
    ``∂fs`` is already in ``∂value``).  With edge features, as ``edge_grads = (attr, weight)``
    asks: ``∂edge_attr [E, K]`` (input edge order) and ``attr_sums [N, 2, H, K]``, the
    per-destination sums ``A``, ``B`` from which :func:`edge_weight_grad` forms ``∂edge_weight``;
    None where not asked for or without edge features.  ``bias_parts`` (:func:`_node_part_buffer`):
    filled with per-node-block partial sums of ``g`` (an output bias's gradient ``Σ_n g_n``, summed by
    the caller) from the read of ``g`` that forms ``δ``; or ``bias_sum`` (``[H, D]``, any float dtype): filled with
    ``Σ_n g_n`` itself, summed inside that launch.  ``grad_targets`` ``(∂value, ∂k or None, ∂dst)``:
    ``[N, H, D]`` tensors of one row stride the kernels store these gradients into (column blocks of one
    ``[N, W]`` gradient, :func:`_packed_columns`) instead of new ones; ``∂k`` only for the dot score.
    ``grad_out_copy``: an ``[N, H, D]`` block ``g`` is stored into as ``δ`` is formed (a per-node addend's
    gradient in a packed gradient).  ``factor_rev``: ``inputs.edge_factor`` in reverse-CSR order (required with
    it: the source pass reads it there); ``grad_factor``: ``[E]`` (reverse-CSR order, accumulation dtype), filled by
    the source pass with the factor's gradient.  ``score_rev``: ``inputs.edge_score`` in reverse-CSR order (required
    with it, as ``factor_rev``).  ``grad_scores``: ``[max(E, 1), H]`` (accumulation dtype) the source pass stores its
    per-edge, per-head value into, in CSR order, instead of a scratch buffer of its own: ``∂L/∂z`` for GAT (``s =
    LeakyReLU(z)``, ``z = el_j + er_i (+ ee_p)``: the gradient of ``inputs.edge_score``), ``∂L/∂s`` otherwise.
    ``gatv2_saves``: GATv2 with edge features needs the scores and slopes its training forward stored
    (:func:`_gatv2_saves`); its ``∂attn`` partials then hold ``e_p``'s share in their first row.

    Keys formed from the values (``inputs.keys_from_values``, AGNN: ``src_term`` is ``r``, ``dst_term`` is ``c = β r``)
    fold the row normalization's backward into the passes (:mod:`gnnfuse.kernels.normalize`) and return
    ``(P, ∂β terms, ∂h, None, None)``: the source pass's ``P = ∂v + r (∂k − ĥ (ĥ · ∂k))`` (in ``grad_value_dtype``),
    the ``∂β`` terms (accumulation dtype, ``[N + pieces]``; ``∂β`` is their sum) and ``∂h`` itself (in
    ``term_grad_dtypes[1]``, default the values' dtype); no ``grad_targets``.
    """

    value = inputs.value
    num_nodes, heads, head_dim = value.shape
    device = value.device
    acc = accumulation_dtype(value.dtype)
    edge_dim = inputs.edge_dim
    src_shape = (num_nodes, heads) if inputs.score == SCORE_GAT else (num_nodes, heads, head_dim)
    folded = inputs.keys_from_values  # AGNN: the normalization's backward folded into the passes
    if folded and (grad_targets is not None or inputs.has_edge):
        raise ValueError("keys formed from the values: no grad_targets and no edge features")
    if grad_targets is None:
        grad_value = _new_output(tuple(value.shape), grad_value_dtype or value.dtype, device)
        # ∂k (never stored when folded: the source pass folds it into P)
        grad_src = grad_value if folded else _new_output(src_shape, term_grad_dtypes[0] or acc, device)
        grad_dst = _new_output(src_shape, term_grad_dtypes[1] or (value.dtype if folded else acc), device)
    else:
        grad_value, grad_src, grad_dst = grad_targets
        if grad_src is None:
            grad_src = _new_output(src_shape, term_grad_dtypes[0] or acc, device)
        stored = (grad_value, grad_dst) + ((grad_src,) if inputs.score == SCORE_DOT else ())
        if inputs.score == SCORE_GAT or not all(
                t.dim() == 3 and _rows_alike(t) and (t.stride(0) == grad_value.stride(0) or num_nodes < 2)
                for t in stored):
            raise ValueError("grad_targets must be [N, H, D] tensors of one row stride with contiguous heads and "
                             "features (GATv2 and the dot score only)")
    grad_stride = grad_value.stride(0)
    attr_grad, weight_grad = (inputs.has_edge and edge_grads[0]), (inputs.has_edge and edge_grads[1])
    grad_attr = _new_output((graph.num_edges, edge_dim), acc, device) if attr_grad else None
    gatv2_edges = _gatv2_edges(inputs)
    attr_sums = None
    if weight_grad:  # GATv2: ∂W_e itself, [H·D, K] (_gatv2_edge_grads); the dot score: the per-row sums A, B
        attr_sums = (torch.zeros(heads * head_dim, edge_dim, dtype=acc, device=device) if gatv2_edges
                     else _new_output((num_nodes, 2, heads, edge_dim), acc, device))
    if num_nodes == 0:
        return grad_value, torch.zeros(0, dtype=acc, device=device) if folded else grad_src, grad_dst, grad_attr, \
            attr_sums
    schedule = graph.schedule(heads, head_dim, value.dtype, options)
    keep_scale, use_dropout = _dropout_args(dropout_p, seed)
    scalars = (inputs.negative_slope, inputs.scale, dropout_p, keep_scale, seed, offset)
    mixed = ROW_LAUNCH_MIXED["destination"]
    width = schedule.block_h * schedule.block_d
    merged_src = _merge_inside(schedule.outgoing, "source", width)
    merged_dst = _merge_inside(schedule.incoming, "destination", max(width, 2 * heads * edge_dim))
    factor_grad = grad_factor is not None
    if (factor_grad or factor_rev is not None) and inputs.edge_factor is None:
        raise ValueError("factor_rev / grad_factor given for an edge factor the inputs do not have")
    if inputs.edge_factor is not None and factor_rev is None:
        raise ValueError("inputs with an edge factor need factor_rev, the factor in reverse-CSR order")
    if (inputs.edge_score is None) != (score_rev is None):
        raise ValueError("score_rev (the edge score in reverse-CSR order) goes with inputs.edge_score, and only then")
    if grad_scores is not None and tuple(grad_scores.shape) != (max(graph.num_edges, 1), heads):
        raise ValueError(f"grad_scores must have shape [max(E, 1), H] = [{max(graph.num_edges, 1)}, {heads}], "
                         f"got {list(grad_scores.shape)}")
    key = ("backward", _call_kind(inputs, value.dtype, use_dropout), weight_grad, mixed, merged_src, merged_dst,
           factor_grad)
    plan = _launch_plan(schedule, key, lambda: _backward_plan(schedule, inputs, value.dtype, use_dropout, weight_grad,
                                                              mixed, merged_src, merged_dst, factor_grad))
    # δ_i = <g_i, out_i> per head: one pass over node rows instead of one over edges.
    delta = _head_dot(grad_out, out, acc, bias_parts, grad_out_copy, bias_sum)
    grad_s = _new_output((max(graph.num_edges, 1), heads), acc, device) if grad_scores is None else grad_scores
    src_term, dst_term, attn, *_ = inputs.pointers()
    # the dot score's edge features reach the source pass as two terms per edge and head (kernels/edge_features.py);
    # GATv2's are projected there (its edge ids, features and weight as keywords)
    terms = _edge_terms(graph, inputs, grad_out, acc, schedule) if inputs.has_edge and not gatv2_edges else grad_s
    # GATv2's edge features: the forward's scores (source pass) and LeakyReLU slopes (every pass) per CSR position,
    # so that no backward kernel projects an edge
    if gatv2_edges and gatv2_saves is None:
        raise ValueError("GATv2 with edge features: attention_backward needs the scores and slopes its training "
                         "forward stored (gatv2_saves)")
    saves = (gatv2_saves[0], gatv2_saves[1]) if gatv2_edges else ()  # scores (source pass), slopes (every pass)
    bits = {"SLOPE_BITS": _slope_bits(schedule)[0]} if gatv2_edges else {}
    src_tensors = (src_term, dst_term, attn, value, terms, lse, grad_out, delta)
    feat_stride, piece_stride = inputs.feat_stride, heads * head_dim  # piece buffers are contiguous
    outgoing = schedule.outgoing
    # reverse-CSR order: never read without FACTOR, nor written without FACTOR_GRAD
    factors = (lse if factor_rev is None else factor_rev, lse if grad_factor is None else grad_factor,
               lse if score_rev is None else score_rev)  # the last never read without EDGE_SCORE
    for index, (grid, ranges, counts, meta) in enumerate(plan["source light"]):
        where = (key, "source light", index)
        prepared = _prepared(schedule, where, plan) or _prepare(
            schedule, where, plan, attention_backward_src_light_kernel, grid,
            SOURCE_DYNAMIC + SAVES_DYNAMIC[:len(saves)],
            _light_fixed(ranges, counts, H=heads, D=head_dim, **meta, **bits))
        prepared(graph.rev_dst, graph.rev_pos, *src_tensors, grad_value, grad_src, grad_s, *factors, *scalars,
                 feat_stride, grad_stride, *saves)
    for index, ((rows, starts, stops, count, pieces), meta) in enumerate(
            zip(_row_launches(outgoing), plan["source rows"])):
        if pieces:
            target_value = _new_output((count, heads, head_dim), acc, device)
            target_src = target_value if folded else _new_output((count, *src_shape[1:]), acc, device)
        else:
            target_value, target_src = grad_value, grad_src
        where = (key, "source rows", index)
        prepared = _prepared(schedule, where, plan) or _prepare(
            schedule, where, plan, attention_backward_src_kernel, (count,),
            SOURCE_DYNAMIC + SOURCE_ROWS_DYNAMIC + SAVES_DYNAMIC[:len(saves)],
            _rows_fixed((rows, starts, stops), outgoing, H=heads, D=head_dim, **meta, **bits))
        prepared(graph.rev_dst, graph.rev_pos, *src_tensors, target_value, target_src, grad_s, *factors, *scalars,
                 feat_stride, piece_stride if pieces else grad_stride,
                 _piece_counts(outgoing, merged_src and pieces, lse), grad_value, grad_src, grad_stride, *saves)
        if pieces and not merged_src:
            _merge_sums(outgoing, target_value, grad_value)
            if not folded:
                _merge_sums(outgoing, target_src, grad_src)
    incoming = schedule.incoming
    if inputs.score == SCORE_GAT and merged_dst:
        # ∂er in one launch: the light rows (of any width class, many per program), then one program per piece of a
        # split row (the last piece of each merging it) and per medium row
        _row_sums(schedule, key, plan, grad_s, grad_dst, acc)
        return grad_value, grad_src, grad_dst, grad_attr, attr_sums
    if inputs.score == SCORE_GAT:
        # ∂er where split rows are merged by launches of their own: every light row in one launch, then one program per
        # medium row and per piece of a split row, and the pieces' merge
        rows, starts, stops = incoming.light_all
        if rows.numel():
            grid, meta = plan["row sums light"]
            row_sum_kernel[grid](rows, starts, stops, grad_s, grad_dst, rows.numel(), heads, incoming.piece_super,
                                 incoming.super_piece_ptr, grad_s, grad_dst, **meta)  # the last four never read
        for rows, starts, stops, count, pieces in _row_launches(incoming):
            target_dst = _new_output((count, heads), acc, device) if pieces else grad_dst
            merge = merged_dst and pieces
            row_sum_kernel[(count,)](rows, starts, stops, grad_s, target_dst, count, heads, incoming.piece_super,
                                     incoming.super_piece_ptr, _piece_counts(incoming, merge, lse), grad_dst,
                                     PIECES=pieces, MERGE=merge, **plan["row sums"])
            if pieces and not merge:
                _merge_sums(incoming, target_dst, grad_dst)
        return grad_value, grad_src, grad_dst, grad_attr, attr_sums
    if gatv2_edges:
        # ∂attr, ∂W_e and e_p's share of ∂attn from the source pass's ∂s and the forward's slopes
        _gatv2_edge_grads(graph, inputs, grad_s, gatv2_saves[1], grad_attr, attr_sums, grad_src, schedule)
    elif attr_grad:
        # ∂attr per edge from α' (left in the terms by the source pass) and ∂s, in CSR order
        _edge_attr_grad(graph, inputs, grad_out, terms, grad_s, grad_attr, schedule)
    # GATv2 / dot: ∂dst gathers the source terms again, weighted by the source pass's ∂s (with edge features:
    # and the rows' feature sums, from α' and ∂s).
    dst_tensors = (*inputs.pointers(), grad_s, terms)
    dst_scalars = (inputs.negative_slope, inputs.scale)
    # AGNN: P added to ∂h as it is stored, each item's ∂β term stored (rows at their index, pieces after them; a split
    # row's own slot stays 0)
    beta_terms = torch.zeros(num_nodes + incoming.num_pieces, dtype=acc, device=device) if folded else None
    fold_args, fold_names = ((grad_value, beta_terms), FOLD_DYNAMIC) if folded else ((), ())
    row_sums = weight_grad and not gatv2_edges  # the dot score's per-row sums A, B (GATv2: ∂W_e formed above)
    sums = attr_sums if row_sums else grad_s  # a tensor the kernels never write where not asked for
    slopes = saves[1:]
    for index, (grid, ranges, counts, meta) in enumerate(plan["destination light"]):
        where = (key, "destination light", index)
        prepared = _prepared(schedule, where, plan) or _prepare(
            schedule, where, plan, attention_backward_dst_light_kernel, grid,
            DESTINATION_DYNAMIC + SAVES_DYNAMIC[2 - len(slopes):] + fold_names,
            _light_fixed(ranges, counts, H=heads, D=head_dim, K=edge_dim, **meta, **bits))
        prepared(graph.csr_src, graph.csr_eid, *dst_tensors, grad_dst, sums, *dst_scalars, feat_stride, grad_stride,
                 *slopes, *fold_args)
    for index, ((rows, starts, stops, count, pieces), meta) in enumerate(
            zip(_row_launches(incoming, mixed, merged_dst), plan["destination rows"])):
        num_pieces = incoming.num_pieces if pieces else 0
        if pieces:
            piece_dst = _new_output((num_pieces, heads, head_dim), acc, device)
            piece_sums = _new_output((num_pieces, 2, heads, edge_dim), acc, device) if row_sums else grad_s
        else:
            piece_dst, piece_sums = grad_dst, sums  # never written
        target_dst, target_sums, stride = ((piece_dst, piece_sums, piece_stride) if pieces is True
                                           else (grad_dst, sums, grad_stride))
        where = (key, "destination rows", index)
        prepared = _prepared(schedule, where, plan) or _prepare(
            schedule, where, plan, attention_backward_dst_kernel, (count,),
            DESTINATION_DYNAMIC + DESTINATION_ROWS_DYNAMIC + SAVES_DYNAMIC[2 - len(slopes):] + fold_names,
            _rows_fixed((rows, starts, stops), incoming, H=heads, D=head_dim, K=edge_dim, num_pieces=num_pieces,
                        beta_pieces=num_nodes, **meta, **bits))
        prepared(graph.csr_src, graph.csr_eid, *dst_tensors, target_dst, target_sums, *dst_scalars, feat_stride,
                 stride, piece_dst, piece_sums, _piece_counts(incoming, merged_dst and bool(pieces), lse), *slopes,
                 *fold_args)
        if pieces and not merged_dst:
            _merge_sums(incoming, piece_dst, grad_dst, grad_value if folded else None)
            if row_sums:
                _merge_sums(incoming, piece_sums, attr_sums)
    if folded:
        return grad_value, beta_terms, grad_dst, grad_attr, attr_sums
    return grad_value, grad_src, grad_dst, grad_attr, attr_sums


# The arguments of the row-sum launch's prepared form (:func:`_row_sums`) that change from call to call.
ROW_SUMS_DYNAMIC = ("values_ptr", "out_ptr", "piece_out_ptr", "piece_count_ptr")


def _row_sums(schedule, key: tuple, plan: dict, grad_s: torch.Tensor, grad_dst: torch.Tensor,
              acc: torch.dtype) -> None:
    """GAT's ``∂er [N, H]``: ``grad_s`` (``∂z [E, H]`` in CSR order) summed per destination row into ``grad_dst``, in
    one launch (:func:`~gnnfuse.kernels.attention_backward.row_sums_kernel`: the light rows, then the pieces of split
    rows, merged by the last of each to finish, and the medium rows), prepared once per schedule and kind of call."""
    incoming = schedule.incoming
    light = incoming.light_all
    items = next(iter(_row_launches(incoming, True, True)), (*incoming.medium, 0, False))
    rows, starts, stops, count, pieces = items
    num_pieces = incoming.num_pieces if pieces else 0
    (light_programs,), light_meta = plan["row sums light"]  # no programs without light rows
    if not light_programs + count:
        return
    heads = grad_dst.shape[1]
    piece_out = _new_output((num_pieces, heads), acc, grad_dst.device) if num_pieces else grad_dst
    where = (key, "row sums")
    prepared = _prepared(schedule, where, plan) or _prepare(
        schedule, where, plan, row_sums_kernel, (light_programs + count,), ROW_SUMS_DYNAMIC, {
            "light_rows_ptr": light[0], "light_starts_ptr": light[1], "light_stops_ptr": light[2],
            "num_light": light[0].numel(), "light_programs": light_programs, "rows_ptr": rows, "starts_ptr": starts,
            "stops_ptr": stops, "num_items": count, "num_pieces": num_pieces, "W": heads,
            "piece_super_ptr": incoming.piece_super, "piece_ptr": incoming.super_piece_ptr,
            "LIGHT_ROWS": light_meta["ROWS"], "LIGHT_E": light_meta["BLOCK_E"], "BLOCK_E": plan["row sums"]["BLOCK_E"],
            "BLOCK_W": plan["row sums"]["BLOCK_W"], "MERGE_P": plan["row sums"]["MERGE_P"]})
    prepared(grad_s, grad_dst, piece_out, _piece_counts(incoming, bool(num_pieces), grad_dst))


# CSR positions per program of the edge-terms pass (kernels/edge_features.py ``edge_terms_kernel``): on the GPU a
# block of a few destinations' edges; under the interpreter, where every program costs Python time, larger.
# The pass replaced the source pass's per-edge projection.  Session 18 (H100, arxiv-like, 16 edge features, same
# call, replayed forward / training step µs, against session 17's tree): bf16 922 / 4567 -> 854 / 2930 (with the
# 2-byte projections on the tensor cores and the dW_e grid below), fp32 1428 / 5783 -> 1428 / 4845; 32 positions
# a program against 64: bf16 step 2911 against 2930, fp32 4836 against 4845.  Session 20 (H200, after the row kernels'
# changes, same call, training step µs): bf16 64 positions 2348 / 2349 against 2410 / 2412 for 32 (call 7, alternating
# rows; call 4: 2351 against 2410), 16 positions 2432; fp32 64 positions 3922 against 3908 (call 4).  So 2-byte floats
# take the second constant.
EDGE_TERMS_BLOCK = 32
EDGE_TERMS_BLOCK_2BYTE = 64
EDGE_TERMS_BLOCK_INTERPRETED = 512  # 0: the GPU's blocks under the interpreter too
# The per-edge form holds each position's projected edge and its destination's q and g rows: 164 registers for sm_90
# (64 positions, 4 warps, bf16; 3 programs per multiprocessor), latency-bound (229 µs of the arxiv-like bf16 step with
# 16 edge features, H200).  A form per destination (W q̃ and W g once per destination row, windows of 2 or 4 node ids,
# the next window prefetched, each position's terms one TF32-part product: 86-100 registers) was built in session 36
# and timed in session 37 (call 1, same call, H200, kernel times): 1008 µs in bf16 and 1020 in fp32 against the
# per-edge form's 228 — its windows run one after another — so it was removed (JOURNAL "Session 37").  Nor is the
# per-edge form bound by its registers: 4 or 2 heads a program (94 / 54 registers in bf16; each CSR block's head blocks
# side by side) ran 230.6 / 250.5 µs in bf16 and 446 (4 heads) / 500 (2 heads, 64 positions) in fp32 against 228 / 419
# (session 37 call 3; removed), and 8 warps (96 registers) 302 µs, 32 positions (72 registers) 289 (call 5).  Nsight
# Compute (call 4, bf16): L1 66% busy, DRAM 23%, 45% of the stalls waiting on the gathered q and g rows.


def _width_key(t: torch.Tensor) -> int:
    """The key of the tables kept by element size (EDGE_WEIGHT_GRAD_*): 2 for float16 / bfloat16,
    4 otherwise (float64 takes float32's entry)."""
    return 2 if t.dtype in TWO_BYTE_DTYPES else 4


def _csr_edge_block(inputs: AttentionInputs) -> int:
    """CSR positions a program of the per-edge passes takes (:func:`_csr_edge_pass`, :func:`attention_weights`)."""
    if backend.INTERPRET and EDGE_TERMS_BLOCK_INTERPRETED:
        return EDGE_TERMS_BLOCK_INTERPRETED
    return EDGE_TERMS_BLOCK_2BYTE if inputs.value.element_size() == 2 else EDGE_TERMS_BLOCK


def _csr_edge_pass(kernel, graph: Graph, inputs: AttentionInputs, tensors: tuple, schedule) -> None:
    """Launch one of the CSR-order edge-feature passes of :mod:`gnnfuse.kernels.edge_features` over every
    CSR position, :data:`EDGE_TERMS_BLOCK` (2-byte values: :data:`EDGE_TERMS_BLOCK_2BYTE`) a program:
    ``kernel(csr_dst, csr_eid, *tensors, E, H, D, K, scale, feat_stride, ...)``."""
    num_edges = graph.num_edges
    heads, head_dim = inputs.value.shape[1], inputs.value.shape[2]
    block = _csr_edge_block(inputs)
    kernel[(cdiv(num_edges, block),)](
        graph.csr_dst, graph.csr_eid, *tensors, num_edges, heads, head_dim, inputs.edge_dim, inputs.scale,
        inputs.feat_stride, BLOCK_P=block, BLOCK_H=schedule.block_h, BLOCK_D=schedule.block_d,
        **_edge_flags(inputs, schedule.block_h, schedule.block_d, block),
    )


def _edge_terms(graph: Graph, inputs: AttentionInputs, grad_out: torch.Tensor, acc: torch.dtype,
                schedule) -> torch.Tensor:
    """``[E, 2, H]`` in ``acc``: per CSR position ``p`` and head, ``t_p = q̃_i · e_p`` and ``r_p = g_i · e_p``
    (``i`` the edge's destination, ``e_p`` its projected features, ``q̃ = scale · q``), the source pass's
    edge-feature terms."""

    terms = _new_output((max(graph.num_edges, 1), 2, inputs.value.shape[1]), acc, inputs.value.device)
    if graph.num_edges:
        _csr_edge_pass(edge_terms_kernel, graph, inputs,
                       (inputs.edge_attr, inputs.edge_weight, inputs.dst_term, grad_out, terms), schedule)
    return terms


def _edge_attr_grad(graph: Graph, inputs: AttentionInputs, grad_out: torch.Tensor, terms: torch.Tensor,
                    grad_s: torch.Tensor, grad_attr: torch.Tensor, schedule) -> None:
    """``∂edge_attr [E, K]`` (input edge order) from ``α'`` (``terms[:, 0]``, as the source pass leaves it)
    and ``∂s`` per CSR position: :func:`~gnnfuse.kernels.edge_features.edge_attr_grad_kernel`."""

    if graph.num_edges:
        _csr_edge_pass(edge_attr_grad_kernel, graph, inputs,
                       (inputs.edge_weight, inputs.dst_term, grad_out, terms, grad_s, grad_attr), schedule)


# CSR positions a program of GATv2's edge-gradient pass walks (kernels/edge_features.py ``gatv2_edge_grad_kernel``), in
# blocks of GATV2_EDGE_GRAD_BLOCK (under the interpreter the per-edge passes' block, :func:`_csr_edge_block`): its ∂W_e
# partials are programs × H·D·K, summed after it.  sm_90 (Triton 3.6, 8 heads × 16, 16 edge features) compiled the
# session-43 kernel (which projected and gathered) at 64 positions a block to 255 registers and 712 bytes of spills a
# thread (bf16), at 32 (fp32) to 168 and none; session 44's at 64 to 167 (fp32) / 235 (bf16), no spills.  H200,
# arxiv-like, PyG GATv2Conv edge_dim=16 training step (session 43 call 3, gnn-gatv2-edge-sweep.s43c3.log, kernel µs
# fp32 / bf16): 32 a block × 2048 a program 2291.0 / 2275.2; × 512 2007.9 / 2256.4; × 128 1971.9 / 2285.8; 16 × 512
# 1930.7 / 2237.7 (taken then).  Session 44 call 2 (the pass without projection or gathers, its products in TF32 parts;
# gnn-gatv2-edge-sweep.s44c2.log): 16 × 512 950.8 / 937.6, 16 × 128 1002.5 / 990.0, 32 × 512 621.0 / 636.6, 32 × 2048
# 649.8 / 730.1, 64 × 1024 519.8 / 512.8 (taken).
GATV2_EDGE_GRAD_EDGES = 1024
GATV2_EDGE_GRAD_BLOCK = 64


def _gatv2_edge_grads(graph: Graph, inputs: AttentionInputs, grad_s: torch.Tensor, slopes: torch.Tensor,
                      grad_attr: torch.Tensor | None, grad_weight: torch.Tensor | None, attn_parts: torch.Tensor,
                      schedule) -> None:
    """GATv2's edge-feature gradients from the source pass's ``∂s [E, H]`` and the forward's LeakyReLU slopes (``[E,
    W]`` bits, :func:`_slope_bits`; both in CSR order): ``∂edge_attr`` into ``grad_attr [E, K]`` (input edge order)
    where given, and from ``G [H·D, K] = Σ_p ∂s_p c_p ⊗ attr_p`` (``c_p = LeakyReLU'(z_p)``) ``∂W_e = a ⊙ G`` into
    ``grad_weight [H·D, K]`` (``lin_edge.weight``'s layout) where given, and ``e_p``'s share of ``∂attn``, ``Σ_k
    W_e[k] ⊙ G[:, k]``, added into the first row of the source pass's ``∂attn`` partials ``attn_parts [N, H, D]``
    (the rest of each edge's ``∂s ⊗ LeakyReLU(z)``, ``∂s ⊗ c ⊙ (fs_j + fd_i)``, is the source pass's).  One pass over
    the CSR positions (``gatv2_edge_grad_kernel``: nothing gathered but the edges' features), its programs' ``G``
    partials then added in a fixed order (deterministic, no atomics).  Correct under every schedule: each form of the
    source pass stores ``∂s`` at every CSR position, each form of the forward the slopes."""
    num_edges = graph.num_edges
    if num_edges == 0:
        return
    heads, head_dim = inputs.value.shape[1], inputs.value.shape[2]
    edge_dim = inputs.edge_dim
    block = _csr_edge_block(inputs) if backend.INTERPRET and EDGE_TERMS_BLOCK_INTERPRETED else GATV2_EDGE_GRAD_BLOCK
    per_program = block * max(1, GATV2_EDGE_GRAD_EDGES // block)
    programs = cdiv(num_edges, per_program)
    partial = _new_output((programs, heads * head_dim, edge_dim), grad_s.dtype, grad_s.device)
    gatv2_edge_grad_kernel[(programs,)](
        graph.csr_eid, slopes, inputs.attn, inputs.edge_attr, inputs.edge_weight, grad_s,
        grad_s if grad_attr is None else grad_attr, partial, num_edges, heads, head_dim, edge_dim,
        inputs.negative_slope, per_program, BLOCK_P=block, BLOCK_H=schedule.block_h, BLOCK_D=schedule.block_d,
        **_edge_flags(inputs, schedule.block_h, schedule.block_d, block, "gradient"), ATTR_GRAD=grad_attr is not None,
        SLOPE_BITS=_slope_bits(schedule)[0],
    )
    # G [H·D, K]: fusecore's column sum of the partials (torch's sum(0) of such [programs, W] blocks is the slow one,
    # session 24)
    sums = column_sum(partial.view(programs, -1)).view(heads * head_dim, edge_dim)
    if grad_weight is not None:
        torch.mul(sums, inputs.attn.reshape(-1, 1).to(sums.dtype), out=grad_weight)
    weight = inputs.edge_weight.reshape(edge_dim, heads * head_dim).t()                             # [H·D, K]
    attn_parts.view(attn_parts.shape[0], -1)[0] += (weight.to(sums.dtype) * sums).sum(dim=1)


def _backward_plan(schedule, inputs: AttentionInputs, dtype: torch.dtype, use_dropout: bool,
                   weight_grad: bool, mixed: bool, merged_src: bool, merged_dst: bool,
                   factor_grad: bool = False) -> dict:
    """The backward's launches (:func:`_launch_plan`) by part: the source pass's light classes and
    row-kernel launches, then GAT's ``∂er`` row sums or the destination pass's light classes and
    row-kernel launches (``mixed``: :data:`ROW_LAUNCH_MIXED`; ``merged_*``: :data:`PIECE_MERGE_IN_ROWS`)."""
    block_h, block_d = schedule.block_h, schedule.block_d
    heads, head_dim = inputs.value.shape[1:]
    flags = _flags(inputs, use_dropout)
    lanes = row_kernel_lanes(schedule, inputs.score, "backward", dtype)
    _, row_block_e = _tile_budget(schedule, inputs, "source")
    value_tiles = _sum_tiles(heads * head_dim, MERGE_TILE_INSIDE)
    src_tiles = _sum_tiles(heads if inputs.score == SCORE_GAT else heads * head_dim, MERGE_TILE_INSIDE)
    src_flags = {**flags, **_factor_flags(inputs, factor_grad), **_edge_score_flags(inputs)}
    plan = {
        "source light": _light_plan(schedule, inputs, schedule.outgoing, "source", src_flags),
        "source rows": [{"BLOCK_E": row_block_e, "BLOCK_H": block_h, "BLOCK_D": block_d, "PIECES": pieces, **src_flags,
                         "LANES": lanes,
                         "PREFETCH": inputs.score in ROW_BACKWARD_PREFETCH_SCORES,
                         **_row_projection(inputs, schedule, row_block_e, "source"),
                         **_row_options(schedule, "source", inputs),
                         **({"MERGE": True, "MERGE_P": value_tiles[0], "MERGE_W": value_tiles[1],
                             "SRC_P": src_tiles[0], "SRC_W": src_tiles[1]} if merged_src and pieces else {})}
                        for *_, pieces in _row_launches(schedule.outgoing)],
    }
    incoming = schedule.incoming
    if inputs.score == SCORE_GAT:
        # a whole feature tile of rows per program, whatever the light classes' cap (TileLimits.max_light_rows)
        per_program = max(1, schedule.tiles.tile_elements // (ROW_SUM_LIGHT_EDGES * block_h))
        plan["row sums light"] = ((cdiv(incoming.light_all[0].numel(), per_program),), {
            "ROWS": per_program, "BLOCK_E": ROW_SUM_LIGHT_EDGES, "BLOCK_W": block_h, "PIECES": False})
        plan["row sums"] = {"ROWS": 1, "BLOCK_W": block_h, "MERGE_P": _sum_tiles(block_h, MERGE_TILE_INSIDE)[0],
                            "BLOCK_E": max(16, min(ROW_SUM_MAX_EDGES, schedule.tiles.tile_elements // block_h))}
        return plan
    # GATv2's edge features: no per-row sums (its ∂W_e is _gatv2_edge_grads')
    flags = {**_score_flags(inputs), "WEIGHT_GRAD": weight_grad and not _gatv2_edges(inputs)}
    _, row_block_e = _tile_budget(schedule, inputs, "destination")
    plan["destination light"] = _light_plan(schedule, inputs, incoming, "destination", flags)
    sums_tiles = _sum_tiles(2 * heads * inputs.edge_dim, MERGE_TILE_INSIDE)
    plan["destination rows"] = [
        {"BLOCK_E": row_block_e, "BLOCK_H": block_h, "BLOCK_D": block_d, "PIECES": pieces, **flags,
         "BLOCK_K": _block_k(inputs), "LANES": lanes, "PREFETCH": inputs.score in ROW_BACKWARD_PREFETCH_SCORES,
         **_row_edge_options(inputs, "destination"), **_row_projection(inputs, schedule, row_block_e, "destination"),
         **_row_options(schedule, "destination", inputs),
         **({"MERGE": True, "MERGE_P": value_tiles[0], "MERGE_W": value_tiles[1], "SUMS_P": sums_tiles[0],
             "SUMS_W": sums_tiles[1]} if merged_dst and pieces == 2 else {})}
        for *_, pieces in _row_launches(incoming, mixed, merged_dst)]
    return plan


# The edge weight's gradient (kernels/edge_features.py ``edge_weight_grad_kernel``), by the element size of the
# features g and q (2: float16 / bfloat16; 4: float32, and float64 whose products are always "ieee"):
# * NODES: nodes per program (each program one head); under the interpreter, where every program costs Python time,
#   NODES_INTERPRETED.  Session 18 (H100, arxiv-like, Nsight Compute): all heads in one program of 1024 nodes, 166
#   programs, took 282 µs (8% occupancy, latency-bound).
# * PRODUCT: "tf32x3", the products on the tensor cores at about float32's accuracy (fusecore.linear.split_dot; two
#   products a pair where g and q come in a 2-byte float), or "ieee", on the CUDA cores.  The "ieee" form compiles for
#   sm_90 to one shared-memory read per multiply-add (256 of each per thread and node block).
# * HEADS_FIRST: the H programs of one node block launched together (they read the same lines of the sums), instead of
#   every node block of head 0 first.
# Session 36 (H200, arxiv-like Transformer with 16 edge features, same call, replayed training step µs; kernel times):
# bf16 "ieee" / node blocks first / 256 nodes 2384.1 (the kernel 216.0 µs), "tf32x3" / heads first / 256 2313.8
# (148.0), the same node blocks first 2319.9, 1024 nodes 2273.4, 2048 nodes 2275.8; fp32 "ieee" / node blocks first /
# 256 3574.4, "tf32x3" / heads first / 256 3615.7, the same at 1024 nodes 3576.3 — float32 keeps the CUDA cores.
EDGE_WEIGHT_GRAD_NODES = {2: 2048, 4: 256}
EDGE_WEIGHT_GRAD_NODES_INTERPRETED = 8192  # 0: the GPU's under the interpreter too
EDGE_WEIGHT_GRAD_PRODUCT = {2: "tf32x3", 4: "ieee"}
EDGE_WEIGHT_GRAD_HEADS_FIRST = {2: True, 4: False}


def edge_weight_grad(
    attr_sums: torch.Tensor, grad_out: torch.Tensor, query: torch.Tensor, scale: float
) -> torch.Tensor:
    """``∂W_e = Σ_i A_i ⊗ g_i + B_i ⊗ (scale · q_i)`` per head, from the destination pass's ``attr_sums
    [N, 2, H, K]`` (:mod:`gnnfuse.kernels.edge_features`), as ``[H·D, K]`` (``lin_edge.weight``'s layout, so
    autograd keeps it as the parameter's gradient without a copy): a deterministic reduction over nodes in
    the accumulation dtype — per-head products over node blocks (``edge_weight_grad_kernel``, each byte of
    the sums, ``g`` and ``q`` read once), then the blocks' partials added in a fixed order."""

    num_nodes, _, heads, edge_dim = attr_sums.shape
    head_dim = grad_out.shape[2]
    acc = attr_sums.dtype
    if num_nodes == 0:
        return torch.zeros(heads * head_dim, edge_dim, dtype=acc, device=attr_sums.device)
    width = _width_key(grad_out)
    interpreted = backend.INTERPRET and EDGE_WEIGHT_GRAD_NODES_INTERPRETED
    nodes = EDGE_WEIGHT_GRAD_NODES_INTERPRETED if interpreted else EDGE_WEIGHT_GRAD_NODES[width]
    precision = EDGE_WEIGHT_GRAD_PRODUCT[width]
    if precision not in ("tf32x3", "ieee"):
        raise ValueError(f"gnnfuse.ops.EDGE_WEIGHT_GRAD_PRODUCT[{width}] must be 'tf32x3' or 'ieee', got {precision!r}")
    precision = "ieee" if acc == torch.float64 else precision
    heads_first = EDGE_WEIGHT_GRAD_HEADS_FIRST[width]
    programs = cdiv(num_nodes, nodes)
    partial = _new_output((programs, heads * head_dim, edge_dim), acc, attr_sums.device)
    grid = (heads, programs) if heads_first else (programs, heads)
    edge_weight_grad_kernel[grid](
        attr_sums, grad_out.contiguous(), query, partial, num_nodes, heads, head_dim, edge_dim, scale,
        query.stride(0), nodes, BLOCK_N=64, BLOCK_K=max(MIN_DOT, next_power_of_2(edge_dim)),
        BLOCK_D=max(MIN_DOT, next_power_of_2(head_dim)), DOT_PRECISION=precision,
        HEADS_FIRST=heads_first, CVT=linear_module.held_split() if precision == "tf32x3" else 0,
    )
    return partial[0] if programs == 1 else partial.sum(dim=0)


@dataclass
class AttentionRequest:
    """The schedule argument of a fused-attention Function that also asks its forward for the
    attention weights (:func:`attention_weights`): ``weights`` is set by the forward.  ``dropped``:
    the weights the aggregation used (the dropout mask and keep scale applied); else the softmax."""

    schedule: ScheduleOptions | None
    dropped: bool = True
    weights: torch.Tensor | None = None


def _requested(schedule: ScheduleOptions | None, return_attention: bool, attention_dropout: bool):
    """The Function's schedule argument: ``schedule``, or an :class:`AttentionRequest` carrying it."""
    if not isinstance(return_attention, bool):
        raise TypeError(f"return_attention must be a bool, got {return_attention!r}")
    if not isinstance(attention_dropout, bool):
        raise TypeError(f"attention_dropout must be a bool, got {attention_dropout!r}")
    return AttentionRequest(schedule, attention_dropout) if return_attention else schedule


def _with_weights(out: torch.Tensor, request) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``out``, or ``(out, weights)`` when ``request`` is an :class:`AttentionRequest`."""
    return (out, request.weights) if isinstance(request, AttentionRequest) else out


def _reference_weights(request) -> str | None:
    """The reference functions' ``weights`` argument for a Function's schedule argument."""
    if not isinstance(request, AttentionRequest):
        return None
    return "dropped" if request.dropped else "softmax"


def _reference_result(result: tuple, dtype: torch.dtype, request):
    """A reference function's ``(out, lse[, α])`` as an op returns it, in ``dtype``."""
    out = result[0].to(dtype)
    return (out, result[2].to(dtype)) if isinstance(request, AttentionRequest) else out


def attention_weights(graph: Graph, inputs: AttentionInputs, lse: torch.Tensor, dropout_p: float,
                      seed: int | torch.Tensor, offset: int, options: ScheduleOptions | None,
                      dropped: bool = True) -> torch.Tensor:
    """The attention weights ``α [E, H]`` of a forward over ``graph`` from its ``lse`` and launch arguments,
    in the values' dtype and the graph's input edge order (:mod:`gnnfuse.kernels.attention_weights`):
    ``α_p = exp(s_p − lse_i)``, with ``dropped`` times the forward's dropout mask and keep scale (and its per-edge
    factor, ``inputs.edge_factor``); ``s_p`` with GAT's per-edge term ``inputs.edge_score`` where the forward had it.
    Not part of any autograd graph."""
    value = inputs.value
    num_edges, heads, head_dim = graph.num_edges, value.shape[1], value.shape[2]
    alpha = _new_output((num_edges, heads), value.dtype, value.device)
    if num_edges == 0:
        return alpha
    schedule = graph.schedule(heads, head_dim, value.dtype, options)
    if not dropped:
        dropout_p = 0.0
    keep_scale, mode = _dropout_args(dropout_p, seed)
    block, warps = _attention_weights_tiling(inputs)
    factor = inputs.edge_factor if dropped and inputs.edge_factor is not None else None
    attention_weights_kernel[(cdiv(num_edges, block),)](
        graph.csr_dst, graph.csr_src, graph.csr_eid, *inputs.pointers(), lse, alpha,
        lse if factor is None else factor, lse if inputs.edge_score is None else inputs.edge_score,
        num_edges, heads, head_dim, inputs.edge_dim, inputs.negative_slope, inputs.scale, dropout_p, keep_scale, seed,
        offset, inputs.feat_stride, BLOCK_P=block, BLOCK_H=schedule.block_h, BLOCK_D=schedule.block_d,
        **_edge_flags(inputs, schedule.block_h, schedule.block_d, block), **_score_flags(inputs), DROPOUT=mode,
        num_warps=warps, **({"FACTOR": True} if factor is not None else {}), **_edge_score_flags(inputs),
    )
    return alpha


# CSR positions per program and warps of the attention-weights pass, by score kind (:data:`LIGHT_KINDS`, the edge-
# feature dot score as "edge") and feature width in bytes; absent: the per-edge passes' block (:func:`_csr_edge_block`:
# 32 positions for 4-byte features, 64 for 2-byte) and 4 warps.  Session 39 (H200, arxiv-like 8 × 16,
# tests/gnnfuse/weights_sweep.py, the pass alone, µs; calls 2 and 3, logs gnn-weights-sweep.s39c[23].log): GATv2 fp32
# 221.2 / 221.4 at the default against 205.3 at 16 positions and 2 warps (96% of its floor), bf16 269.2 against 153.0 /
# 153.5 at 32; the dot score fp32 260.8 / 261.3 against 197.5 at 8 positions (99.7%), bf16 170.9 against 139.6 at 8
# and 2 warps; AGNN's cosine fp32 236.1 / 236.1 against 216.0 at 8, bf16 174.7 against 154.4 at 8 and 2 warps.  GAT
# (44-69 µs whatever the tiling, the two calls apart by 50% at one setting) and the edge-feature dot score (fp32 445.1 /
# 444.8, bf16 411.3 at the defaults, none faster) keep the defaults.
ATTENTION_WEIGHTS_BLOCK: dict[object, dict[int, int]] = {
    SCORE_GATV2: {4: 16, 2: 32}, SCORE_DOT: {4: 8, 2: 8}, LIGHT_COSINE: {4: 8, 2: 8}}
ATTENTION_WEIGHTS_WARPS: dict[object, dict[int, int]] = {SCORE_GATV2: {4: 2}, SCORE_DOT: {2: 2}, LIGHT_COSINE: {2: 2}}


def _attention_weights_tiling(inputs: AttentionInputs) -> tuple[int, int]:
    """(positions per program, warps) of :func:`attention_weights` for ``inputs``."""
    kind = "edge" if inputs.has_edge else _light_kind(inputs)
    width = inputs.value.element_size()
    block = _csr_edge_block(inputs)
    if not (backend.INTERPRET and EDGE_TERMS_BLOCK_INTERPRETED):
        block = ATTENTION_WEIGHTS_BLOCK.get(kind, {}).get(width, block)
    return block, ATTENTION_WEIGHTS_WARPS.get(kind, {}).get(width, 4)


def _forward_saving(ctx, graph: Graph, inputs: AttentionInputs, launch: tuple, differentiable: int,
                    *saved: torch.Tensor, add_index: int | None = None) -> torch.Tensor:
    """The forward of every fused-attention autograd Function: run :func:`attention_forward`,
    save ``saved`` + ``(out, lse)`` and the launch configuration ``(dropout_p, seed, offset,
    options)`` (a device pair is kept as it is: the backward regenerates the same mask from it);
    nothing per edge is saved but GATv2's scores and slopes with edge features (:func:`_gatv2_saves`).

    When any of the first ``differentiable`` inputs needs a gradient (``ctx.attention_grads``),
    ``out`` is kept in the accumulation dtype for the backward's ``δ = <g, out>`` (float16 /
    bfloat16 rounding of ``out`` would be amplified by the softmax-gradient cancellation), without
    ``out_add`` (the Function's input ``add_index``); the returned output ``out (+ out_add)`` in the
    values' dtype is the kernels' second store (``final``), not a cast and an add of their own.  The
    addend's gradient comes from :func:`_addend_grad`.
    """
    value = inputs.value
    add = inputs.out_add
    acc = accumulation_dtype(value.dtype)
    training = (any(ctx.needs_input_grad[:differentiable]) or getattr(ctx, "factor_grad", False)
                or getattr(ctx, "score_grad", False))
    ctx.attention_grads = training
    ctx.add_grad = add is not None and ctx.needs_input_grad[add_index]
    ctx.add_per_node = add is not None and add.dim() == 3
    ctx.add_dtype = None if add is None else add.dtype
    final = None
    if training and (add is not None or value.dtype != acc):
        final = _new_output(tuple(value.shape), value.dtype, value.device)
    request = launch[3] if isinstance(launch[3], AttentionRequest) else None
    if request is not None:
        launch = (*launch[:3], request.schedule)
    ctx.gatv2_saves = _gatv2_saves(graph, inputs, launch[3]) if training else None
    out, lse = attention_forward(graph, inputs, *launch, acc if training else value.dtype, final=final,
                                 saves=ctx.gatv2_saves)
    if request is not None:
        request.weights = attention_weights(graph, inputs, lse, *launch, dropped=request.dropped)
    ctx.save_for_backward(*saved, out, lse)
    ctx.graph = graph
    ctx.launch = launch
    return out if final is None else final


def _backward_saved(ctx, inputs: AttentionInputs, grad_out: torch.Tensor,
                    grad_value_dtype: torch.dtype | None = None, edge_grads: tuple[bool, bool] = (True, True),
                    bias_parts: torch.Tensor | None = None,
                    term_grad_dtypes: tuple[torch.dtype | None, torch.dtype | None] = (None, None),
                    grad_targets: tuple | None = None, grad_out_copy: torch.Tensor | None = None,
                    grad_factor: torch.Tensor | None = None,
                    grad_scores: torch.Tensor | None = None,
                    bias_sum: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """:func:`attention_backward` from what :func:`_forward_saving` kept (``out``, ``lse`` last; the per-edge factor
    of :func:`_edge_factor` and score term of :func:`_edge_score`, each put in reverse-CSR order here by one gather)."""
    out, lse = ctx.saved_tensors[-2:]
    factor = getattr(ctx, "edge_factor", None)
    factor_rev = None if factor is None else factor.index_select(0, ctx.graph.rev_pos)
    edge_score = getattr(ctx, "edge_score", None)
    score_rev = None if edge_score is None else gather_rows(edge_score, ctx.graph.rev_pos)
    return attention_backward(ctx.graph, inputs, lse, out, grad_out.contiguous(), *ctx.launch, grad_value_dtype,
                              edge_grads, bias_parts, term_grad_dtypes, grad_targets, grad_out_copy, factor_rev,
                              grad_factor, score_rev, grad_scores, getattr(ctx, "gatv2_saves", None), bias_sum)


def _edge_factor(ctx, graph: Graph, edge_weight: torch.Tensor | None, acc: torch.dtype, index: int
                 ) -> torch.Tensor | None:
    """A Function's per-edge factor (:attr:`AttentionInputs.edge_factor`): ``edge_weight [E]`` (input edge order,
    checked by :func:`_check_edge_weight`) in CSR order and the accumulation dtype, kept on ``ctx`` with whether the
    Function's input ``index`` (the weight) needs its gradient (``ctx.factor_grad``, which :func:`_forward_saving`
    reads)."""
    ctx.factor_grad = edge_weight is not None and ctx.needs_input_grad[index]
    if edge_weight is None:
        ctx.edge_factor = None
        return None
    ctx.edge_weight_dtype = edge_weight.dtype
    ctx.edge_factor = edge_weight.to(acc).index_select(0, graph.csr_eid)
    return ctx.edge_factor


def _factor_grad_buffer(ctx) -> torch.Tensor | None:
    """The ``[E]`` reverse-CSR-order buffer the source pass fills with the factor's gradient, when one is needed."""
    return _new_output(tuple(ctx.edge_factor.shape), ctx.edge_factor.dtype, ctx.edge_factor.device) if (
        ctx.factor_grad) else None


def _edge_weight_grad(ctx, grad_factor: torch.Tensor | None) -> torch.Tensor | None:
    """``∂edge_weight`` in the caller's edge order and dtype from the source pass's reverse-CSR-order
    ``grad_factor`` (one gather through :attr:`Graph.eid_rev_pos`)."""
    if grad_factor is None:
        return None
    return grad_factor.index_select(0, ctx.graph.eid_rev_pos).to(ctx.edge_weight_dtype)


def _edge_score(ctx, graph: Graph, edge_score: torch.Tensor | None, acc: torch.dtype, index: int, csr: bool
                ) -> torch.Tensor | None:
    """A GAT Function's per-edge score term (:attr:`AttentionInputs.edge_score`): ``edge_score [E, H]`` (checked by
    :func:`_check_edge_score`; input edge order, or CSR order already when ``csr``) in CSR order and the accumulation
    dtype, kept on ``ctx`` with whether the Function's input ``index`` (the term) needs its gradient
    (``ctx.score_grad``, which :func:`_forward_saving` reads) and in which order it came (``ctx.score_csr``)."""
    ctx.score_grad = edge_score is not None and ctx.needs_input_grad[index]
    ctx.score_csr = csr
    if edge_score is None:
        ctx.edge_score = None
        return None
    ctx.edge_score_dtype = edge_score.dtype
    edge_score = edge_score.to(acc)
    ctx.edge_score = edge_score.contiguous() if csr else gather_rows(edge_score, graph.csr_eid)
    return ctx.edge_score


def _score_grad_buffer(ctx) -> torch.Tensor | None:
    """The ``[max(E, 1), H]`` CSR-order buffer of the source pass's per-edge ``∂L/∂z`` (:func:`attention_backward`'s
    ``grad_scores``), when the score term needs its gradient."""
    if not ctx.score_grad:
        return None
    num_edges, heads = ctx.edge_score.shape
    return _new_output((max(num_edges, 1), heads), ctx.edge_score.dtype, ctx.edge_score.device)


def _edge_score_grad(ctx, grad_scores: torch.Tensor | None) -> torch.Tensor | None:
    """``∂edge_score [E, H]`` in the caller's edge order and dtype: the source pass's ``∂L/∂z`` at CSR position ``p``
    belongs to input edge ``csr_eid[p]`` (one scatter; a cast first where the caller's dtype is narrower), or to
    position ``p`` itself where the term came in CSR order."""
    if grad_scores is None:
        return None
    num_edges = ctx.graph.num_edges
    if ctx.score_csr:
        return grad_scores[:num_edges].to(ctx.edge_score_dtype)
    return scatter_rows(grad_scores[:num_edges].to(ctx.edge_score_dtype), ctx.graph.csr_eid, num_edges)


def _unpack(base: torch.Tensor, packing: tuple) -> list[torch.Tensor | None]:
    """The ``[N, H, D]`` column blocks of ``base`` named by ``packing = (H, D, offsets)``
    (:func:`_packed_columns`; None where an offset is None)."""
    heads, head_dim, offsets = packing
    return [None if o is None else _column_block(base, o, heads, head_dim) for o in offsets]


def _packed_gradient(base: torch.Tensor, packing: tuple) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """``(∂base, its blocks)``: a new ``[N, W]`` gradient (zero-filled where the blocks leave columns
    uncovered) and its column blocks, into which the backward stores each block's gradient."""
    heads, head_dim, offsets = packing
    covered = heads * head_dim * sum(o is not None for o in offsets)
    grad = (_new_output(tuple(base.shape), base.dtype, base.device) if covered == base.shape[1]
            else torch.zeros_like(base))
    return grad, _unpack(grad, packing)


def _bias_grad_wanted(ctx) -> bool:
    """Whether the Function's addend is an ``[H, D]`` bias that needs its gradient ``Σ_n g_n``."""
    return ctx.add_grad and not ctx.add_per_node


def _addend_grad(ctx, grad_out: torch.Tensor, bias_sum: torch.Tensor | None) -> torch.Tensor | None:
    """The gradient of a Function's ``out_add`` in its caller's shape (:func:`_addend_layout`): ``g``
    itself for a per-node term, ``Σ_n g_n`` for an ``[H, D]`` bias (``bias_sum`` from
    :func:`attention_backward`'s ``δ`` kernel, or summed here when no attention gradient was needed); None when
    it needs none."""
    if not ctx.add_grad:
        return None
    if ctx.add_per_node:
        return grad_out.to(ctx.add_dtype).view(ctx.add_shape)
    if bias_sum is None:
        rows = grad_out.reshape(grad_out.shape[0], -1)
        bias_sum = column_sum(rows, accumulation_dtype(grad_out.dtype)).view(grad_out.shape[1:])
    return bias_sum.to(ctx.add_dtype).view(ctx.add_shape)


class _NoGradContext:
    """What a Function's ``forward`` is given in place of autograd's context when no input needs a
    gradient (:func:`_apply`): attributes set on it are dropped with it, nothing is saved."""

    def __init__(self, inputs: int):
        self.needs_input_grad = (False,) * inputs

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        pass


def _apply(function: type[torch.autograd.Function], *args):
    """``function.apply(*args)``, or, when autograd records nothing (grad mode off, or no tensor
    input requiring a gradient) and torch.compile is not tracing, its ``forward`` called directly:
    the same kernels and output without autograd's per-call machinery (~8 µs of host time per call
    on a development CPU, more on a GPU machine's host)."""
    if (torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)) or (
            torch.compiler.is_compiling()):
        return function.apply(*args)
    return function.forward(_NoGradContext(len(args)), *args)


_NO_GRADS = (None,) * 6  # the graph and the five launch arguments of every attention Function


class GATAttentionFunction(torch.autograd.Function):
    """Autograd wrapper of the GAT attention from ``(wh, el, er)``: forward saves ``wh, el, er,
    out, lse`` (no per-edge tensor)."""

    @staticmethod
    def forward(ctx, wh, el, er, graph, negative_slope, dropout_p, seed, offset, options,  # type: ignore[override]
                edge_weight, edge_score, score_csr):
        factor = _edge_factor(ctx, graph, edge_weight, el.dtype, 9)
        score = _edge_score(ctx, graph, edge_score, el.dtype, 10, score_csr)
        inputs = AttentionInputs(SCORE_GAT, el, er, wh, negative_slope=negative_slope, edge_factor=factor,
                                 edge_score=score)
        ctx.negative_slope = negative_slope
        return _forward_saving(ctx, graph, inputs, (dropout_p, seed, offset, options), 3, wh, el, er)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        wh, el, er = ctx.saved_tensors[:3]
        inputs = AttentionInputs(SCORE_GAT, el, er, wh, negative_slope=ctx.negative_slope,
                                 edge_factor=ctx.edge_factor, edge_score=ctx.edge_score)
        grad_factor = _factor_grad_buffer(ctx)
        grad_scores = _score_grad_buffer(ctx)
        grad_wh, grad_el, grad_er, *_ = _backward_saved(ctx, inputs, grad_out, grad_factor=grad_factor,
                                                        grad_scores=grad_scores)
        return (grad_wh, grad_el, grad_er, *_NO_GRADS, _edge_weight_grad(ctx, grad_factor),
                _edge_score_grad(ctx, grad_scores), None)


def _check_wh(graph: Graph, wh: torch.Tensor, name: str = "wh") -> None:
    if wh.dim() != 3:
        raise ValueError(f"{name} must have shape [num_nodes, heads, head_dim], got {tuple(wh.shape)}")
    num_nodes, heads, head_dim = wh.shape
    if num_nodes != graph.num_nodes:
        raise ValueError(f"{name} has {num_nodes} rows but the graph has num_nodes={graph.num_nodes}")
    if heads < 1 or head_dim < 1:
        raise ValueError(f"{name} must have at least one head and head_dim >= 1, got shape {tuple(wh.shape)}")


def _check_features(graph: Graph, wh: torch.Tensor, el: torch.Tensor, er: torch.Tensor) -> None:
    # el / er may differ from wh (they are cast to the accumulation dtype), so no "same" check.
    backend.check_dtypes(FLOAT_DTYPES, same=False, wh=wh, el=el, er=er)
    _check_wh(graph, wh)
    num_nodes, heads = wh.shape[0], wh.shape[1]
    for name, t in (("el", el), ("er", er)):
        if tuple(t.shape) != (num_nodes, heads):
            raise ValueError(f"{name} must have shape [num_nodes, heads] = {[num_nodes, heads]}, got {list(t.shape)}")


def _check_dropout(dropout: float, name: str = "dropout") -> float:
    if isinstance(dropout, bool) or not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
        raise ValueError(f"{name} must be a float in [0, 1), got {dropout!r}")
    return float(dropout)


def _check_negative_slope(negative_slope: float) -> float:
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, (int, float)) or not math.isfinite(
        negative_slope
    ):
        raise ValueError(f"negative_slope must be a finite float, got {negative_slope!r}")
    return float(negative_slope)


def _check_edge_weight(graph: Graph, edge_weight: torch.Tensor | None) -> torch.Tensor | None:
    """DGL GATConv's ``edge_weight``: a floating-point ``[E]`` tensor (one factor per edge, the graph's input edge
    order); ValueError / TypeError naming what is wrong otherwise."""
    if edge_weight is None:
        return None
    if not isinstance(edge_weight, torch.Tensor):
        raise TypeError(f"edge_weight must be a tensor of shape [num_edges] or None, got {type(edge_weight).__name__}")
    backend.check_dtypes(FLOAT_DTYPES, edge_weight=edge_weight)
    if tuple(edge_weight.shape) != (graph.num_edges,):
        raise ValueError(f"edge_weight must have shape [num_edges] = [{graph.num_edges}] (one factor per edge, in the "
                         f"graph's edge order), got {list(edge_weight.shape)}")
    return edge_weight


EDGE_SCORE_ORDERS = ("input", "csr")


def _check_edge_score_order(order: object) -> bool:
    """Whether ``edge_score_order`` (``'input'`` or ``'csr'``) says CSR order."""
    if not isinstance(order, str) or order not in EDGE_SCORE_ORDERS:
        raise ValueError(f"edge_score_order must be one of {EDGE_SCORE_ORDERS}, got {order!r}")
    return order == "csr"


def _input_order_score(graph: Graph, edge_score: torch.Tensor | None, csr: bool) -> torch.Tensor | None:
    """The reference path's ``edge_score`` in input edge order (a CSR-order term scattered back; differentiable)."""
    if edge_score is None or not csr:
        return edge_score
    return scatter_rows(edge_score, graph.csr_eid, graph.num_edges)


def _check_edge_score(graph: Graph, edge_score: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """GAT's per-edge score term (PyG GATConv's ``edge_dim``): a floating-point ``[E, H]`` tensor (the graph's input
    edge order); ValueError / TypeError naming what is wrong otherwise (its device: the ops' device check)."""
    if edge_score is None:
        return None
    if not isinstance(edge_score, torch.Tensor):
        raise TypeError(f"edge_score must be a tensor of shape [num_edges, heads] or None, got "
                        f"{type(edge_score).__name__}")
    backend.check_dtypes(FLOAT_DTYPES, edge_score=edge_score)
    if tuple(edge_score.shape) != (graph.num_edges, heads):
        raise ValueError(f"edge_score must have shape [num_edges, heads] = [{graph.num_edges}, {heads}] (one term per "
                         f"edge and head, in the graph's edge order), got {list(edge_score.shape)}")
    return edge_score


def _check_schedule(schedule: ScheduleOptions | None) -> None:
    if schedule is not None and not isinstance(schedule, ScheduleOptions):
        raise TypeError(f"schedule must be a gnnfuse.ScheduleOptions or None, got {type(schedule).__name__}")


@backend.eager_under_compile
def gat_attention(
    graph,
    wh: torch.Tensor,
    el: torch.Tensor,
    er: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    rng: PhiloxStream | DevicePhiloxStream | None = None,
    schedule: ScheduleOptions | None = None,
    return_attention: bool = False,
    attention_dropout: bool = True,
    edge_weight: torch.Tensor | None = None,
    edge_score: torch.Tensor | None = None,
    edge_score_order: str = "input",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused GAT attention over ``graph`` given per-node scores.

    ``wh``: ``[N, H, D]`` projected features (float16 / bfloat16 / float32 / float64);
    ``el``, ``er``: ``[N, H]`` source and destination terms (``a_l · Wh``, ``a_r · Wh``),
    cast to the accumulation dtype (float32, float64 for float64 features).
    ``dropout``: attention dropout probability; the mask for the edge at CSR position ``p``
    and head ``h`` is ``uniform(seed, p, offset + h) >= dropout`` where ``(seed, offset) =
    rng.take(H)`` (``rng`` default: a stream seeded from torch's generator).  A
    :class:`fusecore.DevicePhiloxStream` (on the features' device) keeps the pair on the device:
    the same masks as a ``PhiloxStream`` with its seed and offset, one tiny launch more per call,
    and a CUDA graph that captures the call draws a fresh mask on every replay (``gnnfuse.capture``).
    ``schedule``: :class:`~gnnfuse.schedule.ScheduleOptions` forcing the degree buckets.
    Returns ``out [N, H, D]`` in ``wh``'s dtype; nodes without incoming edges get zeros.
    ``return_attention``: also return the attention weights ``α [E, H]`` in the values' dtype and the graph's
    input edge order, formed from this forward's logsumexp by one pass over the edges
    (:func:`attention_weights`; not differentiable); ``attention_dropout``: with dropout on, the weights
    the aggregation used (mask and ``1 / (1 − dropout)`` applied, DGL's ``get_attention``), else the softmax
    itself (PyG's ``return_attention_weights``).
    ``edge_weight``: ``[E]`` (any float dtype, the graph's input edge order), DGL GATConv's per-edge factor on
    the attention: ``out_i = Σ_j dropout(α_ij) · w_ij · Wh_j`` — after the softmax and its dropout, so it does not
    renormalize; differentiable (``∂w_ij = Σ_h dropout(α_ij)[h] <∂out_i, Wh_j>[h]``, from the backward's source pass),
    and part of the weights ``return_attention`` hands back when they are the aggregation's.
    ``edge_score``: ``[E, H]`` (any float dtype, the graph's input edge order), a per-edge, per-head term added to
    the score before the LeakyReLU, ``s_ijh = LeakyReLU(el_j[h] + er_i[h] + ee_ijh)`` (PyG GATConv's ``edge_dim``:
    ``ee = (lin_edge(edge_attr).view(E, H, C) · att_edge).sum(-1)``); in the softmax, so in every weight
    ``return_attention`` hands back; differentiable: ``∂ee_ijh = ∂L/∂z_ijh`` (``s = LeakyReLU(z)``), the per-edge value
    the backward's source pass forms for ``∂er`` anyway, put in the caller's edge order by one scatter.
    ``edge_score_order``: ``'input'`` (the graph's input edge order, as above) or ``'csr'``: ``edge_score`` is already
    in the graph's CSR order (row ``p`` the edge ``graph.csr_eid[p]``, as :func:`gnnfuse.edge_score.edge_score_csr`
    forms it) and its gradient comes back in that order — no gather, no scatter.
    """
    graph = as_graph(graph)
    _check_features(graph, wh, el, er)
    edge_weight = _check_edge_weight(graph, edge_weight)
    edge_score = _check_edge_score(graph, edge_score, wh.shape[1])
    score_csr = _check_edge_score_order(edge_score_order)
    dropout = _check_dropout(dropout)
    negative_slope = _check_negative_slope(negative_slope)
    _check_schedule(schedule)
    request = _requested(schedule, return_attention, attention_dropout)
    acc = accumulation_dtype(wh.dtype)
    el = el.to(acc).contiguous()
    er = er.to(acc).contiguous()
    wh = wh.contiguous()
    seed, offset = _rng_pair(rng, dropout, wh.shape[1], wh.device)
    if backend.reference_enabled():
        from .reference import gat_attention_reference

        seed, offset = _host_pair(seed, offset)
        result = gat_attention_reference(
            graph, wh, el, er, negative_slope=negative_slope, dropout=dropout, seed=seed, offset=offset,
            weights=_reference_weights(request), edge_weight=edge_weight,
            edge_score=_input_order_score(graph, edge_score, score_csr),
        )
        return _reference_result(result, wh.dtype, request)
    backend.check_devices(wh=wh, el=el, er=er, edge_weight=edge_weight, edge_score=edge_score, graph=graph.indptr)
    out = _apply(GATAttentionFunction, wh, el, er, graph, float(negative_slope), dropout, seed, offset, request,
                 edge_weight, edge_score, score_csr)
    return _with_weights(out, request)


# Warps per program of the per-node backward kernels, by kernel (GAT's node scores) and element size of the features
# (4: float32, 2: 2-byte floats); absent: 4 (Triton's default).  At 4 warps on sm_90 (Triton 3.6, arxiv-like 8 × 16)
# GAT's holds 160 registers in float32 and 168 in bfloat16 (12 resident warps per multiprocessor; 101 / 79 at 8).
# Session 34 (H200, arxiv-like, same call, replayed step µs at 8 warps against 4): GAT bf16 709.1 / 715.7 (call 1),
# 708.5 and 708.4 / 716.9 and 716.6 (call 2, two rounds).  GAT fp32 lost: 1041.7 against 1035.6 (call 1), so it keeps
# 4.  (AGNN's normalization backward, which had its own entries and a register cap, is folded into the attention
# passes since session 51: kernels/normalize.py.)
NODE_BACKWARD_WARPS: dict[str, dict[int, int]] = {"node_scores": {2: 8}}


def _node_backward_options(kernel: str, features: torch.Tensor) -> dict:
    """Launch options of the per-node backward ``kernel`` (``"node_scores"``) on ``features``
    (:data:`NODE_BACKWARD_WARPS`)."""
    warps = NODE_BACKWARD_WARPS[kernel].get(features.element_size())
    return {"num_warps": warps} if warps else {}


def _node_tile_rows(heads: int, head_dim: int) -> tuple[int, int, int]:
    """(block_h, block_d, rows per program) of the per-node kernels: ~4096-element tiles."""
    block_h, block_d = next_power_of_2(heads), next_power_of_2(head_dim)
    return block_h, block_d, max(1, min(256, 4096 // (block_h * block_d)))


def _node_part_buffer(like: torch.Tensor, count: int) -> torch.Tensor:
    """``[count, P, H, D]`` in the accumulation dtype: per-program partial sums of the per-node
    kernels over ``like [N, H, D]`` (``P`` programs of :func:`_node_tile_rows`), ``count`` sums side
    by side so that one sum finishes them all (inside :func:`_node_scores_backward`'s launch, or ``.sum``)."""
    num_nodes, heads, head_dim = like.shape
    programs = cdiv(num_nodes, _node_tile_rows(heads, head_dim)[2])
    return _new_output((count, programs, heads, head_dim), accumulation_dtype(like.dtype), like.device)


# Programs per first-level group of the per-node kernels' own sums of their partials (fusecore.grid_sync.sum_partials),
# and the tile (rows x columns of the partials) a finishing program adds at a time: sm_90 (Triton 3.6, compiled on the
# CPU, GAT 8 x 16) with 2048-element tiles the bf16 node-score backward kept 16 bytes of local memory at 64 registers,
# with 1024 none (fp32: 142-143 registers either way).
NODE_SUM_GROUP = 64
NODE_SUM_TILE = 1024


def _finishing(count: int, programs: int, width: int, acc: torch.dtype, device: torch.device) -> tuple:
    """``(group, counts, meta)``: what a per-node launch of ``programs`` programs needs to finish the column sums of
    its ``count`` partial rows of ``width`` itself (:func:`fusecore.grid_sync.sum_partials`): the first level's
    ``[count, groups, width]`` buffer in ``acc``, the zeroed counts and the compile-time tiling."""
    groups = cdiv(programs, NODE_SUM_GROUP)
    block_w = min(next_power_of_2(width), NODE_SUM_TILE)
    return (_new_output((count, groups, width), acc, device),
            zeroed(None, "node sums", groups + 1, torch.int32, device),
            {"GROUP": NODE_SUM_GROUP, "SUM_P": max(1, NODE_SUM_TILE // block_w), "SUM_W": block_w})


def _head_dot(a: torch.Tensor, b: torch.Tensor, acc: torch.dtype, parts: torch.Tensor | None = None,
              copy: torch.Tensor | None = None, sums: torch.Tensor | None = None) -> torch.Tensor:
    """``Σ_d a · b`` per (node, head) of two contiguous ``[N, H, D]`` tensors, in ``acc``; with
    ``parts`` (one sum of :func:`_node_part_buffer`) also the per-program partial sums of ``a`` (summed by a later
    launch), or with ``sums`` (``[H, D]``, any float dtype) ``Σ_n a_n`` itself, summed inside the launch; and with
    ``copy`` (``[N, H, D]``, contiguous heads and features, any row stride) ``a`` stored into it, from the
    same read."""

    num_nodes, heads, head_dim = a.shape
    out = _new_output((num_nodes, heads), acc, a.device)
    block_h, block_d, rows = _node_tile_rows(heads, head_dim)
    programs = cdiv(num_nodes, rows)
    if not programs:
        if sums is not None:
            sums.zero_()
        return out
    group, counts, finish = out, out, {}
    if sums is not None:
        parts = _node_part_buffer(a, 1)
        group, counts, finish = _finishing(1, programs, heads * head_dim, parts.dtype, a.device)
        finish["FINISH"] = True
    head_dot_kernel[(programs,)](
        a, b, out, out if parts is None else parts, a if copy is None else copy, num_nodes, heads, head_dim,
        0 if copy is None else copy.stride(0), group, out if sums is None else sums, counts, programs, ROWS=rows,
        BLOCK_H=block_h, BLOCK_D=block_d, COLUMN_SUMS=parts is not None, COPY=copy is not None, **finish,
    )
    return out


def _node_scores_forward(wh: torch.Tensor, attn_l: torch.Tensor, attn_r: torch.Tensor):
    num_nodes, heads, head_dim = wh.shape
    acc = accumulation_dtype(wh.dtype)
    el = _new_output((num_nodes, heads), acc, wh.device)
    er = _new_output((num_nodes, heads), acc, wh.device)
    block_h, block_d, rows = _node_tile_rows(heads, head_dim)
    if num_nodes:
        node_scores_kernel[(cdiv(num_nodes, rows),)](
            wh, attn_l.contiguous(), attn_r.contiguous(), el, er, num_nodes, heads, head_dim,
            ROWS=rows, BLOCK_H=block_h, BLOCK_D=block_d,
        )
    return el, er


# GAT's projection with the node scores in its epilogue (kernels/projection.py), for float16 and
# bfloat16 inputs, and float32 ones where fusecore.linear's float32 products apply (tl.dot in three TF32
# parts: fusecore.linear.FLOAT32_PRODUCT; a plain float32 tl.dot would round through TF32), padded
# widths BLOCK_H·BLOCK_D from 16 (tl.dot's least) to PROJECTION_MAX_COLUMNS (one program holds a row
# block's every column in registers) and input rows 16-byte aligned (or, in 2-byte floats, read by alignment
# class: PROJECTION_ROW_CLASSES below).  Otherwise the projection is fusecore.linear's and a node-score pass reads
# Wh again.  Session 10 (H100,
# same-call A/B, replayed): GAT bf16 on the arxiv-like graph (128 features) 336.1 / 973.0 µs forward /
# training step against 346.9 / 984.1 unfused; on the Reddit-scale graph (602 features, rows 1204
# bytes apart: no vector loads) the layer's forward took 2.643 against session 9's 2.537 ms unfused,
# hence the alignment condition (not re-timed with it).
FUSED_PROJECTION = True
# float32 projections with a reduction of at most fusecore.linear.HELD_MAX_K: fusecore.linear's held-parts product
# with the node scores in each column block's epilogue (gnnfuse/kernels/projection.py), where the slice kernel
# splits W into its TF32 parts again for every slice.
PROJECTION_HELD = True
# 2-byte inputs whose rows are not 16 bytes apart (Reddit's 602 features: 1204 bytes) fused too, each program over
# rows of one alignment class (kernels/projection.py ``ROW_CLASSES``, Wᵀ read), so every row's aligned body loads 16
# bytes at a time, where the input has at least PROJECTION_CLASS_MIN_ROWS rows.  Session 28 (H100, kernel times,
# GAT bf16 forward): Reddit scale (233 K rows of 602) 129.1 µs + 2.9 for Wᵀ against torch's product (cuBLAS's
# 2-element-aligned kernel) 163.4 + the node-score pass 16.2, forward 1456 against 1497 µs; the fused kernel with plain
# loads of such rows took 284 µs (H200, session 24); 128 nodes a program 135.1 µs.  On Cora (2708 rows of 1433: 24-48
# programs, each walking all 1433 columns) 35.6 µs against 18.0 for cuBLAS's split product and the node scores.
PROJECTION_ROW_CLASSES = True
PROJECTION_CLASS_MIN_ROWS = 32768
PROJECTION_MAX_COLUMNS = 256
PROJECTION_BLOCK_M = 64  # nodes per program
PROJECTION_BLOCK_F = 64  # input features per tl.dot
PROJECTION_WARPS = 4
PROJECTION_STAGES = 3


def fuses_projection(x: torch.Tensor, weight: torch.Tensor, heads: int, head_dim: int) -> bool:
    """Whether :func:`gat` with ``weight`` projects ``x [N, F]`` by ``weight [H·D, F]`` and computes the
    node scores in one kernel (:func:`_projection_scores`); else fusecore.linear's product and a node-score
    pass."""
    width = next_power_of_2(heads) * next_power_of_2(head_dim)
    tensor_cores = x.dtype in TWO_BYTE_DTYPES or uses_product(x, weight)
    # rows 16 bytes apart (vector loads), or enough rows read by alignment class (:func:`_row_classes`)
    return (FUSED_PROJECTION and tensor_cores and weight.dtype == x.dtype
            and MIN_DOT <= width <= PROJECTION_MAX_COLUMNS and x.dim() == 2 and x.stride(1) == 1
            and x.data_ptr() % 16 == 0
            and (x.stride(0) * x.element_size() % 16 == 0
                 or (x.shape[0] >= PROJECTION_CLASS_MIN_ROWS and _row_classes(x) > 1)))


def _row_classes(x: torch.Tensor) -> int:
    """The projection kernel's ``ROW_CLASSES`` for ``x``: for a 16-byte aligned 2-byte input (with
    :data:`PROJECTION_ROW_CLASSES`), the rows after which a row starts at the same offset modulo 16 bytes — 1 for
    rows 16 bytes apart, up to 8 for rows an odd number of elements apart; else (and for rows of fewer than 16
    elements) 1: plain loads, any row stride."""
    if not PROJECTION_ROW_CLASSES or x.element_size() != 2 or x.data_ptr() % 16 or x.shape[1] < 16:
        return 1
    return 16 // math.gcd(x.stride(0) * 2, 16)


def _projection_held_tiling(x: torch.Tensor, weight: torch.Tensor, heads: int,
                            head_dim: int) -> tuple[int, int, int, int, int] | None:
    """fusecore.linear's held-parts tiling of the float32 projection ``[N, F] @ [F, H·D]`` where
    :func:`_projection_scores` runs it (:data:`PROJECTION_HELD`): its column blocks whole heads (``D`` a power of two
    dividing the block width, which divides ``H·D``); else None (the slice kernel)."""
    if not PROJECTION_HELD or x.dtype != torch.float32:
        return None
    width = heads * head_dim
    held = linear_module.held_tiling(x.shape[0], x.shape[1], width, dot_precision(x.dtype), x.device)
    if held is None or head_dim & (head_dim - 1) or held[1] % head_dim or width % held[1]:
        return None
    return held


def _projection_scores(x: torch.Tensor, weight: torch.Tensor, attn_l: torch.Tensor, attn_r: torch.Tensor,
                       heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(wh [N, H, D], el, er [N, H])``: ``wh = x Wᵀ`` and its node scores in one kernel
    (:func:`fuses_projection` says where it applies)."""

    num_nodes, in_feats = x.shape
    wh = _new_output((num_nodes, heads, head_dim), x.dtype, x.device)
    acc = accumulation_dtype(x.dtype)
    el = _new_output((num_nodes, heads), acc, x.device)
    er = _new_output((num_nodes, heads), acc, x.device)
    held = _projection_held_tiling(x, weight, heads, head_dim)
    if num_nodes and held is not None:
        block_m, block_n, chunk, chunks, programs = held
        projection_scores_held_kernel[(heads * head_dim // block_n, programs)](
            x, weight.contiguous(), attn_l.contiguous(), attn_r.contiguous(), wh, el, er, num_nodes, in_feats,
            x.stride(0), heads, D=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, CHUNK=chunk, CHUNKS=chunks,
            STAGES=linear_module.HELD_STAGES, SUMS=linear_module.HELD_SUMS, CVT=linear_module.held_split(),
            num_warps=linear_module.HELD_WARPS,
        )
    elif num_nodes:
        block_h, block_d = next_power_of_2(heads), next_power_of_2(head_dim)
        classes = _row_classes(x)
        # PROJECTION_BLOCK_M rows up to 128 columns, fewer beyond: the accumulator's registers stay put
        block_m = max(MIN_DOT, PROJECTION_BLOCK_M * 128 // max(128, block_h * block_d))
        # input slices of PROJECTION_BLOCK_F 2-byte elements' bytes (half as many float32 ones: the same shared memory)
        block_f = max(MIN_DOT, min(PROJECTION_BLOCK_F * 2 // x.element_size(), next_power_of_2(in_feats)))
        projection_scores_kernel[(classes * cdiv(cdiv(num_nodes, classes), block_m),)](
            x, weight.contiguous() if classes == 1 else weight.t().contiguous(), attn_l.contiguous(),
            attn_r.contiguous(), wh, el, er, num_nodes, in_feats, x.stride(0), heads, head_dim, BLOCK_M=block_m,
            BLOCK_F=block_f, BLOCK_H=block_h, BLOCK_D=block_d, PRECISION=dot_precision(x.dtype), ROW_CLASSES=classes,
            ROW_VEC=16 // x.element_size(), num_warps=PROJECTION_WARPS, num_stages=PROJECTION_STAGES,
        )
    return wh, el, er


def _node_scores_backward(wh, attn_l, attn_r, grad_el, grad_er, grad_agg, parts: torch.Tensor,
                          sums_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(grad_wh, sums)``: ``grad_wh`` is ``grad_agg`` plus the node scores' share, and ``sums [count, H, D]`` (in
    ``sums_dtype``) the column sums of ``parts`` (:func:`_node_part_buffer`, ``count`` sums side by side) after the
    kernel wrote the partial sums of ``∂attn_l``, ``∂attn_r`` into ``parts[0]``, ``parts[1]`` — one launch: its last
    programs to finish sum the partials (``sums[0]``, ``sums[1]``, and an earlier kernel's ``parts[2:]``)."""

    num_nodes, heads, head_dim = wh.shape
    block_h, block_d, rows = _node_tile_rows(heads, head_dim)
    programs = cdiv(num_nodes, rows)
    count = parts.shape[0]
    sums = _new_output((count, heads, head_dim), sums_dtype, wh.device)
    grad_wh = grad_agg if grad_agg.dtype == wh.dtype else _new_output(tuple(wh.shape), wh.dtype, wh.device)
    if not programs:
        return grad_wh, sums.zero_()
    group, counts, finish = _finishing(count, programs, heads * head_dim, parts.dtype, wh.device)
    node_scores_backward_kernel[(programs,)](
        wh, attn_l.contiguous(), attn_r.contiguous(), grad_el.contiguous(), grad_er.contiguous(), grad_agg,
        grad_wh, parts, group, sums, counts, num_nodes, heads, head_dim, programs, count, ROWS=rows, BLOCK_H=block_h,
        BLOCK_D=block_d, **finish, **_node_backward_options("node_scores", wh),
    )
    return grad_wh, sums


class NodeScoresFunction(torch.autograd.Function):
    """``(el, er)`` from ``wh [N, H, D]`` and ``attn_l``, ``attn_r`` ``(1, H, D)`` in one kernel."""

    @staticmethod
    def forward(ctx, wh, attn_l, attn_r):  # type: ignore[override]
        ctx.save_for_backward(wh, attn_l, attn_r)
        return _node_scores_forward(wh, attn_l, attn_r)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_el, grad_er):  # type: ignore[override]
        wh, attn_l, attn_r = ctx.saved_tensors
        acc = accumulation_dtype(wh.dtype)
        grad_el = torch.zeros(wh.shape[:2], dtype=acc, device=wh.device) if grad_el is None else grad_el.to(acc)
        grad_er = torch.zeros(wh.shape[:2], dtype=acc, device=wh.device) if grad_er is None else grad_er.to(acc)
        parts = _node_part_buffer(wh, 2)
        grad_wh, sums = _node_scores_backward(wh, attn_l, attn_r, grad_el, grad_er, torch.zeros_like(wh), parts,
                                              attn_l.dtype)
        return grad_wh, sums[0:1], sums[1:2]


class GATFunction(torch.autograd.Function):
    """The whole GAT op as one autograd node: node scores, fused attention, and in the backward the
    attention gradients and the node scores' share merged in one epilogue kernel.

    With ``weight [H·D, F]`` the first input is the layer input ``x [N, F]``, projected here
    (``wh = x Wᵀ`` viewed ``[N, H, D]``, a layer's ``fc``) with ``∂W = ∂whᵀ x`` and ``∂x = ∂wh W``
    formed in the backward; without it the first input is ``wh [N, H, D]``.  ``attn_l``, ``attn_r``
    (``H·D`` elements) and ``out_add`` are viewed as the kernels need inside the node and their
    gradients returned in the caller's shapes: a layer call costs autograd this one node (and the
    leaves' accumulation), not one more per projection, view and reshape (each a step of autograd's
    engine on the host)."""

    @staticmethod
    def forward(ctx, x, weight, attn_l, attn_r, graph, negative_slope, dropout_p, seed, offset, options,  # type: ignore[override]
                out_add, edge_weight, edge_score, score_csr):
        heads, head_dim = attn_l.shape[-2], attn_l.shape[-1]
        attn_l3 = attn_l.view(1, heads, head_dim)
        attn_r3 = attn_r.view(1, heads, head_dim)
        ctx.attn_shapes = (attn_l.shape, attn_r.shape)
        if weight is not None and fuses_projection(x, weight, heads, head_dim):
            wh, el, er = _projection_scores(x, weight, attn_l3, attn_r3, heads, head_dim)
        else:
            wh = x if weight is None else linear(x, weight).view(x.shape[0], heads, head_dim)
            el, er = _node_scores_forward(wh, attn_l3, attn_r3)
        inputs = AttentionInputs(SCORE_GAT, el, er, wh, negative_slope=negative_slope,
                                 out_add=_addend_layout(ctx, out_add, heads, head_dim),
                                 edge_factor=_edge_factor(ctx, graph, edge_weight, el.dtype, 11),
                                 edge_score=_edge_score(ctx, graph, edge_score, el.dtype, 12, score_csr))
        ctx.negative_slope = negative_slope
        return _forward_saving(ctx, graph, inputs, (dropout_p, seed, offset, options), 4, wh, attn_l3, attn_r3, el,
                               er, x if weight is not None else None, weight, add_index=10)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        if not ctx.attention_grads:
            return None, None, None, None, *_NO_GRADS, _addend_grad(ctx, grad_out, None), None, None, None
        wh, attn_l, attn_r, el, er, x, weight = ctx.saved_tensors[:7]
        inputs = AttentionInputs(SCORE_GAT, el, er, wh, negative_slope=ctx.negative_slope,
                                 edge_factor=ctx.edge_factor, edge_score=ctx.edge_score)
        # ∂attn_l, ∂attn_r and a bias's Σ_n g_n from per-program partials, summed by the node-score backward's launch
        bias = _bias_grad_wanted(ctx)
        parts = _node_part_buffer(wh, 3 if bias else 2)
        grad_factor = _factor_grad_buffer(ctx)
        grad_scores = _score_grad_buffer(ctx)
        grad_agg, grad_el, grad_er, _, _ = _backward_saved(ctx, inputs, grad_out, grad_value_dtype=el.dtype,
                                                           bias_parts=parts[2] if bias else None,
                                                           grad_factor=grad_factor, grad_scores=grad_scores)
        # wh, the attention vectors and the bias share a dtype
        grad_wh, sums = _node_scores_backward(wh, attn_l, attn_r, grad_el, grad_er, grad_agg, parts, attn_l.dtype)
        grad_x = grad_weight = None
        if weight is None:
            grad_x = grad_wh
        else:
            flat = grad_wh.view(grad_wh.shape[0], weight.shape[0])
            if ctx.needs_input_grad[1]:
                grad_weight = matmul(flat.t(), x)
            if ctx.needs_input_grad[0]:
                grad_x = matmul(flat, weight)
        grad_l, grad_r = sums[0].view(ctx.attn_shapes[0]), sums[1].view(ctx.attn_shapes[1])
        return (grad_x, grad_weight, grad_l, grad_r, *_NO_GRADS, _addend_grad(ctx, grad_out, sums[2] if bias else None),
                _edge_weight_grad(ctx, grad_factor), _edge_score_grad(ctx, grad_scores), None)


def _addend_layout(ctx, out_add: torch.Tensor | None, heads: int, head_dim: int) -> torch.Tensor | None:
    """``out_add`` (checked by :func:`_check_addend`) as the kernels read it, ``[H, D]`` (a bias) or
    ``[N, H, D]`` with contiguous heads and features (any row stride), viewed inside an autograd Function
    (no view node of its own); ``ctx.add_shape`` keeps the caller's shape for the gradient."""
    if out_add is None:
        return None
    ctx.add_shape = out_add.shape
    if out_add.numel() == heads * head_dim:
        return out_add.reshape(heads, head_dim).contiguous()
    add = out_add.reshape(-1, heads, head_dim)
    return add if _rows_alike(add) else add.contiguous()


def _check_addend(out_add: torch.Tensor | None, graph: Graph, heads: int, head_dim: int,
                  dtype: torch.dtype) -> torch.Tensor | None:
    """``out_add`` viewed ``[H, D]`` (a bias of ``H·D`` elements) or ``[N, H, D]`` (a per-node term,
    ``[N, H, D]`` or ``[N, H·D]``), in the features' dtype; ValueError / TypeError otherwise."""
    if out_add is None:
        return None
    backend.check_dtypes(FLOAT_DTYPES, out_add=out_add)
    if out_add.dtype != dtype:
        raise TypeError(f"out_add has dtype {out_add.dtype} but the features have {dtype}: they must share a dtype")
    hd, n, shape = heads * head_dim, graph.num_nodes, tuple(out_add.shape)
    if shape in ((hd,), (1, hd), (heads, head_dim), (1, heads, head_dim)):
        return out_add.reshape(heads, head_dim)
    if shape in ((n, hd), (n, heads, head_dim)):
        return out_add.reshape(n, heads, head_dim)
    raise ValueError(
        f"out_add must be a bias of shape [H·D] = [{hd}] (or [1, H·D], [H, D], [1, H, D]) or a per-node term of "
        f"shape [num_nodes, H, D] = [{n}, {heads}, {head_dim}] (or [num_nodes, H·D]), got {list(shape)}"
    )


def _check_attention_vectors(heads: int, head_dim: int, **vectors: torch.Tensor) -> None:
    """Attention vectors must have shape (1, H, D) (DGL's) or (H, D)."""
    for name, a in vectors.items():
        if not isinstance(a, torch.Tensor) or tuple(a.shape) not in ((1, heads, head_dim), (heads, head_dim)):
            shape = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            raise ValueError(f"{name} must have shape (1, H, D) = (1, {heads}, {head_dim}) or (H, D), got {shape}")


def _rng_pair(rng: PhiloxStream | DevicePhiloxStream | None, dropout: float, heads: int,
              device: torch.device) -> tuple[int | torch.Tensor, int]:
    """(seed, offset) of one launch: ``heads`` positions taken from ``rng`` when dropout is on.

    From a :class:`~fusecore.DevicePhiloxStream` on ``device`` the seed is its int64 pair
    ``[seed, offset]`` on the device (``take`` is a launch: it runs, and is captured, in stream
    order with the kernels that read the pair) and the offset 0."""
    if rng is not None and not isinstance(rng, (PhiloxStream, DevicePhiloxStream)):
        raise TypeError(f"rng must be a fusecore.PhiloxStream, a fusecore.DevicePhiloxStream or None, "
                        f"got {type(rng).__name__}")
    if isinstance(rng, DevicePhiloxStream) and rng.device != torch.device(device):
        raise ValueError(f"rng is a DevicePhiloxStream on '{rng.device}' but the features are on '{device}'")
    if dropout <= 0:
        return 0, 0
    if isinstance(rng, DevicePhiloxStream):
        return rng.take(heads), 0
    return (rng or PhiloxStream.from_torch()).take(heads)


def _host_pair(seed: int | torch.Tensor, offset: int) -> tuple[int, int]:
    """(seed, offset) as ints, for the reference path (a device pair is read back: a sync)."""
    if isinstance(seed, torch.Tensor):
        seed, offset = seed.tolist()
    return seed, offset


@backend.eager_under_compile
def node_scores(wh: torch.Tensor, attn_l: torch.Tensor, attn_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``el = Σ_d wh · attn_l``, ``er = Σ_d wh · attn_r`` per (node, head), in the accumulation dtype.

    One kernel reads ``wh`` once (:mod:`gnnfuse.kernels.node_scores`); under
    :func:`fusecore.use_reference` the same sums in PyTorch.
    """
    backend.check_dtypes(FLOAT_DTYPES, wh=wh, attn_l=attn_l, attn_r=attn_r)
    if wh.dim() != 3:
        raise ValueError(f"wh must have shape [num_nodes, heads, head_dim], got {tuple(wh.shape)}")
    acc = accumulation_dtype(wh.dtype)
    heads, head_dim = wh.shape[1], wh.shape[2]
    _check_attention_vectors(heads, head_dim, attn_l=attn_l, attn_r=attn_r)
    attn_l = attn_l.reshape(1, heads, head_dim)
    attn_r = attn_r.reshape(1, heads, head_dim)
    if backend.reference_enabled():
        wh_acc = wh.to(acc)
        return (wh_acc * attn_l.to(acc)).sum(-1), (wh_acc * attn_r.to(acc)).sum(-1)
    backend.check_devices(wh=wh, attn_l=attn_l, attn_r=attn_r)
    return _apply(NodeScoresFunction, wh.contiguous(), attn_l, attn_r)


@backend.eager_under_compile
def gat(
    graph,
    wh: torch.Tensor,
    attn_l: torch.Tensor,
    attn_r: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    rng: PhiloxStream | DevicePhiloxStream | None = None,
    schedule: ScheduleOptions | None = None,
    out_add: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    return_attention: bool = False,
    attention_dropout: bool = True,
    edge_weight: torch.Tensor | None = None,
    edge_score: torch.Tensor | None = None,
    edge_score_order: str = "input",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """GAT attention from projected features and attention vectors ``attn_l``, ``attn_r`` ``(1, H, D)``.

    Same result as :func:`gat_attention` with ``el``, ``er`` from :func:`node_scores`, as one
    autograd op: the node scores' backward is folded into the feature gradient's epilogue.
    ``out_add``: a bias (``H·D`` elements) or per-node term (``[N, H, D]`` or ``[N, H·D]``) added
    to the output in the kernel's store (in training as a second output beside the attention's own,
    which the backward reads; its gradient from the backward's ``δ`` kernel: :func:`_forward_saving`).
    ``weight``: ``[H·D, F]`` (a layer's ``fc.weight``); then ``wh`` is the unprojected input
    ``x [N, F]`` and the op projects it itself, ``x Wᵀ`` viewed ``[N, H, D]``, in the same
    autograd node (:class:`GATFunction`), gradients reaching ``x`` and ``weight``.  For float16 and
    bfloat16 (:func:`fuses_projection`) the projection and the node scores are one kernel, which
    saves the node-score pass's read of ``Wh``: :class:`~gnnfuse.nn.GATConv` takes this path there
    and keeps ``fc`` as its own module elsewhere (the op alone, with torch's product, was no faster
    as called on the H200: gnn/layer_host, session 7).
    ``return_attention``, ``attention_dropout``, ``edge_weight``, ``edge_score``, ``edge_score_order``: as in
    :func:`gat_attention` (``(out, α [E, H])``).
    """
    graph = as_graph(graph)
    backend.check_dtypes(FLOAT_DTYPES, wh=wh, attn_l=attn_l, attn_r=attn_r, weight=weight)
    if weight is None:
        _check_wh(graph, wh)
        heads, head_dim = wh.shape[1], wh.shape[2]
    else:
        if attn_l.dim() not in (2, 3):
            raise ValueError(f"attn_l must have shape (1, H, D) or (H, D), got {tuple(attn_l.shape)}")
        heads, head_dim = attn_l.shape[-2], attn_l.shape[-1]
        _check_projection(graph, wh, weight, heads * head_dim)
    _check_attention_vectors(heads, head_dim, attn_l=attn_l, attn_r=attn_r)
    dropout = _check_dropout(dropout)
    negative_slope = _check_negative_slope(negative_slope)
    _check_schedule(schedule)
    add = _check_addend(out_add, graph, heads, head_dim, wh.dtype)
    edge_weight = _check_edge_weight(graph, edge_weight)
    edge_score = _check_edge_score(graph, edge_score, heads)
    score_csr = _check_edge_score_order(edge_score_order)
    request = _requested(schedule, return_attention, attention_dropout)
    if backend.reference_enabled():
        if weight is not None:
            wh = torch.nn.functional.linear(wh, weight).view(-1, heads, head_dim)
        el, er = node_scores(wh, attn_l, attn_r)
        result = gat_attention(
            graph, wh, el, er, negative_slope=negative_slope, dropout=dropout, rng=rng, schedule=schedule,
            return_attention=return_attention, attention_dropout=attention_dropout, edge_weight=edge_weight,
            edge_score=edge_score, edge_score_order=edge_score_order,
        )
        out, weights = (result, None) if not return_attention else result
        out = out if add is None else out + add
        return (out, weights) if return_attention else out
    seed, offset = _rng_pair(rng, dropout, heads, wh.device)
    backend.check_devices(wh=wh, weight=weight, attn_l=attn_l, attn_r=attn_r, out_add=add, edge_weight=edge_weight,
                          edge_score=edge_score, graph=graph.indptr)
    # attn_l, attn_r and out_add go in as given (the node views them: no autograd view nodes here)
    out = _apply(
        GATFunction, wh if weight is not None else wh.contiguous(), weight, attn_l.contiguous(), attn_r.contiguous(),
        graph, float(negative_slope), dropout, seed, offset, request, out_add, edge_weight, edge_score, score_csr,
    )
    return _with_weights(out, request)


def _check_projection(graph: Graph, x: torch.Tensor, weight: torch.Tensor, width: int) -> None:
    """``x [N, F]`` and ``weight [width, F]`` of a projection inside an op (same dtype)."""
    if x.dim() != 2 or x.shape[0] != graph.num_nodes:
        raise ValueError(f"wh (the input x when weight is given) must have shape [num_nodes={graph.num_nodes}, F], "
                         f"got {tuple(x.shape)}")
    if weight.dim() != 2 or tuple(weight.shape) != (width, x.shape[1]):
        raise ValueError(f"weight must have shape [H·D, F] = [{width}, {x.shape[1]}], got {tuple(weight.shape)}")
    if weight.dtype != x.dtype:
        raise TypeError(f"weight has dtype {weight.dtype} but wh (the input x) has {x.dtype}: they must share a dtype")


def _edge_weight_heads(edge_weight: torch.Tensor | None, heads: int, head_dim: int) -> torch.Tensor | None:
    """The kernels' ``[K, H, D]`` copy of ``edge_weight [H·D, K]`` (``lin_edge.weight``), or None."""
    if edge_weight is None:
        return None
    return edge_weight.t().reshape(edge_weight.shape[1], heads, head_dim).contiguous()


def _edge_grads_out(grad_attr: torch.Tensor | None, grad_weight: torch.Tensor | None, edge_attr: torch.Tensor,
                    edge_weight: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(∂edge_attr, ∂edge_weight)`` in the inputs' dtypes (None where not asked for)."""
    return (None if grad_attr is None else grad_attr.to(edge_attr.dtype),
            None if grad_weight is None else grad_weight.to(edge_weight.dtype))


class GATv2Function(torch.autograd.Function):
    """GATv2 attention from ``(fs, fd, attn[, edge_attr, edge_weight])``: forward saves ``fs, fd, attn`` (and the
    edge features with the kernels' ``[K, H, D]`` copy of ``edge_weight [H·D, K]``), ``out, lse``; the
    backward's source pass adds the score's share into ``∂fs`` and writes per-row partial
    sums of ``∂attn`` (summed here), the destination pass gives ``∂fd``; with edge features ``∂edge_attr`` and
    ``∂edge_weight`` (in ``lin_edge.weight``'s layout) come from one CSR-order pass (:func:`_gatv2_edge_grads`)."""

    @staticmethod
    def forward(ctx, fs, fd, attn, edge_attr, edge_weight, graph, negative_slope, dropout_p, seed, offset,  # type: ignore[override]
                options, out_add, packing=None):
        ctx.packing = packing
        saved = (fs, fd, attn)
        if packing is not None:  # fs: the [N, W] output both sides are column blocks of (_packed_columns)
            fs, fd, _ = _unpack(fs, packing)
        heads, head_dim = attn.shape
        edge_weight = _edge_weight_heads(edge_weight, heads, head_dim)
        inputs = AttentionInputs(SCORE_GATV2, fs, fd, fs, attn=attn, edge_attr=edge_attr, edge_weight=edge_weight,
                                 negative_slope=negative_slope, out_add=_addend_layout(ctx, out_add, heads, head_dim))
        ctx.negative_slope = negative_slope
        return _forward_saving(ctx, graph, inputs, (dropout_p, seed, offset, options), 5, *saved, edge_attr,
                               edge_weight, add_index=11)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        if not ctx.attention_grads:
            return None, None, None, None, None, *_NO_GRADS, _addend_grad(ctx, grad_out, None), None
        fs, fd, attn, edge_attr, edge_weight = ctx.saved_tensors[:5]
        targets = None
        if ctx.packing is not None:
            base = fs
            fs, fd, _ = _unpack(base, ctx.packing)
            grad_base, (grad_fs, grad_fd, _) = _packed_gradient(base, ctx.packing)
            targets = (grad_fs, None, grad_fd)
        inputs = AttentionInputs(SCORE_GATV2, fs, fd, fs, attn=attn, edge_attr=edge_attr, edge_weight=edge_weight,
                                 negative_slope=ctx.negative_slope)
        # ∂fd stored in fd's dtype by the kernels; the ∂attn partials stay in the accumulation dtype
        # an [H, D] bias's Σ_n g_n, summed inside the δ kernel's launch
        bias_sum = _new_output(tuple(attn.shape), ctx.add_dtype, attn.device) if _bias_grad_wanted(ctx) else None
        grad_fs, attn_parts, grad_fd, grad_attr, grad_weight = _backward_saved(
            ctx, inputs, grad_out, edge_grads=(ctx.needs_input_grad[3], ctx.needs_input_grad[4]),
            term_grad_dtypes=(None, fd.dtype), grad_targets=targets, bias_sum=bias_sum)
        # Σ over the [N, H, D] per-row partials by fusecore's column sum: torch's sum(0) of this shape took 151.5 µs
        # of the arxiv-like bf16 step on the H200 (session 24, kernel_times.py); column_sum read 2.5 TB/s in that run
        grad_attn = column_sum(attn_parts.reshape(attn_parts.shape[0], attn.numel()), attn.dtype).reshape(attn.shape)
        edge_grads = _edge_grads_out(grad_attr, grad_weight, edge_attr, edge_weight)
        add_grad = _addend_grad(ctx, grad_out, bias_sum)
        if ctx.packing is not None:
            return grad_base, None, grad_attn, *edge_grads, *_NO_GRADS, add_grad, None
        return grad_fs, grad_fd, grad_attn, *edge_grads, *_NO_GRADS, add_grad, None


class TransformerAttentionFunction(torch.autograd.Function):
    """Scaled dot-product graph attention from ``(q, k, v[, edge_attr, edge_weight])``
    (``edge_attr [E, K]`` in the graph's input edge order, ``edge_weight [H·D, K]``, ``lin_edge.weight``
    itself: the forward forms the kernels' ``[K, H, D]`` copy and saves it, the backward returns
    ``∂edge_weight`` in the parameter's layout): forward saves the inputs, ``out`` and ``lse``; backward is
    FlashAttention's over the graph — ``∂v``, ``∂k`` in the source pass, ``∂q`` (and, where autograd asks
    for them, ``∂edge_attr`` and the sums giving ``∂edge_weight``) in the destination pass."""

    @staticmethod
    def forward(ctx, query, key, value, edge_attr, edge_weight, graph, scale, dropout_p, seed, offset, options,  # type: ignore[override]
                out_add, packing=None):
        ctx.packing = packing
        saved = (query, key, value)
        if packing is not None:  # query: the [N, W] output q, k, v (and the root term) are column blocks of
            query, key, value, packed_add = _unpack(query, packing)
            out_add = packed_add if packed_add is not None else out_add
        heads, head_dim = value.shape[1], value.shape[2]
        add = _addend_layout(ctx, out_add, heads, head_dim)
        edge_weight = _edge_weight_heads(edge_weight, heads, head_dim)
        inputs = AttentionInputs(SCORE_DOT, key, query, value, edge_attr=edge_attr, edge_weight=edge_weight,
                                 scale=scale, out_add=add)
        ctx.scale = scale
        return _forward_saving(ctx, graph, inputs, (dropout_p, seed, offset, options), 5,
                               *saved, edge_attr, edge_weight, add_index=11)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        if not ctx.attention_grads:
            return None, None, None, None, None, *_NO_GRADS, _addend_grad(ctx, grad_out, None), None
        query, key, value, edge_attr, edge_weight = ctx.saved_tensors[:5]
        targets = packed_add = None
        if ctx.packing is not None:
            base = query
            query, key, value, _ = _unpack(base, ctx.packing)
            grad_base, (grad_q, grad_k, grad_v, packed_add) = _packed_gradient(base, ctx.packing)
            targets = (grad_v, grad_k, grad_q)
        inputs = AttentionInputs(SCORE_DOT, key, query, value, edge_attr=edge_attr, edge_weight=edge_weight,
                                 scale=ctx.scale)
        edge_grads = (ctx.needs_input_grad[3], ctx.needs_input_grad[4])
        # the bias's Σ_n g_n, summed inside the δ kernel's launch
        bias_sum = _new_output(tuple(value.shape[1:]), ctx.add_dtype, value.device) if _bias_grad_wanted(ctx) else None
        grad_v, grad_k, grad_q, grad_attr, attr_sums = _backward_saved(
            ctx, inputs, grad_out, edge_grads=edge_grads, bias_sum=bias_sum,
            term_grad_dtypes=(key.dtype, query.dtype), grad_targets=targets, grad_out_copy=packed_add)
        grad_weight = None if attr_sums is None else edge_weight_grad(attr_sums, grad_out, query, ctx.scale)
        grad_attr, grad_weight = _edge_grads_out(grad_attr, grad_weight, edge_attr, edge_weight)
        add_grad = _addend_grad(ctx, grad_out, bias_sum)
        if ctx.packing is not None:  # the root term's gradient, g itself, was stored by the δ kernel
            return grad_base, None, None, grad_attr, grad_weight, *_NO_GRADS, add_grad, None
        return grad_q, grad_k, grad_v, grad_attr, grad_weight, *_NO_GRADS, add_grad, None


def _normalize_rows(h: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AGNN's per-node scales ``(r, c)``, ``[N, H]`` each in the accumulation dtype: ``r = 1 / max(‖h‖, ε)``
    (keys ``h r``) and ``c = β r`` (queries ``h c``, formed by the attention kernels), from one per-node
    kernel (:mod:`gnnfuse.kernels.normalize`)."""

    num_nodes, heads, head_dim = h.shape
    acc = accumulation_dtype(h.dtype)
    inverse_norm = _new_output((num_nodes, heads), acc, h.device)
    query_scale = _new_output((num_nodes, heads), acc, h.device)
    block_h, block_d, rows = _node_tile_rows(heads, head_dim)
    if num_nodes:
        normalize_kernel[(cdiv(num_nodes, rows),)](
            h, beta, inverse_norm, query_scale, num_nodes, heads, head_dim, NORMALIZE_EPS,
            ROWS=rows, BLOCK_H=block_h, BLOCK_D=block_d,
        )
    return inverse_norm, query_scale


class AGNNFunction(torch.autograd.Function):
    """AGNN from features ``h [N, H, D]`` and ``β``: per-node scales ``r = 1 / max(‖h‖, ε)`` and ``c = β r``
    from one per-node kernel, then the dot-product kernels with ``v = h``, keys formed from the gathered
    values, ``k_j = h_j r_j`` (one tile per edge), and queries from the row's values, ``q_i = h_i c_i`` (no
    ``[N, H, D]`` query tensor written, read or saved).  Backward: the attention's two passes with the
    normalization's backward folded into their stores (:mod:`gnnfuse.kernels.normalize`): ``∂h`` from the
    destination pass, ``∂β = Σ ∂q · ĥ`` summed from its per-row terms in the accumulation dtype (the sum cancels
    strongly: softmax gradients sum to zero per row, so half-precision ``∂q`` would lose it)."""

    @staticmethod
    def forward(ctx, h, beta, graph, options):  # type: ignore[override]
        inverse_norm, query_scale = _normalize_rows(h, beta)
        inputs = AttentionInputs(SCORE_DOT, inverse_norm, query_scale, h, keys_from_values=True)
        no_dropout = (0.0, 0, 0, options)
        return _forward_saving(ctx, graph, inputs, no_dropout, 2, h, beta, inverse_norm, query_scale)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        h, beta, inverse_norm, query_scale = ctx.saved_tensors[:4]
        inputs = AttentionInputs(SCORE_DOT, inverse_norm, query_scale, h, keys_from_values=True)
        _, beta_terms, grad_h, *_ = _backward_saved(ctx, inputs, grad_out, grad_value_dtype=inverse_norm.dtype,
                                                    term_grad_dtypes=(None, h.dtype))
        grad_beta = beta_terms.sum().to(beta.dtype).reshape(beta.shape) if ctx.needs_input_grad[1] else None
        return grad_h, grad_beta, None, None


def _check_edge_features(graph: Graph, edge_attr: torch.Tensor | None, edge_weight: torch.Tensor | None, heads: int,
                         head_dim: int) -> None:
    """``edge_attr [E, K]`` (K >= 1) and ``edge_weight [H·D, K]`` (``lin_edge.weight``), given together or not at all
    (their dtypes and devices are checked with the op's other tensors)."""
    if (edge_attr is None) != (edge_weight is None):
        raise ValueError("edge_attr and edge_weight must be given together (or neither)")
    if edge_attr is not None:
        if edge_attr.dim() != 2 or edge_attr.shape[0] != graph.num_edges or edge_attr.shape[1] < 1:
            raise ValueError(
                f"edge_attr must have shape [num_edges={graph.num_edges}, edge_dim >= 1], got {list(edge_attr.shape)}"
            )
        expected = [heads * head_dim, edge_attr.shape[1]]
        if list(edge_weight.shape) != expected:
            raise ValueError(
                f"edge_weight must have shape [heads * head_dim, edge_dim] = {expected}, got {list(edge_weight.shape)}"
            )


def _check_same_shape(graph: Graph, reference_name: str, reference: torch.Tensor, **others: torch.Tensor) -> None:
    _check_wh(graph, reference, reference_name)
    for name, t in others.items():
        if t.shape != reference.shape:
            raise ValueError(
                f"{name} must have the shape of {reference_name} {list(reference.shape)}, got {list(t.shape)}"
            )


@backend.eager_under_compile
def gatv2(
    graph,
    feat_src: torch.Tensor,
    feat_dst: torch.Tensor,
    attn: torch.Tensor,
    edge_attr: torch.Tensor | None = None,
    edge_weight: torch.Tensor | None = None,
    *,
    negative_slope: float = 0.2,
    dropout: float = 0.0,
    rng: PhiloxStream | DevicePhiloxStream | None = None,
    schedule: ScheduleOptions | None = None,
    return_attention: bool = False,
    attention_dropout: bool = True,
    out_add: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused GATv2 attention (Brody et al., 2022) over ``graph``.

    ``feat_src``, ``feat_dst``: ``[N, H, D]`` projected features as source and as destination
    (pass the same tensor twice for shared weights); ``attn``: ``H·D`` elements (DGL's
    ``(1, H, D)``).  Per head::

        s_ij = Σ_d attn_d · LeakyReLU(fs_j + fd_i)_d,   α_i· = softmax_j s_i·,   out_i = Σ_j α_ij fs_j

    Optional edge features (PyG GATv2Conv's ``edge_dim``), as :func:`transformer_attention` takes them:
    ``edge_attr [E, K]`` in the graph's input edge order with ``edge_weight [H·D, K]`` (``lin_edge.weight``);
    ``e_ij = edge_weight · attr_ij`` viewed ``[H, D]`` is added inside the LeakyReLU, ``s_ij = Σ_d attn_d ·
    LeakyReLU(fs_j + fd_i + e_ij)_d``, and not to the message (still ``fs_j``).  ``e`` is projected in registers by
    the forward (:mod:`gnnfuse.kernels.edge_features`), never stored; a training forward keeps each edge's score
    (``[E, H]``) and LeakyReLU slope bits (``E·H·D`` bits) for the backward, which projects nothing; gradients reach
    ``edge_attr`` and ``edge_weight`` (one deterministic CSR-order pass).

    The ``[E, H, D]`` edge vectors exist only in registers; ``∂attn`` is reduced over
    per-source-row partials (deterministic).  ``dropout``, ``rng``, ``schedule`` as in
    :func:`gat_attention`.  ``out_add``: a bias (``H·D`` elements, PyG GATv2Conv's ``bias``) or a per-node term
    (``[N, H, D]`` or ``[N, H·D]``, a residual) added to the output as the kernels store it, as in :func:`gat`; an
    ``[H, D]`` bias's gradient ``Σ_n g_n`` is summed inside the backward's δ launch.  Returns ``[N, H, D]`` in
    ``feat_src``'s dtype.
    ``return_attention``, ``attention_dropout``: as in :func:`gat_attention` (``(out, α [E, H])``).
    """
    graph = as_graph(graph)
    backend.check_dtypes(FLOAT_DTYPES, feat_src=feat_src, feat_dst=feat_dst, attn=attn, edge_attr=edge_attr,
                         edge_weight=edge_weight)
    _check_same_shape(graph, "feat_src", feat_src, feat_dst=feat_dst)
    heads, head_dim = feat_src.shape[1], feat_src.shape[2]
    _check_attention_vectors(heads, head_dim, attn=attn)
    _check_edge_features(graph, edge_attr, edge_weight, heads, head_dim)
    dropout = _check_dropout(dropout)
    negative_slope = _check_negative_slope(negative_slope)
    _check_schedule(schedule)
    add = _check_addend(out_add, graph, heads, head_dim, feat_src.dtype)
    request = _requested(schedule, return_attention, attention_dropout)
    seed, offset = _rng_pair(rng, dropout, heads, feat_src.device)
    if backend.reference_enabled():
        from .reference import gatv2_reference

        seed, offset = _host_pair(seed, offset)
        result = gatv2_reference(
            graph, feat_src, feat_dst, attn, edge_attr, edge_weight, negative_slope=negative_slope, dropout=dropout,
            seed=seed, offset=offset, weights=_reference_weights(request),
        )
        result = _reference_result(result, feat_src.dtype, request)
        if add is None:
            return result
        return (result[0] + add, result[1]) if isinstance(result, tuple) else result + add
    backend.check_devices(feat_src=feat_src, feat_dst=feat_dst, attn=attn, edge_attr=edge_attr,
                          edge_weight=edge_weight, out_add=add, graph=graph.indptr)
    if edge_attr is not None:
        edge_attr = edge_attr.contiguous()  # read in input order through the graph's edge ids: no permuted copy
    sides, packing = _function_features(heads, head_dim, (feat_src, feat_dst))
    out = _apply(
        GATv2Function, *sides, attn.reshape(heads, head_dim).contiguous(), edge_attr, edge_weight, graph,
        float(negative_slope), dropout, seed, offset, request, out_add, packing,
    )
    return _with_weights(out, request)


@backend.eager_under_compile
def transformer_attention(
    graph,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    edge_attr: torch.Tensor | None = None,
    edge_weight: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    rng: PhiloxStream | DevicePhiloxStream | None = None,
    schedule: ScheduleOptions | None = None,
    out_add: torch.Tensor | None = None,
    return_attention: bool = False,
    attention_dropout: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused Graph Transformer attention (PyG TransformerConv's message and aggregation).

    ``query``, ``key``, ``value``: ``[N, H, D]`` (one dtype); optional edge features
    ``edge_attr [E, K]`` in the graph's input edge order (``edge_index`` order, like PyG's
    ``edge_attr``) with ``edge_weight [H·D, K]`` (``lin_edge.weight``): ``e_ij = edge_weight ·
    attr_ij`` viewed ``[H, D]`` is added to keys and values.  Per head::

        s_ij = scale · q_i · (k_j + e_ij),   α_i· = softmax_j s_i·,   out_i = Σ_j α_ij (v_j + e_ij)

    ``scale`` defaults to ``1/√D``.  The projection ``e`` is recomputed in registers by every
    pass (:mod:`gnnfuse.kernels.edge_features`): no ``E×H×D`` tensor exists, forward or
    backward; gradients reach ``edge_attr`` and ``edge_weight``.  ``dropout``, ``rng``,
    ``schedule`` as in :func:`gat_attention`, ``out_add`` (the layer's root term) as in
    :func:`gat`.  Returns ``[N, H, D]`` in ``value``'s dtype.
    ``return_attention``, ``attention_dropout``: as in :func:`gat_attention` (``(out, α [E, H])``).
    """
    graph = as_graph(graph)
    backend.check_dtypes(FLOAT_DTYPES, query=query, key=key, value=value, edge_attr=edge_attr,
                         edge_weight=edge_weight)
    _check_same_shape(graph, "value", value, query=query, key=key)
    heads, head_dim = value.shape[1], value.shape[2]
    _check_edge_features(graph, edge_attr, edge_weight, heads, head_dim)
    scale = head_dim ** -0.5 if scale is None else scale
    if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite float, got {scale!r}")
    dropout = _check_dropout(dropout)
    _check_schedule(schedule)
    add = _check_addend(out_add, graph, heads, head_dim, value.dtype)
    request = _requested(schedule, return_attention, attention_dropout)
    seed, offset = _rng_pair(rng, dropout, heads, value.device)
    if backend.reference_enabled():
        from .reference import transformer_attention_reference

        seed, offset = _host_pair(seed, offset)
        result = transformer_attention_reference(
            graph, query, key, value, edge_attr, edge_weight, scale=scale, dropout=dropout, seed=seed, offset=offset,
            weights=_reference_weights(request),
        )
        out, weights = (result[0], result[2] if len(result) > 2 else None)
        out = out.to(value.dtype) if add is None else out.to(value.dtype) + add
        return (out, weights.to(value.dtype)) if return_attention else out
    backend.check_devices(query=query, key=key, value=value, edge_attr=edge_attr, edge_weight=edge_weight,
                          out_add=add, graph=graph.indptr)
    if edge_attr is not None:
        # The kernels read edge_attr rows in input order through the graph's edge-id maps: no permuted copy.
        edge_attr = edge_attr.contiguous()
    per_node_add = add if add is not None and add.dim() == 3 else None
    features, packing = _function_features(heads, head_dim, (query, key, value), per_node_add)
    if packing is not None and packing[2][3] is not None:
        out_add = None  # a block of the product: the Function reads it, and stores its gradient, there
    out = _apply(
        TransformerAttentionFunction, *features, edge_attr, edge_weight, graph, float(scale), dropout,
        seed, offset, request, out_add, packing,
    )
    return _with_weights(out, request)


@backend.eager_under_compile
def agnn(
    graph,
    feat: torch.Tensor,
    beta: torch.Tensor,
    *,
    schedule: ScheduleOptions | None = None,
    return_attention: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused AGNN propagation (Thekumparampil et al., 2018): ``out_i = Σ_{j->i} α_ij h_j`` with
    ``α_i· = softmax_j β cos(h_i, h_j)``.

    ``feat``: ``[N, D]`` (or ``[N, H, D]``, one attention per head); ``beta``: a one-element
    tensor.  The cosine is the dot product of unit rows ``ĥ = h / max(‖h‖, 1e-12)``, so this is
    the fused dot-product attention with ``q = β ĥ``, ``k = ĥ``, ``v = h`` and scale 1
    (:class:`AGNNFunction`); the normalization is one per-node kernel, and its backward is folded into the
    attention backward's two passes.
    Returns ``feat``'s shape and dtype; with ``return_attention`` also ``α [E, H]`` (``H = 1`` for ``[N, D]``
    features) in ``feat``'s dtype and the graph's input edge order (not differentiable).
    """
    graph = as_graph(graph)
    backend.check_dtypes(FLOAT_DTYPES, feat=feat, beta=beta)
    _check_schedule(schedule)
    request = _requested(schedule, return_attention, True)
    if feat.dim() not in (2, 3):
        raise ValueError(f"feat must have shape [num_nodes, D] or [num_nodes, H, D], got {tuple(feat.shape)}")
    if beta.numel() != 1:
        raise ValueError(f"beta must have exactly one element, got shape {tuple(beta.shape)}")
    h = feat if feat.dim() == 3 else feat.unsqueeze(1)
    _check_wh(graph, h, "feat")
    if backend.reference_enabled():
        from .reference import agnn_reference

        if return_attention:
            out, weights = agnn_reference(graph, feat, beta, weights=True)
            return out.to(feat.dtype), weights.to(feat.dtype)
        return agnn_reference(graph, feat, beta).to(feat.dtype)
    backend.check_devices(feat=feat, beta=beta, graph=graph.indptr)
    out = _apply(AGNNFunction, h.contiguous(), beta.reshape(1), graph, request)
    return _with_weights(out.reshape(feat.shape), request)


def attention_floor_bytes(
    graph: Graph, heads: int, head_dim: int, dtype: torch.dtype, backward: bool = False, *,
    gathered: int = 1, edge_elements: int = 0, edge_factor: bool = False,
) -> int:
    """The gather floor of TARGETS.md: fewest bytes a fused attention over ``graph`` must move.

    Forward: ``gathered · E·H·D`` feature elements gathered per edge (1 for GAT, GATv2 and
    AGNN, whose scores come from the gathered tile or per-node terms; 2 for the Graph
    Transformer's keys and values) + ``edge_elements`` per edge read (the raw edge features,
    ``E · edge_dim``: what a kernel projecting them in registers would read) + the CSR index
    (``E`` source ids and ``N + 1`` offsets) + the ``N·H·D`` output.  With ``backward``: twice
    that (the backward gathers as much over the reverse CSR and writes the input gradients) —
    per-node score vectors are lower-order terms and left out.  ``edge_factor`` (DGL GATConv's ``edge_weight``):
    ``E`` float32 factors read by each pass, and with ``backward`` their ``E`` gradients written.
    """
    element = torch.empty((), dtype=dtype).element_size()
    index = graph.csr_src.element_size() * graph.num_edges + graph.indptr.element_size() * (graph.num_nodes + 1)
    per_edge = gathered * heads * head_dim + edge_elements
    factor = 4 * graph.num_edges if edge_factor else 0
    forward = graph.num_edges * per_edge * element + index + graph.num_nodes * heads * head_dim * element + factor
    return 2 * forward + factor if backward else forward


def attention_weights_floor_bytes(graph: Graph, heads: int, head_dim: int, dtype: torch.dtype, *,
                                  gathered: int = 1, node_terms: bool = False, edge_elements: int = 0) -> int:
    """Fewest bytes :func:`attention_weights` must move: three ``E`` index arrays (CSR destination, source and
    input edge id), per edge ``gathered`` source tiles of ``H·D`` elements (GAT, ``node_terms``: ``H`` float32
    scores) and ``edge_elements`` raw edge features, the destinations' terms once per node, the ``N·H`` float32
    ``lse`` and the ``E·H`` weights written in ``dtype``."""
    element = torch.empty((), dtype=dtype).element_size()
    index = graph.num_edges * (graph.csr_dst.element_size() + graph.csr_src.element_size()
                               + graph.csr_eid.element_size())
    term = heads * 4 if node_terms else heads * head_dim * element
    per_edge = gathered * term + edge_elements * element + heads * element
    return index + graph.num_edges * per_edge + graph.num_nodes * (term + heads * 4)


def gat_floor_bytes(graph: Graph, heads: int, head_dim: int, dtype: torch.dtype, backward: bool = False) -> int:
    """:func:`attention_floor_bytes` of the GAT attention (one gathered feature tile)."""
    return attention_floor_bytes(graph, heads, head_dim, dtype, backward)
