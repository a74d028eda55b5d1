"""simfuse kernels: one ``@jit`` step / reset / observe function per environment, one file each.

The single-step launcher and the fused K-step rollout call the same step function, so the
dynamics have one source.  :mod:`.dispatch` picks an environment's functions by a
compile-time id; :mod:`.rollout` is the one kernel that steps, samples actions, auto-resets
and writes trajectories; :mod:`.episode` holds the auto-reset and statistics bookkeeping both
rollout kernels share; :mod:`.policy` evaluates an MLP policy inside the kernel; :mod:`.chain`
is the configurable-complexity simulator with its own tile-shaped state.
"""
