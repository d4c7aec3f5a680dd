"""CUDA-graph candidates and dispatch for spec-decode batches (docs/contracts/spec.md#specgraph_candidates, fix 1).

``build_candidates`` stages, for every capture size, one FULL decode graph per uniform query
width the scheduler can produce and one PIECEWISE graph for mixed batches; ``dispatch`` picks
the staged graph that runs a batch, padding requests and tokens up to its size, or eager.

A uniform width is a draft depth plus ``n_new = decode_query_len - max_spec_tokens`` (1 for the
target and DFlash drafts, 0 for DSpark anchor-as-first drafts). A DSD band that disables
drafting (depth 0) therefore gives a DSpark draft manager width 0: no batch has that shape, so
it gets no graph (fix 1; rounding capture sizes up to a multiple of 0 crashed start-up).
"""

import bisect
import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kernels import validate


class Mode(enum.Enum):
    NONE = "none"  # eager
    PIECEWISE = "piecewise"
    FULL = "full"


@dataclass(frozen=True)
class BatchDescriptor:
    """The shape a graph is captured at; hashable, so it is the graph's key.

    ``num_reqs`` None: no request padding (PIECEWISE). ``uniform``: every request has exactly
    this many query tokens (FULL decode). ``max_req_tokens``: no request has more (varlen FULL
    decode).
    """

    mode: Mode
    num_tokens: int
    num_reqs: int | None = None
    uniform: int | None = None
    max_req_tokens: int | None = None


@dataclass(frozen=True)
class Candidates:
    """Everything staged for capture; ``dispatch`` tries ``full`` before ``piecewise``.

    Both are sorted by ``num_tokens``; within one token count, FULL descriptors come in dispatch
    priority (uniform before varlen, then fewer requests first).
    """

    max_num_reqs: int
    widths: tuple[int, ...]  # uniform decode widths (depth + n_new) staged for; varlen graphs take any
    full: tuple[BatchDescriptor, ...]
    piecewise: tuple[BatchDescriptor, ...]


def decode_widths(decode_query_len: int, max_spec_tokens: int, schedule=None,
                  adaptive: bool = False) -> tuple[int, ...]:
    """Uniform query widths (depth + n_new) a decode batch can have, ascending; never 0.

    DSD: one per band depth (capped at ``max_spec_tokens``, as the scheduler caps it). Adaptive
    depth: every depth from 1 up to the largest band cap, or 0 too when a band disables drafting.
    A manager whose query length is below ``max_spec_tokens`` (one token per draft step) does not
    vary with the depth.
    """
    n_new = decode_query_len - max_spec_tokens
    if n_new < 0 or (schedule is None and not adaptive):
        return (decode_query_len,)
    caps = None if schedule is None else {min(depth, max_spec_tokens) for _, _, depth in schedule}
    if not adaptive:
        depths = caps
    elif caps is None:
        depths = range(1, max_spec_tokens + 1)
    else:
        depths = range(0 if 0 in caps else 1, max(caps) + 1)
    return tuple(sorted({d + n_new for d in depths if d + n_new > 0}))


def build_candidates(capture_sizes: Iterable[int], max_num_reqs: int, decode_query_len: int, max_spec_tokens: int,
                     schedule: Sequence[tuple[int, int, int]] | None = None, *, max_capture_size: int | None = None,
                     adaptive: bool = False, small_grid: int = 32, varlen: bool = False) -> Candidates:
    """Stage the graphs of a FULL_AND_PIECEWISE manager (docs/contracts/spec.md#specgraph_candidates).

    Per capture size c: for each uniform width w, ``FULL(round_up(c, w), num_reqs, w)`` unless it
    exceeds ``max_num_reqs * decode_query_len`` tokens, ``max_capture_size`` tokens or
    ``max_num_reqs`` requests; and ``PIECEWISE(c)``. Small batches are guaranteed exact graphs:
    ``FULL(w * r, r, w)`` for r up to ``min(max_num_reqs, small_grid)``. With ``varlen`` the
    uniform graphs are replaced by graphs taking any query lengths up to ``decode_query_len``,
    at four request counts per capture size (and no small grid).
    """
    sizes = sorted({validate.positive_int("capture_sizes", c) for c in capture_sizes})
    validate.positive_int("max_num_reqs", max_num_reqs)
    validate.positive_int("decode_query_len", decode_query_len)
    validate.non_negative_int("max_spec_tokens", max_spec_tokens)
    validate.non_negative_int("small_grid", small_grid)
    validate.flag("adaptive", adaptive)
    validate.flag("varlen", varlen)
    _check_schedule(schedule)
    if (schedule is not None or adaptive) and max_spec_tokens == 0:
        raise ValueError("max_spec_tokens: a DSD schedule or adaptive depth needs a maximum depth >= 1")
    if max_capture_size is None:
        max_capture_size = sizes[-1] if sizes else 0
    elif validate.positive_int("max_capture_size", max_capture_size) < (sizes[-1] if sizes else 0):
        raise ValueError(f"max_capture_size: {max_capture_size} is below the largest capture size {sizes[-1]}")
    widths = decode_widths(decode_query_len, max_spec_tokens, schedule, adaptive)
    if not sizes:
        return Candidates(max_num_reqs, widths, (), ())

    full = set()
    for c in sizes:
        if varlen:
            if c <= max_num_reqs * decode_query_len:
                most = min(c, max_num_reqs)
                for num_reqs in {-(-c // decode_query_len), (most + 1) // 2, (3 * most + 3) // 4, most}:
                    full.add(BatchDescriptor(Mode.FULL, c, num_reqs, max_req_tokens=decode_query_len))
            continue
        for w in widths:
            num_tokens = _round_up(c, w)
            num_reqs = num_tokens // w
            # no width exceeds decode_query_len: num_tokens <= max_num_reqs * decode_query_len follows
            if num_tokens <= max_capture_size and num_reqs <= max_num_reqs:
                full.add(BatchDescriptor(Mode.FULL, num_tokens, num_reqs, w))
    if not varlen:
        for w in widths:
            for num_reqs in range(1, min(max_num_reqs, small_grid) + 1):
                full.add(BatchDescriptor(Mode.FULL, w * num_reqs, num_reqs, w))
    return Candidates(max_num_reqs, widths, tuple(sorted(full, key=_priority)),
                      tuple(BatchDescriptor(Mode.PIECEWISE, c) for c in sizes))


def dispatch(candidates: Candidates, num_reqs: int, num_tokens: int, uniform: int | None, has_prefill: bool = False,
             *, max_req_tokens: int | None = None) -> BatchDescriptor:
    """The graph that runs this batch: the first that fits among those staged at the smallest
    token count >= ``num_tokens`` (FULL first, then PIECEWISE), else eager ``NONE``.

    ``uniform``: every request has this many query tokens (None: they differ). ``max_req_tokens``:
    the longest request's query tokens, if the caller tracks it (varlen graphs need it).
    """
    _check_batch(candidates, num_reqs, num_tokens, uniform, max_req_tokens)
    validate.flag("has_prefill", has_prefill)
    if has_prefill:
        # A prompt chunk of exactly a decode width makes the batch look like spec decode; a decode
        # graph would run it as one (upstream vllm#49918).
        uniform = max_req_tokens = None
    for staged in (candidates.full, candidates.piecewise):
        for desc in _staged_at(staged, num_tokens):
            if _fits(desc, num_reqs, num_tokens, uniform, max_req_tokens):
                return desc
    return BatchDescriptor(Mode.NONE, num_tokens)


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _priority(desc: BatchDescriptor) -> tuple:
    return desc.num_tokens, desc.uniform is None, desc.num_reqs


def _tokens(desc: BatchDescriptor) -> int:
    return desc.num_tokens


def _staged_at(staged: tuple[BatchDescriptor, ...], num_tokens: int) -> tuple[BatchDescriptor, ...]:
    """The descriptors staged at the smallest token count >= ``num_tokens`` (one candidate-table row)."""
    lo = bisect.bisect_left(staged, num_tokens, key=_tokens)
    if lo == len(staged):
        return ()
    return staged[lo:bisect.bisect_right(staged, staged[lo].num_tokens, key=_tokens)]


def _fits(desc: BatchDescriptor, num_reqs: int, num_tokens: int, uniform: int | None,
          max_req_tokens: int | None) -> bool:
    return ((desc.uniform is None or desc.uniform == uniform)
            and (desc.max_req_tokens is None or (max_req_tokens is not None and desc.max_req_tokens >= max_req_tokens))
            and (desc.num_reqs is None or desc.num_reqs >= num_reqs)
            and desc.num_tokens >= num_tokens)


def _check_schedule(schedule) -> None:
    if schedule is None:
        return
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence) or not schedule:
        raise ValueError(f"schedule: expected a non-empty list of (range_start, range_end, depth), got {schedule!r}")
    for band in schedule:
        if not isinstance(band, Sequence) or len(band) != 3:
            raise ValueError(f"schedule: entry {band!r} is not (range_start, range_end, depth)")
        start, end, depth = band
        validate.positive_int("schedule", start)
        validate.non_negative_int("schedule", depth)
        if validate.positive_int("schedule", end) < start:
            raise ValueError(f"schedule: band {band!r} ends before it starts")


def _check_batch(candidates, num_reqs, num_tokens, uniform, max_req_tokens) -> None:
    validate.positive_int("num_tokens", num_tokens)
    validate.positive_int("num_reqs", num_reqs)
    if num_reqs > num_tokens:
        raise ValueError(f"num_reqs: {num_reqs} requests cannot share {num_tokens} tokens (each has at least one)")
    if num_reqs > candidates.max_num_reqs:
        raise ValueError(f"num_reqs: {num_reqs} is above max_num_reqs={candidates.max_num_reqs}")
    if uniform is not None and validate.positive_int("uniform", uniform) * num_reqs != num_tokens:
        raise ValueError(f"uniform: {num_reqs} requests of {uniform} tokens are not {num_tokens} tokens")
    if max_req_tokens is not None:
        validate.positive_int("max_req_tokens", max_req_tokens)
        if not -(-num_tokens // num_reqs) <= max_req_tokens <= num_tokens - num_reqs + 1:
            raise ValueError(f"max_req_tokens: {max_req_tokens} cannot be the longest of {num_reqs} requests "
                             f"sharing {num_tokens} tokens")
        if uniform is not None and max_req_tokens != uniform:
            raise ValueError(f"max_req_tokens: {max_req_tokens} differs from uniform={uniform}")
