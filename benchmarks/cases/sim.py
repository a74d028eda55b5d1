"""simfuse: env-steps per second of fused rollouts against per-step loops and Gymnasium.

Each implementation does the same work, K steps of N CartPole-v1 envs with the trajectory
(obs, action, reward, terminated, truncated) written to device memory, except where its
name says otherwise ("stats only": episode statistics; Gymnasium: numpy on the CPU).
``params["env_steps_per_s"]`` is N K / median time.  The floor counts 26 B per env-step
(16 B observation, 4 B action, 4 B reward, 2 B flags).  Rows are timed with CUDA events
around Python calls (``do_bench``), except those named "CUDA-graph replays" and the A/B of
``sim/tuning`` and both sides of ``sim/chain``, which replay a captured graph (GPU time only).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import simfuse
from benchmarks.registry import Context, case, plot
from fusecore import use_reference
from simfuse import reference
from simfuse.specs import CARTPOLE, ENV_DEFS

TRAJECTORY_BYTES = {name: 4 * d.obs_dim + 10 for name, d in ENV_DEFS.items()}


def _rate(record, n: int, k: int) -> None:
    record.params["env_steps_per_s"] = n * k / (record.median_ms / 1e3)


def _check_against_reference(ctx: Context, name: str, variant: str, n: int) -> None:
    """Fused rollout vs the unfused PyTorch reference (same Philox draws, same math), 16 steps of n envs.

    n = 67 uses the block size of 4,096 envs, so the CartPole check reuses that compiled kernel.
    """
    k = 16
    fused = simfuse.make_vec(name, n, max_episode_steps=10, device=ctx.device)
    oracle = simfuse.make_vec(name, n, max_episode_steps=10, device=ctx.device)
    fused.reset(seed=5)
    oracle.reset(seed=5)
    traj = fused.rollout("random", num_steps=k)
    with use_reference():
        ref = oracle.rollout("random", num_steps=k)
    ctx.check(f"{variant} obs", traj.obs.cpu(), ref.obs.cpu(), 1e-4)
    ctx.check(f"{variant} rewards", traj.rewards.cpu(), ref.rewards.cpu(), 1e-5)
    flags = (traj.terminated != ref.terminated) | (traj.truncated != ref.truncated)
    ctx.check(f"{variant} flags", flags.float().cpu(), torch.zeros(flags.shape), 1e-9)  # any mismatch fails


@case("sim", "cartpole", baseline="torch per-step loop")
def cartpole_case(ctx: Context) -> None:
    """CartPole-v1 K-step rollouts: fused (random / given / 2x64 MLP / stats only) vs per-step loops."""
    sizes = [(257, 8)] if ctx.quick else [(4096, 512), (65536, 256), (1 << 20, 64)]
    _check_against_reference(ctx, "CartPole-v1", "reference", 67)
    for n, k in sizes:
        variant = f"n={n},K={k}"
        env = simfuse.make_vec("CartPole-v1", n, device=ctx.device)
        env.reset(seed=0)
        gen = torch.Generator(device=ctx.device).manual_seed(n)
        actions = torch.randint(0, 2, (k, n), device=ctx.device, dtype=torch.int32, generator=gen)
        actor = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                    torch.nn.Linear(64, 2)).to(ctx.device)
        critic = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                     torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(ctx.device)
        mlp_fast = simfuse.MLPPolicy(actor, precision="tf32")
        mlp_fast_critic = simfuse.MLPPolicy(actor, critic, precision="tf32")
        mlp_half = simfuse.MLPPolicy(actor, precision="bf16")
        mlp_half_critic = simfuse.MLPPolicy(actor, critic, precision="bf16")
        mlp_exact = simfuse.MLPPolicy(actor, precision="ieee")
        state = reference.start_state(CARTPOLE, torch.rand((4, n), device=ctx.device, generator=gen))
        steps = torch.zeros(n, dtype=torch.int32, device=ctx.device)

        def step_loop():
            for t in range(k):
                env.step(actions[t])

        traj_bytes = n * k * TRAJECTORY_BYTES["CartPole-v1"]
        runs = [
            ("torch per-step loop", lambda: reference.unfused_random_rollout(CARTPOLE, state, steps, k, 500),
             traj_bytes),
            # each step reads its 4-byte action and writes obs, reward and flags: the trajectory's bytes
            ("step() python loop", step_loop, traj_bytes),
            ("fused rollout, random", lambda: env.rollout("random", num_steps=k), traj_bytes),
            ("fused rollout, given actions", lambda: env.rollout(actions), traj_bytes + 4 * n * k),
            ("fused rollout, 2x64 MLP actor (tf32)", lambda: env.rollout(mlp_fast, num_steps=k),
             traj_bytes + 4 * n * k),
            ("fused rollout, 2x64 MLP actor+critic (tf32)", lambda: env.rollout(mlp_fast_critic, num_steps=k),
             traj_bytes + 8 * n * k),
            ("fused rollout, 2x64 MLP actor (bf16)", lambda: env.rollout(mlp_half, num_steps=k),
             traj_bytes + 4 * n * k),
            ("fused rollout, 2x64 MLP actor+critic (bf16)", lambda: env.rollout(mlp_half_critic, num_steps=k),
             traj_bytes + 8 * n * k),
            # IEEE float32 products run on the CUDA cores: bounded near 5e9 env-steps/s on an H200
            ("fused rollout, 2x64 MLP actor (fp32)", lambda: env.rollout(mlp_exact, num_steps=k),
             traj_bytes + 4 * n * k),
            ("fused stats only, random", lambda: env.rollout("random", num_steps=k, stats_only=True), 28 * n),
        ]
        if ctx.gpu and n == 65536:
            compiled_step = torch.compile(reference.unfused_step, dynamic=False)
            runs.append(("torch.compile'd step, per-step loop",
                         lambda: reference.unfused_random_rollout(CARTPOLE, state, steps, k, 500,
                                                                  step_fn=compiled_step),
                         traj_bytes))
        for impl, fn, nbytes in runs:
            try:
                record = ctx.time(impl, fn, bytes_moved=nbytes, params={"num_envs": n, "steps": k}, variant=variant)
            except Exception as exc:  # torch.compile may be unavailable; the others must still run
                if impl.startswith("torch.compile"):
                    print(f"[sim] {impl} skipped: {type(exc).__name__}: {exc}")
                    continue
                raise
            _rate(record, n, k)
        # the kernel alone: at 4,096 envs the Python launch path of rollout() is as long as the kernel
        _rate(ctx.time("fused rollout, random (CUDA-graph replays)", lambda: env.rollout("random", num_steps=k),
                       bytes_moved=traj_bytes, params={"num_envs": n, "steps": k}, variant=variant, cuda_graph=True),
              n, k)
    _gymnasium_baseline(ctx)
    _gymnax_baseline(ctx)


def _gymnasium_baseline(ctx: Context) -> None:
    """Gymnasium's own numpy CartPoleVectorEnv on the CPU at the sizes of TARGETS.md."""
    import gymnasium

    for n in ([64] if ctx.quick else [1024, 16384]):
        k = 8 if ctx.quick else 64
        env = gymnasium.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
        env.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, size=(k, n))

        def loop():
            for t in range(k):
                env.step(actions[t])

        record = ctx.time("Gymnasium CartPoleVectorEnv (numpy, CPU)", loop, params={"num_envs": n, "steps": k},
                          variant=f"gymnasium n={n},K={k}")
        _rate(record, n, k)


def _gymnax_baseline(ctx: Context) -> None:
    """gymnax (JAX) when installed: jit + lax.scan random rollout, no trajectory kept."""
    try:
        import gymnax  # noqa: F401
        import jax
    except ImportError:
        print("[sim] gymnax not installed: its baseline is skipped")
        return
    env, params = gymnax.make("CartPole-v1")
    n, k = (256, 8) if ctx.quick else (65536, 256)

    @jax.jit
    def run(key):
        keys = jax.random.split(key, n)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)

        def body(carry, _):
            state, key = carry
            key, k_act, k_step = jax.random.split(key, 3)
            acts = jax.random.randint(k_act, (n,), 0, 2)
            _, state, reward, done, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_step, n), state, acts, params)
            return (state, key), reward.sum()

        return jax.lax.scan(body, (state, key), None, length=k)[1].sum()

    key = jax.random.PRNGKey(0)
    run(key).block_until_ready()
    record = ctx.time("gymnax (JAX scan, no trajectory)", lambda: run(key).block_until_ready(),
                      params={"num_envs": n, "steps": k}, variant=f"n={n},K={k}")
    _rate(record, n, k)


@case("sim", "tuning", baseline="default launch", headline=False)
def tuning_case(ctx: Context) -> None:
    """Launch variants of the CartPole rollout kernel, each against the default choice.

    The first H200 sweep (16:45 run of session 2: envs per program 2 .. 256, policy and reset
    draws eager or lazy, MLP blocks and warps in bf16 / tf32 / ieee) set the defaults in
    :class:`simfuse.ops.Tuning` and :data:`simfuse.ops.MLP_LAUNCH`.  The variants now:

    * random policy, 4,096 envs x 512 steps (latency-bound; default 16 envs per program, each
      env's next two start states drawn every four steps): one start state ahead and a
      per-step test for a second reset; the steps one per loop iteration with the policy-draw
      test every step instead of unrolled groups of four; 8 envs per program (grouped or not);
    * random policy, 1 M envs x 64 steps (default 128 envs per program, 4 warps, one start
      state ahead): two start states ahead (no per-step test); 64 envs per program; 32 envs
      per program (one warp: the per-step test is a warp vote);

    Second mid run of this session (H200, CUDA-graph replays, before the default took two
    start states ahead below 64 envs per program): 4,096 envs 0.0872 ms, two ahead 0.0811,
    one step per iteration 0.0988, 8 envs per program 0.0814 (one step per iteration
    0.0996); 1 M envs 0.5013 ms, two ahead 0.5400, 64 envs 0.5049, 32 envs in one warp 0.5539.

    The random-policy variants are timed as CUDA-graph replays (kernel time only: the Python
    launch path is the same for all, and at 4,096 envs it is as long as the kernel).
    """
    from simfuse import ops

    groups = [(129, 8, [("8 envs/program", {"env_block": 8}),
                        ("one step per iteration", {"group_random_draws": False}),
                        ("two start states ahead", {"two_start_states_ahead": True})])]
    if not ctx.quick:
        groups = [
            (4096, 512, [("one start state ahead and a per-step test", {"two_start_states_ahead": False}),
                         ("one step per iteration (draw test every step)", {"group_random_draws": False}),
                         ("8 envs/program", {"env_block": 8}),
                         ("8 envs/program, one step per iteration", {"env_block": 8, "group_random_draws": False})]),
            (1 << 20, 64, [("two start states ahead (no per-step test)", {"two_start_states_ahead": True}),
                           ("64 envs/program", {"env_block": 64}),
                           ("32 envs/program (one warp)", {"env_block": 32})]),
        ]
    for n, k, variants in groups:
        env = simfuse.make_vec("CartPole-v1", n, device=ctx.device)
        env.reset(seed=0)
        traj_bytes = n * k * TRAJECTORY_BYTES["CartPole-v1"]
        expected = env.rollout("random", num_steps=8).obs
        for impl, overrides in [("default launch", {})] + variants:
            with ops.tuned(**overrides):
                env.reset(seed=0)  # the launch choice must not change a single bit
                ctx.check(f"{impl}: obs", env.rollout("random", num_steps=8).obs.cpu(), expected.cpu(), 1e-9)

                def run(o=overrides):
                    with ops.tuned(**o):
                        env.rollout("random", num_steps=k)

                # replayed from a CUDA graph: the kernel's time, without the Python launch path
                _rate(ctx.time(impl, run, bytes_moved=traj_bytes, params={"num_envs": n, "steps": k, **overrides},
                               variant=f"random,n={n},K={k}", cuda_graph=True), n, k)


@case("sim", "mlp_fp32", baseline="torch per-step loop", headline=False)
def mlp_fp32_case(ctx: Context) -> None:
    """The 2x64 MLP actor with float32 ("ieee") products alone, a short check of that launch.

    The final run of this session measured it 12x slower than the first mid run (4,096 x 512:
    36.2 ms against 3.10; tf32 and bf16 1.15x slower at 4,096 envs): the start states then
    carried from step to step (for the random and given policies they are drawn ahead) take
    registers its operand tiles need.  MLP policies below 64 envs per program now draw them
    when some env resets, as before.
    """
    sizes = [(257, 8)] if ctx.quick else [(4096, 512), (65536, 256)]
    for n, k in sizes:
        env = simfuse.make_vec("CartPole-v1", n, device=ctx.device)
        env.reset(seed=0)
        torch.manual_seed(n)
        actor = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                              nn.Linear(64, 2)).to(ctx.device)
        policy = simfuse.MLPPolicy(actor, precision="ieee")
        traj = env.rollout(policy, num_steps=4)
        with torch.no_grad():
            want = torch.log_softmax(actor(traj.obs), -1).gather(-1, traj.actions.long()[..., None])[..., 0]
        ctx.check(f"n={n} log-probs", traj.log_probs.cpu(), want.cpu(), 1e-4)
        state = reference.start_state(CARTPOLE, torch.rand((4, n), device=ctx.device))
        steps = torch.zeros(n, dtype=torch.int32, device=ctx.device)
        traj_bytes = n * k * TRAJECTORY_BYTES["CartPole-v1"]
        variant = f"n={n},K={k}"
        for impl, fn, nbytes in (
            ("torch per-step loop", lambda: reference.unfused_random_rollout(CARTPOLE, state, steps, k, 500),
             traj_bytes),
            ("fused rollout, 2x64 MLP actor (fp32)", lambda: env.rollout(policy, num_steps=k), traj_bytes + 4 * n * k),
        ):
            _rate(ctx.time(impl, fn, bytes_moved=nbytes, params={"num_envs": n, "steps": k}, variant=variant), n, k)


def _classic_rollouts(ctx: Context, names: list[str]) -> None:
    """Fused random rollout vs the unfused torch loop for each of ``names``, 4,096 envs x 64 steps.

    4,096 envs take the block size of the 67-env check (16 envs per program), so each env
    compiles one rollout kernel: on a fresh machine its compile, not the timing, is the
    case's cost.
    """
    n, k = (129, 8) if ctx.quick else (4096, 64)
    for name in names:
        spec = ENV_DEFS[name]
        # few envs: float32 rounding could flip a termination flag somewhere in a large batch
        _check_against_reference(ctx, name, name, 67)
        env = simfuse.make_vec(name, n, device=ctx.device)
        env.reset(seed=1)
        gen = torch.Generator(device=ctx.device).manual_seed(1)
        state = reference.start_state(spec, torch.rand((4, n), device=ctx.device, generator=gen))
        steps = torch.zeros(n, dtype=torch.int32, device=ctx.device)
        nbytes = n * k * TRAJECTORY_BYTES[name]
        params = {"num_envs": n, "steps": k}
        variant = f"{name},n={n},K={k}"
        for impl, fn in (
            ("torch per-step loop",
             lambda: reference.unfused_random_rollout(spec, state, steps, k, spec.max_episode_steps)),
            ("fused rollout, random", lambda: env.rollout("random", num_steps=k)),
        ):
            _rate(ctx.time(impl, fn, bytes_moved=nbytes, params=dict(params), variant=variant), n, k)


@case("sim", "classic", baseline="torch per-step loop")
def classic_case(ctx: Context) -> None:
    """CartPole-v1, Pendulum-v1 and both MountainCars: fused random rollout vs the unfused torch loop.

    17.4 s on a fresh H200 machine (session 4; four compiles, four loops of ~30 ms a call).
    Acrobot-v1 is the case ``sim/acrobot``.
    """
    _classic_rollouts(ctx, [name for name in ENV_DEFS if name != "Acrobot-v1"])


@case("sim", "acrobot", baseline="torch per-step loop")
def acrobot_case(ctx: Context) -> None:
    """Acrobot-v1: fused random rollout vs the unfused torch loop.

    A case of its own for its compile time: Triton's layout pass (``TritonGPUCoalesce``) takes
    ~50 s on this project's 2-core CPU machine (triton 3.6; ~30 s with 3.9) over the rollout
    kernel's four unrolled RK4 steps and their stores: the case took 77 s on the GPU machine
    (session 4), nearly all of it that compile.
    """
    _classic_rollouts(ctx, ["Acrobot-v1"])


# Bytes the unfused per-step loop (reference.chain_unfused_random_rollout) moves per state element
# (one particle or link) and step, float32, each elementwise kernel reading its operands and writing
# its result once.  OscillatorSwarm-v0's step (reference.swarm_step) 120 B: eight unary kernels of
# 8 B (x·x reads x once), four binary ones of 12 B, two row means of 4 B; PendulumChain-v0's step
# (reference.chain_step) 160 B: eleven unary kernels (a sine, a remainder, ...) 88, five binary ones
# 60, two row means 8, a zeroed torque 4.  Both loops add 40 B of truncation and reset (fresh draws
# 12, two torch.where 28); writing the observation adds 16 B.
UNFUSED_BYTES_PER_ELEMENT = {"OscillatorSwarm-v0": 160, "PendulumChain-v0": 200}
TILE_SIZE_ARGUMENT = {"OscillatorSwarm-v0": "num_particles", "PendulumChain-v0": "num_links"}


def _chain_sweep(quick: bool) -> list[tuple[str, int, bool]]:
    """(env id, state size, trajectory written) of every point of the complexity case."""
    if quick:
        return [("OscillatorSwarm-v0", 1, False), ("OscillatorSwarm-v0", 4, False), ("OscillatorSwarm-v0", 4, True),
                ("PendulumChain-v0", 4, False)]
    return ([("OscillatorSwarm-v0", size, False) for size in (1, 4, 16, 64)]
            + [("OscillatorSwarm-v0", 16, True), ("PendulumChain-v0", 16, False)])


def _chain_variants(quick: bool) -> dict[tuple[str, int, bool], list[tuple[str, dict]]]:
    """Launch variants timed next to the default at some points: (implementation, ops.tuned overrides)."""
    size, per_thread = (4, 2) if quick else (64, 16)
    return {("OscillatorSwarm-v0", size, False): [
        (f"fused rollout, {per_thread} particles per thread ({size // per_thread} threads per env)",
         {"chain_links_per_thread": per_thread})]}


@case("sim", "chain", baseline="torch per-step loop")
def chain_case(ctx: Context) -> None:
    """Gleeson's curve: fused-over-unfused speedup against the unfused step's memory traffic.

    Gleeson et al.'s mechanism: the unfused loop re-reads and re-writes the simulator's state
    (and every intermediate) once per operation and step; the fused kernel keeps it in
    registers for all K steps.  The simulator is OscillatorSwarm-v0 (S particles per env),
    N = 1,048,576 envs, K = 32 steps, S = 1, 4, 16, 64, both sides timed as CUDA-graph
    replays (GPU time, no Python launch path on either side), the fused kernel writing only
    episode statistics (the fusion effect alone).  The x axis of the plot is the unfused
    step's traffic, N S · 160 B (:data:`UNFUSED_BYTES_PER_ELEMENT`).  Two further points:
    the trajectory written (S = 16) and PendulumChain-v0 (a sine and a floor per link, S = 16).
    At S = 64 a second launch splits each env over four threads of 16 particles instead of
    two of 32 (:data:`simfuse.ops.Tuning` ``chain_links_per_thread``): 11 instructions per
    element-step instead of 8.5 but ~140 registers instead of ~250 (twice the resident warps).

    Expected, from the byte and instruction counts (H200: ~3.6 TB/s reached by elementwise
    kernels, 132 x 4 schedulers x 32 lanes x 1.98 GHz = 3.3e13 thread-instructions/s, ~80%
    of it reached: R ≈ 2.7e13/s):

    * unfused, per step: ~30 kernels (launched from the graph, ~1.5 µs each) plus
      N S · 160 B / 3.6 TB/s: S = 1: 92 µs (launch-bound: 45 µs of launches, 47 µs of
      bytes), 4: 0.23 ms, 16: 0.79 ms, 64: 3.0 ms — per 32-step call 2.9, 7.4, 25, 97 ms;
    * fused, per call: N K S c(S) / R, with c(S) the SASS instructions of the step loop per
      element-step (sm_90, counted: the per-env work of a step, ~60 instructions — a quarter
      of a Philox call for the policy, flags, counters, statistics — over the S ≤ 32
      particles each thread holds, plus ~6 per particle: three FMAs, two row sums, a
      square): c = 65 (S = 1), 22 (4), 10 (16), 8.5 (64, two threads per env), plus the
      state read and written once per call (16 S B per env): 0.09, 0.13, 0.27, 0.97 ms.

    So the speedup should rise 34x → 58x → 93x → 100x: at small S the unfused loop is
    bound by its launches and the fused kernel by its per-env work, and as S grows the per-env
    work amortises while the unfused bytes grow linearly; the curve then flattens at the ratio
    of the per-element costs, 160 B / 3.6 TB/s = 44 ps against (8.5 / R + 16 B / (K · 3.6 TB/s))
    = 0.45 ps.  With the trajectory written the fused kernel moves 8 S B per env-step itself
    (bound near 176 / 8 = 22x at large S); PendulumChain-v0 takes ~50 instructions per
    element-step (a sine with its range reduction, a floor division) against 200 B unfused.

    Measured (H200, session 4, 14.9 s for the case): 34x, 70x, 136x, 89x at S = 1, 4, 16, 64
    (fused 0.088, 0.117, 0.220, 1.126 ms; torch loop 3.0, 8.2, 30.0, 99.7 ms): the curve rises
    as expected up to S = 16 and falls back at 64, where two threads per env with ~250
    registers reach ~50% of the issue rate and the once-per-call state traffic is 1 GiB; 16
    particles per thread there: 1.312 ms (76x).  Trajectory 19.8x, PendulumChain-v0 36x.
    Details: simfuse/README.md.
    """
    from simfuse import ops

    k = 4 if ctx.quick else 32
    envs = 67 if ctx.quick else 1 << 20
    # the unfused loop takes up to ~0.1 s a call: 50 ms of replays per row keep the case near 20 s
    ctx.rep_ms = min(ctx.rep_ms, 50.0)
    variants = _chain_variants(ctx.quick)
    for name, size, write_obs in _chain_sweep(ctx.quick):
        model = simfuse.ENV_CLASSES[name].model
        kwargs = {TILE_SIZE_ARGUMENT[name]: size, "device": ctx.device}
        kind = "trajectory" if write_obs else "stats only"
        variant = f"{name}: N={envs},size={size},{kind}"
        launches = [("fused rollout", {})] + variants.get((name, size, write_obs), [])
        for impl, overrides in launches:
            # the launch that is timed, at 67 envs and with episodes of 3 steps (resets inside
            # the kernel), against the unfused reference semantics: the same compiled kernel
            check, oracle = simfuse.make_vec(name, 67, max_episode_steps=3, **kwargs), \
                simfuse.make_vec(name, 67, max_episode_steps=3, **kwargs)
            check.reset(seed=2)
            oracle.reset(seed=2)
            with ops.tuned(**overrides):
                got = check.rollout("random", num_steps=8, stats_only=not write_obs)
            with use_reference():
                want = oracle.rollout("random", num_steps=8, stats_only=not write_obs)
            ctx.check(f"{variant} {impl}: next obs", got.next_obs.cpu(), want.next_obs.cpu(), 1e-5)
            if write_obs:
                ctx.check(f"{variant} {impl}: obs", got.obs.cpu(), want.obs.cpu(), 1e-5)
            else:
                ctx.check(f"{variant} {impl}: returns", got.return_sum.cpu(), want.return_sum.cpu(), 1e-5)

        env = simfuse.make_vec(name, envs, **kwargs)
        env.reset(seed=2)
        gen = torch.Generator(device=ctx.device).manual_seed(size)
        state = torch.cat([torch.rand((envs, size), device=ctx.device, generator=gen) - 0.5,
                           torch.zeros((envs, size), device=ctx.device)], 1)
        steps = torch.zeros(envs, dtype=torch.int32, device=ctx.device)
        per_element = UNFUSED_BYTES_PER_ELEMENT[name] + (16 if write_obs else 0)
        unfused_bytes = envs * size * per_element  # per step
        # the floor: what the fused kernel must move (state once, or the trajectory)
        nbytes = envs * k * (8 * size + 10) if write_obs else 2 * envs * 8 * size + 28 * envs
        params = {"num_envs": envs, "steps": k, "size": size, "state_floats": 2 * size,
                  "state_bytes": envs * 8 * size, "unfused_bytes_per_step": unfused_bytes,
                  "kind": f"{name}, {kind}"}
        unfused = ctx.time(
            "torch per-step loop",
            lambda: reference.chain_unfused_random_rollout(state, steps, k, 200, write_obs=write_obs, model=model),
            bytes_moved=nbytes, params=dict(params), variant=variant, cuda_graph=True)
        _rate(unfused, envs, k)
        for impl, overrides in launches:
            def fused(o=overrides):
                with ops.tuned(**o):
                    env.rollout("random", num_steps=k, stats_only=not write_obs)

            _rate(ctx.time(impl, fused, bytes_moved=nbytes, params={**params, **overrides}, variant=variant,
                           cuda_graph=True), envs, k)


@plot("sim")
def complexity_plot(records: list, out_dir) -> list:
    """Gleeson's curve: fused-over-unfused speedup against the unfused step's memory traffic."""
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.domain == "sim" and r.case.startswith("chain[") and r.speedup is not None
            and r.implementation == "fused rollout" and "unfused_bytes_per_step" in r.params]
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    kinds = sorted({r.params["kind"] for r in rows})
    for kind, marker in zip(kinds, "os^vD"):
        points = sorted((r.params["unfused_bytes_per_step"] / 2**20, r.speedup, r.params["size"]) for r in rows
                        if r.params["kind"] == kind)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, label=kind)
        for traffic, speedup, size in points:
            ax.annotate(f"S={size}", (traffic, speedup), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("memory traffic of one unfused step (MiB): N x S x bytes per element")
    ax.set_ylabel("speedup over the unfused torch loop (x)")
    gpu = "GPU, unfused loop under a CUDA graph" if any(r.gpu_time for r in rows) else \
        "CPU interpreter, not GPU times"
    ax.set_title(f"Fusion speedup vs the simulator's memory traffic per step\n({gpu})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "sim-complexity.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]
