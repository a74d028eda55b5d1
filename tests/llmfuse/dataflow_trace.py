"""A happens-before check of the dependency-ordered looped schedule, from a trace of the real kernel.

:func:`trace_launch` runs a launch through Triton's interpreter and records, per program and in
program order, every access to the step's mutable buffers (element indices of loads, stores and
atomics, from the kernel's own pointer arithmetic), every CTA barrier, and every wait on a count
(the count and the target the kernel computed: ``wait_for`` is wrapped where the kernels call it).
Nothing of the schedule is restated here: tiles, buffers, counts and targets are the kernel's.

:func:`check_happens_before` then proves, for that trace, that no two programs race:

* **waits** — a wait for ``count >= T`` is satisfied by the first ``T`` programs (in index order)
  that signal that count; they must all have lower indices (the dispatch order the schedule relies
  on for progress), and every other signaller of the count must happen after the waiting program,
  so that in no execution can its signal be one of the ``T`` (the induction that makes the
  relation below sound for every interleaving, not just the interpreter's);
* **last-finisher rounds** — programs that add to a semaphore until the last of them resets it
  form a round; the last one's work after its add (the epilogue: summing the parts, RoPE, the
  merge) happens after every participant's work and before any program that waits for all of
  their signals; the next round on that semaphore must start after the reset;
* **conflicts** — any two accesses of the same element by different programs (or epilogues), at
  least one a plain write, must be ordered by that relation (RAW, WAR, WAW);
* **barriers** — the memory-model side inside a program: a CTA barrier between a program's last
  store and each release (a count's signal, a semaphore add: a release by one thread orders only
  that thread's stores), and between a wait and the program's first access.
"""

from __future__ import annotations

import bisect
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from triton.runtime import interpreter as triton_interpreter

from llmfuse.kernels import looped as looped_module
from llmfuse.kernels import qkv_attention as qkv_attention_module

SYNC_BUFFERS = ("counter", "timeout")  # counts and the timeout flag: synchronisation, not data
SEMAPHORES = ("sem", "pair_sem", "proj_sem")


@dataclass
class Event:
    kind: str  # "load", "store", "atomic", "barrier", "wait", "signal"
    buffer: str = ""
    index: np.ndarray | None = None  # element indices touched (masked-off lanes removed)
    value: int = 0  # atomic: the value added / exchanged; wait: the target
    returned: int = 0  # atomic: the value before
    op: str = ""  # atomic: "add" / "exch"; memory order of an atomic


@dataclass
class Trace:
    """Per program, the events in program order."""

    programs: list[list[Event]] = field(default_factory=list)


class _Buffers:
    """Maps host addresses to (buffer name, element index) for the named tensors."""

    def __init__(self, named: dict[str, torch.Tensor]):
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name, t.element_size())
                       for name, t in named.items() if t.numel())
        self.starts = [s[0] for s in spans]
        self.spans = spans

    def locate(self, addresses: np.ndarray) -> tuple[str, np.ndarray] | None:
        """The buffer all ``addresses`` fall in and their element indices; None outside every buffer
        (weights, which no program writes).  An access reaching from one buffer into another is an error."""
        if addresses.size == 0:
            return None
        first, last = int(addresses.min()), int(addresses.max())
        i = bisect.bisect_right(self.starts, first) - 1
        start, end, name, size = self.spans[i] if i >= 0 else (0, 0, "", 1)
        if first >= end:
            j = bisect.bisect_right(self.starts, last) - 1
            assert j == i or last >= self.spans[j][1], f"an access reaches into {self.spans[j][2]} from outside it"
            return None
        assert last < end, f"an access reaches past the end of {name}"
        return name, ((addresses.astype(np.int64) - start) // size)


def _scalar(value) -> int:
    handle = getattr(value, "handle", None)
    data = handle.data if handle is not None else value
    return int(np.asarray(data).reshape(-1)[0])


@contextmanager
def trace_launch(named: dict[str, torch.Tensor]):
    """Record the events of every interpreted program launched inside the block (one launch)."""
    builder = triton_interpreter.interpreter_builder
    buffers = _Buffers(named)
    trace = Trace()
    originals = {name: getattr(builder, name) for name in
                 ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_barrier",
                  "set_grid_idx")}
    wait_fns = {module: module.wait_for for module in (looped_module, qkv_attention_module)}

    def events() -> list[Event]:
        return trace.programs[builder.grid_idx[0]]

    def record(kind: str, ptrs, mask, **extra) -> None:
        where = buffers.locate(np.asarray(ptrs.data)[np.asarray(mask.data, dtype=bool)])
        if where is not None:
            events().append(Event(kind, where[0], where[1], **extra))

    def set_grid_idx(x, y, z):
        while len(trace.programs) <= x:
            trace.programs.append([])
        return originals["set_grid_idx"](x, y, z)

    def masked_load(ptrs, mask, other, cache_policy, is_volatile):
        record("load", ptrs, mask)
        return originals["create_masked_load"](ptrs, mask, other, cache_policy, is_volatile)

    def masked_store(ptrs, value, mask, cache_policy):
        record("store", ptrs, mask)
        return originals["create_masked_store"](ptrs, value, mask, cache_policy)

    def atomic_rmw(rmw_op, ptr, val, mask, sem, scope):
        before = originals["create_atomic_rmw"](rmw_op, ptr, val, mask, sem, scope)
        op = "add" if "ADD" in str(rmw_op).upper() else "exch" if "XCHG" in str(rmw_op).upper() else str(rmw_op)
        record("atomic", ptr, mask, value=_scalar(val.data), returned=_scalar(before.data),
               op=f"{op}.{str(sem).rsplit('.', 1)[-1].lower()}")
        return before

    def barrier():
        events().append(Event("barrier"))
        return originals["create_barrier"]()

    def traced_wait_for(original):
        def wait_for(count_ptr, target, *args, **kwargs):
            where = buffers.locate(np.asarray(count_ptr.handle.data).reshape(-1))
            events().append(Event("wait", where[0], where[1], value=_scalar(target)))
            return original(count_ptr, target, *args, **kwargs)
        return wait_for

    def patch(on: bool) -> None:
        for module, original in wait_fns.items():
            module.wait_for = traced_wait_for(original) if on else original

    # Under FUSEKIT_COMPILE_FOR each launch is also compiled (fusecore.compile_check): with the kernel's
    # own wait_for, not the recording wrapper, which only the interpreter can run.
    kernel = looped_module.looped_decode_kernel
    compile_check = getattr(kernel, "check", None)
    if compile_check is not None:
        def check_unpatched(args, kwargs):
            patch(False)
            try:
                compile_check(args, kwargs)
            finally:
                patch(True)
        kernel.check = check_unpatched
    for name, fn in (("create_masked_load", masked_load), ("create_masked_store", masked_store),
                     ("create_atomic_rmw", atomic_rmw), ("create_barrier", barrier),
                     ("set_grid_idx", set_grid_idx)):
        setattr(builder, name, fn)
    patch(True)
    try:
        yield trace
    finally:
        for name, fn in originals.items():
            setattr(builder, name, fn)
        patch(False)
        if compile_check is not None:
            del kernel.check


def _is_signal(e: Event) -> bool:
    return e.kind == "atomic" and e.buffer == "counter" and e.op.startswith("add") and e.value > 0


def _is_data(e: Event) -> bool:
    return e.kind in ("load", "store", "atomic") and e.buffer not in SYNC_BUFFERS


def check_happens_before(trace: Trace) -> dict[str, int]:
    """Raise AssertionError naming the first race found in ``trace``; returns what was checked."""
    programs = trace.programs
    n = len(programs)
    # --- last-finisher rounds: (semaphore, element) -> participants until the reset
    rounds: list[tuple[list[int], int]] = []  # (participants, last)
    epilogue_start: dict[int, int] = {}  # program -> event index where its epilogue begins
    open_rounds: dict[tuple[str, int], list[int]] = {}
    round_of_sem: dict[tuple[str, int], list[int]] = {}
    for p, events in enumerate(programs):
        for i, e in enumerate(events):
            if e.kind != "atomic" or e.buffer not in SEMAPHORES:
                continue
            key = (e.buffer, int(e.index[0]))
            if e.op.startswith("add"):
                assert e.op.endswith("acquire_release"), f"program {p}: semaphore add {key} is {e.op}"
                members = open_rounds.setdefault(key, [])
                assert e.returned == len(members), f"program {p}: {key} returned {e.returned}, {len(members)} before"
                members.append(p)
                epilogue_start[p] = i + 1
            else:  # the last participant's reset closes the round
                members = open_rounds.pop(key)
                assert members[-1] == p, f"program {p} reset {key} but did not finish its round last"
                round_of_sem.setdefault(key, []).append(len(rounds))
                rounds.append((members, p))
    assert not open_rounds, f"semaphores left set after the launch: {sorted(open_rounds)}"
    finishers = {last: r for r, (_, last) in enumerate(rounds)}

    # --- nodes: programs, then one epilogue per round; accesses per node
    m = n + len(rounds)
    accesses: list[list[Event]] = [[] for _ in range(m)]
    for p, events in enumerate(programs):
        split = epilogue_start.get(p, len(events)) if p in finishers else len(events)
        for i, e in enumerate(events):
            if _is_data(e) and not (e.kind == "atomic" and e.buffer in SEMAPHORES):
                accesses[n + finishers[p] if i >= split else p].append(e)

    # --- waits: predecessors are the first T signallers (index order) of the count
    signallers: dict[tuple[str, int], list[int]] = {}
    for p, events in enumerate(programs):
        for e in events:
            if _is_signal(e):
                signallers.setdefault((e.buffer, int(e.index[0])), []).append(p)
    reach = np.zeros((m, m), dtype=bool)
    waits = []
    for p, events in enumerate(programs):
        for e in events:
            if e.kind == "wait":
                key = (e.buffer, int(e.index[0]))
                pool = signallers.get(key, [])
                assert e.value <= len(pool), f"program {p} waits for {e.value} signals of {key}, {len(pool)} exist"
                preds = pool[: e.value]
                assert all(q < p for q in preds), f"program {p} waits on a higher program: {preds}"
                reach[preds, p] = True
                waits.append((p, key, preds))
    for r, (members, _) in enumerate(rounds):
        reach[members, n + r] = True

    def closure(r: np.ndarray) -> np.ndarray:
        r = r.copy()
        for k in range(m):  # Floyd–Warshall on booleans
            r |= r[:, k : k + 1] & r[k : k + 1, :]
        return r

    while True:  # an epilogue precedes whatever happens after every participant's signal
        closed = closure(reach)
        grown = reach.copy()
        for r, (members, _) in enumerate(rounds):
            after_all = np.logical_and.reduce(closed[members, :], axis=0)
            after_all[list(members)] = False
            grown[n + r] |= after_all
        if np.array_equal(grown, reach):
            break
        reach = grown
    closed = closure(reach)

    # --- the induction: no other signaller of a count can precede a program waiting on it
    for p, key, preds in waits:
        for s in signallers[key]:
            assert s in preds or s == p or closed[p, s], (
                f"program {p} waits on {key}; program {s} also signals it and is not ordered after {p}")
    # --- the next round on a semaphore starts after the previous round's reset
    for key, indices in round_of_sem.items():
        for before, after in zip(indices, indices[1:]):
            for q in rounds[after][0]:
                assert closed[n + before, q], f"{key}: round of {rounds[after][0]} may start before the reset"

    # --- conflicts
    by_element: dict[tuple[str, int], list[tuple[int, bool]]] = {}
    for node, events in enumerate(accesses):
        for e in events:
            write = e.kind == "store" or (e.kind == "atomic" and e.op.startswith("exch"))
            for idx in np.unique(e.index):
                by_element.setdefault((e.buffer, int(idx)), []).append((node, write))
    conflicts = 0
    for (buffer, idx), users in by_element.items():
        writers = {node for node, write in users if write}
        for w in writers:
            for node in {node for node, _ in users}:
                if node != w:
                    conflicts += 1
                    assert closed[w, node] or closed[node, w], (
                        f"race on {buffer}[{idx}]: {_name(w, n, rounds)} writes, {_name(node, n, rounds)} "
                        f"accesses, unordered")

    # --- barriers inside each program
    for p, events in enumerate(programs):
        stored = False
        after_wait = False
        for e in events:
            if e.kind == "barrier":
                stored = after_wait = False
            elif e.kind == "wait":
                after_wait = True
            elif _is_data(e) and not (e.kind == "atomic" and e.buffer in SEMAPHORES):
                assert not after_wait, f"program {p}: {e.kind} of {e.buffer} after a wait without a CTA barrier"
                stored |= e.kind == "store"
            elif _is_signal(e) or (e.kind == "atomic" and e.buffer in SEMAPHORES and e.op.startswith("add")):
                assert not stored, f"program {p}: release on {e.buffer} after stores without a CTA barrier"
    return {"programs": n, "rounds": len(rounds), "waits": len(waits), "conflicting pairs": conflicts}


def _name(node: int, n: int, rounds) -> str:
    return f"program {node}" if node < n else f"the epilogue of the round of programs {rounds[node - n][0]}"
