"""Kernels with the patterns of real engines that a CPU tracer must handle, each as a correct
form and a planted bug: pointer tables, constructs the interpreter cannot run, atomic tickets,
and a tiled Gumbel/argmax sampler over a long vocabulary. Also the tracing example of docs/tracing.md."""

import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels import runtime  # noqa: F401  (chooses the interpreter before any kernel exists)


@triton.jit
def scale_groups(src_table_ptr, dst_table_ptr, lens_ptr, scale, BLOCK: tl.constexpr, OVERREAD: tl.constexpr):
    """Group g: ``dst[g][:n] = src[g][:n] * scale`` with ``n = lens[g]``, where ``src_table[g]`` and
    ``dst_table[g]`` hold the addresses of group g's float32 tensors (LoRA weight tables, per-group
    slot mappings). OVERREAD drops the length from the load mask: lanes past an entry's length
    read past its storage."""
    g = tl.program_id(0)
    src = tl.load(src_table_ptr + g).to(tl.pointer_type(tl.float32))
    dst = tl.load(dst_table_ptr + g).to(tl.pointer_type(tl.float32))
    n = tl.load(lens_ptr + g)
    offs = tl.arange(0, BLOCK)
    if OVERREAD:
        values = tl.load(src + offs)
    else:
        values = tl.load(src + offs, mask=offs < n, other=0.0)
    tl.store(dst + offs, values * scale, mask=offs < n)


@triton.jit
def gather_groups(table_ptr, lens_ptr, out_ptr, out_stride, BLOCK: tl.constexpr):
    """Row g of ``out`` gets the first ``lens[g]`` floats of the tensor at address ``table[g]``."""
    g = tl.program_id(0)
    src = tl.load(table_ptr + g).to(tl.pointer_type(tl.float32))
    offs = tl.arange(0, BLOCK)
    keep = offs < tl.load(lens_ptr + g)
    tl.store(out_ptr + g * out_stride + offs, tl.load(src + offs, mask=keep, other=0.0), mask=keep)


@triton.jit
def asm_copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.inline_asm_elementwise("mov.u32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out_ptr + offs, y)


@triton.jit
def libdevice_erfinv(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, libdevice.erfinv(tl.load(x_ptr + offs)))


@triton.jit
def stamp_time(out_ptr):
    tl.store(out_ptr, tl.extra.cuda.globaltimer())


@triton.jit
def compact_positive(x_ptr, count_ptr, out_ptr, BLOCK: tl.constexpr, ATOMIC: tl.constexpr):
    """Each program appends its block's positive values to ``out`` at positions it claims with
    one ticket from ``count`` (stream compaction, as in MoE token routing). The layout depends on
    which program claims first; ATOMIC=False takes the ticket with a plain load and store."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    keep = (x > 0).to(tl.int32)
    n = tl.sum(keep, 0)
    if ATOMIC:
        start = tl.atomic_add(count_ptr, n)
    else:
        start = tl.load(count_ptr)
        tl.store(count_ptr, start + n)
    tl.store(out_ptr + start + tl.cumsum(keep, 0) - 1, x, mask=keep > 0)


@triton.jit
def gumbel_argmax(logits_ptr, logits_stride, out_ptr, vocab, seed, GUMBEL: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program per row: the argmax over the vocabulary, in tiles, of ``logits + Gumbel noise``
    (noise from ``rand(seed + row, token)``; none when GUMBEL is off), lowest token on ties."""
    row = tl.program_id(0)
    best_scores = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    best_tokens = tl.zeros((BLOCK_V,), tl.int32)
    for v0 in range(0, vocab, BLOCK_V):
        tokens = v0 + tl.arange(0, BLOCK_V)
        scores = tl.load(logits_ptr + row * logits_stride + tokens, mask=tokens < vocab, other=float("-inf"))
        if GUMBEL:
            u = tl.rand(seed + row, tokens)
            scores += -tl.log(-tl.log(u + 1e-20) + 1e-20)
        better = scores > best_scores
        best_scores = tl.where(better, scores, best_scores)
        best_tokens = tl.where(better, tokens, best_tokens)
    top = tl.max(best_scores, 0)
    tl.store(out_ptr + row, tl.min(tl.where(best_scores == top, best_tokens, vocab), 0))
