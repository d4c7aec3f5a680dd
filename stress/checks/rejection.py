"""Registry entries of rejection.verify and rejection.distribution: verification of drafted tokens."""

import dataclasses

import torch

import kernels.rejection
import reference.rejection
from stress.checks.common import ENGINE_SAMPLED, EVERYWHERE, SUBNORMAL_TEMPERATURES_UNREACHABLE, unreachable_by_engine
from stress.checks.profiles import (
    DRAFTS_IN_SUPPORT,
    DRAFTS_IN_VOCAB,
    FINITE_LOGITS,
    GREEDY_AT_ZERO_ONLY,
    MASKED_LOGITS,
    NO_DRAFT_LOGITS,
    NO_PADDED_ROWS,
    NO_PLACEHOLDER_DRAFTS,
    NO_REFUSALS,
    TEMPERATURE_FLOOR,
)
from stress.core.compare import exact_unless_near_tie
from stress.core.types import RETURN, Check, Mutant, Patch, Reach
from stress.families import rejection as rejection_families
from stress.families.ignored import Region, one_of, poisoned, unmapped_slots, whole_rows
from stress.families.refusals import (
    emptied,
    moved,
    past_bound,
    refusal_family,
    resized,
    retyped,
    rows_short_of,
    strided,
)
from stress.oracles import distribution

_VERIFY = "kernels.rejection:_verify_kernel"
_STATS = "kernels.rejection:_softmax_stats_kernel"
# what keeps a step-stride slip in the draft-logits reads out of the engine's reach
_CONTIGUOUS_LOGITS = unreachable_by_engine("the engine's target logits and draft-logits cache are contiguous over one "
                                           "vocabulary: their step strides agree")
_ACCEPT_IGNORES_U = Mutant(
    "accept-ignores-u", "accepts iff p(x) >= q(x): the uniform is dropped from the accept test",
    (Patch(_VERIFY, "(p_x > uint_to_uniform_float(bits) * q_x)", "(p_x >= q_x)"),),
    oracles=EVERYWHERE,
    path=Reach(families=ENGINE_SAMPLED))
_RESAMPLE_FROM_TARGET = Mutant(
    "resample-from-target", "resamples from p (rejected draft included) instead of the residual max(p - q, 0)",
    (Patch(_VERIFY, "bits, draft, p_max, p_sum, q_max, q_sum, vocab,\n                                       "
                    "HAS_DRAFT_LOGITS, BLOCK_V)",
           "bits, -1, p_max, p_sum, q_max, q_sum, vocab,\n                                       False, BLOCK_V)"),),
    oracles=EVERYWHERE,
    path=Reach(families=ENGINE_SAMPLED))


# ---------------------------------------------------------------- refusals

def _requests(inputs: dict) -> int:
    return inputs["target_logits"].shape[0]


VERIFY_REFUSALS = refusal_family(rejection_families.mixed, (
    emptied({"target_logits": 1, "out_tokens": 1}, "no bonus row (k + 1 = 0 rows)", refused="target_logits"),
    *resized("draft_tokens", 1, (-1, 1), "draft_tokens one column short or past k"),
    *resized("draft_tokens", 0, (-1, 1), "draft_tokens one row short or past the requests"),
    *resized("idx_mapping", 0, (-1, 1), "idx_mapping one entry short or past the requests"),
    *resized("positions", 0, (-1, 1), "positions one entry short or past the requests"),
    *resized("seeds", 0, (-1, 1), "seeds for one slot fewer or more than temperature"),
    *resized("out_tokens", 0, (rows_short_of(_requests),), "out_tokens one row short of the requests"),
    *resized("out_tokens", 1, (-1, 1), "out_tokens one column short or past k + 1"),
    *resized("num_sampled", 0, (rows_short_of(_requests),), "num_sampled one entry short of the requests"),
    *resized("num_rejected", 0, (rows_short_of(_requests),), "num_rejected one entry short of the requests"),
    *resized("draft_logits", 2, (-1, 1), "draft_logits one vocabulary entry short or past the target's"),
    past_bound("idx_mapping", lambda i: i["temperature"].numel(), "a slot past temperature"),
    emptied({"target_logits": 2, "draft_logits": 2}, "a vocabulary of 0", refused="target_logits"),
    *moved("target_logits", "draft_tokens", "idx_mapping", "temperature", "seeds", "positions", "out_tokens",
          "num_sampled", "num_rejected", "draft_logits"),
    # every integer and float argument in another dtype, and the tensors that hold more than one entry on the CPU
    # as views of innermost stride 2: their dtype and stride checks are the only guards against them
    retyped("draft_tokens", torch.int32), retyped("idx_mapping", torch.int64), retyped("temperature", torch.float64),
    retyped("seeds", torch.int32), retyped("positions", torch.int32), retyped("out_tokens", torch.int32),
    retyped("num_sampled", torch.int64), retyped("num_rejected", torch.int64), retyped("target_logits", torch.float64),
    *strided("target_logits", "draft_tokens", "out_tokens", "draft_logits"),
    # every dimension of draft_logits' shape, not only the vocabulary (appended: the cases above keep their draws)
    *resized("draft_logits", 0, (-1, 1), "draft_logits for one slot fewer or more than temperature"),
    *resized("draft_logits", 1, (-1, 1), "draft_logits one step short or past k"),
), "verify")


# ---------------------------------------------------------------- ignored regions


def _sampled_slots(inputs: dict) -> torch.Tensor:
    """Per slot, whether a live request on it verifies probabilistically (temperature > 0): only those read a
    seed, a position key or draft logits."""
    slots = inputs["idx_mapping"].long()
    sampled = torch.zeros(inputs["temperature"].numel(), dtype=torch.bool)
    live = slots[slots >= 0]
    sampled[live] = inputs["temperature"][live] > 0
    return sampled


def verify_ignored(inputs: dict) -> list[Region]:
    """Temperatures of slots no request names; seeds, position keys and draft-logits rows of requests that draw
    nothing (inert or greedy); the target logits and drafts of inert requests; and the draft-logits row of a step
    whose draft is a placeholder (no q takes part there)."""
    slots = inputs["idx_mapping"].long()
    sampled = _sampled_slots(inputs)
    live = slots >= 0
    inert = ~live
    drawing = live & sampled[slots.clamp(min=0)]
    regions = [Region("temperature", unmapped_slots(inputs["idx_mapping"], sampled.numel())),
               Region("seeds", ~sampled), Region("positions", ~drawing),
               Region("target_logits", whole_rows(inert, inputs["target_logits"])),
               Region("draft_tokens", whole_rows(inert, inputs["draft_tokens"]))]
    draft_logits = inputs.get("draft_logits")
    if draft_logits is not None:
        drafted = torch.zeros(draft_logits.shape[:2], dtype=torch.bool)
        drafted[slots[drawing]] = inputs["draft_tokens"][drawing] >= 0
        regions.append(Region("draft_logits", (~drafted)[:, :, None].expand(draft_logits.shape)))
    return regions


CHECKS = (
    Check(
        name="rejection.verify",
        contract="greedy or probabilistic verification of k drafts per request: accept iff p(x) > u q(x), resample "
                 "from max(p - q, 0), bonus token when all are accepted",
        choices={"no-padded-rows": NO_PADDED_ROWS, "temperature-floor": TEMPERATURE_FLOOR,
                 "finite-logits": FINITE_LOGITS, "masked-logits": MASKED_LOGITS,
                 "no-placeholder-drafts": NO_PLACEHOLDER_DRAFTS, "drafts-in-vocab": DRAFTS_IN_VOCAB,
                 "drafts-in-support": DRAFTS_IN_SUPPORT,
                 "no-draft-logits": NO_DRAFT_LOGITS, "greedy-at-zero-only": GREEDY_AT_ZERO_ONLY,
                 "no-refusals": NO_REFUSALS},
        kernel=kernels.rejection.verify,
        reference=reference.rejection.verify,
        # every draft accepted at each depth around the emitted tokens' tile: one family draws such depths
        unit_tests=("tests/test_rejection.py::test_every_draft_accepted_at_every_depth_around_a_tile_keeps_the_bonus",),
        families={**rejection_families.FAMILIES, "refused": VERIFY_REFUSALS,
                  "ignored_poisoned": poisoned(one_of(rejection_families.padded, rejection_families.placeholders),
                                               verify_ignored)},
        outputs=("out_tokens", "num_sampled", "num_rejected"),
        compare=exact_unless_near_tie,
        sweep=rejection_families.verify_sweep,
        mutants=(
            Mutant("placeholder-accepted", "a -1 draft is tested like a token (as token 0) instead of rejected",
                   (Patch(_VERIFY, "accepted = valid & (p_x", "accepted = (p_x"),),
                   oracles=EVERYWHERE, families=("placeholders",),
                   path=unreachable_by_engine(
                       'the engine schedules real drafts only and verifies each request with exactly its drafts (one '
                       'launch per draft count): no -1 placeholder is ever verified')),
            Mutant("placeholder-resampled-from-residual", "a placeholder step is resampled from max(p - q, 0) with "
                   "q the draft-logits row of a step the request never drafted, instead of sampled from p",
                   (Patch(_VERIFY, "if draft < 0:  # no draft at this step", "if False:  # no draft at this step"),),
                   oracles=EVERYWHERE, families=("placeholders",)),
            _ACCEPT_IGNORES_U,
            _RESAMPLE_FROM_TARGET,
            Mutant("accepts-zero-target-probability", "accepts iff p(x) >= u q(x) (pre-fix): a token of target "
                   "probability 0 passes when its draft probability is 0 too, where upstream's log test rejects it",
                   (Patch(_VERIFY, "(p_x > uint_to_uniform_float(bits) * q_x)",
                          "(p_x >= uint_to_uniform_float(bits) * q_x)"),),
                   oracles=EVERYWHERE, families=("extremes",),
                   path=unreachable_by_engine(
                       "the engine's small random models spread logits far less than the ~100 a float32 softmax needs"
                       ' to give a token probability exactly 0')),
            Mutant("padding-counted-as-rejected", "num_rejected (pre-fix) counts a shorter request's trailing "
                   "placeholders as rejected drafts: k + 1 - num_sampled instead of its own d + 1 - num_sampled",
                   (Patch(_VERIFY, "tl.where(live, own_drafts + 1 - sampled, 0)",
                          "tl.where(live, num_drafts + 1 - sampled, 0)"),),
                   oracles=EVERYWHERE, families=("placeholders",),
                   path=unreachable_by_engine(
                       'the engine verifies each request with exactly its drafts (one launch per draft count): no '
                       "padding placeholder follows a request's drafts")),
            Mutant("step-offset-int32", "the draft step is an int32 counter: step * the target's step stride "
                   "wraps past 2^31 elements and the bonus row is read 8 GB before the logits",
                   (Patch(_VERIFY, "step = b.to(tl.int64) * 0", "step = b * 0"),),
                   oracles={"cuda": "crash"}, families=("big_offsets_steps",),
                   why_not="needs a view past 2^31 elements, big_offsets_steps' GPU-only size; on the CPU its rows "
                           "are a few thousand elements apart",
                           path=unreachable_by_engine(
                               'the engine verifies contiguous logits of a small vocabulary: no step offset nears '
                               '2^31 elements')),
            Mutant("shared-drafts-row-stride-one", "draft_tokens' row stride passed as max(1, stride) (pre-fix): "
                   "one draft row expanded to the batch (stride 0) is read at rows 1, 2, ... elements apart",
                   (Patch("kernels.rejection:verify", "draft_tokens.stride(0), idx_mapping",
                          "max(1, draft_tokens.stride(0)), idx_mapping"),),
                   oracles=EVERYWHERE, families=("shared_drafts",),
                   path=unreachable_by_engine(
                       "the engine's draft tokens are a contiguous [requests, depth] buffer, never one row expanded "
                       'over the batch (stride 0)')),
            Mutant("seed-by-row", "the Philox seed is read by batch row instead of request slot",
                   (Patch(_VERIFY, "tl.load(seeds_ptr + slot,", "tl.load(seeds_ptr + b,"),),
                   oracles=EVERYWHERE, families=("mixed",),
                   path=Reach(families=ENGINE_SAMPLED)),
            Mutant("empty-residual-token-0", "an empty residual (p <= q at every token) resamples token 0, the "
                   "argmax of an all -inf row (pre-fix, as upstream), instead of Gumbel-max over the target row",
                   (Patch("kernels.rejection:_gumbel_argmax", 'tl.max(best_scores, 0) > float("-inf"), token,',
                          "True, token,"),
                    Patch(_VERIFY, "def _verify_kernel(", "def _verify_kernel("),),  # rebuilt with the helper
                   oracles=EVERYWHERE, families=("empty_residual", "empty_residual_spread", "extremes")),
            Mutant("greedy-argmax-of-probabilities", "greedy verification takes the argmax of exp(logits), as an "
                   "argmax of probabilities does: the same order, but two logits closer than the exponential's "
                   "float32 spacing tie there, and the lower token wins where the higher logit should",
                   (Patch("kernels.rejection:_argmax", "logits = tl.load(row_ptr + tokens, mask=tokens < vocab, "
                          'other=float("-inf"))', "logits = tl.exp(tl.load(row_ptr + tokens, mask=tokens < vocab, "
                          'other=float("-inf")))'),
                    Patch(_VERIFY, "def _verify_kernel(", "def _verify_kernel("),),  # rebuilt with the helper
                   oracles=EVERYWHERE, families=("ulp_ties",)),
            Mutant("rejects-zero-draft-probability", "a draft the drafter gave probability 0 is rejected (accept "
                   "iff q(x) > 0 and p(x) / q(x) > u, a ratio test that needs q > 0) where p(x) > u q(x) accepts it",
                   (Patch(_VERIFY, "accepted = valid & (p_x > uint_to_uniform_float(bits) * q_x)",
                          "accepted = valid & (q_x > 0) & (p_x > uint_to_uniform_float(bits) * q_x)"),),
                   oracles=EVERYWHERE, families=("unsupported_drafts",)),
            Mutant("residual-keeps-by-target-score", "the residual keeps the tokens whose Gumbel score on the target "
                   "row (logits / temp plus noise, the neighbouring line's) exceeds q instead of those where p > q: "
                   "with logits well above 1 both keep every token of p > q, but log-probabilities keep nothing and "
                   "the resample falls back to the target row, the rejected draft included",
                   (Patch("kernels.rejection:_gumbel_argmax", "keep = in_vocab & (p > q)",
                          "keep = in_vocab & (target_scores > q)"),
                    Patch(_VERIFY, "def _verify_kernel(", "def _verify_kernel("),),  # rebuilt with the helper
                   oracles=EVERYWHERE, families=("overconfident_drafter",)),
            Mutant("uniform-row-counts-padding", "the softmax statistics give the lanes past the vocab -2^126 (the "
                   "clamp's floor) instead of -inf: they weigh nothing beside a finite score, but a row of -inf or "
                   "NaN, uniform by contract, spreads its mass over the last tile's padding too",
                   (Patch("kernels.rejection:_softmax_stats", 'temp), float("-inf"))', "temp), -CLAMP)"),
                    Patch(_STATS, "def _softmax_stats_kernel(", "def _softmax_stats_kernel("),),  # rebuilt with it
                   oracles=EVERYWHERE, families=("uniform_rows",),
                   path=unreachable_by_engine("the engine's target logits are finite: no row is all -inf or NaN")),
            Mutant("q-row-target-step-stride", "the draft-logits row of a step is addressed with the target's step "
                   "stride (the neighbouring tensor's): the same number whenever both are contiguous over one "
                   "vocabulary",
                   (Patch(_VERIFY, "q_row_ptr = draft_row_ptr + step * draft_logits_step_stride",
                          "q_row_ptr = draft_row_ptr + step * target_step_stride"),),
                   oracles=EVERYWHERE, families=("agreeing_layouts",),
                   path=_CONTIGUOUS_LOGITS),
            Mutant("q-stats-target-step-stride", "the softmax statistics of q address a step's draft-logits row "
                   "with the target's step stride (the neighbouring tensor's): a window of the row moved by the row "
                   "padding, the same row whenever both are contiguous over one vocabulary",
                   (Patch(_STATS, "q_row_ptr += step * draft_logits_step_stride",
                          "q_row_ptr += step * target_step_stride"),),
                   oracles=EVERYWHERE, families=("agreeing_peaked_layouts",),
                   path=_CONTIGUOUS_LOGITS),
            Mutant("q-stats-by-batch-row", "the softmax statistics of q are taken from the draft-logits row of the "
                   "request's batch row instead of its slot (the verify kernel's own q reads stay by slot): p(x) > "
                   "u q(x) and the residual weigh another request's drafter",
                   (Patch(_STATS, "q_row_ptr = draft_logits_ptr + slot.to(tl.int64)",
                          "q_row_ptr = draft_logits_ptr + b.to(tl.int64)"),),
                   oracles=EVERYWHERE, families=("mixed", "rejected_drafts")),
            Mutant("verify-subnormal-temperature-greedy", "temperatures below the smallest normal float32 are "
                   "flushed to 0, as a flush-to-zero build does: one ulp above 0 verifies greedily instead of "
                   "sampling",
                   (Patch(_VERIFY, "temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)",
                          "temp = tl.load(temperature_ptr + slot, mask=live, other=0.0)\n"
                          "    temp = tl.where(temp < 1.1754944e-38, 0.0, temp)"),),
                   oracles=EVERYWHERE, families=("greedy_threshold",), path=SUBNORMAL_TEMPERATURES_UNREACHABLE),
        ),
    ),
    Check(
        name="rejection.distribution",
        contract="the tokens verification emits follow the target distribution (chi-square over many trials)",
        kernel=distribution.verify_trials,
        judges=("rejection.verify",),
        reference=distribution.expected_distribution,
        families=rejection_families.DISTRIBUTION_FAMILIES,
        outputs=(RETURN,),
        compare=distribution.judge_trials,
        sweep=rejection_families.verify_sweep,
        mutants=(_ACCEPT_IGNORES_U, _RESAMPLE_FROM_TARGET,
                 # the same bug hunted at a 128k vocabulary only: the positive control of that chi-square
                 dataclasses.replace(_ACCEPT_IGNORES_U, name="accept-ignores-u-128k", families=("long_vocab",),
                                     oracles={"cuda": "divergence"},
                                     why_not="long_vocab is a greedy smoke version on the CPU (no uniform to drop); "
                                             "target_distribution kills accept-ignores-u here",
                                             path=Reach(families=ENGINE_SAMPLED))),
    ),
)
