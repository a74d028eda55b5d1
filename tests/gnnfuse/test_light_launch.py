"""One launch per pass for every light width class (kernels/tiles.py, ops._light_plan)."""

from types import SimpleNamespace

import pytest
import torch
from gnn_testing import corner_case_edges

from fusecore import use_reference
from fusecore.testing import assert_close
from gnnfuse import Graph, ScheduleOptions, ops
from gnnfuse.kernels.tiles import LIGHT_SLOTS, pack_light


def test_pack_light_puts_log2_rows_plus_one_in_each_width_slot():
    assert pack_light({}) == 0
    assert pack_light({1: 8, 4: 2, 64: 1}) == 4 | (2 << 8) | (1 << 24)
    for bad in ({3: 1}, {2: 3}, {1 << LIGHT_SLOTS: 1}, {1: 1 << 15}):
        with pytest.raises(ValueError):
            pack_light(bad)


def _widths_graph(device: torch.device) -> Graph:
    """40 rows each of in-degree 1, 2, 3, 5, 9 and 13: five light width classes at light_max_degree 16."""
    degrees = [1, 2, 3, 5, 9, 13] * 40
    dst = torch.repeat_interleave(torch.arange(len(degrees)), torch.tensor(degrees))
    src = torch.arange(dst.numel()) % len(degrees)
    return Graph(torch.stack([src, dst]).to(device), len(degrees))


# one launch per pass; the default's narrow and wide launches; breaks by pass (the per-score tables' form)
@pytest.mark.parametrize("breaks", [(), (8,), {"forward": (4, 16), "source": ()}])
# the GAT's light rows (forward and the backward's source pass) with the edge slots unrolled (bfloat16), or
# in one tile (float32, and bfloat16 with the passes switched off)
@pytest.mark.parametrize("unrolled", [True, False, "bf16-off"])
def test_light_classes_launch_grouped_by_the_breaks(gen, monkeypatch, breaks, unrolled):
    import gnnfuse.schedule
    from fusecore.testing import test_device
    from gnnfuse.kernels.scores import SCORE_GAT

    per_pass = isinstance(breaks, dict)
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS", (2,) if per_pass else breaks)
    # every dtype follows LIGHT_LAUNCH_BREAKS, or the per-pass entry of the GAT's score
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS_2BYTE", {SCORE_GAT: breaks} if per_pass else {})
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS_4BYTE", {SCORE_GAT: breaks} if per_pass else {})
    for name in ("LIGHT_FORWARD_UNROLLED", "LIGHT_SOURCE_UNROLLED"):
        monkeypatch.setattr(ops, name, unrolled is True)
    device = test_device()
    # small tiles on one multiprocessor: no class is merged into the next for being too small
    monkeypatch.setattr(gnnfuse.schedule, "device_facts", lambda _: SimpleNamespace(sm_count=1))
    options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
    for graph in (_widths_graph(device), Graph(corner_case_edges(gen).to(device), 29)):
        n, heads, dim = graph.num_nodes, 2, 3
        dtype = torch.float32 if unrolled is False else torch.bfloat16
        wh = torch.randn(n, heads, dim, generator=gen).to(device, dtype).requires_grad_(True)
        el = torch.randn(n, heads, generator=gen).to(device, dtype).requires_grad_(True)
        er = torch.randn(n, heads, generator=gen).to(device, dtype).requires_grad_(True)
        out = ops.gat_attention(graph, wh, el, er, schedule=options)
        g = torch.randn(out.shape, generator=gen).to(device)
        grads = torch.autograd.grad(out, (wh, el, er), g)
        with use_reference():
            ref = ops.gat_attention(graph, wh, el, er, schedule=options)
            ref_grads = torch.autograd.grad(ref, (wh, el, er), g)
        for got, want in ((out, ref), *zip(grads, ref_grads)):
            assert_close(got, want)  # the dtype's tolerance of fusecore.testing.TOLERANCES, as a relative norm
        schedule = graph.schedule(heads, dim, dtype, options)
        for buckets, kind, part, kernel_pass in ((schedule.incoming, "forward", 0, "forward"),
                                                 (schedule.outgoing, "backward", "source light", "source")):
            pass_breaks = breaks[kernel_pass] if per_pass else breaks
            # the classes' lists are views of light_all's, side by side in class order
            begin = 0
            for _, rows, starts, _ in buckets.light:
                assert rows.data_ptr() == buckets.light_all[0][begin:].data_ptr()
                assert starts.data_ptr() == buckets.light_all[1][begin:].data_ptr()
                begin += rows.numel()
            assert begin == buckets.light_all[0].numel()
            plans = [plan for key, plan in schedule.launches.items() if key[0] == kind]
            assert len(plans) == 1
            light = plans[0][part]
            assert all(meta["UNROLLED"] == (unrolled is True) for *_, meta in light)
            groups: list[list[int]] = []  # the classes' row counts, a new launch at each break
            for width, rows, _, _ in buckets.light:
                if not groups or width in pass_breaks:
                    groups.append([])
                groups[-1].append(rows.numel())
            assert len(light) == len(groups)
            for (_, ranges, counts, _), group in zip(light, groups):
                assert len(counts) == LIGHT_SLOTS and sum(counts) == sum(group) == ranges[0].numel()
                assert [c for c in counts if c] == group
            assert sum(map(sum, groups)) == begin
        if graph.num_nodes == 240:
            assert [w for w, *_ in schedule.incoming.light] == [1, 2, 4, 8, 16]


def test_light_breaks_per_score_in_two_byte_floats(monkeypatch):
    """``ops.LIGHT_LAUNCH_BREAKS_2BYTE`` overrides the breaks for its scores in 2-byte floats only,
    ``ops.LIGHT_LAUNCH_BREAKS_4BYTE`` for its scores in 4-byte floats only."""
    from gnnfuse.kernels.scores import SCORE_DOT, SCORE_GAT, SCORE_GATV2

    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS", (8,))
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS_2BYTE", {SCORE_GAT: (), SCORE_DOT: (4,)})
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS_4BYTE", {SCORE_GAT: (16,), ops.LIGHT_COSINE: (2,)})
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        feats, scale = torch.zeros(2, 2, 3, dtype=dtype), torch.zeros(2, 2, dtype=dtype)
        two_byte = dtype != torch.float32
        assert ops._light_breaks(ops.AttentionInputs(SCORE_GAT, scale, scale, feats)) == (() if two_byte else (16,))
        assert ops._light_breaks(ops.AttentionInputs(SCORE_DOT, feats, feats, feats)) == ((4,) if two_byte else (8,))
        assert ops._light_breaks(ops.AttentionInputs(SCORE_GATV2, feats, feats, feats, attn=feats[0])) == (8,)
        # AGNN's cosine (the dot score's keys formed from the values) has a key of its own, apart from SCORE_DOT
        cosine = ops.AttentionInputs(SCORE_DOT, scale, scale, feats, keys_from_values=True)
        assert ops._light_breaks(cosine) == ((8,) if two_byte else (2,))


def test_light_breaks_per_pass(monkeypatch):
    """An entry of the per-score dicts may give each pass its own breaks; a pass it leaves out takes
    ``ops.LIGHT_LAUNCH_BREAKS``, and a plain tuple serves every pass."""
    from gnnfuse.kernels.scores import SCORE_DOT, SCORE_GAT

    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS", (8,))
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS_4BYTE", {SCORE_DOT: {"forward": (4, 16), "source": ()},
                                                           SCORE_GAT: (2,)})
    feats, scale = torch.zeros(2, 2, 3), torch.zeros(2, 2)
    dot, gat = ops.AttentionInputs(SCORE_DOT, feats, feats, feats), ops.AttentionInputs(SCORE_GAT, scale, scale, feats)
    assert [ops._light_breaks(dot, p) for p in ("forward", "source", "destination")] == [(4, 16), (), (8,)]
    assert [ops._light_breaks(gat, p) for p in ("forward", "source", "destination")] == [(2,)] * 3


def test_light_launch_defaults_as_measured():
    """The defaults as sessions 31-32 measured them: AGNN's cosine one light launch a pass in every dtype; the
    Graph Transformer's dot score one in 2-byte floats, and in float32 two ((8, 32)) in the forward and one in the
    backward's passes; GATv2 in float32 one in the forward and two in the backward's passes."""
    from gnnfuse.kernels.scores import SCORE_DOT, SCORE_GATV2

    one, two = (32,), ops.LIGHT_LAUNCH_BREAKS
    passes = ("forward", "source", "destination")
    for dtype, transformer, gatv2 in ((torch.float32, (two, one, one), (one, two, two)),
                                      (torch.bfloat16, (one,) * 3, (two,) * 3)):
        feats, scale = torch.zeros(2, 2, 3, dtype=dtype), torch.zeros(2, 2, dtype=dtype)
        cosine = ops.AttentionInputs(SCORE_DOT, scale, scale, feats, keys_from_values=True)
        dot = ops.AttentionInputs(SCORE_DOT, feats, feats, feats)
        v2 = ops.AttentionInputs(SCORE_GATV2, feats, feats, feats, attn=feats[0])
        assert [ops._light_breaks(cosine, p) for p in passes] == [one] * 3
        assert tuple(ops._light_breaks(dot, p) for p in passes) == transformer
        assert tuple(ops._light_breaks(v2, p) for p in passes) == gatv2
    assert ops.LIGHT_LAUNCH_BREAKS == (8, 32)
    for table in (ops.LIGHT_LAUNCH_BREAKS_2BYTE, ops.LIGHT_LAUNCH_BREAKS_4BYTE):  # per-pass entries name real passes
        assert all(set(entry) <= set(ops.KERNEL_PASSES) for entry in table.values() if isinstance(entry, dict))
    for table in (ops.LIGHT_UNROLLED_FLOAT32_WARPS, ops.LIGHT_UNROLLED_TWO_BYTE_WARPS, ops.ROW_FLOAT32_WARPS):
        assert set(table) == set(ops.KERNEL_PASSES)


def test_edge_feature_kernels_launch_one_class_at_a_time_over_aligned_lists(gen, monkeypatch):
    """With edge features each light class of the forward (whose light tiles project the features) can keep a
    launch of its own (ops.LIGHT_LAUNCH_PER_CLASS_WITH_EDGES, off by default, set here): one nonzero
    count per launch, row lists equal
    to the class's and 16-byte aligned; the backward's passes, which project nothing, group their classes as
    without edge features; values and gradients (edge features and their weight too) as the reference's."""
    import gnnfuse.schedule
    from fusecore.testing import test_device

    device = test_device()
    monkeypatch.setattr(gnnfuse.schedule, "device_facts", lambda _: SimpleNamespace(sm_count=1))
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_PER_CLASS_WITH_EDGES", True)
    options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
    graph = _widths_graph(device)
    n, heads, dim, k = graph.num_nodes, 2, 4, 3

    def leaf(*shape):
        return torch.randn(*shape, generator=gen).to(device).requires_grad_(True)

    q, key, v = leaf(n, heads, dim), leaf(n, heads, dim), leaf(n, heads, dim)
    attr, weight = leaf(graph.num_edges, k), leaf(heads * dim, k)
    inputs = (q, key, v, attr, weight)
    out = ops.transformer_attention(graph, *inputs, schedule=options)
    g = torch.randn(out.shape, generator=gen).to(device)
    grads = torch.autograd.grad(out, inputs, g)
    with use_reference():
        ref = ops.transformer_attention(graph, *inputs, schedule=options)
        ref_grads = torch.autograd.grad(ref, inputs, g)
    for got, want in ((out, ref), *zip(grads, ref_grads)):
        assert_close(got, want)  # the float32 tolerance of fusecore.testing.TOLERANCES, as a relative norm
    schedule = graph.schedule(heads, dim, torch.float32, options)
    for (kind, *_), plan in schedule.launches.items():
        if kind == "backward":
            for part, buckets in (("source light", schedule.outgoing), ("destination light", schedule.incoming)):
                launches = plan[part]
                assert 1 <= len(launches) <= len(buckets.light)
                rows = sum(r.numel() for _, r, _, _ in buckets.light)
                assert sum(sum(counts) for _, _, counts, _ in launches) == rows
            # the five destination classes in fewer launches (grouped by ops.LIGHT_LAUNCH_BREAKS)
            assert len(plan["destination light"]) < len(schedule.incoming.light) == 5
            continue
        for part in (0,):
            buckets = schedule.incoming if part in (0, "destination light") else schedule.outgoing
            light = plan[part]
            assert len(light) == len(buckets.light)
            for (_, ranges, counts, _), (_, rows, starts, stops) in zip(light, buckets.light):
                assert [c for c in counts if c] == [rows.numel()]
                for got, want in zip(ranges, (rows, starts, stops)):
                    assert got.data_ptr() % 16 == 0 and torch.equal(got, want)
    assert [w for w, *_ in schedule.incoming.light] == [1, 2, 4, 8, 16]


def _matches_the_reference(gen, name: str, dtype: torch.dtype, options: ScheduleOptions, graph=None) -> dict:
    """One op of score ``name`` (gat, gatv2, dot, agnn; dropout 0.3 where it has any) on ``graph`` (default
    the widths graph), 3 heads × 5: output and gradients against the reference path; returns the schedule's
    launch plans."""
    from fusecore import PhiloxStream
    from fusecore.testing import test_device

    device = test_device()
    graph = _widths_graph(device) if graph is None else graph.to(device)
    n, heads, dim = graph.num_nodes, 3, 5
    q, k, v = (torch.randn(n, heads, dim, generator=gen).to(device, dtype).requires_grad_(True) for _ in range(3))
    attn = torch.randn(1, heads, dim, generator=gen).to(device, dtype).requires_grad_(True)
    beta = torch.tensor([0.8], device=device, dtype=dtype, requires_grad=True)
    calls = {
        "gat": (lambda: ops.gat_attention(graph, v, q[:, :, 0], k[:, :, 0], dropout=0.3, rng=PhiloxStream(5),
                                          schedule=options), (v, q, k)),
        "gatv2": (lambda: ops.gatv2(graph, q, k, attn, dropout=0.3, rng=PhiloxStream(5), schedule=options),
                  (q, k, attn)),
        "dot": (lambda: ops.transformer_attention(graph, q, k, v, dropout=0.3, rng=PhiloxStream(5), schedule=options),
                (q, k, v)),
        "agnn": (lambda: ops.agnn(graph, v, beta, schedule=options), (v, beta)),
    }
    fn, leaves = calls[name]
    out = fn()
    g = torch.randn(out.shape, generator=gen).to(device, dtype)
    grads = torch.autograd.grad(out, leaves, g)
    with use_reference():
        ref = fn()
        ref_grads = torch.autograd.grad(ref, leaves, g)
    for got, want in ((out, ref), *zip(grads, ref_grads)):
        assert_close(got, want, dtype=dtype)
    launches = graph.schedule(heads, dim, dtype, options).launches
    return launches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["gat", "gatv2", "dot", "agnn"])
def test_unrolled_light_rows_match_the_reference_for_every_score(gen, monkeypatch, name, dtype):
    """The unrolled light rows of the forward and of the backward's source and destination passes
    (UNROLLED in kernels/attention_forward.py and kernels/attention_backward.py) for every score,
    switched on for all of them (AGNN too) and for float32 too: outputs and gradients against the
    reference, with dropout."""
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_SCORES", (0, 1, 2))
    every_pass = dict.fromkeys(("forward", "source", "destination"), (0, 1, 2))
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_FLOAT32_SCORES", every_pass)
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_KEYS_FROM_VALUES", True)
    monkeypatch.setattr(ops, "LIGHT_SOURCE_UNROLLED", True)
    monkeypatch.setattr(ops, "LIGHT_DESTINATION_UNROLLED", True)
    # a register cap on one pass in 2-byte floats, on another in 4-byte floats, and a warp count on the second:
    # launch options, the values unchanged
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_MAXNREG", {"forward": {}, "source": dict.fromkeys(ops.LIGHT_KINDS, 96),
                                                        "destination": {}})
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_FLOAT32_MAXNREG", {"forward": {}, "source": {},
                                                                "destination": dict.fromkeys(ops.LIGHT_KINDS, 80)})
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_WARPS", {"forward": None, "source": None, "destination": 2})
    options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
    launches = _matches_the_reference(gen, name, dtype, options)
    forward = [plan[0] for key, plan in launches.items() if key[0] == "forward"]
    backward = [plan for key, plan in launches.items() if key[0] == "backward"]
    source = [plan["source light"] for plan in backward]
    destination = [plan["destination light"] for plan in backward if "destination light" in plan]
    assert forward and source and (name == "gat" or destination)  # GAT's destination pass is a row sum
    assert all(meta["UNROLLED"] for light in forward + source + destination for *_, meta in light)
    two_byte = dtype in (torch.bfloat16, torch.float16)
    capped, cap = (source, 96) if two_byte else (destination, 80)
    assert all(meta["maxnreg"] == cap for light in capped for *_, meta in light)
    assert all("maxnreg" not in meta for light in forward + (destination if two_byte else source)
               for *_, meta in light)
    assert all(meta["num_warps"] == 2 for light in destination for *_, meta in light)


@pytest.mark.parametrize("wide", [False, True])
def test_default_register_caps_reach_the_source_light_launches_they_name(gen, monkeypatch, wide):
    """The default caps of the unrolled light launches (``ops.LIGHT_UNROLLED_FLOAT32_MAXNREG``: the dot score's and
    AGNN's float32 source pass at 48 registers; ``ops.LIGHT_UNROLLED_MAXNREG``: in 2-byte floats the dot score's at
    64 and AGNN's at 40) reach those launches and no other pass's (GATv2 has none), and none where the head tile is
    wider than ``LIGHT_UNROLLED_MAXNREG_MAX_WIDTH`` (here 4 × 8, so ``wide`` sets the limit to 16); values as the
    reference's."""
    if wide:
        monkeypatch.setattr(ops, "LIGHT_UNROLLED_MAXNREG_MAX_WIDTH", 16)
    want = {("agnn", torch.float32): 48, ("agnn", torch.bfloat16): 40, ("dot", torch.float32): 48,
            ("dot", torch.bfloat16): 64}
    options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
    for (name, dtype), cap in (*want.items(), (("gatv2", torch.float32), None), (("gatv2", torch.bfloat16), None)):
        launches = _matches_the_reference(gen, name, dtype, options)
        light = [(part, meta) for key, plan in launches.items() if key[0] == "backward"
                 for part in ("source light", "destination light") for *_, meta in plan.get(part, ())]
        light += [("forward", meta) for key, plan in launches.items() if key[0] == "forward" for *_, meta in plan[0]]
        assert {part for part, _ in light} == {"forward", "source light", "destination light"}
        for part, meta in light:
            capped = part == "source light" and meta["UNROLLED"] and not wide
            assert meta.get("maxnreg") == (cap if capped else None), (name, dtype, part, meta)
        assert wide or cap is None or any(meta.get("maxnreg") == cap for _, meta in light)


def test_two_byte_register_caps_skip_edge_features(gen):
    """The 2-byte caps of ``ops.LIGHT_UNROLLED_MAXNREG`` are not applied with edge features (the Transformer bf16's
    source pass spills at its cap there): the dot score's unrolled source launches with edge features carry none."""
    from fusecore.testing import test_device

    device = test_device()
    graph = _widths_graph(device)
    n, heads, dim, k = graph.num_nodes, 3, 5, 4
    q, key, v = (torch.randn(n, heads, dim, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
                 for _ in range(3))
    attr = torch.randn(graph.num_edges, k, generator=gen).to(device, torch.bfloat16)
    weight = torch.randn(heads * dim, k, generator=gen).to(device, torch.bfloat16)
    options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
    out = ops.transformer_attention(graph, q, key, v, attr, weight, schedule=options)
    out.backward(torch.randn(out.shape, generator=gen).to(device, torch.bfloat16))
    launches = graph.schedule(heads, dim, torch.bfloat16, options).launches
    source = [meta for key_, plan in launches.items() if key_[0] == "backward"
              for *_, meta in plan["source light"]]
    assert any(meta["UNROLLED"] for meta in source)
    assert all("maxnreg" not in meta for meta in source), source


@pytest.mark.parametrize("name", ["gat", "dot"])
def test_light_classes_wider_than_the_unrolled_cap_launch_in_the_tile_form(gen, monkeypatch, name):
    """ops.LIGHT_UNROLLED_MAX_WIDTH: classes up to it run unrolled, wider ones in the tile form in a launch of their
    own (a launch is one form), without the unrolled form's register cap; values as the reference's."""
    import gnnfuse.schedule

    monkeypatch.setattr(ops, "LIGHT_UNROLLED_MAX_WIDTH", 4)
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS", ())
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS_2BYTE", {})
    monkeypatch.setattr(ops, "LIGHT_LAUNCH_BREAKS_4BYTE", {})
    monkeypatch.setattr(ops, "LIGHT_SOURCE_UNROLLED", True)
    monkeypatch.setattr(ops, "LIGHT_UNROLLED_MAXNREG", {"forward": {}, "source": dict.fromkeys((0, 1, 2), 96),
                                                        "destination": {}})
    # small tiles on one multiprocessor: no class is merged into the next for being too small
    monkeypatch.setattr(gnnfuse.schedule, "device_facts", lambda _: SimpleNamespace(sm_count=1))
    options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
    launches = _matches_the_reference(gen, name, torch.bfloat16, options)
    forward = [plan[0] for key, plan in launches.items() if key[0] == "forward"]
    source = [plan["source light"] for key, plan in launches.items() if key[0] == "backward"]
    assert forward and source
    for light in forward:  # the incoming rows' widths 1, 2, 4 unrolled; 8 and 16 in the tile form
        assert [[1 << i for i, c in enumerate(counts) if c] for _, _, counts, _ in light] == [[1, 2, 4], [8, 16]]
    for light, kernel_pass in [*((light, "forward") for light in forward), *((light, "source") for light in source)]:
        for _, _, counts, meta in light:
            widths = [1 << i for i, c in enumerate(counts) if c]
            assert all(w <= 4 for w in widths) or not any(w <= 4 for w in widths)  # one form a launch
            assert meta["UNROLLED"] is (max(widths) <= 4)
            assert meta.get("maxnreg") == (96 if meta["UNROLLED"] and kernel_pass == "source" else None)


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("name", ["gat", "gatv2", "dot", "agnn"])
def test_row_kernel_prefetch_matches_the_reference(gen, monkeypatch, name, lanes, depth):
    """The forward row kernel with each edge block's indices (``PREFETCH`` 1) or its indices and gathers
    (2) loaded a trip ahead, set for every score through ops.ROW_PREFETCH_SCORES /
    ROW_PREFETCH_GATHER_SCORES, and (depth 1) the backward's row kernels with their indices a trip ahead
    (ops.ROW_BACKWARD_PREFETCH_SCORES): outputs and gradients equal the reference's, per-lane state or not, with
    dropout, on rows of 2 to 12 edges in blocks of at most 8 (rows of 13 split into pieces of 7)."""
    monkeypatch.setattr(ops, "ROW_PREFETCH_SCORES", (0, 1, 2))
    monkeypatch.setattr(ops, "ROW_PREFETCH_GATHER_SCORES", (0, 1, 2) if depth == 2 else ())
    monkeypatch.setattr(ops, "ROW_BACKWARD_PREFETCH_SCORES", (0, 1, 2) if depth == 1 else ())
    options = ScheduleOptions(light_max_degree=1, split_degree=12, piece_edges=7, edge_lanes=lanes, tile_elements=256)
    launches = _matches_the_reference(gen, name, torch.bfloat16, options)
    rows = [launch for key, plan in launches.items() if key[0] == "forward" for launch in plan[1]]
    assert rows and all(launch["PREFETCH"] == depth and launch["BLOCK_E"] <= 8 for launch in rows)  # 2-3 trips
    backward = [launch for key, plan in launches.items() if key[0] == "backward"
                for part in ("source rows", "destination rows") for launch in plan.get(part, [])]
    assert backward and all(launch["PREFETCH"] == (depth == 1) for launch in backward)


def test_row_kernel_edge_blocks_are_capped_on_the_gpu_only(monkeypatch):
    """``ops.ROW_MAX_EDGES``: the GPU's row-kernel edge block per pass and score (AGNN's destination pass
    uncapped); under the interpreter the schedule's larger blocks stay."""
    from fusecore import backend
    from gnnfuse.kernels.scores import SCORE_DOT, SCORE_GAT, SCORE_GATV2

    schedule = Graph(torch.tensor([[0, 1], [1, 0]]), 2).schedule(4, 16, torch.float32)
    feats, scale = torch.zeros(2, 4, 16), torch.zeros(2, 4)
    inputs = {SCORE_GAT: ops.AttentionInputs(SCORE_GAT, scale, scale, feats),
              SCORE_GATV2: ops.AttentionInputs(SCORE_GATV2, feats, feats, feats, attn=feats[0]),
              SCORE_DOT: ops.AttentionInputs(SCORE_DOT, feats, feats, feats)}
    agnn = ops.AttentionInputs(SCORE_DOT, scale, scale, feats, keys_from_values=True)
    passes = ("forward", "source", "destination")
    interpreted = backend.INTERPRET
    monkeypatch.setattr(backend, "INTERPRET", True)  # the blocks without a cap (on the GPU: its own schedule's)
    uncapped = {(p, s): ops._tile_budget(schedule, x, p)[1] for p in passes for s, x in inputs.items()}
    uncapped_agnn = {p: ops._tile_budget(schedule, agnn, p)[1] for p in passes}
    if interpreted:
        assert all(block > 16 for block in uncapped.values())  # the interpreter's blocks stay large
    monkeypatch.setattr(backend, "INTERPRET", False)
    for p in passes:
        for s, x in inputs.items():
            assert ops._tile_budget(schedule, x, p)[1] == min(uncapped[p, s], ops.ROW_MAX_EDGES[p][s])
        cap = ops.ROW_MAX_EDGES_KEYS_FROM_VALUES[p]
        block = ops._tile_budget(schedule, agnn, p)[1]
        assert block == (min(uncapped_agnn[p], cap) if cap else uncapped_agnn[p])
    monkeypatch.setitem(ops.ROW_MAX_EDGES, "forward", {})  # absent: no cap
    assert ops._tile_budget(schedule, inputs[SCORE_GAT], "forward")[1] == uncapped["forward", SCORE_GAT]


@pytest.mark.parametrize("lanes", [False, True])
@pytest.mark.parametrize("name", ["gat", "gatv2", "dot", "agnn"])
def test_capped_row_kernel_blocks_match_the_reference(gen, monkeypatch, name, lanes):
    """The GPU's edge-block caps (``ops.ROW_MAX_EDGES``) applied under the interpreter: rows of 17 to 70 edges
    in and out, those above 50 split into pieces of 24, every pass's row kernel looping over several capped
    blocks: outputs and gradients equal the reference's."""
    monkeypatch.setattr(ops, "row_max_edges", ops.gpu_row_max_edges)
    n = 90
    degree = 17 + torch.randperm(54, generator=gen)[torch.arange(n) % 54]
    dst = torch.repeat_interleave(torch.arange(n), degree)
    src = torch.randint(0, n, (dst.numel(),), generator=gen)
    graph = Graph(torch.stack([src, dst]), n)
    options = ScheduleOptions(light_max_degree=1, split_degree=50, piece_edges=24, edge_lanes=lanes)
    launches = _matches_the_reference(gen, name, torch.float32, options, graph)
    blocks = {part: [launch["BLOCK_E"] for key, plan in launches.items() for launch in
                     (plan[1] if key[0] == "forward" and part == "forward" else
                      plan.get(part, []) if key[0] == "backward" and isinstance(plan, dict) else [])]
              for part in ("forward", "source rows", "destination rows")}
    assert blocks["forward"] and max(blocks["forward"]) <= 16
    assert blocks["source rows"] and max(blocks["source rows"]) <= 8
    if name in ("gatv2", "dot"):  # GAT's destination pass sums per row without a row kernel; AGNN's is uncapped
        assert blocks["destination rows"] and max(blocks["destination rows"]) <= 16


def test_row_kernel_launch_options_per_pass(gen, monkeypatch):
    """``ops.ROW_WARPS`` / ``ops.ROW_MAXNREG`` reach the row kernels' launches of their pass only; values unchanged."""
    from gnn_testing import SCHEDULES

    from fusecore.testing import test_device

    device = test_device()
    graph = Graph(corner_case_edges(gen).to(device), 29)
    options = SCHEDULES["mixed"]  # medium rows and super-row pieces
    n, heads, dim = graph.num_nodes, 2, 3
    wh, el, er = (torch.randn(*shape, generator=gen).to(device).requires_grad_(True)
                  for shape in ((n, heads, dim), (n, heads), (n, heads)))
    q, k, v = (torch.randn(n, heads, dim, generator=gen).to(device).requires_grad_(True) for _ in range(3))
    g = torch.randn(n, heads, dim, generator=gen).to(device)

    def run():
        gat = ops.gat_attention(graph, wh, el, er, schedule=options)
        tr = ops.transformer_attention(graph, q, k, v, schedule=options)
        return (gat, tr, *torch.autograd.grad(gat, (wh, el, er), g), *torch.autograd.grad(tr, (q, k, v), g))

    want = run()
    monkeypatch.setattr(ops, "ROW_WARPS", {"forward": 2, "source": None, "destination": 8})
    monkeypatch.setattr(ops, "ROW_MAXNREG", {"forward": None, "source": 64, "destination": None})
    schedule = graph.schedule(heads, dim, torch.float32, options)
    schedule.launches.clear()
    got = run()
    for a, b in zip(got, want):
        assert_close(a, b)
    seen = {"forward": 0, "source rows": 0, "destination rows": 0}
    for (kind, *_), plan in schedule.launches.items():
        parts = {"forward": plan[1]} if kind == "forward" else plan
        for part, want_warps, want_cap in (("forward", 2, None), ("source rows", schedule.num_warps, 64),
                                           ("destination rows", 8, None)):
            for meta in parts.get(part, []):
                assert meta["num_warps"] == want_warps and meta.get("maxnreg") == want_cap, (part, meta)
                seen[part] += 1
    assert seen["forward"] and seen["destination rows"], seen
    schedule.launches.clear()


def test_dense_graphs_take_light_rows_up_to_32_in_a_launch_of_their_own(gen, monkeypatch):
    """Mean in-degree >= ``schedule.DENSE_MEAN_DEGREE``: light rows up to ``DENSE_LIGHT_MAX`` (32), the width-32
    class launched apart (``ops.LIGHT_LAUNCH_BREAKS``); sparse graphs keep 16; values and gradients as the reference.
    """
    import gnnfuse.schedule as sched
    from fusecore.testing import test_device

    device = test_device()
    monkeypatch.setattr(sched, "SMALL_GRAPH_EDGES", 0)  # on the GPU a graph this small would take no light rows
    degrees = torch.randint(24, 49, (48,), generator=gen)
    dst = torch.repeat_interleave(torch.arange(48), degrees)
    dense = Graph(torch.stack([torch.randint(0, 48, (dst.numel(),), generator=gen), dst]).to(device), 48)
    assert dense.num_edges >= sched.DENSE_MEAN_DEGREE * dense.num_nodes
    sparse = Graph(corner_case_edges(gen).to(device), 29)
    n, heads, dim = 48, 2, 3
    for dtype in (torch.float32, torch.bfloat16):
        assert dense.schedule(heads, dim, dtype).light_max_degree == sched.DENSE_LIGHT_MAX == 32
        assert sparse.schedule(heads, dim, dtype).light_max_degree == sched.DEFAULT_LIGHT_MAX == 16
        assert dense.schedule(heads, dim, dtype, ScheduleOptions(light_max_degree=8)).light_max_degree == 8
        wh, el, er = (torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_(True)
                      for shape in ((n, heads, dim), (n, heads), (n, heads)))
        q, k, v = (torch.randn(n, heads, dim, generator=gen).to(device, dtype).requires_grad_(True) for _ in range(3))
        g = torch.randn(n, heads, dim, generator=gen).to(device, dtype)
        for op, inputs in ((ops.gat_attention, (wh, el, er)), (ops.transformer_attention, (q, k, v))):
            out = op(dense, *inputs)
            grads = torch.autograd.grad(out, inputs, g)
            with use_reference():
                ref = op(dense, *inputs)
                ref_grads = torch.autograd.grad(ref, inputs, g)
            for got, want in ((out, ref), *zip(grads, ref_grads)):
                assert_close(got, want)  # the dtype's tolerance of fusecore.testing.TOLERANCES
        schedule = dense.schedule(heads, dim, dtype)
        widths = [w for w, *_ in schedule.incoming.light]
        assert 32 in widths and schedule.incoming.medium[0].numel() > 0
        for (kind, *_), plan in schedule.launches.items():
            if kind == "forward":
                # the last launch holds the width-32 class alone: one nonzero class count
                assert [c for c in plan[0][-1][2] if c] == [schedule.incoming.light[-1][1].numel()]


def test_warps_by_pass_score_and_float_width(monkeypatch):
    """The light and row kernels' warps per program: the per-pass override when set, else the table of the input's
    float width by score kind (AGNN's cosine apart from the Graph Transformer's dot score; the row kernel's only on
    4-byte floats and for tiles at least ``ops.ROW_FLOAT32_WARPS_MIN_WIDTH`` wide), else the schedule's."""
    from gnnfuse.kernels.scores import SCORE_DOT, SCORE_GAT, SCORE_GATV2

    # the defaults as sessions 32-34 measured them
    assert ops.LIGHT_UNROLLED_FLOAT32_WARPS == {"forward": {SCORE_GATV2: 8, SCORE_DOT: 8, ops.LIGHT_COSINE: 8},
                                                "source": {SCORE_DOT: 8, ops.LIGHT_COSINE: 8},
                                                "destination": {SCORE_GATV2: 8}}
    assert ops.LIGHT_UNROLLED_TWO_BYTE_WARPS == {"forward": {}, "source": {ops.LIGHT_COSINE: 8}, "destination": {}}
    assert ops.ROW_FLOAT32_WARPS == {p: {SCORE_GATV2: 8} for p in ops.KERNEL_PASSES}
    assert ops.ROW_FLOAT32_WARPS_MIN_WIDTH == 128
    schedule = SimpleNamespace(num_warps=4, block_h=8, block_d=16)  # a row tile 128 wide
    narrow = SimpleNamespace(num_warps=4, block_h=4, block_d=16)
    monkeypatch.setattr(ops, "ROW_FLOAT32_WARPS", {"forward": {SCORE_GATV2: 8, ops.LIGHT_COSINE: 2}, "source": {},
                                                   "destination": {}})
    eight = {
        torch.float32: {("gatv2", "forward"), ("gatv2", "destination"), ("cosine", "forward"), ("cosine", "source"),
                        ("dot", "forward"), ("dot", "source")},
        torch.bfloat16: {("cosine", "source")}, torch.float16: {("cosine", "source")},
    }
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        feats, scale = torch.zeros(2, 2, 3, dtype=dtype), torch.zeros(2, 2, dtype=dtype)
        v2 = ops.AttentionInputs(SCORE_GATV2, feats, feats, feats, attn=feats[0])
        cosine = ops.AttentionInputs(SCORE_DOT, scale, scale, feats, keys_from_values=True)
        dot, gat = ops.AttentionInputs(SCORE_DOT, feats, feats, feats), ops.AttentionInputs(SCORE_GAT, scale, scale,
                                                                                            feats)
        fp32 = dtype == torch.float32
        assert ops._row_options(schedule, "forward", v2)["num_warps"] == (8 if fp32 else 4)
        assert ops._row_options(schedule, "forward", cosine)["num_warps"] == (2 if fp32 else 4)
        assert ops._row_options(schedule, "forward", dot)["num_warps"] == 4
        assert ops._row_options(schedule, "source", v2)["num_warps"] == 4
        assert ops._row_options(narrow, "forward", v2)["num_warps"] == 4  # narrower than ROW_FLOAT32_WARPS_MIN_WIDTH
        for table, dtypes in ((ops.LIGHT_UNROLLED_FLOAT32_WARPS, ops.FLOAT32_DTYPES),
                              (ops.LIGHT_UNROLLED_TWO_BYTE_WARPS, ops.TWO_BYTE_DTYPES)):
            assert all(ops._by_kind(table, gat, p, dtypes) is None for p in ops.KERNEL_PASSES)
        light = {(name, p): (ops._by_kind(ops.LIGHT_UNROLLED_FLOAT32_WARPS, inputs, p)
                             or ops._by_kind(ops.LIGHT_UNROLLED_TWO_BYTE_WARPS, inputs, p, ops.TWO_BYTE_DTYPES))
                 for name, inputs in (("gatv2", v2), ("cosine", cosine), ("dot", dot)) for p in ops.KERNEL_PASSES}
        assert light == {key: (8 if key in eight[dtype] else None) for key in light}
        monkeypatch.setattr(ops, "ROW_WARPS", {"forward": 16, "source": None, "destination": None})
        assert ops._row_options(schedule, "forward", v2)["num_warps"] == 16
        monkeypatch.setattr(ops, "ROW_WARPS", {"forward": None, "source": None, "destination": None})


def test_node_backward_warps_reach_the_per_node_backward_launches(monkeypatch, device):
    """``ops.NODE_BACKWARD_WARPS``: the per-node backward kernel's launch options by feature width (warps as
    session 34 measured them), and a GAT and an AGNN training step with every width at 8 warps give the reference's
    gradients."""
    assert ops.NODE_BACKWARD_WARPS == {"node_scores": {2: 8}}
    for dtype, node_scores in ((torch.float32, {}), (torch.bfloat16, {"num_warps": 8}),
                               (torch.float16, {"num_warps": 8}), (torch.float64, {})):
        assert ops._node_backward_options("node_scores", torch.zeros(2, 2, 3, dtype=dtype)) == node_scores
    monkeypatch.setattr(ops, "NODE_BACKWARD_WARPS", {"node_scores": {8: 8}})
    assert ops._node_backward_options("node_scores", torch.zeros(1, dtype=torch.float64)) == {"num_warps": 8}
    from gnnfuse.nn import AGNNConv, GATConv

    gen = torch.Generator().manual_seed(3)
    n = 23
    edges = torch.randint(0, n, (2, 97), generator=gen)
    graph = Graph(torch.cat([edges, torch.arange(n).repeat(2, 1)], 1).to(device), n)
    # slope 0.25: float32 holds it exactly (the compiled kernels' scalar arguments are float32)
    for layer in (GATConv(12, 4, 3, negative_slope=0.25), AGNNConv()):
        x = torch.randn(n, 12, generator=gen, dtype=torch.float64).to(device).requires_grad_()
        layer = layer.double().to(device)
        grads = []
        for reference in (False, True):
            with use_reference(reference):
                x.grad = None
                for p in layer.parameters():
                    p.grad = None
                layer(graph, x).square().sum().backward()
                grads.append([x.grad.clone(), *(p.grad.clone() for p in layer.parameters())])
        for got, want in zip(*grads):
            assert_close(got, want)
