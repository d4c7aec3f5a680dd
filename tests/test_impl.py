"""Judging an implementation the suite did not write (``--impl``, ``stress.gate``): it reaches every worker and
every repro line, a planted contract violation is failed, and one that differs only by a declared choice or by
its declared random stream passes."""

import json

import eager_violations
import impl_variants
import pytest
import torch

from eager import block_table
from stress import checks, gate
from stress.__main__ import main
from stress.core import impl, pool, workers
from stress.core.cases import Task, build_case
from stress.core.types import Case

VIOLATIONS = {v.check: v for v in eager_violations.VIOLATIONS}


def _verdicts(results) -> set[str]:
    return {str(r.verdict).split(":")[0] for r in results}


@pytest.mark.parametrize("bad, says", [
    ("sampling.gumbel", "is not CHECK=module:function"),
    ("sampling.gumbel=eager.sampling", "is not CHECK=module:function"),
    ("nosuch.check=eager.sampling:gumbel_sample", "check 'nosuch.check' is not registered"),
    ("sampling.gumbel=eager.nosuch:gumbel_sample", "cannot be imported"),
    ("sampling.gumbel=eager.sampling:gumbel_sample@no-such-choice", "has no choice 'no-such-choice'"),
    ("rejection.distribution=eager.rejection:verify", "is a driver"),
])
def test_a_bad_registration_is_a_usage_error_naming_impl(bad, says, capsys):
    assert main(["run", "--check", "block_table.gather", "--iters", "1", "--jobs", "0", "--impl", bad]) == 2
    err = capsys.readouterr().err
    assert says in err and ("--impl" in err or "check" in err), err


def test_run_judges_the_implementation_in_every_worker_and_its_repro_line_reruns_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(impl.ENV, "")  # undone after the test: main() registers the implementation in os.environ
    violation = VIOLATIONS["block_table.gather"]
    spec = f"block_table.gather=eager_violations:{violation.call.__name__}"
    code = main(["run", "--check", "block_table.gather", "--family", "padded", "--family", "basic", "--iters", "3",
                 "--jobs", "2", "--impl", spec, "--report", str(tmp_path)])
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    cases = [line for line in lines if "check" in line]
    assert code == 1 and lines[0]["run"]["impl"] == [spec]
    assert {c["impl"] for c in cases} == {spec}
    failed = [c for c in cases if c["verdict"].startswith("fail:")]
    assert failed and {c["family"] for c in failed} == {"padded"}  # the broken clause: rows past the batch
    assert all(c["verdict"] == "pass" for c in cases if c["family"] == "basic")
    repro = next(line for line in (tmp_path / "summary.md").read_text().splitlines() if "--impl" in line)
    args = repro[repro.index("./specsan repro ") + len("./specsan "):].strip("` ").split()
    rerun = next(c for c in failed if str(c["seed"]) == args[3])
    monkeypatch.setenv(impl.ENV, "")
    capsys.readouterr()
    assert main(args) == 1
    assert f"verdict: {rerun['verdict']}" in capsys.readouterr().out
    assert impl.registered()["block_table.gather"].spec() == spec  # the repro line registered it again


def _registered_against(violation) -> str:
    """The check whose production launcher the violation's eager function is the twin of."""
    module = violation.launcher.__module__.split(".")[-1]
    return next(c.name for c in checks.REGISTRY if (launcher := impl.launcher_of(c)) is not None
                and launcher.__name__ == violation.launcher.__name__ and launcher.__module__ == f"kernels.{module}")


@pytest.mark.parametrize("check", sorted(VIOLATIONS))
def test_a_planted_contract_violation_is_failed_through_the_gate(check):
    violation = VIOLATIONS[check]
    iters = 3 if violation.reaches is None else 12  # few cases of some families reach the clause (sampled rows)
    results = gate.judge(check, violation.call, iters=iters, families=list(violation.families),
                         against=_registered_against(violation))
    assert any(r.failed for r in results), [r.verdict for r in results]


def test_a_choice_declared_narrows_the_cases_and_the_rest_pass():
    undeclared = gate.judge("attention.paged", impl_variants.always_causal, iters=8, families=["multi_query"])
    assert any(r.failed for r in undeclared)
    declared = gate.judge("attention.paged", impl.Implementation(impl_variants.always_causal, profile=("causal-only",)),
                          iters=8, families=["multi_query"])
    assert _verdicts(declared) == {"pass", "not_checked"}
    assert all("outside the implementation's profile (causal-only" in r.verdict for r in declared if r.not_checked)


def test_a_choice_declared_maps_the_expected_outputs():
    cached = ["mixed", "padded"]
    assert any(r.failed for r in gate.judge("sampling.gumbel", impl_variants.gumbel_caching_after_temperature,
                                            iters=2, families=cached))
    declared = impl.Implementation(impl_variants.gumbel_caching_after_temperature,
                                   profile=("cache-after-temperature",))
    assert _verdicts(gate.judge("sampling.gumbel", declared, iters=2, families=cached)) == {"pass"}


def test_a_declared_random_stream_is_the_one_the_reference_draws_from():
    sampled = ["mixed"]
    bare = impl.Implementation(impl_variants.gumbel_with_salted_stream)
    assert any(r.failed for r in gate.judge("sampling.gumbel", bare, iters=3, families=sampled))
    assert _verdicts(gate.judge("sampling.gumbel", impl_variants.SALTED_GUMBEL, iters=3, families=sampled)) == {"pass"}


def test_the_production_launcher_is_back_after_a_judged_implementation():
    gate.judge("block_table.gather", block_table.gather_block_tables, iters=1, families=["basic"])
    assert impl.registered() == {} and checks.get("sampling.gumbel").kernel.__module__ == "kernels.sampling"
    import kernels.block_table
    assert kernels.block_table.gather_block_tables.__module__ == "kernels.block_table"


def test_list_impl_says_what_an_implementation_must_accept(capsys):
    assert main(["list", "--impl"]) == 0
    out = capsys.readouterr().out
    assert "--impl sampling.gumbel=module:function  where function(logits" in out
    assert "@temperature-floor:" in out and "not registrable" in out


def test_a_case_that_killed_its_worker_keeps_the_implementation_in_its_repro_line(monkeypatch):
    monkeypatch.setenv(impl.ENV, "block_table.gather=eager.block_table:gather_block_tables@no-padded-rows")
    task = Task("block_table.gather", "basic", 5)
    for failure in ("died", "timeout"):
        result = workers.result_of(pool.Outcome(task, failure=failure, detail="killed by SIGSEGV"), "cpu", 300, True)
        assert result.repro().endswith("--impl block_table.gather=eager.block_table:gather_block_tables@no-padded-rows")


def test_choices_of_an_engine_that_trusts_its_caller_narrow_the_cases_and_map_the_null_block():
    families = ["basic", "past_width", "padded", "refused"]
    assert any(r.failed for r in gate.judge("block_table.slot_mapping", impl_variants.slot_mapping_trusting_its_rows,
                                            iters=3, families=families))
    declared = impl.Implementation(impl_variants.slot_mapping_trusting_its_rows, profile=(
        "positions-in-row", "batch-tokens-only", "null-block-slots", "no-refusals"))
    results = gate.judge("block_table.slot_mapping", declared, iters=3, families=families)
    assert _verdicts(results) == {"pass", "not_checked"} and any(r.verdict == "pass" for r in results)
    for choice in ("positions-in-row", "batch-tokens-only", "no-refusals"):
        assert any(f"profile ({choice}:" in r.verdict for r in results), choice


def test_greedy_at_zero_only_leaves_negative_and_nan_temperatures_unjudged():
    threshold = ["greedy_threshold"]
    assert any(r.failed for r in gate.judge("sampling.gumbel", impl_variants.sampler_greedy_at_zero_only, iters=4,
                                            families=threshold))
    declared = impl.Implementation(impl_variants.sampler_greedy_at_zero_only, profile=("greedy-at-zero-only",))
    results = gate.judge("sampling.gumbel", declared, iters=4, families=threshold)
    assert _verdicts(results) <= {"pass", "not_checked"} and any("greedy-at-zero-only" in r.verdict for r in results)


def test_shared_row_stride_leaves_out_only_tables_of_two_strides():
    choice = checks.get("block_table.gather").choices["shared-row-stride"]
    table = torch.zeros(4, 6, dtype=torch.int32)
    same = Case(inputs={"persistent": table, "out": torch.zeros(3, 6, dtype=torch.int32)})
    spread = Case(inputs={"persistent": table, "out": torch.zeros(3, 12, dtype=torch.int32)[:, :6]})
    assert choice.outside(same) is None and "row strides differ" in choice.outside(spread)


def test_finite_attention_reads_only_the_slots_the_rows_reach():
    check = checks.get("attention.paged")
    outside = check.choices["finite-attention"].outside
    poisoned_elsewhere = build_case(check, "decode", 1, "cpu")  # unreached cache slots hold NaN
    assert torch.isnan(poisoned_elsewhere.inputs["k_cache"]).any() and outside(poisoned_elsewhere) is None
    assert "NaN or infinity in the attended k_cache" in outside(build_case(check, "infinite_keys", 1, "cpu"))


def test_list_impl_json_is_json_only(capsys):
    assert main(["list", "--impl", "--json"]) == 0
    listed = {c["check"]: c["impl"] for c in json.loads(capsys.readouterr().out)}
    assert "temperature-floor" in listed["sampling.gumbel"]["choices"]
    assert listed["spec.slots"]["registrable"] is False and listed["spec.slots"]["why_not"]


def test_a_driver_check_judges_and_names_the_implementation_its_driver_calls(monkeypatch):
    """rejection.distribution runs verify's trials: with an implementation registered against verify, its cases
    judge that one, and their records and repro lines name it; a choice that only verify defines leaves them
    out rather than judging them under a choice they cannot apply."""
    from stress.core.workers import run_case

    task = Task("rejection.distribution", "target_distribution", 0)
    monkeypatch.setenv(impl.ENV, "rejection.verify=eager.rejection:verify")
    result = run_case(task, "cpu", trace=False)
    assert result.verdict == "pass" and result.impl == "rejection.verify=eager.rejection:verify"
    assert result.repro().endswith("--impl rejection.verify=eager.rejection:verify")
    crashed = workers.result_of(pool.Outcome(task, failure="died", detail="killed"), "cpu", 300, True)
    assert crashed.repro().endswith("--impl rejection.verify=eager.rejection:verify")
    monkeypatch.setenv(impl.ENV, "rejection.verify=eager.rejection:verify@no-padded-rows")
    left_out = run_case(task, "cpu", trace=False)
    assert left_out.verdict.startswith("not_checked") and "no-padded-rows" in left_out.verdict
    monkeypatch.setenv(impl.ENV, "")
    assert run_case(task, "cpu", trace=False).impl is None


def test_a_driver_judges_only_checks_an_implementation_can_be_registered_against():
    for check in checks.REGISTRY:
        for name in check.judges:
            assert impl.why_not_registrable(checks.get(name)) is None, (check.name, name)
            assert impl.why_not_registrable(check) is not None, check.name  # a driver, not a launcher


def test_temperature_floor_looks_only_at_the_slots_the_batch_samples():
    """A low temperature on a slot no batch row names is never read, so it leaves the case in the profile."""
    from stress.checks import profiles

    def case(temperature, idx_mapping):
        return Case({"temperature": torch.tensor(temperature), "idx_mapping": torch.tensor(idx_mapping,
                                                                                        dtype=torch.int32)})

    assert profiles.TEMPERATURE_FLOOR.outside(case([1.0, 0.001], [0, -1])) is None
    assert "temperature in (0" in profiles.TEMPERATURE_FLOOR.outside(case([1.0, 0.001], [1, 0]))


def test_masked_logits_judges_a_masked_token_and_leaves_out_nan_inf_and_fully_masked_rows():
    """An engine that masks tokens with -inf but defines nothing for NaN, +inf or a fully masked row declares
    masked-logits and keeps its masked-token cases judged, which finite-logits would leave out."""
    from stress.checks import profiles

    inf = float("inf")
    for logits, judged in (([[0.0, -inf, 1.0]], True), ([[0.0, float("nan"), 1.0]], False),
                           ([[0.0, inf, 1.0]], False), ([[-inf, -inf, -inf], [0.0, 1.0, 2.0]], False)):
        case = Case({"target_logits": torch.tensor([logits])})
        assert (profiles.MASKED_LOGITS.outside(case) is None) == judged, logits
        assert profiles.FINITE_LOGITS.outside(case) is not None, logits  # the broader choice leaves all four out


def test_drafts_in_support_leaves_out_drafts_of_zero_draft_probability_and_judges_the_rest():
    """A verifier that rejects a draft of q(x) = 0 fails unsupported_drafts until it declares drafts-in-support;
    then those cases are not judged, and its ordinary cases pass."""
    families = ["unsupported_drafts", "mixed"]
    undeclared = gate.judge("rejection.verify", impl_variants.verify_rejecting_unsupported_drafts, iters=3,
                            families=families)
    assert any(r.verdict == "fail:divergence" and r.family == "unsupported_drafts" for r in undeclared)
    declared = gate.judge("rejection.verify", impl.Implementation(impl_variants.verify_rejecting_unsupported_drafts,
                                                                  profile=("drafts-in-support",)),
                          iters=3, families=families)
    assert _verdicts(declared) == {"pass", "not_checked"}
    assert all(r.not_checked for r in declared if r.family == "unsupported_drafts")
