"""Reference Gumbel-max sampling: a loop over rows, float64 scores from the same Philox draws.

Mirrors kernels.sampling: slot -1 rows are inert (greedy, seed 0, no cache write), NaN ranks as
-inf, ties go to the lowest token id, temperatures that are not > 0 mean greedy, and the
temperature division is a float32 IEEE division (as the kernel's ``div_rn``). Everything after
it is float64, so each row also reports whether its winner is decided beyond float32 rounding
(``near_tie``): there the kernel may legitimately pick another token.
"""

from typing import NamedTuple

import torch

from reference import philox

DRAFT_NOISE_SALT = 1 << 30
# |float32 kernel score - float64 score| <= EPS * (|scaled logit| + |noise|) + TINY: the noise is
# rounded to float32 once and added once (two half-ulp roundings, doubled for safety).
EPS = 2.0**-22
TINY = 2.0**-120


class Decided(NamedTuple):
    """Expected values with, per leading index, whether float32 rounding may change them."""

    value: torch.Tensor
    near_tie: torch.Tensor  # bool, one per row (or request)


def scaled(logits: torch.Tensor, temp: float) -> torch.Tensor:
    """``logits / temp`` as a float32 IEEE division, then float64."""
    return (logits.to(torch.float32) / torch.tensor(temp, dtype=torch.float32)).to(torch.float64)


def gumbel_noise(gumbel_seed, vocab: int) -> torch.Tensor:
    """float64 Gumbel noise of tokens ``0..vocab-1`` from ``rand(gumbel_seed, token)``."""
    u = philox.rand(gumbel_seed, torch.arange(vocab)).to(torch.float64)
    return -torch.log(-torch.log(u + 1e-20) + 1e-20)


def noise_tolerance(values: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Rounding bound of ``float32(values + float32(noise))`` (0 where the score is infinite)."""
    tol = EPS * (values.abs() + noise.abs()) + TINY
    return torch.where(torch.isfinite(values), tol, torch.zeros_like(tol))


def argmax_decided(scores: torch.Tensor, lo: torch.Tensor | None = None,
                   hi: torch.Tensor | None = None) -> tuple[int, bool]:
    """Lowest-index argmax (NaN as -inf), and whether it is a near tie: some other token's score
    interval ``[lo, hi]`` (where the float32 kernel's score may lie) reaches the winner's.
    Without intervals the scores are exact and equal ones go to the lower index."""
    s = torch.where(torch.isnan(scores), torch.tensor(float("-inf"), dtype=scores.dtype), scores)
    best = int(torch.argmax(s))  # first maximal index
    if lo is None:
        return best, False
    rivals = hi >= lo[best]
    rivals[best] = False
    rivals &= ~((hi == lo) & (hi[best] == lo[best]))  # exact on both sides: the lower index wins
    return best, bool(rivals.any())


def gumbel_max(values: torch.Tensor, noise: torch.Tensor) -> tuple[int, bool]:
    """Argmax of ``values + noise`` as the float32 kernel rounds it, and whether it is a near tie."""
    scores, tol = values + noise, noise_tolerance(values, noise)
    return argmax_decided(scores, scores - tol, scores + tol)


def sample_row(logits: torch.Tensor, temp: float, seed: int, pos: int) -> tuple[int, bool]:
    """One row: greedy when ``temp`` is not > 0, else Gumbel-max keyed by (seed, pos)."""
    if not temp > 0:
        return argmax_decided(logits.to(torch.float64))
    return gumbel_max(scaled(logits, temp), gumbel_noise(philox.randint(seed, pos), logits.numel()))


def gumbel_sample(logits, idx_mapping, temperature, seeds, positions, *, draft=False, logits_cache=None,
                  cache_cols=None):
    """Returns ``(Decided(tokens [R] int64, near_tie [R]), logits_cache after the launch or None)``."""
    num_rows = logits.shape[0]
    tokens = torch.zeros(num_rows, dtype=torch.int64)
    near_tie = torch.zeros(num_rows, dtype=torch.bool)
    cache = None if logits_cache is None else logits_cache.clone()
    salt = DRAFT_NOISE_SALT if draft else 0
    for row in range(num_rows):
        slot = int(idx_mapping[row])
        temp, seed = (float(temperature[slot]), int(seeds[slot])) if slot >= 0 else (0.0, 0)
        if slot >= 0 and cache is not None:
            cache[slot, int(cache_cols[row])] = logits[row]
        tokens[row], near_tie[row] = sample_row(logits[row], temp, seed, int(positions[row]) + salt)
    return Decided(tokens, near_tie), cache
