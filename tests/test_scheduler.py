"""The engine's scheduler as a state machine: steps, early stops and step ends drawn by hypothesis, the
queues checked against a model after every rule, the block pools and prefix cache audited, and the
slot changes each step hands the engine replayed through ``RequestSlots``."""

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
    precondition,
    rule,
    run_state_machine_as_test,
)

from kernels.spec import scheduler
from kernels.spec.slots import RequestSlots
from stress.core import patches as mutants
from stress.core.types import Mutant, Patch

PREFIXES = ((1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 7, 7), (5, 5))  # shared heads, so admissions hit the prefix cache


@st.composite
def workloads(draw):
    """A scheduler configuration and requests small and tight enough to chunk, share prefixes and preempt."""
    q = draw(st.integers(1, 3))
    config = scheduler.SchedulerConfig(
        max_num_reqs=draw(st.integers(1, 3)), max_num_batched_tokens=draw(st.integers(2, 16)),
        target_block_size=draw(st.sampled_from((2, 4))), target_num_blocks=draw(st.integers(3, 16)),
        draft_block_size=draw(st.sampled_from((2, 4))), draft_num_blocks=draw(st.integers(3, 16)),
        num_query_per_req=q, max_model_len=24)
    requests = []
    for index in range(draw(st.integers(2, 6))):
        head = draw(st.sampled_from(PREFIXES))
        tail = draw(st.lists(st.integers(0, 9), max_size=6))
        requests.append(scheduler.Request(f"q{(7 * index) % 10}-{index}", index, draw(st.integers(0, 4)),
                                          list(head) + tail, draw(st.integers(1, 6)), 0.0, None))
    return config, requests


class SchedulerMachine(RuleBasedStateMachine):
    """A scheduler driven as the engine drives it: ``schedule``, the step's tokens recorded (accepted drafts
    drawn), requests stopped early, ``finish_step``. The model holds the queues by request index: arrivals
    join the waiting queue in (arrival, index) order, preemption takes the last running request back to the
    waiting queue's front, admission takes the waiting queue's head in order."""

    live = Bundle("live")

    @initialize(workload=workloads())
    def start(self, workload):
        self.config, self.requests = workload
        self.sched = scheduler.Scheduler(self.config, self.requests)
        self.step = 0
        self.in_step = False  # between schedule and finish_step
        self.batch: list[tuple[scheduler.Request, int]] = []
        self.pending = sorted(self.requests, key=lambda r: (r.arrival, r.index))
        self.waiting: list[scheduler.Request] = []
        self.running: list[scheduler.Request] = []
        self.to_release: set[str] = set()  # finished at the last step end
        self.slots = RequestSlots(self.config.max_num_reqs, seed=0)

    @precondition(lambda self: not self.in_step)
    @rule(target=live, data=st.data())
    def schedule(self, data):
        c = self.config
        while self.pending and self.pending[0].arrival <= self.step:
            self.waiting.append(self.pending.pop(0))
        plan = self.sched.schedule(self.step)
        self.in_step, self.batch = True, plan.batch

        still = [r for r in self.running if r in self.sched.running]
        preempted = self.running[len(still):]
        assert self.running[:len(still)] == still, "only the last running requests are preempted"
        assert plan.released == self.to_release | {r.req_id for r in preempted}
        assert not (preempted and plan.admitted), "no admission in a step that preempted"
        self.waiting = preempted + self.waiting
        assert plan.admitted == self.waiting[:len(plan.admitted)], "admission takes the waiting queue's head"
        self.waiting = self.waiting[len(plan.admitted):]
        self.running = still + plan.admitted
        self.to_release = set()
        assert self.sched.running == self.running and self.sched.waiting == self.waiting
        assert len(self.running) <= c.max_num_reqs

        for req in plan.admitted:
            assert req.num_computed == req.num_cached < len(req.tokens)
            assert req.num_cached % c.target_block_size == 0
            hits = req.target_blocks[:req.num_cached // c.target_block_size]
            keys = self.sched.target_pool.block_keys(req.tokens, len(hits))
            assert [self.sched.target_pool.key_of.get(b) for b in hits] == keys, "a hit holds another prefix"

        rows = [req for req, _ in plan.batch]
        assert len(set(map(id, rows))) == len(rows) and all(r in self.running for r in rows)
        assert all(n >= 1 for _, n in plan.batch) and sum(n for _, n in plan.batch) <= c.max_num_batched_tokens
        prefilling = [r.prefilling for r in rows]
        assert prefilling == sorted(prefilling), "decodes first, then prefill chunks"
        for req, n in plan.batch:
            assert -(-(req.num_computed + n) // c.target_block_size) <= len(req.target_blocks)
            assert -(-(req.num_computed + n + c.num_query_per_req) // c.draft_block_size) <= len(req.draft_blocks)

        self.slots.release(plan.released)  # the slot changes the engine applies: never a stale or double one
        for req in plan.admitted:
            self.slots.admit(req.req_id, req.num_cached)

        for req, n in plan.batch:
            self._record(req, n, data)
        return multiple(*plan.admitted)

    def _record(self, req: scheduler.Request, n: int, data) -> None:
        """The step's outcome for one batch row, as the engine records it: a decode keeps a drawn number of
        its drafts plus a bonus token, a chunk that ends the prompt samples the first output."""
        if req.prefilling:
            req.num_computed += n
            emitted = [data.draw(st.integers(0, 9))] if req.num_computed == len(req.tokens) else []
        else:
            accepted = data.draw(st.integers(0, len(req.drafts)))
            emitted = req.drafts[:accepted] + [data.draw(st.integers(0, 9))]
            req.num_computed += len(emitted)
        req.tokens += emitted
        limit = min(len(req.prompt) + req.max_new_tokens, self.config.max_model_len)
        if len(req.tokens) >= limit:
            del req.tokens[limit:]
            req.num_computed = min(req.num_computed, limit)
            req.finished = True
        room = self.config.max_model_len - len(req.tokens)
        drafting = not (req.prefilling or req.finished)
        req.drafts = data.draw(st.lists(st.integers(0, 9), max_size=self.config.num_query_per_req - 1))[:room] \
            if drafting else []

    @precondition(lambda self: self.in_step)
    @rule(req=consumes(live))
    def stop(self, req):
        """An early stop (end of sequence) of a request this step ran; any other is left as it is."""
        if any(r is req for r, _ in self.batch) and not req.finished:
            req.finished, req.drafts = True, []

    @precondition(lambda self: self.in_step)
    @rule()
    def finish_step(self):
        self.sched.finish_step()
        done = [r for r in self.running if r.finished]
        self.running = [r for r in self.running if not r.finished]
        self.to_release = {r.req_id for r in done}
        assert self.sched.running == self.running
        self.in_step, self.batch = False, []
        self.step += 1

    @invariant()
    def queued_requests_hold_nothing(self):
        for req in self.waiting + self.pending:
            assert (req.target_blocks, req.draft_blocks, req.num_computed) == ([], [], 0), req.req_id

    @invariant()
    def target_blocks_are_free_or_referenced_by_their_holders(self):
        pool = self.sched.target_pool
        holders = np.zeros(self.config.target_num_blocks, dtype=np.int64)
        for req in self.running:
            assert len(set(req.target_blocks)) == len(req.target_blocks), req.req_id
            holders[req.target_blocks] += 1
        assert holders[0] == 0, "the null block is handed out"
        assert holders.tolist() == pool.refs.tolist()
        assert sorted(pool.free) == [b for b in range(1, self.config.target_num_blocks) if holders[b] == 0]

    @invariant()
    def draft_blocks_are_free_or_held_once(self):
        held = [b for req in self.running for b in req.draft_blocks]
        assert sorted(held + list(self.sched.draft_pool.free)) == list(range(1, self.config.draft_num_blocks))

    @invariant()
    def running_requests_have_blocks_for_their_computed_tokens(self):
        c = self.config
        for req in self.running:
            assert -(-req.num_computed // c.target_block_size) <= len(req.target_blocks), req.req_id
            assert -(-req.num_computed // c.draft_block_size) <= len(req.draft_blocks), req.req_id

    @invariant()
    def the_prefix_cache_maps_keys_and_blocks_one_to_one(self):
        pool = self.sched.target_pool
        assert {block: key for key, block in pool.block_of.items()} == pool.key_of
        for req in self.running:
            for block, key in zip(req.target_blocks, req.block_keys, strict=False):
                assert pool.key_of.get(block, key) == key, f"{req.req_id}: block {block} cached under another key"


SchedulerMachine.TestCase.settings = settings(stateful_step_count=60)
TestSchedulerMachine = SchedulerMachine.TestCase

_SCHEDULER = "kernels.spec.scheduler:Scheduler"
SCHEDULER_SLIPS = [
    Mutant("draft-blocks-leaked", "a request's draft blocks are never returned to their pool",
           (Patch(_SCHEDULER, "self.draft_pool.release(req.draft_blocks)", "pass"),), {}),
    Mutant("preempted-keeps-progress", "a preempted request keeps its computed count with its blocks gone",
           (Patch(_SCHEDULER, "req.num_computed, req.drafts = 0, []", "req.drafts = []"),), {}),
    Mutant("preempted-to-the-back", "a preempted request is queued behind the waiting ones",
           (Patch(_SCHEDULER, "self.waiting.insert(0, req)", "self.waiting.append(req)"),), {}),
    Mutant("admits-after-preempting", "requests are admitted in a step that preempted",
           (Patch(_SCHEDULER, "while not preempted and self.waiting", "while self.waiting"),), {}),
]

# Enough generated runs to reach each slip; derandomized, so the control is the same run every time.
CONTROL = settings(max_examples=300, stateful_step_count=40, derandomize=True, database=None,
                   phases=(Phase.generate,))


@pytest.mark.parametrize("slip", SCHEDULER_SLIPS, ids=lambda m: m.name)
def test_the_machine_finds_a_planted_slip(slip):
    with mutants.applied(slip), pytest.raises(AssertionError):
        run_state_machine_as_test(SchedulerMachine, settings=CONTROL)
