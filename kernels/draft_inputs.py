"""DFlash / DSpark draft-input preparation (docs/contracts/draft_inputs.md#layouts,
docs/contracts/draft_inputs.md#padding, fixes 3 and 4).

One launch writes, per live batch row, its context rows (KV positions and slots of the target
tokens), its Q draft query rows (bonus or anchor token, then mask ids), its K sampling rows and
its draft ``seq_lens``; one extra program clears everything past the live batch, so a padded
CUDA-graph replay sees inert rows (sampling slot -1, ids and positions 0, PAD slots) instead of
stale values. Layouts: DFlash has Q = 1 + K and mask row j predicts its own position; DSpark
(anchor as first row) has Q = K and every row predicts the next position.

Two choices differ from the upstream pseudo-code: the padding is written by an extra program row
(grid row B) rather than by the last live request, so an empty batch is padded too; and a
position whose block index lies past the table row gets PAD, as in ``compute_slot_mappings``,
where upstream clamps the index to the row's last entry.

Index spaces: ``batch_row`` indexes this step's batch (target CSR, block table, query rows),
``slot = idx_mapping[batch_row]`` indexes per-request state (last sampled token, next prefill
token, cached count, draft_tokens rows).
"""

import torch
import triton
import triton.language as tl

from kernels import block_table as tables  # looked up at call time: a patched fail-closed test reaches here
from kernels import runtime, validate  # runtime first: the device choice precedes any kernel

MAX_BLOCK = 256


@triton.jit
def _kv_slot(row_ptr, pos, live, width, block_size):
    """Physical KV slot of ``pos`` in one batch row's (unshifted) table; PAD off the row or on the null block."""
    block_idx = pos // block_size
    in_row = live & (block_idx < width)
    block_id = tl.load(row_ptr + block_idx, mask=in_row, other=0).to(tl.int64)
    return tl.where(in_row & (block_id != 0), block_id * block_size + pos % block_size, -1)


# Batch sizes, row counts, depths and token ids change from step to step; specializing on their
# value (== 1, divisible by 16) would compile a variant per batch shape for a latency-bound kernel.
@triton.jit(do_not_specialize=[
    "block_table_stride", "width", "block_size", "num_query_per_req", "num_draft_tokens", "sample_offset",
    "mask_token_id", "max_model_len", "num_context_rows", "num_query_rows", "num_sample_rows",
    "num_query_start_loc", "num_seq_lens", "num_batch_rows"])
def _prepare_draft_inputs_kernel(
        idx_mapping_ptr, target_qsl_ptr, target_positions_ptr, num_sampled_ptr, num_rejected_ptr,
        last_sampled_ptr, next_prefill_tokens_ptr, num_cached_tokens_ptr, block_table_ptr, block_table_stride,
        width, block_size, num_query_per_req, num_draft_tokens, sample_offset, mask_token_id, max_model_len,
        context_positions_ptr, context_slot_mapping_ptr, num_context_rows,
        input_ids_ptr, positions_ptr, query_slot_mapping_ptr, num_query_rows,
        sample_indices_ptr, sample_pos_ptr, sample_idx_mapping_ptr, num_sample_rows,
        query_start_loc_ptr, num_query_start_loc, seq_lens_ptr, num_seq_lens, num_batch_rows,
        BLOCK: tl.constexpr):
    batch_row = tl.program_id(0)
    lanes = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    Q = num_query_per_req
    K = num_draft_tokens
    if batch_row < num_batch_rows:
        slot = tl.load(idx_mapping_ptr + batch_row).to(tl.int64)
        ctx_start = tl.load(target_qsl_ptr + batch_row).to(tl.int64)
        n_ctx = tl.load(target_qsl_ptr + batch_row + 1) - ctx_start
        n_valid = n_ctx - tl.load(num_rejected_ptr + batch_row)  # the rejected suffix is not context
        sampled = tl.load(num_sampled_ptr + batch_row) > 0  # 0: chunked prefill, no bonus yet
        bonus = tl.where(sampled, tl.load(last_sampled_ptr + slot),
                         tl.load(next_prefill_tokens_ptr + slot).to(tl.int64))
        last_pos = tl.load(target_positions_ptr + ctx_start + n_valid - 1)
        row_ptr = block_table_ptr + batch_row.to(tl.int64) * block_table_stride

        # Context rows: every target row of the request is stored, the rejected suffix as position 0 / PAD,
        # so a replayed graph never reads a stale row.
        is_ctx = lanes < n_ctx
        ctx_valid = lanes < n_valid
        ctx_pos = tl.load(target_positions_ptr + ctx_start + lanes, mask=ctx_valid, other=0)
        tl.store(context_positions_ptr + ctx_start + lanes, ctx_pos, mask=is_ctx)
        tl.store(context_slot_mapping_ptr + ctx_start + lanes,
                 _kv_slot(row_ptr, ctx_pos, ctx_valid, width, block_size), mask=is_ctx)

        # Query rows: off 0 is the bonus (or anchor) token, then mask ids, at positions last_pos + 1 + off.
        off = lanes - n_valid
        is_query = (off >= 0) & (off < Q)
        query_pos = last_pos + 1 + off
        query_row = batch_row.to(tl.int64) * Q + off
        tl.store(input_ids_ptr + query_row, tl.where(off == 0, bonus, mask_token_id).to(tl.int32), mask=is_query)
        tl.store(positions_ptr + query_row, tl.minimum(query_pos, max_model_len - 1), mask=is_query)
        tl.store(query_slot_mapping_ptr + query_row, _kv_slot(row_ptr, query_pos, is_query, width, block_size),
                 mask=is_query)

        # Sampling rows: DFlash (offset 1) samples mask rows at their own position, DSpark (offset 0) samples
        # every row at the next position.
        is_sample = is_query & (off >= sample_offset)
        sample_row = batch_row.to(tl.int64) * K + off - sample_offset
        tl.store(sample_indices_ptr + sample_row, query_row, mask=is_sample)
        tl.store(sample_pos_ptr + sample_row, query_pos + 1 - sample_offset, mask=is_sample)
        tl.store(sample_idx_mapping_ptr + sample_row, (lanes * 0 + slot).to(tl.int32), mask=is_sample)

        if tl.program_id(1) == 0:
            tl.store(query_start_loc_ptr + batch_row, batch_row * Q)
            # Fix 4: whole cached blocks are shifted out of the draft's view, so they do not count.
            cached_start = (tl.load(num_cached_tokens_ptr + slot) // block_size) * block_size
            tl.store(seq_lens_ptr + batch_row, tl.maximum(last_pos + 1 + Q - cached_start, Q).to(tl.int32))
    elif tl.program_id(1) == 0:
        # The extra program: everything past the live batch is inert (docs/contracts/draft_inputs.md#padding, fix 3).
        live_queries = num_batch_rows * Q
        for start in range(num_batch_rows, num_query_start_loc, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            tl.store(query_start_loc_ptr + rows, tl.full((BLOCK,), 0, tl.int32) + live_queries,
                     mask=rows < num_query_start_loc)
        for start in range(num_batch_rows, num_seq_lens, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            tl.store(seq_lens_ptr + rows, tl.full((BLOCK,), 0, tl.int32), mask=rows < num_seq_lens)
        for start in range(num_batch_rows * K, num_sample_rows, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            keep = rows < num_sample_rows
            tl.store(sample_indices_ptr + rows, tl.full((BLOCK,), 0, tl.int64), mask=keep)
            tl.store(sample_pos_ptr + rows, tl.full((BLOCK,), 0, tl.int64), mask=keep)
            tl.store(sample_idx_mapping_ptr + rows, tl.full((BLOCK,), -1, tl.int32), mask=keep)
        for start in range(live_queries, num_query_rows, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            keep = rows < num_query_rows
            tl.store(input_ids_ptr + rows, tl.full((BLOCK,), 0, tl.int32), mask=keep)  # cleared query inputs
            tl.store(positions_ptr + rows, tl.full((BLOCK,), 0, tl.int64), mask=keep)  # (fix 3)
            tl.store(query_slot_mapping_ptr + rows, tl.full((BLOCK,), -1, tl.int64), mask=keep)
        for start in range(tl.load(target_qsl_ptr + num_batch_rows), num_context_rows, BLOCK):
            rows = start + tl.arange(0, BLOCK)
            keep = rows < num_context_rows
            tl.store(context_positions_ptr + rows, tl.full((BLOCK,), 0, tl.int64), mask=keep)
            tl.store(context_slot_mapping_ptr + rows, tl.full((BLOCK,), -1, tl.int64), mask=keep)


def prepare_draft_inputs(*, idx_mapping, target_query_start_loc, target_positions, num_sampled, num_rejected,
                         last_sampled, next_prefill_tokens, num_cached_tokens, block_table, block_size: int,
                         num_draft_tokens: int, anchor_first: bool, mask_token_id: int, max_model_len: int,
                         context_positions, context_slot_mapping, input_ids, positions, query_slot_mapping,
                         sample_indices, sample_pos, sample_idx_mapping, query_start_loc, seq_lens,
                         draft_tokens, block: int | None = None, num_warps: int | None = None) -> bool:
    """Prepare the draft inputs of the live batch and clear every buffer past it; False if refused.

    A batch in which some live slot's cached count is not a multiple of ``block_size`` is refused
    before any kernel runs (fix 4, fail closed): ``draft_tokens[:B] = -1``, nothing else is written,
    and verification then rejects the placeholders, so the step acts like plain decode.

    Batch-row inputs (B rows): idx_mapping int32 [B], target_query_start_loc int32 [B+1] (CSR of the
    target rows), target_positions int64 [>= T], num_sampled / num_rejected int32 [>= B],
    block_table int32 [>= B, W] (unshifted). Slot inputs (S slots): last_sampled int64,
    next_prefill_tokens int32, num_cached_tokens int32. Outputs (pre-allocated; everything past the
    live part is padding): context_positions / context_slot_mapping int64 [>= T], input_ids int32,
    positions / query_slot_mapping int64 [>= B*Q], sample_indices / sample_pos int64 and
    sample_idx_mapping int32 [>= B*K], query_start_loc int32 [>= B+1], seq_lens int32 [>= B],
    draft_tokens int64 [>= B, K]. Every live row needs at least one non-rejected target row.
    ``block`` (lanes per program) and ``num_warps`` are launch knobs for stress sweeps.
    """
    i32, i64 = torch.int32, torch.int64
    tensors = {  # name: (tensor, dtype, ndim), in the order errors are looked for
        "idx_mapping": (idx_mapping, i32, 1), "target_query_start_loc": (target_query_start_loc, i32, 1),
        "target_positions": (target_positions, i64, 1), "num_sampled": (num_sampled, i32, 1),
        "num_rejected": (num_rejected, i32, 1), "last_sampled": (last_sampled, i64, 1),
        "next_prefill_tokens": (next_prefill_tokens, i32, 1), "num_cached_tokens": (num_cached_tokens, i32, 1),
        "block_table": (block_table, i32, 2), "context_positions": (context_positions, i64, 1),
        "context_slot_mapping": (context_slot_mapping, i64, 1), "input_ids": (input_ids, i32, 1),
        "positions": (positions, i64, 1), "query_slot_mapping": (query_slot_mapping, i64, 1),
        "sample_indices": (sample_indices, i64, 1), "sample_pos": (sample_pos, i64, 1),
        "sample_idx_mapping": (sample_idx_mapping, i32, 1), "query_start_loc": (query_start_loc, i32, 1),
        "seq_lens": (seq_lens, i32, 1), "draft_tokens": (draft_tokens, i64, 2)}
    for name, (t, dtype, ndim) in tensors.items():
        validate.tensor(name, t, dtype=dtype, ndim=ndim)
    validate.on_kernel_device(**{name: t for name, (t, _, _) in tensors.items()})
    validate.positive_int("block_size", block_size)
    validate.positive_int("max_model_len", max_model_len)
    for name, knob in (("block", block), ("num_warps", num_warps)):
        if knob is not None:
            validate.power_of_two(name, knob)
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens: expected an int >= 0, got {num_draft_tokens!r}")
    if anchor_first and num_draft_tokens == 0:
        raise ValueError("num_draft_tokens: the anchor-first layout needs at least one row (the anchor)")
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int):
        raise ValueError(f"mask_token_id: expected an int, got {mask_token_id!r}")
    num_batch_rows = idx_mapping.numel()
    num_slots = last_sampled.numel()
    k = num_draft_tokens
    q = k if anchor_first else 1 + k
    _at_least("target_query_start_loc", target_query_start_loc, num_batch_rows + 1)
    for name, t in (("next_prefill_tokens", next_prefill_tokens), ("num_cached_tokens", num_cached_tokens)):
        if t.numel() != num_slots:
            raise ValueError(f"{name}: {t.numel()} slots, but last_sampled has {num_slots}")
    slots, target_starts, cached_counts = runtime.read_back(idx_mapping, target_query_start_loc, num_cached_tokens)
    if num_batch_rows and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise ValueError(f"idx_mapping: live batch rows need slots in [0, {num_slots}), got {slots.tolist()}")
    num_target_rows = int(target_starts[num_batch_rows])
    for name, t, need in (("target_positions", target_positions, num_target_rows),
                          ("num_sampled", num_sampled, num_batch_rows), ("num_rejected", num_rejected, num_batch_rows),
                          ("block_table", block_table, num_batch_rows), ("draft_tokens", draft_tokens, num_batch_rows),
                          ("context_positions", context_positions, num_target_rows),
                          ("input_ids", input_ids, num_batch_rows * q),
                          ("sample_indices", sample_indices, num_batch_rows * k),
                          ("query_start_loc", query_start_loc, num_batch_rows + 1),
                          ("seq_lens", seq_lens, num_batch_rows)):
        _at_least(name, t, need)
    validate.offsets("target_query_start_loc", target_starts[:num_batch_rows + 1], num_target_rows)
    for name, t, twin, twin_name in (
            ("context_slot_mapping", context_slot_mapping, context_positions, "context_positions"),
            ("positions", positions, input_ids, "input_ids"),
            ("query_slot_mapping", query_slot_mapping, input_ids, "input_ids"),
            ("sample_pos", sample_pos, sample_indices, "sample_indices"),
            ("sample_idx_mapping", sample_idx_mapping, sample_indices, "sample_indices")):
        if t.numel() != twin.numel():
            raise ValueError(f"{name}: {t.numel()} entries, but {twin_name} has {twin.numel()}")
    if draft_tokens.shape[1] != k:
        raise ValueError(f"draft_tokens: {draft_tokens.shape[1]} columns, expected num_draft_tokens = {k}")

    if tables.has_unaligned_cached_prefix(cached_counts, slots, (block_size,)):
        draft_tokens[:num_batch_rows] = -1
        return False
    max_target_rows = int((target_starts[1:num_batch_rows + 1] - target_starts[:num_batch_rows]).max()) \
        if num_batch_rows else 0
    lanes = max(1, max_target_rows + q)  # context rows and query rows of the longest request
    block = block or min(MAX_BLOCK, triton.next_power_of_2(lanes))
    grid = (num_batch_rows + 1, triton.cdiv(lanes, block))
    extra = {} if num_warps is None else {"num_warps": num_warps}
    _prepare_draft_inputs_kernel[grid](
        idx_mapping, target_query_start_loc, target_positions, num_sampled, num_rejected, last_sampled,
        next_prefill_tokens, num_cached_tokens, block_table, block_table.stride(0), block_table.shape[1], block_size,
        q, k, 0 if anchor_first else 1, mask_token_id, max_model_len,
        context_positions, context_slot_mapping, context_positions.numel(),
        input_ids, positions, query_slot_mapping, input_ids.numel(),
        sample_indices, sample_pos, sample_idx_mapping, sample_indices.numel(),
        query_start_loc, query_start_loc.numel(), seq_lens, seq_lens.numel(), num_batch_rows, BLOCK=block, **extra)
    return True


def _at_least(name: str, t: torch.Tensor, need: int) -> None:
    rows = t.shape[0]
    if rows < need:
        raise ValueError(f"{name}: {rows} rows, the live batch needs at least {need}")
