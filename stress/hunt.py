"""Hunt mode: hammer a kernel back to back with its inputs resident on the device.

A race that fires once in 10^4 launches needs far more launches than the replay's three per
case, and a replay case pays for guard zones, a CPU reference and a host sync on every launch.
Here each fresh case is uploaded once and its expected outputs computed once; the kernel is then
launched ``launches_per_case`` times, each launch on its own copy of the in-place outputs (one
device copy per case, no restore between launches), and all copies are compared with the
expected outputs by one device reduction per case. The host syncs once per ``cases_per_sync``
cases, so the GPU stays busy while the CPU builds the next cases. The first failure stops the
hunt and names its case, its launch shape and the commands that rerun it.

Supported: checks whose outputs are exact tensor inputs written in place or through ``out=``
(``supports`` says why another is refused). Runs under the CPU interpreter too (slowly), where no race
can fire: a hunt that finds nothing there is ``not_checked`` (``blind_spot``), never a pass.
"""

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from stress.core import cases, compare, gpus, guards, oracle, refusal, workers
from stress.core import patches as mutants
from stress.core.types import RETURN, Check, Judged, Result, Verdict, not_checked
from stress.mutate import operators


@dataclass
class ShapeStats:
    """What one launch shape saw: launches, cases and the hunt time spent in it, and when it failed."""

    launches: int = 0
    cases: int = 0
    seconds: float = 0.0
    caught_after_s: float | None = None  # this shape's own hunt time up to the sync that saw the failure


@dataclass
class HuntResult(Judged):
    check: str
    device: str
    verdict: str  # a Verdict, or not_checked(why) when nothing it could catch was found
    launches: int = 0
    cases: int = 0
    seconds: float = 0.0  # hunting time, warm-up (compiles) excluded
    warmup_s: float = 0.0
    mutant: str | None = None
    load: bool = False
    failure: Result | None = None  # the failing case, with its launch shape, seed and details
    failed_launch: int | None = None  # which launch of the failing case (0-based)
    shapes: dict[str, ShapeStats] = field(default_factory=dict)  # by launch shape, "k=v,..." keys
    processes: int = 1  # hunts that ran side by side (merged)
    fatal: bool = False  # the worker's CUDA context is unusable (a raised hunt is reported by the pool instead)

    def record(self) -> dict:
        """The hunt as one JSON-able record (results.jsonl, --json), with rates and repro lines."""
        record = asdict(self)
        record.update(launches_per_s=round(self.launches_per_s, 1), cases_per_s=round(self.cases_per_s, 1))
        if self.failure:
            record["failure"]["repro"] = self.failure.repro()
            record["hunt_line"] = self.hunt_line()
        return record

    @property
    def launches_per_s(self) -> float:
        return self.launches / self.seconds if self.seconds else 0.0

    @property
    def cases_per_s(self) -> float:
        return self.cases / self.seconds if self.seconds else 0.0

    def hunt_line(self) -> str:
        """The command that hammers exactly the failing case again, in its launch shape."""
        f = self.failure
        line = (f"./specsan hunt {f.check} --family {f.family} --case-seed {f.seed} --device {f.device} "
                f"--launch {shape_key(f.launch)}")
        return line + (f" --mutant {f.mutant}" if f.mutant else "") + (" --load" if self.load else "")

    def lines(self) -> list[str]:
        head = (f"hunt {self.check} on {self.device}{f' (mutant {self.mutant})' if self.mutant else ''}: "
                f"{self.verdict}: {self.launches} checked launches, {self.cases} fresh cases in {self.seconds:.2f} s "
                f"({self.launches_per_s:.0f} launches/s, {self.cases_per_s:.0f} cases/s; warm-up "
                f"{self.warmup_s:.1f} s{', background load' if self.load else ''}"
                f"{f', {self.processes} processes' if self.processes > 1 else ''})")
        out = [head]
        if self.failure:
            f = self.failure
            out += [f"  first failure: {f.family} seed {f.seed}, launch {self.failed_launch} of its case, shape "
                    f"{shape_key(f.launch) or 'default'} ({f.note})", f"  {f.repro()}", f"  {self.hunt_line()}"]
            out += [f"  {d}" for d in f.details[:8]]
        if len(self.shapes) > 1 or any(s.caught_after_s is not None for s in self.shapes.values()):
            for key, s in self.shapes.items():
                caught = (f"caught after {s.caught_after_s:.3f} s" if s.caught_after_s is not None
                          else f"not caught in {s.seconds:.2f} s")
                out.append(f"  {key or 'default'}: {caught} ({s.launches} launches, {s.cases} cases)")
        return out


def shape_key(launch: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(launch.items()))


def supports(check: Check, device: str) -> str | None:
    """None when ``check`` can be hunted on ``device``, else why not."""
    if device not in check.devices:
        return check.skipped(device=device)
    if RETURN in check.outputs:
        return f"{check.name} returns its output; hunt needs outputs written into tensor arguments"
    if check.compare is not None:
        return f"{check.name} is judged by {check.compare.__name__}, not bit for bit; hunt compares exactly on " \
               "the device"
    return None


INTERPRETED = ("the CPU interpreter runs a launch's programs one after another and its barriers are no-ops, so no "
               "race can fire in a hunt there; on the CPU the tracer of `run` and `trace` checks races")


def blind_spot(device: str, planted) -> str | None:
    """Why a hunt on ``device`` cannot catch what it hunts (the production code's races, or ``planted``),
    else None. A hunt sees only outputs that differ: a planted bug it can catch is one whose oracle on
    ``device`` is a divergence (a generated mutant's is "any"); without one it hunts races, which the CPU
    interpreter cannot produce."""
    if planted is not None and planted.oracles.get(device) in ("divergence", "any"):
        return None
    if planted is not None:
        return (f"mutant {planted.name} shows on {device} as {planted.oracles.get(device) or 'nothing'}, not as "
                f"outputs that differ, which is all a hunt compares" + (f"; {INTERPRETED}" if device == "cpu" else ""))
    return INTERPRETED if device == "cpu" else None


def huntable(device: str) -> list[str]:
    from stress import checks

    return [c.name for c in checks.REGISTRY if supports(c, device) is None]


def _upload(tensors: list[torch.Tensor], dev: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Copy CPU tensors to ``dev`` in one transfer: each in its own 64-byte-aligned segment of one buffer
    (a small host-to-device copy costs about as much as a launch). Returns the buffer and the views."""
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // 64) * 64
    host = torch.zeros(total, dtype=torch.uint8)  # zeroed gaps: two copies of a region compare equal
    for t, at in zip(tensors, offsets, strict=True):
        host[at:at + t.numel() * t.element_size()].view(t.dtype).copy_(t.reshape(-1))
    buffer = host.to(dev)
    return buffer, [buffer[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                    for t, at in zip(tensors, offsets, strict=True)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Floats as same-size integers, so the device comparison is bit for bit (NaN payloads, -0.0)."""
    return t.view(compare._BITS[t.element_size()]) if t.is_floating_point() else t


class _Staged:
    """One case on the device: read-only inputs (and a pristine copy of them), a copy of every output per
    launch, the expected outputs; uploaded in one transfer."""

    def __init__(self, check: Check, case, expected: dict, dev: torch.device, launches: int):
        self.case = case
        tensors = {k: v for k, v in case.inputs.items() if isinstance(v, torch.Tensor)}
        read_only = [k for k in tensors if k not in check.outputs]
        outputs = [k for k in tensors if k in check.outputs]
        order = [tensors[k] for k in read_only] * 2 + [tensors[k] for k in outputs] + [expected[k] for k in outputs]
        buffer, views = _upload(order, dev)
        ro_bytes = sum(-(-t.numel() * t.element_size() // 64) * 64 for t in order[:len(read_only)])
        self.read_only, self.pristine = buffer[:ro_bytes], buffer[ro_bytes:2 * ro_bytes]
        self.args = {k: v for k, v in case.inputs.items() if not isinstance(v, torch.Tensor)}
        self.args.update(zip(read_only, views, strict=False))
        self.pristine_views = dict(zip(read_only, views[len(read_only):], strict=False))
        starts = views[2 * len(read_only):2 * len(read_only) + len(outputs)]
        self.work = {k: v.unsqueeze(0).repeat(launches, *([1] * v.dim())) for k, v in zip(outputs, starts, strict=True)}
        self.expected = dict(zip(outputs, views[2 * len(read_only) + len(outputs):], strict=True))

    def launch(self, kernel, i: int, streams=None) -> None:
        """Launch ``i`` writes its own output copies; on a GPU it runs on stream ``i mod len(streams)``, so
        launches that cannot fill the GPU (one program per row) run side by side."""
        if not streams:
            kernel(**self.args, **{name: work[i] for name, work in self.work.items()}, **self.case.launch)
            return
        with torch.cuda.stream(streams[i % len(streams)]):
            kernel(**self.args, **{name: work[i] for name, work in self.work.items()}, **self.case.launch)

    def bad_launches(self, launches: int) -> torch.Tensor:
        """[launches] bool on the device: which launches left a wrong output; a modified read-only input
        marks every launch (it cannot be pinned to one)."""
        bad = (self.read_only != self.pristine).any().expand(launches)
        for name, work in self.work.items():
            if work[0].numel():
                bad = bad | (_bits(work) != _bits(self.expected[name]).unsqueeze(0)).flatten(1).any(1)
        return bad

    def details(self, check: Check, i: int) -> list[str]:
        lines = []
        for name, work in self.work.items():
            found = compare.exact(name, self.expected[name], work[i])
            if found is not None:
                lines += found.lines(self.case.inputs.get(check.provenance.get(name, "")))
        for name, copy in self.pristine_views.items():
            if (found := compare.unchanged(name, copy, self.args[name])) is not None:
                lines += found.lines()
        return lines


def _load(device: str, dev: torch.device):
    if device != "cuda":
        return None
    from stress.core.load import MemoryTraffic

    return MemoryTraffic(dev)


def hunt(check: Check, device: str, *, seconds: float, families: list[str] | None = None, seed: int = 0,
         case_seed: int | None = None, launch: dict | None = None, mutant: str | None = None,
         launches_per_case: int = 16, cases_per_sync: int = 8, load: bool = False, by_shape: bool = False,
         min_cases: int = 1, streams: int = 4) -> HuntResult:
    """Hunt ``check`` for ``seconds`` of launches (at least ``min_cases`` cases, whatever the time).

    Cases cycle through ``families`` (default: the mutant's, else all) and launch shapes (``launch``,
    else the check's sweep); ``case_seed`` hammers that one case instead of drawing fresh ones.
    With ``by_shape`` each shape is hunted on its own for ``seconds``, until its first failure. On a GPU a
    case's launches are spread over ``streams`` streams.
    """

    if (why := supports(check, device)) is not None:
        raise ValueError(f"{check.name}: no hunt support on {device}: {why}; huntable here: "
                         f"{', '.join(huntable(device)) or 'none'}")
    planted = operators.find(mutant, check) if mutant else None
    fams = [f for f in families or (planted.families if planted and planted.families else check.families)
            if not refusal.is_family(check.families[f])]  # a refusal case launches nothing to hammer
    shapes = [dict(launch)] if launch is not None else (check.sweep(device) if check.sweep else [{}])
    dev = guards.torch_device(device)
    result = HuntResult(check.name, device, "pass", mutant=mutant, load=load,
                        shapes={shape_key(s): ShapeStats() for s in shapes})
    with mutants.applied(planted):
        kernel = oracle._current(check.kernel)
        start = time.perf_counter()
        for shape in shapes:  # compile every shape first, so hunting time is launch time
            _Staged(check, *_fresh(check, fams[0], seed, device, shape), dev, 1).launch(kernel, 0)
        _sync(device)
        result.warmup_s = time.perf_counter() - start
        traffic = _load(device, dev) if load else None
        groups = [[s] for s in shapes] if by_shape else [shapes]
        for group in groups:
            _hunt_group(check, device, dev, kernel, result, group, fams, seed, case_seed, seconds,
                        launches_per_case, cases_per_sync, traffic, min_cases, streams)
            if result.failed and not by_shape:
                break
        if traffic is not None:
            traffic.drain()
    if not result.failed and (why := blind_spot(device, planted)):
        result.verdict = not_checked(why)
    return result


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _fresh(check: Check, family: str, seed: int, device: str, shape: dict):
    case = cases.build_case(check, family, seed, device, shape)
    return case, cases.expected_outputs(check, case)


def _hunt_group(check, device, dev, kernel, result: HuntResult, shapes, fams, seed, case_seed, seconds,
                launches_per_case, cases_per_sync, traffic, min_cases, num_streams) -> None:
    """Hunt over ``shapes`` until ``seconds`` pass or a failure shows; fills ``result``."""
    streams = [torch.cuda.Stream(dev) for _ in range(num_streams)] if device == "cuda" else []
    main = torch.cuda.current_stream(dev) if device == "cuda" else None
    pending = []  # (staged case, family, seed, shape key, its bad-launch flags) since the last sync
    start = time.perf_counter()
    first, done = (0 if case_seed is not None else result.cases), 0
    while True:
        i = first + done
        family, shape = fams[i % len(fams)], shapes[i % len(shapes)]
        case_i = case_seed if case_seed is not None else cases.case_seed(seed, check.name, family, i)
        staged = _Staged(check, *_fresh(check, family, case_i, device, shape), dev, launches_per_case)
        if traffic is not None:
            traffic.kick()
        for s in streams:
            s.wait_stream(main)  # the uploads come first
        for j in range(launches_per_case):
            staged.launch(kernel, j, streams)
        for s in streams:
            main.wait_stream(s)  # then the comparison
        pending.append((staged, family, case_i, shape_key(shape), staged.bad_launches(launches_per_case)))
        done += 1
        elapsed = time.perf_counter() - start
        if len(pending) < cases_per_sync and elapsed < seconds:
            continue
        flags = torch.stack([p[-1] for p in pending]).cpu().numpy()  # the one host sync of the batch
        elapsed = time.perf_counter() - start
        _account(result, pending, flags, launches_per_case, elapsed - result_seconds(result, shapes))
        if flags.any():
            b, j = (int(x) for x in np.argwhere(flags)[0])
            staged, family, case_i, key, _ = pending[b]
            stats = result.shapes[key]
            stats.caught_after_s = stats.seconds
            if result.failure is None:
                result.verdict, result.failed_launch = Verdict.DIVERGENCE, j
                result.failure = Result(check.name, family, case_i, device, Verdict.DIVERGENCE,
                                        details=staged.details(check, j), launch=dict(staged.case.launch),
                                        note=staged.case.note, mutant=result.mutant)
            return
        pending = []
        if elapsed >= seconds and done >= min_cases:
            return


def result_seconds(result: HuntResult, shapes) -> float:
    """Hunting time already charged to ``shapes`` (by earlier syncs of this group)."""
    return sum(result.shapes[shape_key(s)].seconds for s in shapes)


def _account(result: HuntResult, pending, flags, launches_per_case: int, seconds: float) -> None:
    """Charge a batch's launches and cases, and its time split by launches, to the totals and the shapes."""
    result.cases += len(pending)
    result.launches += len(pending) * launches_per_case
    result.seconds += seconds
    for p in pending:
        stats = result.shapes[p[3]]
        stats.cases += 1
        stats.launches += launches_per_case
        stats.seconds += seconds / len(pending)


def _hunt_task(item: tuple, device: str) -> HuntResult:
    from stress import checks

    name, options = item
    return hunt(checks.get(name), device, **options)


def _failed_process(name: str, device: str, seed: int, outcome) -> HuntResult:
    """A hunt whose worker hung past its deadline, died or raised: the hunt fails, charged to no case."""
    verdict = Verdict.TIMEOUT if outcome.failure == "timeout" else Verdict.CRASH
    failed = HuntResult(name, device, verdict)
    failed.failure = Result(name, "hunt", seed, device, verdict,
                            details=(outcome.detail or outcome.failure).splitlines()[-12:])
    return failed


def merged(results: list[HuntResult]) -> HuntResult:
    """Hunts that ran side by side as one: launches and cases summed over the wall time of the longest,
    the first failure reported, per shape the earliest catch."""
    first = next((r for r in results if r.failed), results[0])
    out = HuntResult(first.check, first.device, first.verdict, mutant=first.mutant, load=first.load,
                     failure=first.failure, failed_launch=first.failed_launch, processes=len(results))
    out.launches, out.cases = sum(r.launches for r in results), sum(r.cases for r in results)
    out.seconds, out.warmup_s = max(r.seconds for r in results), max(r.warmup_s for r in results)
    for r in results:
        for key, stats in r.shapes.items():
            into = out.shapes.setdefault(key, ShapeStats())
            into.launches, into.cases = into.launches + stats.launches, into.cases + stats.cases
            into.seconds = max(into.seconds, stats.seconds)
            if stats.caught_after_s is not None:
                into.caught_after_s = min(stats.caught_after_s, into.caught_after_s or stats.caught_after_s)
    return out


def hunt_processes(check: Check, device: str, jobs: int, *, seed: int = 0, timeout: float = 0.0,
                   **options) -> HuntResult:
    """``hunt`` in ``jobs`` worker processes at once (a hunt is bound by building cases and launching them from
    Python, so processes add launches until the device is full), merged. The first process draws the cases a
    one-process hunt of ``seed`` draws, the others their own; a process past ``timeout`` (0: none) is killed and
    its hunt fails. ``jobs`` 0 hunts in this process."""
    from functools import partial

    items = iter([(check.name, {**options, "seed": s}) for s in process_seeds(check, seed, jobs)])
    results = []

    def on_outcome(outcome) -> None:
        results.append(_failed_process(check.name, device, seed, outcome) if outcome.failure else outcome.value)

    with workers.worker_pool(partial(_hunt_task, device=device), device, jobs, timeout) as case_pool:
        case_pool.run(lambda: next(items, None), on_outcome)
    return merged(results)


def process_seeds(check: Check, seed: int, jobs: int) -> list[int]:
    """The seed each of ``jobs`` side-by-side hunts draws its cases from (one for ``jobs`` 0, this process): the
    first ``seed`` itself, so one process hunts what ``hunt`` alone does, the others seeds of their own."""
    return [seed] + [cases.case_seed(seed, check.name, "hunt process", k) for k in range(1, jobs)]


def planned(checks: list[Check], device: str) -> list[Check]:
    """The checks ``run --hunt`` hunts on ``device``: those with hunt seconds there that a hunt supports."""
    return [c for c in checks if device in c.hunt_seconds and supports(c, device) is None]


# hunts side by side on one GPU in ``run --hunt`` (see hunt_jobs): on one H200, block_table.shift's 4 s hunt in 4
# processes checked 22,702 launches/s over 1,419 fresh cases/s; one process had checked 8,539 over 534
HUNT_PROCESSES_PER_GPU = 4


def hunt_jobs(device: str, jobs: int) -> int:
    """Processes of one ``run --hunt`` hunt: on GPUs up to HUNT_PROCESSES_PER_GPU per GPU within ``jobs`` (a
    process builds and launches fresh cases at a rate its one core allows, the GPU has room for more); on the
    CPU one, where the interpreter can fire no race; 0 (this process) with ``jobs`` 0."""
    if jobs == 0:
        return 0
    if device != "cuda":
        return 1
    return max(1, min(jobs, HUNT_PROCESSES_PER_GPU * max(1, gpus.count())))


def run_hunts(checks: list[Check], device: str, seed: int, jobs: int, timeout: float, on_result) -> None:
    """``run --hunt``: each selected check with ``hunt_seconds`` for ``device``, one after another, each in
    ``hunt_jobs`` worker processes at once (a hang or a crash is charged to that hunt), ``on_result`` per hunt."""
    processes = hunt_jobs(device, jobs)
    for check in planned(checks, device):
        on_result(hunt_processes(check, device, processes, seed=seed, timeout=timeout,
                                 seconds=check.hunt_seconds[device]))
