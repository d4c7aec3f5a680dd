"""Every planted bug is killed, on this device, by the oracle that claims it; none has gone stale."""

import pytest
import slow_cases

from stress import checks
from stress.core import patches as mutants
from stress.mutate import kill_matrix as matrix

MUTANTS = [(c.name, m.name) for c in checks.REGISTRY for m in c.mutants]
# hunted through engine steps or a sampled distribution: 5-8 s each on a CPU core; the cheapest of each check
# (engine.step's one-request-drafts-nothing, rejection.distribution's accept-ignores-u) stays quick
SLOW = {("engine.step", "free-count-per-hit-twice"), ("engine.step", "prefix-blocks-visible"),
        ("engine.step", "refused-batch-skips-context-kv"), ("rejection.distribution", "resample-from-target"),
        *(("engine.step", name) for name in ("scale-from-hidden", "depth-by-running-count", "drafts-past-the-limit",
                                             "evicted-block-still-cached", "partial-block-under-stale-key"))}
PARAMS = slow_cases.marked(MUTANTS, SLOW)


@pytest.mark.parametrize("check_name,mutant_name", PARAMS)
def test_mutant_is_killed(check_name, mutant_name, device):
    check = checks.get(check_name)
    mutant = check.mutant(mutant_name)
    mutants.validate(mutant)  # the patched text still occurs exactly once
    oracle = mutant.oracles.get(device.type)
    if oracle is None:
        pytest.skip(f"not_checked on {device.type}: {mutant.why_not}")
    # ignored_poisoned fills what a kernel must not read with wild values: a slip that reads them stores wildly,
    # which under the interpreter can take this process down, so those hunts run in a worker
    jobs = 1 if "ignored_poisoned" in mutant.families else 0
    kill = matrix.hunt_mutant(check_name, mutant_name, device.type, oracle, max_iters=60, seed=0, launch=None,
                              jobs=jobs)
    if kill.status == "not_checked":  # a sanitizer oracle where no compute-sanitizer can run
        pytest.skip(f"not_checked on {device.type}: {kill.reason}")
    assert kill.status == "killed", f"{mutant_name} survived {kill.iterations} cases (other verdicts: " \
                                    f"{kill.other_failures})"


def test_mutant_patches_restore_the_production_code():
    import kernels.block_table as kbt

    shift = checks.get("block_table.shift")
    original = kbt._shift_rows_kernel
    with mutants.applied(shift.mutants[0]):
        assert kbt._shift_rows_kernel is not original
    assert kbt._shift_rows_kernel is original


def test_a_module_first_imported_under_a_mutant_gets_the_production_object_back(monkeypatch):
    """A check imports its production module lazily (the engine's), so its first import may happen while
    another module's mutant is applied, copying the mutant with ``from ... import``: unless restored, every
    later case in that process would run the mutant (a models mutant's crash would then kill engine mutants)."""
    import sys
    import types

    from kernels.spec import scheduler

    original = scheduler.PrefixCachingPool
    late = types.ModuleType("stress._imported_under_a_mutant")
    with mutants.applied(checks.get("engine.step").mutant("free-count-per-hit-twice")):
        monkeypatch.setitem(sys.modules, late.__name__, late)
        late.PrefixCachingPool = scheduler.PrefixCachingPool  # what its `from ... import` binds now
        assert late.PrefixCachingPool is not original
    assert late.PrefixCachingPool is original and scheduler.PrefixCachingPool is original


def test_a_class_held_by_a_module_level_registry_is_swapped_there_too():
    """``attention_backends.make`` finds a backend class by name in a module-level dict: a mutant of the class
    that only replaced module attributes never ran (a slip in the host-planned backend survived every check)."""
    from kernels.spec import attention_backends
    from stress.mutate import operators as mutate_ops

    original = attention_backends.HostPlannedBackend
    mutant = mutate_ops.resolve("gen:kernels.spec.attention_backends:HostPlannedBackend:const:b5c65493")
    with mutants.applied(mutant):
        made = attention_backends.make("host_planned", causal=False)
        assert type(made) is not original and type(made).__name__ == original.__name__
    assert attention_backends.BACKENDS["host_planned"] is original
    assert type(attention_backends.make("host_planned", causal=False)) is original


def test_a_mutated_class_reads_the_live_module_as_the_original_does(monkeypatch):
    """A unit test that monkeypatches a module global (``draft_graphs.capturing``) must reach a mutant of a class
    of that module too: its methods read the live module, not the copy its source was rebuilt in. Otherwise the
    test fails under every mutant of the class, a kill that says nothing about the slip."""
    from kernels.spec import draft_graphs
    from stress.mutate import operators as mutate_ops

    original = draft_graphs.DraftGraphs
    mutant = mutate_ops.resolve("gen:kernels.spec.draft_graphs:DraftGraphs:same-name:26685ca5")  # in capture only
    with mutants.applied(mutant):
        mutated = draft_graphs.DraftGraphs
        assert mutated is not original
        for name in ("forward", "run", "capture", "clear"):
            assert vars(mutated)[name].__globals__ is vars(draft_graphs), name
        assert vars(mutated)["descriptors"].fget.__globals__ is vars(draft_graphs)
        monkeypatch.setattr(draft_graphs, "capturing", lambda: True)  # as the retention test does
        assert vars(mutated)["forward"].__globals__["capturing"]() is True
