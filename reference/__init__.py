"""CPU references: one module per kernels/ module, same function names, pure functions.

They return their outputs and never mutate inputs, and never import from ``kernels``
(a reference that calls the kernel proves nothing).
"""
