"""Replay loop: derive seeds, run cases (in worker processes), stream verdicts to disk.

A case is addressed by (check, family, seed); ``run_case`` rebuilds it from those alone, so
every failure reproduces from one printed line.
"""

import os
import signal
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

from stress.core import gpus, interrupts, pool, refusal
from stress.core.gpu_share import GpuShare
from stress.core.guards import fresh_inputs, guarded, settle, torch_device
from stress.core.types import PASS, RETURN, Case, Check, Result


class Task(NamedTuple):
    check: str
    family: str
    seed: int
    mutant: str | None = None
    launch: tuple | None = None  # forced launch shape, as sorted (key, value) pairs
    tool: str | None = None  # run under this compute-sanitizer tool (stress.sanitize.runner) instead


class CaseTimeout(Exception):
    pass


SUITE_ERROR = "fail:suite-error"


class SuiteError(Exception):
    """specsan's own code (the reference, a comparator, a metric) raised on a case. The case fails as
    ``SUITE_ERROR``, which no oracle counts as a kill: a comparator that crashes on every divergence must not
    read as the kernel crashing, nor hide a planted bug as a survivor with a stray ``fail:crash``."""


@contextmanager
def own_code(what: str):
    try:
        yield
    except CaseTimeout:
        raise
    except Exception as exc:
        raise SuiteError(f"{what} raised {type(exc).__name__}: {exc}") from exc


def case_seed(base: int, check: str, family: str, i: int) -> int:
    """Seed of iteration i of (check, family): independent of run order and of the worker."""
    key = (zlib.crc32(check.encode()), zlib.crc32(family.encode()), i)
    state = np.random.SeedSequence(entropy=base, spawn_key=key).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))  # 63 bits: fits an int64 everywhere it is printed or stored


def build_case(check: Check, family: str, seed: int, device: str, launch: dict | None = None) -> Case:
    if family not in check.families:
        raise ValueError(f"family {family!r} is not one of {check.name}'s: {', '.join(check.families)}")
    if launch is None:
        launch = draw_launch(check.sweep(device) if check.sweep else [{}], seed)
    if device in getattr(check.families[family], "own_launch_on", ()):  # stress.families.common.own_launch
        launch = {}
    case = check.families[family](np.random.default_rng(seed), device, dict(launch))
    case.launch = dict(launch)
    return case


DEFAULT_SHARE = 1 / 3  # of the cases at least, where a sweep's first shape is the launcher's own choice ({})


def draw_launch(shapes: list[dict], seed: int) -> dict:
    """The launch shape of a case drawn without one: uniform over the sweep, except that the launcher's own
    choice (an empty first shape) runs in at least DEFAULT_SHARE of the cases. It is what production runs,
    and a slip in its tile heuristic shows only in cases that use it: over the H200's sweep of 13 shapes a
    uniform draw gave it 1 case in 13, and three of write_kv's tile-heuristic slips survived `mutate --iters 2`
    there (the CPU's 3 shapes already give it a third, and draw as before). A shape once drawn by a seed is
    still drawn by it wherever the uniform draw chose the default, so older repro lines hold."""
    rng, n = np.random.default_rng([seed, 7]), len(shapes)
    index = int(rng.integers(n))
    if index and not shapes[0] and rng.random() < (DEFAULT_SHARE - 1 / n) / (1 - 1 / n):  # never at n <= 3
        index = 0
    return shapes[index]


def expected_outputs(check: Check, case: Case) -> dict:
    """The reference's outputs by name, computed on CPU copies (the reference must not mutate)."""
    ref = check.reference(**fresh_inputs(case))
    values = (ref,) if len(check.outputs) == 1 else tuple(ref)
    return dict(zip(check.outputs, values, strict=True))


def _fatal(exc: BaseException) -> bool:
    """A CUDA error poisons the process's context: later cases there would all crash."""
    text = f"{type(exc).__name__}: {exc}"
    return "CUDA error" in text or "AcceleratorError" in text or "illegal memory access" in text


HEAP_DAMAGE = ("corrupt", "double free", "free(): ", "malloc", "bad_alloc")  # glibc's and the C++ runtime's words


def _memory_verdict(result: Result) -> bool:
    """Out of bounds, or a crash that reads as heap damage: the interpreter runs kernels on host copies, so a
    stray write may have landed in this process's heap, and later cases here would fail for reasons of their own."""
    damaged = result.verdict == "fail:crash" and any(w in line for line in result.details for w in HEAP_DAMAGE)
    return result.verdict == "fail:oob" or damaged


def interpreter_gap(check: Check, case: Case, device: str) -> str | None:
    """Why the CPU interpreter cannot judge this case, or None: a bfloat16 ``tl.dot`` (``Check.bf16_dot``) is
    computed on the operands' bit patterns there, so its output would diverge whatever the kernel's logic."""
    bf16 = [k for k, v in case.inputs.items() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16]
    if device == "cpu" and check.bf16_dot and bf16:
        return (f"bfloat16 tl.dot under the Triton interpreter ({', '.join(bf16)}): it multiplies the raw bit "
                "patterns (triton-lang/triton#11584); judge it on a GPU")
    return None


def differential(check: Check, case: Case, expected: dict, device: str, load=None,
                 metrics: dict | None = None) -> tuple[str, list[str]]:
    """Run the kernel ``repeats`` times on guarded copies; compare each run with the reference.

    ``metrics``, when given, receives the check's metrics of the last run."""
    from stress.core import compare

    compare_fn = check.compare or compare.exact
    dev = torch_device(device)
    tensors = {k: v for k, v in case.inputs.items() if isinstance(v, torch.Tensor)}
    notes = []  # what a comparator tolerated (and says so) in a passing case
    unjudged = []  # outputs a comparator could not judge: the case is not_checked
    for repeat in range(check.repeats.get(device, 1)):
        # the last repeat's guarded copies go before new ones are made (a view past 2^31 elements is GBs)
        placed = args = returned = outputs = None
        placed, args = guarded(case.inputs, dev)
        if load is not None:
            load.kick()
        returned = _current(check.kernel)(**args, **case.launch)
        tag = f"repeat {repeat}: " if repeat else ""
        # an optional output the case leaves out (None) is neither written nor compared
        outputs = {name: returned if name == RETURN else placed[name].view for name in check.outputs
                   if name == RETURN or name in placed}
        read_only = {name: placed[name].view for name in tensors if name not in check.outputs}
        damage, host = settle(placed, {**{f"in:{k}": v for k, v in read_only.items()}, **outputs})
        if damage:
            return "fail:oob", [tag + d for d in damage]
        outputs = {name: host[name] for name in outputs}
        lines, verdict = [], ""
        if metrics is not None and check.metrics:
            with own_code(f"{check.name}'s metrics"):
                metrics.update(check.metrics(expected, outputs))
        for name, got in outputs.items():
            with own_code(f"the comparison of {name}"):
                found = compare_fn(name, expected[name], got)
            if isinstance(found, compare.Unjudged):
                unjudged += [tag + line for line in found.lines()]
            elif isinstance(found, compare.Tolerated):
                notes += [tag + line for line in found.lines()]
            elif found is not None:
                source = tensors.get(check.provenance.get(name, ""))
                lines += found.lines(source)
                verdict = verdict or found.verdict
        for name in read_only:
            if found := compare.unchanged(name, tensors[name], host[f"in:{name}"]):
                lines += found.lines()
                verdict = verdict or found.verdict
        if lines:
            return f"fail:{verdict}", [tag + line for line in lines]
    if unjudged:
        return "not_checked:near ties", unjudged + notes
    return PASS, notes


def trace_case(check: Check, case: Case, seed: int, permute: str = "auto"):
    """Run the kernel once on plain clones of the inputs under ``stress.core.tracer.tracing``."""
    from stress.core import tracer as trace

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
    if verdict == PASS:  # benign findings (duplicate stores) stay in the details
        benign = [(r.kernel, f) for r in recording.reports for f in r.duplicate_stores]
        return PASS, [f"{kernel}: {line}" for kernel, f in benign for line in f.lines()]
    return verdict, [line for r in recording.reports if r.verdict != PASS for line in r.lines()]


def _current(fn):
    """The function as its module holds it now, so an applied mutant's replacement is the one called."""
    import sys

    return getattr(sys.modules.get(fn.__module__), fn.__name__, fn)


_LOAD = None


def _background_load(device: str):
    global _LOAD
    if device == "cuda" and _LOAD is None and os.environ.get("SPECSAN_NO_LOAD") != "1":
        from stress.core.load import BackgroundLoad
        _LOAD = BackgroundLoad(torch.device("cuda", torch.cuda.current_device()))
    return _LOAD


def run_case(task: Task, device: str, timeout: float = 0, trace: bool = True) -> Result:
    """Build, run and judge one case. Never raises: a crash is a verdict.

    On the CPU a case that matches its reference is also traced (``trace=False`` skips it). A task
    with a ``tool`` runs in a process of its own under compute-sanitizer instead. A refusal case
    (``Case.refused``) is judged by ``stress.core.refusal`` instead of against the reference. A pool worker
    on a GPU holds its GPU shared while the case runs, and runs a case that ran out of device memory
    again, alone on the GPU (``stress.core.gpu_share``).
    """
    if task.tool:
        from stress.sanitize import runner as sanitizer

        return sanitizer.run_case(task, task.tool, timeout)
    if _SHARE is None:
        return _judged(task, device, timeout, trace)[0]
    waited = time.perf_counter()
    with _SHARE.shared():
        waited = time.perf_counter() - waited
        result, out_of_memory = _judged(task, device, timeout, trace)
    if out_of_memory:
        waited = time.perf_counter()
        with _SHARE.alone():
            waited = time.perf_counter() - waited
            torch.cuda.empty_cache()
            result, _ = _judged(task, device, timeout, trace)
        result.details.append("ran again alone on its GPU: it ran out of device memory beside other workers' cases")
    result.phases["gpu_wait"] = round(waited, 4)
    return result


@contextmanager
def _phase(result: Result, name: str):
    """Adds the seconds the block took to ``result.phases[name]`` (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        result.phases[name] = round(result.phases.get(name, 0.0) + time.perf_counter() - start, 4)


def _judged(task: Task, device: str, timeout: float, trace: bool) -> tuple[Result, bool]:
    """``run_case``'s work: the Result, and whether the case ran out of device memory."""
    from stress import checks
    from stress.core import patches as mutants

    out_of_memory = False
    result = Result(task.check, task.family, task.seed, device, PASS, launch=dict(task.launch or ()),
                    mutant=task.mutant, timeout=timeout, trace=trace)
    start = time.perf_counter()
    if timeout:
        signal.signal(signal.SIGALRM, _on_alarm)
    try:
        if timeout:  # armed inside the try: a deadline shorter than the next bytecode is still a verdict
            signal.setitimer(signal.ITIMER_REAL, timeout)
        check = checks.get(task.check)
        mutant = checks.find_mutant(task.mutant, check) if task.mutant else None
        if device not in check.devices:
            result.verdict = f"not_checked:{check.why_not or f'{check.name} does not run on {device}'}"
            return result, out_of_memory
        with _phase(result, "build"):
            case = build_case(check, task.family, task.seed, device, dict(task.launch) if task.launch else None)
        result.launch, result.note = case.launch, case.note
        if gap := interpreter_gap(check, case, device):
            result.verdict = f"not_checked:{gap}"
            return result, out_of_memory
        if case.refused:  # bad input the launcher must refuse: no reference output, nothing to trace
            with mutants.applied(mutant), _phase(result, "judge"):
                result.verdict, result.details = refusal.judge_all(check, case, device, _current(check.kernel))
            return result, out_of_memory
        with own_code("the reference"), _phase(result, "reference"):
            expected = expected_outputs(check, case)
        with mutants.applied(mutant):
            with _phase(result, "judge"):
                result.verdict, result.details = differential(check, case, expected, device,
                                                              _background_load(device), result.metrics)
            if trace and device == "cpu" and result.verdict == PASS:
                with _phase(result, "trace"):
                    result.verdict, result.details = traced(check, case, task.seed)
    except CaseTimeout:
        result.verdict, result.details = "fail:timeout", [f"case ran past {timeout:g} s"]
    except SuiteError as exc:
        out_of_memory = isinstance(exc.__cause__, torch.OutOfMemoryError)  # the reference's copies on the GPU
        result.verdict = SUITE_ERROR
        result.details = [f"specsan's own code failed: {exc}",
                          *"".join(traceback.format_exception(exc.__cause__)).splitlines()[-12:]]
    except Exception as exc:  # noqa: BLE001 - a crashing case is a verdict, not the end of the run
        result.verdict = "fail:crash"
        result.details = traceback.format_exception_only(exc)[-1:] + traceback.format_exc().splitlines()[-12:]
        result.fatal = _fatal(exc)
        out_of_memory = isinstance(exc, torch.OutOfMemoryError)
    finally:
        if timeout:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
            except CaseTimeout:  # the deadline passed just as the case ended: it did end
                pass
        result.fatal = result.fatal or _memory_verdict(result)
        case = expected = None  # this case's tensors go before its cached device memory does
        _release_device_memory(device)
        result.seconds = round(time.perf_counter() - start, 4)
    return result, out_of_memory


KEEP_CACHED_BYTES = 16 << 30  # the most device memory a worker keeps cached between cases
_SHARE: GpuShare | None = None  # this pool worker's share of its GPU
_keep_cached = KEEP_CACHED_BYTES


def _release_device_memory(device: str) -> None:
    """A case past 2^31 elements (``kv_cache.write``'s big_cache) leaves tens of GB in this process's
    allocator cache; the workers sharing the GPU need them back. Smaller caches are kept."""
    if device == "cuda" and torch.cuda.memory_reserved() > _keep_cached:
        torch.cuda.empty_cache()


def _on_alarm(signum, frame):
    raise CaseTimeout()


# ---------------------------------------------------------------- worker processes


def _init_worker(slot: int, device: str, threads: int, locks: str = "", jobs: int = 1) -> None:
    """Set a pool worker up: device, its share of the cores, its GPU (slot modulo the GPUs), its share of
    that GPU (``locks``: the lock folder of ``stress.core.gpu_share``) and of the GPU's memory kept cached."""
    global _SHARE, _keep_cached
    os.environ["SPECSAN_DEVICE"] = device
    torch.set_num_threads(threads)  # workers split the cores instead of each taking them all
    if device == "cuda":
        count = gpus.count()
        gpu = gpus.gpu_of(slot, count)
        torch.cuda.set_device(gpu)
        _SHARE = GpuShare(locks, gpu) if locks else None
        sharing = -(-jobs // max(1, count))
        _keep_cached = min(KEEP_CACHED_BYTES, torch.cuda.get_device_properties(gpu).total_memory // (2 * sharing))
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


def case_runner(device: str, jobs: int, timeout: float, trace: bool):
    """``run_case`` for a pool: in this process (jobs == 0) the deadline is an alarm signal,
    in workers the pool's watchdog enforces it."""
    return partial(run_case, device=device, timeout=timeout if jobs == 0 else 0, trace=trace)


def result_of(outcome: pool.Outcome, device: str, timeout: float, trace: bool) -> Result:
    """The case's Result, also when its worker was killed at the deadline or died under it."""
    task = outcome.item
    result = outcome.value
    if outcome.failure:
        result = Result(task.check, task.family, task.seed, device, "fail:crash", mutant=task.mutant,
                        launch=dict(task.launch or ()), seconds=round(outcome.seconds, 4))
        if outcome.failure == "timeout":
            result.verdict, result.details = "fail:timeout", [f"case ran past {timeout:g} s; its worker was killed"]
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


def default_jobs(device: str) -> int:
    """CPU: one worker per core. GPU: one worker per core, up to 16 per GPU, and always a multiple of the GPUs
    so each gets the same share. A GPU case's own device work is microseconds; its time goes to the host side
    (building inputs, the float64 reference, comparison, Triton compiles of new launch shapes), which the
    workers split. They wait for the GPU once per repeat (``stress.core.guards.settle``), so sharing it costs little."""
    cores = gpus.cores()
    if device == "cuda":
        count = max(1, gpus.count())
        return count * max(1, min(16, cores // count))
    return cores


def worker_threads(jobs: int) -> int:
    """Torch CPU threads per worker: the cores divided among the workers."""
    return max(1, gpus.cores() // max(1, jobs))


def execute(tasks: list[Task], device: str, jobs: int, on_result: Callable[[Result], None],
            timeout: float = 0, trace: bool = True, on_abandoned: Callable[[list[Task]], None] | None = None) -> None:
    """Run every task, calling ``on_result`` as each finishes (in completion order).

    ``jobs == 0`` runs in this process. Otherwise ``stress.core.pool`` workers run the cases: a case
    past ``timeout`` is ``fail:timeout`` and one that kills its worker ``fail:crash``, each
    charged to that case alone while the run goes on. When a signal stops the run
    (``stress.core.interrupts``), ``on_abandoned`` gets the cases that were running.
    """
    pending = iter(tasks)
    with worker_pool(case_runner(device, jobs, timeout, trace), device, jobs, timeout) as workers:
        try:
            workers.run(lambda: next(pending, None),
                        lambda outcome: on_result(result_of(outcome, device, timeout, trace)))
        except interrupts.Interrupted:
            if on_abandoned is not None:
                on_abandoned(workers.abandoned)
            raise


# ---------------------------------------------------------------- the run command


def plan(checks: list[Check], families: list[str] | None, iters: int, seed: int,
         mutant: str | None = None, tool: str | None = None) -> list[Task]:
    """Iteration-major order, so an interrupted run has covered every family evenly; ``mutant`` is
    applied in every case, and every case runs under compute-sanitizer's ``tool`` when one is given."""
    # A check (or a family: common.one_per_value) with an iteration share runs its n cases spread evenly over
    # the iterations.
    def spread_over(share: float) -> dict[int, int]:
        n = max(1, round(iters * share)) if share < 1 else iters
        return {j * iters // n: j for j in range(n)}

    at = {(check.name, family): spread_over(check.iteration_share * getattr(build, "iteration_share", 1.0))
          for check in checks for family, build in check.families.items()}
    tasks = []
    for i in range(iters):
        for check in checks:
            for family, build in check.families.items():
                # a refusal case launches no kernel: nothing for compute-sanitizer to watch
                if (i in at[check.name, family] and (not families or family in families)
                        and not (tool and refusal.is_family(build))):
                    case = at[check.name, family][i]
                    tasks.append(Task(check.name, family, case_seed(seed, check.name, family, case), mutant, tool=tool))
    return tasks
