"""stress.oracles.distribution: the chi-square judge passes honest samples and catches planted skews."""

import numpy as np
import torch

from stress.core.compare import Divergence
from stress.oracles import distribution


def _expected(probs, greedy=False, drafts=None):
    return distribution.TargetDistribution(torch.tensor(probs, dtype=torch.float64), greedy,
                                           None if drafts is None else torch.tensor(drafts))


def test_chi_square_pools_small_bins():
    stat, df = distribution.chi_square(torch.tensor([50.0, 48, 1, 1]), torch.tensor([49.0, 49, 1, 1]))
    assert df == 1  # the two bins expecting 1 pool into one below 5, folded into the largest
    assert abs(stat - (1 / 51 + 1 / 49)) < 1e-9  # bin 0 becomes 52 observed vs 51 expected


def test_honest_samples_pass():
    rng = np.random.default_rng(0)
    probs = [[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]
    tokens = torch.from_numpy(np.stack([rng.choice(3, 4000, p=p) for p in probs], 1))
    assert distribution.judge("tokens", _expected(probs), tokens) is None


def test_skewed_samples_fail():
    tokens = torch.tensor([[0, -1]] * 60 + [[1, -1]] * 40)
    found = distribution.judge("tokens", _expected([[0.2, 0.8], [0.5, 0.5]]), tokens)
    assert isinstance(found, Divergence) and "chi-square" in found.problem


def test_resampled_rejected_draft_fails():
    """Trial 1 was rejected at position 0 and resampled its own draft (one-hot q)."""
    tokens = torch.tensor([[1, 0], [1, -1]])
    found = distribution.judge("tokens", _expected([[0.5, 0.5], [0.5, 0.5]], drafts=[1]), tokens)
    assert isinstance(found, Divergence) and "rejected draft" in found.problem


def test_greedy_must_emit_the_argmax():
    found = distribution.judge("tokens", _expected([[0.0, 1.0], [1.0, 0.0]], greedy=True),
                               torch.tensor([[1, 0], [0, -1]]))
    assert isinstance(found, Divergence) and "argmax" in found.problem


def test_tokens_out_of_range_fail():
    found = distribution.judge("tokens", _expected([[0.5, 0.5]]), torch.tensor([[2], [0]]))
    assert isinstance(found, Divergence) and "range" in found.problem
