"""fusecore.grid_sync: counts in device memory that order the programs of one launch.

Under the interpreter the programs of a grid run one after another (0, 1, 2, ...), so a chain
in which program i waits for the i signals of the programs before it runs there; the GPU run
of llmfuse's looped kernel checks the co-resident grid."""

import pytest
import torch
import triton.language as tl

from fusecore.backend import COMPILED, jit
from fusecore.grid_sync import signal, sum_partials, wait_for
from fusecore.testing import test_device


@jit
def _chain(count_ptr, before_ptr, out_ptr, timeout_ptr, extra, max_polls):
    # program i waits until i programs (+ extra) have signalled, writes, then signals itself
    i = tl.program_id(0)
    wait_for(count_ptr, i + extra, max_polls, timeout_ptr, False, 0)
    tl.store(out_ptr + i, tl.load(out_ptr + i - 1, mask=i > 0, other=0) + 1)
    tl.store(before_ptr + i, signal(count_ptr))


def _run(programs: int, extra: int, max_polls: int):
    device = test_device()
    count = torch.zeros(1, dtype=torch.int32, device=device)
    before = torch.full((programs,), -1, dtype=torch.int32, device=device)
    out = torch.zeros(programs, dtype=torch.int32, device=device)
    timeout = torch.zeros(1, dtype=torch.int32, device=device)
    _chain[(programs,)](count, before, out, timeout, extra, max_polls)
    return count, before, out, timeout


def test_a_chain_of_waits_and_signals_orders_every_program():
    count, before, out, timeout = _run(7, 0, 1 << 20)
    assert count.item() == 7 and timeout.item() == 0
    assert sorted(before.tolist()) == list(range(7))  # signal returns the count before the add
    assert out.tolist() == list(range(1, 8))  # each program read its predecessor's store


def test_a_wait_that_cannot_end_raises_the_timeout_flag_instead_of_hanging():
    if COMPILED:  # one program per SM here would wait its full poll budget: keep it short
        count, before, out, timeout = _run(1, 1, 1000)
    else:
        count, before, out, timeout = _run(3, 1, 10)
    assert timeout.item() == 1 and count.item() == before.numel()


@jit
def _partials(x_ptr, part_ptr, group_ptr, out_ptr, count_ptr, programs, count, W,
              GROUP: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr):
    # program p stores part[k, p, :] = x[k, p, :] * (p + 1), then finishes the column sums with the launch
    pid = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_W)
    for k in range(0, count):
        row = (k * programs + pid) * W
        for w0 in range(0, W, BLOCK_W):
            mask = w0 + offs < W
            acc = part_ptr.dtype.element_ty
            value = tl.load(x_ptr + row + w0 + offs, mask=mask).to(acc) * (pid + 1).to(acc)
            tl.store(part_ptr + row + w0 + offs, value, mask=mask)
    sum_partials(pid, programs, part_ptr, count, W, group_ptr, out_ptr, count_ptr, GROUP, BLOCK_P, BLOCK_W)


@pytest.mark.parametrize("programs,count,width,group,acc,out_dtype", [
    (1, 1, 1, 4, torch.float32, torch.float32),
    (7, 2, 13, 4, torch.float32, torch.bfloat16),    # groups of 4, the last one short
    (64, 3, 40, 8, torch.float32, torch.float16),    # whole groups only
    (29, 2, 70, 64, torch.float64, torch.float64),   # one group
    (131, 1, 5, 3, torch.float32, torch.float32),    # 44 groups: the second level longer than the first
])
def test_sum_partials_finishes_the_column_sums_inside_the_launch(gen, programs, count, width, group, acc, out_dtype):
    """Every program's partial rows summed over the programs by the launch's last arrivals, deterministically (a fixed
    order of addition), into ``out`` in its dtype, and the counts left zeroed for the next launch."""
    device = test_device()
    x = torch.randn(count, programs, width, generator=gen).to(device)
    groups = -(-programs // group)
    part = torch.full((count, programs, width), float("nan"), dtype=acc, device=device)
    grouped = torch.full((count, groups, width), float("nan"), dtype=acc, device=device)
    counts = torch.zeros(groups + 1, dtype=torch.int32, device=device)
    want = (x.double() * torch.arange(1, programs + 1, dtype=torch.float64, device=device)[None, :, None]).sum(1)
    results = []
    for _ in range(2):  # the counts left by the first launch serve the second
        out = torch.full((count, width), float("nan"), dtype=out_dtype, device=device)
        _partials[(programs,)](x, part, grouped, out, counts, programs, count, width, GROUP=group, BLOCK_P=4,
                               BLOCK_W=16)
        assert not counts.any(), counts
        tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[out_dtype]
        assert torch.allclose(out.double(), want, rtol=tol, atol=tol * want.abs().max().item()), (out, want)
        results.append(out)
    assert torch.equal(results[0], results[1])
