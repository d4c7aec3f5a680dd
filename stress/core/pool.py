"""Worker processes that can be killed: a deadline per task, a death charged to its own task.

A kernel that spins never returns to Python, so no signal handler can stop it, and a kernel
that faults takes its process down; ``concurrent.futures`` can do nothing about the first and
breaks the whole executor on the second. Here every worker is a spawned process with its own
pipe: the parent sends one task at a time, waits on every pipe and every process sentinel at
once, kills a worker whose task outlives its deadline, and replaces any worker that dies or is
retired, so only that task is charged. There are no queues or locks, so nothing is left for the
multiprocessing resource tracker to clean up; it is stopped with the pool.

Workers ignore SIGINT and SIGTERM (a Ctrl-C reaches the whole process group; the parent decides)
and die with the parent, even a SIGKILLed one. ``Pool(jobs=0)`` runs tasks in this process.
"""

import ctypes
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import get_context, resource_tracker
from multiprocessing.connection import wait
from typing import Any

from stress.core import interrupts

_PR_SET_PDEATHSIG = 1
_STOP = None  # sent to a worker: exit
_START_DEATHS = 3  # workers that may die before they are ready, per pool, before it gives up


@dataclass
class Outcome:
    """How one task ended: ``value`` when ``fn`` returned, else ``failure`` and ``detail`` say why not."""

    item: Any
    value: Any = None
    failure: str = ""  # "" | "timeout" (killed at its deadline) | "died" (the worker died) | "raised"
    detail: str = ""
    seconds: float = 0.0
    slot: int | None = None  # the worker slot that ran it (a slot owns a GPU); None: run in this process


class PoolError(RuntimeError):
    """A worker could not even start (its initializer failed or it died on the way)."""


def signal_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


# ---------------------------------------------------------------- the worker side


def _die_with_parent(parent: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies, so no worker outlives the run."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's shutdown still joins every worker
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _serve(conn, fn, initializer, initargs, slot: int, parent: int) -> None:
    # Signals were blocked by the parent around start(): ignore them first, then unblock, so a
    # Ctrl-C that reached the process group while this worker started is dropped, not raised.
    for s in interrupts.SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupts.SIGNALS)
    _die_with_parent(parent)
    try:
        if initializer is not None:
            initializer(slot, *initargs)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises PoolError
        conn.send(("failed", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is _STOP:
            return
        start = time.monotonic()
        try:
            message = ("done", fn(item), time.monotonic() - start)
        except Exception:  # noqa: BLE001 - the task's failure, not the worker's
            message = ("raised", traceback.format_exc(), time.monotonic() - start)
        try:
            conn.send(message)
        except Exception:  # noqa: BLE001 - a value that does not pickle
            conn.send(("raised", traceback.format_exc(), message[2]))


# ---------------------------------------------------------------- the parent side


def serving(context, fn: Callable, initializer: Callable | None, initargs: tuple, slot: int, role: str):
    """A started process serving ``fn`` over a pipe (``_serve``), and the parent's end of that pipe. Its first
    message is ``("ready", pid)`` or ``("failed", traceback)``; each item sent gets ``("done", value, seconds)``
    or ``("raised", traceback, seconds)`` back."""
    parent_end, child_end = context.Pipe()
    process = context.Process(target=_serve, name=f"specsan-{role}-{slot}", daemon=True,
                              args=(child_end, fn, initializer, initargs, slot, os.getpid()))
    # Blocked here, the signals stay blocked in the child until _serve has set them to SIG_IGN.
    signal.pthread_sigmask(signal.SIG_BLOCK, interrupts.SIGNALS)
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupts.SIGNALS)
    child_end.close()
    return process, parent_end


class _Worker:
    def __init__(self, slot: int, process, conn):
        self.slot, self.process, self.conn = slot, process, conn
        self.ready = False
        self.item: Any = None  # the task it is running
        self.busy = False
        self.started = 0.0  # when that task was sent
        self.created = self.since = time.monotonic()  # when it was started; since: when it last became idle

    def send(self, item) -> bool:
        """Hand ``item`` over; False when the worker turns out to be dead (its pipe is closed)."""
        try:
            self.conn.send(item)
        except OSError:
            return False
        self.item, self.busy, self.started = item, True, time.monotonic()
        return True

    def finish(self) -> tuple[Any, float]:
        item, seconds = self.item, time.monotonic() - self.started
        self.item, self.busy, self.since = None, False, time.monotonic()
        return item, seconds


class Pool:
    """``jobs`` worker processes running ``fn(item)``; use as a context manager.

    ``initializer(slot, *initargs)`` runs once in each worker (``slot`` in ``range(jobs)``; a
    replacement keeps its slot, so a slot can own a GPU). ``timeout`` (seconds, 0 = none) is
    each task's deadline. ``retire(value)`` true replaces the worker that returned ``value``
    (a poisoned CUDA context needs a fresh process).
    """

    def __init__(self, fn: Callable, jobs: int, *, initializer: Callable | None = None, initargs: tuple = (),
                 timeout: float = 0.0, retire: Callable[[Any], bool] | None = None):
        self.fn, self.jobs, self.timeout = fn, jobs, timeout
        self.initializer, self.initargs, self.retire = initializer, initargs, retire
        self.abandoned: list = []  # tasks that were running when run() was left by an exception
        self._context = get_context("spawn")
        self._workers: list[_Worker] = []
        self._start_deaths = 0
        # where the workers' seconds went outside their tasks: starting (process start to ready), idle (ready
        # with no task handed over: the parent busy with other workers' outcomes) and transit (a task's round trip
        # less its time in the worker: pipes, pickling, the parent's turnaround); held: every worker's life, start
        # to kill, complete once the pool is closed (the rest of it: tasks, and waits with nothing left to start)
        self.seconds = {"starting": 0.0, "idle": 0.0, "transit": 0.0, "held": 0.0}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------ running

    def run(self, source: Callable[[], Any], on_outcome: Callable[[Outcome], None]) -> None:
        """Feed tasks from ``source()`` to idle workers until it returns None with nothing running.

        ``source()`` returning None means "nothing to start now"; it is asked again after the next
        outcome, so a task may depend on earlier outcomes. ``on_outcome`` is called in completion
        order. A signal (under ``interrupts.handled()``) stops the run: nothing new starts, the
        running tasks are listed in ``abandoned`` and ``close()`` kills their workers.
        """
        if self.jobs == 0:
            self._run_here(source, on_outcome)
            return
        try:
            with interrupts.deferred():
                while len(self._workers) < self.jobs:
                    self._start(len(self._workers))
                undelivered = []  # taken from the source for a worker that had just died
                while True:
                    drained = False
                    for worker in list(self._workers):
                        if worker.ready and not worker.busy:
                            interrupts.check()
                            item = undelivered.pop() if undelivered else source()
                            if item is None:
                                drained = True
                                break
                            if not worker.send(item):
                                undelivered.append(item)
                                self._replace(worker)
                            else:
                                self.seconds["idle"] += worker.started - worker.since
                    if drained and not any(w.busy for w in self._workers):
                        return
                    self._wait(on_outcome)
        except BaseException:
            self.abandoned = [w.item for w in self._workers if w.busy]
            raise

    def _run_here(self, source, on_outcome) -> None:
        while True:
            interrupts.check()
            item = source()
            if item is None:
                return
            start = time.monotonic()
            try:
                outcome = Outcome(item, value=self.fn(item))
            except interrupts.Interrupted:
                self.abandoned = [item]
                raise
            except Exception:  # noqa: BLE001 - the task's failure, as in a worker
                outcome = Outcome(item, failure="raised", detail=traceback.format_exc())
            outcome.seconds = time.monotonic() - start
            with interrupts.deferred():
                on_outcome(outcome)

    def _wait(self, on_outcome) -> None:
        """Wait for a message, a death or the nearest deadline; handle whatever happened."""
        deadlines = [w.started + self.timeout for w in self._workers if w.busy and self.timeout]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        by_conn = {w.conn: w for w in self._workers}
        by_sentinel = {w.process.sentinel: w for w in self._workers}
        with interrupts.allowed():
            ready = wait([*by_conn, *by_sentinel], timeout)
        for w in [by_conn[r] for r in ready if r in by_conn]:  # messages first: a result sent just before exit
            self._receive(w, on_outcome)
        for w in {by_sentinel[r] for r in ready if r in by_sentinel}:
            if w in self._workers:  # not already replaced while reading its pipe
                self._died(w, on_outcome)
        now = time.monotonic()
        for w in list(self._workers):
            if w.busy and self.timeout and now - w.started >= self.timeout:
                self._replace(w)
                item, seconds = w.finish()
                on_outcome(Outcome(item, failure="timeout", seconds=seconds, slot=w.slot,
                                   detail=f"ran past its {self.timeout:g} s deadline; its worker was killed"))

    def _receive(self, w: _Worker, on_outcome) -> None:
        try:
            kind, payload, *busy = w.conn.recv()
        except (EOFError, OSError):  # the worker died (its pipe closed with it)
            self._died(w, on_outcome)
            return
        if kind == "failed":
            raise PoolError(f"a worker failed to start:\n{payload}")
        if kind == "ready":
            now = time.monotonic()
            w.ready, w.since = True, now
            self.seconds["starting"] += now - w.created
            return
        item, seconds = w.finish()
        self.seconds["transit"] += max(0.0, seconds - busy[0])
        if kind == "raised":
            on_outcome(Outcome(item, failure="raised", detail=payload, seconds=seconds, slot=w.slot))
            return
        on_outcome(Outcome(item, value=payload, seconds=seconds, slot=w.slot))
        if self.retire is not None and self.retire(payload):
            self._replace(w)

    def _died(self, w: _Worker, on_outcome) -> None:
        w.process.join()
        if not w.ready:
            self._start_deaths += 1  # killed from outside, say; a worker that cannot start at all stops the pool
            if self._start_deaths > _START_DEATHS:
                raise PoolError(f"workers keep dying while starting ({signal_text(w.process.exitcode)})")
        self._replace(w)
        if w.busy:
            item, seconds = w.finish()
            on_outcome(Outcome(item, failure="died", seconds=seconds, slot=w.slot,
                               detail=f"its worker process died ({signal_text(w.process.exitcode)})"))

    # ------------------------------------------------------------ processes

    def _start(self, slot: int) -> None:
        process, parent_end = serving(self._context, self.fn, self.initializer, self.initargs, slot, "worker")
        worker = _Worker(slot, process, parent_end)
        if slot < len(self._workers):
            self._workers[slot] = worker
        else:
            self._workers.append(worker)

    def _replace(self, w: _Worker) -> None:
        """Kill ``w`` (it is stuck, dead or retired) and start a fresh worker in its slot."""
        self._kill(w)
        self._start(w.slot)

    def _kill(self, w: _Worker) -> None:
        if w.process.is_alive():
            w.process.kill()
        w.process.join()
        w.conn.close()
        self.seconds["held"] += time.monotonic() - w.created

    def close(self) -> None:
        """Kill and join every worker, then stop the resource tracker if nothing else needs it."""
        with interrupts.deferred():
            for w in self._workers:
                self._kill(w)
            self._workers = []
            tracker = resource_tracker._resource_tracker
            if not self._context.active_children() and getattr(tracker, "_pid", None) is not None:
                tracker._stop()

