"""The command line of trace: kernel launches traced on the CPU."""

import os

from stress.cli.common import UsageError, checks_named, count, family_named, planted_mutant, seed_value


def add_parsers(sub) -> None:
    tr = sub.add_parser("trace", help="trace kernel launches on the CPU (a check's cases, or your own kernel with "
                                      "--kernel): races, out-of-bounds, uninit, order dependence")
    tr.add_argument("check", nargs="?", help="a registered check (or use --kernel)")
    tr.add_argument("family", nargs="?")
    tr.add_argument("seed", nargs="?", type=seed_value)
    tr.add_argument("--seeds", type=count(1), default=3, help="seeds per family without FAMILY SEED (default: 3)")
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



def cmd_trace(args) -> int:
    """Print every traced launch of the chosen cases with its findings."""
    os.environ["SPECSAN_DEVICE"] = "cpu"
    from kernels import runtime

    if runtime.DEVICE != "cpu":
        raise UsageError("SPECSAN_DEVICE", "trace needs the CPU interpreter", "run with SPECSAN_DEVICE=cpu")
    from stress.core import cases, oracle
    from stress.core import patches as mutants

    if args.kernel:
        return trace_own(args)
    if args.check is None:
        raise UsageError("CHECK", "missing", "name a registered check, or your own kernel with --kernel MODULE:NAME "
                                             "--args SCRIPT")
    check = checks_named([args.check], "CHECK")[0]
    if (args.family is None) != (args.seed is None):
        raise UsageError("FAMILY SEED", "give both or neither", "e.g. `specsan trace CHECK FAMILY SEED`")
    mutant = planted_mutant(check, args.mutant)
    if args.family is not None:
        chosen = [(family_named(check, args.family), args.seed)]
    else:
        chosen = [(f, cases.case_seed(0, check.name, f, i)) for f in check.families for i in range(args.seeds)]
    failed = 0
    for family, seed in chosen:
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


def trace_own(args) -> int:
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
