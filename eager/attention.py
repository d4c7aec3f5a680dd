"""Paged attention of ``kernels.attention`` in plain tensor ops: every batch row's queries (the last ``q_len`` of
its ``seq_lens[b]`` tokens) attend over the keys and values its block-table row addresses, causal or not, with
GQA (docs/contracts/attention.md).

Each query token gathers its batch row's positions ``0 .. max(seq_lens) - 1`` (those past its own sequence
masked and zeroed, never read through an index out of the cache) and runs one softmax over them in float32;
the probabilities weight the values in the cache's precision, as the kernel's second product does. A query
whose every visible key scores -inf gets zeros; a NaN or +inf score makes its row NaN. The argument checks
repeat the launcher's (same helpers, same messages): they are inline there, where its planted refusal bugs
patch them.
"""

import math

import torch

from eager.block_table import batch_rows_of
from kernels import validate

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _checked(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out) -> None:
    """The launcher's refusals up to its launch knobs, in its order."""
    validate.tensor("query", query, dtype=FLOAT_DTYPES, ndim=3)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        validate.tensor(name, t, dtype=FLOAT_DTYPES, ndim=4)
    validate.tensor("out", out, dtype=FLOAT_DTYPES, ndim=3)
    validate.tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    validate.tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=1)
    validate.tensor("query_start_loc", query_start_loc, dtype=torch.int32, ndim=1, min_numel=1)
    validate.same_device(query=query, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                         query_start_loc=query_start_loc, out=out)
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


def _check_indices(query_start_loc, block_table, seq_lens, num_tokens: int, num_blocks: int, block_size: int):
    """What is followed as an index: query offsets within the queries, sequence lengths within their table row,
    every block id a sequence reaches within the cache."""
    validate.offsets("query_start_loc", query_start_loc, num_tokens)
    validate.indices("seq_lens", seq_lens, 0, block_table.shape[1] * block_size + 1, what="sequence length")
    first_tokens = torch.arange(block_table.shape[1], device=block_table.device) * block_size
    validate.indices("block_table", block_table, 0, num_blocks, what="block id",
                     where=lambda: first_tokens[None, :] < seq_lens[:, None])


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, *, scale: float, causal: bool,
                    out: torch.Tensor) -> None:
    """Attention of every batch row's queries over its paged keys and values, written into ``out``; rows of
    ``out`` outside the batch's queries, and queries of a row without keys, untouched. Arguments as
    ``kernels.attention.paged_attention``."""
    _checked(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, out)
    num_tokens, num_q_heads, head_dim = query.shape
    num_batch_rows, (num_blocks, block_size, num_kv_heads, _) = query_start_loc.numel() - 1, k_cache.shape
    if num_batch_rows == 0 or num_tokens == 0:
        return
    _check_indices(query_start_loc, block_table[:num_batch_rows], seq_lens[:num_batch_rows], num_tokens,
                   num_blocks, block_size)
    if head_dim == 0 or k_cache.numel() == 0:
        return
    starts = query_start_loc.to(torch.int64)
    tokens = torch.arange(int(starts[0]), int(starts[-1]), device=query.device)
    rows = batch_rows_of(starts, tokens)
    seq_len = seq_lens[:num_batch_rows].to(torch.int64)[rows]
    tokens, rows, seq_len = tokens[seq_len > 0], rows[seq_len > 0], seq_len[seq_len > 0]  # no key: nothing written
    if tokens.numel() == 0:
        return
    q_len = (starts[1:] - starts[:-1])[rows]
    pos = torch.arange(int(seq_len.max()), device=query.device)
    in_seq = pos[None, :] < seq_len[:, None]
    table = block_table[rows].to(torch.int64)
    block_idx = (pos // block_size).clamp(max=table.shape[1] - 1)
    blocks = torch.where(in_seq, table[:, block_idx], 0)
    keys = k_cache[blocks, pos % block_size].masked_fill(~in_seq[..., None, None], 0)  # [n, L, H_kv, D]
    values = v_cache[blocks, pos % block_size].masked_fill(~in_seq[..., None, None], 0)
    last_key = seq_len - q_len + (tokens - starts[rows]) if causal else seq_len - 1
    visible = in_seq & (pos[None, :] <= last_key[:, None])

    group = num_q_heads // num_kv_heads
    q = query[tokens].to(torch.float32).view(-1, num_kv_heads, group, head_dim)  # query head h reads KV head h // group
    scores = torch.einsum("nhgd,nlhd->nhgl", q, keys.to(torch.float32)) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    top = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - torch.where(top == float("-inf"), 0.0, top))  # a row that sees no key: all 0
    total = p.sum(-1, keepdim=True)
    acc = torch.einsum("nhgl,nlhd->nhgd", p.to(v_cache.dtype).to(torch.float32), values.to(torch.float32))
    out[tokens] = (acc / torch.where(total > 0, total, 1.0)).reshape(-1, num_q_heads, head_dim).to(out.dtype)
