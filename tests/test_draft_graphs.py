"""The captured draft step: dispatch and padding, static-buffer preparation, retention, the host-planned
backend's baked lengths, poison, the judges; on a GPU, capture and replay themselves."""

import copy
import math

import pytest
import torch

from kernels import runtime
from kernels.spec import attention_backends, draft_graphs, draft_step
from kernels.spec.draft_graphs import DraftGraphs
from kernels.spec.draft_step import DraftConfig, random_weights
from kernels.spec.graphs import Mode
from reference import attention as reference_attention
from stress import checks
from stress.core import cases, compare, guards, workers
from stress.core import patches as mutants
from stress.core.types import RETURN, Mutant, Patch
from stress.oracles import graph_replay
from stress.oracles.graph_replay import POISON, Batch

MASK = 63
LAST_SAMPLED = (40, 41, 42, 43, 44)  # by slot
NEXT_PREFILL = (50, 51, 52, 53, 54)


def _graphs(device, *, backend="specsan_paged", causal=False, anchor_first=False, schedule=None,
            small_grid=0, capture_sizes=(8, 16)):
    """A small draft (K = 3, block size 4) for 4 batch rows and 5 slots; capture sizes in tokens."""
    config = DraftConfig(vocab_size=64, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8, block_size=4,
                         max_draft_tokens=3, anchor_first=anchor_first, causal=causal, mask_token_id=MASK,
                         max_model_len=64)
    weights = type(random_weights(config, 0))(*(w.to(device) for w in random_weights(config, 0)))
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache = (torch.randn(40, 4, 1, 8, generator=gen).to(device) for _ in range(2))
    step = draft_step.DraftStep(config, weights, attention_backends.make(backend, causal=causal),
                                k_cache=k_cache, v_cache=v_cache, temperature=torch.zeros(5, device=device),
                                seeds=torch.zeros(5, dtype=torch.int64, device=device),
                                logits_cache=torch.zeros(5, 3, 64, device=device), max_num_reqs=4, max_num_tokens=32,
                                max_blocks_per_req=4)
    # both classes as their modules hold them now, so a planted bug applies
    return draft_graphs.DraftGraphs(step, capture_sizes=capture_sizes, max_num_reqs=4, schedule=schedule,
                                    small_grid=small_grid)


def _batch(*, k=3, positions=(5, 6, 9), cached=(1, 0, 3, 0, 5)):
    """Batch row 0 = slot 3: a decode step at positions 5..6, both accepted (last position 6). Batch row 1 =
    slot 1: a one-row prefill chunk at position 9, nothing sampled yet. Idle slots carry unaligned counts."""
    return Batch(idx_mapping=(3, 1), target_query_start_loc=(0, 2, 3), target_positions=positions,
                 num_sampled=(2, 0), num_rejected=(0, 0), block_table=((10, 11, 12, 13), (20, 21, 22, 23)),
                 last_sampled=LAST_SAMPLED, next_prefill_tokens=NEXT_PREFILL, num_cached_tokens=cached,
                 temperature=(0.0, 1.0, 0.0, 0.5, 0.0), seeds=(1, 2, 3, 4, 5), num_draft_tokens=k)


def test_batches_dispatch_to_the_smallest_captured_size_that_holds_them(device):
    dflash = _graphs(device)  # Q = 4: capture sizes 8 and 16 tokens are 2 and 4 requests
    assert [(d.num_reqs, d.uniform) for d in (dflash.descriptor_for(b, 3) for b in (1, 2, 3, 4))] == \
        [(2, 4), (2, 4), (4, 4), (4, 4)]
    assert dflash.descriptor_for(2, 2).mode is Mode.NONE, "depth 2 has no graph without a schedule"
    banded = _graphs(device, schedule=[(1, 2, 3), (3, 4, 0)], small_grid=4)  # DFlash: widths 4 and 1 (drafts nothing)
    assert {banded.depth(d) for d in banded.candidates.full} == {3, 0}
    assert {banded.depth(d) for d in banded.descriptors} == {3}
    dspark = _graphs(device, anchor_first=True, schedule=[(1, 2, 3), (3, 4, 0)])  # Q = K: the 0 band has no width
    assert {d.uniform for d in dspark.descriptors} == {3}


def test_a_backend_that_bakes_lengths_is_never_captured_for_non_causal_drafting(device):
    assert _graphs(device, backend="host_planned", causal=False).descriptors == []
    assert _graphs(device, backend="host_planned", causal=False).descriptor_for(1, 3).mode is Mode.NONE
    assert _graphs(device, backend="host_planned", causal=True).descriptors
    assert _graphs(device, backend="specsan_paged", causal=False).descriptors


def test_depth_zero_drafts_nothing_and_writes_nothing(device):
    owner = _graphs(device, schedule=[(1, 2, 3), (3, 4, 0)])
    graph_replay.poison(owner, _batch())
    out = owner.run(num_draft_tokens=0, **_batch(k=0).target(device))
    assert out.draft_tokens.shape == (2, 0) and out.hidden is None and not out.replayed
    assert bool((owner.step.buffers.input_ids == POISON).all()), "no preparation ran"


def test_prepare_fills_the_padded_size_and_nothing_past_it(device):
    owner = _graphs(device)
    graph_replay.poison(owner, _batch())
    assert owner.step.prepare(num_reqs=4, num_draft_tokens=3, **_batch().target(device))
    buf = {k: v.cpu().tolist() for k, v in owner.step.buffers.tensors().items()}
    assert buf["input_ids"][:16] == [LAST_SAMPLED[3], MASK, MASK, MASK, NEXT_PREFILL[1], MASK, MASK, MASK] + [0] * 8
    assert buf["positions"][:16] == [7, 8, 9, 10, 10, 11, 12, 13] + [0] * 8
    assert buf["query_slot_mapping"][:16] == [47, 48, 49, 50, 90, 91, 92, 93] + [-1] * 8  # block * 4 + offset
    assert buf["query_start_loc"] == [0, 4, 8, 8, 8]
    assert buf["seq_lens"] == [11, 14, 0, 0]
    assert buf["sample_indices"] == [1, 2, 3, 5, 6, 7] + [0] * 6
    assert buf["sample_pos"] == [8, 9, 10, 11, 12, 13] + [0] * 6
    assert buf["sample_idx_mapping"] == [3, 3, 3, 1, 1, 1] + [-1] * 6, "padded sampling rows are inert"
    assert buf["block_table"][2:] == [[39] * 4] * 2, "padded table rows keep the poison block"


def test_a_partial_cached_block_refuses_the_batch(device):
    owner = _graphs(device)
    graph_replay.poison(owner, _batch())
    out = owner.run(num_draft_tokens=3, **_batch(cached=(1, 2, 3, 0, 5)).target(device))
    assert out.draft_tokens.tolist() == [[-1] * 3] * 2 and out.hidden is None


def test_poison_covers_buffers_sampling_state_and_logits_cache(device):
    owner = _graphs(device)
    graph_replay.poison(owner, _batch())
    step = owner.step
    for name, t in step.buffers.tensors().items():
        assert bool((t == (39 if name == "block_table" else POISON)).all()), name
    assert [math.isnan(t) for t in step.temperature.tolist()] == [True, False, True, False, True]
    assert step.seeds.tolist() == [POISON, 2, POISON, 4, POISON]
    assert bool(step.logits_cache.isnan().all())


def test_backbone_outputs_are_retained_only_while_capturing(monkeypatch, device):
    """Fix 8 (e): under capture the exact hidden-state object is kept; eager runs keep nothing."""
    owner = _graphs(device)
    graph_replay.poison(owner, _batch())
    assert owner.step.prepare(num_reqs=2, num_draft_tokens=3, **_batch().target(device))
    owner.forward(2, 3)
    assert owner.retained == ()
    monkeypatch.setattr(draft_graphs, "capturing", lambda: True)
    outputs = owner.forward(2, 3)
    assert len(owner.retained) == 1 and owner.retained[0] is outputs.hidden
    owner.clear()
    assert owner.retained == () and owner.captured == {}


def test_a_cleared_graph_is_never_replayed(device):
    """``clear`` drops the graphs themselves, not only the outputs they filled: a later run of a batch that
    dispatches to a cleared graph runs the step eagerly. A stand-in records replays (graphs need a GPU)."""
    owner = _graphs(device)
    graph_replay.poison(owner, _batch())
    desc = owner.descriptor_for(2, 3)
    replayed = []
    owner._graphs[desc] = type("Graph", (), {"replay": lambda self: replayed.append(desc)})()
    owner.clear()
    out = owner.run(num_draft_tokens=3, **_batch().target(device))
    assert out.descriptor == desc and not out.replayed and not replayed


@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("backend", attention_backends.BACKENDS)
def test_each_backend_attends_like_the_reference_on_rows_without_keys_or_queries(backend, causal, device):
    """The metadata a draft step hands its backend may hold padded rows (queries, no keys), rows with keys and
    no queries, and a one-key row. Both backends must give the reference's out: skipped rows and the padding
    past the batch untouched (NaN here), every other row its attention. Graph families never build such rows
    for the host-planned backend's own non-causal loop."""
    gen = torch.Generator().manual_seed(2)
    rows = ((2, 0), (0, 5), (1, 1), (3, 7), (2, 8))  # (query rows, seq_len) per batch row
    starts = [0]
    for queries, _ in rows:
        starts.append(starts[-1] + queries)
    k_cache, v_cache = (torch.randn(12, 4, 2, 8, generator=gen) for _ in range(2))
    query = torch.randn(starts[-1] + 2, 4, 8, generator=gen)  # two padding rows past the batch
    block_table = torch.randperm(12, generator=gen)[:10].view(5, 2).to(torch.int32)
    seq_lens = torch.tensor([s for _, s in rows], dtype=torch.int32)
    query_start_loc = torch.tensor(starts, dtype=torch.int32)
    expected = reference_attention.paged_attention(query, k_cache, v_cache, block_table, seq_lens, query_start_loc,
                                                   scale=0.3, causal=causal, out=torch.full_like(query, math.nan))
    meta = attention_backends.AttentionMetadata(query_start_loc.to(device), seq_lens.to(device),
                                                block_table.to(device), 4)
    attend = attention_backends.make(backend, causal=causal)
    out = torch.full_like(query, math.nan).to(device)
    attend.plan(meta)
    attend.forward(query.to(device), k_cache.to(device), v_cache.to(device), meta, scale=0.3, out=out)
    torch.testing.assert_close(out.cpu(), expected.float(), rtol=1e-5, atol=1e-5, equal_nan=True)


def test_host_planned_attention_uses_the_lengths_of_its_last_plan(device):
    """What a replay of a captured host-planned step does: the launches keep the plan's lengths."""
    owner = _graphs(device, backend="host_planned")
    step = owner.step
    assert step.prepare(num_reqs=2, num_draft_tokens=3, **_batch().target(device))
    at_capture = copy.copy(step.backend)  # the plan a capture would bake in
    # longer sequences, still within a row of the table (4 blocks of 4 tokens: the launcher refuses more)
    assert step.prepare(num_reqs=2, num_draft_tokens=3, **_batch(positions=(10, 11, 2)).target(device))
    fresh = step.backbone(2, 3)
    step.backend = attention_backends.make("specsan_paged", causal=False)
    paged = step.backbone(2, 3)
    step.backend = at_capture
    stale = step.backbone(2, 3)
    torch.testing.assert_close(fresh, paged, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(stale, fresh, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("check_name", ["graphs.replay", "graphs.lifetime", "graphs.eager_step"])
def test_every_planted_bug_reaches_what_the_drivers_build(check_name, device):
    """The drivers look their classes up when they build, so a patched class is the one that runs."""
    check = checks.get(check_name)
    case = cases.build_case(check, next(iter(check.families)), 1, "cpu")
    inputs = guards.fresh_inputs(case)
    weights = draft_step.DraftWeights(*(inputs[name].to(device) for name in draft_step.DraftWeights._fields))
    k_cache, v_cache = inputs["k_cache"].to(device), inputs["v_cache"].to(device)
    for mutant in check.mutants:
        with mutants.applied(mutant):
            owner = graph_replay.build(inputs["config"], weights, inputs["setup"], k_cache, v_cache, inputs["batches"])
            assert type(owner) is draft_graphs.DraftGraphs and type(owner.step) is draft_step.DraftStep, mutant.name
    with mutants.applied(checks.get("graphs.replay").mutant("non-causal-claims-full")):
        assert _graphs(device, backend="host_planned").mode is Mode.FULL


def test_a_slip_in_the_configuration_class_reaches_the_step_the_drivers_build(device):
    """A case's DraftConfig is built before a bug is planted; the drivers rebuild it from its fields with the class
    as its module holds it then, so a slip in one of its methods (the query length here) is what the step runs."""
    check = checks.get("graphs.eager_step")
    inputs = guards.fresh_inputs(cases.build_case(check, "padded_graph", 1, "cpu"))
    weights = draft_step.DraftWeights(*(inputs[name].to(device) for name in draft_step.DraftWeights._fields))
    slip = Mutant("query-len-by-flag", "the query length adds the anchor-first flag instead of the new tokens",
                  (Patch("kernels.spec.draft_step:DraftConfig", "return num_draft_tokens + self.new_tokens",
                         "return num_draft_tokens + self.anchor_first"),), oracles={})
    with mutants.applied(slip):
        owner = graph_replay.build(inputs["config"], weights, inputs["setup"], inputs["k_cache"].to(device),
                                   inputs["v_cache"].to(device), inputs["batches"])
        assert owner.step.config.query_len(2) == 2 + int(inputs["config"].anchor_first)
    assert inputs["config"].query_len(2) == 3 - int(inputs["config"].anchor_first)


def test_padded_rows_mapped_to_slot_0_write_its_logits_cache(device):
    """The fix-3 pre-fix form in the draft step, eagerly: two padded requests (6 sampling rows) write
    slot 0's cached logits, though slot 0 is not in the batch."""
    def run():
        owner = _graphs(device, capture_sizes=(16,))  # 2 requests pad to 4
        graph_replay.poison(owner, _batch())
        owner.run(num_draft_tokens=3, replay=False, **_batch().target(device))
        return owner.step.logits_cache[0]

    assert bool(run().isnan().all())
    with mutants.applied(checks.get("graphs.replay").mutant("padded-draft-rows-slot-0")):
        assert not bool(run().isnan().any())


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the CPU refusal; a GPU captures")
def test_capture_needs_a_gpu(device):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        _graphs(device).capture()
    _graphs(device, backend="host_planned").capture()  # nothing to capture: no error


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the CPU verdict")
def test_graph_checks_are_not_checked_on_the_cpu_and_say_why():
    for name in ("graphs.replay", "graphs.lifetime"):
        family = next(iter(checks.get(name).families))
        result = workers.run_case(cases.Task(name, family, 1), "cpu")
        assert result.verdict.startswith("not_checked:CUDA graphs need a GPU"), result.verdict


def test_overlapping_allocations_are_found():
    made = [(100, 50), (150, 10), (300, 8)]
    assert graph_replay.reused(120, 40, made) == [(100, 50), (150, 10)]
    assert graph_replay.reused(160, 100, made) == []


@pytest.fixture(scope="module")
def eager_run(device):
    """The replay driver over one non-causal case with capture switched off: the 'replay' side runs
    eagerly at the padded size, so it equals the twin bit for bit, and every FULL dispatch is a silent
    fallback the judge must name."""
    check = checks.get("graphs.replay")
    case = cases.build_case(check, "non_causal_draft", 3, device.type)
    expected = cases.expected_outputs(check, case)[RETURN]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DraftGraphs, "capture", lambda self: None)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v
                  for k, v in guards.fresh_inputs(case).items()}
        got = graph_replay.replay_draft_graphs(**inputs)
    return expected, got



def _lines(found) -> list[str]:
    return [] if found is None else found.lines()


def test_judge_passes_the_eager_pipeline_except_for_its_silent_fallbacks(eager_run):
    expected, got = eager_run
    found = graph_replay.judge_replay(RETURN, expected, got)
    fallbacks = sum(r.silent_fallback for r in got.batches)
    if fallbacks:
        assert isinstance(found, graph_replay.Findings)
        assert all("never captured" in line for line in found.lines()), found.lines()
        assert len(found.lines()) == fallbacks
    else:
        assert not isinstance(found, graph_replay.Findings), _lines(found)


def test_judge_names_a_replay_that_differs_from_eager(eager_run):
    expected, got = eager_run
    records = list(got.batches)
    tampered = next(i for i, r in enumerate(records) if r.replay.draft_tokens.numel())
    tokens = records[tampered].replay.draft_tokens.clone()
    tokens[0, 0] += 1
    records[tampered] = records[tampered]._replace(replay=records[tampered].replay._replace(draft_tokens=tokens))
    found = graph_replay.judge_replay(RETURN, expected, got._replace(batches=tuple(records)))
    assert any("draft_tokens (replay vs eager)" in line for line in _lines(found)), _lines(found)
    assert found.verdict == "divergence"  # the runner fails the case as fail:<verdict>


def test_judge_names_eager_logits_off_the_reference(eager_run):
    expected, got = eager_run
    records = list(got.batches)
    index = next(i for i, r in enumerate(records) if r.eager.hidden is not None)
    cache = records[index].eager.logits_cache.clone()
    live = ~cache.isnan()
    cache[live] += 0.01
    records[index] = records[index]._replace(eager=records[index].eager._replace(logits_cache=cache))
    lines = _lines(graph_replay.judge_replay(RETURN, expected, got._replace(batches=tuple(records))))
    assert any("logits_cache (eager vs reference)" in line for line in lines), lines


# ---------------------------------------------------------------- on a GPU


def _capture_and_run(device, owner, batch, replay=True):
    owner.capture()
    graph_replay.poison(owner, batch)
    return owner.run(num_draft_tokens=batch.num_draft_tokens, replay=replay, **batch.target(device))


@pytest.mark.gpu
def test_replay_equals_the_eager_twin_and_a_skipped_replay_leaves_poison(device):
    batch = _batch()
    twin = _graphs(device)
    graph_replay.poison(twin, batch)
    eager = twin.run(num_draft_tokens=3, replay=False, **batch.target(device))
    replayed = _capture_and_run(device, _graphs(device), batch)
    assert replayed.replayed and torch.equal(replayed.draft_tokens, eager.draft_tokens)
    assert torch.equal(replayed.hidden, eager.hidden)
    with mutants.applied(checks.get("graphs.replay").mutant("replay-skipped")):
        skipped = _capture_and_run(device, _graphs(device), batch)
    assert bool((skipped.draft_tokens == POISON).all())


@pytest.mark.gpu
def test_non_causal_host_planned_replays_stale_lengths_once_it_claims_full_graphs(device):
    """The fix-6 pre-fix: the claim lets the host-planned step be captured; a replay with other lengths
    then differs from the same step run eagerly."""
    later = _batch(positions=(10, 11, 2))
    with mutants.applied(checks.get("graphs.replay").mutant("non-causal-claims-full")):
        owner = _graphs(device, backend="host_planned")
        assert owner.descriptors
        replayed = _capture_and_run(device, owner, later)
        twin = _graphs(device, backend="host_planned")
        graph_replay.poison(twin, later)
        eager = twin.run(num_draft_tokens=3, replay=False, **later.target(device))
    assert replayed.replayed and not torch.equal(replayed.hidden, eager.hidden)


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", [None, "backbone-not-retained"])
def test_lifetime_shows_address_reuse_only_without_retention(mutant):
    seed = cases.case_seed(0, "graphs.lifetime", "shared_pool", 0)
    result = workers.run_case(cases.Task("graphs.lifetime", "shared_pool", seed, mutant), "cuda")
    evidence = [line for line in result.details if "the second capture allocated" in line]
    if mutant is None:
        assert result.verdict == "pass" and not evidence, result.details
    else:
        assert result.verdict == "fail:divergence" and evidence, result.details



def test_near_ties_are_counted_over_the_whole_case(eager_run):
    """Two near ties in one small batch leave the case judged; a flood across the case does not."""
    expected, got = eager_run
    no_fallback = got._replace(batches=tuple(r._replace(silent_fallback=False) for r in got.batches))

    def flagged(count):
        steps = []
        for step in expected.steps:
            near_tie = torch.zeros_like(step.draft_tokens.near_tie)
            take = min(count, near_tie.numel())
            near_tie[:take] = True
            count -= take
            steps.append(step._replace(draft_tokens=step.draft_tokens._replace(near_tie=near_tie)))
        return expected._replace(steps=tuple(steps))

    rows = sum(step.draft_tokens.near_tie.numel() for step in expected.steps)
    assert isinstance(graph_replay.judge_replay(RETURN, flagged(2), no_fallback), compare.Tolerated)
    assert not isinstance(graph_replay.judge_replay(RETURN, flagged(2), no_fallback), compare.Unjudged)
    assert isinstance(graph_replay.judge_replay(RETURN, flagged(rows), no_fallback), compare.Unjudged)


def test_a_padded_batch_hands_back_the_hidden_state_of_its_live_rows_only(device):
    """Three requests run at the captured size of four (eagerly here: replay=False pads as a replay does): the
    hidden state handed back holds the three live requests' query rows, the padded request's left out."""
    owner = _graphs(device)
    batch = Batch(idx_mapping=(3, 1, 0), target_query_start_loc=(0, 2, 3, 4), target_positions=(5, 6, 9, 7),
                  num_sampled=(2, 0, 1), num_rejected=(0, 0, 0),
                  block_table=((10, 11, 12, 13), (20, 21, 22, 23), (24, 25, 26, 27)), last_sampled=LAST_SAMPLED,
                  next_prefill_tokens=NEXT_PREFILL, num_cached_tokens=(0,) * 5, temperature=(0.0,) * 5,
                  seeds=(1, 2, 3, 4, 5), num_draft_tokens=3)
    out = owner.run(num_draft_tokens=3, replay=False, **batch.target(device))
    assert out.descriptor.num_reqs == 4, "the batch runs padded"
    assert out.hidden.shape[0] == 3 * owner.step.config.query_len(3)
