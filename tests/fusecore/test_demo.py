"""The demonstration kernel: K fused Langevin steps against the float64 step-by-step oracle."""

from pathlib import Path

import numpy as np
import pytest
import torch

import fusecore
from fusecore.demo import langevin, langevin_reference, langevin_unfused
from fusecore.rng import normal_reference
from fusecore.testing import STRICT_FLOAT32, assert_all_written, assert_close, poisoned


@pytest.mark.parametrize("n,steps", [(1, 1), (7, 0), (37, 5), (1031, 3)])
def test_matches_float64_oracle(n, steps, gen, device):
    x = torch.randn(n, generator=gen)
    v = torch.randn(n, generator=gen)
    seed = int(torch.randint(0, 2**62, (1,), generator=gen))
    out = tuple(poisoned((n,), torch.float32, device) for _ in range(3))
    got = langevin(x.to(device), v.to(device), steps, seed=seed, offset=11, out=out)
    assert all(g is o for g, o in zip(got, out))
    want = langevin_reference(x, v, steps, seed=seed, offset=11, dtype=torch.float64)
    for name, g, w in zip(("x", "v", "energy"), got, want):
        assert_all_written(g, name)
        assert_close(g, w, tol=10 * STRICT_FLOAT32, name=f"{name} (test seed {gen.initial_seed()})")


def test_offsets_continue_the_stream_exactly(device):
    x = torch.randn(3, 5, device=device)
    v = torch.randn(3, 5, device=device)
    whole = langevin(x, v, 6, seed=9)
    first = langevin(x, v, 4, seed=9)
    second = langevin(first[0], first[1], 2, seed=9, offset=4)
    assert torch.equal(whole[0], second[0]) and torch.equal(whole[1], second[1])
    assert whole[0].shape == (3, 5)


def test_non_contiguous_input(device):
    base = torch.randn(8, 6, device=device)
    x, v = base[:, ::2], base[:, 1::2]
    got = langevin(x, v, 2, seed=1)
    want = langevin(x.contiguous(), v.contiguous(), 2, seed=1)
    assert torch.equal(got[0], want[0])


def test_empty_input(device):
    e = torch.empty(0, device=device)
    out = langevin(e, e, 4)
    assert all(t.numel() == 0 for t in out)


def test_reference_switch_gives_the_same_math(device):
    x = torch.randn(17, device=device)
    v = torch.randn(17, device=device)
    fused = langevin(x, v, 3, seed=2)
    with fusecore.use_reference():
        ref = langevin(x, v, 3, seed=2)
    for a, b in zip(fused, ref):
        assert_close(a, b, tol=10 * STRICT_FLOAT32)


def test_unfused_baseline_has_the_same_deterministic_part(device):
    x = torch.randn(9, device=device)
    v = torch.randn(9, device=device)
    fused = langevin(x, v, 4, sigma=0.0)
    loop = langevin_unfused(x, v, 4, sigma=0.0)
    for a, b in zip(fused, loop):
        assert_close(a, b, tol=10 * STRICT_FLOAT32)


@pytest.mark.parametrize(
    "args,kwargs,error,match",
    [
        ((torch.zeros(3, dtype=torch.float64), torch.zeros(3), 1), {}, TypeError, "x must be float32"),
        ((torch.zeros(3), torch.zeros(4), 1), {}, ValueError, "same shape"),
        ((torch.zeros(3), torch.zeros(3), -1), {}, ValueError, "steps"),
        ((torch.zeros(3), torch.zeros(3), 1), {"dt": 0.0}, ValueError, "dt"),
        ((torch.zeros(3), torch.zeros(3), 1), {"seed": -5}, ValueError, "seed"),
        ((torch.zeros(3), torch.zeros(3), 1), {"offset": -1}, ValueError, "offset"),
        ((torch.zeros(3), torch.zeros(3), 1), {"offset": 1.5}, TypeError, "offset must be an int"),
        ((torch.zeros(3), torch.zeros(3), 2), {"offset": 2**63 - 1}, ValueError, "offset \\+ steps"),
        (([0.0], torch.zeros(3), 1), {}, TypeError, "x must be a torch.Tensor"),
    ],
)
def test_bad_input_is_rejected(args, kwargs, error, match, device):
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(error, match=match):
        langevin(*args, **kwargs)


FIXTURE = Path(__file__).parent / "data" / "langevin_interpreted.pt"
FIXTURE_N, FIXTURE_STEPS, FIXTURE_SEED, FIXTURE_OFFSET = 4099, 16, 123, 7


def _fixture_inputs():
    """Inputs every machine reproduces exactly: Philox normals from the numpy oracle."""
    z = torch.from_numpy(normal_reference(1, np.arange(FIXTURE_N), 0)).to(torch.float32)
    return z[:, 0].contiguous(), z[:, 1].contiguous()


def _fixture_run(device):
    x, v = _fixture_inputs()
    return langevin(x.to(device), v.to(device), FIXTURE_STEPS, seed=FIXTURE_SEED, offset=FIXTURE_OFFSET)


@pytest.mark.skipif(not fusecore.INTERPRET, reason="the fixture holds interpreter output")
def test_interpreter_reproduces_fixture():
    """The committed interpreter output is what the interpreter computes today."""
    got = _fixture_run("cpu")
    want = torch.load(FIXTURE)
    for a, b in zip(got, want):
        assert_close(a, b, tol=STRICT_FLOAT32)


@pytest.mark.gpu
def test_compiled_equals_interpreted():
    """The kernel compiled on the GPU gives the interpreter's results (committed from a CPU run)."""
    got = _fixture_run("cuda")
    want = torch.load(FIXTURE)
    for a, b in zip(got, want):
        assert_close(a.cpu(), b, tol=STRICT_FLOAT32)


if __name__ == "__main__":  # regenerate the fixture: PYTHONPATH=. python tests/fusecore/test_demo.py
    assert fusecore.INTERPRET, "run with the interpreter (FUSEKIT_BACKEND=interpret) to write the fixture"
    FIXTURE.parent.mkdir(exist_ok=True)
    torch.save(tuple(t.clone() for t in _fixture_run("cpu")), FIXTURE)
    print("wrote", FIXTURE)
