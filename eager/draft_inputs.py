"""DFlash / DSpark draft-input preparation of ``kernels.draft_inputs`` in plain tensor ops: per live batch row its
context rows, query rows, sampling rows, ``query_start_loc`` and ``seq_lens``; everything past the live batch
inert; a batch with an unaligned cached prefix refused (docs/contracts/draft_inputs.md).

The argument checks repeat the launcher's (same helpers, same messages, same order): they are inline there,
where its planted refusal bugs patch them. The fail-closed test is the launcher's own host function
(``kernels.block_table.has_unaligned_cached_prefix``, plain tensor code already).
"""

import torch

from eager.block_table import PAD, batch_rows_of, kv_slot
from kernels import block_table as tables
from kernels import validate

_I32, _I64 = torch.int32, torch.int64
# the tensor arguments and their dtypes, in the order the launcher looks for errors
TENSORS = {"idx_mapping": _I32, "target_query_start_loc": _I32, "target_positions": _I64, "num_sampled": _I32,
           "num_rejected": _I32, "last_sampled": _I64, "next_prefill_tokens": _I32, "num_cached_tokens": _I32,
           "block_table": _I32, "context_positions": _I64, "context_slot_mapping": _I64, "input_ids": _I32,
           "positions": _I64, "query_slot_mapping": _I64, "sample_indices": _I64, "sample_pos": _I64,
           "sample_idx_mapping": _I32, "query_start_loc": _I32, "seq_lens": _I32, "draft_tokens": _I64}


def _checked(args: dict, block_size, num_draft_tokens, anchor_first, mask_token_id, max_model_len) -> None:
    """The launcher's refusals, in its order (``args``: the tensor arguments by name)."""
    for name, dtype in TENSORS.items():
        validate.tensor(name, args[name], dtype=dtype, ndim=2 if name in ("block_table", "draft_tokens") else 1)
    validate.same_device(**{name: args[name] for name in TENSORS})
    validate.positive_int("block_size", block_size)
    validate.positive_int("max_model_len", max_model_len)
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens: expected an int >= 0, got {num_draft_tokens!r}")
    if anchor_first and num_draft_tokens == 0:
        raise ValueError("num_draft_tokens: the anchor-first layout needs at least one row (the anchor)")
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise ValueError(f"mask_token_id: expected an int, got {mask_token_id!r}")
    num_batch_rows, num_slots = args["idx_mapping"].numel(), args["last_sampled"].numel()
    k = num_draft_tokens
    q = k if anchor_first else 1 + k
    _at_least("target_query_start_loc", args["target_query_start_loc"], num_batch_rows + 1)
    for name in ("next_prefill_tokens", "num_cached_tokens"):
        if args[name].numel() != num_slots:
            raise ValueError(f"{name}: {args[name].numel()} slots, but last_sampled has {num_slots}")
    slots = args["idx_mapping"].cpu()
    if num_batch_rows and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise ValueError(f"idx_mapping: live batch rows need slots in [0, {num_slots}), got {slots.tolist()}")
    target_starts = args["target_query_start_loc"].cpu()
    num_target_rows = int(target_starts[num_batch_rows])
    for name, need in (("target_positions", num_target_rows), ("num_sampled", num_batch_rows),
                       ("num_rejected", num_batch_rows), ("block_table", num_batch_rows),
                       ("draft_tokens", num_batch_rows), ("context_positions", num_target_rows),
                       ("input_ids", num_batch_rows * q), ("sample_indices", num_batch_rows * k),
                       ("query_start_loc", num_batch_rows + 1), ("seq_lens", num_batch_rows)):
        _at_least(name, args[name], need)
    validate.offsets("target_query_start_loc", target_starts[:num_batch_rows + 1], num_target_rows)
    for name, twin in (("context_slot_mapping", "context_positions"), ("positions", "input_ids"),
                       ("query_slot_mapping", "input_ids"), ("sample_pos", "sample_indices"),
                       ("sample_idx_mapping", "sample_indices")):
        if args[name].numel() != args[twin].numel():
            raise ValueError(f"{name}: {args[name].numel()} entries, but {twin} has {args[twin].numel()}")
    if args["draft_tokens"].shape[1] != k:
        raise ValueError(f"draft_tokens: {args['draft_tokens'].shape[1]} columns, expected num_draft_tokens = {k}")


def _at_least(name: str, t: torch.Tensor, need: int) -> None:
    if t.shape[0] < need:
        raise ValueError(f"{name}: {t.shape[0]} rows, the live batch needs at least {need}")


def prepare_draft_inputs(*, idx_mapping, target_query_start_loc, target_positions, num_sampled, num_rejected,
                         last_sampled, next_prefill_tokens, num_cached_tokens, block_table, block_size: int,
                         num_draft_tokens: int, anchor_first: bool, mask_token_id: int, max_model_len: int,
                         context_positions, context_slot_mapping, input_ids, positions, query_slot_mapping,
                         sample_indices, sample_pos, sample_idx_mapping, query_start_loc, seq_lens,
                         draft_tokens) -> bool:
    """Prepare the draft inputs of the live batch and clear every buffer past it; False if refused (then only
    ``draft_tokens[:B] = -1`` is written). Arguments as ``kernels.draft_inputs.prepare_draft_inputs``."""
    args = {name: value for name, value in locals().items() if name in TENSORS}
    _checked(args, block_size, num_draft_tokens, anchor_first, mask_token_id, max_model_len)
    num_batch_rows, k = idx_mapping.numel(), num_draft_tokens
    q = k if anchor_first else 1 + k
    if tables.has_unaligned_cached_prefix(num_cached_tokens, idx_mapping.cpu(), (block_size,)):
        draft_tokens[:num_batch_rows] = -1
        return False
    dev = idx_mapping.device
    starts = target_query_start_loc[:num_batch_rows + 1].to(torch.int64)
    slots = idx_mapping.to(torch.int64)
    table = block_table[:num_batch_rows]

    # Per batch row: its last valid context position and its bonus (or anchor) token.
    ctx_start = starts[:-1]
    n_valid = starts[1:] - ctx_start - num_rejected[:num_batch_rows]  # the rejected suffix is not context
    last_pos = target_positions[(ctx_start + n_valid - 1).clamp(min=0)] if num_batch_rows else ctx_start
    bonus = torch.where(num_sampled[:num_batch_rows] > 0, last_sampled[slots],
                        next_prefill_tokens[slots].to(torch.int64))

    # Context rows: every target row of the live batch; the rejected suffix as position 0 / PAD.
    first_target, num_target_rows = int(starts[0]), int(starts[-1])
    targets = torch.arange(first_target, num_target_rows, device=dev)
    rows = batch_rows_of(starts, targets)
    valid = targets - ctx_start[rows] < n_valid[rows]
    ctx_pos = torch.where(valid, target_positions[first_target:num_target_rows], 0)
    context_positions[first_target:num_target_rows] = ctx_pos
    context_slot_mapping[first_target:num_target_rows] = torch.where(valid, kv_slot(table[rows], ctx_pos, block_size),
                                                                     PAD)
    context_positions[num_target_rows:] = 0
    context_slot_mapping[num_target_rows:] = PAD

    # Query rows b * Q + off: the bonus, then mask ids, at last_pos + 1 + off (clamped to the model's length;
    # the KV slot is that of the unclamped position).
    off = torch.arange(q, device=dev)
    query_pos = last_pos[:, None] + 1 + off[None, :]
    ids = torch.where(off[None, :] == 0, bonus[:, None], mask_token_id)
    live_queries = num_batch_rows * q
    input_ids[:live_queries] = ids.flatten().to(torch.int32)
    positions[:live_queries] = query_pos.clamp(max=max_model_len - 1).flatten()
    query_slot_mapping[:live_queries] = kv_slot(table.repeat_interleave(q, 0), query_pos.flatten(), block_size)
    input_ids[live_queries:] = 0
    positions[live_queries:] = 0
    query_slot_mapping[live_queries:] = PAD

    # Sampling rows b * K + s: DFlash (offset 1) samples mask rows at their own position, DSpark (offset 0)
    # samples every row at the next position.
    offset = 0 if anchor_first else 1
    query_rows = torch.arange(num_batch_rows, device=dev)[:, None] * q + off[None, offset:]
    live_samples = num_batch_rows * k
    sample_indices[:live_samples] = query_rows.flatten()
    sample_pos[:live_samples] = (query_pos[:, offset:] + 1 - offset).flatten()
    sample_idx_mapping[:live_samples] = slots.repeat_interleave(k).to(torch.int32)
    sample_indices[live_samples:] = 0
    sample_pos[live_samples:] = 0
    sample_idx_mapping[live_samples:] = -1

    # Fix 4: whole cached blocks are shifted out of the draft's view, so they do not count.
    cached_start = torch.div(num_cached_tokens.to(torch.int64)[slots], block_size, rounding_mode="trunc") * block_size
    query_start_loc[:num_batch_rows] = (torch.arange(num_batch_rows, device=dev) * q).to(torch.int32)
    query_start_loc[num_batch_rows:] = live_queries
    seq_lens[:num_batch_rows] = torch.clamp(last_pos + 1 + q - cached_start, min=q).to(torch.int32)
    seq_lens[num_batch_rows:] = 0
    return True
