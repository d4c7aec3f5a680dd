"""Implementations registered against a check: a check's contract judged on code the suite did not write.

``--impl CHECK=module:attribute[@choice,choice]`` names an importable callable (or an ``Implementation``,
which may also declare its contract profile and its hooks) that stands in for the check's production launcher.
The registration travels in the environment (``SPECSAN_IMPL``), so every worker, every compute-sanitizer child
and every rank judges the same implementation, and each result's repro line names it. In each case the
launcher is swapped out under every name the project imported it by (``stress.core.patches.swapped``), so a
check whose kernel is a driver over that launcher (``rejection.distribution`` over ``verify``) judges the
implementation too. The choices of its profile (``Check.choices``) narrow the cases (a case outside one is
``not_checked`` with the choice's reason) or map the expected outputs; its random stream replaces the one the
references draw from.
"""

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from stress.core import patches
from stress.core.types import Case, Check

ENV = "SPECSAN_IMPL"
STREAM_FUNCTIONS = ("randint", "rand", "uniform")  # what a random stream provides: reference.philox's interface


@dataclasses.dataclass(frozen=True)
class Implementation:
    """What an ``--impl`` target may be instead of a bare function.

    ``function`` takes the production launcher's arguments (launch knobs it does not accept are not passed).
    ``profile`` names the check's choices it makes (``python -m stress list --impl`` lists them). ``stream``: a
    module or object with the functions of ``reference/philox.py`` (``randint(seed, offset)``, ``rand(bits,
    offsets)``, ``uniform(bits)``), the random stream it samples with; the references then draw from it, so
    exact sampling stays comparable. ``layout(returned, inputs)``: writes what ``function`` returns into the
    check's outputs where it returns them instead of writing them in place.
    """

    function: Callable
    profile: tuple[str, ...] = ()
    stream: object | None = None
    layout: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Registration:
    """One ``--impl`` value: the check, the target's import path, and choices named on the command line."""

    check: str
    target: str  # module:attribute
    choices: tuple[str, ...] = ()

    def spec(self) -> str:
        return f"{self.check}={self.target}" + (f"@{','.join(self.choices)}" if self.choices else "")

    def load(self) -> Implementation:
        if self.check in _IN_PROCESS and self.target == _target_of(_IN_PROCESS[self.check]):
            return _IN_PROCESS[self.check]
        module_name, _, attribute = self.target.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"--impl: {self.target!r} cannot be imported ({exc}); give module:attribute of a "
                             "function on the Python path") from exc
        found = found if isinstance(found, Implementation) else Implementation(found)
        if not callable(found.function):
            raise ValueError(f"--impl: {self.target} is not callable")
        return dataclasses.replace(found, profile=tuple(dict.fromkeys(found.profile + self.choices)))


def parse(text: str) -> Registration:
    """``CHECK=module:attribute[@choice,...]``, or a ValueError that names --impl and the expected form."""
    check, eq, rest = text.partition("=")
    target, _, choices = rest.partition("@")
    if not eq or not check or ":" not in target or not target.partition(":")[2]:
        raise ValueError(f"--impl: {text!r} is not CHECK=module:function (e.g. "
                         "sampling.gumbel=eager.sampling:gumbel_sample, choices after @)")
    return Registration(check, target, tuple(c for c in choices.split(",") if c))


IN_PROCESS = "<in-process>"  # the target of an implementation registered as an object, in this process only
_IN_PROCESS: dict[str, Implementation] = {}


def registered() -> dict[str, Registration]:
    """The registrations this process judges: the environment's (which its children inherit), and those
    registered as objects in this process (``in_process``)."""
    found = {}
    for text in filter(None, os.environ.get(ENV, "").split(";")):
        reg = parse(text)
        found[reg.check] = reg
    found.update({name: Registration(name, _target_of(implementation)) for name, implementation in _IN_PROCESS.items()})
    return found


def _target_of(implementation: Implementation) -> str:
    """The import path a repro line can name for an in-process implementation, else ``IN_PROCESS``."""
    function = implementation.function
    module, name = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if module and name and "<" not in name and getattr(sys.modules.get(module), name, None) is function:
        return f"{module}:{name}"
    return IN_PROCESS


@contextmanager
def in_process(check: str, implementation: Implementation | Callable) -> Iterator[None]:
    """``implementation`` judged for ``check`` in this process for the duration (no import path needed; worker
    processes do not see it)."""
    found = implementation if isinstance(implementation, Implementation) else Implementation(implementation)
    _IN_PROCESS[check] = found
    try:
        yield
    finally:
        del _IN_PROCESS[check]
        for registration in [r for r in _LOADED if r.check == check]:
            del _LOADED[registration]


def register(registrations: list[Registration]) -> None:
    """Judge ``registrations`` in this process and every process it starts (workers, sanitizer children)."""
    if registrations:
        os.environ[ENV] = ";".join(r.spec() for r in registrations)
    else:
        os.environ.pop(ENV, None)


def launcher_of(check: Check) -> Callable | None:
    """The production launcher an implementation registered against ``check`` replaces, or None."""
    if check.launcher is not None:
        return check.launcher
    module = getattr(check.kernel, "__module__", "") or ""
    return check.kernel if module.split(".")[0] == "kernels" else None


def why_not_registrable(check: Check) -> str | None:
    """Why no implementation can stand in for ``check``'s kernel, or None: its kernel is no production launcher
    but a driver of the suite's (host logic run step by step, CUDA-graph capture, trials over a launcher)."""
    if launcher_of(check) is not None:
        return None
    module = getattr(check.kernel, "__module__", "") or ""
    return (f"its kernel is a driver ({module}.{getattr(check.kernel, '__qualname__', check.kernel)}), not a "
            "launcher: register the launchers it drives against their own checks, and it judges them too")


def launcher_check(check: Check, registry) -> Check:
    """``check``, once it is known an implementation can be registered against it (a ValueError says why not)."""
    if (why := why_not_registrable(check)) is not None:
        registrable = ", ".join(c.name for c in registry if why_not_registrable(c) is None)
        raise ValueError(f"--impl: {check.name}: {why} (registrable: {registrable})")
    return check


def validated(registration: Registration, check: Check) -> Implementation:
    """The loaded implementation, its profile checked against the check's choices."""
    implementation = registration.load()
    unknown = [c for c in implementation.profile if c not in check.choices]
    if unknown:
        raise ValueError(f"--impl: {check.name} has no choice {', '.join(map(repr, unknown))}; its choices: "
                         f"{', '.join(check.choices) or 'none'} (python -m stress list --impl)")
    if implementation.stream is not None:
        missing = [f for f in STREAM_FUNCTIONS if not callable(getattr(implementation.stream, f, None))]
        if missing:
            raise ValueError(f"--impl: the stream of {registration.target} lacks {', '.join(missing)}; a stream "
                             "provides reference/philox.py's randint, rand and uniform")
    return implementation


def _adapter(implementation: Implementation, launcher: Callable) -> Callable:
    """The implementation called as the launcher is: without launch knobs it does not take, its returned values
    placed by its ``layout``. A local function, so the oracle's lookup of the current module attribute (which
    finds an applied mutant) leaves it alone."""
    function = implementation.function
    params = inspect.signature(function).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())

    def implementation_of_launcher(*args, **kwargs):
        taken = kwargs if takes_all else {k: v for k, v in kwargs.items() if k in params}
        returned = function(*args, **taken)
        if implementation.layout is not None:
            implementation.layout(returned, kwargs)
            return None
        return returned

    implementation_of_launcher.__doc__ = f"{getattr(function, '__qualname__', function)} standing in for " \
                                         f"{launcher.__module__}.{launcher.__qualname__}"
    implementation_of_launcher.takes = None if takes_all else frozenset(params)  # read by stress.core.refusal
    return implementation_of_launcher


@contextmanager
def _stream(stream) -> Iterator[None]:
    """The references draw their random numbers from ``stream`` for the duration: each reference module's
    ``philox`` is the stream (reference/philox.py itself is left as it is, so a stream may build on it)."""
    philox = importlib.import_module("reference.philox")
    holders = [module for name, module in list(sys.modules.items())
               if name.startswith("reference.") and getattr(module, "philox", None) is philox]
    try:
        for module in holders:
            module.philox = stream
        yield
    finally:
        for module in holders:
            module.philox = philox


def of_check(check: Check) -> tuple[Registration, Implementation] | None:
    """The registration judged for ``check``, and its implementation, or None."""
    registration = registered().get(check.name)
    return (registration, _load(registration, check)) if registration else None


def judged_by(check: Check, by_name: dict[str, Check]) -> list[tuple[Registration, Implementation]]:
    """What ``check``'s cases judge: its own registration, or those of the checks its driver calls
    (``Check.judges``), which its records and repro lines then name."""
    own = of_check(check)
    return [own] if own else [found for name in check.judges if (found := of_check(by_name[name]))]


def specs(found: list[tuple[Registration, Implementation]]) -> str | None:
    """The ``--impl`` values of ``found`` as a repro line gives them (None: the suite's own launchers)."""
    return " --impl ".join(registration.spec() for registration, _ in found) or None


_LOADED: dict[Registration, Implementation] = {}


def _load(registration: Registration, check: Check) -> Implementation:
    if registration not in _LOADED:
        _LOADED[registration] = validated(registration, check)
    return _LOADED[registration]


@contextmanager
def installed(checks: dict[str, Check]) -> Iterator[None]:
    """Every registered implementation swapped in for its check's launcher, under every name it was imported by."""
    with ExitStack() as stack:
        for name, registration in registered().items():
            check = checks[name]
            implementation = _load(registration, check)
            launcher = launcher_of(check)
            stack.enter_context(patches.swapped(launcher, _adapter(implementation, launcher)))
        yield


@contextmanager
def reference_stream(check: Check) -> Iterator[None]:
    """The check's references draw from its registered implementation's stream, if it declares one."""
    found = of_check(check)
    if found is None or found[1].stream is None:
        yield
        return
    with _stream(found[1].stream):
        yield


def outside_profile(check: Check, case: Case, found: list[tuple[Registration, Implementation]]) -> str | None:
    """Why ``case`` lies outside the profiles of the implementations judged for ``check`` (``found``), or None.
    A choice of another check (one a driver calls) that ``check`` does not define leaves every case out: no
    case of this check is judged under a choice it cannot apply."""
    for registration, implementation in found:
        for name in implementation.profile:
            choice = check.choices.get(name)
            if choice is None:
                return (f"outside the implementation's profile: it declares {name}, a choice of "
                        f"{registration.check} that {check.name} does not define, so its cases cannot be judged "
                        "under it")
            if choice.outside is not None and (why := choice.outside(case)):
                return f"outside the implementation's profile ({name}: {choice.doc}): {why}"
    return None


def expected_under_profile(check: Check, case: Case, expected: dict) -> dict:
    """The reference's outputs as the judged implementation's profile defines them."""
    found = of_check(check)
    for name in found[1].profile if found else ():
        choice = check.choices[name]
        if choice.expect is not None:
            expected = choice.expect(case, expected)
    return expected


def written_in_triton(implementation: Implementation) -> bool:
    """Whether the implementation's module uses Triton (its kernels then run under the CPU interpreter)."""
    module = sys.modules.get(getattr(implementation.function, "__module__", "") or "")
    return module is not None and any(getattr(v, "__name__", "") == "triton" for v in vars(module).values())


def replaces(mutant, checks) -> str | None:
    """Why a planted bug cannot be hunted while an implementation stands in for the code it patches, or None: it
    patches the module of a launcher that a registration replaces (its kernels are then never run)."""
    replaced = {launcher_of(c).__module__: c.name for c in checks if c.name in registered()}
    hit = {patch.target.split(":")[0] for patch in mutant.patches} & set(replaced)
    if not hit:
        return None
    module = sorted(hit)[0]
    return (f"it patches {module}, whose launcher the implementation registered against {replaced[module]} "
            "replaces: the planted bug is the suite's own kernel's, not the implementation's")
