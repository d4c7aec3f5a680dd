"""The statistical check of verification: many trials of one request (identical logits, distinct
seeds) in one ``verify`` launch; the emitted tokens must follow the target distribution.

Per position i, the tokens of the trials that reach i (all earlier drafts accepted) are
distributed as the target's p_i, whatever q is, as long as the drafts are drawn from q: with
one-hot q the draft is fixed; with draft logits each trial drafts through ``gumbel_sample``
(which also fills the logits cache ``verify`` reads). Judged by chi-square with bins of expected
count < 5 merged and threshold ``df + 10 * sqrt(2 * df)`` (far in the tail: it does not flake),
plus exact invariants: tokens in range, greedy emits the argmax, a one-hot resample never emits
the rejected draft, accepted positions repeat the drafts.
"""

import math
from typing import NamedTuple

import torch

from kernels.rejection import verify
from kernels.sampling import gumbel_sample
from reference import rejection
from stress.core.compare import Divergence

MIN_EXPECTED = 5.0


def verify_trials(target_logits, draft_tokens, draft_logits, temperature, seeds, positions, block_v=None,
                  num_warps=None) -> torch.Tensor:
    """Run ``len(seeds)`` trials of one request; returns their emitted tokens ``[N, k+1]``."""
    trials = seeds.numel()
    depth, vocab = target_logits.shape[0] - 1, target_logits.shape[1]
    dev = target_logits.device
    slots = torch.arange(trials, dtype=torch.int32, device=dev)
    temps = torch.full((trials,), temperature, dtype=torch.float32, device=dev)
    knobs = {"block_v": block_v, "num_warps": num_warps}
    cache = None
    if draft_logits is None:
        drafts = draft_tokens.expand(trials, depth).contiguous()
    else:
        cache = torch.empty(trials, depth, vocab, dtype=torch.float32, device=dev)
        cols = torch.arange(depth, device=dev).repeat(trials)
        drafts = gumbel_sample(draft_logits.repeat(trials, 1), slots.repeat_interleave(depth), temps, seeds,
                               positions.repeat_interleave(depth) + cols, draft=True, logits_cache=cache,
                               cache_cols=cols.to(torch.int32), **knobs).view(trials, depth)
    out = torch.empty(trials, depth + 1, dtype=torch.int64, device=dev)
    counts = torch.empty(2, trials, dtype=torch.int32, device=dev)
    # Every trial reads the one copy of the logits (request stride 0): a 128k vocabulary times
    # 20,000 trials would not fit materialized.
    verify(target_logits.expand(trials, depth + 1, vocab), drafts, slots, temps, seeds, positions, out,
           counts[0], counts[1], draft_logits=cache, **knobs)
    return out


class TargetDistribution(NamedTuple):
    probs: torch.Tensor  # [k+1, V] float64: p_i at each position
    greedy: bool
    one_hot_drafts: torch.Tensor | None  # [k] the fixed drafts when q is one-hot


def expected_distribution(target_logits, draft_tokens, draft_logits, temperature, seeds, positions):
    """What the trials must follow: the target distribution at each position (one-hot argmax when greedy)."""
    greedy = not temperature > 0
    if greedy:
        probs = torch.nn.functional.one_hot(target_logits.nan_to_num(nan=float("-inf")).argmax(-1),
                                            target_logits.shape[1]).to(torch.float64)
    else:
        probs = torch.stack([rejection.softmax(row, temperature)[0] for row in target_logits])
    return TargetDistribution(probs, greedy, draft_tokens if draft_logits is None else None)


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """Statistic and degrees of freedom, bins of expected count < 5 pooled (into the largest bin if
    the pool is still below 5)."""
    keep = expected >= MIN_EXPECTED
    obs, exp = list(observed[keep].tolist()), list(expected[keep].tolist())
    pooled_obs, pooled_exp = float(observed[~keep].sum()), float(expected[~keep].sum())
    if pooled_exp >= MIN_EXPECTED:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    elif exp:
        largest = max(range(len(exp)), key=exp.__getitem__)
        obs[largest] += pooled_obs
        exp[largest] += pooled_exp
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    return stat, max(len(exp) - 1, 0)


def _invariant_failures(tokens: torch.Tensor, expected: TargetDistribution) -> list[str]:
    trials, width = tokens.shape
    vocab = expected.probs.shape[1]
    emitted = tokens >= 0
    lengths = emitted.sum(1)
    problems = []
    if bool((tokens >= vocab).any()) or bool((tokens < -1).any()):
        problems.append("tokens out of range")
    if not bool((lengths >= 1).all()) or not bool((emitted == (torch.arange(width) < lengths[:, None])).all()):
        problems.append("emitted tokens are not a prefix followed by -1")
    drafts = expected.one_hot_drafts
    if drafts is not None and width > 1:
        # per trial, its last emitted position: a resample there must differ from that position's draft,
        # and every position before it must repeat the drafts; the first trial that breaks either is named.
        # A trial that emitted nothing (already a problem above) indexes from the end, as Python's -1 does.
        last = lengths - 1
        at_last = tokens.gather(1, (last % width)[:, None])[:, 0]
        resampled = (last < width - 1) & (at_last == drafts[last % (width - 1)])
        prefix = torch.arange(width - 1)[None, :] < last[:, None]
        differs = (last < 0) | ((tokens[:, :width - 1] != drafts[None, :]) & prefix).any(1)
        broken = (resampled | differs).nonzero()
        if broken.numel():
            trial = int(broken[0])
            if bool(resampled[trial]):
                spot = int(last[trial])
                problems.append(f"trial {trial} resampled its rejected draft {int(drafts[spot])} at position {spot}")
            else:
                problems.append(f"trial {trial}: accepted tokens differ from the drafts")
    return problems


def judge_trials(output: str, expected: TargetDistribution, got) -> Divergence | None:
    """Invariants, then per position: greedy exact, sampled by chi-square."""
    tokens = got.detach().cpu()
    problems = _invariant_failures(tokens, expected)
    for i, p in enumerate(expected.probs):
        reached = tokens[:, i][tokens[:, i] >= 0].clamp(max=p.numel() - 1)
        if reached.numel() == 0:
            continue
        counts = torch.bincount(reached, minlength=p.numel()).to(torch.float64)
        if expected.greedy:
            if counts[int(p.argmax())] != reached.numel():
                problems.append(f"position {i}: greedy emitted something other than the argmax {int(p.argmax())}")
            continue
        stat, df = chi_square(counts, p * reached.numel())
        if df < 1:
            continue  # too few trials reached this position for a test
        limit = df + 10 * math.sqrt(2 * df)
        if stat > limit:
            problems.append(f"position {i}: chi-square {stat:.1f} > {limit:.1f} (df {df}, {reached.numel()} trials)")
    if not problems:
        return None
    return Divergence(output, len(problems), [], problem="; ".join(problems[:4]))
