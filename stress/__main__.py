"""specsan command line: run, repro, trace, list, mutants, tp.

The device is chosen before any kernel module is imported (kernels.runtime decides between
compiled Triton and the interpreter at import time), so this module imports lazily.

Exit status (``EXIT_STATUS``, the end of ``--help``): a usage error is one line on stderr,
``specsan: <argument>: <what is wrong>; <how to fix>``.
"""

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict

from stress.core import interrupts
from stress.core.pool import PoolError
from stress.core.types import DEFAULT_TIMEOUT


class UsageError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""

    def __init__(self, argument: str, problem: str, fix: str):
        super().__init__(f"{argument}: {problem}; {fix}")


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line in the same form as every other usage error."""

    def error(self, message: str):
        head, _, rest = message.partition(": ")
        if head.startswith("argument "):
            argument, problem = head.removeprefix("argument ").split("/")[0], rest
        elif head == "unrecognized arguments":
            argument, problem = rest, "not an argument of this command"
        elif head == "the following arguments are required":
            argument, problem = rest, "missing"
        else:
            argument, problem = self.prog, message
        fix = "" if "; " in problem else f"; see `{self.prog} --help`"
        self.exit(2, f"specsan: {argument}: {problem}{fix}\n")


def _count(minimum: int, maximum: int | None = None, why_maximum: str = ""):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}; pass a number >= {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum} ({why_maximum}), got {value}; "
                                             f"pass a number <= {maximum}")
        return value
    return parse


def _percentage(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be a percentage from 0 to 100, got {text}; 0 means no gate")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}; 0 means no deadline")
    return value


def _launch(text: str) -> dict:
    """``chunk=16,num_warps=4`` -> {"chunk": 16, "num_warps": 4} (the form repro lines print)."""
    launch = {}
    for part in filter(None, text.split(",")):
        key, sep, value = part.partition("=")
        try:
            launch[key.strip()] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected KEY=INT[,KEY=INT...], got {text!r}") from None
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected KEY=INT[,KEY=INT...], got {text!r}")
    return launch


EXIT_STATUS = ("exit status: 0 all good; 1 a failure found (or a planted bug survived); 2 a usage error; 3 nothing "
               "was judged (every case, hunt and mutant not_checked on this device: stderr says why); 130 or 143 "
               "stopped by SIGINT or SIGTERM")

_seed = _count(0, 2**63 - 1, "63 bits, as every case seed")
_AUTO_DEVICE = "cuda when a GPU is visible, else cpu (the Triton interpreter)"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specsan", description="Verify and stress the spec-decode kernels.", epilog=EXIT_STATUS)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(sp, seed=True):
        sp.add_argument("--device", choices=("cpu", "cuda"), help=f"default: {_AUTO_DEVICE}")
        if seed:
            sp.add_argument("--seed", type=_seed, default=0, help="base seed, >= 0 (default: 0)")

    def pool(sp, what, jobs="one per CPU core, up to 16 per GPU"):
        sp.add_argument("--jobs", type=_count(0), help=f"worker processes; 0 runs in this process (default: {jobs})")
        sp.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT,
                        help=f"seconds per {what} case before it is killed as fail:timeout; 0 = none "
                             f"(default: {DEFAULT_TIMEOUT:g})")

    def matrix(sp):
        sp.add_argument("--max-iters", type=_count(1), default=200,
                        help="cases per mutant before it counts as survived (default: 200)")
        sp.add_argument("--by-shape", action="store_true", help="hunt separately in every launch shape of the sweep")
        sp.add_argument("--path", action="store_true",
                        help="add the path column: the whole-path check (engine.step) hunts every other check's bug "
                             "too (default: off; it costs minutes)")
        sp.add_argument("--path-iters", type=_count(1), default=40,
                        help="with --path: cases of the whole-path check per other check's mutant (default: 40)")

    run = sub.add_parser("run", help="replay every (check, family) N times against the references")
    common(run)
    run.add_argument("--iters", type=_count(1), default=10, help="cases per (check, family) (default: 10)")
    run.add_argument("--check", action="append", help="only this check, repeatable (default: every check)")
    run.add_argument("--family", action="append", help="only this family, repeatable (default: every family)")
    run.add_argument("--report", default="reports/latest",
                     help="directory for results.jsonl, summary.md and heat maps; cleared of an earlier "
                          "run's files (default: reports/latest)")
    pool(run, "replayed")
    run.add_argument("--no-trace", action="store_true", help="skip the CPU tracer (races, out-of-bounds, uninit)")
    run.add_argument("--mutant", help="apply this planted bug in every case of the checks that plant it or hunt every "
                                      "bug (engine.step): what it does to the verdicts and the acceptance "
                                      "(default: the production code)")
    run.add_argument("--hunt", action="store_true",
                     help="then hunt the race-prone checks (those with hunt seconds for this device) back to back on "
                          "device-resident cases (see `hunt`), into the same report")
    run.add_argument("--kill-matrix", action="store_true", help="then run the kill matrix into the same report")
    matrix(run)
    run.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")

    repro = sub.add_parser("repro", help="rerun one case and print its first divergences")
    common(repro, seed=False)
    repro.add_argument("check", metavar="CHECK")
    repro.add_argument("family", metavar="FAMILY")
    repro.add_argument("seed", metavar="SEED", type=_seed)
    repro.add_argument("--mutant", help="with this planted bug applied (default: the production code)")
    repro.add_argument("--launch", type=_launch,
                       help="force a launch shape, e.g. chunk=16,num_warps=4 (default: the one the seed draws)")
    repro.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT,
                       help=f"seconds before the case is stopped as fail:timeout; on a GPU the case then runs in "
                            f"a worker process that can be killed; 0 = none, always in this process "
                            f"(default: {DEFAULT_TIMEOUT:g})")
    repro.add_argument("--no-trace", action="store_true", help="skip the CPU tracer")
    repro.add_argument("--sanitizer", choices=("memcheck", "initcheck", "synccheck"),
                       help="run the case in its own process under this compute-sanitizer tool (GPU only) "
                            "(default: the differential run)")

    tr = sub.add_parser("trace", help="trace kernel launches on the CPU (a check's cases, or your own kernel with "
                                      "--kernel): races, out-of-bounds, uninit, order dependence")
    tr.add_argument("check", nargs="?", help="a registered check (or use --kernel)")
    tr.add_argument("family", nargs="?")
    tr.add_argument("seed", nargs="?", type=_seed)
    tr.add_argument("--seeds", type=_count(1), default=3, help="seeds per family without FAMILY SEED (default: 3)")
    tr.add_argument("--mutant", help="with this planted bug applied (default: the production code)")
    tr.add_argument("--kernel", metavar="MODULE:NAME",
                    help="your own @triton.jit kernel (give --grid) or a function that launches kernels; "
                         "MODULE is a dotted module or a .py path (default: none, trace CHECK)")
    tr.add_argument("--grid", help="the kernel's grid: one to three integers, e.g. 8 or 8,4 (default: none; needed "
                                   "for a kernel, not for a launcher)")
    tr.add_argument("--args", metavar="SCRIPT",
                    help="Python file that sets `args` (tuple) and optionally `kwargs` and `unwritten` (dicts) "
                         "(default: none; needed with --kernel)")
    tr.add_argument("--expect-order-dependent", metavar="REASON",
                    help="outputs may differ under another program order for this reason (atomic tickets) "
                         "(default: not expected)")

    lst = sub.add_parser("list", help="show checks, families and mutants")
    lst.add_argument("--json", action="store_true", help="print JSON on stdout and nothing else")

    mut = sub.add_parser("mutants", help="run each planted bug through its check: the kill matrix")
    common(mut)
    mut.add_argument("--check", action="append", help="only this check, repeatable (default: every check)")
    matrix(mut)
    mut.add_argument("--path-only", action="store_true", help="hunt the path column alone (implies --path)")
    mut.add_argument("--mutant", action="append", help="only this planted bug, repeatable (default: every one)")
    pool(mut, "hunted")
    mut.add_argument("--json", action="store_true", help="print the matrix as JSON on stdout and nothing else")
    mut.add_argument("--report", help="also write results.jsonl, mutants.json, summary.md and the heat map to DIR, "
                                      "cleared of an earlier run's files (default: no report)")

    san = sub.add_parser("sanitize", help="replay cases under NVIDIA compute-sanitizer on the GPU, each in its own "
                                          "process: out-of-bounds, uninitialized reads, barrier misuse")
    san.add_argument("--tool", choices=("memcheck", "initcheck", "synccheck"), default="memcheck",
                     help="memcheck: out-of-bounds and misaligned accesses (fail:oob); initcheck: reads of memory "
                          "never written (fail:uninit); synccheck: invalid barriers (fail:sync) (default: memcheck)")
    common(san)
    san.add_argument("--iters", type=_count(1), default=1, help="cases per (check, family) (default: 1)")
    san.add_argument("--check", action="append", help="only this check, repeatable (default: every check)")
    san.add_argument("--family", action="append", help="only this family, repeatable (default: every family)")
    san.add_argument("--mutant", help="apply this planted bug in every case of the checks that plant it "
                                      "(default: the production code)")
    san.add_argument("--report", default="reports/sanitize",
                     help="directory for results.jsonl and summary.md, cleared of an earlier run's files "
                          "(default: reports/sanitize)")
    san.add_argument("--baseline", metavar="DIR",
                     help="a `run` report folder: the summary then gives the slowdown per case against its replay "
                          "of the same checks and families (default: none)")
    pool(san, "sanitized", jobs="one per CPU core: each case is a process of its own")

    hunt = sub.add_parser("hunt", help="launch one check's kernel back to back on device-resident cases, checked "
                                       "on the device in batches, until the first failure or the time is up")
    common(hunt)
    hunt.add_argument("check", metavar="CHECK")
    hunt.add_argument("--family", action="append",
                      help="only this family, repeatable (default: the mutant's families, else all)")
    hunt.add_argument("--seconds", type=_seconds, default=10.0,
                      help="hunting time, compiles excluded; per launch shape with --by-shape (default: 10)")
    hunt.add_argument("--case-seed", type=_seed,
                      help="hammer this one case (with one --family) instead of fresh ones, e.g. from a failure's "
                           "hunt line (default: fresh cases from --seed)")
    hunt.add_argument("--launch", type=_launch, help="only this launch shape, e.g. chunk=4096,num_warps=4 "
                                                     "(default: cycle through the check's sweep)")
    hunt.add_argument("--mutant", help="with this planted bug applied (default: the production code)")
    hunt.add_argument("--launches-per-case", type=_count(1), default=16,
                      help="launches of each fresh case before the next is drawn (default: 16)")
    hunt.add_argument("--cases-per-sync", type=_count(1), default=8,
                      help="cases checked per host synchronization (default: 8)")
    hunt.add_argument("--streams", type=_count(1), default=4,
                      help="CUDA streams a case's launches are spread over (GPU; default: 4, the fastest of 4, 8 "
                           "and 16 on an H200)")
    hunt.add_argument("--load", action="store_true",
                      help="memory traffic on a side stream while the kernel runs (GPU; default: off)")
    hunt.add_argument("--by-shape", action="store_true",
                      help="hunt each launch shape on its own for --seconds; report the time to the first failure "
                           "in each")
    hunt.add_argument("--jobs", type=_count(1), default=1,
                      help="hunt in this many processes at once, each with its own cases (default: 1)")
    hunt.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")

    mt = sub.add_parser("mutate", help="generate mutants of each check's production code and hunt them: the "
                                       "mutation score per check")
    common(mt)
    mt.add_argument("--check", action="append", help="only this check, repeatable (default: every check)")
    mt.add_argument("--operator", action="append",
                    help="only this operator, repeatable (default: all of cmp-flip, const, mask-term, load-other, "
                         "no-int64, barrier, min-max, cdiv-floor, index-swap, where-swap, and-or, default)")
    mt.add_argument("--mutant", action="append", help="only this generated mutant id, repeatable (default: all)")
    mt.add_argument("--survivors", metavar="JSONL",
                    help="only the mutants that survived in this earlier run's mutate.jsonl, e.g. to hunt them "
                         "again with more --iters (default: none)")
    mt.add_argument("--resume", metavar="JSONL",
                    help="take the mutants that this earlier run's mutate.jsonl (or .jsonl.gz) decided (same "
                         "--device, --iters and --seed; their module unchanged since) as they are and hunt only the "
                         "rest, survivors included, e.g. after a time limit stopped it (default: none)")
    mt.add_argument("--iters", type=_count(1), default=3, help="cases per family before a mutant survives (default: 3)")
    mt.add_argument("--sample", type=_count(0), default=0,
                    help="at most this many mutants per check, a deterministic sample by --seed (default: 0 = all)")
    mt.add_argument("--fail-under", type=_percentage, default=0.0,
                    help="exit 1 when a check's score is below this percentage (default: 0, no gate)")
    mt.add_argument("--report", default="reports/mutate",
                    help="directory for mutate.jsonl, one line per decided mutant (default: reports/mutate)")
    mt.add_argument("--hunt-seconds", type=_seconds, default=0.0,
                    help="stop starting cases after this long hunting: what is undecided stays pending for a later "
                         "--resume, and the survivors found so far still meet memcheck and their unit tests, "
                         "which a run stopped by a time limit never reaches (default: 0, no bound)")
    pool(mt, "hunted")
    mt.add_argument("--json", action="store_true", help="print the summary as JSON on stdout and nothing else")

    tp = sub.add_parser("tp", help="TP determinism: N rank processes replay one schedule and compare every step")
    common(tp)
    tp.add_argument("--ranks", type=_count(1), default=2,
                    help="rank processes; 1 runs the production code alone, to exercise the process group "
                         "(default: 2)")
    tp.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                    help="process group: nccl gathers on one GPU per rank, gloo on the CPU; auto: nccl when the "
                         "kernels run on CUDA with a GPU per rank, else gloo (default: auto)")
    tp.add_argument("--mutant", action="append",
                    help="also replay with this planted bug in every rank; it must diverge, repeatable "
                         "(default: production code only)")
    tp.add_argument("--steps", type=_count(1), default=8, help="schedule steps (default: 8)")
    tp.add_argument("--workload", choices=("slots", "engine", "all"), default="all",
                    help="slots: an admission schedule through the slots and draft inputs; engine: the whole "
                         "engine (kernels.spec.engine); all: both (default: all)")
    return p


# ---------------------------------------------------------------- shared pieces


def _select_device(args) -> str:
    if getattr(args, "device", None) == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device", "cuda asked for, but no CUDA device is visible here",
                             "use --device cpu, or leave --device out to pick what is present")
    if getattr(args, "device", None):
        os.environ["SPECSAN_DEVICE"] = args.device
    from kernels import runtime

    return runtime.DEVICE


def _checks(names, argument: str = "--check"):
    from stress import checks

    if not names:
        return list(checks.REGISTRY)
    unknown = [n for n in names if n not in checks.BY_NAME]
    if unknown:
        raise UsageError(argument, f"{unknown[0]!r} is not a registered check",
                         f"known: {', '.join(checks.BY_NAME)}")
    return [checks.BY_NAME[n] for n in dict.fromkeys(names)]


def _family(check, family: str, argument: str = "FAMILY") -> str:
    if family not in check.families:
        raise UsageError(argument, f"{family!r} is not a family of {check.name}", f"known: {', '.join(check.families)}")
    return family


def _mutant(check, name: str | None):
    if name is None:
        return None
    from stress.mutate import operators as mutate_ops

    if name.startswith(mutate_ops.PREFIX):  # a generated mutant (python -m stress mutate) names its own patch
        return mutate_ops.resolve(name)
    if name not in {m.name for m in check.mutants}:
        raise UsageError("--mutant", f"{name!r} is not a planted bug of {check.name}",
                         f"known: {', '.join(m.name for m in check.mutants) or 'none'}")
    return check.mutant(name)


def _launch_in_sweep(check, device: str, launch: dict | None) -> None:
    """A forced ``--launch`` takes only the knobs and values of the check's sweep on ``device`` (a knob left
    out takes the launcher's default): any other value would reach the launcher and be charged to the
    kernel as a crash."""
    if launch is None:
        return
    values: dict[str, set] = {}
    for shape in check.sweep(device) if check.sweep else []:
        for key, value in shape.items():
            values.setdefault(key, set()).add(value)
    for key, value in launch.items():
        if key not in values:
            raise UsageError("--launch", f"{key!r} is not a launch knob of {check.name} on {device}",
                             f"known: {', '.join(sorted(values)) or 'none'}")
        if value not in values[key]:
            raise UsageError("--launch", f"{key}={value} is not in the launch sweep of {check.name} on {device}",
                             f"use {key}={' or '.join(map(str, sorted(values[key])))}, or leave {key} out for the "
                             "launcher's default")


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


NOT_JUDGED = 3  # exit status when nothing was judged: not_checked is never a pass


def _not_judged(reasons: list[str]) -> int:
    """Say on stderr that nothing was judged, and why; the exit status for it."""
    _log(f"specsan: nothing was judged here (exit {NOT_JUDGED}): " + "; ".join(reasons))
    return NOT_JUDGED


class _LogProgress:
    """Progress for logs (CI, tee): a plain line at every tenth of the run or after ``every`` seconds, whichever
    comes first (a tenth of a CPU run can take minutes), with the rate so far and the time left at that
    rate; no carriage returns."""

    def __init__(self, total: int, every: float = 30.0, clock=time.perf_counter):
        self.total, self.done, self.postfix, self.every, self.clock = total, 0, "", every, clock
        self.start = self.last = clock()
        self.step = max(1, total // 10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, text: str) -> None:
        _log(text)

    def set_postfix_str(self, text: str, refresh: bool = False) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if self.done % self.step == 0 or self.done == self.total or now - self.last >= self.every:
            self.last, elapsed = now, now - self.start
            rate = self.done / elapsed if elapsed > 0 else 0.0
            left = f"{(self.total - self.done) / rate:.0f} s left" if rate else "time left unknown"
            self.write(f"[{self.done}/{self.total} cases, {elapsed:.0f} s, {rate:.2f} cases/s, {left}] {self.postfix}")


def _progress(total: int):
    """A live bar on a terminal, plain lines in a log; stderr either way (stdout is for results)."""
    if not sys.stderr.isatty():
        return _LogProgress(total)
    from tqdm import tqdm

    return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)


def _run_report(directory: str, argument: str) -> None:
    """``directory`` must be the report folder of a `specsan run`: a results.jsonl that opens with a run's
    header (its ``iters``; a sanitize run's names its ``tool``)."""
    try:
        with open(os.path.join(directory, "results.jsonl")) as f:
            header = json.loads(f.readline())["run"]
        is_run = "iters" in header and "tool" not in header
    except (OSError, ValueError, KeyError, TypeError):
        is_run = False
    if not is_run:
        raise UsageError(argument, f"{directory} is not the report folder of a `specsan run`",
                         "give the --report DIR of an earlier run (default: reports/latest)")


def _open_report(directory: str | None, header: dict, argument: str = "--report"):
    from stress.report import summary as report

    try:
        return report.Report(directory, header)
    except report.ReportError as exc:
        problem, _, fix = str(exc).partition("; ")
        raise UsageError(argument, problem, fix) from None


def _gpu_header(device: str, jobs: int) -> dict:
    """The header's ``gpus``: every visible GPU and how many of the ``jobs`` workers take it (none on the CPU)."""
    from stress.core import gpus

    return {"gpus": gpus.describe(jobs)} if device == "cuda" else {}


def _gpu_log(header: dict) -> str:
    from stress.core import gpus

    return f"\n  {gpus.line(header['gpus'])}" if header.get("gpus") else ""


def _streamed(report, bar):
    """``on_result`` for a replay: each result into the report, a failure shown with its repro line."""
    def on_result(result):
        report.add(result)
        if result.failed:
            bar.write(f"FAIL {result.verdict} {result.check} {result.family} seed={result.seed}: "
                      f"{result.details[0] if result.details else ''}\n  {result.repro()}")
        bar.set_postfix_str(report.closing_line(), refresh=False)
        bar.update(1)

    return on_result


def _run_matrix(report, selected, device: str, args, jobs: int) -> None:
    """The kill matrix into ``report.kills`` (planned rows first), each decided row streamed and shown."""
    from stress.mutate import kill_matrix as matrix

    def on_row(row):
        report.add_kill(row)
        shape = f" {row.launch}" if args.by_shape and row.launch else ""
        _log(f"  {row.check} {row.mutant}{shape}: {row.status}"
             + (f" after {row.iterations} case(s)" if row.status == "killed" else ""))

    report.kills = []
    matrix.kill_matrix(selected, device, max_iters=args.max_iters, seed=args.seed, jobs=jobs, by_shape=args.by_shape,
                       timeout=args.timeout, on_row=on_row, rows=report.kills,
                       path_iters=args.path_iters if args.path or getattr(args, "path_only", False) else 0,
                       path_only=getattr(args, "path_only", False), on_case=report.add_matrix_case,
                       only=args.mutant if args.command == "mutants" else None)


def _run_into(report, stages) -> interrupts.Interrupted | None:
    """Run ``stages()``, which writes into ``report``; close the report also when a signal (returned)
    or an error (raised again) stopped it, so what finished is kept and the summary says so."""
    start = time.perf_counter()
    stopped = None
    try:
        stages()
    except interrupts.Interrupted as exc:
        stopped = exc
        report.interrupted = exc.name
    except BaseException as exc:
        report.interrupted = f"an error ({type(exc).__name__})"
        raise
    finally:
        report.header["wall_s"] = round(time.perf_counter() - start, 1)
        report.close()
    if stopped:
        _log(f"specsan: interrupted by {stopped.name}: " + "; ".join(report.progress()))
    return stopped


# ---------------------------------------------------------------- commands


def _selected(args) -> list:
    """The checks of ``--check`` (all by default) that plant ``--mutant`` or hunt every bug, after
    checking that each ``--family`` belongs to one of them."""
    selected = _checks(args.check)
    if args.mutant:
        selected = [c for c in selected if c.unreachable is not None or any(m.name == args.mutant for m in c.mutants)]
        if not selected:
            raise UsageError("--mutant", f"{args.mutant!r} is planted in no selected check, and none hunts every bug",
                             "`./specsan list` names the planted bugs of each check")
    known = list(dict.fromkeys(f for c in selected for f in c.families))
    for family in args.family or ():
        if family not in known:
            raise UsageError("--family", f"{family!r} is not a family of the selected checks",
                             f"known: {', '.join(known)}")
    return selected


def cmd_run(args) -> int:
    device = _select_device(args)
    from stress import hunt
    from stress.core import cases, oracle, telemetry, workers
    from stress.mutate import kill_matrix as matrix

    selected = _selected(args)
    tasks = cases.plan(selected, args.family, args.iters, args.seed, args.mutant)
    jobs = workers.default_jobs(device) if args.jobs is None else args.jobs
    header = {"device": device, "iters": args.iters, "seed": args.seed, "cases": len(tasks), "jobs": jobs,
              "timeout": args.timeout, "trace": not args.no_trace, "kill_matrix": args.kill_matrix, "hunt": args.hunt,
              **({"hunts": len(hunt.planned(selected, device))} if args.hunt else {}),
              **({"mutant": args.mutant} if args.mutant else {}),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), **_gpu_header(device, jobs)}
    report = _open_report(args.report, header)

    def stages():
        _log(f"specsan run: {len(tasks)} cases on {device} ({jobs} worker(s)), report in {args.report}"
             + _gpu_log(header))
        with telemetry.envelope(report.telemetry) if device == "cuda" else nullcontext():
            with _progress(len(tasks)) as bar:
                workers.execute(tasks, device, jobs, _streamed(report, bar), args.timeout, trace=not args.no_trace,
                               on_abandoned=report.abandoned.extend)
            if args.hunt:
                def on_hunt(result):
                    report.add_hunt(result)
                    _log("\n".join(result.lines()))

                hunt.run_hunts(selected, device, args.seed, jobs, args.timeout, on_hunt)
            if args.kill_matrix:
                _log(f"kill matrix on {device}:")
                _run_matrix(report, selected, device, args, jobs)

    stopped = _run_into(report, stages)
    failed = report.counts()[1] + sum(h.failed for h in report.hunts)
    matrix_line, all_killed = matrix.verdict(report.kills or [], device)
    if stopped:
        code = stopped.exit_code
    elif failed or not all_killed:
        code = 1
    else:
        code = 0 if report.judged() else _not_judged(report.unjudged_reasons())
    if args.json:
        print(json.dumps({"status": report.end_record()["status"], "exit_code": code, "report": args.report,
                          "device": device, "cases_planned": len(tasks), "cases_finished": len(report.results),
                          **dict(zip(("passed", "failed", "not_checked"), report.counts(), strict=True)),
                          "failures": [{"verdict": r.verdict, "check": r.check, "family": r.family, "seed": r.seed,
                                        "repro": r.repro()} for r in report.results if r.failed],
                          "kill_matrix": None if report.kills is None else [asdict(k) for k in report.kills],
                          "hunts": [hunt.as_record(h) for h in report.hunts]},
                         indent=2))
        return code
    print(f"wall time {report.header['wall_s']:.1f} s; summary in {args.report}/summary.md")
    if report.kills is not None:
        print(matrix_line)
    print(report.closing_line())
    return code


def cmd_repro(args) -> int:
    device = _select_device(args)
    from stress.core import cases, oracle, refusal, workers
    from stress.sanitize import runner as sanitizer

    check = _checks([args.check], "CHECK")[0]
    _family(check, args.family)
    _mutant(check, args.mutant)
    if args.sanitizer and refusal.is_family(check.families[args.family]):
        raise UsageError("--sanitizer", f"{args.family!r} is a refusal family: its cases launch no kernel",
                         "rerun it without --sanitizer")
    _launch_in_sweep(check, device, args.launch)
    case = cases.build_case(check, args.family, args.seed, device, args.launch)
    print(f"{check.name} / {args.family} / seed {args.seed} on {device}: {case.note}")
    print(f"launch: {case.launch or 'default'}")
    for name, value in case.inputs.items():
        shown = f"{tuple(value.shape)} {value.dtype}" if hasattr(value, "shape") else repr(value)
        print(f"  {name}: {shown}")
    forced = tuple(sorted(args.launch.items())) if args.launch is not None else None
    task = cases.Task(args.check, args.family, args.seed, args.mutant, forced, args.sanitizer)
    results = []
    # Here a deadline is an alarm signal; a kernel spinning on a GPU never sees it, so there a
    # deadline runs the case in one worker process the pool can kill (a sanitized case has its own).
    jobs = 1 if device == "cuda" and args.timeout and not args.sanitizer else 0
    if args.sanitizer and (gate := sanitizer.gate(args.sanitizer, device)).state != "caught":
        print(f"verdict: not_checked:{gate.text}")
        return _not_judged([gate.text]) if gate.state == "unavailable" else 1  # blind: the tool missed its control
    workers.execute([task], device, jobs, results.append, args.timeout, trace=not args.no_trace)
    result = results[0]
    print(f"verdict: {result.verdict}")
    for line in result.details:
        print(line)
    if result.not_checked:
        return _not_judged([result.verdict.removeprefix("not_checked:")])
    return 1 if result.failed else 0


def cmd_trace(args) -> int:
    """Print every traced launch of the chosen cases with its findings."""
    os.environ["SPECSAN_DEVICE"] = "cpu"
    from kernels import runtime

    if runtime.DEVICE != "cpu":
        raise UsageError("SPECSAN_DEVICE", "trace needs the CPU interpreter", "run with SPECSAN_DEVICE=cpu")
    from stress.core import cases, oracle, workers
    from stress.core import patches as mutants

    if args.kernel:
        return _trace_own(args)
    if args.check is None:
        raise UsageError("CHECK", "missing", "name a registered check, or your own kernel with --kernel MODULE:NAME "
                                             "--args SCRIPT")
    check = _checks([args.check], "CHECK")[0]
    if (args.family is None) != (args.seed is None):
        raise UsageError("FAMILY SEED", "give both or neither", "e.g. `specsan trace CHECK FAMILY SEED`")
    mutant = _mutant(check, args.mutant)
    if args.family is not None:
        cases = [(_family(check, args.family), args.seed)]
    else:
        cases = [(f, cases.case_seed(0, check.name, f, i)) for f in check.families for i in range(args.seeds)]
    failed = 0
    for family, seed in cases:
        case = cases.build_case(check, family, seed, "cpu")
        if case.refused:
            print(f"{check.name} / {family} / seed {seed} ({case.note}): a refusal case, nothing to trace")
            continue
        with mutants.applied(mutant):
            recording = oracle.trace_case(check, case, seed, permute="always")
        print(f"{check.name} / {family} / seed {seed} ({case.note}) launch {case.launch or 'default'}: "
              f"{recording.verdict}")
        for report in recording.reports:
            print("\n".join("  " + line for line in report.lines()))
        if not recording.reports:
            print("  no kernel launch: nothing to trace")
        failed += recording.verdict != "pass"
    return 1 if failed else 0


def _trace_own(args) -> int:
    """``trace --kernel``: one launch of the user's kernel (or every launch of a launcher)."""
    from stress.trace import own as trace_own

    if args.check or args.mutant:
        raise UsageError("--kernel", "traces your own kernel, not a registered check", "drop CHECK and --mutant")
    if not args.args:
        raise UsageError("--args", "missing: --kernel needs the arguments to launch it with",
                         "give --args SCRIPT, a Python file that sets `args`")
    target = trace_own.load_target(args.kernel)
    arguments = trace_own.load_args(args.args)
    grid = trace_own.parse_grid(args.grid) if args.grid else None
    recording = trace_own.run(target, grid, arguments, permute="always",
                              expected_order_dependence=args.expect_order_dependent)
    for report in recording.reports:
        print("\n".join(report.lines()))
    if not recording.reports:
        print("no kernel launch: nothing to trace")
    print(f"verdict: {recording.verdict}")
    return 0 if recording.verdict == "pass" else 1


def cmd_list(args) -> int:
    from stress import checks

    if args.json:
        print(json.dumps([{"check": c.name, "contract": c.contract, "docs": c.docs, "families": list(c.families),
                           "devices": list(c.devices),
                           "mutants": [{"name": m.name, "description": m.description, "oracles": m.oracles}
                                       for m in c.mutants]} for c in checks.REGISTRY], indent=2))
        return 0
    for c in checks.REGISTRY:
        print(f"{c.name}  [{', '.join(c.devices)}]")
        print(f"  contract: {c.contract}  (more: {c.docs})")
        print(f"  families: {', '.join(c.families)}")
        for m in c.mutants:
            oracles = ", ".join(f"{d}: {o}" for d, o in m.oracles.items())
            print(f"  mutant {m.name}: {m.description}  (killed by {oracles})")
    return 0


def cmd_mutants(args) -> int:
    device = _select_device(args)
    from stress.core import cases, oracle, telemetry, workers
    from stress.mutate import kill_matrix as matrix

    selected = _checks(args.check)
    jobs = workers.default_jobs(device) if args.jobs is None else args.jobs
    header = {"device": device, "max_iters": args.max_iters, "seed": args.seed, "jobs": jobs, "timeout": args.timeout,
              "by_shape": args.by_shape, "started": time.strftime("%Y-%m-%d %H:%M:%S"), **_gpu_header(device, jobs)}
    report = _open_report(args.report, header)

    def stages():
        _log(f"specsan mutants: kill matrix on {device} ({jobs} worker(s))" + _gpu_log(header))
        with telemetry.envelope(report.telemetry) if device == "cuda" else nullcontext():
            _run_matrix(report, selected, device, args, jobs)

    stopped = _run_into(report, stages)
    rows = report.kills
    line, all_killed = matrix.verdict(rows, device)
    if args.json:
        print(json.dumps([asdict(k) for k in rows], indent=2))
        _log(line)
    else:
        print(matrix.table(rows))
        print(line)
    if stopped or not all_killed:
        return stopped.exit_code if stopped else 1
    return 0 if report.judged() else _not_judged(report.unjudged_reasons())


def cmd_sanitize(args) -> int:
    """Cases under compute-sanitizer, after the tool's positive control in the same run."""
    if args.baseline:
        _run_report(args.baseline, "--baseline")
    device = _select_device(args)
    from stress.core import cases, oracle, workers
    from stress.core.types import Result
    from stress.sanitize import runner as sanitizer

    selected = _selected(args)
    tasks = cases.plan(selected, args.family, args.iters, args.seed, args.mutant, tool=args.tool)
    jobs = sanitizer.default_jobs() if args.jobs is None else args.jobs
    outcome = []  # the tool's Gate, once its control has run
    header = {"device": device, "tool": args.tool, "iters": args.iters, "seed": args.seed, "cases": len(tasks),
              "jobs": jobs, **_gpu_header(device, jobs), "timeout": args.timeout,
              **({"mutant": args.mutant} if args.mutant else {}), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    report = _open_report(args.report, header)

    def not_checked(why: str) -> None:
        for t in tasks:
            report.add(Result(t.check, t.family, t.seed, device, f"not_checked:{why}", mutant=t.mutant, tool=t.tool,
                              timeout=args.timeout))

    def stages():
        gate = sanitizer.gate(args.tool, device)
        report.header["control"] = gate.text
        outcome.append(gate)
        if gate.state != "caught":
            not_checked(gate.text)
            return
        _log(f"specsan sanitize: {gate.text}")
        _log(f"specsan sanitize: {len(tasks)} cases under {args.tool} ({jobs} worker(s)), report in {args.report}")
        with _progress(len(tasks)) as bar:
            workers.execute(tasks, device, jobs, _streamed(report, bar), args.timeout, trace=False,
                           on_abandoned=report.abandoned.extend)
        ran = [r for r in report.results if r.verdict == "pass" or r.failed]
        report.header["cost"] = (f"{len(ran)} case(s) sanitized in {time.perf_counter() - started:.1f} s (control "
                                 f"included) with "
                                 f"{jobs} worker(s), {sum(r.seconds for r in ran) / max(1, len(ran)):.1f} s per case "
                                 "(its own process: start, import, compile, the tool)")
        if args.baseline:
            report.header["slowdown"] = sanitizer.slowdown(report.results, args.baseline)

    started = time.perf_counter()
    stopped = _run_into(report, stages)
    if stopped:
        return stopped.exit_code
    gate = outcome[0]
    if gate.state != "caught":
        # Nothing could be checked: not an error for a plain `sanitize` where no sanitizer can run,
        # but it is when cases were asked for by name, or when the tool ran and missed its control.
        print(f"specsan sanitize: not_checked: {gate.text}")
        return 0 if gate.state == "unavailable" and not (args.check or args.family or args.mutant) else 1
    print(f"{report.header.get('cost', '')}; summary in {args.report}/summary.md")
    if args.baseline:
        print(f"slowdown: {report.header['slowdown']}")
    print(report.closing_line())
    return 1 if report.counts()[1] else 0


def cmd_hunt(args) -> int:
    device = _select_device(args)
    from stress import hunt

    check = _checks([args.check], "CHECK")[0]
    if (why := hunt.supports(check, device)) is not None:
        raise UsageError("CHECK", f"{check.name} has no hunt support on {device} ({why})",
                         f"huntable here: {', '.join(hunt.huntable(device)) or 'none'}")
    for family in args.family or ():
        _family(check, family, "--family")
    _mutant(check, args.mutant)
    _launch_in_sweep(check, device, args.launch)
    if args.case_seed is not None and len(args.family or ()) != 1:
        raise UsageError("--case-seed", "names one case, so it needs exactly one --family", "add --family F")
    if args.load and device != "cuda":
        raise UsageError("--load", "background load needs a GPU", "drop --load on the CPU")
    options = dict(seconds=args.seconds, families=args.family, seed=args.seed, case_seed=args.case_seed,
                   launch=args.launch, mutant=args.mutant, launches_per_case=args.launches_per_case,
                   cases_per_sync=args.cases_per_sync, load=args.load, by_shape=args.by_shape, streams=args.streams)
    if args.jobs > 1:
        result = hunt.hunt_processes(check, device, args.jobs, **options)
    else:
        result = hunt.hunt(check, device, **options)
    if args.json:
        print(json.dumps(hunt.as_record(result), indent=2))
    else:
        print("\n".join(result.lines()))
    if result.not_checked:
        return _not_judged([result.verdict.removeprefix("not_checked:")])
    return 1 if result.failed else 0

def cmd_mutate(args) -> int:
    device = _select_device(args)
    from stress.core import cases, oracle, workers
    from stress.mutate import campaign as mutate
    from stress.mutate import operators as mutate_ops

    unknown = [o for o in args.operator or () if o not in mutate_ops.OPERATORS]
    if unknown:
        raise UsageError("--operator", f"{unknown[0]!r} is not an operator",
                         f"known: {', '.join(mutate_ops.OPERATORS)}")
    if args.survivors:
        try:
            earlier = [r["mutant"] for r in map(json.loads, open(args.survivors)) if "mutant" in r]
        except (OSError, ValueError) as exc:
            raise UsageError("--survivors", f"cannot read {args.survivors} ({exc})",
                             "give the mutate.jsonl of an earlier run") from None
        args.mutant = [*(args.mutant or ()), *(r["id"] for r in earlier if r["status"] == "survived")]
        args.check = args.check or sorted({o for r in earlier if r["status"] == "survived" for o in r["owners"]})
        if not args.mutant:
            raise UsageError("--survivors", f"no mutant survived in {args.survivors}", "nothing to hunt again")
    selected = _checks(args.check)
    if args.mutant:
        for name in args.mutant:
            mutate_ops.resolve(name)  # a stale or malformed id is a usage error before anything runs
    resumed = None
    if args.resume:
        try:
            earlier, decided = mutate.earlier_run(args.resume)
        except (OSError, ValueError) as exc:
            raise UsageError("--resume", f"cannot read {args.resume} ({exc})",
                             "give the mutate.jsonl of an earlier run") from None
        ours = {"device": device, "iters": args.iters, "seed": args.seed}
        if differ := [k for k, v in ours.items() if earlier.get(k) != v]:
            raise UsageError("--resume", f"{args.resume} ran with {', '.join(f'{k} {earlier.get(k)}' for k in differ)}",
                             "resume with the same --device, --iters and --seed, or start afresh")
        if os.path.abspath(args.resume) == os.path.abspath(os.path.join(args.report, mutate.Stream.NAME)):
            raise UsageError("--resume", f"{args.resume} is this run's own report, which it overwrites",
                             "copy it elsewhere first, or give another --report")
        resumed = (args.resume, decided)
    jobs = workers.default_jobs(device) if args.jobs is None else args.jobs
    summary = mutate.run(selected, device, iters=args.iters, seed=args.seed, jobs=jobs, timeout=args.timeout,
                         operators=args.operator, only=args.mutant, sample=args.sample, report=args.report, log=_log,
                         resumed=resumed, hunt_seconds=args.hunt_seconds)
    rows, stopped = summary.pop("rows"), summary.pop("exit_code")
    out = print if not args.json else _log
    if stopped:
        out(f"INTERRUPTED by {summary['interrupted']}: the scores below count the mutants decided so far")
    out(mutate.score_table("check", summary["by_check"]))
    out("")
    out(mutate.score_table("module", summary["by_module"]))
    for line in mutate.survivor_lines(rows, device, args.iters):
        out(line)
    entries = {"STALE equivalence entry (matches no generated mutant)": summary["stale_equivalences"],
               "STALE survivor explanation (matches no generated mutant)": summary["stale_explanations"],
               f"REFUTED survivor explanation (killed on {device}: remove it)": summary["refuted_explanations"]}
    for what, listed in entries.items():
        for entry in listed:
            out(f"{what}: {entry['target']} {entry['operator']}: {entry['old'].strip()!r} -> {entry['new'].strip()!r}")
    equivalent = sum(g["equivalent"] + g["reasoned"] for g in summary["by_check"].values())
    killed = sum(g["killed"] + g["hang"] for g in summary["by_check"].values())
    judged = killed + sum(g["survived"] for g in summary["by_check"].values())
    by_tests = sum(r.verdict == mutate.UNIT_TEST_VERDICT for r in rows)
    by_memcheck = sum(r.status == "killed" and any(f.startswith("memcheck:") for f in r.families)
                      and r.verdict != mutate.UNIT_TEST_VERDICT for r in rows)
    out(f"{killed} of {judged} non-equivalent mutants killed on {device} "
        f"({sum(g['hang'] for g in summary['by_check'].values())} of them as a hang, fail:timeout; {by_memcheck} by "
        f"memcheck after every family; {by_tests} by a check's unit tests; the rest by its families); "
        f"{equivalent} equivalent (same TTIR/bytecode, or reasoned in stress/equivalent_mutants.toml); "
        f"{summary['wall_s']:.0f} s")
    if survivors := [r for r in rows if r.status == "survived"]:
        elsewhere = sum(not r.explained and bool(r.killed_elsewhere) for r in survivors)
        unexplained = sum(not r.explained and not r.killed_elsewhere for r in survivors)
        out(f"{len(survivors)} survivor(s): {len(survivors) - unexplained - elsewhere} explained in "
            f"stress/surviving_mutants.toml, {elsewhere} killed on another device by a kept record in records/ "
            f"(counted all the same), {unexplained} unexplained")
    if pending := sum(g["pending"] for g in summary["by_check"].values()):
        out(f"{pending} mutant(s) undecided: the run stopped before their hunts ended (neither killed nor survived)")
    if args.json:
        print(json.dumps(summary, indent=2))
    low = [name for name, g in summary["by_check"].items() if g["score"] is not None and g["score"] < args.fail_under]
    return stopped or (1 if low or any(entries.values()) else 0)


def cmd_tp(args) -> int:
    _select_device(args)
    from stress import tp

    # The production code always runs first: it must agree; each named mutant must diverge.
    scenarios = (None, *dict.fromkeys(args.mutant or ()))
    ok = True
    for workload in tp.WORKLOADS if args.workload == "all" else (args.workload,):
        outcomes = tp.run_ranks(args.ranks, mutants=scenarios, seed=args.seed, num_steps=args.steps,
                                workload=workload, backend=args.backend)
        for name, outcome in outcomes.items():
            as_expected = outcome.agreed == (name is None)
            ok &= as_expected
            verdict = "as expected" if as_expected else f"UNEXPECTED: must {'diverge' if name else 'agree'}"
            print(f"[{workload}] {name or 'production code'}: {outcome.message}  [{verdict}]")
        first = next(iter(outcomes.values()))
        print(f"[{workload}] {args.ranks} rank(s) over {first.backend} in {first.seconds:.1f} s: "
              + ("; ".join(first.ranks) or "no rank reported its device"))
    return 0 if ok else 1


COMMANDS = {"run": cmd_run, "repro": cmd_repro, "trace": cmd_trace, "list": cmd_list, "mutants": cmd_mutants,
            "hunt": cmd_hunt, "tp": cmd_tp, "sanitize": cmd_sanitize, "mutate": cmd_mutate}


def main(argv=None) -> int:
    # Signals are routed before anything slow is imported, so even an early Ctrl-C exits cleanly.
    with interrupts.handled():
        try:
            args = _parser().parse_args(argv)
            return COMMANDS[args.command](args)
        except UsageError as exc:
            _log(f"specsan: {exc}")
            return 2
        except ValueError as exc:  # a launcher-style "argument: problem; fix" from below the command line
            _log(f"specsan: {exc}")
            return 2
        except interrupts.Interrupted as exc:
            _log(f"specsan: interrupted by {exc.name}")
            return exc.exit_code
        except PoolError as exc:  # e.g. no GPU for a worker: the harness cannot run here
            _log(f"specsan: {exc}")
            return 1
        except BrokenPipeError:  # output piped into `head` and closed early
            sys.stderr.close()
            return 0


if __name__ == "__main__":
    sys.exit(main())
