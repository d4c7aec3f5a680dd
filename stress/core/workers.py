"""Worker processes: each judges cases (``stress.core.oracle``) on its share of the cores and of its GPU;
``execute`` streams a run's verdicts back as they finish."""

import dataclasses
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial

import torch

from stress.core import compiles, gpus, impl, interrupts, pool, prebuild
from stress.core.cases import Task
from stress.core.gpu_share import GpuShare, worker_share
from stress.core.oracle import judge_task
from stress.core.types import Result, Verdict


def run_case(task: Task, device: str, timeout: float = 0, trace: bool = True) -> Result:
    """Build, run and judge one case. Never raises: a crash is a verdict.

    On the CPU a case that matches its reference is also traced (``trace=False`` or the task's own ``trace``
    False skips it). A task with a ``tool`` is the sanitizer driver's (``stress.sanitize.runner.run_task``). A
    refusal case (``Case.refused``) is judged by ``stress.core.refusal`` instead of against the reference. A pool
    worker on a GPU holds its GPU shared while the case runs, and runs a case that ran out of device memory
    again, alone on the GPU (``stress.core.gpu_share``).
    """
    trace = trace and task.trace
    if _SHARE is None:
        return _judged_and_released(task, device, timeout, trace)[0]
    waited = time.perf_counter()
    with _SHARE.alone() if task.alone else _SHARE.shared():
        waited = time.perf_counter() - waited
        result, out_of_memory = _judged_and_released(task, device, timeout, trace)
    if out_of_memory:
        waited = time.perf_counter()
        with _SHARE.alone():
            waited = time.perf_counter() - waited
            torch.cuda.empty_cache()
            result, _ = _judged_and_released(task, device, timeout, trace)
        result.details.append("ran again alone on its GPU: it ran out of device memory beside other workers' cases")
    if task.alone:
        result.details.append(f"ran again alone on its GPU, in a fresh worker: {task.alone}")
    result.phases["gpu_wait"] = round(result.phases.get("gpu_wait", 0.0) + waited, 4)
    return result


KEEP_CACHED_BYTES = 16 << 30  # the most device memory a worker keeps cached between cases


_SHARE: GpuShare | None = None  # this pool worker's share of its GPU


_keep_cached = KEEP_CACHED_BYTES


def _judged_and_released(task: Task, device: str, timeout: float, trace: bool) -> tuple[Result, bool]:
    """``judge_task``, then the device memory this worker keeps cached trimmed (the case's tensors are gone), the
    seconds that took counted as the result's ``release``.

    A device error can surface there, after the verdict: a kernel's illegal address is reported at the next
    CUDA call, and one launched late in the case (or freeing its memory) may leave that call to the release.
    It is the case's: ``fail:crash``, and fatal, so the worker with the poisoned context is replaced instead of
    failing every case after it."""
    try:
        result, out_of_memory = judge_task(task, device, timeout, trace, _SHARE.room if _SHARE else None)
    finally:
        start = time.perf_counter()
        failed = _released(device)
    if failed is not None:
        before = f"the verdict before it: {result.verdict}" + (f" ({result.details[0]})" if result.details else "")
        result.verdict, result.fatal = Verdict.CRASH, True
        result.details = [f"releasing the case's device memory raised: {failed}", before]
    result.phases["release"] = round(time.perf_counter() - start, 4)
    return result, out_of_memory


def _released(device: str) -> str | None:
    """Release the case's compile locks and trim the worker's cached device memory; what that raised, if it did."""
    try:
        compiles.release()
        _release_device_memory(device)
    except Exception as exc:  # noqa: BLE001 - a late device error: the case's verdict, not the worker's end
        return "".join(traceback.format_exception_only(exc)).strip()
    return None


def _release_device_memory(device: str) -> None:
    """A case past 2^31 elements (``kv_cache.write``'s big_cache) leaves tens of GB in this process's
    allocator cache; the workers sharing the GPU need them back. Smaller caches are kept."""
    if device == "cuda" and torch.cuda.memory_reserved() > _keep_cached:
        torch.cuda.empty_cache()


def _init_worker(slot: int, device: str, threads: int, locks: str = "", jobs: int = 1) -> None:
    """Set a pool worker up: device, its share of the cores, its GPU (slot modulo the GPUs), its share of
    that GPU (``locks``: the lock folder of ``stress.core.gpu_share``) and of the GPU's memory kept cached."""
    global _SHARE, _keep_cached
    os.environ["SPECSAN_DEVICE"] = device
    torch.set_num_threads(threads)  # workers split the cores instead of each taking them all
    if device == "cuda":
        count = gpus.count()
        if not count:
            raise RuntimeError("a GPU worker sees no CUDA device (torch.cuda.is_available() is False in it); "
                               "check CUDA_VISIBLE_DEVICES and the driver, or run with --device cpu")
        gpu = gpus.gpu_of(slot, count)
        torch.cuda.set_device(gpu)
        sharing = -(-jobs // count)
        memory = torch.cuda.get_device_properties(gpu).total_memory
        _SHARE = GpuShare(locks, gpu, memory, sharing) if locks else None
        if locks:
            compiles.share(os.path.join(locks, "compiles"))
        _keep_cached = min(KEEP_CACHED_BYTES, worker_share(memory, sharing))
    import stress.checks  # noqa: F401  - define every kernel once, up front


_LOCKS: tempfile.TemporaryDirectory | None = None  # the lock files of this process's GPU worker pools


def _lock_folder(device: str) -> str:
    global _LOCKS
    if device != "cuda":
        return ""
    if _LOCKS is None:
        _LOCKS = tempfile.TemporaryDirectory(prefix="specsan-gpus-")
    return _LOCKS.name


def worker_pool(fn, device: str, jobs: int, timeout: float) -> pool.Pool:
    """The pool ``run`` and ``mutants`` share: a case past ``timeout`` is killed with its worker,
    a dead worker is charged to its case, a fatal result (CUDA error, memory verdict) gets its worker replaced."""
    return pool.Pool(fn, jobs, initializer=_init_worker,
                     initargs=(device, worker_threads(jobs), _lock_folder(device), jobs),
                     timeout=timeout if jobs else 0.0, retire=lambda result: result.fatal)


def case_runner(device: str, jobs: int, timeout: float, judge: Callable[..., Result] = run_case):
    """``judge`` (``run_case``, or a driver's variant of it) for a pool: in this process (jobs == 0) the
    deadline is an alarm signal, in workers the pool's watchdog enforces it."""
    return partial(judge, device=device, timeout=timeout if jobs == 0 else 0)


CAPTURE_INVALIDATED = "operation failed due to a previous error during capture"  # cudaErrorStreamCaptureInvalidated


def rerun_alone(task: Task, result: Result, device: str, jobs: int) -> Task | None:
    """The task again, to hold its GPU alone, when its CUDA graph capture was invalidated while other workers
    shared the GPU; None otherwise (and for a rerun: its verdict stands). An allocation that runs out of device
    memory mid-capture makes torch's allocator free cached blocks, and a free during capture invalidates it
    (torch reports the invalidated capture, not the out-of-memory): beside other workers' cases that is their
    memory, not the code under test. The capture's process is replaced (a CUDA error), so the rerun starts in
    a fresh one; alone, a capture the code itself breaks fails again."""
    shared = device == "cuda" and jobs > 1
    if not shared or task.alone or result.verdict != Verdict.CRASH:
        return None
    if not any(CAPTURE_INVALIDATED in line for line in result.details):
        return None
    return task._replace(alone=f"its graph capture was invalidated beside other workers' cases ({result.details[0]})")


def with_reruns(source: Callable[[], Task | None], on_outcome: Callable[[pool.Outcome], None], device: str,
                jobs: int) -> tuple[Callable, Callable]:
    """``source`` and ``on_outcome`` for ``Pool.run``, a task whose result calls for it (``rerun_alone``) run again
    before the next new one: ``on_outcome`` sees only the rerun's outcome, under the task as ``source`` gave it."""
    reruns: list[tuple[Task, Task]] = []  # (the rerun, the task as the source gave it)
    first_of: dict[int, Task] = {}  # id(rerun running) -> the task as the source gave it

    def next_task() -> Task | None:
        if not reruns:
            return source()
        rerun, first = reruns.pop()
        first_of[id(rerun)] = first
        return rerun

    def finished(outcome: pool.Outcome) -> None:
        first = first_of.pop(id(outcome.item), outcome.item)
        if outcome.value is not None and (rerun := rerun_alone(outcome.item, outcome.value, device, jobs)):
            reruns.append((rerun, first))
        else:
            on_outcome(dataclasses.replace(outcome, item=first))

    return next_task, finished


def result_of(outcome: pool.Outcome, device: str, timeout: float, trace: bool) -> Result:
    """The case's Result, also when its worker was killed at the deadline or died under it."""
    task = outcome.item
    result = outcome.value
    if outcome.failure:
        # rebuilt here, in the parent: the registration judged comes from the environment it shares with the worker
        from stress import checks

        check = checks.BY_NAME.get(task.check)
        judged = impl.judged_by(check, checks.BY_NAME) if check else []
        result = Result(task.check, task.family, task.seed, device, Verdict.CRASH, mutant=task.mutant,
                        launch=dict(task.launch or ()), seconds=round(outcome.seconds, 4), impl=impl.specs(judged))
        if outcome.failure == "timeout":
            result.verdict, result.details = Verdict.TIMEOUT, [f"case ran past {timeout:g} s; its worker was killed"]
        elif outcome.failure == "died":
            result.details = [f"the case killed its worker: {outcome.detail}"]
        else:
            result.details = outcome.detail.splitlines()[-12:]
    result.timeout, result.trace = timeout, trace
    result.gpu = _gpu_of(outcome, device)
    return result


def _gpu_of(outcome: pool.Outcome, device: str) -> int | None:
    """The GPU the case ran on: its worker slot's (``_init_worker``), or this process's current one."""
    if device != "cuda":
        return None
    if outcome.slot is None:
        return torch.cuda.current_device()
    return gpus.gpu_of(outcome.slot, gpus.count())


GPU_WORKERS = 8  # per GPU: on one H200 (16 cores) 8 workers ran the registry faster than 16 (40 s against 46 s)


def default_jobs(device: str) -> int:
    """CPU: one worker per core. GPU: one worker per two cores, up to ``GPU_WORKERS`` per GPU, and always a
    multiple of the GPUs so each gets the same share. A GPU case's own device work is microseconds; its time
    goes to the host side (building inputs, the float64 reference, comparison, Triton compiles of new launch
    shapes), which the workers split. More workers than that contend: the CUDA contexts of one GPU are served
    in turn, and each wait for the GPU (``stress.core.guards.settle``) then waits for the others' slices too."""
    cores = gpus.cores()
    if device == "cuda":
        count = max(1, gpus.count())
        return count * max(1, min(GPU_WORKERS, cores // (2 * count)))
    return cores


def worker_threads(jobs: int) -> int:
    """Torch CPU threads per worker: the cores divided among the workers."""
    return max(1, gpus.cores() // max(1, jobs))


def execute(tasks: list[Task], device: str, jobs: int, on_result: Callable[[Result], None] | None,
            timeout: float = 0, trace: bool = True, on_abandoned: Callable[[list[Task]], None] | None = None,
            judge: Callable[..., Result] = run_case, beside=None, builders: int = 0) -> dict[str, float]:
    """Run every task, calling ``on_result`` as each finishes (in completion order); returns where the workers'
    seconds went outside their cases, and all they held (``stress.core.pool.Pool.seconds``; zeros in this process).

    ``jobs == 0`` runs in this process. Otherwise ``stress.core.pool`` workers run the cases: a case
    past ``timeout`` is ``fail:timeout`` and one that kills its worker ``fail:crash``, each
    charged to that case alone while the run goes on. When a signal stops the run
    (``stress.core.interrupts``), ``on_abandoned`` gets the cases that were running. ``judge`` judges
    one task (``run_case`` by default); ``trace`` False skips the CPU tracer in ``tasks``' cases.

    ``builders``: processes that build the cases ``stress.core.prebuild.built_ahead`` picks ahead of their turn
    (0: every case is built by its worker).

    ``beside``: tasks of another driver sharing the same workers, so that neither waits for the other's slowest
    cases or starts workers of its own (``stress.mutate.kill_matrix.Hunting``: its ``next_task(ahead)``, ``owns``,
    ``finished`` and ``stop``). Its tasks that depend on none of its running ones go first, then ``tasks``, then,
    once those are all handed out, whatever it would run ahead of time; it hears its own outcomes, and ``stop``
    when a signal stops the run. Its tasks are traced whatever ``trace`` says.
    """
    pending = prebuild.Ahead(tasks if trace else [task._replace(trace=False) for task in tasks], device, builders)
    drained = False

    def source() -> Task | None:
        nonlocal drained
        if beside is not None and (task := beside.next_task(ahead=False)) is not None:
            return task
        if not drained:
            if (task := pending.next()) is not None:
                return task
            drained = True
        return beside.next_task(ahead=True) if beside is not None else None

    def finished(outcome: pool.Outcome) -> None:
        if beside is not None and beside.owns(outcome.item):
            beside.finished(outcome)
            return
        built = pending.finished(outcome.item)
        result = result_of(outcome, device, timeout, trace)
        if built:  # not the case's own seconds: a builder's, beside the workers
            result.phases["built_ahead"] = round(built, 4)
        on_result(result)

    try:
        with worker_pool(case_runner(device, jobs, timeout, judge), device, jobs, timeout) as workers:
            try:
                workers.run(*with_reruns(source, finished, device, jobs))
            except interrupts.Interrupted:
                if on_abandoned is not None:
                    on_abandoned([task._replace(prebuilt="") for task in workers.abandoned
                                  if beside is None or not beside.owns(task)])
                if beside is not None:
                    beside.stop()
                raise
    finally:
        pending.close()
    return {**workers.seconds, "built_ahead": round(pending.seconds, 4)}  # closed: its workers' lives are complete
