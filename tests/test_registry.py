"""Every (check, family) of the registry against its reference, a few seeds each; --iters raises it."""

import pytest
import torch

from kernels import runtime
from stress import checks, runner

PAIRS = [(c.name, f) for c in checks.REGISTRY for f in c.families]


@pytest.mark.stress
@pytest.mark.parametrize("check_name,family", PAIRS, ids=[f"{c}-{f}" for c, f in PAIRS])
def test_family_matches_reference(check_name, family, iters, base_seed, record_property, repro_of):
    check = checks.get(check_name)
    if runtime.DEVICE not in check.devices:
        pytest.skip(f"{check_name} does not run on {runtime.DEVICE}")
    for i in range(max(1, round(iters * check.iteration_share))):
        task = runner.Task(check_name, family, runner.case_seed(base_seed, check_name, family, i))
        result = runner.run_case(task, runtime.DEVICE)
        line = repro_of(result)
        record_property("repro", line)  # in the JUnit XML, to rerun any case from CI's report
        assert result.verdict == "pass", "\n".join([line, *result.details])


def test_every_check_has_families_and_mutants():
    for check in checks.REGISTRY:
        assert check.families, check.name
        assert check.mutants, f"{check.name} has no planted bug: its oracle is unproven"


def test_a_mutant_name_means_one_bug():
    """The kill matrix's path column and `run --mutant` key results by name: two checks may share a
    name only when they plant the same patches (one bug hunted in two places)."""
    patches_by_name = {}
    for check in checks.REGISTRY:
        for mutant in check.mutants:
            seen = patches_by_name.setdefault(mutant.name, mutant.patches)
            assert seen == mutant.patches, f"{mutant.name} names two different bugs ({check.name})"


def _same(a, b) -> bool:
    """Equal all the way down; tensors bitwise (NaN logits equal NaN)."""
    from stress.compare import exact

    if isinstance(a, torch.Tensor):  # the layout too: a strided view must come back with the same strides
        return isinstance(b, torch.Tensor) and a.stride() == b.stride() and exact("", a, b) is None
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_families_are_deterministic():
    """(check, family, seed) fully determines the case, which is what makes repro lines work."""
    for check in checks.REGISTRY:
        for family in check.families:
            a = runner.build_case(check, family, 12345, "cpu")
            b = runner.build_case(check, family, 12345, "cpu")
            assert a.launch == b.launch and a.note == b.note
            for name, value in a.inputs.items():
                assert _same(value, b.inputs[name]), name


def test_layout_families_give_the_kernel_strided_views():
    """A ``layouts`` family that stopped making views would pass silently: most cases must hold one."""
    for check in checks.REGISTRY:
        if "layouts" not in check.families:
            continue
        strided = sum(any(isinstance(v, torch.Tensor) and not v.is_contiguous()
                          for v in runner.build_case(check, "layouts", seed, "cpu").inputs.values())
                      for seed in range(10))
        assert strided >= 7, f"{check.name}: {strided} of 10 layouts cases hold a strided view"
