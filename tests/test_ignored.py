"""The ignored-region declarations (stress.families.ignored): poisoning what a contract ignores must not change
the reference's outputs, and each declaration must find something to poison."""

import numpy as np
import pytest
import torch

from stress.checks import REGISTRY
from stress.core.guards import fresh_inputs
from stress.core.types import Case
from stress.families.ignored import Region, poison

SEEDS = range(6)
POISONED = [(check, name, family) for check in REGISTRY for name, family in check.families.items() if family.ignored]


def _outputs(check, inputs: dict) -> dict:
    result = check.reference(**fresh_inputs(Case(inputs)))
    values = (result,) if len(check.outputs) == 1 else tuple(result)
    return {name: getattr(value, "value", value) for name, value in zip(check.outputs, values, strict=True)}


def _bits(value) -> torch.Tensor:
    """A value compared bit for bit (NaN payloads and -0.0 included)."""
    t = torch.as_tensor(value).contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4 else torch.int64) \
        if t.dtype.is_floating_point else t


def _expected_after_poison(valid_inputs: dict, poisoned_inputs: dict, name: str, valid_output):
    """An in-place output keeps what its poisoned regions hold (they are neither read nor written)."""
    if name not in poisoned_inputs or not isinstance(valid_output, torch.Tensor):
        return valid_output
    changed = _bits(poisoned_inputs[name]) != _bits(valid_inputs[name])
    expected = valid_output.clone()
    expected[changed] = poisoned_inputs[name][changed].to(expected.dtype)
    return expected


def test_every_kernel_check_with_a_poisoned_family_is_listed():
    assert {check.name for check, _, _ in POISONED} >= {
        "block_table.gather", "block_table.slot_mapping", "block_table.shift", "block_table.unaligned_prefix",
        "draft_inputs.prepare", "sampling.gumbel", "rejection.verify", "kv_cache.write", "attention.paged"}


@pytest.mark.parametrize("check,name,family", POISONED, ids=[f"{c.name}-{n}" for c, n, _ in POISONED])
def test_poisoning_ignored_regions_leaves_the_reference_outputs_unchanged(check, name, family):
    poisoned_somewhere = False
    for seed in SEEDS:
        valid = family.valid(np.random.default_rng(seed), "cpu", {})
        case = family(np.random.default_rng(seed), "cpu", {})
        poisoned_somewhere |= any(not torch.equal(_bits(case.inputs[k]), _bits(v))
                                  for k, v in valid.inputs.items() if isinstance(v, torch.Tensor))
        want, got = _outputs(check, valid.inputs), _outputs(check, case.inputs)
        for output, value in want.items():
            expected = _expected_after_poison(valid.inputs, case.inputs, output, value)
            assert torch.equal(_bits(got[output]), _bits(expected)), f"seed {seed}: {output} changed ({case.note})"
    assert poisoned_somewhere, f"{check.name}: no seed of {name} poisoned anything"


def test_poison_uses_every_hostile_value_and_touches_nothing_else():
    t = torch.arange(20, dtype=torch.int32)
    where = torch.arange(20) >= 10
    inputs = {"t": t}
    assert poison(np.random.default_rng(0), inputs, Region("t", where, (-5, 7)))
    assert torch.equal(inputs["t"][:10], t[:10]) and set(inputs["t"][10:].tolist()) == {-5, 7}
    assert torch.equal(t, torch.arange(20, dtype=torch.int32))  # the valid tensor itself is left alone
