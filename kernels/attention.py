"""Paged attention for draft (and decode) steps: queries that are the last tokens of their sequences,
keys and values read through a block table, causal or not (DFlash / DSpark draft layers are not).

Request b (a batch row) owns query rows ``[query_start_loc[b], query_start_loc[b+1])``; they are the
last ``q_len`` of its ``seq_lens[b]`` tokens, so query i sits at position ``seq_len - q_len + i``: a
request with queries has no key or at least as many keys as queries (the draft's seq_lens are at
least its query count, docs/contracts/draft_inputs.md#layouts, fix 4), and no more keys than its block-table row
addresses. Causal: it sees key positions up to its own. Non-causal: every query sees all ``seq_len`` positions.
Only those positions are read, through ``block_table[b, pos // block_size]``: never a block past
them, never a slot of another block. A request with no query or no key writes and reads nothing.
A query whose every visible key scores -inf (a key holding -inf, or an infinite query) gets zeros, as
FlashAttention does: no key carries weight. A NaN score, or +inf, makes its row NaN, in one KV split or
across several. Scores are float32: a query-key product past its range is +-inf.

Work split: one program per (batch row, KV head, KV split). Its rows are the query heads of one
GQA group for a chunk of queries, so each key and value is loaded once for the whole group. With
several splits (small batches, long contexts: flash-decoding) each program writes a partial result
and a second kernel combines the splits. The grid and the split count depend on tensor shapes only
and every per-step value is read on the device, so both launches can be captured in a CUDA graph
and replayed with other seq_lens, query_start_loc and block tables.
"""

import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from kernels import runtime, validate

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = math.log2(math.e)

# Values that change per step or per model are not specialized: one compile serves every batch.
# The block size is a compile-time constant (one compile per block size): block indices of power-of-two
# sizes are shifts, and the compiler sees which keys share a block-table entry.
_RUNTIME_INTS = ["causal", "group", "queries_per_chunk", "num_q_heads", "head_dim", "num_splits", "table_width",
                 "table_stride"]


# Row reductions go through tl.reduce with Triton's own combine functions: compiled, that is exactly
# tl.max / tl.sum; interpreted, it skips a nested @jit call, which re-patches triton.language each time
# (milliseconds per call). The same cost is why the kernels inline their small helpers.
_MAX = tl.standard._elementwise_max
_SUM = tl.standard._sum_combine


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _paged_attention_kernel(
        query_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
        partial_acc_ptr, partial_ml_ptr, qk_scale, causal, group, queries_per_chunk, num_q_heads, head_dim,
        num_splits, table_width, table_stride, q_stride_t, q_stride_h, o_stride_t, o_stride_h,
        kv_stride_b, kv_stride_t, kv_stride_h,
        BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        EVEN_D: tl.constexpr, SPLIT: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    batch_row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + batch_row)
    q_len = tl.load(query_start_loc_ptr + batch_row + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + batch_row)
    if (q_len > 0) & (seq_len > 0):
        # This split's share of the sequence, in whole tiles.
        tiles_per_split = ((seq_len + BLOCK_N - 1) // BLOCK_N + num_splits - 1) // num_splits
        kv_lo = split * tiles_per_split * BLOCK_N
        kv_hi = tl.minimum(kv_lo + tiles_per_split * BLOCK_N, seq_len)
        rows = tl.arange(0, BLOCK_M)
        q_head = kv_head * group + rows % group  # query head h reads KV head h // group
        dims = tl.arange(0, BLOCK_D)
        # A head dim that fills the tile needs no mask along it, so K and V rows load as 16-byte vectors.
        in_dim = tl.full([BLOCK_D], 1, tl.int1) if EVEN_D else dims < head_dim
        table_row = block_table_ptr + batch_row.to(tl.int64) * table_stride
        k_head = k_cache_ptr + kv_head * kv_stride_h
        v_head = v_cache_ptr + kv_head * kv_stride_h
        for chunk_start in range(0, q_len, queries_per_chunk):
            # Row r holds query chunk_start + r // group of the request (for query head q_head[r]).
            query_idx = chunk_start + rows // group
            live = (rows // group < queries_per_chunk) & (query_idx < q_len)
            token = (q_start + query_idx).to(tl.int64)
            q = tl.load(query_ptr + token[:, None] * q_stride_t + q_head[:, None] * q_stride_h + dims[None, :],
                        mask=live[:, None] & in_dim[None, :], other=0.0)
            if UPCAST:  # the interpreter computes 16-bit floats on their bit patterns
                q = q.to(tl.float32)
            # The last key position each row sees: its own (causal) or the sequence's last; no tile past
            # the chunk's last query is read.
            last_key = tl.where(causal != 0, seq_len - q_len + query_idx, seq_len - 1)
            chunk_end = tl.minimum(chunk_start + queries_per_chunk, q_len)
            hi = tl.minimum(kv_hi, seq_len - (q_len - chunk_end) * (causal != 0))
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.full([BLOCK_M], 0.0, tl.float32)
            acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
            for start in range(kv_lo, hi, BLOCK_N):
                pos = start + tl.arange(0, BLOCK_N)
                block_idx = pos // BLOCK_SIZE
                in_range = (pos < hi) & (block_idx < table_width)
                block_id = tl.load(table_row + block_idx, mask=in_range, other=0).to(tl.int64)
                kv_rows = (block_id * kv_stride_b + (pos % BLOCK_SIZE) * kv_stride_t)[:, None] + dims[None, :]
                kv_mask = in_range[:, None] & in_dim[None, :]
                k = tl.load(k_head + kv_rows, mask=kv_mask, other=0.0)
                v = tl.load(v_head + kv_rows, mask=kv_mask, other=0.0)
                if UPCAST:
                    k = k.to(tl.float32)
                s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
                visible = in_range[None, :] & (pos[None, :] <= last_key[:, None])
                s = tl.where(visible, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.reduce(s, 1, _MAX))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
                alpha = tl.exp2(m_i - m_safe)
                p = tl.exp2(s - m_safe[:, None])
                l_i = l_i * alpha + tl.reduce(p, 1, _SUM)
                # Probabilities enter the second product in the cache's precision, as in FlashAttention.
                p_lo = p.to(v_cache_ptr.dtype.element_ty)
                if UPCAST:
                    p_lo = p_lo.to(tl.float32)
                    v = v.to(tl.float32)
                acc = acc * alpha[:, None] + tl.dot(p_lo, v, input_precision=DOT_PRECISION)
                m_i = m_new
            if not SPLIT:
                o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that sees no key gets 0
                tl.store(out_ptr + token[:, None] * o_stride_t + q_head[:, None] * o_stride_h + dims[None, :],
                         o.to(out_ptr.dtype.element_ty), mask=live[:, None] & in_dim[None, :])
            else:
                part = (token * num_q_heads + q_head) * num_splits + split
                tl.store(partial_ml_ptr + part * 2, m_i, mask=live)
                tl.store(partial_ml_ptr + part * 2 + 1, l_i, mask=live)
                # A split that saw no key for a row (l == 0) leaves its accumulator unwritten and the combine
                # skips it. Not m == -inf: a row whose keys were all NaN keeps m at -inf on the GPU (max ignores
                # NaN) but has l = NaN, and that NaN must reach the output.
                tl.store(partial_acc_ptr + part[:, None] * BLOCK_D + dims[None, :], acc,
                         mask=(live & (l_i != 0))[:, None])


@triton.jit(do_not_specialize=_RUNTIME_INTS[1:6])
def _combine_splits_kernel(seq_lens_ptr, query_start_loc_ptr, out_ptr, partial_acc_ptr, partial_ml_ptr, group,
                           queries_per_chunk, num_q_heads, head_dim, num_splits, o_stride_t, o_stride_h,
                           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, COMBINE_D: tl.constexpr):
    """Weights each split's partial result by exp2(its max - the overall max); the attention kernel's rows,
    COMBINE_D of the head dims per program (more programs than batch rows times KV heads)."""
    batch_row = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_start = tl.load(query_start_loc_ptr + batch_row)
    q_len = tl.load(query_start_loc_ptr + batch_row + 1) - q_start
    if (q_len > 0) & (tl.load(seq_lens_ptr + batch_row) > 0):
        rows = tl.arange(0, BLOCK_M)
        q_head = kv_head * group + rows % group
        dims = tl.program_id(2) * COMBINE_D + tl.arange(0, COMBINE_D)
        for chunk_start in range(0, q_len, queries_per_chunk):
            query_idx = chunk_start + rows // group
            live = (rows // group < queries_per_chunk) & (query_idx < q_len)
            token = (q_start + query_idx).to(tl.int64)
            first = (token * num_q_heads + q_head) * num_splits
            m_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
            for split in range(num_splits):
                m_max = tl.maximum(m_max, tl.load(partial_ml_ptr + (first + split) * 2, mask=live,
                                                  other=float("-inf")))
            m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
            l_sum = tl.full([BLOCK_M], 0.0, tl.float32)
            acc = tl.full([BLOCK_M, COMBINE_D], 0.0, tl.float32)
            for split in range(num_splits):
                part = first + split
                m_s = tl.load(partial_ml_ptr + part * 2, mask=live, other=float("-inf"))
                l_s = tl.load(partial_ml_ptr + part * 2 + 1, mask=live, other=0.0)
                seen = live & (l_s != 0)  # NaN counts as seen: poison must propagate
                weight = tl.where(seen, tl.exp2(m_s - m_safe), 0.0)
                l_sum += weight * l_s
                acc += weight[:, None] * tl.load(partial_acc_ptr + part[:, None] * BLOCK_D + dims[None, :],
                                                 mask=seen[:, None], other=0.0)
            o = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]
            tl.store(out_ptr + token[:, None] * o_stride_t + q_head[:, None] * o_stride_h + dims[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=live[:, None] & (dims < head_dim)[None, :])


COMBINE_D = 32  # head dims per combine program
_SM_COUNT: dict[int, int] = {}


# The interpreter has no multiprocessors. It counts two, so a launch of two batch rows or KV heads in all takes two
# KV splits there and runs the combine pass in the launcher's own shape, as on a GPU.
INTERPRETER_MULTIPROCESSORS = 2


def _multiprocessors(device: torch.device) -> int:
    """Multiprocessors to fill (INTERPRETER_MULTIPROCESSORS under the interpreter); read once per device, never per
    launch."""
    if device.type != "cuda":
        return INTERPRETER_MULTIPROCESSORS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


# Programs per multiprocessor the KV splits aim at. On an H100 (bf16, GQA 8, D 128, 4 requests x 8 KV heads,
# 132 multiprocessors) decode at 8k keys takes 66 us over 8 splits, 75 us over 17 and 87 us over 33, at 32k
# 198, 208 and 219 us: fewer partial results to write and combine, longer pipelined runs per program, and
# two decode programs (three stages of 64-key K and V tiles each) are what a multiprocessor's shared memory holds.
PROGRAMS_PER_SM = 2


def launch_shape(num_tokens: int, num_batch_rows: int, num_kv_heads: int, group: int, head_dim: int,
                 capacity: int, dtype: torch.dtype, device: torch.device, *, block_m=None, block_n=None,
                 kv_splits=None, num_warps=None, num_stages=None) -> dict:
    """Tile sizes and split count from shapes alone (never from per-step values), knobs taking precedence.

    A program's rows are whole GQA groups for as many queries as fit (sized from the mean query
    count per batch row). Splits aim at PROGRAMS_PER_SM programs per multiprocessor, but each split
    keeps at least two key tiles and twice its rows in keys, so its key and value reads stay above
    the partial results it writes (``capacity``, the tokens a block-table row can address, bounds
    the sequence).
    """
    block_d = max(16, triton.next_power_of_2(head_dim))
    if block_m is None:
        mean_queries = triton.cdiv(num_tokens, max(1, num_batch_rows))
        per_chunk = min(triton.next_power_of_2(mean_queries), max(1, 128 // group))
        block_m = max(16, triton.next_power_of_2(per_chunk * group))
    elif block_m < group:
        raise ValueError(f"block_m: {block_m} rows cannot hold one GQA group of {group} query heads")
    if block_n is None:
        block_n = 32 if dtype == torch.float32 else 64
    if dtype == torch.float32 and block_d >= 128:
        block_n = min(block_n, 32)  # fp32 tiles of 64 keys overflow shared memory at two stages
    rows = (block_m // group) * group
    if kv_splits is None:
        # Rounded down: one program too many past a full wave waits for a whole second one (at 32k keys 9 splits
        # took 283 us against 8's 198 on that H100).
        wanted = PROGRAMS_PER_SM * _multiprocessors(device) // max(1, num_batch_rows * num_kv_heads)
        kv_splits = max(1, min(wanted, capacity // max(2 * block_n, 2 * rows)))
    if num_stages is None:
        # Decode-sized programs keep three stages of K and V tiles in flight where they fit three times in shared
        # memory; programs of 64+ rows already hold a large Q tile and run 3-5% faster with two (H200, draft-16).
        num_stages = 3 if block_m < 64 and 2 * block_n * block_d * dtype.itemsize <= 48 * 1024 else 2
    return {"block_m": block_m, "block_n": block_n, "block_d": block_d, "kv_splits": kv_splits,
            "num_warps": num_warps or (8 if block_m >= 64 else 4), "num_stages": num_stages,
            "queries_per_chunk": block_m // group}


def _check_indices(query_start_loc, block_table, seq_lens, num_tokens: int, num_blocks: int,
                   block_size: int) -> None:
    """What the kernel follows (read back on the CPU, on a GPU only with SPECSAN_CHECK_INDICES=1): query
    offsets within the queries, sequence lengths within their table row, and every block id a sequence
    reaches within the cache."""
    validate.offsets("query_start_loc", query_start_loc, num_tokens)
    validate.indices("seq_lens", seq_lens, 0, block_table.shape[1] * block_size + 1, what="sequence length")

    def reached():  # the columns a row's sequence reaches: those whose first token is below its length
        first_tokens = torch.arange(block_table.shape[1], device=block_table.device) * block_size
        return first_tokens[None, :] < seq_lens[:, None]

    validate.indices("block_table", block_table, 0, num_blocks, what="block id", where=reached)


def fitting_tiles(shape: dict, group: int, *, rows_forced: bool, keys_forced: bool) -> list[tuple[int, int]]:
    """(block_m, block_n) to launch in turn until one fits the device: the shape's own, then, for the sizes
    the caller did not force, key tiles halved down to 16, then programs of half the rows (down to one GQA
    group's) with each key tile again. The launcher sizes tiles from shapes alone, and at head dim 512, or 256
    under a group past 128, its own programs overflow an H200's shared memory (Triton raises OutOfResources
    before anything runs)."""
    def halvings(first: int, last: int, forced: bool) -> list[int]:
        sizes = [first]
        while not forced and sizes[-1] // 2 >= last:
            sizes.append(sizes[-1] // 2)
        return sizes

    rows = halvings(shape["block_m"], max(16, triton.next_power_of_2(group)), rows_forced)
    keys = halvings(shape["block_n"], 16, keys_forced)
    return [(block_m, block_n) for block_m in rows for block_n in keys]


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, *, scale: float, causal: bool,
                    out: torch.Tensor, block_m: int | None = None, block_n: int | None = None,
                    kv_splits: int | None = None, num_warps: int | None = None,
                    num_stages: int | None = None) -> None:
    """Attention of every batch row's queries over its paged keys and values, written into ``out``.

    query [T, H_q, D]; k_cache / v_cache [num_blocks, block_size >= 1, H_kv, D] (H_q a multiple of H_kv;
    query head h reads KV head h // (H_q / H_kv)); block_table int32 [>= B, W] and seq_lens int32
    [>= B] by batch row, ``seq_lens[b]`` 0 or from the row's query count to ``W * block_size`` (the upper
    bound is checked where indices are, see ``_check_indices``; the lower is not); query_start_loc int32
    [B + 1]; out [>= T, H_q, D]. Query, caches and out
    share one dtype (fp16, bf16 or fp32). Rows of ``out`` outside the batch's queries are untouched.
    ``block_m`` (rows per program: query heads of a GQA group times queries), ``block_n`` (keys per
    tile), ``kv_splits``, ``num_warps`` and ``num_stages`` are launch knobs for stress sweeps and benches.
    Its branches are the argument checks, one refusal each, in the order a caller reads them, then the launch
    choice: splitting them would scatter the refusals the refused family checks one by one.
    """
    validate.tensor("query", query, dtype=FLOAT_DTYPES, ndim=3)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        validate.tensor(name, t, dtype=FLOAT_DTYPES, ndim=4)
    validate.tensor("out", out, dtype=FLOAT_DTYPES, ndim=3)
    validate.tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    validate.tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=1)
    validate.tensor("query_start_loc", query_start_loc, dtype=torch.int32, ndim=1, min_numel=1)
    device = validate.on_kernel_device(query=query, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                       seq_lens=seq_lens, query_start_loc=query_start_loc, out=out)
    validate.same_dtype("use one dtype throughout", query=query, k_cache=k_cache, v_cache=v_cache, out=out)
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} and strides {v_cache.stride()} must equal k_cache's "
                         f"{tuple(k_cache.shape)} and {k_cache.stride()} (one layout for both, as in a combined KV "
                         "tensor)")
    num_tokens, num_q_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]}, but query has {head_dim}")
    if k_cache.shape[1] == 0:
        raise ValueError("k_cache: block size 0; a cache block holds at least one token")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(f"query: {num_q_heads} heads is not a multiple of the caches' {num_kv_heads} KV heads")
    if out.shape[0] < num_tokens or tuple(out.shape[1:]) != (num_q_heads, head_dim):
        raise ValueError(f"out: shape {tuple(out.shape)}, expected [>= {num_tokens}, {num_q_heads}, {head_dim}]")
    num_batch_rows = query_start_loc.numel() - 1
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if t.shape[0] < num_batch_rows:
            raise ValueError(f"{name}: {t.shape[0]} rows, but query_start_loc describes {num_batch_rows} batch rows")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite float, got {scale!r}")
    for name, knob in (("block_m", block_m), ("block_n", block_n), ("num_warps", num_warps)):
        if knob is not None:
            validate.power_of_two(name, knob)
    if block_n is not None and block_n < 16:
        raise ValueError(f"block_n: {block_n}, expected at least 16 (the smallest matrix-product tile)")
    for name, knob in (("kv_splits", kv_splits), ("num_stages", num_stages)):
        if knob is not None:
            validate.positive_int(name, knob)
    if num_batch_rows == 0 or num_tokens == 0:
        return
    group = num_q_heads // num_kv_heads
    block_size = k_cache.shape[1]
    # Before the return for empty caches: a sequence that reaches a block of a cache with none is refused.
    _check_indices(query_start_loc, block_table[:num_batch_rows], seq_lens[:num_batch_rows], num_tokens,
                   k_cache.shape[0], block_size)
    if head_dim == 0 or k_cache.numel() == 0:
        return

    def shape_of(rows, keys):
        return launch_shape(num_tokens, num_batch_rows, num_kv_heads, group, head_dim,
                            block_table.shape[1] * block_size, query.dtype, device, block_m=rows, block_n=keys,
                            kv_splits=kv_splits, num_warps=num_warps, num_stages=num_stages)

    tiles = fitting_tiles(shape_of(block_m, block_n), group, rows_forced=block_m is not None,
                          keys_forced=block_n is not None)
    for attempt, (rows, keys) in enumerate(tiles):
        try:
            _launch(shape_of(rows, keys), query, k_cache, v_cache, block_table, seq_lens, query_start_loc, out,
                    scale=scale, causal=causal, group=group)
            return
        except OutOfResources as exc:
            if attempt < len(tiles) - 1:
                continue
            if block_m is not None or block_n is not None:
                raise  # a forced tile is the caller's to fit
            raise ValueError(f"query: head dim {head_dim} with {group} query heads per KV head in {query.dtype}: "
                             f"no program of whole groups fits this device ({exc}); use a smaller head dim or "
                             "group") from exc


def _launch(shape: dict, query, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, *, scale, causal,
            group: int) -> None:
    """The attention kernel (and, over several splits, the combine) at ``shape``."""
    num_tokens, num_q_heads, head_dim = query.shape
    num_batch_rows, num_kv_heads = query_start_loc.numel() - 1, k_cache.shape[2]
    splits, block_d = shape["kv_splits"], shape["block_d"]
    device = query.device
    if splits > 1:
        partial_acc = torch.empty((num_tokens, num_q_heads, splits, block_d), dtype=torch.float32, device=device)
        partial_ml = torch.empty((num_tokens, num_q_heads, splits, 2), dtype=torch.float32, device=device)
    else:
        partial_acc = partial_ml = out  # not read: the single split writes out directly
    common = {"group": group, "queries_per_chunk": shape["queries_per_chunk"], "num_q_heads": num_q_heads,
              "head_dim": head_dim, "num_splits": splits}
    _paged_attention_kernel[(num_batch_rows, num_kv_heads, splits)](
        query, k_cache, v_cache, block_table, seq_lens, query_start_loc, out, partial_acc, partial_ml,
        float(scale) * LOG2E, int(bool(causal)), table_width=block_table.shape[1],
        table_stride=block_table.stride(0), q_stride_t=query.stride(0), q_stride_h=query.stride(1),
        o_stride_t=out.stride(0), o_stride_h=out.stride(1), kv_stride_b=k_cache.stride(0),
        kv_stride_t=k_cache.stride(1), kv_stride_h=k_cache.stride(2), BLOCK_SIZE=k_cache.shape[1],
        BLOCK_M=shape["block_m"], BLOCK_N=shape["block_n"], BLOCK_D=block_d, EVEN_D=head_dim == block_d,
        SPLIT=splits > 1, UPCAST=runtime.INTERPRETED, DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=shape["num_warps"], num_stages=shape["num_stages"], **common)
    if splits > 1:
        combine_d = min(block_d, COMBINE_D)
        _combine_splits_kernel[(num_batch_rows, num_kv_heads, block_d // combine_d)](
            seq_lens, query_start_loc, out, partial_acc, partial_ml, o_stride_t=out.stride(0),
            o_stride_h=out.stride(1), BLOCK_M=shape["block_m"], BLOCK_D=block_d, COMBINE_D=combine_d, num_warps=4,
            **common)
