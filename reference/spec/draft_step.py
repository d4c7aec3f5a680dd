"""Reference draft step: the draft layer of kernels.spec.draft_step in float64, composed from the
references of its parts, for the live batch only (padding must not change what a live row computes).

Draft-input preparation (reference.draft_inputs), the fix-4 shift (reference.block_table), the
query rows' K/V write (reference.kv_cache), paged attention (reference.attention) and the Gumbel
decision (reference.sampling's helpers). Every float result carries an error bound for the float32
step: ``REL`` times the same computation over absolute values (``|a| @ |b|`` for a product, attention
over ``|v|`` for an attention output). A token whose decision lies within its bounds of a tie is
flagged ``near_tie``, as ``reference.sampling.Decided`` does for rounding alone.

Batches are read by attribute (``idx_mapping``, ``target_query_start_loc``, ... ``num_draft_tokens``:
tuples of ints and floats, see ``stress.graphs.Batch``). The logits cache starts every batch as all
NaN (poison), as the harness leaves it before each step.

The configuration is read for its fields alone (sizes, flags); what the step derives from them (the
query length, the attention scale 1 / sqrt(head_dim)) is derived again here, so a slip in the step's
own derivation shows instead of being shared.
"""

import math
from typing import NamedTuple

import torch

from reference import attention, block_table, draft_inputs, kv_cache, philox, sampling
from reference.spec import backends, graphs

# float32 error allowance per unit of the absolute-value computation; the step's measured error stays
# under 6% of it for hidden states and under 1% for logits (CPU interpreter, every replay family)
REL = 2.0**-15


class ExpectedStep(NamedTuple):
    draft_tokens: sampling.Decided  # [B * K] row-major, near ties flagged per sampling row
    logits_cache: torch.Tensor  # [S, K_max, V] float64 after the step (NaN where nothing is written)
    logits_bound: torch.Tensor  # same shape: allowed |error| (0 where the value must be exact)
    hidden: torch.Tensor | None  # [B * Q, H, D] the live rows of the backbone output; None if nothing ran
    hidden_bound: torch.Tensor | None


class ExpectedRun(NamedTuple):
    steps: tuple[ExpectedStep, ...]
    k_cache: torch.Tensor  # float64, after every batch
    v_cache: torch.Tensor
    k_bound: torch.Tensor
    v_bound: torch.Tensor


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX-style rotary embedding in float64: the two halves of the last dimension rotate together."""
    half = x.shape[-1] // 2
    inv_freq = theta ** -(torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_bound(bound: torch.Tensor) -> torch.Tensor:
    """A bound on the rotated error: each output mixes one element of each half."""
    half = bound.shape[-1] // 2
    both = bound[..., :half] + bound[..., half:]
    return torch.cat([both, both], dim=-1)


def decide(logits: torch.Tensor, bound: torch.Tensor, temp: float, seed: int, pos: int) -> tuple[int, bool]:
    """The token a draft row samples (greedy unless ``temp > 0``), and whether it is a near tie."""
    if not temp > 0:
        return sampling.argmax_decided(logits, logits - bound, logits + bound)
    values = logits / temp
    noise = sampling.gumbel_noise(philox.randint(seed, pos + sampling.DRAFT_NOISE_SALT), logits.numel())
    scores = values + noise
    tol = sampling.noise_tolerance(values, noise) + bound / temp
    return sampling.argmax_decided(scores, scores - tol, scores + tol)


def _t(values, dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def query_len(config, num_draft_tokens: int) -> int:
    """Query rows per request: the drafts, plus DFlash's bonus row (none in anchor-first mode)."""
    return num_draft_tokens + _new_tokens(config)


def _new_tokens(config) -> int:
    return 0 if config.anchor_first else 1


def prepared_inputs(config, batch) -> dict | None:
    """``reference.draft_inputs.prepare_draft_inputs`` for the live batch, by output name; None if refused."""
    k, live = batch.num_draft_tokens, len(batch.idx_mapping)
    q = query_len(config, k)
    num_target_rows = batch.target_query_start_loc[-1]
    i32, i64 = torch.int32, torch.int64
    prepared, *outputs = draft_inputs.prepare_draft_inputs(
        idx_mapping=_t(batch.idx_mapping, i32), target_query_start_loc=_t(batch.target_query_start_loc, i32),
        target_positions=_t(batch.target_positions, i64), num_sampled=_t(batch.num_sampled, i32),
        num_rejected=_t(batch.num_rejected, i32), last_sampled=_t(batch.last_sampled, i64),
        next_prefill_tokens=_t(batch.next_prefill_tokens, i32), num_cached_tokens=_t(batch.num_cached_tokens, i32),
        block_table=_t(batch.block_table, i32), block_size=config.block_size, num_draft_tokens=k,
        anchor_first=config.anchor_first, mask_token_id=config.mask_token_id, max_model_len=config.max_model_len,
        context_positions=torch.zeros(num_target_rows, dtype=i64),
        context_slot_mapping=torch.zeros(num_target_rows, dtype=i64), input_ids=torch.zeros(live * q, dtype=i32),
        positions=torch.zeros(live * q, dtype=i64), query_slot_mapping=torch.zeros(live * q, dtype=i64),
        sample_indices=torch.zeros(live * k, dtype=i64), sample_pos=torch.zeros(live * k, dtype=i64),
        sample_idx_mapping=torch.zeros(live * k, dtype=i32), query_start_loc=torch.zeros(live + 1, dtype=i32),
        seq_lens=torch.zeros(live, dtype=i32), draft_tokens=torch.zeros(live, k, dtype=i64))
    return dict(zip(draft_inputs.OUTPUTS, outputs, strict=True)) if prepared else None


def step(config, weights, caches, batch, width: int) -> ExpectedStep:
    """One batch; ``caches`` = [k_cache, v_cache, k_bound, v_bound] (float64) is updated in place. ``width``: the
    step's static table, whose columns past the batch's own are the null block."""
    embed, wq, wk, wv, w_out = weights
    num_slots, kmax, vocab = len(batch.temperature), config.max_draft_tokens, config.vocab_size
    k, live = batch.num_draft_tokens, len(batch.idx_mapping)
    logits_cache = torch.full((num_slots, kmax, vocab), float("nan"), dtype=torch.float64)
    logits_bound = torch.zeros_like(logits_cache)
    if k == 0 or live == 0 or (inputs := prepared_inputs(config, batch)) is None:
        # a depth-0 band drafts nothing; a refused batch (fix 4) gets -1 placeholders and nothing else
        placeholders = torch.full((live * k,), -1, dtype=torch.int64)
        return ExpectedStep(sampling.Decided(placeholders, torch.zeros(live * k, dtype=torch.bool)), logits_cache,
                            logits_bound, None, None)
    num_tokens = live * query_len(config, k)
    table = torch.nn.functional.pad(_t(batch.block_table, torch.int32), (0, width - len(batch.block_table[0])))
    table = block_table.shift_block_table_rows(table, _t(batch.idx_mapping, torch.int32),
                                               _t(batch.num_cached_tokens, torch.int32), inputs["seq_lens"],
                                               config.block_size)
    ids, positions = inputs["input_ids"].long(), inputs["positions"]
    h = embed[ids]

    def project(w, heads):
        return (h @ w).view(num_tokens, heads, config.head_dim), REL * (h.abs() @ w.abs()).view(
            num_tokens, heads, config.head_dim)

    (query, _), (key, key_bound), (value, value_bound) = (project(wq, config.num_heads),
                                                          project(wk, config.num_kv_heads),
                                                          project(wv, config.num_kv_heads))
    query, key = rope(query, positions, config.rope_theta), rope(key, positions, config.rope_theta)
    slots = inputs["query_slot_mapping"]
    caches[0], caches[1] = kv_cache.write_kv(key, value, slots, caches[0], caches[1])
    caches[2], caches[3] = kv_cache.write_kv(rope_bound(key_bound), value_bound, slots, caches[2], caches[3])

    def attend(v_cache):
        return attention.paged_attention(query, caches[0], v_cache, table, inputs["seq_lens"],
                                         inputs["query_start_loc"], scale=1 / math.sqrt(config.head_dim),
                                         causal=config.causal, out=torch.zeros(query.shape, dtype=torch.float64))

    hidden, hidden_abs = attend(caches[1]), attend(caches[1].abs())
    rows = inputs["sample_indices"]
    logits = hidden.flatten(1)[rows] @ w_out
    bound = REL * (hidden_abs.flatten(1)[rows] @ w_out.abs())
    tokens = torch.zeros(len(rows), dtype=torch.int64)
    near_tie = torch.zeros(len(rows), dtype=torch.bool)
    for row, (slot, pos) in enumerate(zip(inputs["sample_idx_mapping"].tolist(), inputs["sample_pos"].tolist(),
                                          strict=True)):
        tokens[row], near_tie[row] = decide(logits[row], bound[row], batch.temperature[slot], batch.seeds[slot], pos)
        logits_cache[slot, row % k] = logits[row]
        logits_bound[slot, row % k] = bound[row]
    return ExpectedStep(sampling.Decided(tokens, near_tie), logits_cache, logits_bound, hidden, REL * hidden_abs)


def static_width(batches) -> int:
    """The step's static block-table width over ``batches``: the widest batch's, as
    ``stress.oracles.graph_replay.build`` sizes it."""
    return max(len(row) for batch in batches for row in batch.block_table)


def expected_replay(*, config, embed, wq, wk, wv, w_out, k_cache, v_cache, batches, setup=None,
                    width: int | None = None) -> ExpectedRun:
    """Every batch in order over one KV cache; ``setup`` (how the step is captured) changes nothing here. ``width``:
    the step's static table (default: ``static_width(batches)``)."""
    width = width or static_width(batches)
    weights = tuple(w.to(torch.float64) for w in (embed, wq, wk, wv, w_out))
    caches = [k_cache.to(torch.float64), v_cache.to(torch.float64),
              torch.zeros(k_cache.shape, dtype=torch.float64), torch.zeros(v_cache.shape, dtype=torch.float64)]
    steps = tuple(step(config, weights, caches, batch, width) for batch in batches)
    return ExpectedRun(steps, *caches)


def expected_lifetime(*, config, embed, wq, wk, wv, w_out, k_cache, v_cache, batches, setup=None) -> ExpectedRun:
    """The first pool owner's batches (every other one, from the first) in order, as ``expected_replay``."""
    return expected_replay(config=config, embed=embed, wq=wq, wk=wk, wv=wv, w_out=w_out, k_cache=k_cache,
                           v_cache=v_cache, batches=batches[::2],
                           width=static_width(batches))


class ExpectedEagerRun(NamedTuple):
    run: ExpectedRun
    dispatched: tuple[tuple[str, int | None, int], ...]  # per batch: (mode, padded requests, tokens)
    to_capture: tuple[tuple[int, int, int], ...]  # (requests, tokens, width) of every graph to capture, sorted


def dispatched(config, setup, num_reqs: int, num_draft_tokens: int) -> tuple[str, int | None, int]:
    """The graph a draft run of ``num_reqs`` requests at ``num_draft_tokens`` dispatches to, from the documented
    configuration alone (docs/contracts/graphs.md#graphseager_step): nothing for an empty run, else the first
    staged FULL graph of width depth + n_new that fits, when the backend may be captured; eager otherwise.
    The case's two backends claim the same support on every capability, so it is judged at SM90's."""
    if num_draft_tokens == 0 or num_reqs == 0:
        return ("none", None, 0)
    width = query_len(config, num_draft_tokens)
    candidates = _candidates(config, setup)
    if candidates is not None and num_reqs <= setup.max_num_reqs:
        found = graphs.dispatch(candidates, num_reqs, num_reqs * width, width)
        if found.mode == "FULL":
            return ("full", found.num_reqs, found.num_tokens)
    return ("none", None, num_reqs * width)


def to_capture(config, setup) -> tuple[tuple[int, int, int], ...]:
    """The FULL graphs a capture records: every staged one of depth 1..K (a depth-0 band drafts nothing), none
    when the backend may not be captured."""
    candidates = _candidates(config, setup)
    staged = [] if candidates is None else candidates.full
    return tuple(sorted((d.num_reqs, d.num_tokens, d.uniform) for d in staged
                        if 1 <= d.uniform - _new_tokens(config) <= config.max_draft_tokens))


def _candidates(config, setup):
    """The draft's staged graphs (Q = K + n_new wide at most), or None when its backend may not be captured."""
    if backends.draft_graph_mode(setup.backend, 9, not config.causal) != "FULL":
        return None
    max_query_len = query_len(config, config.max_draft_tokens)
    return graphs.build_candidates(setup.capture_sizes, setup.max_num_reqs, max_query_len, config.max_draft_tokens,
                                   setup.schedule, small_grid=setup.small_grid)


def expected_eager_step(*, config, setup, embed, wq, wk, wv, w_out, k_cache, v_cache, batches) -> ExpectedEagerRun:
    """``expected_replay``, the graph each batch dispatches to and the graphs a capture records."""
    run = expected_replay(config=config, embed=embed, wq=wq, wk=wk, wv=wv, w_out=w_out, k_cache=k_cache,
                          v_cache=v_cache, batches=batches)
    return ExpectedEagerRun(run, tuple(dispatched(config, setup, len(b.idx_mapping), b.num_draft_tokens)
                                       for b in batches), to_capture(config, setup))
