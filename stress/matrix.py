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
    verdict: str = ""  # the failing verdict that killed it
    iterations: int = 0  # cases run until the first kill (or in all, when it survived)
    launch: dict = field(default_factory=dict)
    repro: str = ""
    reason: str = ""
    other_failures: list[str] = field(default_factory=list)  # verdicts other than the claimed oracle
    # The whole-path check's hunt of the same bug (the path column): status, verdict, cases, repro or reason
    path: str = "-"
    path_verdict: str = ""
    path_iterations: int = 0
    path_detail: str = ""


ANY = "any"  # a path hunt's oracle: any failure but a timeout kills


def hunt(check_name: str, mutant_name: str, device: str, oracle: str, max_iters: int, seed: int,
         launch: dict | None, timeout: float = 0) -> Kill:
    """Run the mutant through its families round-robin until a case fails with ``oracle`` (``ANY``: any
    failure but a timeout). A whole-path check hunts another check's bug through all its own families."""
    from stress import checks

    check = checks.get(check_name)
    mutant = checks.find_mutant(mutant_name, check)
    own = any(m is mutant for m in check.mutants)
    if own:
        families = list(mutant.families or check.families)
    else:  # the families that reach this bug first, then the rest
        families = list(dict.fromkeys(check.path_families.get(mutant.name, ()) + tuple(check.families)))
    forced = tuple(sorted(launch.items())) if launch else None
    kill = Kill(check.name, mutant.name, device, oracle, "survived", max_iters, launch=launch or {})
    for i in range(max_iters):
        family = families[i % len(families)]
        r = run_case(Task(check.name, family, case_seed(seed, check.name, family, i), mutant.name, forced),
                     device, timeout)
        if r.verdict == f"fail:{oracle}" or (oracle == ANY and r.failed and r.verdict != "fail:timeout"):
            kill.status, kill.iterations, kill.repro, kill.launch = "killed", i + 1, r.repro(), r.launch
            kill.verdict = r.verdict
            return kill
        if r.failed and r.verdict not in kill.other_failures:
            kill.other_failures.append(r.verdict)
    return kill


def _path_hunts(checks: list[Check], device: str, max_iters: int, seed: int, timeout: float):
    """The path column: each whole-path check of the registry hunts every selected check's bugs but its own;
    returns (hunts to run, rows' path fields for the bugs it cannot reach here)."""
    from stress import checks as registry

    hunts, known = [], {}
    for path in registry.REGISTRY:
        if path.unreachable is None or device not in path.devices:
            continue
        for check in checks:
            for mutant in check.mutants if check is not path else ():
                reason = path.unreachable.get(mutant.name, {}).get(device)
                if reason:
                    known[mutant.name] = ("unreachable", "", 0, reason)
                elif mutant.name not in known:
                    known[mutant.name] = None
                    hunts.append((path.name, mutant.name, device, ANY, max_iters, seed, None, timeout))
    return hunts, {name: fields for name, fields in known.items() if fields}


def kill_matrix(checks: list[Check], device: str, *, max_iters: int, seed: int, jobs: int,
                by_shape: bool = False, timeout: float = 0, on_row=None, path_iters: int = 40,
                path_only: bool = False) -> list[Kill]:
    """One row per mutant (per launch shape with ``by_shape``); hunts run in worker processes. Each row
    also carries the path column: the whole-path check's hunt of the same bug (``path_iters`` cases).
    ``path_only`` hunts the path column alone (the rows' own status is then "not_hunted")."""
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
            if path_only:
                rows.append(Kill(check.name, mutant.name, device, oracle, "not_hunted"))
                continue
            for launch in (check.sweep(device) if by_shape and check.sweep else [None]):
                hunts.append((check.name, mutant.name, device, oracle, max_iters, seed, launch, timeout))
    path_hunts, path_fields = _path_hunts(checks, device, path_iters, seed, timeout)
    for row in rows:
        if on_row:
            on_row(row)
    done = []

    def finished(args, row):
        if args in path_hunts:
            path_fields[row.mutant] = (row.status, row.verdict, row.iterations, row.repro or row.reason)
        else:
            rows.append(row)
            done.append(row)
            if on_row:
                on_row(row)

    if jobs == 0:
        for args in hunts + path_hunts:
            finished(args, hunt(*args))
    else:
        counter = get_context("spawn").Value("i", 0)
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_init_worker,
                                 initargs=(device, counter, timeout, True, worker_threads(jobs))) as pool:
            futures = {pool.submit(hunt, *args): args for args in hunts + path_hunts}
            for future in as_completed(futures):
                args = futures[future]
                try:
                    row = future.result()
                except BrokenProcessPool:
                    row = Kill(args[0], args[1], device, args[3], "crash", launch=args[6] or {},
                               reason="a worker process died during the hunt")
                finished(args, row)
    for row in rows:
        if row.mutant in path_fields:
            row.path, row.path_verdict, row.path_iterations, row.path_detail = path_fields[row.mutant]
    return rows


def table(rows: list[Kill]) -> str:
    """The matrix; with a whole-path check, its column says, per bug, whether the whole step killed it too."""
    with_path = any(k.path != "-" for k in rows)
    path_head = f" {'path':11} {'verdict':16} {'iters':>5}" if with_path else ""
    lines = [f"{'check':28} {'mutant':24} {'oracle':10} {'device':6} {'status':11} {'iters':>5}{path_head}  "
             "launch / reason"]
    for k in rows:
        tail = k.reason or (str(k.launch) if k.launch else "")
        if k.other_failures:
            tail += f"  (also failed as {', '.join(k.other_failures)})"
        path = f" {k.path:11} {k.path_verdict:16} {k.path_iterations:>5}" if with_path else ""
        if with_path and k.path in ("unreachable", "survived", "crash"):
            tail += f"  [path: {k.path_detail}]"
        lines.append(f"{k.check:28} {k.mutant:24} {k.oracle:10} {k.device:6} {k.status:11} {k.iterations:>5}{path}  "
                     f"{tail}")
    return "\n".join(lines)
