"""The command line of hunt: one check's kernel hammered on device-resident cases."""

import json

from stress.cli.common import (
    IMPLEMENTATIONS,
    UsageError,
    checks_named,
    count,
    device_and_seed,
    family_named,
    launch_in_sweep,
    launch_shape,
    not_judged,
    planted_mutant,
    seconds,
    seed_value,
    select_device,
)
from stress.core.types import NOT_CHECKED


def add_parsers(sub) -> None:
    hunt = sub.add_parser(
        "hunt", parents=[device_and_seed(), IMPLEMENTATIONS],
        help="launch one check's kernel back to back on device-resident cases, checked "
             "on the device in batches, until the first failure or the time is up")
    hunt.add_argument("check", metavar="CHECK")
    hunt.add_argument("--family", action="append",
                      help="only this family, repeatable (default: the mutant's families, else all)")
    hunt.add_argument("--seconds", type=seconds, default=10.0,
                      help="hunting time, compiles excluded; per launch shape with --by-shape (default: 10)")
    hunt.add_argument("--case-seed", type=seed_value,
                      help="hammer this one case (with one --family) instead of fresh ones, e.g. from a failure's "
                           "hunt line (default: fresh cases from --seed)")
    hunt.add_argument("--launch", type=launch_shape, help="only this launch shape, e.g. chunk=4096,num_warps=4 "
                                                     "(default: cycle through the check's sweep)")
    hunt.add_argument("--mutant", help="with this planted bug applied (default: the production code)")
    hunt.add_argument("--launches-per-case", type=count(1), default=16,
                      help="launches of each fresh case before the next is drawn (default: 16)")
    hunt.add_argument("--cases-per-sync", type=count(1), default=8,
                      help="cases checked per host synchronization (default: 8)")
    hunt.add_argument("--streams", type=count(1), default=4,
                      help="CUDA streams a case's launches are spread over (GPU; default: 4, the fastest of 4, 8 "
                           "and 16 on an H200)")
    hunt.add_argument("--load", action="store_true",
                      help="memory traffic on a side stream while the kernel runs (GPU; default: off)")
    hunt.add_argument("--by-shape", action="store_true",
                      help="hunt each launch shape on its own for --seconds; report the time to the first failure "
                           "in each")
    hunt.add_argument("--jobs", type=count(1), default=1,
                      help="hunt in this many processes at once, each with its own cases (default: 1)")
    hunt.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")



def cmd_hunt(args) -> int:
    device = select_device(args)
    from stress import hunt

    check = checks_named([args.check], "CHECK")[0]
    if (why := hunt.supports(check, device)) is not None:
        raise UsageError("CHECK", f"{check.name} has no hunt support on {device} ({why})",
                         f"huntable here: {', '.join(hunt.huntable(device)) or 'none'}")
    for family in args.family or ():
        family_named(check, family, "--family")
    planted_mutant(check, args.mutant)
    launch_in_sweep(check, device, args.launch)
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
        print(json.dumps(result.record(), indent=2))
    else:
        print("\n".join(result.lines()))
    if result.not_checked:
        return not_judged([result.verdict.removeprefix(NOT_CHECKED)])
    return 1 if result.failed else 0
