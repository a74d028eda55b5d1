"""GAT's projection with the node scores in its epilogue (gnnfuse/kernels/projection.py).

The kernel against a float64 oracle (the product rounded to the input dtype, the scores from the
rounded product) at odd sizes, poisoned outputs, in 16-bit floats and in float32 (products in three
TF32 parts on the GPU: fusecore.linear); where the fused path applies; and GATConv with it against
GATConv with the unfused projection and the node-score pass, forward and every gradient.
"""

from __future__ import annotations

import math

import pytest
import torch
from gnn_testing import corner_case_edges, poison_op_outputs

from fusecore.testing import (
    assert_all_written,
    assert_close,
    fresh_generator,
    record_launches,
    test_device,
    tolerance,
)
from gnnfuse import Graph, ops
from gnnfuse.nn import GATConv

DEVICE = test_device()
HALF = (torch.bfloat16, torch.float16)
FUSED = (*HALF, torch.float32)


def _oracle(x, weight, attn_l, attn_r, heads, head_dim):
    wh = (x.double() @ weight.double().t()).to(x.dtype).view(-1, heads, head_dim)
    w64 = wh.double()
    el = (w64 * attn_l.double().view(1, heads, head_dim)).sum(-1)
    er = (w64 * attn_r.double().view(1, heads, head_dim)).sum(-1)
    return wh, el, er


@pytest.mark.parametrize("dtype", FUSED)
@pytest.mark.parametrize(
    "num_nodes, in_feats, heads, head_dim",
    [(1, 1, 1, 16), (61, 5, 3, 5), (64, 16, 8, 16), (130, 100, 2, 8), (67, 130, 4, 64), (0, 7, 2, 8),
     (53, 602, 4, 16), (3, 602, 4, 16), (29, 37, 2, 16), (9, 17, 1, 16)],
)
def test_projection_scores_matches_float64(dtype, num_nodes, in_feats, heads, head_dim, monkeypatch):
    gen = fresh_generator()
    seed = gen.initial_seed()
    created = poison_op_outputs(monkeypatch)
    monkeypatch.setattr(ops, "PROJECTION_CLASS_MIN_ROWS", 0)
    x = torch.randn(num_nodes, in_feats, generator=gen).to(DEVICE, dtype)
    weight = (torch.randn(heads * head_dim, in_feats, generator=gen) / in_feats**0.5).to(DEVICE, dtype)
    attn_l = torch.randn(1, heads, head_dim, generator=gen).to(DEVICE, dtype)
    attn_r = torch.randn(1, heads, head_dim, generator=gen).to(DEVICE, dtype)
    # the layer fuses 16-byte aligned rows, and 2-byte rows of >= 16 columns at any stride by alignment class (rows
    # of 37 or 17 elements: 8 classes; 602 or 130: 4; 100: 2; here at any row count); the kernel itself takes any
    # row stride
    aligned = in_feats * x.element_size() % 16 == 0 or (dtype in HALF and in_feats >= 16)
    assert ops.fuses_projection(x, weight, heads, head_dim) == (aligned and x.data_ptr() % 16 == 0)
    if dtype in HALF and in_feats >= 16:
        assert ops._row_classes(x) == 16 // math.gcd(in_feats * 2, 16)
    wh, el, er = ops._projection_scores(x, weight, attn_l, attn_r, heads, head_dim)
    assert wh.shape == (num_nodes, heads, head_dim) and wh.dtype == dtype
    assert el.shape == er.shape == (num_nodes, heads) and el.dtype == torch.float32
    for tensor in created:
        assert_all_written(tensor)
    ref_wh, ref_el, ref_er = _oracle(x, weight, attn_l, attn_r, heads, head_dim)
    if num_nodes:
        assert_close(wh.float(), ref_wh.float(), dtype, name=f"wh (seed {seed})")
        # the scores are summed in float32 from the kernel's own Wh (one ulp of dtype off the oracle's)
        assert_close(el, ref_el.float(), dtype, name=f"el (seed {seed})")
        assert_close(er, ref_er.float(), dtype, name=f"er (seed {seed})")


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize(
    "num_nodes, in_feats, heads, head_dim, block_m",
    [(300, 128, 8, 16, 16), (1, 3, 4, 16, 128), (257, 33, 2, 32, 32), (45, 128, 1, 64, 16), (97, 8, 16, 8, 64)],
)
def test_float32_projection_held_and_sliced(held, num_nodes, in_feats, heads, head_dim, block_m, monkeypatch):
    """The float32 projection on fusecore.linear's held TF32 parts (column blocks of whole heads, each with its
    heads' scores; small row blocks so that every program walks several, two programs per column block on the
    interpreter's two "SMs") and on the slice kernel, against the float64 oracle."""
    from fusecore import linear as core_linear

    monkeypatch.setattr(ops, "PROJECTION_HELD", held)
    monkeypatch.setattr(core_linear, "HELD_BLOCK_M", block_m)
    monkeypatch.setattr(core_linear, "HELD_PROGRAMS_PER_SM", 2)
    gen = fresh_generator()
    seed = gen.initial_seed()
    created = poison_op_outputs(monkeypatch)
    x = torch.randn(num_nodes, in_feats, generator=gen).to(DEVICE)
    weight = (torch.randn(heads * head_dim, in_feats, generator=gen) / in_feats**0.5).to(DEVICE)
    attn_l = torch.randn(1, heads, head_dim, generator=gen).to(DEVICE)
    attn_r = torch.randn(1, heads, head_dim, generator=gen).to(DEVICE)
    assert (ops._projection_held_tiling(x, weight, heads, head_dim) is not None) == held
    wh, el, er = ops._projection_scores(x, weight, attn_l, attn_r, heads, head_dim)
    for tensor in created:
        assert_all_written(tensor)
    ref_wh, ref_el, ref_er = _oracle(x, weight, attn_l, attn_r, heads, head_dim)
    assert_close(wh, ref_wh.float(), torch.float32, name=f"wh (seed {seed})")
    assert_close(el, ref_el.float(), torch.float32, name=f"el (seed {seed})")
    assert_close(er, ref_er.float(), torch.float32, name=f"er (seed {seed})")


def test_where_the_held_projection_applies():
    """Whole heads per column block, a reduction of at most fusecore.linear.HELD_MAX_K, float32 only."""
    from fusecore import linear as core_linear

    def tiling(in_feats, heads, head_dim, dtype=torch.float32):
        x = torch.zeros(4, in_feats, dtype=dtype, device=DEVICE)
        weight = torch.zeros(heads * head_dim, in_feats, dtype=dtype, device=DEVICE)
        return ops._projection_held_tiling(x, weight, heads, head_dim)

    assert tiling(128, 8, 16)[1] == core_linear.HELD_BLOCK_N
    assert tiling(128, 2, 8)[1] == 16
    assert tiling(129, 8, 16) is None  # deeper than HELD_MAX_K
    assert tiling(64, 3, 5) is None  # a head size that is not a power of two
    assert tiling(64, 1, 128) is None  # a head wider than the column block
    assert tiling(64, 8, 16, torch.bfloat16) is None


def test_projection_reads_a_row_strided_input(monkeypatch):
    gen = fresh_generator()
    poison_op_outputs(monkeypatch)
    wide = torch.randn(37, 56, generator=gen).to(DEVICE, torch.bfloat16)
    x = wide[:, 8:48]  # row stride 56, unit column stride, rows 16-byte aligned
    weight = torch.randn(32, 40, generator=gen).to(DEVICE, torch.bfloat16)
    attn = torch.randn(1, 4, 8, generator=gen).to(DEVICE, torch.bfloat16)
    assert ops.fuses_projection(x, weight, 4, 8)
    assert not ops.fuses_projection(wide[:, 3:43], weight, 4, 8)  # rows start 6 bytes in
    wh, el, er = ops._projection_scores(x, weight, attn, attn, 4, 8)
    ref_wh, ref_el, _ = _oracle(x.contiguous(), weight, attn, attn, 4, 8)
    assert_close(wh.float(), ref_wh.float(), torch.bfloat16)
    assert_close(el, ref_el.float(), torch.bfloat16)
    assert torch.equal(el, er)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("width, start, in_feats, classes", [(61, 8, 37, 8), (58, 8, 26, 4), (45, 0, 17, 8),
                                                            (40, 24, 16, 1)])
def test_projection_by_row_class_of_a_strided_input(dtype, width, start, in_feats, classes, monkeypatch):
    """Rows of a view ``width`` elements apart, starting 16-byte aligned: each program takes the rows of one
    alignment class, loads their aligned body 16 bytes at a time and gathers the columns around it (every row
    written, against the float64 oracle, for row counts around the class count)."""
    gen = fresh_generator()
    seed = gen.initial_seed()
    created = poison_op_outputs(monkeypatch)
    monkeypatch.setattr(ops, "PROJECTION_CLASS_MIN_ROWS", 0)
    weight = (torch.randn(32, in_feats, generator=gen) / in_feats**0.5).to(DEVICE, dtype)
    attn_l = torch.randn(1, 2, 16, generator=gen).to(DEVICE, dtype)
    attn_r = torch.randn(1, 2, 16, generator=gen).to(DEVICE, dtype)
    for num_nodes in (1, classes - 1, classes + 1, 5 * classes + 3, 131):
        if num_nodes < 1:
            continue
        wide = torch.randn(num_nodes, width, generator=gen).to(DEVICE, dtype)
        x = wide[:, start:start + in_feats]
        assert ops.fuses_projection(x, weight, 2, 16) and ops._row_classes(x) == classes
        wh, el, er = ops._projection_scores(x, weight, attn_l, attn_r, 2, 16)
        for tensor in created:
            assert_all_written(tensor)
        created.clear()
        ref_wh, ref_el, ref_er = _oracle(x, weight, attn_l, attn_r, 2, 16)
        what = f"{num_nodes} rows (seed {seed})"
        assert_close(wh.float(), ref_wh.float(), dtype, name=f"wh, {what}")
        assert_close(el, ref_el.float(), dtype, name=f"el, {what}")
        assert_close(er, ref_er.float(), dtype, name=f"er, {what}")


def test_row_classes_only_where_they_apply(monkeypatch):
    """Row classes for 16-byte aligned 2-byte inputs of >= 16 columns; otherwise plain loads (one class)."""
    x = torch.zeros(8, 42, dtype=torch.bfloat16, device=DEVICE)
    assert ops._row_classes(x[:, :37]) == 4  # rows 84 bytes apart
    assert ops._row_classes(x[:, :40].contiguous()) == 1  # 80 bytes apart: aligned rows
    assert ops._row_classes(x[:, 1:38]) == 1  # starts 2 bytes in
    assert ops._row_classes(x[:, :15]) == 1  # under 16 columns
    assert ops._row_classes(x.float()[:, :37]) == 1  # float32: rows must be aligned to fuse at all
    weight = torch.zeros(32, 37, dtype=torch.bfloat16, device=DEVICE)
    # the layer fuses them from PROJECTION_CLASS_MIN_ROWS rows (fewer rows: too few programs for the long rows)
    assert not ops.fuses_projection(x[:, :37], weight, 2, 16)
    monkeypatch.setattr(ops, "PROJECTION_CLASS_MIN_ROWS", 8)
    assert ops.fuses_projection(x[:, :37], weight, 2, 16)
    assert not ops.fuses_projection(x[:7, :37], weight, 2, 16)
    # unaligned rows of under 16 columns: not by class, so not fused (plain loads of such rows are slow)
    assert not ops.fuses_projection(x[:, :15], torch.zeros(32, 15, dtype=torch.bfloat16, device=DEVICE), 2, 16)
    monkeypatch.setattr(ops, "PROJECTION_ROW_CLASSES", False)
    assert ops._row_classes(x[:, :37]) == 1
    assert not ops.fuses_projection(x[:, :37], weight, 2, 16)


def test_where_the_fused_projection_applies():
    x = torch.zeros(4, 8, dtype=torch.bfloat16, device=DEVICE)

    def weight(rows, dtype=torch.bfloat16):
        return torch.zeros(rows, 8, dtype=dtype, device=DEVICE)

    assert ops.fuses_projection(x, weight(128), 8, 16)
    assert ops.fuses_projection(x.half(), weight(15, torch.float16), 3, 5)  # padded 4 x 8 = 32 columns
    assert ops.fuses_projection(x.float(), weight(128, torch.float32), 8, 16)  # float32: three TF32 parts
    assert not ops.fuses_projection(x.double(), weight(128, torch.float64), 8, 16)  # float64: torch's product
    assert not ops.fuses_projection(x, weight(128, torch.float16), 8, 16)  # mixed dtypes
    assert not ops.fuses_projection(x, weight(8), 1, 8)  # 8 columns: below tl.dot's 16
    assert not ops.fuses_projection(x, weight(512), 8, 64)  # 512 columns: above PROJECTION_MAX_COLUMNS
    column_strided = torch.zeros(8, 4, dtype=torch.bfloat16, device=DEVICE).t()
    assert not ops.fuses_projection(column_strided, weight(128), 8, 16)
    # rows 1204 bytes apart: 4 alignment classes, fused from PROJECTION_CLASS_MIN_ROWS rows
    reddit = torch.zeros(ops.PROJECTION_CLASS_MIN_ROWS, 602, dtype=torch.bfloat16, device=DEVICE)
    assert ops.fuses_projection(reddit, torch.zeros(64, 602, dtype=torch.bfloat16, device=DEVICE), 4, 16)
    assert not ops.fuses_projection(reddit[:4], torch.zeros(64, 602, dtype=torch.bfloat16, device=DEVICE), 4, 16)
    assert not ops.fuses_projection(reddit[:, 1:], torch.zeros(64, 601, dtype=torch.bfloat16, device=DEVICE), 4, 16)
    assert not ops.fuses_projection(reddit.float(), torch.zeros(64, 602, device=DEVICE), 4, 16)  # 2408 bytes apart


def test_float32_projection_follows_the_float32_product_setting(monkeypatch):
    """float32 fuses only while fusecore.linear's tensor-core product is on (else a float32 tl.dot would
    round through one TF32 part)."""
    from fusecore import linear as core_linear

    x, weight = torch.zeros(4, 8, device=DEVICE), torch.zeros(128, 8, device=DEVICE)
    assert ops.fuses_projection(x, weight, 8, 16)
    monkeypatch.setattr(core_linear, "FLOAT32_PRODUCT", None)
    assert not ops.fuses_projection(x, weight, 8, 16)


def test_float32_projection_follows_torchs_tf32_setting(monkeypatch):
    """Where torch's float32 products may use TF32 (torch.set_float32_matmul_precision("high")), the fused float32
    projection takes one TF32 product (the slice kernel with PRECISION "tf32", not the held parts' three), as
    fusecore.linear's products do; against the float64 oracle at float32's tolerance."""
    from fusecore import linear as core_linear

    log = record_launches(monkeypatch, ops, "projection_scores_kernel", "projection_scores_held_kernel")
    gen = fresh_generator()
    seed = gen.initial_seed()
    x = torch.randn(300, 128, generator=gen).to(DEVICE)
    weight = (torch.randn(128, 128, generator=gen) / 128**0.5).to(DEVICE)
    attn_l, attn_r = (torch.randn(1, 8, 16, generator=gen).to(DEVICE) for _ in range(2))
    ref_wh, ref_el, ref_er = _oracle(x, weight, attn_l, attn_r, 8, 16)
    for precision, kernel in (("highest", ("projection_scores_held_kernel", None)),
                              ("high", ("projection_scores_kernel", "tf32"))):
        log.clear()
        with core_linear.float32_matmul_precision(precision):
            assert ops.fuses_projection(x, weight, 8, 16)
            assert (ops._projection_held_tiling(x, weight, 8, 16) is None) == (precision == "high")
            wh, el, er = ops._projection_scores(x, weight, attn_l, attn_r, 8, 16)
        launched = [(name, kwargs.get("PRECISION")) for name, kwargs in log]
        assert launched == [kernel], (precision, launched)
        for got, want, name in ((wh, ref_wh, "wh"), (el, ref_el, "el"), (er, ref_er, "er")):
            assert_close(got, want.float(), torch.float32, name=f"{name} at {precision} (seed {seed})")


@pytest.mark.parametrize("dtype, in_feats", [*((d, 24) for d in FUSED), (torch.bfloat16, 37), (torch.float16, 26)])
@pytest.mark.parametrize("residual", [False, True])
def test_gatconv_with_the_fused_projection_matches_the_unfused_layer(dtype, in_feats, residual, monkeypatch):
    """in_feats 37 / 26 in 2-byte floats: rows not 16 bytes apart, fused by alignment class."""
    monkeypatch.setattr(ops, "PROJECTION_CLASS_MIN_ROWS", 0)
    gen = fresh_generator()
    seed = gen.initial_seed()
    num_nodes = 29
    graph = Graph(corner_case_edges(gen, num_nodes).to(DEVICE), num_nodes)
    torch.manual_seed(seed)
    layer = GATConv(in_feats, 6, 3, residual=residual, allow_zero_in_degree=True).to(DEVICE, dtype)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "bias" in name:
                p.normal_()
    x = torch.randn(num_nodes, in_feats, generator=gen).to(DEVICE, dtype).requires_grad_()
    grad = torch.randn(num_nodes, 3, 6, generator=gen).to(DEVICE, dtype)
    assert ops.fuses_projection(x, layer.fc.weight, 3, 6)
    results = []
    for fused in (True, False):
        monkeypatch.setattr(ops, "FUSED_PROJECTION", fused)
        x.grad = None
        layer.zero_grad(set_to_none=True)
        out = layer(graph, x)
        out.backward(grad)
        results.append([out.detach(), x.grad, *(p.grad for p in layer.parameters())])
    names = ["out", "x.grad", *(f"{n}.grad" for n, _ in layer.named_parameters())]
    for name, got, want in zip(names, *results):
        assert got is not None and want is not None, name
        assert_close(got.float(), want.float(), tol=2 * tolerance(dtype), name=f"{name} (seed {seed})")

