"""`run --resume`: a stopped run goes on where it stopped, and never inherits verdicts it should not."""

import json
import os
import signal
import subprocess
import sys

import pytest
from test_cli import ROOT, _wait_for_results

from stress.__main__ import main

ARGS = ["run", "--device", "cpu", "--check", "block_table.gather", "--check", "spec.slots", "--jobs", "0", "--iters"]


def rows(folder) -> list[dict]:
    with open(os.path.join(folder, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def cases(folder) -> dict:
    return {(r["check"], r["family"], r["seed"]): r for r in rows(folder) if "verdict" in r}


def stopped_copy(source, folder, keep: int) -> list[dict]:
    """``source``'s header and first ``keep`` cases in ``folder``: what a run stopped there leaves behind."""
    kept = rows(source)[:keep + 1]
    os.makedirs(folder)
    with open(os.path.join(folder, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return kept[1:]


def test_a_resumed_run_carries_what_finished_reruns_crashes_and_reaches_a_fresh_runs_verdicts(tmp_path, capsys):
    fresh, stopped = tmp_path / "fresh", tmp_path / "stopped"
    assert main(ARGS + ["2", "--report", str(fresh)]) == 0
    kept = stopped_copy(fresh, stopped, keep=12)
    # mark what must be carried as it is, and make one case a crash, which a machine can cause: it runs again
    lines = rows(stopped)
    for r in lines[1:]:
        r["note"] = "carried as it was"
    lines[5]["verdict"], crashed = "fail:crash", (lines[5]["check"], lines[5]["family"], lines[5]["seed"])
    with open(stopped / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)

    # three iterations where the stopped run planned two: the first two iterations' seeds are the same
    capsys.readouterr()
    assert main(ARGS + ["3", "--report", str(stopped), "--resume", str(stopped), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cases_carried"] == 11 and printed["cases_finished"] == printed["cases_planned"]
    resumed, before = cases(stopped), cases(fresh)
    header = rows(stopped)[0]["run"]
    assert header["resumed"] == {"from": str(stopped), "carried": 11, "rerun": 1}
    assert header["cases"] == len(resumed) > len(before)
    for key, r in before.items():  # every case of the fresh run, with its verdict and details
        assert (resumed[key]["verdict"], resumed[key]["details"]) == (r["verdict"], r["details"]), key
    carried = {(r["check"], r["family"], r["seed"]) for r in kept} - {crashed}
    assert {k for k, r in resumed.items() if r["note"] == "carried as it was"} == carried
    assert resumed[crashed]["verdict"] == "pass" and resumed[crashed]["note"] != "carried as it was"
    with open(stopped / "summary.md") as f:
        summary = f.read()
    assert "resumed: 11 of them carried from" in summary
    # the time tables hold this run's own cases only: the carried ones' seconds were the earlier run's
    timed = summary.split("## Where the time went")[1].split("\n\n")[1].splitlines()[2:]
    assert sum(int(line.split("|")[2]) for line in timed) == len(resumed) - 11


def test_resume_refuses_another_seed_or_source_and_names_the_fix(tmp_path, capsys):
    earlier = tmp_path / "earlier"
    assert main(ARGS + ["1", "--report", str(earlier)]) == 0
    capsys.readouterr()
    assert main(ARGS + ["1", "--seed", "1", "--report", str(tmp_path / "a"), "--resume", str(earlier)]) == 2
    assert "--resume:" in (err := capsys.readouterr().err) and "seed was 0, now 1" in err and "same seed" in err

    lines = rows(earlier)
    lines[0]["run"]["source"] = "0" * 16  # as if a kernel or a reference changed since
    with open(earlier / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)
    assert main(ARGS + ["1", "--report", str(tmp_path / "b"), "--resume", str(earlier)]) == 2
    assert "the source changed since" in (err := capsys.readouterr().err) and "run without --resume" in err

    assert main(ARGS + ["1", "--report", str(tmp_path / "c"), "--resume", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_stopped_by_ctrl_c_and_resumed_ends_as_one_run_would(tmp_path, capsys):
    """The way a user meets it: Ctrl-C mid-run, then the same command with --resume into the same folder."""
    args = ["run", "--device", "cpu", "--check", "block_table.shift", "--iters", "20", "--jobs", "2", "--no-trace"]
    stopped, fresh = tmp_path / "stopped", tmp_path / "fresh"
    proc = subprocess.Popen([sys.executable, "-m", "stress", *args, "--report", str(stopped)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_results(stopped, 5, proc)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    finished = cases(stopped)
    planned = rows(stopped)[0]["run"]["cases"]
    assert 5 <= len(finished) < planned

    assert main(args + ["--report", str(stopped), "--resume", str(stopped)]) == 0
    assert main(args + ["--report", str(fresh)]) == 0
    capsys.readouterr()
    resumed = cases(stopped)
    assert rows(stopped)[0]["run"]["resumed"]["carried"] == len(finished)
    assert {k: (r["verdict"], r["details"]) for k, r in resumed.items()} == \
        {k: (r["verdict"], r["details"]) for k, r in cases(fresh).items()}
    assert all(resumed[k]["seconds"] == r["seconds"] for k, r in finished.items())  # carried, not run again
    assert rows(stopped)[-1]["end"]["status"] == "complete"


def kill_rows(folder) -> dict:
    return {(r["kill"]["check"], r["kill"]["mutant"]): r["kill"] for r in rows(folder) if "kill" in r}


@pytest.mark.slow
def test_the_kill_matrix_rows_an_earlier_run_hunted_are_carried_only_under_the_same_bounds(tmp_path, capsys):
    matrix = ["run", "--device", "cpu", "--check", "block_table.gather", "--iters", "1", "--kill-matrix"]
    earlier = tmp_path / "earlier"
    assert main(matrix + ["--jobs", "1", "--report", str(earlier)]) == 0
    hunted = {k: r for k, r in kill_rows(earlier).items() if r["status"] in ("killed", "survived")}
    assert hunted

    assert main(matrix + ["--jobs", "1", "--report", str(tmp_path / "same"), "--resume", str(earlier)]) == 0
    assert rows(tmp_path / "same")[0]["run"]["resumed"]["carried"] == len(cases(earlier))
    assert kill_rows(tmp_path / "same") == kill_rows(earlier)
    with open(tmp_path / "same" / "summary.md") as f:
        assert f"; {len(hunted)} kill-matrix row(s) carried" in f.read()

    # other bounds: every row is hunted again (its cases, not the earlier row, decide it)
    assert main(matrix + ["--jobs", "1", "--max-iters", "50", "--report", str(tmp_path / "bounds"),
                          "--resume", str(earlier)]) == 0
    again = kill_rows(tmp_path / "bounds")
    assert {k: r["status"] for k, r in again.items()} == {k: r["status"] for k, r in kill_rows(earlier).items()}
    with open(tmp_path / "bounds" / "summary.md") as f:
        assert "; 0 kill-matrix row(s) carried" in f.read()

    # a run in one process kept its process after a fatal case: its matrix is not carried
    single = tmp_path / "single"
    assert main(matrix + ["--jobs", "0", "--report", str(single)]) == 0
    assert main(matrix + ["--jobs", "0", "--report", str(tmp_path / "b"), "--resume", str(single)]) == 0
    with open(tmp_path / "b" / "summary.md") as f:
        assert "; 0 kill-matrix row(s) carried" in f.read()
    capsys.readouterr()


def test_the_source_fingerprint_follows_every_judged_implementations_module(tmp_path, monkeypatch):
    from stress.report import resume

    module = tmp_path / "my_gather.py"
    module.write_text("def gather(*args, **kwargs):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = ["block_table.gather=my_gather:gather"]
    before = resume.source_fingerprint(spec)
    assert before != resume.source_fingerprint() and before == resume.source_fingerprint(spec)
    module.write_text("def gather(*args, **kwargs):\n    return 1\n")  # the implementation changed
    assert resume.source_fingerprint(spec) != before


def test_make_stress_takes_resume():
    done = subprocess.run(["make", "-n", "stress", "ITER=2", "RESUME=reports/stress"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "--resume reports/stress" in done.stdout and "--iters 2" in done.stdout, done
