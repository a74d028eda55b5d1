"""fusekit's cross-domain benchmark suite: ``python -m benchmarks`` (or ``fusekit-bench``)."""
