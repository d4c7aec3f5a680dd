"""Case families for the block-table kernels (gather, slot mappings, in-place shift, fail-closed test)."""

import numpy as np
import torch

from kernels.block_table import PAD_TILE, ROW_PATH_TOKENS_PER_ROW, ROW_TILE, ROW_TILE_SPLIT, ROW_TILE_TOKENS
from stress.core.types import Case
from stress.families.common import (
    BLOCK_SIZES,
    INT32_MAX,
    SENTINEL,
    big,
    distinct_blocks,
    int32,
    int64,
    laid_out,
    near_int32_max,
    offset_reach,
    one_per_value,
    pick,
    slots_for,
    spread,
    tile_boundary_sizes,
)

# ---------------------------------------------------------------- shift_block_table_rows


def shift_sweep(device: str) -> list[dict]:
    """Launch shapes: the race is certain in some and invisible in others (anchors 2.5)."""
    if device == "cuda":
        return [{"chunk": c, "num_warps": w} for c in (128, 256, 512, 1024, 2048, 4096) for w in (1, 2, 4, 8, 16)]
    return [{"chunk": 16}, {"chunk": 64}, {}]  # {}: the launcher's defaults (chunk 1024)


def _shift_case(rng, *, width, block_size, shifts, residuals, seq_lens, table_rows=None, extra_slots=3,
                note="") -> Case:
    """Batch row b shifts by ``shifts[b]`` blocks (+ ``residuals[b]`` tokens) with ``seq_lens[b]`` tokens;
    a shift of None makes b a padded batch row (slot -1), which must not move.

    Slots not in the batch get random cached counts, so reading the count by batch row instead
    of by slot gives a different shift.
    """
    batch_rows = len(shifts)
    rows = table_rows if table_rows is not None else batch_rows
    table = distinct_blocks(rng, rows, width)
    idx_mapping, num_slots = slots_for(rng, batch_rows, extra_slots)
    cached = rng.integers(0, max(1, width * block_size), num_slots)
    for b in range(batch_rows):
        if shifts[b] is None:
            idx_mapping[b] = -1
        else:
            cached[int(idx_mapping[b])] = shifts[b] * block_size + residuals[b]
    seq = np.zeros(max(rows, batch_rows), dtype=np.int64)
    seq[:batch_rows] = seq_lens
    return Case(
        inputs={"block_table": table, "idx_mapping": idx_mapping, "num_cached_tokens": int32(cached),
                "seq_lens": int32(seq), "block_size": block_size},
        note=note)


def shift_overlap(rng, device, launch):
    """Shift just below, at and just above the chunk width, and far above it."""
    chunk = launch.get("chunk", 1024)
    shift = pick(rng, (1, 2, chunk - 1, chunk, chunk + 1, 2 * chunk + 1, int(rng.integers(1, 4 * chunk))))
    shift = max(1, shift)
    cap = 16384 if big(device) else 2 * chunk + 64
    width = int(rng.integers(shift + 1, max(shift + 2, min(cap, shift + 4 * chunk))))
    rows = int(rng.integers(1, 5 if big(device) else 3))
    bs = pick(rng, BLOCK_SIZES)
    return _shift_case(rng, width=width, block_size=bs, shifts=[shift] * rows, residuals=[0] * rows,
                       seq_lens=[width * bs] * rows, note=f"shift {shift} vs chunk {chunk}, width {width}")


def shift_partial_block(rng, device, launch):
    """Cached counts and seq_lens that are not block multiples; the row tail must stay untouched."""
    bs = pick(rng, BLOCK_SIZES[1:])
    width = int(rng.integers(8, 2048 if big(device) else 96))
    rows = int(rng.integers(1, 6))
    shifts = [int(rng.integers(1, width // 2)) for _ in range(rows)]
    residuals = [int(rng.integers(1, bs)) for _ in range(rows)]
    seq_lens = [int(rng.integers(1, (width - s) * bs)) for s in shifts]
    return _shift_case(rng, width=width, block_size=bs, shifts=shifts, residuals=residuals, seq_lens=seq_lens,
                       note="partial blocks, short seq_lens")


def shift_long_row(rng, device, launch):
    """Rows up to 16384 entries: many chunks and warp boundaries."""
    width = pick(rng, (4096, 8192, 16384) if big(device) else (256, 512))
    rows = int(rng.integers(1, 4))
    shifts = [int(rng.integers(1, 64)) for _ in range(rows)]
    return _shift_case(rng, width=width, block_size=16, shifts=shifts, residuals=[0] * rows,
                       seq_lens=[width * 16] * rows, note=f"width {width}")


def shift_zero_shift(rng, device, launch):
    """Every live slot has fewer cached tokens than a block: nothing may be written."""
    bs = pick(rng, BLOCK_SIZES[1:])
    rows = int(rng.integers(1, 6))
    return _shift_case(rng, width=int(rng.integers(1, 64)), block_size=bs, shifts=[0] * rows,
                       residuals=[int(rng.integers(0, bs)) for _ in range(rows)],
                       seq_lens=[int(rng.integers(0, 64 * bs)) for _ in range(rows)], note="shift 0")


def shift_zero_width(rng, device, launch):
    """No batch rows, or rows of width 0."""
    if rng.integers(2):
        return _shift_case(rng, width=int(rng.integers(1, 16)), block_size=16, shifts=[], residuals=[],
                           seq_lens=[], table_rows=3, note="no batch rows")
    rows = int(rng.integers(1, 4))
    return _shift_case(rng, width=0, block_size=16, shifts=[1] * rows, residuals=[0] * rows,
                       seq_lens=[32] * rows, note="width 0")


def shift_padded(rng, device, launch):
    """CUDA-graph padding: batch rows with slot -1 among the live ones (a count of 0, never one read before
    the counts; block size 1 makes any count a shift) and table rows past the batch holding sentinels.
    Narrow tables have more batch rows than columns."""
    live = int(rng.integers(1, 5))
    padded_rows = int(rng.integers(1, 4))
    pad = int(rng.integers(1, 5))
    width = int(rng.integers(2, 512 if big(device) else 64)) if rng.integers(2) else int(rng.integers(2, 5))
    bs = pick(rng, BLOCK_SIZES)
    shifts = [int(rng.integers(1, width)) for _ in range(live)] + [None] * padded_rows
    shifts = [shifts[i] for i in rng.permutation(len(shifts))]
    rows = len(shifts)
    case = _shift_case(rng, width=width, block_size=bs, shifts=shifts, residuals=[0] * rows,
                       seq_lens=[width * bs] * rows, table_rows=rows + pad,
                       note=f"{padded_rows} slot -1 rows, {pad} padded table rows, bs {bs}")
    case.inputs["block_table"][rows:] = SENTINEL
    return case


def shift_slot_vs_row(rng, device, launch):
    """idx_mapping is a permutation with gaps and every slot's shift differs."""
    rows = int(rng.integers(3, 9))
    width = int(rng.integers(rows + 2, 256 if big(device) else 48))
    case = _shift_case(rng, width=width, block_size=16, shifts=[0] * rows, residuals=[0] * rows,
                       seq_lens=[width * 16] * rows, extra_slots=rows, note="slot != batch row")
    num_slots = case.inputs["num_cached_tokens"].numel()
    case.inputs["num_cached_tokens"] = int32((rng.permutation(num_slots) % (width - 1) + 1) * 16)
    return case


def shift_tiles(rng, device, launch):
    """Copies of one below, at and one above one and two chunks: the last chunk's mask at its edge."""
    chunk = launch.get("chunk", 1024)
    rows = int(rng.integers(1, 4))
    copied = [pick(rng, tile_boundary_sizes(chunk)) for _ in range(rows)]
    shifts = [int(rng.integers(1, 2 * chunk + 2)) for _ in range(rows)]
    width = max(s + n for s, n in zip(shifts, copied, strict=True)) + int(rng.integers(0, 3))
    return _shift_case(rng, width=width, block_size=16, shifts=shifts, residuals=[0] * rows,
                       seq_lens=[n * 16 - int(rng.integers(0, 16)) for n in copied],
                       note=f"{copied} blocks copied, chunk {chunk}")


def shift_extremes(rng, device, launch):
    """Block ids at the top of the int32 range, seq_lens up to 2^31 - 1 (the blocks needed pass the
    row) and cached counts up to 2^31 - 1 (shifts past the row: nothing to copy)."""
    rows = int(rng.integers(1, 5))
    width = int(rng.integers(2, 64))
    bs = pick(rng, BLOCK_SIZES)
    shifts = [int(rng.integers(1, width)) for _ in range(rows)]
    seq_lens = [pick(rng, (INT32_MAX, INT32_MAX - int(rng.integers(bs)), width * bs + 1)) for _ in range(rows)]
    case = _shift_case(rng, width=width, block_size=bs, shifts=shifts, residuals=[0] * rows, seq_lens=seq_lens,
                       note="int32 extremes")
    case.inputs["block_table"] = near_int32_max(rng, case.inputs["block_table"].shape)
    cached = case.inputs["num_cached_tokens"]
    past = torch.from_numpy(rng.random(cached.numel()) < 0.3)
    cached[past] = INT32_MAX - torch.from_numpy(rng.integers(0, bs, int(past.sum())).astype(np.int32))
    return case


def shift_big_offsets(rng, device, launch):
    """On the GPU, table rows spread over 2^31 elements, every batch row shifting: the last row's offset, its
    batch row times the row stride, passes 2^31, which int32 arithmetic wraps (a view of about 8.6 GB; only
    its rows are written). Three rows or more, so the stride itself fits int32. The CPU runs the same layout
    a few thousand elements apart."""
    rows = int(rng.integers(3, 6))
    width = int(rng.integers(2, 40))
    bs = pick(rng, BLOCK_SIZES)
    case = _shift_case(rng, width=width, block_size=bs, shifts=[int(rng.integers(1, width)) for _ in range(rows)],
                       residuals=[0] * rows, seq_lens=[width * bs] * rows)
    reach = offset_reach(rng, device)
    case.inputs["block_table"] = spread(case.inputs["block_table"], 0, reach)
    case.note = f"block_table spread over {reach} elements"
    return case


def shift_exact_seq_lens(rng, device, launch):
    """``padded`` cases whose seq_lens hold exactly one entry per batch row while the table keeps its rows past
    the batch: seq_lens is by batch row, so its length is bounded by the batch, never by the table."""
    case = shift_padded(rng, device, launch)
    rows = case.inputs["idx_mapping"].numel()
    case.inputs["seq_lens"] = case.inputs["seq_lens"][:rows].clone()
    case.note += f", seq_lens of exactly {rows} entries"
    return case


SHIFT_FAMILIES = {
    "overlap": shift_overlap, "partial_block": shift_partial_block, "long_row": shift_long_row,
    "zero_shift": shift_zero_shift, "zero_width": shift_zero_width, "padded": shift_padded,
    "slot_vs_row": shift_slot_vs_row, "layouts": laid_out(shift_padded, "block_table"), "tiles": shift_tiles,
    "extremes": shift_extremes, "big_offsets": shift_big_offsets, "exact_seq_lens": shift_exact_seq_lens,
}

# ---------------------------------------------------------------- gather_block_tables


def _gather_case(rng, *, batch_rows, pad_rows, width, extra_slots, negative=0.0, note=""):
    idx_mapping, num_slots = slots_for(rng, batch_rows, extra_slots)
    if negative:
        idx_mapping[torch.from_numpy(rng.random(batch_rows) < negative)] = -1
    out = torch.full((batch_rows + pad_rows, width), SENTINEL, dtype=torch.int32)
    return Case(inputs={"persistent": distinct_blocks(rng, num_slots, width), "idx_mapping": idx_mapping,
                        "out": out}, note=note)


def gather_basic(rng, device, launch):
    return _gather_case(rng, batch_rows=int(rng.integers(1, 9)), pad_rows=0,
                        width=int(rng.integers(1, 4096 if big(device) else 80)), extra_slots=int(rng.integers(0, 8)))


def gather_padded(rng, device, launch):
    """Output rows past the batch hold sentinels that must survive."""
    return _gather_case(rng, batch_rows=int(rng.integers(1, 6)), pad_rows=int(rng.integers(1, 6)),
                        width=int(rng.integers(1, 64)), extra_slots=2, note="padded output rows")


def gather_negative_slot(rng, device, launch):
    """Padded batch rows with slot -1 gather null blocks."""
    return _gather_case(rng, batch_rows=int(rng.integers(2, 8)), pad_rows=1, width=int(rng.integers(1, 64)),
                        extra_slots=2, negative=0.4, note="slot -1 rows")


def gather_wide(rng, device, launch):
    """Rows wider than one program's block; on the GPU also wider than 2^20, the largest tile Triton compiles."""
    width = pick(rng, (1025, 4097, 16384, 2**20 + 1) if big(device) else (1025, 1500))
    return _gather_case(rng, batch_rows=int(rng.integers(1, 4)), pad_rows=0, width=width, extra_slots=3,
                        note=f"width {width}")


def gather_no_rows(rng, device, launch):
    """No batch rows and no slots: an empty batch of an empty pool is valid, and nothing is written."""
    return _gather_case(rng, batch_rows=0, pad_rows=2, width=8, extra_slots=0, note="no batch rows, no slots")


def gather_no_rows_some_slots(rng, device, launch):
    """No batch rows over a pool of three slots: nothing to write."""
    return _gather_case(rng, batch_rows=0, pad_rows=2, width=8, extra_slots=3, note="no batch rows, 3 slots")


def gather_zero_width(rng, device, launch):
    """Batch rows of width 0, with slots or with none (every row padded): nothing to gather, nothing to write."""
    slots, rows = pick(rng, (0, 2)), 3
    return Case(inputs={"persistent": torch.zeros((slots, 0), dtype=torch.int32),
                        "idx_mapping": int32(rng.integers(-1, slots, rows)),
                        "out": torch.zeros((rows + int(rng.integers(0, 2)), 0), dtype=torch.int32)},
                note=f"width 0, {slots} slots")


def gather_one_slot(rng, device, launch):
    """A single slot row that every live batch row gathers (the others are padded, slot -1)."""
    rows = int(rng.integers(1, 5))
    slots = rng.integers(-1, 1, rows)
    slots[int(rng.integers(rows))] = 0
    case = _gather_case(rng, batch_rows=rows, pad_rows=int(rng.integers(0, 2)), width=int(rng.integers(1, 40)),
                        extra_slots=0, note="one slot")
    case.inputs["idx_mapping"] = int32(slots)
    case.inputs["persistent"] = case.inputs["persistent"][:1].contiguous()
    return case


def gather_narrow(rng, device, launch):
    """More batch rows than columns (one to three blocks per row): a row count is never compared with the width."""
    width = int(rng.integers(1, 4))
    return _gather_case(rng, batch_rows=int(rng.integers(width + 1, 9)), pad_rows=int(rng.integers(0, 2)),
                        width=width, extra_slots=int(rng.integers(0, 3)), negative=0.2, note=f"width {width}")


def gather_tiles(rng, device, launch):
    """Widths one below, at and one above the launcher's column block (the width rounded up to a power of
    two, at most 1024) and twice it."""
    width = pick(rng, tile_boundary_sizes(pick(rng, (16, 64, 1024))))
    return _gather_case(rng, batch_rows=int(rng.integers(1, 4)), pad_rows=1, width=width, extra_slots=2,
                        negative=0.2, note=f"width {width}")


def gather_extremes(rng, device, launch):
    """Block ids at the top of the int32 range, copied bit for bit."""
    case = gather_negative_slot(rng, device, launch)
    case.inputs["persistent"] = near_int32_max(rng, case.inputs["persistent"].shape)
    case.note = "block ids near 2^31"
    return case


def gather_big_offsets(rng, device, launch, spread_rows):
    """On the GPU, slot rows (``persistent``) or out rows (``out``), one per family, spread over 2^31 elements,
    the last slot gathered and the last out row written: their offsets pass 2^31, which int32 offset arithmetic
    wraps (a view of about 8.6 GB; only its rows are written). Three rows or more, so the row stride fits int32
    and only the row times the stride passes it (two rows 2^31 apart have a stride Triton passes as int64).
    The CPU runs the same layouts a few thousand elements apart."""
    reach = offset_reach(rng, device)
    rows = int(rng.integers(3, 6))
    case = _gather_case(rng, batch_rows=rows, pad_rows=0, width=int(rng.integers(1, 64)),
                        extra_slots=int(rng.integers(0, 3)), negative=0.2)
    case.inputs["idx_mapping"][int(rng.integers(rows))] = case.inputs["persistent"].shape[0] - 1
    case.inputs[spread_rows] = spread(case.inputs[spread_rows], 0, reach)
    case.note = f"{spread_rows} spread over {reach} elements"
    return case


GATHER_FAMILIES = {"basic": gather_basic, "padded": gather_padded, "negative_slot": gather_negative_slot,
                   "wide": gather_wide, "no_rows": gather_no_rows, "zero_width": gather_zero_width,
                   "no_rows_some_slots": gather_no_rows_some_slots, "one_slot": gather_one_slot,
                   "narrow": gather_narrow,
                   "layouts": laid_out(gather_negative_slot, "persistent", "out"), "tiles": gather_tiles,
                   "extremes": gather_extremes,
                   **one_per_value(gather_big_offsets, "spread_rows", ("persistent", "out"), "big_offsets")}

# ---------------------------------------------------------------- compute_slot_mappings


def _slot_mapping_case(rng, *, query_lens, width, block_size, null_frac=0.1, out_extra=0, past_width=False,
                       lead=0, note=""):
    """``lead`` tokens before the first batch row's start belong to no row: they must become PAD."""
    batch_rows = len(query_lens)
    table = distinct_blocks(rng, max(batch_rows, 1), width)
    table[torch.from_numpy(rng.random(table.shape) < null_frac)] = 0
    starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int64) + lead
    positions = [int(p) for p in rng.integers(0, width * block_size, lead)]
    for q in query_lens:
        limit = width * block_size * (2 if past_width else 1)
        first = int(rng.integers(0, max(1, limit - q + 1)))
        positions.extend(range(first, first + q))
    if past_width and len(positions) > lead:
        # -1 (a common padding position) is the one a block index truncated toward zero would wrongly map into
        # the row's first block: every such case holds it, beside -block_size and a random negative
        spots = rng.choice(np.arange(lead, len(positions)), size=min(3, len(positions) - lead), replace=False)
        for spot, value in zip(spots, (-1, -block_size, -int(rng.integers(1, 100))), strict=False):
            positions[int(spot)] = value
    out = torch.full((int(starts[-1]) + out_extra,), SENTINEL, dtype=torch.int64)
    return Case(inputs={"block_table": table, "query_start_loc": int32(starts), "positions": int64(positions),
                        "block_size": block_size, "out": out}, note=note)


def slots_basic(rng, device, launch):
    rows = int(rng.integers(1, 9))
    return _slot_mapping_case(rng, query_lens=[int(rng.integers(1, 20)) for _ in range(rows)],
                              width=int(rng.integers(1, 64)), block_size=pick(rng, BLOCK_SIZES))


def slots_partial_block(rng, device, launch):
    """Query spans that start and end inside blocks."""
    bs = pick(rng, BLOCK_SIZES[1:])
    rows = int(rng.integers(1, 6))
    return _slot_mapping_case(rng, query_lens=[int(rng.integers(1, 3 * bs)) for _ in range(rows)],
                              width=int(rng.integers(3, 32)), block_size=bs, null_frac=0.0, note="partial blocks")


def slots_padded(rng, device, launch):
    """Tokens past the batch (CUDA-graph padding) and, one time in two, tokens before the first row's start
    (query_start_loc[0] > 0) must become PAD, never keep the sentinel."""
    rows = int(rng.integers(1, 6))
    lead = int(rng.integers(1, 40)) if rng.integers(2) else 0
    return _slot_mapping_case(rng, query_lens=[int(rng.integers(1, 12)) for _ in range(rows)],
                              width=int(rng.integers(1, 32)), block_size=16, out_extra=int(rng.integers(1, 600)),
                              lead=lead, note=f"padded tokens, {lead} before the first row")


def slots_past_width(rng, device, launch):
    """Positions past the row and negative ones give PAD and read nothing outside the row."""
    rows = int(rng.integers(1, 6))
    return _slot_mapping_case(rng, query_lens=[int(rng.integers(1, 12)) for _ in range(rows)],
                              width=int(rng.integers(1, 16)), block_size=pick(rng, BLOCK_SIZES), past_width=True,
                              note="positions past the row")


def slots_long_query(rng, device, launch):
    """Prefill-sized spans crossing many program blocks."""
    rows = int(rng.integers(1, 4))
    q = 4096 if big(device) else 700
    return _slot_mapping_case(rng, query_lens=[int(rng.integers(1, q)) for _ in range(rows)], width=512,
                              block_size=16, out_extra=int(rng.integers(0, 300)), note="long spans")


def slots_zero_width(rng, device, launch):
    return _slot_mapping_case(rng, query_lens=[0] * int(rng.integers(0, 3)), width=4, block_size=16,
                              out_extra=int(rng.integers(0, 5)), note="no tokens")


def slots_tiles(rng, device, launch):
    """Spans and padding tails one below, at and one above one and two 256-token program blocks."""
    rows = int(rng.integers(1, 3))
    return _slot_mapping_case(rng, query_lens=[pick(rng, tile_boundary_sizes(256)) for _ in range(rows)],
                              width=40, block_size=16, out_extra=pick(rng, (0, *tile_boundary_sizes(256))),
                              note="256-token block edges")


def slots_one_token(rng, device, launch):
    """The smallest output: one token (one row of one, or no row and one padding token)."""
    lens = pick(rng, ([1], [0], []))
    return _slot_mapping_case(rng, query_lens=lens, width=int(rng.integers(1, 4)), block_size=pick(rng, BLOCK_SIZES),
                              out_extra=1 - sum(lens), null_frac=0.0, note="one output token")


def slots_prefill_rows(rng, device, launch):
    """Many batch rows, prefill-sized ones among decode-sized and empty ones, some ending exactly on a
    256-token program block: whole program blocks inside late rows, where one scalar search of the tile's
    first token's row decides every lane (an empty row sharing a start must not own the tokens)."""
    lens = []
    for _ in range(int(rng.integers(4, 10))):
        kind = rng.random()
        lens.append(0 if kind < 0.2 else int(rng.integers(1, 4)) if kind < 0.5 else int(rng.integers(257, 700)))
        if rng.random() < 0.3:  # pad this row so the next one starts on a program block
            lens[-1] += -sum(lens) % 256
    return _slot_mapping_case(rng, query_lens=lens, width=64, block_size=16, out_extra=int(rng.integers(0, 3)),
                              note=f"{len(lens)} rows, {sum(lens)} tokens")


def slots_extremes(rng, device, launch):
    """Block ids at the top of the int32 range (id * block size passes 2^31: int64 slots) and positions
    near 2^62 (a block index far past the row: PAD)."""
    case = slots_partial_block(rng, device, launch)
    table = case.inputs["block_table"]
    case.inputs["block_table"] = near_int32_max(rng, table.shape).masked_fill(table == 0, 0)
    positions = case.inputs["positions"]
    far = torch.from_numpy(rng.random(positions.numel()) < 0.2)
    positions[far] = torch.from_numpy(rng.integers(2**62 - 2**20, 2**62, int(far.sum()), dtype=np.int64))
    case.note = "block ids near 2^31, positions near 2^62"
    return case


def _spread_rows_case(rng, device, longest_row: int, note: str) -> Case:
    """Three to five batch rows of 1 to ``longest_row`` tokens on live blocks, in a block table whose rows are
    spread over 2^31 elements on the GPU (a few thousand on the CPU)."""
    reach = offset_reach(rng, device)
    case = _slot_mapping_case(rng, query_lens=[int(rng.integers(1, longest_row + 1))
                                               for _ in range(int(rng.integers(3, 6)))],
                              width=int(rng.integers(1, 16)), block_size=pick(rng, BLOCK_SIZES), null_frac=0.0)
    case.inputs["block_table"] = spread(case.inputs["block_table"], 0, reach)
    case.note = f"block-table rows spread over {reach} elements{note}"
    return case


def slots_big_offsets(rng, device, launch):
    """On the GPU, block-table rows spread over 2^31 elements, the last batch row's tokens on live blocks: their
    table offsets pass 2^31, which int32 row arithmetic wraps (a view of about 8.6 GB, as in gather's
    big_offsets; only its rows are written). Three rows or more, so the row stride fits int32 (two rows 2^31
    apart have a stride Triton passes as int64, which hides int32 row arithmetic). The CPU runs the same layout
    a few thousand elements apart."""
    return _spread_rows_case(rng, device, 11, "")


def slots_big_offsets_row_tiles(rng, device, launch):
    """``big_offsets`` on the row tiles: three to five rows of 1 to ROW_PATH_TOKENS_PER_ROW tokens each, whose
    table offsets pass 2^31 on the GPU (big_offsets' own rows of up to 11 tokens take either launch path, by
    their count)."""
    return _spread_rows_case(rng, device, ROW_PATH_TOKENS_PER_ROW, ", row tiles")


def slots_many_rows(rng, device, launch):
    """Hundreds of decode-sized batch rows among runs of empty ones, most times also before the first row
    with tokens: row counts one below or above a power of two, where the binary searches need every one of
    their steps, and more rows than a 256-token program block has tokens, so a row index and a token index
    are never interchangeable (in the first program block, empty leading rows put row indices above token
    indices)."""
    num_rows = 2 ** int(rng.integers(8, 11)) + pick(rng, (-1, 1))
    lens = [0] * (int(rng.integers(1, 9)) if rng.random() < 0.75 else 0)
    while len(lens) < num_rows:
        lens += [0] * int(rng.integers(1, 6)) if rng.random() < 0.3 else [int(rng.integers(1, 4))]
    width = int(rng.integers(1, 9))  # narrow: the table's row stride is no bound on the search's steps
    return _slot_mapping_case(rng, query_lens=lens[:num_rows], width=width, block_size=pick(rng, BLOCK_SIZES),
                              null_frac=0.0, out_extra=int(rng.integers(0, 3)), note=f"{num_rows} rows, width {width}")


def slots_empty_rows(rng, device, launch):
    """Mostly empty batch rows, led by a run of more empty rows than the batch has tokens: the first token's
    row index passes the token count, which only a search that keeps rows and tokens apart gets right."""
    lens = [int(rng.integers(1, 4)) if rng.random() < 0.2 else 0 for _ in range(int(rng.integers(8, 40)))]
    lead_rows = sum(lens) + int(rng.integers(1, 20))
    return _slot_mapping_case(rng, query_lens=[0] * lead_rows + lens + [int(rng.integers(1, 4))], width=16,
                              block_size=pick(rng, BLOCK_SIZES), null_frac=0.0, out_extra=int(rng.integers(0, 3)),
                              note=f"{lead_rows} empty rows first, {sum(lens)} tokens after")


def slots_lead_long_row(rng, device, launch):
    """Tokens before the first row's start (no row owns them), then a first row that runs past the end of the
    256-token program block it starts in: no row starts at or before the block's first token, and the tile
    still belongs to row 0 alone."""
    lead = int(rng.integers(1, 600))
    first_row = -lead % 256 + int(rng.integers(1, 300))
    lens = [first_row] + [int(rng.integers(0, 20)) for _ in range(int(rng.integers(0, 4)))]
    return _slot_mapping_case(rng, query_lens=lens, width=64, block_size=16, null_frac=0.0, lead=lead,
                              out_extra=int(rng.integers(0, 3)),
                              note=f"{lead} tokens first, a first row of {first_row}")


def slots_empty_table(rng, device, launch):
    """A block table without entries: batch rows of width 0 (every position is past the row: PAD), or a table
    of no rows under a batch of none. out still has tokens, and every one of them must become PAD."""
    if rng.integers(2):
        lens = [int(rng.integers(0, 5)) for _ in range(int(rng.integers(1, 5)))]
        return _slot_mapping_case(rng, query_lens=lens, width=0, block_size=pick(rng, BLOCK_SIZES),
                                  out_extra=int(rng.integers(1, 4)), note="rows of width 0")
    case = _slot_mapping_case(rng, query_lens=[], width=int(rng.integers(0, 4)), block_size=16,
                              out_extra=int(rng.integers(1, 4)), note="a table of no rows, no batch rows")
    case.inputs["block_table"] = case.inputs["block_table"][:0].clone()
    return case


def slots_path_boundary(rng, device, launch):
    """Decode-shaped batches whose token count (tokens before the first row included) is one below, at or one
    above ROW_PATH_TOKENS_PER_ROW per batch row: the same shapes on either side of the launcher's choice
    between row tiles and token tiles. Row counts of a few, or one below, at and one above one and two row
    tiles; tokens spread over the rows at random (empty rows among rows of a dozen); one time in two tokens
    before the first row; PAD tails past one and two PAD programs."""
    rows = pick(rng, (1, 2, 3, int(rng.integers(4, 200)), *tile_boundary_sizes(ROW_TILE)))
    tokens = ROW_PATH_TOKENS_PER_ROW * rows + pick(rng, (-1, 0, 1))
    lead = int(rng.integers(1, min(tokens, 40) + 1)) if rng.integers(2) else 0
    lens = [int(n) for n in rng.multinomial(tokens - lead, np.full(rows, 1 / rows))]
    path = "row tiles" if tokens <= ROW_PATH_TOKENS_PER_ROW * rows else "token tiles"
    return _slot_mapping_case(rng, query_lens=lens, width=int(rng.integers(1, 9)), block_size=pick(rng, BLOCK_SIZES),
                              out_extra=pick(rng, (0, 1, int(rng.integers(2, 300)), PAD_TILE, PAD_TILE + 1)),
                              lead=lead, note=f"{rows} rows, {tokens} tokens ({lead} before the first row): {path}")


def slots_decode_long_row(rng, device, launch):
    """Rows of 0 to 2 tokens around one row of 3 to 3 * ROW_TILE_SPLIT * ROW_TILE_TOKENS tokens (never the first),
    the batch still within ROW_PATH_TOKENS_PER_ROW tokens per row, so the row tiles take it: a tile's tokens run
    from its first row's start to its last row's end, whatever row is long, and its programs share them in steps.
    Row counts of a few dozen, one below, at and one above one and two row tiles, or (one time in three) hundreds,
    where the long row can pass ROW_TILE_SPLIT * ROW_TILE_TOKENS tokens and every program of its tile takes
    several steps; one time in two tokens before the first row; PAD tails."""
    rows = (int(rng.integers(300, 1100)) if rng.random() < 1 / 3
            else pick(rng, (int(rng.integers(2, 200)), *tile_boundary_sizes(ROW_TILE))))
    lens = [int(n) for n in rng.integers(0, 3, rows)]
    long_row = int(rng.integers(1, rows))
    lens[long_row] = 0
    room = ROW_PATH_TOKENS_PER_ROW * rows - sum(lens)
    lens[long_row] = int(rng.integers(3, min(room, 3 * ROW_TILE_SPLIT * ROW_TILE_TOKENS) + 1))
    lead = int(rng.integers(0, room - lens[long_row] + 1)) if rng.integers(2) else 0
    return _slot_mapping_case(rng, query_lens=lens, width=200, block_size=16, null_frac=0.05, lead=lead,
                              out_extra=int(rng.integers(0, 40)),
                              note=f"{rows} rows, row {long_row} of {lens[long_row]}, {lead} tokens first")


def slots_spec_rows(rng, device, launch):
    """Dozens to hundreds of speculative-decode rows of 5 to 12 tokens among runs of empty rows, more than
    ROW_PATH_TOKENS_PER_ROW tokens per row in all (the last row takes what is missing), so the token tiles
    take them: each 256-token tile spans dozens of rows, which its per-lane binary search finds, at row counts
    one below or above a power of two (every step of the search needed)."""
    num_rows = 2 ** int(rng.integers(6, 10)) + pick(rng, (-1, 1))
    lens = []
    while len(lens) < num_rows:
        lens += [0] * int(rng.integers(1, 4)) if rng.random() < 0.2 else [int(rng.integers(5, 13))]
    lens = lens[:num_rows]
    lens[-1] += max(0, ROW_PATH_TOKENS_PER_ROW * num_rows + 1 - sum(lens))
    return _slot_mapping_case(rng, query_lens=lens, width=int(rng.integers(1, 9)), block_size=pick(rng, BLOCK_SIZES),
                              null_frac=0.0, out_extra=int(rng.integers(0, 3)),
                              note=f"{num_rows} rows, {sum(lens)} tokens")


def slots_row_tile_steps(rng, device, launch):
    """In every case, one row longer than one step of its tile's programs (ROW_TILE_SPLIT * ROW_TILE_TOKENS
    tokens), up to three steps, among rows of 0 or 1 token, the batch within ROW_PATH_TOKENS_PER_ROW tokens per
    row: every program of that tile walks more than one step, and each token of the tile, past the programs'
    first steps too, must be mapped exactly once. decode_long_row reaches this one case in five."""
    step = ROW_TILE_SPLIT * ROW_TILE_TOKENS
    long = int(rng.integers(step + 1, 3 * step + 1))
    rows = long // (ROW_PATH_TOKENS_PER_ROW - 1) + int(rng.integers(1, 200))
    lens = [int(n) for n in rng.integers(0, 2, rows)]
    long_row = int(rng.integers(0, rows))
    lens[long_row] = long
    return _slot_mapping_case(rng, query_lens=lens, width=200, block_size=16, null_frac=0.05,
                              out_extra=int(rng.integers(0, 40)), note=f"{rows} rows, row {long_row} of {long}")


def slots_row_tiles_past_width(rng, device, launch):
    """Decode rows of 1 to ROW_PATH_TOKENS_PER_ROW tokens (the row tiles take them) whose positions run past the
    row's width and below 0, in a block table whose rows are padded views (``laid_out`` in the registry): PAD,
    never the padding's entries, which a bound by the row stride instead of the width would read."""
    rows = int(rng.integers(1, 2 * ROW_TILE))
    return _slot_mapping_case(rng, query_lens=[int(n) for n in rng.integers(1, ROW_PATH_TOKENS_PER_ROW + 1, rows)],
                              width=int(rng.integers(1, 16)), block_size=pick(rng, BLOCK_SIZES), past_width=True,
                              note=f"{rows} decode rows, positions past the row")


SLOT_MAPPING_FAMILIES = {"basic": slots_basic, "partial_block": slots_partial_block, "padded": slots_padded,
                         "past_width": slots_past_width, "long_query": slots_long_query,
                         "zero_width": slots_zero_width, "layouts": laid_out(slots_padded, "block_table"),
                         "tiles": slots_tiles, "extremes": slots_extremes, "prefill_rows": slots_prefill_rows,
                         "one_token": slots_one_token, "big_offsets": slots_big_offsets,
                         "big_offsets_row_tiles": slots_big_offsets_row_tiles,
                         "many_rows": slots_many_rows, "empty_table": slots_empty_table,
                         "empty_rows": slots_empty_rows, "lead_long_row": slots_lead_long_row,
                         "path_boundary": slots_path_boundary, "decode_long_row": slots_decode_long_row,
                         "spec_rows": slots_spec_rows, "row_tile_steps": slots_row_tile_steps,
                         "row_tiles_past_width": laid_out(slots_row_tiles_past_width, "block_table")}

# ---------------------------------------------------------------- has_unaligned_cached_prefix


def _prefix_case(rng, *, block_sizes, unaligned_live, unaligned_idle=True, padded=False, slot_zero=None, note=""):
    """``slot_zero``: whether slot 0 (live) holds the unaligned count; None: one time in two."""
    batch_rows = int(rng.integers(1, 8))
    idx_mapping, num_slots = slots_for(rng, batch_rows, int(rng.integers(1, 5)))
    step = int(np.lcm.reduce(block_sizes))
    cached = rng.integers(0, 20, num_slots) * step
    live = idx_mapping.numpy()
    idle = np.setdiff1d(np.arange(num_slots), live)
    if unaligned_idle and idle.size:
        cached[idle] += 1  # slots outside the batch must not matter
    if unaligned_live:
        row = int(rng.integers(batch_rows))
        if rng.integers(2) if slot_zero is None else slot_zero:  # slot 0: the smallest live slot
            if 0 in live:
                row = int(np.flatnonzero(live == 0)[0])
            idx_mapping[row] = 0
        victim = int(idx_mapping[row])
        cached[victim] += int(rng.integers(1, max(block_sizes)))
        if all(cached[victim] % bs == 0 for bs in block_sizes):
            cached[victim] += 1
    if padded:
        idx_mapping = torch.cat([idx_mapping, torch.full((int(rng.integers(1, 4)),), -1, dtype=torch.int32)])
        cached[-1] += 1  # what a negative index would wrongly wrap to
    return Case(inputs={"num_cached_tokens": int32(cached), "idx_mapping": idx_mapping,
                        "block_sizes": tuple(block_sizes)}, note=note)


def prefix_aligned(rng, device, launch):
    return _prefix_case(rng, block_sizes=[pick(rng, BLOCK_SIZES)], unaligned_live=False, note="aligned")


def prefix_unaligned(rng, device, launch):
    return _prefix_case(rng, block_sizes=[pick(rng, BLOCK_SIZES[1:])], unaligned_live=True, note="one unaligned")


def prefix_slot_zero(rng, device, launch):
    """The unaligned count sits on slot 0, the one a test of slots > 0 (instead of >= 0, padded rows) drops."""
    return _prefix_case(rng, block_sizes=[pick(rng, BLOCK_SIZES[1:])], unaligned_live=True, slot_zero=True,
                        note="slot 0 unaligned")


def prefix_multi_group(rng, device, launch):
    """Several draft KV groups: aligned to one block size is not enough, also when neither size divides
    the other (16 and 24, 3 and 16)."""
    sizes = pick(rng, ([16, 32], [16, 48], [16, 64], [16, 24], [3, 16], [24, 64]))
    return _prefix_case(rng, block_sizes=sizes, unaligned_live=bool(rng.integers(2)), note=f"block sizes {sizes}")


def prefix_aligned_to_one(rng, device, launch):
    """Several draft KV groups, every live count a whole number of blocks of all of them but one, which is a
    whole number of blocks of one group and not of another (32k + 16 under 16 and 32; a multiple of 24 and not
    of 64): the answer is True, seen only by a test that asks every block size."""
    sizes = pick(rng, ([16, 32], [16, 48], [16, 64], [16, 24], [3, 16], [24, 64]))
    case = _prefix_case(rng, block_sizes=sizes, unaligned_live=False)
    aligned_to, not_to = pick(rng, [pair for pair in (sizes, sizes[::-1]) if pair[0] % pair[1]])
    count = aligned_to * int(rng.integers(1, 20))
    while count % not_to == 0:
        count += aligned_to
    idx_mapping = case.inputs["idx_mapping"]
    victim = int(idx_mapping[int(rng.integers(idx_mapping.numel()))])
    case.inputs["num_cached_tokens"][victim] = count
    case.note = f"block sizes {sizes}, slot {victim} holds {count}: aligned to {aligned_to}, not to {not_to}"
    return case


def prefix_padded(rng, device, launch):
    """Padded rows (slot -1) are ignored, whatever the last slot holds."""
    return _prefix_case(rng, block_sizes=[16], unaligned_live=False, padded=True, note="slot -1 rows")


def prefix_no_live_rows(rng, device, launch):
    """No batch row holds a slot (every row padded, or no row) while every slot's count is unaligned: nothing
    live is unaligned, so the answer is False, and the slot bound has no live slot to test."""
    num_slots = int(rng.integers(1, 5))
    cached = rng.integers(0, 20, num_slots) * 16 + rng.integers(1, 16, num_slots)
    idx_mapping = torch.full((int(rng.integers(0, 4)),), -1, dtype=torch.int32)
    return Case(inputs={"num_cached_tokens": int32(cached), "idx_mapping": idx_mapping, "block_sizes": (16,)},
                note=f"{idx_mapping.numel()} padded rows, no live row")


PREFIX_FAMILIES = {"aligned": prefix_aligned, "unaligned": prefix_unaligned, "slot_zero": prefix_slot_zero,
                   "multi_group": prefix_multi_group, "aligned_to_one": prefix_aligned_to_one, "padded": prefix_padded,
                   "no_live_rows": prefix_no_live_rows}
