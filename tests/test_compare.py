"""stress.core.compare.exact_unless_near_tie: near-tie rows are counted, not judged; too many leave a case unjudged."""

import pytest
import torch

from reference.sampling import Decided
from stress.core import compare
from stress.core.compare import Divergence, Tolerated, Unjudged, exact_unless_near_tie


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


def test_a_flood_of_near_ties_leaves_the_output_unjudged():
    """The flags come from the inputs, not the kernel: too many means not_checked, never a pass."""
    expected = _decided(list(range(10)), [True] * 3 + [False] * 7)
    found = exact_unless_near_tie("tokens", expected, torch.arange(10))
    assert isinstance(found, Unjudged) and "3 of 10 rows are near ties" in found.lines()[0]


def test_a_flood_does_not_hide_a_wrong_judged_row():
    expected = _decided(list(range(10)), [True] * 3 + [False] * 7)
    found = exact_unless_near_tie("tokens", expected, torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 0]))
    assert isinstance(found, Divergence) and found.total == 1


def test_runner_reports_an_unjudged_case_as_not_checked():
    from stress.core import cases, oracle
    from stress.core.types import RETURN, Case, Check

    def family(rng, device, launch):
        return Case(inputs={"x": torch.arange(10)})

    check = Check(name="flood", kernel=lambda x: x.clone(), families={"f": family}, outputs=(RETURN,),
                  reference=lambda x: _decided(x.tolist(), [True] * 3 + [False] * 7), compare=exact_unless_near_tie)
    case = cases.build_case(check, "f", 1, "cpu")
    verdict, details = oracle.differential(check, case, cases.expected_outputs(check, case), "cpu")
    assert verdict == "not_checked:near ties" and "too few rows judged" in details[0]


def test_floats_compare_bit_for_bit():
    """-0.0 is not 0.0 and a NaN must keep its payload; the report shows the bits that differ."""
    payload = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    found = compare.exact("x", torch.tensor([0.0, float("nan"), 1.0]), torch.cat([torch.tensor([-0.0]), payload,
                                                                               torch.tensor([1.0])]))
    assert found.total == 2
    assert found.lines() == ["x: 2 element(s) differ",
                             "  x[0]: expected 0.0 (bits 0x00000000), got -0.0 (bits 0x80000000)",
                             "  x[1]: expected nan (bits 0x7fc00000), got nan (bits 0x7fc00001)"]
    assert compare.exact("x", torch.tensor([float("nan")], dtype=torch.float64),
                         torch.tensor([float("nan")], dtype=torch.float64)) is None


def test_a_nan_or_infinite_reference_is_matched_exactly_not_bounded():
    """A NaN row in the reference (a NaN score) sets no bound: before, its NaN baseline error made the bound NaN
    and every element passed. A finite element beside it is still judged against the finite baseline."""
    want = torch.tensor([float("nan"), float("inf"), 1.0], dtype=torch.float64)
    expected = compare.Float64Expected(value=want, baseline=torch.tensor([float("nan"), float("inf"), 1.0]),
                                       computed=torch.ones(3, dtype=torch.bool), floor=0.0)
    assert isinstance(compare.within_float32_baseline("o", expected, torch.tensor([float("nan"), float("inf"), 1.0])),
                      Tolerated)
    for got in ([0.5, float("inf"), 1.0], [float("nan"), float("-inf"), 1.0], [float("nan"), float("inf"), 1.5]):
        found = compare.within_float32_baseline("o", expected, torch.tensor(got))
        assert isinstance(found, Divergence) and found.total == 1, got


def test_input_rounding_is_added_only_to_an_output_the_baseline_bound_rejects():
    """``rounding`` (attention's score rounding) widens the bound of a rejected output and is not asked of one
    that passes; an error past both still diverges, and the message names the added term."""
    asked = []

    def rounding():
        asked.append(1)
        return 0.5

    want = torch.tensor([1.0, 2.0], dtype=torch.float64)
    expected = compare.Float64Expected(value=want, baseline=torch.tensor([1.0, 2.1]),
                                       computed=torch.ones(2, dtype=torch.bool), floor=0.0, rounding=rounding)
    assert isinstance(compare.within_float32_baseline("o", expected, torch.tensor([1.0, 2.15])), Tolerated)
    assert not asked  # within twice the baseline's 0.1: the term is never computed
    passed = compare.within_float32_baseline("o", expected, torch.tensor([1.0, 2.6]))
    assert isinstance(passed, Tolerated) and "input rounding 0.5" in passed.note and asked == [1]
    found = compare.within_float32_baseline("o", expected, torch.tensor([1.0, 2.8]))  # past 0.2 + 0.5
    assert isinstance(found, Divergence) and found.total == 1 and "+ input rounding 0.5" in found.lines()[0]


def test_score_rounding_grows_with_the_dot_products_that_carry_weight():
    """One float32 ulp of the largest weighted |q||k| dot times the values' size: keys a thousand above the
    rest raise it a thousandfold; a key whose score overflows float32 (no weight, or a NaN row) adds nothing."""
    from stress.families.attention import score_rounding

    query = torch.tensor([[[4.0, 1.0, 1.0, 1.0]]])
    k_cache = torch.ones(1, 4, 1, 4)  # one block of 4 slots, one KV head, head dim 4
    inputs = {"query": query, "k_cache": k_cache, "block_table": torch.zeros(1, 1, dtype=torch.int32),
              "seq_lens": torch.tensor([4], dtype=torch.int32), "query_start_loc": torch.tensor([0, 1]),
              "scale": 0.5, "causal": False}
    eps = torch.finfo(torch.float32).eps
    assert score_rounding(inputs, 2.0) == pytest.approx(7 * 0.5 * eps * 2.0)
    k_cache[0, 1, 0, 0] = -1000.0  # |q||k| counts the size, not the sign
    assert score_rounding(inputs, 2.0) == pytest.approx((4000 + 3) * 0.5 * eps * 2.0)
    k_cache[0, 1, 0, 0] = 1e38  # 4e38: past float32, so its score is +inf and carries no finite weight
    assert score_rounding(inputs, 2.0) == pytest.approx(7 * 0.5 * eps * 2.0)
