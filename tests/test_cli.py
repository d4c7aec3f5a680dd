"""The command line as a user meets it: one-line usage errors (exit 2), signals that stop a run
cleanly (exit 130 / 143, a summary that says how far it got, no process left), machine-readable
output, every default in --help, report folders that never mix runs, repro lines that run."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_pool import in_group

from kernels import runtime
from stress import checks
from stress.__main__ import main, parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU = torch.cuda.is_available()
USAGE = re.compile(r"^specsan: \S[^:]*: .+; .+$")


def cli(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stress", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, **kwargs)


def one_line_usage_error(capsys, argv: list[str], argument: str) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and USAGE.match(lines[0]), err
    assert lines[0].startswith(f"specsan: {argument}: "), err
    return lines[0]


@pytest.mark.parametrize("argv,argument", [
    (["run", "--iters", "0"], "--iters"),
    (["run", "--iters", "abc"], "--iters"),
    (["run", "--timeout", "-1"], "--timeout"),
    (["run", "--timeout", "nan"], "--timeout"),
    (["run", "--seed", "-1"], "--seed"),
    (["run", "--jobs", "-1"], "--jobs"),
    (["run", "--check", "no.such.check"], "--check"),
    (["run", "--check", "block_table.shift", "--family", "nope"], "--family"),
    (["run", "--device", "tpu"], "--device"),
    (["run", "--bogus"], "--bogus"),
    (["mutants", "--max-iters", "0"], "--max-iters"),
    (["mutants", "--check", "nope"], "--check"),
    (["mutants", "--mutant", "no-such-bug"], "--mutant"),
    (["mutants", "--check", "block_table.shift", "--mutant", "gqa-head-mapping"], "--mutant"),
    (["run", "--mutant", "no-such-bug"], "--mutant"),
    (["repro", "no.such.check", "f", "1"], "CHECK"),
    (["repro", "block_table.shift", "nope", "1"], "FAMILY"),
    (["repro", "block_table.shift", "overlap", "-5"], "SEED"),
    (["repro", "block_table.shift", "overlap", "99999999999999999999999"], "SEED"),  # past 63 bits
    (["run", "--seed", str(2**63)], "--seed"),
    (["mutate", "--fail-under", "150"], "--fail-under"),
    (["mutate", "--fail-under", "-1"], "--fail-under"),
    (["sanitize", "--baseline", "Makefile"], "--baseline"),
    (["repro", "block_table.shift", "overlap", "1", "--mutant", "nope"], "--mutant"),
    (["repro", "block_table.shift", "overlap", "1", "--launch", "chunk"], "--launch"),
    (["repro", "block_table.shift", "overlap", "1", "--launch", "warps=4"], "--launch"),
    (["repro", "block_table.shift", "overlap", "1", "--launch", "chunk=3"], "--launch"),  # not a sweep value
    (["hunt", "block_table.shift", "--launch", "chunk=3"], "--launch"),
    (["repro", "block_table.shift"], "FAMILY, SEED"),
    (["trace", "block_table.shift", "--seeds", "0"], "--seeds"),
    (["trace", "block_table.shift", "overlap"], "FAMILY SEED"),
    (["trace", "block_table.shift", "--mutant", "nope"], "--mutant"),
    (["trace", "--kernel", "nosuch.module:fn", "--args", "tests/trace_example_args.py"], "--kernel"),
    (["trace", "--kernel", "tests.trace_kernels:nosuch", "--args", "tests/trace_example_args.py"], "--kernel"),
    (["trace", "--kernel", "tests.trace_kernels:gather_groups", "--grid", "3", "--args", "Makefile"], "--args"),
    (["trace", "--kernel", "tests.trace_kernels:gather_groups", "--grid", "3"], "--args"),
    (["trace", "block_table.shift", "--kernel", "tests.trace_kernels:gather_groups"], "--kernel"),
    (["tp", "--ranks", "0"], "--ranks"),
    (["tp", "--ranks", "1", "--mutant", "global-rng-seeds"], "--mutant"),  # one rank cannot diverge
    (["tp", "--backend", "nccl", "--device", "cpu"], "--backend"),
    (["tp", "--backend", "mpi"], "--backend"),
])
def test_user_errors_are_one_line_with_the_argument_and_the_fix(capsys, argv, argument):
    one_line_usage_error(capsys, argv, argument)


@pytest.mark.skipif(GPU, reason="graphs.replay is judged on a GPU")
def test_a_run_or_repro_that_judged_nothing_exits_3_saying_why(tmp_path, capsys):
    """Every case not_checked (CUDA graphs need a GPU) is not green: exit 3, distinct from a failure."""
    why = "CUDA graphs need a GPU"
    code = main(["run", "--check", "graphs.replay", "--iters", "1", "--jobs", "0", "--report", str(tmp_path)])
    err = capsys.readouterr().err.splitlines()
    assert code == 3 and err[-1].startswith("specsan: nothing was judged here (exit 3): ") and why in err[-1]
    assert main(["repro", "graphs.replay", "padded_graph", "1"]) == 3
    captured = capsys.readouterr()
    assert f"verdict: not_checked:{why}" in captured.out and why in captured.err
    assert "3 nothing was judged" in parser().format_help()  # the exit statuses are in --help
    assert main(["mutants", "--check", "graphs.replay", "--jobs", "0"]) == 3  # no planted bug has an oracle here
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"specsan: nothing was judged here (exit 3): {why}")


def test_a_sanitize_baseline_must_be_a_run_report(tmp_path, capsys):
    assert main(["run", "--check", "block_table.unaligned_prefix", "--iters", "1", "--jobs", "0", "--no-trace",
                 "--report", str(tmp_path / "run")]) == 0
    assert main(["mutants", "--check", "block_table.unaligned_prefix", "--jobs", "0", "--report",
                 str(tmp_path / "matrix")]) == 0
    capsys.readouterr()
    for folder in ("matrix", "empty"):  # a kill matrix's report, a folder with no report
        (tmp_path / folder).mkdir(exist_ok=True)
        line = one_line_usage_error(capsys, ["sanitize", "--baseline", str(tmp_path / folder)], "--baseline")
        assert "is not the report folder of a `specsan run`" in line
    code = main(["sanitize", "--baseline", str(tmp_path / "run"), "--report", str(tmp_path / "sanitize")])
    assert code != 2, capsys.readouterr().err


def test_report_folder_that_cannot_be_written_is_a_usage_error(capsys, tmp_path):
    a_file = tmp_path / "results"
    a_file.write_text("not a folder")
    line = one_line_usage_error(capsys, ["run", "--iters", "1", "--report", str(a_file)], "--report")
    assert "is a file, not a directory" in line
    line = one_line_usage_error(capsys, ["mutants", "--report", str(a_file / "sub")], "--report")
    assert "cannot write to" in line
    assert a_file.read_text() == "not a folder"


@pytest.mark.skipif(GPU, reason="a GPU is visible: --device cuda is valid here")
def test_device_cuda_without_a_gpu_is_a_usage_error(capsys):
    line = one_line_usage_error(capsys, ["run", "--device", "cuda"], "--device")
    assert "SPECSAN_DEVICE" not in line  # names what the user typed, not an environment variable


@pytest.mark.skipif(GPU, reason="a GPU is visible: --device cuda is valid here")
@pytest.mark.slow
def test_pytest_device_cuda_without_a_gpu_is_a_clean_usage_error():
    done = subprocess.run([sys.executable, "-m", "pytest", "--device", "cuda", "-q", "-p", "no:xdist",
                           "tests/test_compare.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 4 and "INTERNALERROR" not in text and "Traceback" not in text, text
    assert "specsan: --device: cuda asked for, but no CUDA device is visible here" in text


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.slow
def test_make_stress_with_a_bad_iter_stops_at_the_error():
    done = subprocess.run(["make", "stress", "ITER=abc"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode != 0
    specsan = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("specsan")]
    assert specsan == ["specsan: --iters: expected a whole number, got 'abc'; see `specsan run --help`"], \
        done.stdout + done.stderr
    assert "kill matrix" not in done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_documented_ways_to_run_part_of_the_tests_work():
    with open(os.path.join(ROOT, "docs", "testing.md")) as f:
        doc = f.read()
    examples = re.findall(r'^make test ARGS="([^"]+)"', doc, re.MULTILINE)
    assert examples
    for args in examples:
        done = subprocess.run(["make", "-n", "test", f"ARGS={args}"], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "PYTHON": sys.executable})
        (command,) = [line for line in done.stdout.splitlines() if " -m pytest " in line]
        assert command.endswith(args), command  # make hands ARGS to pytest as they are
        collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args.split()], cwd=ROOT,
                                   capture_output=True, text=True, timeout=300)
        assert collected.returncode == 0, collected.stdout + collected.stderr  # and they select tests
    usage = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300).stdout
    assert "tests/test_registry.py" in usage  # --iters says which tests it sizes
    assert "--iters N" in doc and "--seed S" in doc


@pytest.mark.slow
def test_a_bad_device_variable_is_a_one_line_usage_error():
    done = cli("list", env={**os.environ, "SPECSAN_DEVICE": "tpu"})
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "specsan: SPECSAN_DEVICE: 'tpu' is not one of cpu, cuda; set one of them, or unset it to auto-detect"]


def test_each_xdist_worker_takes_its_own_gpu():
    from conftest import gpu_of_worker

    assert [gpu_of_worker(f"gw{n}", 4) for n in range(6)] == [0, 1, 2, 3, 0, 1]
    assert gpu_of_worker("gw5", 1) == 0


def test_help_shows_every_default():
    built = parser()
    sub = next(a for a in built._actions if a.dest == "command")
    for name, command in sub.choices.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help" and action.nargs != 0:
                assert action.help and "default" in action.help, f"{name} {action.option_strings[0]}"
    assert "(default: 300)" in sub.choices["run"].format_help()


@pytest.mark.parametrize("argv,code", [(["--help"], 0), (["run", "--iters", "0"], 2)])
def test_help_and_usage_errors_import_neither_torch_nor_triton(tmp_path, argv, code):
    """`./specsan --help` answers at once: neither the wrapper's environment check nor the command line
    imports torch or triton (seconds) for help or an argument the parser refuses."""
    imported = tmp_path / "imported"
    for name in ("torch", "triton"):  # stand-ins that record being imported, ahead of the real ones
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"open({str(imported)!r}, 'a').write('{name}\\n')\n")
    done = subprocess.run([os.path.join(ROOT, "specsan"), *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == code, done.stderr
    assert not imported.exists(), f"imported: {imported.read_text().split()}"


def test_log_progress_comes_every_30_seconds_at_most_with_the_rate_and_the_time_left(capsys):
    from stress.cli.common import LogProgress as _LogProgress

    now = [0.0]
    progress = _LogProgress(1000, clock=lambda: now[0])  # a tenth of this run is 100 cases, 500 s
    for _ in range(20):
        now[0] += 5.0
        progress.update()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines  # at 30, 60 and 90 s
    assert lines[0].startswith("[6/1000 cases, 30 s, 0.20 cases/s, 4970 s left]")


# ---------------------------------------------------------------- signals


def _results(report) -> list[dict]:
    return [json.loads(line) for line in (report / "results.jsonl").read_text().splitlines()]


def _wait_for_results(report, count: int, proc, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        path = report / "results.jsonl"
        if path.exists() and sum('"check"' in line for line in path.read_text().splitlines()) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} results in {limit} s")


@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGINT to the main process", "SIGTERM to the group"])
@pytest.mark.slow
def test_a_signal_stops_the_run_within_seconds_with_a_summary(tmp_path, how):
    args = ["run", "--check", "block_table.shift", "--iters", "500", "--jobs", "2", "--report", str(tmp_path)]
    if "SIGTERM" in how:
        args.append("--kill-matrix")
    proc = subprocess.Popen([sys.executable, "-m", "stress", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_results(tmp_path, 3, proc)
    signum = signal.SIGTERM if "SIGTERM" in how else signal.SIGINT
    start = time.monotonic()
    (os.killpg if "group" in how else os.kill)(proc.pid, signum)
    out, err = proc.communicate(timeout=60)
    seconds = time.monotonic() - start
    assert proc.returncode == 128 + signum, err
    assert seconds < 5, f"{seconds:.1f} s from the signal to the exit"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert in_group(proc.pid) == []  # no worker and no resource tracker survives
    records = _results(tmp_path)
    finished = [r for r in records if "check" in r]
    name = signal.Signals(signum).name
    assert records[-1]["end"]["status"] == f"interrupted by {name}"
    planned = 500 * len(checks.get("block_table.shift").families)
    assert records[-1]["end"]["cases_finished"] == len(finished) < planned
    assert len(records[-1]["end"]["abandoned"]) <= 2
    summary = (tmp_path / "summary.md").read_text()
    assert f"**Interrupted by {name}**" in summary
    assert f"replay: {len(finished)} of {planned} cases finished" in summary
    # the kill matrix hunts on the replay's workers: a signal stops both, its undecided rows left unfinished
    matrix = re.search(r"kill matrix: (\d+) of (\d+) rows decided", summary)
    assert (matrix is not None) == ("--kill-matrix" in args)
    if matrix:
        kills = [r["kill"] for r in records if "kill" in r]
        assert len(kills) == int(matrix[2]) and sum(k["status"] != "unfinished" for k in kills) == int(matrix[1])
    assert out.splitlines()[-1].startswith(f"{len(finished)} passed, 0 failed (interrupted by {name}")


def _busy_worker(parent: int) -> int | None:
    """A worker process of ``parent`` that is running a case right now (state R), if any."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] == "R" and "spawn_main" in cmdline:
            return int(pid)
    return None


def _kill_a_busy_worker(proc, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while (victim := _busy_worker(proc.pid)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert victim is not None, "no worker was seen running a case"
    os.kill(victim, signal.SIGKILL)


# A worker seen running can finish its case before the kill lands (a loaded machine delays the
# test between the look and the kill): that try loses nothing, and the next one kills again.
# Three tries that all land between cases would be a bug in the look, not bad luck.
TRIES = 3


@pytest.mark.slow
def test_a_worker_killed_mid_case_fails_that_case_only(tmp_path):
    for attempt in range(TRIES):
        report = tmp_path / str(attempt)
        args = ["run", "--check", "rejection.distribution", "--iters", "4", "--jobs", "2", "--report", str(report)]
        proc = subprocess.Popen([sys.executable, "-m", "stress", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        _wait_for_results(report, 1, proc)
        _kill_a_busy_worker(proc)
        _, err = proc.communicate(timeout=300)
        results = [r for r in _results(report) if "check" in r]
        assert len(results) == 8, err  # every case has its verdict, the killed one included
        crashed = [r for r in results if r["verdict"] != "pass"]
        if not crashed:
            assert proc.returncode == 0, err
            continue
        assert proc.returncode == 1, err
        assert [r["verdict"] for r in crashed] == ["fail:crash"]
        assert "killed by SIGKILL" in crashed[0]["details"][0]
        return
    raise AssertionError(f"{TRIES} kills of a running worker all landed between cases")


@pytest.mark.slow
def test_a_worker_killed_mid_hunt_fails_that_case_only_and_the_hunt_goes_on():
    """Six hunts on two workers (none runs ahead yet): the killed case is one verdict among its hunt's."""
    args = ["mutants", "--check", "rejection.verify", "--check", "rejection.distribution", "--max-iters", "40",
            "--jobs", "2", "--json"]
    for _ in range(TRIES):
        proc = subprocess.Popen([sys.executable, "-m", "stress", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        while "killed after" not in proc.stderr.readline():  # the workers are up and hunting
            assert proc.poll() is None
        _kill_a_busy_worker(proc, limit=120)
        out, err = proc.communicate(timeout=300)
        rows = [r for r in json.loads(out) if r["status"] != "not_checked"]
        assert {r["status"] for r in rows} == {"killed"}, err
        crashes = sum("fail:crash" in r["other_failures"] for r in rows)
        if crashes:
            assert crashes == 1, rows
            return
    raise AssertionError(f"{TRIES} kills of a hunting worker all landed between cases")


@pytest.mark.slow
def test_a_case_past_its_deadline_is_killed_and_reported(tmp_path, capsys):
    code = main(["run", "--check", "block_table.unaligned_prefix", "--family", "aligned", "--iters", "1",
                 "--timeout", "1e-9", "--jobs", "1", "--report", str(tmp_path)])
    assert code == 1, capsys.readouterr().err
    (result,) = [r for r in _results(tmp_path) if "check" in r]
    assert result["verdict"] == "fail:timeout" and "its worker was killed" in result["details"][0]
    assert result["repro"].endswith("--timeout 1e-09")
    assert "`fail:timeout` block_table.unaligned_prefix / aligned" in (tmp_path / "summary.md").read_text()


# ---------------------------------------------------------------- output for tools and people


@pytest.mark.slow
def test_json_output_is_json_only(tmp_path, capsys):
    done = cli("mutants", "--check", "block_table.unaligned_prefix", "--jobs", "0", "--json")
    rows = json.loads(done.stdout)
    assert done.returncode == 0 and {r["status"] for r in rows} == {"killed"}
    assert "checkable mutants killed" in done.stderr
    code = main(["run", "--check", "block_table.unaligned_prefix", "--iters", "1", "--jobs", "0", "--json",
                 "--report", str(tmp_path)])
    summary = json.loads(capsys.readouterr().out)
    assert code == summary["exit_code"] == 0
    families = len(checks.get("block_table.unaligned_prefix").families)
    assert (summary["status"], summary["passed"], summary["cases_planned"]) == ("complete", families, families)
    assert main(["list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["check"] == checks.REGISTRY[0].name


def test_a_report_folder_never_mixes_runs(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["mutants", "--check", "block_table.unaligned_prefix", "--jobs", "0", "--report", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"notes.txt", "results.jsonl", "summary.md", "mutants.json",
                                                     "kills.png"}
    assert "## Kill matrix" in (tmp_path / "summary.md").read_text()
    assert main(["run", "--check", "block_table.unaligned_prefix", "--iters", "1", "--jobs", "0", "--report",
                 str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"notes.txt", "results.jsonl", "summary.md", "failures.png"}
    assert "Kill matrix" not in (tmp_path / "summary.md").read_text()


def test_run_with_the_kill_matrix_writes_one_report_with_both_and_heat_maps(tmp_path):
    assert main(["run", "--check", "block_table.gather", "--iters", "1", "--jobs", "0", "--kill-matrix",
                 "--report", str(tmp_path)]) == 0
    summary = (tmp_path / "summary.md").read_text()
    assert "| block_table.gather | basic | 1 | 0 | 0 |" in summary and "## Kill matrix" in summary
    checkable = sum(runtime.DEVICE in m.oracles for m in checks.get("block_table.gather").mutants)
    assert f"{checkable} of {checkable} checkable mutants killed on {runtime.DEVICE}" in summary
    assert [r["kill"]["status"] for r in _results(tmp_path) if "kill" in r].count("killed") == checkable
    for picture in ("failures.png", "kills.png"):
        assert (tmp_path / picture).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="the by-shape hunt below uses the CPU sweep and oracle")
@pytest.mark.slow
def test_a_by_shape_repro_line_runs_as_printed_from_the_checkout():
    done = cli("mutants", "--check", "block_table.shift", "--by-shape", "--jobs", "0", "--max-iters", "6", "--json")
    rows = [r for r in json.loads(done.stdout) if r["mutant"] == "no-barrier" and r["status"] == "killed"]
    line = next(r["repro"] for r in rows if r["launch"] == {"chunk": 16})
    assert line.startswith("./specsan repro block_table.shift ") and "--launch chunk=16" in line
    rerun = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHON": sys.executable})
    assert rerun.returncode == 1, rerun.stderr
    assert "launch: {'chunk': 16}" in rerun.stdout and "verdict: fail:race" in rerun.stdout


@pytest.mark.skipif(runtime.DEVICE != "cpu", reason="reruns the line on the device it names")
def test_a_junit_repro_line_under_specsan_mutant_names_the_mutant_and_reruns_as_it_ran(tmp_path):
    from xml.etree import ElementTree

    from stress.mutate import operators as mutate_ops

    mutant = mutate_ops.generate("kernels.block_table:_shift_rows_kernel", ["cmp-flip"])[0].id
    junit = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "--iters",
                           "1", f"--junitxml={junit}",
                           "tests/test_registry.py::test_family_matches_reference[block_table.shift-overlap]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPECSAN_MUTANT": mutant})
    (line,) = [p.get("value") for p in ElementTree.parse(junit).iter("property") if p.get("name") == "repro"]
    assert f"--mutant {mutant}" in line, line
    rerun = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHON": sys.executable})
    assert rerun.returncode == done.returncode, rerun.stdout + rerun.stderr  # fails (or passes) as the test did


@pytest.mark.slow
def test_importing_triton_first_leaves_the_kernels_working():
    script = ("import triton\n"
              "from stress.core import cases, workers\n"
              "print(workers.run_case(cases.Task('block_table.shift', 'overlap', 1), 'cpu').verdict)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPECSAN_DEVICE": "cpu"})
    assert done.stdout.strip() == "pass", done.stdout + done.stderr


@pytest.mark.slow
def test_a_test_past_its_timeout_is_stopped_with_its_stack(tmp_path):
    (tmp_path / "test_hangs.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                           "--test-timeout", "1", str(tmp_path / "test_hangs.py")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode != 0
    assert "test_hangs.py::test_hangs ran past --test-timeout=1 s" in done.stderr
    assert "time.sleep(60)" in done.stderr  # where it was stuck


@pytest.mark.slow
def test_under_xdist_a_test_past_its_timeout_fails_and_a_fresh_worker_runs_the_rest(tmp_path):
    (tmp_path / "test_hangs.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n\n"
                                            "def test_after():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-n", "1",
                           "--test-timeout", "1", str(tmp_path / "test_hangs.py")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert "worker 'gw0' crashed while running 'test_hangs.py::test_hangs'" in done.stdout, done.stdout


def _kills(report) -> dict:
    return {k["mutant"]: (k["status"], k["iterations"], k["repro"], k["verdict"])
            for r in _results(report) if "kill" in r for k in [r["kill"]]}


def test_the_kill_matrix_beside_the_replay_decides_every_row_as_it_does_alone(tmp_path):
    """`run --kill-matrix` hunts on the replay's workers; each row is still its first killing iteration in order,
    so the rows are those of `mutants` on a pool of its own (block_table.shift's no-barrier takes more than one)."""
    beside, alone = tmp_path / "beside", tmp_path / "alone"
    assert main(["run", "--check", "block_table.shift", "--iters", "1", "--jobs", "2", "--kill-matrix",
                 "--report", str(beside)]) == 0
    assert main(["mutants", "--check", "block_table.shift", "--jobs", "2", "--report", str(alone)]) == 0
    rows = _kills(beside)
    assert rows == _kills(alone) and {status for status, *_ in rows.values()} == {"killed"}
    assert max(iterations for _, iterations, *_ in rows.values()) > 1
    line = next(x for x in (beside / "summary.md").read_text().splitlines() if x.startswith("Worker-seconds:"))
    held, *parts = (float(v) for v in re.findall(r"([\d.]+) (?:held|s)\b", line))
    assert parts[1] > 0, "the kill matrix's cases are counted among the workers' seconds"
    assert sum(parts) == pytest.approx(held, abs=0.2), line  # every worker-second has a place, the tail included


def test_builders_take_a_count_or_auto_and_name_the_fix_otherwise():
    import argparse

    from stress.cli.common import builder_count

    assert builder_count("auto") == "auto" and builder_count("3") == 3 and builder_count("0") == 0
    for bad in ("-1", "many"):
        with pytest.raises(argparse.ArgumentTypeError, match="or auto"):
            builder_count(bad)


def test_builders_are_on_by_default_and_none_run_on_the_cpu():
    """``run`` asks for ``auto`` unless told otherwise; ``auto`` starts none on the CPU or without pool workers."""
    from stress.__main__ import parser
    from stress.core import prebuild

    assert parser().parse_args(["run", "--iters", "1"]).builders == "auto"
    assert parser().parse_args(["run", "--iters", "1", "--builders", "0"]).builders == 0
    assert prebuild.builders_for("cpu", 2) == 0 and prebuild.builders_for("cuda", 0) == 0
