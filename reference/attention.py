"""Reference paged attention: gather each request's keys and values into contiguous tensors, then
plain softmax attention, in float64 by default; and the prefix-masked draft step built on it.

``precision=torch.float32`` gives the float32 baseline the float comparison is scaled by.
"""

import torch

from reference.block_table import PAD, kv_slot, shift_block_table_rows
from reference.kv_cache import write_kv

FLOAT32_MAX = torch.finfo(torch.float32).max
# Queries attended at a time: a prefill-sized row's scores and weights take tens of MB, not hundreds freshly
# mapped (page faults cost more than the arithmetic there). Rows of up to 64 queries run whole, as before.
QUERIES_PER_CHUNK = 64


def visible_keys(num_queries: int, length: int, causal: bool) -> torch.Tensor:
    """[Q, L] bool: the keys each of the last Q of L positions sees (causal: query i sees ``j <= L - Q + i``)."""
    if causal:
        return torch.arange(length)[None, :] <= (length - num_queries + torch.arange(num_queries))[:, None]
    return torch.ones(num_queries, length, dtype=torch.bool)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, scale: float, causal: bool,
           precision: torch.dtype = torch.float64) -> torch.Tensor:
    """Attention of ``query [Q, H_q, D]`` (the last Q of L positions) over ``keys / values [L, H_kv, D]``.

    Query head h reads KV head ``h // (H_q / H_kv)``. Causal: query i sees keys ``j <= L - Q + i``.
    A query that sees no key, or whose every visible key scores -inf, gets zeros: no key carries any
    weight (FlashAttention's convention; the softmax of an all -inf row is 0/0). A visible NaN or +inf
    score makes the query's row NaN (softmax's NaN, and +inf - +inf). Scores are float32 quantities: a
    query-key product past float32's range is infinite, as a float32 accumulator makes it; keys out of
    sight carry no weight whatever they score. Returns ``[Q, H_q, D]`` in ``precision``, computed
    QUERIES_PER_CHUNK queries at a time (a query's output depends on its own scores alone).
    """
    q = query.to(precision)
    k = keys.to(precision).transpose(0, 1)  # [H_kv, L, D]
    v = values.to(precision).transpose(0, 1)
    visible = visible_keys(query.shape[0], keys.shape[0], causal)
    out = torch.empty(query.shape, dtype=precision)
    for first in range(0, query.shape[0], QUERIES_PER_CHUNK):
        rows = slice(first, first + QUERIES_PER_CHUNK)
        out[rows] = _attend_rows(q[rows], k, v, visible[rows], scale)
    return out


def by_kv_head(query: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``query [Q, H_q, D]`` as ``[H_kv, group * Q, D]``: KV head k's rows are its ``group`` query heads times the
    queries, in (head, query) order (GQA: query head h reads KV head h // group)."""
    num_queries, num_q_heads, dim = query.shape
    return query.permute(1, 0, 2).reshape(num_kv_heads, (num_q_heads // num_kv_heads) * num_queries, dim)


def _attend_rows(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                 scale: float) -> torch.Tensor:
    """``attend`` of ``query [Q, H_q, D]`` over ``k / v [H_kv, L, D]`` (in the precision of all three), query i
    over the keys that ``visible [Q, L]`` marks."""
    num_queries, num_q_heads, dim = query.shape
    num_kv_heads = k.shape[0]
    group = num_q_heads // num_kv_heads
    q = by_kv_head(query, num_kv_heads)
    visible = visible.repeat(group, 1)  # row g * Q + i is query i
    products = q @ k.transpose(1, 2)
    # past float32's range: infinite, as a float32 accumulator makes it (NaN stays NaN)
    products.masked_fill_(products > FLOAT32_MAX, float("inf")).masked_fill_(products < -FLOAT32_MAX, float("-inf"))
    scores = (products * scale).masked_fill_(~visible, float("-inf"))
    weightless = (scores == float("-inf")).all(-1, keepdim=True)  # no visible key, or -inf scores only
    weights = torch.softmax(scores, dim=-1).masked_fill_(weightless, 0.0)
    out = weights @ v  # [H_kv, group * Q, D]
    return out.view(num_q_heads, num_queries, dim).transpose(0, 1)


def gather_kv(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """Positions ``0..length-1`` of one batch row, read through its block-table row: [length, H_kv, D]."""
    block_size = cache.shape[1]
    positions = torch.arange(length)
    return cache[table_row.long()[positions // block_size], positions % block_size]


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, *, scale: float, causal: bool,
                    out: torch.Tensor, precision: torch.dtype = torch.float64) -> torch.Tensor:
    """Returns ``out`` (as ``precision``) with every batch row's query rows replaced by their attention."""
    result = out.to(precision, copy=True)
    starts = query_start_loc.tolist()
    for batch_row in range(len(starts) - 1):
        first, last = starts[batch_row], starts[batch_row + 1]
        length = int(seq_lens[batch_row])
        if last == first or length == 0:
            continue
        keys = gather_kv(k_cache, block_table[batch_row], length)
        values = gather_kv(v_cache, block_table[batch_row], length)
        result[first:last] = attend(query[first:last], keys, values, scale=scale, causal=causal, precision=precision)
    return result


def prefix_masked_draft(*, idx_mapping, num_cached_tokens, target_query_start_loc, target_positions, num_rejected,
                        block_table, block_size, num_draft_tokens, anchor_first, context_key, context_value, query,
                        query_key, query_value, k_cache, v_cache, scale, out,
                        precision: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    """One draft step with a restored prefix (docs/contracts/draft_inputs.md#layouts, fix 4): returns ``(out,
    k_cache, v_cache, block_table)``.

    Batch row b keeps its valid target rows (not the rejected suffix) at their positions and its
    draft query block at ``p + 1 .. p + Q`` (p: last valid position); its queries attend,
    non-causally, to exactly the positions the draft computed: from the first block that was not
    restored (``floor(nc / bs) * bs``) to the end of the query block. The returned table is the
    draft's view: row b shifted left by the restored blocks.
    """
    q = num_draft_tokens if anchor_first else num_draft_tokens + 1
    starts, positions = target_query_start_loc.tolist(), target_positions.tolist()
    context_slots = [PAD] * context_key.shape[0]
    query_slots = [PAD] * query.shape[0]
    seq_lens = torch.zeros(block_table.shape[0], dtype=torch.int32)
    visible = []
    for batch_row, slot in enumerate(idx_mapping.tolist()):
        row = block_table[batch_row].tolist()
        valid_end = starts[batch_row + 1] - int(num_rejected[batch_row])
        for token in range(starts[batch_row], valid_end):
            context_slots[token] = kv_slot(row, positions[token], block_size)
        last = positions[valid_end - 1]
        for off in range(q):
            query_slots[batch_row * q + off] = kv_slot(row, last + 1 + off, block_size)
        first_visible = int(num_cached_tokens[slot]) // block_size * block_size
        seq_lens[batch_row] = max(last + 1 + q - first_visible, q)
        visible.append([kv_slot(row, pos, block_size) for pos in range(first_visible, last + 1 + q)])
        if PAD in visible[-1]:
            raise ValueError(f"batch row {batch_row}: a visible position has no KV slot (null block or past the row)")
    k_new, v_new = write_kv(context_key, context_value, torch.tensor(context_slots), k_cache, v_cache)
    k_new, v_new = write_kv(query_key, query_value, torch.tensor(query_slots), k_new, v_new)
    table = shift_block_table_rows(block_table, idx_mapping, num_cached_tokens, seq_lens, block_size)
    result = out.to(precision, copy=True)
    for batch_row, slots in enumerate(visible):
        slots = torch.tensor(slots)
        keys = k_new.flatten(0, 1)[slots]
        values = v_new.flatten(0, 1)[slots]
        rows = slice(batch_row * q, (batch_row + 1) * q)
        result[rows] = attend(query[rows], keys, values, scale=scale, causal=False, precision=precision)
    return result, k_new, v_new, table
