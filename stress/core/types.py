"""The data the harness is driven by: a Check per kernel, its Cases, its planted Mutants."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PASS = "pass"
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
    more_refusals: list["Case"] = field(default_factory=list)  # refusal cases judged after this one, in order


@dataclass(frozen=True)
class Patch:
    """Replace ``old`` (which must occur exactly once) by ``new`` in the source of ``target``."""

    target: str  # "module:attribute", a @triton.jit kernel or a plain function
    old: str
    new: str


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
    reorder reruns must reproduce the output, else ``fail:order-dependent``. ``why_not`` says
    why a device outside ``devices`` cannot judge the check (its ``not_checked`` reason there).
    ``metrics(expected, outputs)`` (dicts by output name) gives numbers recorded with every case
    (the engine's acceptance). A whole-path check sets ``unreachable``: it also hunts every other
    check's planted bugs (the kill matrix's path column), and this maps each bug it cannot reach
    to, per device, the reason; ``path_families`` names, per bug, the families that reach it (its
    hunt tries them first). ``iteration_share``: the fraction of ``--iters`` a run gives each
    family (at least one case), for checks whose one case replays many steps of many kernels.
    ``hunt_seconds``: per device, how long ``run --hunt`` (``make stress``) hammers the kernel with
    ``stress.hunt`` (race-prone kernels; a device missing is not hunted).
    """

    name: str
    kernel: Callable
    reference: Callable
    families: dict[str, Callable]
    outputs: tuple[str, ...]
    compare: Callable | None = None  # None: stress.core.compare.exact
    mutants: tuple[Mutant, ...] = ()
    devices: tuple[str, ...] = ("cpu", "cuda")
    sweep: Callable[[str], list[dict]] | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    repeats: dict[str, int] = field(default_factory=lambda: {"cpu": 1, "cuda": 3})
    expected_order_dependence: str | None = None
    why_not: str = ""
    metrics: Callable | None = None
    unreachable: dict[str, dict[str, str]] | None = None
    path_families: dict[str, tuple[str, ...]] = field(default_factory=dict)
    iteration_share: float = 1.0
    hunt_seconds: dict[str, float] = field(default_factory=dict)  # race-prone: `run --hunt` hunts it this long
    not_sanitized: str = ""  # why its cases cannot run under compute-sanitizer ("" = they can)
    # pytest node ids that pin host logic no device's cases reach (a fallback on a simulated smaller device), or
    # reach more widely than its families can afford (the engine's scheduler alone, over many workloads):
    # `stress mutate` runs them against each mutant that survives every family (SPECSAN_MUTANT, see conftest.py)
    unit_tests: tuple[str, ...] = ()
    contract: str = ""  # one line: what the check holds the code to (in full: the page `docs` names)

    @property
    def docs(self) -> str:
        """Where the contract is stated in full: docs/contracts/<module>.md, at the check's section."""
        return f"docs/contracts/{self.name.split('.')[0]}.md#{self.name.replace('.', '')}"
    # its kernel computes tl.dot on bfloat16 operands, which the Triton interpreter multiplies as raw bit patterns:
    # on the CPU its cases with a bfloat16 input are not_checked (the suite's own kernels upcast, and leave it False)
    bf16_dot: bool = False

    def mutant(self, name: str) -> Mutant:
        for planted in self.mutants:
            if planted.name == name:
                return planted
        known = ", ".join(m.name for m in self.mutants) or "none"
        raise ValueError(f"mutant {name!r} is not one of {self.name}'s: {known}")


@dataclass
class Result:
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
    phases: dict[str, float] = field(default_factory=dict)  # seconds: build, reference, judge, trace, gpu_wait

    @property
    def failed(self) -> bool:
        return self.verdict.startswith("fail:")

    @property
    def not_checked(self) -> bool:
        return self.verdict.startswith("not_checked:")

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
        return line
