"""Seeded case families, one module per kernels/ module: ``f(rng, device, launch) -> Case``."""
