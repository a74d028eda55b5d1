"""fusecore's own kernels: the demonstration of the kernel-building core."""
