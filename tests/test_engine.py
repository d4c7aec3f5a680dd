"""The spec-decode engine in lockstep with the reference engine: scheduling policy, what each workload
family exercises, acceptance as an observable, the first-divergence report and near-tie following."""

import functools

import numpy as np
import pytest
import torch

from kernels.spec import scheduler
from reference.spec import engine as reference_engine
from reference.spec import scheduler as ref_scheduler
from stress import checks
from stress.core import cases, guards
from stress.core import patches as mutants
from stress.core.compare import Divergence, Tolerated
from stress.core.types import kill_matrix_verdict
from stress.oracles import engine as engine_check

# ---------------------------------------------------------------- scheduling policy, without a model


def _workload(rng):
    """Requests over a few shared prefixes (cache hits), tight pools (preemption, eviction)."""
    bs_t = int(rng.choice([2, 4]))
    config = {"max_num_reqs": int(rng.integers(2, 5)), "max_num_batched_tokens": int(rng.integers(6, 24)),
              "target_block_size": bs_t, "target_num_blocks": int(rng.integers(10, 30)),
              "draft_block_size": bs_t * int(rng.choice([1, 2])), "draft_num_blocks": int(rng.integers(10, 30)),
              "max_model_len": 48}
    prefixes = [rng.integers(0, 5, int(rng.integers(2, 14))).tolist() for _ in range(2)]
    requests = [{"req_id": f"r{int(rng.integers(100))}-{i}", "arrival": int(rng.integers(0, 6)),
                 "prompt": prefixes[int(rng.integers(2))] + rng.integers(0, 5, int(rng.integers(1, 6))).tolist(),
                 "max_new_tokens": int(rng.integers(1, 8)), "temperature": 0.0, "seed": None} for i in range(8)]
    return config, requests


def _emit(rng, req, n, k):
    """One step's outcome for a scheduled request: chunk computed, tokens accepted and emitted, new drafts."""
    if req.prefilling:
        req.num_computed += n
        if req.num_computed == len(req.tokens):
            req.tokens.append(int(rng.integers(0, 5)))
    else:
        accepted = int(rng.integers(0, len(req.drafts) + 1))
        req.num_computed += accepted + 1
        req.tokens += req.drafts[:accepted] + [int(rng.integers(0, 5))]
    limit = min(len(req.prompt) + req.max_new_tokens, 48)
    if len(req.tokens) >= limit:
        del req.tokens[limit:]
        req.num_computed = min(req.num_computed, limit)
        req.finished = True
    req.drafts = [] if req.prefilling or req.finished else rng.integers(0, 5, k).tolist()


@pytest.mark.parametrize("seed", range(40))
def test_engine_and_reference_schedulers_agree(seed):
    """Same batches, token counts, blocks, admissions, releases and restored counts at every step."""
    rng = np.random.default_rng(seed)
    config, requests = _workload(rng)
    k = 2
    ours = scheduler.Scheduler(scheduler.SchedulerConfig.from_dict(dict(config, num_query_per_req=k + 1)),
                               [scheduler.Request(r["req_id"], i, r["arrival"], r["prompt"], r["max_new_tokens"], 0.0,
                                                  None) for i, r in enumerate(requests)])
    theirs_reqs = [dict(r, index=i, tokens=list(r["prompt"]), num_computed=0, num_cached=0, drafts=[],
                        target_blocks=[], draft_blocks=[], finished=False) for i, r in enumerate(requests)]
    theirs = ref_scheduler.Scheduler(config, k + 1, theirs_reqs)
    preempted = hits = 0
    for step in range(24):
        plan = ours.schedule(step)
        batch, admitted, released = theirs.schedule(step)
        assert [(r.index, n) for r, n in plan.batch] == [(r["index"], n) for r, n in batch], step
        assert [r.index for r in plan.admitted] == [r["index"] for r in admitted], step
        assert plan.released == released, step
        for (req, n), (twin, _) in zip(plan.batch, batch, strict=True):
            assert (req.target_blocks, req.draft_blocks, req.num_cached) == (
                twin["target_blocks"], twin["draft_blocks"], twin["num_cached"]), (step, req.index)
            _emit(rng, req, n, k)
            twin.update(tokens=list(req.tokens), num_computed=req.num_computed, drafts=list(req.drafts),
                        finished=req.finished)
        preempted += len(plan.released - {r.req_id for r in requests_finished(ours)})
        hits += sum(r.num_cached > 0 for r in plan.admitted)
        ours.finish_step()
        theirs.finish_step()
    assert ours.target_pool.free == dict.fromkeys(theirs.pools.free_t) and list(ours.draft_pool.free) == \
        theirs.pools.free_d


def requests_finished(sched):
    return [r for r in sched.pending + sched.waiting + sched.running if r.finished]


def test_prefix_cache_hits_full_blocks_and_evicts_in_free_order():
    pool = scheduler.PrefixCachingPool(6, 2)
    req = scheduler.Request("a", 0, 0, [1, 2, 3, 4, 5], 1, 0.0, None)
    req.target_blocks = pool.allocate(3)  # blocks 1, 2, 3
    req.num_computed = 5
    pool.register(req)  # two full blocks: [1, 2] in block 1, [3, 4] in block 2
    assert pool.lookup([1, 2, 3, 4, 5, 6]) == [1, 2]
    assert pool.lookup([1, 2, 3, 4]) == [1], "the last token is never a hit: it must be recomputed"
    pool.release(req.target_blocks)  # freed in reverse: 3, 2, 1 join the queue's back
    assert list(pool.free) == [4, 5, 3, 2, 1]
    assert pool.lookup([1, 2, 3, 4, 9]) == [1, 2], "freed blocks keep their content until reallocated"
    assert pool.allocate(4) == [4, 5, 3, 2]  # block 2 is evicted as it is handed out
    assert pool.lookup([1, 2, 3, 4, 9]) == [1]


# ---------------------------------------------------------------- the engine against the reference


@functools.cache
def _case_and_reference(family, seed):
    """Built once a process: the tests below meet the same (family, seed) with and without a mutant, and in more
    than one test; the reference never runs under a mutant, and each engine run gets fresh inputs of the case."""
    case = cases.build_case(checks.get("engine.step"), family, seed, "cpu")
    return case, engine_check.reference(**guards.fresh_inputs(case))


def _run(family, seed, mutant=None):
    check = checks.get("engine.step")
    case, expected = _case_and_reference(family, seed)
    with mutants.applied(mutant and checks.find_mutant(mutant, check)):
        got = engine_check.run_engine(**guards.fresh_inputs(case))
    return case, expected, got


def _features(case, records) -> set[str]:
    """What a replay exercised, from its records."""
    config, found = case.inputs["config"], set()
    slots_before, cached, holder, draft_rows = {}, 0, {}, {}
    greedy = [r["temperature"] == 0 for r in case.inputs["requests"]]
    for r in records:
        rows = {int(req): set(row.tolist()) - {0}
                for req, row in zip(r["batch.request"], r.get("draft.block_table", ()), strict=False)}
        if any(blocks & held for req, blocks in rows.items() for other, held in draft_rows.items() if other != req):
            found.add("draft block handed over")  # a draft block another request held the step before
        draft_rows = rows
        slot_of = r["slots.slot_of_request"].tolist()
        for req, slot in enumerate(slot_of):
            if slots_before.get(req, -1) >= 0 and slot < 0 and r["batch.request"].numel():
                found.add("released")
            slots_before[req] = slot
            if slot >= 0:
                if holder.get(slot, req) != req and greedy[holder[slot]] != greedy[req]:
                    found.add("temperature handed over")  # a slot passed between a sampled and a greedy request
                holder[slot] = req
        if "idx_mapping" not in r:
            continue
        live_cached = r["slots.num_cached_tokens"][r["idx_mapping"].long()]
        cached = max(cached, int(live_cached.max()))
        if cached:
            found.add("restored prefix")
        if not bool(r["draft.prepared"]):
            found.add("refused")
            if (r["verify.num_rejected"] > 0).any():
                found.add("rejections undrafted")  # context rows the engine writes itself, a rejected suffix in them
        elif bool((r["draft.shifted_block_table"] != r["draft.block_table"]).any()):
            found.add("shifted")
        found.add(f"depth {int(r['depth'])}" if int(r["depth"]) == 0 else "drafting")
        tokens = r["batch.num_tokens"]
        ends = r["target.query_start_loc"][1:].long() - 1
        for req, end, sampled in zip(r["batch.request"].tolist(), ends, r["verify.num_sampled"].tolist(), strict=True):
            if not sampled and int(r["target.positions"][end]) >= len(case.inputs["requests"][req]["prompt"]):
                found.add("chunk past the prompt")  # a resumed recompute cut short of its last token
        if (r["verify.num_drafts"] > 0).any() and (r["verify.num_sampled"] == 0).any():
            found.add("prefill beside decode")
        if int(r["draft.positions"].max()) == config["scheduler"]["max_model_len"] - 1 and tokens.numel():
            found.add("clamped")
        if r["target.logits"].numel() and (r["verify.num_drafts"] == 0).any():
            found.add("first token")
        graph = r.get("draft.graph")
        if graph is not None and int(graph[0]) == 2 and int(graph[2]) > tokens.numel():
            found.add("padded graph")
        if graph is not None and int(graph[0]) == 2:
            found.add("full draft graph")
    return found


WANTED = {"shared_prefix": {"restored prefix", "shifted"},
          "unaligned_prefix": {"refused", "shifted", "rejections undrafted"},
          "preempt_resume": {"restored prefix", "shifted"}, "mixed_prefill_decode": {"prefill beside decode"},
          "dsd_bands": {"depth 0", "drafting", "rejections undrafted"}, "long_context": {"clamped"},
          "seeded_sampling": {"drafting"},
          "padded_graphs": {"padded graph", "drafting"},
          "sampling_churn": {"temperature handed over", "drafting"},
          "dspark_dispatch": {"full draft graph", "drafting"},
          "draft_pool_pressure": {"draft block handed over", "drafting"},
          "chunked_resume": {"chunk past the prompt", "drafting"}}


# The scheduler's input classes the newer families exist for, each proven reached by a generated one-line slip
# that only that class shows (stress/mutate/operators.py; each id names its patch): its family must kill it.
_SCHED = "gen:kernels.spec.scheduler"
WITNESSES = [
    ("prefix_chain", f"{_SCHED}:PrefixCachingPool:const:654d9e32"),  # a key chained to the first block's key
    ("prefix_chain", f"{_SCHED}:PrefixCachingPool:const:e3683a66"),  # a lookup that covers the last token
    ("prefix_chain", f"{_SCHED}:PrefixCachingPool:const:7fe0a7f7"),  # a lookup a token short
    ("mid_prefill_hit", f"{_SCHED}:PrefixCachingPool:cdiv-floor:c67aa547"),  # a half-computed block cached
    ("tight_pools", f"{_SCHED}:BlockPool:cmp-flip:f2cb3117"),  # a pool of one block refused
    ("tight_pools", f"{_SCHED}:Scheduler:cmp-flip:ad4e5495"),  # the last free block refused to a chunk
    ("crowded_preemption", f"{_SCHED}:Scheduler:const:5c752710"),  # a preempted request queued behind another
    ("budget_bound", f"{_SCHED}:Scheduler:cmp-flip:593b6f64"),  # a spent budget still schedules zero tokens
    ("multi_turn", "gen:kernels.spec.engine:Engine:min-max:be930a9a"),  # a finished turn's last token cached
    ("dsd_bands", "gen:kernels.spec.engine:Engine:cmp-flip:592ac3a7"),  # a depth-0 step's first rejected row kept
    ("unaligned_prefix", "gen:kernels.spec.engine:Engine:const:8e3c6028"),  # a refused step's rejected rows at 1
]


@pytest.mark.parametrize("family,mutant", WITNESSES)
@pytest.mark.slow
def test_scheduler_families_kill_the_slip_only_their_class_shows(family, mutant):
    for i in range(4):
        case, expected, got = _run(family, cases.case_seed(7, "engine.step", family, i))
        assert engine_check.compare("engine", expected, got) is None, case.note
        try:
            case, expected, got = _run(family, cases.case_seed(7, "engine.step", family, i), mutant)
        except Exception:  # noqa: BLE001 - a crash kills it as well (fail:crash)
            return
        if engine_check.compare("engine", expected, got) is not None:
            return
    pytest.fail(f"{family}: 4 cases did not tell {mutant} from the production scheduler")


@pytest.mark.slow
def test_a_blocked_head_keeps_the_request_behind_it_waiting():
    for i in range(3):
        case, expected, got = _run("blocked_head", cases.case_seed(7, "engine.step", "blocked_head", i))
        assert engine_check.compare("engine", expected, got) is None, case.note
        # step 1: both queued requests have arrived and a slot is free, but the head does not fit
        assert got[1]["batch.request"].tolist() == [0], case.note
        assert got[1]["slots.free"].numel() > 0, case.note
        assert any(set(r["batch.request"].tolist()) >= {1, 2} for r in got[2:]), "the head was never admitted"
        _, _, sent_back = _run("blocked_head", cases.case_seed(7, "engine.step", "blocked_head", i),
                               "blocked-head-sent-back")
        assert 2 in sent_back[1]["batch.request"].tolist(), case.note


@pytest.mark.slow
def test_a_budget_step_moves_the_depth_of_its_batchs_band_only():
    for i in range(3):
        case, expected, got = _run("budget_bands", cases.case_seed(7, "engine.step", "budget_bands", i))
        assert engine_check.compare("engine", expected, got) is None, case.note
        k = case.inputs["config"]["num_spec_tokens"]
        slots = case.inputs["config"]["scheduler"]["max_num_reqs"]  # every slot taken at step 0
        assert all(r["batch.num_tokens"].numel() <= 1 + k < slots for r in got[1:]), case.note
        _, _, misfiled = _run("budget_bands", cases.case_seed(7, "engine.step", "budget_bands", i),
                              "observe-under-running-count")
        assert engine_check.compare("engine", expected, misfiled) is not None, case.note


# Families with temperatures above 0: acceptance below 100%
SAMPLED = {"seeded_sampling", "padded_graphs", "dsd_bands", "unaligned_prefix", "sampling_churn", "dspark_dispatch"}


@pytest.mark.parametrize("family", sorted(WANTED))
@pytest.mark.slow
def test_family_exercises_what_it_names_and_greedy_accepts_every_draft(family):
    seen, drafted_total = set(), 0
    for i in range(3):
        case, expected, got = _run(family, cases.case_seed(7, "engine.step", family, i))
        assert engine_check.compare("engine", expected, got) is None, case.note
        seen |= _features(case, got)
        drafted, accepted = engine_check.acceptance(got)
        drafted_total += drafted
        if family not in SAMPLED:
            assert accepted == drafted, f"{family}: greedy drafts from the shared weights were rejected ({case.note})"
    assert drafted_total > 0
    assert WANTED[family] <= seen, f"{family} never showed {WANTED[family] - seen}"


def test_prefix_masking_mutant_collapses_acceptance_and_names_the_first_divergence():
    case, expected, got = _run("shared_prefix", cases.case_seed(0, "engine.step", "shared_prefix", 0),
                               mutant="prefix-blocks-visible")
    drafted, accepted = engine_check.acceptance(got)
    ref_drafted, ref_accepted = engine_check.acceptance(expected.trace.records)
    assert ref_accepted == ref_drafted > 0
    assert accepted < 0.5 * drafted, f"acceptance {accepted}/{drafted} did not collapse"
    found = engine_check.compare("engine", expected, got)
    assert isinstance(found, Divergence)
    assert "draft.seq_lens" in found.output, found.lines()


def _trace(records):
    tolerances = [{name: torch.full_like(v, 1e-3) for name, v in r.items() if v.is_floating_point()} for r in records]
    return engine_check.Expected(reference_engine.Trace(records, tolerances, [], []), {})


def test_first_divergence_reports_step_field_index_expected_got():
    want = [{"a": torch.tensor([1, 2]), "x": torch.tensor([[1.0, 2.0]])},
            {"a": torch.tensor([3, 4]), "x": torch.tensor([[float("nan"), 10.0]])}]
    got = [{k: v.clone() for k, v in r.items()} for r in want]
    assert engine_check.compare("engine", _trace(want), got) is None
    got[1]["x"][0, 1] += 1e-4  # within the reference's bound
    assert engine_check.compare("engine", _trace(want), got) is None
    got[1]["a"][1] = 7
    got[1]["x"][0, 0] = 0.0  # NaN expected: a number is a divergence; but "a" comes first in record order
    found = engine_check.compare("engine", _trace(want), got)
    assert found.lines() == ["step 1 a: 1 element(s) differ", "  step 1 a[1]: expected 4, got 7"]
    got[1]["a"][1] = 4
    assert engine_check.compare("engine", _trace(want), got).lines()[1] == "  step 1 x[0, 0]: expected nan, got 0.0"
    del got[0]["x"]
    assert engine_check.compare("engine", _trace(want), got).lines() == [
        "step 0 x: missing from the engine's record"]


def test_a_field_missing_from_the_engines_record_is_a_divergence_before_any_invariant_reads_it():
    """The invariants read fields of the engine's record (the slots' cached counts): an engine that stops
    recording one fails as a divergence naming it, not as the suite's own error, which kills nothing."""
    case, expected, got = _run("multi_turn", cases.case_seed(0, "engine.step", "multi_turn", 0))
    assert engine_check.compare("engine", expected, got) is None, case.note
    del got[1]["slots.num_cached_tokens"]
    assert engine_check.compare("engine", expected, got).lines() == [
        "step 1 slots.num_cached_tokens: missing from the engine's record"]


def test_near_ties_follow_the_engine(monkeypatch):
    """An inert padded row's draft token changed by hand: a divergence; once the reference deems every
    sampling decision undecidable, it takes the engine's token and the case is tolerated, not failed."""
    case, _, got = _run("seeded_sampling", cases.case_seed(0, "engine.step", "seeded_sampling", 0))
    step = next(i for i, r in enumerate(got) if "draft.sampled" in r and (r["draft.sample_idx_mapping"] < 0).any())
    row = int((got[step]["draft.sample_idx_mapping"] < 0).nonzero()[0])
    got = got[:step + 1]  # the case ends there, so the changed token shows nowhere later
    got[step]["draft.sampled"][row] = (got[step]["draft.sampled"][row] + 1) % 64
    inputs = dict(guards.fresh_inputs(case), num_steps=step + 1)
    found = engine_check.compare("engine", engine_check.reference(**inputs), got)
    assert isinstance(found, Divergence) and f"step {step} draft.sampled" in found.output
    monkeypatch.setitem(reference_engine.HIDDEN_ERROR, "float32", 1.0)
    monkeypatch.setattr(engine_check, "NEAR_TIE_SHARE", 1.0)
    tolerated = engine_check.compare("engine", engine_check.reference(**inputs), got)
    assert isinstance(tolerated, Tolerated) and "took the engine's" in tolerated.note


@pytest.mark.slow
def test_tp_ranks_agree_on_the_engine_and_diverge_under_the_fix2_mutants():
    """Ranks with different PYTHONHASHSEED and global-RNG state replay one request stream through the whole
    engine: they agree on every record field at every step, and each fix-2 bug splits them at its field."""
    from stress import tp

    first_field = {"set-order-recycling": ("slots.slot_of_request", "slots.free"),
                   "global-rng-seeds": ("slots.seeds",)}
    outcomes = tp.run_ranks(2, mutants=(None, *first_field), workload="engine", num_steps=6)
    assert outcomes.pop(None).agreed
    for mutant, outcome in outcomes.items():
        assert not outcome.agreed and "DIVERGED step " in outcome.message, outcome.message
        assert outcome.message.split(" field ")[1].split(":")[0] in first_field[mutant], outcome.message


@pytest.mark.slow
def test_path_column_is_opt_in_and_kills_through_the_whole_step():
    """Without a path budget the matrix hunts only the unit checks; with one, engine.step kills the slot bugs too."""
    from stress.mutate import kill_matrix as matrix

    slots = [checks.get("spec.slots")]
    plain = matrix.kill_matrix(slots, "cpu", max_iters=20, seed=0, jobs=0, path_iters=0)
    assert {k.path for k in plain} == {"-"} and {k.status for k in plain} == {"killed"}
    with_path = matrix.kill_matrix(slots, "cpu", max_iters=20, seed=0, jobs=0, path_iters=20, path_only=True)
    assert {k.mutant: k.path for k in with_path} == {"set-order-recycling": "killed", "global-rng-seeds": "killed"}
    line, ok = kill_matrix_verdict(with_path, "cpu")
    assert ok and "path column: 2 killed by the whole step" in line


@pytest.mark.gpu
def test_a_step_waits_for_the_device_a_few_times(monkeypatch):
    """A wait for the device costs a GPU shared by several worker processes a turn of their time slices (about
    2.7 ms each beside seven others): with a blocking copy per record field, per host list and per scalar written
    into a device tensor, 91 waits a step on an H100, engine.step's launches took 1.4 s a case in make stress.
    torch's sync debug mode and the explicit synchronizes count each step's waits over a `combined` workload
    (prefill chunks, drafting, preemption, sampling): about 5 remain there (one H200), the launchers' argument
    checks, the KV guards, verification's and the draft's results read back, the record."""
    import warnings

    from kernels.spec import engine

    inputs = cases.build_case(checks.BY_NAME["engine.step"], "combined", 3, "cuda").inputs
    replay = engine.Engine(inputs["config"], inputs["weights"], inputs["requests"])
    explicit = []  # torch.cuda.synchronize, which the sync debug mode does not report
    synchronize = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (explicit.append(1), synchronize(*a, **k)))
    waits = []
    for _ in range(inputs["num_steps"]):
        explicit.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                replay.step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        waits.append(sum("synchroniz" in str(w.message) for w in caught) + len(explicit))
    assert min(waits) > 0, f"a step the count saw no wait in cannot be counted here: {waits}"
    assert max(waits) <= 6, f"waits for the device per step: {waits}"


@pytest.mark.parametrize("where", ["front guard", "null block", "back guard", "nowhere"])
def test_guards_intact_sees_a_write_to_a_guard_or_the_null_block(where):
    from kernels.spec import models
    config = models.ModelConfig(vocab=8, hidden=4, layers=1, heads=1, kv_heads=1, head_dim=4, ffn=4,
                                rope_theta=1e4, max_position=8)
    head = dict.fromkeys(("head_raw", "head_norm", "position_codes"), torch.zeros(1))
    model = models.Model(config, head, torch.device("cpu"), torch.float32)
    (k_cache, _), = model.new_kv_caches(num_blocks=3, block_size=2)
    k_cache[1:].zero_()  # blocks handed out to requests: any value is theirs
    whole = model._guarded[0]
    row = {"front guard": 0, "null block": models.GUARD_BLOCKS, "back guard": -1}.get(where)
    if row is not None:
        whole[row, 0] = 0.0
    assert model.guards_intact() is (where == "nowhere")


@pytest.mark.parametrize("head_dim", [-2, 0, 1, 2, 3, 4, 33])
def test_a_model_config_refuses_an_odd_head_dim_naming_it(head_dim):
    from kernels.spec import models

    def config():
        return models.ModelConfig(vocab=8, hidden=4, layers=1, heads=1, kv_heads=1, head_dim=head_dim, ffn=4,
                                  rope_theta=1e4, max_position=8)

    if head_dim >= 2 and head_dim % 2 == 0:
        assert config().head_dim == head_dim
    else:
        with pytest.raises(ValueError, match=r"^head_dim: .* must be even and at least 2"):
            config()
