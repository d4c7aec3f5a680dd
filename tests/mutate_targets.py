"""Targets for tests/test_mutate.py whose generated mutants are known: the equivalence filter's controls."""

import triton
import triton.language as tl

from kernels import runtime  # noqa: F401  (device choice before any kernel is defined)


@triton.jit
def widen_kernel(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    # src is int64 in every launch: removing this cast is the same program (same TTIR)
    values = tl.load(src_ptr + offs, mask=offs < n, other=0).to(tl.int64)
    tl.store(out_ptr + offs, values, mask=offs < n)


def first_positive(values, default=None):
    for value in values:
        if value > 0:
            return value
    return default
