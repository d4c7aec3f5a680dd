"""Cases built ahead of their turn, in processes of their own, while a GPU run's workers judge others.

A refusal family's case holds one valid case per corruption (``stress.families.refusals``). On a GPU those are
model-sized: attention's 33 take seconds of host random draws, a sixth of a whole gate's worker time, while
judging their refusals takes a fraction of a second. A ``Check.host_heavy`` check's cases cost tens of
milliseconds of host work or more to build and to compute the reference of (the engine's reference replays
every step). Builders (processes that launch nothing, on the cores the GPU workers leave) do that work ahead
of the plan and write each case, with its reference's outputs, into a file that its worker maps
(``torch.load(mmap=True)``) instead. A case follows from (check, family, seed, device, launch) alone wherever
it is built, and the reference from the case, so the cases and verdicts are the ones the worker would have
reached; a build that fails, or whose builder dies, leaves its case to its worker, and a reference that fails
or writes its inputs leaves the reference to it, as without builders.

Only cases of the plan's own (no planted bug, no sanitizer tool) are built ahead: a mutant may patch what a
family or a reference calls, and it is planted in the worker only. A reference is computed ahead only for the
suite's own kernels (an implementation's contract profile may change what it expects).
"""

import os
import shutil
import tempfile
from collections import deque
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import wait

import torch

from stress.core import gpus, impl, interrupts, pool, refusal
from stress.core.cases import Task, by_output, task_case
from stress.core.guards import shared_inputs, written_in_place
from stress.core.types import Case, Check

BUILDERS = 8  # at most, per run
AHEAD = 4  # cases built or building per builder, at most, before their turn (each up to about 1 GB of file)
SHM = "/dev/shm"


def builders_for(device: str, jobs: int) -> int:
    """Builders for a run that asks for ``auto``: on a GPU with pool workers, one per core the workers leave (at
    least one, at most ``BUILDERS``); none on the CPU, where the workers take every core and the cases are small."""
    if device != "cuda" or jobs == 0:
        return 0
    return max(1, min(BUILDERS, gpus.cores() - jobs))


def built_ahead(check: Check, task: Task) -> bool:
    """Whether ``task``'s case is one a builder builds: a refusal family's or a host-heavy check's, with no
    planted bug or tool."""
    plain = task.mutant is None and task.patched is None and task.tool is None
    return plain and (check.host_heavy or refusal.is_family(check.families[task.family]))


def case_of(check: Check, task: Task, device: str) -> tuple[Case, dict | None]:
    """The task's case, and its reference's outputs where a builder computed them (else None): mapped from its
    builder's file where it was built ahead, else built here."""
    if task.prebuilt:
        built = torch.load(task.prebuilt, mmap=True, weights_only=False)
        return built["case"], built["expected"]
    return task_case(check, task, device), None


# ---------------------------------------------------------------- the builder side


def _init_builder(slot: int, device: str) -> None:
    os.environ["SPECSAN_DEVICE"] = device
    torch.set_num_threads(1)
    import stress.checks  # noqa: F401  - define every kernel once, up front


def _build(item: tuple[Task, str, str]) -> str:
    """Build the task's case, and a host-heavy check's reference, into ``path`` (whole or not at all: written
    beside it, then renamed)."""
    from stress import checks

    task, device, path = item
    check = checks.get(task.check)
    case = task_case(check, task, device)
    expected = None
    if check.host_heavy and not case.refused and not impl.judged_by(check, checks.BY_NAME):
        expected = _reference(check, case)
    torch.save({"case": case, "expected": expected}, path + ".part")
    os.replace(path + ".part", path)
    return path


def _reference(check: Check, case: Case) -> dict | None:
    """The reference's outputs on the case's own tensors (no copies of a GPU-sized case; an output that keeps one
    of them is saved once with the case), or None where it raises or writes one of them."""
    inputs, versions = shared_inputs(case)
    try:
        values = check.reference(**inputs)
    except Exception:  # noqa: BLE001 - its worker computes it again, and reports the failure as its own
        return None
    if written_in_place(inputs, versions):
        return None
    return by_output(check, values)


# ---------------------------------------------------------------- the parent side


@dataclass
class _Build:
    task: Task
    path: str
    state: str = "queued"  # queued | building | ready | failed
    seconds: float = 0.0  # the builder's


class _Builder:
    def __init__(self, process, conn):
        self.process, self.conn = process, conn
        self.ready = False
        self.build: _Build | None = None  # the build it is running


class Ahead:
    """The plan's tasks in order, those that ``built_ahead`` picks handed out once built (``next``).

    A task whose build is not done yet waits, and later tasks go first; a waiting task goes out as soon as its
    build is done, the earliest such first, and once nothing else is left the first build to finish is waited
    for. ``finished(task)`` removes its file (after its final outcome: a task run again reads it again);
    ``close`` stops the builders and removes every file.
    """

    def __init__(self, tasks: list[Task], device: str, builders: int):
        from stress import checks

        self.device = device
        self.pending = deque(tasks)
        self.builds: dict[int, _Build] = {}  # by position in the plan: a task may come twice
        self.waiting: deque[int] = deque()  # positions whose tasks came up before their builds were done
        self.window = AHEAD * builders
        self.folder = tempfile.mkdtemp(prefix="specsan-cases-", dir=_folder(self.window)) if builders else ""
        for position, task in enumerate(tasks if builders else ()):
            if built_ahead(checks.get(task.check), task):
                self.builds[position] = _Build(task, os.path.join(self.folder, f"{position}.pt"))
        self.queued = deque(sorted(self.builds))
        self.position = 0  # of the next pending task in the plan
        self.seconds = 0.0  # the builders' seconds, every build
        self.built: dict[str, float] = {}  # the builder's seconds of each case handed out built
        context = get_context("spawn")
        self.builders = [_Builder(*pool.serving(context, _build, _init_builder, (device,), slot, "builder"))
                         for slot in range(builders if self.builds else 0)]

    def next(self) -> Task | None:
        """The next task to hand out, ``prebuilt`` set where its case was built; None when none is left."""
        self._poll(0)
        if (position := self._done()) is not None:
            return self._handed(position)
        while self.pending:
            task, position = self.pending.popleft(), self.position
            self.position += 1
            build = self.builds.get(position)
            if build is None or build.state in ("ready", "failed"):
                return self._handed(position) if build else task
            self.waiting.append(position)
        if not self.waiting:
            return None
        while (position := self._done()) is None:
            self._poll(None)  # a builder that dies fails its build, and the last one every build (``_lost``)
        return self._handed(position)

    def _done(self) -> int | None:
        """The first waiting task whose build is over (built or failed), taken off the waiting list; None if none."""
        for i, position in enumerate(self.waiting):
            if self.builds[position].state in ("ready", "failed"):
                del self.waiting[i]
                return position
        return None

    def finished(self, task: Task) -> float:
        """``task`` has its final outcome: its file is removed. Returns the seconds its builder took (0.0: its
        case was not built ahead)."""
        if not task.prebuilt:
            return 0.0
        _remove(task.prebuilt)
        return self.built.pop(task.prebuilt, 0.0)

    def close(self) -> None:
        for builder in self.builders:
            if builder.process.is_alive():
                builder.process.kill()
            builder.process.join()
            builder.conn.close()
        self.builders = []
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _handed(self, position: int) -> Task:
        build = self.builds.pop(position)
        self._dispatch()
        if build.state == "failed":  # its worker builds it, and a build that fails there is its verdict
            return build.task
        self.built[build.path] = build.seconds
        return build.task._replace(prebuilt=build.path)

    def _poll(self, timeout: float | None) -> None:
        """Take the builders' messages (waiting up to ``timeout`` seconds, None: until one comes), then hand
        queued builds to idle builders."""
        if timeout != 0 and self.builders:
            with interrupts.allowed():
                wait([b.conn for b in self.builders], timeout)  # a builder's death closes its pipe: readable
        for builder in list(self.builders):
            while builder.conn.poll():
                try:
                    kind, payload, *seconds = builder.conn.recv()
                except (EOFError, OSError):  # it died
                    self._lost(builder)
                    break
                if kind == "ready":
                    builder.ready = True
                elif kind in ("done", "raised") and builder.build is not None:
                    builder.build.state = "ready" if kind == "done" else "failed"
                    builder.build.seconds = seconds[0]
                    self.seconds += seconds[0]
                    builder.build = None
                elif kind == "failed":  # it could not start: its pipe closes as it exits
                    builder.process.kill()
        self._dispatch()

    def _lost(self, builder: _Builder) -> None:
        builder.process.join()
        builder.conn.close()
        self.builders.remove(builder)
        if builder.build is not None:
            builder.build.state = "failed"
        if not self.builders:  # nothing left to build them: every build still queued goes to the workers
            for position in self.queued:
                if position in self.builds:
                    self.builds[position].state = "failed"
            self.queued.clear()

    def _dispatch(self) -> None:
        """Hand queued builds to idle builders, while fewer than ``window`` are building or built and not handed
        out. Called at every hand-out: it counts them only when a builder is idle and a build is queued."""
        idle = [b for b in self.builders if b.ready and b.build is None]
        if not idle or not self.queued:
            return
        ahead = sum(1 for b in self.builds.values() if b.state in ("building", "ready"))
        for builder in idle:
            while self.queued and self.queued[0] not in self.builds:  # handed out before a builder got to it
                self.queued.popleft()
            if not self.queued or ahead >= self.window:
                return
            build = self.builds[self.queued.popleft()]
            try:
                builder.conn.send((build.task, self.device, build.path))
            except OSError:
                continue  # died: the next poll removes it
            build.state, builder.build = "building", build
            ahead += 1


def _folder(window: int) -> str | None:
    """Shared memory where it holds the window's files (about 1 GB each), else the temporary folder."""
    try:
        stats = os.statvfs(SHM)
    except OSError:
        return None
    return SHM if stats.f_bavail * stats.f_frsize >= window * (1 << 30) else None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
