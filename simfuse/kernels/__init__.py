"""simfuse kernels: one ``@jit`` step / reset / observe function per environment, one file each.

The single-step launcher and the fused K-step rollout call the same step function, so the
dynamics have one source.  :mod:`.dispatch` picks an environment's functions by a
compile-time id; :mod:`.rollout` is the one kernel that steps, samples actions, auto-resets
and writes trajectories; :mod:`.policy` evaluates an MLP policy in registers; :mod:`.chain`
is the configurable-complexity simulator with its own tile-shaped state.
"""
