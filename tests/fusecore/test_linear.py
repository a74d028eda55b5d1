"""fusecore.linear: column_sum against a float64 oracle at odd sizes; linear's forward and gradients
against torch.nn.functional.linear (16-bit and float64: the same cuBLAS calls, the bias gradient from
column_sum; float32: the tensor-core product, against float64); product / matmul against float64 at odd
sizes, strided operands and split reductions, and its accuracy on the GPU beside torch's float32 product."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import triton.language as tl

from fusecore import linear as linear_module
from fusecore import scratch
from fusecore.backend import COMPILED, jit
from fusecore.linear import (
    column_sum,
    finite_or_zero,
    float32_matmul_precision,
    linear,
    matmul,
    product,
    split_dot,
    tf32_parts,
    torch_allows_tf32,
    uses_product,
)
from fusecore.testing import (
    AllocationAudit,
    assert_all_written,
    assert_close,
    fresh_generator,
    poisoned,
    record_launches,
    test_device,
)

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
CAT = "aten.cat.default"


@pytest.fixture
def device():
    return test_device()


@pytest.fixture
def poison(monkeypatch):
    """Every buffer column_sum allocates starts as NaN: an element a kernel skips shows."""
    monkeypatch.setattr(linear_module, "_new", lambda shape, dtype, device: poisoned(shape, dtype, device))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(1, 1), (2, 3), (31, 129), (97, 7), (1000, 128), (3, 300), (613, 257),
                                        (64, 1000), (65, 33)])  # one pass up to ONE_PASS_ROWS rows, two beyond
def test_column_sum_matches_float64(device, poison, dtype, rows, cols):
    gen = fresh_generator(device)
    x = torch.randn(rows, cols, generator=gen, device=device).to(dtype)
    out = column_sum(x)
    assert out.dtype == dtype and out.shape == (cols,)
    assert_close(out, x.double().sum(0), dtype=dtype, name="column_sum")


def test_column_sum_strided_rows_out_dtype_and_empty(device, poison):
    gen = fresh_generator(device)
    base = torch.randn(90, 40, generator=gen, device=device)
    x = base[::3, 5:30]  # row stride 120, columns contiguous
    assert_close(column_sum(x), x.double().sum(0), dtype=torch.float32, tol=1e-6)
    half = base.to(torch.bfloat16)
    out = column_sum(half, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out, half.double().sum(0), tol=1e-6, name="float32 output of bfloat16 input")
    transposed = base.t()  # columns strided: copied first
    assert_close(column_sum(transposed), transposed.double().sum(0), dtype=torch.float32, tol=1e-6)
    for shape in ((0, 5), (4, 0)):
        empty = column_sum(torch.empty(shape, device=device))
        assert torch.equal(empty, torch.zeros(shape[1], device=device))


@pytest.mark.parametrize("cols", [128, 300, 512])
def test_column_sum_first_stage_programs_whatever_the_width(device, monkeypatch, cols):
    """The first stage's slabs are counted per column block: at most about PROGRAMS_PER_SM programs per
    multiprocessor in all, whether x has one column block or several (a layer's four stacked biases: 512 columns, 4
    blocks; session 36's tiling launched 4x as many there).  Fewer where the slabs' rows round up to a whole tile."""
    launches = []
    real = linear_module._launch
    monkeypatch.setattr(linear_module, "_launch", lambda x, out, br, bc, rpp, finish=None: launches.append(
        -(-x.shape[0] // rpp) * -(-x.shape[1] // bc)) or real(x, out, br, bc, rpp, finish))
    x = torch.randn(20_000, cols, device=device)
    for _ in range(2):  # the second call reuses the counts the first left zeroed
        assert_close(column_sum(x), x.double().sum(0), dtype=torch.float32, name=f"column_sum [20000, {cols}]")
    wanted = linear_module.PROGRAMS_PER_SM * linear_module.device_facts(device).sm_count
    blocks = -(-cols // linear_module.COLUMN_BLOCK_MAX)
    assert len(launches) == 2 and blocks <= launches[0] <= wanted + blocks, (launches, wanted)  # one launch a sum
    kept = [t for (name, *_), t in scratch._KEPT.items() if name == "column sums"]
    assert kept and all(not counts.any() for counts in kept)


def test_column_sum_rejects_bad_input(device):
    with pytest.raises(ValueError, match="2-D"):
        column_sum(torch.ones(5, device=device))
    with pytest.raises(ValueError, match="must be one of"):
        column_sum(torch.ones(5, 3, dtype=torch.int32, device=device))
    for bad in (torch.int32, "float32"):  # an integer out_dtype once truncated the sums without a word
        with pytest.raises(ValueError, match="out_dtype"):
            column_sum(torch.ones(5, 3, device=device), bad)


def test_strided_bias_is_read_as_its_values(device):
    """A bias that is a strided view (every other element) once went to the kernels as if contiguous."""
    gen = fresh_generator(device)
    x = torch.randn(9, 24, generator=gen, device=device)
    weight = torch.randn(16, 24, generator=gen, device=device)
    bias = torch.randn(32, generator=gen, device=device)[::2]
    expected = F.linear(*(t.double() for t in (x, weight, bias)))
    assert_close(linear(x, weight, bias), expected, dtype=torch.float32, name="linear")
    if uses_product(x, weight.t(), bias):
        assert_close(product(x, weight.t(), bias), expected, dtype=torch.float32, name="product")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (5, 11), (2, 3, 13)])
def test_linear_matches_torch(device, dtype, shape):
    gen = fresh_generator(device)
    x = torch.randn(*shape[:-1], 24, generator=gen, device=device).to(dtype)
    x = x if len(shape) > 1 else x.reshape(24)
    weight = torch.randn(shape[-1], 24, generator=gen, device=device).to(dtype)
    bias = torch.randn(shape[-1], generator=gen, device=device).to(dtype)
    grad = torch.randn(*x.shape[:-1], shape[-1], generator=gen, device=device).to(dtype)
    ours = [t.clone().requires_grad_() for t in (x, weight, bias)]
    theirs = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out = linear(*ours)
    assert out.grad_fn is not None and "Linear" in type(out.grad_fn).__name__
    if dtype == torch.float32:  # the tensor-core product (module doc)
        assert uses_product(x) and out.shape == F.linear(*theirs).shape
        assert_close(out, F.linear(*(t.double() for t in (x, weight, bias))), dtype=dtype, name="output")
    else:
        assert torch.equal(out, F.linear(*theirs))  # the same forward call
    out.backward(grad)
    F.linear(*theirs).backward(grad)
    for name, a, b in zip(("x", "weight", "bias"), ours, theirs):
        assert_close(a.grad, b.grad.double(), dtype=dtype, name=f"grad of {name}")


def test_linear_gradients_only_where_asked_and_without_autograd(device):
    gen = fresh_generator(device)
    x = torch.randn(9, 6, generator=gen, device=device)
    weight = torch.randn(4, 6, generator=gen, device=device)
    bias = torch.randn(4, generator=gen, device=device, requires_grad=True)
    linear(x, weight, bias).sum().backward()
    assert weight.grad is None and x.grad is None
    assert_close(bias.grad, torch.full((4,), 9.0, dtype=torch.float64), tol=1e-6)
    with torch.no_grad():
        out = linear(x, weight, bias)
    assert out.grad_fn is None
    assert_close(out, F.linear(x.double(), weight.double(), bias.double()), dtype=torch.float32, name="no-grad")
    no_bias = linear(x, weight.requires_grad_(), None)
    assert_close(no_bias, F.linear(x.double(), weight.double()), dtype=torch.float32, name="without a bias")
    no_bias.sum().backward()
    ones = torch.ones(9, 4, dtype=torch.float64, device=device)
    assert_close(weight.grad, ones.t() @ x.double(), dtype=torch.float32, name="grad of weight")


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 24, 5), (130, 33, 17), (61, 200, 129), (300, 16, 260),
                                     (2, 4099, 3)])
@pytest.mark.parametrize("layout", ["rows", "a transposed", "b transposed"])
@pytest.mark.parametrize("kernel", ["held", "rows", "slices"])
def test_product_matches_float64(device, poison, monkeypatch, m, k, n, layout, kernel):
    """product(a, b, bias) against float64 at odd sizes, with either operand a transposed view read in place,
    short reductions by the held-parts kernel (product_held_kernel, programs walking several row blocks), the
    row-block loop (product_rows_kernel) or by slices, and long ones split (few output tiles: partials summed by
    column_sum)."""
    rows_kernel = kernel != "slices"
    monkeypatch.setattr(linear_module, "HELD_KERNEL", kernel == "held")
    monkeypatch.setattr(linear_module, "HELD_BLOCK_M", 16)
    monkeypatch.setattr(linear_module, "HELD_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(linear_module, "ROWS_KERNEL", rows_kernel)
    monkeypatch.setattr(linear_module, "ROWS_BLOCK_M", 16)  # several row blocks per program at these sizes
    monkeypatch.setattr(linear_module, "ROWS_PROGRAMS_PER_SM", 1)
    monkeypatch.setattr(linear_module, "SPLIT_MIN_K", 64)  # split the long reductions of these small sizes
    gen = fresh_generator(device)
    a = torch.randn(m, k, generator=gen, device=device)
    b = torch.randn(k, n, generator=gen, device=device)
    if layout == "a transposed":
        a = a.t().contiguous().t()
    elif layout == "b transposed":
        b = b.t().contiguous().t()
    bias = torch.randn(n, generator=gen, device=device)
    want = a.double() @ b.double()
    for with_bias in (False, True):
        out = product(a, b, bias if with_bias else None)
        assert out.shape == (m, n) and out.dtype == torch.float32 and out.is_contiguous()
        assert_all_written(out)
        assert_close(out, want + (bias.double() if with_bias else 0), dtype=torch.float32,
                     name=f"product {m}x{k}x{n} {layout} {kernel} bias={with_bias} "
                          f"(seed {gen.initial_seed()})")
    assert_close(matmul(a, b), want, dtype=torch.float32, name="matmul")


@pytest.mark.parametrize("sums", [1, 2])
def test_product_held_sums_match_float64(device, poison, monkeypatch, sums):
    """Every way product_held_kernel sums its TF32 parts' products (HELD_SUMS), one to four reduction chunks, with
    a bias, against float64."""
    monkeypatch.setattr(linear_module, "HELD_SUMS", sums)
    monkeypatch.setattr(linear_module, "HELD_BLOCK_M", 32)
    gen = fresh_generator(device)
    for m, k, n in [(97, 128, 80), (33, 70, 16), (5, 9, 130)]:
        a = torch.randn(m, k, generator=gen, device=device)
        b = torch.randn(n, k, generator=gen, device=device).t()  # a layer's weight, read transposed
        bias = torch.randn(n, generator=gen, device=device)
        out = product(a, b, bias)
        assert_all_written(out)
        assert_close(out, a.double() @ b.double() + bias.double(), dtype=torch.float32,
                     name=f"held sums={sums} {m}x{k}x{n} (seed {gen.initial_seed()})")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf - inf
@pytest.mark.parametrize("sums", [1, 2])
@pytest.mark.parametrize("weight_inf", [False, True])
@pytest.mark.parametrize("split", ["cvt", "bits"])
def test_product_held_non_finite_inputs_as_torch(device, poison, monkeypatch, sums, weight_inf, split):
    """Infinities and NaN in either operand give torch's ±inf and NaN: the remainders of an infinite value (its
    ``inf · 0`` products) never reach the result, a NaN stays NaN — with infinite inputs in ``a`` alone and in the
    weight too (``weight_inf``), both TF32 splits (``HELD_SPLIT``; the interpreter has only the bits).  A NaN whose
    payload lies only in the 13 bits TF32 drops stays NaN through the bits and reads as infinity through the
    hardware's conversion (:func:`fusecore.linear.tf32_parts`): its row is non-finite either way."""
    monkeypatch.setattr(linear_module, "HELD_SUMS", sums)
    monkeypatch.setattr(linear_module, "HELD_SPLIT", split)
    monkeypatch.setattr(linear_module, "HELD_BLOCK_N", 16)
    gen = fresh_generator(device)
    m, k, n = 19, 40, 24
    a = torch.randn(m, k, generator=gen, device=device)
    weight = torch.randint(-3, 4, (n, k), generator=gen, device=device).float()  # exact in TF32: remainders 0
    weight[5] += 0.999  # rounds up in TF32: a negative remainder beside a positive part
    low_nan = torch.tensor([0x7F800001], dtype=torch.int32, device=device).view(torch.float32)
    a[2, 3], a[7, 0], a[11, 39], a[13, 20] = float("inf"), float("-inf"), low_nan, float("nan")
    weight[:, 0] = 1.0  # -inf · 1 in every column of row 7
    if weight_inf:
        weight[17, 30] = float("inf")  # column 17: a[:, 30] · inf, whose remainders (a_lo · inf) must not count
    b = weight.t()
    out = product(a, b)
    want = a @ b if device.type == "cpu" else (a.double() @ b.double()).float()
    if linear_module.held_split():  # the hardware's split: the low-payload NaN's row non-finite, compared no further
        assert not torch.isfinite(out[11]).any()
        keep = torch.arange(m, device=device) != 11
        a, out, want = a[keep], out[keep], want[keep]
    assert torch.equal(torch.isnan(out), torch.isnan(want)), "NaN where torch's product has none, or the reverse"
    infinite = torch.isinf(want)
    assert torch.equal(torch.isinf(out), infinite) and torch.equal(out[infinite], want[infinite])
    finite = torch.isfinite(want)
    assert_close(out[finite], (a.double() @ b.double())[finite], dtype=torch.float32,
                 name=f"finite entries sums={sums}")


def test_product_held_sums_setting_is_checked(device, monkeypatch):
    monkeypatch.setattr(linear_module, "HELD_SUMS", 0)
    a = torch.ones(4, 8, device=device)
    with pytest.raises(ValueError, match="HELD_SUMS must be 1 or 2"):
        product(a, a.t())
    monkeypatch.setattr(linear_module, "HELD_SUMS", 2)
    monkeypatch.setattr(linear_module, "HELD_SPLIT", "rna")
    with pytest.raises(ValueError, match="HELD_SPLIT must be one of"):
        product(a, a.t())


@pytest.mark.parametrize("backward", [False, True])
def test_linear_float32_paths(device, monkeypatch, backward):
    """float32 linear: aligned rows take the product, others (and every gradient unless BACKWARD_PRODUCTS) torch's;
    forward and gradients against float64 either way."""
    monkeypatch.setattr(linear_module, "BACKWARD_PRODUCTS", backward)
    calls = []
    real = linear_module.product
    monkeypatch.setattr(linear_module, "product", lambda *args: calls.append(args[0].shape) or real(*args))
    gen = fresh_generator(device)
    for feats, aligned in ((24, True), (22, False)):
        calls.clear()
        x = torch.randn(37, feats, generator=gen, device=device, requires_grad=True)
        weight = torch.randn(9, feats, generator=gen, device=device, requires_grad=True)
        bias = torch.randn(9, generator=gen, device=device, requires_grad=True)
        grad = torch.randn(37, 9, generator=gen, device=device)
        out = linear(x, weight, bias)
        out.backward(grad)
        assert len(calls) == aligned + 2 * backward, (feats, calls)
        ref = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
        want = F.linear(*ref)
        want.backward(grad.double())
        assert_close(out, want, dtype=torch.float32, name=f"out ({feats} features)")
        for name, ours, theirs in zip(("x", "weight", "bias"), (x, weight, bias), ref):
            assert_close(ours.grad, theirs.grad, dtype=torch.float32, name=f"grad of {name} ({feats} features)")


def test_float32_product_setting_is_checked(device, monkeypatch):
    monkeypatch.setattr(linear_module, "FLOAT32_PRODUCT", "tf32")
    with pytest.raises(ValueError, match="FLOAT32_PRODUCT must be one of"):
        product(torch.ones(4, 5, device=device), torch.ones(5, 3, device=device))


def test_torch_allows_tf32_reads_each_of_torchs_settings():
    """torch_allows_tf32 follows torch.set_float32_matmul_precision ("highest" no; "high", "medium" yes), the legacy
    allow_tf32 flag, and the newer fp32_precision attributes (in a subprocess: once a process sets those to "tf32",
    torch refuses reads of the legacy settings for the rest of it; float32_matmul_precision then sets and restores
    the newer attribute)."""
    with pytest.raises(ValueError, match=r"expected one of \('highest', 'high', 'medium'\)"):
        with float32_matmul_precision("tf32"):
            pass
    assert not torch_allows_tf32()  # torch's default, which the tests run under
    for precision, allowed in (("highest", False), ("high", True), ("medium", True)):
        with float32_matmul_precision(precision):
            assert torch_allows_tf32() == allowed, precision
    assert not torch_allows_tf32()
    matmul_flags = torch.backends.cuda.matmul
    matmul_flags.allow_tf32 = True
    try:
        assert torch_allows_tf32()
    finally:
        matmul_flags.allow_tf32 = False
    assert not torch_allows_tf32()
    if not hasattr(matmul_flags, "fp32_precision"):
        return
    code = ("import torch\n"
            "from fusecore.linear import torch_allows_tf32\n"
            "m = torch.backends.cuda.matmul\n"
            "seen = [torch_allows_tf32()]\n"
            "m.fp32_precision = 'tf32'; seen.append(torch_allows_tf32())\n"
            "m.fp32_precision = 'ieee'; seen.append(torch_allows_tf32())\n"
            "torch.backends.fp32_precision = 'tf32'; m.fp32_precision = 'none'; seen.append(torch_allows_tf32())\n"
            "m.fp32_precision = 'tf32'\n"
            "from fusecore.linear import float32_matmul_precision\n"
            "with float32_matmul_precision('highest'):\n"
            "    seen.append(torch_allows_tf32())\n"
            "seen.append(m.fp32_precision)\n"
            "print(seen)\n")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[False, True, False, True, False, 'tf32']", done.stdout


def test_float32_products_follow_torchs_tf32_setting(device, poison, monkeypatch):
    """Where torch's float32 products may use TF32 ("high"), product takes one TF32 product (the row-block
    kernel, PRECISION "tf32": the held kernel is for "tf32x3" only), else FLOAT32_PRODUCT's three parts (the held
    kernel); FLOAT32_FOLLOWS_TORCH False keeps the three parts under "high" too; against float64 at float32's
    tolerance (which allows TF32: on the interpreter the products are exact).  linear and matmul under TF32 are
    torch's own products."""
    log = record_launches(monkeypatch, linear_module, "product_rows_kernel", "product_held_kernel")

    def launched() -> list[tuple[str, str | None]]:  # (kernel, its PRECISION constexpr) per launch
        return [(name, kwargs.get("PRECISION")) for name, kwargs in log]

    gen = fresh_generator(device)
    a, b = torch.randn(70, 24, generator=gen, device=device), torch.randn(24, 40, generator=gen, device=device)
    bias = torch.randn(40, generator=gen, device=device)
    want = a.double() @ b.double() + bias.double()
    runs = {}
    for precision, follows in (("highest", True), ("high", True), ("high", False), ("medium", True)):
        monkeypatch.setattr(linear_module, "FLOAT32_FOLLOWS_TORCH", follows)
        log.clear()
        with float32_matmul_precision(precision):
            tf32 = follows and precision != "highest"
            assert linear_module.dot_precision(torch.float32) == ("tf32" if tf32 else "tf32x3")
            assert linear_module.dot_precision(torch.bfloat16) == "tf32"
            out = product(a, b, bias)
        runs[precision, follows] = launched()
        assert_all_written(out)
        assert_close(out, want, dtype=torch.float32, name=f"product at {precision} (follows {follows}, seed "
                                                          f"{gen.initial_seed()})")
    held, rows = [("product_held_kernel", None)], [("product_rows_kernel", "tf32")]
    assert runs["highest", True] == runs["high", False] == held, runs
    assert runs["high", True] == runs["medium", True] == rows, runs
    # linear (and matmul) under TF32: torch's own product (cuBLAS's TF32 product, the faster), bit for bit
    x, weight = a.requires_grad_(), b.t().contiguous().requires_grad_()
    with float32_matmul_precision("high"):
        log.clear()
        assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias)) and not log
        monkeypatch.setattr(linear_module, "BACKWARD_PRODUCTS", True)
        assert torch.equal(matmul(a, b), a @ b) and not log
        monkeypatch.setattr(linear_module, "FLOAT32_FOLLOWS_TORCH", False)
        linear(x, weight, bias)
        assert launched() == held, launched()


def test_product_splits_long_reductions_over_few_tiles(device, monkeypatch):
    """The split rule: one slice where the output tiles fill the machine or the reduction is short; else
    slices of at least SPLIT_MIN_K, up to SPLIT_TILES_PER_SM programs per multiprocessor."""
    sms = linear_module.device_facts(device).sm_count
    assert linear_module._splits(2 * sms, 10**6, device) == 1
    assert linear_module._splits(1, 2 * linear_module.SPLIT_MIN_K - 1, device) == 1
    many = linear_module._splits(1, 10**9, device)
    assert many == linear_module.SPLIT_TILES_PER_SM * sms
    assert linear_module._splits(1, 3 * linear_module.SPLIT_MIN_K, device) == min(3, many)


def test_product_empty_and_bad_input(device, poison):
    for m, k, n in [(0, 5, 3), (4, 0, 3), (4, 5, 0)]:
        a, b = torch.ones(m, k, device=device), torch.ones(k, n, device=device)
        bias = torch.full((n,), 2.0, device=device)
        assert torch.equal(product(a, b, bias), torch.full((m, n), 2.0, device=device))
    a = torch.ones(4, 5, device=device)
    with pytest.raises(ValueError, match=r"expected a \[M, K\] and b \[K, N\], got \[4, 5\] and \[4, 3\]"):
        product(a, torch.ones(4, 3, device=device))
    with pytest.raises(ValueError, match=r"bias must have shape \[3\]"):
        product(a, torch.ones(5, 3, device=device), torch.ones(4, device=device))
    with pytest.raises(ValueError, match="must be float32 tensors"):
        product(a.double(), torch.ones(5, 3, device=device, dtype=torch.float64))


def test_float32_product_off_is_torch(device, monkeypatch):
    """FLOAT32_PRODUCT = None: linear and matmul are torch's own float32 products, bit for bit."""
    monkeypatch.setattr(linear_module, "FLOAT32_PRODUCT", None)
    gen = fresh_generator(device)
    x, weight = torch.randn(37, 24, generator=gen, device=device), torch.randn(9, 24, generator=gen, device=device)
    assert not uses_product(x, weight)
    assert torch.equal(linear(x, weight), F.linear(x, weight))
    assert torch.equal(matmul(x, weight.t()), x @ weight.t())


def test_autocast_keeps_torchs_product(device):
    """Under autocast linear is F.linear in autocast's dtype, as a user of autocast expects."""
    x, weight = torch.randn(5, 16, device=device), torch.randn(3, 16, device=device)
    assert uses_product(x, weight)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        assert not uses_product(x, weight)
        out = linear(x, weight)
        assert out.dtype == torch.bfloat16 and torch.equal(out, F.linear(x, weight))
        bias = torch.randn(3, device=device, requires_grad=True)
        trained = linear(x, weight.requires_grad_(), bias)
        assert trained.dtype == torch.bfloat16
    trained.float().sum().backward()  # torch's own backward, gradients in the parameters' dtype
    assert weight.grad.dtype == bias.grad.dtype == torch.float32


@pytest.mark.skipif(not COMPILED, reason="TF32 exists on the GPU only (the interpreter's products are exact)")
@pytest.mark.parametrize("precision, held", [("tf32x3", True), ("tf32x3", False), ("bf16x6", False)])
def test_float32_product_accuracy_on_the_gpu(device, monkeypatch, precision, held):
    """The tensor-core product in three TF32 parts keeps float32's accuracy: against float64, its error at a
    graph layer's shape is within 4x torch's float32 product's (cuBLAS, FP32 units), where one TF32 part alone
    (plain "tf32") is far off — so the bound would catch a product that lost the remainders."""
    monkeypatch.setattr(linear_module, "FLOAT32_PRODUCT", precision)
    monkeypatch.setattr(linear_module, "HELD_KERNEL", held)
    gen = fresh_generator(device)
    for m, k, n in [(20_011, 128, 512), (3001, 602, 64), (512, 20_011, 128), (20_011, 100, 72)]:
        a = torch.randn(m, k, generator=gen, device=device)
        b = torch.randn(k, n, generator=gen, device=device) / k ** 0.5
        want = a.double() @ b.double()
        scale = want.abs().max().item()
        theirs = ((a @ b).double() - want).abs().max().item() / scale
        ours = (product(a, b).double() - want).abs().max().item() / scale
        assert ours <= 4 * theirs + 1e-7, f"{m}x{k}x{n}: {precision} error {ours:.2e}, torch float32 {theirs:.2e}"
        tf32 = torch.empty(m, n, device=device)
        linear_module.product_kernel[(triton_cdiv(n, 64), triton_cdiv(m, 64), 1)](
            a, b, None, tf32, m, n, k, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), m * n, n,
            BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, HAS_BIAS=False, PRECISION="tf32")
        single = (tf32.double() - want).abs().max().item() / scale
        assert single > 8 * ours, f"{m}x{k}x{n}: plain tf32 {single:.2e} not worse than tf32x3 {ours:.2e}"


@pytest.mark.skipif(not COMPILED, reason="the hardware's TF32 conversion is inline PTX (compiled only)")
def test_held_split_by_the_hardware_matches_the_bits(device):
    """``HELD_SPLIT`` "cvt" (``cvt.rna.tf32.f32``) and "bits" round alike: the held product bit for bit equal, with
    ties, values that round up to the next binade, infinities and NaN among the inputs.  (They part only within
    2^-11 of the largest finite float, which the hardware rounds to infinity — as Triton's own tf32x3 does — where
    the bits truncate, and at a NaN whose payload lies only in the 13 dropped bits, which the hardware reads as
    infinity: :func:`fusecore.linear.tf32_parts`.)"""
    gen = fresh_generator(device)
    a = torch.randn(3001, 128, generator=gen, device=device)
    b = torch.randn(128, 200, generator=gen, device=device)
    bits = a.view(torch.int32)
    bits[:64] = (bits[:64] & ~0x1FFF) | 0x1000  # exact ties at TF32's last bit
    bits[64:96] |= 0x7FFFFF  # fractions that round up into the next binade
    a[100, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")], device=device)
    b[7, 150] = float("-inf")
    outs = {}
    for split in ("cvt", "bits"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(linear_module, "HELD_SPLIT", split)
            outs[split] = product(a, b)
    assert torch.equal(outs["cvt"].nan_to_num(), outs["bits"].nan_to_num()), "the two TF32 splits differ"
    assert torch.equal(outs["cvt"].isnan(), outs["bits"].isnan()), "the two TF32 splits differ in NaN"


@jit
def _split_dot_kernel(a_ptr, b_ptr, out_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
                      B_EXACT: tl.constexpr, CVT: tl.constexpr):
    """``out = a @ b`` through :func:`fusecore.linear.split_dot`: two K halves, one accumulator pair."""
    m = tl.arange(0, M)
    k = tl.arange(0, K // 2)
    n = tl.arange(0, N)
    big = tl.zeros([M, N], dtype=tl.float32)
    small = tl.zeros([M, N], dtype=tl.float32)
    for half in tl.static_range(2):
        kk = half * (K // 2) + k
        a = tl.load(a_ptr + m[:, None] * K + kk[None, :])
        b = tl.load(b_ptr + kk[:, None] * N + n[None, :]).to(tl.float32)
        if B_EXACT:
            big, small = split_dot(a, b, b, big, small, True, CVT)
        else:
            b_hi, b_lo = tf32_parts(b, CVT)
            big, small = split_dot(a, b_hi, b_lo, big, small, False, CVT)
    tl.store(out_ptr + m[:, None] * N + n[None, :], big + finite_or_zero(small))


@pytest.mark.parametrize("b_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_split_dot_keeps_float32_accuracy(device, b_dtype):
    """``split_dot`` (TF32 parts on the tensor cores) against float64: float32 operands through three products, a
    2-byte ``b`` (exact in TF32) through two; near float32's own error, where one TF32 product is ~1e-3 off (on the
    GPU; the interpreter's products are exact, so there it checks the parts' algebra)."""
    gen = fresh_generator(device)
    a = torch.randn(16, 64, generator=gen, device=device) * 3.7
    b = torch.randn(64, 32, generator=gen, device=device).to(b_dtype)
    out = poisoned((16, 32), torch.float32, device)
    cvt = 0 if not COMPILED else 1
    _split_dot_kernel[(1,)](a, b, out, M=16, K=64, N=32, B_EXACT=b_dtype != torch.float32, CVT=cvt)
    want = a.double() @ b.double()
    err = ((out.double() - want).abs().max() / want.abs().max()).item()
    assert err < 2e-6, f"split_dot relative error {err:.2e}"


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


LINEARS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _oracle(x, weights, biases):
    return [x.double() @ w.double().t() + (0 if b is None else b.double()) for w, b in zip(weights, biases)]


@pytest.mark.parametrize("dtype", LINEARS_DTYPES)
@pytest.mark.parametrize("rows, feats, out, group", [
    (1, 16, 16, 2), (37, 24, 40, 3), (130, 72, 16, 4), (67, 8, 136, 2), (5, 13, 17, 3), (0, 32, 16, 4),
])
@pytest.mark.parametrize("bias", [True, False])
def test_linears_forward_and_gradients(device, poison, dtype, rows, feats, out, group, bias):
    """Every map's output (a column block of one product of the stacked weights) against a float64 oracle,
    and every gradient (through the blocks, autograd adding their gradients) against float64 F.linear."""
    gen = fresh_generator(device)
    x = torch.randn(rows, feats, generator=gen, device=device).to(dtype)
    weights = [(torch.randn(out, feats, generator=gen, device=device) / feats ** 0.5).to(dtype) for _ in range(group)]
    biases = [torch.randn(out, generator=gen, device=device).to(dtype) if bias else None for _ in range(group)]
    grads = [torch.randn(rows, out, generator=gen, device=device).to(dtype) for _ in range(group)]
    leaves = [t.clone().requires_grad_() for t in (x, *weights, *(b for b in biases if b is not None))]
    lx, lw, lb = leaves[0], leaves[1:1 + group], leaves[1 + group:] or [None] * group
    ys = linear_module.linears(lx, lw, lb)
    assert len(ys) == group
    for g, (y, want) in enumerate(zip(ys, _oracle(x, weights, biases))):
        assert y.dtype == dtype and y.shape == (rows, out)
        # column block g of one [rows, group · out] product
        assert y.stride(-1) == 1 and (rows < 2 or y.stride(0) == group * out) and y._base is ys[0]._base
        assert_close(y, want, dtype=dtype, name=f"output {g}")
    torch.autograd.backward(ys, grads)
    ref = [t.detach().double().requires_grad_() for t in leaves]
    rx, rw, rb = ref[0], ref[1:1 + group], ref[1 + group:] or [None] * group
    torch.autograd.backward([F.linear(rx, w, b) for w, b in zip(rw, rb)], [g.double() for g in grads])
    names = ["x"] + [f"weights[{g}]" for g in range(group)] + [f"biases[{g}]" for g in range(group)]
    for name, ours, theirs in zip(names, leaves, ref):
        assert_close(ours.grad, theirs.grad, dtype=dtype, name=f"grad of {name}")


def test_linears_partial_gradients_and_no_autograd(device, poison):
    gen = fresh_generator(device)
    x = torch.randn(45, 32, generator=gen, device=device).to(torch.bfloat16)
    weights = [torch.randn(24, 32, generator=gen, device=device).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    biases = [torch.randn(24, generator=gen, device=device).to(torch.bfloat16).requires_grad_() for _ in range(3)]
    ys = linear_module.linears(x, weights, biases)  # x without gradient; only the second output used
    ys[1].float().square().sum().backward()
    assert x.grad is None
    assert all(torch.count_nonzero(p.grad) == 0 for p in (weights[0], weights[2], biases[0], biases[2]))
    want = 2 * (x.double() @ weights[1].double().t() + biases[1].double())
    assert_close(weights[1].grad, want.t() @ x.double(), dtype=torch.bfloat16, name="grad of weights[1]")
    with torch.no_grad():
        plain = linear_module.linears(x, weights, biases)
    assert all(y.grad_fn is None for y in plain)
    for y, want in zip(plain, _oracle(x, weights, biases)):
        assert_close(y, want, dtype=torch.bfloat16, name="no-grad output")


def test_linears_rejects_bad_input(device):
    x = torch.ones(4, 16, device=device, dtype=torch.bfloat16)
    w = torch.ones(16, 16, device=device, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one or more weights"):
        linear_module.linears(x, [])
    with pytest.raises(ValueError, match="as many biases"):
        linear_module.linears(x, [w, w], [None])
    with pytest.raises(ValueError, match=r"weights\[1\] must have shape \[out, in=16\]"):
        linear_module.linears(x, [w, torch.ones(16, 8, device=device, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match=r"biases\[0\] must have shape \[16\]"):
        linear_module.linears(x, [w, w], [torch.ones(3, device=device, dtype=torch.bfloat16), None])
    with pytest.raises(ValueError, match="x must be a tensor"):
        linear_module.linears("x", [w])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linears_stacked_and_per_map_agree(device, poison, monkeypatch, dtype):
    """The default path (one product of the stacked weights, outputs its column blocks) against one product per
    map (STACK_LINEARS off): the same outputs and gradients within the dtype's rounding; a mix of maps with
    and without a bias is never stacked."""
    gen = fresh_generator(device)
    x = torch.randn(53, 24, generator=gen, device=device).to(dtype)
    weights = [(torch.randn(40, 24, generator=gen, device=device) / 5).to(dtype) for _ in range(3)]
    biases = [torch.randn(40, generator=gen, device=device).to(dtype) for _ in range(3)]
    grads = [torch.randn(53, 40, generator=gen, device=device).to(dtype) for _ in range(3)]
    results = []
    for stack in (True, False):
        monkeypatch.setattr(linear_module, "STACK_LINEARS", stack)
        leaves = [t.clone().requires_grad_() for t in (x, *weights, *biases)]
        ys = linear_module.linears(leaves[0], leaves[1:4], leaves[4:])
        assert all((y._base is not None) == stack and y.stride(0) == (120 if stack else 40) for y in ys)
        torch.autograd.backward(ys, grads)
        results.append([*ys, *(t.grad for t in leaves)])
    for i, (a, b) in enumerate(zip(*results)):
        assert_close(a, b.double(), dtype=dtype, name=f"tensor {i}")
    monkeypatch.setattr(linear_module, "STACK_LINEARS", True)
    mixed = linear_module.linears(x, weights[:2], [biases[0], None])
    assert all(y.is_contiguous() for y in mixed)


_RESIDENT_SCRIPT = """
import types, torch
import fusecore.linear as L
L.device_facts = lambda _device: types.SimpleNamespace(sm_count=132)  # an H100 / H200's multiprocessors
for shape, dtype in (((169343, 512), torch.float32), ((169343, 256), torch.float32), ((169343, 128), torch.bfloat16),
                     ((20011, 7), torch.float32), ((169343, 128), torch.float64)):
    L.column_sum(torch.zeros(shape, dtype=dtype))
"""


@pytest.mark.skipif(COMPILED, reason="compile-only runs under the interpreter, on machines without a GPU")
def test_column_sum_programs_stay_resident_on_sm90(tmp_path):
    """The one-launch column sum is sized for PROGRAMS_PER_SM programs a multiprocessor, so it runs in one wave only
    if that many fit together: compiled for sm_90 on the CPU (not run) at the GPU's tiling (the layers' bias sums,
    a narrow one, float64), each specialisation's registers and shared memory must let them reside, without local
    memory.  Session 49 found the finishing code had taken the float32 first stage to 80 registers, 3 programs of
    the 4 it was sized for: two waves, 146.7 µs where two launches took 83.2 ([169 343, 512], H200)."""
    from fusecore.compile_check import KernelResources

    report = tmp_path / "report.jsonl"
    env = {**os.environ, "FUSEKIT_COMPILE_FOR": "sm_90", "FUSEKIT_COMPILE_ONLY": "1",
           "FUSEKIT_COMPILE_REPORT": str(report), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("FUSEKIT_BACKEND", None)
    done = subprocess.run([sys.executable, "-c", _RESIDENT_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    entries = [KernelResources(**json.loads(line)) for line in report.read_text().splitlines() if line.strip()]
    sums = [e for e in entries if e.kernel.endswith("column_sum_kernel") and "FINISH=True" in e.constexprs]
    assert len(sums) >= 4, entries
    for entry in sums:
        assert entry.blocks_per_sm >= linear_module.PROGRAMS_PER_SM and entry.local_bytes == 0, entry


def test_column_sum_of_float64_to_bfloat16(device, poison):
    """column_sum(float64 x, out_dtype=bfloat16) once stored garbage (NaN, 0, 5e-40): the interpreter cast float64
    to bfloat16's uint16 storage as an integer."""
    gen = fresh_generator(device)
    for rows in (20, 100):  # one pass, and the slabs' finishing sums
        x = torch.randn(rows, 37, generator=gen, device=device, dtype=torch.float64)
        out = column_sum(x, out_dtype=torch.bfloat16)
        assert out.dtype == torch.bfloat16
        assert_close(out, x.sum(0), dtype=torch.bfloat16, name=f"column_sum [{rows}, 37] float64 -> bfloat16")


def test_column_sum_keeps_autograd(device):
    """column_sum of a tensor that requires grad once returned a result detached from it (its gradient silently
    lost; only the empty case, torch's own sum, kept it): the gradient of x.sum(0) now flows."""
    gen = fresh_generator(device)
    for rows, out_dtype in ((100, None), (7, torch.float64), (0, None)):
        x = torch.randn(rows, 5, generator=gen, device=device, requires_grad=True)
        out = column_sum(x, out_dtype)
        assert out.requires_grad and out.dtype == (out_dtype or torch.float32)
        weights = torch.arange(1.0, 6.0, device=device, dtype=out.dtype)
        (out * weights).sum().backward()
        assert x.grad.dtype == x.dtype and torch.equal(x.grad, weights.float().expand(rows, 5))
    with torch.no_grad():
        assert not column_sum(torch.ones(9, 3, device=device, requires_grad=True)).requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("x_shape, out", [((4, 0), 3), ((2, 4, 0), 3), ((4, 5), 0), ((2, 4, 5), 0)])
def test_linear_gradients_of_empty_features(device, dtype, x_shape, out):
    """linear's backward once failed for no input features or no outputs ('cannot reshape tensor of 0 elements into
    shape [-1, 0]'), where F.linear gives zero gradients of the right shapes."""
    gen = fresh_generator(device)
    x = torch.randn(*x_shape, generator=gen, device=device).to(dtype)
    weight = torch.randn(out, x_shape[-1], generator=gen, device=device).to(dtype)
    bias = torch.randn(out, generator=gen, device=device).to(dtype)
    ours = [t.clone().requires_grad_() for t in (x, weight, bias)]
    theirs = [t.clone().requires_grad_() for t in (x, weight, bias)]
    y = linear(*ours)
    assert y.shape == (*x_shape[:-1], out)
    y.sum().backward()
    F.linear(*theirs).sum().backward()
    for name, a, b in zip(("x", "weight", "bias"), ours, theirs):
        assert a.grad.shape == b.grad.shape and a.grad.dtype == dtype, name
        assert_close(a.grad, b.grad.double(), dtype=dtype, name=f"grad of {name}")


@pytest.mark.parametrize("grad", [False, True])
def test_linear_rejects_bad_input_naming_the_argument(device, grad):
    """Bad arguments to linear once failed deep inside (IndexError for a 0-D x, AttributeError for a non-tensor,
    'product: expected a [M, K] and b [K, N]' naming the transposed weight, torch's 'self and mat2' for mixed
    dtypes, an autograd shape error for a [1, out] bias): a ValueError / TypeError naming the argument."""
    x = torch.ones(5, 8, device=device, requires_grad=grad)
    w = torch.ones(3, 8, device=device)
    b = torch.ones(3, device=device)
    for args, error, match in [
        (("x", w, b), TypeError, "linear: x must be a torch.Tensor, got str"),
        ((x, None, b), TypeError, "linear: weight must be a torch.Tensor, got NoneType"),
        ((x, w, [1.0, 2.0, 3.0]), TypeError, "linear: bias must be None or a torch.Tensor, got list"),
        ((torch.tensor(1.0, device=device), torch.ones(3, 1, device=device), None), ValueError,
         r"linear: x must be a tensor \[..., in\] of at least one dimension, got shape \[\]"),
        ((x, torch.ones(3, 7, device=device), b), ValueError,
         r"linear: weight must have shape \[out, in=8\], got \[3, 7\]"),
        ((x, torch.ones(8, device=device), None), ValueError,
         r"linear: weight must have shape \[out, in=8\], got \[8\]"),
        ((x, w, torch.ones(1, 3, device=device)), ValueError, r"linear: bias must have shape \[3\], got \[1, 3\]"),
        ((x, w, torch.ones(4, device=device)), ValueError, r"linear: bias must have shape \[3\], got \[4\]"),
        ((x, w.double(), b), TypeError, "linear: weight has dtype float64 but x has float32"),
        ((x, w, b.half()), TypeError, "linear: bias has dtype float16 but x has float32"),
        ((x.detach().bfloat16().requires_grad_(grad), w.bfloat16(), b), TypeError,
         "linear: bias has dtype float32 but x has bfloat16"),
    ]:
        with pytest.raises(error, match=match):
            linear(*args)
    with pytest.raises(TypeError, match="product: a, b and bias must be tensors"):
        product("a", w.t())


def test_linears_refuses_a_tensor_for_its_lists(device):
    """linears(x, w) with one weight tensor instead of a list once iterated it as its rows ('weights[0] must have
    shape [out, in=16], got [16]'), and a tensor of biases as one bias per element: a TypeError saying a list."""
    x, w = torch.ones(4, 16, device=device), torch.ones(16, 16, device=device)
    for args, match in (((x, w), r"linears: weights must be a list or tuple of tensors, got a Tensor of shape "
                                 r"\[16, 16\]"),
                        ((x, [w], torch.ones(16, device=device)), "linears: biases must be a list or tuple of tensors "
                                                                  "or None, got a Tensor")):
        with pytest.raises(TypeError, match=match):
            linear_module.linears(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("stack", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_linears_of_parameters_kept_in_one_buffer(device, poison, dtype, stack, bias):
    """Parameters kept as blocks of one buffer (:func:`stack_parameters`: same objects, same values) are read as one
    stacked weight without a concatenation, and the one autograd node of :func:`linears` gives each parameter its
    own gradient (one frozen: None) — against float64 F.linear, with and without the buffer."""
    gen = fresh_generator(device)
    group, rows, feats, out = 3, 37, 24, 16
    x = torch.randn(rows, feats, generator=gen, device=device).to(dtype).requires_grad_()
    weights = [torch.nn.Parameter((torch.randn(out, feats, generator=gen, device=device) / feats ** 0.5).to(dtype))
               for _ in range(group)]
    biases = [torch.nn.Parameter(torch.randn(out, generator=gen, device=device).to(dtype)) for _ in range(group)]
    weights[1].requires_grad_(False)
    before = [t.detach().clone() for t in (*weights, *biases)]
    if stack:
        buffer = linear_module.stack_parameters(weights)
        assert linear_module.stack_parameters(biases) is not None
        assert buffer.shape == (group * out, feats)
        assert all(w.data_ptr() == buffer[g * out].data_ptr() for g, w in enumerate(weights))
        assert all(torch.equal(a, b) for a, b in zip((*weights, *biases), before))  # values kept
        assert linear_module.stack_parameters(weights).data_ptr() == buffer.data_ptr()  # already stacked: kept
    with AllocationAudit() as counted:
        ys = linear_module.linears(x, weights, biases if bias else None)
    assert counted.made_by(CAT) == (0 if stack else 1 + bias)
    grads = [torch.randn(rows, out, generator=gen, device=device).to(dtype) for _ in range(group)]
    torch.autograd.backward(ys, grads)
    ref = [t.detach().double().requires_grad_() for t in (x, *weights, *biases)]
    rx, rw, rb = ref[0], ref[1:1 + group], ref[1 + group:]
    outs = [F.linear(rx, w, b if bias else None) for w, b in zip(rw, rb)]
    for g, (y, want) in enumerate(zip(ys, outs)):
        assert_close(y, want, dtype=dtype, name=f"output {g}")
    torch.autograd.backward(outs, [g.double() for g in grads])
    assert weights[1].grad is None
    for name, ours, theirs in [("x", x, rx), ("weights[0]", weights[0], rw[0]), ("weights[2]", weights[2], rw[2])] + (
            [(f"biases[{g}]", biases[g], rb[g]) for g in range(group)] if bias else []):
        assert_close(ours.grad, theirs.grad, dtype=dtype, name=f"grad of {name}")


def test_stacked_reads_live_values_and_refuses_stale_ones(device):
    """A stacked weight is the parameters' own memory: an optimizer's step shows in the next call; a parameter
    changed in place between a call and its backward is refused there, as torch refuses it for any saved tensor."""
    gen = fresh_generator(device)
    x = torch.randn(9, 8, generator=gen, device=device)
    weights = [torch.nn.Parameter(torch.randn(4, 8, generator=gen, device=device)) for _ in range(2)]
    linear_module.stack_parameters(weights)
    torch.optim.SGD(weights, lr=0.5).zero_grad()
    linear_module.linears(x, weights)[0].sum().backward()
    torch.optim.SGD(weights, lr=0.5).step()
    for y, w in zip(linear_module.linears(x, weights), weights):
        assert_close(y, x.double() @ w.detach().double().t(), dtype=torch.float32, name="after a step")
    y = linear_module.linears(x, weights)[1]
    with torch.no_grad():
        weights[0].mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_stack_parameters_leaves_what_it_cannot_stack(device):
    """Different trailing shapes or dtypes, one tensor, or an uninitialized (lazy) parameter: nothing changes."""
    a, b = torch.nn.Parameter(torch.ones(2, 3, device=device)), torch.nn.Parameter(torch.ones(2, 4, device=device))
    c = torch.nn.Parameter(torch.ones(2, 3, device=device, dtype=torch.float64))
    for tensors in ([a, b], [a, c], [a], [a, torch.nn.parameter.UninitializedParameter()]):
        ptrs = [t.data_ptr() for t in tensors if not isinstance(t, torch.nn.parameter.UninitializedParameter)]
        assert linear_module.stack_parameters(tensors) is None
        assert ptrs == [t.data_ptr() for t in tensors if not isinstance(t, torch.nn.parameter.UninitializedParameter)]
    assert torch.equal(linear_module.stacked([a, a]), torch.cat([a, a]))  # the same block twice: copied
