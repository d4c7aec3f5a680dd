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
