"""Replay loop: derive seeds, run cases (in worker processes), stream verdicts to disk.

A case is addressed by (check, family, seed); ``run_case`` rebuilds it from those alone, so
every failure reproduces from one printed line.
"""

import copy
import json
import os
import signal
import time
import traceback
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from multiprocessing import get_context
from typing import NamedTuple

import numpy as np
import torch

from stress.types import PASS, RETURN, Case, Check, Result


class Task(NamedTuple):
    check: str
    family: str
    seed: int
    mutant: str | None = None
    launch: tuple | None = None  # forced launch shape, as sorted (key, value) pairs


class CaseTimeout(Exception):
    pass


def case_seed(base: int, check: str, family: str, i: int) -> int:
    """Seed of iteration i of (check, family): independent of run order and of the worker."""
    key = (zlib.crc32(check.encode()), zlib.crc32(family.encode()), i)
    state = np.random.SeedSequence(entropy=base, spawn_key=key).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))  # 63 bits: fits an int64 everywhere it is printed or stored


def build_case(check: Check, family: str, seed: int, device: str, launch: dict | None = None) -> Case:
    if family not in check.families:
        raise ValueError(f"family {family!r} is not one of {check.name}'s: {', '.join(check.families)}")
    if launch is None:
        shapes = check.sweep(device) if check.sweep else [{}]
        launch = shapes[int(np.random.default_rng([seed, 7]).integers(len(shapes)))]
    case = check.families[family](np.random.default_rng(seed), device, dict(launch))
    case.launch = dict(launch)
    return case


def fresh_inputs(case: Case) -> dict:
    """Private copies of a case's inputs, so no run can change what the next one sees."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in case.inputs.items()}


def expected_outputs(check: Check, case: Case) -> dict:
    """The reference's outputs by name, computed on CPU copies (the reference must not mutate)."""
    ref = check.reference(**fresh_inputs(case))
    values = (ref,) if len(check.outputs) == 1 else tuple(ref)
    return dict(zip(check.outputs, values, strict=True))


def _fatal(exc: BaseException) -> bool:
    """A CUDA error poisons the process's context: later cases there would all crash."""
    text = f"{type(exc).__name__}: {exc}"
    return "CUDA error" in text or "AcceleratorError" in text or "illegal memory access" in text


def differential(check: Check, case: Case, expected: dict, device: str, load=None) -> tuple[str, list[str]]:
    """Run the kernel ``repeats`` times on guarded copies; compare each run with the reference."""
    from stress import compare, guards

    compare_fn = check.compare or compare.exact
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    tensors = {k: v for k, v in case.inputs.items() if isinstance(v, torch.Tensor)}
    notes = []  # what a comparator tolerated (and says so) in a passing case
    unjudged = []  # outputs a comparator could not judge: the case is not_checked
    for repeat in range(check.repeats.get(device, 1)):
        placed = {k: guards.place(k, v, dev) for k, v in tensors.items()}
        args = {**copy.deepcopy({k: v for k, v in case.inputs.items() if k not in placed}),
                **{k: g.view for k, g in placed.items()}}
        if load is not None:
            load.kick()
        returned = _current(check.kernel)(**args, **case.launch)
        if device == "cuda":
            torch.cuda.synchronize()
        tag = f"repeat {repeat}: " if repeat else ""
        damage = [d for g in placed.values() if (d := g.damage())]
        if damage:
            return "fail:oob", [tag + d for d in damage]
        lines = []
        for name in check.outputs:
            got = returned if name == RETURN else placed[name].view
            found = compare_fn(name, expected[name], got)
            if isinstance(found, compare.Unjudged):
                unjudged += [tag + line for line in found.lines()]
            elif isinstance(found, compare.Tolerated):
                notes += [tag + line for line in found.lines()]
            elif found is not None:
                source = tensors.get(check.provenance.get(name, ""))
                lines += found.lines(source)
        for name, original in tensors.items():
            if name not in check.outputs and (found := compare.unchanged(name, original, placed[name].view)):
                lines += found.lines()
        if lines:
            return "fail:divergence", [tag + line for line in lines]
    if unjudged:
        return "not_checked:near ties", unjudged + notes
    return PASS, notes


def trace_case(check: Check, case: Case, seed: int, permute: str = "auto"):
    """Run the kernel once on plain clones of the inputs under ``stress.trace.tracing``."""
    from stress import trace

    inputs = fresh_inputs(case)
    unwritten = []
    for name, mask in case.unwritten.items():
        if not isinstance(inputs.get(name), torch.Tensor):
            raise ValueError(f"unwritten: {name!r} is not a tensor input of {check.name}")
        unwritten.append((inputs[name], mask))
    with trace.tracing(unwritten, seed=seed, permute=permute,
                       expected_order_dependence=check.expected_order_dependence) as recording:
        _current(check.kernel)(**inputs, **case.launch)
    return recording


def traced(check: Check, case: Case, seed: int) -> tuple[str, list[str]]:
    """Rerun the kernel on fresh copies under the CPU tracer: races, out-of-bounds, uninit reads.

    Plain clones (no guard zones) give every input its own storage, so a lane that leaves its
    tensor lands outside every storage and is reported as out-of-bounds.
    """
    recording = trace_case(check, case, seed)
    verdict = recording.verdict
    if verdict == PASS:
        return PASS, []
    return verdict, [line for r in recording.reports if r.verdict != PASS for line in r.lines()]


def _current(fn):
    """The function as its module holds it now, so an applied mutant's replacement is the one called."""
    import sys

    return getattr(sys.modules.get(fn.__module__), fn.__name__, fn)


_LOAD = None


def _background_load(device: str):
    global _LOAD
    if device == "cuda" and _LOAD is None and os.environ.get("SPECSAN_NO_LOAD") != "1":
        from stress.load import BackgroundLoad
        _LOAD = BackgroundLoad(torch.device("cuda", torch.cuda.current_device()))
    return _LOAD


def run_case(task: Task, device: str, timeout: float = 0, trace: bool = True) -> Result:
    """Build, run and judge one case. Never raises: a crash is a verdict.

    On the CPU a case that matches its reference is also traced (``trace=False`` skips it).
    """
    from stress import checks, mutants

    result = Result(task.check, task.family, task.seed, device, PASS, mutant=task.mutant)
    start = time.perf_counter()
    if timeout:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        check = checks.get(task.check)
        mutant = check.mutant(task.mutant) if task.mutant else None
        if device not in check.devices:
            result.verdict = f"not_checked:{check.why_not or f'{check.name} does not run on {device}'}"
            return result
        case = build_case(check, task.family, task.seed, device, dict(task.launch) if task.launch else None)
        result.launch, result.note = case.launch, case.note
        expected = expected_outputs(check, case)
        with mutants.applied(mutant):
            result.verdict, result.details = differential(check, case, expected, device, _background_load(device))
            if trace and device == "cpu" and result.verdict == PASS:
                result.verdict, result.details = traced(check, case, task.seed)
    except CaseTimeout:
        result.verdict, result.details = "fail:timeout", [f"case ran past {timeout:.0f} s"]
    except Exception as exc:  # noqa: BLE001 - a crashing case is a verdict, not the end of the run
        result.verdict = "fail:crash"
        result.details = traceback.format_exception_only(exc)[-1:] + traceback.format_exc().splitlines()[-12:]
        result.fatal = _fatal(exc)
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
        case = expected = None  # this case's tensors go before its cached device memory does
        _release_device_memory(device)
        result.seconds = round(time.perf_counter() - start, 4)
    return result


KEEP_CACHED_BYTES = 16 << 30


def _release_device_memory(device: str) -> None:
    """A case past 2^31 elements (``kv_cache.write``'s big_cache) leaves tens of GB in this process's
    allocator cache; the workers sharing the GPU need them back. Smaller caches are kept."""
    if device == "cuda" and torch.cuda.memory_reserved() > KEEP_CACHED_BYTES:
        torch.cuda.empty_cache()


def _on_alarm(signum, frame):
    raise CaseTimeout()


# ---------------------------------------------------------------- worker processes

_DEVICE = "cpu"
_TIMEOUT = 0.0
_TRACE = True


def _init_worker(device: str, counter, timeout: float, trace: bool, threads: int) -> None:
    global _DEVICE, _TIMEOUT, _TRACE
    _DEVICE, _TIMEOUT, _TRACE = device, timeout, trace
    os.environ["SPECSAN_DEVICE"] = device
    torch.set_num_threads(threads)  # workers split the cores instead of each taking them all
    if device == "cuda":
        with counter.get_lock():
            index = counter.value
            counter.value += 1
        torch.cuda.set_device(index % torch.cuda.device_count())  # one worker per GPU
    import stress.checks  # noqa: F401  - define every kernel once, up front


def _work(task: Task) -> Result:
    return run_case(task, _DEVICE, _TIMEOUT, _TRACE)


def _crash_result(task: Task, device: str) -> Result:
    return Result(task.check, task.family, task.seed, device, "fail:crash", mutant=task.mutant,
                  details=["the worker process died running this case (segfault or abort)"])


def _cores() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def default_jobs(device: str) -> int:
    """CPU: one worker per core. GPU: up to eight workers per GPU, as cores allow; they share the
    device (more concurrent launches) and split the CPU side, which dominates a GPU run: Triton
    compiles (one per new specialization) and the float64 references."""
    cores = _cores()
    if device == "cuda":
        gpus = max(1, torch.cuda.device_count())
        return gpus * max(1, min(8, cores // gpus))
    return cores


def worker_threads(jobs: int) -> int:
    """Torch CPU threads per worker: the cores divided among the workers."""
    return max(1, _cores() // max(1, jobs))


def execute(tasks: list[Task], device: str, jobs: int, on_result: Callable[[Result], None],
            timeout: float = 0, trace: bool = True) -> None:
    """Run every task, calling ``on_result`` as each finishes (in completion order).

    ``jobs == 0`` runs in this process. Otherwise worker processes run the cases; a worker that
    dies takes no result with it: the pool is rebuilt, the unfinished cases rerun one by one
    until the one that kills its worker is found and reported as ``fail:crash``.
    """
    if jobs == 0:
        for task in tasks:
            on_result(run_case(task, device, timeout, trace))
        return
    counter = get_context("spawn").Value("i", 0)
    pending, isolate = list(tasks), False
    while pending:
        workers = 1 if isolate else jobs
        finished: set[Task] = set()
        broken = restart = False
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                                 initargs=(device, counter, timeout, trace, worker_threads(workers))) as pool:
            futures = {pool.submit(_work, task): task for task in pending}
            try:
                for future in as_completed(futures):
                    result = future.result()
                    finished.add(futures[future])
                    on_result(result)
                    if result.fatal:
                        restart = True  # a fresh process gets a fresh CUDA context
                        break
            except BrokenProcessPool:
                broken = True
            if broken or restart:
                pool.shutdown(wait=True, cancel_futures=True)
        pending = [t for t in pending if t not in finished]
        if broken and isolate and pending:
            on_result(_crash_result(pending.pop(0), device))
            isolate = False
        elif broken:
            isolate = True


# ---------------------------------------------------------------- the run command


def plan(checks: list[Check], families: list[str] | None, iters: int, seed: int) -> list[Task]:
    """Iteration-major order, so an interrupted run has covered every family evenly."""
    tasks = []
    for i in range(iters):
        for check in checks:
            for family in check.families:
                if not families or family in families:
                    tasks.append(Task(check.name, family, case_seed(seed, check.name, family, i)))
    return tasks


class Report:
    """Streams results to DIR/results.jsonl as they arrive and writes DIR/summary.md at the end."""

    def __init__(self, directory: str | None, header: dict):
        self.results: list[Result] = []
        self.directory = directory
        self.stream = None
        if directory:
            os.makedirs(directory, exist_ok=True)
            self.stream = open(os.path.join(directory, "results.jsonl"), "w", buffering=1)
            self.stream.write(json.dumps({"run": header}) + "\n")
        self.header = header
        self.telemetry: dict = {}  # GPU envelope (stress.telemetry), filled during a GPU run

    def add(self, result: Result) -> None:
        self.results.append(result)
        if self.stream:
            record = asdict(result)
            record["repro"] = result.repro()
            self.stream.write(json.dumps(record) + "\n")

    def counts(self) -> tuple[int, int, int]:
        passed = sum(r.verdict == PASS for r in self.results)
        failed = sum(r.failed for r in self.results)
        return passed, failed, sum(r.not_checked for r in self.results)

    def closing_line(self) -> str:
        passed, failed, not_checked = self.counts()
        line = f"{passed} passed, {failed} failed"
        return line + (f", {not_checked} not checked" if not_checked else "")

    def close(self) -> None:
        if self.stream:
            if self.telemetry:
                self.stream.write(json.dumps({"telemetry": self.telemetry}) + "\n")
            self.stream.close()
            with open(os.path.join(self.directory, "summary.md"), "w") as f:
                f.write(self.summary())

    def summary(self) -> str:
        rows: dict[tuple[str, str], list[Result]] = {}
        for r in self.results:
            rows.setdefault((r.check, r.family), []).append(r)
        out = ["# specsan stress summary", "",
               "  ".join(f"{k}: {v}" for k, v in self.header.items()), "",
               "| check | family | passed | failed | not checked | seconds |", "|---|---|---|---|---|---|"]
        for (check, family), rs in sorted(rows.items()):
            out.append(f"| {check} | {family} | {sum(r.verdict == PASS for r in rs)} | {sum(r.failed for r in rs)} "
                       f"| {sum(r.not_checked for r in rs)} | {sum(r.seconds for r in rs):.2f} |")
        failures = [r for r in self.results if r.failed]
        if failures:
            out += ["", "## Failures", ""]
            for r in failures:
                out.append(f"- `{r.verdict}` {r.check} / {r.family} ({r.note}) launch {r.launch}")
                out.append(f"  - `{r.repro()}`")
                out += [f"  - {d}" for d in r.details[:6]]
        skipped = sorted({(r.check, r.family, r.verdict) for r in self.results if r.not_checked})
        if skipped:
            out += ["", "## Not checked", ""] + [f"- {c} / {f}: {v}" for c, f, v in skipped]
        if self.telemetry:
            from stress import telemetry

            out += ["", "## GPU telemetry", ""] + [f"- {line}" for line in telemetry.lines(self.telemetry)]
        out += ["", self.closing_line(), ""]
        return "\n".join(out)
