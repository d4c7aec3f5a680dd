"""The command line of tp: TP determinism across rank processes."""

from stress.cli.common import count, device_and_seed, select_device


def add_parsers(sub) -> None:
    tp = sub.add_parser(
        "tp", parents=[device_and_seed()],
        help="TP determinism: N rank processes replay one schedule and compare every step")
    tp.add_argument("--ranks", type=count(1), default=2,
                    help="rank processes; 1 runs the production code alone, to exercise the process group "
                         "(default: 2)")
    tp.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                    help="process group: nccl gathers on one GPU per rank, gloo on the CPU; auto: nccl when the "
                         "kernels run on CUDA with a GPU per rank, else gloo (default: auto)")
    tp.add_argument("--mutant", action="append",
                    help="also replay with this planted bug in every rank; it must diverge, repeatable "
                         "(default: production code only)")
    tp.add_argument("--steps", type=count(1), default=8, help="schedule steps (default: 8)")
    tp.add_argument("--workload", choices=("slots", "engine", "all"), default="all",
                    help="slots: an admission schedule through the slots and draft inputs; engine: the whole "
                         "engine (kernels.spec.engine); all: both (default: all)")


def cmd_tp(args) -> int:
    select_device(args)
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
