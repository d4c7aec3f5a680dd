"""specsan command line: run, repro, trace, list, mutants, tp.

The device is chosen before any kernel module is imported (kernels.runtime decides between
compiled Triton and the interpreter at import time), so this module imports lazily.
"""

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specsan", description="Verify and stress the spec-decode kernels.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp, seed=True):
        sp.add_argument("--device", choices=("cpu", "cuda"),
                        help="default: cuda when present, else the CPU interpreter")
        if seed:
            sp.add_argument("--seed", type=int, default=0, help="base seed (default 0)")

    run = sub.add_parser("run", help="replay every (check, family) N times against the references")
    common(run)
    run.add_argument("--iters", type=int, default=10, help="cases per (check, family)")
    run.add_argument("--check", action="append", help="only this check (repeatable)")
    run.add_argument("--family", action="append", help="only this family (repeatable)")
    run.add_argument("--report", default="reports/latest", help="directory for results.jsonl and summary.md")
    run.add_argument("--jobs", type=int,
                     help="worker processes (default: CPU cores, or up to 8 per GPU); 0 = in process")
    run.add_argument("--timeout", type=float, default=300, help="seconds per case before fail:timeout (0 = none)")
    run.add_argument("--no-trace", action="store_true", help="skip the CPU tracer (races, out-of-bounds, uninit)")

    repro = sub.add_parser("repro", help="rerun one case and print its first divergences")
    common(repro, seed=False)
    repro.add_argument("check")
    repro.add_argument("family")
    repro.add_argument("seed", type=int)
    repro.add_argument("--mutant", help="with this planted bug applied")
    repro.add_argument("--no-trace", action="store_true", help="skip the CPU tracer")

    tr = sub.add_parser("trace", help="trace kernel launches on the CPU (a check's cases, or your own kernel with "
                                      "--kernel): races, out-of-bounds, uninit, order dependence")
    tr.add_argument("check", nargs="?", help="a registered check (or use --kernel)")
    tr.add_argument("family", nargs="?")
    tr.add_argument("seed", nargs="?", type=int)
    tr.add_argument("--seeds", type=int, default=3, help="seeds per family without FAMILY SEED (default 3)")
    tr.add_argument("--mutant", help="with this planted bug applied")
    tr.add_argument("--kernel", metavar="MODULE:NAME",
                    help="your own @triton.jit kernel (give --grid) or a function that launches kernels; "
                         "MODULE is a dotted module or a .py path")
    tr.add_argument("--grid", help="the kernel's grid: one to three integers, e.g. 8 or 8,4")
    tr.add_argument("--args", metavar="SCRIPT",
                    help="Python file that sets `args` (tuple) and optionally `kwargs` and `unwritten` (dicts)")
    tr.add_argument("--expect-order-dependent", metavar="REASON",
                    help="outputs may differ under another program order for this reason (atomic tickets)")

    lst = sub.add_parser("list", help="show checks, families and mutants")
    lst.add_argument("--json", action="store_true")

    mut = sub.add_parser("mutants", help="run each planted bug through its check: the kill matrix")
    common(mut)
    mut.add_argument("--check", action="append", help="only this check (repeatable)")
    mut.add_argument("--max-iters", type=int, default=200, help="cases per mutant before it counts as survived")
    mut.add_argument("--by-shape", action="store_true", help="hunt separately in every launch shape of the sweep")
    mut.add_argument("--jobs", type=int, help="worker processes (default as for run); 0 = in process")
    mut.add_argument("--json", action="store_true", help="print the matrix as JSON")
    mut.add_argument("--report", help="also write the matrix to DIR/mutants.json")

    tp = sub.add_parser("tp", help="TP determinism: N rank processes replay one schedule and compare every step")
    common(tp)
    tp.add_argument("--ranks", type=int, default=2, help="rank processes (default 2)")
    tp.add_argument("--mutant", action="append",
                    help="also replay with this planted bug in every rank; it must diverge (repeatable)")
    tp.add_argument("--steps", type=int, default=8, help="schedule steps (default 8)")
    return p


def _select_device(args) -> str:
    if getattr(args, "device", None):
        os.environ["SPECSAN_DEVICE"] = args.device
    from kernels import runtime

    return runtime.DEVICE


def _checks(names):
    from stress import checks

    if not names:
        return list(checks.REGISTRY)
    return [checks.get(n) for n in names]


class _LogProgress:
    """Progress for logs (CI, tee): one plain line every tenth of the run, no carriage returns."""

    def __init__(self, total: int):
        self.total, self.done, self.postfix, self.start = total, 0, "", time.perf_counter()
        self.step = max(1, total // 10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def set_postfix_str(self, text: str, refresh: bool = False) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done % self.step == 0 or self.done == self.total:
            elapsed = time.perf_counter() - self.start
            self.write(f"[{self.done}/{self.total} cases, {elapsed:.0f} s] {self.postfix}")


def _progress(total: int):
    """A live bar on a terminal, plain lines in a log."""
    if not sys.stderr.isatty():
        return _LogProgress(total)
    from tqdm import tqdm

    return tqdm(total=total, unit="case", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)


def cmd_run(args) -> int:
    device = _select_device(args)
    from stress import runner, telemetry

    if args.iters < 1:
        raise SystemExit("--iters: must be at least 1")
    selected = _checks(args.check)
    known = {f for c in selected for f in c.families}
    for family in args.family or ():
        if family not in known:
            raise SystemExit(f"--family {family}: no selected check has it; known: {', '.join(sorted(known))}")
    tasks = runner.plan(selected, args.family, args.iters, args.seed)
    jobs = runner.default_jobs(device) if args.jobs is None else args.jobs
    header = {"device": device, "iters": args.iters, "seed": args.seed, "cases": len(tasks), "jobs": jobs,
              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    report = runner.Report(args.report, header)
    print(f"specsan run: {len(tasks)} cases on {device} ({jobs} worker(s)), report in {args.report}", flush=True)
    start = time.perf_counter()
    with _progress(len(tasks)) as bar:
        def on_result(result):
            report.add(result)
            if result.failed:
                bar.write(f"FAIL {result.verdict} {result.check} {result.family} seed={result.seed}: "
                          f"{result.details[0] if result.details else ''}\n  {result.repro()}")
            bar.set_postfix_str(report.closing_line(), refresh=False)
            bar.update(1)

        with telemetry.envelope(report.telemetry) if device == "cuda" else nullcontext():
            runner.execute(tasks, device, jobs, on_result, args.timeout, trace=not args.no_trace)
    report.header["wall_s"] = round(time.perf_counter() - start, 1)
    report.close()
    print(f"wall time {report.header['wall_s']:.1f} s; summary in {args.report}/summary.md")
    print(report.closing_line())
    return 1 if report.counts()[1] else 0


def cmd_repro(args) -> int:
    device = _select_device(args)
    from stress import checks, runner

    check = checks.get(args.check)
    case = runner.build_case(check, args.family, args.seed, device)
    print(f"{check.name} / {args.family} / seed {args.seed} on {device}: {case.note}")
    print(f"launch: {case.launch or 'default'}")
    for name, value in case.inputs.items():
        shown = f"{tuple(value.shape)} {value.dtype}" if hasattr(value, "shape") else repr(value)
        print(f"  {name}: {shown}")
    result = runner.run_case(runner.Task(args.check, args.family, args.seed, args.mutant), device,
                             trace=not args.no_trace)
    print(f"verdict: {result.verdict}")
    for line in result.details:
        print(line)
    return 1 if result.failed else 0


def cmd_trace(args) -> int:
    """Print every traced launch of the chosen cases with its findings."""
    os.environ["SPECSAN_DEVICE"] = "cpu"
    from kernels import runtime

    if runtime.DEVICE != "cpu":
        raise SystemExit("trace: needs the CPU interpreter; run with SPECSAN_DEVICE=cpu")
    from stress import checks, mutants, runner

    if args.kernel:
        return _trace_own(args)
    if args.check is None:
        raise SystemExit("trace: name a CHECK, or your own kernel with --kernel MODULE:NAME --args SCRIPT")
    check = checks.get(args.check)
    if (args.family is None) != (args.seed is None):
        raise SystemExit("trace: give both FAMILY and SEED, or neither")
    mutant = check.mutant(args.mutant) if args.mutant else None
    if args.family is not None:
        cases = [(args.family, args.seed)]
    else:
        cases = [(f, runner.case_seed(0, check.name, f, i)) for f in check.families for i in range(args.seeds)]
    failed = 0
    for family, seed in cases:
        case = runner.build_case(check, family, seed, "cpu")
        with mutants.applied(mutant):
            recording = runner.trace_case(check, case, seed, permute="always")
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
    from stress import trace_own

    if args.check or args.mutant:
        raise SystemExit("trace --kernel: traces your own kernel; drop CHECK and --mutant")
    if not args.args:
        raise SystemExit("trace --kernel: give --args SCRIPT, a Python file that sets `args`")
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
        print(json.dumps([{"check": c.name, "families": list(c.families), "devices": list(c.devices),
                           "mutants": [{"name": m.name, "description": m.description, "oracles": m.oracles}
                                       for m in c.mutants]} for c in checks.REGISTRY], indent=2))
        return 0
    for c in checks.REGISTRY:
        print(f"{c.name}  [{', '.join(c.devices)}]")
        print(f"  families: {', '.join(c.families)}")
        for m in c.mutants:
            oracles = ", ".join(f"{d}: {o}" for d, o in m.oracles.items())
            print(f"  mutant {m.name}: {m.description}  (killed by {oracles})")
    return 0


def cmd_mutants(args) -> int:
    device = _select_device(args)
    from stress import matrix, runner

    jobs = runner.default_jobs(device) if args.jobs is None else args.jobs
    rows = matrix.kill_matrix(_checks(args.check), device, max_iters=args.max_iters, seed=args.seed, jobs=jobs,
                              by_shape=args.by_shape,
                              on_row=None if args.json else lambda k: print(f"  {k.mutant}: {k.status}", flush=True))
    if args.report:
        os.makedirs(args.report, exist_ok=True)
        with open(os.path.join(args.report, "mutants.json"), "w") as f:
            json.dump([asdict(k) for k in rows], f, indent=2)
    if args.json:
        print(json.dumps([asdict(k) for k in rows], indent=2))
    else:
        print(matrix.table(rows))
    # With --by-shape a mutant has one row per launch shape; it is killed when any shape kills it
    # (a race can be invisible in some shapes, e.g. one warp, and certain in others).
    status: dict[tuple[str, str], set[str]] = {}
    for k in rows:
        status.setdefault((k.check, k.mutant), set()).add(k.status)
    checkable = [s for s in status.values() if s != {"not_checked"}]
    killed = sum("killed" in s for s in checkable)
    print(f"{killed} of {len(checkable)} checkable mutants killed on {device}; "
          f"{len(status) - len(checkable)} not checked here")
    return 0 if killed == len(checkable) else 1


def cmd_tp(args) -> int:
    _select_device(args)
    from stress import tp

    # The production code always runs first: it must agree; each named mutant must diverge.
    scenarios = (None, *dict.fromkeys(args.mutant or ()))
    outcomes = tp.run_ranks(args.ranks, mutants=scenarios, seed=args.seed, num_steps=args.steps)
    ok = True
    for name, outcome in outcomes.items():
        as_expected = outcome.agreed == (name is None)
        ok &= as_expected
        verdict = "as expected" if as_expected else f"UNEXPECTED: must {'diverge' if name else 'agree'}"
        print(f"{name or 'production code'}: {outcome.message}  [{verdict}]")
    print(f"{args.ranks} ranks in {next(iter(outcomes.values())).seconds:.1f} s")
    return 0 if ok else 1


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        commands = {"run": cmd_run, "repro": cmd_repro, "trace": cmd_trace, "list": cmd_list, "mutants": cmd_mutants,
                    "tp": cmd_tp}
        return commands[args.command](args)
    except ValueError as exc:
        print(f"specsan: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and closed early
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
