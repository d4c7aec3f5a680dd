"""Block-table operations of ``kernels.block_table`` in plain tensor ops: gather rows by request slot, token
slot mappings, and the left shift past prefix-cache-restored blocks.

Index spaces as there: ``batch_row`` indexes this step's batch, ``slot = idx_mapping[batch_row]`` indexes
persistent per-request state. Argument checks repeat the launchers' own (same helpers, same messages): they
sit inline in each launcher, whose planted refusal bugs patch them there, so they cannot move into a shared
function. Devices are checked to agree, not to be the kernels' device: these run anywhere.
"""

import torch

from kernels import validate

PAD = -1  # a slot-mapping entry that writes nothing


def kv_slot(table_rows: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Physical KV slot of each ``pos`` in its own block-table row (``table_rows[i]`` for ``pos[i]``): PAD for a
    negative position, a block index past the row, or the null block 0."""
    width = table_rows.shape[1]
    block_idx = pos // block_size
    in_row = (pos >= 0) & (block_idx < width)
    if width == 0:
        return torch.full_like(pos, PAD)
    block_id = table_rows.gather(1, block_idx.clamp(0, width - 1)[:, None])[:, 0].to(torch.int64)
    return torch.where(in_row & (block_id != 0), block_id * block_size + pos % block_size, PAD)


def batch_rows_of(starts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The batch row of each token under CSR offsets ``starts [B+1]``: the last b with ``starts[b] <= token``
    (empty rows share a start; the last of them owns the tokens)."""
    return torch.searchsorted(starts[:-1].contiguous(), tokens, right=True) - 1


def gather_block_tables(persistent: torch.Tensor, idx_mapping: torch.Tensor, out: torch.Tensor) -> None:
    """``out[b] = persistent[idx_mapping[b]]`` for ``b < len(idx_mapping)``; a negative slot gives null blocks
    (0); later rows untouched."""
    validate.tensor("persistent", persistent, dtype=torch.int32, ndim=2)
    validate.tensor("idx_mapping", idx_mapping, dtype=torch.int32, ndim=1)
    validate.tensor("out", out, dtype=torch.int32, ndim=2)
    validate.same_device(persistent=persistent, idx_mapping=idx_mapping, out=out)
    if out.shape[1] != persistent.shape[1]:
        raise ValueError(f"out: width {out.shape[1]} differs from persistent width {persistent.shape[1]}")
    num_rows = idx_mapping.numel()
    if num_rows > out.shape[0]:
        raise ValueError(f"out: {out.shape[0]} rows, but idx_mapping has {num_rows} batch rows")
    if num_rows == 0 or persistent.shape[1] == 0:
        return
    if persistent.shape[0] == 0:
        raise ValueError("persistent: has no slot rows, but idx_mapping has batch rows")
    validate.indices("idx_mapping", idx_mapping, -1, persistent.shape[0], what="slot")
    slots = idx_mapping.to(torch.int64)
    rows = persistent[slots.clamp(min=0)]
    out[:num_rows] = torch.where((slots >= 0)[:, None], rows, 0)


def compute_slot_mappings(block_table: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor,
                          block_size: int, out: torch.Tensor) -> None:
    """Physical KV slot of every token: ``block_table[b, pos // bs] * bs + pos % bs`` for token t of batch row b
    (``query_start_loc[b] <= t < query_start_loc[b+1]``); every other entry of ``out`` gets PAD, as do
    positions off the row and positions on the null block."""
    validate.tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    validate.tensor("query_start_loc", query_start_loc, dtype=torch.int32, ndim=1, min_numel=1)
    validate.tensor("positions", positions, dtype=torch.int64, ndim=1)
    validate.tensor("out", out, dtype=torch.int64, ndim=1)
    validate.positive_int("block_size", block_size)
    validate.same_device(block_table=block_table, query_start_loc=query_start_loc, positions=positions, out=out)
    num_batch_rows = query_start_loc.numel() - 1
    if num_batch_rows > block_table.shape[0]:
        raise ValueError(f"block_table: {block_table.shape[0]} rows, but query_start_loc describes {num_batch_rows}")
    if out.numel() < positions.numel():
        raise ValueError(f"out: {out.numel()} entries, fewer than the {positions.numel()} positions")
    validate.offsets("query_start_loc", query_start_loc, positions.numel())
    if out.numel() == 0:
        return
    starts = query_start_loc.to(torch.int64)
    first, last = int(starts[0]), int(starts[-1])  # the batch's tokens are one run: offsets never decrease
    tokens = torch.arange(first, last, device=out.device)
    slots = kv_slot(block_table[batch_rows_of(starts, tokens)], positions[first:last], block_size)
    out.fill_(PAD)
    out[first:last] = slots


def shift_block_table_rows(block_table: torch.Tensor, idx_mapping: torch.Tensor, num_cached_tokens: torch.Tensor,
                           seq_lens: torch.Tensor, block_size: int) -> None:
    """Shift batch row b left, in place, by ``num_cached_tokens[idx_mapping[b]] // block_size`` entries:
    ``row[j] = old_row[j + shift]`` for ``j < min(width - shift, ceil(seq_lens[b] / block_size))``, the rest of
    the row untouched; a shift of 0 (or a negative slot) writes nothing. All sources are read before any entry
    is written, so overlapping source and destination need no ordering."""
    validate.tensor("block_table", block_table, dtype=torch.int32, ndim=2)
    validate.tensor("idx_mapping", idx_mapping, dtype=torch.int32, ndim=1)
    validate.tensor("num_cached_tokens", num_cached_tokens, dtype=torch.int32, ndim=1)
    validate.tensor("seq_lens", seq_lens, dtype=torch.int32, ndim=1)
    validate.positive_int("block_size", block_size)
    validate.same_device(block_table=block_table, idx_mapping=idx_mapping, num_cached_tokens=num_cached_tokens,
                         seq_lens=seq_lens)
    num_batch_rows = idx_mapping.numel()
    if num_batch_rows > block_table.shape[0]:
        raise ValueError(f"block_table: {block_table.shape[0]} rows, but idx_mapping has {num_batch_rows} batch rows")
    if seq_lens.numel() < num_batch_rows:
        raise ValueError(f"seq_lens: {seq_lens.numel()} entries, but idx_mapping has {num_batch_rows} batch rows")
    if num_batch_rows == 0:
        return
    validate.indices("idx_mapping", idx_mapping, -1, num_cached_tokens.numel(), what="slot")
    width = block_table.shape[1]
    if width == 0:
        return
    slots = idx_mapping.to(torch.int64)
    cached = num_cached_tokens.to(torch.int64)
    cached = torch.where(slots >= 0, cached[slots.clamp(min=0)], 0) if cached.numel() else torch.zeros_like(slots)
    shift = torch.div(cached, block_size, rounding_mode="trunc")  # as the kernel's integer division
    needed = -torch.div(-seq_lens[:num_batch_rows].to(torch.int64), block_size, rounding_mode="floor")
    count = torch.minimum(width - shift, needed)
    cols = torch.arange(width, device=block_table.device)
    moved = (shift[:, None] > 0) & (cols[None, :] < count[:, None])
    rows = block_table[:num_batch_rows]
    sources = rows.gather(1, (cols[None, :] + shift[:, None]).clamp(0, width - 1))
    rows[moved] = sources[moved]
