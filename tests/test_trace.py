"""The CPU tracer against planted control kernels (each a positive or negative control), and the
registry's own kernels, which must all trace clean."""

import pytest
import slow_cases
import torch
import triton
import triton.language as tl

from kernels import runtime
from stress import checks
from stress.core import cases, oracle, refusal, workers
from stress.core.tracer import trace, tracing
from stress.core.types import Case, Check
from stress.report import summary as report

pytestmark = pytest.mark.skipif(not runtime.INTERPRETED, reason="the tracer runs under the CPU interpreter")


@triton.jit
def _tiled_shift(x_ptr, n, K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs + K < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs + K, mask=keep), mask=keep)


@triton.jit
def _row_shift(x_ptr, n, K: tl.constexpr, BLOCK: tl.constexpr, BARRIER: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    keep = offs + K < n
    values = tl.load(x_ptr + offs + K, mask=keep)
    if BARRIER:
        tl.debug_barrier()
    tl.store(x_ptr + offs, values, mask=keep)


@triton.jit
def _scatter(idx_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + tl.load(idx_ptr + offs), offs)


@triton.jit
def _stamp(out_ptr, SAME_VALUE: tl.constexpr):
    """Every program stores to ``out[0]``: 7 from each (a duplicate store), or its own program id."""
    tl.store(out_ptr, 7 if SAME_VALUE else tl.program_id(0))


@triton.jit
def _counters(counter_ptr, out_ptr, PLAIN_STORE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if PLAIN_STORE and tl.program_id(0) == 0:
        tl.store(counter_ptr, 0)
    else:
        tl.atomic_add(counter_ptr, 1)
    tl.atomic_add(out_ptr + offs, offs)


@triton.jit
def _masked_overlap(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs % 4, offs, mask=offs < 4)  # lanes 4.. alias lanes 0..3 but are masked off


@triton.jit
def _copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if MASKED:
        values = tl.load(x_ptr + offs, mask=offs < n, other=0)
    else:
        values = tl.load(x_ptr + offs)  # the `offs < n` term was dropped
    tl.store(out_ptr + offs, values, mask=offs < BLOCK)


@triton.jit
def _load_at(x_ptr, out_ptr, index):
    tl.store(out_ptr, tl.load(x_ptr + index))


@triton.jit
def _fill_then_read(x_ptr, out_ptr, BLOCK: tl.constexpr, FILL: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if FILL:
        tl.store(x_ptr + offs, offs)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def _recovered_token(probs_ptr, draft_ptr, out_ptr, V, BLOCK: tl.constexpr, FIXED: tl.constexpr):
    """vLLM PR #23829: zero the draft token's probability in place, read the row, restore it."""
    row = tl.program_id(0)
    draft = tl.load(draft_ptr + row)
    offs = tl.arange(0, BLOCK)
    row_ptr = probs_ptr + row * V
    if FIXED:
        probs = tl.load(row_ptr + offs, mask=(offs < V) & (offs != draft), other=0.0)
    else:
        saved = tl.load(row_ptr + draft)
        tl.store(row_ptr + draft, 0.0)
        probs = tl.load(row_ptr + offs, mask=offs < V, other=0.0)
        tl.store(row_ptr + draft, saved)
    tl.store(out_ptr + row, tl.argmax(probs, 0))


@triton.jit
def _ticket(counter_ptr, out_ptr):
    tl.store(out_ptr + tl.program_id(0), tl.atomic_add(counter_ptr, 1))


@triton.jit
def _first_claims(flag_ptr):
    tl.atomic_cas(flag_ptr, 0, tl.program_id(0) + 1)


def _kinds(report):
    return {f.kind for f in report.races}


def test_tiled_in_place_shift_races_between_programs():
    x = torch.arange(1024, dtype=torch.int32)
    report = trace(_tiled_shift, (16,), x, 1024, K=3, BLOCK=64)
    assert report.verdict == "fail:race"
    cross = [f for f in report.races if f.kind == "WAR" and f.first.program != f.second.program]
    assert cross and sum(f.bytes for f in cross) == 15 * 3 * 4  # three elements at each of 15 tile edges
    assert "order" in _kinds(report)  # the reversed order really changes the result
    assert torch.equal(x[:1021], torch.arange(3, 1024, dtype=torch.int32)), "the default order's result is kept"


def test_one_program_shift_needs_its_barrier():
    clean = trace(_row_shift, (1,), torch.arange(256, dtype=torch.int32), 256, K=5, BLOCK=256, BARRIER=True)
    racy = trace(_row_shift, (1,), torch.arange(256, dtype=torch.int32), 256, K=5, BLOCK=256, BARRIER=False)
    assert clean.ok, clean.lines()
    assert racy.verdict == "fail:race" and _kinds(racy) == {"WAR"}
    finding = racy.races[0]
    assert finding.bytes == (256 - 10) * 4 and finding.first.program == finding.second.program
    assert finding.first.op == "load" and finding.second.op == "store"
    assert finding.first.site.endswith(f"test_trace.py:{_row_shift.fn.__code__.co_firstlineno + 4}")  # the load


def test_scatter_with_duplicate_indices_is_waw_and_disjoint_is_clean():
    out = torch.zeros(8, dtype=torch.int32)
    dup = trace(_scatter, (2,), torch.tensor([0, 1, 2, 3, 4, 5, 0, 0], dtype=torch.int32), out, BLOCK=4)
    assert dup.verdict == "fail:race" and "WAW" in _kinds(dup)
    scopes = {f.first.program == f.second.program for f in dup.races if f.kind == "WAW"}
    assert scopes == {True, False}  # lanes 2, 3 of program 1 collide, and both with program 0's lane 0
    disjoint = trace(_scatter, (2,), torch.tensor([7, 1, 2, 3, 4, 5, 6, 0], dtype=torch.int32), out, BLOCK=4)
    assert disjoint.ok, disjoint.lines()


def test_stores_of_one_value_by_several_programs_are_benign_duplicates_and_of_differing_values_race():
    same = trace(_stamp, (3,), torch.zeros(1, dtype=torch.int32), SAME_VALUE=True)
    assert same.verdict == "pass" and not same.races
    assert [(f.category, f.kind) for f in same.duplicate_stores] == [("duplicate-store", "WAW")]
    assert same.duplicate_stores[0].first.program != same.duplicate_stores[0].second.program
    assert any(line.startswith("duplicate-store WAW") for line in same.lines())
    differing = trace(_stamp, (3,), torch.zeros(1, dtype=torch.int32), SAME_VALUE=False)
    assert differing.verdict == "fail:race" and "WAW" in _kinds(differing) and not differing.duplicate_stores


def test_a_case_whose_programs_store_one_value_passes_with_the_duplicates_in_its_details_and_summary(monkeypatch):
    def family(rng, device, launch):
        return Case(inputs={"out": torch.zeros(1, dtype=torch.int32)})

    check = Check(name="t.stamp", kernel=lambda out: _stamp[(3,)](out, SAME_VALUE=True),
                  reference=lambda out: torch.full_like(out, 7), families={"f": family}, outputs=("out",))
    monkeypatch.setitem(checks.BY_NAME, check.name, check)
    result = workers.run_case(cases.Task(check.name, "f", 1), "cpu")
    assert result.verdict == "pass"
    assert result.details[0].startswith("_stamp: duplicate-store WAW"), result.details
    summary = report.Report(None, {})
    summary.add(result)
    assert f"## Passed with notes\n\n- t.stamp / f: 1 case(s); seed 1: {result.details[0]}" in summary.summary()


def test_atomics_alone_are_clean_but_mixed_with_a_plain_store_race():
    atomics = trace(_counters, (4,), torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32),
                    PLAIN_STORE=False, BLOCK=8)
    assert atomics.ok, atomics.lines()
    mixed = trace(_counters, (4,), torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32),
                  PLAIN_STORE=True, BLOCK=8)
    assert mixed.verdict == "fail:race"
    assert {(f.first.op, f.second.op) for f in mixed.races if f.kind != "order"} == {("store", "atomic")}


def test_lanes_that_overlap_only_where_masked_off_are_clean():
    assert trace(_masked_overlap, (1,), torch.zeros(8, dtype=torch.int32), BLOCK=8).ok


def test_dropped_mask_term_is_out_of_bounds_and_reads_nothing():
    x, out = torch.arange(1, 6, dtype=torch.int32), torch.full((8,), -1, dtype=torch.int32)
    report = trace(_copy, (1,), x, out, 5, BLOCK=8, MASKED=False)
    assert report.verdict == "fail:oob"
    assert report.oob[0].count == 3 and report.oob[0].bytes == 12 and report.oob[0].first.lane == 5
    assert report.oob[0].first.where == "x_ptr +20 B, outside its 20 B storage"
    assert out.tolist() == [1, 2, 3, 4, 5, 0, 0, 0], "out-of-bounds lanes are masked, not garbage"
    assert trace(_copy, (1,), x, out, 5, BLOCK=8, MASKED=True).ok
    short = torch.zeros(5, dtype=torch.int32)
    stores = trace(_copy, (1,), x, short, 5, BLOCK=8, MASKED=True)
    assert stores.verdict == "fail:oob" and stores.oob[0].kind == "store" and stores.oob[0].count == 3


def test_index_minus_one_off_an_empty_tensor_is_out_of_bounds_and_not_loaded():
    empty, out = torch.empty(0, dtype=torch.int32), torch.full((1,), 7, dtype=torch.int32)
    assert empty.data_ptr() == 0  # the address below it is 2^64 - 4, where address + size wraps to 0
    report = trace(_load_at, (1,), empty, out, -1)
    assert report.verdict == "fail:oob"
    assert report.oob[0].kind == "load" and report.oob[0].bytes == 4


def test_read_of_a_declared_unwritten_region_is_uninit():
    mask = torch.zeros(8, dtype=torch.bool)
    mask[2:4] = True
    args = (torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))
    report = trace(_fill_then_read, (1,), *args, BLOCK=8, FILL=False, unwritten={"x_ptr": mask})
    assert report.verdict == "fail:uninit"
    assert report.uninit[0].bytes == 8 and report.uninit[0].first.lane == 2
    assert trace(_fill_then_read, (1,), *args, BLOCK=8, FILL=True, unwritten={"x_ptr": mask}).ok
    with pytest.raises(ValueError, match="unwritten"):
        trace(_fill_then_read, (1,), *args, BLOCK=8, FILL=False, unwritten={"BLOCK": mask})


def test_read_modify_write_of_vllm_23829_races_and_its_fix_is_clean():
    def run(fixed):
        probs = torch.rand(3, 50, generator=torch.Generator().manual_seed(0))
        out = torch.zeros(3, dtype=torch.int32)
        return trace(_recovered_token, (3,), probs, torch.tensor([4, 9, 49], dtype=torch.int32), out, 50,
                     BLOCK=64, FIXED=fixed)

    racy = run(False)
    assert racy.verdict == "fail:race" and {"RAW", "WAR"} <= _kinds(racy)
    assert all(f.first.program == f.second.program for f in racy.races)
    assert run(True).ok


def test_output_that_depends_on_program_order_through_atomics_alone_is_order_dependent():
    report = trace(_ticket, (8,), torch.zeros(1, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))
    assert report.verdict == "fail:order-dependent" and not report.races, report.lines()
    assert {f.kind for f in report.order_dependent} == {"reversed", "shuffled"}
    claims = trace(_first_claims, (4,), torch.zeros(1, dtype=torch.int32))
    assert claims.verdict == "fail:order-dependent"


def test_hooks_are_removed_also_on_error_and_unknown_internals_are_not_checked(monkeypatch):
    from triton.runtime import interpreter

    before = dict(vars(interpreter.InterpreterBuilder)), interpreter._interpreter
    with pytest.raises(RuntimeError, match="boom"), tracing():
        raise RuntimeError("boom")
    assert (dict(vars(interpreter.InterpreterBuilder)), interpreter._interpreter) == before
    monkeypatch.delattr(interpreter.InterpreterBuilder, "create_barrier")
    report = trace(_copy, (1,), torch.zeros(8), torch.zeros(8), 8, BLOCK=8, MASKED=True)
    assert report.verdict.startswith("not_checked:") and "create_barrier" in report.not_checked


def test_a_write_the_hooks_did_not_see_is_not_checked(monkeypatch):
    from triton._C.libtriton import interpreter as memory
    from triton.runtime import interpreter

    def unhooked_store(self, ptrs, value, mask, cache_policy):
        return memory.store(ptrs.data, value.data, mask.data)  # bypasses the module the tracer wraps

    assert trace(_copy, (1,), torch.arange(8.0), torch.zeros(8), 8, BLOCK=8, MASKED=True).ok  # probe runs here
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_store", unhooked_store)
    report = trace(_copy, (1,), torch.arange(8.0), torch.zeros(8), 8, BLOCK=8, MASKED=True)
    assert report.verdict.startswith("not_checked:") and "does not hook" in report.not_checked


def test_runner_turns_the_no_barrier_mutant_into_fail_race():
    seed = cases.case_seed(0, "block_table.shift", "overlap", 0)
    result = workers.run_case(cases.Task("block_table.shift", "overlap", seed, "no-barrier"), "cpu")
    assert result.verdict == "fail:race", result.details
    assert any("tl.debug_barrier()" in line for line in result.details)
    assert workers.run_case(cases.Task("block_table.shift", "overlap", seed, "no-barrier"), "cpu",
                           trace=False).verdict == "pass", "without the tracer the interpreter cannot see it"


# a refusal family's cases launch no kernel: nothing to trace (stress.core.refusal)
PAIRS = [(c.name, f) for c in checks.REGISTRY if "cpu" in c.devices for f, build in c.families.items()
         if not refusal.is_family(build)]
# an engine step traced takes 5-29 s on a CPU core; mid_prefill_hit, the cheapest, stays quick
SLOW = {*slow_cases.every_family_of("engine.step", but={"mid_prefill_hit", "refused"}),
        ("sampling.gumbel", "huge_vocab"), ("sampling.gumbel", "vocab_splits_short_last"),
        ("sampling.gumbel", "vocab_splits_many_rows"), ("kv_cache.write", "tile_limit"),
        ("rejection.verify", "huge_vocab")}
PARAMS = slow_cases.marked(PAIRS, SLOW)


@pytest.mark.parametrize("check_name,family", PARAMS)
def test_registry_traces_clean(check_name, family):
    check = checks.get(check_name)
    for i in range(2):
        seed = cases.case_seed(1, check_name, family, i)
        case = cases.build_case(check, family, seed, "cpu")
        verdict, details = oracle.traced(check, case, seed)
        assert verdict == "pass", "\n".join([f"specsan trace {check_name} {family} {seed}", *details])


def test_a_later_launch_may_read_what_an_earlier_one_wrote():
    x, out = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    with tracing([(x, torch.ones(8, dtype=torch.bool))]) as recording:
        _fill_then_read[(1,)](x, out, BLOCK=8, FILL=True)
        _copy[(1,)](x, out, 8, BLOCK=8, MASKED=True)
    assert [r.verdict for r in recording.reports] == ["pass", "pass"] and recording.verdict == "pass"


def test_runner_reports_declared_unwritten_reads_as_fail_uninit():
    from stress.core.types import Case, Check

    def copy(x, out):
        _copy[(1,)](x, out, x.numel(), BLOCK=8, MASKED=True)

    check = Check("control.copy", copy, lambda x, out: x.clone(), families={}, outputs=("out",))
    inputs = {"x": torch.arange(8, dtype=torch.int32), "out": torch.zeros(8, dtype=torch.int32)}
    stale = torch.arange(8) >= 6
    verdict, details = oracle.traced(check, Case(inputs, unwritten={"x": stale}), seed=0)
    assert verdict == "fail:uninit" and "_copy" in details[0]
    assert oracle.traced(check, Case(inputs, unwritten={"out": stale}), seed=0) == ("pass", [])
    with pytest.raises(ValueError, match="unwritten"):
        oracle.traced(check, Case(inputs, unwritten={"missing": stale}), seed=0)
