"""The kill matrix: hunt each planted bug through its check until the oracle that claims it fires."""

from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context

from stress import mutants as planted
from stress.runner import Task, _init_worker, case_seed, run_case, worker_threads
from stress.types import Check


@dataclass
class Kill:
    check: str
    mutant: str
    device: str
    oracle: str
    status: str  # killed | survived | not_checked | stale | crash
    iterations: int = 0  # cases run until the first kill (or in all, when it survived)
    launch: dict = field(default_factory=dict)
    repro: str = ""
    reason: str = ""
    other_failures: list[str] = field(default_factory=list)  # verdicts other than the claimed oracle


def hunt(check_name: str, mutant_name: str, device: str, oracle: str, max_iters: int, seed: int,
         launch: dict | None, timeout: float = 0) -> Kill:
    """Run the mutant through its families round-robin until a case fails with ``oracle``."""
    from stress import checks

    check = checks.get(check_name)
    mutant = check.mutant(mutant_name)
    families = list(mutant.families or check.families)
    forced = tuple(sorted(launch.items())) if launch else None
    kill = Kill(check.name, mutant.name, device, oracle, "survived", max_iters, launch=launch or {})
    for i in range(max_iters):
        family = families[i % len(families)]
        r = run_case(Task(check.name, family, case_seed(seed, check.name, family, i), mutant.name, forced),
                     device, timeout)
        if r.verdict == f"fail:{oracle}":
            kill.status, kill.iterations, kill.repro, kill.launch = "killed", i + 1, r.repro(), r.launch
            return kill
        if r.failed and r.verdict not in kill.other_failures:
            kill.other_failures.append(r.verdict)
    return kill


def kill_matrix(checks: list[Check], device: str, *, max_iters: int, seed: int, jobs: int,
                by_shape: bool = False, timeout: float = 0, on_row=None) -> list[Kill]:
    """One row per mutant (per launch shape with ``by_shape``); hunts run in worker processes."""
    rows, hunts = [], []
    for check in checks:
        for mutant in check.mutants:
            oracle = mutant.oracles.get(device)
            if oracle is None:
                rows.append(Kill(check.name, mutant.name, device, "-", "not_checked", reason=mutant.why_not))
                continue
            try:
                planted.validate(mutant)
            except planted.StaleMutant as exc:
                rows.append(Kill(check.name, mutant.name, device, oracle, "stale", reason=str(exc)))
                continue
            for launch in (check.sweep(device) if by_shape and check.sweep else [None]):
                hunts.append((check.name, mutant.name, device, oracle, max_iters, seed, launch, timeout))
    for row in rows:
        if on_row:
            on_row(row)
    if jobs == 0:
        for args in hunts:
            rows.append(hunt(*args))
            if on_row:
                on_row(rows[-1])
        return rows
    counter = get_context("spawn").Value("i", 0)
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(device, counter, timeout, True, worker_threads(jobs))) as pool:
        futures = {pool.submit(hunt, *args): args for args in hunts}
        for future in as_completed(futures):
            args = futures[future]
            try:
                row = future.result()
            except BrokenProcessPool:
                row = Kill(args[0], args[1], device, args[3], "crash", launch=args[6] or {},
                           reason="a worker process died during the hunt")
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def table(rows: list[Kill]) -> str:
    lines = [f"{'check':28} {'mutant':24} {'oracle':10} {'device':6} {'status':11} {'iters':>5}  launch / reason"]
    for k in rows:
        tail = k.reason or (str(k.launch) if k.launch else "")
        if k.other_failures:
            tail += f"  (also failed as {', '.join(k.other_failures)})"
        lines.append(f"{k.check:28} {k.mutant:24} {k.oracle:10} {k.device:6} {k.status:11} {k.iterations:>5}  {tail}")
    return "\n".join(lines)
