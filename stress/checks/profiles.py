"""Contract choices an implementation may declare (``--impl CHECK=module:function@choice``), shared by several
checks: the places where engines differ by design. Each narrows the cases (one outside it is ``not_checked`` with
the reason) or says how the expected outputs differ. A check's entry lists the ones that apply to it
(``Check.choices``); docs/impl.md describes them."""

import torch

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


def _low_temperature(case: Case) -> str | None:
    temperature = _tensor(case, "temperature")
    if temperature is None:
        return None
    low = (temperature > 0) & (temperature < FLOOR)
    return f"a temperature in (0, {FLOOR})" if bool(low.any()) else None


def _non_finite(*names: str):
    def outside(case: Case) -> str | None:
        bad = [n for n in names if (t := _tensor(case, n)) is not None and t.is_floating_point()
               and not bool(torch.isfinite(t).all())]
        return f"NaN or infinity in {', '.join(bad)}" if bad else None
    return outside


def _placeholder_drafts(case: Case) -> str | None:
    drafts = _tensor(case, "draft_tokens")
    return "a -1 placeholder among the drafts" if drafts is not None and bool((drafts < 0).any()) else None


def _drafts_past_vocab(case: Case) -> str | None:
    drafts, logits = _tensor(case, "draft_tokens"), _tensor(case, "target_logits")
    if drafts is None or logits is None:
        return None
    return "a draft token past the vocabulary" if bool((drafts >= logits.shape[-1]).any()) else None


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


NO_PADDED_ROWS = Choice("its batches have no padded rows (idx_mapping holds no -1)", outside=_padded_rows)
NO_PAD_SLOTS = Choice("every token it is given is written (no PAD -1 slots)", outside=_pad_slots)
TEMPERATURE_FLOOR = Choice(f"a temperature above 0 is raised to at least {FLOOR}", outside=_low_temperature)
FINITE_LOGITS = Choice("NaN and infinite logits are undefined for it",
                       outside=_non_finite("logits", "target_logits", "draft_logits"))
FINITE_ATTENTION = Choice("NaN and infinite queries, keys and values are undefined for it",
                          outside=_non_finite("query", "k_cache", "v_cache"))
NO_PLACEHOLDER_DRAFTS = Choice("every draft token is a real token (no -1 placeholders)", outside=_placeholder_drafts)
DRAFTS_IN_VOCAB = Choice("draft tokens lie inside the vocabulary", outside=_drafts_past_vocab)
NO_DRAFT_LOGITS = Choice("it verifies without draft logits (no probabilistic residual from a draft distribution)",
                         outside=_input_given("draft_logits", "draft logits given"))
NO_LOGITS_CACHE = Choice("it keeps no processed-logits cache", outside=_input_given("logits_cache", "a logits cache"))
CACHE_AFTER_TEMPERATURE = Choice("its logits cache holds logits after temperature (divided by it), not raw logits",
                                 expect=_cache_after_temperature)
CAUSAL_ONLY = Choice("it attends causally only", outside=_non_causal)
