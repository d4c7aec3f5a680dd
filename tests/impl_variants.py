"""Implementations that differ from a check's contract only by a choice an engine may declare, or by their random
stream: each must pass once it declares the choice (or its stream), and fail while it does not
(``tests/test_impl.py``)."""

import types

import torch

from eager import attention, philox, sampling
from kernels.rejection import verify as _PRODUCTION_VERIFY
from stress.core.impl import Implementation

SALT = 0x5EED


def _salted_randint(seed, offset):
    return philox.randint(torch.as_tensor(seed, dtype=torch.int64) ^ SALT, offset)


# Philox keyed by the seed xor a constant: another engine's stream, same interface as reference/philox.py (on any
# device: the eager sampler draws where its logits are, the references on the host)
SALTED_STREAM = types.SimpleNamespace(randint=_salted_randint, rand=philox.rand, uniform=philox.uniform)


def gumbel_with_salted_stream(logits, idx_mapping, temperature, seeds, positions, *, draft=False, logits_cache=None,
                              cache_cols=None):
    """The eager Gumbel sampler drawing from ``SALTED_STREAM`` instead of the suite's stream."""
    saved = sampling.philox
    sampling.philox = SALTED_STREAM
    try:
        return sampling.gumbel_sample(logits, idx_mapping, temperature, seeds, positions, draft=draft,
                                      logits_cache=logits_cache, cache_cols=cache_cols)
    finally:
        sampling.philox = saved


SALTED_GUMBEL = Implementation(gumbel_with_salted_stream, stream=SALTED_STREAM)


def gumbel_caching_after_temperature(logits, idx_mapping, temperature, seeds, positions, *, draft=False,
                                     logits_cache=None, cache_cols=None):
    """The eager Gumbel sampler whose logits cache holds logits divided by the temperature (sampled rows)."""
    tokens = sampling.gumbel_sample(logits, idx_mapping, temperature, seeds, positions, draft=draft,
                                    logits_cache=logits_cache, cache_cols=cache_cols)
    if logits_cache is not None:
        for row, slot in enumerate(idx_mapping.tolist()):
            if slot >= 0 and float(temperature[slot]) > 0:
                logits_cache[slot, int(cache_cols[row])] = logits[row] / temperature[slot]
    return tokens


def always_causal(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale, causal, out):
    """Eager paged attention that attends causally whatever it is asked."""
    attention.paged_attention(query, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                              causal=True, out=out)


def slot_mapping_trusting_its_rows(block_table, query_start_loc, positions, block_size, out):
    """A slot mapping that trusts its caller: no refusals, the null block 0 a real block, each position taken to
    lie inside its row, only entries from len(positions) on padded, nothing written before the first row."""
    starts = query_start_loc.tolist()
    for row in range(len(starts) - 1):
        for token in range(starts[row], starts[row + 1]):
            pos = int(positions[token])
            out[token] = int(block_table[row, pos // block_size]) * block_size + pos % block_size
    out[positions.numel():] = -1


def sampler_greedy_at_zero_only(logits, idx_mapping, temperature, seeds, positions, *, draft=False,
                                logits_cache=None, cache_cols=None):
    """The eager Gumbel sampler for which only a temperature of exactly 0 is greedy: a negative or NaN one is
    divided by as it is, and a row whose every score is NaN gives token 0."""
    tokens = sampling.gumbel_sample(logits, idx_mapping, temperature, seeds, positions, draft=draft,
                                    logits_cache=logits_cache, cache_cols=cache_cols)
    for row, slot in enumerate(idx_mapping.tolist()):
        temp = float(temperature[slot]) if slot >= 0 else 0.0
        if temp < 0 or temp != temp:
            tokens[row] = int(torch.nan_to_num(logits[row] / temp, nan=float("-inf")).argmax())
    return tokens


def verify_rejecting_unsupported_drafts(*args, **kwargs):
    """The verification kernel with the accept test of a ratio p(x) / q(x) that needs q(x) > 0: a draft its
    drafter gave probability 0 is rejected (the planted bug rejects-zero-draft-probability, as an engine's code)."""
    from stress import checks
    from stress.core import patches

    planted = next(m for m in checks.get("rejection.verify").mutants if m.name == "rejects-zero-draft-probability")
    with patches.applied(planted):
        return _PRODUCTION_VERIFY(*args, **kwargs)  # the module's own name is this implementation while it is judged
