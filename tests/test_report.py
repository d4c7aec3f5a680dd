"""A report folder's summary and closing record: how far a stopped run got, and lines that rerun what it
left behind."""

import json
import shlex

from stress import hunt
from stress.__main__ import main
from stress.core import cases
from stress.report.summary import Report


def test_a_stopped_run_says_how_far_its_hunts_got_and_how_to_rerun_each_abandoned_case(tmp_path, capsys):
    from stress import checks

    planned = hunt.planned(checks.REGISTRY, "cpu")
    header = {"device": "cpu", "cases": 2, "timeout": 300.0, "trace": False, "hunt": True, "hunts": len(planned)}
    report = Report(str(tmp_path), header)
    report.abandoned = [cases.Task("block_table.unaligned_prefix", "aligned", 7)]
    report.interrupted = "SIGINT"
    report.close()
    summary = (tmp_path / "summary.md").read_text()
    assert f"hunts: 0 of {len(planned)} finished" in summary and planned
    end = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])["end"]
    (abandoned,) = end["abandoned"]
    assert f"hunts: 0 of {len(planned)} finished" in end["progress"]
    line = abandoned["repro"]
    assert f"`{line}`" in summary and line.endswith("--device cpu --no-trace")
    argv = shlex.split(line)
    assert argv[0] == "./specsan" and main(argv[1:]) == 0  # the line reruns that case
    assert "block_table.unaligned_prefix / aligned / seed 7 on cpu" in capsys.readouterr().out


def test_the_summary_says_where_each_checks_case_seconds_went():
    from stress.core.types import Result
    from stress.report.summary import time_lines

    def result(check, seed, seconds, **phases):
        r = Result(check, "basic", seed, "cuda", "pass", seconds=seconds)
        r.phases = phases
        return r

    rows = time_lines([result("a.x", 1, 1.0, build=0.5, launch=0.25, gpu_wait=3.0, release=0.5),
                       result("a.x", 2, 3.0, build=0.5, reference=1.0, compile=1.0),
                       result("b.y", 1, 2.0, build=2.0)])
    header, _, a, b = rows[3:]
    assert header == ("| check | cases | case-seconds | per case | build | reference | launch | compile | gpu_wait "
                      "| release | other | slowest |")
    # a.x: 4 s over 2 cases; build 1 s = 25%, reference 25%, launch 6%, compile 25%; the 3 s waiting for the GPU
    # and the 0.5 s releasing memory after are not part of a case's seconds (75% and 12% of them), and the 0.75 s
    # no phase timed is other (19%)
    assert a == "| a.x | 2 | 4.0 | 2000.0 ms | 25% | 25% | 6% | 25% | 75% | 12% | 19% | 3.00 s (basic, seed 2) |"
    assert b == "| b.y | 1 | 2.0 | 2000.0 ms | 100% | 0% | 0% | 0% | 0% | 0% | 0% | 2.00 s (basic, seed 1) |"
    assert time_lines([result("a.x", 1, 1.0)]) == []  # no phase timed: no table


def test_the_counts_kept_as_results_come_match_a_count_over_them():
    from stress.core.types import Result, not_checked

    report = Report(None, {"cases": 7})
    for i, verdict in enumerate(["pass", "fail:divergence", "pass", not_checked("no GPU"), "fail:crash", "pass"]):
        report.add(Result("block_table.gather", "basic", i, "cpu", verdict))
    assert report.counts() == (3, 2, 1)
    assert report.counts() == (sum(r.verdict == "pass" for r in report.results),
                               sum(r.failed for r in report.results), sum(r.not_checked for r in report.results))
    assert report.closing_line().startswith("3 passed, 2 failed, 1 not checked")
