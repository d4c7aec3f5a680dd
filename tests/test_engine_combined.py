"""The combined engine family: model sizes of which no two coincide, and every pair of feature settings met,
each setting visible in the case it builds."""

import itertools

import numpy as np
import pytest

from stress import checks
from stress.core import cases, guards
from stress.core import patches as mutants
from stress.families import engine as families
from stress.families import engine_shapes
from stress.oracles import engine as engine_check

ENGINE = checks.get("engine.step")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_drawn_shapes_never_coincide_and_are_grouped_query(device):
    for seed in range(200):
        dims, block_sizes = engine_shapes.distinct_shape(np.random.default_rng(seed), device)
        assert engine_shapes.coinciding(dims, block_sizes) == [], (seed, dims, block_sizes)
        assert dims["head_dim"] != dims["hidden"] // dims["heads"] and dims["head_dim"] % 2 == 0
        assert 1 < dims["kv_heads"] < dims["heads"] and dims["heads"] % dims["kv_heads"] == 0
        assert min(dims["hidden"], dims["head_dim"]) >= families.CLASSES  # the planted circuit's room


def test_the_fixed_shapes_coincide_where_the_drawn_ones_cannot():
    """The detector's positive control: the older families' CPU model has head_dim == hidden / heads."""
    dims = families.model_config(np.random.default_rng(0), "cpu", 64, 3)
    assert ("head_dim", "hidden / heads") in engine_shapes.coinciding(dims, (4, 4))
    assert ("target block", "draft block") in engine_shapes.coinciding(dims, (4, 4))


def _realized(case) -> dict[str, str]:
    """Each feature's setting as the built case shows it (config and requests), not as the family drew it."""
    config, requests = case.inputs["config"], case.inputs["requests"]
    sched, k, schedule = config["scheduler"], config["num_spec_tokens"], config["dsd_schedule"]
    bs, budget = sched["target_block_size"], sched["max_num_batched_tokens"]
    prompts = [r["prompt"] for r in requests]
    full = sum(-(-min(len(r["prompt"]) + r["max_new_tokens"] + 2 * k + 2, sched["max_model_len"] + k + 2) // bs)
               for r in requests)  # every request at full length, with its drafts and lookahead
    firsts = [tuple(p[:bs]) for p in prompts if len(p) > bs]
    return {
        "layout": "dspark" if config["anchor_first"] else "dflash",
        "depth": "fixed" if schedule is None else "adaptive" if schedule == [(1, sched["max_num_reqs"], k)]
        else "bands",
        "budget": "tight" if budget < sched["max_num_reqs"] * (k + 1) else "loose",
        "blocks": "pressed" if sched["target_num_blocks"] - 1 < full else "ample",
        "prefix": "shared" if len(firsts) > len(set(firsts)) else "none",
        "length": "limit" if any(len(r["prompt"]) + r["max_new_tokens"] > sched["max_model_len"] for r in requests)
        else "free",
        "sampling": "mixed" if any(r["temperature"] > 0 for r in requests) else "greedy",
        "verify": "cached" if config["draft_probabilistic"] else "one-hot",
        "graphs": "graphs" if config["cuda_graphs"] else "eager",
        "arrivals": "staggered" if any(r["arrival"] for r in requests) else "together",
    }


def test_the_combined_family_meets_every_pair_of_settings_and_each_shows_in_its_case():
    drawn_cases = []
    for i in range(120):
        case = cases.build_case(ENGINE, "combined", cases.case_seed(0, "engine.step", "combined", i), "cpu")
        settings = (item.split("=") for item in case.note.split() if "=" in item)
        drawn = {name: value for name, value in settings if name in families.FEATURES}
        assert drawn.keys() == families.FEATURES.keys(), case.note
        realized = _realized(case)
        # sampling may draw temperature 0 for every request: "mixed" then shows as greedy
        assert {n: v for n, v in realized.items() if n != "sampling"} == \
            {n: drawn[n] for n in realized if n != "sampling"}, (case.note, realized)
        assert drawn["sampling"] == "mixed" or realized["sampling"] == "greedy"
        drawn_cases.append(drawn)
    for a, b in itertools.combinations(families.FEATURES, 2):
        met = {(d[a], d[b]) for d in drawn_cases}
        assert met == set(itertools.product(families.FEATURES[a], families.FEATURES[b])), (a, b, met)


@pytest.mark.slow
def test_the_scale_slip_shows_only_where_head_dim_is_not_hidden_over_heads():
    """Under the older families' shapes the slip computes the model's own scale; the combined family's kill it
    in the target's logits."""
    slip = ENGINE.mutant("scale-from-hidden")
    for family, killed in (("shared_prefix", False), ("combined", True)):
        case = cases.build_case(ENGINE, family, cases.case_seed(0, "engine.step", family, 0), "cpu")
        expected = engine_check.reference(**guards.fresh_inputs(case))
        with mutants.applied(slip):
            got = engine_check.run_engine(**guards.fresh_inputs(case))
        found = engine_check.compare("engine", expected, got)
        assert (found is not None) == killed, (family, found and found.lines())
        if killed:
            assert found.verdict == "divergence" and "logits" in found.lines()[0], found.lines()
