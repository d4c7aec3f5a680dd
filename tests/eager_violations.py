"""Planted contract violations: for each kernel check, the eager implementation with one clause of its contract
broken the way an engine's kernel might break it. They are the positive controls of judging an implementation
other than the production one (``tests/test_eager.py``): each must be failed on the families that reach it.

Each wrapper calls the eager function and then breaks one clause; its docstring names the clause.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from eager import attention, draft_inputs, kv_cache, rejection, sampling
from eager import block_table as tables
from stress.core.types import Case


@dataclass(frozen=True)
class Violation:
    check: str
    launcher: Callable  # the eager function it wraps: it stands in for that function's production twin
    families: tuple[str, ...]  # the families that reach the broken clause
    call: Callable
    reaches: Callable[[Case], bool] | None  # which of their cases reach it (None: every case)

    @property
    def name(self) -> str:
        return self.call.__name__.replace("_", "-")


VIOLATIONS: list[Violation] = []


def violates(check: str, launcher: Callable, families: tuple[str, ...], reaches: Callable[[Case], bool] | None = None):
    """Registers the decorated wrapper of ``launcher``; it takes the launcher's arguments (its signature says so,
    so launch knobs are dropped before it as before the launcher)."""
    def register(fn):
        fn.__signature__ = inspect.signature(launcher)
        VIOLATIONS.append(Violation(check, launcher, families, fn, reaches))
        return fn
    return register


@violates("block_table.gather", tables.gather_block_tables, ("padded",))
def clears_rows_past_the_batch(persistent, idx_mapping, out):
    """Rows past the batch are untouched: here they are cleared to null blocks."""
    tables.gather_block_tables(persistent, idx_mapping, out)
    out[idx_mapping.numel():] = 0


@violates("block_table.slot_mapping", tables.compute_slot_mappings, ("padded",))
def stale_slots_past_the_batch(block_table, query_start_loc, positions, block_size, out):
    """Tokens past the batch get PAD: here they keep their stale slots."""
    end = int(query_start_loc[-1])
    stale = out[end:].clone()
    tables.compute_slot_mappings(block_table, query_start_loc, positions, block_size, out)
    out[end:] = stale


@violates("block_table.shift", tables.shift_block_table_rows, ("partial_block", "tiles"))
def shifts_to_the_end_of_the_row(block_table, idx_mapping, num_cached_tokens, seq_lens, block_size):
    """Only the blocks seq_lens[b] needs are moved (fix 4): here every entry up to the end of the row is."""
    whole_rows = torch.full_like(seq_lens, block_table.shape[1] * block_size)
    tables.shift_block_table_rows(block_table, idx_mapping, num_cached_tokens, whole_rows, block_size)


@violates("draft_inputs.prepare", draft_inputs.prepare_draft_inputs, ("padded", "zero_width"),
          reaches=lambda case: _stale_query_rows(case.inputs))
def stale_padded_queries(**args):
    """Query rows past the live batch get id 0 and position 0 (fix 3): here they keep stale ids and positions."""
    live = _live_query_rows(args)
    stale = {name: args[name][live:].clone() for name in ("input_ids", "positions")}
    prepared = draft_inputs.prepare_draft_inputs(**args)
    for name, values in stale.items():
        args[name][live:] = values
    return prepared


@violates("sampling.gumbel", sampling.gumbel_sample, ("padded",))
def padded_rows_sample_as_slot_0(logits, idx_mapping, temperature, seeds, positions, *, draft=False,
                                 logits_cache=None, cache_cols=None):
    """Rows of slot -1 are inert (fix 3): here they are sampled as slot 0 and write its cached logits."""
    return sampling.gumbel_sample(logits, idx_mapping.clamp(min=0), temperature, seeds, positions, draft=draft,
                                  logits_cache=logits_cache, cache_cols=cache_cols)


@violates("rejection.verify", rejection.verify, ("placeholders", "last_slot_placeholder"),
          reaches=lambda case: _trailing_placeholder(case.inputs))
def padding_counted_as_rejected(target_logits, draft_tokens, idx_mapping, temperature, seeds, positions, out_tokens,
                                num_sampled, num_rejected, *, draft_logits=None):
    """num_rejected counts the request's own drafts: here trailing placeholders count as rejected (k + 1 - n)."""
    rejection.verify(target_logits, draft_tokens, idx_mapping, temperature, seeds, positions, out_tokens,
                     num_sampled, num_rejected, draft_logits=draft_logits)
    batch, k = draft_tokens.shape
    num_rejected[:batch] = torch.where(idx_mapping >= 0, k + 1 - num_sampled[:batch], 0)


@violates("rejection.distribution", rejection.verify, ("target_distribution",),
          reaches=lambda case: case.inputs["temperature"] > 0)
def one_noise_key_for_every_request(target_logits, draft_tokens, idx_mapping, temperature, seeds, positions,
                                    out_tokens, num_sampled, num_rejected, *, draft_logits=None):
    """Noise is keyed per request by (seeds[slot], position): here every request draws under the first one's key."""
    rejection.verify(target_logits, draft_tokens, idx_mapping, temperature, seeds[:1].expand_as(seeds).contiguous(),
                     positions[:1].expand_as(positions).contiguous(), out_tokens, num_sampled, num_rejected,
                     draft_logits=draft_logits)


@violates("kv_cache.write", kv_cache.write_kv, ("pad", "null_block"),
          reaches=lambda case: bool((case.inputs["slot_mapping"][:case.inputs["key"].shape[0]] < 0).any()))
def pad_clamped_to_slot_0(key, value, slot_mapping, k_cache, v_cache):
    """PAD (-1) writes nothing: here it is clamped to slot 0 and writes the null block."""
    kv_cache.write_kv(key, value, slot_mapping.clamp(min=0), k_cache, v_cache)


@violates("attention.paged", attention.paged_attention, ("multi_query", "edges"),
          reaches=lambda case: not case.inputs["causal"] and _several_queries_with_keys(case.inputs))
def every_query_causal(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale, causal, out):
    """Non-causal (DFlash draft) queries see every key of their sequence: here they get the causal mask."""
    attention.paged_attention(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                              causal=True, out=out)


@violates("attention.prefix_masked", tables.shift_block_table_rows, ("restored", "long"),
          reaches=lambda case: _restored_blocks(case.inputs))
def restored_blocks_stay_in_view(block_table, idx_mapping, num_cached_tokens, seq_lens, block_size):
    """The draft's table is shifted past the restored blocks (fix 4): here it is left as it is, so attention reads
    the restored prefix's never-written KV."""
    tables.shift_block_table_rows(block_table, idx_mapping, torch.zeros_like(num_cached_tokens), seq_lens, block_size)


def _trailing_placeholder(inputs: dict) -> bool:
    """A live request padded to k with placeholders: its own drafts are fewer than k."""
    drafts, live = inputs["draft_tokens"], inputs["idx_mapping"] >= 0
    return drafts.shape[1] > 0 and bool(((drafts[:, -1] < 0) & live).any())


def _several_queries_with_keys(inputs: dict) -> bool:
    """A batch row with two queries or more and keys: its first query sees fewer keys under a causal mask."""
    starts = inputs["query_start_loc"]
    rows = starts.numel() - 1
    return bool((((starts[1:] - starts[:-1]) > 1) & (inputs["seq_lens"][:rows] > 0)).any())


def _restored_blocks(inputs: dict) -> bool:
    """A batch row whose slot has a whole restored block, which the draft must not see."""
    cached = inputs["num_cached_tokens"][inputs["idx_mapping"].long()]
    return bool((cached >= inputs["block_size"]).any())


def _live_query_rows(inputs: dict) -> int:
    return inputs["idx_mapping"].numel() * (inputs["num_draft_tokens"] + (0 if inputs["anchor_first"] else 1))


def _stale_query_rows(inputs: dict) -> bool:
    """Query rows past the live batch that hold something other than what clearing writes there."""
    live = _live_query_rows(inputs)
    return bool((inputs["input_ids"][live:] != 0).any() or (inputs["positions"][live:] != 0).any())
