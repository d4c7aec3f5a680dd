"""The harness itself: seeds, verdicts, guard zones, streaming reports and the CLI."""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
import torch
import triton
import triton.language as tl

from kernels import runtime
from stress import checks
from stress.core import cases, compare, guards, oracle, pool, workers
from stress.core.types import Case, Check, Result
from stress.mutate import kill_matrix as matrix
from stress.report import summary as report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "stress", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def test_case_seed_is_order_independent_and_distinct():
    a = cases.case_seed(0, "x", "f", 3)
    assert a == cases.case_seed(0, "x", "f", 3)
    assert len({cases.case_seed(0, c, f, i) for c in "ab" for f in "fg" for i in range(50)}) == 200
    assert cases.case_seed(1, "x", "f", 3) != a


def test_a_family_that_owns_its_launch_runs_the_launchers_own_shape_on_its_devices():
    """huge_vocab exists for the launcher's capped tile: no drawn or forced tile may replace it; wide_groups
    owns its launch on the CPU only, and the GPU's forced shapes still reach it."""
    verify, attention = checks.get("rejection.verify"), checks.get("attention.paged")
    forced = {"block_v": 128, "num_warps": 4}
    for seed in range(6):
        assert cases.build_case(verify, "huge_vocab", seed, "cpu").launch == {}
    assert cases.build_case(verify, "huge_vocab", 0, "cpu", forced).launch == {}
    assert cases.build_case(verify, "tiles", 0, "cpu", forced).launch == forced  # a family that owns none
    assert cases.build_case(attention, "wide_groups", 0, "cpu", {"block_n": 16}).launch == {}
    assert attention.families["wide_groups"].own_launch_on == ("cpu",)
    # its own tiles only: a forced 16 x 8 x 8192 tile at one warp keeps ptxas past the 300 s deadline on an H200
    assert checks.get("kv_cache.write").families["wide_heads"].own_launch_on == ("cpu", "cuda")


def test_families_split_per_value_share_the_iterations_of_one():
    """one_per_value's families each get an equal share of a run's iterations (at least one case), spread
    over them, and build the value they are named for; the check's other families run every iteration."""
    from collections import Counter

    from stress.families.common import one_per_value

    def family(rng, device, launch, layout):
        return Case(inputs={}, note=layout)

    split = one_per_value(family, "layout", ("a", "b c", "d"))
    assert list(split) == ["family_a", "family_b_c", "family_d"]
    assert split["family_b_c"](None, "cpu", {}).note == "b c"
    check = Check(name="t.split", kernel=None, reference=None, families={"plain": family, **split}, outputs=())
    tasks = cases.plan([check], None, 100, 0)
    assert Counter(t.family for t in tasks) == {"plain": 100, "family_a": 33, "family_b_c": 33, "family_d": 33}
    assert len({t.seed for t in tasks if t.family == "family_a"}) == 33
    assert Counter(t.family for t in cases.plan([check], None, 1, 0)) == {f: 1 for f in ("plain", *split)}


def _damage(g: guards.Guarded) -> str | None:
    """What the runner's read-back (``guards.settle``) says of ``g``'s guard zones."""
    lines, _, _ = guards.settle({g.name: g}, {})
    return lines[0] if lines else None


def test_guard_zone_catches_a_write_past_the_end():
    g = guards.place("t", torch.arange(10, dtype=torch.int32), torch.device("cpu"))
    assert _damage(g) is None
    g.buffer[g.pad + 10] = 0
    assert "(0 byte(s) before, 4 after the tensor)" in _damage(g)


def test_scratch_the_code_allocates_on_the_cpu_comes_poisoned_and_the_setting_is_restored():
    """Inside ``scratch_poisoned`` an uninitialized allocation on the CPU holds NaN (floats) or the largest value
    (integers), so a read of scratch no program wrote shows in the outputs; after it, torch is as it was."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    with guards.scratch_poisoned(torch.device("cpu")):
        assert torch.empty(64).isnan().all()
        assert (torch.empty(8, dtype=torch.int32) == torch.iinfo(torch.int32).max).all()
    assert (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory) == before
    with guards.scratch_poisoned(torch.device("meta")):  # off on any other device
        assert torch.are_deterministic_algorithms_enabled() == before[0]


def test_guard_zone_keeps_a_strided_view_and_watches_its_row_padding():
    rows = torch.arange(12, dtype=torch.int32).view(3, 4)[:, :3]  # row-padded: stride 4, width 3
    g = guards.place("t", rows, torch.device("cpu"))
    assert g.view.stride() == (4, 1) and torch.equal(g.view, rows) and _damage(g) is None
    g.buffer[g.pad + 3] = 0  # the padding element after row 0
    assert "1 after the tensor" not in _damage(g) and "in the gaps between its rows" in _damage(g)
    assert torch.equal(g.view, rows), "checking the gaps must leave the view's values as they were"
    copied = guards.same_layout(rows)
    assert copied.stride() == rows.stride() and torch.equal(copied, rows)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.float32])
def test_every_gap_byte_is_watched_and_counted_exactly(dtype, device):
    """The gaps are scanned eight bytes at a time where aligned and byte by byte at the ends: a damaged byte
    anywhere between the rows is found, and the report counts bytes, not words."""
    rows = torch.arange(35, dtype=torch.int64).to(dtype).view(5, 7)[:, :3]  # 4 elements of padding per row
    g = guards.place("t", rows.to(device), torch.device(device))
    raw = g.buffer.view(torch.uint8)
    gap_bytes = [i for i in range(g.pad * g.buffer.element_size(), raw.numel() - g.pad * g.buffer.element_size())
                 if (i // g.buffer.element_size() - g.pad) % 7 >= 3]
    assert len(gap_bytes) == 4 * 4 * g.buffer.element_size()  # the padding of the first four rows
    for i in gap_bytes:
        raw[i] ^= 1
        assert "1 in the gaps between its rows" in _damage(g), i
        raw[i] ^= 1
    raw[gap_bytes[0]] ^= 1
    raw[gap_bytes[-1]] ^= 1
    raw[gap_bytes[len(gap_bytes) // 2]] ^= 1
    assert "(0 byte(s) before, 0 after the tensor, 3 in the gaps between its rows)" in _damage(g)
    assert torch.equal(g.view.cpu(), rows), "checking the gaps must leave the view's values as they were"


def test_a_broadcast_view_keeps_its_zero_stride_and_its_guards():
    rows = torch.arange(3, dtype=torch.int64).view(1, 3).expand(4, 3)  # one row shared by 4: stride (0, 1)
    g = guards.place("t", rows, torch.device("cpu"))
    assert g.view.stride() == (0, 1) and torch.equal(g.view, rows) and _damage(g) is None
    assert torch.equal(g.view, rows), "checking the guards must leave the shared row as it was"
    g.buffer[g.pad + 3] = 7  # just past the shared row: one int64, 8 bytes
    assert "8 after the tensor" in _damage(g)
    copied = guards.same_layout(rows)
    assert copied.stride() == (0, 1) and torch.equal(copied, rows)


def test_a_spread_view_reaches_its_offset_and_keeps_its_values():
    from stress.families.common import spread

    rows = torch.arange(12, dtype=torch.float32).view(3, 4)
    view = spread(rows, 0, 1 << 20)  # big_offsets uses 2^31 on the GPU
    assert 2 * view.stride(0) >= 1 << 20 and view.stride(1) == 1 and torch.equal(view, rows)
    g = guards.place("t", view, torch.device("cpu"))
    assert g.view.stride() == view.stride() and _damage(g) is None


def _kept_changes(view: torch.Tensor, write) -> dict:
    """What ``guards.settle`` reports of ``view`` kept across ``write(view)``."""
    before = guards.snapshot({"t": view})
    write(view)
    _, _, changed = guards.settle({}, {}, {"t": (view, before["t"])})
    return changed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.uint8])
def test_a_kept_tensor_is_compared_bit_for_bit_where_it_lives(dtype, device):
    """Unchanged: nothing comes back. Changed anywhere, even 0.0 to -0.0: its values come back, on the host."""
    values = torch.tensor([0, 1, 0, 1, 1, 0]).to(dtype).to(device)
    assert _kept_changes(values.clone(), lambda v: None) == {}
    changed = _kept_changes(values.clone(), lambda v: v.__setitem__(2, 1 if dtype is torch.bool else 3))
    assert list(changed) == ["t"] and changed["t"].device.type == "cpu" and not torch.equal(changed["t"], values.cpu())
    if dtype.is_floating_point:
        assert torch.signbit(_kept_changes(values.clone(), lambda v: v.__setitem__(0, -0.0))["t"][0])
        nan = torch.full((3,), float("nan"), dtype=dtype, device=device)
        assert _kept_changes(nan, lambda v: v.copy_(v.clone())) == {}, "the same NaN is unchanged"


def test_a_kept_tensor_of_a_width_with_no_integer_twin_is_compared_on_the_host():
    """complex128 (16 bytes an element) has no integer view: flagged, then judged exactly where its values land."""
    values = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128)
    assert torch.equal(_kept_changes(values.clone(), lambda v: None)["t"], values)
    assert compare.unchanged("t", values, values) is None


def test_a_kept_view_is_copied_compactly_and_its_shared_row_once(device):
    """A view spread over a large span, and a broadcast one, are snapshot by their own elements; a write into
    the shared row of the broadcast one shows."""
    from stress.families.common import spread

    view = guards.place("t", spread(torch.arange(12.0).view(3, 4), 0, 1 << 20), torch.device(device)).view
    assert guards.snapshot({"t": view})["t"].numel() == 12
    assert _kept_changes(view, lambda v: v.__setitem__((2, 3), -1.0))["t"][2, 3].item() == -1.0
    shared = guards.place("s", torch.arange(3.0).view(1, 3).expand(1000, 3), torch.device(device)).view
    assert guards.snapshot({"s": shared})["s"].shape == (1, 3)
    assert _kept_changes(shared, lambda v: v[:1].fill_(9.0)) != {}


def test_exact_reports_first_divergence_and_its_source():
    source = torch.arange(10, dtype=torch.int32).view(1, 10)
    got = source[:, :].clone()
    got[0, 2] = 9
    found = compare.exact("block_table", source, got)
    assert found.total == 1
    text = "\n".join(found.lines(source))
    assert "block_table[0, 2]: expected 2, got 9" in text and "+7 from this entry" in text
    assert compare.exact("x", torch.tensor([float("nan")]), torch.tensor([float("nan")])) is None


def _fake_check(kernel, outputs=("out",)):
    def family(rng, device, launch):
        return Case(inputs={"out": torch.zeros(8, dtype=torch.int32), "x": torch.arange(8, dtype=torch.int32)})

    return Check(name="fake", kernel=kernel, reference=lambda out, x: x.clone(), families={"f": family},
                 outputs=outputs)


def test_oob_write_is_its_own_verdict():
    def overflowing(out, x):
        torch.as_strided(out, (9,), (1,)).copy_(torch.arange(9, dtype=torch.int32))

    check = _fake_check(overflowing)
    case = cases.build_case(check, "f", 1, "cpu")
    verdict, details = oracle.differential(check, case, cases.expected_outputs(check, case), "cpu")
    assert verdict == "fail:oob" and "guard zone" in details[0]


def test_a_memory_verdict_retires_its_worker_and_a_plain_crash_does_not(monkeypatch):
    """Out of bounds, a crash that reads as heap damage, or on the CPU any failure once the kernel was launched
    other than a launcher's refusal: the process may be corrupted, so its worker goes."""
    def overflowing(out, x):
        torch.as_strided(out, (9,), (1,)).copy_(torch.arange(9, dtype=torch.int32))

    def heap_damaged(out, x):
        raise RuntimeError("free(): corrupted unsorted chunks")

    def refusing(out, x):
        raise ValueError("x: not a tensor this launcher takes")

    def damaged_after_launch(out, x):  # what a stray store into the heap left: a tensor of absurd size
        raise IndexError("Dimension out of range (expected to be in range of [-1, 0], but got 34359738521)")

    for kernel, verdict, retired in ((overflowing, "fail:oob", True), (heap_damaged, "fail:crash", True),
                                     (refusing, "fail:crash", False), (damaged_after_launch, "fail:crash", True)):
        monkeypatch.setitem(checks.BY_NAME, "fake", _fake_check(kernel))
        result = workers.run_case(cases.Task("fake", "f", 1), "cpu")
        assert (result.verdict, result.fatal) == (verdict, retired), result.details


def test_a_failure_before_the_kernel_ran_keeps_its_worker(monkeypatch):
    """A family or a reference that raises ran no kernel: nothing can have touched this process's memory."""
    def reference_raising(out, x):
        raise IndexError("the reference's own slip")

    check = dataclasses.replace(_fake_check(lambda out, x: out.copy_(x)), reference=reference_raising)
    monkeypatch.setitem(checks.BY_NAME, "fake", check)
    result = workers.run_case(cases.Task("fake", "f", 1), "cpu")
    assert (result.verdict, result.fatal) == ("fail:suite-error", False), result.details


def test_a_worker_that_cannot_even_look_its_check_up_is_retired(monkeypatch):
    """What an earlier case's unseen stray store can leave on the CPU: the registry's lookup fails in this process.
    Kept, such a worker fails every later case at once and takes most of the run's cases."""
    monkeypatch.delattr(checks, "BY_NAME")
    result = workers.run_case(cases.Task("block_table.gather", "basic", 1), "cpu")
    assert (result.verdict, result.fatal) == ("fail:crash", True), result.details
    assert "BY_NAME" in result.details[0]


def test_an_in_process_run_says_it_is_not_trusted_after_a_memory_verdict():
    for jobs, trusted in ((0, False), (2, True)):
        summary = report.Report(None, {"jobs": jobs, "cases": 2})
        summary.add(Result("fake", "f", 1, "cpu", "fail:oob", fatal=True))
        summary.add(Result("fake", "f", 2, "cpu", "pass"))
        warning = "not trusted after fake / f seed 1 (fail:oob)"
        assert (warning in summary.summary(), warning in summary.closing_line()) == (not trusted, not trusted)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    rows, cols = tl.arange(0, N)[:, None], tl.arange(0, N)[None, :]
    product = tl.dot(tl.load(a_ptr + rows * N + cols), tl.load(b_ptr + rows * N + cols), out_dtype=tl.float32)
    tl.store(out_ptr + rows * N + cols, product)


def _dot_check(bf16_dot: bool) -> Check:
    """An engine's kernel, not the suite's: ``out = a @ b`` by one ``tl.dot``, in float32 or bfloat16."""
    def family(dtype):
        def build(rng, device, launch):
            a, b = (torch.from_numpy(rng.integers(-3, 4, (16, 16))).to(dtype) for _ in range(2))
            return Case(inputs={"a": a, "b": b, "out": torch.zeros(16, 16)})
        return build

    return Check(name="t.dot", kernel=lambda a, b, out: _dot_kernel[(1,)](a, b, out, N=16),
                 reference=lambda a, b, out: a.float() @ b.float(), outputs=("out",), bf16_dot=bf16_dot,
                 families={"float32": family(torch.float32), "bfloat16": family(torch.bfloat16)})


@pytest.mark.skipif(not runtime.INTERPRETED, reason="the interpreter's bf16 dot")
def test_a_bf16_dot_under_the_interpreter_is_not_checked_when_declared(monkeypatch):
    def run(family, bf16_dot):
        monkeypatch.setitem(checks.BY_NAME, "t.dot", _dot_check(bf16_dot))
        return workers.run_case(cases.Task("t.dot", family, 1), "cpu", trace=False)

    assert run("bfloat16", bf16_dot=False).verdict == "fail:divergence", "the interpreter multiplies bf16 bits"
    skipped = run("bfloat16", bf16_dot=True)
    assert skipped.verdict.startswith("not_checked:") and "bfloat16 tl.dot" in skipped.verdict
    assert run("float32", bf16_dot=True).verdict == "pass"


def test_scribbling_on_a_read_only_input_is_a_divergence():
    def scribbler(out, x):
        out.copy_(x)
        x[0] = 5

    check = _fake_check(scribbler)
    case = cases.build_case(check, "f", 1, "cpu")
    verdict, details = oracle.differential(check, case, cases.expected_outputs(check, case), "cpu")
    assert verdict == "fail:divergence" and "x (read-only input)" in details[0]


def test_a_crash_in_the_suites_own_comparison_is_a_suite_error_that_kills_nothing(monkeypatch, device):
    """A comparator that raises on a divergence (here an AttributeError, as a judge reading a missing field
    raises) is specsan's bug: it must not read as the kernel crashing, and no oracle, not even a whole-path
    hunt's ANY, counts it."""
    def broken_compare(name, expected, got):
        raise AttributeError("'Findings' object has no attribute 'verdict'")

    check = dataclasses.replace(checks.get("block_table.gather"), compare=broken_compare)
    monkeypatch.setitem(checks.BY_NAME, check.name, check)
    result = workers.run_case(cases.Task(check.name, "basic", 1), device.type)
    assert result.verdict == oracle.SUITE_ERROR and result.failed, result.details
    assert "the comparison of out raised AttributeError" in result.details[0]
    assert any("broken_compare" in line for line in result.details), "the traceback says where"
    assert not matrix._kills(matrix.ANY, result.verdict) and not matrix._kills("crash", result.verdict)
    assert matrix._kills(matrix.ANY, "fail:crash")


def test_compiles_inside_a_refusal_count_as_compiles_not_as_the_refusal(monkeypatch, device):
    """A launcher that finds no tile fitting compiles each rung to learn it: the profile must show those seconds
    as compiles (a warm cache removes them), not as the refusal's own cost."""
    from triton import knobs

    real = checks.get("block_table.gather").kernel

    def compiling_then_refusing(**kwargs):
        runtime = knobs.runtime
        runtime.jit_cache_hook and runtime.jit_cache_hook()
        time.sleep(0.05)
        runtime.jit_post_compile_hook and runtime.jit_post_compile_hook()
        return real(**kwargs)

    check = dataclasses.replace(checks.get("block_table.gather"), kernel=compiling_then_refusing)
    monkeypatch.setitem(checks.BY_NAME, check.name, check)
    result = workers.run_case(cases.Task(check.name, "refused", 1), device.type)
    refusals = len(cases.build_case(check, "refused", 1, device.type).more_refusals) + 1
    assert result.verdict == "pass", result.details
    assert result.phases["compile"] >= 0.05 * refusals > result.phases["refusal"]


def test_crash_and_timeout_are_verdicts_not_exceptions(device):
    crashed = workers.run_case(cases.Task("block_table.shift", "no_such_family", 1), device.type)
    assert crashed.verdict == "fail:crash" and "no_such_family" in "\n".join(crashed.details)
    slow = workers.run_case(cases.Task("block_table.shift", "long_row", 1), device.type, timeout=1e-4)
    assert slow.verdict == "fail:timeout"


def test_execute_keeps_going_after_a_crash(device):
    seen: list[Result] = []
    tasks = [cases.Task("block_table.shift", "no_such_family", 1), cases.Task("block_table.shift", "overlap", 2)]
    workers.execute(tasks, device.type, 0, seen.append)
    assert [r.verdict for r in seen] == ["fail:crash", "pass"]


def test_a_killed_or_dead_worker_is_charged_to_its_case():
    task = cases.Task("block_table.shift", "overlap", 7, None, (("chunk", 16),))
    timed_out = workers.result_of(pool.Outcome(task, failure="timeout", seconds=2.5), "cpu", 2.0, True)
    assert (timed_out.verdict, timed_out.details) == ("fail:timeout", ["case ran past 2 s; its worker was killed"])
    assert timed_out.repro().endswith("overlap 7 --device cpu --launch chunk=16 --timeout 2")
    died = workers.result_of(pool.Outcome(task, failure="died", detail="its worker process died (killed by SIGSEGV)"),
                            "cpu", 300, False)
    assert died.verdict == "fail:crash" and "SIGSEGV" in died.details[0] and died.repro().endswith("--no-trace")


def _verdict(i: int, verdict: str) -> Result:
    return Result("block_table.shift", "overlap", i, "cpu", verdict)


def test_a_hunt_is_decided_by_its_first_kill_in_order_whatever_ran_ahead():
    hunt = matrix._new_hunt(checks.get("block_table.shift"), "no-barrier", "cpu", "race", 10, 0, None)
    handed = [hunt.next_task()[0] for _ in range(4)]
    assert handed == [0, 1, 2, 3]
    hunt.record(2, _verdict(2, "fail:race"))
    hunt.record(3, _verdict(3, "fail:race"))
    assert hunt.next_task() is None and not hunt.decided()  # iterations 0 and 1 may still kill earlier
    crashed = _verdict(0, "fail:crash")
    crashed.details = ["AttributeError: 'Findings' object has no attribute 'verdict'\n", "Traceback ..."]
    hunt.record(0, crashed)  # its worker died: one more verdict, the hunt goes on
    hunt.record(1, _verdict(1, "pass"))
    assert hunt.decided()
    kill = hunt.finish()
    assert (kill.status, kill.iterations, kill.other_failures) == ("killed", 3, ["fail:crash"])
    assert kill.other_example == f"fail:crash: AttributeError: 'Findings' object has no attribute 'verdict'; " \
                                 f"{crashed.repro()}"


@pytest.mark.slow
def test_the_kill_matrix_does_not_depend_on_the_number_of_workers(device):
    gather = [checks.get("block_table.gather")]
    here = matrix.kill_matrix(gather, device.type, max_iters=20, seed=0, jobs=0)
    pooled = matrix.kill_matrix(gather, device.type, max_iters=20, seed=0, jobs=2)
    assert [(k.mutant, k.status, k.iterations, k.repro) for k in here] == \
           [(k.mutant, k.status, k.iterations, k.repro) for k in pooled]


@pytest.mark.slow
def test_run_streams_jsonl_and_summary(tmp_path, device):
    done = cli("run", "--iters", "2", "--check", "block_table.shift", "--report", str(tmp_path), "--jobs", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    results = [r for r in lines if "check" in r]
    families = len(checks.get("block_table.shift").families)
    assert "run" in lines[0] and len(results) == 2 * families
    # a GPU run also records its telemetry envelope and its per-GPU counts; every run ends with its closing record
    assert [next(iter(r)) for r in lines[1:] if "check" not in r] == \
           (["telemetry", "gpus"] if device.type == "cuda" else []) + ["end"]
    assert lines[-1]["end"]["status"] == "complete" and lines[-1]["end"]["cases_finished"] == 2 * families
    assert all(r["verdict"] == "pass" and r["repro"].startswith("./specsan repro block_table.shift") for r in results)
    assert done.stdout.strip().splitlines()[-1] == f"{2 * families} passed, 0 failed"
    assert "| block_table.shift | overlap | 2 | 0 | 0 |" in (tmp_path / "summary.md").read_text()


@pytest.mark.slow
def test_repro_of_a_mutant_prints_the_divergence():
    done = cli("repro", "block_table.shift", "slot_vs_row", str(cases.case_seed(0, "block_table.shift",
                                                                               "slot_vs_row", 0)),
               "--mutant", "count-by-batch-row")
    assert done.returncode == 1
    assert "verdict: fail:divergence" in done.stdout and "from this entry" in done.stdout


@pytest.mark.slow
def test_mutants_command_kills_and_exits_zero(device):
    done = cli("mutants", "--check", "block_table.gather", "--check", "block_table.unaligned_prefix", "--jobs", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    planted = [m for name in ("block_table.gather", "block_table.unaligned_prefix") for m in checks.get(name).mutants]
    checkable = sum(device.type in m.oracles for m in planted)
    assert checkable >= 3  # not_checked on this device must stay the exception
    assert (f"{checkable} of {checkable} checkable mutants killed on {device.type}; "
            f"{len(planted) - checkable} not checked here") in done.stdout


def test_the_launchers_own_shape_runs_in_a_third_of_the_cases_of_a_wide_sweep():
    """Production runs the launcher's own tile choice, which a uniform draw over a 13-shape sweep would give 1
    case in 13. Every forced shape is still drawn, a seed whose uniform draw is the default draws it (a repro
    line without --launch names the same shape), and sweeps of up to 3 shapes draw exactly as a uniform draw
    does."""
    import numpy as np

    wide = [{}] + [{"block_t": t} for t in range(12)]
    drawn = [cases.draw_launch(wide, seed) for seed in range(3000)]
    assert 0.30 < sum(d == {} for d in drawn) / len(drawn) < 0.37
    assert all(shape in drawn for shape in wide)
    for seed in range(300):
        uniform = int(np.random.default_rng([seed, 7]).integers(len(wide)))
        assert uniform or cases.draw_launch(wide, seed) == {}
        narrow = wide[:3]
        assert cases.draw_launch(narrow, seed) == narrow[int(np.random.default_rng([seed, 7]).integers(3))]
    forced_first = wide[1:]  # no default in the sweep: nothing to favour
    assert sum(cases.draw_launch(forced_first, s) == forced_first[0] for s in range(3000)) < 3000 * 0.15


def test_a_refusal_case_whose_bad_input_went_through_retires_its_cpu_worker():
    """An accepted refusal ran the kernel on input it should have refused (here V caches shaped unlike the K cache):
    under the interpreter whatever it wrote out of place landed in this process's memory."""
    accepted = cases.Task("kv_cache.write", "refused", 3, mutant="v-cache-shape-unchecked")
    seen = []  # in a worker process: the stray write must not land in this one
    workers.execute([accepted, cases.Task("kv_cache.write", "refused", 3)], "cpu", 1, seen.append)
    by_mutant = {r.mutant: r for r in seen}
    assert (by_mutant[accepted.mutant].verdict, by_mutant[accepted.mutant].fatal) == ("fail:accepted", True)
    assert (by_mutant[None].verdict, by_mutant[None].fatal) == ("pass", False)
