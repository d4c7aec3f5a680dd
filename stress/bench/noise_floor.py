"""The cost of the Gumbel noise alone, for ``make bench``: what ``gumbel_sample`` at a temperature computes per
token beyond an argmax (one Philox draw and two float64 logarithms, ``kernels.sampling.gumbel_noise``), over the
same grid and without reading a logit. No sampling kernel that keeps the contract's noise runs faster."""

import triton
import triton.language as tl

from kernels.sampling import gumbel_noise, vocab_splits


@triton.jit
def _noise_max_kernel(out_ptr, vocab, split_tiles, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    best = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    first = split * split_tiles * BLOCK_V
    for v0 in range(first, tl.minimum(vocab, first + split_tiles * BLOCK_V), BLOCK_V):
        best = tl.maximum(best, gumbel_noise(row, v0 + tl.arange(0, BLOCK_V)))
    tl.store(out_ptr + row * tl.num_programs(1) + split, tl.max(best, 0))


def noise_max(out, rows: int, vocab: int, block_v: int = 1024) -> None:
    """Each (row, split) program's largest noise value into ``out`` [rows * splits]: the programs and vocab
    shares ``gumbel_sample`` launches for ``rows`` rows (``kernels.sampling.vocab_splits``)."""
    split_tiles, num_splits = vocab_splits(rows, vocab, block_v)
    _noise_max_kernel[(rows, num_splits)](out, vocab, split_tiles, BLOCK_V=block_v)
