"""Production side: Triton kernels of the spec-decode path and the host logic around them."""

