"""Reference graph candidates and dispatch: the loops of docs/contracts/spec.md#specgraph_candidates written out
over plain tuples.

Same names and call shapes as kernels.spec.graphs, so one driver (stress.oracles.host.graph_outcomes) runs
either; a descriptor's mode is its name ("FULL", "PIECEWISE", "NONE").

The candidate table is taken literally: a batch of T tokens is offered only the descriptors
staged at the smallest staged token count >= T (FULL first, then PIECEWISE).
"""

from typing import NamedTuple


class Descriptor(NamedTuple):
    mode: str  # "FULL", "PIECEWISE" or "NONE"
    num_tokens: int
    num_reqs: int | None = None
    uniform: int | None = None
    max_req_tokens: int | None = None


class Candidates(NamedTuple):
    max_num_reqs: int
    widths: list[int]
    full: list[Descriptor]
    piecewise: list[Descriptor]


def decode_widths(decode_query_len, max_spec_tokens, schedule=None, adaptive=False):
    n_new = decode_query_len - max_spec_tokens
    if n_new < 0 or (schedule is None and not adaptive):
        return [decode_query_len]
    if schedule is None:
        depths = list(range(1, max_spec_tokens + 1))
    else:
        caps = [min(band[2], max_spec_tokens) for band in schedule]
        depths = list(range(0 if 0 in caps else 1, max(caps) + 1)) if adaptive else caps
    return sorted({d + n_new for d in depths} - {0})


def build_candidates(capture_sizes, max_num_reqs, decode_query_len, max_spec_tokens, schedule=None, *,
                     max_capture_size=None, adaptive=False, small_grid=32, varlen=False):
    widths = decode_widths(decode_query_len, max_spec_tokens, schedule, adaptive)
    sizes = sorted(set(capture_sizes))
    if not sizes:
        return Candidates(max_num_reqs, widths, [], [])
    if max_capture_size is None:
        max_capture_size = sizes[-1]
    full = set()
    for c in sizes:
        if varlen and c <= max_num_reqs * decode_query_len:
            most = min(c, max_num_reqs)
            fewest = (c + decode_query_len - 1) // decode_query_len
            for num_reqs in (fewest, (most + 1) // 2, (3 * most + 3) // 4, most):
                full.add(Descriptor("FULL", c, num_reqs, None, decode_query_len))
        if varlen:
            continue
        for w in widths:
            num_reqs = (c + w - 1) // w
            if (num_reqs * w <= max_num_reqs * decode_query_len and num_reqs * w <= max_capture_size
                    and num_reqs <= max_num_reqs):
                full.add(Descriptor("FULL", num_reqs * w, num_reqs, w))
    for w in [] if varlen else widths:  # exact graphs for small batches
        for num_reqs in range(1, min(max_num_reqs, small_grid) + 1):
            full.add(Descriptor("FULL", w * num_reqs, num_reqs, w))
    ordered = sorted(full, key=lambda d: (d.num_tokens, d.uniform is None, d.num_reqs))
    return Candidates(max_num_reqs, widths, ordered, [Descriptor("PIECEWISE", c) for c in sizes])


def dispatch(candidates, num_reqs, num_tokens, uniform, has_prefill=False, *, max_req_tokens=None):
    if has_prefill:
        uniform = max_req_tokens = None
    for staged in (candidates.full, candidates.piecewise):
        counts = [d.num_tokens for d in staged if d.num_tokens >= num_tokens]
        if not counts:
            continue
        row = [d for d in staged if d.num_tokens == min(counts)]
        fitting = [d for d in row
                   if (d.uniform is None or d.uniform == uniform)
                   and (d.max_req_tokens is None or (max_req_tokens is not None and d.max_req_tokens >= max_req_tokens))
                   and (d.num_reqs is None or d.num_reqs >= num_reqs)]
        if fitting:  # uniform graphs first, then the fewest requests
            return min(fitting, key=lambda d: (d.uniform is None, d.num_reqs or 0))
    return Descriptor("NONE", num_tokens)
