"""TP determinism: rank processes with different PYTHONHASHSEED and global-RNG state agree on slots,
seeds and draft inputs at every step, and each fix-2 mutant makes them diverge at a named field."""

from stress import tp

FIRST_FIELD = {"set-order-recycling": ("slot_map", "free_slots"), "global-rng-seeds": ("seeds",)}


def test_ranks_agree_and_fix2_mutants_diverge():
    outcomes = tp.run_ranks(2, mutants=(None, *FIRST_FIELD))
    clean = outcomes.pop(None)
    assert clean.agreed, clean.message
    for mutant, outcome in outcomes.items():
        assert not outcome.agreed, f"{mutant}: ranks agreed although the mutant was applied"
        assert "DIVERGED step " in outcome.message, outcome.message
        field = outcome.message.split(" field ")[1].split(":")[0]
        assert field in FIRST_FIELD[mutant], f"{mutant}: first divergence in {field}, expected {FIRST_FIELD[mutant]}"
