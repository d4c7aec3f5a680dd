"""The kill matrix: hunt each planted bug through its check until the oracle that claims it fires.

A hunt is a sequence of cases (iteration i draws family ``i mod len(families)``); each case is
one task of the same worker pool ``run`` uses, so a case that hangs or kills its worker is
charged to that case (``fail:timeout`` / ``fail:crash`` among the hunt's other failures) and
the hunt goes on. Idle workers run later iterations of unfinished hunts ahead of time; a hunt's
result is still its first killing iteration in order, whatever ran in parallel.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stress.core import impl, workers
from stress.core import patches as planted
from stress.core.cases import Task, case_seed
from stress.core.types import FAIL, Check, Kill, Mutant, Result, Verdict
from stress.mutate import operators
from stress.sanitize import runner as sanitizer

ANY = "any"  # a path hunt's oracle: any failure but a timeout or a suite error kills


def _kills(oracle: str, verdict: str) -> bool:
    return verdict in (FAIL + oracle, sanitizer.VERDICT.get(oracle)) or (
        oracle == ANY and verdict.startswith(FAIL) and verdict not in (Verdict.TIMEOUT, Verdict.SUITE_ERROR))


@dataclass
class _Hunt:
    """One mutant (in one launch shape) hunted through its families, iteration by iteration."""

    kill: Kill
    families: tuple[str, ...]
    forced: tuple | None  # the launch shape every case must use (``--by-shape``)
    max_iters: int
    seed: int
    started: int = 0  # iterations handed out so far
    results: dict[int, Result] = field(default_factory=dict)
    first_kill: int | None = None
    mutant: Mutant | None = None  # the bug hunted, resolved once here (a generated one is not in the registry)

    def limit(self) -> int:
        return self.max_iters if self.first_kill is None else self.first_kill + 1

    def next_task(self) -> tuple[int, Task] | None:
        if self.started >= self.limit():
            return None
        i, self.started = self.started, self.started + 1
        family = self.families[i % len(self.families)]
        k = self.kill
        tool = k.oracle if k.oracle in sanitizer.TOOLS else None
        return i, Task(k.check, family, case_seed(self.seed, k.check, family, i), k.mutant, self.forced, tool,
                       self.mutant)

    def record(self, i: int, result: Result) -> None:
        self.results[i] = result
        if _kills(self.kill.oracle, result.verdict) and (self.first_kill is None or i < self.first_kill):
            self.first_kill = i

    def running(self) -> int:
        return self.started - len(self.results)

    def decided(self) -> bool:
        return all(i in self.results for i in range(self.limit()))

    def finish(self, status: str | None = None) -> Kill:
        """The row: killed at the first killing iteration, else survived (or ``status``)."""
        k = self.kill
        done = [self.results[i] for i in range(self.limit()) if i in self.results]
        others = [r for r in done if r.failed and not _kills(k.oracle, r.verdict)]
        k.other_failures = list(dict.fromkeys(r.verdict for r in others))
        if others:
            first = others[0]
            k.other_example = f"{first.verdict}: {(first.details or [''])[0].strip()[:200]}; {first.repro()}"
        if status:
            k.status, k.iterations = status, len(done)
        elif self.first_kill is not None:
            r = self.results[self.first_kill]
            k.status, k.iterations, k.repro, k.launch = "killed", self.first_kill + 1, r.repro(), r.launch
            k.verdict, k.detail = r.verdict, _first_detail(r.details)
        else:
            k.status, k.iterations = "survived", self.max_iters
        return k


def _first_detail(details: list[str]) -> str:
    """A result's first detail line; for a crash, with where it was raised (the innermost frame)."""
    first = (details or [""])[0].strip()
    frames = [line.strip() for line in details[1:] if line.strip().startswith("File ")]
    return (f"{first} ({frames[-1]})" if frames else first)[:400]


def _new_hunt(check: Check, mutant_name: str, device: str, oracle: str, max_iters: int, seed: int,
              launch: dict | None) -> _Hunt:
    """A whole-path check hunts another check's bug through its own families, mostly those that reach it."""
    mutant = operators.find(mutant_name, check)
    forced = tuple(sorted(launch.items())) if launch else None
    kill = Kill(check.name, mutant.name, device, oracle, "unfinished", launch=launch or {})
    if any(m is mutant for m in check.mutants):
        families = tuple(mutant.families or check.families)
    else:  # the families that reach the bug take four turns in every round
        hints = mutant.path.families
        families = hints * 4 + tuple(f for f in check.families if f not in hints)
    return _Hunt(kill, families, forced, max_iters, seed, mutant=mutant)


class Hunting:
    """Hunts' cases as a pool's source, and their outcomes: on a pool of their own (``_run_hunts``) or beside a
    replay's cases (``stress.core.workers.execute``'s ``beside``). ``on_row`` gets each hunt's row as it is
    decided, ``on_case`` every case's Result. Past ``deadline`` (``time.monotonic()``) no case starts."""

    def __init__(self, hunts: list[_Hunt], device: str, timeout: float, on_row, on_case=None,
                 deadline: float | None = None):
        self.open = list(hunts)
        self.device, self.timeout, self.on_row, self.on_case, self.deadline = device, timeout, on_row, on_case, deadline
        self._running: dict[int, tuple[_Hunt, int, Task]] = {}  # id(task) -> its hunt, iteration and the task

    def next_task(self, ahead: bool = True) -> Task | None:
        """The next case of the open hunt with the fewest cases running (earlier hunts first among equals).
        ``ahead``: also a later iteration of a hunt that has one running, which a pool with nothing else to do
        runs ahead of time; without it, only a hunt with none running gets one (a pool with other work keeps one
        case of each hunt in flight). A hunt's row is its first killing iteration in order either way."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return None
        for h in sorted(self.open, key=lambda h: h.running()):
            if not ahead and h.running():
                return None
            if (step := h.next_task()) is not None:
                i, task = step
                self._running[id(task)] = (h, i, task)
                return task
        return None

    def owns(self, task: Task) -> bool:
        return id(task) in self._running

    def finished(self, outcome) -> None:
        h, i, _ = self._running.pop(id(outcome.item))
        result = workers.result_of(outcome, self.device, self.timeout, trace=True)
        if self.on_case:
            self.on_case(result)
        if h not in self.open:
            return  # an iteration run ahead of a kill that was found earlier
        h.record(i, result)
        if h.decided():
            self.open.remove(h)
            self.on_row(h.finish())

    def stop(self) -> None:
        """Every hunt still open gets its row as ``unfinished`` (a signal, a deadline)."""
        for h in self.open:
            self.on_row(h.finish("unfinished"))
        self.open = []


def _run_hunts(hunts: list[_Hunt], device: str, jobs: int, timeout: float, on_row, on_case=None,
               deadline: float | None = None) -> None:
    """Run the hunts' cases on one pool (``Hunting``). Past ``deadline`` no case starts; the running ones finish,
    and every hunt left undecided gets its row as ``unfinished``."""
    hunting = Hunting(hunts, device, timeout, on_row, on_case, deadline)
    if deadline is None or time.monotonic() < deadline:  # past it, no pool of workers starts for nothing
        workers.execute([], device, jobs, None, timeout, judge=sanitizer.run_task, beside=hunting)
    hunting.stop()


def hunt_mutant(check_name: str, mutant_name: str, device: str, oracle: str, max_iters: int, seed: int,
         launch: dict | None, timeout: float = 0, jobs: int = 0) -> Kill:
    """Run one mutant through its families round-robin until a case fails with ``oracle``: in this process, or
    with ``jobs`` worker processes (a mutant whose cases may take their process down)."""
    from stress import checks

    if oracle in sanitizer.TOOLS and (reason := _sanitizer_blind(oracle, device, {})):
        return Kill(check_name, mutant_name, device, oracle, "not_checked", reason=reason)
    rows: list[Kill] = []
    h = _new_hunt(checks.get(check_name), mutant_name, device, oracle, max_iters, seed, launch)
    _run_hunts([h], device, jobs, timeout, rows.append)
    return rows[0]


def _path_hunts(checks: list[Check], device: str, max_iters: int, seed: int) -> tuple[dict[str, _Hunt], dict]:
    """The path column: each whole-path check of the registry (``Check.whole_path``) hunts every
    selected check's bugs but its own, with any failure as the oracle. Returns the hunts by mutant,
    and the path fields of the bugs it cannot reach on this device."""
    from stress import checks as registry

    hunts, known = {}, {}
    for path in registry.REGISTRY:
        if not path.whole_path or device not in path.devices:
            continue
        for check in checks:
            for mutant in check.mutants if check is not path else ():
                reason = mutant.path.unreachable.get(device)
                if reason:
                    known[mutant.name] = ("unreachable", "", 0, reason)
                elif mutant.name not in hunts and mutant.name not in known:
                    hunts[mutant.name] = _new_hunt(path, mutant.name, device, ANY, max_iters, seed, None)
    return hunts, known


@dataclass
class Matrix:
    """A planned kill matrix: every row (undecided ones say ``unfinished``), the hunts that decide them, and
    ``decided``, which takes each hunt's row as it is decided (a path hunt's fills its bug's path column)."""

    rows: list[Kill]
    hunts: list[_Hunt]
    decided: Callable[[Kill], None]


def kill_matrix(checks: list[Check], device: str, *, max_iters: int, seed: int, jobs: int,
                by_shape: bool = False, timeout: float = 0, on_row=None, rows: list | None = None,
                path_iters: int = 40, path_only: bool = False, on_case=None,
                only: list[str] | None = None) -> list[Kill]:
    """One row per mutant (per launch shape with ``by_shape``), in registry order, hunted on a pool of its own.

    ``on_row`` sees each row as it is decided. ``rows``, when given, is filled with every planned
    row up front (undecided ones say ``unfinished``), so a caller still holds the whole matrix
    when a signal stops it; the hunts still open then go to ``on_row`` as ``unfinished`` too.
    Each row also carries the path column: the whole-path check's hunt of the same bug
    (``path_iters`` cases; 0 leaves the column out); ``path_only`` hunts that column alone (rows then
    say ``not_hunted``). ``on_case`` sees the Result of every case the hunts ran. ``only``: hunt just
    these planted bugs (by name).
    """
    matrix = planned(checks, device, max_iters=max_iters, seed=seed, by_shape=by_shape, on_row=on_row, rows=rows,
                     path_iters=path_iters, path_only=path_only, only=only)
    _run_hunts(matrix.hunts, device, jobs, timeout, matrix.decided, on_case)
    return matrix.rows


def planned(checks: list[Check], device: str, *, max_iters: int, seed: int, by_shape: bool = False, on_row=None,
            rows: list | None = None, path_iters: int = 40, path_only: bool = False,
            only: list[str] | None = None) -> Matrix:
    """``kill_matrix``'s rows and hunts, not run yet (the arguments are ``kill_matrix``'s): rows decided without
    a hunt (not checked here, stale, not hunted) go to ``on_row`` now."""
    rows = [] if rows is None else rows
    hunts: list[_Hunt] = []
    blind: dict[str, str | None] = {}  # sanitizer tool -> why it cannot judge here (None: its control was caught)
    for check in checks:
        for mutant in check.mutants:
            if only and mutant.name not in only:
                continue
            decided = _decided_unhunted(check, mutant, device, checks, blind, path_only)
            if decided is not None:
                rows.append(decided)
                continue
            for launch in (check.sweep(device) if by_shape and check.sweep else [None]):
                hunts.append(_new_hunt(check, mutant.name, device, mutant.oracles[device], max_iters, seed, launch))
                rows.append(hunts[-1].kill)
    for row in rows:
        if on_row and row.status in ("not_checked", "stale", "not_hunted"):
            on_row(row)
    path_hunts, path_fields = _path_hunts(checks, device, path_iters, seed) if path_iters else ({}, {})
    by_kill = {id(h.kill): name for name, h in path_hunts.items()}

    def decided(row: Kill) -> None:
        name = by_kill.get(id(row))
        if name is None:
            if on_row:
                on_row(row)
            return
        path_fields[name] = (row.status, row.verdict, row.iterations, row.repro or row.reason)
        for unit in rows:
            if unit.mutant == name:
                unit.path, unit.path_verdict, unit.path_iterations, unit.path_detail = path_fields[name]

    _set_path_column(rows, path_fields, path_hunts)
    return Matrix(rows, hunts + list(path_hunts.values()), decided)


def _set_path_column(rows: list[Kill], path_fields: dict, path_hunts: dict) -> None:
    """Each row's path column as far as it is known before the hunts: decided (unreachable), or unfinished."""
    for row in rows:
        if row.mutant in path_fields:
            row.path, row.path_verdict, row.path_iterations, row.path_detail = path_fields[row.mutant]
        elif row.mutant in path_hunts:
            row.path = "unfinished"


def _decided_unhunted(check: Check, mutant: Mutant, device: str, checks: list[Check], blind: dict,
                      path_only: bool) -> Kill | None:
    """The row of a planted bug that is not hunted here, and why (no oracle on this device, a blind sanitizer, an
    implementation standing in for its code, a stale patch, a path-only run); None: it is hunted."""
    oracle = mutant.oracles.get(device)
    if oracle is None:
        return Kill(check.name, mutant.name, device, "-", "not_checked", reason=mutant.why_not)
    if oracle in sanitizer.TOOLS and (reason := _sanitizer_blind(oracle, device, blind)):
        return Kill(check.name, mutant.name, device, oracle, "not_checked", reason=reason)
    if reason := impl.replaces(mutant, checks):
        return Kill(check.name, mutant.name, device, oracle, "not_checked", reason=reason)
    try:
        planted.validate(mutant)
    except planted.StaleMutant as exc:
        return Kill(check.name, mutant.name, device, oracle, "stale", reason=str(exc))
    return Kill(check.name, mutant.name, device, oracle, "not_hunted") if path_only else None


def _sanitizer_blind(tool: str, device: str, known: dict[str, str | None]) -> str | None:
    """Why ``tool`` cannot kill here: no sanitizer or GPU, or its positive control (run once per
    matrix) was not reported. None when the control was caught."""
    if tool not in known:
        gate = sanitizer.gate(tool, device)
        known[tool] = None if gate.state == "caught" else gate.text
    return known[tool]


def table(rows: list[Kill]) -> str:
    """The matrix; with a whole-path check, its column says, per bug, whether the whole step killed it too."""
    with_path = any(k.path != "-" for k in rows)
    path_head = f" {'path':11} {'verdict':16} {'iters':>5}" if with_path else ""
    lines = [f"{'check':28} {'mutant':24} {'oracle':10} {'device':6} {'status':11} {'iters':>5}{path_head}  "
             "launch / reason"]
    for k in rows:
        tail = k.reason or (str(k.launch) if k.launch else "")
        if k.other_failures:
            tail += "  " + k.also_failed()
        path = f" {k.path:11} {k.path_verdict:16} {k.path_iterations:>5}" if with_path else ""
        if with_path and k.path not in ("killed", "-"):
            tail += f"  [path: {k.path_detail}]"
        lines.append(f"{k.check:28} {k.mutant:24} {k.oracle:10} {k.device:6} {k.status:11} {k.iterations:>5}{path}  "
                     f"{tail}")
    return "\n".join(lines)
