"""Registry entries of draft_inputs.prepare: the draft's context, query and sampling rows."""

import torch

import kernels.draft_inputs
import reference.draft_inputs
from stress.checks.common import ENGINE_SAMPLED, EVERYWHERE, unreachable_by_engine
from stress.checks.profiles import NO_PADDED_ROWS, NO_REFUSALS
from stress.core.types import RETURN, Check, Mutant, Patch, Reach
from stress.families import draft_inputs as di_families
from stress.families.common import pick
from stress.families.ignored import Region, one_of, past, poisoned, unmapped_slots
from stress.families.refusals import (
    NOT_POSITIVE,
    Corruption,
    batch_rows,
    moved,
    past_bound,
    refusal_family,
    replaced,
    resized,
    retyped,
    short,
)

_DI = "kernels.draft_inputs:_prepare_draft_inputs_kernel"


# ---------------------------------------------------------------- refusals

def _target_rows(inputs: dict) -> int:
    return int(inputs["target_query_start_loc"][batch_rows(inputs)])


def _query_rows(inputs: dict) -> int:
    """Query rows per request: K (anchor-first) or 1 + K."""
    k = inputs["num_draft_tokens"]
    return k if inputs.get("anchor_first") else 1 + k


def _anchor_first_without_drafts(rng, inputs):
    inputs.update(anchor_first=True, num_draft_tokens=0)
    inputs["draft_tokens"] = inputs["draft_tokens"][:, :0].clone()


def _decreasing_offsets(rng, inputs) -> bool:
    """Two neighbouring target offsets of the batch swapped where they differ: a row of negative length."""
    starts = inputs["target_query_start_loc"]
    rows = [b for b in range(batch_rows(inputs)) if starts[b] < starts[b + 1]]
    if not rows:
        return False
    b = int(pick(rng, rows))
    starts[b], starts[b + 1] = int(starts[b + 1]), int(starts[b])
    return True


PREPARE_REFUSALS = refusal_family(di_families.decode, (
    *replaced("num_draft_tokens", (-1, 2.0, True), "num_draft_tokens not an int >= 0"),
    Corruption("num_draft_tokens", "anchor-first with no draft rows", _anchor_first_without_drafts),
    *replaced("mask_token_id", (1.0, True, None), "mask_token_id not an int"),
    *replaced("block_size", NOT_POSITIVE, "block_size not a positive int"),
    *resized("next_prefill_tokens", 0, (-1, 1), "next_prefill_tokens for one slot fewer or more than last_sampled"),
    *resized("num_cached_tokens", 0, (-1, 1), "num_cached_tokens for one slot fewer or more than last_sampled"),
    past_bound("idx_mapping", lambda i: i["last_sampled"].numel(), "a live batch row's slot past last_sampled",
               on_gpu=True),
    # -1 is a padded row's slot elsewhere (the fail-closed test skips it): a live row must not have it
    past_bound("idx_mapping", lambda i: -1, "a live batch row's slot -1", on_gpu=True),
    *short("target_query_start_loc", lambda i: batch_rows(i) + 1, "the batch's offsets"),
    Corruption("target_query_start_loc", "target offsets that decrease", _decreasing_offsets),
    *short("target_positions", _target_rows, "the target rows"),
    *short("num_sampled", batch_rows, "the batch"),
    *short("num_rejected", batch_rows, "the batch"),
    *short("block_table", batch_rows, "the batch"),
    *short("draft_tokens", batch_rows, "the batch"),
    *short("context_positions", _target_rows, "the target rows"),
    *short("input_ids", lambda i: batch_rows(i) * _query_rows(i), "the query rows"),
    *short("sample_indices", lambda i: batch_rows(i) * i["num_draft_tokens"], "the sampled rows"),
    *short("seq_lens", batch_rows, "the batch"),
    *short("query_start_loc", lambda i: batch_rows(i) + 1, "the batch's offsets"),
    *resized("context_slot_mapping", 0, (-1, 1), "context_slot_mapping one entry off context_positions"),
    *resized("query_slot_mapping", 0, (-1, 1), "query_slot_mapping one entry off input_ids"),
    *resized("sample_idx_mapping", 0, (-1, 1), "sample_idx_mapping one entry off sample_indices"),
    *resized("draft_tokens", 1, (-1, 1), "draft_tokens one column off num_draft_tokens"),
    *moved("idx_mapping", "target_query_start_loc", "target_positions", "num_sampled", "num_rejected", "last_sampled",
           "next_prefill_tokens", "num_cached_tokens", "block_table", "context_positions", "context_slot_mapping",
           "input_ids", "positions", "query_slot_mapping", "sample_indices", "sample_pos", "sample_idx_mapping",
           "query_start_loc", "seq_lens", "draft_tokens"),
    # what only each argument's own validation refuses: the later guards compare sizes and offsets
    *(retyped(name, torch.int32, torch.int64) for name in ("idx_mapping", "target_positions", "block_table",
                                                             "context_slot_mapping", "draft_tokens")),
    *replaced("max_model_len", NOT_POSITIVE, "max_model_len not a positive int"),
    *replaced("block", (3,), "block not a power of two"),
    *replaced("num_warps", (3,), "num_warps not a power of two"),
    # the twins of each output not covered above (appended: the cases above keep their draws)
    *resized("positions", 0, (-1, 1), "positions one entry off input_ids"),
    *resized("sample_pos", 0, (-1, 1), "sample_pos one entry off sample_indices"),
), "prepare_draft_inputs")


# ---------------------------------------------------------------- ignored regions


def _request_positions(inputs: dict, batch_row: int) -> tuple[torch.Tensor, slice]:
    """A live row's kept target rows (a slice of target_positions, the rejected suffix left out) and the positions
    its context and query rows map through the block table (query positions unclamped)."""
    starts, positions = inputs["target_query_start_loc"], inputs["target_positions"]
    kept = slice(int(starts[batch_row]), int(starts[batch_row + 1]) - int(inputs["num_rejected"][batch_row]))
    query_rows = _query_rows(inputs)
    last = int(positions[kept.stop - 1])
    return torch.cat([positions[kept], torch.arange(last + 1, last + 1 + query_rows)]), kept


def prepare_ignored(inputs: dict) -> list[Region]:
    """Target offsets past B + 1 (any value), the positions of rejected and unused target rows, block-table entries
    no kept or query position reaches (rows past the batch included), counts past the batch, and slot state no
    live row reads: last_sampled where the row did not sample, next_prefill_tokens where it did, and every slot
    input of a slot no row names."""
    num_batch_rows = batch_rows(inputs)
    table, block_size = inputs["block_table"], inputs["block_size"]
    reached = torch.zeros(table.shape, dtype=torch.bool)
    read_positions = torch.zeros(inputs["target_positions"].numel(), dtype=torch.bool)
    for batch_row in range(num_batch_rows):
        mapped, kept = _request_positions(inputs, batch_row)
        read_positions[kept] = True
        columns = torch.div(mapped, block_size, rounding_mode="floor")
        reached[batch_row, columns[(columns >= 0) & (columns < table.shape[1])]] = True
    slots = inputs["idx_mapping"].long()
    num_slots = inputs["last_sampled"].numel()
    sampled = torch.zeros(num_slots, dtype=torch.bool)
    sampled[slots[inputs["num_sampled"][:num_batch_rows] > 0]] = True
    idle = unmapped_slots(inputs["idx_mapping"], num_slots)
    return [Region("target_query_start_loc", past(num_batch_rows + 1, inputs["target_query_start_loc"].numel())),
            Region("target_positions", ~read_positions),
            Region("block_table", ~reached),
            Region("num_sampled", past(num_batch_rows, inputs["num_sampled"].numel())),
            Region("num_rejected", past(num_batch_rows, inputs["num_rejected"].numel())),
            Region("last_sampled", idle | ~sampled),
            Region("next_prefill_tokens", idle | sampled),
            Region("num_cached_tokens", idle)]


CHECKS = (
    Check(
        name="draft_inputs.prepare",
        contract="the draft's context, query and sampling rows and seq_lens for the live batch, everything past it "
                 "inert; a batch with an unaligned cached prefix drafts -1s (fixes 3, 4)",
        choices={"no-padded-rows": NO_PADDED_ROWS, "no-refusals": NO_REFUSALS},
        kernel=kernels.draft_inputs.prepare_draft_inputs,
        reference=reference.draft_inputs.prepare_draft_inputs,
        families={**di_families.FAMILIES, "refused": PREPARE_REFUSALS,
                  "ignored_poisoned": poisoned(one_of(di_families.padded, di_families.rejected_suffix),
                                               prepare_ignored)},
        outputs=(RETURN, *reference.draft_inputs.OUTPUTS),
        sweep=di_families.sweep,
        mutants=(
            Mutant("stale-padded-queries", "fix 3, pre-fix (docs/fixes.md#fix-3): padded query rows get PAD slots "
                                           "but keep stale "
                   "input ids and positions",
                   (Patch(_DI, "tl.store(input_ids_ptr + rows, tl.full((BLOCK,), 0, tl.int32), mask=keep)  # cleared "
                          "query inputs\n            tl.store(positions_ptr + rows, tl.full((BLOCK,), 0, tl.int64), "
                          "mask=keep)  # (fix 3)", "pass"),),
                   oracles=EVERYWHERE, families=("padded", "zero_width")),
            Mutant("seq-lens-keep-cached", "fix 4, pre-fix (docs/fixes.md#fix-4): seq_lens are not shortened by the "
                                           "cached blocks",
                   (Patch(_DI, "(tl.load(num_cached_tokens_ptr + slot) // block_size) * block_size",
                          "tl.load(num_cached_tokens_ptr + slot) * 0"),),
                   oracles=EVERYWHERE, families=("prefix_cache", "decode"),
                   path=Reach(families=("shared_prefix",))),
            Mutant("unaligned-drafts", "fix 4 (docs/fixes.md#fix-4): a batch with a partial cached block is "
                                       "drafted, not refused",
                   (Patch("kernels.draft_inputs:prepare_draft_inputs",
                          "if tables.has_unaligned_cached_prefix(cached_counts, slots, (block_size,)):",
                          "if False:"),),
                   oracles=EVERYWHERE, families=("prefix_cache",),
                   path=Reach(families=("unaligned_prefix",))),
            Mutant("rejected-keeps-slot", "the rejected suffix keeps its real position and KV slot",
                   (Patch(_DI, "ctx_valid = lanes < n_valid", "ctx_valid = lanes < n_ctx"),),
                   oracles=EVERYWHERE, families=("rejected_suffix",),
                   path=Reach(families=ENGINE_SAMPLED)),
            Mutant("position-unclamped", "query positions are not clamped to max_model_len - 1",
                   (Patch(_DI, "tl.minimum(query_pos, max_model_len - 1)", "query_pos + max_model_len * 0"),),
                   oracles=EVERYWHERE, families=("max_model_len",),
                   path=Reach(families=("long_context",))),
            Mutant("context-pad-to-target", "the inert context tail ends where the target positions end, not where "
                   "the context buffers do: an engine's static buffers past a step of fewer tokens keep stale rows",
                   (Patch("kernels.draft_inputs:prepare_draft_inputs",
                          "context_positions, context_slot_mapping, context_positions.numel(),",
                          "context_positions, context_slot_mapping, target_positions.numel(),"),),
                   oracles=EVERYWHERE, families=("longer_context",),
                   path=Reach(families=("shared_prefix", "mixed_prefill_decode"))),
            Mutant("sample-slot-is-batch-row", "sampling rows record the batch row instead of the request slot",
                   (Patch(_DI, "(lanes * 0 + slot).to(tl.int32)", "(lanes * 0 + batch_row).to(tl.int32)"),),
                   oracles=EVERYWHERE),
            Mutant("decreasing-offsets-accepted", "target offsets are not checked for order (pre-fix): a row of "
                   "negative length is accepted",
                   (Patch("kernels.draft_inputs:prepare_draft_inputs",
                          '    validate.offsets("target_query_start_loc", target_starts[:num_batch_rows + 1], '
                          'num_target_rows)\n', ""),),
                   oracles={"cpu": "accepted", "cuda": "accepted"}, families=("refused",)),
            Mutant("offsets-tail-validated", "the launcher checks every target offset, also those past B + 1 (it "
                   "forgets the [:B + 1] slice): stale offsets a larger batch left there refuse a valid call",
                   (Patch("kernels.draft_inputs:prepare_draft_inputs",
                          'validate.offsets("target_query_start_loc", target_starts[:num_batch_rows + 1],',
                          'validate.offsets("target_query_start_loc", target_starts,'),),
                   oracles={"cpu": "crash", "cuda": "crash"}, families=("ignored_poisoned",),
                   path=unreachable_by_engine("the engine's target query_start_loc holds exactly B + 1 offsets")),
            Mutant("last-position-by-count", "the last kept target position is taken as the last target row's "
                   "position less the rejected count: right only while a request's target positions are "
                   "consecutive, which the contract does not promise for the rejected suffix",
                   (Patch(_DI, "last_pos = tl.load(target_positions_ptr + ctx_start + n_valid - 1)",
                          "last_pos = tl.load(target_positions_ptr + ctx_start + n_ctx - 1) - (n_ctx - n_valid)"),),
                   oracles=EVERYWHERE, families=("ignored_poisoned",),
                   path=unreachable_by_engine(
                       "the engine's target rows of a request hold consecutive positions, rejected ones included")),
        ),
    ),
)
