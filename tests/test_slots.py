"""Request slots: LIFO recycling in sorted id order, private fallback seeds, cached counts per admission."""

import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from kernels.spec import slots
from kernels.spec.slots import RequestSlots
from reference.spec import slots as ref
from stress import checks
from stress.core import patches as mutants
from stress.core.types import Mutant, Patch
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


def test_replay_refuses_per_slot_arrays_of_another_dtype(monkeypatch):
    """The rows are recorded as ints, so a flag array of ints or int64 cached counts would pass unseen: the replay
    checks the documented dtypes itself, and the production arrays have them."""
    steps = schedule.random_schedule(np.random.default_rng(1), max_num_reqs=3, num_steps=2)
    schedule.replay(3, 0, steps, global_seed=0)

    class IntFlags(RequestSlots):
        def __init__(self, max_num_reqs, seed):
            super().__init__(max_num_reqs, seed)
            self.seeds_set = np.zeros(max_num_reqs, dtype=np.int64)

    monkeypatch.setattr(slots, "RequestSlots", IntFlags)
    with pytest.raises(RuntimeError, match="seeds_set is int64, documented bool"):
        schedule.replay(3, 0, steps, global_seed=0)


# ---------------------------------------------------------------- the slots as a state machine

INT64 = np.iinfo(np.int64)
REQ_IDS = ("r7", "r1", "r4", "r0", "r9", "r3", "r8", "r2")  # drawn in an order unrelated to sorted order


class TwoRankSlots(RuleBasedStateMachine):
    """Two TP ranks' ``RequestSlots`` fed the same admissions and releases, each release handed to the two
    in a different order (as two processes' set orders differ), against a model: a stack of free slots
    (admission pops the end), releases pushed in sorted id order, fallback seeds from a private stream
    seeded by the configuration. The slots are looked up on the module, so a planted slip reaches them."""

    live = Bundle("live")

    @initialize(max_num_reqs=st.integers(1, 5), config_seed=st.none() | st.integers(0, 2**32))
    def start(self, max_num_reqs, config_seed):
        self.ranks = [slots.RequestSlots(max_num_reqs, config_seed) for _ in range(2)]
        self.max_num_reqs = max_num_reqs
        self.free = list(range(max_num_reqs))
        self.slot_of: dict[str, int] = {}
        self.held: dict[int, tuple[int, bool, int]] = {}  # slot -> (seed, seed given, cached count)
        self.fallback = np.random.default_rng(config_seed or 0)

    @rule(target=live, req_id=st.sampled_from(REQ_IDS), num_cached=st.integers(0, 64),
          seed=st.none() | st.integers(INT64.min, INT64.max))
    def admit(self, req_id, num_cached, seed):
        if req_id in self.slot_of or not self.free:  # a live id, or every slot taken: refused, nothing changes
            for rank in self.ranks:
                with pytest.raises(ValueError, match="req_id"):
                    rank.admit(req_id, num_cached, seed)
            return multiple()
        slot = self.free.pop()
        for rank in self.ranks:
            assert rank.admit(req_id, num_cached, seed) == slot
        drawn = int(self.fallback.integers(INT64.min, INT64.max, dtype=np.int64)) if seed is None else seed
        self.slot_of[req_id] = slot
        self.held[slot] = (drawn, seed is not None, num_cached)
        return req_id

    @rule(req_ids=st.lists(consumes(live), unique=True))
    def release(self, req_ids):
        """Finished and preempted requests of one step; the ranks see them in opposite orders."""
        self.ranks[0].release(req_ids)
        self.ranks[1].release(reversed(req_ids))
        for req_id in sorted(req_ids):
            slot = self.slot_of.pop(req_id)
            del self.held[slot]
            self.free.append(slot)

    @invariant()
    def every_slot_is_free_or_held_once(self):
        for rank in self.ranks:
            assert sorted(rank.free_slots + list(rank.slot_of.values())) == list(range(self.max_num_reqs))

    @invariant()
    def both_ranks_match_the_model(self):
        for rank in self.ranks:
            assert rank.free_slots == self.free
            assert rank.slot_of == self.slot_of
            for slot, (seed, given, cached) in self.held.items():
                assert (int(rank.seeds[slot]), bool(rank.seeds_set[slot]), int(rank.num_cached_tokens[slot])) == (
                    seed, given, cached), f"slot {slot}"


TwoRankSlots.TestCase.settings = settings(stateful_step_count=30)
TestTwoRankSlots = TwoRankSlots.TestCase

_SLOTS = "kernels.spec.slots:RequestSlots"
SLOT_SLIPS = [
    checks.get("spec.slots").mutant("set-order-recycling"),
    checks.get("spec.slots").mutant("global-rng-seeds"),
    Mutant("leaked-slot", "a released slot is never pushed back on the free stack",
           (Patch(_SLOTS, "self.free_slots.append(self.slot_of.pop(req_id))", "self.slot_of.pop(req_id)"),), {}),
    Mutant("seed-at-batch-row", "the seed is stored at the request's row among the live ones, not at its slot",
           (Patch(_SLOTS, "self.seeds[slot] = seed", "self.seeds[len(self.slot_of) - 1] = seed"),), {}),
]

# Enough generated runs to reach each slip; derandomized, so the control is the same run every time.
CONTROL = settings(max_examples=200, stateful_step_count=30, derandomize=True, database=None,
                   phases=(Phase.generate,))


@pytest.mark.parametrize("slip", SLOT_SLIPS, ids=lambda m: m.name)
def test_the_machine_finds_a_planted_slip(slip):
    with mutants.applied(slip), pytest.raises(AssertionError):
        run_state_machine_as_test(TwoRankSlots, settings=CONTROL)
