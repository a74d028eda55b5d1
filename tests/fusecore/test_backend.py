"""fusecore.backend: kernel-mode decision, device checks, the reference switch."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

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
