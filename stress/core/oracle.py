"""The oracle of one case: build it, run the kernel on guarded copies against its reference, trace it on the
CPU, judge a refusal case's refusals. Never raises: a crash is a verdict."""

import os
import signal
import time
import traceback
from contextlib import contextmanager, nullcontext

import torch

from stress.core import impl, prebuild, refusal
from stress.core.cases import Task, expected_outputs
from stress.core.guards import device_bytes, fresh_inputs, guarded, scratch_poisoned, settle, snapshot, torch_device
from stress.core.types import PASS, RETURN, Case, Check, Result, Verdict, not_checked


class CaseTimeout(BaseException):
    """The case's deadline (an alarm in this process). Not an ``Exception``: code that judges whatever a reference
    or a kernel raises (a refusal's, a crash's) must not take the deadline for the case's own failure."""


SUITE_ERROR = Verdict.SUITE_ERROR


class SuiteError(Exception):
    """specsan's own code (the reference, a comparator, a metric) raised on a case. The case fails as
    ``SUITE_ERROR``, which no oracle counts as a kill: a comparator that crashes on every divergence must not
    read as the kernel crashing, nor hide a planted bug as a survivor with a stray ``fail:crash``."""


@contextmanager
def own_code(what: str):
    try:
        yield
    except Exception as exc:
        raise SuiteError(f"{what} raised {type(exc).__name__}: {exc}") from exc


def _fatal(exc: BaseException) -> bool:
    """A CUDA error poisons the process's context: later cases there would all crash."""
    text = f"{type(exc).__name__}: {exc}"
    return "CUDA error" in text or "AcceleratorError" in text or "illegal memory access" in text


HEAP_DAMAGE = ("corrupt", "double free", "free(): ", "malloc", "bad_alloc")  # glibc's and the C++ runtime's words


def _memory_verdict(result: Result) -> bool:
    """Out of bounds, a crash that reads as heap damage, or on the CPU a refusal case whose bad input went
    through: the interpreter runs kernels on host copies, so a stray write may have landed in this process's
    heap, and later cases here would fail for reasons of their own."""
    damaged = result.verdict == Verdict.CRASH and any(w in line for line in result.details for w in HEAP_DAMAGE)
    ran_on_bad_input = result.verdict == Verdict.ACCEPTED and result.device == "cpu"
    return result.verdict == Verdict.OOB or damaged or ran_on_bad_input


def _host_damaged(result: Result, device: str, exc: BaseException) -> bool:
    """Whether a case that raised may have damaged this process: on the CPU the interpreter runs kernels on the
    process's own memory, so once a kernel was launched, a failure other than a launcher's ValueError refusing
    its input may come from a stray store into the heap (the guard check itself then raising on a tensor of
    absurd size), and later cases here could fail for reasons of their own."""
    return device == "cpu" and "launch" in result.phases and not isinstance(exc, ValueError)


def _broken_before_the_case(result: Result) -> bool:
    """A failure before the case's first phase: looking up its check or planted bug, which every case of this
    process does the same way, failed. That is the process's own state (on the CPU, an earlier case's stray store
    that no guard saw), not this case's, and a worker kept in it would fail every later case at once."""
    return not result.phases


def interpreter_gap(check: Check, case: Case, device: str, foreign_triton: bool = False) -> str | None:
    """Why the CPU interpreter cannot judge this case, or None: a bfloat16 ``tl.dot`` is computed on the operands'
    bit patterns there, so its output would diverge whatever the kernel's logic. The suite's own kernels say
    whether they have one (``Check.bf16_dot``); a registered implementation written in Triton
    (``foreign_triton``) may, and its bfloat16 cases are left to a GPU."""
    bf16 = [k for k, v in case.inputs.items() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16]
    if device == "cpu" and (check.bf16_dot or foreign_triton) and bf16:
        return (f"bfloat16 tl.dot under the Triton interpreter ({', '.join(bf16)}): it multiplies the raw bit "
                "patterns (triton-lang/triton#11584); judge it on a GPU")
    return None


def _judged_case(check: Check, case: Case, seed: int, device: str, trace: bool, result: Result,
                 mutant, expected: dict | None = None) -> tuple[str, list[str]]:
    """A built case judged: its refusals, or the kernel (under ``mutant``) against the reference (``expected``:
    its outputs where a builder computed them, ``stress.core.prebuild``), then traced on the CPU. A registered
    implementation (``stress.core.impl``) stands in for the launcher throughout."""
    from stress import checks
    from stress.core import patches

    if case.refused:  # bad input the launcher must refuse: no reference output, nothing to trace
        # a launcher that finds no tile fitting compiles each rung to learn it: those compiles count as compiles
        with impl.installed(checks.BY_NAME), patches.applied(mutant), _phase_less_compiles(result.phases, "refusal"):
            return refusal.judge_all(check, case, device, _current(check.kernel))
    with own_code("the reference"), _phase(result.phases, "reference"), impl.reference_stream(check):
        expected = impl.expected_under_profile(check, case, expected_outputs(check, case) if expected is None
                                               else expected)
    with impl.installed(checks.BY_NAME), patches.applied(mutant):
        verdict, details = differential(check, case, expected, device, _background_load(device), result.metrics,
                                        result.phases)
        if trace and device == "cpu" and verdict == PASS:
            with _phase(result.phases, "trace"):
                verdict, details = traced(check, case, seed)
    return verdict, details


def differential(check: Check, case: Case, expected: dict, device: str, load=None,
                 metrics: dict | None = None, phases: dict | None = None) -> tuple[str, list[str]]:
    """Run the kernel ``repeats`` times on guarded copies; compare each run with the reference.

    ``metrics``, when given, receives the check's metrics of the last run; ``phases`` the seconds of each step
    (``stress.core.types.PHASES``)."""
    dev = torch_device(device)
    tensors = {k: v for k, v in case.inputs.items() if isinstance(v, torch.Tensor)}
    notes = []  # what a comparator tolerated (and says so) in a passing case
    unjudged = []  # outputs a comparator could not judge: the case is not_checked
    for repeat in range(check.repeats.get(device, 1)):
        # the last repeat's guarded copies go before new ones are made (a view past 2^31 elements is GBs)
        placed = args = returned = outputs = None
        with _phase(phases, "place"):
            placed, args = guarded(case.inputs, dev)
            read_only = {name: placed[name].view for name in tensors if name not in check.outputs and name in placed}
            before = snapshot(read_only)
        if load is not None:
            load.kick()
        with _phase_less_compiles(phases, "launch"), scratch_poisoned(dev):
            returned = _current(check.kernel)(**args, **case.launch)
        tag = f"repeat {repeat}: " if repeat else ""
        # an optional output the case leaves out (None) is neither written nor compared
        outputs = {name: returned if name == RETURN else placed[name].view for name in check.outputs
                   if name == RETURN or name in placed}
        with _phase(phases, "settle"):
            damage, host, changed = settle(placed, outputs, {k: (v, before[k]) for k, v in read_only.items()})
        if damage:
            return Verdict.OOB, [tag + d for d in damage]
        outputs = {name: host[name] for name in outputs}
        with _phase(phases, "compare"):
            lines, verdict = _compared(check, expected, outputs, tensors, changed, metrics, notes, unjudged, tag)
        if lines:
            return f"fail:{verdict}", [tag + line for line in lines]
    if unjudged:
        return "not_checked:near ties", unjudged + notes
    return PASS, notes


def _compared(check: Check, expected: dict, outputs: dict, tensors: dict, inputs_after: dict, metrics: dict | None,
              notes: list, unjudged: list, tag: str) -> tuple[list[str], str]:
    """One run's outputs against the reference and the read-only inputs it changed (``inputs_after``: the device
    found them changed) against what they were: the failure lines and the first failure's verdict; what a
    comparator tolerated goes to ``notes``, what it could not judge to ``unjudged``."""
    from stress.core import compare

    compare_fn = check.compare or compare.exact
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
    for name, after in inputs_after.items():
        if found := compare.unchanged(name, tensors[name], after):
            lines += found.lines()
            verdict = verdict or found.verdict
    return lines, verdict


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
    if verdict == PASS and not recording.reports and impl.of_check(check):
        return PASS, ["the CPU tracer saw no Triton launch (the implementation launched none): nothing traced"]
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


@contextmanager
def _phase(phases: dict | None, name: str):
    """Adds the seconds the block took to ``phases[name]`` (also when it raises); nothing when ``phases`` is None."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if phases is not None:
            phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - start, 4)


@contextmanager
def _phase_less_compiles(phases: dict | None, name: str):
    """``_phase(phases, name)`` less the Triton compiles inside the block, whose seconds count under ``compile``
    instead, so a cold cache shows apart from the launches and refusals that met it."""
    from stress.core import compiles

    compiling = {}
    try:
        with _phase(phases, name), compiles.timed(compiling):
            yield
    finally:
        if phases is not None and (seconds := compiling.get("compile", 0.0)):
            phases[name] = round(phases[name] - seconds, 4)
            phases["compile"] = round(phases.get("compile", 0.0) + seconds, 4)


def judge_task(task: Task, device: str, timeout: float, trace: bool, room=None) -> tuple[Result, bool]:
    """``run_case``'s work: the Result, and whether the case ran out of device memory. ``room(nbytes)``, when given
    (``stress.core.gpu_share.GpuShare.room``), holds device memory for the built case's guarded copies while it is
    judged, and yields the seconds it waited for them."""
    from stress import checks

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
        mutant = task.patched or (checks.find_mutant(task.mutant, check) if task.mutant else None)
        if device not in check.devices:
            result.verdict = not_checked(check.skipped(device=device))
            return result, out_of_memory
        registered = impl.judged_by(check, checks.BY_NAME)
        result.impl = impl.specs(registered)
        with _phase(result.phases, "build"):
            case, expected = prebuild.case_of(check, task, device)
        result.launch, result.note = case.launch, case.note
        foreign_triton = any(impl.written_in_triton(implementation) for _, implementation in registered)
        if why := interpreter_gap(check, case, device, foreign_triton) or impl.outside_profile(check, case, registered):
            result.verdict = not_checked(why)
            return result, out_of_memory
        with room(device_bytes(case.inputs)) if room else nullcontext(0.0) as waited_for_room:
            if waited_for_room:
                result.phases["gpu_wait"] = round(waited_for_room, 4)
            result.verdict, result.details = _judged_case(check, case, task.seed, device, trace, result, mutant,
                                                          expected)
    except CaseTimeout:
        result.verdict, result.details = Verdict.TIMEOUT, [f"case ran past {timeout:g} s"]
    except SuiteError as exc:
        out_of_memory = isinstance(exc.__cause__, torch.OutOfMemoryError)  # the reference's copies on the GPU
        result.fatal = _host_damaged(result, device, exc)
        result.verdict = SUITE_ERROR
        result.details = [f"specsan's own code failed: {exc}",
                          *"".join(traceback.format_exception(exc.__cause__)).splitlines()[-12:]]
    except Exception as exc:  # noqa: BLE001 - a crashing case is a verdict, not the end of the run
        result.verdict = Verdict.CRASH
        result.details = traceback.format_exception_only(exc)[-1:] + traceback.format_exc().splitlines()[-12:]
        result.fatal = _fatal(exc) or _host_damaged(result, device, exc) or _broken_before_the_case(result)
        out_of_memory = isinstance(exc, torch.OutOfMemoryError)
    finally:
        if timeout:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
            except CaseTimeout:  # the deadline passed just as the case ended: it did end
                pass
        result.fatal = result.fatal or _memory_verdict(result)
        # like the wait for a share of the GPU before it, the wait for room is not the case's own time
        result.seconds = round(time.perf_counter() - start - result.phases.get("gpu_wait", 0.0), 4)
    return result, out_of_memory


def _on_alarm(signum, frame):
    raise CaseTimeout()
