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
