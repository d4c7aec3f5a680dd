"""Every (check, family) of the registry against its reference, a few seeds each; --iters raises it."""

import pytest

from kernels import runtime
from stress import checks, runner

PAIRS = [(c.name, f) for c in checks.REGISTRY for f in c.families]


@pytest.mark.stress
@pytest.mark.parametrize("check_name,family", PAIRS, ids=[f"{c}-{f}" for c, f in PAIRS])
def test_family_matches_reference(check_name, family, iters, base_seed, record_property):
    check = checks.get(check_name)
    if runtime.DEVICE not in check.devices:
        pytest.skip(f"{check_name} does not run on {runtime.DEVICE}")
    for i in range(iters):
        task = runner.Task(check_name, family, runner.case_seed(base_seed, check_name, family, i))
        result = runner.run_case(task, runtime.DEVICE)
        record_property("repro", result.repro())  # in the JUnit XML, to rerun any case from CI's report
        assert result.verdict == "pass", "\n".join([result.repro(), *result.details])


def test_every_check_has_families_and_mutants():
    for check in checks.REGISTRY:
        assert check.families, check.name
        assert check.mutants, f"{check.name} has no planted bug: its oracle is unproven"


def test_families_are_deterministic():
    """(check, family, seed) fully determines the case, which is what makes repro lines work."""
    import torch

    from stress.compare import exact

    for check in checks.REGISTRY:
        for family in check.families:
            a = runner.build_case(check, family, 12345, "cpu")
            b = runner.build_case(check, family, 12345, "cpu")
            assert a.launch == b.launch and a.note == b.note
            for name, value in a.inputs.items():
                other = b.inputs[name]
                same = exact(name, value, other) is None if isinstance(value, torch.Tensor) else value == other
                assert same, name  # bitwise: NaN logits equal NaN
