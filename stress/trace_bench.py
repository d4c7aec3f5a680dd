"""Tracer overhead: traced vs plain interpreter time over the registry's CPU cases.

Each case runs once untimed (the interpreter rewrites a kernel on first use), then plain and
traced runs alternate on fresh copies of the inputs so both see the same caches.
"""

import time

from kernels import runtime  # noqa: F401  - chooses the interpreter before any kernel module imports triton
from stress import checks, runner

SEEDS = 3
ROUNDS = 3


def _plain(check, case, seed):
    check.kernel(**runner.fresh_inputs(case), **case.launch)


def _traced(check, case, seed):
    verdict, details = runner.traced(check, case, seed)
    if verdict != "pass":
        raise RuntimeError(f"{check.name}: traced verdict {verdict}: {details[:3]}")


def _best(fn, *args) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return min(times)


def report(seeds: int = SEEDS) -> list[str]:
    """Printable lines: per check, plain and traced seconds over its cases and the ratio."""
    lines = [f"tracer overhead, {seeds} seed(s) per family, best of {ROUNDS} runs per case",
             f"{'check':28} {'cases':>5} {'plain s':>9} {'traced s':>9} {'ratio':>6}"]
    total_plain = total_traced = 0.0
    for check in checks.REGISTRY:
        if "cpu" not in check.devices:
            continue
        plain = traced = 0.0
        cases = 0
        for family in check.families:
            for i in range(seeds):
                seed = runner.case_seed(0, check.name, family, i)
                case = runner.build_case(check, family, seed, "cpu")
                _traced(check, case, seed)  # warm-up: rewrite the kernel, run the tracer's self-test
                plain += _best(_plain, check, case, seed)
                traced += _best(_traced, check, case, seed)
                cases += 1
        total_plain, total_traced = total_plain + plain, total_traced + traced
        lines.append(f"{check.name:28} {cases:>5} {plain:>9.3f} {traced:>9.3f} {traced / max(plain, 1e-9):>5.2f}x")
    lines.append(f"{'all':28} {'':>5} {total_plain:>9.3f} {total_traced:>9.3f} "
                 f"{total_traced / max(total_plain, 1e-9):>5.2f}x")
    return lines


if __name__ == "__main__":
    print("\n".join(report()))
