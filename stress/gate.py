"""Gate your own kernels from your own tests: a check's families and oracles judged on an implementation, in this
process (docs/impl.md). For a whole run in worker processes, ``python -m stress run --impl`` does the same."""

from collections.abc import Callable

from stress import checks
from stress.core import cases, impl, workers
from stress.core.types import Result


def judge(check: str, implementation: impl.Implementation | Callable, *, iters: int = 3, seed: int = 0,
          device: str = "cpu", families: list[str] | None = None, against: str | None = None) -> list[Result]:
    """One Result per case: ``iters`` cases of every family of ``check`` (or of ``families``), each judged as the
    production launcher's are, with ``implementation`` standing in for it. ``against``: the check whose launcher
    it replaces, where ``check`` judges that launcher through a driver of its own (``rejection.distribution``
    over ``rejection.verify``'s). A result that is ``not_checked`` says why (outside the implementation's
    declared profile, a device it cannot run on); none is a pass."""
    target, registered_check = checks.get(check), checks.get(against or check)
    impl.launcher_check(registered_check, checks.REGISTRY)
    if families is not None and (unknown := [f for f in families if f not in target.families]):
        raise ValueError(f"families: {', '.join(unknown)} not of {check}; its families: {', '.join(target.families)}")
    with impl.in_process(registered_check.name, implementation):
        impl.validated(impl.registered()[registered_check.name], registered_check)
        return [workers.run_case(task, device, trace=device == "cpu")
                for task in cases.plan([target], families, iters, seed)]
