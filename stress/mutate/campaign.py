"""``python -m stress mutate``: how much of each check's production code its cases pin down.

For every check, the production functions its cases execute (found by running one case per family
under a profiler, plus every Triton kernel they launch) are mutated by ``stress.mutate.operators``; each
mutant that is not provably the same program (``stress.mutate.equivalence``) is hunted through the check's
families, up to ``iters`` cases per family, in the kill matrix's pool (``stress.mutate.kill_matrix``), and is
killed by any failing verdict. A target several checks execute belongs to each of them; its mutant is
hunted by them in registry order until one kills it (a whole-path check owns only what no other
check executes). Survivors proven equivalent by reasoning are listed in ``equivalent_mutants.toml``.
"""

import json
import os
import subprocess
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field

import tomllib

from stress.core import interrupts, sources, workers
from stress.core.cases import Task, case_seed
from stress.core.types import Check, Verdict
from stress.mutate import kill_matrix as matrix
from stress.mutate import operators as mutate_ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
EQUIVALENT_FILE = os.path.join(os.path.dirname(__file__), "equivalent_mutants.toml")
# Survivors that are real programs but that no check can observe on a device (a launch setting that changes only
# speed, a fallback rung no device shape reaches), each with why: still counted as survivors, but explained.
EXPLAINED_FILE = os.path.join(os.path.dirname(__file__), "surviving_mutants.toml")
RECORDS = os.path.join(ROOT, "records")  # kept mutate.jsonl.gz of whole runs, one device each
# Modules whose mutants the stress families cannot judge, with the reason
EXCLUDED = {
    "kernels.runtime": "device choice at import time, before any case runs",
    "kernels.validate": "argument refusals: the families feed valid inputs only; tests/test_validate*.py covers them",
}
EQUIVALENCE_TIMEOUT = 60.0  # seconds to compile one mutant's kernels to TTIR


@dataclass
class Row:
    """One generated mutant's outcome, as streamed to mutate.jsonl."""

    id: str
    target: str
    operator: str
    file: str
    line: int
    old: str
    new: str
    check: str  # the first check that owns the target (its score counts this row)
    owners: list[str]
    status: str = "pending"  # killed | hang | survived | equivalent | reasoned | not_checked | invalid
    equivalence: str = ""  # the test that decided equivalence: ttir | bytecode | ast | reasoned
    killed_by: str = ""  # the check whose case killed it
    verdict: str = ""
    iterations: int = 0
    families: list[str] = field(default_factory=list)  # families its hunts ran
    repro: str = ""
    detail: str = ""  # the killing case's first detail line: a crash's exception, a divergence's first difference
    reason: str = ""
    explained: str = ""  # why it survives on this device (stress/mutate/surviving_mutants.toml), when it is known
    killed_elsewhere: str = ""  # where and how a kept record of another device killed it (same module source)
    fingerprint: str = ""  # of the target module's source: a resumed run takes this row only if it is unchanged
    unscored: list[str] = field(default_factory=list)  # checks that execute it but failed unmutated: not hunting
    tree: str = ""  # of every kernel and suite source: a resumed survivor is taken as it is only if unchanged
    unjudged_by: str = ""  # the second oracles a stopped run left a survivor without
    operator_class: str = "token"  # token (stress/mutate/operators.py) or semantic (stress/mutate/semantic.py)
    description: str = ""  # what the mutant changes, in words

    def command(self, device: str, iters: int) -> str:
        """The one line that reruns this mutant's hunt."""
        return f"./specsan mutate --mutant {self.id} --device {device} --iters {iters}"


# ---------------------------------------------------------------- what each check executes


@dataclass
class Coverage:
    targets: dict[str, list[str]]  # check -> "module:attr" targets its cases executed, in first-seen order
    launches: dict[str, set]  # "module:kernel" -> launch signatures (for TTIR)
    baseline: dict[str, list[str]]  # check -> failures of the production code itself (then it is skipped)


def _module_of(filename: str, root: str) -> str | None:
    rel = os.path.relpath(filename, root)
    if not rel.startswith("kernels" + os.sep) or not rel.endswith(".py"):
        return None
    return rel[:-3].replace(os.sep, ".").removesuffix(".__init__")


@dataclass
class _Traced:
    seen: list[str]
    launches: dict[str, set]
    failure: str  # the case's failing verdict and repro line ("" when it passed)
    fatal: bool  # its CUDA context is unusable: the pool replaces the worker


def _traced_case(task: Task, device: str, timeout: float) -> _Traced:
    """Run one case recording the production functions executed (a trace function sees every new
    frame of ``kernels/`` code) and the kernels launched with their signatures; and its failure, if any."""
    from stress.mutate import equivalence as mutate_equiv

    seen: dict[str, None] = {}
    launches: dict[str, set] = {}
    modules: dict[str, str | None] = {}

    def trace(frame, event, arg):  # a global trace function: called once per new frame, never per line
        filename = frame.f_code.co_filename
        if filename not in modules:
            modules[filename] = _module_of(filename, ROOT)
        module = modules[filename]
        name = frame.f_code.co_qualname.split(".")[0]
        if module and module not in EXCLUDED and not name.startswith("<"):
            seen[f"{module}:{name}"] = None

    import kernels.block_table

    kernel_class = type(kernels.block_table._gather_rows_kernel)  # every launch goes through its run
    original_run = kernel_class.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        name = f"{self.fn.__module__}:{self.fn.__name__}"
        if (sig := mutate_equiv.signature(self, args, kwargs)) is not None:
            launches.setdefault(name, set()).add(sig)
        seen[name] = None
        seen.update(dict.fromkeys(t for t in mutate_ops.jit_helpers(self) if t.split(":")[0] not in EXCLUDED))
        return original_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    kernel_class.run = recording_run
    sys.settrace(trace)
    try:
        result = workers.run_case(task, device, timeout=timeout, trace=False)
    finally:
        sys.settrace(None)
        kernel_class.run = original_run
    return _Traced(list(seen), launches, f"{result.verdict}: {result.repro()}" if result.failed else "", result.fatal)


def discover(checks: list[Check], device: str, seed: int, jobs: int, timeout: float, log) -> Coverage:
    """Iteration 0 of every family of each check, in the pool: what each check executes and launches,
    and whether the production code itself passes (a check that fails unmutated is not scored)."""
    from functools import partial

    cov = Coverage({c.name: [] for c in checks}, {}, {c.name: [] for c in checks})
    tasks = [Task(c.name, f, case_seed(seed, c.name, f, 0)) for c in checks if device in c.devices for f in c.families]
    left = {c.name: sum(t.check == c.name for t in tasks) for c in checks}
    queue = iter(tasks)

    def done(outcome) -> None:
        task = outcome.item
        if outcome.failure:
            cov.baseline[task.check].append(f"{outcome.failure}: {outcome.detail.strip().splitlines()[-1][:200]}")
        else:
            traced = outcome.value
            known = cov.targets[task.check]
            known += [t for t in traced.seen if t not in known and _has_source(t)]
            for name, sigs in traced.launches.items():
                cov.launches.setdefault(name, set()).update(sigs)
            if traced.failure:
                cov.baseline[task.check].append(traced.failure)
        left[task.check] -= 1
        if left[task.check] == 0:
            failed = cov.baseline[task.check]
            log(f"  {task.check}: {len(cov.targets[task.check])} target(s)"
                + (f"; the production code FAILS, not scored: {failed[0]}" if failed else "")
                + ("; its mutants are hunted only by other checks that run its targets (raise --timeout if the "
                   "case was only slow)" if failed and failed[0].startswith("timeout") else ""))

    with workers.worker_pool(partial(_traced_case, device=device, timeout=timeout if jobs == 0 else 0), device, jobs,
                            timeout) as case_pool:
        case_pool.run(lambda: next(queue, None), done)
    return cov


def _has_source(target: str) -> bool:
    import importlib

    from stress.core.patches import source_of

    module, attr = target.split(":")
    try:
        source_of(getattr(importlib.import_module(module), attr))
    except (AttributeError, TypeError, OSError):
        return False
    return True


def owners(checks: list[Check], cov: Coverage) -> dict[str, list[str]]:
    """target -> the checks that hunt its mutants, in registry order (whole-path checks last resort)."""
    out: dict[str, list[str]] = {}
    for path in (False, True):
        for check in checks:
            if check.whole_path != path or cov.baseline.get(check.name):
                continue
            for target in cov.targets.get(check.name, ()):
                if not path or target not in out:
                    out.setdefault(target, []).append(check.name)
    return out


# ---------------------------------------------------------------- the equivalence data file


def _key(target: str, operator: str, old: str, new: str) -> tuple:
    return target, operator, old, new


def load_reasoned(path: str = EQUIVALENT_FILE) -> dict[tuple, str]:
    """(target, operator, old, new) -> the reason the mutant is the same program."""
    return {_key(e["target"], e["operator"], e["old"], e["new"]): e["reason"] for e in _entries(path)}


def explain(rows: list[Row], device: str, entries: list[dict] | None = None) -> list[dict]:
    """Attach to each survivor the reason it survives on ``device``, where the data file gives one; return the
    entries whose mutant was killed here (the reason no longer holds: the entry should go)."""
    entries = _entries(EXPLAINED_FILE) if entries is None else entries
    by_key = {_key(e["target"], e["operator"], e["old"], e["new"]): e for e in entries if device in e["devices"]}
    refuted = []
    for row in rows:
        entry = by_key.get(_key(row.target, row.operator, row.old, row.new))
        if entry is None:
            continue
        if row.status == "survived":
            row.explained = entry["why"]
        elif row.status in ("killed", "hang"):
            refuted.append(entry)
    return refuted


def killed_elsewhere(rows: list[Row], device: str, directory: str = RECORDS) -> None:
    """A survivor here that a kept record of another device killed, on the same module source (its fingerprint),
    is a slip that device shows and this one cannot: the row says where and how; so is a kernel mutant the GPU
    compiler refuses, which only the interpreter runs. That is evidence, not a reason: the row still counts as a
    survivor here."""
    import glob

    from stress.mutate.equivalence import NOT_COMPILED

    if device != "cuda":  # the GPU compiler refused it: a GPU's first launch of the kernel raises
        for row in rows:
            if row.status == "survived" and row.equivalence == NOT_COMPILED:
                row.killed_elsewhere = ("does not compile for a GPU (its TTIR fails, compiled on this machine): a GPU "
                                        "launch of it raises")
    for path in sorted(glob.glob(os.path.join(directory, "mutate-*.jsonl.gz"))):
        header, known = earlier_run(path)
        other = header.get("device")
        if other == device:
            continue
        for row in rows:
            earlier = known.get(row.id)
            if (row.status == "survived" and not row.killed_elsewhere and earlier
                    and earlier.get("fingerprint") == row.fingerprint and earlier.get("status") in ("killed", "hang")):
                row.killed_elsewhere = (f"killed on {other} ({os.path.relpath(path, ROOT)}): {earlier.get('verdict')} "
                                        f"by {earlier.get('killed_by')} after {earlier.get('iterations')} case(s)")


# ---------------------------------------------------------------- the run


class ModulesNotRun(ValueError):
    """The modules a run was limited to hold no code the selected checks execute (a typo in a module of the
    production code, or checks that do not reach it): an empty run would read as nothing to report."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.fix = fix


def plan(checks: list[Check], cov: Coverage, operators: list[str] | None, only: list[str] | None,
         sample: int, seed: int, modules: list[str] | None = None) -> list[Row]:
    """Every generated mutant of every owned target (of ``modules`` only, when given: the code a change
    touched); with ``sample``, at most that many per check, chosen by a hash of (seed, id) so the sample is
    deterministic and spread over the targets."""
    import inspect

    rows, tree = [], tree_fingerprint()
    for target, hunters in owners(checks, cov).items():
        if modules and target.split(":")[0] not in modules:
            continue
        module = sys.modules[target.split(":")[0]]
        file, source_hash = os.path.relpath(inspect.getsourcefile(module)), fingerprint(module)
        unscored = [c for c, failed in cov.baseline.items() if failed and target in cov.targets[c]]
        for g in mutate_ops.generate(target, operators):
            if only and g.id not in only:
                continue
            rows.append(Row(g.id, target, g.operator, file, g.line, g.patch.old, g.patch.new, hunters[0], hunters,
                            fingerprint=source_hash, unscored=list(unscored), tree=tree,
                            operator_class=mutate_ops.operator_class(g.operator), description=g.description))
    if sample:
        by_check: dict[str, list[Row]] = {}
        for row in rows:
            by_check.setdefault(row.check, []).append(row)
        keep = {r.id for group in by_check.values()
                for r in sorted(group, key=lambda r: zlib.crc32(f"{seed}:{r.id}".encode()))[:sample]}
        rows = [r for r in rows if r.id in keep]
    return rows


def classify(rows: list[Row], cov: Coverage, device: str, jobs: int, on_row, on_different=None) -> None:
    """Decide equivalence before anything runs: reasoned (the data file) or the same program; ``on_different``
    sees each row found a different program (a resumed run need not compile it again).

    Compiling to TTIR is CPU work: up to ``jobs`` workers, never more than the CPU cores (the GPU
    machine's 16 cores turn a pass of ~1,600 compiles from tens of minutes into a few)."""
    from stress.core import pool
    from stress.mutate import equivalence as mutate_equiv

    reasoned = load_reasoned()
    pending = {}
    for row in (r for r in rows if r.status == "pending"):
        why = reasoned.get(_key(row.target, row.operator, row.old, row.new))
        if why is not None:  # a resumed survivor too: the reason may have been written since
            row.status, row.equivalence, row.reason = "reasoned", "reasoned", why
            on_row(row)
        elif not row.equivalence:  # resumed rows carry their compiled verdict
            pending[row.id] = row
    if not pending:
        return
    queue = iter(list(pending))

    def decided(outcome) -> None:
        row = pending[outcome.item]
        if outcome.failure == "timeout":  # undecided: hunted like any other
            row.equivalence = "none (the compile timed out)"
            return
        if outcome.failure:  # a patch that does not even build is no program
            row.status, row.reason = "invalid", outcome.detail.strip().splitlines()[-1][:300]
        else:
            same, row.equivalence = outcome.value
            if not same:
                if on_different:
                    on_different(row)
                return
            row.status = "equivalent"
        on_row(row)

    count = max(1, min(jobs, os.cpu_count() or 1, len(pending)))
    with pool.Pool(mutate_equiv.decide_id, count, initializer=mutate_equiv.init_worker,
                   initargs=(device, cov.launches), timeout=EQUIVALENCE_TIMEOUT) as case_pool:
        case_pool.run(lambda: next(queue, None), decided)


def _entries(path: str = EQUIVALENT_FILE) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return tomllib.load(f).get("mutant", [])


def stale_entries(rows: list[Row], targets: set[str], entries: list[dict] | None = None) -> list[dict]:
    """Data-file entries for the targets and operators generated here that no longer match a generated mutant
    (an ``--operator`` run judges only the entries of its operators)."""
    generated = {_key(r.target, r.operator, r.old, r.new) for r in rows}
    operators = {r.operator for r in rows}
    entries = _entries() if entries is None else entries
    return [e for e in entries if e["target"] in targets and e["operator"] in operators
            and _key(e["target"], e["operator"], e["old"], e["new"]) not in generated]


class Phases:
    """Seconds each part of a run took, logged as it ends: what a run split over limited device time sizes
    ``--hunt-seconds`` by (discovery and the second oracles are not bounded by it)."""

    def __init__(self, log):
        self.log, self.seconds, self._mark = log, {}, time.perf_counter()

    def end(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._mark, 1)
        self._mark = now
        self.log(f"specsan mutate: {name} took {self.seconds[name]:g} s")


def hunt_generated(rows: list[Row], device: str, *, iters: int, seed: int, jobs: int, timeout: float, on_row,
         hunt_seconds: float = 0.0, log=None, phases: Phases | None = None) -> None:
    """Hunt every undecided row through its owners in turn, each with up to ``iters`` cases per family.
    ``hunt_seconds`` (0: none) bounds the hunting: past it no case starts, the rows not yet decided stay
    pending (a later ``--resume`` hunts them), and the survivors found so far still meet the second oracles,
    which a run stopped by a signal or a time limit never reaches."""
    from stress import checks as registry

    deadline = time.monotonic() + hunt_seconds if hunt_seconds else None
    survivors = [r for r in rows if r.status == "survived" and r.unjudged_by]  # resumed: their families are done
    for row in survivors:
        row.unjudged_by = row.reason = ""
    for round_ in range(max((len(r.owners) for r in rows), default=0)):
        hunts, by_kill = [], {}
        for row in rows:
            if row.status == "pending" and round_ < len(row.owners):
                check = registry.get(row.owners[round_])
                families = tuple(check.families)
                h = matrix._Hunt(matrix.Kill(check.name, row.id, device, matrix.ANY, "unfinished"), families, None,
                                 iters * len(families), seed, mutant=mutate_ops.resolve(row.id))
                hunts.append(h)
                by_kill[id(h.kill)] = (row, h)

        def decided(kill, by_kill=by_kill, round_=round_):
            row, h = by_kill[id(kill)]
            ran = sorted({h.families[i % len(h.families)] for i in h.results})
            row.families = sorted(set(row.families) | {f"{kill.check}/{f}" for f in ran})
            row.iterations += kill.iterations
            if kill.status == "killed":
                row.status, row.killed_by, row.verdict, row.repro = "killed", kill.check, kill.verdict, kill.repro
                row.detail = kill.detail
            elif Verdict.TIMEOUT in kill.other_failures:
                timed = next(r for r in h.results.values() if r.verdict == Verdict.TIMEOUT)
                row.status, row.killed_by, row.verdict, row.repro = "hang", kill.check, Verdict.TIMEOUT, timed.repro()
            elif kill.status == "unfinished":  # a signal stopped its hunt: undecided, never a survivor
                return
            elif round_ == len(row.owners) - 1:  # the last owner could not kill it either
                row.status = "survived"
                survivors.append(row)  # streamed once the second oracles have judged it
                return
            if row.status != "pending":
                on_row(row)

        try:
            matrix._run_hunts(hunts, device, jobs, timeout, decided, deadline=deadline)
        except BaseException:
            unjudged(survivors, on_row)
            raise
    left = sum(r.status == "pending" for r in rows)
    if deadline is not None and left and log:
        log(f"specsan mutate: --hunt-seconds {hunt_seconds:g} spent; {left} mutant(s) left pending for a later "
            f"--resume; the second oracles judge the {len(survivors)} survivor(s) found")
    if phases:
        phases.end("hunting")
    second_oracles(survivors, device, seed=seed, timeout=timeout, on_row=on_row)
    if phases:
        phases.end("unit tests and memcheck")


def second_oracles(rows: list[Row], device: str, *, seed: int, timeout: float, on_row) -> None:
    """What survived every family meets the oracles its families' outputs cannot give: first its checks' unit
    tests (seconds a mutant), then, for what they leave, memcheck on a GPU (a sanitized process per case, the
    long part). A row is streamed once it is decided, so a run stopped during memcheck keeps the unit tests'
    kills."""
    left, missing = list(rows), "memcheck and unit tests"
    try:
        judge_by_unit_tests([r for r in rows if _unit_tests_of(r)], device, timeout)
        missing = "memcheck"
        for row in [r for r in left if r.status != "survived"]:
            on_row(row)
            left.remove(row)
        judge_by_memcheck(left, device, seed=seed, timeout=timeout)
        while left:
            on_row(left.pop(0))
    finally:
        unjudged(left, on_row, missing)


MEMCHECK = "memcheck"


def judge_by_memcheck(rows: list[Row], device: str, *, seed: int, timeout: float) -> None:
    """On a GPU, survivors replayed under compute-sanitizer memcheck, one case per family of their first owner
    that can be sanitized (each case its own process), after the tool's positive control in this run. An
    over-read whose value is never used changes no output on a GPU, and only a memory checker sees it (the
    CPU's tracer kills it as fail:oob): a finding kills the mutant with memcheck's verdict (fail:oob, as the
    tracer's; its row lists the memcheck hunt among its families). Without a caught control, or without an
    owner that can be sanitized, the survivors stay as they are, with the reason."""
    from stress import checks as registry
    from stress.sanitize import runner as sanitizer

    if device != "cuda" or not rows:
        return
    gate = sanitizer.gate(MEMCHECK, device)
    if gate.state != "caught":
        for row in rows:
            row.reason = f"memcheck not run: {gate.text}"
        return
    hunts, by_kill = [], {}
    for row in rows:
        owners = [registry.get(name) for name in row.owners]
        check = next((c for c in owners if sanitizer.why_not(c) is None), None)
        if check is None:
            row.reason = f"memcheck not run: {sanitizer.why_not(owners[0])}"
            continue
        families = tuple(check.families)
        h = matrix._Hunt(matrix.Kill(check.name, row.id, device, MEMCHECK, "unfinished"), families, None,
                         len(families), seed, mutant=mutate_ops.resolve(row.id))
        hunts.append(h)
        by_kill[id(h.kill)] = row

    def decided(kill) -> None:
        row = by_kill[id(kill)]
        row.families.append(f"memcheck: {kill.check}, {kill.iterations} case(s)")
        if kill.status == "unfinished":  # a signal: the clean cases so far are no verdict
            row.reason = (f"memcheck unfinished: the run was interrupted after {kill.iterations} of its "
                          f"{kill.check} case(s) ran clean")
            row.unjudged_by = MEMCHECK
        if kill.status == "killed":
            row.status, row.killed_by, row.verdict, row.repro = "killed", kill.check, kill.verdict, kill.repro
            row.detail = kill.detail

    matrix._run_hunts(hunts, device, sanitizer.default_jobs(), timeout, decided)


UNIT_TEST_VERDICT = Verdict.UNIT_TEST


def _unit_tests_of(row: Row) -> tuple[str, ...]:
    from stress import checks as registry

    return tuple(dict.fromkeys(node for name in row.owners for node in registry.get(name).unit_tests))


def _pytest_line(nodes: tuple[str, ...], device: str, mutant_id: str) -> str:
    return f"SPECSAN_MUTANT={mutant_id} python -m pytest -q -p no:xdist --device {device} {' '.join(nodes)}"


def _pytest(nodes: tuple[str, ...], device: str, timeout: float, mutant_id: str = "") -> tuple[int, str]:
    """pytest's exit code for ``nodes`` in a fresh process (under ``mutant_id``, none if empty), and its last
    line; -1 when it ran past ``timeout`` seconds."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider",
               "--device", device, *nodes]
    try:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "SPECSAN_MUTANT": mutant_id},
                              capture_output=True, text=True, timeout=timeout or None)
    except subprocess.TimeoutExpired:
        return -1, f"ran past {timeout:g} s"
    return done.returncode, ((done.stdout + done.stderr).strip().splitlines() or [""])[-1]


def judge_by_unit_tests(rows: list[Row], device: str, timeout: float) -> None:
    """Survivors of every family against their checks' ``unit_tests`` (host logic that no device's cases reach):
    a failing test kills the mutant as fail:unit-test. The tests must pass on the production code first (once
    per set of tests), else they judge nothing and the mutants stay survivors, with the reason."""
    production: dict[tuple, tuple[int, str]] = {}
    for row in rows:
        nodes = _unit_tests_of(row)
        if nodes not in production:
            production[nodes] = _pytest(nodes, device, timeout)
        rc, last = production[nodes]
        if rc != 0:
            row.reason = f"unit tests not run: the production code fails them (pytest exit {rc}: {last})"
            continue
        rc, last = _pytest(nodes, device, timeout, row.id)
        row.families.append("unit tests: " + ", ".join(node.split("::")[-1] for node in nodes))
        if rc == 1:
            row.status, row.killed_by, row.verdict = "killed", "unit tests", UNIT_TEST_VERDICT
            row.repro = _pytest_line(nodes, device, row.id)
        elif rc != 0:
            row.reason = f"unit tests could not judge it (pytest exit {rc}: {last})"


def unjudged(rows: list[Row], on_row, missing: str = "memcheck and unit tests") -> None:
    """Survivors of their families that a stopped run leaves without (some of) the second oracles' verdicts,
    ``missing``: streamed as they stand, with the reason."""
    for row in rows:
        if row.status == "survived" and not row.reason:  # else a reason of its own (memcheck cannot sanitize it)
            row.reason, row.unjudged_by = f"{missing} not run: the run was interrupted", missing
        on_row(row)


# ---------------------------------------------------------------- scores


def scores(rows: list[Row], key) -> dict[str, dict]:
    """Per group (check or module): counts by status and the score, killed / (killed + survived)."""
    out: dict[str, dict] = {}
    for row in rows:
        group = out.setdefault(key(row), {s: 0 for s in
                                          ("generated", "equivalent", "reasoned", "invalid", "killed", "hang",
                                           "survived", "pending")})
        group["generated"] += 1
        group[row.status if row.status in group else "pending"] += 1
    for group in out.values():
        judged = group["killed"] + group["hang"] + group["survived"]
        group["score"] = round(100.0 * (group["killed"] + group["hang"]) / judged, 1) if judged else None
    return out


def scores_by_class(rows: list[Row]) -> dict[str, dict]:
    """The scores per check and per module of each operator class the rows hold, apart: a run of one-token
    and semantic mutants says how each kind of slip fares, not one blend of both."""
    out = {}
    for name in mutate_ops.OPERATOR_CLASSES:
        group = [r for r in rows if r.operator_class == name]
        if group:
            out[name] = {"by_check": scores(group, lambda r: r.check),
                         "by_module": scores(group, lambda r: r.target.split(":")[0])}
    return out


def score_table(title: str, table: dict[str, dict]) -> str:
    lines = [f"{title:34} {'gen':>5} {'equiv':>5} {'reas':>5} {'inval':>5} {'killed':>6} {'hang':>5} "
             f"{'surv':>5} {'pend':>5} {'score':>7}"]
    for name, g in table.items():
        score = "-" if g["score"] is None else f"{g['score']:.1f}%"
        lines.append(f"{name:34} {g['generated']:>5} {g['equivalent']:>5} {g['reasoned']:>5} {g['invalid']:>5} "
                     f"{g['killed']:>6} {g['hang']:>5} {g['survived']:>5} {g['pending']:>5} {score:>7}")
    return "\n".join(lines)


def survivor_lines(rows: list[Row], device: str, iters: int) -> list[str]:
    out = []
    for r in rows:
        if r.status != "survived":
            continue
        old, new = r.old.strip().replace("\n", " | "), r.new.strip().replace("\n", " | ")
        why = (f"    why it survives: {' '.join(r.explained.split())}" if r.explained else
               f"    {r.killed_elsewhere}; on {device}: no reason in {os.path.basename(EXPLAINED_FILE)} yet"
               if r.killed_elsewhere else
               f"    UNEXPLAINED: a family that kills it, or its reason in {os.path.basename(EXPLAINED_FILE)}")
        out += [f"SURVIVED {r.id}  ({r.file}:{r.line}, {r.operator}, equivalence test: {r.equivalence})",
                *([f"    {r.description}"] if r.operator_class == "semantic" else []),
                f"    - {old}", f"    + {new}", f"    ran: {', '.join(r.families)} ({r.iterations} cases)", why,
                *([f"    note: {r.reason}"] if r.reason else []),
                *([f"    not hunted by {', '.join(r.unscored)}, which failed unmutated here (see discovery)"]
                  if r.unscored else []),
                f"    {r.command(device, iters)}"]
    return out


class Stream:
    """mutate.jsonl in the report folder: a run record, one line per decided mutant (and one per mutant found a
    different program, so a resumed run need not compile it again), an end record."""

    NAME = "mutate.jsonl"

    def __init__(self, directory: str | None, header: dict):
        self.file = None
        if directory:
            os.makedirs(directory, exist_ok=True)
            self.file = open(os.path.join(directory, self.NAME), "w", buffering=1)
            self.write({"run": header})

    def write(self, record: dict) -> None:
        if self.file:
            self.file.write(json.dumps(record) + "\n")

    def row(self, row: Row) -> None:
        self.write({"mutant": asdict(row)})

    def different(self, row: Row) -> None:
        """A row the equivalence pass found a different program, before its hunt decides it."""
        self.write({"different": {"id": row.id, "equivalence": row.equivalence, "fingerprint": row.fingerprint}})

    def close(self, end: dict) -> None:
        self.write({"end": end})
        if self.file:
            self.file.close()


RESUMED_FIELDS = ("status", "equivalence", "killed_by", "verdict", "iterations", "families", "repro", "detail",
                  "reason", "unjudged_by")
TREE = ("kernels", "reference", "stress", "tests")  # what a survivor's hunt ran: a change may kill it


def tree_fingerprint() -> str:
    """A hash of every kernel and suite source (families, runner, oracles, references, unit tests): a survivor
    resumed under the same tree would meet the same cases and oracles again."""
    return sources.fingerprint(TREE, files=("conftest.py",))


def fingerprint(module) -> str:
    """A hash of the module's source: a mutant's id pins its own line, this the code around it."""
    import hashlib
    import inspect

    return hashlib.sha256(inspect.getsource(module).encode()).hexdigest()[:16]


def earlier_run(path: str) -> tuple[dict, dict[str, dict]]:
    """An earlier run's mutate.jsonl (or .jsonl.gz): its header and its mutants by id, decided ones and those
    only found a different program (status pending) (OSError, ValueError if unreadable)."""
    import gzip

    header, known = {}, {}
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for record in map(json.loads, f):
            header = record.get("run", header)
            for kind in ("different", "mutant"):  # a decided row replaces its classification
                if kind in record:
                    known[record[kind]["id"]] = {"status": "pending", **record[kind]}
    return header, known


def resume(rows: list[Row], known: dict[str, dict], on_row) -> int:
    """Rows an earlier run of the same settings decided take its outcome (streamed again, so this run's
    mutate.jsonl is whole), if their module's source is unchanged since; the rest stay pending, those it
    found a different program without compiling them again. A survivor is hunted again (families and oracles
    added since may kill it) unless every kernel and suite source is unchanged (a run split over several
    device slots); then it is taken as it is, and one whose unit tests or memcheck a signal cut off meets them
    without its families (``hunt``). Returns how many were taken."""
    taken, reasoned = 0, load_reasoned()
    for row in rows:
        earlier = known.get(row.id)
        if earlier is None or earlier.get("fingerprint") != row.fingerprint:
            continue
        if earlier.get("status") == "equivalent" and earlier.get("equivalence", "").startswith("ttir"):
            continue  # decided again: compile work, and the launches it is compared in may cover more now
        status = earlier.get("status", "pending")
        if status == "pending" or status == "survived" and (
                earlier.get("tree") != row.tree or _key(row.target, row.operator, row.old, row.new) in reasoned):
            row.equivalence = earlier.get("equivalence", "")
            continue
        for name in RESUMED_FIELDS:
            setattr(row, name, earlier.get(name, getattr(row, name)))
        taken += 1
        if not row.unjudged_by:  # else streamed once its second oracles have judged it
            on_row(row)
    return taken


def run(checks: list[Check], device: str, *, iters: int, seed: int, jobs: int, timeout: float,
        operators: list[str] | None, only: list[str] | None, sample: int, report: str | None, log,
        resumed: tuple[str, dict[str, dict]] | None = None, hunt_seconds: float = 0.0,
        modules: list[str] | None = None) -> dict:
    """The whole command; returns the JSON summary. ``resumed``: (path, decided rows) of an earlier run of
    the same device, iters and seed, whose decisions are taken instead of hunting those mutants again;
    ``hunt_seconds``: see ``hunt``; ``modules``: see ``plan``."""
    start = time.perf_counter()
    header = {"device": device, "iters": iters, "seed": seed, "jobs": jobs, "timeout": timeout, "sample": sample,
              "modules": modules, "hunt_seconds": hunt_seconds, "operators": operators,
              "checks": [c.name for c in checks],
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), **({"resumed_from": resumed[0]} if resumed else {})}
    stream = Stream(report, header)
    phases = Phases(log)
    log(f"specsan mutate: finding the production code each check executes on {device} (one case per family)")
    for check in checks:
        if device not in check.devices:
            log(f"  {check.name}: not_checked on {device} ({check.skipped(device=device)})")
    try:
        cov = discover(checks, device, seed, jobs, timeout, log)
    except interrupts.Interrupted:
        stream.close({"complete": False, "interrupted": "during discovery"})
        raise
    phases.end("discovery")
    rows = plan(checks, cov, operators, only, sample, seed, modules)
    if modules and not rows:
        owned = sorted({t.split(":")[0] for t in owners(checks, cov)})
        stream.close({"complete": False, "interrupted": "no target in --module"})
        raise ModulesNotRun(f"no code of {', '.join(modules)} is run by the selected checks here",
                            f"the modules they run: {', '.join(owned)}")
    done, reported = [0], set()
    by_check: dict[str, list[Row]] = {}
    for row in rows:
        by_check.setdefault(row.check, []).append(row)

    def on_row(row: Row) -> None:
        done[0] += 1
        stream.row(row)
        detail = {"killed": f"{row.verdict} by {row.killed_by} after {row.iterations} case(s)",
                  "hang": f"hang ({row.verdict}) under {row.killed_by}", "equivalent": f"same {row.equivalence}",
                  "survived": f"{row.iterations} case(s)"}.get(row.status, row.reason[:80])
        log(f"  [{done[0]}/{len(rows)}] {row.status:10} {row.id}  {detail}")
        group = by_check[row.check]
        if row.check not in reported and all(r.status != "pending" for r in group):
            reported.add(row.check)
            g = scores(group, lambda r: r.check)[row.check]
            log(f"  -- {row.check}: score {g['score']}% ({g['killed'] + g['hang']} killed of "
                f"{g['killed'] + g['hang'] + g['survived']} non-equivalent)")

    log(f"specsan mutate: {len(rows)} mutant(s) of {len(owners(checks, cov))} target(s); deciding equivalence")
    interrupted = None
    try:
        if resumed:
            taken = resume(rows, resumed[1], on_row)
            log(f"specsan mutate: {taken} mutant(s) decided in {resumed[0]}, taken as they are")
        classify(rows, cov, device, jobs, on_row, stream.different)
        phases.end("equivalence")
        log(f"specsan mutate: hunting {sum(r.status == 'pending' for r in rows)} mutant(s), up to {iters} case(s) "
            f"per family, {jobs} worker(s)")
        hunt_generated(rows, device, iters=iters, seed=seed, jobs=jobs, timeout=timeout, on_row=on_row,
             hunt_seconds=hunt_seconds, log=log, phases=phases)
    except interrupts.Interrupted as exc:  # what was decided is scored; the rest stays pending
        interrupted = exc
    except BaseException as exc:
        interrupted = exc
        raise
    finally:
        targets = {r.target for r in rows}
        # a partial run cannot tell a stale entry from one it did not generate
        whole = not only and not sample and not modules
        stale = stale_entries(rows, targets) if whole else []
        explanations = _entries(EXPLAINED_FILE)
        stale_explained = stale_entries(rows, targets, explanations) if whole else []
        refuted = explain(rows, device, explanations)
        killed_elsewhere(rows, device)
        summary = {"run": header, "by_check": scores(rows, lambda r: r.check),
                   "by_module": scores(rows, lambda r: r.target.split(":")[0]), "by_class": scores_by_class(rows),
                   "survivors": [asdict(r) for r in rows if r.status == "survived"],
                   "stale_equivalences": stale, "stale_explanations": stale_explained,
                   "refuted_explanations": refuted, "wall_s": round(time.perf_counter() - start, 1),
                   "baseline_failures": {k: v for k, v in cov.baseline.items() if v}}
        summary["interrupted"] = getattr(interrupted, "name", None) or (interrupted and type(interrupted).__name__)
        complete = interrupted is None and all(r.status != "pending" for r in rows)
        stream.close({"complete": complete, "interrupted": summary["interrupted"],
                      "wall_s": summary["wall_s"], "phases": phases.seconds, "by_check": summary["by_check"],
                      "by_class": summary["by_class"]})
    summary["rows"] = rows
    summary["exit_code"] = getattr(interrupted, "exit_code", None)
    return summary
