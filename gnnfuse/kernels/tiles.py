"""Index helpers every gnnfuse kernel shares: which edges a program owns, and feature tiles.

* :func:`head_tile` — offsets and masks of one node's ``[BLOCK_H, BLOCK_D]`` feature tile
  (features stored row-major ``[H, D]`` per node, heads and head size padded to powers of two);
* :func:`flat_head_tile` — the same tile flattened to ``[BLOCK_H · BLOCK_D]`` columns, for
  results folded per row as ``[ROWS, BLOCK_H · BLOCK_D]``;
* :func:`item_edges` — the row, CSR edge range and output slot of one program's item: a whole
  row or one piece of a split row (ranges precomputed by the schedule);
* :func:`row_ranges` — ``ROWS`` items of a schedule list: rows, CSR starts and degrees;
* :func:`light_edges` — the ``ROWS`` light rows of one program and the ``[ROWS, BLOCK_E]`` tile
  of their CSR positions (``BLOCK_E`` >= every row's degree);
* :func:`node_rows` — ``ROWS`` consecutive nodes of one program and their feature tile
  ``[ROWS, BLOCK_H, BLOCK_D]`` (per-node kernels);
* :func:`finish_softmax` — output and logsumexp from an online softmax's running state;
* :func:`store_output` — the forward's output store, with the added term and the second output;
* :func:`lane_add`, :func:`lane_total` — edge-loop sums kept per edge lane or reduced per trip;
* :func:`pack_light`, :func:`light_slot_count` — the width classes one light launch covers
  (:data:`LIGHT_SLOTS` slots, slot ``k`` the rows of width ``2**k``: see below).

One light launch covers several width classes: its programs are numbered class after class (the
classes' rows side by side in one list, narrowest width first), and each program runs the code of
its own class, compiled for that class's tile (``ROWS`` rows of ``BLOCK_E = 2**k`` edges).  Which
classes a launch has and their rows per program are one constexpr ``LIGHT`` (4 bits per slot:
``log2(ROWS) + 1``, 0 for a class the launch does not have: :func:`pack_light`); the classes' row
counts are plain int arguments ``n0 .. n6`` (a class's bounds in program ids come from them: no
table read before the rows).

All positions and ids come back as int64, so address arithmetic never overflows int32.
"""

import triton.language as tl

from fusecore.backend import jit

LIGHT_SLOTS = 7  # light width classes one launch can cover: widths 1, 2, 4, ... 64 (schedule.MAX_LIGHT_DEGREE)
LIGHT_SLOT_BITS = 4
ONE = tl.constexpr(1)  # shifts of constexprs stay constexprs only from a constexpr on the left


def pack_light(rows_by_width: dict[int, int]) -> int:
    """The ``LIGHT`` constexpr of a light launch: ``{width: rows per program}`` packed 4 bits per
    slot (slot ``log2(width)`` holds ``log2(rows) + 1``; widths and rows powers of two)."""
    packed = 0
    for width, rows in rows_by_width.items():
        slot, field = width.bit_length() - 1, rows.bit_length()
        if width != 1 << slot or rows != 1 << (field - 1) or slot >= LIGHT_SLOTS or field >= 1 << LIGHT_SLOT_BITS:
            raise ValueError(f"light class of width {width} with {rows} rows per program cannot be packed")
        packed |= field << (LIGHT_SLOT_BITS * slot)
    return packed


@jit
def head_tile(H, D, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """(offs_h, h_mask, hd_offs, hd_mask) of a node's [BLOCK_H, BLOCK_D] feature tile."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < H
    hd_mask = h_mask[:, None] & (offs_d[None, :] < D)
    hd_offs = offs_h[:, None] * D + offs_d[None, :]
    return offs_h, h_mask, hd_offs, hd_mask


@jit
def flat_head_tile(H, D, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """(c_offs, c_mask): column c = head c // BLOCK_D, lane c % BLOCK_D of the flattened tile."""
    offs_c = tl.arange(0, BLOCK_H * BLOCK_D)
    c_mask = ((offs_c // BLOCK_D) < H) & ((offs_c % BLOCK_D) < D)
    c_offs = (offs_c // BLOCK_D) * D + offs_c % BLOCK_D
    return c_offs, c_mask


@jit
def item_edges(pid, rows_ptr, starts_ptr, stops_ptr, PIECES: tl.constexpr):
    """(row, start, stop, out_index) of item ``pid``: its row and CSR edge range, read from
    the schedule's arrays side by side (no dependent load through ``indptr``), and where its
    result goes (the row itself, or the piece index for a partial result)."""
    row = tl.load(rows_ptr + pid).to(tl.int64)
    start = tl.load(starts_ptr + pid).to(tl.int64)
    stop = tl.load(stops_ptr + pid).to(tl.int64)
    if PIECES:
        out_index = pid
    else:
        out_index = row
    return row, start, stop, out_index


@jit
def row_ranges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS: tl.constexpr):
    """(offs_r, r_mask, rows, start, degree) of the program's ``ROWS`` items of a schedule list
    (positions ``offs_r`` in the list; masked items have degree 0)."""
    offs_r = pid * ROWS + tl.arange(0, ROWS)
    r_mask = offs_r < num_rows
    rows = tl.load(rows_ptr + offs_r, mask=r_mask, other=0).to(tl.int64)
    start = tl.load(starts_ptr + offs_r, mask=r_mask, other=0).to(tl.int64)
    degree = tl.load(stops_ptr + offs_r, mask=r_mask, other=0).to(tl.int64) - start
    return offs_r, r_mask, rows, start, degree


@jit
def light_edges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    """(rows, r_mask, pos, e_mask): the program's rows [ROWS] and their CSR positions
    [ROWS, BLOCK_E] with the mask of real edges."""
    _, r_mask, rows, start, degree = row_ranges(pid, rows_ptr, starts_ptr, stops_ptr, num_rows, ROWS)
    offs_e = tl.arange(0, BLOCK_E)
    pos = start[:, None] + offs_e[None, :]
    e_mask = offs_e[None, :] < degree[:, None]
    return rows, r_mask, pos, e_mask


@jit
def node_rows(pid, num_nodes, H, D, ROWS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """(offs_r, r_mask, feat_offs, feat_mask, rh_offs, rh_mask) for nodes ``pid·ROWS ...``:
    offsets of their ``[ROWS, BLOCK_H, BLOCK_D]`` features and ``[ROWS, BLOCK_H]`` per-head values."""
    offs_r = pid * ROWS + tl.arange(0, ROWS)
    offs_h, h_mask, hd_offs, hd_mask = head_tile(H, D, BLOCK_H, BLOCK_D)
    r_mask = offs_r < num_nodes
    feat_offs = offs_r[:, None, None] * (H * D) + hd_offs[None, :, :]
    feat_mask = r_mask[:, None, None] & hd_mask[None, :, :]
    rh_offs = offs_r[:, None] * H + offs_h[None, :]
    rh_mask = r_mask[:, None] & h_mask[None, :]
    return offs_r, r_mask, feat_offs, feat_mask, rh_offs, rh_mask


@jit
def finish_softmax(acc, m, total):
    """(out, lse) = (acc / total, m + log total) per head; a head with ``total == 0`` (no edges)
    gives zeros and ``-inf``."""
    has_edges = total > 0
    safe_total = tl.where(has_edges, total, 1.0)
    return acc / safe_total[:, None], tl.where(has_edges, m + tl.log(safe_total), float("-inf"))


@jit
def store_output(out_ptr, final_ptr, add_ptr, out, out_offs, add_offs, mask, ADD: tl.constexpr,
                 FINAL: tl.constexpr):
    """Store a forward output tile ``out``: at ``out_ptr`` plus the term ``add`` (``ADD``); with
    ``FINAL``, ``out_ptr`` keeps the attention's own output (the backward's ``δ = <g, out>`` reads
    it) and ``final_ptr`` gets ``out (+ add)`` in its own dtype — the caller's output in one pass."""
    total = out
    if ADD:
        total = out + tl.load(add_ptr + add_offs, mask=mask, other=0.0).to(out.dtype)
    if FINAL:
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(final_ptr + out_offs, total.to(final_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=mask)


@jit
def lane_add(acc, terms, LANES: tl.constexpr):
    """``acc`` plus the per-edge ``terms [BLOCK_E, ...]``: kept per edge lane with ``LANES`` (``acc``
    shaped like ``terms``: no reduction across threads inside an edge loop), else summed over the
    edges at once (``acc`` without the edge axis)."""
    if LANES:
        acc = acc + terms
    else:
        acc = acc + tl.sum(terms, axis=0)
    return acc


@jit
def lane_total(acc, LANES: tl.constexpr):
    """The edge-summed value of an accumulator built with :func:`lane_add`."""
    if LANES:
        acc = tl.sum(acc, axis=0)
    return acc


@jit
def light_slot_count(K: tl.constexpr, n0, n1, n2, n3, n4, n5, n6):
    """Row count of slot ``K`` among the launch's int arguments ``n0 .. n6``, as an int64 scalar."""
    count = n0
    if K == 1:
        count = n1
    if K == 2:
        count = n2
    if K == 3:
        count = n3
    if K == 4:
        count = n4
    if K == 5:
        count = n5
    if K == 6:
        count = n6
    return tl.full([], 0, tl.int64) + count
