"""The command line of sanitize: cases under compute-sanitizer."""

import time

from stress.cli.common import (
    CHECKS,
    FAMILIES,
    IMPLEMENTATIONS,
    count,
    device_and_seed,
    gpu_header,
    impl_header,
    log,
    open_report,
    pool_options,
    progress,
    run_report,
    select_device,
    selected_checks,
)
from stress.cli.run import run_into, streamed
from stress.core.types import not_checked


def add_parsers(sub) -> None:
    san = sub.add_parser(
        "sanitize", parents=[device_and_seed(), IMPLEMENTATIONS, CHECKS, FAMILIES,
                             pool_options("sanitized", jobs="one per CPU core: each case is a process of its own")],
        help="replay cases under NVIDIA compute-sanitizer on the GPU, each in its own "
             "process: out-of-bounds, uninitialized reads, barrier misuse")
    san.add_argument("--tool", choices=("memcheck", "initcheck", "synccheck"), default="memcheck",
                     help="memcheck: out-of-bounds and misaligned accesses (fail:oob); initcheck: reads of memory "
                          "never written (fail:uninit); synccheck: invalid barriers (fail:sync) (default: memcheck)")
    san.add_argument("--iters", type=count(1), default=1, help="cases per (check, family) (default: 1)")
    san.add_argument("--mutant", help="apply this planted bug in every case of the checks that plant it "
                                      "(default: the production code)")
    san.add_argument("--report", default="reports/sanitize",
                     help="directory for results.jsonl and summary.md, cleared of an earlier run's files "
                          "(default: reports/sanitize)")
    san.add_argument("--baseline", metavar="DIR",
                     help="a `run` report folder: the summary then gives the slowdown per case against its replay "
                          "of the same checks and families (default: none)")



def cmd_sanitize(args) -> int:
    """Cases under compute-sanitizer, after the tool's positive control in the same run."""
    if args.baseline:
        run_report(args.baseline, "--baseline")
    device = select_device(args)
    from stress.core import cases, workers
    from stress.core.types import Result
    from stress.sanitize import runner as sanitizer

    selected = selected_checks(args)
    tasks = cases.plan(selected, args.family, args.iters, args.seed, args.mutant, tool=args.tool)
    jobs = sanitizer.default_jobs() if args.jobs is None else args.jobs
    outcome = []  # the tool's Gate, once its control has run
    header = {**impl_header(), "device": device,
              "tool": args.tool, "iters": args.iters, "seed": args.seed, "cases": len(tasks),
              "jobs": jobs, **gpu_header(device, jobs), "timeout": args.timeout,
              **({"mutant": args.mutant} if args.mutant else {}), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    report = open_report(args.report, header)

    def none_checked(why: str) -> None:
        for t in tasks:
            report.add(Result(t.check, t.family, t.seed, device, not_checked(why), mutant=t.mutant, tool=t.tool,
                              timeout=args.timeout))

    def stages():
        gate = sanitizer.gate(args.tool, device)
        report.header["control"] = gate.text
        outcome.append(gate)
        if gate.state != "caught":
            none_checked(gate.text)
            return
        log(f"specsan sanitize: {gate.text}")
        log(f"specsan sanitize: {len(tasks)} cases under {args.tool} ({jobs} worker(s)), report in {args.report}")
        with progress(len(tasks)) as bar:
            workers.execute(tasks, device, jobs, streamed(report, bar), args.timeout, trace=False,
                           on_abandoned=report.abandoned.extend, judge=sanitizer.run_task)
        ran = [r for r in report.results if r.verdict == "pass" or r.failed]
        report.header["cost"] = (f"{len(ran)} case(s) sanitized in {time.perf_counter() - started:.1f} s (control "
                                 f"included) with "
                                 f"{jobs} worker(s), {sum(r.seconds for r in ran) / max(1, len(ran)):.1f} s per case "
                                 "(its own process: start, import, compile, the tool)")
        if args.baseline:
            report.header["slowdown"] = sanitizer.slowdown(report.results, args.baseline)

    started = time.perf_counter()
    stopped = run_into(report, stages)
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
