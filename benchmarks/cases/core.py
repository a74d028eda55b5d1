"""fusecore's demonstration kernel: K fused Langevin steps against the per-step torch loop."""

import torch

from benchmarks.registry import Context, case
from fusecore.demo import langevin, langevin_bytes, langevin_reference, langevin_unfused


@case("core", "langevin", baseline="torch per-step loop")
def langevin_case(ctx: Context) -> None:
    """Fused K-step noisy oscillator vs one torch launch sequence per step."""
    sizes = [(4099, 8)] if ctx.quick else [(1 << 20, 64), (1 << 24, 64)]
    for n, steps in sizes:
        gen = torch.Generator(device=ctx.device).manual_seed(n)
        x = torch.randn(n, device=ctx.device, generator=gen)
        v = torch.randn(n, device=ctx.device, generator=gen)
        variant = f"n={n},K={steps}"
        # correctness on a slice, against the float64 oracle with identical noise
        m = min(n, 4099)
        fx, fv, fe = langevin(x[:m], v[:m], steps, seed=11)
        rx, rv, re = langevin_reference(x[:m].cpu(), v[:m].cpu(), steps, seed=11, dtype=torch.float64)
        ctx.check(f"{variant} x", fx.cpu(), rx, 1e-4)
        ctx.check(f"{variant} energy", fe.cpu(), re, 1e-4)
        params = {"n": n, "steps": steps}
        for impl, fn in (
            ("torch per-step loop", lambda: langevin_unfused(x, v, steps)),
            ("fused (fusecore)", lambda: langevin(x, v, steps, seed=11)),
        ):
            record = ctx.time(impl, fn, bytes_moved=langevin_bytes(n), params=dict(params), variant=variant)
            # The fused kernel is bound by its arithmetic (10-round Philox + Box-Muller per
            # element-step), not by the 20 B/element it moves: report the step rate too.
            record.params["element_steps_per_s"] = n * steps / (record.median_ms / 1e3)


@case("core", "fast_launch", baseline="Triton launch path", headline=False)
def fast_launch_case(ctx: Context) -> None:
    """Host time of compiled launches: Triton's per-call dispatch against fusecore's direct path.

    Rows timed back to back (calls issued one after another, wall time per call; the host's
    issue time per call in params host_ms): the demo op at a size whose kernel takes a few
    microseconds (host-bound: the row is the launch path's cost), and a GAT layer (bf16, 8 heads
    x 16) on a power-law graph shaped like ogbn-arxiv, forward and training step.  Both paths
    must give the same outputs (checked)."""
    import gnnfuse
    from fusecore.fast_launch import fast_launch_enabled, set_fast_launch
    from gnnfuse.datasets import power_law_graph
    from gnnfuse.nn import GATConv

    nodes, edges = (300, 2_400) if ctx.quick else (169_343, 1_350_000)
    graph = gnnfuse.Graph(power_law_graph(nodes, edges, max(nodes // 13, 2), seed=0).to(ctx.device), nodes)
    gen = torch.Generator(device=ctx.device).manual_seed(1)
    dtype = torch.bfloat16 if ctx.gpu else torch.float32
    layer = GATConv(128, 16, num_heads=8).to(device=ctx.device, dtype=dtype)
    feats = torch.randn(nodes, 128, device=ctx.device, dtype=dtype, generator=gen)
    grad = torch.randn(nodes, 8, 16, device=ctx.device, dtype=dtype, generator=gen)
    x = torch.randn(4096, device=ctx.device, generator=gen)
    v = torch.randn(4096, device=ctx.device, generator=gen)
    params = list(layer.parameters())

    def forward():
        with torch.no_grad():
            return layer(graph, feats)

    def train_step():
        for p in params:
            p.grad = None
        layer(graph, feats).backward(grad)
        return params[0].grad

    label = f"{'arxiv-like' if not ctx.quick else f'power-law {nodes}'},{str(dtype).replace('torch.', '')}"
    runs = {
        "langevin[n=4096,K=1]": lambda: langevin(x, v, 1, seed=3)[0],
        f"gat_forward[{label}]": forward,
        f"gat_train_step[{label}]": train_step,
    }
    before = fast_launch_enabled()
    try:
        for variant, fn in runs.items():
            outs = []
            for impl, enabled in (("Triton launch path", False), ("fusecore direct launch", True)):
                set_fast_launch(enabled)
                fn()  # first launch of each specialisation: compiles, records the launcher
                outs.append(fn().float().clone())
                ctx.time(impl, fn, variant=variant, params={"fast_launch": enabled}, back_to_back=True)
            ctx.check(f"{variant}: direct launch equals Triton's", outs[1], outs[0], 1e-6)
    finally:
        set_fast_launch(before)


@case("core", "column_sum", baseline="torch .sum(0)")
def column_sum_case(ctx: Context) -> None:
    """A linear layer's bias gradient ``Σ_n ∂y_n`` of a ``[N, 128]`` gradient (a Graph Transformer
    projection on the arxiv-like graph): fusecore.linear.column_sum against torch's reduction, which
    nn.Linear's backward calls; bytes moved = the gradient read once."""
    from fusecore.linear import column_sum

    rows = 4099 if ctx.quick else 169_343
    gen = torch.Generator(device=ctx.device).manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(rows, 128, device=ctx.device, generator=gen).to(dtype)
        variant = f"{rows}x128,{str(dtype).replace('torch.', '')}"
        ctx.check(f"{variant} column_sum", column_sum(x).cpu(), x.double().sum(0).cpu(), 2e-2 if dtype != torch.float32
                  else 1e-5)
        for impl, fn in (("torch .sum(0)", lambda: x.sum(0)), ("column_sum (fusecore)", lambda: column_sum(x))):
            ctx.time(impl, fn, bytes_moved=x.numel() * x.element_size(), variant=variant, params={"rows": rows})


@case("core", "linears", baseline="one F.linear per map")
def linears_case(ctx: Context) -> None:
    """A layer's G projections of one input (a Graph Transformer's query, key, value and skip: G = 4;
    GATv2's source and destination: G = 2) on the arxiv-like graph's features ``[169 343, 128]`` →
    ``[169 343, 128]`` each, bfloat16 and float32: fusecore.linear.linears (one product of the stacked
    weights, ``x`` read once, the outputs its column blocks) against one cuBLAS product per map (``x`` read G
    times), forward; and the backward of each as gnnfuse's attention ops drive it (``variant`` ``…,bwd``):
    one ``[N, G·out]`` gradient through the stacked product (one ``∂x`` and one ``∂W`` product, one bias
    column sum) against G gradients through the per-map products.  Bytes moved = ``x`` once, the G outputs
    (gradients), weights and biases (the backward: the gradients and ``x`` read once, ``∂x`` written, the
    weights read, ``∂W`` and ``∂b`` written — the fewest bytes a backward that fuses ∂x and ∂W must move;
    before session 38 ``x`` was counted twice and the weights' read not at all: earlier rows' floors are
    17-25% higher)."""
    import torch.nn.functional as F

    from fusecore.linear import linear, linears

    rows, feats, out = (4099, 128, 128) if ctx.quick else (169_343, 128, 128)
    gen = torch.Generator(device=ctx.device).manual_seed(7)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(rows, feats, device=ctx.device, generator=gen).to(dtype)
        size = x.element_size()
        name = str(dtype).replace("torch.", "")
        for group in (4, 2):
            weights = [(torch.randn(out, feats, device=ctx.device, generator=gen) / feats ** 0.5).to(dtype)
                       .requires_grad_() for _ in range(group)]
            biases = [torch.randn(out, device=ctx.device, generator=gen).to(dtype).requires_grad_()
                      for _ in range(group)]
            params = {"rows": rows, "in": feats, "out": out, "group": group}
            variant = f"G={group},{rows}x{feats}->{out},{name}"
            moved = (rows * feats + group * (rows * out + out * feats + out)) * size
            tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
            with torch.no_grad():
                want = [F.linear(x, w, b) for w, b in zip(weights, biases)]
                got = linears(x, weights, biases)
                for g in range(group):
                    ctx.check(f"{variant} map {g}", got[g].float().cpu(), want[g].double().cpu(), tol)
                ctx.time("one F.linear per map", lambda: [F.linear(x, w, b) for w, b in zip(weights, biases)],
                         bytes_moved=moved, variant=variant, params=dict(params), cuda_graph=ctx.gpu)
                ctx.time("linears (fusecore)", lambda: linears(x, weights, biases), bytes_moved=moved,
                         variant=variant, params=dict(params), cuda_graph=ctx.gpu)
            grads = [torch.randn(rows, out, device=ctx.device, generator=gen).to(dtype) for _ in range(group)]
            grad = torch.cat(grads, dim=1)
            stacked_w, stacked_b = torch.cat(weights).detach().requires_grad_(), torch.cat(biases).detach()
            stacked_b.requires_grad_()
            leaf = x.detach().requires_grad_()
            ys = [F.linear(leaf, w, b) for w, b in zip(weights, biases)]
            y = linear(leaf, stacked_w, stacked_b)
            back_moved = (group * rows * out + 2 * rows * feats + 2 * group * out * feats + group * out) * size
            ctx.time("one F.linear per map", lambda: torch.autograd.grad(ys, [leaf, *weights, *biases], grads,
                                                                         retain_graph=True),
                     bytes_moved=back_moved, variant=variant + ",bwd", params=dict(params))
            ctx.time("linears (fusecore)", lambda: torch.autograd.grad(y, [leaf, stacked_w, stacked_b], grad,
                                                                       retain_graph=True),
                     bytes_moved=back_moved, variant=variant + ",bwd", params=dict(params))
            per_map = torch.autograd.grad(ys, [leaf], grads, retain_graph=True)[0]
            stacked = torch.autograd.grad(y, [leaf], grad, retain_graph=True)[0]
            ctx.check(f"{variant} ∂x", stacked.float().cpu(), per_map.double().cpu(), tol)
