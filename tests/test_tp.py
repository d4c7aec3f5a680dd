"""TP determinism: rank processes with different PYTHONHASHSEED and global-RNG state agree on slots,
seeds and draft inputs at every step, and each fix-2 mutant makes them diverge at a named field."""

from concurrent.futures import ThreadPoolExecutor

from stress import tp

SCENARIOS = {None: None, "set-order-recycling": ("slot_map", "free_slots"), "global-rng-seeds": ("seeds",)}


def test_ranks_agree_and_fix2_mutants_diverge():
    # The three runs are independent process groups; running them side by side halves the wall time.
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        outcomes = dict(zip(SCENARIOS, pool.map(lambda m: tp.run_ranks(2, mutant=m), SCENARIOS), strict=True))
    clean = outcomes.pop(None)
    assert clean.agreed, clean.message
    for mutant, outcome in outcomes.items():
        assert not outcome.agreed, f"{mutant}: ranks agreed although the mutant was applied"
        assert outcome.message.startswith("DIVERGED step "), outcome.message
        field = outcome.message.split(" field ")[1].split(":")[0]
        assert field in SCENARIOS[mutant], f"{mutant}: first divergence in {field}, expected {SCENARIOS[mutant]}"
