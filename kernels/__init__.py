"""Production side: Triton kernels of the spec-decode path and the host logic around them.

``kernels.runtime`` is imported first, whatever submodule is asked for: it must choose between
compiled Triton and the interpreter before ``triton`` (and its own @jit helpers) is imported.
"""

from kernels import runtime  # noqa: F401
