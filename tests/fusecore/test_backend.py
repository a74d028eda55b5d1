"""fusecore.backend: kernel-mode decision, device checks, the reference switch."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton.language as tl

import fusecore
from fusecore import backend


def test_mode_is_fixed_and_consistent():
    assert backend.KERNEL_MODE in ("compiled", "interpret")
    assert backend.COMPILED != backend.INTERPRET
    assert backend.COMPILED == torch.cuda.is_available() or os.environ.get(backend.ENV_VAR) == "interpret"
    assert backend.describe().startswith("triton ")


def test_decide_mode(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert backend._decide_mode("auto") == "interpret"
    assert backend._decide_mode("reference") == "interpret"
    assert backend._decide_mode("interpret") == "interpret"
    with pytest.raises(backend.BackendError, match="needs a CUDA GPU"):
        backend._decide_mode("compiled")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert backend._decide_mode("auto") == "compiled"
    assert backend._decide_mode("interpret") == "interpret"


def test_invalid_env_value(monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "fastest")
    with pytest.raises(backend.BackendError, match="FUSEKIT_BACKEND='fastest'"):
        backend._requested()
    monkeypatch.setenv(backend.ENV_VAR, " Interpret ")
    assert backend._requested() == "interpret"


def test_version_parsing():
    assert backend._parse_version("3.6.0") == (3, 6)
    assert backend._parse_version("3.10.0+git1234") == (3, 10)
    assert backend._parse_version("4") == (4, 0)


def test_check_devices_accepts_kernel_device_and_skips_none(device):
    a = torch.zeros(3, device=device)
    assert backend.check_devices(a=a, b=None, c=a) == a.device


def test_check_devices_rejects_mixed_and_unsupported(device):
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        backend.check_devices(x=torch.zeros(1, device=device), y=[1.0])
    meta = torch.empty(2, device="meta")
    with pytest.raises(ValueError, match="m is on device 'meta'"):
        backend.check_devices(m=meta)
    if backend.INTERPRET:
        with pytest.raises(ValueError, match="b is on device 'meta' but a is on 'cpu'"):
            backend.check_devices(a=torch.zeros(1), b=meta)
    else:
        with pytest.raises(ValueError, match="a is on device 'cpu'"):
            backend.check_devices(a=torch.zeros(1))
    with pytest.raises(ValueError, match="no tensor"):
        backend.check_devices(a=None)


def test_check_dtypes():
    f32, f16 = torch.zeros(1), torch.zeros(1, dtype=torch.float16)
    allowed = (torch.float32, torch.float16)
    assert backend.check_dtypes(allowed, a=f32, b=None) == torch.float32
    with pytest.raises(TypeError, match="b has dtype float16 but a has float32"):
        backend.check_dtypes(allowed, a=f32, b=f16)
    assert backend.check_dtypes(allowed, same=False, a=f32, b=f16) == torch.float32
    with pytest.raises(TypeError, match="c has dtype int64; expected one of float32, float16"):
        backend.check_dtypes(allowed, c=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError):
        backend.check_dtypes(allowed)


def test_missing_or_old_triton_says_what_to_install(monkeypatch):
    import importlib
    import types

    real_import = importlib.import_module

    def no_triton(name, *args):
        if name == "triton":
            raise ImportError("No module named 'triton'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_triton)
    with pytest.raises(backend.BackendError, match="pip install triton"):
        backend._import_triton()
    monkeypatch.setattr(importlib, "import_module", lambda name, *a: types.SimpleNamespace(__version__="2.1.0"))
    with pytest.raises(backend.BackendError, match="found 2.1.0.*pip install -U triton"):
        backend._import_triton()


def test_reference_switch_is_scoped():
    assert not fusecore.reference_enabled()
    with fusecore.use_reference():
        assert fusecore.reference_enabled()
        with fusecore.use_reference(False):
            assert not fusecore.reference_enabled()
        assert fusecore.reference_enabled()
    assert not fusecore.reference_enabled()


def test_autotune_runs_first_config_under_interpreter(device):
    import triton
    import triton.language as tl

    @backend.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"])
    @backend.jit
    def fill(out_ptr, n, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + idx, idx.to(tl.float32), mask=idx < n)

    out = torch.full((50,), float("nan"), device=device)
    fill[lambda meta: (triton.cdiv(50, meta["BLOCK"]),)](out, 50)
    assert torch.equal(out.cpu(), torch.arange(50, dtype=torch.float32))


@pytest.mark.skipif(not backend.INTERPRET, reason="checks the interpreter set-up")
def test_interpreter_works_when_triton_was_imported_first():
    """Another library importing triton.language before fusekit must not break the interpreter."""
    code = textwrap.dedent(
        """
        import triton.language  # imported before fusekit, without TRITON_INTERPRET
        import torch
        from fusecore.demo import langevin
        x = torch.randn(10); v = torch.randn(10)
        out = langevin(x, v, 3)
        assert all(torch.isfinite(t).all() for t in out)
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", backend.ENV_VAR)}
    env["PYTHONPATH"] = os.pathsep.join([str(backend.__file__).rsplit("/fusecore/", 1)[0], env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


@backend.jit
def _bf16_round_and_dot(x_ptr, w_ptr, cast_ptr, out_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """cast = bf16(x) (float32 x [BM, BK]); out = bf16(x) @ w.T in float32 (w bf16 [BN, BK])."""
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    x = tl.load(x_ptr + rm[:, None] * BK + rk[None, :]).to(tl.bfloat16)
    w = tl.load(w_ptr + rn[:, None] * BK + rk[None, :])
    tl.store(cast_ptr + rm[:, None] * BK + rk[None, :], x)
    tl.store(out_ptr + rm[:, None] * BN + rn[None, :], tl.dot(x, tl.trans(w)))


@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")  # inf · 0 in row 0
@pytest.mark.parametrize("bm, bn, bk", [(16, 16, 16), (16, 32, 64)])
def test_bfloat16_rounds_to_nearest_even_and_multiplies_as_on_the_gpu(device, bm, bn, bk):
    """The interpreter's bfloat16 (fusecore.backend._interpret_bfloat16_as_the_gpu): a float32 ->
    bfloat16 cast bit for bit torch's (round to nearest even, ties included; NaN, inf, subnormals),
    and tl.dot of bfloat16 operands the float64 product of their values."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    x = torch.randn(bm, bk, generator=gen) * 8
    # ties of both parities, values that round up into the next binade, specials
    x.view(-1)[:8] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2 - 2**-9, 3.4e38,
                                   float("inf"), -float("inf"), 1e-40])
    w = (torch.randn(bn, bk, generator=gen) * 8).to(torch.bfloat16)
    cast = torch.full((bm, bk), 7, dtype=torch.bfloat16)
    out = torch.full((bm, bn), float("nan"))
    x, w, cast, out = (t.to(device) for t in (x, w, cast, out))
    _bf16_round_and_dot[(1,)](x, w, cast, out, BM=bm, BN=bn, BK=bk)
    assert torch.equal(cast.view(torch.int16).cpu(), x.to(torch.bfloat16).view(torch.int16).cpu())
    finite = x.abs() < 1e30  # the big and infinite values sit in row 0
    rows = finite.all(1)
    expected = x.to(torch.bfloat16).double()[rows] @ w.double().T
    # exact products, float32 sums of bk terms
    tol = bk * 2**-23 * (x.to(torch.bfloat16).double()[rows].abs() @ w.double().abs().T)
    assert ((out[rows].double() - expected).abs() <= tol + 1e-30).all()


def test_set_reference_takes_a_bool():
    """bool("no") is True: a string once switched the reference path on (session 38's audit)."""
    before = backend.reference_enabled()
    for bad in ("no", 0, None):
        with pytest.raises(TypeError, match="enabled must be True or False"):
            backend.set_reference(bad)
    assert backend.reference_enabled() == before


def test_check_dtypes_takes_one_dtype_or_a_tuple():
    x = torch.ones(2)
    assert backend.check_dtypes(torch.float32, x=x) == backend.check_dtypes((torch.float32,), x=x) == torch.float32
    with pytest.raises(TypeError, match="x has dtype float32; expected one of int64"):
        backend.check_dtypes(torch.int64, x=x)


@backend.jit
def _cast_to_bf16(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs).to(tl.bfloat16))


def test_float64_to_bfloat16_rounds_once_to_nearest_even(device):
    """The interpreter once cast float64 to bfloat16 as an integer into its uint16 storage (2.5 -> 2 as bits:
    garbage); the cast is now float64's value rounded once to nearest even, as the GPU's cvt.rn.bf16.f64 (not
    through float32, which would round 1 + 2^-8 + 2^-30 down to the tie 1 + 2^-8 and then to even 1.0)."""
    values = [2.5, -3.75, 1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-40), 3.4e38, 1e300,
              -1e300, 1e-40, 0.0, float("inf"), float("-inf"), 1 / 3, 2 - 2**-9, 1e-300]
    want = [2.5, -3.75, 1 + 2**-7, 1.0, 1 + 2**-6, -(1 + 2**-7), float("inf"), float("inf"), float("-inf"),
            None, 0.0, float("inf"), float("-inf"), 0.333984375, 2.0, 0.0]
    x = torch.tensor(values + [float("nan")], dtype=torch.float64, device=device)
    out = torch.full((32,), 7, dtype=torch.bfloat16, device=device)
    _cast_to_bf16[(1,)](torch.cat([x, x.new_zeros(32 - x.numel())]), out, N=32)
    got = out[:len(values)].double().tolist()
    for value, expected, result in zip(values, want, got):
        if expected is None:  # a bfloat16 subnormal: float32's rounding of it is exact enough to compare with
            expected = torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).item()
        assert result == expected, (value, result, expected)
    assert torch.isnan(out[len(values)])
