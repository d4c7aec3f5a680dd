"""Registry entries of sampling.gumbel: Gumbel-max sampling with per-request seeds."""


import torch

import kernels.sampling
import reference.sampling
from stress.checks.common import ENGINE_SAMPLED, EVERYWHERE, SUBNORMAL_TEMPERATURES_UNREACHABLE, unreachable_by_engine
from stress.checks.profiles import (
    CACHE_AFTER_TEMPERATURE,
    FINITE_LOGITS,
    GREEDY_AT_ZERO_ONLY,
    MASKED_LOGITS,
    NO_LOGITS_CACHE,
    NO_PADDED_ROWS,
    NO_REFUSALS,
    TEMPERATURE_FLOOR,
)
from stress.core.compare import exact_unless_near_tie
from stress.core.types import RETURN, Check, Mutant, Patch, Reach
from stress.families import sampling as sampling_families
from stress.families import sampling_splits
from stress.families.ignored import Region, one_of, poisoned, unmapped_slots
from stress.families.refusals import (
    Corruption,
    emptied,
    moved,
    past_bound,
    refusal_family,
    replaced,
    resized,
    retyped,
    strided,
)

_SAMPLING = "kernels.sampling:_gumbel_sample_kernel"
_SPLITS = "kernels.sampling:vocab_splits"
# the split-count bugs, from the whole step's side
_NO_ROW_SPLIT_IN_THE_ENGINE = unreachable_by_engine(
    "the engine's vocabularies (64 or 256 tokens) fit one tile and its batches hold far fewer than 512 rows: its "
    "rows are never split")


# ---------------------------------------------------------------- refusals

def _live_rows(inputs: dict) -> torch.Tensor:
    return inputs["idx_mapping"] >= 0


def _slot_0_column_past_cache(rng, inputs):
    """A live row moved to slot 0 (the edge of the live-row mask, ``idx_mapping >= 0``; the row that held it
    takes the row's old slot) with its cache column at the cache's depth."""
    idx, cols = inputs["idx_mapping"].clone(), inputs["cache_cols"].clone()
    live = (idx >= 0).nonzero().flatten()
    if live.numel() == 0:
        return False
    row = int(live[int(rng.integers(live.numel()))])
    idx[idx == 0] = idx[row]
    idx[row] = 0
    cols[row] = inputs["logits_cache"].shape[1]
    inputs.update(idx_mapping=idx, cache_cols=cols)


GUMBEL_REFUSALS = refusal_family(sampling_families.mixed, (
    *resized("idx_mapping", 0, (-1, 1), "idx_mapping one entry short of or past the logits rows"),
    *resized("positions", 0, (-1, 1), "positions one entry short of or past the logits rows"),
    *resized("seeds", 0, (-1, 1), "seeds for one slot fewer or more than temperature"),
    *replaced("cache_cols", (None,), "logits_cache without cache_cols", refused="logits_cache"),
    *resized("logits_cache", 0, (-1, 1), "logits_cache for one slot fewer or more than temperature"),
    *resized("logits_cache", 2, (-1, 1), "logits_cache one vocabulary entry short or past the logits"),
    *resized("cache_cols", 0, (-1, 1), "cache_cols one entry short of or past the logits rows"),
    past_bound("idx_mapping", lambda i: i["temperature"].numel(), "a slot past temperature"),
    past_bound("cache_cols", lambda i: i["logits_cache"].shape[1], "a live row's cache column past the cache",
               live=_live_rows),
    Corruption("cache_cols", "the cache column of slot 0's row past the cache", _slot_0_column_past_cache,
               on_gpu=False),
    emptied({"logits": 1, "logits_cache": 2}, "a vocabulary of 0", refused="logits"),
    *moved("logits", "idx_mapping", "temperature", "seeds", "positions", "logits_cache", "cache_cols"),
    *strided("logits", "temperature", "seeds", "logits_cache"),  # per-row tensors hold one entry on the CPU
    retyped("idx_mapping", torch.int64), retyped("positions", torch.int32), retyped("cache_cols", torch.int64),
    # the pairing guard's other half (appended: the cases above keep their draws)
    *replaced("logits_cache", (None,), "cache_cols without logits_cache"),
), "gumbel_sample")


# ---------------------------------------------------------------- ignored regions


def noiseless_rows(inputs: dict) -> torch.Tensor:
    """Rows that draw no noise: inert ones (slot -1) and greedy ones (their slot's temperature not > 0)."""
    slots = inputs["idx_mapping"].long()
    temperature = inputs["temperature"][slots.clamp(min=0)]
    return (slots < 0) | ~(temperature > 0)


def gumbel_ignored(inputs: dict) -> list[Region]:
    """Temperature and seed of every slot no row names, the seeds of greedy slots, the positions (noise keys) of
    rows that draw no noise, and the cache columns of inert rows."""
    slots = inputs["idx_mapping"]
    idle = unmapped_slots(slots, inputs["temperature"].numel())
    regions = [Region("temperature", idle), Region("seeds", idle | ~(inputs["temperature"] > 0)),
               Region("positions", noiseless_rows(inputs))]
    if inputs.get("cache_cols") is not None:
        regions.append(Region("cache_cols", slots < 0))
    return regions


CHECKS = (
    Check(
        name="sampling.gumbel",
        contract="one Gumbel-max token per row keyed by (seeds[slot], position), greedy at temperature 0; slot -1 "
                 "rows inert; raw logits cached per (slot, column) (fix 3)",
        choices={"no-padded-rows": NO_PADDED_ROWS, "temperature-floor": TEMPERATURE_FLOOR,
                 "finite-logits": FINITE_LOGITS, "masked-logits": MASKED_LOGITS,
                 "no-logits-cache": NO_LOGITS_CACHE, "cache-after-temperature": CACHE_AFTER_TEMPERATURE,
                 "greedy-at-zero-only": GREEDY_AT_ZERO_ONLY, "no-refusals": NO_REFUSALS},
        kernel=kernels.sampling.gumbel_sample,
        reference=reference.sampling.gumbel_sample,
        families={**sampling_families.FAMILIES, **sampling_splits.FAMILIES, "refused": GUMBEL_REFUSALS,
                  "ignored_poisoned": poisoned(one_of(sampling_families.padded, sampling_families.mixed),
                                               gumbel_ignored)},
        outputs=(RETURN, "logits_cache"),
        compare=exact_unless_near_tie,
        sweep=sampling_families.sampling_sweep,
        mutants=(
            Mutant("padded-rows-slot-0", "fix 3 (docs/fixes.md#fix-3): padded rows map to slot 0 and write its "
                                         "cached logits",
                   (Patch(_SAMPLING, "slot = tl.load(idx_mapping_ptr + row)",
                          "slot = tl.maximum(tl.load(idx_mapping_ptr + row), 0)"),),
                   oracles=EVERYWHERE, families=("padded",),
                   path=Reach(families=ENGINE_SAMPLED)),
            Mutant("draft-noise-unsalted", "noise keys (docs/contracts/sampling.md#noise-keys): drafting reuses the "
                                           "verifier's noise stream (no +2^30)",
                   (Patch(_SAMPLING, "tl.load(positions_ptr + row) + pos_salt", "tl.load(positions_ptr + row)"),),
                   oracles=EVERYWHERE, families=("mixed",),
                   path=Reach(families=ENGINE_SAMPLED)),
            Mutant("cache-after-temperature", "the logits cache stores scaled logits instead of the raw ones",
                   (Patch(_SAMPLING, "tl.store(cache_row_ptr + tokens, logits,",
                          "tl.store(cache_row_ptr + tokens, logits / tl.where(temp > 0, temp, 1.0),"),),
                   oracles=EVERYWHERE, families=("mixed",),
                   path=Reach(families=ENGINE_SAMPLED)),
            Mutant("temperature-by-row", "temperature read by batch row instead of request slot",
                   (Patch(_SAMPLING, "tl.load(temperature_ptr + slot,", "tl.load(temperature_ptr + row,"),),
                   oracles=EVERYWHERE, families=("mixed",),
                   path=Reach(families=ENGINE_SAMPLED)),
            Mutant("subnormal-temperature-greedy", "temperatures below the smallest normal float32 are flushed to 0, "
                   "as a flush-to-zero build does: one ulp above 0 turns greedy instead of sampling",
                   (Patch(_SAMPLING, "temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)",
                          "temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)\n"
                          "    temp = tl.where(temp < 1.1754944e-38, 0.0, temp)"),),
                   oracles=EVERYWHERE, families=("greedy_threshold",), path=SUBNORMAL_TEMPERATURES_UNREACHABLE),
            Mutant("inert-columns-validated", "the launcher checks the cache column of every row, inert ones too "
                   "(the live-row mask is left out): a stale column of a padded row refuses a valid call",
                   (Patch("kernels.sampling:gumbel_sample", 'what="column", where=idx_mapping >= 0)',
                          'what="column")'),),
                   oracles={"cpu": "crash"}, families=("ignored_poisoned",),
                   why_not="the GPU launcher reads no index back (SPECSAN_CHECK_INDICES unset), so nothing refuses",
                   path=unreachable_by_engine(
                       "the engine's cache columns are arange % depth: every row's, an inert row's too, lies in "
                       "the cache")),
            Mutant("splits-per-row-unclamped", "the splits a row gets are not clamped to at least one: past 512 rows "
                   "(PROGRAMS_WANTED // rows is 0) the launcher divides by zero",
                   (Patch(_SPLITS, "max(1, min(tiles, PROGRAMS_WANTED // num_rows))",
                          "min(tiles, PROGRAMS_WANTED // num_rows)"),),
                   oracles={"cpu": "crash", "cuda": "crash"}, families=("vocab_splits_many_rows",),
                   path=_NO_ROW_SPLIT_IN_THE_ENGINE),
            Mutant("last-split-dropped", "the split count is rounded down: when the tiles are no multiple of the tiles "
                   "a split holds, the last split is never launched and its tokens are neither scanned nor cached",
                   (Patch(_SPLITS, "-(-tiles // per_split)", "tiles // per_split"),),
                   oracles=EVERYWHERE, families=("vocab_splits_short_last",), path=_NO_ROW_SPLIT_IN_THE_ENGINE),
        ),
    ),
)
