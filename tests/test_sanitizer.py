"""The compute-sanitizer oracle on the CPU: its XML parser and verdicts against outputs recorded on an H200
(tests/data/sanitizer, made by record.sh there), its process plumbing against a stand-in binary, and the
command line where no sanitizer can run."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernels import runtime
from stress import checks
from stress.__main__ import main
from stress.core import cases, workers
from stress.mutate import kill_matrix as matrix
from stress.sanitize import report_xml as sanitizer_xml
from stress.sanitize import runner as sanitizer

DATA = Path(__file__).parent / "data" / "sanitizer"
FAKE = Path(__file__).parent / "fake_sanitizer.py"
# exit status of each recorded run (record.sh's log): ERROR_EXIT when the tool reported something
RECORDED_STATUS = {"memcheck_oob": 9, "memcheck_clean": 0, "memcheck_row_overread": 9, "initcheck_uninit": 9,
                   "initcheck_clean": 0, "synccheck_bad_warp_sync": 9, "synccheck_clean": 0}


def recorded(name: str) -> tuple[int, str, str, dict]:
    """(status, XML, text output, child record) of one recorded run, as ``sanitizer._run_child`` returns them."""
    return (RECORDED_STATUS[name], (DATA / f"{name}.xml").read_text(), "",
            json.loads((DATA / f"{name}.json").read_text()))


# ---------------------------------------------------------------- the XML parser


def test_memcheck_out_of_bounds_read_is_parsed_field_by_field():
    findings = sanitizer_xml.parse((DATA / "memcheck_oob.xml").read_text())
    access = [f for f in findings if f.device_access]
    assert len(access) == 6 and len(findings) == 10  # then four CUDA calls that failed after the abort
    first = access[0]
    assert first.kind == "Precise" and first.kernel == "_copy_kernel"
    assert first.text == "Invalid __global__ read of size 16 bytes is out of bounds"
    assert first.size == 16 and first.address == 0x7FD910800FA0
    assert first.source.endswith("stress/sanitize/controls.py:31")
    assert first.thread == (122, 0, 0) and first.block == (0, 0, 0)
    api = [f for f in findings if not f.device_access]
    assert all(f.kind == "Api" and f.text.startswith("Program hit cudaErrorLaunchFailure") for f in api)


@pytest.mark.parametrize("tool", ["memcheck", "initcheck", "synccheck"])
def test_a_clean_run_is_an_empty_document(tool):
    assert sanitizer_xml.parse((DATA / f"{tool}_clean.xml").read_text()) == []


def test_initcheck_and_synccheck_records_are_parsed():
    uninit = sanitizer_xml.parse((DATA / "initcheck_uninit.xml").read_text())
    assert len(uninit) == sanitizer.PRINT_LIMIT and {f.kind for f in uninit} == {"Initcheck"}
    assert uninit[0].text == "Uninitialized __global__ memory read of size 4 bytes" and uninit[0].size == 4
    sync = sanitizer_xml.parse((DATA / "synccheck_bad_warp_sync.xml").read_text())
    assert sync[0].kind == "Synccheck" and sync[0].text == "Barrier error (Invalid arguments)"
    assert sync[0].kernel == "_copy_kernel" and sync[0].address is None


@pytest.mark.parametrize("text,problem", [("", "empty"), ("<ComputeSanitizerOutput><record>", "does not parse"),
                                          ("<html/>", "expected <ComputeSanitizerOutput>")])
def test_anything_else_is_refused(text, problem):
    with pytest.raises(sanitizer_xml.SanitizerXmlError, match=problem):
        sanitizer_xml.parse(text)


# ---------------------------------------------------------------- verdicts


def test_the_overread_control_is_fail_oob_at_the_end_of_src():
    verdict, details = sanitizer.judge("memcheck", *recorded("memcheck_oob"))
    assert verdict == "fail:oob"
    assert details[-1] == "6 memcheck finding(s) (and 4 failed CUDA call(s) after them)"
    assert details[0].startswith("_copy_kernel; Invalid __global__ read of size 16 bytes is out of bounds; "
                                 "at src + 4000: just past its end; it has 4000 bytes; line ")
    assert "src + 4016: 16 byte(s) past its end" in details[1]


def test_row_overread_on_the_h200_names_the_table_it_leaves():
    """The planted row-overread bug (block_table.gather, family wide): reads past the persistent table."""
    verdict, details = sanitizer.judge("memcheck", *recorded("memcheck_row_overread"))
    assert verdict == "fail:oob"
    assert details[-1].startswith(f"{sanitizer.PRINT_LIMIT} or more memcheck finding(s)")
    assert details[0].startswith("_gather_rows_kernel; Invalid __global__ read of size 4 bytes")
    assert "at persistent + 81940: just past its end; it has 81940 bytes" in details[0]


def test_initcheck_and_synccheck_verdicts():
    verdict, details = sanitizer.judge("initcheck", *recorded("initcheck_uninit"))
    assert verdict == "fail:uninit" and "at src + 1536: inside it; it has 4000 bytes" in details[0]
    verdict, details = sanitizer.judge("synccheck", *recorded("synccheck_bad_warp_sync"))
    assert verdict == "fail:sync" and details[0].startswith("_copy_kernel; Barrier error (Invalid arguments)")


@pytest.mark.parametrize("tool", ["memcheck", "initcheck", "synccheck"])
def test_clean_runs_pass_and_say_what_ran(tool):
    assert sanitizer.judge(tool, *recorded(f"{tool}_clean")) == ("pass", [f"1 kernel launch(es) clean under {tool}"])


def test_a_sanitizer_that_did_not_run_is_not_checked_with_its_own_words():
    """Recorded on the H200: an option this version does not take, so no XML and exit 255."""
    output = (DATA / "bad_option.txt").read_text()
    verdict, _ = sanitizer.judge("memcheck", 255, "", output, {})
    assert verdict == ("not_checked:compute-sanitizer did not run the case: compute-sanitizer: extra yes detected "
                       "on the input command line")


def test_findings_the_xml_does_not_hold_still_fail():
    assert sanitizer.judge("memcheck", sanitizer.ERROR_EXIT, "", "", {})[0] == "fail:oob"
    empty = "<ComputeSanitizerOutput/>"
    assert sanitizer.judge("initcheck", sanitizer.ERROR_EXIT, empty, "", {"launches": 1})[0] == "fail:uninit"


def test_a_child_that_raised_without_findings_crashed():
    verdict, details = sanitizer.judge("memcheck", 3, "<ComputeSanitizerOutput/>", "",
                                       {"launches": 0, "error": "ValueError: out: bad shape", "traceback": []})
    assert verdict == "fail:crash" and details[0] == "ValueError: out: bad shape"


def test_host_logic_is_not_checked_never_passed():
    verdict, _ = sanitizer.judge("memcheck", 0, "<ComputeSanitizerOutput/>", "", {"launches": 0, "tensors": {}})
    assert verdict.startswith("not_checked:launches no Triton kernel")


def test_an_address_is_named_by_the_nearest_tensor():
    tensors = {"a": [1000, 100], "b": [2000, 40]}
    assert sanitizer._nearest(990, tensors) == "a - 10: 10 byte(s) before its start; it has 100 bytes"
    assert sanitizer._nearest(1050, tensors) == "a + 50: inside it; it has 100 bytes"
    assert sanitizer._nearest(2048, tensors) == "b + 48: 8 byte(s) past its end; it has 40 bytes"
    assert sanitizer._nearest(5, {}) == "address 0x5 (no input tensor recorded)"


# ---------------------------------------------------------------- the process around a case


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """compute-sanitizer replaced by tests/fake_sanitizer.py; returns a function that sets what it leaves."""
    monkeypatch.setenv("COMPUTE_SANITIZER", str(FAKE))
    argv_file = tmp_path / "argv"
    monkeypatch.setenv("FAKE_SANITIZER_ARGV", str(argv_file))

    def leave(name: str | None = None, status: int = 0, record: dict | None = None, sleep: float = 0):
        if name:
            monkeypatch.setenv("FAKE_SANITIZER_XML", str(DATA / f"{name}.xml"))
            record = json.loads((DATA / f"{name}.json").read_text()) if record is None else record
            status = RECORDED_STATUS[name]
        monkeypatch.setenv("FAKE_SANITIZER_RECORD", json.dumps(record or {}))
        monkeypatch.setenv("FAKE_SANITIZER_STATUS", str(status))
        monkeypatch.setenv("FAKE_SANITIZER_SLEEP", str(sleep))
        return argv_file

    return leave


def test_a_case_runs_in_its_own_process_with_caching_off(fake):
    argv_file = fake("memcheck_row_overread")
    task = cases.Task("block_table.gather", "wide", 1, "row-overread", tool="memcheck")
    result = workers.run_case(task, "cuda")
    assert result.verdict == "fail:oob" and result.note == "width 4097" and result.tool == "memcheck"
    assert result.repro() == ("./specsan repro block_table.gather wide 1 --device cuda --mutant row-overread "
                              "--timeout 0 --sanitizer memcheck")
    argv = argv_file.read_text().splitlines()[:-1]  # the last line is the fake's process id
    assert argv[argv.index("--tool") + 1] == "memcheck" and "--xml" in argv and "--padding" in argv
    assert argv[argv.index("--error-exitcode") + 1] == str(sanitizer.ERROR_EXIT)
    assert argv[argv.index(sys.executable):][:3] == [sys.executable, "-m", "stress.sanitize.case"]
    assert argv[argv.index("case"):] == ["case", "block_table.gather", "wide", "1", "--mutant", "row-overread"]
    assert sanitizer._environment(0)["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


def test_a_case_past_its_deadline_is_killed_with_its_process_group(fake):
    fake(sleep=30)
    task = cases.Task("block_table.gather", "basic", 1, tool="memcheck")
    start = time.perf_counter()
    result = sanitizer.run_case(task, "memcheck", timeout=0.5)
    assert result.verdict == "fail:timeout" and time.perf_counter() - start < 10


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


@pytest.mark.slow
def test_a_worker_killed_at_its_deadline_takes_its_sanitizer_along(fake):
    """The pool kills a worker whose case outlives its deadline; the sanitizer it started must not live on."""
    argv_file = fake(sleep=60)
    worker = subprocess.Popen([sys.executable, "-c", "from stress import sanitizer; "
                               "sanitizer._run_child('memcheck', ['case', 'block_table.gather', 'basic', '1'])"])
    deadline = time.monotonic() + 60  # the worker imports torch first
    while not (argv_file.exists() and argv_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    sanitizer_pid = int(argv_file.read_text().splitlines()[-1])
    worker.kill()
    worker.wait()
    for _ in range(100):
        if _gone(sanitizer_pid):
            break
        time.sleep(0.05)
    assert _gone(sanitizer_pid)


def test_checks_that_cannot_be_sanitized_say_why_without_a_process(fake):
    argv_file = fake()
    for name in ("graphs.replay", "engine.step"):
        result = sanitizer.run_case(cases.Task(name, next(iter(checks.get(name).families)), 1), "memcheck")
        assert result.verdict.startswith("not_checked:") and "caching allocator" in result.verdict
    assert not argv_file.exists()


def test_every_gpu_check_runs_under_the_sanitizer_or_says_why():
    for check in checks.REGISTRY:
        reason = sanitizer.why_not(check)
        assert reason is None or len(reason) > 20, check.name


# ---------------------------------------------------------------- the positive control gates the run


def test_a_sanitizer_that_misses_its_control_is_blind(fake, monkeypatch):
    monkeypatch.setattr(sanitizer, "unavailable", lambda device: None)  # as on a GPU with the tool installed
    fake("memcheck_clean")
    gate = sanitizer.gate("memcheck", "cuda")
    assert gate.state == "blind" and gate.text.startswith("sanitizer blind: the planted overread was not reported")
    rows = matrix.kill_matrix([checks.get("block_table.gather")], "cuda", max_iters=2, seed=0, jobs=0, path_iters=0,
                              only=["row-overread"])
    assert [(r.mutant, r.status) for r in rows] == [("row-overread", "not_checked")]
    assert rows[0].reason.startswith("sanitizer blind")


def test_a_caught_control_opens_the_gate(fake, monkeypatch):
    monkeypatch.setattr(sanitizer, "unavailable", lambda device: None)
    fake("memcheck_oob")
    gate = sanitizer.gate("memcheck", "cuda")
    assert gate.state == "caught" and gate.text.startswith("overread control under memcheck: fail:oob (_copy_kernel")


def test_a_sanitizer_oracle_kills_through_the_matrix(fake, monkeypatch):
    monkeypatch.setattr(sanitizer, "unavailable", lambda device: None)
    fake("memcheck_row_overread")  # the control and every case leave the recorded row-overread findings
    monkeypatch.setattr(runner, "_gpu_of", lambda outcome, device: 0)  # no CUDA here to ask which GPU
    rows = matrix.kill_matrix([checks.get("block_table.gather")], "cuda", max_iters=2, seed=0, jobs=0, path_iters=0,
                              only=["row-overread"])
    assert (rows[0].status, rows[0].iterations, rows[0].verdict) == ("killed", 1, "fail:oob")
    assert rows[0].repro.endswith("--sanitizer memcheck")


# ---------------------------------------------------------------- the command line without a GPU


@pytest.mark.skipif(runtime.DEVICE == "cuda", reason="on a GPU the command runs for real")
def test_sanitize_without_a_gpu_is_one_not_checked_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECSAN_DEVICE", "cpu")  # what --device sets, restored afterwards
    assert main(["sanitize", "--device", "cpu", "--report", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["specsan sanitize: not_checked: compute-sanitizer checks GPU kernels and no CUDA device is in "
                   "use here"]
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    cases = [r for r in records if "check" in r]
    assert cases and all(r["verdict"].startswith("not_checked:") and r["tool"] == "memcheck" for r in cases)
    assert records[-1]["end"]["status"] == "complete"
    # asked for cases by name, the user gets a failing status for what could not be checked
    assert main(["sanitize", "--device", "cpu", "--check", "block_table.gather", "--report", str(tmp_path)]) == 1
    # one case asked for and none judged: repro's exit status for that (3), as for any not_checked case
    assert main(["repro", "block_table.gather", "basic", "1", "--device", "cpu", "--sanitizer", "memcheck"]) == 3
    assert "verdict: not_checked:compute-sanitizer checks GPU kernels" in capsys.readouterr().out


def test_the_slowdown_is_measured_against_a_run_report(tmp_path):
    from stress.core.types import Result

    lines = [{"run": {}}, {"check": "a", "family": "f", "verdict": "pass", "seconds": 0.1},
             {"check": "a", "family": "f", "verdict": "pass", "seconds": 0.3},
             {"check": "a", "family": "f", "verdict": "fail:divergence", "seconds": 9.0},
             {"check": "b", "family": "g", "verdict": "pass", "seconds": 0.5}, {"kill": {"check": "a"}}]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    results = [Result("a", "f", 1, "cuda", "pass", seconds=8.0, tool="memcheck"),
               Result("c", "h", 1, "cuda", "pass", seconds=99.0, tool="memcheck")]
    assert sanitizer.slowdown(results, str(tmp_path)) == (
        f"8.00 s per sanitized case against 0.200 s replayed in process by run (medians over 1 case(s) of the "
        f"same check and family, {tmp_path}/results.jsonl): 40x")
    assert sanitizer.slowdown(results, str(tmp_path / "missing")).startswith("no baseline: cannot read")
