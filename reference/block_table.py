"""Reference block-table operations: plain loops over batch rows, obviously right."""

import torch

PAD = -1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def gather_block_tables(persistent: torch.Tensor, idx_mapping: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    result = out.clone()
    for batch_row, slot in enumerate(idx_mapping.tolist()):
        result[batch_row] = persistent[slot] if slot >= 0 else 0
    return result


def kv_slot(row: list[int], pos: int, block_size: int) -> int:
    """Physical KV slot of ``pos`` in one batch row's table; PAD before or past the row, or on the null block."""
    block_idx = pos // block_size
    if pos < 0 or block_idx >= len(row) or row[block_idx] == 0:
        return PAD
    return row[block_idx] * block_size + pos % block_size


def compute_slot_mappings(block_table: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor,
                          block_size: int, out: torch.Tensor) -> torch.Tensor:
    result = torch.full_like(out, PAD)
    starts = query_start_loc.tolist()
    for batch_row in range(len(starts) - 1):
        row = block_table[batch_row].tolist()
        for token in range(starts[batch_row], starts[batch_row + 1]):
            result[token] = kv_slot(row, int(positions[token]), block_size)
    return result


def shift_block_table_rows(block_table: torch.Tensor, idx_mapping: torch.Tensor, num_cached_tokens: torch.Tensor,
                           seq_lens: torch.Tensor, block_size: int) -> torch.Tensor:
    result = block_table.clone()
    width = block_table.shape[1]
    for batch_row, slot in enumerate(idx_mapping.tolist()):
        if slot < 0:
            continue
        shift = int(num_cached_tokens[slot]) // block_size
        if shift <= 0:
            continue
        n = min(width - shift, _ceil_div(int(seq_lens[batch_row]), block_size))
        if n > 0:
            result[batch_row, :n] = block_table[batch_row, shift:shift + n]
    return result


def has_unaligned_cached_prefix(num_cached_tokens, idx_mapping, block_sizes) -> bool:
    cached = [int(c) for c in torch.as_tensor(num_cached_tokens).flatten().tolist()]
    for slot in torch.as_tensor(idx_mapping).flatten().tolist():
        if slot >= 0 and any(cached[slot] % bs for bs in block_sizes):
            return True
    return False
