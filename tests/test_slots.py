"""Request slots: LIFO recycling in sorted id order, private fallback seeds, cached counts per admission."""

import numpy as np
import pytest

from kernels.spec.slots import RequestSlots
from reference.spec import slots as ref
from stress.families import schedule


def test_admission_pops_the_end_of_the_free_list():
    state = RequestSlots(4, seed=1)
    assert [state.admit(r, 0) for r in ("a", "b", "c")] == [3, 2, 1]
    state.release({"b"})
    assert state.admit("d", 0) == 2, "the slot freed last is taken first"


@pytest.mark.parametrize("order", [("x", "m", "a"), ("a", "m", "x"), ("m", "x", "a")])
def test_release_order_is_sorted_whatever_the_iteration_order(order):
    state = RequestSlots(3, seed=1)
    slot = {r: state.admit(r, 0) for r in ("m", "a", "x")}  # m -> 2, a -> 1, x -> 0
    state.release(list(order))
    # freed in order a, m, x: the next admissions pop x's, then m's, then a's slot
    assert [state.admit(r, 0) for r in ("p", "q", "s")] == [slot["x"], slot["m"], slot["a"]]


def test_fallback_seeds_ignore_the_global_rng():
    """fix 2A (docs/fixes.md#fix-2a): two ranks with different global RNG use draw the same fallback seeds."""
    saved = np.random.get_state()
    try:
        np.random.seed(1234)
        rank0 = RequestSlots(4, seed=17)
        np.random.random(1000)
        rank1 = RequestSlots(4, seed=17)
        for i in range(4):
            rank0.admit(f"r{i}", 0)
            np.random.random(7 * i + 1)
            rank1.admit(f"r{i}", 0)
    finally:
        np.random.set_state(saved)
    assert np.array_equal(rank0.seeds, rank1.seeds)
    assert not rank0.seeds_set.any()
    assert len(set(rank0.seeds.tolist())) == 4


def test_explicit_seed_is_kept_and_flagged():
    state = RequestSlots(2, seed=0)
    slot = state.admit("a", 0, seed=-5)
    assert state.seeds[slot] == -5 and state.seeds_set[slot]


def test_cached_count_is_recorded_at_every_readmission():
    state = RequestSlots(2, seed=0)
    first = state.admit("a", 32)
    assert state.num_cached_tokens[first] == 32
    state.release({"a"})  # preempted
    again = state.admit("a", 48)  # resumed with more restored tokens
    assert state.num_cached_tokens[again] == 48


def test_errors_name_the_argument():
    state = RequestSlots(1, seed=0)
    state.admit("a", 0)
    with pytest.raises(ValueError, match="req_id: 'a' already holds"):
        state.admit("a", 0)
    with pytest.raises(ValueError, match="no free slot"):
        state.admit("b", 0)
    with pytest.raises(ValueError, match="max_num_reqs"):
        RequestSlots(-1, seed=0)


def test_replay_matches_reference_and_restores_the_global_rng():
    rng = np.random.default_rng(5)
    steps = schedule.random_schedule(rng, max_num_reqs=6, num_steps=10, preempt_p=0.4)
    before = np.random.get_state()[1].copy()
    got = schedule.replay(6, 99, steps, global_seed=3)
    assert np.array_equal(np.random.get_state()[1], before)
    assert got.equal(ref.replay(6, 99, steps))
    assert got.shape == (sum(len(s.admitted) for s in steps), len(schedule.ADMISSION_FIELDS))
