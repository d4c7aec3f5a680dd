"""python -m stress mutate: operators, the equivalence filter (positive and negative controls), the data
file of reasoned equivalences, and one generated mutant hunted end to end."""

import dataclasses
import json

import pytest
import torch

from kernels import runtime
from stress import checks
from stress.core import cases, pool, workers
from stress.core import patches as mutants
from stress.core.patches import source_of
from stress.mutate import campaign as mutate
from stress.mutate import equivalence as mutate_equiv
from stress.mutate import operators as mutate_ops

WIDEN = "tests.mutate_targets:widen_kernel"
HOST = "tests.mutate_targets:first_positive"


def _one(target: str, operator: str, old_part: str, new_part: str) -> mutate_ops.Generated:
    found = [g for g in mutate_ops.generate(target, [operator])
             if old_part in g.patch.old and new_part in g.patch.new]
    assert len(found) == 1, [g.patch for g in found]
    return found[0]


def test_every_generated_patch_matches_once_and_round_trips():
    for target in (WIDEN, HOST, "kernels.block_table:_shift_rows_kernel", "kernels.spec.slots:RequestSlots"):
        generated = mutate_ops.generate(target)
        assert generated, target
        text = source_of(mutate_ops._target(target))[1]
        assert len({g.id for g in generated}) == len(generated)
        for g in generated:
            assert text.count(g.patch.old) == 1, g.id
            assert mutate_ops.resolve(g.id).patches[0] == g.patch


def test_operators_make_the_slips_they_name():
    # the same comparison twice in the kernel: the patch widens to a line that occurs once
    flip = _one(WIDEN, "cmp-flip", "values = tl.load", "offs <= n")
    assert "tl.store" not in flip.patch.old
    _one("kernels.block_table:_shift_rows_kernel", "barrier", "tl.debug_barrier()", "pass")
    moved = [g for g in mutate_ops.generate("kernels.block_table:_shift_rows_kernel", ["barrier"])
             if g.patch.new.strip().endswith("tl.debug_barrier()")]
    assert len(moved) == 1 and moved[0].patch.new.strip().startswith("tl.store")
    _one(HOST, "default", "default=None", "default=0")
    swaps = mutate_ops.generate("kernels.block_table:_shift_rows_kernel", ["index-swap"])
    assert any("num_cached_tokens_ptr + batch_row" in g.patch.new for g in swaps)  # slot -> batch row
    assert not any("+ cols" in g.patch.new for g in swaps)  # lanes are no index of the batch


def test_a_helper_mutant_rebuilds_the_kernels_that_call_it():
    clamped = mutate_ops.generate("kernels.rejection:_clamped")[0].mutant()
    rebuilt = [p.target for p in clamped.patches[1:]]
    assert rebuilt.index("kernels.rejection:_gumbel_argmax") < rebuilt.index("kernels.rejection:_verify_kernel")
    assert mutate_ops.callers("kernels.sampling:gumbel_noise") == [
        "kernels.sampling:gumbel_scores", "kernels.rejection:_gumbel_argmax", "kernels.sampling:_gumbel_sample_kernel",
        "kernels.rejection:_verify_kernel"]


def test_a_helper_mutant_reaches_a_kernel_of_another_module_compiled_before_it():
    """Rejection's kernel inlines sampling's running best. Compiled in this process from the production helper,
    the same case under the mutant (tokens kept where a better score wins) must run the mutant's helper, and
    the production case after it the production one: a compiled kernel keeps the helpers it was built with, so
    a kernel left out of the rebuild runs the production binary under the mutant, or (another launch shape,
    compiled meanwhile) keeps the mutant's after it, in this process and in Triton's disk cache."""
    from kernels import runtime
    from stress.core.cases import Task
    from stress.core.types import PASS
    from stress.core.workers import run_case

    case = Task("rejection.verify", "mixed", 0)
    generated = "gen:kernels.sampling:running_best:where-swap:2a5536c0"
    slip = case._replace(mutant=generated, patched=mutate_ops.resolve(generated))
    assert run_case(case, runtime.DEVICE, trace=False).verdict == PASS
    assert run_case(slip, runtime.DEVICE, trace=False).verdict == "fail:divergence"
    assert run_case(case, runtime.DEVICE, trace=False).verdict == PASS

def test_applied_swaps_every_imported_name():
    import kernels.kv_cache
    from stress.families import kv_cache as kv_families

    g = mutate_ops.generate("kernels.kv_cache:write_kv", ["cmp-flip"])[0]
    with mutants.applied(g.mutant()):
        assert kv_families.write_kv is kernels.kv_cache.write_kv
        assert kv_families.write_kv is not kernels.kv_cache.__dict__.get("_unused")
        patched = kv_families.write_kv
    assert kv_families.write_kv is kernels.kv_cache.write_kv is not patched


def _decide(ids: list[str], launches: dict) -> dict:
    """Equivalence as the tool decides it: in a process that never ran a kernel."""
    out = {}
    with pool.Pool(mutate_equiv.decide_id, 1, initializer=mutate_equiv.init_worker,
                   initargs=(runtime.DEVICE, launches), timeout=120) as workers:
        queue = iter(ids)
        workers.run(lambda: next(queue, None), lambda o: out.__setitem__(o.item, o.value or o.failure))
    return out


@pytest.mark.slow
def test_equivalence_filter_controls():
    kernel = mutate_ops._target(WIDEN)
    src, out = torch.arange(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64)
    signature = mutate_equiv.signature(kernel, (src, out, 8), {"BLOCK": 8})
    cast = _one(WIDEN, "no-int64", ".to(tl.int64)", "other=0)").id
    flip = _one(WIDEN, "cmp-flip", "values = tl.load", "offs <= n").id
    host_flip = _one(HOST, "cmp-flip", "value > 0", "value >= 0").id
    host_default = _one(HOST, "default", "default=None", "default=0").id
    got = _decide([cast, flip, host_flip, host_default], {WIDEN: {signature}})
    assert got[cast] == (True, "ttir")  # positive control: a cast of an int64 to int64
    assert got[flip] == (False, "ttir")  # negative controls
    assert got[host_flip] == (False, "bytecode")
    assert got[host_default] == (False, "bytecode")


def test_reasoned_equivalences_have_reasons_and_fields():
    for entry in mutate._entries():
        assert set(entry) == {"target", "operator", "old", "new", "reason"}, entry
        assert any(entry["operator"] in ops for ops in mutate_ops.OPERATOR_CLASSES.values())
        assert len(entry["reason"]) > 40, f"{entry['target']}: a reason must say why, not just that"


def test_an_entry_matching_no_mutant_is_stale():
    g = mutate_ops.generate(HOST, ["cmp-flip"])[0]
    row = mutate.Row(g.id, g.target, g.operator, "tests/mutate_targets.py", g.line, g.patch.old, g.patch.new,
                     "c", ["c"])
    entries = [{"target": HOST, "operator": "cmp-flip", "old": g.patch.old, "new": g.patch.new, "reason": "x"},
               {"target": HOST, "operator": "cmp-flip", "old": "gone", "new": "gone too", "reason": "x"}]
    assert [e["old"] for e in mutate.stale_entries([row], {HOST}, entries)] == ["gone"]
    other_operator = {"target": HOST, "operator": "const", "old": "not generated", "new": "here", "reason": "x"}
    assert mutate.stale_entries([row], {HOST}, [other_operator]) == [], "judged by a run of another operator"


def test_explained_survivors_have_reasons_devices_and_fields():
    entries = mutate._entries(mutate.EXPLAINED_FILE)
    assert entries, "the explained survivors file is read"
    for entry in entries:
        assert set(entry) == {"target", "operator", "old", "new", "devices", "why"}, entry
        known = any(entry["operator"] in names for names in mutate_ops.OPERATOR_CLASSES.values())
        assert known and set(entry["devices"]) <= {"cpu", "cuda"}, entry
        assert len(entry["why"]) > 40, f"{entry['target']}: a reason must say why, not just that"


def _row(target: str, operator: str, old_part: str, new_part: str, status: str) -> mutate.Row:
    g = _one(target, operator, old_part, new_part)
    return mutate.Row(g.id, g.target, g.operator, "f.py", g.line, g.patch.old, g.patch.new, "attention.paged",
                      ["attention.paged"], status=status)


def test_a_survivor_is_explained_on_the_devices_its_entry_lists_and_refuted_when_killed():
    row = _row(HOST, "cmp-flip", "", "", "survived")
    entry = {"target": HOST, "operator": "cmp-flip", "old": row.old, "new": row.new, "devices": ["cuda"],
             "why": "a reason"}
    assert mutate.explain([row], "cpu", [entry]) == [] and row.explained == ""  # not listed for the CPU
    assert mutate.explain([row], "cuda", [entry]) == [] and row.explained == "a reason"
    lines = mutate.survivor_lines([row], "cuda", 1)
    assert "    why it survives: a reason" in lines
    row.status, row.explained = "killed", ""
    assert mutate.explain([row], "cuda", [entry]) == [entry], "a killed mutant refutes its explanation"
    row.status = "survived"
    assert any(line.startswith("    UNEXPLAINED") for line in mutate.survivor_lines([row], "cpu", 1))


def test_a_survivor_killed_by_another_devices_kept_record_says_where_and_still_counts(tmp_path):
    """A CPU survivor that the kept GPU record killed on the same module source names that kill instead of being
    UNEXPLAINED; a record of this device, or one made on other source, says nothing. It stays a survivor."""
    import gzip
    import json

    same, moved, alone = (dataclasses.replace(_row(HOST, "cmp-flip", "", "", "survived"), id=f"gen:x:{i}",
                                              fingerprint="f" * 16) for i in range(3))
    killed = {"status": "killed", "verdict": "fail:crash", "killed_by": "kv_cache.write", "iterations": 13}

    def record(name, device, mutants):
        with gzip.open(tmp_path / name, "wt") as f:
            f.write(json.dumps({"run": {"device": device, "iters": 2, "seed": 0}}) + "\n")
            for m in mutants:
                f.write(json.dumps({"mutant": m}) + "\n")

    record("mutate-h200-iters2.jsonl.gz", "cuda", [{"id": same.id, "fingerprint": "f" * 16, **killed},
                                                   {"id": moved.id, "fingerprint": "0" * 16, **killed}])
    record("mutate-cpu-iters2.jsonl.gz", "cpu", [{"id": alone.id, "fingerprint": "f" * 16, **killed}])
    mutate.killed_elsewhere([same, moved, alone], "cpu", str(tmp_path))
    assert same.killed_elsewhere.startswith("killed on cuda (") and "fail:crash by kv_cache.write after 13" in \
        same.killed_elsewhere
    assert moved.killed_elsewhere == alone.killed_elsewhere == ""
    lines = mutate.survivor_lines([same, moved], "cpu", 2)
    assert sum(line.startswith("    UNEXPLAINED") for line in lines) == 1 and same.status == "survived"


def test_a_kernel_mutant_the_gpu_compiler_refuses_says_so_off_the_gpu_and_still_counts(tmp_path):
    """A CPU survivor whose TTIR did not compile (the interpreter ran it) is named as one a GPU launch would refuse;
    on a GPU the same row says nothing (there it ran compiled), and a survivor that compiled says nothing."""
    from stress.mutate.equivalence import NOT_COMPILED

    refused, compiled = (dataclasses.replace(_row(HOST, "cmp-flip", "", "", "survived"), id=f"gen:y:{i}",
                                             equivalence=test) for i, test in enumerate((NOT_COMPILED, "ttir")))
    mutate.killed_elsewhere([refused, compiled], "cpu", str(tmp_path))
    assert refused.killed_elsewhere.startswith("does not compile for a GPU") and compiled.killed_elsewhere == ""
    assert refused.status == "survived"
    on_gpu = dataclasses.replace(refused, killed_elsewhere="")
    mutate.killed_elsewhere([on_gpu], "cuda", str(tmp_path))
    assert on_gpu.killed_elsewhere == ""


@pytest.mark.slow
def test_unit_tests_kill_a_fallback_slip_and_not_a_speed_setting():
    """attention.paged's unit tests run the tile fallback on a simulated small device: dropping its last rung
    (positive control) fails them; a stage count, which only changes speed (negative control), passes."""
    last_rung = _row("kernels.attention:paged_attention", "const", "len(tiles) - 1", "len(tiles) - 2", "survived")
    stages = _row("kernels.attention:launch_shape", "const", "num_stages = 3 if", "num_stages = 4 if", "survived")
    unbuildable = dataclasses.replace(stages, id=stages.id[:-8] + "00000000")  # a session that cannot start
    streamed = []
    mutate.second_oracles([last_rung, stages, unbuildable], runtime.DEVICE, seed=0, timeout=300,
                          on_row=streamed.append)
    assert streamed == [last_rung, stages, unbuildable]
    assert unbuildable.status == "survived" and "pytest exit 4" in unbuildable.reason, "a usage error is no kill"
    assert (last_rung.status, last_rung.verdict, last_rung.killed_by) == ("killed", "fail:unit-test", "unit tests")
    assert last_rung.repro.startswith(f"SPECSAN_MUTANT={last_rung.id} python -m pytest")
    assert (stages.status, stages.reason) == ("survived", "")
    assert any("test_tiles_that_overflow_shared_memory_fall_back" in f for f in stages.families), stages.families


@pytest.mark.parametrize("path", [mutate.EQUIVALENT_FILE, mutate.EXPLAINED_FILE], ids=["equivalent", "explained"])
def test_every_data_file_entry_matches_a_generated_mutant(path):
    """Generation is source-only, so the data files cannot rot between full mutate runs."""
    generated = {}
    for entry in mutate._entries(path):
        key = (entry["target"], entry["operator"])
        if key not in generated:
            generated[key] = {(g.patch.old, g.patch.new) for g in mutate_ops.generate(*key[:1], [key[1]])}
        assert (entry["old"], entry["new"]) in generated[key], f"stale: {entry['target']} {entry['new']!r}"


def test_a_kernel_rounds_up_with_an_added_divisor():
    """Triton's // truncates toward zero: -(-a // b) would be a // b again, an equivalent mutant."""
    news = [g.patch.new for g in mutate_ops.generate("kernels.kv_cache:_write_kv_kernel", ["cdiv-floor"])]
    assert any("+ (block_size) - 1) // (block_size)" in new for new in news), news
    assert not any("(-(-(" in new for new in news), news


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the small deterministic sample runs in CPU CI")
@pytest.mark.slow
def test_a_known_killable_generated_mutant_is_killed():
    """The whole path (discovery, equivalence, the pool's hunt) on a few mutants of one check."""
    check = checks.get("block_table.gather")
    killable = _one("kernels.block_table:_gather_rows_kernel", "cmp-flip", "live = cols < width", "<=")
    summary = mutate.run([check], "cpu", iters=1, seed=0, jobs=1, timeout=120, operators=["cmp-flip"],
                         only=[killable.id], sample=0, report=None, log=lambda line: None)
    (row,) = summary["rows"]
    assert row.status == "killed" and row.verdict.startswith("fail:"), row
    assert row.repro.startswith("./specsan repro block_table.gather ") and killable.id in row.repro
    assert summary["by_check"]["block_table.gather"]["score"] == 100.0


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the small deterministic sample runs in CPU CI")
@pytest.mark.slow
def test_a_small_sample_of_a_host_check_is_decided_and_streamed(tmp_path):
    import json
    import time

    start = time.monotonic()
    summary = mutate.run([checks.get("spec.slots")], "cpu", iters=1, seed=0, jobs=1, timeout=60, operators=None,
                         only=None, sample=3, report=str(tmp_path), log=lambda line: None)
    assert time.monotonic() - start < 300  # the CI bound: a sample, not the whole code
    rows = summary["rows"]
    assert len(rows) == 3 and all(r.status != "pending" for r in rows)
    assert all(r.equivalence in ("bytecode", "reasoned") for r in rows)  # host code: compared by bytecode
    records = [json.loads(line) for line in open(tmp_path / mutate.Stream.NAME)]
    assert "run" in records[0] and records[-1]["end"]["complete"]
    assert sorted(r["mutant"]["id"] for r in records if "mutant" in r) == sorted(r.id for r in rows)
    different = {r["different"]["id"] for r in records if "different" in r}
    assert different == {r.id for r in rows if r.status not in ("equivalent", "reasoned", "invalid")}
    same = mutate.plan([checks.get("spec.slots")], mutate.Coverage({"spec.slots": [r.target for r in rows]}, {},
                                                                   {"spec.slots": []}), None, None, 3, 0)
    assert [r.id for r in same] == [r.id for r in rows]  # the sample is deterministic


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the small deterministic sample runs in CPU CI")
@pytest.mark.slow
def test_a_hunt_stopped_by_a_signal_leaves_its_mutants_undecided(monkeypatch, tmp_path):
    """A signal ends every open hunt as "unfinished": those mutants stay pending, never survivors, and the
    stream says the run did not complete."""
    import json
    import signal

    from stress.core import interrupts
    from stress.mutate import kill_matrix as matrix

    def stopped(hunts, device, jobs, timeout, on_row, on_case=None, deadline=None):
        for h in hunts:
            on_row(h.finish("unfinished"))
        raise interrupts.Interrupted(signal.SIGINT)

    monkeypatch.setattr(matrix, "_run_hunts", stopped)
    summary = mutate.run([checks.get("spec.slots")], "cpu", iters=1, seed=0, jobs=1, timeout=60, operators=None,
                         only=None, sample=3, report=str(tmp_path), log=lambda line: None)
    hunted = [r for r in summary["rows"] if r.equivalence == "bytecode" and r.status not in ("equivalent", "invalid")]
    assert hunted and all(r.status == "pending" for r in hunted), summary["rows"]
    assert not summary["survivors"] and summary["exit_code"] == 130
    assert summary["by_check"]["spec.slots"]["pending"] == len(hunted)
    end = [json.loads(line) for line in open(tmp_path / mutate.Stream.NAME)][-1]["end"]
    assert end["complete"] is False and end["interrupted"] == "SIGINT"


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the small deterministic sample runs in CPU CI")
@pytest.mark.slow
def test_a_resumed_run_hunts_only_what_the_earlier_run_left_undecided(monkeypatch, tmp_path):
    """A run stopped by a signal, resumed: its decided mutants are taken as they are (and streamed again, so
    the new mutate.jsonl is whole), its undecided ones are hunted, nothing else."""
    import json
    import shutil
    import signal

    from stress.core import interrupts
    from stress.mutate import kill_matrix as matrix

    real = matrix._run_hunts

    def stopped(hunts, device, jobs, timeout, on_row, on_case=None, deadline=None):  # decides two hunts, stops the rest
        on_row(hunts[0].finish("killed"))
        on_row(hunts[1].finish("survived"))
        for h in hunts[2:]:
            on_row(h.finish("unfinished"))
        raise interrupts.Interrupted(signal.SIGINT)

    def run(report, resumed=None):
        return mutate.run([checks.get("spec.slots")], "cpu", iters=1, seed=0, jobs=1, timeout=60, operators=None,
                          only=None, sample=4, report=str(report), log=lambda line: None, resumed=resumed)

    monkeypatch.setattr(matrix, "_run_hunts", stopped)
    first = {r.id: r.status for r in run(tmp_path / "first")["rows"]}
    undecided = {i for i, status in first.items() if status == "pending"}
    survivor = next(i for i, status in first.items() if status == "survived")
    assert undecided and "killed" in first.values(), first
    earlier = tmp_path / "earlier.jsonl"
    shutil.copy(tmp_path / "first" / mutate.Stream.NAME, earlier)

    hunted = []

    def recording(hunts, *args, **kwargs):
        hunted.extend(h.kill.mutant for h in hunts)
        return real(hunts, *args, **kwargs)

    monkeypatch.setattr(matrix, "_run_hunts", recording)
    header, known = mutate.earlier_run(str(earlier))
    decided = {i for i, row in known.items() if row["status"] != "pending"}
    assert header["iters"] == 1 and decided == set(first) - undecided and set(known) == set(first)
    summary = run(tmp_path / "second", (str(earlier), known))
    assert set(hunted) == undecided, "a survivor of the same kernels and suite would meet the same cases again"
    rows = {r.id: r for r in summary["rows"]}
    assert all(r.status != "pending" for r in rows.values())
    assert all(rows[i].status == first[i] for i in decided)
    records = [json.loads(line) for line in open(tmp_path / "second" / mutate.Stream.NAME)]
    assert records[0]["run"]["resumed_from"] == str(earlier)
    assert sorted(r["mutant"]["id"] for r in records if "mutant" in r) == sorted(first)
    assert not [r for r in records if "different" in r], "the earlier run's equivalence verdicts are not recompiled"

    hunted.clear()  # another kernel or suite source: new families or oracles may kill the survivor
    run(tmp_path / "other-tree", (str(earlier), {i: dict(row, tree="other") for i, row in known.items()}))
    assert set(hunted) == undecided | {survivor}

    hunted.clear()  # a module whose source changed since: everything is classified and hunted again
    changed = {i: dict(row, fingerprint="changed") for i, row in known.items()}
    run(tmp_path / "third", (str(earlier), changed))
    assert set(hunted) == set(first)
    records = [json.loads(line) for line in open(tmp_path / "third" / mutate.Stream.NAME)]
    assert {r["different"]["id"] for r in records if "different" in r} == set(first)

    hunted.clear()  # a survivor whose equivalence was reasoned since: taken as reasoned, not hunted again
    row = known[survivor]
    monkeypatch.setattr(mutate, "load_reasoned",
                        lambda: {mutate._key(row["target"], row["operator"], row["old"], row["new"]): "same program"})
    rows = {r.id: r for r in run(tmp_path / "fourth", (str(earlier), known))["rows"]}
    assert rows[survivor].status == "reasoned" and survivor not in hunted and set(hunted) == undecided


def test_resuming_another_devices_or_iters_run_is_a_usage_error(capsys, tmp_path):
    from stress.__main__ import main

    earlier = tmp_path / "mutate.jsonl"
    earlier.write_text('{"run": {"device": "cpu", "iters": 3, "seed": 0}}\n')
    assert main(["mutate", "--device", "cpu", "--iters", "2", "--resume", str(earlier)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specsan: --resume: ") and "iters 3" in err and "same --device, --iters" in err
    assert main(["mutate", "--device", "cpu", "--iters", "3", "--resume", str(earlier),
                 "--report", str(tmp_path)]) == 2
    assert "this run's own report" in capsys.readouterr().err
    assert main(["mutate", "--device", "cpu", "--resume", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def _memcheck_survivors():
    over_read = dataclasses.replace(_row("kernels.block_table:_slot_mapping_kernel", "const",
                                         "hi = lo + num_batch_rows - 1", "hi = lo + num_batch_rows - 0", "survived"),
                                    check="block_table.slot_mapping", owners=["block_table.slot_mapping"])
    graph = dataclasses.replace(over_read, id=over_read.id[:-8] + "11111111", check="graphs.lifetime",
                                owners=["graphs.lifetime"])
    return over_read, graph


def test_a_run_stopped_during_memcheck_keeps_the_unit_tests_kills(monkeypatch):
    """The unit tests (seconds a mutant) judge before memcheck (a sanitized process per case): a signal during
    memcheck leaves their kills written, and the rows still surviving say that memcheck alone did not run."""
    killed, left = _memcheck_survivors()
    order = []

    def unit_tests(rows, device, timeout):
        order.append(("unit tests", rows))
        killed.status, killed.verdict, killed.killed_by = "killed", mutate.UNIT_TEST_VERDICT, "unit tests"

    def memcheck(rows, device, **kw):
        order.append(("memcheck", list(rows)))
        raise KeyboardInterrupt

    monkeypatch.setattr(mutate, "_unit_tests_of", lambda row: ("tests/test_mutate.py::test_any",))
    monkeypatch.setattr(mutate, "judge_by_unit_tests", unit_tests)
    monkeypatch.setattr(mutate, "judge_by_memcheck", memcheck)
    streamed = []
    with pytest.raises(KeyboardInterrupt):
        mutate.second_oracles([killed, left], "cuda", seed=0, timeout=60, on_row=streamed.append)
    assert order == [("unit tests", [killed, left]), ("memcheck", [left])]
    assert streamed == [killed, left] and (killed.status, left.status) == ("killed", "survived")
    assert left.reason == "memcheck not run: the run was interrupted"


def test_memcheck_judges_gpu_survivors_after_its_control_and_only_on_a_gpu(monkeypatch):
    """On a GPU, a survivor meets memcheck in one case per family of its first sanitizable owner; a finding kills
    it with memcheck's verdict. A check that cannot be sanitized, a control not caught, or the CPU leave it as it is."""
    from stress.mutate import kill_matrix as matrix
    from stress.sanitize import runner as sanitizer

    over_read, graph = _memcheck_survivors()
    hunted = []

    def fake_hunts(hunts, device, jobs, timeout, on_row, on_case=None):
        for h in hunts:
            hunted.append((h.kill.check, h.kill.oracle, h.max_iters, len(h.families)))
            h.kill.status, h.kill.verdict, h.kill.iterations = "killed", sanitizer.VERDICT["memcheck"], 3
            h.kill.repro = "./specsan repro ... --tool memcheck"
            on_row(h.kill)

    monkeypatch.setattr(matrix, "_run_hunts", fake_hunts)
    monkeypatch.setattr(sanitizer, "gate", lambda tool, device: sanitizer.Gate("caught", "control caught"))
    streamed = []
    mutate.second_oracles([over_read, graph], "cpu", seed=0, timeout=60, on_row=streamed.append)
    assert not hunted and over_read.status == graph.status == "survived"  # the CPU has its tracer instead
    mutate.second_oracles([over_read, graph], "cuda", seed=0, timeout=60, on_row=streamed.append)
    families = len(checks.get("block_table.slot_mapping").families)
    assert hunted == [("block_table.slot_mapping", "memcheck", families, families)]
    assert (over_read.status, over_read.verdict, over_read.killed_by) == ("killed", "fail:oob",
                                                                          "block_table.slot_mapping")
    assert over_read.families[-1] == "memcheck: block_table.slot_mapping, 3 case(s)"
    assert graph.status == "survived" and graph.reason.startswith("memcheck not run: ")
    assert streamed == [over_read, graph] * 2


def test_a_survivor_whose_memcheck_hunt_a_signal_stopped_says_how_far_it_got(monkeypatch):
    """Its clean cases so far are no verdict: the row must not read as judged, nor as never sanitized."""
    from stress.mutate import kill_matrix as matrix
    from stress.sanitize import runner as sanitizer

    over_read, _ = _memcheck_survivors()

    def stopped_hunts(hunts, device, jobs, timeout, on_row, on_case=None):
        hunts[0].kill.iterations = 3
        on_row(hunts[0].kill)  # "unfinished", as _run_hunts leaves every open hunt at a signal
        raise KeyboardInterrupt

    monkeypatch.setattr(matrix, "_run_hunts", stopped_hunts)
    monkeypatch.setattr(sanitizer, "gate", lambda tool, device: sanitizer.Gate("caught", "control caught"))
    monkeypatch.setattr(mutate, "_unit_tests_of", lambda row: ())
    streamed = []
    with pytest.raises(KeyboardInterrupt):
        mutate.second_oracles([over_read], "cuda", seed=0, timeout=60, on_row=streamed.append)
    assert streamed == [over_read] and over_read.status == "survived"
    assert over_read.reason == ("memcheck unfinished: the run was interrupted after 3 of its "
                                "block_table.slot_mapping case(s) ran clean")
    assert over_read.unjudged_by == "memcheck"  # a resumed run owes it memcheck, not its families


def test_memcheck_without_a_caught_control_judges_nothing(monkeypatch):
    from stress.mutate import kill_matrix as matrix
    from stress.sanitize import runner as sanitizer

    over_read, _ = _memcheck_survivors()
    monkeypatch.setattr(matrix, "_run_hunts", lambda *a, **k: pytest.fail("hunted without a caught control"))
    monkeypatch.setattr(sanitizer, "gate", lambda tool, device: sanitizer.Gate("blind", "the control was missed"))
    mutate.judge_by_memcheck([over_read], "cuda", seed=0, timeout=60)
    assert over_read.status == "survived" and over_read.reason == "memcheck not run: the control was missed"


def test_the_kept_h200_record_resumes_with_the_documented_command():
    """records/ keeps the H200's decided mutants; docs/mutation.md's `make mutate` line must match its settings."""
    import os
    import re

    path = "records/mutate-h200-iters2.jsonl.gz"
    header, decided = mutate.earlier_run(os.path.join(mutate.ROOT, path))
    assert (header["device"], header["seed"]) == ("cuda", 0) and decided
    readme = open(os.path.join(mutate.ROOT, "docs", "mutation.md")).read()
    assert f"make mutate MUTATE_ITERS={header['iters']}\nRESUME={path}" in readme
    assert all(re.fullmatch(r"[0-9a-f]{16}", row["fingerprint"]) for row in decided.values())


def test_a_target_of_a_check_that_failed_unmutated_says_which_check_did_not_hunt_it():
    """A check whose production code fails in discovery is not scored; a target it shares with another check is
    hunted by that one alone, and its survivors say which check did not hunt them (a weak co-owner's score is
    otherwise all one sees)."""
    target = "kernels.spec.slots:RequestSlots"
    cov = mutate.Coverage({"spec.slots": [target], "spec.graph_candidates": [target]}, {},
                          {"spec.slots": [], "spec.graph_candidates": ["timeout: ran past its 90 s deadline"]})
    rows = mutate.plan([checks.get("spec.slots"), checks.get("spec.graph_candidates")], cov, ["cmp-flip"], None, 0, 0)
    assert rows and all(r.owners == ["spec.slots"] and r.unscored == ["spec.graph_candidates"] for r in rows)
    rows[0].status = "survived"
    assert ("    not hunted by spec.graph_candidates, which failed unmutated here (see discovery)"
            in mutate.survivor_lines(rows[:1], "cuda", 2))


def test_a_kill_keeps_its_first_detail_and_where_a_crash_was_raised():
    from stress.mutate import kill_matrix as matrix

    crash = ["ValueError: not enough values to unpack\n", "Traceback (most recent call last):",
             '  File "/x/engine.py", line 10, in step', "    a, b = f()", '  File "/x/models.py", line 3, in f',
             "    return (1,)"]
    assert matrix._first_detail(crash) == 'ValueError: not enough values to unpack (File "/x/models.py", line 3, in f)'
    assert matrix._first_detail(["step 2 draft.tokens: 1 element(s) differ", "  at (0, 1): expected 3, got 4"]) == \
        "step 2 draft.tokens: 1 element(s) differ"
    assert matrix._first_detail([]) == ""


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the small deterministic sample runs in CPU CI")
@pytest.mark.slow
def test_hunt_seconds_leaves_the_rest_pending_and_still_judges_the_survivors_found(monkeypatch, tmp_path):
    """Past --hunt-seconds no case starts: the mutants not decided stay pending, the run says it is not complete,
    and the survivors decided before the deadline still meet the second oracles (a time limit never lets them)."""
    import json

    from stress.mutate import kill_matrix as matrix

    real, judged = matrix._run_hunts, []

    def one_survivor_then_the_deadline(hunts, device, jobs, timeout, on_row, on_case=None, deadline=None):
        assert deadline is not None
        on_row(hunts[0].finish("survived"))  # decided before the deadline
        monkeypatch.setattr(workers, "worker_pool", lambda *a, **k: pytest.fail("a pool started past the deadline"))
        real(hunts[1:], device, jobs, timeout, on_row, on_case, deadline=0.0)  # the deadline has passed

    monkeypatch.setattr(matrix, "_run_hunts", one_survivor_then_the_deadline)
    monkeypatch.setattr(mutate, "second_oracles", lambda rows, device, **kw: judged.extend(rows) or
                        [kw["on_row"](r) for r in rows])
    lines = []
    summary = mutate.run([checks.get("spec.slots")], "cpu", iters=1, seed=0, jobs=1, timeout=60, operators=None,
                         only=None, sample=4, report=str(tmp_path), log=lines.append, hunt_seconds=30)
    rows = summary["rows"]
    hunted = [r for r in rows if r.equivalence == "bytecode" and r.status not in ("equivalent", "invalid")]
    assert len(hunted) >= 2 and [r.status for r in judged] == ["survived"] and judged[0] is hunted[0]
    assert all(r.status == "pending" for r in hunted[1:]) and summary["exit_code"] is None
    assert any("--hunt-seconds 30 spent" in line and f"{len(hunted) - 1} mutant(s) left pending" in line
               for line in lines)
    end = [json.loads(line) for line in open(tmp_path / mutate.Stream.NAME)][-1]["end"]
    assert end["complete"] is False and end["interrupted"] is None
    # what the next run's --hunt-seconds is sized by: every phase's seconds, in the log and in the report
    assert list(end["phases"]) == ["discovery", "equivalence", "hunting", "unit tests and memcheck"]
    assert any(line.startswith("specsan mutate: hunting took ") for line in lines)


@pytest.mark.parametrize("check", ["rejection.verify", "draft_inputs.prepare", "sampling.gumbel"])
def test_the_launched_kernels_name_every_jit_helper_the_interpreter_runs(monkeypatch, check):
    """On a GPU a kernel's jit helpers are compiled into it and no frame of theirs runs, so discovery takes them
    from the launched kernels' source. Every helper the CPU's trace sees running must be found that way, or the
    GPU generates no mutant of it (rejection's _argmax among them)."""
    from stress.core.cases import Task, case_seed

    monkeypatch.setattr(mutate_ops, "jit_helpers", lambda kernel: [])  # the trace alone, as on a GPU
    family = next(iter(checks.get(check).families))
    traced = mutate._traced_case(Task(check, family, case_seed(0, check, family, 0)), "cpu", 0)
    monkeypatch.undo()
    import importlib

    def jit(target):
        module, name = target.split(":")
        return getattr(importlib.import_module(module), name, None)

    kernel_type = type(jit(next(iter(traced.launches))))
    ran = {t for t in traced.seen if isinstance(jit(t), kernel_type)} - set(traced.launches)
    found = {h for k in traced.launches for h in mutate_ops.jit_helpers(jit(k))}
    assert ran and ran <= found, ran - found


def test_equivalence_compares_every_launch_variant_the_cases_used():
    """Launches compared per kernel cover every argument type and constexpr value seen: four signatures without
    draft logits sort before the one with them, and a mutant of code only that one compiles (an int32 slot offset
    into the draft logits) must meet it, or its TTIR reads as the same program."""
    def sig(has_draft_logits, stride="i32", block=16):
        return (("draft_logits_slot_stride", stride, None), ("BLOCK_V", "constexpr", block),
                ("HAS_DRAFT_LOGITS", "constexpr", has_draft_logits))

    plain = [sig(False, block=b) for b in (16, 32, 64, 128)]
    rare = [sig(True, block=64), sig(False, stride="i64", block=64)]
    chosen = mutate_equiv.covering(plain + rare)
    assert sorted(plain + rare, key=repr)[:mutate_equiv.MAX_SIGNATURES] == sorted(plain, key=repr)  # the old pick
    assert set(rare) <= set(chosen) and {s[1][2] for s in chosen} == {16, 32, 64, 128}
    assert len(mutate_equiv.covering(plain)) == mutate_equiv.MAX_SIGNATURES


def test_a_resumed_survivor_that_a_signal_left_without_memcheck_meets_it_without_its_families(monkeypatch):
    """Same kernels and suite: its families would run the same cases again, only the cut oracle is owed."""
    from stress.mutate import kill_matrix as matrix

    left = dataclasses.replace(_memcheck_survivors()[0], status="pending", fingerprint="f" * 16, tree="t" * 16)
    earlier = {left.id: {**dataclasses.asdict(left), "status": "survived", "unjudged_by": "memcheck",
                         "reason": "memcheck unfinished: the run was interrupted after 2 of its cases ran clean"}}
    streamed, judged = [], []
    assert mutate.resume([left], earlier, streamed.append) == 1
    assert left.status == "survived" and not streamed, "streamed once its second oracles have judged it"
    monkeypatch.setattr(matrix, "_run_hunts", lambda hunts, *a, **k: hunts and pytest.fail(f"hunted {hunts}"))
    monkeypatch.setattr(mutate, "second_oracles", lambda rows, *a, **k: judged.extend(rows))
    mutate.hunt_generated([left], "cuda", iters=1, seed=0, jobs=1, timeout=60, on_row=streamed.append)
    assert judged == [left] and (left.unjudged_by, left.reason) == ("", "")


def test_a_stopped_run_marks_only_survivors_without_a_reason_of_their_own_as_unjudged():
    cut, whole_path = _memcheck_survivors()
    whole_path.reason = "memcheck not run: a whole-path check"
    mutate.unjudged([cut, whole_path], lambda row: None, "memcheck")
    assert (cut.unjudged_by, whole_path.unjudged_by) == ("memcheck", "")
    assert cut.reason == "memcheck not run: the run was interrupted"


def test_a_resumed_run_decides_ttir_equivalence_again():
    """Equivalence by TTIR depends on the launches compared, so a resumed run decides it again (compile work);
    a kill, or a bytecode equivalence, is taken as it is."""
    rows = [dataclasses.replace(_row(HOST, "cmp-flip", "", "", "pending"), id=f"gen:x:{i}", fingerprint="f" * 16)
            for i in range(3)]
    known = {"gen:x:0": {"status": "equivalent", "equivalence": "ttir", "fingerprint": "f" * 16},
             "gen:x:1": {"status": "equivalent", "equivalence": "bytecode", "fingerprint": "f" * 16},
             "gen:x:2": {"status": "killed", "equivalence": "ttir", "fingerprint": "f" * 16}}
    taken = []
    assert mutate.resume(rows, known, taken.append) == 2
    assert [r.id for r in taken] == ["gen:x:1", "gen:x:2"] and (rows[0].status, rows[0].equivalence) == ("pending", "")


def test_module_limits_the_plan_to_the_code_of_that_module():
    """``--module``: a change to one module is mutated alone; its mutants keep the owners every other target has."""
    cov = mutate.Coverage({"spec.graph_candidates": ["kernels.spec.slots:RequestSlots",
                                                     "kernels.spec.graphs:build_candidates"]}, {},
                          {"spec.graph_candidates": []})
    everything = mutate.plan([checks.get("spec.graph_candidates")], cov, ["cmp-flip"], None, 0, 0)
    limited = mutate.plan([checks.get("spec.graph_candidates")], cov, ["cmp-flip"], None, 0, 0,
                          modules=["kernels.spec.graphs"])
    assert {r.target.split(":")[0] for r in everything} == {"kernels.spec.slots", "kernels.spec.graphs"}
    graphs_rows = [r.id for r in everything if r.target.startswith("kernels.spec.graphs:")]
    assert limited and [r.id for r in limited] == graphs_rows


def test_a_module_that_is_no_module_or_that_no_selected_check_runs_is_a_usage_error(capsys, tmp_path):
    from stress.__main__ import main

    assert main(["mutate", "--device", "cpu", "--module", "kernels.spec.engin", "--report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("specsan: --module: no module 'kernels.spec.engin'; ")
    assert main(["mutate", "--device", "cpu", "--jobs", "0", "--check", "spec.slots", "--module",
                 "kernels.spec.engine", "--report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no code of kernels.spec.engine is run by the selected checks" in err and "kernels.spec.slots" in err


def test_run_and_repro_apply_a_generated_mutant_as_mutate_prints_it(capsys, tmp_path):
    """``mutate`` names a survivor or a kill by its generated id; ``run`` and ``repro`` take that id in --mutant and
    apply it in every case (a planted bug's name would fail as not planted); a stale id is a usage error."""
    from stress.__main__ import main

    generated = "gen:kernels.spec.slots:RequestSlots:same-name:dee35124"  # killed by spec.slots/churn at once
    assert main(["run", "--device", "cpu", "--check", "spec.slots", "--family", "churn", "--iters", "1", "--jobs", "0",
                 "--mutant", generated, "--report", str(tmp_path / "run")]) == 1
    verdicts = [json.loads(line).get("verdict") for line in open(tmp_path / "run" / "results.jsonl")]
    assert "fail:divergence" in verdicts and "fail:crash" not in verdicts
    seed = str(cases.case_seed(0, "spec.slots", "churn", 0))
    assert main(["repro", "spec.slots", "churn", seed, "--device", "cpu", "--mutant", generated]) == 1
    assert "verdict: fail:divergence" in capsys.readouterr().out
    assert main(["run", "--device", "cpu", "--mutant", generated[:-8] + "00000000", "--report", str(tmp_path)]) == 2
    assert "no longer matches a mutant" in capsys.readouterr().err


def test_hunts_beside_other_work_keep_one_case_of_each_in_flight_and_run_ahead_only_when_asked():
    from stress.mutate import kill_matrix as matrix

    planned = matrix.planned([checks.get("block_table.gather")], "cpu", max_iters=4, seed=0)
    hunting = matrix.Hunting(planned.hunts, "cpu", 0, lambda row: None)
    first = [hunting.next_task(ahead=False) for _ in planned.hunts]
    assert None not in first and len({(t.mutant, t.seed) for t in first}) == len(planned.hunts)
    assert hunting.next_task(ahead=False) is None, "each hunt has one case running"
    ahead = hunting.next_task(ahead=True)
    assert ahead is not None and hunting.owns(ahead) and all(hunting.owns(t) for t in first)
    assert (ahead.mutant, ahead.seed) not in {(t.mutant, t.seed) for t in first}, "a later iteration, not a rerun"
