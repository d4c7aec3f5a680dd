"""The ``slow`` marker on parametrized registry cases. ``make test-quick`` (``pytest -m "not slow"``) leaves out
what took 3 s or more in a 2-worker run on a 2-core CPU machine (Triton interpreter); ``make test`` runs it all.
The cheapest case of a check stays quick even when it is slower than that, so that the quick subset still checks
every check (``test_registry.test_every_check_keeps_a_quick_case``)."""

import pytest

from stress import checks


def every_family_of(check_name: str, but: set[str]) -> set[tuple[str, str]]:
    """Every (check, family) pair of the check except ``but``: a family added later starts out slow."""
    families = checks.get(check_name).families
    if but - set(families):
        raise ValueError(f"{check_name} has no family {sorted(but - set(families))}")
    return {(check_name, f) for f in families if f not in but}


def marked(pairs: list[tuple[str, str]], slow: set[tuple[str, str]]) -> list:
    """``pairs`` as parameters with the ids ``check-name``, the ones in ``slow`` marked slow; a slow entry that
    names no pair is an error at collection, so the list cannot rot."""
    if slow - set(pairs):
        raise ValueError(f"slow names no parametrized case: {sorted(slow - set(pairs))}")
    return [pytest.param(a, b, id=f"{a}-{b}", marks=[pytest.mark.slow] if (a, b) in slow else [])
            for a, b in pairs]


def is_slow(param) -> bool:
    return any(mark.name == "slow" for mark in param.marks)
