"""Case families for draft-input preparation: both layouts, padded buffers, prefix-cache hits.

Every output buffer is pre-filled with SENTINEL, so a row the kernel should have written but
left stale shows as a divergence; unused target positions hold POISON, so reading past a
request's rows shows too. Slots outside the batch get unaligned cached counts: the fail-closed
test and seq_lens must look at live slots only.
"""

import numpy as np
import torch

from kernels.draft_inputs import MAX_BLOCK
from stress.core.types import Case
from stress.families import common
from stress.families.common import BLOCK_SIZES, SENTINEL, big, distinct_blocks, int32, int64, pick, slots_for

POISON = -999_999


def sweep(device: str) -> list[dict]:
    """Launch shapes: small blocks split a request over several programs; default picks one block."""
    if device == "cuda":
        return [{}] + [{"block": b, "num_warps": w} for b in (16, 64, 256) for w in (1, 4, 8)]
    return [{}, {"block": 16}]


def _rows(rng, batch_rows, k, *, prefill, reject, chunk):
    """Per batch row: (target rows, num_sampled, num_rejected); prefill chunks have 1..chunk-1 rows."""
    rows = []
    for _ in range(batch_rows):
        if rng.random() < prefill:  # a prefill chunk: 0 sampled means the chunk ends mid-prompt
            rows.append((int(rng.integers(1, chunk)), int(rng.integers(0, 2)), 0))
            continue
        n_ctx = 1 + int(rng.integers(0, k + 1))  # bonus + drafts verified last step
        accepted = int(rng.integers(1, n_ctx + 1)) if rng.random() < reject else n_ctx
        rows.append((n_ctx, accepted, n_ctx - accepted))
    return rows


def _cached_count(rng, first_pos, block_size, unaligned):
    aligned = int(rng.integers(0, first_pos // block_size + 1)) * block_size
    return aligned + int(rng.integers(1, block_size)) if unaligned else aligned


def draft_case(rng, *, batch_rows, k=None, anchor_first=None, block_size=None, pad_rows=0, pad_tokens=0,
               prefill=0.2, reject=0.3, chunk=10, null_frac=0.0, unaligned=False, near_max=False,
               past_row=False, context_pad=0, note="") -> Case:
    """A batch of ``batch_rows`` requests; ``unaligned`` gives one live slot a partial cached block; ``past_row``
    moves each request's last target row past its table row (its block index the row's width); ``context_pad``
    makes the context buffers that many entries longer than the target positions (padding included)."""
    anchor_first = bool(rng.integers(2)) if anchor_first is None else anchor_first
    k = int(rng.integers(1, 5)) if k is None else k
    q = k if anchor_first else 1 + k
    bs = pick(rng, BLOCK_SIZES) if block_size is None else block_size
    width = int(rng.integers(1, 7)) + chunk // bs
    idx_mapping, num_slots = slots_for(rng, batch_rows, int(rng.integers(0, 3)))
    cached = np.zeros(num_slots, dtype=np.int64)
    idle = np.setdiff1d(np.arange(num_slots), idx_mapping.numpy())
    cached[idle] = rng.integers(0, 40, idle.size) * bs + (1 if bs > 1 else 0)
    victim = int(rng.integers(batch_rows)) if unaligned else -1

    rows = _rows(rng, batch_rows, k, prefill=prefill, reject=reject, chunk=chunk)
    positions, last_positions = [], []
    for batch_row, (n_ctx, _, rejected) in enumerate(rows):
        first = int(rng.integers(0, width * bs + 2))
        if past_row:
            first = max(first, width * bs - n_ctx + 1)
        positions.extend(range(first, first + n_ctx))
        last_positions.append(first + n_ctx - rejected - 1)
        cached[int(idx_mapping[batch_row])] = _cached_count(rng, first, bs, batch_row == victim)
    num_target_rows = len(positions)
    max_model_len = max(last_positions, default=0) + 1 + (int(rng.integers(0, q + 1)) if near_max else 64)

    table = distinct_blocks(rng, batch_rows + pad_rows, width)
    table[torch.from_numpy(rng.random(table.shape) < null_frac)] = 0
    num_query_rows = batch_rows * q + pad_tokens

    def sentinel(n, dtype):
        return torch.full((n,), SENTINEL, dtype=dtype)

    inputs = {
        "idx_mapping": idx_mapping,
        # a padded row's offset repeats the total (entries past B + 1 are never read)
        "target_query_start_loc": int32(np.concatenate([[0], np.cumsum([r[0] for r in rows], dtype=np.int64),
                                                        [num_target_rows] * pad_rows])),
        "target_positions": int64(positions + [POISON] * pad_tokens),
        "num_sampled": int32([r[1] for r in rows]),
        "num_rejected": int32([r[2] for r in rows]),
        "last_sampled": int64(rng.integers(0, 50_000, num_slots)),
        "next_prefill_tokens": int32(rng.integers(50_000, 100_000, num_slots)),
        "num_cached_tokens": int32(cached),
        "block_table": table,
        "block_size": bs,
        "num_draft_tokens": k,
        "anchor_first": anchor_first,
        "mask_token_id": int(rng.integers(100_000, 200_000)),
        "max_model_len": max_model_len,
        "context_positions": sentinel(num_target_rows + pad_tokens + context_pad, torch.int64),
        "context_slot_mapping": sentinel(num_target_rows + pad_tokens + context_pad, torch.int64),
        "input_ids": sentinel(num_query_rows, torch.int32),
        "positions": sentinel(num_query_rows, torch.int64),
        "query_slot_mapping": sentinel(num_query_rows, torch.int64),
        "sample_indices": sentinel((batch_rows + pad_rows) * k, torch.int64),
        "sample_pos": sentinel((batch_rows + pad_rows) * k, torch.int64),
        "sample_idx_mapping": sentinel((batch_rows + pad_rows) * k, torch.int32),
        "query_start_loc": sentinel(batch_rows + pad_rows + 1, torch.int32),
        "seq_lens": sentinel(batch_rows + pad_rows, torch.int32),
        "draft_tokens": torch.full((batch_rows + pad_rows, k), SENTINEL, dtype=torch.int64),
    }
    layout = "dspark" if anchor_first else "dflash"
    return Case(inputs=inputs, note=f"{layout} K={k} bs={bs} B={batch_rows}+{pad_rows} {note}".strip())


def _batch(rng, device, cpu_max):
    """Live batch rows: a handful under the interpreter, up to 64 on the GPU."""
    return int(rng.integers(1, (64 if big(device) else cpu_max) + 1))


def _padding(rng):
    return {"pad_rows": int(rng.integers(0, 2)), "pad_tokens": int(rng.integers(0, 3))}


def longer_context(rng, device, launch):
    """Context buffers longer than the target positions, as an engine's static ones are past a step of fewer
    tokens: every context entry past the live rows must become inert, to the buffers' end, not to the end of
    the target positions."""
    return draft_case(rng, batch_rows=_batch(rng, device, 2), **_padding(rng), context_pad=int(rng.integers(1, 40)),
                      note="longer context buffers")


def decode(rng, device, launch):
    return draft_case(rng, batch_rows=_batch(rng, device, 3), **_padding(rng))


def padded(rng, device, launch):
    """Live batch smaller than every buffer, as under a CUDA-graph replay: the tail must become inert."""
    return draft_case(rng, batch_rows=_batch(rng, device, 2), pad_rows=int(rng.integers(1, 4)),
                      pad_tokens=int(rng.integers(1, 12)), note="padded")


def prefix_cache(rng, device, launch):
    """Aligned cached prefixes shorten seq_lens; one unaligned live slot refuses the batch."""
    unaligned = bool(rng.integers(2))
    return draft_case(rng, batch_rows=_batch(rng, device, 2), block_size=pick(rng, BLOCK_SIZES[1:]),
                      unaligned=unaligned, **_padding(rng), note="unaligned" if unaligned else "aligned")


def rejected_suffix(rng, device, launch):
    """Decode rows whose trailing draft rows were rejected: position 0 / PAD, queries after the accepted ones."""
    return draft_case(rng, batch_rows=_batch(rng, device, 2), prefill=0.0, reject=1.0, **_padding(rng),
                      note="rejections")


def chunked_prefill(rng, device, launch):
    """Prefill chunks: long context spans, the bonus is the next prompt token when nothing was sampled."""
    return draft_case(rng, batch_rows=_batch(rng, device, 2), prefill=1.0, **_padding(rng), note="prefill")


def zero_width(rng, device, launch):
    """No live request (only padding to clear), or DFlash at depth 0 (a bonus row, no sampling rows)."""
    if rng.integers(2):
        return draft_case(rng, batch_rows=0, pad_rows=int(rng.integers(0, 3)), pad_tokens=int(rng.integers(0, 5)),
                          note="no requests")
    return draft_case(rng, batch_rows=_batch(rng, device, 2), k=0, anchor_first=False, **_padding(rng),
                      note="depth 0")


def max_model_len(rng, device, launch):
    """Query positions run past max_model_len - 1 and are clamped (slots and sample_pos are not)."""
    return draft_case(rng, batch_rows=_batch(rng, device, 2), near_max=True, **_padding(rng), note="near max len")


def long_prefill(rng, device, launch):
    """Prefill chunks up to two and a bit program blocks long: several token blocks per row."""
    chunk = 2048 if big(device) else 2 * launch.get("block", MAX_BLOCK) + 2
    return draft_case(rng, batch_rows=_batch(rng, device, 1), prefill=1.0, chunk=chunk,
                      **_padding(rng), note="long prefill")


def many_padded_rows(rng, device, launch):
    """CUDA-graph padding of more batch rows than one program block (17 to 80 behind a live batch of a few):
    the padding loops of query_start_loc, seq_lens and the sampling rows run several iterations, each from
    where the last stopped."""
    return draft_case(rng, batch_rows=_batch(rng, device, 2), pad_rows=int(rng.integers(17, 81)),
                      pad_tokens=int(rng.integers(0, 3)), note="many padded rows")


def cached_past_last(rng, device, launch):
    """Live slots whose cached count, whole blocks, lies past the row's last valid position + 1: the visible span
    p + 1 + Q - cached is below Q, and seq_lens is Q (the floor of its max)."""
    case = draft_case(rng, batch_rows=_batch(rng, device, 2), **_padding(rng), note="cached past the last position")
    inputs = case.inputs
    bs, starts = inputs["block_size"], inputs["target_query_start_loc"]
    for batch_row, slot in enumerate(inputs["idx_mapping"].tolist()):
        last = int(inputs["target_positions"][int(starts[batch_row + 1]) - int(inputs["num_rejected"][batch_row]) - 1])
        inputs["num_cached_tokens"][slot] = (-(-(last + 2) // bs) + int(rng.integers(0, 3))) * bs
    return case


def _past_row(rng, device, launch):
    return draft_case(rng, batch_rows=_batch(rng, device, 2), past_row=True, **_padding(rng),
                      note="last target rows past the table row")


def null_block(rng, device, launch):
    """Null blocks (id 0) in the table: those rows get PAD, never slot 0 * bs + offset."""
    return draft_case(rng, batch_rows=_batch(rng, device, 2), null_frac=0.4, **_padding(rng), note="null blocks")


def tiles(rng, device, launch):
    """Prefill spans up to one past the program block and padding tails one below, at and one above one
    and two blocks: every masked edge of the row and padding loops."""
    block = launch.get("block", MAX_BLOCK)
    return draft_case(rng, batch_rows=_batch(rng, device, 2), prefill=0.5, chunk=block + 2,
                      pad_rows=int(rng.integers(0, 2)), pad_tokens=pick(rng, common.tile_boundary_sizes(block)),
                      note=f"block {block} edges")


def extremes(rng, device, launch):
    """Block ids, token ids and the mask id at the top of the int32 range, idle slots cached 2^31 - 1
    tokens. One case in two keeps its positions in the table rows, with block sizes past 1 (an id times the
    block size passes 2^31); the others move every position up with max_model_len: by about 2^30, or (block
    size 3) so that the largest live cached count is the last multiple of 3 below 2^31, where rounding a
    count up to a whole block would pass 2^31. int64 position and slot arithmetic, block indices far past
    the row."""
    moving = pick(rng, (0, 0, 1, 2))
    case = draft_case(rng, batch_rows=_batch(rng, device, 2), null_frac=0.2, **_padding(rng), note="int32 extremes",
                      block_size=pick(rng, BLOCK_SIZES[1:]) if moving == 0 else 3 if moving == 2 else None)
    inputs = case.inputs
    table = inputs["block_table"]
    inputs["block_table"] = common.near_int32_max(rng, table.shape).masked_fill(table == 0, 0)
    num_slots = inputs["last_sampled"].numel()
    inputs["last_sampled"] = int64(common.INT32_MAX - rng.integers(0, 1000, num_slots))
    inputs["next_prefill_tokens"] = int32(common.INT32_MAX - rng.integers(0, 1000, num_slots))
    inputs["mask_token_id"] = common.INT32_MAX
    cached = inputs["num_cached_tokens"]
    live = torch.zeros(num_slots, dtype=torch.bool)
    live[inputs["idx_mapping"].long()] = True
    cached[~live] = common.INT32_MAX
    if moving:
        bs = inputs["block_size"]
        top = common.INT32_MAX // bs * bs
        moved = 2**30 // bs * bs if moving == 1 else top - int(cached[live].max())  # a whole number of blocks
        positions = inputs["target_positions"]
        positions[positions != POISON] += moved
        cached[live] += moved
        inputs["max_model_len"] += moved
        case.note += ", positions near 2^30" if moving == 1 else f", a live slot cached {top} tokens"
    return case


def big_offsets(rng, device, launch):
    """On the GPU, block-table rows spread over 2^31 elements: the last batch row's table offset, its row
    times the row stride, passes 2^31, which int32 arithmetic wraps (a view of about 8.6 GB; only its rows
    are read). Three batch rows or more, so the stride itself fits int32. The CPU runs the same layout a few
    thousand elements apart. No padded table rows: the last batch row is the table's last."""
    case = draft_case(rng, batch_rows=int(rng.integers(3, 6)), pad_tokens=int(rng.integers(0, 3)))
    reach = common.offset_reach(rng, device)
    case.inputs["block_table"] = common.spread(case.inputs["block_table"], 0, reach)
    case.note += f", block_table spread over {reach} elements"
    return case


def no_requests(rng, device, launch):
    """An empty batch (B = 0) in every case, over buffers of stale values: the extra program still clears them
    all, and no launcher step may read a live row that is not there (``zero_width`` draws it half the time)."""
    return draft_case(rng, batch_rows=0, pad_rows=int(rng.integers(0, 4)), pad_tokens=int(rng.integers(0, 6)),
                      note="no requests")


FAMILIES = {"decode": decode, "padded": padded, "prefix_cache": prefix_cache, "rejected_suffix": rejected_suffix,
            "chunked_prefill": chunked_prefill, "zero_width": zero_width, "max_model_len": max_model_len,
            "null_block": null_block, "long_prefill": long_prefill, "tiles": tiles, "extremes": extremes,
            "big_offsets": big_offsets, "many_padded_rows": many_padded_rows, "cached_past_last": cached_past_last,
            "layouts": common.laid_out(prefix_cache, "block_table", "draft_tokens"),
            # positions whose block index is the row's width, in tables whose rows are padded: only the width, not
            # the row stride, says where a row ends
            "layouts_past_row": common.laid_out(_past_row, "block_table"), "no_requests": no_requests,
            "longer_context": longer_context}
