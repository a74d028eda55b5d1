"""The Graph Transformer with edge features called again and again on the same inputs: each call's output and gradients
against the float64 oracle, to catch an error that comes and goes (a race, a read of memory no kernel wrote: the
caching allocator hands back the previous call's blocks, so such a read can look right the second time).

    python3 tests/gnnfuse/repeat_grads.py [--seed S] [--repeats R] [--dtype fp32|bf16] [--scrub] [--set NAME=VALUE,...]

The inputs are those of ``test_attention_family.py``'s
``test_unrolled_forward_light_rows_with_edges_every_weight_form`` at ``FUSEKIT_TEST_SEED=S`` (rows of in-degree 1 to
13, then the corner-case graph; schedule options ``light_max_degree=16, split_degree=16, tile_elements=256``). Each
line: the schedule's multiprocessor count (``one_sm``: one, as the test patches it, so that no light width class is
merged into the next; else the device's), the forward's light form (``None``: the tile form; 0 / 1 / 2: the unrolled
form with ``LIGHT_UNROLLED_EDGE_FORM``), the graph, and the relative errors of the output and of the gradients of q,
k, v, edge_attr, W_e; below a gradient further off than ``LIST_ABOVE`` (per dtype), its six rows furthest off (node
id, degree, error, the reference row's norm). ``--scrub`` fills the allocator's free blocks with NaN before each
call, which tells an element no kernel writes (NaN every time) from a race (wrong now and then); ``--set`` changes
gnnfuse settings for every call (``ab_layers.py``'s row syntax: ``LIGHT_UNROLLED_FLOAT32_WARPS={...}`` ...).

Session 45 (H200, seed 3830403486): with one multiprocessor, the first call of three of the four forms put 2.8-6.0%
into the gradient of k or of v of the corner-case graph, the repeats of a form none; with the device's count, none
(``benchmarks/results/H200/gnn-repeat-grads.s45c5.log``). On the CPU (interpreter) no call errs, whatever the order
the programs of a grid run in. The cause, read from the sm_90 PTX: the source pass's in-place ``α'`` store raced
other warps' loads of the score term it replaces; fixed by a barrier (``attention_backward.replace_terms``,
``test_sm90_terms_order.py``); session 46 ran this tool on the GPU with the fix (``gnn-repeat-grads.s46c2.log``,
``--scrub``): every call of every form, one multiprocessor or the device's, within 4.2e-7.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ab_layers import apply, parse  # noqa: E402
from gnn_testing import corner_case_edges  # noqa: E402
from test_attention_family import OPS, make_leaves  # noqa: E402

import gnnfuse.schedule  # noqa: E402
from fusecore.testing import rel_error, test_device  # noqa: E402
from gnnfuse import Graph, ScheduleOptions, ops  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LEAVES = ("q", "k", "v", "edge_attr", "W_e")
# A gradient further off than this gets its worst rows listed: well above each dtype's ordinary error on these inputs
# (float32 3e-7, bfloat16 2e-3 on the H200, session 46) and well below the race's 3-6% (session 45).
LIST_ABOVE = {torch.float32: 1e-4, torch.bfloat16: 8e-3}


def scrub(device) -> None:
    """Fill the caching allocator's free blocks with NaN (small and large pools: many buffers of 512 B to 1 MiB,
    filled, then freed), so that an output element no kernel writes reads NaN, not a previous call's value."""
    held = [torch.full((size // 4,), float("nan"), device=device) for size in (512, 4096, 32768, 262144, 1 << 20)
            for _ in range(64)]
    del held


def errors(seed: int, form: int | None, one_sm: bool, pick: int, dtype: torch.dtype, device,
           scrubbed: bool = False) -> list[float]:
    """Relative errors (output, then each leaf's gradient) of graph ``pick`` (0: the degree rows, 1: the corner-case
    graph), its inputs drawn as the test draws them."""
    ops.LIGHT_FORWARD_UNROLLED_WITH_EDGES = form is not None
    ops.LIGHT_UNROLLED_EDGE_FORM = 1 if form is None else form
    facts = gnnfuse.schedule.device_facts
    if one_sm:
        gnnfuse.schedule.device_facts = lambda _: SimpleNamespace(sm_count=1)
    try:
        gen = torch.Generator().manual_seed(seed)
        degrees = torch.tensor([1, 2, 3, 5, 9, 13] * 6)
        dst = torch.repeat_interleave(torch.arange(degrees.numel()), degrees)
        src = torch.randint(0, degrees.numel() + 3, (dst.numel(),), generator=gen)
        options = ScheduleOptions(light_max_degree=16, split_degree=16, tile_elements=256)
        makers = (lambda: Graph(torch.stack([src, dst]).to(device), degrees.numel() + 3),
                  lambda: Graph(corner_case_edges(gen).to(device), 29))
        for k, make in enumerate(makers):
            graph = make()
            leaves = make_leaves(OPS["transformer+edge"], graph, 3, 5, dtype, device, gen)
            fused = [t.detach().clone().requires_grad_(True) for t in leaves]
            if scrubbed:
                scrub(device)
            out = ops.transformer_attention(graph, *fused, schedule=options, dropout=0.0)
            grad_out = torch.randn(out.shape, generator=gen).to(device, dtype)
            if k != pick:
                continue
            grads = torch.autograd.grad(out, fused, grad_out)
            refs = [t.detach().cpu().double().requires_grad_(True) for t in leaves]
            ref = OPS["transformer+edge"].oracle(graph.to("cpu"), *refs, dropout=0.0, seed=0, offset=5)
            ref_grads = torch.autograd.grad(ref, refs, grad_out.cpu().double())
            errs = [rel_error(out, ref)] + [rel_error(g, r) for g, r in zip(grads, ref_grads)]
            for name, err, g, r in zip(LEAVES, errs[1:], grads, ref_grads):
                if err > LIST_ABOVE[dtype]:  # the rows that are off: node (or edge) id, in/out-degree, error, norm
                    diff = (g.detach().double().cpu() - r).flatten(1).norm(dim=1)
                    worst = diff.argsort(descending=True)[:6].tolist()
                    deg = graph.out_degree if name in ("k", "v") else graph.in_degree
                    print(f"    {name}: rows " + ", ".join(
                        f"{i} (degree {int(deg[i]) if name in ('q', 'k', 'v') else '-'}, error {diff[i]:.2e}, "
                        f"norm {r.flatten(1)[i].norm():.2e})" for i in worst), flush=True)
            return errs
        raise ValueError(f"graph {pick}: expected 0 or 1")
    finally:
        gnnfuse.schedule.device_facts = facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=3830403486)
    parser.add_argument("--repeats", type=int, default=3, help="calls of the unrolled whole-tile form")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32")
    parser.add_argument("--scrub", action="store_true", help="NaN in the allocator's free blocks before each call")
    parser.add_argument("--set", default="", metavar="NAME=VALUE,...",
                        help="gnnfuse settings for every call, as ab_layers.py's rows take them")
    args = parser.parse_args(argv)
    _, _, settings = parse(f"tr-fp32:{args.set}")
    apply(settings)
    device = test_device()
    for one_sm in (True, False):
        for form in (None, 0, 1, *[2] * args.repeats):
            for pick in (1, 0):
                e = errors(args.seed, form, one_sm, pick, DTYPES[args.dtype], device, args.scrub)
                print(f"one_sm={one_sm} form={form} graph={pick}: out {e[0]:.2e} grads "
                      + " ".join(f"{x:.2e}" for x in e[1:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
