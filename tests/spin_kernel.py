"""A Triton kernel that never finishes, for the pool's watchdog test (imported only by the worker that runs it)."""

import torch
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels import runtime  # before triton: the interpreter on a CPU machine


@triton.jit
def _spin_kernel(flag_ptr):
    """Waits for a flag nobody sets: on a GPU it never returns to Python, and no signal stops it."""
    flag = tl.load(flag_ptr)
    while flag == 0:
        flag = tl.load(flag_ptr)


def spin() -> None:
    _spin_kernel[(1,)](torch.zeros(1, dtype=torch.int32, device=runtime.device()))
