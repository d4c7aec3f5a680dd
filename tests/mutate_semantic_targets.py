"""Targets for tests/test_mutate_semantic.py: small code whose semantic mutants the tests write out in full."""

import triton
import triton.language as tl

from kernels import runtime  # noqa: F401  (device choice before any kernel is defined)


@triton.jit
def reverse_rows_kernel(src_ptr, dst_ptr, src_stride, dst_stride, width, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    live = cols < width
    values = tl.load(src_ptr + row * src_stride + cols, mask=live, other=0)
    tl.store(dst_ptr + row * dst_stride + (width - 1 - cols), values, mask=live)  # the row reversed


def window_sum(values: list[int], start: int, stop: int) -> tuple[int, int]:
    if stop < start:
        raise ValueError("stop: before start; pass stop >= start")
    total = 0
    count = 0
    for i in range(stop):
        total += values[i]
    first = values[start]
    last = values[stop - 1]
    total = total - sum(values[:start])
    return divmod(total + first - last, count + 1)


class Window:
    def __init__(self, start: int, stop: int):
        self.start = start
        self.stop = stop
        self.seen: dict[int, int] = {}

    def width(self) -> int:
        return self.stop - self.start
