"""Host-side spec-decode logic (no kernels)."""
