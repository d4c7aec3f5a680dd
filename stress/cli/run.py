"""The command line of run and repro: replay cases against the references; rerun one."""

import json
import time
from contextlib import nullcontext
from dataclasses import asdict

from stress.cli.common import (
    CHECKS,
    FAMILIES,
    IMPLEMENTATIONS,
    MATRIX,
    UsageError,
    builder_count,
    checks_named,
    count,
    device_and_seed,
    family_named,
    generated_mutant,
    gpu_header,
    gpu_log,
    impl_header,
    launch_in_sweep,
    launch_shape,
    log,
    mutants_named,
    not_judged,
    open_report,
    planted_mutant,
    pool_options,
    progress,
    seconds,
    seed_value,
    select_device,
    selected_checks,
)
from stress.core import interrupts
from stress.core.types import DEFAULT_TIMEOUT, NOT_CHECKED, kill_matrix_verdict
from stress.report import resume


def add_parsers(sub) -> None:
    run = sub.add_parser(
        "run", parents=[device_and_seed(), pool_options("replayed"), MATRIX, IMPLEMENTATIONS, CHECKS, FAMILIES],
        help="replay every (check, family) N times against the references")
    run.add_argument("--iters", type=count(1), default=10, help="cases per (check, family) (default: 10)")
    run.add_argument("--report", default="reports/latest",
                     help="directory for results.jsonl, summary.md and heat maps; cleared of an earlier "
                          "run's files (default: reports/latest)")
    run.add_argument("--no-trace", action="store_true", help="skip the CPU tracer (races, out-of-bounds, uninit)")
    run.add_argument("--mutant", help="apply this planted bug in every case of the checks that plant it or hunt every "
                                      "bug (engine.step): what it does to the verdicts and the acceptance; a "
                                      "generated id (gen:..., from mutate) in every selected check "
                                      "(default: the production code)")
    run.add_argument("--hunt", action="store_true",
                     help="first hunt the race-prone checks (those with hunt seconds for this device) back to back on "
                          "device-resident cases (see `hunt`), into the same report")
    run.add_argument("--kill-matrix", action="store_true",
                     help="also run the kill matrix, on the replay's workers beside its cases, into the same report")
    run.add_argument("--builders", type=builder_count, default="auto",
                     help="processes that build refusal cases and host-heavy checks' cases, references included, "
                          "ahead of their turn, beside the workers (stress.core.prebuild); auto: on a GPU one per "
                          "core the workers leave, 8 at most, none on the CPU (the default); 0: the workers build "
                          "every case")
    run.add_argument("--resume", metavar="REPORT",
                     help="carry the cases an earlier run's report (its folder or results.jsonl) finished, on the "
                          "same device, seed, settings and source, and run only the rest; crashes and timeouts run "
                          "again; it may be the --report folder itself (default: run every case)")
    run.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")


    repro = sub.add_parser(
        "repro", parents=[device_and_seed(seed=False), IMPLEMENTATIONS],
        help="rerun one case and print its first divergences")
    repro.add_argument("check", metavar="CHECK")
    repro.add_argument("family", metavar="FAMILY")
    repro.add_argument("seed", metavar="SEED", type=seed_value)
    repro.add_argument("--mutant", help="with this planted bug applied (default: the production code)")
    repro.add_argument("--launch", type=launch_shape,
                       help="force a launch shape, e.g. chunk=16,num_warps=4 (default: the one the seed draws)")
    repro.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT,
                       help=f"seconds before the case is stopped as fail:timeout; on a GPU the case then runs in "
                            f"a worker process that can be killed; 0 = none, always in this process "
                            f"(default: {DEFAULT_TIMEOUT:g})")
    repro.add_argument("--no-trace", action="store_true", help="skip the CPU tracer")
    repro.add_argument("--sanitizer", choices=("memcheck", "initcheck", "synccheck"),
                       help="run the case in its own process under this compute-sanitizer tool (GPU only) "
                            "(default: the differential run)")



def streamed(report, bar):
    """``on_result`` for a replay: each result into the report, a failure shown with its repro line."""
    def on_result(result):
        report.add(result)
        if result.failed:
            bar.write(f"FAIL {result.verdict} {result.check} {result.family} seed={result.seed}: "
                      f"{result.details[0] if result.details else ''}\n  {result.repro()}")
        bar.set_postfix_str(report.closing_line(), refresh=False)
        bar.update(1)

    return on_result


def _on_row(report, args, say=log):
    """A kill-matrix row as it is decided: into ``report.kills``' row, and shown."""
    def on_row(row):
        report.add_kill(row)
        shape = f" {row.launch}" if args.by_shape and row.launch else ""
        say(f"  {row.check} {row.mutant}{shape}: {row.status}"
            + (f" after {row.iterations} case(s)" if row.status == "killed" else ""))

    return on_row


def _matrix_options(args) -> dict:
    return {"max_iters": args.max_iters, "seed": args.seed, "by_shape": args.by_shape,
            "path_iters": args.path_iters if args.path or getattr(args, "path_only", False) else 0,
            "path_only": getattr(args, "path_only", False),
            "only": args.mutant if args.command == "mutants" else None}


def run_matrix(report, selected, device: str, args, jobs: int) -> None:
    """The kill matrix alone, on a pool of its own, into ``report.kills`` (planned rows first), each decided row
    streamed and shown."""
    from stress.mutate import kill_matrix as matrix

    report.kills = []
    matrix.kill_matrix(selected, device, jobs=jobs, timeout=args.timeout, on_row=_on_row(report, args),
                       rows=report.kills, on_case=report.add_matrix_case, **_matrix_options(args))


def matrix_beside(report, selected, device: str, args, say, earlier=None):
    """The kill matrix planned into ``report.kills``, to hunt beside the replay's cases on the same workers
    (``stress.core.workers.execute``'s ``beside``): each decided row streamed and shown with ``say``; with an
    ``earlier`` run (``--resume``), the rows it hunted are carried where they may be (``resume.carry_kills``)."""
    from stress.mutate import kill_matrix as matrix

    report.kills = []
    on_row = _on_row(report, args, say)
    planned = matrix.planned(selected, device, on_row=on_row, rows=report.kills, **_matrix_options(args))
    if earlier is not None:
        report.header["resumed"]["kills"] = resume.carry_kills(earlier, report.header, planned, on_row)
    return matrix.Hunting(planned.hunts, device, args.timeout, planned.decided, report.add_matrix_case)


def run_into(report, stages) -> interrupts.Interrupted | None:
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
        log(f"specsan: interrupted by {stopped.name}: " + "; ".join(report.progress()))
    return stopped


def cmd_run(args) -> int:
    device = select_device(args)
    from stress import hunt
    from stress.core import cases, prebuild, telemetry, workers
    from stress.sanitize import runner as sanitizer

    selected = selected_checks(args)
    mutants_named(selected, [args.mutant] if args.mutant else ())
    tasks = cases.plan(selected, args.family, args.iters, args.seed, args.mutant)
    if patched := generated_mutant(args.mutant):
        tasks = [task._replace(patched=patched) for task in tasks]
    jobs = workers.default_jobs(device) if args.jobs is None else args.jobs
    builders = prebuild.builders_for(device, jobs) if args.builders == "auto" else args.builders
    header = {**impl_header(), "device": device,
              "iters": args.iters, "seed": args.seed, "cases": len(tasks), "jobs": jobs, "builders": builders,
              "timeout": args.timeout, "trace": not args.no_trace, "kill_matrix": args.kill_matrix, "hunt": args.hunt,
              **({"hunts": len(hunt.planned(selected, device))} if args.hunt else {}),
              **({"mutant": args.mutant} if args.mutant else {}),
              **({"max_iters": args.max_iters, "by_shape": args.by_shape,
                  "path_iters": args.path_iters if args.path else 0} if args.kill_matrix else {}),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), **gpu_header(device, jobs)}
    header["source"] = resume.source_fingerprint(header.get("impl"))
    carried, earlier = [], None
    if args.resume:  # read before the report folder, which may be the same one, is cleared
        try:
            earlier = resume.read(args.resume)
            resume.check_same(earlier, header)
        except resume.ResumeError as exc:
            problem, _, fix = str(exc).partition("; ")
            raise UsageError("--resume", problem, fix) from None
        tasks, carried = resume.carry(tasks, earlier)
        header["resumed"] = {"from": args.resume, "carried": len(carried), "rerun": earlier.rerun}
    report = open_report(args.report, header)
    for result in carried:
        report.add_carried(result)

    def stages():
        log(f"specsan run: {len(tasks)} cases on {device} ({jobs} worker(s)), report in {args.report}"
            + (f"; {len(carried)} carried from {args.resume}" if args.resume else "") + gpu_log(header))
        with telemetry.envelope(report.telemetry) if device == "cuda" else nullcontext():
            if args.hunt:
                def on_hunt(result):
                    report.add_hunt(result)
                    log("\n".join(result.lines()))

                hunt.run_hunts(selected, device, args.seed, jobs, args.timeout, on_hunt)
            with progress(len(tasks)) as bar:
                # the kill matrix hunts on the replay's workers, so neither waits for the other's slowest cases
                matrix = None
                if args.kill_matrix:
                    bar.write(f"kill matrix on {device}, on the replay's workers:")
                    matrix = matrix_beside(report, selected, device, args, bar.write, earlier)
                report.workers = workers.execute(tasks, device, jobs, streamed(report, bar), args.timeout,
                                                 trace=not args.no_trace, on_abandoned=report.abandoned.extend,
                                                 judge=sanitizer.run_task, beside=matrix, builders=builders)

    stopped = run_into(report, stages)
    failed = report.counts()[1] + sum(h.failed for h in report.hunts)
    matrix_line, all_killed = kill_matrix_verdict(report.kills or [], device)
    if stopped:
        code = stopped.exit_code
    elif failed or not all_killed:
        code = 1
    else:
        code = 0 if report.judged() else not_judged(report.unjudged_reasons())
    if args.json:
        print(json.dumps({"status": report.end_record()["status"], "exit_code": code, "report": args.report,
                          "device": device, "cases_planned": header["cases"], "cases_carried": len(carried),
                          "cases_finished": len(report.results),
                          **dict(zip(("passed", "failed", "not_checked"), report.counts(), strict=True)),
                          "failures": [{"verdict": r.verdict, "check": r.check, "family": r.family, "seed": r.seed,
                                        "repro": r.repro()} for r in report.results if r.failed],
                          "kill_matrix": None if report.kills is None else [asdict(k) for k in report.kills],
                          "hunts": [h.record() for h in report.hunts]},
                         indent=2))
        return code
    print(f"wall time {report.header['wall_s']:.1f} s; summary in {args.report}/summary.md")
    if report.kills is not None:
        print(matrix_line)
    print(report.closing_line())
    return code


def cmd_repro(args) -> int:
    device = select_device(args)
    from stress.core import cases, refusal, workers
    from stress.sanitize import runner as sanitizer

    check = checks_named([args.check], "CHECK")[0]
    family_named(check, args.family)
    patched = generated_mutant(args.mutant)
    if patched is None:
        planted_mutant(check, args.mutant)
    if args.sanitizer and refusal.is_family(check.families[args.family]):
        raise UsageError("--sanitizer", f"{args.family!r} is a refusal family: its cases launch no kernel",
                         "rerun it without --sanitizer")
    launch_in_sweep(check, device, args.launch)
    case = cases.build_case(check, args.family, args.seed, device, args.launch)
    print(f"{check.name} / {args.family} / seed {args.seed} on {device}: {case.note}")
    print(f"launch: {case.launch or 'default'}")
    for name, value in case.inputs.items():
        shown = f"{tuple(value.shape)} {value.dtype}" if hasattr(value, "shape") else repr(value)
        print(f"  {name}: {shown}")
    forced = tuple(sorted(args.launch.items())) if args.launch is not None else None
    task = cases.Task(args.check, args.family, args.seed, args.mutant, forced, args.sanitizer, patched)
    results = []
    # Here a deadline is an alarm signal; a kernel spinning on a GPU never sees it, so there a
    # deadline runs the case in one worker process the pool can kill (a sanitized case has its own).
    jobs = 1 if device == "cuda" and args.timeout and not args.sanitizer else 0
    if args.sanitizer and (gate := sanitizer.gate(args.sanitizer, device)).state != "caught":
        print(f"verdict: not_checked:{gate.text}")
        return not_judged([gate.text]) if gate.state == "unavailable" else 1  # blind: the tool missed its control
    workers.execute([task], device, jobs, results.append, args.timeout, trace=not args.no_trace,
                   judge=sanitizer.run_task)
    result = results[0]
    print(f"verdict: {result.verdict}")
    for line in result.details:
        print(line)
    if result.not_checked:
        return not_judged([result.verdict.removeprefix(NOT_CHECKED)])
    return 1 if result.failed else 0
