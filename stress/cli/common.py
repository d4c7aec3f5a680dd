"""What the commands share: argument types, parent parsers of shared options, usage errors, progress, reports."""

import argparse
import json
import os
import sys
import time

from stress.core.types import DEFAULT_TIMEOUT


class UsageError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""

    def __init__(self, argument: str, problem: str, fix: str):
        super().__init__(f"{argument}: {problem}; {fix}")


class Parser(argparse.ArgumentParser):
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


def count(minimum: int, maximum: int | None = None, why_maximum: str = ""):
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


def percentage(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be a percentage from 0 to 100, got {text}; 0 means no gate")
    return value


def builder_count(text: str) -> int | str:
    """``--builders``: ``auto`` or a whole number >= 0."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return count(0)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; or auto (one per core the workers leave)") from None


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}; 0 means no deadline")
    return value


def launch_shape(text: str) -> dict:
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


seed_value = count(0, 2**63 - 1, "63 bits, as every case seed")


AUTO_DEVICE = "cuda when a GPU is visible, else cpu (the Triton interpreter)"


def select_device(args) -> str:
    if getattr(args, "device", None) == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device", "cuda asked for, but no CUDA device is visible here",
                             "use --device cpu, or leave --device out to pick what is present")
    if getattr(args, "device", None):
        os.environ["SPECSAN_DEVICE"] = args.device
    from kernels import runtime

    return runtime.DEVICE


def checks_named(names, argument: str = "--check"):
    from stress import checks

    if not names:
        return list(checks.REGISTRY)
    unknown = [n for n in names if n not in checks.BY_NAME]
    if unknown:
        raise UsageError(argument, f"{unknown[0]!r} is not a registered check",
                         f"known: {', '.join(checks.BY_NAME)}")
    return [checks.BY_NAME[n] for n in dict.fromkeys(names)]


def family_named(check, family: str, argument: str = "FAMILY") -> str:
    if family not in check.families:
        raise UsageError(argument, f"{family!r} is not a family of {check.name}", f"known: {', '.join(check.families)}")
    return family


def generated_mutant(name: str | None):
    """The mutant a generated id (``mutate``'s ``gen:...``, which names its own patch) rebuilds from the current
    source, handed to every case as ``Task.patched``; None for a planted bug's name. A stale id is a usage error."""
    from stress.mutate import operators as mutate_ops

    if not name or not name.startswith(mutate_ops.PREFIX):
        return None
    try:
        return mutate_ops.resolve(name)
    except ValueError as exc:
        raise UsageError("--mutant", str(exc).removeprefix("--mutant: "), "rerun `mutate` for current ids") from None


def mutants_named(selected, names) -> None:
    """Each of ``names`` (``--mutant``) is a generated id or a planted bug of a selected check (a whole-path check
    takes any check's): a misspelt name is a usage error, not a run that judges nothing."""
    from stress import checks

    owners = checks.REGISTRY if any(c.whole_path for c in selected) else selected
    known = {m.name for c in owners for m in c.mutants}
    for name in names or ():
        if not generated_mutant(name) and name not in known:
            raise UsageError("--mutant", f"{name!r} is not a planted bug of the selected checks",
                             "`./specsan list` shows each check's")


def planted_mutant(check, name: str | None):
    if name is None:
        return None
    if generated := generated_mutant(name):
        return generated
    if name not in {m.name for m in check.mutants}:
        raise UsageError("--mutant", f"{name!r} is not a planted bug of {check.name}",
                         f"known: {', '.join(m.name for m in check.mutants) or 'none'}")
    return check.mutant(name)


def launch_in_sweep(check, device: str, launch: dict | None) -> None:
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


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


NOT_JUDGED = 3  # exit status when nothing was judged: not_checked is never a pass


def not_judged(reasons: list[str]) -> int:
    """Say on stderr that nothing was judged, and why; the exit status for it."""
    log(f"specsan: nothing was judged here (exit {NOT_JUDGED}): " + "; ".join(reasons))
    return NOT_JUDGED


class LogProgress:
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
        log(text)

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


def progress(total: int):
    """A live bar on a terminal, plain lines in a log; stderr either way (stdout is for results)."""
    if not sys.stderr.isatty():
        return LogProgress(total)
    from tqdm import tqdm

    return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)


def run_report(directory: str, argument: str) -> None:
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


def open_report(directory: str | None, header: dict, argument: str = "--report"):
    from stress.report import summary as report

    try:
        return report.Report(directory, header)
    except report.ReportError as exc:
        problem, _, fix = str(exc).partition("; ")
        raise UsageError(argument, problem, fix) from None


def gpu_header(device: str, jobs: int) -> dict:
    """The header's ``gpus``: every visible GPU and how many of the ``jobs`` workers take it (none on the CPU)."""
    from stress.core import gpus

    return {"gpus": gpus.describe(jobs)} if device == "cuda" else {}


def gpu_log(header: dict) -> str:
    from stress.core import gpus

    return f"\n  {gpus.line(header['gpus'])}" if header.get("gpus") else ""


def selected_checks(args) -> list:
    """The checks of ``--check`` (all by default) that plant ``--mutant`` or hunt every bug, after
    checking that each ``--family`` belongs to one of them."""
    from stress.mutate import operators as mutate_ops

    selected = checks_named(args.check)
    # a generated id (resolved once by the command) runs in every selected check
    if args.mutant and not args.mutant.startswith(mutate_ops.PREFIX):
        selected = [c for c in selected if c.whole_path or any(m.name == args.mutant for m in c.mutants)]
        if not selected:
            raise UsageError("--mutant", f"{args.mutant!r} is planted in no selected check, and none hunts every bug",
                             "`./specsan list` names the planted bugs of each check")
    known = list(dict.fromkeys(f for c in selected for f in c.families))
    for family in args.family or ():
        if family not in known:
            raise UsageError("--family", f"{family!r} is not a family of the selected checks",
                             f"known: {', '.join(known)}")
    return selected


def register_implementations(values: list[str] | None) -> None:
    """``--impl`` values checked (the check exists, the target imports, its choices are the check's) and handed
    to every process this run starts. A list without values leaves an inherited registration in place."""
    if not values or isinstance(values, bool):
        return
    from stress import checks
    from stress.core import impl

    registrations = [impl.parse(v) for v in values]
    seen = set()
    for registration in registrations:
        if registration.check in seen:
            raise UsageError("--impl", f"{registration.check} is registered twice", "give one --impl per check")
        seen.add(registration.check)
        impl.validated(registration, impl.launcher_check(checks.get(registration.check), checks.REGISTRY))
    impl.register(registrations)


def impl_header() -> dict:
    """The implementations a report judged, for its header (absent when only the suite's own were)."""
    from stress.core import impl

    registered = impl.registered()
    return {"impl": [r.spec() for r in registered.values()]} if registered else {}


def device_and_seed(seed: bool = True) -> argparse.ArgumentParser:
    """The parent parser of --device (and --seed)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--device", choices=("cpu", "cuda"), help=f"default: {AUTO_DEVICE}")
    if seed:
        parent.add_argument("--seed", type=seed_value, default=0, help="base seed, >= 0 (default: 0)")
    return parent


def pool_options(what: str, jobs: str = "one per CPU core; on a GPU one per 2 cores, 8 per GPU at most"
                 ) -> argparse.ArgumentParser:
    """The parent parser of --jobs and --timeout, for a command whose cases are ``what``."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--jobs", type=count(0), help=f"worker processes; 0 runs in this process (default: {jobs})")
    parent.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT,
                        help=f"seconds per {what} case before it is killed as fail:timeout; 0 = none "
                             f"(default: {DEFAULT_TIMEOUT:g})")
    return parent


IMPLEMENTATIONS = argparse.ArgumentParser(add_help=False)
IMPLEMENTATIONS.add_argument(
    "--impl", action="append", default=[], metavar="CHECK=MODULE:FUNCTION[@CHOICE,...]",
    help="judge this implementation in place of CHECK's production launcher, in every worker and repro line; @ "
         "declares choices of the check's contract profile (list --impl shows them); repeatable, one per check "
         "(default: the suite's own launchers)")

MATRIX = argparse.ArgumentParser(add_help=False)
MATRIX.add_argument("--max-iters", type=count(1), default=200,
                    help="cases per mutant before it counts as survived (default: 200)")
MATRIX.add_argument("--by-shape", action="store_true", help="hunt separately in every launch shape of the sweep")
MATRIX.add_argument("--path", action="store_true",
                    help="add the path column: the whole-path check (engine.step) hunts every other check's bug "
                         "too (default: off; it costs minutes)")
MATRIX.add_argument("--path-iters", type=count(1), default=40,
                    help="with --path: cases of the whole-path check per other check's mutant (default: 40)")

CHECKS = argparse.ArgumentParser(add_help=False)
CHECKS.add_argument("--check", action="append", help="only this check, repeatable (default: every check)")

FAMILIES = argparse.ArgumentParser(add_help=False)
FAMILIES.add_argument("--family", action="append", help="only this family, repeatable (default: every family)")
