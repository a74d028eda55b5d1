"""Run by test_compile_check.py in a child process with FUSEKIT_COMPILE_FOR=sm_90 (the mode is
fixed at import): one kernel that compiles, one that only the interpreter accepts."""

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
