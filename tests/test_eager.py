"""The eager implementations (eager/) judged as any implementation of a kernel check is: registered against the
checks whose launchers they stand in for (``stress.core.impl``, as ``--impl`` registers them, here in process),
then judged by ``stress.core.workers.run_case`` through the check's own families and oracles; a check whose
kernel is a driver over several launchers judges the registered ones it calls. Every family must pass; every
planted violation (tests/eager_violations.py) must be failed on the families that reach it."""

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable
from contextlib import ExitStack

import eager_violations
import pytest
import torch
import triton

import eager
from eager import philox as eager_philox
from reference import philox
from stress import checks
from stress.core import cases, impl, oracle, workers
from stress.core.types import Result

# Kernel checks whose production function is no Triton launcher: host code in plain tensor ops already, so it
# is its own eager implementation and eager/ holds no twin.
NO_TWIN = {"block_table.unaligned_prefix": "has_unaligned_cached_prefix is host tensor code, not a Triton launcher"}
# eager/ modules that twin no kernels/ module: what the twins share
SHARED = {"philox": "Philox on the logits' device, drawn by the eager samplers as tl.randint draws it in theirs"}


def eager_twins() -> dict[Callable, Callable]:
    """Production launcher -> its eager twin: each public function of ``eager.<module>`` whose name is a plain
    function (not a Triton kernel) of ``kernels.<module>``."""
    twins = {}
    for info in pkgutil.iter_modules(eager.__path__):
        if info.name in SHARED:
            continue
        module = importlib.import_module(f"eager.{info.name}")
        production = importlib.import_module(f"kernels.{info.name}")
        for name, fn in vars(module).items():
            launcher = getattr(production, name, None)
            if (not name.startswith("_") and inspect.isfunction(fn) and fn.__module__ == module.__name__
                    and inspect.isfunction(launcher)):
                twins[launcher] = fn
    return twins


def driver_launchers(check, launchers) -> list[Callable]:
    """The production launchers a driver kernel (one outside ``kernels``) calls through its module's globals."""
    if check.kernel.__module__.split(".")[0] == "kernels":
        return []
    module = sys.modules[check.kernel.__module__]
    return [value for value in vars(module).values() if inspect.isfunction(value) and value in launchers]


def judged_checks(twins: dict[Callable, Callable]) -> list[str]:
    """The checks an implementation set reaches: its launcher has a twin, or it is a driver that calls launchers
    with twins (on the CPU: GPU-only checks cannot be judged here)."""
    return [c.name for c in checks.REGISTRY if "cpu" in c.devices
            and (impl.launcher_of(c) in twins or driver_launchers(c, twins))]


def registered_against(launcher: Callable) -> str | None:
    """The check whose production launcher ``launcher`` is (the check an implementation of it registers against)."""
    return next((c.name for c in checks.REGISTRY if impl.launcher_of(c) is launcher), None)


def judge(check_name: str, family: str, seed: int, implementations: dict[Callable, Callable]) -> Result:
    """One case of ``check_name`` with ``implementations`` (production launcher -> replacement) registered against
    their checks, as ``--impl`` registers them (in this process), judged on the CPU (no tracer: there is no
    Triton kernel to trace). A driver check judges the registered launchers it calls."""
    with ExitStack() as stack:
        for launcher, replacement in implementations.items():
            if (against := registered_against(launcher)) is not None:
                stack.enter_context(impl.in_process(against, replacement))
        return workers.run_case(cases.Task(check_name, family, seed), "cpu", trace=False)


TWINS = eager_twins()
JUDGED = judged_checks(TWINS)
SEEDS = 3  # cases per family (every family's three take under 3 s on one CPU core); the runner's own seeds
PAIRS = [(name, family) for name in JUDGED for family in checks.get(name).families]


def seeds(check_name: str, family: str) -> list[int]:
    return [cases.case_seed(0, check_name, family, i) for i in range(SEEDS)]


def seeds_reaching(violation, family: str, tries: int = 64) -> list[int]:
    """The first SEEDS of the runner's seeds whose case reaches the violation's broken clause."""
    check = checks.get(violation.check)
    found = [seed for seed in (cases.case_seed(0, check.name, family, i) for i in range(tries))
             if violation.reaches is None or violation.reaches(cases.build_case(check, family, seed, "cpu"))]
    assert len(found) >= SEEDS, f"{violation.name}: {family} reaches it in {len(found)} of {tries} cases"
    return found[:SEEDS]


@pytest.mark.parametrize("check_name,family", PAIRS, ids=[f"{c}-{f}" for c, f in PAIRS])
def test_the_eager_implementation_keeps_the_contract(check_name, family):
    """Every case passes: a not_checked (near ties) fails here too."""
    for seed in seeds(check_name, family):
        result = judge(check_name, family, seed, TWINS)
        assert result.verdict == "pass", "\n".join([f"{check_name} {family} {seed}: {result.verdict}",
                                                    *result.details])


@pytest.mark.parametrize("violation", eager_violations.VIOLATIONS, ids=lambda v: f"{v.check}-{v.name}")
def test_a_planted_contract_violation_is_failed(violation):
    """Every case of its families that reaches the broken clause fails, by an oracle's verdict: not a crash, not
    the suite's own error."""
    production = next(launcher for launcher, twin in TWINS.items() if twin is violation.launcher)
    implementations = {**TWINS, production: violation.call}
    for family in violation.families:
        for seed in seeds_reaching(violation, family):
            result = judge(violation.check, family, seed, implementations)
            assert result.failed and result.verdict not in ("fail:crash", oracle.SUITE_ERROR), (
                f"{violation.name} on {violation.check} {family} {seed}: {result.verdict}")


def test_every_kernel_check_is_judged_with_a_twin_and_a_planted_violation():
    """A kernel check of a mirrored module (or a driver over their launchers) without an eager twin, or a twin
    without a positive control, would be an implementation the suite never judges, or judges unproven."""
    mirrored = {f"kernels.{info.name}" for info in pkgutil.iter_modules(eager.__path__)}
    for check in checks.REGISTRY:
        if check.kernel.__module__ in mirrored:
            assert check.name in JUDGED or check.name in NO_TWIN, f"{check.name}: no eager twin"
    assert set(NO_TWIN) <= set(checks.BY_NAME) and not set(NO_TWIN) & set(JUDGED)
    assert sorted(v.check for v in eager_violations.VIOLATIONS) == sorted(JUDGED)
    for violation in eager_violations.VIOLATIONS:
        assert violation.launcher in TWINS.values(), violation.name
        assert set(violation.families) <= set(checks.get(violation.check).families), violation.name


@pytest.mark.parametrize("seed", [0, 1, -1, 2**32 - 1, 2**63 - 1, -2**63, 0x5EED0000DEAD])
def test_the_eager_philox_draws_the_references_numbers(seed, device):
    """eager.philox on the test's device, bit for bit against reference.philox on the host: offsets of every sign
    and both 32-bit words, broadcast against a column of keys."""
    offsets = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, -1, -2**63, 2**63 - 1, 128255, 1 << 30])
    keys = torch.tensor([[seed], [seed ^ 1], [~seed]])
    bits = eager_philox.randint(keys.to(device), offsets.to(device))
    assert bits.device.type == torch.device(device).type
    assert torch.equal(bits.cpu(), philox.randint(keys, offsets))
    assert torch.equal(eager_philox.rand(keys.to(device), offsets.to(device)).cpu(), philox.rand(keys, offsets))


def test_eager_mirrors_modules_that_hold_a_triton_kernel():
    """Each eager module twins a kernels/ module of Triton kernels (a new kernel module may come without one:
    its checks are then judged on the production launcher only, docs/adding-a-kernel.md)."""
    import kernels

    triton_modules = {info.name for info in pkgutil.iter_modules(kernels.__path__)
                      if any(isinstance(v, triton.runtime.KernelInterface)
                             for v in vars(importlib.import_module(f"kernels.{info.name}")).values())}
    mirrored = {info.name for info in pkgutil.iter_modules(eager.__path__)} - set(SHARED)
    assert mirrored <= triton_modules
    assert {"block_table", "draft_inputs", "kv_cache", "sampling", "rejection", "attention"} <= mirrored


def test_a_twin_takes_its_launchers_arguments_less_the_launch_knobs():
    """Same names, order, kinds and defaults; what it leaves out are keyword-only knobs with defaults."""
    for launcher, twin in TWINS.items():
        ours = inspect.signature(twin).parameters
        theirs = inspect.signature(launcher).parameters
        assert [p for p in theirs.values() if p.name in ours] == list(ours.values()), twin.__qualname__
        knobs = [p for p in theirs.values() if p.name not in ours]
        assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in knobs), twin.__qualname__
