"""Run by test_compile_check.py in a child process with FUSEKIT_COMPILE_FOR=sm_90 (the mode is
fixed at import): one kernel that compiles, one that only the interpreter accepts, and a
tensor-core product whose operand chunk also feeds a sum of squares (read once: its pipelined
shared-memory buffer gets no swizzle; loaded a second time for the sum: swizzled)."""

import sys

import torch
import triton.language as tl

from fusecore import backend, jit
from fusecore.compile_check import CheckedFunction, CompileCheckError


@jit
def _twice_sum(x):
    return tl.sum(x * 2.0, axis=0)


@jit
def good_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    # a device function, a library function and a tensor member function
    tl.store(out_ptr, _twice_sum(x) + tl.sigmoid(x).to(tl.float32).sum() - (BLOCK - n) * 0.5)


@jit
def interpreter_only_kernel(x_ptr, out_ptr, n):
    acc = 0  # int32 first, float32 after the first iteration: the compiler rejects the loop
    for i in range(n):
        acc += tl.load(x_ptr + i)
    tl.store(out_ptr, acc)


@jit
def square_sum_dot_kernel(x_ptr, w_ptr, out_ptr, sq_ptr, K, SECOND_LOAD: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, BK: tl.constexpr):
    """out = x @ w.T (x float32 [BM, K] rounded to bf16, w bf16 [BN, K]) and sq = Σ_k x²."""
    rm, rn, rk = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    sq = tl.zeros([BM], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(x_ptr + rm[:, None] * K + k0 + rk[None, :])
        w = tl.load(w_ptr + rn[:, None] * K + k0 + rk[None, :])
        acc += tl.dot(x.to(tl.bfloat16), tl.trans(w))
        if SECOND_LOAD:  # the chunk again, as one flat vector (the same tile shape would be CSE'd)
            flat = tl.arange(0, BM * BK)
            x = tl.reshape(tl.load(x_ptr + flat // BK * K + k0 + flat % BK), [BM, BK])
        sq += tl.sum(x * x, 1)
    tl.store(out_ptr + rm[:, None] * BN + rn[None, :], acc)
    tl.store(sq_ptr + rm, sq)


def main() -> int:
    assert backend.INTERPRET and backend.COMPILE_CHECK_TARGET.arch == 90
    assert isinstance(good_kernel, CheckedFunction)
    x, out = torch.randn(13), torch.full((1,), float("nan"))
    good_kernel[(1,)](x, out, 13, BLOCK=16, num_warps=2)
    expected = (2 * x).sum() + torch.sigmoid(x).sum()
    assert torch.allclose(out, expected.reshape(1), atol=1e-5), (out, expected)
    assert len(good_kernel._compiled) == 1
    good_kernel[(1,)](x, out, 13, BLOCK=16, num_warps=2)  # same specialisation: not compiled again
    assert len(good_kernel._compiled) == 1
    xs, ws = torch.randn(16, 256), torch.randn(32, 256).to(torch.bfloat16)
    for second_load in (0, 1):
        prod, sq = torch.full((16, 32), float("nan")), torch.full((16,), float("nan"))
        square_sum_dot_kernel[(1,)](xs, ws, prod, sq, 256, SECOND_LOAD=second_load, BM=16, BN=32, BK=128,
                                    num_stages=3)
        expected = xs.to(torch.bfloat16).double() @ ws.double().T
        assert torch.allclose(prod.double(), expected, rtol=1e-3, atol=1e-3), (prod - expected).abs().max()
        assert torch.allclose(sq, (xs * xs).sum(1), rtol=1e-5), (sq, (xs * xs).sum(1))
    try:
        interpreter_only_kernel[(1,)](x, out, 13)
    except CompileCheckError as exc:
        assert "interpreter_only_kernel" in str(exc) and "sm_90" in str(exc), exc
        print("rejected:", str(exc).splitlines()[0])
        return 0
    print("the loop with a changing carried type was not rejected")
    return 1


if __name__ == "__main__":
    sys.exit(main())
