"""Registry entries of block_table.gather, block_table.slot_mapping, block_table.shift, block_table.unaligned_prefix."""

from dataclasses import replace

import torch

import kernels.block_table
import reference.block_table
from stress.checks.common import EVERYWHERE, unreachable_by_engine
from stress.checks.profiles import (
    BATCH_TOKENS_ONLY,
    NO_PADDED_ROWS,
    NO_REFUSALS,
    NULL_BLOCK_SLOTS,
    POSITIONS_IN_ROW,
    SHARED_ROW_STRIDE,
)
from stress.core.types import RETURN, Check, Mutant, Patch, Reach
from stress.families import block_table as bt_families
from stress.families.ignored import (
    HOSTILE_COUNT,
    HOSTILE_NEGATIVE,
    Region,
    past,
    poisoned,
    unmapped_slots,
    whole_rows,
)
from stress.families.refusals import (
    NOT_POSITIVE,
    Corruption,
    as_list,
    batch_rows,
    moved,
    one_dim_more,
    past_bound,
    qsl_rows,
    refusal_family,
    replaced,
    resized,
    retyped,
    rows_short_of,
    short,
)

_BT = "kernels.block_table"
# gather's refusal bugs, from the whole step's side
_VALID_IN_THE_ENGINE = unreachable_by_engine(
    "the engine builds every launcher argument itself and always validly: no bad input reaches "
                     "gather's guards, whose refusal the block_table.gather refused family proves")


# ---------------------------------------------------------------- refusals

def _slot_past_rows_of_wide_table(rng, inputs):
    """A live row's slot one past persistent's rows, in a table (and out) widened past its slot count with null
    blocks: the bound is persistent's rows, never its width."""
    idx, persistent, out = inputs["idx_mapping"].clone(), inputs["persistent"], inputs["out"]
    live = (idx >= 0).nonzero().flatten()
    if live.numel() == 0:
        return False
    extra = max(0, persistent.shape[0] + 1 - persistent.shape[1])
    inputs["persistent"] = torch.cat([persistent, persistent.new_zeros((persistent.shape[0], extra))], 1)
    inputs["out"] = torch.cat([out, out.new_zeros((out.shape[0], extra))], 1)
    idx[int(live[int(rng.integers(live.numel()))])] = persistent.shape[0]
    inputs["idx_mapping"] = idx
    return True


def _slot_past_rows_below_the_batch(rng, inputs):
    """A live row's slot past persistent's rows yet below the batch's row count (idx_mapping and out lengthened
    with padded rows until the batch has more rows than persistent has slots): the bound is persistent's rows,
    never the batch's."""
    idx, persistent, out = inputs["idx_mapping"], inputs["persistent"], inputs["out"]
    live = (idx >= 0).nonzero().flatten()
    if live.numel() == 0:
        return False
    slots = persistent.shape[0]
    extra = max(0, slots + 2 - idx.numel())
    idx = torch.cat([idx, idx.new_full((extra,), -1)])
    inputs["out"] = torch.cat([out, out.new_zeros((extra, out.shape[1]))])
    idx[int(live[int(rng.integers(live.numel()))])] = int(rng.integers(slots, idx.numel()))
    inputs["idx_mapping"] = idx
    return True


GATHER_REFUSALS = refusal_family(bt_families.gather_basic, (
    *resized("out", 1, (-1, 1), "out one column narrower or wider than persistent"),
    *short("out", batch_rows, "the batch"),
    *resized("persistent", 0, (lambda i: 0,), "persistent without slot rows"),
    past_bound("idx_mapping", lambda i: i["persistent"].shape[0], "a slot past persistent's rows"),
    retyped("idx_mapping", torch.int64), one_dim_more("out"), as_list("persistent"),
    # out's own dtype and type: the later guards compare only its shape, so only out's validation refuses these
    retyped("out", torch.int64), as_list("out"),
    *moved("persistent", "idx_mapping", "out"),
    # appended: the cases above keep their draws
    Corruption("idx_mapping", "a slot past persistent's rows, in a table wider than its slot count",
               _slot_past_rows_of_wide_table, on_gpu=False),
    Corruption("idx_mapping", "a slot past persistent's rows, below the batch's row count",
               _slot_past_rows_below_the_batch, on_gpu=False),
), "gather_block_tables")


def last_offset(inputs: dict) -> torch.Tensor:
    """Marks query_start_loc's last entry: raised past the tokens, the offsets still do not decrease."""
    qsl = inputs["query_start_loc"]
    return torch.arange(qsl.numel()) == qsl.numel() - 1


SLOT_MAPPING_REFUSALS = refusal_family(bt_families.slots_basic, (
    *resized("block_table", 0, (rows_short_of(qsl_rows),), "block_table one row short of the batch"),
    *resized("out", 0, (lambda i: i["positions"].numel() - 1,), "out one entry short of the positions"),
    past_bound("query_start_loc", lambda i: i["positions"].numel() + 1, "an offset past the tokens"),
    *replaced("block_size", NOT_POSITIVE, "block_size not a positive int"),
    retyped("positions", torch.int32),
    # dtypes only each tensor's own validation refuses: the later guards compare sizes and offsets
    retyped("block_table", torch.int64), retyped("query_start_loc", torch.int64), retyped("out", torch.int32),
    # an offset past the positions yet within a longer out: offsets are bounded by positions, never by out
    replace(past_bound("query_start_loc", lambda i: i["positions"].numel() + 1,
                       "the last offset past the tokens, within out's padding", live=last_offset),
            valid=bt_families.slots_padded),
    *moved("block_table", "query_start_loc", "positions", "out"),
), "compute_slot_mappings")


SHIFT_REFUSALS = refusal_family(bt_families.shift_slot_vs_row, (
    *short("block_table", batch_rows, "the batch"),
    *resized("seq_lens", 0, (rows_short_of(batch_rows),), "seq_lens one entry short of the batch"),
    past_bound("idx_mapping", lambda i: i["num_cached_tokens"].numel(), "a slot past num_cached_tokens"),
    *replaced("block_size", NOT_POSITIVE, "block_size not a positive int"),
    retyped("num_cached_tokens", torch.int64),
    *moved("block_table", "idx_mapping", "num_cached_tokens", "seq_lens"),
    # the dtypes and knobs only each argument's own validation refuses (the later guards compare sizes)
    retyped("block_table", torch.int64), retyped("idx_mapping", torch.int64), retyped("seq_lens", torch.int64),
    *replaced("chunk", (3, 0), "chunk not a power of two"),
    *replaced("num_warps", (3,), "num_warps not a power of two"),
), "shift_block_table_rows")


UNALIGNED_PREFIX_REFUSALS = refusal_family(bt_families.prefix_aligned, (
    *replaced("block_sizes", ((),), "no block sizes"),
    *replaced("block_sizes", ((16, 0), (-16,), (16.0,), (True,)), "a block size that is not a positive int"),
    past_bound("idx_mapping", lambda i: i["num_cached_tokens"].numel(), "a slot past num_cached_tokens", on_gpu=True),
), "has_unaligned_cached_prefix")


# ---------------------------------------------------------------- ignored regions


def gather_ignored(inputs: dict) -> list[Region]:
    """Persistent rows no batch row selects: only the selected rows are copied."""
    persistent = inputs["persistent"]
    return [Region("persistent", whole_rows(unmapped_slots(inputs["idx_mapping"], persistent.shape[0]), persistent))]


def _token_rows(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Each token's batch row (the last b with query_start_loc[b] <= t); -1 for tokens outside the batch."""
    tokens = torch.arange(num_tokens)
    rows = torch.bucketize(tokens, query_start_loc, right=True) - 1
    outside = (tokens < query_start_loc[0]) | (tokens >= query_start_loc[-1])
    return torch.where(outside, -1, rows)


def slot_mapping_ignored(inputs: dict) -> list[Region]:
    """Table entries no token's block index reaches (rows past the batch included), and the positions of tokens
    outside the batch (they become PAD whatever they hold)."""
    table, positions, block_size = inputs["block_table"], inputs["positions"], inputs["block_size"]
    rows = _token_rows(inputs["query_start_loc"].long(), positions.numel())
    columns = torch.div(positions, block_size, rounding_mode="floor")
    on_table = (rows >= 0) & (columns >= 0) & (columns < table.shape[1])
    reached = torch.zeros(table.shape, dtype=torch.bool)
    reached[rows[on_table], columns[on_table]] = True
    return [Region("block_table", ~reached), Region("positions", rows < 0)]


def _shift_extents(inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch row, the shift and the entries copied (0 for a padded row or a shift of 0)."""
    table, idx_mapping, block_size = inputs["block_table"], inputs["idx_mapping"].long(), inputs["block_size"]
    live = idx_mapping >= 0
    cached = inputs["num_cached_tokens"].long()[idx_mapping.clamp(min=0)]
    shift = torch.where(live, cached // block_size, 0)
    needed = -(-inputs["seq_lens"][:idx_mapping.numel()].long() // block_size)
    copied = torch.where(shift > 0, torch.minimum(table.shape[1] - shift, needed).clamp(min=0), 0)
    return shift, copied


def shift_ignored(inputs: dict) -> list[Region]:
    """Table entries a row neither reads nor writes (all of a padded row, of a row that does not shift, of rows
    past the batch), the counts of slots no batch row names and seq_lens past the batch; counts and seq_lens
    stay >= 0, as the contract asks of every entry."""
    table, idx_mapping = inputs["block_table"], inputs["idx_mapping"]
    shift, copied = _shift_extents(inputs)
    batch_rows = idx_mapping.numel()
    column = torch.arange(table.shape[1])
    touched = torch.ones(table.shape, dtype=torch.bool)
    touched[batch_rows:] = False
    touched[:batch_rows] = ((column < copied[:, None])
                            | ((column >= shift[:, None]) & (column < (shift + copied)[:, None])))
    return [Region("block_table", ~touched),
            Region("num_cached_tokens", unmapped_slots(idx_mapping, inputs["num_cached_tokens"].numel()),
                   HOSTILE_COUNT),
            Region("seq_lens", past(batch_rows, inputs["seq_lens"].numel()), HOSTILE_COUNT)]


def unaligned_prefix_ignored(inputs: dict) -> list[Region]:
    """Padded rows may hold any negative slot, and the counts of slots no live row names any value."""
    idx_mapping, cached = inputs["idx_mapping"], inputs["num_cached_tokens"]
    return [Region("idx_mapping", idx_mapping < 0, HOSTILE_NEGATIVE),
            Region("num_cached_tokens", unmapped_slots(idx_mapping, cached.numel()))]


CHECKS = (
    Check(
        name="block_table.gather",
        contract="out[b] = persistent[idx_mapping[b]] for each batch row b; slot -1 gives null blocks; rows past "
                 "the batch untouched",
        choices={"no-padded-rows": NO_PADDED_ROWS, "shared-row-stride": SHARED_ROW_STRIDE,
                 "no-refusals": NO_REFUSALS},
        kernel=kernels.block_table.gather_block_tables,
        reference=reference.block_table.gather_block_tables,
        families={**bt_families.GATHER_FAMILIES, "refused": GATHER_REFUSALS,
                  "ignored_poisoned": poisoned(bt_families.gather_negative_slot, gather_ignored)},
        outputs=("out",),
        provenance={"out": "persistent"},
        # the runner places a view that torch calls contiguous as a contiguous copy, so no family can hand a
        # launcher a one-wide table of innermost stride past 1: the argument check that must accept it is pinned here
        unit_tests=("tests/test_validate.py::test_a_launcher_reads_a_one_wide_table_of_any_innermost_stride",),
        mutants=(
            Mutant("gather-by-batch-row", "reads the persistent row of batch row b instead of its slot",
                   (Patch(f"{_BT}:_gather_rows_kernel", "slot = tl.load(idx_mapping_ptr + batch_row).to(tl.int64)",
                          "slot = batch_row.to(tl.int64) + tl.load(idx_mapping_ptr + batch_row).to(tl.int64) * 0"),),
                   oracles=EVERYWHERE),
            Mutant("row-overread", "the column term is dropped from the load mask: lanes past the width read the "
                   "next row, and past the last row, memory outside the table",
                   (Patch(f"{_BT}:_gather_rows_kernel", "persistent_stride + cols, mask=live, other=0)",
                          "persistent_stride + cols)"),),
                   oracles={"cpu": "oob", "cuda": "memcheck"},
                   path=Reach(unreachable={"cuda": "the over-read values are never stored, so every output "
                                                   "matches: only a tracer sees it (the CPU tracer kills it through "
                                                   "the engine)"})),
            # positive controls of the refusal verdict (stress.core.refusal): the refused family must kill each
            Mutant("width-guard-removed", "out's width is not compared with persistent's: a narrower out is "
                   "accepted and its rows are overrun",
                   (Patch(f"{_BT}:gather_block_tables", "if out.shape[1] != persistent.shape[1]:", "if False:"),),
                   oracles={"cpu": "accepted", "cuda": "accepted"}, families=("refused",),
                   path=_VALID_IN_THE_ENGINE),
            Mutant("slot-bound-by-batch-rows", "a slot is bounded by persistent's rows or the batch's, whichever is "
                   "more: in a batch of more rows than persistent has slots, a slot past persistent is read",
                   (Patch(f"{_BT}:gather_block_tables",
                          'validate.indices("idx_mapping", idx_mapping, -1, persistent.shape[0], what="slot")',
                          'validate.indices("idx_mapping", idx_mapping, -1, max(persistent.shape[0], out.shape[0]), '
                          'what="slot")'),),
                   oracles={"cpu": "accepted"}, families=("refused",), path=_VALID_IN_THE_ENGINE,
                   why_not="a GPU launcher reads no index back unless SPECSAN_CHECK_INDICES=1, so the refused family "
                           "holds no slot past persistent there"),
            Mutant("refusal-names-wrong-argument", "too few out rows is refused, but the error names idx_mapping",
                   (Patch(f"{_BT}:gather_block_tables", 'raise ValueError(f"out: {out.shape[0]} rows, but idx_mapping',
                          'raise ValueError(f"idx_mapping: {out.shape[0]} rows of out, but'),),
                   oracles={"cpu": "refusal", "cuda": "refusal"}, families=("refused",),
                   path=_VALID_IN_THE_ENGINE),
            Mutant("written-before-refusal", "out is cleared before persistent is found empty: the refused call "
                   "has already written",
                   (Patch(f"{_BT}:gather_block_tables", "    if persistent.shape[0] == 0:\n",
                          "    if persistent.shape[0] == 0:\n        out.zero_()\n"),),
                   oracles=EVERYWHERE, families=("refused",),
                   path=_VALID_IN_THE_ENGINE),
        ),
    ),
    Check(
        name="block_table.slot_mapping",
        contract="out[t] = block_table[b, pos // bs] * bs + pos % bs for token t of batch row b; PAD for null "
                 "blocks, positions off the row and tokens past the batch",
        choices={"positions-in-row": POSITIONS_IN_ROW, "batch-tokens-only": BATCH_TOKENS_ONLY,
                 "null-block-slots": NULL_BLOCK_SLOTS, "no-refusals": NO_REFUSALS},
        kernel=kernels.block_table.compute_slot_mappings,
        reference=reference.block_table.compute_slot_mappings,
        families={**bt_families.SLOT_MAPPING_FAMILIES, "refused": SLOT_MAPPING_REFUSALS,
                  "ignored_poisoned": poisoned(bt_families.slots_padded, slot_mapping_ignored)},
        outputs=("out",),
        mutants=(
            Mutant("pad-tail-unwritten", "tokens past the batch keep stale slots instead of PAD",
                   (Patch(f"{_BT}:_slot_mapping_kernel", "mask=tokens < num_out)  # tokens past the batch: PAD",
                          "mask=live)"),),
                   oracles=EVERYWHERE, families=("padded",)),
            Mutant("null-block-writable", "the null block 0 gets a real slot instead of PAD",
                   (Patch(f"{_BT}:_slot_mapping_kernel", "in_row & (block_id != 0)", "in_row"),),
                   oracles=EVERYWHERE,
                   path=unreachable_by_engine(
                       'the engine allocates a block for every position it maps (target tokens, draft context and '
                       'query rows), so no slot mapping meets the null block')),
            Mutant("row-tile-ends-at-first-row", "a row tile's tokens end at its first row's end, not its last "
                   "row's: the tokens of its later rows keep stale slots",
                   (Patch(f"{_BT}:_slot_mapping_rows_kernel", "tl.minimum(first_row + ROWS, num_batch_rows)",
                          "first_row + 1"),),
                   oracles=EVERYWHERE, families=("path_boundary", "decode_long_row")),
            Mutant("row-tile-one-step", "each program of a row tile maps one step of its tokens: a tile holding "
                   "more than SPLIT * TOKENS tokens (a long row among short ones) leaves the rest stale",
                   (Patch(f"{_BT}:_slot_mapping_rows_kernel", "range(walk_start, tile_end, SPLIT * TOKENS)",
                          "range(walk_start, tl.minimum(tile_end, walk_start + 1), SPLIT * TOKENS)"),),
                   oracles=EVERYWHERE, families=("decode_long_row",),
                   path=unreachable_by_engine("the engine's batches hold a dozen rows at most, so a step it maps "
                                              "with row tiles (4 tokens a row at most) never fills one step of "
                                              "a tile's programs")),
            Mutant("row-tile-rows-past-batch-start-at-0", "the starts of a last row tile's rows past the batch load "
                   "as 0 instead of past every token: each token counts them, and lands that many rows too far",
                   (Patch(f"{_BT}:_slot_mapping_rows_kernel", "other=2**31 - 1)", "other=0)"),),
                   oracles=EVERYWHERE, families=("path_boundary", "decode_long_row")),
            Mutant("row-path-lead-unwritten", "the row tiles' PAD programs cover the tail past the batch only: tokens "
                   "before query_start_loc[0] keep stale slots",
                   (Patch(f"{_BT}:_slot_mapping_rows_kernel", "outside = (tokens < tl.load(query_start_loc_ptr)) | ",
                          "outside = (tokens < 0) | "),),
                   oracles=EVERYWHERE, families=("path_boundary",),
                   path=unreachable_by_engine("the engine's query_start_loc starts at 0: no token lies before the "
                                              "first row")),
            Mutant("pad-programs-from-positions", "the row tiles' PAD programs are counted from the positions, not "
                   "from out: a PAD tail past the positions' last PAD tile keeps stale slots",
                   (Patch(f"{_BT}:compute_slot_mappings", "triton.cdiv(out.numel(), PAD_TILE)",
                          "triton.cdiv(positions.numel(), PAD_TILE)"),),
                   oracles=EVERYWHERE, families=("path_boundary",),
                   path=Reach(unreachable={"cpu": "the CPU engine's slot mappings (token budgets of 64 at most) fit "
                                                  "in the one PAD program that a step with tokens launches"})),
        ),
    ),
    Check(
        name="block_table.shift",
        contract="batch row b shifted left in place by num_cached_tokens[idx_mapping[b]] // bs entries, only the "
                 "blocks seq_lens[b] needs; race-free (fixes 4, 5)",
        choices={"no-padded-rows": NO_PADDED_ROWS, "no-refusals": NO_REFUSALS},
        kernel=kernels.block_table.shift_block_table_rows,
        reference=reference.block_table.shift_block_table_rows,
        families={**bt_families.SHIFT_FAMILIES, "refused": SHIFT_REFUSALS,
                  "ignored_poisoned": poisoned(bt_families.shift_padded, shift_ignored)},
        outputs=("block_table",),
        sweep=bt_families.shift_sweep,
        provenance={"block_table": "block_table"},
        hunt_seconds={"cpu": 0.5, "cuda": 4.0},  # in-place and chunked: races between warps (fix 5)
        mutants=(
            Mutant("no-barrier", "fix 5 (docs/fixes.md#fix-5): the barrier between a chunk's loads and its stores "
                                 "is removed",
                   (Patch(f"{_BT}:_shift_rows_kernel", "tl.debug_barrier()", "pass"),),
                   oracles={"cpu": "race", "cuda": "divergence"}, families=("overlap", "long_row"),
                   path=Reach(families=("shared_prefix",), unreachable={
                       "cuda": "the engine's draft rows (tens of blocks, one default chunk) give the barrier-less copy "
                               "too little overlap across warps to race visibly; the shift check's chunk x num_warps "
                               "sweep kills it there, the CPU tracer through the engine"})),
            Mutant("count-by-batch-row", "fix 4 (docs/fixes.md#fix-4): num_cached_tokens indexed by batch row "
                                         "instead of slot",
                   (Patch(f"{_BT}:_shift_rows_kernel", "tl.load(num_cached_tokens_ptr + slot, mask=slot >= 0",
                          "tl.load(num_cached_tokens_ptr + batch_row, mask=slot >= 0"),),
                   oracles=EVERYWHERE,
                   path=Reach(families=("shared_prefix",))),
            Mutant("ignores-seq-lens", "fix 4 (docs/fixes.md#fix-4): copies to the end of the row instead of the "
                                       "needed blocks",
                   (Patch(f"{_BT}:_shift_rows_kernel", "n = tl.minimum(width - shift, needed)",
                          "n = width - shift + needed * 0"),),
                   oracles=EVERYWHERE,
                   path=Reach(families=("shared_prefix",))),
            Mutant("seq-len-blocks-int32", "the blocks a seq_len needs are counted in int32: cdiv's + block_size - 1 "
                   "wraps a seq_len near 2^31 negative and the row is not shifted",
                   (Patch(f"{_BT}:_shift_rows_kernel", "tl.load(seq_lens_ptr + batch_row).to(tl.int64), block_size)",
                          "tl.load(seq_lens_ptr + batch_row), block_size)"),),
                   oracles=EVERYWHERE, families=("extremes",),
                   path=unreachable_by_engine(
                       "the engine's seq_lens stay far below 2^31 tokens, where the int32 block count wraps")),
        ),
    ),
    Check(
        name="block_table.unaligned_prefix",
        contract="True iff some live slot's cached count is not a multiple of a block size: the batch must not "
                 "draft (fix 4)",
        choices={"no-refusals": NO_REFUSALS},
        kernel=kernels.block_table.has_unaligned_cached_prefix,
        reference=reference.block_table.has_unaligned_cached_prefix,
        families={**bt_families.PREFIX_FAMILIES, "refused": UNALIGNED_PREFIX_REFUSALS,
                  "ignored_poisoned": poisoned(bt_families.prefix_padded, unaligned_prefix_ignored)},
        outputs=(RETURN,),
        mutants=(
            Mutant("unaligned-not-refused", "fix 4 (docs/fixes.md#fix-4): a partial restored block is not refused",
                   (Patch(f"{_BT}:has_unaligned_cached_prefix", "return any(", "return False and any("),),
                   oracles=EVERYWHERE,
                   path=Reach(families=("unaligned_prefix",))),
            Mutant("padded-slot-wraps", "padded rows (slot -1) index the last slot's count",
                   (Patch(f"{_BT}:has_unaligned_cached_prefix", "slots = slots[slots >= 0]", "pass"),),
                   oracles=EVERYWHERE, families=("padded",),
                   path=unreachable_by_engine(
                       "the engine's idx_mapping holds live batch rows only; no slot -1 reaches the "
                                        "fail-closed test")),
            Mutant("padding-only-minus-one", "only slot -1 is taken for padding (slots != -1) where every negative "
                   "slot is: another negative slot indexes a count from the end, or past it",
                   (Patch(f"{_BT}:has_unaligned_cached_prefix", "slots = slots[slots >= 0]",
                          "slots = slots[slots != -1]"),),
                   oracles={"cpu": "crash", "cuda": "crash"}, families=("ignored_poisoned",),
                   path=unreachable_by_engine("the engine's idx_mapping holds live batch rows only; no negative slot "
                                        "reaches the fail-closed test")),
        ),
    ),
)
