"""Per-step depth: an explicit 0 is kept (fix 7), the zero-width draft view, the acceptance-length
controller and its per-band variant (docs/contracts/spec.md#specdepth), with the upstream expectations worked by
hand."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.spec.depth import (
    PLACEHOLDER,
    AcceptanceLengthController,
    BandAcceptanceLengthController,
    band_lookup,
    limit_draft_tokens,
    resolve_num_spec_tokens,
    spec_token_placeholders,
)
from reference.spec import depth as ref


@pytest.mark.parametrize("value,expected", [(None, 5), (2, 2), (0, 0)])
def test_default_depth_only_when_the_scheduler_gave_none(value, expected):
    assert resolve_num_spec_tokens(value, default=5) == expected


def test_async_placeholders_follow_the_resolved_depth():
    assert spec_token_placeholders(None, 3) == [PLACEHOLDER] * 3
    assert spec_token_placeholders(2, 3) == [PLACEHOLDER] * 2
    assert spec_token_placeholders(0, 3) == []


def test_negative_depths_are_refused():
    with pytest.raises(ValueError, match="^value:"):
        resolve_num_spec_tokens(-1, 5)
    with pytest.raises(ValueError, match="^default:"):
        resolve_num_spec_tokens(None, -1)


def test_limit_to_the_adaptive_depth_is_a_view():
    draft = torch.tensor([[1, 2, 3], [4, 5, 6]])
    limited = limit_draft_tokens(draft, 2, 3)
    assert limited.tolist() == [[1, 2], [4, 5]]
    assert limited.untyped_storage().data_ptr() == draft.untyped_storage().data_ptr()


def test_depth_zero_gives_the_zero_width_view_of_the_same_storage():
    """Fix 7 (e): [[1,2,3],[4,5,6]] limited to 0 is a (2, 0) view, not an error."""
    draft = torch.tensor([[1, 2, 3], [4, 5, 6]])
    limited = limit_draft_tokens(draft, 0, 3)
    assert limited.shape == (2, 0)
    assert limited.untyped_storage().data_ptr() == draft.untyped_storage().data_ptr()


def test_a_speculator_that_drafted_nothing_passes_through():
    draft = torch.empty(4, 0, dtype=torch.int64)
    assert limit_draft_tokens(draft, 2, 3) is draft


@pytest.mark.parametrize("shape,n,k_max,name", [
    ((2, 3), 4, 3, "n"),  # above k_max
    ((2, 3), -1, 3, "n"),
    ((2, 2), 3, 3, "draft"),  # fewer columns than scheduled
    ((2, 4), 2, 3, "draft"),  # wider than k_max
    ((6,), 2, 3, "draft"),
    ((2, 3), 2, 0, "k_max"),
])
def test_limit_refuses_impossible_requests(shape, n, k_max, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        limit_draft_tokens(torch.zeros(shape, dtype=torch.int64), n, k_max)


def test_controller_starts_at_max_and_waits_for_its_window():
    """docs/contracts/spec.md#specdepth: 2 of 10 tokens accepted over a window of 2 steps: mean 1.0 per draft,
    target 2."""
    controller = AcceptanceLengthController(max_depth=5, window=2)
    assert controller.depth == 5
    assert not controller.observe(2, 10, 2)
    assert controller.depth == 5
    assert controller.observe(2, 10, 2)
    assert controller.depth == 2


def test_nothing_accepted_drops_to_one():
    controller = AcceptanceLengthController(max_depth=5, window=1)
    controller.observe(1, 5, 0)
    assert controller.depth == 1


def test_target_rounds_and_depth_creeps_up():
    """237 of 500 over 100 drafts: mean 2.37, floor(3.87) = 3, a drop to 3; then 28 of 30 over 10 drafts:
    mean 2.8, target 4, one step up."""
    controller = AcceptanceLengthController(max_depth=5, window=1)
    controller.observe(100, 500, 237)
    assert controller.depth == 3
    controller.observe(10, 30, 28)
    assert controller.depth == 4


def test_recovery_climbs_one_step_per_window():
    controller = AcceptanceLengthController(max_depth=8, window=1)
    controller.observe(1, 8, 0)
    assert controller.depth == 1
    for expected in range(2, 9):
        controller.observe(1, 7, 7)  # target 8 every window
        assert controller.depth == expected
    controller.observe(1, 8, 8)
    assert controller.depth == 8


def test_empty_steps_do_not_count_and_bad_counts_change_nothing():
    controller = AcceptanceLengthController(max_depth=3, window=1)
    assert not controller.observe(0, 0, 0)
    assert controller.depth == 3
    with pytest.raises(ValueError, match="^num_accepted_tokens:"):
        controller.observe(1, 1, 2)
    with pytest.raises(ValueError, match="^num_draft_tokens:"):
        controller.observe(0, 1, 0)
    assert controller.depth == 3
    controller.observe(2, 6, 0)  # the refused steps left the window empty: this one closes it alone
    assert controller.depth == 1


def test_controller_arguments_are_validated():
    with pytest.raises(ValueError, match="^max_depth:"):
        AcceptanceLengthController(0, 1)
    with pytest.raises(ValueError, match="^window:"):
        AcceptanceLengthController(3, 0)
    with pytest.raises(ValueError, match="^initial_depth:"):
        AcceptanceLengthController(3, 1, initial_depth=4)


def test_band_lookup_fills_gaps_and_the_tail_and_caps_depths():
    """[(1,16,4),(32,128,2)]: 17..31 keep 4, 129.. keep 2; with Kmax 3 the 4 is capped to 3."""
    table = band_lookup([(32, 128, 2), (1, 16, 4)], max_batch_size=200, max_depth=3)
    assert len(table) == 201 and table[0] == 0
    assert set(table[1:32]) == {3}
    assert set(table[32:]) == {2}


@pytest.mark.parametrize("schedule", [[(1, 16, 4), (16, 32, 2)], [(2, 8, 1)], [], [(1, 4, -1)], [(3, 1, 1)]])
def test_band_lookup_refuses_overlaps_and_holes_at_the_start(schedule):
    with pytest.raises(ValueError, match="^schedule:"):
        band_lookup(schedule, 64, 4)


def test_each_band_adapts_on_its_own_and_a_zero_band_never_drafts():
    caps = band_lookup([(1, 2, 3), (3, 4, 0), (5, 8, 2)], max_batch_size=8, max_depth=3)
    bands = BandAcceptanceLengthController(caps, window=1)
    assert [bands.depth_for(b) for b in range(1, 9)] == [3, 3, 0, 0, 2, 2, 2, 2]
    assert not bands.observe(3, 0, 0, 0)
    bands.observe(1, 1, 3, 0)  # nothing accepted at batch size 1: its band drops to 1
    assert [bands.depth_for(b) for b in range(1, 9)] == [1, 1, 0, 0, 2, 2, 2, 2]
    with pytest.raises(ValueError, match="^batch_size:"):
        bands.depth_for(9)


def test_two_bands_of_one_cap_apart_keep_their_own_controllers():
    caps = band_lookup([(1, 2, 3), (3, 4, 1), (5, 8, 3)], max_batch_size=8, max_depth=3)
    bands = BandAcceptanceLengthController(caps, window=1)
    bands.observe(1, 1, 3, 0)  # nothing accepted at batch size 1: only the first band drops
    assert [bands.depth_for(b) for b in range(1, 9)] == [1, 1, 1, 1, 3, 3, 3, 3]


def test_band_controllers_start_at_the_smaller_of_initial_and_cap():
    caps = band_lookup([(1, 2, 3), (3, 4, 1)], max_batch_size=4, max_depth=3)
    assert [BandAcceptanceLengthController(caps, 1, initial_depth=2).depth_for(b) for b in (1, 3)] == [2, 1]


def test_a_disabled_band_flows_through_as_depth_zero():
    """Fix 7 end to end: a K = 0 band gives depth 0, kept by resolve, no placeholders, a zero-width draft."""
    caps = band_lookup([(1, 4, 3), (5, 8, 0)], max_batch_size=8, max_depth=3)
    depth = BandAcceptanceLengthController(caps, window=2).depth_for(6)
    draft = torch.arange(18).view(6, 3)
    assert resolve_num_spec_tokens(depth, 3) == 0
    assert spec_token_placeholders(depth, 3) == []
    assert limit_draft_tokens(draft, resolve_num_spec_tokens(depth, 3), 3).shape == (6, 0)


@given(st.integers(1, 8), st.integers(1, 4),
       st.lists(st.tuples(st.integers(0, 5), st.integers(0, 8), st.integers(0, 8)), max_size=30))
def test_controller_stays_in_range_and_rises_at_most_one_per_window(max_depth, window, steps):
    controller = AcceptanceLengthController(max_depth, window)
    for num_drafts, per_draft, accepted_per_draft in steps:
        before = controller.depth
        accepted = min(accepted_per_draft, per_draft) * num_drafts
        closed = controller.observe(num_drafts, per_draft * num_drafts, accepted)
        assert 1 <= controller.depth <= max_depth
        assert controller.depth <= before + 1
        assert closed or controller.depth == before


@pytest.mark.parametrize("impl", [pytest.param(None, id="production"), pytest.param(ref, id="reference")])
def test_the_spec_controller_cases_hold_for_both_implementations(impl):
    make = AcceptanceLengthController if impl is None else impl.AcceptanceLengthController
    windowed = make(5, 2)
    windowed.observe(2, 10, 2)
    windowed.observe(2, 10, 2)
    rejected = make(5, 1)
    rejected.observe(1, 5, 0)
    creeping = make(5, 1)
    creeping.observe(100, 500, 237)
    after_drop = creeping.depth
    creeping.observe(10, 30, 28)
    assert (windowed.depth, rejected.depth, after_drop, creeping.depth) == (2, 1, 3, 4)


def test_the_band_caps_the_depth_and_the_placeholders():
    """Upstream: Kmax 3 with the schedule [(1, 4, 2)] schedules depth 2, and the async scheduler reserves 2."""
    depth = BandAcceptanceLengthController(band_lookup([(1, 4, 2)], 4, 3), window=1).depth_for(1)
    assert depth == 2
    assert spec_token_placeholders(depth, 3) == [PLACEHOLDER] * 2
