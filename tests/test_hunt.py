"""Hunt mode: its positive control (a planted bug visible on this device is caught, with lines that rerun
it), a clean hunt of the production code, refusals, and its place in `run --hunt`'s report."""

import json

import pytest

from kernels import runtime
from stress import checks, hunt
from stress.__main__ import main
from stress.core import cases, workers

SHIFT = checks.get("block_table.shift")


def test_hunt_catches_a_planted_bug_and_names_the_case_that_reruns_it(device):
    found = hunt.hunt(SHIFT, device.type, seconds=60, mutant="ignores-seq-lens", launches_per_case=2, cases_per_sync=2)
    assert found.verdict == "fail:divergence"
    failure = found.failure
    assert failure.details and "element(s) differ" in failure.details[0]
    assert found.shapes[hunt.shape_key(failure.launch)].caught_after_s is not None
    # The printed repro line's case fails in the replay too ...
    rerun = workers.run_case(cases.Task(SHIFT.name, failure.family, failure.seed, "ignores-seq-lens",
                                        tuple(sorted(failure.launch.items()))), device.type, trace=False)
    assert rerun.verdict == "fail:divergence"
    assert f"--launch {hunt.shape_key(failure.launch)}" in failure.repro()
    # ... and the hunt line's one case is caught again at once.
    again = hunt.hunt(SHIFT, device.type, seconds=0, families=[failure.family], case_seed=failure.seed,
                      launch=failure.launch, mutant="ignores-seq-lens", launches_per_case=1)
    assert again.failed and again.failure.seed == failure.seed
    assert f"--case-seed {failure.seed}" in found.hunt_line()


@pytest.mark.parametrize("name", ["block_table.shift", "block_table.gather", "block_table.slot_mapping"])
def test_production_kernels_hunt_clean_in_every_launch_shape(name, device):
    check = checks.get(name)
    shapes = check.sweep(device.type) if check.sweep else [{}]
    done = hunt.hunt(check, device.type, seconds=0, min_cases=len(shapes), launches_per_case=2,
                     cases_per_sync=len(shapes))
    # on the CPU interpreter no race can fire: a clean hunt there judged nothing
    expected = "pass" if device.type == "cuda" else f"not_checked:{hunt.INTERPRETED}"
    assert done.verdict == expected, "\n".join(done.lines())
    assert done.cases >= len(shapes) and done.launches == 2 * done.cases
    assert all(s.cases for s in done.shapes.values())


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the barrier-less shift is a divergence a GPU hunt can catch")
def test_a_hunt_that_cannot_fire_here_is_not_checked_never_a_pass(capsys, device):
    """The barrier-less shift races only where programs run side by side; its CPU oracle is the tracer."""
    done = hunt.hunt(SHIFT, device.type, seconds=0, mutant="no-barrier", launches_per_case=1, cases_per_sync=1)
    assert done.not_checked and not done.failed
    assert "no-barrier shows on cpu as race" in done.verdict and hunt.INTERPRETED in done.verdict
    assert main(["hunt", SHIFT.name, "--seconds", "0", "--mutant", "no-barrier", "--launches-per-case", "1"]) == 3
    captured = capsys.readouterr()
    assert f"{SHIFT.name} on cpu (mutant no-barrier): not_checked:" in captured.out
    assert captured.err.startswith("specsan: nothing was judged here (exit 3): mutant no-barrier shows on cpu")
    # a planted bug whose oracle here is a divergence is judged: a miss would be a pass
    assert hunt.blind_spot(device.type, SHIFT.mutant("count-by-batch-row")) is None


def test_by_shape_hunts_every_shape_and_stops_each_at_its_first_failure(device):
    done = hunt.hunt(SHIFT, device.type, seconds=60, mutant="count-by-batch-row", by_shape=True, launches_per_case=1,
                     cases_per_sync=1)
    assert done.failed
    assert all(s.caught_after_s is not None for s in done.shapes.values()), "\n".join(done.lines())


def test_a_check_without_hunt_support_is_refused_clearly(capsys, device):
    with pytest.raises(ValueError, match="no hunt support"):
        hunt.hunt(checks.get("block_table.unaligned_prefix"), device.type, seconds=0)
    assert main(["hunt", "sampling.gumbel", "--seconds", "0"]) == 2
    assert "huntable here: block_table.gather" in capsys.readouterr().err
    assert main(["hunt", SHIFT.name, "--case-seed", "3"]) == 2  # a case seed needs its family


def test_hunt_command_exits_1_on_a_failure_with_json(capsys):
    code = main(["hunt", SHIFT.name, "--seconds", "60", "--mutant", "count-by-batch-row", "--launches-per-case",
                 "1", "--json"])
    record = json.loads(capsys.readouterr().out)
    assert code == 1 and record["verdict"] == "fail:divergence"
    assert record["failure"]["repro"].startswith(f"./specsan repro {SHIFT.name}")
    assert record["hunt_line"].startswith(f"./specsan hunt {SHIFT.name}")


def test_run_hunt_puts_the_hunt_in_the_same_report(tmp_path, device):
    assert main(["run", "--check", SHIFT.name, "--family", "zero_shift", "--iters", "1", "--jobs", "0", "--hunt",
                 "--no-trace", "--report", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    hunts = [r["hunt"] for r in records if "hunt" in r]
    assert len(hunts) == 1 and hunts[0]["check"] == SHIFT.name and hunts[0]["launches"] > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "## Hunts" in summary
    if device.type == "cpu":  # the Hunts section of `make stress` on a CPU runner
        assert hunts[0]["verdict"] == f"not_checked:{hunt.INTERPRETED}"
        assert f"hunt {SHIFT.name} on cpu: not_checked:" in summary and "1 hunt(s) not checked" in summary


def test_run_hunt_hunts_in_several_processes_per_gpu_and_one_on_the_cpu(monkeypatch):
    """A hunt is bound by building and launching cases from Python: `run --hunt` spreads it over processes on a
    GPU, within the run's workers; the interpreter can fire no race, so the CPU hunts in one."""
    monkeypatch.setattr(hunt.gpus, "count", lambda: 2)
    assert [hunt.hunt_jobs("cuda", jobs) for jobs in (0, 1, 3, 16)] == [0, 1, 3, 2 * hunt.HUNT_PROCESSES_PER_GPU]
    assert [hunt.hunt_jobs("cpu", jobs) for jobs in (0, 1, 16)] == [0, 1, 1]


def test_the_first_of_several_hunt_processes_draws_what_a_lone_hunt_draws():
    seeds = hunt.process_seeds(SHIFT, 7, 4)
    assert seeds[0] == 7 and len(set(seeds)) == 4
    assert hunt.process_seeds(SHIFT, 7, 0) == hunt.process_seeds(SHIFT, 7, 1) == [7]


@pytest.mark.slow
def test_hunt_in_processes_merges_their_counts_and_reports_a_failure(device):
    found = hunt.hunt_processes(SHIFT, device.type, 2, seconds=60, mutant="count-by-batch-row", launches_per_case=1,
                                cases_per_sync=1)
    assert found.processes == 2 and found.failed
    assert found.cases >= 2 and found.launches == found.cases
    assert found.failure.repro().startswith(f"./specsan repro {SHIFT.name}")
