"""Stress throughput, for ``make bench``: cases per second per check in one process, with the share of a
case's time each phase takes (``stress.core.types.PHASES``: building the inputs, the reference, placing,
launching, compiling, settling and comparing, the CPU tracer, refusals), and the registry's cases per second
through the worker pool ``run`` uses.

Each family's first case runs untimed (it compiles the kernel's launch shapes); the timed cases are the
next ``cases`` seeds of every family, exactly those ``run`` would draw.
"""

import time
from collections import defaultdict

from stress import checks
from stress.core import cases, workers
from stress.core.cases import Task, case_seed
from stress.core.types import PHASES


def check_rows(device: str, cases: int = 2, seed: int = 0) -> list[str]:
    rows = [f"{'check':28} {'cases':>6} {'cases/s':>9} {'ms/case':>9} " + " ".join(f"{p:>9}" for p in PHASES)]
    for check in checks.REGISTRY:
        if device not in check.devices:
            rows.append(f"{check.name:28} not_checked: {check.skipped(device=device)}")
            continue
        for family in check.families:
            workers.run_case(Task(check.name, family, case_seed(seed, check.name, family, 0)), device)
        results = [workers.run_case(Task(check.name, family, case_seed(seed, check.name, family, i)), device)
                   for i in range(1, cases + 1) for family in check.families]
        seconds = sum(r.seconds for r in results)
        phases = defaultdict(float)
        for r in results:
            for name, value in r.phases.items():
                phases[name] += value
        shares = " ".join(f"{100 * phases[p] / seconds:8.0f}%" if seconds else f"{'-':>9}" for p in PHASES)
        rows.append(f"{check.name:28} {len(results):6d} {len(results) / seconds:9.1f} "
                    f"{1e3 * seconds / len(results):9.1f} {shares}")
    return rows


def pool_row(device: str, iters: int = 2, seed: int = 0) -> str:
    """The whole registry, ``iters`` iterations, through the default worker pool: cases per second of wall time."""
    tasks = cases.plan(list(checks.REGISTRY), None, iters, seed)
    jobs = workers.default_jobs(device)
    verdicts = defaultdict(int)
    start = time.perf_counter()
    workers.execute(tasks, device, jobs, lambda r: verdicts.__setitem__(r.verdict.split(":")[0],
                                                                      verdicts[r.verdict.split(":")[0]] + 1))
    wall = time.perf_counter() - start
    counted = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
    return (f"pool: {len(tasks)} cases ({iters} iterations of every family) in {wall:.1f} s with {jobs} worker(s): "
            f"{len(tasks) / wall:.1f} cases/s, worker start-up and compiles included ({counted})")
