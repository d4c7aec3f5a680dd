"""The data the harness is driven by: a Check per kernel, its Cases, its planted Mutants."""

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    """How a case ended (docs/verdicts.md). Plain strings on disk: ``results.jsonl`` holds the values, and
    ``not_checked:<reason>`` (``not_checked``) is a verdict of its own with a free-form reason."""

    PASS = "pass"
    DIVERGENCE = "fail:divergence"
    OOB = "fail:oob"
    RACE = "fail:race"
    UNINIT = "fail:uninit"
    SYNC = "fail:sync"
    ORDER_DEPENDENT = "fail:order-dependent"
    ACCEPTED = "fail:accepted"
    REFUSAL = "fail:refusal"
    CRASH = "fail:crash"
    TIMEOUT = "fail:timeout"
    SUITE_ERROR = "fail:suite-error"
    ACCOUNTING = "fail:accounting"
    DRAFTS = "fail:drafts"
    KV = "fail:kv"
    GRAPHS = "fail:graphs"
    UNIT_TEST = "fail:unit-test"

    @classmethod
    def failing(cls, oracle: str) -> "Verdict":
        """The failure an oracle reports (``Oracle`` value or a comparator's kind): ``race`` -> ``fail:race``."""
        return cls(f"fail:{oracle}")


FAIL = "fail:"  # the prefix of every failing verdict
NOT_CHECKED = "not_checked:"


def not_checked(reason: str) -> str:
    """The verdict of a case that could not be judged here, and why: never a pass."""
    return f"{NOT_CHECKED}{reason}"


class Judged:
    """What a record with a ``verdict`` (a case's Result, a hunt's) says of it."""

    verdict: str

    @property
    def failed(self) -> bool:
        return self.verdict.startswith(FAIL)

    @property
    def not_checked(self) -> bool:
        return self.verdict.startswith(NOT_CHECKED)


class Oracle(StrEnum):
    """What kills a planted bug on a device (``Mutant.oracles``): the failure verdict it must produce, or the
    compute-sanitizer tool whose finding kills it on a GPU."""

    DIVERGENCE = "divergence"
    OOB = "oob"
    RACE = "race"
    UNINIT = "uninit"
    ACCEPTED = "accepted"
    REFUSAL = "refusal"
    CRASH = "crash"
    ACCOUNTING = "accounting"
    DRAFTS = "drafts"
    KV = "kv"
    GRAPHS = "graphs"
    MEMCHECK = "memcheck"
    INITCHECK = "initcheck"
    SYNCCHECK = "synccheck"
    ANY = "any"  # any failure but a timeout or a suite error (a generated mutant's, a path hunt's)


PASS = Verdict.PASS
RETURN = "return"  # output name that stands for the kernel's return value
DEFAULT_TIMEOUT = 300.0  # seconds per case, for `run`, `mutants` and `repro` alike


@dataclass
class Case:
    """One fully determined input: everything follows from (check, family, seed, device)."""

    inputs: dict[str, Any]  # CPU tensors and scalars, by argument name of kernel and reference
    launch: dict[str, Any] = field(default_factory=dict)  # kernel-only knobs (chunk, num_warps)
    note: str = ""  # what makes the case interesting, for reports
    unwritten: dict[str, Any] = field(default_factory=dict)  # input name -> bool mask of bytes never written
    refused: str = ""  # a refusal case: the argument the launcher's ValueError must name (stress.core.refusal)
    # a refusal case of a limit of the suite's own kernel on the GPU (its tiles' shared memory), not of the
    # contract: not asked of another implementation
    own_limit: bool = False
    more_refusals: list["Case"] = field(default_factory=list)  # refusal cases judged after this one, in order


@dataclass(frozen=True)
class Family:
    """A family of cases: ``build(rng, device, launch) -> Case``, and the traits the harness reads from it.

    ``own_launch_on``: devices where its cases run with no launch knobs (``stress.families.common.own_launch``);
    ``iteration_share``: the fraction of a run's iterations it gets (``one_per_value``); ``corruptions``: set on
    a refusal family (``stress.families.refusals.refusal_family``), each applied to its own case of ``valid``;
    ``ignored``: set on a poisoned family (``stress.families.ignored.poisoned``), the regions of a case of ``valid``
    its contract ignores, which it fills with hostile values. A Check wraps a plain builder function in a Family
    with none of these traits.
    """

    build: Callable[..., Case]
    own_launch_on: tuple[str, ...] = ()
    iteration_share: float = 1.0
    corruptions: tuple = ()
    valid: Callable | None = None
    ignored: Callable | None = None

    def __call__(self, rng, device: str, launch: dict, **options) -> Case:
        return self.build(rng, device, launch, **options)

    @property
    def refuses(self) -> bool:
        return bool(self.corruptions)

    @property
    def doc(self) -> str:
        return self.build.__doc__ or ""

    @staticmethod
    def of(family: "Family | Callable") -> "Family":
        return family if isinstance(family, Family) else Family(family)


DEVICES = ("cpu", "cuda")
SANITIZER = "compute-sanitizer"  # the tool a Skip may name


@dataclass(frozen=True)
class Skip:
    """Where a check's cases cannot be judged, and why: on a ``device``, or under a ``tool`` (``SANITIZER``).
    Such a case is ``not_checked`` with ``reason``, never a pass."""

    reason: str
    device: str | None = None
    tool: str | None = None

    def __post_init__(self):
        if not self.reason or (self.device is None) == (self.tool is None) or self.device not in (None, *DEVICES):
            raise ValueError(f"skips: a Skip names one device of {DEVICES} or one tool, and why: {self!r}")


@dataclass(frozen=True)
class Choice:
    """A documented way an implementation may differ from a check's contract by design (``--impl ...@choice``).

    ``outside(case)``: why a case exercises what the choice leaves out (it is then ``not_checked`` with that
    reason), else None. ``expect(case, expected)``: the expected outputs under the choice, where it defines
    them differently. ``doc``: the choice in one line, as ``list --impl`` prints it.
    """

    doc: str
    outside: Callable[[Case], str | None] | None = None
    expect: Callable[[Case, dict], dict] | None = None


@dataclass(frozen=True)
class Patch:
    """Replace ``old`` (which must occur exactly once) by ``new`` in the source of ``target``."""

    target: str  # "module:attribute", a @triton.jit kernel or a plain function
    old: str
    new: str


@dataclass(frozen=True)
class Reach:
    """How a whole-path check (``Check.whole_path``) reaches a bug planted in another check: the families
    that reach it (its hunt tries them first), or, per device, why none of its cases can."""

    families: tuple[str, ...] = ()
    unreachable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Mutant:
    """A planted bug: the pre-fix form of an upstream fix, or a classic kernel slip.

    ``oracles`` maps a device to the verdict that must kill the mutant there; a device that is
    missing is reported ``not_checked`` with ``why_not`` as the reason.
    An oracle may also name a compute-sanitizer tool (``memcheck``, ``initcheck``): on the GPU the
    hunt's cases then run under that tool, and its finding (``fail:oob``, ``fail:uninit``) kills.
    """

    name: str
    description: str
    patches: tuple[Patch, ...]
    oracles: dict[str, str]
    families: tuple[str, ...] = ()  # restrict the hunt to these families (default: all)
    why_not: str = "no oracle on this device"
    path: Reach = field(default_factory=Reach)  # how the whole-path check reaches it

    def __post_init__(self):
        for device, oracle in self.oracles.items():
            if oracle not in Oracle.__members__.values():
                raise ValueError(f"oracles: {self.name}'s {device} oracle {oracle!r} is none of "
                                 f"{', '.join(Oracle)}")


@dataclass(frozen=True)
class Check:
    """One kernel (or host function) with its reference, case families, outputs and mutants.

    ``kernel(**case.inputs, **case.launch)`` writes the tensors named in ``outputs`` in place
    (or returns the output named ``RETURN``); ``reference(**case.inputs)`` returns the expected
    outputs (one value, or a tuple in ``outputs`` order) and mutates nothing.
    ``families[name](rng, device, launch)`` builds a Case; ``sweep(device)`` lists the launch
    shapes a case may draw. ``provenance`` names, per output, the input its values are copied
    from, so a divergence can say where a wrong value came from. ``expected_order_dependence``
    is the reason a kernel may produce another valid output when its programs run in another
    order (positions handed out by atomic tickets); None (the default): the CPU tracer's
    reorder reruns must reproduce the output, else ``fail:order-dependent``. ``skips`` says where
    (a device, compute-sanitizer) its cases cannot be judged and why (``skipped``).
    ``metrics(expected, outputs)`` (dicts by output name) gives numbers recorded with every case
    (the engine's acceptance). A ``whole_path`` check also hunts every other check's planted bugs
    (the kill matrix's path column), each as its ``Mutant.path`` says. ``iteration_share``: the fraction
    of ``--iters`` a run gives each family (at least one case), for checks whose one case replays many
    steps of many kernels.
    ``hunt_seconds``: per device, how long ``run --hunt`` (``make stress``) hammers the kernel with
    ``stress.hunt`` (race-prone kernels; a device missing is not hunted).
    """

    name: str
    kernel: Callable
    reference: Callable
    families: dict[str, Family]  # plain builder functions are wrapped (Family.of)
    outputs: tuple[str, ...]
    compare: Callable | None = None  # None: stress.core.compare.exact
    mutants: tuple[Mutant, ...] = ()
    skips: tuple[Skip, ...] = ()
    sweep: Callable[[str], list[dict]] | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    repeats: dict[str, int] = field(default_factory=lambda: {"cpu": 1, "cuda": 3})
    expected_order_dependence: str | None = None
    metrics: Callable | None = None
    whole_path: bool = False
    iteration_share: float = 1.0
    hunt_seconds: dict[str, float] = field(default_factory=dict)  # race-prone: `run --hunt` hunts it this long
    # pytest node ids that pin host logic no device's cases reach (a fallback on a simulated smaller device), or
    # reach more widely than its families can afford (the engine's scheduler alone, over many workloads):
    # `stress mutate` runs them against each mutant that survives every family (SPECSAN_MUTANT, see conftest.py)
    unit_tests: tuple[str, ...] = ()
    contract: str = ""  # one line: what the check holds the code to (in full: the page `docs` names)
    choices: dict[str, Choice] = field(default_factory=dict)  # the contract profile an implementation may declare
    # the production launcher an implementation registered against this check stands in for, where ``kernel`` is
    # the suite's adapter over it (None: ``kernel`` itself, when it is a launcher of kernels/)
    launcher: Callable | None = None
    # other checks whose launchers ``kernel`` (a driver) calls: an implementation registered against one of them
    # is what this check's cases judge (rejection.distribution runs verify's trials)
    judges: tuple[str, ...] = ()

    @property
    def docs(self) -> str:
        """Where the contract is stated in full: docs/contracts/<module>.md, at the check's section."""
        return f"docs/contracts/{self.name.split('.')[0]}.md#{self.name.replace('.', '')}"
    # its kernel computes tl.dot on bfloat16 operands, which the Triton interpreter multiplies as raw bit patterns:
    # on the CPU its cases with a bfloat16 input are not_checked (the suite's own kernels upcast, and leave it False)
    bf16_dot: bool = False
    # building its GPU-sized cases and their reference takes tens of milliseconds of host time or more: a GPU run
    # has builder processes do both ahead of the case's turn (``stress.core.prebuild``), off its workers' path
    host_heavy: bool = False

    def __post_init__(self):
        object.__setattr__(self, "families", {name: Family.of(f) for name, f in self.families.items()})

    @property
    def devices(self) -> tuple[str, ...]:
        """The devices its cases run on: every one it does not skip."""
        return tuple(d for d in DEVICES if self.skipped(device=d) is None)

    def skipped(self, device: str | None = None, tool: str | None = None) -> str | None:
        """Why its cases cannot be judged on ``device`` (or under ``tool``), or None where they can."""
        return next((s.reason for s in self.skips if (device and s.device == device) or (tool and s.tool == tool)),
                    None)

    def mutant(self, name: str) -> Mutant:
        for planted in self.mutants:
            if planted.name == name:
                return planted
        known = ", ".join(m.name for m in self.mutants) or "none"
        raise ValueError(f"mutant {name!r} is not one of {self.name}'s: {known}")


PHASES = ("build", "reference", "place", "launch", "compile", "settle", "compare", "trace", "refusal", "gpu_wait",
          "release", "built_ahead")
"""Where a case's seconds go (``Result.phases``): building its inputs, the reference, placing guarded copies on
the device, launching the kernel (host side; on a GPU it runs while the next step waits), compiling launch shapes
this process had not compiled, settling (the one wait for the device, guard zones and outputs read back),
comparing, the CPU tracer, judging refusals; and around the case (``OUTSIDE``), waiting for a share of the GPU and
releasing what the case left (the device memory its worker should not keep cached, its compile locks); and
``BESIDE`` it, building it ahead in a builder process (``stress.core.prebuild``; its worker then only maps it)."""

OUTSIDE = ("gpu_wait", "release")  # phases timed before or after a case, not within its seconds
BESIDE = ("built_ahead",)  # phases timed in another process: neither the case's seconds nor its worker's


@dataclass
class Result(Judged):
    """The verdict of one case, as streamed to results.jsonl."""

    check: str
    family: str
    seed: int
    device: str
    verdict: str
    details: list[str] = field(default_factory=list)
    launch: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    mutant: str | None = None
    seconds: float = 0.0
    fatal: bool = False  # the process is unsafe after this case (a poisoned CUDA context, a heap a stray write hit)
    timeout: float = DEFAULT_TIMEOUT  # the deadline the case ran under (0 = none)
    trace: bool = True  # whether a passing CPU case was also run under the tracer
    metrics: dict[str, float] = field(default_factory=dict)  # Check.metrics of the last run
    gpu: int | None = None  # the CUDA device index the case ran on (None on the CPU)
    tool: str | None = None  # the compute-sanitizer tool the case ran under (stress.sanitize.runner), if any
    phases: dict[str, float] = field(default_factory=dict)  # seconds, by PHASES
    impl: str | None = None  # the --impl registration judged in place of the production launcher (its spec)

    def repro(self) -> str:
        """The command that reruns exactly this case from a checkout: launch shape, deadline and tracer too."""
        line = f"./specsan repro {self.check} {self.family} {self.seed} --device {self.device}"
        if self.mutant:
            line += f" --mutant {self.mutant}"
        if self.launch:
            line += " --launch " + ",".join(f"{k}={v}" for k, v in sorted(self.launch.items()))
        if self.timeout != DEFAULT_TIMEOUT:
            line += f" --timeout {self.timeout:g}"
        if not self.trace and self.device == "cpu":
            line += " --no-trace"
        if self.tool:
            line += f" --sanitizer {self.tool}"
        if self.impl:
            line += f" --impl {self.impl}"
        return line


@dataclass
class Kill:
    check: str
    mutant: str
    device: str
    oracle: str
    status: str  # killed | survived | not_checked | stale | unfinished (not decided yet, or interrupted)
    iterations: int = 0  # cases run until the first kill (or in all, when it survived)
    launch: dict = field(default_factory=dict)
    repro: str = ""
    reason: str = ""
    other_failures: list[str] = field(default_factory=list)  # verdicts other than the claimed oracle
    other_example: str = ""  # the first of those failures: its first detail line and its repro
    verdict: str = ""  # the failing verdict that killed it
    detail: str = ""  # the killing case's first detail line (a crash's exception, say)
    # The whole-path check's hunt of the same bug (the path column): status, verdict, cases, repro or reason
    path: str = "-"
    path_verdict: str = ""
    path_iterations: int = 0
    path_detail: str = ""

    def also_failed(self) -> str:
        """Its hunt's failures other than the oracle's, and the first in full: a row that also failed otherwise may
        have a broken oracle, not a weak one."""
        return f"(also failed as {', '.join(self.other_failures)}; first: {self.other_example})"


def kill_matrix_verdict(rows: list[Kill], device: str) -> tuple[str, bool]:
    """The matrix's closing line, and whether every checkable mutant was killed.

    With ``--by-shape`` a mutant has one row per launch shape; it is killed when any shape kills
    it (a race can be invisible in some shapes, e.g. one warp, and certain in others)."""
    status: dict[tuple[str, str], set[str]] = {}
    for k in rows:
        status.setdefault((k.check, k.mutant), set()).add(k.status)
    checkable = [s for s in status.values() if s != {"not_checked"} and s != {"not_hunted"}]
    killed = sum("killed" in s for s in checkable)
    line = (f"{killed} of {len(checkable)} checkable mutants killed on {device}; "
            f"{sum(s == {'not_checked'} for s in status.values())} not checked here")
    path = {k.mutant: k.path for k in rows if k.path != "-"}
    missed = sorted(m for m, p in path.items() if p not in ("killed", "unreachable"))
    if path:
        line += (f"; path column: {sum(p == 'killed' for p in path.values())} killed by the whole step, "
                 f"{sum(p == 'unreachable' for p in path.values())} unreachable"
                 + (f", NOT killed: {', '.join(missed)}" if missed else ""))
    return line, killed == len(checkable) and not missed
