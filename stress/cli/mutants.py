"""The command line of mutants (the kill matrix of planted bugs) and mutate (generated mutants)."""

import json
import os
import time
from contextlib import nullcontext
from dataclasses import asdict

from stress.cli.common import (
    CHECKS,
    IMPLEMENTATIONS,
    MATRIX,
    UsageError,
    checks_named,
    count,
    device_and_seed,
    gpu_header,
    gpu_log,
    impl_header,
    log,
    mutants_named,
    not_judged,
    open_report,
    percentage,
    pool_options,
    seconds,
    select_device,
)
from stress.cli.run import run_into, run_matrix
from stress.core.types import kill_matrix_verdict


def add_parsers(sub) -> None:
    mut = sub.add_parser(
        "mutants", parents=[device_and_seed(), pool_options("hunted"), MATRIX, IMPLEMENTATIONS, CHECKS],
        help="run each planted bug through its check: the kill matrix")
    mut.add_argument("--path-only", action="store_true", help="hunt the path column alone (implies --path)")
    mut.add_argument("--mutant", action="append", help="only this planted bug, repeatable (default: every one)")
    mut.add_argument("--json", action="store_true", help="print the matrix as JSON on stdout and nothing else")
    mut.add_argument("--report", help="also write results.jsonl, mutants.json, summary.md and the heat map to DIR, "
                                      "cleared of an earlier run's files (default: no report)")


    mt = sub.add_parser(
        "mutate", parents=[device_and_seed(), pool_options("hunted"), CHECKS],
        help="generate mutants of each check's production code and hunt them: the "
             "mutation score per check")
    mt.add_argument("--operators", choices=("token", "semantic", "all"),
                    help="which class of operators: token (one-token slips), semantic (an engineer's slips: a "
                         "same-kind name, swapped arguments, a forgotten statement, a neighbouring expression, an "
                         "index off by one, a guard one part short) or all; each class is scored apart "
                         "(default: token; with --mutant or --survivors, all)")
    mt.add_argument("--operator", action="append",
                    help="only this operator, repeatable, of the --operators class (token: cmp-flip, const, "
                         "mask-term, load-other, no-int64, barrier, min-max, cdiv-floor, index-swap, where-swap, "
                         "and-or, default; semantic: same-name, arg-swap, stmt-delete, neighbour-expr, "
                         "boundary-shift, guard-part)")
    mt.add_argument("--mutant", action="append", help="only this generated mutant id, repeatable (default: all)")
    mt.add_argument("--module", action="append",
                    help="only the code of this module of the production code, repeatable, e.g. kernels.spec.engine "
                         "for a change to the engine; its mutants are hunted by the selected checks that run it "
                         "(default: every module they run)")
    mt.add_argument("--survivors", metavar="JSONL",
                    help="only the mutants that survived in this earlier run's mutate.jsonl, e.g. to hunt them "
                         "again with more --iters (default: none)")
    mt.add_argument("--resume", metavar="JSONL",
                    help="take the mutants that this earlier run's mutate.jsonl (or .jsonl.gz) decided (same "
                         "--device, --iters and --seed; their module unchanged since) as they are and hunt only the "
                         "rest, survivors included, e.g. after a time limit stopped it (default: none)")
    mt.add_argument("--iters", type=count(1), default=3, help="cases per family before a mutant survives (default: 3)")
    mt.add_argument("--sample", type=count(0), default=0,
                    help="at most this many mutants per check, a deterministic sample by --seed (default: 0 = all)")
    mt.add_argument("--fail-under", type=percentage, default=0.0,
                    help="exit 1 when a check's score is below this percentage (default: 0, no gate)")
    mt.add_argument("--report", default="reports/mutate",
                    help="directory for mutate.jsonl, one line per decided mutant (default: reports/mutate)")
    mt.add_argument("--hunt-seconds", type=seconds, default=0.0,
                    help="stop starting cases after this long hunting: what is undecided stays pending for a later "
                         "--resume, and the survivors found so far still meet memcheck and their unit tests, "
                         "which a run stopped by a time limit never reaches (default: 0, no bound)")
    mt.add_argument("--json", action="store_true", help="print the summary as JSON on stdout and nothing else")



def cmd_mutants(args) -> int:
    device = select_device(args)
    from stress.core import telemetry, workers
    from stress.mutate import kill_matrix as matrix

    selected = checks_named(args.check)
    mutants_named(selected, args.mutant)
    jobs = workers.default_jobs(device) if args.jobs is None else args.jobs
    header = {**impl_header(), "device": device,
              "max_iters": args.max_iters, "seed": args.seed, "jobs": jobs, "timeout": args.timeout,
              "by_shape": args.by_shape, "started": time.strftime("%Y-%m-%d %H:%M:%S"), **gpu_header(device, jobs)}
    report = open_report(args.report, header)

    def stages():
        log(f"specsan mutants: kill matrix on {device} ({jobs} worker(s))" + gpu_log(header))
        with telemetry.envelope(report.telemetry) if device == "cuda" else nullcontext():
            run_matrix(report, selected, device, args, jobs)

    stopped = run_into(report, stages)
    rows = report.kills
    line, all_killed = kill_matrix_verdict(rows, device)
    if args.json:
        print(json.dumps([asdict(k) for k in rows], indent=2))
        log(line)
    else:
        print(matrix.table(rows))
        print(line)
    if stopped or not all_killed:
        return stopped.exit_code if stopped else 1
    return 0 if report.judged() else not_judged(report.unjudged_reasons())


def chosen_operators(args) -> list[str]:
    """The operators a mutate run generates: ``--operator`` names within the ``--operators`` class (token by
    default; every class when ``--mutant`` names the mutants, whose ids carry their operator)."""
    from stress.mutate import operators as mutate_ops

    classes = mutate_ops.OPERATOR_CLASSES
    chosen = args.operators or ("all" if args.mutant or args.survivors else "token")
    allowed = [o for name, ops in classes.items() if chosen in (name, "all") for o in ops]
    unknown = [o for o in args.operator or () if o not in allowed]
    if unknown:
        other = next((name for name, ops in classes.items() if unknown[0] in ops), None)
        raise UsageError("--operator", f"{unknown[0]!r} is not a {chosen} operator",
                         f"add --operators {other}" if other else f"known: {', '.join(allowed)}")
    return list(args.operator or allowed)


def _modules_exist(modules: list[str] | None) -> None:
    """``--module`` names importable modules: a typo is a usage error before discovery runs every family."""
    import importlib.util

    for name in modules or ():
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise UsageError("--module", f"no module {name!r}", "give a dotted module of the production code, "
                                                               "e.g. kernels.spec.engine")


def _survivors_again(args) -> None:
    """``--survivors FILE``: the mutants that survived there join ``--mutant``, their checks ``--check``."""
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


def _resumed(args, device: str) -> tuple[str, dict] | None:
    """``--resume FILE``: what an earlier run of the same device, iters and seed decided."""
    from stress.mutate import campaign as mutate

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
    return resumed


def cmd_mutate(args) -> int:
    device = select_device(args)
    from stress.core import workers
    from stress.mutate import campaign as mutate
    from stress.mutate import operators as mutate_ops

    operators = chosen_operators(args)
    _survivors_again(args)
    selected = checks_named(args.check)
    for name in args.mutant or ():
        mutate_ops.resolve(name)  # a stale or malformed id is a usage error before anything runs
    _modules_exist(args.module)
    resumed = _resumed(args, device)
    jobs = workers.default_jobs(device) if args.jobs is None else args.jobs
    try:
        summary = mutate.run(selected, device, iters=args.iters, seed=args.seed, jobs=jobs, timeout=args.timeout,
                             operators=operators, only=args.mutant, sample=args.sample, report=args.report, log=log,
                             resumed=resumed, hunt_seconds=args.hunt_seconds, modules=args.module)
    except mutate.ModulesNotRun as exc:
        raise UsageError("--module", str(exc), exc.fix) from None
    rows, stopped = summary.pop("rows"), summary.pop("exit_code")
    out = print if not args.json else log
    if stopped:
        out(f"INTERRUPTED by {summary['interrupted']}: the scores below count the mutants decided so far")
    for name, tables in summary["by_class"].items():  # one-token and semantic mutants scored apart
        out(mutate.score_table(f"check ({name} mutants)", tables["by_check"]))
        out("")
        out(mutate.score_table(f"module ({name} mutants)", tables["by_module"]))
        out("")
    for line in mutate.survivor_lines(rows, device, args.iters):
        out(line)
    return _closing_lines(summary, rows, device, args, out, stopped)


def _closing_lines(summary: dict, rows: list, device: str, args, out, stopped) -> int:
    """The stale and refuted data entries, the score line, the survivors' explanations; the exit status."""
    from stress.mutate import campaign as mutate

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
        f"{equivalent} equivalent (same TTIR/bytecode, or reasoned in stress/mutate/equivalent_mutants.toml); "
        f"{summary['wall_s']:.0f} s")
    if survivors := [r for r in rows if r.status == "survived"]:
        elsewhere = sum(not r.explained and bool(r.killed_elsewhere) for r in survivors)
        unexplained = sum(not r.explained and not r.killed_elsewhere for r in survivors)
        out(f"{len(survivors)} survivor(s): {len(survivors) - unexplained - elsewhere} explained in "
            f"stress/mutate/surviving_mutants.toml, {elsewhere} killed on another device by a kept record in records/ "
            f"(counted all the same), {unexplained} unexplained")
    if pending := sum(g["pending"] for g in summary["by_check"].values()):
        out(f"{pending} mutant(s) undecided: the run stopped before their hunts ended (neither killed nor survived)")
    if args.json:
        print(json.dumps(summary, indent=2))
    low = [name for name, g in summary["by_check"].items() if g["score"] is not None and g["score"] < args.fail_under]
    return stopped or (1 if low or any(entries.values()) else 0)
