"""specsan command line: run, repro, trace, list, mutants, sanitize, hunt, mutate, tp (stress/cli/, one module per
driver, each adding its parsers and running its commands).

The device is chosen before any kernel module is imported (kernels.runtime decides between
compiled Triton and the interpreter at import time), so the command modules import lazily.

Exit status (``EXIT_STATUS``, the end of ``--help``): a usage error is one line on stderr,
``specsan: <argument>: <what is wrong>; <how to fix>``.
"""

import sys

from stress.cli import common, hunt, listing, mutants, run, sanitize, tp, trace
from stress.core import interrupts
from stress.core.pool import PoolError

COMMANDS = {"run": run.cmd_run, "repro": run.cmd_repro, "trace": trace.cmd_trace, "list": listing.cmd_list,
            "mutants": mutants.cmd_mutants, "hunt": hunt.cmd_hunt, "tp": tp.cmd_tp, "sanitize": sanitize.cmd_sanitize,
            "mutate": mutants.cmd_mutate}


def parser() -> common.Parser:
    p = common.Parser(prog="specsan", description="Verify and stress the spec-decode kernels.",
                      epilog=common.EXIT_STATUS)
    sub = p.add_subparsers(dest="command", required=True, parser_class=common.Parser)
    for module in (run, trace, listing, mutants, sanitize, hunt, tp):
        module.add_parsers(sub)
    return p


def main(argv=None) -> int:
    # Signals are routed before anything slow is imported, so even an early Ctrl-C exits cleanly.
    with interrupts.handled():
        try:
            args = parser().parse_args(argv)
            common.register_implementations(getattr(args, "impl", None))
            return COMMANDS[args.command](args)
        except common.UsageError as exc:
            common.log(f"specsan: {exc}")
            return 2
        except ValueError as exc:  # a launcher-style "argument: problem; fix" from below the command line
            common.log(f"specsan: {exc}")
            return 2
        except interrupts.Interrupted as exc:
            common.log(f"specsan: interrupted by {exc.name}")
            return exc.exit_code
        except PoolError as exc:  # e.g. no GPU for a worker: the harness cannot run here
            common.log(f"specsan: {exc}")
            return 1
        except BrokenPipeError:  # output piped into `head` and closed early
            sys.stderr.close()
            return 0


if __name__ == "__main__":
    sys.exit(main())
