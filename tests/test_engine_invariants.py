"""The engine step's own invariants (``stress.oracles.engine_invariants``): silent on the production engine, each
planted bug killed by its oracle (the accounting one where the lockstep comparison passes), and each broken
promise reported as one line."""

import numpy as np
import pytest

from kernels.spec import scheduler
from stress import checks
from stress.core import cases, guards, workers
from stress.core import patches as mutants
from stress.oracles import engine as engine_check
from stress.oracles import engine_invariants

ENGINE = checks.get("engine.step")

# ---------------------------------------------------------------- the pool audit, without a model


def _scheduled(seed: int, mutant: str | None = None) -> tuple[list[engine_invariants.Finding], int]:
    """A scheduler over requests sharing a prefix, some arriving after its holders finished (hits on
    unreferenced blocks), in pools tight enough to preempt; outputs made up. The audit's findings, and
    how many admissions hit a block no running request held."""
    rng = np.random.default_rng(seed)
    config = scheduler.SchedulerConfig(max_num_reqs=3, max_num_batched_tokens=int(rng.integers(6, 16)),
                                       target_block_size=2, target_num_blocks=int(rng.integers(8, 16)),
                                       draft_block_size=2, draft_num_blocks=int(rng.integers(10, 20)),
                                       num_query_per_req=2, max_model_len=40)
    prefix = rng.integers(0, 5, 7).tolist()
    requests = [scheduler.Request(f"r{i}", i, int(rng.integers(0, 12)), prefix + rng.integers(0, 5, 2).tolist(),
                                  int(rng.integers(1, 5)), 0.0, None) for i in range(6)]
    unreferenced_hits = 0
    with mutants.applied(mutant and checks.find_mutant(mutant, ENGINE)):
        sched = scheduler.Scheduler(config, requests)  # the (mutated) pool class is looked up here
        audit = engine_invariants.PoolAudit(sched)
        for step in range(30):
            held = {b for r in sched.running for b in r.target_blocks}
            cached = set(sched.target_pool.key_of)
            plan = sched.schedule(step)
            unreferenced_hits += sum(bool(set(r.target_blocks) & cached - held) for r in plan.admitted)
            for req, n in plan.batch:
                req.num_computed += n
                if req.num_computed == len(req.tokens):
                    req.tokens.append(int(rng.integers(0, 5)))
                req.finished = req.num_outputs >= req.max_new_tokens
            sched.finish_step()
    return audit.findings, unreferenced_hits


def test_the_audit_is_silent_on_the_production_pools_and_catches_the_miscount():
    hits = 0
    for seed in range(12):
        findings, reached = _scheduled(seed)
        assert findings == [], findings[0].reason
        hits += reached
        if reached:
            caught, _ = _scheduled(seed, "free-count-per-hit-twice")
            assert caught and caught[0].oracle == "accounting", seed
            assert "unreferenced hit(s)" in caught[0].reason, caught[0].reason
    assert hits >= 3, "the workloads never hit a cached block that no running request held"


def test_the_audit_names_a_free_queue_that_disagrees_with_the_holders():
    sched = scheduler.Scheduler(scheduler.SchedulerConfig(2, 8, 2, 6, 2, 6, 2, 20),
                                [scheduler.Request("a", 0, 0, [1, 2, 3], 2, 0.0, None)])
    audit = engine_invariants.PoolAudit(sched)
    sched.schedule(0)
    assert audit.findings == []
    held = sched.running[0].target_blocks[0]
    sched.target_pool.free[held] = None  # a held block back in the queue
    sched.finish_step()
    (finding,) = audit.findings
    assert finding.step == 0 and finding.oracle == "accounting"
    assert f"queued, but held: [{held}]" in finding.reason and "\n" not in finding.reason


def _one_prefill(tokens: list[int], computed: int):
    """A scheduler whose one request (block size 2) ran its first step and has ``computed`` tokens computed, with
    its audit; the step is not finished yet."""
    sched = scheduler.Scheduler(scheduler.SchedulerConfig(2, 8, 2, 6, 2, 6, 2, 20),
                                [scheduler.Request("a", 0, 0, list(tokens), 2, 0.0, None)])
    audit = engine_invariants.PoolAudit(sched)
    sched.schedule(0)
    sched.running[0].num_computed = computed
    return sched, audit


def _cache(pool, block: int, key: bytes) -> None:
    pool.block_of[key], pool.key_of[block] = block, key


def test_the_audit_names_a_partial_block_cached_under_a_full_blocks_key():
    tokens = [1, 2, 3, 4, 5]
    sched, audit = _one_prefill(tokens, 3)  # block 1 holds tokens 2 and 3; only 2 is computed
    req, pool = sched.running[0], sched.target_pool
    _cache(pool, req.target_blocks[1], engine_invariants.chain_keys(tokens, 2, 2)[1])
    sched.finish_step()
    (finding,) = audit.findings
    assert (finding.step, finding.oracle) == (0, "accounting")
    assert finding.reason == (f"prefix cache after the step: block {req.target_blocks[1]} is cached, but request 0 "
                              "holds it as its block 1 with 1 of its 2 tokens computed (a partial block under a full "
                              "key)"), finding.reason


def test_the_audit_names_a_full_block_under_another_chains_key():
    tokens = [1, 2, 3, 4, 5]
    sched, audit = _one_prefill(tokens, 4)
    req, pool = sched.running[0], sched.target_pool
    _cache(pool, req.target_blocks[1], engine_invariants.chain_keys([1, 9, 3, 4], 2, 2)[1])  # block 0 differs
    sched.finish_step()
    (finding,) = audit.findings
    assert "holds it as its block 1 under a key other than the chain of its tokens 0..3" in finding.reason, finding


def test_the_audits_chain_key_is_the_documented_blake2b_chain():
    """Restated apart from the pool: a 16-byte BLAKE2b of the key before and the block's tokens as int64s."""
    import hashlib

    first = hashlib.blake2b(np.asarray([7, 8], dtype=np.int64).tobytes(), digest_size=16).digest()
    second = hashlib.blake2b(first + np.asarray([9, 10], dtype=np.int64).tobytes(), digest_size=16).digest()
    assert engine_invariants.chain_keys([7, 8, 9, 10, 11], 2, 2) == [first, second]


# ---------------------------------------------------------------- the drafts, from the step records


def _records(family: str, i: int, mutant: str | None = None):
    case = cases.build_case(ENGINE, family, cases.case_seed(0, "engine.step", family, i), "cpu")
    with mutants.applied(mutant and checks.find_mutant(mutant, ENGINE)):
        return case.inputs["config"], engine_check.run_engine(**guards.fresh_inputs(case))


@pytest.fixture(scope="module")
def padded():
    return _records("padded_graphs", 0)


def test_padded_graphs_drafts_a_batch_of_one_at_step_0_and_keeps_every_draft_promise(padded):
    config, records = padded
    first = records[0]
    assert first["idx_mapping"].numel() == 1 and int(first["depth"]) > 0 and bool(first["draft.prepared"])
    assert records.findings == [] and engine_invariants.draft_findings(config, records) == []
    assert any(int(r["verify.num_drafts"].max()) > 0 for r in records if "verify.num_drafts" in r), \
        "no step verified drafts: the handoff was never judged"


def test_a_draft_changed_between_steps_and_a_depth_outside_its_band_are_named(padded):
    config, records = padded
    step = next(s for s, r in enumerate(records) if "verify.num_drafts" in r and int(r["verify.num_drafts"].max()))
    b = int(records[step]["verify.num_drafts"].argmax())
    changed = [{k: v.clone() for k, v in r.items()} for r in records]
    start = int(changed[step]["target.query_start_loc"][b])
    changed[step]["target.input_ids"][start + 1] += 1
    (found,) = engine_invariants.draft_findings(config, changed)
    assert (found.step, found.oracle) == (step, "drafts") and "last proposed" in found.reason
    deep = [{k: v.clone() for k, v in r.items()} for r in records]
    deep[0]["depth"] += config["num_spec_tokens"]
    assert "outside the band" in engine_invariants.draft_findings(config, deep)[0].reason


@pytest.mark.slow
def test_one_request_drafting_nothing_is_named_at_step_0():
    config, records = _records("padded_graphs", 0, "one-request-drafts-nothing")
    found = engine_invariants.first_finding(config, records)
    assert (found.step, found.oracle) == (0, "drafts")
    assert found.reason.startswith("request 0 (batch row 0, slot ") and "got 0 drafted token(s), expected" in \
        found.reason, found.reason


# ---------------------------------------------------------------- positive controls


@pytest.mark.slow
def test_the_drafts_oracle_kills_its_planted_bug_through_the_runner_in_one_line():
    assert ENGINE.mutant("one-request-drafts-nothing").oracles == {"cpu": "drafts", "cuda": "drafts"}
    task = cases.Task("engine.step", "padded_graphs", cases.case_seed(0, "engine.step", "padded_graphs", 0),
                       mutant="one-request-drafts-nothing")
    result = workers.run_case(task, "cpu", trace=False)
    assert result.verdict == "fail:drafts", result.details
    assert len(result.details) == 1 and result.details[0].startswith("step 0 drafts: request 0 "), result.details
    assert "--mutant one-request-drafts-nothing" in result.repro()


@pytest.mark.slow
def test_the_accounting_oracle_alone_kills_the_miscount_at_the_first_iteration():
    """The lockstep comparison passes it: the miscount changes no recorded field of this case."""
    assert ENGINE.mutant("free-count-per-hit-twice").oracles == {"cpu": "accounting", "cuda": "accounting"}
    case = cases.build_case(ENGINE, "preempt_resume", cases.case_seed(0, "engine.step", "preempt_resume", 0), "cpu")
    expected = engine_check.reference(**guards.fresh_inputs(case))
    with mutants.applied(ENGINE.mutant("free-count-per-hit-twice")):
        got = engine_check.run_engine(**guards.fresh_inputs(case))
    assert engine_check.first_divergence(expected.trace, got) is None
    found = engine_check.compare("engine", expected, got)
    assert found.verdict == "accounting" and len(found.lines()) == 1, found.lines()
    assert "unreferenced hit(s)" in found.lines()[0], found.lines()


@pytest.mark.slow
def test_the_accounting_oracle_kills_a_partial_block_cached_during_a_resumes_recompute():
    """The first evicted_resume case enters the block its resumed request is recomputing under a stale key; the
    audit names it at that step, through the runner, in one line."""
    assert ENGINE.mutant("partial-block-under-stale-key").oracles == {"cpu": "accounting", "cuda": "accounting"}
    task = cases.Task("engine.step", "evicted_resume", cases.case_seed(0, "engine.step", "evicted_resume", 0),
                       mutant="partial-block-under-stale-key")
    result = workers.run_case(task, "cpu", trace=False)
    assert result.verdict == "fail:accounting", result.details
    assert len(result.details) == 1 and "(a partial block under a full key)" in result.details[0], result.details


# ---------------------------------------------------------------- the replay audit


class _Graphs:
    """A DraftGraphs stand-in whose run returns what it is told."""

    def __init__(self, out):
        self.out = out

    def run(self, **step):
        return self.out


@pytest.mark.parametrize("mode,hidden,replayed,found", [
    ("FULL", True, False, True),  # dispatched to a graph, drafted eagerly: the lost replay
    ("FULL", True, True, False), ("FULL", False, False, False),  # replayed; refused (nothing drafted)
    ("NONE", True, False, False),  # no graph fits: eager by design
])
def test_the_replay_audit_names_a_full_dispatch_that_ran_eagerly(mode, hidden, replayed, found):
    import torch

    from kernels.spec.draft_graphs import DraftOutputs
    from kernels.spec.graphs import BatchDescriptor, Mode

    desc = BatchDescriptor(Mode[mode], 8, num_reqs=2) if mode == "FULL" else BatchDescriptor(Mode.NONE, 6)
    engine = type("Engine", (), {})()
    engine.step_index, engine.graphs = 3, _Graphs(DraftOutputs(torch.zeros(2, 3), torch.zeros(6, 4) if hidden
                                                               else None, desc, replayed))
    findings = []
    engine_invariants.ReplayAudit(engine, findings)
    assert engine.graphs.run(num_draft_tokens=3) is engine.graphs.out  # what the engine gets is unchanged
    assert [f.oracle for f in findings] == (["graphs"] if found else [])
    if found:
        assert findings[0].step == 3 and "FULL(num_reqs=2, num_tokens=8) but ran eagerly" in findings[0].reason


@pytest.mark.gpu
def test_the_graphs_oracle_kills_an_engine_that_never_captures():
    assert ENGINE.mutant("draft-graphs-never-captured").oracles == {"cuda": "graphs"}
    task = cases.Task("engine.step", "padded_graphs", cases.case_seed(0, "engine.step", "padded_graphs", 0),
                       mutant="draft-graphs-never-captured")
    result = workers.run_case(task, "cuda", trace=False)
    assert result.verdict == "fail:graphs", result.details
    assert "but ran eagerly" in result.details[0], result.details


# ---------------------------------------------------------------- the KV each read finds, the drafts each row keeps


@pytest.fixture(scope="module")
def chained():
    """prefix_chain: later requests restore blocks other requests wrote."""
    case = cases.build_case(ENGINE, "prefix_chain", cases.case_seed(0, "engine.step", "prefix_chain", 0), "cpu")
    return case.inputs, engine_check.run_engine(**guards.fresh_inputs(case))


def test_every_read_finds_its_token_and_every_row_keeps_its_cut_drafts(chained):
    inputs, records = chained
    assert engine_invariants.first_finding(inputs["config"], records, inputs["requests"]) is None
    assert any(int(r["slots.num_cached_tokens"].max()) > 0 for r in records), "no prefix was restored"


def test_a_table_entry_naming_another_block_is_a_read_of_other_kv(chained):
    inputs, records = chained
    step = next(s for s, r in enumerate(records) if "target.block_table" in r and int(r["target.seq_lens"][0]) > 1)
    wrong = [{k: v.clone() for k, v in r.items()} for r in records]
    wrong[step]["target.block_table"][0, 0] = 0  # the null block: never written
    found = engine_invariants.first_finding(inputs["config"], wrong, inputs["requests"])
    assert (found.step, found.oracle) == (step, "kv") and "reads position 0" in found.reason, found


def test_a_kept_draft_past_the_cut_is_named(chained):
    inputs, records = chained
    step = next(s for s, r in enumerate(records) if "draft.kept" in r and r["draft.kept"].numel())
    wrong = [{k: v.clone() for k, v in r.items()} for r in records]
    wrong[step]["draft.kept"].fill_(inputs["config"]["model"]["vocab"] - 1)
    found = engine_invariants.first_finding(inputs["config"], wrong, inputs["requests"])
    assert (found.step, found.oracle) == (step, "drafts") and "keeps drafts" in found.reason, found


@pytest.mark.slow
@pytest.mark.parametrize("mutant,family,oracle,says", [
    ("evicted-block-still-cached", "crowded_preemption", "kv", "which holds position"),
    ("drafts-past-the-limit", "long_context", "drafts", "keeps drafts"),
])
def test_the_kv_and_kept_oracles_kill_their_planted_slips(mutant, family, oracle, says):
    """The invariants' positive controls: the first case of the family that the slip changes at all fails with
    the invariant's oracle (judged before the lockstep comparison), whose line names the read or the kept
    drafts."""
    assert ENGINE.mutant(mutant).oracles == {"cpu": oracle, "cuda": oracle}
    for i in range(12):
        case = cases.build_case(ENGINE, family, cases.case_seed(0, "engine.step", family, i), "cpu")
        expected = engine_check.reference(**guards.fresh_inputs(case))
        with mutants.applied(ENGINE.mutant(mutant)):
            got = engine_check.run_engine(**guards.fresh_inputs(case))
        found = engine_check.compare("engine", expected, got)
        if found is not None:
            assert found.verdict == oracle and says in found.lines()[0], found.lines()
            return
    pytest.fail(f"{mutant} changed none of 12 {family} cases")
