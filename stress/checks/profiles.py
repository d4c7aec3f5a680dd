"""Contract choices an implementation may declare (``--impl CHECK=module:function@choice``), shared by several
checks: the places where engines differ by design. Each narrows the cases (one outside it is ``not_checked`` with
the reason) or says how the expected outputs differ. A check's entry lists the ones that apply to it
(``Check.choices``); docs/impl.md describes them."""

import torch

from reference.rejection import softmax
from stress.core.types import Case, Choice


def _tensor(case: Case, name: str) -> torch.Tensor | None:
    value = case.inputs.get(name)
    return value if isinstance(value, torch.Tensor) else None


def _padded_rows(case: Case) -> str | None:
    idx = _tensor(case, "idx_mapping")
    return "a padded batch row (slot -1)" if idx is not None and bool((idx < 0).any()) else None


def _pad_slots(case: Case) -> str | None:
    slots = _tensor(case, "slot_mapping")
    tokens = _tensor(case, "key")
    if slots is None or tokens is None:
        return None
    return "a PAD (-1) slot among the tokens" if bool((slots[: tokens.shape[0]] < 0).any()) else None


FLOOR = 0.01


def _sampled_temperatures(case: Case) -> torch.Tensor | None:
    """The temperatures of the slots some batch row samples (every one where no idx_mapping maps rows to
    slots): a slot no row names is never read, whatever it holds."""
    temperature, idx = _tensor(case, "temperature"), _tensor(case, "idx_mapping")
    if temperature is None or idx is None:
        return temperature
    return temperature[idx[(idx >= 0) & (idx < temperature.numel())].long()]


def _low_temperature(case: Case) -> str | None:
    temperature = _sampled_temperatures(case)
    if temperature is None:
        return None
    low = (temperature > 0) & (temperature < FLOOR)
    return f"a temperature in (0, {FLOOR})" if bool(low.any()) else None


def _undefined_in(*names: str, undefined, what: str):
    """A profile test: the float tensors of ``names`` where ``undefined(tensor)`` holds are named with ``what``."""
    def outside(case: Case) -> str | None:
        bad = [n for n in names if (t := _tensor(case, n)) is not None and t.is_floating_point() and t.numel()
               and bool(undefined(t))]
        return f"{what} in {', '.join(bad)}" if bad else None
    return outside


def _non_finite(*names: str):
    return _undefined_in(*names, undefined=lambda t: ~torch.isfinite(t).all(), what="NaN or infinity")


def _unmasked_non_finite(*names: str):
    """NaN or +inf in ``names``, or a row of them with every token -inf; a -inf beside finite logits (a masked
    token) is inside."""
    return _undefined_in(*names, what="NaN, +inf or a row of only -inf",
                         undefined=lambda t: (t.isnan() | (t == float("inf"))).any()
                         | (t == float("-inf")).all(-1).any())


def _non_finite_attended(case: Case) -> str | None:
    """NaN or infinity in the batch's queries or in the keys and values its rows reach (positions below each
    row's sequence length, through its block-table row). Cache slots no row reaches are not read by the
    contract, whatever they hold: the families fill them with NaN, so they say nothing about this choice."""
    query, k_cache, v_cache = _tensor(case, "query"), _tensor(case, "k_cache"), _tensor(case, "v_cache")
    starts, table, seq_lens = _tensor(case, "query_start_loc"), _tensor(case, "block_table"), _tensor(case, "seq_lens")
    if any(t is None for t in (query, k_cache, v_cache, starts, table, seq_lens)) or starts.numel() < 2:
        return None
    bad = []
    if not bool(torch.isfinite(query[int(starts[0]):int(starts[-1])].float()).all()):
        bad.append("query")
    block_size = k_cache.shape[1]
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        for b in range(starts.numel() - 1):
            positions = torch.arange(int(seq_lens[b]))
            if positions.numel() == 0:
                continue
            reached = cache[table[b].long()[positions // block_size], positions % block_size]
            if not bool(torch.isfinite(reached.float()).all()):
                bad.append(name)
                break
    return f"NaN or infinity in the attended {', '.join(bad)}" if bad else None


def _placeholder_drafts(case: Case) -> str | None:
    drafts = _tensor(case, "draft_tokens")
    return "a -1 placeholder among the drafts" if drafts is not None and bool((drafts < 0).any()) else None


def _drafts_past_vocab(case: Case) -> str | None:
    drafts, logits = _tensor(case, "draft_tokens"), _tensor(case, "target_logits")
    if drafts is None or logits is None:
        return None
    return "a draft token past the vocabulary" if bool((drafts >= logits.shape[-1]).any()) else None


def _draft_outside_support(case: Case) -> str | None:
    """A draft of a sampled live request that its drafter's logits give probability 0 (as the reference computes
    q: exactly 0 where the kernel's is), at any step."""
    drafts, cached = _tensor(case, "draft_tokens"), _tensor(case, "draft_logits")
    idx, temperature = _tensor(case, "idx_mapping"), _tensor(case, "temperature")
    if drafts is None or cached is None or idx is None or temperature is None:
        return None
    for b_row, slot in enumerate(idx.tolist()):
        temp = float(temperature[slot]) if 0 <= slot < temperature.numel() else 0.0
        if not temp > 0:
            continue
        for step, x in enumerate(drafts[b_row, :cached.shape[1]].tolist()):
            if 0 <= x < cached.shape[-1] and float(softmax(cached[slot, step], temp)[0][x]) == 0:
                return "a draft its drafter gave probability 0 (q(x) = 0)"
    return None


def _input_given(name: str, what: str):
    def outside(case: Case) -> str | None:
        return what if case.inputs.get(name) is not None else None
    return outside


def _non_causal(case: Case) -> str | None:
    return "non-causal attention" if case.inputs.get("causal") is False else None


def _cache_after_temperature(case: Case, expected: dict) -> dict:
    """The logits cache holds each sampled row's logits divided by its slot's temperature (greedy rows: as is)."""
    if case.inputs.get("logits_cache") is None or "logits_cache" not in expected:
        return expected
    cache = expected["logits_cache"].clone()
    logits, temperature = case.inputs["logits"], case.inputs["temperature"]
    slots, cols = case.inputs["idx_mapping"].tolist(), case.inputs["cache_cols"].tolist()
    for row, (slot, col) in enumerate(zip(slots, cols, strict=True)):
        if slot >= 0 and float(temperature[slot]) > 0:
            cache[slot, col] = (logits[row] / temperature[slot]).to(cache.dtype)
    return {**expected, "logits_cache": cache}


def _refusal(case: Case) -> str | None:
    return f"bad arguments the contract refuses ({case.note or case.refused})" if case.refused else None


def _not_zero_greedy(case: Case) -> str | None:
    """A temperature below 0 or NaN on a slot some batch row samples: greedy under the contract (not > 0)."""
    used = _sampled_temperatures(case)
    if used is None or _tensor(case, "idx_mapping") is None:
        return None
    return "a negative or NaN temperature" if bool(((used < 0) | used.isnan()).any()) else None


def _batch_rows(case: Case) -> list[tuple[int, int, int]]:
    """(batch row, first token, end token) of each batch row under query_start_loc."""
    starts = case.inputs["query_start_loc"].tolist()
    return [(b, starts[b], starts[b + 1]) for b in range(len(starts) - 1)]


def _positions_off_row(case: Case) -> str | None:
    table, positions = _tensor(case, "block_table"), _tensor(case, "positions")
    if table is None or positions is None or _tensor(case, "query_start_loc") is None:
        return None
    reach = table.shape[1] * case.inputs["block_size"]
    for _, first, end in _batch_rows(case):
        pos = positions[first:end]
        if bool(((pos < 0) | (pos >= reach)).any()):
            return "a position off its row (negative, or past the row's blocks)"
    return None


def _tokens_past_batch(case: Case) -> str | None:
    starts, positions = _tensor(case, "query_start_loc"), _tensor(case, "positions")
    if starts is None or positions is None:
        return None
    if int(starts[0]) != 0 or int(starts[-1]) != positions.numel():
        return "tokens outside the batch's rows (query_start_loc not from 0 to len(positions))"
    return None


def _null_block_slots(case: Case, expected: dict) -> dict:
    """A token on the null block 0 (inside its row) gets the slot 0 * bs + pos % bs, not PAD."""
    table, positions, bs = case.inputs["block_table"], case.inputs["positions"], case.inputs["block_size"]
    out = expected["out"].clone()
    for b, first, end in _batch_rows(case):
        for t in range(first, end):
            pos = int(positions[t])
            if 0 <= pos < table.shape[1] * bs and int(table[b, pos // bs]) == 0:
                out[t] = pos % bs
    return {**expected, "out": out}


def _row_strides_differ(case: Case) -> str | None:
    persistent, out = _tensor(case, "persistent"), _tensor(case, "out")
    if persistent is None or out is None or persistent.stride(0) == out.stride(0):
        return None
    return f"row strides differ (persistent {persistent.stride(0)}, out {out.stride(0)})"


NO_PADDED_ROWS = Choice("its batches have no padded rows (idx_mapping holds no -1)", outside=_padded_rows)
NO_PAD_SLOTS = Choice("every token it is given is written (no PAD -1 slots)", outside=_pad_slots)
TEMPERATURE_FLOOR = Choice(f"a temperature above 0 is raised to at least {FLOOR}", outside=_low_temperature)
FINITE_LOGITS = Choice("NaN and infinite logits are undefined for it",
                       outside=_non_finite("logits", "target_logits", "draft_logits"))
MASKED_LOGITS = Choice("NaN, +inf and rows of only -inf logits are undefined for it; a -inf logit beside finite ones "
                       "(a masked token) is defined", outside=_unmasked_non_finite("logits", "target_logits",
                                                                                   "draft_logits"))
FINITE_ATTENTION = Choice("NaN and infinite queries, keys and values are undefined for it",
                          outside=_non_finite_attended)
NO_PLACEHOLDER_DRAFTS = Choice("every draft token is a real token (no -1 placeholders)", outside=_placeholder_drafts)
DRAFTS_IN_VOCAB = Choice("draft tokens lie inside the vocabulary", outside=_drafts_past_vocab)
DRAFTS_IN_SUPPORT = Choice("every draft has probability above 0 under its drafter's logits (a draft of q(x) = 0 may be "
                           "rejected)", outside=_draft_outside_support)
NO_DRAFT_LOGITS = Choice("it verifies without draft logits (no probabilistic residual from a draft distribution)",
                         outside=_input_given("draft_logits", "draft logits given"))
NO_LOGITS_CACHE = Choice("it keeps no processed-logits cache", outside=_input_given("logits_cache", "a logits cache"))
CACHE_AFTER_TEMPERATURE = Choice("its logits cache holds logits after temperature (divided by it), not raw logits",
                                 expect=_cache_after_temperature)
CAUSAL_ONLY = Choice("it attends causally only", outside=_non_causal)
NO_REFUSALS = Choice("it trusts its caller: bad arguments are not refused (no ValueError)", outside=_refusal)
GREEDY_AT_ZERO_ONLY = Choice("only a temperature of exactly 0 means greedy: negative and NaN temperatures are "
                             "undefined for it", outside=_not_zero_greedy)
POSITIONS_IN_ROW = Choice("every position lies inside its row's blocks (0 <= pos < width * block_size)",
                          outside=_positions_off_row)
BATCH_TOKENS_ONLY = Choice("its positions are the batch's tokens exactly (query_start_loc runs from 0 to "
                           "len(positions))", outside=_tokens_past_batch)
NULL_BLOCK_SLOTS = Choice("the null block 0 is a real block: a token on it gets slot pos % block_size, not PAD",
                          expect=_null_block_slots)
SHARED_ROW_STRIDE = Choice("source and destination tables share one row stride", outside=_row_strides_differ)
