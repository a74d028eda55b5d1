"""OscillatorSwarm-v0: S particles on springs, the simulator of constant arithmetic per state byte.

Env i holds S positions x_j and velocities v_j (state size 2S, set by the caller) and one
action a ∈ [−1, 1], a common force 2a on every particle.  Each particle is tied to the origin
by a spring and to the swarm's centre of mass by another, and damped.  One semi-implicit
Euler step (dt = 0.05)::

    c    = (1/S) Σ_j x_j
    α_j  = −4 x_j − 2 (x_j − c) − 0.1 v_j + 2a
    v_j' = v_j + dt α_j,    x_j' = x_j + dt v_j'
    r    = −(1/S) Σ_j x_j'²

No termination (truncation by the step limit).  Start state x_j ~ U[−0.5, 0.5), v_j = 0 (the
draws of PendulumChain-v0's angles, :func:`simfuse.kernels.chain.store_start_states`).
Observation: (x_0..x_{S−1}, v_0..v_{S−1}).

Why this simulator: every state element costs the fused kernel five float instructions per
step (two fused multiply-adds for v', one for x', an addition to each of the two row sums and
a square; :func:`swarm_step`), with the per-env work of a step (~60 instructions: the policy
draw, flags, counters) spread over the env's S particles, which one thread holds in registers
(:mod:`simfuse.kernels.chain`): 65 SASS instructions per env-step at S = 1, 10 per
element-step at S = 16, 8-8.5 from S = 32 on (sm_90).  The unfused PyTorch step streams the
[N, S] state through fourteen elementwise kernels (120 B per element, 160 B with the loop's
truncation and reset; see benchmarks/cases/sim.py).  So as S grows the unfused loop's memory
traffic grows while the fused kernel's cost per element falls to a few instructions: the
ratio of the two is what Gleeson et al. plot against the simulator's memory traffic.
(PendulumChain-v0 pays a sine and a floor division per element.)  Memory traffic of the fused
rollout: the state read and written once per launch (16 S B per env), 8S B of observation
per env-step when the trajectory is written, nothing per step with statistics only.
"""

import triton.language as tl

from fusecore.backend import jit

DT: tl.constexpr = tl.constexpr(0.05)
SPRING: tl.constexpr = tl.constexpr(4.0)
COUPLING: tl.constexpr = tl.constexpr(2.0)
DAMPING: tl.constexpr = tl.constexpr(0.1)


@jit
def swarm_step(x, v, action, L: tl.constexpr, L_PAD: tl.constexpr):
    """One step of every swarm: x, v [L_PAD, BLOCK] (rows ≥ L zero), action [BLOCK]; returns (x', v', reward).

    The update is regrouped per env so that each element costs two fused multiply-adds for
    v' and one for x'::

        v' = (1 − dt D) v − dt (K + C) x + dt (C c + 2a),    x' = x + dt v'

    (K, C, D the spring, coupling and damping constants); with the two row sums (c and the
    reward) that is five float instructions per element-step.
    """
    centre = tl.sum(x, axis=0) * (1.0 / L)  # padding rows hold zeros
    force = 2.0 * tl.minimum(tl.maximum(action, -1.0), 1.0)
    drive = DT * tl.fma(centre, COUPLING, force)
    v = tl.fma(v, 1.0 - DT * DAMPING, tl.fma(x, -DT * (SPRING + COUPLING), drive[None, :]))
    if L < L_PAD:  # keep the padding rows zero
        v = tl.where(tl.arange(0, L_PAD)[:, None] < L, v, 0.0)
    x = tl.fma(v, DT, x)
    reward = -tl.sum(x * x, axis=0) * (1.0 / L)
    return x, v, reward
