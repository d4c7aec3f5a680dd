"""The registry: one Check per kernel. Runner, tests, tracer and mutant matrix all iterate it."""

import dataclasses
import functools

import kernels.attention
import kernels.block_table
import kernels.draft_inputs
import kernels.kv_cache
import kernels.rejection
import kernels.sampling
import kernels.spec.slots
import reference.attention
import reference.block_table
import reference.draft_inputs
import reference.kv_cache
import reference.rejection
import reference.sampling
import reference.spec.backends
import reference.spec.depth
import reference.spec.draft_step
import reference.spec.graphs
import reference.spec.slots
import stress.families.schedule
import stress.oracles.graph_replay
from stress.core.compare import exact_chunked, exact_unless_near_tie, within_float32_baseline
from stress.core.types import RETURN, Check, Mutant, Patch
from stress.families import attention as attention_families
from stress.families import backends as backend_families
from stress.families import block_table as bt_families
from stress.families import depth as depth_families
from stress.families import draft_inputs as di_families
from stress.families import engine as engine_families
from stress.families import graph_replay as replay_families
from stress.families import graphs as graph_families
from stress.families import kv_cache as kv_families
from stress.families import refusals
from stress.families import rejection as rejection_families
from stress.families import sampling as sampling_families
from stress.families import slots as slot_families
from stress.oracles import distribution, host
from stress.oracles import engine as engine_check

_BT = "kernels.block_table"

BLOCK_TABLE_CHECKS = (
    Check(
        name="block_table.gather",
        contract="out[b] = persistent[idx_mapping[b]] for each batch row b; slot -1 gives null blocks; rows past "
                 "the batch untouched",
        kernel=kernels.block_table.gather_block_tables,
        reference=reference.block_table.gather_block_tables,
        families={**bt_families.GATHER_FAMILIES, "refused": refusals.GATHER},
        outputs=("out",),
        provenance={"out": "persistent"},
        mutants=(
            Mutant("gather-by-batch-row", "reads the persistent row of batch row b instead of its slot",
                   (Patch(f"{_BT}:_gather_rows_kernel", "slot = tl.load(idx_mapping_ptr + batch_row).to(tl.int64)",
                          "slot = batch_row.to(tl.int64) + tl.load(idx_mapping_ptr + batch_row).to(tl.int64) * 0"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}),
            Mutant("row-overread", "the column term is dropped from the load mask: lanes past the width read the "
                   "next row, and past the last row, memory outside the table",
                   (Patch(f"{_BT}:_gather_rows_kernel", "persistent_stride + cols, mask=live, other=0)",
                          "persistent_stride + cols)"),),
                   oracles={"cpu": "oob", "cuda": "memcheck"}),
            # positive controls of the refusal verdict (stress.core.refusal): the refused family must kill each
            Mutant("width-guard-removed", "out's width is not compared with persistent's: a narrower out is "
                   "accepted and its rows are overrun",
                   (Patch(f"{_BT}:gather_block_tables", "if out.shape[1] != persistent.shape[1]:", "if False:"),),
                   oracles={"cpu": "accepted", "cuda": "accepted"}, families=("refused",)),
            Mutant("refusal-names-wrong-argument", "too few out rows is refused, but the error names idx_mapping",
                   (Patch(f"{_BT}:gather_block_tables", 'raise ValueError(f"out: {out.shape[0]} rows, but idx_mapping',
                          'raise ValueError(f"idx_mapping: {out.shape[0]} rows of out, but'),),
                   oracles={"cpu": "refusal", "cuda": "refusal"}, families=("refused",)),
            Mutant("written-before-refusal", "out is cleared before persistent is found empty: the refused call "
                   "has already written",
                   (Patch(f"{_BT}:gather_block_tables", "    if persistent.shape[0] == 0:\n",
                          "    if persistent.shape[0] == 0:\n        out.zero_()\n"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("refused",)),
        ),
    ),
    Check(
        name="block_table.slot_mapping",
        contract="out[t] = block_table[b, pos // bs] * bs + pos % bs for token t of batch row b; PAD for null "
                 "blocks, positions off the row and tokens past the batch",
        kernel=kernels.block_table.compute_slot_mappings,
        reference=reference.block_table.compute_slot_mappings,
        families={**bt_families.SLOT_MAPPING_FAMILIES, "refused": refusals.SLOT_MAPPING},
        outputs=("out",),
        mutants=(
            Mutant("pad-tail-unwritten", "tokens past the batch keep stale slots instead of PAD",
                   (Patch(f"{_BT}:_slot_mapping_kernel", "mask=tokens < num_out)  # tokens past the batch: PAD",
                          "mask=live)"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("padded",)),
            Mutant("null-block-writable", "the null block 0 gets a real slot instead of PAD",
                   (Patch(f"{_BT}:_slot_mapping_kernel", "in_row & (block_id != 0)", "in_row"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}),
        ),
    ),
    Check(
        name="block_table.shift",
        contract="batch row b shifted left in place by num_cached_tokens[idx_mapping[b]] // bs entries, only the "
                 "blocks seq_lens[b] needs; race-free (fixes 4, 5)",
        kernel=kernels.block_table.shift_block_table_rows,
        reference=reference.block_table.shift_block_table_rows,
        families={**bt_families.SHIFT_FAMILIES, "refused": refusals.SHIFT},
        outputs=("block_table",),
        sweep=bt_families.shift_sweep,
        provenance={"block_table": "block_table"},
        hunt_seconds={"cpu": 0.5, "cuda": 4.0},  # in-place and chunked: races between warps (fix 5)
        mutants=(
            Mutant("no-barrier", "fix 5 (docs/fixes.md#fix-5): the barrier between a chunk's loads and its stores "
                                 "is removed",
                   (Patch(f"{_BT}:_shift_rows_kernel", "tl.debug_barrier()", "pass"),),
                   oracles={"cpu": "race", "cuda": "divergence"}, families=("overlap", "long_row")),
            Mutant("count-by-batch-row", "fix 4 (docs/fixes.md#fix-4): num_cached_tokens indexed by batch row "
                                         "instead of slot",
                   (Patch(f"{_BT}:_shift_rows_kernel", "tl.load(num_cached_tokens_ptr + slot, mask=slot >= 0",
                          "tl.load(num_cached_tokens_ptr + batch_row, mask=slot >= 0"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}),
            Mutant("ignores-seq-lens", "fix 4 (docs/fixes.md#fix-4): copies to the end of the row instead of the "
                                       "needed blocks",
                   (Patch(f"{_BT}:_shift_rows_kernel", "n = tl.minimum(width - shift, needed)",
                          "n = width - shift + needed * 0"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}),
            Mutant("seq-len-blocks-int32", "the blocks a seq_len needs are counted in int32: cdiv's + block_size - 1 "
                   "wraps a seq_len near 2^31 negative and the row is not shifted",
                   (Patch(f"{_BT}:_shift_rows_kernel", "tl.load(seq_lens_ptr + batch_row).to(tl.int64), block_size)",
                          "tl.load(seq_lens_ptr + batch_row), block_size)"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("extremes",)),
        ),
    ),
    Check(
        name="block_table.unaligned_prefix",
        contract="True iff some live slot's cached count is not a multiple of a block size: the batch must not "
                 "draft (fix 4)",
        kernel=kernels.block_table.has_unaligned_cached_prefix,
        reference=reference.block_table.has_unaligned_cached_prefix,
        families={**bt_families.PREFIX_FAMILIES, "refused": refusals.UNALIGNED_PREFIX},
        outputs=(RETURN,),
        mutants=(
            Mutant("unaligned-not-refused", "fix 4 (docs/fixes.md#fix-4): a partial restored block is not refused",
                   (Patch(f"{_BT}:has_unaligned_cached_prefix", "return any(", "return False and any("),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}),
            Mutant("padded-slot-wraps", "padded rows (slot -1) index the last slot's count",
                   (Patch(f"{_BT}:has_unaligned_cached_prefix", "slots = slots[slots >= 0]", "pass"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("padded",)),
        ),
    ),
)

_DI = "kernels.draft_inputs:_prepare_draft_inputs_kernel"
_EVERYWHERE = {"cpu": "divergence", "cuda": "divergence"}

DRAFT_INPUT_CHECKS = (
    Check(
        name="draft_inputs.prepare",
        contract="the draft's context, query and sampling rows and seq_lens for the live batch, everything past it "
                 "inert; a batch with an unaligned cached prefix drafts -1s (fixes 3, 4)",
        kernel=kernels.draft_inputs.prepare_draft_inputs,
        reference=reference.draft_inputs.prepare_draft_inputs,
        families={**di_families.FAMILIES, "refused": refusals.PREPARE},
        outputs=(RETURN, *reference.draft_inputs.OUTPUTS),
        sweep=di_families.sweep,
        mutants=(
            Mutant("stale-padded-queries", "fix 3, pre-fix (docs/fixes.md#fix-3): padded query rows get PAD slots "
                                           "but keep stale "
                   "input ids and positions",
                   (Patch(_DI, "tl.store(input_ids_ptr + rows, tl.full((BLOCK,), 0, tl.int32), mask=keep)  # cleared "
                          "query inputs\n            tl.store(positions_ptr + rows, tl.full((BLOCK,), 0, tl.int64), "
                          "mask=keep)  # (fix 3)", "pass"),),
                   oracles=_EVERYWHERE, families=("padded", "zero_width")),
            Mutant("seq-lens-keep-cached", "fix 4, pre-fix (docs/fixes.md#fix-4): seq_lens are not shortened by the "
                                           "cached blocks",
                   (Patch(_DI, "(tl.load(num_cached_tokens_ptr + slot) // block_size) * block_size",
                          "tl.load(num_cached_tokens_ptr + slot) * 0"),),
                   oracles=_EVERYWHERE, families=("prefix_cache", "decode")),
            Mutant("unaligned-drafts", "fix 4 (docs/fixes.md#fix-4): a batch with a partial cached block is "
                                       "drafted, not refused",
                   (Patch("kernels.draft_inputs:prepare_draft_inputs",
                          "if tables.has_unaligned_cached_prefix(num_cached_tokens, slots, (block_size,)):",
                          "if False:"),),
                   oracles=_EVERYWHERE, families=("prefix_cache",)),
            Mutant("rejected-keeps-slot", "the rejected suffix keeps its real position and KV slot",
                   (Patch(_DI, "ctx_valid = lanes < n_valid", "ctx_valid = lanes < n_ctx"),),
                   oracles=_EVERYWHERE, families=("rejected_suffix",)),
            Mutant("position-unclamped", "query positions are not clamped to max_model_len - 1",
                   (Patch(_DI, "tl.minimum(query_pos, max_model_len - 1)", "query_pos + max_model_len * 0"),),
                   oracles=_EVERYWHERE, families=("max_model_len",)),
            Mutant("sample-slot-is-batch-row", "sampling rows record the batch row instead of the request slot",
                   (Patch(_DI, "(lanes * 0 + slot).to(tl.int32)", "(lanes * 0 + batch_row).to(tl.int32)"),),
                   oracles=_EVERYWHERE),
            Mutant("decreasing-offsets-accepted", "target offsets are not checked for order (pre-fix): a row of "
                   "negative length is accepted",
                   (Patch("kernels.draft_inputs:prepare_draft_inputs",
                          '    validate.offsets("target_query_start_loc", target_starts[:num_batch_rows + 1], '
                          'num_target_rows)\n', ""),),
                   oracles={"cpu": "accepted", "cuda": "accepted"}, families=("refused",)),
        ),
    ),
)

_SAMPLING = "kernels.sampling:_gumbel_sample_kernel"

SAMPLING_CHECKS = (
    Check(
        name="sampling.gumbel",
        contract="one Gumbel-max token per row keyed by (seeds[slot], position), greedy at temperature 0; slot -1 "
                 "rows inert; raw logits cached per (slot, column) (fix 3)",
        kernel=kernels.sampling.gumbel_sample,
        reference=reference.sampling.gumbel_sample,
        families={**sampling_families.FAMILIES, "refused": refusals.GUMBEL},
        outputs=(RETURN, "logits_cache"),
        compare=exact_unless_near_tie,
        sweep=sampling_families.sampling_sweep,
        mutants=(
            Mutant("padded-rows-slot-0", "fix 3 (docs/fixes.md#fix-3): padded rows map to slot 0 and write its "
                                         "cached logits",
                   (Patch(_SAMPLING, "slot = tl.load(idx_mapping_ptr + row)",
                          "slot = tl.maximum(tl.load(idx_mapping_ptr + row), 0)"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("padded",)),
            Mutant("draft-noise-unsalted", "noise keys (docs/contracts/sampling.md#noise-keys): drafting reuses the "
                                           "verifier's noise stream (no +2^30)",
                   (Patch(_SAMPLING, "tl.load(positions_ptr + row) + pos_salt", "tl.load(positions_ptr + row)"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("mixed",)),
            Mutant("cache-after-temperature", "the logits cache stores scaled logits instead of the raw ones",
                   (Patch(_SAMPLING, "tl.store(cache_row_ptr + tokens, logits,",
                          "tl.store(cache_row_ptr + tokens, logits / tl.where(temp > 0, temp, 1.0),"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("mixed",)),
            Mutant("temperature-by-row", "temperature read by batch row instead of request slot",
                   (Patch(_SAMPLING, "tl.load(temperature_ptr + slot,", "tl.load(temperature_ptr + row,"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("mixed",)),
        ),
    ),
)

_SLOTS = "kernels.spec.slots:RequestSlots"

SLOT_CHECKS = (
    Check(
        name="spec.slots",
        contract="request slots and fallback seeds identical on every TP rank: sorted slot recycling, a private "
                 "seed generator (fix 2)",
        kernel=stress.families.schedule.replay,  # drives the production kernels.spec.slots.RequestSlots
        reference=reference.spec.slots.replay,
        families={**slot_families.FAMILIES, "refused": refusals.SLOTS},
        outputs=(RETURN,),
        mutants=(
            Mutant("set-order-recycling", "fix 2B, pre-fix (docs/fixes.md#fix-2b): freed slots are recycled in set "
                                          "order",
                   (Patch(_SLOTS, "for req_id in sorted(req_ids):", "for req_id in req_ids:"),),
                   oracles=_EVERYWHERE, families=("mass_finish", "churn")),
            Mutant("global-rng-seeds", "fix 2A, pre-fix (docs/fixes.md#fix-2a): fallback seeds come from the global "
                                       "numpy RNG",
                   (Patch(_SLOTS, "self._fallback_seed_rng.integers(", "np.random.randint("),),
                   oracles=_EVERYWHERE, families=("resume", "churn")),
        ),
    ),
)


_VERIFY = "kernels.rejection:_verify_kernel"
_ACCEPT_IGNORES_U = Mutant(
    "accept-ignores-u", "accepts iff p(x) >= q(x): the uniform is dropped from the accept test",
    (Patch(_VERIFY, "(p_x > uint_to_uniform_float(bits) * q_x)", "(p_x >= q_x)"),),
    oracles={"cpu": "divergence", "cuda": "divergence"})
_RESAMPLE_FROM_TARGET = Mutant(
    "resample-from-target", "resamples from p (rejected draft included) instead of the residual max(p - q, 0)",
    (Patch(_VERIFY, "bits, draft, p_max, p_sum, q_max, q_sum, vocab,\n                                       "
                    "HAS_DRAFT_LOGITS, BLOCK_V)",
           "bits, -1, p_max, p_sum, q_max, q_sum, vocab,\n                                       False, BLOCK_V)"),),
    oracles={"cpu": "divergence", "cuda": "divergence"})

REJECTION_CHECKS = (
    Check(
        name="rejection.verify",
        contract="greedy or probabilistic verification of k drafts per request: accept iff p(x) > u q(x), resample "
                 "from max(p - q, 0), bonus token when all are accepted",
        kernel=kernels.rejection.verify,
        reference=reference.rejection.verify,
        families={**rejection_families.FAMILIES, "refused": refusals.VERIFY},
        outputs=("out_tokens", "num_sampled", "num_rejected"),
        compare=exact_unless_near_tie,
        sweep=rejection_families.verify_sweep,
        mutants=(
            Mutant("placeholder-accepted", "a -1 draft is tested like a token (as token 0) instead of rejected",
                   (Patch(_VERIFY, "accepted = valid & (p_x", "accepted = (p_x"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("placeholders",)),
            Mutant("placeholder-resampled-from-residual", "a placeholder step is resampled from max(p - q, 0) with "
                   "q the draft-logits row of a step the request never drafted, instead of sampled from p",
                   (Patch(_VERIFY, "if draft < 0:  # no draft at this step", "if False:  # no draft at this step"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("placeholders",)),
            _ACCEPT_IGNORES_U,
            _RESAMPLE_FROM_TARGET,
            Mutant("accepts-zero-target-probability", "accepts iff p(x) >= u q(x) (pre-fix): a token of target "
                   "probability 0 passes when its draft probability is 0 too, where upstream's log test rejects it",
                   (Patch(_VERIFY, "(p_x > uint_to_uniform_float(bits) * q_x)",
                          "(p_x >= uint_to_uniform_float(bits) * q_x)"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("extremes",)),
            Mutant("padding-counted-as-rejected", "num_rejected (pre-fix) counts a shorter request's trailing "
                   "placeholders as rejected drafts: k + 1 - num_sampled instead of its own d + 1 - num_sampled",
                   (Patch(_VERIFY, "tl.where(live, own_drafts + 1 - sampled, 0)",
                          "tl.where(live, num_drafts + 1 - sampled, 0)"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("placeholders",)),
            Mutant("step-offset-int32", "the draft step is an int32 counter: step * the target's step stride "
                   "wraps past 2^31 elements and the bonus row is read 8 GB before the logits",
                   (Patch(_VERIFY, "step = b.to(tl.int64) * 0", "step = b * 0"),),
                   oracles={"cuda": "crash"}, families=("big_offsets_steps",),
                   why_not="needs a view past 2^31 elements, big_offsets_steps' GPU-only size; on the CPU its rows "
                           "are a few thousand elements apart"),
            Mutant("shared-drafts-row-stride-one", "draft_tokens' row stride passed as max(1, stride) (pre-fix): "
                   "one draft row expanded to the batch (stride 0) is read at rows 1, 2, ... elements apart",
                   (Patch("kernels.rejection:verify", "draft_tokens.stride(0), idx_mapping",
                          "max(1, draft_tokens.stride(0)), idx_mapping"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("shared_drafts",)),
            Mutant("seed-by-row", "the Philox seed is read by batch row instead of request slot",
                   (Patch(_VERIFY, "tl.load(seeds_ptr + slot,", "tl.load(seeds_ptr + b,"),),
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("mixed",)),
            Mutant("empty-residual-token-0", "an empty residual (p <= q at every token) resamples token 0, the "
                   "argmax of an all -inf row (pre-fix, as upstream), instead of Gumbel-max over the target row",
                   (Patch("kernels.rejection:_gumbel_argmax", 'tl.max(best_scores, 0) > float("-inf"), token,',
                          "True, token,"),
                    Patch(_VERIFY, "def _verify_kernel(", "def _verify_kernel("),),  # rebuilt with the helper
                   oracles={"cpu": "divergence", "cuda": "divergence"}, families=("empty_residual", "extremes")),
        ),
    ),
    Check(
        name="rejection.distribution",
        contract="the tokens verification emits follow the target distribution (chi-square over many trials)",
        kernel=distribution.verify_trials,
        reference=distribution.expected_distribution,
        families=rejection_families.DISTRIBUTION_FAMILIES,
        outputs=(RETURN,),
        compare=distribution.judge,
        sweep=rejection_families.verify_sweep,
        mutants=(_ACCEPT_IGNORES_U, _RESAMPLE_FROM_TARGET,
                 # the same bug hunted at a 128k vocabulary only: the positive control of that chi-square
                 dataclasses.replace(_ACCEPT_IGNORES_U, name="accept-ignores-u-128k", families=("long_vocab",),
                                     oracles={"cuda": "divergence"},
                                     why_not="long_vocab is a greedy smoke version on the CPU (no uniform to drop); "
                                             "target_distribution kills accept-ignores-u here")),
    ),
)

_GRAPHS = "kernels.spec.graphs"
_DEPTH = "kernels.spec.depth"
_BACKENDS = "kernels.spec.backends"
# Fix 6 (pre-fix): FlashInfer and our host-planned backend claim full-graph support for non-causal
# attention too, so the draft captures launches whose host-side plan only fits the capture batch.
# The graph replay check hunts the same patch on the GPU.
NON_CAUSAL_CLAIMS_FULL = Mutant(
    "non-causal-claims-full", "fix 6, pre-fix (docs/fixes.md#fix-6): non-causal attention claims UNIFORM_BATCH "
                              "graph support",
    (Patch(f"{_BACKENDS}:graph_support",
           "CGSupport.UNIFORM_SINGLE_TOKEN_DECODE if non_causal else CGSupport.UNIFORM_BATCH",
           "CGSupport.UNIFORM_BATCH"),),
    oracles=_EVERYWHERE, families=("sm100_non_causal",))


def _host_check(name: str, contract: str, driver, impl, families: dict, compare, mutants: tuple[Mutant, ...]) -> Check:
    """A host-logic check: ``driver`` (stress.oracles.host) runs the production module by default, and the
    reference module ``impl`` of the same names for the expected records."""
    return Check(name=name, contract=contract, kernel=driver, reference=functools.partial(driver, impl=impl),
                 families=families,
                 outputs=(RETURN,), compare=compare, mutants=mutants)


HOST_CHECKS = (
    _host_check(
        "spec.graph_candidates", "FULL and PIECEWISE graph candidates per capture size and uniform width, never "
                                 "width 0 (fix 1); dispatch picks the first staged graph that fits, else eager",
        host.graph_outcomes, reference.spec.graphs,
        {**graph_families.FAMILIES, "refused": refusals.GRAPH_CANDIDATES},
        host.graph_outcomes_agree,
        (
            Mutant("zero-width-candidates", "fix 1, pre-fix (docs/fixes.md#fix-1): no zero-width filter, so a "
                                            "depth-0 band of an "
                   "n_new = 0 draft rounds capture sizes up to a multiple of 0: candidate building raises "
                   "ZeroDivisionError on a valid configuration, as the upstream engine did at start-up",
                   (Patch(f"{_GRAPHS}:decode_widths", "{d + n_new for d in depths if d + n_new > 0}",
                          "{d + n_new for d in depths}"),),
                   oracles={"cpu": "crash", "cuda": "crash"}, families=("zero_width_band",)),
            Mutant("dispatch-fewer-requests", "the request test of dispatch is flipped (<=): a varlen graph with "
                   "fewer requests than the batch is replayed",
                   (Patch(f"{_GRAPHS}:_fits", "desc.num_reqs >= num_reqs", "desc.num_reqs <= num_reqs"),),
                   oracles=_EVERYWHERE, families=("varlen", "dsd_schedule")),
            Mutant("prefill-replays-decode-graph", "a batch still prefilling keeps its uniform width, so prompt "
                   "chunks shaped like decode replay a FULL decode graph (upstream vllm#49918)",
                   (Patch(f"{_GRAPHS}:dispatch", "if has_prefill:", "if False:"),),
                   oracles=_EVERYWHERE, families=("prefill",)),
            Mutant("capture-size-rounded-down", "capture sizes rounded down to whole requests: graphs smaller "
                   "than the size, and 0-request graphs below one width",
                   (Patch(f"{_GRAPHS}:_round_up", "(n + multiple - 1) // multiple * multiple",
                          "n // multiple * multiple"),),
                   oracles=_EVERYWHERE, families=("basic", "dsd_schedule")),
        ),
    ),
    _host_check(
        "spec.depth", "a scheduled depth of 0 stays 0 and limits drafts to a zero-width view (fix 7); "
                      "acceptance-length controllers per DSD band",
        host.depth_outcomes, reference.spec.depth,
        {**depth_families.FAMILIES, "refused": refusals.DEPTH}, host.records_agree,
        (
            Mutant("depth-or-default", "fix 7, pre-fix (docs/fixes.md#fix-7): the depth is resolved as `value or "
                                       "default`, so a "
                   "scheduled 0 becomes K",
                   (Patch(f"{_DEPTH}:resolve_num_spec_tokens", "default if value is None else value",
                          "value or default"),),
                   oracles=_EVERYWHERE, families=("resolve", "disable_drafting")),
            Mutant("limit-refuses-zero", "fix 7, pre-fix (docs/fixes.md#fix-7): limit_draft_tokens has no depth-0 "
                                         "branch and "
                   "refuses 0 like any depth outside 1..k_max",
                   (Patch(f"{_DEPTH}:limit_draft_tokens", "if n == 0:", "if False:"),),
                   oracles=_EVERYWHERE, families=("limit", "disable_drafting")),
            Mutant("rises-to-target", "the controller jumps straight up to a higher target instead of one step per "
                   "window",
                   (Patch(f"{_DEPTH}:AcceptanceLengthController", "self.depth += 1", "self.depth = target"),),
                   oracles=_EVERYWHERE, families=("controller", "bands")),
        ),
    ),
    _host_check(
        "spec.backends", "backend priorities and graph claims by capability and causality: non-causal drafts never "
                         "claim full graphs or FlashInfer first on SM100 (fix 6)",
        host.backend_outcomes, reference.spec.backends,
        {**backend_families.FAMILIES, "refused": refusals.BACKENDS},
        host.records_agree,
        (
            NON_CAUSAL_CLAIMS_FULL,
            Mutant("sm100-non-causal-prefers-flashinfer", "fix 6, pre-fix (docs/fixes.md#fix-6): SM100 puts "
                                                          "FlashInfer first "
                   "whatever the causality, so non-causal drafts auto-select its cutlass path",
                   (Patch(f"{_BACKENDS}:backend_priorities", "if capability_major == 10 and not non_causal:",
                          "if capability_major == 10:"),),
                   oracles=_EVERYWHERE, families=("sm100_non_causal",)),
            Mutant("no-layer-types-causal", "a DFlash config without layer types is taken as causal, so its "
                   "non-causal draft claims FlashInfer's full graphs",
                   (Patch(f"{_BACKENDS}:_causal", "bool(types) and types[layer]", "not types or types[layer]"),),
                   oracles=_EVERYWHERE),
        ),
    ),
)

_KV = "kernels.kv_cache:_write_kv_kernel"
PAD_WRITTEN = Mutant(
    "pad-written", "PAD tokens (slot -1) are stored: the row before each cache is overwritten",
    (Patch(_KV, "store = live & (slot >= 0)  # PAD writes nothing", "store = live"),),
    oracles={"cpu": "oob", "cuda": "oob"}, families=("pad",))

KV_CACHE_CHECKS = (
    Check(
        name="kv_cache.write",
        contract="k_cache and v_cache[slot // bs, slot % bs] = key and value[t], bit for bit, for each token whose "
                 "slot is not PAD",
        kernel=kv_families.write_kv_pair,  # kernels.kv_cache.write_kv on the halves of one combined cache
        reference=kv_families.write_kv_pair_reference,
        families={**kv_families.FAMILIES, "refused": refusals.WRITE_KV},
        outputs=("kv_cache",),
        compare=exact_chunked,
        sweep=kv_families.sweep,
        mutants=(
            PAD_WRITTEN,
            # the same bug with no guard zones: the write before the K cache leaves its allocation
            dataclasses.replace(PAD_WRITTEN, name="pad-written-memcheck", oracles={"cuda": "memcheck"},
                                why_not="compute-sanitizer runs on the GPU; the CPU tracer kills pad-written"),
            Mutant("int32-offset", "the V-cache row offset is computed in int32: past 2^31 elements it wraps into "
                   "the K cache below it",
                   (Patch(_KV, "v_row = block * v_stride_b + offset * v_stride_t",
                          "v_row = (block * v_stride_b + offset * v_stride_t).to(tl.int32)"),),
                   oracles={"cuda": "divergence"}, families=("big_cache",),
                   why_not="needs a cache past 2^31 elements, big_cache's GPU-only size; a CPU-sized cache cannot "
                           "overflow int32 offsets"),
        ),
    ),
)

_ATT = "kernels.attention:_paged_attention_kernel"

ATTENTION_CHECKS = (
    Check(
        name="attention.paged",
        contract="each batch row's queries (its last tokens) attend over its paged KV, causal or not, with GQA; "
                 "error within twice a float32 baseline's",
        kernel=kernels.attention.paged_attention,
        reference=attention_families.judged(reference.attention.paged_attention, ("v_cache",)),
        families={**attention_families.FAMILIES, "refused": refusals.PAGED_ATTENTION},
        outputs=("out",),
        compare=within_float32_baseline,
        sweep=attention_families.sweep,
        # the tile fallback on a device smaller than any that runs the families (an H200 fits the earlier rungs)
        unit_tests=("tests/test_attention.py::test_fitting_tiles_halve_keys_then_rows_down_to_a_group",
                    "tests/test_attention.py::test_tiles_that_overflow_shared_memory_fall_back"),
        mutants=(
            Mutant("causal-off-by-one", "causal queries stop one key short of their own position",
                   (Patch(_ATT, "(pos[None, :] <= last_key[:, None])", "(pos[None, :] < last_key[:, None])"),),
                   oracles=_EVERYWHERE, families=("edges", "multi_query")),
            Mutant("non-causal-as-causal", "non-causal (DFlash draft) queries get the causal mask",
                   (Patch(_ATT, "tl.where(causal != 0,", "tl.where(causal >= 0,"),),
                   oracles=_EVERYWHERE, families=("multi_query",)),
            Mutant("gqa-head-mapping", "query head h reads KV head h % H_kv instead of h // group",
                   (Patch(_ATT, "q_head = kv_head * group + rows % group  # query head h reads KV head h // group",
                          "q_head = rows % group * (num_q_heads // group) + kv_head"),),
                   oracles=_EVERYWHERE, families=("gqa",)),
            Mutant("empty-cache-accepted", "the return for a cache of no blocks comes before the index check "
                   "(pre-fix): sequences that reach a block of an empty cache are accepted and nothing is written",
                   (Patch("kernels.attention:paged_attention", "    if num_batch_rows == 0 or num_tokens == 0:\n",
                          "    if num_batch_rows == 0 or num_tokens == 0 or k_cache.numel() == 0:\n"),),
                   oracles={"cpu": "accepted"}, families=("refused",),
                   why_not="a GPU launch reads block ids back only with SPECSAN_CHECK_INDICES=1, so its refused "
                           "cases leave this corruption out"),
            Mutant("block-size-0-accepted", "a cache of block size 0 is not refused up front (pre-fix): the CPU "
                   "refuses its sequences through seq_lens, naming the wrong argument; a GPU launch (which reads "
                   "no index back) compiles BLOCK_SIZE = 0 and returns, accepted",
                   (Patch("kernels.attention:paged_attention", "    if k_cache.shape[1] == 0:\n", "    if False:\n"),),
                   oracles={"cpu": "refusal", "cuda": "accepted"}, families=("refused",)),
            Mutant("own-tiles-only", "the launcher launches its own tiles only (pre-fix): where they overflow the "
                   "GPU's shared memory (head dim 512 under 16-query drafts, 256 under a group past 128) Triton "
                   "raises OutOfResources",
                   (Patch("kernels.attention:paged_attention", "rows_forced=block_m is not None,\n"
                          "                          keys_forced=block_n is not None)",
                          "rows_forced=True, keys_forced=True)"),),
                   oracles={"cuda": "crash"}, families=("overflowing_tiles",),
                   why_not="the interpreter has no shared-memory limit: every tile fits"),
            Mutant("no-tile-fits-unnamed", "a shape no tile fits escapes as Triton's OutOfResources instead of a "
                   "ValueError naming query",
                   (Patch("kernels.attention:paged_attention",
                          "            if block_m is not None or block_n is not None:\n", "            if True:\n"),),
                   oracles={"cuda": "refusal"}, families=("refused",),
                   why_not="the interpreter has no shared-memory limit, so the refused family leaves this shape "
                           "out on the CPU"),
            Mutant("minus-inf-rows-nan", "a query whose every visible key scores -inf divides 0 by 0 (NaN) instead "
                   "of getting zeros, in one split and in the combine",
                   (Patch(_ATT, "o = acc / tl.where(l_i > 0, l_i, 1.0)", "o = acc / tl.where(l_i >= 0, l_i, 1.0)"),
                    Patch("kernels.attention:_combine_splits_kernel", "o = acc / tl.where(l_sum > 0, l_sum, 1.0)",
                          "o = acc / tl.where(l_sum >= 0, l_sum, 1.0)")),
                   oracles=_EVERYWHERE, families=("infinite_keys", "infinite_keys_split")),
        ),
    ),
    Check(
        name="attention.prefix_masked",
        contract="a draft step over a restored prefix attends only to KV the draft computed: never-written KV stays "
                 "out of sight (fix 4)",
        kernel=attention_families.prefix_masked_draft,  # drives the production kernels of one draft step
        reference=attention_families.judged(reference.attention.prefix_masked_draft,
                                            ("v_cache", "context_value", "query_value")),
        families=attention_families.PREFIX_FAMILIES,
        outputs=("out", "k_cache", "v_cache", "block_table"),
        compare=within_float32_baseline,
        sweep=attention_families.sweep,
        mutants=(
            Mutant("restored-blocks-visible", "fix 4, pre-fix (docs/fixes.md#fix-4): no block-table shift and "
                                              "seq_lens not "
                   "shortened, so draft attention reads the restored prefix's never-written KV (NaN)",
                   (Patch(_DI, "(tl.load(num_cached_tokens_ptr + slot) // block_size) * block_size",
                          "tl.load(num_cached_tokens_ptr + slot) * 0"),
                    Patch(f"{_BT}:_shift_rows_kernel", "shift = num_cached // block_size", "shift = num_cached * 0")),
                   oracles=_EVERYWHERE),
        ),
    ),
)

_DRAFT_GRAPHS = "kernels.spec.draft_graphs:DraftGraphs"
_STEP = "kernels.spec.draft_step:DraftStep"
_NO_GRAPHS = "CUDA graphs need a GPU: capture, replay and the graph memory pool exist only on a CUDA device"
_ON_GPU = {"cuda": "divergence"}
# measured on the H200: with the caching allocator off, capture fails with cudaErrorStreamCaptureInvalidated
_GRAPHS_UNCACHED = ("CUDA graph capture needs the caching allocator's private pool, which "
                    "PYTORCH_NO_CUDA_MEMORY_CACHING=1 (what makes an out-of-bounds access visible) turns off")


def _graph_check(name: str, contract: str, driver, reference_driver, families: dict, judge, mutants: tuple[Mutant, ...],
                 unit_tests: tuple[str, ...] = ()) -> Check:
    """A GPU-only check whose ``driver`` (stress.oracles.graph_replay) captures and replays kernels.spec.draft_graphs;
    each case replays its graphs many times already, so it runs once."""
    return Check(name=name, contract=contract, kernel=driver, reference=reference_driver, families=families,
                 outputs=(RETURN,), compare=judge, devices=("cuda",), why_not=_NO_GRAPHS, repeats={"cuda": 1},
                 mutants=mutants, not_sanitized=_GRAPHS_UNCACHED, unit_tests=unit_tests)


GRAPH_CHECKS = (
    _graph_check(
        "graphs.replay", "a padded CUDA-graph replay of the draft step equals the eager step bit for bit, and the "
                         "eager step the float64 reference (GPU)",
        stress.oracles.graph_replay.replay_draft_graphs, reference.spec.draft_step.expected_replay,
        replay_families.REPLAY_FAMILIES, stress.oracles.graph_replay.judge_replay,
        (
            Mutant("replay-skipped", "a graph that does nothing: the dispatched graph is never replayed",
                   (Patch(_DRAFT_GRAPHS, "graph.replay()", "pass"),), oracles=_ON_GPU, why_not=_NO_GRAPHS),
            Mutant("kv-write-not-captured", "the capture misses a kernel: the query rows' K/V write runs eagerly "
                   "but is left out of the graph",
                   (Patch(_STEP, "kv_cache.write_kv(", "capturing() or kv_cache.write_kv("),),
                   oracles=_ON_GPU, why_not=_NO_GRAPHS),
            Mutant("padded-draft-rows-slot-0", "fix 3, pre-fix (docs/fixes.md#fix-3) in the draft step: padded "
                                               "sampling rows map to "
                   "slot 0 and write its logits cache",
                   (Patch(_STEP, "buf.sample_idx_mapping[:num_rows], self.temperature",
                          "buf.sample_idx_mapping[:num_rows].clamp(min=0), self.temperature"),),
                   oracles=_ON_GPU, families=("padded_graph",), why_not=_NO_GRAPHS),
            # the spec.backends patch, hunted where its effect shows: host-planned attention captured for
            # non-causal drafting replays with the lengths of the capture batch
            dataclasses.replace(NON_CAUSAL_CLAIMS_FULL, oracles=_ON_GPU, families=("non_causal_draft",),
                                why_not=_NO_GRAPHS),
        ),
        # the backends on rows no draft step builds for the host-planned loop: queries without keys, keys
        # without queries, a single key
        unit_tests=("tests/test_draft_graphs.py::"
                    "test_each_backend_attends_like_the_reference_on_rows_without_keys_or_queries",),
    ),
    _graph_check(
        "graphs.lifetime", "a captured graph's backbone output is not handed to a later capture in the shared pool "
                           "(fix 8, GPU)",
        stress.oracles.graph_replay.lifetime_experiment, reference.spec.draft_step.expected_lifetime,
        replay_families.LIFETIME_FAMILIES, stress.oracles.graph_replay.judge_lifetime,
        (
            Mutant("backbone-not-retained", "fix 8, pre-fix (docs/fixes.md#fix-8): captured backbone outputs are "
                                            "not retained, so "
                   "a later capture in the shared pool is handed their memory",
                   (Patch(_DRAFT_GRAPHS, "self._captured_backbone_outputs.append(hidden)", "pass"),),
                   oracles=_ON_GPU, why_not=_NO_GRAPHS),
        ),
    ),
)

_ENGINE = "kernels.spec.engine:Engine"

ENGINE_CHECKS = (
    Check(
        name="engine.step",
        contract="the whole spec-decode step, every recorded field against a reference engine after every step, "
                 "plus the step's own invariants",
        kernel=engine_check.run_engine,  # drives the production kernels.spec.engine.Engine step by step
        reference=engine_check.reference,
        families={**engine_families.FAMILIES, "refused": refusals.ENGINE},
        outputs=(RETURN,),
        compare=engine_check.compare,
        metrics=engine_check.metrics,
        repeats={"cpu": 1, "cuda": 2},
        unreachable=engine_check.UNREACHABLE,
        path_families=engine_check.PATH_FAMILIES,
        iteration_share=engine_check.ITERATION_SHARE,
        # the scheduler alone against the reference's, over 40 workloads of random outcomes: far more shapes of
        # admission, eviction and preemption than engine cases can afford; the model config's refusals; the
        # KV guards' own check, which no production run trips
        unit_tests=("tests/test_engine.py::test_engine_and_reference_schedulers_agree",
                    "tests/test_engine.py::test_prefix_cache_hits_full_blocks_and_evicts_in_free_order",
                    "tests/test_engine.py::test_a_model_config_refuses_an_odd_head_dim_naming_it",
                    "tests/test_engine.py::test_guards_intact_sees_a_write_to_a_guard_or_the_null_block"),
        not_sanitized="a whole-path check: its kernels are sanitized through their own checks, and its graph "
                      "families need the caching allocator (" + _GRAPHS_UNCACHED + ")",
        mutants=(
            Mutant("prefix-blocks-visible", "fix 4, pre-fix (docs/fixes.md#fix-4): no restored counts reach the "
                                            "draft: seq_lens not "
                   "shortened, no shift, no fail-closed; the draft reads never-written (NaN) KV",
                   (Patch(_ENGINE, "torch.from_numpy(self.slots.num_cached_tokens).to(self.device)",
                          "torch.zeros_like(torch.from_numpy(self.slots.num_cached_tokens)).to(self.device)"),),
                   oracles=_EVERYWHERE, families=("shared_prefix", "preempt_resume", "unaligned_prefix")),
            Mutant("refused-batch-skips-context-kv", "upstream order: a batch that drafts nothing (refused for an "
                   "unaligned prefix, or at depth 0) returns before its context KV is written, so later drafts "
                   "read never-written KV",
                   (Patch(_ENGINE, "        self.model.write_context_kv(",
                          "        prepared and self.model.write_context_kv("),),
                   oracles=_EVERYWHERE, families=("unaligned_prefix", "dsd_bands")),
            # the step's own invariants (stress.oracles.engine_invariants), each killing a slip that no recorded field
            # shows until a workload happens to make it decide something
            Mutant("free-count-per-hit-twice", "the target pool's free count for an admission takes two blocks "
                   "per unreferenced cache hit: admission refuses too early only when it is tight to that block",
                   (Patch("kernels.spec.scheduler:PrefixCachingPool", "sum(1 for b in hits if self.refs[b] == 0)",
                          "sum(2 for b in hits if self.refs[b] == 0)"),),
                   oracles={"cpu": "accounting", "cuda": "accounting"}, families=("preempt_resume",)),
            Mutant("one-request-drafts-nothing", "a batch of one request runs no draft step through DraftGraphs "
                   "(the empty-batch test reads num_reqs == 1)",
                   (Patch(_DRAFT_GRAPHS, "if num_draft_tokens == 0 or num_reqs == 0:",
                          "if num_draft_tokens == 0 or num_reqs == 1:"),),
                   oracles={"cpu": "drafts", "cuda": "drafts"}, families=("padded_graphs",)),
            # host slips that equal model sizes or one feature at a time hide: the combined family, whose sizes all
            # differ and whose features meet, kills them (host code: the same on the GPU)
            Mutant("scale-from-hidden", "attention scaled by 1/sqrt(hidden / heads) instead of the model's "
                   "1/sqrt(head_dim): the same number whenever head_dim == hidden / heads",
                   (Patch("kernels.spec.models:Model", "math.sqrt(config.head_dim)",
                          "math.sqrt(config.hidden // config.heads)"),),
                   oracles=_EVERYWHERE, families=("combined",)),
            Mutant("depth-by-running-count", "the step's depth looked up for every running request instead of the "
                   "batch's rows: the same unless the token budget leaves running requests out of a DSD step",
                   (Patch(_ENGINE, "step_depth = self._depth(len(batch))",
                          "step_depth = self._depth(len(self.scheduler.running))"),),
                   oracles={"cpu": "drafts", "cuda": "drafts"}, families=("combined",)),
            Mutant("drafts-past-the-limit", "a request keeps one draft more than the room left before max_model_len: "
                   "the next step's budget cut or the request's finish usually hides it",
                   (Patch(_ENGINE, "req.drafts = [t for t in row if t >= 0][:room]",
                          "req.drafts = [t for t in row if t >= 0][:room + 1]"),),
                   oracles={"cpu": "drafts", "cuda": "drafts"}, families=("combined", "long_context")),
            Mutant("evicted-block-still-cached", "a target block popped from the free queue keeps its prefix-cache "
                   "entry: a later hit restores KV another request has overwritten",
                   (Patch("kernels.spec.scheduler:PrefixCachingPool", "del self.block_of[key]", "pass"),),
                   oracles={"cpu": "kv", "cuda": "kv"}, families=("combined", "prefix_chain", "crowded_preemption")),
            Mutant("draft-graphs-never-captured", "the engine builds its draft graphs but never captures them: "
                   "every step dispatched to a FULL graph drafts the same tokens eagerly, without the replay",
                   (Patch(_ENGINE, "self.graphs.capture()", "self.graphs.clear()"),),
                   oracles={"cuda": "graphs"}, families=("padded_graphs",),
                   why_not="CUDA graphs exist only on a GPU: the CPU drafts eagerly, nothing is captured"),
        ),
    ),
)

REGISTRY: tuple[Check, ...] = (BLOCK_TABLE_CHECKS + DRAFT_INPUT_CHECKS + SLOT_CHECKS + SAMPLING_CHECKS
                                 + REJECTION_CHECKS + HOST_CHECKS + KV_CACHE_CHECKS + ATTENTION_CHECKS
                                 + GRAPH_CHECKS + ENGINE_CHECKS)
BY_NAME = {check.name: check for check in REGISTRY}


def find_mutant(name: str, check: Check) -> Mutant:
    """``check``'s planted bug ``name``; a whole-path check (``unreachable`` set) also takes any other's.
    A generated mutant's id (``stress.mutate.operators``) names its own patch and applies to any check."""
    from stress.mutate import operators as mutate_ops

    if name.startswith(mutate_ops.PREFIX):
        return mutate_ops.resolve(name)
    if check.unreachable is None or any(m.name == name for m in check.mutants):
        return check.mutant(name)
    for other in REGISTRY:
        if any(m.name == name for m in other.mutants):
            return other.mutant(name)
    raise ValueError(f"mutant {name!r} is not planted in any check; `python -m stress list` shows them")


def get(name: str) -> Check:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"check {name!r} is not registered; `python -m stress list` shows the checks") from None
