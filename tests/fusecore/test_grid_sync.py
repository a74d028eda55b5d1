"""fusecore.grid_sync: counts in device memory that order the programs of one launch.

Under the interpreter the programs of a grid run one after another (0, 1, 2, ...), so a chain
in which program i waits for the i signals of the programs before it runs there; the GPU run
of llmfuse's looped kernel checks the co-resident grid."""

import torch
import triton.language as tl

from fusecore.backend import COMPILED, jit
from fusecore.grid_sync import signal, wait_for
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
