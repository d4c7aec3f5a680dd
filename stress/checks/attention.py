"""Registry entries of attention.paged and attention.prefix_masked: paged draft attention."""


import dataclasses

import torch

import kernels.attention
import kernels.block_table
import kernels.draft_inputs
import reference.attention
from stress.checks.common import EVERYWHERE, unreachable_by_engine
from stress.checks.profiles import CAUSAL_ONLY, FINITE_ATTENTION, NO_REFUSALS
from stress.core.compare import within_float32_baseline
from stress.core.types import Check, Mutant, Patch, Reach
from stress.families import attention as attention_families
from stress.families.ignored import Region, past, poisoned, whole_rows
from stress.families.refusals import (
    Corruption,
    emptied,
    moved,
    past_bound,
    qsl_rows,
    refusal_family,
    replaced,
    resized,
    retyped,
    rows_short_of,
    short,
)

_DI = "kernels.draft_inputs:_prepare_draft_inputs_kernel"
_BT = "kernels.block_table"
_ATT = "kernels.attention:_paged_attention_kernel"
# non-finite scores, from the whole step's side
_FINITE_IN_THE_ENGINE = unreachable_by_engine(
    "the engine's models give finite queries and keys of moderate size: no score is NaN or infinite")


# ---------------------------------------------------------------- refusals

def _query_tokens(inputs: dict) -> int:
    return inputs["query"].shape[0]


def _attended_rows(inputs: dict) -> torch.Tensor:
    """The batch rows query_start_loc describes (rows past them are never read)."""
    return torch.arange(inputs["seq_lens"].numel()) < inputs["query_start_loc"].numel() - 1


def _row_capacity(inputs: dict) -> int:
    """One past the longest sequence a block-table row holds (the bound of seq_lens)."""
    return inputs["block_table"].shape[1] * inputs["k_cache"].shape[1] + 1


def _reached_blocks(inputs: dict) -> torch.Tensor:
    """The block-table entries a batch row's sequence reaches: its first cdiv(seq_len, block_size) columns."""
    table, rows = inputs["block_table"], inputs["query_start_loc"].numel() - 1
    reached = torch.zeros(table.shape, dtype=torch.bool)
    reached[:rows] = attention_families.reached_columns(inputs["seq_lens"][:rows], table.shape[1],
                                                        inputs["k_cache"].shape[1])
    return reached


def _unread_queries(inputs: dict) -> torch.Tensor:
    """Query rows no batch row reads: outside every row's span, or in a row with no key."""
    starts, seq_lens = inputs["query_start_loc"].long(), inputs["seq_lens"]
    read = torch.zeros(inputs["query"].shape[0], dtype=torch.bool)
    for batch_row in range(starts.numel() - 1):
        if seq_lens[batch_row] > 0:
            read[starts[batch_row]:starts[batch_row + 1]] = True
    return ~read


def paged_ignored(inputs: dict) -> list[Region]:
    """Block-table entries no sequence reaches (rows past the batch included), seq_lens past the batch, and the
    query rows no batch row attends with."""
    rows = inputs["query_start_loc"].numel() - 1
    return [Region("block_table", ~_reached_blocks(inputs)),
            Region("seq_lens", past(rows, inputs["seq_lens"].numel())),
            Region("query", whole_rows(_unread_queries(inputs), inputs["query"]))]


def _unfittable(rng, device, launch):
    """Decode rows of 130 float32 query heads per KV head at head dim 256: a program holds a whole group (256
    rows), whose query tile alone (256 KiB) passes a GPU's shared memory (227 KiB on an H200; the launcher's
    own tiles here ask 353 KiB)."""
    return attention_families.attention_case(rng, query_lens=[1, 1],
                                             seq_lens=[int(rng.integers(1, 40)) for _ in range(2)], kv_heads=1,
                                             group=130, head_dim=256, block_size=16, dtype=torch.float32,
                                             causal=bool(rng.integers(2)), note="no tile fits")


def _small_decode(rng, device, launch):
    """``decode`` at the interpreter's size whatever the device."""
    return attention_families.decode(rng, "cpu", launch)


def _heads_off_group(rng, inputs):
    """Caches of twice their KV heads (an even count) under a query and out of one head past twice theirs (an odd
    count): no whole GQA group per KV head, where everything else agrees."""
    for name in ("k_cache", "v_cache"):
        inputs[name] = torch.cat([inputs[name]] * 2, 2)
    for name in ("query", "out"):
        inputs[name] = torch.cat([inputs[name], inputs[name], inputs[name][:, :1]], 1)


def _offset_past_query_within_out(rng, inputs):
    """The last query offset one past the queries, under an out two rows longer than query (out [>= T] is
    allowed): offsets are bounded by query's rows, never by out's."""
    out = inputs["out"]
    inputs["out"] = torch.cat([out, out.new_zeros((2, *out.shape[1:]))])
    starts = inputs["query_start_loc"].clone()
    starts[-1] = inputs["query"].shape[0] + 1
    inputs["query_start_loc"] = starts


def _v_cache_row_padded(rng, inputs):
    """The V cache as a row-padded view: k_cache's shape and a unit innermost stride, in another layout."""
    v = inputs["v_cache"]
    inputs["v_cache"] = torch.cat([v, v], -1)[..., :v.shape[-1]]


def _seq_len_past_row_of_long_batch(rng, inputs):
    """A live row's sequence one past its block-table row, in a batch of more rows than the table has columns (empty
    batch rows added: no query, no key): the bound is a row's width in tokens, never the batch's row count."""
    live = _attended_rows(inputs).nonzero().flatten()
    if live.numel() == 0:
        return False
    table, starts, seq_lens = inputs["block_table"], inputs["query_start_loc"], inputs["seq_lens"]
    rows = starts.numel() - 1
    extra = max(0, table.shape[1] + 1 - rows)
    inputs["block_table"] = torch.cat([table[:rows], table.new_zeros((extra, table.shape[1]))])
    inputs["query_start_loc"] = torch.cat([starts, starts[-1:].expand(extra)])
    seq_lens = torch.cat([seq_lens[:rows], seq_lens.new_zeros(extra)])
    seq_lens[int(live[int(rng.integers(live.numel()))])] = _row_capacity(inputs)
    inputs["seq_lens"] = seq_lens
    return True


PAGED_ATTENTION_REFUSALS = refusal_family(attention_families.decode, (
    retyped("out", torch.float16, torch.float32),
    retyped("k_cache", torch.float16, torch.float32),
    retyped("query", torch.float16, torch.float32),  # unlike the caches and out: named itself
    *resized("v_cache", 0, (-1, 1), "v_cache one block off k_cache"),
    *resized("query", 2, (-1, 1), "query one head dim off the caches", refused="k_cache"),
    emptied({"k_cache": 2, "v_cache": 2}, "caches without KV heads", refused="query"),
    emptied({"k_cache": 1, "v_cache": 1}, "caches of block size 0", refused="k_cache"),
    # refused through the block ids, checked as indices (on a GPU only with SPECSAN_CHECK_INDICES=1)
    emptied({"k_cache": 0, "v_cache": 0}, "caches of no blocks under sequences that reach one", refused="block_table",
            on_gpu=False),
    *resized("out", 0, (rows_short_of(_query_tokens),), "out one row short of the queries"),
    *resized("out", 1, (-1, 1), "out one head off the query"),
    *short("block_table", qsl_rows, "the batch"),
    *short("seq_lens", qsl_rows, "the batch"),
    *replaced("scale", (float("nan"), float("inf"), "0.125", True, None), "scale not a finite float"),
    past_bound("query_start_loc", lambda i: i["query"].shape[0] + 1, "a query offset past the queries"),
    past_bound("seq_lens", _row_capacity, "a sequence longer than its block-table row", live=_attended_rows),
    past_bound("block_table", lambda i: i["k_cache"].shape[0], "a block id a sequence reaches, past the cache",
               live=_reached_blocks),
    # well formed, but more than the GPU holds: no program of whole groups fits its shared memory
    Corruption("query", "130 float32 query heads per KV head at head dim 256", lambda rng, inputs: None,
               valid=_unfittable, on_cpu=False),
    *moved("query", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc", "out"),
    # what only the argument's own validation refuses: no later guard looks at its dtype, its emptiness or the knob
    # (on a case of the interpreter's size on every device: a refusal reads no value, so GPU-sized inputs buy nothing)
    *(dataclasses.replace(c, valid=_small_decode) for c in (
        retyped("query_start_loc", torch.int64),
        emptied({"query_start_loc": 0}, "query_start_loc without entries (not even the batch's start)",
                refused="query_start_loc"),
        *replaced("block_n", (8,), "block_n below the smallest matrix-product tile"))),
    # each of a two-part guard's parts on its own (appended: the cases above keep their draws)
    Corruption("query", "query heads no whole number of groups over the caches' KV heads", _heads_off_group),
    *resized("out", 2, (-1, 1), "out one head dim off the query"),
    Corruption("v_cache", "v_cache of k_cache's shape as a row-padded view (other strides)", _v_cache_row_padded),
    # checked as an index (on a GPU only with SPECSAN_CHECK_INDICES=1)
    Corruption("query_start_loc", "the last query offset past the queries, within a longer out",
               _offset_past_query_within_out, on_gpu=False),
    Corruption("seq_lens", "a sequence longer than its block-table row, in a batch of more rows than the table's "
               "columns", _seq_len_past_row_of_long_batch, on_gpu=False),
), "paged_attention")


CHECKS = (
    Check(
        name="attention.paged",
        contract="each batch row's queries (its last tokens) attend over its paged KV, causal or not, with GQA; "
                 "error within twice a float32 baseline's",
        choices={"causal-only": CAUSAL_ONLY, "finite-attention": FINITE_ATTENTION, "no-refusals": NO_REFUSALS},
        kernel=kernels.attention.paged_attention,
        reference=attention_families.judged(reference.attention.paged_attention, ("v_cache",),
                                            rounding=attention_families.score_rounding),
        families={**attention_families.FAMILIES, "refused": PAGED_ATTENTION_REFUSALS,
                  "ignored_poisoned": poisoned(attention_families.edges, paged_ignored)},
        outputs=("out",),
        compare=within_float32_baseline,
        sweep=attention_families.sweep,
        # the tile fallback on a device smaller than any that runs the families (an H200 fits the earlier rungs)
        unit_tests=("tests/test_attention.py::test_fitting_tiles_halve_keys_then_rows_down_to_a_group",
                    "tests/test_attention.py::test_tiles_that_overflow_shared_memory_fall_back"),
        mutants=(
            Mutant("causal-off-by-one", "causal queries stop one key short of their own position",
                   (Patch(_ATT, "(pos[None, :] <= last_key[:, None])", "(pos[None, :] < last_key[:, None])"),),
                   oracles=EVERYWHERE, families=("edges", "multi_query")),
            Mutant("non-causal-as-causal", "non-causal (DFlash draft) queries get the causal mask",
                   (Patch(_ATT, "tl.where(causal != 0,", "tl.where(causal >= 0,"),),
                   oracles=EVERYWHERE, families=("multi_query",)),
            Mutant("gqa-head-mapping", "query head h reads KV head h % H_kv instead of h // group",
                   (Patch(_ATT, "q_head = kv_head * group + rows % group  # query head h reads KV head h // group",
                          "q_head = rows % group * (num_q_heads // group) + kv_head"),),
                   oracles=EVERYWHERE, families=("gqa",),
                   path=Reach(families=("combined",))),
            Mutant("even-d-by-alignment", "the launcher drops the head-dim mask for any head dim that is a multiple "
                   "of 16 instead of one that fills its tile: at 48 (tile 64) loads and stores run 16 dims into "
                   "the next head",
                   (Patch("kernels.attention:_launch", "EVEN_D=head_dim == block_d", "EVEN_D=head_dim % 16 == 0"),),
                   oracles=EVERYWHERE, families=("head_dim_48",),
                   path=unreachable_by_engine(
                       "the engine's head dims (16 and 32, 6 to 40 in its shape families) hold no multiple of 16 "
                       "that is not a power of two")),
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
                   oracles=EVERYWHERE, families=("infinite_keys", "infinite_keys_split")),
            Mutant("combine-minus-inf-rows-nan", "the combine pass alone divides a query's weighted sum by its "
                   "zero total where every split saw only -inf scores (NaN) instead of writing zeros: a launch of "
                   "one split per row never runs the combine and cannot show it",
                   (Patch("kernels.attention:_combine_splits_kernel", "o = acc / tl.where(l_sum > 0, l_sum, 1.0)",
                          "o = acc / l_sum"),),
                   oracles=EVERYWHERE, families=("infinite_keys_split",)),
            Mutant("nan-score-masked", "a NaN score is masked like a key out of sight (no weight) instead of making "
                   "its row NaN",
                   (Patch(_ATT, 's = tl.where(visible, s, float("-inf"))',
                          's = tl.where(visible & (s == s), s, float("-inf"))'),),
                   oracles=EVERYWHERE, families=("nonfinite_keys", "nonfinite_keys_split"), path=_FINITE_IN_THE_ENGINE),
            Mutant("combine-drops-nan-partial", "the combine skips a split whose sum is NaN (it tests l > 0, not "
                   "l != 0): a NaN or +inf score in one split no longer reaches the output",
                   (Patch("kernels.attention:_combine_splits_kernel", "seen = live & (l_s != 0)",
                          "seen = live & (l_s > 0)"),),
                   oracles=EVERYWHERE, families=("nonfinite_keys_split",), path=_FINITE_IN_THE_ENGINE),
            Mutant("combine-reads-unseen-splits", "the combine loads every live row's partial output, also of a "
                   "split that saw no key and so never wrote it: its weight is 0, but 0 times the NaN the CPU run "
                   "leaves in unwritten scratch is NaN",
                   (Patch("kernels.attention:_combine_splits_kernel", "mask=seen[:, None], other=0.0)",
                          "mask=live[:, None], other=0.0)"),),
                   oracles={"cpu": "divergence"}, families=("two_splits", "wide_table"),
                   why_not="the GPU run does not fill unwritten scratch (stress.core.guards.scratch_poisoned): what "
                           "the allocator left in the partials decides, and that has not been measured there"),
            Mutant("indices-checked-past-batch", "the launcher's index check reads every block-table and seq_lens "
                   "row, also those past the batch (it forgets the [:B] slices): what a larger batch left there "
                   "refuses a valid call",
                   (Patch("kernels.attention:paged_attention",
                          "_check_indices(query_start_loc, block_table[:num_batch_rows], seq_lens[:num_batch_rows],",
                          "_check_indices(query_start_loc, block_table, seq_lens,"),),
                   oracles={"cpu": "crash"}, families=("ignored_poisoned",),
                   why_not="the GPU launcher reads no index back (SPECSAN_CHECK_INDICES unset), so nothing refuses",
                   path=unreachable_by_engine("the engine hands attention its padded batch's rows only, none past it")),
        ),
    ),
    Check(
        name="attention.prefix_masked",
        contract="a draft step over a restored prefix attends only to KV the draft computed: never-written KV stays "
                 "out of sight (fix 4)",
        kernel=attention_families.prefix_masked_draft,  # drives the production kernels of one draft step
        judges=("draft_inputs.prepare", "kv_cache.write", "block_table.shift", "attention.paged"),
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
                   oracles=EVERYWHERE),
        ),
    ),
)
