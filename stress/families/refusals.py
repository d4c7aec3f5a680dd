"""Refusal families: valid cases of a check, each with one corruption its launcher must refuse (``Case.refused``).

Each ``Corruption`` is applied to a fresh valid case, so the rest of the input is valid and the guard under
test is the one that must fire; ``stress.core.refusal`` judges each. A case holds one such refusal per corruption
of its family (``Case.more_refusals``): refusals launch no kernel and cost little, and so every case tries
every guard (one drawn corruption per case would leave most guards untried in a three-case hunt). The one
exception is attention's shape that no tile fits: the launcher learns that from Triton's failed compiles
(one per tile rung), so on a GPU its refusal costs compile time in every worker that has not compiled it. Bounds
are hit exactly where the guard compares (one past the last slot, one row short), where a flipped ``>=``
shows.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from kernels import validate
from kernels.spec.backends import LAYER_TYPES
from stress.core.types import Case
from stress.families import attention, engine, graphs, kv_cache, rejection, sampling, slots
from stress.families import block_table as bt
from stress.families import draft_inputs as di
from stress.families.common import pick
from stress.families.depth import draft_columns

TRIES = 20  # valid cases drawn until one the corruption applies to (e.g. one with a live batch row)


@dataclass(frozen=True)
class Corruption:
    """``apply(rng, inputs)`` corrupts ``inputs`` (a dict it may change) in place, or returns False when this
    valid case has nothing to corrupt; the launcher must then refuse naming ``refused``."""

    refused: str
    what: str
    apply: Callable[[np.random.Generator, dict], bool | None]
    valid: Callable | None = None  # the valid family it corrupts, where not the refusal family's own
    # False: an index value the launcher checks through kernels.validate.indices/offsets, which on a GPU read
    # it back only with SPECSAN_CHECK_INDICES=1; without it a GPU case leaves the corruption out
    on_gpu: bool = True
    on_cpu: bool = True  # False: a limit of the GPU itself (its shared memory), which the interpreter does not have


def applies(corruption: Corruption, device: str) -> bool:
    """Whether a refusal family holds ``corruption`` on ``device`` (see ``Corruption.on_gpu`` / ``on_cpu``)."""
    if device == "cuda":
        return corruption.on_gpu or validate.CHECK_INDICES_ON_GPU
    return corruption.on_cpu


def refusal_family(valid: Callable, corruptions: tuple[Corruption, ...], launcher: str) -> Callable:
    """A family whose every case holds each of ``corruptions``, each applied to its own case of ``valid``."""
    def build(rng, device, launch):
        first, *more = [corrupted(valid, c, rng, device, launch) for c in corruptions if applies(c, device)]
        first.more_refusals = more
        return first

    build.refuses, build.valid, build.corruptions = True, valid, corruptions  # see stress.core.refusal.is_family
    build.__name__ = "refused"
    build.__doc__ = f"{launcher}'s refusals, each on its own valid case: " + "; ".join(c.what for c in corruptions)
    return build


def corrupted(valid: Callable, corruption: Corruption, rng, device: str, launch: dict) -> Case:
    """The first of ``valid``'s cases that ``corruption`` applies to, corrupted."""
    valid = corruption.valid or valid
    for _ in range(TRIES):
        case = valid(rng, device, launch)
        inputs = dict(case.inputs)
        if corruption.apply(rng, inputs) is not False:
            note = f"{corruption.what}, must be refused" + (f" ({case.note})" if case.note else "")
            return Case(inputs, note=note, refused=corruption.refused)
    raise RuntimeError(f"{corruption.what}: none of {TRIES} cases of {valid.__name__} can be corrupted so")


# ---------------------------------------------------------------- corruptions


def resized(name: str, dim: int, sizes: tuple, what: str, refused: str | None = None) -> tuple[Corruption, ...]:
    """One corruption per entry of ``sizes``: ``name`` resized along ``dim``, by an int (-1: one entry fewer)
    or to what a callable gives from the inputs (one row short of the batch); grown entries repeat the first
    ones."""
    def resize(choice):
        def apply(rng, inputs):
            t = inputs.get(name)
            if t is None:  # an optional tensor this case leaves out
                return False
            size = t.shape[dim]
            new = choice(inputs) if callable(choice) else size + choice
            if new < 0 or new == size or (new > size and size == 0):
                return False
            if new < size:
                inputs[name] = t.narrow(dim, 0, new).clone()
            else:
                inputs[name] = torch.cat([t] * -(-new // size), dim).narrow(dim, 0, new).clone()
            return True

        return apply

    return tuple(Corruption(refused or name, what if callable(choice) else f"{what} ({choice:+d})", resize(choice))
                 for choice in sizes)


def emptied(dims: dict[str, int], what: str, refused: str, on_gpu: bool = True) -> Corruption:
    """Every tensor of ``dims`` given size 0 along its dimension (a vocabulary of 0 in logits and cache alike);
    a tensor absent from the case is skipped, and a case with no entry along the first is left alone.
    ``on_gpu``: as ``Corruption``'s."""
    def apply(rng, inputs):
        first = next(iter(dims))
        if inputs[first].numel() == 0:
            return False
        for name, dim in dims.items():
            if inputs.get(name) is not None:
                inputs[name] = inputs[name].narrow(dim, 0, 0).clone()
        return True

    return Corruption(refused, what, apply, on_gpu=on_gpu)


def past_bound(name: str, bound: Callable[[dict], int], what: str,
               live: Callable[[dict], torch.Tensor] | None = None, refused: str | None = None,
               on_gpu: bool = False) -> Corruption:
    """One index of ``name`` set to ``bound(inputs)``, its exclusive upper bound (exactly there, where a flipped
    ``>=`` shows): one that ``live(inputs)`` marks, by default one >= 0 (a padded row's -1 is never followed).
    ``on_gpu``: the launcher reads the index back itself, so a GPU launch refuses it too."""
    def apply(rng, inputs):
        t = inputs[name].clone(memory_format=torch.contiguous_format)
        marked = live(inputs) if live else t >= 0
        where = marked.flatten().nonzero().flatten()
        if where.numel() == 0:
            return False
        t.view(-1)[int(where[int(rng.integers(where.numel()))])] = bound(inputs)
        inputs[name] = t
        return True

    return Corruption(refused or name, what, apply, on_gpu=on_gpu)


def replaced(name: str, values: tuple, what: str, refused: str | None = None) -> tuple[Corruption, ...]:
    """One corruption per entry of ``values``: ``name`` replaced by it (a zero count, a float for an int, a bool)."""
    def replace(value):
        def apply(rng, inputs):
            inputs[name] = value

        return apply

    return tuple(Corruption(refused or name, f"{what}: {value!r}", replace(value)) for value in values)


def retyped(name: str, *dtypes: torch.dtype, refused: str | None = None) -> Corruption:
    """``name`` in the first of ``dtypes`` it does not have already."""
    def apply(rng, inputs):
        t = inputs[name]
        inputs[name] = t.to(next(d for d in dtypes if d != t.dtype))

    return Corruption(refused or name, f"{name} in another dtype", apply)


def one_dim_more(name: str) -> Corruption:
    """``name`` with a leading dimension of 1: the wrong number of dimensions."""
    def apply(rng, inputs):
        inputs[name] = inputs[name].unsqueeze(0)

    return Corruption(name, f"{name} with an extra dimension", apply)


def as_list(name: str) -> Corruption:
    """``name`` as a Python list instead of a tensor."""
    def apply(rng, inputs):
        inputs[name] = inputs[name].tolist()

    return Corruption(name, f"{name} as a list", apply)


# ---------------------------------------------------------------- per launcher


def _rows_short_of(batch: Callable[[dict], int]) -> Callable[[dict], int]:
    """A size one short of the batch, for ``resized``."""
    return lambda inputs: batch(inputs) - 1


def _short(name: str, need: Callable[[dict], int], what: str) -> Corruption:
    """``name`` one row short of what the live batch needs."""
    return resized(name, 0, (_rows_short_of(need),), f"{name} one row short of {what}")


def _batch_rows(inputs: dict) -> int:
    """A batch of one row per ``idx_mapping`` entry."""
    return inputs["idx_mapping"].numel()


def _qsl_rows(inputs: dict) -> int:
    return inputs["query_start_loc"].numel() - 1


def _requests(inputs: dict) -> int:
    return inputs["target_logits"].shape[0]


_NOT_POSITIVE = (0, -1, 16.0, True)  # a count the launcher must refuse: zero, negative, float, bool


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


GATHER = refusal_family(bt.gather_basic, (
    *resized("out", 1, (-1, 1), "out one column narrower or wider than persistent"),
    *_short("out", _batch_rows, "the batch"),
    *resized("persistent", 0, (lambda i: 0,), "persistent without slot rows"),
    past_bound("idx_mapping", lambda i: i["persistent"].shape[0], "a slot past persistent's rows"),
    retyped("idx_mapping", torch.int64), one_dim_more("out"), as_list("persistent"),
), "gather_block_tables")

SLOT_MAPPING = refusal_family(bt.slots_basic, (
    *resized("block_table", 0, (_rows_short_of(_qsl_rows),), "block_table one row short of the batch"),
    *resized("out", 0, (lambda i: i["positions"].numel() - 1,), "out one entry short of the positions"),
    past_bound("query_start_loc", lambda i: i["positions"].numel() + 1, "an offset past the tokens"),
    *replaced("block_size", _NOT_POSITIVE, "block_size not a positive int"),
    retyped("positions", torch.int32),
), "compute_slot_mappings")

SHIFT = refusal_family(bt.shift_slot_vs_row, (
    *_short("block_table", _batch_rows, "the batch"),
    *resized("seq_lens", 0, (_rows_short_of(_batch_rows),), "seq_lens one entry short of the batch"),
    past_bound("idx_mapping", lambda i: i["num_cached_tokens"].numel(), "a slot past num_cached_tokens"),
    *replaced("block_size", _NOT_POSITIVE, "block_size not a positive int"),
    retyped("num_cached_tokens", torch.int64),
), "shift_block_table_rows")

UNALIGNED_PREFIX = refusal_family(bt.prefix_aligned, (
    *replaced("block_sizes", ((),), "no block sizes"),
    *replaced("block_sizes", ((16, 0), (-16,), (16.0,), (True,)), "a block size that is not a positive int"),
    past_bound("idx_mapping", lambda i: i["num_cached_tokens"].numel(), "a slot past num_cached_tokens", on_gpu=True),
), "has_unaligned_cached_prefix")

GUMBEL = refusal_family(sampling.mixed, (
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
), "gumbel_sample")

VERIFY = refusal_family(rejection.mixed, (
    emptied({"target_logits": 1, "out_tokens": 1}, "no bonus row (k + 1 = 0 rows)", refused="target_logits"),
    *resized("draft_tokens", 1, (-1, 1), "draft_tokens one column short or past k"),
    *resized("draft_tokens", 0, (-1, 1), "draft_tokens one row short or past the requests"),
    *resized("idx_mapping", 0, (-1, 1), "idx_mapping one entry short or past the requests"),
    *resized("positions", 0, (-1, 1), "positions one entry short or past the requests"),
    *resized("seeds", 0, (-1, 1), "seeds for one slot fewer or more than temperature"),
    *resized("out_tokens", 0, (_rows_short_of(_requests),), "out_tokens one row short of the requests"),
    *resized("out_tokens", 1, (-1, 1), "out_tokens one column short or past k + 1"),
    *resized("num_sampled", 0, (_rows_short_of(_requests),), "num_sampled one entry short of the requests"),
    *resized("num_rejected", 0, (_rows_short_of(_requests),), "num_rejected one entry short of the requests"),
    *resized("draft_logits", 2, (-1, 1), "draft_logits one vocabulary entry short or past the target's"),
    past_bound("idx_mapping", lambda i: i["temperature"].numel(), "a slot past temperature"),
    emptied({"target_logits": 2, "draft_logits": 2}, "a vocabulary of 0", refused="target_logits"),
), "verify")


def _target_rows(inputs: dict) -> int:
    return int(inputs["target_query_start_loc"][_batch_rows(inputs)])


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
    rows = [b for b in range(_batch_rows(inputs)) if starts[b] < starts[b + 1]]
    if not rows:
        return False
    b = int(pick(rng, rows))
    starts[b], starts[b + 1] = int(starts[b + 1]), int(starts[b])
    return True


PREPARE = refusal_family(di.decode, (
    *replaced("num_draft_tokens", (-1, 2.0, True), "num_draft_tokens not an int >= 0"),
    Corruption("num_draft_tokens", "anchor-first with no draft rows", _anchor_first_without_drafts),
    *replaced("mask_token_id", (1.0, True, None), "mask_token_id not an int"),
    *replaced("block_size", _NOT_POSITIVE, "block_size not a positive int"),
    *resized("next_prefill_tokens", 0, (-1, 1), "next_prefill_tokens for one slot fewer or more than last_sampled"),
    *resized("num_cached_tokens", 0, (-1, 1), "num_cached_tokens for one slot fewer or more than last_sampled"),
    past_bound("idx_mapping", lambda i: i["last_sampled"].numel(), "a live batch row's slot past last_sampled",
               on_gpu=True),
    # -1 is a padded row's slot elsewhere (the fail-closed test skips it): a live row must not have it
    past_bound("idx_mapping", lambda i: -1, "a live batch row's slot -1", on_gpu=True),
    *_short("target_query_start_loc", lambda i: _batch_rows(i) + 1, "the batch's offsets"),
    Corruption("target_query_start_loc", "target offsets that decrease", _decreasing_offsets),
    *_short("target_positions", _target_rows, "the target rows"),
    *_short("num_sampled", _batch_rows, "the batch"),
    *_short("num_rejected", _batch_rows, "the batch"),
    *_short("block_table", _batch_rows, "the batch"),
    *_short("draft_tokens", _batch_rows, "the batch"),
    *_short("context_positions", _target_rows, "the target rows"),
    *_short("input_ids", lambda i: _batch_rows(i) * _query_rows(i), "the query rows"),
    *_short("sample_indices", lambda i: _batch_rows(i) * i["num_draft_tokens"], "the sampled rows"),
    *_short("seq_lens", _batch_rows, "the batch"),
    *_short("query_start_loc", lambda i: _batch_rows(i) + 1, "the batch's offsets"),
    *resized("context_slot_mapping", 0, (-1, 1), "context_slot_mapping one entry off context_positions"),
    *resized("query_slot_mapping", 0, (-1, 1), "query_slot_mapping one entry off input_ids"),
    *resized("sample_idx_mapping", 0, (-1, 1), "sample_idx_mapping one entry off sample_indices"),
    *resized("draft_tokens", 1, (-1, 1), "draft_tokens one column off num_draft_tokens"),
), "prepare_draft_inputs")

def _writing_tokens(inputs: dict) -> torch.Tensor:
    """The slot_mapping entries that write: a token's (entries past the tokens are ignored), not negative."""
    slots = inputs["slot_mapping"]
    return (slots >= 0) & (torch.arange(slots.numel()) < inputs["key"].shape[0])


def _slot_0_without_blocks(rng, inputs):
    """The caches cut to no blocks, every token PAD but one at slot 0: the slot that only the check of every
    slot >= 0 (PAD aside) refuses, where a check of slots > 0 lets it through."""
    writing = _writing_tokens(inputs).nonzero().flatten()
    if writing.numel() == 0:
        return False
    slots = torch.where(_writing_tokens(inputs), -1, inputs["slot_mapping"])
    slots[int(writing[int(rng.integers(writing.numel()))])] = 0
    inputs["slot_mapping"] = slots
    inputs["kv_cache"] = inputs["kv_cache"][:, :0].clone()
    return True


WRITE_KV = refusal_family(kv_cache.pad, (
    retyped("value", torch.float16, torch.float32),
    *resized("value", 0, (-1, 1), "value one token off key"),
    *resized("value", 2, (-1, 1), "value one head dim off key"),
    *resized("kv_cache", 3, (-1, 1), "a cache of one KV head fewer or more than key", refused="k_cache"),
    *resized("kv_cache", 4, (-1, 1), "a cache one head dim off key", refused="k_cache"),
    *resized("slot_mapping", 0, (lambda i: i["key"].shape[0] - 1,), "slot_mapping one entry short of the tokens"),
    retyped("slot_mapping", torch.int32),
    past_bound("slot_mapping", lambda i: i["kv_cache"].shape[1] * i["kv_cache"].shape[2],
               "a token's slot past the cache", live=_writing_tokens),
    Corruption("slot_mapping", "a token's slot 0 in caches of no blocks", _slot_0_without_blocks, on_gpu=False),
), "write_kv")


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
    reached[:rows] = attention.reached_columns(inputs["seq_lens"][:rows], table.shape[1], inputs["k_cache"].shape[1])
    return reached


def _unfittable(rng, device, launch):
    """Decode rows of 130 float32 query heads per KV head at head dim 256: a program holds a whole group (256
    rows), whose query tile alone (256 KiB) passes a GPU's shared memory (227 KiB on an H200; the H200 asked
    353 KiB for the launcher's own tiles here)."""
    return attention.attention_case(rng, query_lens=[1, 1], seq_lens=[int(rng.integers(1, 40)) for _ in range(2)],
                                    kv_heads=1, group=130, head_dim=256, block_size=16, dtype=torch.float32,
                                    causal=bool(rng.integers(2)), note="no tile fits")


PAGED_ATTENTION = refusal_family(attention.decode, (
    retyped("out", torch.float16, torch.float32),
    retyped("k_cache", torch.float16, torch.float32),
    *resized("v_cache", 0, (-1, 1), "v_cache one block off k_cache"),
    *resized("query", 2, (-1, 1), "query one head dim off the caches", refused="k_cache"),
    emptied({"k_cache": 2, "v_cache": 2}, "caches without KV heads", refused="query"),
    emptied({"k_cache": 1, "v_cache": 1}, "caches of block size 0", refused="k_cache"),
    # refused through the block ids, checked as indices (on a GPU only with SPECSAN_CHECK_INDICES=1)
    emptied({"k_cache": 0, "v_cache": 0}, "caches of no blocks under sequences that reach one", refused="block_table",
            on_gpu=False),
    *resized("out", 0, (_rows_short_of(_query_tokens),), "out one row short of the queries"),
    *resized("out", 1, (-1, 1), "out one head off the query"),
    *_short("block_table", _qsl_rows, "the batch"),
    *_short("seq_lens", _qsl_rows, "the batch"),
    *replaced("scale", (float("nan"), float("inf"), "0.125", True, None), "scale not a finite float"),
    past_bound("query_start_loc", lambda i: i["query"].shape[0] + 1, "a query offset past the queries"),
    past_bound("seq_lens", _row_capacity, "a sequence longer than its block-table row", live=_attended_rows),
    past_bound("block_table", lambda i: i["k_cache"].shape[0], "a block id a sequence reaches, past the cache",
               live=_reached_blocks),
    # well formed, but more than the GPU holds: no program of whole groups fits its shared memory
    Corruption("query", "130 float32 query heads per KV head at head dim 256", lambda rng, inputs: None,
               valid=_unfittable, on_cpu=False),
), "paged_attention")


def _no_slots(rng, inputs):
    inputs["max_num_reqs"] = 0  # every schedule admits at least one request


SLOTS = refusal_family(slots.churn, (
    *replaced("max_num_reqs", (-1, 4.0, True, None, "8"), "max_num_reqs not an int >= 0"),
    Corruption("req_id", "an admission with every slot taken", _no_slots),
), "RequestSlots")


def configured(key: str, value: Callable[[np.random.Generator, dict], object], what: str,
               refused: str | None = None) -> Corruption:
    """The case's ``config`` (a host check's keyword arguments) with ``key`` set to ``value(rng, config)``;
    None from ``value``: this configuration has nothing to corrupt so."""
    def apply(rng, inputs):
        config = dict(inputs["config"])
        new = value(rng, config)
        if new is None:
            return False
        config[key] = new
        inputs["config"] = config
        return True

    return Corruption(refused or key, what, apply)


def query_replaced(query: Callable[[np.random.Generator, dict], graphs.Query | None], what: str,
                   refused: str) -> Corruption:
    """One of the case's dispatch queries replaced by ``query(rng, config)`` (None: not in this configuration)."""
    def apply(rng, inputs):
        bad = query(rng, inputs["config"])
        if bad is None:
            return False
        queries = list(inputs["queries"])
        queries[int(rng.integers(len(queries)))] = bad
        inputs["queries"] = queries
        return True

    return Corruption(refused, what, apply)


def _depth_without_maximum(rng, config):
    config["adaptive"] = config["adaptive"] or config["schedule"] is None
    return 0


def _below_largest_size(rng, config):
    largest = max(config["capture_sizes"], default=0)
    return largest - 1 if largest > 1 else None


_BAD_SCHEDULES = ("1-8:2", 5, [], {(1, 8, 2)}, [(1, 8)], [(3, 2, 1)], [(0, 4, 1)], [(1, 4, -1)], [(1, 4.0, 1)])


def _uneven_longest(rng, config):
    """A longest request one token short of what ``r`` requests sharing ``t`` tokens need (``r`` does not
    divide ``t``: rounding the mean down instead of up lets it through)."""
    r = min(config["max_num_reqs"], 3)
    return graphs.Query(r, 2 * r + 1, None, False, 2) if r >= 2 else None


def _uniform_and_longest_differ(rng, config):
    r, w = 2, 3
    return graphs.Query(r, r * w, w, False, w + 1) if config["max_num_reqs"] >= r else None


GRAPH_CANDIDATES = refusal_family(graphs.dsd_schedule, (
    configured("max_spec_tokens", _depth_without_maximum, "a DSD schedule or adaptive depth with Kmax 0"),
    configured("max_capture_size", _below_largest_size, "max_capture_size below the largest capture size"),
    *(configured("schedule", lambda rng, config, bad=bad: bad, f"a schedule that is no list of bands: {bad!r}")
      for bad in _BAD_SCHEDULES),
    query_replaced(lambda rng, c: graphs.Query(2, 1, None, False, None), "more requests than tokens", "num_reqs"),
    query_replaced(lambda rng, c: graphs.Query(c["max_num_reqs"] + 1, 2 * c["max_num_reqs"] + 2, None, False, None),
                   "more requests than max_num_reqs", "num_reqs"),
    query_replaced(lambda rng, c: graphs.Query(1, 3, 2, False, None), "a uniform width that misses the tokens",
                   "uniform"),
    query_replaced(_uneven_longest, "a longest request shorter than the mean", "max_req_tokens"),
    query_replaced(lambda rng, c: graphs.Query(1, 3, None, False, 4), "a longest request past the tokens",
                   "max_req_tokens"),
    query_replaced(_uniform_and_longest_differ, "a longest request other than the uniform width", "max_req_tokens"),
), "build_candidates and dispatch")


def _call(function: str, args: list, note: str, then: tuple = (), draft: torch.Tensor | None = None) -> Case:
    """A case of ``stress.oracles.host.depth_outcomes``' ``call`` kind: ``function(draft?, *args)``, then each method
    (``stress.oracles.host.called``); its corruptions change ``params``."""
    inputs = {"kind": "call", "params": {"function": function, "args": args, "then": then}}
    if draft is not None:
        inputs["draft"] = draft
    return Case(inputs, note=note)


def limit_call(rng, device, launch):
    """A valid ``limit_draft_tokens``: n in 1..columns of a draft of 1..k_max columns."""
    k_max = int(rng.integers(1, 7))
    columns = int(rng.integers(1, k_max + 1))
    n = int(rng.integers(1, columns + 1))
    return _call("limit_draft_tokens", [n, k_max], f"n={n} of {columns} columns, k_max {k_max}",
                 draft=draft_columns(rng, int(rng.integers(1, 4)), columns))


def band_call(rng, device, launch):
    """A valid ``band_lookup``: 1-3 bands from batch size 1, each ending before the next starts."""
    bands, start = [], 1
    for _ in range(int(rng.integers(1, 4))):
        end = start + int(rng.integers(0, 4))
        bands.append((start, end, int(rng.integers(0, 6))))
        start = end + int(rng.integers(1, 3))
    return _call("band_lookup", [bands, start + 1, 4], f"bands {bands}")


def controller_call(rng, device, launch):
    """A valid ``BandAcceptanceLengthController`` over a table of 1-3 batch sizes, asked one depth."""
    caps = (0, *(int(c) for c in rng.integers(0, 5, size=int(rng.integers(1, 4)))))
    size = int(rng.integers(1, len(caps)))
    return _call("BandAcceptanceLengthController", [caps, 2], f"caps {caps}", then=(("depth_for", [size]),))


def arguments(refused: str, what: str, index: int, values: tuple, valid: Callable, key: str = "params"
              ) -> tuple[Corruption, ...]:
    """One corruption per entry of ``values``: ``args[index]`` of a host ``call`` case (``inputs[key]``, see
    ``stress.oracles.host.called``) set to it, or to what it gives from the args where it is callable (None: not
    in this case)."""
    def argument(value):
        def apply(rng, inputs):
            call = inputs[key]
            args = list(call["args"])
            new = value(args) if callable(value) else value
            if callable(value) and new is None:
                return False
            args[index] = new
            inputs[key] = {**call, "args": args}
            return True

        return apply

    return tuple(Corruption(refused, f"{what}: {value if callable(value) else repr(value)}", argument(value), valid)
                 for value in values)


class _Named:
    """A callable value with a name for the corruption's description."""

    def __init__(self, name: str, fn: Callable):
        self.name, self.fn = name, fn

    def __call__(self, args):
        return self.fn(args)

    def __str__(self):
        return self.name


def _asked(size: Callable[[tuple], int], what: str) -> Corruption:
    """The controller asked for the depth of ``size(caps)``."""
    def apply(rng, inputs):
        caps = inputs["params"]["args"][0]
        inputs["params"] = {**inputs["params"], "then": (("depth_for", [size(caps)]),)}

    return Corruption("batch_size", what, apply, controller_call)


def _draft_columns(columns: Callable[[list], int | None], what: str) -> Corruption:
    """``limit_call``'s draft with ``columns(args)`` columns (None: not in this case)."""
    def apply(rng, inputs):
        wanted = columns(inputs["params"]["args"])
        if wanted is None:
            return False
        inputs["draft"] = draft_columns(rng, inputs["draft"].shape[0], wanted)

    return Corruption("draft", what, apply)


def _ends_before_start(args):
    """A second band that ends before it starts and lies past the first (nothing else wrong with it)."""
    first = args[0][0]
    return [first, (first[1] + 3, first[1] + 2, 1)]


def _touching(args):
    """Two bands sharing one batch size: the second starts where the first ends (past 1)."""
    first = args[0][0]
    if first[1] < 2:
        first = (1, 2, first[2])
    return [first, (first[1], first[1] + 2, 1)]


DEPTH = refusal_family(limit_call, (
    *arguments("n", "n not an int", 0, (True, 1.0, None, "1"), limit_call),
    *arguments("n", "n outside 0..k_max", 0, (-1, _Named("k_max + 1", lambda a: a[1] + 1)), limit_call),
    *arguments("k_max", "k_max not a positive int", 1, _NOT_POSITIVE, limit_call),
    _draft_columns(lambda a: a[1] + 1, "a draft of k_max + 1 columns"),
    _draft_columns(lambda a: a[0] - 1 if a[0] > 1 else None, "a draft of fewer columns than n"),
    *arguments("schedule", "a schedule that is no list of bands", 0, _BAD_SCHEDULES, band_call),
    *arguments("schedule", "bands", 0, (_Named("a band past the first that ends before it starts", _ends_before_start),
                                        _Named("two bands sharing a batch size", _touching), [(2, 4, 1)]), band_call),
    *arguments("caps", "a table without batch sizes, without its unused 0, or with a negative cap", 0,
               ((0,), _Named("(1, *caps)", lambda a: (1, *a[0][1:])), (0, -1)), controller_call),
    *arguments("window", "window not a positive int", 1, _NOT_POSITIVE, controller_call),
    _asked(len, "a batch size at the table's end"),
    _asked(lambda caps: 0, "a batch size of 0"),
), "limit_draft_tokens, band_lookup and BandAcceptanceLengthController")


def layer_call(rng, device, launch):
    """A valid ``dflash_layer_causal`` (``stress.oracles.host.backend_outcomes``' ``call``): a layer of 1-6, with
    per-layer types or none, and an override now and then."""
    num_layers = int(rng.integers(1, 7))
    types = pick(rng, (None, [pick(rng, LAYER_TYPES) for _ in range(num_layers)]))
    args = [int(rng.integers(num_layers)), num_layers, types, pick(rng, (None, None, True, False))]
    return Case({"rows": [], "call": {"function": "dflash_layer_causal", "args": args}},
                note=f"layer {args[0]} of {num_layers}, types {types}")


BACKENDS = refusal_family(layer_call, (
    *arguments("layer", "a layer that is no int in [0, num_layers)", 0,
               (True, False, 1.0, -1, _Named("num_layers", lambda a: a[1])), layer_call, key="call"),
    *arguments("num_layers", "num_layers not a positive int", 1, _NOT_POSITIVE, layer_call, key="call"),
    *arguments("layer_types", "layer types", 2,
               (_Named("one entry past the layers", lambda a: ["full_attention"] * (a[1] + 1)),
                _Named("one of an unknown kind", lambda a: ["full_attention"] * (a[1] - 1) + ["linear_attention"])),
               layer_call, key="call"),
    *arguments("causal_override", "causal_override neither a bool nor None", 3, (1, 0, "yes"), layer_call,
               key="call"),
), "dflash_layer_causal")


def _one_block_pool(pool: str, blocks: int) -> Corruption:
    """The engine's ``pool`` (``target_num_blocks`` or ``draft_num_blocks``) of ``blocks`` blocks."""
    def apply(rng, inputs):
        config = dict(inputs["config"])
        config["scheduler"] = {**config["scheduler"], pool: blocks}
        inputs["config"] = config

    return Corruption("num_blocks", f"{pool} {blocks}: no block besides the null block", apply)


ENGINE = refusal_family(engine.shared_prefix, tuple(
    _one_block_pool(pool, blocks) for pool in ("target_num_blocks", "draft_num_blocks") for blocks in (1, 0)),
    "the engine's BlockPool")
