"""Case families for paged draft attention, and the draft step that checks prefix-cache masking end to end.

KV slots a case never wrote hold NaN (and are declared unwritten to the CPU tracer), so a read of
them shows in the output; output rows outside the batch hold SENTINEL and must survive. Block
tables are random permutations of a shared block pool; block 0 (the null block) is referenced
only by the one-element cache, whose only block it is.
"""

import numpy as np
import torch

from kernels.attention import launch_shape, paged_attention
from kernels.block_table import shift_block_table_rows
from kernels.draft_inputs import prepare_draft_inputs
from kernels.kv_cache import write_kv
from reference.attention import FLOAT32_MAX, QUERIES_PER_CHUNK, by_kv_head, gather_kv, visible_keys
from stress.core.compare import Float64Expected
from stress.core.types import Case
from stress.families.common import (
    SENTINEL,
    big,
    distinct_blocks,
    int32,
    int64,
    laid_out,
    offset_reach,
    one_per_value,
    own_launch,
    pick,
    slots_for,
    spread,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FLOOR_ULPS = {torch.float32: 4}  # else 1


def sweep(device: str) -> list[dict]:
    """Keys per tile, KV splits (one: no combine pass), warps; the default shape from the heuristics too."""
    if device == "cuda":
        return [{}] + [{"block_n": n, "kv_splits": s, "num_warps": w} for n in (32, 64) for s in (1, 3, 16)
                       for w in (4, 8)]
    return [{}, {"block_m": 32, "block_n": 16, "kv_splits": 3}]


def score_rounding(inputs: dict, value_scale: float) -> float:
    """What rounding a score to float32 can move an output by, in a paged-attention case: one float32 ulp of
    the largest absolute dot product ``scale * sum |q_i| |k_i|`` over the pairs that carry weight (visible,
    finite score within float32), times the largest value's size.

    A score is a float32 sum whose partial sums reach that size, so its error grows with it, and a weight
    moves by the score's error (relative). Keys planted a thousand above the rest put scores in the
    thousands, where this is the largest error any float32 computation makes; the baseline's own error
    there depends on its summation order, and the kernel's order can land above twice it.
    """
    query, k_cache = inputs["query"], inputs["k_cache"]
    starts, scale = inputs["query_start_loc"].tolist(), inputs["scale"]
    largest = 0.0
    for batch_row in range(len(starts) - 1):
        first, last = starts[batch_row], starts[batch_row + 1]
        length = int(inputs["seq_lens"][batch_row])
        if last == first or length == 0:
            continue
        keys = gather_kv(k_cache, inputs["block_table"][batch_row], length).to(torch.float64).transpose(0, 1)
        keys_abs = keys.abs()  # [H_kv, L, D]
        num_kv_heads = keys.shape[0]
        group = query.shape[1] // num_kv_heads
        queries, visible = query[first:last], visible_keys(last - first, length, inputs["causal"])
        for chunk in range(0, last - first, QUERIES_PER_CHUNK):  # as the reference: its chunks, its row order
            rows = slice(chunk, chunk + QUERIES_PER_CHUNK)
            q = by_kv_head(queries[rows].to(torch.float64), num_kv_heads)
            scores = (q @ keys.transpose(1, 2)) * scale
            spans = (q.abs() @ keys_abs.transpose(1, 2)) * scale  # [H_kv, group * Q, L], none negative
            # weighted: visible, and a score within float32 (so finite: NaN and inf compare false)
            weighted = visible[rows].repeat(group, 1) & (scores.abs() <= FLOAT32_MAX * scale)
            largest = max(largest, float(spans.masked_fill_(~weighted, 0.0).max()))
    return largest * torch.finfo(torch.float32).eps * value_scale


def judged(reference_fn, value_inputs: tuple[str, ...], rounding=None):
    """The check's reference: ``reference_fn``'s float64 ``out`` (its first output) as a Float64Expected.

    The float32 baseline is the same reference at float32, rounded to the output dtype. The floor is
    ``FLOOR_ULPS`` ulps (of the output dtype) of the largest value any query could read: one bounds
    rounding the softmax probabilities to a 16-bit dtype before they weight the values; a float32
    output gets four, as the GPU's exp2 is approximate to a few ulps where the baseline's is not.
    ``rounding(inputs, value_scale)`` (``score_rounding``), where given, is asked only of an output that
    bound rejects.
    """
    def reference(**inputs):
        exact = reference_fn(**inputs)
        baseline = reference_fn(**inputs, precision=torch.float32)
        outputs = exact if isinstance(exact, tuple) else (exact,)
        given = inputs["out"]
        scale = max(_largest_finite(inputs[name]) for name in value_inputs)
        first = Float64Expected(value=outputs[0], computed=outputs[0] != given.to(torch.float64),
                                baseline=(baseline[0] if isinstance(baseline, tuple) else baseline).to(given.dtype),
                                floor=FLOOR_ULPS.get(given.dtype, 1) * torch.finfo(given.dtype).eps * scale,
                                rounding=(lambda: rounding(inputs, scale)) if rounding else None)
        return (first, *outputs[1:]) if isinstance(exact, tuple) else first
    reference.bare = reference_fn  # refusal cases only ask whether it validates: no float32 baseline for them
    return reference


def _largest_finite(values: torch.Tensor) -> float:
    """The largest absolute finite element of ``values`` (0.0 if none), in their own dtype (abs and max round
    nothing): no float64 copy of a whole cache."""
    if values.numel() == 0:
        return 0.0
    return float(values.abs().nan_to_num_(nan=0.0, posinf=0.0).max())  # abs made -inf +inf: every non-finite 0


def _randn(rng, shape, dtype) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32)).to(dtype)


def _poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype)


def _unwritten(cache: torch.Tensor) -> torch.Tensor:
    """The tracer's mask of a poisoned cache's elements no case wrote, as a broadcast view: a case writes whole
    (block, slot) rows of finite values, so a row's first element says for all of it (no pass over the cache,
    which on the GPU holds up to 33k tokens of every head)."""
    return torch.isnan(cache[:, :, :1, :1]).expand(cache.shape)


def reached_columns(seq_lens: torch.Tensor, width: int, block_size: int) -> torch.Tensor:
    """[rows, width] bool: the block-table columns each row's sequence reaches (a column's first token is below
    its length)."""
    return torch.arange(width)[None, :] * block_size < seq_lens[:, None]


def attention_case(rng, *, query_lens, seq_lens, kv_heads, group, head_dim, block_size, dtype, causal,
                   pad_rows=0, extra_rows=0, pad_tokens=0, min_width=1, note="") -> Case:
    """Live requests with ``query_lens`` / ``seq_lens``; ``pad_rows`` batch rows with no query and no key;
    ``extra_rows`` block-table and seq_lens rows past the batch (their values must not matter);
    ``pad_tokens`` query and out rows past the batch; block-table rows at least ``min_width`` wide; in half
    the cases the entries no sequence reaches hold a stale block id past the cache."""
    rows = len(query_lens) + pad_rows
    all_seq = list(seq_lens) + [0] * pad_rows + [int(rng.integers(1, 64)) for _ in range(extra_rows)]
    width = max([-(-s // block_size) for s in all_seq] + [min_width]) + int(rng.integers(0, 3))
    table = distinct_blocks(rng, rows + extra_rows, width)
    shape = (table.numel() + 1 + int(rng.integers(0, 3)), block_size, kv_heads, head_dim)
    k_cache, v_cache = _poisoned(shape, dtype), _poisoned(shape, dtype)
    if rng.random() < 0.5:  # stale ids past the cache where no sequence reaches: never followed, never checked
        table[~reached_columns(torch.tensor(all_seq), width, block_size)] = int(rng.integers(shape[0], 2**31 - 1))
    for batch_row, length in enumerate(seq_lens):
        positions = torch.arange(length)
        blocks = table[batch_row].long()[positions // block_size]
        k_cache[blocks, positions % block_size] = _randn(rng, (length, kv_heads, head_dim), dtype)
        v_cache[blocks, positions % block_size] = _randn(rng, (length, kv_heads, head_dim), dtype)
    num_tokens = sum(query_lens)
    query_start_loc = np.concatenate([[0], np.cumsum(list(query_lens) + [0] * pad_rows)])
    num_q_heads = kv_heads * group
    inputs = {
        "query": _randn(rng, (num_tokens + pad_tokens, num_q_heads, head_dim), dtype),
        "k_cache": k_cache, "v_cache": v_cache, "block_table": table, "seq_lens": int32(all_seq),
        "query_start_loc": int32(query_start_loc), "scale": float(head_dim ** -0.5 * rng.uniform(0.5, 2.0)),
        "causal": causal, "out": torch.full((num_tokens + pad_tokens, num_q_heads, head_dim), SENTINEL, dtype=dtype)}
    return Case(inputs=inputs, unwritten={"k_cache": _unwritten(k_cache), "v_cache": _unwritten(v_cache)},
                note=(f"{'causal' if causal else 'non-causal'} q={list(query_lens)} seq={list(seq_lens)} "
                      f"H_kv={kv_heads} group={group} D={head_dim} bs={block_size} {str(dtype)[6:]} {note}").strip())


def _shape(rng, device, *, groups=(1, 4, 8), kv_heads=None, dtypes=(torch.bfloat16,)) -> dict:
    """Heads, head dim, block size, dtype: model-sized on the GPU, tiny under the interpreter."""
    if big(device):
        return {"kv_heads": kv_heads or int(rng.integers(1, 9)), "group": pick(rng, groups),
                "head_dim": pick(rng, (64, 128)), "block_size": pick(rng, (16, 32, 64)), "dtype": pick(rng, dtypes)}
    return {"kv_heads": kv_heads or 1, "group": pick(rng, groups), "head_dim": pick(rng, (8, 16)),
            "block_size": pick(rng, (16, 32)), "dtype": pick(rng, dtypes)}


def _requests(rng, device, query_lens, longest: int) -> list[int]:
    """A sequence length for each query count: at least the queries, at most ``longest``."""
    return [int(rng.integers(max(q, 1), max(q, longest) + 1)) for q in query_lens]


def _batch(rng, device, cpu_max=2, gpu_max=16) -> int:
    return int(rng.integers(1, (gpu_max if big(device) else cpu_max) + 1))


def decode(rng, device, launch):
    """One query per request, causal or not, GQA 1/4/8."""
    query_lens = [1] * _batch(rng, device, gpu_max=16)
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens,
                                                                         2048 if big(device) else 60),
                          causal=bool(rng.integers(2)), **_shape(rng, device))


def multi_query(rng, device, launch):
    """Draft blocks of up to 16 queries: non-causal (DFlash / DSpark full-attention layers) sees every key of
    the request, causal (sliding-window layers) stops each query at its own position."""
    query_lens = [int(rng.integers(2, 17 if big(device) else 9)) for _ in range(_batch(rng, device, gpu_max=8))]
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens,
                                                                         2048 if big(device) else 40),
                          causal=bool(rng.integers(2)), **_shape(rng, device))


def edges(rng, device, launch):
    """Sequence lengths 0, 1 and around block boundaries; requests with no query, or queries and no key;
    CUDA-graph padding: batch rows with neither, table and seq_lens rows past the batch, out rows past it."""
    shape = _shape(rng, device)
    bs = shape["block_size"]
    seq_lens = [int(pick(rng, (0, 1, 2, bs - 1, bs, bs + 1, 2 * bs))) for _ in range(_batch(rng, device, 3, 8))]
    query_lens = [int(rng.integers(0, min(s, 4) + 1)) if s else int(rng.integers(0, 3)) for s in seq_lens]
    return attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)),
                          pad_rows=int(rng.integers(0, 3)), extra_rows=int(rng.integers(0, 3)),
                          pad_tokens=int(rng.integers(0, 4)), **shape)


def long(rng, device, launch):
    """Long contexts (8k to 33k on the GPU): many tiles per split, splits of uneven length."""
    query_lens = [pick(rng, (1, 4, 16) if big(device) else (1, 3)) for _ in range(_batch(rng, device, 1, 2))]
    shortest, longest = (8192, 33_000) if big(device) else (64, 160)
    seq_lens = [int(rng.integers(shortest, longest + 1)) for _ in query_lens]
    return attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)),
                          note="long", **_shape(rng, device, groups=(1, 8), kv_heads=int(rng.integers(1, 3))))


def gqa(rng, device, launch):
    """Several KV heads shared by 1 to 8 query heads each: query head h must read KV head h // group. Groups of
    3, 5 and 6 leave rows of a program past its whole groups (rows // group >= queries per chunk); a group that
    exactly fills a forced program (32 rows on the CPU sweep; half the cases that force one) holds one query
    per chunk, which the launcher accepts."""
    query_lens = [int(rng.integers(1, 8)) for _ in range(_batch(rng, device, 1))]
    kv_heads = int(rng.integers(2, 9 if big(device) else 3))
    groups = (launch["block_m"],) if "block_m" in launch and rng.random() < 0.5 else (1, 3, 4, 5, 6, 8, 32)
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 40),
                          causal=bool(rng.integers(2)), **_shape(rng, device, kv_heads=kv_heads, groups=groups))


def chunks(rng, device, launch):
    """One long draft block among decode rows, so it spans several query chunks of a program (the default chunk
    is sized from the mean query count), with groups that leave rows past a program's last whole group (3, 5,
    6: those rows belong to the next chunk's first query) and groups that fill it (2, 4: a chunk's last query
    is its last row)."""
    query_lens = [1] * int(rng.integers(1, 4)) + [int(rng.integers(8, 49 if big(device) else 25))]
    query_lens = [query_lens[i] for i in rng.permutation(len(query_lens))]
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 48),
                          causal=bool(rng.integers(2)), **_shape(rng, device, groups=(2, 3, 4, 5, 6)))


@own_launch()
def widest_tiles(rng, device, launch):
    """The largest default programs: the widest head dim (256 on the GPU) in a 16-bit dtype, with groups of 3,
    5 or 6 and 33 to 64 queries per row, so the per-chunk cap (128 // group queries) sizes each program to 128
    rows that leave rows past their last whole group, or decode rows. Such a program fills most of an H200's
    shared memory (192 KiB of 227); the launcher's own shape only, as the sweep's forced key tiles would change
    it."""
    group = pick(rng, (3, 5, 6))
    if rng.random() < 0.75:
        query_lens = [int(rng.integers(33, 65)) for _ in range(_batch(rng, device, 1, 3))]
    else:
        query_lens = [1] * _batch(rng, device, 2, 8)
    shape = {**_shape(rng, device, dtypes=(torch.float16, torch.bfloat16), kv_heads=int(rng.integers(1, 3))),
             "group": group, "head_dim": 256 if big(device) else 16}
    return attention_case(rng, query_lens=query_lens,
                          seq_lens=_requests(rng, device, query_lens, max(query_lens) + (512 if big(device) else 16)),
                          causal=bool(rng.integers(2)), note="widest tiles", **shape)


@own_launch()
def overflowing_tiles(rng, device, launch):
    """Shapes whose own tiles overflow an H200's shared memory, so the launcher must fall back to narrower key
    tiles or fewer rows per program: head dim 512 under draft rows of 16 queries (128-row programs), or head dim
    256 in a 16-bit dtype under a group past 128 (256-row programs); decode rows at head dim 512 fit as they
    are. The launcher's own shape only (a forced tile is the caller's to fit). On the CPU, where nothing
    overflows, the same kinds at small head dims."""
    kind = pick(rng, ("draft rows, head dim 512", "group past 128, head dim 256", "decode, head dim 512"))
    wide = kind.startswith("group")
    shape = {**_shape(rng, device, dtypes=(torch.float16, torch.bfloat16) if wide else DTYPES,
                      kv_heads=int(rng.integers(1, 3))),
             "group": 130 if wide else 8, "head_dim": (256 if wide else 512) if big(device) else 16}
    query_lens = [16 if kind.startswith("draft") else 1] * _batch(rng, device, 2, 4)
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 300),
                          causal=bool(rng.integers(2)), note=kind, **shape)


@own_launch("cpu")
def wide_groups(rng, device, launch):
    """MQA-like groups of more query heads per KV head than the smallest program's 16 rows, up to past 128 (a
    program then holds one query's group); decode rows with padded batch rows after them, so the mean query count
    per batch row is below one. The CPU runs the launcher's own shape (its sweep's forced block_m would refuse
    such groups); the GPU's sweep forces only key tiles, splits and warps."""
    # past 128 (on the GPU half the time), where 128 // group is 0 (the per-chunk cap keeps one query)
    group = 130 if not big(device) or rng.integers(2) else pick(rng, (48, 64))
    query_lens = [1] * _batch(rng, device, 2, 8)
    shape = {**_shape(rng, device, kv_heads=int(rng.integers(1, 3))), "group": group}
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 40),
                          causal=bool(rng.integers(2)), pad_rows=int(rng.integers(1, 4)), **shape)


def float32(rng, device, launch, wide=False):
    """float32, whose default key tile is narrower than the 16-bit floats', at head dims whose tile is below 128."""
    query_lens = [int(rng.integers(1, 4)) for _ in range(_batch(rng, device))]
    head_dim = pick(rng, ((128, 256) if wide else (64, 80)) if big(device) else ((65, 128) if wide else (16, 24)))
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 40),
                          causal=bool(rng.integers(2)), **{**_shape(rng, device), "dtype": torch.float32,
                                                             "head_dim": head_dim})


def float32_wide(rng, device, launch):
    """float32 at head dims whose tile is 128 or more, where the launcher narrows its default key tile further."""
    return float32(rng, device, launch, wide=True)


@own_launch("cpu")
def two_splits(rng, device, launch):
    """Two batch rows or KV heads in all, with block-table rows wide enough for 512 tokens (a table sized for
    the longest sequence, here short ones): on the CPU (two multiprocessors, as the launcher counts the
    interpreter's) the default split count is 2, the one count the sweep does not force, so on the CPU it always
    runs the launcher's own shape. In half the cases the first row is one query over one key: a single split holds
    it and the combine must still write it."""
    rows, kv_heads = pick(rng, ((1, 2), (2, 1)))
    query_lens = [int(rng.integers(1, 4)) for _ in range(rows)]
    shape = {**_shape(rng, device), "kv_heads": kv_heads}
    seq_lens = _requests(rng, device, query_lens, 40)
    if rng.random() < 0.5:
        query_lens[0] = seq_lens[0] = 1
    return attention_case(rng, query_lens=query_lens, seq_lens=seq_lens,
                          causal=bool(rng.integers(2)), min_width=512 // shape["block_size"], **shape)


def large_scores(rng, device, launch):
    """Keys scaled by a few hundred, so scores (in log2 units) reach hundreds and the splits' maxima lie further
    apart than a float32 exponential spans: the combine must weight each split by its maximum against the
    overall one, and a wrong reference maximum overflows or underflows."""
    query_lens = [int(rng.integers(1, 4)) for _ in range(_batch(rng, device))]
    case = attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 60),
                          causal=bool(rng.integers(2)), note="keys x300", **_shape(rng, device))
    case.inputs["k_cache"] *= 300  # never-written slots stay NaN
    return case


LEVEL_SCORE = 150.0  # the mean score of level_scores' keys: about 216 in the kernel's log2 units


def level_scores(rng, device, launch):
    """fp16 and bf16 over several KV splits, every key scoring about 150 (216 in log2 units) within a unit or
    so of the others: every split's maximum sits near the overall one, so each split carries weight, and the
    maxima and sums the splits hand the combine must keep float32's precision (fp16 spaces numbers near 216
    by 0.125, bf16 by 1: a rounded maximum moves its split's weight by up to 4% or 41%). Queries are positive
    and keys a shared level plus small noise; tables of 512 tokens and two batch rows or KV heads at most give
    the launcher's own shape 2 or more splits, and sequences of 70 to 160 tokens put keys in each."""
    rows, kv_heads = pick(rng, ((1, 1), (1, 2), (2, 1)))
    query_lens = [int(rng.integers(1, 4)) for _ in range(rows)]
    shape = {**_shape(rng, device, dtypes=(torch.float16, torch.bfloat16)), "kv_heads": kv_heads}
    seq_lens = [int(rng.integers(70, 161)) for _ in query_lens]
    case = attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)),
                          min_width=512 // shape["block_size"], note="level scores", **shape)
    inputs, dtype = case.inputs, shape["dtype"]
    query = inputs["query"].float().abs() + 0.5
    level = LEVEL_SCORE / (inputs["scale"] * float(query.sum(-1).mean()))
    inputs["query"] = query.to(dtype)
    inputs["k_cache"] = (inputs["k_cache"].float() * 0.3 + level).to(dtype)  # never-written slots stay NaN
    return case


CACHE_LAYOUTS = ("head-major", "token-major", "padded")


def relaid_cache(cache: torch.Tensor, layout: str, pads: list[int]) -> torch.Tensor:
    """``cache``'s values in a view of its shape over memory ``[N, H_kv, bs, D]`` (head-major), ``[bs, N, H_kv,
    D]`` (token-major) or ``[N, bs + p0, H_kv + p1, D + p2]`` (padded): block, token and head strides unlike a
    contiguous cache's, the innermost stride 1. The same ``layout`` and ``pads`` give K and V one layout."""
    n, bs, heads, dim = cache.shape
    if layout == "head-major":
        view = torch.empty((n, heads, bs, dim), dtype=cache.dtype).transpose(1, 2)
    elif layout == "token-major":
        view = torch.empty((bs, n, heads, dim), dtype=cache.dtype).transpose(0, 1)
    else:
        view = torch.empty((n, bs + pads[0], heads + pads[1], dim + pads[2]), dtype=cache.dtype)[:, :bs, :heads, :dim]
    return view.copy_(cache)


def cache_layouts(rng, device, launch):
    """Draft blocks over two or more KV heads whose K and V caches (one layout for both) are handed over
    head-major, token-major or with every inner size padded: a key is found only through the caches' own
    block, token and head strides, never through sizes that hold for a contiguous cache alone."""
    query_lens = [int(rng.integers(1, 9)) for _ in range(_batch(rng, device))]
    shape = _shape(rng, device, kv_heads=int(rng.integers(2, 4)))
    case = attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 40),
                          causal=bool(rng.integers(2)), **shape)
    layout, pads = pick(rng, CACHE_LAYOUTS), [int(rng.integers(1, 4)) for _ in range(3)]
    for name in ("k_cache", "v_cache"):
        case.inputs[name] = relaid_cache(case.inputs[name], layout, pads)
    case.note += f", caches {layout}"
    return case


@own_launch()
def infinite_keys(rng, device, launch, split=False):
    """Keys holding -inf in head dim 0 for a prefix of each sequence (all of the first batch row's, and of half
    the others), met by queries positive there: a query whose every visible key scores -inf gets zeros, as one
    that sees no key; one that also sees finite keys gives the infinite ones no weight. The launcher's own
    shape: tables of at most 64 tokens (under two key tiles) take one KV split."""
    shape = _shape(rng, device, dtypes=DTYPES)
    if split:
        rows, shape["kv_heads"] = pick(rng, ((1, 2), (2, 1)))
        query_lens = [int(rng.integers(1, 4)) for _ in range(rows)]
        seq_lens = _requests(rng, device, query_lens, 40)
        case = attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)),
                              min_width=512 // shape["block_size"], note="512-token table", **shape)
    else:
        query_lens = [int(rng.integers(1, 4)) for _ in range(_batch(rng, device))]
        seq_lens = _requests(rng, device, query_lens, 30)
        case = attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)), **shape)
        width = -(-max(seq_lens) // shape["block_size"])
        case.inputs["block_table"] = case.inputs["block_table"][:, :width].contiguous()
    query, k_cache = case.inputs["query"], case.inputs["k_cache"]
    query[..., 0] = query[..., 0].abs() + 0.25  # -inf times a positive number: no NaN score
    block_size = k_cache.shape[1]
    cuts = [length if row == 0 or rng.random() < 0.5 else int(rng.integers(0, length + 1))
            for row, length in enumerate(seq_lens)]
    for batch_row, cut in enumerate(cuts):
        positions = torch.arange(cut)
        blocks = case.inputs["block_table"][batch_row].long()[positions // block_size]
        k_cache[blocks, positions % block_size, :, 0] = float("-inf")
    case.note += f", keys -inf up to positions {cuts}"
    return case


@own_launch()
def infinite_keys_split(rng, device, launch):
    """``infinite_keys`` through the combine pass: two batch rows or KV heads in all with tables of 512 tokens
    (as ``two_splits``), so a split may see -inf scores only, or every split of a row."""
    return infinite_keys(rng, device, launch, split=True)


def dtypes(rng, device, launch):
    """fp16, bf16 and fp32 caches, head dims that are not powers of two."""
    query_lens = [int(rng.integers(1, 5)) for _ in range(_batch(rng, device))]
    shape = _shape(rng, device, dtypes=DTYPES)
    shape["head_dim"] = pick(rng, (64, 80, 128) if big(device) else (5, 16, 24))
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 40),
                          causal=bool(rng.integers(2)), **shape)


def many_queries(rng, device, launch):
    """Rows of more queries than the launcher's chunk holds (128 // group queries, so the mean query count per
    batch row passes it and the cap on the default tile decides): prefill-sized on the GPU (512 to 1024, with a
    decode row or none), one row of a few past the cap on the CPU. A program walks several chunks."""
    group = pick(rng, (4, 8))
    if big(device):
        query_lens = [int(rng.integers(512, 1025))] + [1] * int(rng.integers(0, 2))
        query_lens = [query_lens[i] for i in rng.permutation(len(query_lens))]
    else:
        query_lens = [128 // group + int(rng.integers(1, 8))]
    long_row = max(query_lens)
    return attention_case(rng, query_lens=query_lens,
                          seq_lens=_requests(rng, device, query_lens, long_row + (256 if big(device) else 16)),
                          causal=bool(rng.integers(2)), **{**_shape(rng, device), "group": group})


@own_launch()
def wide_table(rng, device, launch):
    """Block-table rows that address far more tokens than their short sequences use (2^24 on the GPU, 2^12 on
    the CPU; the columns past the sequences hold stale ids, never followed). The launcher's own split count
    must stay the one the multiprocessors ask for, not what the table could hold: past 65535 splits (a table
    of 2^24 tokens at 128 keys per split) a GPU grid cannot launch."""
    query_lens = [1] * _batch(rng, device, 2, 4)
    case = attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 40),
                          causal=bool(rng.integers(2)), **_shape(rng, device, groups=(1, 4, 8)))
    table, block_size = case.inputs["block_table"], case.inputs["k_cache"].shape[1]
    columns = -(-(2**24 if big(device) else 2**12) // block_size) - table.shape[1]
    stale = torch.full((table.shape[0], columns), case.inputs["k_cache"].shape[0], dtype=torch.int32)
    case.inputs["block_table"] = torch.cat([table, stale], 1)
    case.note += f", table of {case.inputs['block_table'].shape[1] * block_size} tokens"
    return case


def big_offsets(rng, device, launch, layout):
    """On the GPU, one view per family spread so that the last row a request reads or writes lies 2^31
    elements or more past the first, which int32 offset arithmetic wraps: ``query`` rows, ``out`` rows,
    ``block_table`` rows or cache blocks (``caches``); three batch rows, so each stride stays below 2^31 and
    is passed as an int32; views of up to 8.6 GB, only their rows written. The CPU runs the same layouts a
    few thousand elements apart."""
    reach = offset_reach(rng, device)
    query_lens = [int(rng.integers(1, 4)) for _ in range(3)]
    case = attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens, 40),
                          causal=bool(rng.integers(2)), **_shape(rng, device))
    if layout == "caches":  # cut past the last block a sequence reaches, which then lies `reach` past block 0
        last = int((~case.unwritten["k_cache"]).flatten(1).any(1).nonzero().max())
        for cache in ("k_cache", "v_cache"):
            case.unwritten[cache] = case.unwritten[cache][:last + 1].clone()
            case.inputs[cache] = spread(case.inputs[cache][:last + 1], 0, -(-reach // last) * last)
    else:
        case.inputs[layout] = spread(case.inputs[layout], 0, reach)
    case.note += f", {layout} spread over {reach} elements"
    return case


def _emptied(case: Case, names: tuple[str, ...], dim: int) -> Case:
    """``case`` with the tensors ``names`` (and their unwritten masks) cut to size 0 along ``dim``."""
    for name in names:
        case.inputs[name] = case.inputs[name].narrow(dim, 0, 0).contiguous()
        if name in case.unwritten:
            case.unwritten[name] = case.unwritten[name].narrow(dim, 0, 0).contiguous()
    return case


def no_keys(rng, device, launch):
    """Requests with queries but no key (seq_len 0: their out rows stay untouched) among ones with both."""
    query_lens = [int(rng.integers(1, 4)) for _ in range(_batch(rng, device, 3, 8))]
    seq_lens = [0 if i % 2 == 0 else s for i, s in enumerate(_requests(rng, device, query_lens, 40))]
    return attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)),
                          note="even rows without keys", **_shape(rng, device))


def one_element(rng, device, launch):
    """A cache of one element (one block of one slot, one KV head, head dim 1) that every batch row reads
    as its only key; query and out rows past the batch outnumber the head dim."""
    rows, group, dtype = int(rng.integers(1, 3)), pick(rng, (1, 3, 4)), pick(rng, DTYPES)
    pad_tokens = int(rng.integers(1, 4))
    k_cache, v_cache = _randn(rng, (1, 1, 1, 1), dtype), _randn(rng, (1, 1, 1, 1), dtype)
    inputs = {"query": _randn(rng, (rows + pad_tokens, group, 1), dtype), "k_cache": k_cache, "v_cache": v_cache,
              "block_table": torch.zeros((rows, 1), dtype=torch.int32), "seq_lens": int32([1] * rows),
              "query_start_loc": int32(range(rows + 1)), "scale": float(rng.uniform(0.5, 2.0)),
              "causal": bool(rng.integers(2)), "out": torch.full((rows + pad_tokens, group, 1), SENTINEL, dtype=dtype)}
    return Case(inputs=inputs, note=f"one-element cache, {rows} batch rows, group {group}, {pad_tokens} padded tokens")


def empty_inputs(rng, device, launch):
    """Inputs the launcher returns early on, or launches programs that find nothing to do: no batch rows, no
    query tokens (out rows to spare), head dim 0, a cache of no blocks (every sequence empty, so the queries'
    out rows stay untouched)."""
    shape = _shape(rng, device)
    kind = pick(rng, ("no batch rows", "no tokens", "head dim 0", "no blocks"))
    rows = _batch(rng, device, 3, 4)
    query_lens = [0] * rows if kind == "no tokens" else [int(rng.integers(1, 4)) for _ in range(rows)]
    seq_lens = [0] * rows if kind == "no blocks" else _requests(rng, device, query_lens, 40)
    if kind == "no batch rows":
        query_lens, seq_lens = [], []
    case = attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)),
                          extra_rows=int(rng.integers(0, 3)), pad_tokens=int(rng.integers(0, 3)), note=kind, **shape)
    if kind == "no tokens":  # out keeps rows past the (empty) batch
        case.inputs["out"] = torch.cat([case.inputs["out"], torch.full_like(case.inputs["out"][:1], SENTINEL)])
        return _emptied(case, ("query",), 0)
    if kind == "head dim 0":
        return _emptied(case, ("query", "k_cache", "v_cache", "out"), -1)
    if kind == "no blocks":
        return _emptied(case, ("k_cache", "v_cache"), 0)
    return case


# ---------------------------------------------------------------- non-finite scores through every split path

NONFINITE_KINDS = ("nan", "+inf", "overflow", "masked split", "dominant split", "equal maxima")
OVERFLOWING_KEY = 1e38  # times a query of at least 4 in head dim 0: past float32's range (bf16 and fp32 hold it)


def split_ranges(case: Case, launch: dict, device: str) -> list[list[tuple[int, int]]]:
    """Per batch row, the key positions ``[lo, hi)`` each KV split reads under ``launch`` (splits with no key
    left out), by the launcher's own tile rules: a split holds whole key tiles."""
    inputs = case.inputs
    num_tokens, num_q_heads, head_dim = inputs["query"].shape
    _, block_size, kv_heads, _ = inputs["k_cache"].shape
    starts = inputs["query_start_loc"].tolist()
    shape = launch_shape(num_tokens, len(starts) - 1, kv_heads, num_q_heads // kv_heads, head_dim,
                         inputs["block_table"].shape[1] * block_size, inputs["query"].dtype, torch.device(device),
                         **launch)
    keys, splits = shape["block_n"], shape["kv_splits"]
    ranges = []
    for length in inputs["seq_lens"][:len(starts) - 1].tolist():
        tiles = -(-length // keys)
        per_split = -(-tiles // splits) * keys  # whole tiles per split, as the kernel divides them
        ranges.append([(lo, min(lo + per_split, length)) for lo in range(0, length, per_split)] if length else [])
    return ranges


def _set_keys(case: Case, batch_row: int, positions, value=None, add=None) -> None:
    """Head dim 0 of every KV head's key at ``positions`` of ``batch_row``: set to ``value`` or raised by ``add``."""
    k_cache = case.inputs["k_cache"]
    positions = torch.as_tensor(positions, dtype=torch.int64).flatten()
    blocks = case.inputs["block_table"][batch_row].long()[positions // k_cache.shape[1]]
    slots = positions % k_cache.shape[1]
    if add is not None:
        k_cache[blocks, slots, :, 0] += add
    else:
        k_cache[blocks, slots, :, 0] = value


def _plant(rng, case: Case, batch_row: int, kind: str, parts: list[tuple[int, int]]) -> str:
    """Plants one ``kind`` of non-finite (or dominating) key in ``batch_row``'s splits ``parts``; returns a note."""
    length = parts[-1][1]
    dtype = case.inputs["k_cache"].dtype
    at = int(rng.integers(length))
    if kind in ("nan", "+inf"):
        _set_keys(case, batch_row, [at], float("nan") if kind == "nan" else float("inf"))
        return f"{kind} at {at}"
    if kind == "overflow":  # a finite key whose score is past float32's range: +-inf by the product alone
        sign = pick(rng, (1.0, -1.0))
        big_key = OVERFLOWING_KEY if dtype != torch.float16 else float("inf")  # fp16 holds no such key
        _set_keys(case, batch_row, [at], sign * big_key)
        return f"{'+' if sign > 0 else '-'}{big_key:g} at {at}"
    lo, hi = parts[int(rng.integers(len(parts)))]
    if kind == "masked split":  # every key of one split scores -inf: the split saw no weight
        _set_keys(case, batch_row, range(lo, hi), float("-inf"))
        return f"-inf on [{lo}, {hi})"
    if kind == "dominant split":  # its maximum far above the others': their weights underflow to 0
        _set_keys(case, batch_row, range(lo, hi), add=1000.0)
        outside = [p for p in range(length) if not lo <= p < hi] or [at]
        poison = pick(rng, (float("nan"), float("inf"), float("-inf")))
        where = outside[int(rng.integers(len(outside)))]
        _set_keys(case, batch_row, [where], poison)
        return f"[{lo}, {hi}) dominates, {poison} at {where}"
    # equal maxima: the same key, above every other, once in each split
    k_cache, table = case.inputs["k_cache"], case.inputs["block_table"][batch_row].long()
    bs = k_cache.shape[1]
    chosen = [int(rng.integers(a, b)) for a, b in parts]
    keys = torch.stack([k_cache[table[p // bs], p % bs] for p in range(length)])
    top = keys[chosen[0]].clone()
    top[:, 0] = keys[..., 0].max() + 8
    for p in chosen:
        k_cache[table[p // bs], p % bs] = top
    poison = pick(rng, (None, float("nan"), float("-inf")))
    if poison is not None:
        _set_keys(case, batch_row, [at], poison)
    return f"equal maxima at {chosen}" + (f", {poison} at {at}" if poison is not None else "")


def _plant_drawn(rng, case: Case, batch_row: int, parts: list[tuple[int, int]]) -> str:
    """One ``NONFINITE_KINDS`` drawn for the row, planted."""
    return _plant(rng, case, batch_row, pick(rng, NONFINITE_KINDS), parts)


def _last_split_dominates(rng, case: Case, batch_row: int, parts: list[tuple[int, int]]) -> str:
    """The row's last split raised far above the others (no poison elsewhere): their weights underflow to 0."""
    lo, hi = parts[-1]
    _set_keys(case, batch_row, range(lo, hi), add=1000.0)
    return f"the last of {len(parts)} split(s), [{lo}, {hi}), dominates"


def nonfinite_case(rng, device, launch, *, split: bool, plant=_plant_drawn) -> Case:
    """NaN, +-inf and float32-overflowing keys where queries see them, one ``NONFINITE_KINDS`` per batch row
    (or what ``plant`` puts there); every query positive in head dim 0, so a key's sign there gives its score's.
    One split (tables shorter than two key tiles) or several (tables of 512 tokens, 2048 on the GPU, and
    sequences across them)."""
    shape = _shape(rng, device, dtypes=DTYPES)
    if split:
        rows = int(rng.integers(1, 3))
        shape["kv_heads"] = 1 if rows == 2 else int(rng.integers(1, 3))
        capacity = 2048 if big(device) else 512
        query_lens = [int(rng.integers(1, 4)) for _ in range(rows)]
        seq_lens = [int(rng.integers(max(q, capacity // 8), capacity // 2 + 1)) for q in query_lens]
    else:
        rows, capacity = _batch(rng, device), 0
        query_lens = [int(rng.integers(1, 4)) for _ in range(rows)]
        seq_lens = _requests(rng, device, query_lens, 30)
    case = attention_case(rng, query_lens=query_lens, seq_lens=seq_lens, causal=bool(rng.integers(2)),
                          min_width=capacity // shape["block_size"], **shape)
    width = max(-(-max(seq_lens) // shape["block_size"]), capacity // shape["block_size"])
    case.inputs["block_table"] = case.inputs["block_table"][:, :width].contiguous()
    query = case.inputs["query"]
    query[..., 0] = query[..., 0].abs() + 4
    notes = []
    for batch_row, parts in enumerate(split_ranges(case, launch, device)):
        notes.append(f"row {batch_row} over {len(parts)} split(s): {plant(rng, case, batch_row, parts)}")
    case.note += "; " + "; ".join(notes)
    return case


@own_launch()
def nonfinite_keys(rng, device, launch):
    """NaN, +inf, and keys whose score overflows float32 (a +inf score: the row is NaN; -inf: no weight),
    visible to some queries of a causal row and not others; a row all -inf (zeros); a key far above the rest
    beside a NaN or infinite one; equal maxima. The launcher's own shape: tables under two key tiles take one
    KV split, so the kernel normalizes and writes each row itself."""
    return nonfinite_case(rng, device, launch, split=False)


def nonfinite_keys_split(rng, device, launch):
    """``nonfinite_keys`` over several KV splits (2 to 4 on the CPU, up to 16 on the GPU), planted by where the
    splits fall: a NaN or +inf partial the combine must carry to the output, a split whose keys all score -inf
    (skipped), a split that dominates while another holds NaN (a weight of 0 times NaN is NaN), equal maxima
    across splits."""
    return nonfinite_case(rng, device, launch, split=True)


def last_split_dominates(rng, device, launch):
    """``nonfinite_keys_split``'s several KV splits with every batch row's last split far above the rest and
    nothing non-finite: the overall maximum comes from the last split, so a combine whose maximum misses a
    split weighs it by an exponential past float32's range (inf / inf, NaN) where the answer is finite."""
    return nonfinite_case(rng, device, launch, split=True, plant=_last_split_dominates)


# Head dims that change the kernel's path: the head-dim tile (16 to 512), whether the head dim fills it (no
# mask along it), the combine's programs per head (tile / 32), the fp32 key tile narrowed at 128 and up.
PATH_HEAD_DIMS = (1, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512)


def head_dim(rng, device, launch, dim):
    """Every head dim class: the powers of two from 16 to 512 (the tile filled, no mask along it) and one past
    each (the tile half empty, masked), and 1; fp16, bf16 or fp32, one split or several."""
    query_lens = [int(rng.integers(1, 5)) for _ in range(_batch(rng, device, 2, 4))]
    shape = {**_shape(rng, device, dtypes=DTYPES), "head_dim": dim}
    return attention_case(rng, query_lens=query_lens, seq_lens=_requests(rng, device, query_lens,
                                                                         600 if big(device) else 40),
                          causal=bool(rng.integers(2)), note=f"head dim {dim}", **shape)


def head_dim_48(rng, device, launch):
    """A head dim that is a multiple of 16 but no power of two: its tile (64) is not filled, though each
    16-wide slice of the head is, so only a mask against the head dim itself keeps loads and stores in the head
    (the PATH_HEAD_DIMS classes are powers of two, which fill their tile, and one past them, which no multiple
    of 16 is)."""
    return head_dim(rng, device, launch, 48)


FAMILIES = {"decode": decode, "multi_query": multi_query, "edges": edges, "long": long, "gqa": gqa,
            "dtypes": dtypes, "chunks": chunks, "widest_tiles": widest_tiles,
            "overflowing_tiles": overflowing_tiles, "wide_groups": wide_groups, "float32": float32,
            "float32_wide": float32_wide, "two_splits": two_splits, "large_scores": large_scores,
            "level_scores": level_scores, "cache_layouts": cache_layouts,
            "empty": empty_inputs, "no_keys": no_keys, "one_element": one_element, "many_queries": many_queries,
            "wide_table": wide_table, "infinite_keys": infinite_keys,
            "infinite_keys_split": infinite_keys_split,
            "nonfinite_keys": nonfinite_keys, "nonfinite_keys_split": nonfinite_keys_split,
            "last_split_dominates": last_split_dominates,
            **one_per_value(head_dim, "dim", PATH_HEAD_DIMS), "head_dim_48": head_dim_48,
            **one_per_value(big_offsets, "layout", ("query", "out", "block_table", "caches")),
            # query and out as slices of wider buffers, a padded block table (the caches keep one layout:
            # the launcher asks K and V for the same strides)
            "layouts": laid_out(edges, "query", "out", "block_table")}

# ---------------------------------------------------------------- prefix-cache masking end to end


def prefix_masked_draft(*, idx_mapping, num_cached_tokens, target_query_start_loc, target_positions, num_rejected,
                        block_table, block_size, num_draft_tokens, anchor_first, context_key, context_value, query,
                        query_key, query_value, k_cache, v_cache, scale, out, **launch) -> None:
    """One draft step in production order (docs/contracts/draft_inputs.md#layouts, fix 4): draft inputs (slots from
    the unshifted table, seq_lens shortened by the restored blocks), context and query KV writes, the block-table
    shift past the restored blocks, then non-causal paged attention. Writes k_cache, v_cache, block_table and out.

    Token ids and sampling rows are prepared too but play no part here (greedy placeholders)."""
    dev = query.device
    batch_rows, table_rows = idx_mapping.numel(), block_table.shape[0]
    num_slots, k = num_cached_tokens.numel(), num_draft_tokens
    i32, i64 = torch.int32, torch.int64

    def empty(size, dtype):
        return torch.empty(size, dtype=dtype, device=dev)

    context_slots, query_slots = empty(context_key.shape[0], i64), empty(query.shape[0], i64)
    query_start_loc, seq_lens = empty(table_rows + 1, i32), empty(table_rows, i32)
    prepared = prepare_draft_inputs(
        idx_mapping=idx_mapping, target_query_start_loc=target_query_start_loc, target_positions=target_positions,
        num_sampled=torch.ones(batch_rows, dtype=i32, device=dev), num_rejected=num_rejected,
        last_sampled=torch.zeros(num_slots, dtype=i64, device=dev),
        next_prefill_tokens=torch.zeros(num_slots, dtype=i32, device=dev), num_cached_tokens=num_cached_tokens,
        block_table=block_table, block_size=block_size, num_draft_tokens=k, anchor_first=anchor_first,
        mask_token_id=0, max_model_len=block_table.shape[1] * block_size + k + 2,
        context_positions=empty(context_key.shape[0], i64), context_slot_mapping=context_slots,
        input_ids=empty(query.shape[0], i32), positions=empty(query.shape[0], i64), query_slot_mapping=query_slots,
        sample_indices=empty(table_rows * k, i64), sample_pos=empty(table_rows * k, i64),
        sample_idx_mapping=empty(table_rows * k, i32), query_start_loc=query_start_loc, seq_lens=seq_lens,
        draft_tokens=empty((table_rows, k), i64))
    if not prepared:  # an unaligned restored prefix: the step drafts nothing
        return
    write_kv(context_key, context_value, context_slots, k_cache, v_cache)
    write_kv(query_key, query_value, query_slots, k_cache, v_cache)
    shift_block_table_rows(block_table, idx_mapping, num_cached_tokens, seq_lens, block_size)
    paged_attention(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale, causal=False,
                    out=out, **launch)


def prefix_case(rng, device, *, batch_rows, pad_rows=0, max_cached_tokens, max_history, max_context,
                note="") -> Case:
    """Requests whose first ``nc`` tokens (whole blocks) were restored from the prefix cache and never got
    draft KV (NaN), then ``history`` tokens computed in earlier steps, then this step's target rows
    (a rejected suffix among them) and the draft query block."""
    shape = _shape(rng, device, groups=(1, 4, 8))
    bs, kv_heads, head_dim, dtype = shape["block_size"], shape["kv_heads"], shape["head_dim"], shape["dtype"]
    anchor_first = bool(rng.integers(2))
    k = int(rng.integers(1, 8 if big(device) else 4))
    q = k if anchor_first else k + 1
    idx_mapping, num_slots = slots_for(rng, batch_rows, int(rng.integers(0, 3)))
    cached = rng.integers(0, 40, num_slots) * bs + 1  # slots outside the batch: unaligned, must not matter
    requests = []  # (restored, first target position, target rows, rejected)
    for batch_row in range(batch_rows):
        restored = int(rng.integers(0, max_cached_tokens // bs + 1)) * bs
        cached[int(idx_mapping[batch_row])] = restored
        n_ctx = int(rng.integers(1, max_context + 1))
        rejected = int(rng.integers(0, n_ctx)) if rng.random() < 0.5 else 0
        requests.append((restored, restored + int(rng.integers(0, max_history + 1)), n_ctx, rejected))
    width = max(-(-(first + n_ctx - rejected + q) // bs) for _, first, n_ctx, rejected in requests)
    width += int(rng.integers(0, 2))
    table = distinct_blocks(rng, batch_rows + pad_rows, width)
    cache_shape = (table.numel() + 1, bs, kv_heads, head_dim)
    k_cache, v_cache = _poisoned(cache_shape, dtype), _poisoned(cache_shape, dtype)
    positions = []
    for batch_row, (restored, first, n_ctx, _) in enumerate(requests):
        history = torch.arange(restored, first)  # computed in earlier steps: real KV
        blocks = table[batch_row].long()[history // bs]
        k_cache[blocks, history % bs] = _randn(rng, (len(history), kv_heads, head_dim), dtype)
        v_cache[blocks, history % bs] = _randn(rng, (len(history), kv_heads, head_dim), dtype)
        positions.extend(range(first, first + n_ctx))
    num_query_rows = (batch_rows + pad_rows) * q
    inputs = {
        "idx_mapping": idx_mapping, "num_cached_tokens": int32(cached),
        "target_query_start_loc": int32(np.concatenate([[0], np.cumsum([r[2] for r in requests])])),
        "target_positions": int64(positions), "num_rejected": int32([r[3] for r in requests]),
        "block_table": table, "block_size": bs, "num_draft_tokens": k, "anchor_first": anchor_first,
        "context_key": _randn(rng, (len(positions), kv_heads, head_dim), dtype),
        "context_value": _randn(rng, (len(positions), kv_heads, head_dim), dtype),
        "query": _randn(rng, (num_query_rows, kv_heads * shape["group"], head_dim), dtype),
        "query_key": _randn(rng, (num_query_rows, kv_heads, head_dim), dtype),
        "query_value": _randn(rng, (num_query_rows, kv_heads, head_dim), dtype),
        "v_cache": v_cache, "k_cache": k_cache, "scale": float(head_dim ** -0.5),
        "out": torch.full((num_query_rows, kv_heads * shape["group"], head_dim), SENTINEL, dtype=dtype)}
    restored = [r[0] for r in requests]
    return Case(inputs=inputs, unwritten={"k_cache": _unwritten(k_cache), "v_cache": _unwritten(v_cache)},
                note=f"restored {restored} B={batch_rows}+{pad_rows} Q={q} bs={bs} {str(dtype)[6:]} {note}".strip())


def prefix_restored(rng, device, launch):
    """Whole restored blocks before the computed tokens (some requests with none); under CUDA-graph padding
    the batch rows past the live ones get no KV, no shift and no output."""
    return prefix_case(rng, device, batch_rows=_batch(rng, device, 2, 8), pad_rows=int(rng.integers(0, 3)),
                       max_cached_tokens=640 if big(device) else 48, max_history=300 if big(device) else 20,
                       max_context=40 if big(device) else 6)


def prefix_long(rng, device, launch):
    """Long restored prefixes (up to 8k tokens on the GPU) ahead of a short computed tail."""
    return prefix_case(rng, device, batch_rows=_batch(rng, device, 1, 2), max_cached_tokens=8192 if big(device) else 96,
                       max_history=2000 if big(device) else 40, max_context=16 if big(device) else 4, note="long")


PREFIX_FAMILIES = {"restored": prefix_restored, "long": prefix_long}
