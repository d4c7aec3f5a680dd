"""The registry: one Check per kernel, each entry in the module of its kernel (stress/checks/<module>.py).

Runner, tests, tracer and the kill matrix iterate ``REGISTRY``; none has a branch for a particular check. Every
module of this package with a ``CHECKS`` tuple is an entry module: a new kernel's entry is found by being here.
"""

import importlib
import pkgutil

from stress.core.types import Check, Mutant

# Registry order (reports, the kill matrix, a run's case order): the kernels first, the whole step last; a module
# not named here follows them in name order.
ORDER = ("block_table", "draft_inputs", "slots", "sampling", "rejection", "spec", "kv_cache", "attention", "graphs",
         "engine")


def _entry_modules() -> list:
    found = {m.name for m in pkgutil.iter_modules(__path__)}
    modules = [importlib.import_module(f"{__name__}.{name}")
               for name in [n for n in ORDER if n in found] + sorted(found - set(ORDER))]
    return [module for module in modules if hasattr(module, "CHECKS")]


REGISTRY: tuple[Check, ...] = tuple(check for module in _entry_modules() for check in module.CHECKS)
BY_NAME = {check.name: check for check in REGISTRY}
if len(BY_NAME) != len(REGISTRY):
    raise ValueError(f"checks: two entries share a name: {sorted(c.name for c in REGISTRY)}")


def find_mutant(name: str, check: Check) -> Mutant:
    """``check``'s planted bug ``name``; a whole-path check also takes any other's.
    Generated mutants are the mutation driver's (``stress.mutate.operators.find``)."""
    if not check.whole_path or any(m.name == name for m in check.mutants):
        return check.mutant(name)
    for other in REGISTRY:
        if any(m.name == name for m in other.mutants):
            return other.mutant(name)
    raise ValueError(f"mutant {name!r} is not planted in any check; `python -m stress list` shows them")


def get(name: str) -> Check:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"check {name!r} is not registered; `python -m stress list` shows the checks") from None
