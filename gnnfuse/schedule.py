"""Degree-bucketed schedules: which program handles which rows of a CSR.

Rows (destination nodes of the CSR, or source nodes of the reverse CSR) fall in three kinds
by degree ``d``:

``light``   ``d <= light_max_degree`` (at most 64): grouped by ``width``, the power of two
            at or above ``d``; a program takes many rows of one width, all their edges in
            one ``[rows, width]`` tile (no loop, no masked waste beyond the rounding).  A
            width class too small to fill the device joins the next wider one.  One launch
            per pass covers every class, each class's programs running code compiled for its
            own tile (:mod:`gnnfuse.kernels.tiles`); ``ScheduleOptions.light_widths`` picks
            fewer widths (more masked slots).
            Rows of degree 0 are light: their program writes the zeros (and ``lse = -inf``).
            Graphs under ``SMALL_GRAPH_EDGES`` edges on the GPU get no light rows at all:
            every row goes to the row kernel, one launch per pass (they are launch-bound).
``medium``  ``light_max_degree < d <= split_degree``: one program per row, looping over its
            edges in blocks of ``medium_block_e``; rows sorted by decreasing degree so the
            longest start first.
``super``   ``d > split_degree``: the row is cut into pieces of at most ``piece_edges`` edges
            (default: small enough that the split rows give about 16 programs per
            multiprocessor, so their launch is short and latency is hidden)
            (:func:`fusecore.plan.make_work_plan`); one program per piece writes a partial
            result (normalized output + logsumexp in the forward, partial sums in the
            backward) and a merge kernel combines the pieces of each row.

Block sizes follow the feature tile: heads and head size are padded to powers of two
(``block_h × block_d``) and the edge block is sized so one tile of gathered features stays
near 4096 elements on the GPU (larger under the interpreter, see :class:`TileLimits`); the row
kernels divide it by the tiles they hold per edge and, on the GPU, cap it per pass
(``gnnfuse.ops.ROW_EDGE_TILES``, ``ROW_MAX_EDGES``).
``split_degree`` defaults to about ``E / (8 · multiprocessors)``, so no single row takes
longer than an even share of the graph, whatever its degree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fusecore import cdiv, device_facts, make_work_plan, next_power_of_2

MAX_LIGHT_DEGREE = 64
DEFAULT_LIGHT_MAX = 16
# ... and on dense graphs (mean in-degree >= DENSE_MEAN_DEGREE) rows up to DENSE_LIGHT_MAX are light: a light
# program gathers all of a row's edges at once, where the row kernel walks them in dependent trips of 16.
# Session 17 (H100, same call, Reddit-scale graph of mean in-degree 101, replayed forward / step µs): GAT bf16
# 1583 / 5441 -> 1468 / 5279 at 32, 1547 / 5420 at 64; GATv2 bf16 1481 / 8487 -> 1380 / 8472, GAT fp32 2307 / 7179
# -> 2276 / 7105; the Graph Transformer lost a little (bf16 2310 / 8197 -> 2375 / 8296, fp32 4779 / 13510 -> 4780 /
# 13674): one schedule serves every score, so it takes that.  On the arxiv-like graph (mean 8) rows up to 32 lost
# (GAT bf16 241 -> 268, fp32 420 -> 455, Transformer fp32 965 -> 1002), so sparse graphs keep 16.
DENSE_LIGHT_MAX = 32
DENSE_MEAN_DEGREE = 32
PROGRAMS_PER_SM = 8
NO_LIGHT_ROWS = -1  # light_max_degree that sends every row, degree 0 included, to the row kernel
SMALL_GRAPH_EDGES = 1 << 18
PIECES_PER_SM = 16


@dataclass(frozen=True)
class TileLimits:
    """Tile sizes per kernel mode: registers bound them on the GPU; under the interpreter,
    where programs run one after another and each op costs a fixed overhead, larger tiles
    (fewer programs, fewer loop trips) are what makes the CPU path usable."""

    tile_elements: int
    max_edge_block: int
    max_light_rows: int


# At most 8 light rows per program on the GPU: the light width classes share one launch per pass and so
# one register allocation, that of their widest tile (kernels/tiles.py); sm_90, GAT bf16 8 × 16: the
# width-1 class at 32 rows per program took 123 registers (16 warps per SM), width 2 at 16 rows 80, the
# classes of width 4 (8 rows) to 16 at most 72; at 8 rows widths 1 and 2 take 32 and 40, all five in one
# kernel 72.
GPU_TILES = TileLimits(tile_elements=4096, max_edge_block=64, max_light_rows=8)
INTERPRETER_TILES = TileLimits(tile_elements=32768, max_edge_block=256, max_light_rows=512)
DEFAULT_NUM_WARPS = 4
EDGES_PER_ROW_ELEMENT = 64  # on the GPU the edge block may grow to tile_elements / 64 (64 edges at 4096)


_OPTION_MINIMA = {"piece_edges": 1, "light_max_degree": NO_LIGHT_ROWS, "tile_elements": 256, "num_warps": 1}


@dataclass(frozen=True)
class ScheduleOptions:
    """Thresholds forcing a schedule (None: chosen from the graph and the feature shape).

    ``light_max_degree``: rows up to this degree are light (0 .. 64; rows of degree 0 are
    light too), or -1 for no light rows at all (every row in the row kernel: one launch per
    pass, the default for graphs under ``SMALL_GRAPH_EDGES`` edges on the GPU);
    ``split_degree``: rows above this degree are split across programs (>= light_max_degree);
    ``piece_edges``: edges per piece of a split row (>= 1; default: the split rows' edges
    over ``16 · multiprocessors``, between ``4 · medium_block_e`` and ``split_degree``);
    ``tile_elements``: feature elements one gathered tile holds (>= 256; default
    :data:`GPU_TILES` / :data:`INTERPRETER_TILES`); ``num_warps``: warps per attention program
    (1 .. 32, a power of two; default 4); ``edge_lanes``: the row kernels keep their running
    state per edge lane and reduce it once after the edge loop, not on every trip (the forward's
    online softmax, the backward's gradient sums; default: per kernel, score and dtype, as measured,
    :func:`gnnfuse.ops.row_kernel_lanes`); ``light_widths``: the tile widths of the light
    classes, increasing powers of two up to 64 (default: every power of two up to
    ``light_max_degree``): a row goes to the narrowest width >= its degree and rows above the
    widest are not light (fewer widths: fewer classes, more masked edge slots).  The last four are
    tuning knobs for GPU experiments.
    """

    light_max_degree: int | None = None
    split_degree: int | None = None
    piece_edges: int | None = None
    tile_elements: int | None = None
    num_warps: int | None = None
    edge_lanes: bool | None = None
    light_widths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("light_max_degree", "split_degree", "piece_edges", "tile_elements", "num_warps"):
            value = getattr(self, name)
            low = _OPTION_MINIMA.get(name, 0)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"ScheduleOptions.{name} must be None or an int >= {low}, got {value!r}")
        if self.edge_lanes is not None and not isinstance(self.edge_lanes, bool):
            raise ValueError(f"ScheduleOptions.edge_lanes must be None or a bool, got {self.edge_lanes!r}")
        widths = self.light_widths
        if widths is not None and not (
            isinstance(widths, tuple) and widths and all(_is_power_of_two(w) and w <= MAX_LIGHT_DEGREE for w in widths)
            and list(widths) == sorted(set(widths))
        ):
            raise ValueError(
                f"ScheduleOptions.light_widths must be None or a non-empty tuple of increasing powers of two "
                f"<= {MAX_LIGHT_DEGREE}, got {widths!r}"
            )
        if self.num_warps is not None and (self.num_warps > 32 or self.num_warps & (self.num_warps - 1)):
            raise ValueError(f"ScheduleOptions.num_warps must be a power of two in 1 .. 32, got {self.num_warps}")
        if self.light_max_degree is not None and self.light_max_degree > MAX_LIGHT_DEGREE:
            raise ValueError(
                f"ScheduleOptions.light_max_degree must be <= {MAX_LIGHT_DEGREE}, got {self.light_max_degree}"
            )


@dataclass(frozen=True)
class Buckets:
    """The rows of one CSR by kind (index tensors on the graph's device).

    Every list of rows comes as ``(rows, starts, stops)``: the rows and their CSR edge ranges
    side by side, so a program reads both at once instead of through ``indptr``.

    ``light``: ``(width, rows, starts, stops)``, rows of degree <= width (and > width / 2);
    ``medium``: ``(rows, starts, stops)``;
    ``light_all``: ``(rows, starts, stops)`` of every light row, width classes in order (the
    classes' lists are views of these: a light launch covers several classes, :func:`gnnfuse.ops._light_plan`);
    ``piece_edges``: the most edges one piece of a split row holds;
    ``piece_row[p]``, ``piece_start[p]``, ``piece_stop[p]``: super row and absolute edge range
    of piece ``p``; the pieces of ``super_rows[s]`` are ``super_piece_ptr[s] :
    super_piece_ptr[s + 1]`` and ``piece_super[p]`` is ``s`` (``max_row_pieces``: the most pieces of one row);
    ``pieces_then_medium``: ``(rows, starts,
    stops)`` of every piece (piece ``p`` at position ``p``) followed by every medium row, for a row-kernel
    launch covering both (:data:`gnnfuse.ops.ROW_LAUNCH_MIXED`).
    """

    light: tuple[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor], ...]
    medium: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    light_all: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    super_rows: torch.Tensor
    piece_row: torch.Tensor
    piece_start: torch.Tensor
    piece_stop: torch.Tensor
    super_piece_ptr: torch.Tensor
    piece_super: torch.Tensor
    max_row_pieces: int
    piece_edges: int
    pieces_then_medium: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    # buffers kept across launches per stream (fusecore.scratch.zeroed: the merging launches' piece counts)
    scratch: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def num_pieces(self) -> int:
        return int(self.piece_row.numel())

    def counts(self) -> dict[str, int]:
        return {
            "light": sum(int(rows.numel()) for _, rows, _, _ in self.light),
            "medium": int(self.medium[0].numel()),
            "super": int(self.super_rows.numel()),
            "pieces": self.num_pieces,
        }


@dataclass(frozen=True)
class Schedule:
    """How the attention kernels (every score) cover one graph for one feature shape, dtype and device.

    ``incoming`` buckets the destination rows (forward pass, per-destination backward
    reductions); ``outgoing`` buckets the source rows of the reverse CSR (backward pass
    over sources).  ``launches``: the launch configurations (grids, compile-time arguments)
    :mod:`gnnfuse.ops` derives from this schedule per kind of call, kept here so that a later
    call of the same kind on the same graph only launches (:func:`gnnfuse.ops._launch_plan`); ``prepared``: the
    launches prepared from those plans (:func:`gnnfuse.ops._prepare`), each beside the plan it came from.
    """

    incoming: Buckets
    outgoing: Buckets
    block_h: int
    block_d: int
    medium_block_e: int
    light_max_degree: int
    split_degree: int
    tiles: TileLimits
    num_warps: int
    edge_lanes: bool | None
    launches: dict = field(default_factory=dict, init=False, compare=False, repr=False)
    prepared: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def light_rows_per_program(self, width: int, row_elements: int) -> int:
        """Rows per program for light rows of ``width`` edges with ``row_elements`` values per edge."""
        return light_rows_per_program(self.tiles, width, row_elements)


def light_rows_per_program(tiles: TileLimits, width: int, row_elements: int) -> int:
    """One ``[rows · width, row_elements]`` tile near the tile budget (a power of two of rows)."""
    return max(1, min(tiles.max_light_rows, tiles.tile_elements // (width * row_elements)))


def _is_power_of_two(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1 and value & (value - 1) == 0


def _light_classes(
    degree: torch.Tensor, light_max: int, min_rows, widths: tuple[int, ...] | None = None,
) -> list[tuple[int, torch.Tensor]]:
    """Light rows by width (``widths``, default every power of two up to ``light_max``): a row
    goes to the narrowest width >= its degree, a width never above ``light_max`` rounded up to a
    power of two (the widest tile the light rows need); a class too small to fill the device on
    its own (fewer than ``min_rows(width)`` rows) joins the next wider one, saving a launch."""
    widest = 1 << max(0, light_max - 1).bit_length()
    if widths is None:
        widths = tuple(1 << k for k in range(widest.bit_length()))
    bounds = []
    low = -1
    for width in widths:
        if low >= light_max:
            break
        high = min(width, light_max)
        bounds.append((min(width, widest), low, high))
        low = high
    classes, carried = [], None
    for k, (width, low, high) in enumerate(bounds):
        rows = torch.nonzero((degree > low) & (degree <= high)).flatten()
        if carried is not None:
            rows, carried = torch.cat([carried, rows]), None
        if rows.numel() == 0:
            continue
        if k < len(bounds) - 1 and rows.numel() < min_rows(width):
            carried = rows
            continue
        classes.append((width, rows))
    return classes


def _buckets(
    degree: torch.Tensor, indptr: torch.Tensor, light_max: int, split: int, piece_edges: int | None,
    min_piece_edges: int, pieces_wanted: int, node_dtype: torch.dtype, min_rows,
    light_widths: tuple[int, ...] | None = None,
) -> Buckets:
    device = indptr.device
    degree = degree.to(device)

    def with_ranges(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = rows.to(device=device, dtype=torch.int64)
        return rows.to(node_dtype), indptr[rows], indptr[rows + 1]

    light_classes = _light_classes(degree, light_max, min_rows, light_widths)
    light_rows = torch.cat([rows for _, rows in light_classes]) if light_classes else degree[:0].long()
    light_all = with_ranges(light_rows)
    # each class's lists are views of light_all's (one launch may cover several classes: ops._light_plan)
    light, begin = [], 0
    for width, rows in light_classes:
        end = begin + rows.numel()
        light.append((width, *(t[begin:end] for t in light_all)))
        begin = end
    medium_mask = (degree > light_max) & (degree <= split)
    medium_rows = torch.nonzero(medium_mask).flatten()
    medium_rows = medium_rows[torch.argsort(degree[medium_rows], descending=True, stable=True)]
    super_rows = torch.nonzero(degree > split).flatten()
    super_rows = super_rows[torch.argsort(degree[super_rows], descending=True, stable=True)]
    super_degree = degree[super_rows].cpu()
    if piece_edges is None:
        wanted = cdiv(int(super_degree.sum()), pieces_wanted)
        piece_edges = max(1, min(split, max(min_piece_edges, wanted)))
    plan = make_work_plan(super_degree, max_piece_cost=piece_edges, num_chunks=1)
    piece_row = super_rows.cpu()[plan.piece_item]
    row_start = indptr.cpu().to(torch.int64)[piece_row]
    super_piece_ptr = torch.zeros(super_rows.numel() + 1, dtype=torch.int64)
    super_piece_ptr[1:] = torch.cumsum(plan.item_pieces, 0)
    medium = with_ranges(medium_rows)
    pieces = (piece_row.to(device=device, dtype=node_dtype), (row_start + plan.piece_start).to(device),
              (row_start + plan.piece_stop).to(device))
    return Buckets(
        light=tuple(light),
        medium=medium,
        light_all=light_all,
        super_rows=super_rows.to(node_dtype),
        piece_row=pieces[0],
        piece_start=pieces[1],
        piece_stop=pieces[2],
        super_piece_ptr=super_piece_ptr.to(device),
        piece_super=torch.repeat_interleave(torch.arange(super_rows.numel(), dtype=torch.int32),
                                            plan.item_pieces.to(torch.int64)).to(device),
        max_row_pieces=int(plan.item_pieces.max()) if plan.item_pieces.numel() else 0,
        piece_edges=piece_edges,
        pieces_then_medium=tuple(torch.cat((p.to(m.dtype), m)) for p, m in zip(pieces, medium)),
    )


def build_schedule(graph, num_heads: int, head_dim: int, dtype: torch.dtype, options: ScheduleOptions) -> Schedule:
    """Choose the buckets of ``graph`` for features ``[N, num_heads, head_dim]`` (see module doc)."""
    block_h, block_d = next_power_of_2(num_heads), next_power_of_2(head_dim)
    tiles = GPU_TILES if graph.device.type == "cuda" else INTERPRETER_TILES
    if options.tile_elements is not None:
        max_edge_block = tiles.max_edge_block
        if tiles is GPU_TILES:
            max_edge_block = max(1, options.tile_elements // EDGES_PER_ROW_ELEMENT)
        tiles = replace(tiles, tile_elements=options.tile_elements, max_edge_block=max_edge_block)
    edge_tile = max(1, min(tiles.max_edge_block, tiles.tile_elements // (block_h * block_d)))
    sm_count = device_facts(graph.device).sm_count
    light_max = options.light_max_degree
    if light_max is None:
        # A small graph on the GPU is bound by launches, not bytes: every row goes to the one
        # row kernel (one launch per pass) instead of several light width classes.
        small = graph.device.type == "cuda" and graph.num_edges < SMALL_GRAPH_EDGES
        dense = graph.num_edges >= DENSE_MEAN_DEGREE * max(1, graph.num_nodes)
        light_max = NO_LIGHT_ROWS if small else min(DENSE_LIGHT_MAX if dense else DEFAULT_LIGHT_MAX, edge_tile)
    if options.light_widths is not None:
        light_max = min(light_max, options.light_widths[-1])
    split = options.split_degree
    if split is None:
        split = max(4 * edge_tile, cdiv(graph.num_edges, PROGRAMS_PER_SM * sm_count))
    split = max(split, light_max)
    node_dtype = graph.csr_src.dtype

    def min_rows(width: int) -> int:
        return light_rows_per_program(tiles, width, block_h * block_d) * sm_count

    pieces = (options.piece_edges, 4 * edge_tile, PIECES_PER_SM * sm_count, node_dtype, min_rows, options.light_widths)
    incoming = _buckets(graph.in_degree, graph.indptr, light_max, split, *pieces)
    outgoing = _buckets(graph.out_degree, graph.rev_indptr, light_max, split, *pieces)
    return Schedule(
        incoming=incoming, outgoing=outgoing, block_h=block_h, block_d=block_d,
        medium_block_e=edge_tile,
        light_max_degree=light_max, split_degree=split, tiles=tiles,
        num_warps=options.num_warps or DEFAULT_NUM_WARPS,
        edge_lanes=options.edge_lanes,
    )

