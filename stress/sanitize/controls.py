"""Positive controls for compute-sanitizer: tiny kernels with one planted bug each.

Every sanitizer run starts with its tool's control in the same run; a tool that does not report
its control is blind here (wrong allocator setting, a sanitizer that cannot attach), and its
clean verdicts would mean nothing.

- ``overread`` (memcheck): the load mask is dropped, so the last program's lanes read past the
  end of ``src``; only in-bounds lanes are stored, so the outputs are right and only a sanitizer
  can see the read (the same bug as the ``row-overread`` mutant).
- ``uninit`` (initcheck): ``src`` is never written before the kernel reads it.
- ``bad-warp-sync`` (synccheck): every lane runs ``bar.warp.sync`` with a member mask that names
  lane 0 only, an invalid argument for the other 31 lanes.
- ``clean``: the same copy with its mask, which no tool may report.
"""

import triton
import triton.language as tl

from kernels import runtime  # noqa: F401  (device choice before any kernel is defined)

BLOCK = 1024


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, BAD_WARP_SYNC: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    if MASK_LOAD:
        values = tl.load(src_ptr + offs, mask=live, other=0)
    else:
        values = tl.load(src_ptr + offs)
    if BAD_WARP_SYNC:
        values = tl.inline_asm_elementwise("bar.warp.sync 1;\n\tmov.b32 $0, $1;", "=r,r", [values],
                                           dtype=tl.int32, is_pure=False, pack=1)
    tl.store(dst_ptr + offs, values, mask=live)


def launch(name: str, src, dst) -> None:
    n = src.numel()
    _copy_kernel[(triton.cdiv(n, BLOCK),)](src, dst, n, BLOCK=BLOCK, MASK_LOAD=name != "overread",
                                          BAD_WARP_SYNC=name == "bad-warp-sync")
