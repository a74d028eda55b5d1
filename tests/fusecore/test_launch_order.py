"""fusecore.launch_order: the L2 prefetch and the programmatic-dependent-launch wait change no value,
and the compiled kernel prefetches before it waits."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton.language as tl

from fusecore.backend import COMPILED, default_device, jit
from fusecore.launch_order import after_previous_kernel, prefetch_rows

ROOT = Path(__file__).resolve().parents[2]


@jit
def _scaled_copy_kernel(x_ptr, y_ptr, K, PREFETCH_LINES: tl.constexpr, USE_PDL: tl.constexpr,
                        BLOCK: tl.constexpr):
    """y[row] = 2 x[row], after asking L2 for the row's first lines and waiting for the previous kernel."""
    row = tl.program_id(0).to(tl.int64)
    prefetch_rows(x_ptr + row * K + tl.zeros([1], tl.int64), tl.full([1], True, tl.int1), 0, K, PREFETCH_LINES)
    after_previous_kernel(USE_PDL)
    for k0 in range(0, K, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        tl.store(y_ptr + row * K + k, 2.0 * tl.load(x_ptr + row * K + k, mask=k < K), mask=k < K)


# Under the interpreter the helpers must be switched off (inline PTX); compiled, both ways.
SETTINGS = [(0, False), (4, True), (1, False)] if COMPILED else [(0, False)]


@pytest.mark.parametrize("lines, pdl", SETTINGS)
@pytest.mark.parametrize("rows, K", [(3, 37), (5, 1000)])
def test_prefetch_and_wait_change_no_value(lines, pdl, rows, K):
    gen = torch.Generator().manual_seed(rows * K)
    device = default_device()
    x = torch.randn(rows, K, generator=gen).to(device)
    y = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    source = torch.empty_like(x)
    source.copy_(x)  # the previous kernel in the stream: the copy writes what the launch reads
    _scaled_copy_kernel[(rows,)](source, y, K, PREFETCH_LINES=lines, USE_PDL=pdl, BLOCK=64,
                                 **({"launch_pdl": True} if pdl else {}))
    assert torch.equal(y.cpu(), 2.0 * x.cpu())


PTX_SCRIPT = '''
import torch
torch.cuda.is_available = lambda: True  # compiled-mode fusecore kernels, on a machine without a GPU

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import fusecore
from test_launch_order import _scaled_copy_kernel

assert fusecore.COMPILED
source = ASTSource(fn=_scaled_copy_kernel, signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "K": "i32",
                   "PREFETCH_LINES": "constexpr", "USE_PDL": "constexpr", "BLOCK": "constexpr"},
                   constexprs={(3,): 4, (4,): True, (5,): 64})
ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
lines = [line.strip() for line in ptx.splitlines()]
first = lambda op: next(i for i, line in enumerate(lines) if op in line)
print(first("prefetch.global.L2"), first("griddepcontrol.wait"), first("griddepcontrol.launch_dependents"),
      first("ld.global"), first("st.global"))
'''


@pytest.mark.skipif(COMPILED, reason="compiles for sm_90 without a GPU: the CPU machines' check")
def test_compiled_kernel_prefetches_then_waits_then_reads(tmp_path):
    """sm_90 PTX: every prefetch before griddepcontrol.wait, the trigger after it, loads and stores after both."""
    script = tmp_path / "ptx_order.py"
    script.write_text(textwrap.dedent(PTX_SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])}
    for name in ("FUSEKIT_BACKEND", "FUSEKIT_COMPILE_FOR", "TRITON_INTERPRET"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    prefetch, wait, trigger, load, store = map(int, done.stdout.split())
    assert prefetch < wait < trigger < load and trigger < store
