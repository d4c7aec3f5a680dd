"""Every (check, family) of the registry against its reference, a few seeds each; --iters raises it."""

import pytest
import slow_cases
import torch
from same_values import same

from kernels import runtime
from stress import checks
from stress.core import cases, refusal, workers

PAIRS = [(c.name, f) for c in checks.REGISTRY for f in c.families]
# one engine step case takes 3-28 s on a CPU core (each family one case: iteration_share 0.1)
SLOW = {*slow_cases.every_family_of("engine.step", but={"tight_pools", "refused"}),
        ("rejection.verify", "huge_vocab"), ("rejection.verify", "agreeing_drafter"),
        ("sampling.gumbel", "huge_vocab"), ("sampling.gumbel", "vocab_splits_short_last"),
        ("sampling.gumbel", "vocab_splits_many_rows"), ("kv_cache.write", "tile_limit"),
        ("attention.paged", "many_queries"), ("attention.paged", "big_offsets_caches"),
        ("attention.paged", "head_dim_257"), ("attention.paged", "head_dim_512")}
PARAMS = slow_cases.marked(PAIRS, SLOW)


@pytest.mark.stress
@pytest.mark.parametrize("check_name,family", PARAMS)
def test_family_matches_reference(check_name, family, iters, base_seed, record_property, repro_of):
    check = checks.get(check_name)
    if runtime.DEVICE not in check.devices:
        pytest.skip(f"{check_name} does not run on {runtime.DEVICE}")
    for i in range(max(1, round(iters * check.iteration_share))):
        task = cases.Task(check_name, family, cases.case_seed(base_seed, check_name, family, i))
        result = workers.run_case(task, runtime.DEVICE)
        line = repro_of(result)
        record_property("repro", line)  # in the JUnit XML, to rerun any case from CI's report
        assert result.verdict == "pass", "\n".join([line, *result.details])


def test_every_check_keeps_a_quick_case():
    """``make test-quick`` (``-m "not slow"``) still replays, traces and kills a planted bug of every check that runs
    on the CPU: a quick subset that checks nothing of a check would pass whatever that check's code does."""
    import test_mutants
    import test_trace

    def quick(params, check_name) -> list:
        return [p.values for p in params if p.values[0] == check_name and not slow_cases.is_slow(p)]

    for check in checks.REGISTRY:
        if "cpu" not in check.devices:
            continue
        replayed = [f for _, f in quick(PARAMS, check.name) if not refusal.is_family(check.families[f])]
        assert replayed, f"{check.name}: every family that launches is marked slow"
        if any(c == check.name for c, _ in test_trace.PAIRS):
            assert quick(test_trace.PARAMS, check.name), f"{check.name}: every traced family is marked slow"
        if any("cpu" in m.oracles for m in check.mutants):
            killed = [m for _, m in quick(test_mutants.PARAMS, check.name) if "cpu" in check.mutant(m).oracles]
            assert killed, f"{check.name}: every planted bug checkable on the CPU is marked slow"


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


def test_families_are_deterministic():
    """(check, family, seed) fully determines the case, which is what makes repro lines work."""
    for check in checks.REGISTRY:
        for family in check.families:
            a = cases.build_case(check, family, 12345, "cpu")
            b = cases.build_case(check, family, 12345, "cpu")
            assert a.launch == b.launch and a.note == b.note
            for name, value in a.inputs.items():
                assert same(value, b.inputs[name]), name


def test_layout_families_give_the_kernel_strided_views():
    """A ``layouts`` family that stopped making views would pass silently: most cases must hold one."""
    for check in checks.REGISTRY:
        if "layouts" not in check.families:
            continue
        strided = sum(any(isinstance(v, torch.Tensor) and not v.is_contiguous()
                          for v in cases.build_case(check, "layouts", seed, "cpu").inputs.values())
                      for seed in range(10))
        assert strided >= 7, f"{check.name}: {strided} of 10 layouts cases hold a strided view"


def test_a_skip_names_one_place_and_why_and_decides_the_devices():
    from stress.core.types import SANITIZER, Skip

    for bad in (dict(reason="", device="cpu"), dict(reason="why", device="cpu", tool=SANITIZER),
                dict(reason="why"), dict(reason="why", device="tpu")):
        with pytest.raises(ValueError, match="^skips: "):
            Skip(**bad)
    replay = checks.get("graphs.replay")
    assert replay.devices == ("cuda",) and "GPU" in replay.skipped(device="cpu")
    assert replay.skipped(device="cuda") is None and replay.skipped(tool=SANITIZER)
    assert checks.get("block_table.gather").skipped(device="cpu", tool=SANITIZER) is None
