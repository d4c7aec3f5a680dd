"""A run's report folder: results.jsonl streamed as cases finish, then summary.md, mutants.json
and the heat maps, written also when a signal stopped the run.

A folder holds one run only: a new run first removes every file an earlier run may have
left there (only specsan's own file names), so a stale summary never sits beside new results.
"""

import json
import os
from dataclasses import asdict

from stress.core.types import (
    BESIDE,
    DEFAULT_TIMEOUT,
    NOT_CHECKED,
    OUTSIDE,
    PASS,
    PHASES,
    Result,
    kill_matrix_verdict,
)

UNJUDGED_KILLS = ("not_checked", "not_hunted")  # kill-matrix statuses that hunted nothing here
RESULTS, SUMMARY, MATRIX = "results.jsonl", "summary.md", "mutants.json"
FAILURES_PNG, KILLS_PNG = "failures.png", "kills.png"
ARTIFACTS = (RESULTS, SUMMARY, MATRIX, FAILURES_PNG, KILLS_PNG)


class ReportError(ValueError):
    """The report folder cannot be used; the message says why and what to do instead."""


def _open(directory: str):
    """DIR/results.jsonl, open for writing, after removing every file an earlier run left in DIR."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ReportError(f"{directory} is a file, not a directory; give a directory path (it is created if missing)")
    try:
        os.makedirs(directory, exist_ok=True)
        for name in ARTIFACTS:
            if os.path.lexists(path := os.path.join(directory, name)):
                os.remove(path)
        return open(os.path.join(directory, RESULTS), "w", buffering=1)
    except OSError as exc:
        raise ReportError(f"cannot write to {directory} ({exc.strerror}); choose a writable directory") from None


class Report:
    """Results and kill-matrix rows of one run, streamed to DIR/results.jsonl as they arrive.

    ``directory=None`` keeps everything in memory. ``close()`` writes the closing record and
    the summary; ``interrupted`` (a signal name) makes both say how far the run got.
    """

    def __init__(self, directory: str | None, header: dict):
        self.directory, self.header = directory, header
        self.results: list[Result] = []
        self.carried = 0  # the first results, an earlier run's (``run --resume``): not timed by this run
        self._counts = [0, 0, 0]  # passed, failed, not checked among ``results``, kept as they come (counted once)
        self.kills: list | None = None  # kill-matrix rows (Kill) in registry order, once the matrix is planned
        self.hunts: list = []  # stress.hunt.HuntResult of `run --hunt`, in the order they finished
        self.abandoned: list = []  # tasks that were running when a signal stopped the run
        self.interrupted: str | None = None
        self.telemetry: dict = {}  # GPU envelope (stress.core.telemetry), filled during a GPU run
        self.workers: dict = {}  # the replay pool's worker-seconds, held and outside cases (pool.Pool.seconds)
        self.matrix_cases: dict[int | None, int] = {}  # kill-matrix cases run, by GPU
        self.matrix_seconds = 0.0  # their seconds in the workers, waits for the GPU and releases included
        self.untrusted_after: Result | None = None  # in process: the first case that may have damaged the process
        self.stream = None
        if directory:
            self.stream = _open(directory)
            self._write({"run": header})

    def _write(self, record: dict) -> None:
        if self.stream:
            self.stream.write(json.dumps(record) + "\n")

    def add(self, result: Result) -> None:
        self._watch(result)
        self.results.append(result)
        self._counts[0] += result.verdict == PASS
        self._counts[1] += result.failed
        self._counts[2] += result.not_checked
        record = asdict(result)
        record["repro"] = result.repro()
        self._write(record)

    def add_carried(self, result: Result) -> None:
        """An earlier run's finished case (``run --resume``), added before this run's own: it counts among the
        verdicts, not among this run's seconds."""
        if self.carried != len(self.results):
            raise ValueError("carried results come before this run's own")
        self.add(result)
        self.carried += 1

    def add_kill(self, row) -> None:
        """Stream one decided kill-matrix row (``kills`` holds the whole matrix, decided or not)."""
        self._write({"kill": asdict(row)})

    def add_hunt(self, result) -> None:
        self.hunts.append(result)
        self._write({"hunt": result.record()})

    def add_matrix_case(self, result: Result) -> None:
        """Count one kill-matrix case on the GPU it ran on (its verdicts live in the matrix's rows)."""
        self._watch(result)
        self.matrix_cases[result.gpu] = self.matrix_cases.get(result.gpu, 0) + 1
        self.matrix_seconds += in_worker(result)

    def _watch(self, result: Result) -> None:
        """A run in this process (``jobs`` 0) keeps its process after a fatal case (a memory verdict, a poisoned
        CUDA context), where a worker would be replaced: every later case ran in a process that may be damaged."""
        if result.fatal and self.header.get("jobs") == 0 and self.untrusted_after is None:
            self.untrusted_after = result

    def untrusted_line(self) -> str:
        r = self.untrusted_after
        return (f"not trusted after {r.check} / {r.family} seed {r.seed} ({r.verdict}): the run kept its process "
                "(--jobs 0), which that case may have damaged, so later verdicts may be wrong; rerun with --jobs 1")

    def gpu_rows(self) -> list[dict]:
        """Per GPU of the run (the header's ``gpus``): its workers, the cases that ran there by verdict,
        the kill-matrix cases, and its NVML readings."""
        from stress.core import telemetry

        rows = []
        for gpu in self.header.get("gpus", ()):
            ran = [r for r in self.results if r.gpu == gpu["index"]]
            rows.append({**gpu, "cases": len(ran), "passed": sum(r.verdict == PASS for r in ran),
                         "failed": sum(r.failed for r in ran), "not_checked": sum(r.not_checked for r in ran),
                         "seconds": round(sum(r.seconds for r in ran), 2),
                         "matrix_cases": self.matrix_cases.get(gpu["index"], 0),
                         "telemetry": telemetry.of_gpu(self.telemetry, gpu["uuid"])})
        return rows

    def counts(self) -> tuple[int, int, int]:
        """Passed, failed and not checked among the results: kept as each is added, since the progress line asks
        after every result (a count over all of them each time cost a run of 23,715 cases a minute)."""
        return tuple(self._counts)

    def judged(self) -> bool:
        """Whether the run judged anything: a case passed or failed, a hunt could fire, a kill-matrix row (or
        its path column) was hunted. A run that judged nothing is not green, whatever it did not find."""
        return (any(not r.not_checked for r in self.results) or any(not h.not_checked for h in self.hunts)
                or any(k.status not in UNJUDGED_KILLS or k.path not in ("-", "unreachable", "not_checked")
                       for k in self.kills or ()))

    def unjudged_reasons(self) -> list[str]:
        """Why the cases, hunts and kill-matrix rows were not checked, each reason once."""
        reasons = [r.verdict.removeprefix(NOT_CHECKED) for r in self.results if r.not_checked]
        reasons += [h.verdict.removeprefix(NOT_CHECKED) for h in self.hunts if h.not_checked]
        reasons += [k.reason or f"{k.mutant}: {k.status}" for k in self.kills or () if k.status in UNJUDGED_KILLS]
        return list(dict.fromkeys(reasons)) or ["no case ran"]

    def closing_line(self) -> str:
        """``N passed, N failed[, N not checked]``, then what stopped the run early, if anything."""
        passed, failed, not_checked = self.counts()
        line = f"{passed} passed, {failed} failed" + (f", {not_checked} not checked" if not_checked else "")
        if caught := sum(h.failed for h in self.hunts):
            line += f"; {caught} hunt(s) found a failure"
        if blind := sum(h.not_checked for h in self.hunts):
            line += f"; {blind} hunt(s) not checked"
        if self.untrusted_after:
            line += f"; {self.untrusted_line()}"
        return line + (f" (interrupted by {self.interrupted}: {'; '.join(self.progress())})" if self.interrupted
                       else "")

    def progress(self) -> list[str]:
        """How far the run got: cases finished of planned, kill-matrix rows decided, what was abandoned."""
        lines = []
        if "cases" in self.header:
            lines.append(f"replay: {len(self.results)} of {self.header['cases']} cases finished")
            if resumed := self.header.get("resumed"):
                lines.append(f"resumed: {resumed['carried']} of them carried from {resumed['from']} (their verdicts "
                             f"are that run's, their seconds left out of this run's times; {resumed['rerun']} "
                             "crash(es) and timeout(s) ran again)"
                             + (f"; {resumed['kills']} kill-matrix row(s) carried" if "kills" in resumed else ""))
        if "hunts" in self.header:
            lines.append(f"hunts: {len(self.hunts)} of {self.header['hunts']} finished")
        if self.kills is not None:
            decided = sum(k.status != "unfinished" for k in self.kills)
            lines.append(f"kill matrix: {decided} of {len(self.kills)} rows decided")
        elif self.header.get("kill_matrix"):
            lines.append("kill matrix: not started")
        if self.abandoned:
            lines.append(f"{len(self.abandoned)} case(s) running at the signal were abandoned")
        return lines

    def repro(self, task) -> str:
        """The line that reruns an abandoned task (stress.core.cases.Task) as this run ran its cases."""
        return Result(task.check, task.family, task.seed, self.header.get("device", ""), "abandoned",
                      launch=dict(task.launch or ()), mutant=task.mutant, tool=task.tool,
                      timeout=self.header.get("timeout", DEFAULT_TIMEOUT), trace=self.header.get("trace", True)).repro()

    def end_record(self) -> dict:
        return {"status": f"interrupted by {self.interrupted}" if self.interrupted else "complete",
                "cases_finished": len(self.results),
                "abandoned": [{**t._asdict(), "repro": self.repro(t)} for t in self.abandoned],
                "progress": self.progress(), "worker_seconds": self.workers}

    def close(self) -> None:
        """The closing record, then summary.md, mutants.json and the heat maps beside them."""
        from stress.report import heatmap

        if not self.stream:
            return
        if self.telemetry:
            self._write({"telemetry": self.telemetry})
        if self.header.get("gpus"):
            self._write({"gpus": self.gpu_rows()})
        self._write({"end": self.end_record()})
        self.stream.close()
        self.stream = None
        if self.results:
            heatmap.failures(self.results).save(os.path.join(self.directory, FAILURES_PNG))
        if self.kills:
            heatmap.kills(self.kills).save(os.path.join(self.directory, KILLS_PNG))
            with open(os.path.join(self.directory, MATRIX), "w") as f:
                json.dump([asdict(k) for k in self.kills], f, indent=2)
        with open(os.path.join(self.directory, SUMMARY), "w") as f:
            f.write(self.summary())

    def summary(self) -> str:
        out = ["# specsan stress summary", "",
               "  ".join(f"{k}: {v}" for k, v in self.header.items() if k != "gpus"), ""]
        if self.interrupted:
            out += [f"**Interrupted by {self.interrupted}**: the run stopped early; below is what finished.", ""]
        if self.untrusted_after:
            out += [f"**{self.untrusted_line()}**", ""]
        out += [f"- {line}" for line in self.progress()] + [""]
        if self.results:
            out += self._replay_section()
        if self.hunts:
            out += ["", "## Hunts", ""] + [f"    {line}" for h in self.hunts for line in h.lines()]
        if self.abandoned:
            out += ["", "## Abandoned (running at the signal)", ""]
            out += [f"- {t.check} / {t.family} seed {t.seed}" + (f" mutant {t.mutant}" if t.mutant else "")
                    + f": `{self.repro(t)}`" for t in self.abandoned]
        if self.kills:
            out += self._matrix_section()
        if self.header.get("gpus"):
            out += self._gpu_section()
        if self.telemetry:
            from stress.core import telemetry

            out += ["", "## GPU telemetry", ""] + [f"- {line}" for line in telemetry.lines(self.telemetry)]
        if self.kills is not None:
            out += ["", kill_matrix_verdict(self.kills, self.header.get("device", ""))[0]]
        if "cases" in self.header:
            out += ["", self.closing_line()]
        elif self.interrupted:
            out += ["", f"interrupted by {self.interrupted}: {'; '.join(self.progress())}"]
        return "\n".join(out + [""])

    def _replay_section(self) -> list[str]:
        rows: dict[tuple[str, str], list[Result]] = {}
        for r in self.results:
            rows.setdefault((r.check, r.family), []).append(r)
        out = ["| check | family | passed | failed | not checked | seconds |", "|---|---|---|---|---|---|"]
        for (check, family), rs in sorted(rows.items()):
            out.append(f"| {check} | {family} | {sum(r.verdict == PASS for r in rs)} | {sum(r.failed for r in rs)} "
                       f"| {sum(r.not_checked for r in rs)} | {sum(r.seconds for r in rs):.2f} |")
        out += acceptance_lines(self.results)
        timed = self.results[self.carried:]  # the carried cases' seconds were another run's
        out += time_lines(timed) + worker_lines(self.workers, timed, self.matrix_seconds)
        out += ["", f"![failures by check and family]({FAILURES_PNG})"]
        failures = [r for r in self.results if r.failed]
        if failures:
            out += ["", "## Failures", ""]
            for r in failures:
                out.append(f"- `{r.verdict}` {r.check} / {r.family} ({r.note}) launch {r.launch}")
                out.append(f"  - `{r.repro()}`")
                out += [f"  - {d}" for d in r.details[:6]]
        noted: dict[tuple[str, str], list[Result]] = {}
        for r in self.results:
            if r.verdict == PASS and r.details:
                noted.setdefault((r.check, r.family), []).append(r)
        if noted:  # what passed with a remark: tolerated near ties, benign duplicate stores
            out += ["", "## Passed with notes", ""]
            out += [f"- {c} / {f}: {len(rs)} case(s); seed {rs[0].seed}: {rs[0].details[0]}"
                    for (c, f), rs in sorted(noted.items())]
        skipped = sorted({(r.check, r.family, r.verdict) for r in self.results if r.not_checked})
        if skipped:
            out += ["", "## Not checked", ""] + [f"- {c} / {f}: {v}" for c, f, v in skipped]
        return out

    def _gpu_section(self) -> list[str]:
        from stress.core import telemetry

        columns = ("GPU", "name", "workers", "cases", "passed", "failed", "not checked", "seconds",
                   "kill-matrix cases", *telemetry.GPU_COLUMNS)
        out = ["", "## GPUs", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for g in self.gpu_rows():
            cells = [g["index"], g["name"], g["workers"], g["cases"], g["passed"], g["failed"], g["not_checked"],
                     f"{g['seconds']:.2f}", g["matrix_cases"], *telemetry.gpu_cells(g["telemetry"])]
            out.append("| " + " | ".join(map(str, cells)) + " |")
        return out

    def _matrix_section(self) -> list[str]:
        out = ["", "## Kill matrix", "", f"![kills by mutant and launch shape]({KILLS_PNG})", "",
               "| check | mutant | oracle | status | iterations | path (whole step) | launch / reason |",
               "|---|---|---|---|---|---|---|"]
        for k in self.kills:
            tail = k.reason or (f"`{k.repro}`" if k.repro else (str(k.launch) if k.launch else ""))
            if k.other_failures:
                tail += " " + k.also_failed()
            path = {"-": "-", "killed": f"killed ({k.path_verdict}, {k.path_iterations})"}.get(
                k.path, f"{k.path}: {k.path_detail}")
            out.append(f"| {k.check} | {k.mutant} | {k.oracle} | {k.status} | {k.iterations} | {path} | {tail} |")
        return out


def time_lines(results: list[Result]) -> list[str]:
    """Where the case-seconds went, per check: its cases, their seconds summed over the workers, each phase's
    share of them (``stress.core.types.PHASES``; ``other``: what no phase timed) and
    the slowest case. Phases no case of the run timed get no column."""
    by_check: dict[str, list[Result]] = {}
    for r in results:
        by_check.setdefault(r.check, []).append(r)
    seen = [p for p in PHASES if any(p in r.phases for r in results)]
    if not seen:
        return []
    out = ["", "## Where the time went", "",
           "| check | cases | case-seconds | per case | " + " | ".join(seen) + " | other | slowest |",
           "|---|---|---|---|" + "---|" * (len(seen) + 2)]
    for check, rs in sorted(by_check.items()):
        seconds = sum(r.seconds for r in rs)
        phases = {p: sum(r.phases.get(p, 0.0) for r in rs) for p in seen}
        timed = sum(v for p, v in phases.items() if p not in OUTSIDE + BESIDE)  # not within a case's seconds
        share = [f"{100 * phases[p] / seconds:.0f}%" if seconds else "-" for p in seen]
        other = f"{100 * max(0.0, seconds - timed) / seconds:.0f}%" if seconds else "-"
        slowest = max(rs, key=lambda r: r.seconds)
        out.append(f"| {check} | {len(rs)} | {seconds:.1f} | {1e3 * seconds / len(rs):.1f} ms | " + " | ".join(share)
                   + f" | {other} | {slowest.seconds:.2f} s ({slowest.family}, seed {slowest.seed}) |")
    return out


def in_worker(result: Result) -> float:
    """A case's seconds in its worker: its own, and its waits for the GPU and release of device memory around it."""
    return result.seconds + sum(result.phases.get(p, 0.0) for p in OUTSIDE)


def worker_lines(seconds: dict, results: list[Result], matrix_seconds: float = 0.0) -> list[str]:
    """Where the workers' seconds went (``stress.core.pool.Pool.seconds``), summed over the workers: in cases (the
    replay's, the kill matrix's beside them), waiting for the GPU and releasing its memory around them, starting,
    idle (held back by the parent), in transit, and the rest: no case left to start (the run's tail)."""
    if not any(seconds.values()):
        return []
    replay = sum(r.seconds for r in results)
    around = sum(r.phases.get(p, 0.0) for r in results for p in OUTSIDE)
    parts = {"replay cases": replay, "kill-matrix cases (waits included)": matrix_seconds,
             "waiting for the GPU and releasing memory around replay cases": around,
             "starting (process start to ready)": seconds["starting"],
             "idle before a case (the parent's turnaround)": seconds["idle"],
             "in transit (a case's round trip less its time in the worker)": seconds["transit"]}
    parts["nothing left to start (the run's tail)"] = max(0.0, seconds["held"] - sum(parts.values()))
    beside = (f" Builder processes built cases ahead for {seconds['built_ahead']:.1f} s beside them."
              if seconds.get("built_ahead") else "")
    return ["", f"Worker-seconds: {seconds['held']:.1f} held; "
            + "; ".join(f"{name} {v:.1f} s" for name, v in parts.items() if v or name == "replay cases") + "."
            + beside]


def acceptance_lines(results: list[Result]) -> list[str]:
    """Acceptance per (check, family) over the cases that report it: the engine's accepted drafts per
    verified draft next to the reference's on the same workloads; a family whose rate falls below
    the reference's is flagged."""
    totals: dict[tuple[str, str], list[int]] = {}
    for r in results:
        if "drafted" in r.metrics:
            t = totals.setdefault((r.check, r.family), [0, 0, 0, 0, 0])
            t[0] += 1
            for i, key in enumerate(("drafted", "accepted", "expected_drafted", "expected_accepted"), start=1):
                t[i] += r.metrics[key]
    if not totals:
        return []
    out = ["", "## Acceptance", "", "| check | family | cases | drafts | acceptance | reference | |",
           "|---|---|---|---|---|---|---|"]
    for (check, family), (cases, drafted, accepted, ref_drafted, ref_accepted) in sorted(totals.items()):
        rate = accepted / drafted if drafted else float("nan")
        ref_rate = ref_accepted / ref_drafted if ref_drafted else float("nan")
        flag = "**FALLS**" if ref_drafted and (not drafted or rate < ref_rate) else ""
        out.append(f"| {check} | {family} | {cases} | {drafted} | {rate:.3f} | {ref_rate:.3f} | {flag} |")
    return out
