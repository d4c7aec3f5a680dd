"""stress.compare.exact_unless_near_tie: near-tie rows are counted, not judged, and must stay rare."""

import torch

from reference.sampling import Decided
from stress.compare import Divergence, Tolerated, exact_unless_near_tie


def _decided(values, near_tie):
    return Decided(torch.tensor(values), torch.tensor(near_tie))


def test_plain_tensors_compare_exactly():
    assert exact_unless_near_tie("t", torch.tensor([1, 2]), torch.tensor([1, 2])) is None
    assert isinstance(exact_unless_near_tie("t", torch.tensor([1, 2]), torch.tensor([1, 3])), Divergence)


def test_a_near_tie_row_is_reported_not_judged():
    expected = _decided([[1, 2], [3, 4]] + [[0, 0]] * 20, [False, True] + [False] * 20)
    got = torch.tensor([[1, 2], [9, 9]] + [[0, 0]] * 20)
    found = exact_unless_near_tie("tokens", expected, got)
    assert isinstance(found, Tolerated) and "1 of 22" in found.lines()[0]


def test_other_rows_are_still_exact():
    expected = _decided([[1, 2], [3, 4]], [False, True])
    found = exact_unless_near_tie("tokens", expected, torch.tensor([[1, 5], [3, 4]]))
    assert isinstance(found, Divergence) and found.total == 1


def test_a_flood_of_near_ties_is_a_divergence():
    expected = _decided(list(range(10)), [True] * 3 + [False] * 7)
    found = exact_unless_near_tie("tokens", expected, torch.arange(10))
    assert isinstance(found, Divergence) and "near ties" in found.problem
