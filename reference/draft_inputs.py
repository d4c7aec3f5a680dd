"""Reference draft-input preparation: a loop per request and per row, written from docs/contracts/draft_inputs.md."""

from reference.block_table import PAD, kv_slot

OUTPUTS = ("context_positions", "context_slot_mapping", "input_ids", "positions", "query_slot_mapping",
           "sample_indices", "sample_pos", "sample_idx_mapping", "query_start_loc", "seq_lens", "draft_tokens")


def prepare_draft_inputs(*, idx_mapping, target_query_start_loc, target_positions, num_sampled, num_rejected,
                         last_sampled, next_prefill_tokens, num_cached_tokens, block_table, block_size,
                         num_draft_tokens, anchor_first, mask_token_id, max_model_len, **buffers):
    """Returns ``(prepared, *buffers in OUTPUTS order)``; the buffers given are copied, never written."""
    out = {name: buffers[name].clone() for name in OUTPUTS}
    slots = idx_mapping.tolist()
    cached = num_cached_tokens.tolist()
    if any(cached[slot] % block_size for slot in slots):
        out["draft_tokens"][:len(slots)] = -1
        return (False, *(out[name] for name in OUTPUTS))

    k = num_draft_tokens
    q = k if anchor_first else 1 + k
    starts = target_query_start_loc.tolist()
    target_pos = target_positions.tolist()
    for batch_row, slot in enumerate(slots):
        row = block_table[batch_row].tolist()
        ctx_start, ctx_end = starts[batch_row], starts[batch_row + 1]
        n_valid = ctx_end - ctx_start - int(num_rejected[batch_row])
        for i in range(ctx_start, ctx_end):
            if i - ctx_start < n_valid:
                out["context_positions"][i] = target_pos[i]
                out["context_slot_mapping"][i] = kv_slot(row, target_pos[i], block_size)
            else:  # rejected suffix
                out["context_positions"][i] = 0
                out["context_slot_mapping"][i] = PAD
        last_pos = target_pos[ctx_start + n_valid - 1]
        bonus = int(last_sampled[slot]) if int(num_sampled[batch_row]) > 0 else int(next_prefill_tokens[slot])
        for off in range(q):
            query_row = batch_row * q + off
            query_pos = last_pos + 1 + off
            out["input_ids"][query_row] = bonus if off == 0 else mask_token_id
            out["positions"][query_row] = min(query_pos, max_model_len - 1)
            out["query_slot_mapping"][query_row] = kv_slot(row, query_pos, block_size)
            if anchor_first:  # every row predicts the next position
                sample_row, predicted = batch_row * k + off, query_pos + 1
            elif off > 0:  # mask row off predicts its own position
                sample_row, predicted = batch_row * k + off - 1, query_pos
            else:
                continue  # the DFlash bonus row is not sampled
            out["sample_indices"][sample_row] = query_row
            out["sample_pos"][sample_row] = predicted
            out["sample_idx_mapping"][sample_row] = slot
        out["query_start_loc"][batch_row] = batch_row * q
        visible_from = cached[slot] // block_size * block_size
        out["seq_lens"][batch_row] = max(last_pos + 1 + q - visible_from, q)

    live = len(slots)
    out["query_start_loc"][live:] = live * q
    out["seq_lens"][live:] = 0
    out["sample_indices"][live * k:] = 0
    out["sample_pos"][live * k:] = 0
    out["sample_idx_mapping"][live * k:] = -1
    out["input_ids"][live * q:] = 0
    out["positions"][live * q:] = 0
    out["query_slot_mapping"][live * q:] = PAD
    out["context_positions"][starts[live]:] = 0
    out["context_slot_mapping"][starts[live]:] = PAD
    return (True, *(out[name] for name in OUTPUTS))
