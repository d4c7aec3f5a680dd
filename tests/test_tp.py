"""TP determinism: rank processes with different PYTHONHASHSEED and global-RNG state agree on slots,
seeds and draft inputs at every step, and each fix-2 mutant makes them diverge at a named field."""

import pytest

from stress import tp

FIRST_FIELD = {"set-order-recycling": ("slot_map", "free_slots"), "global-rng-seeds": ("seeds",)}


@pytest.mark.slow
def test_ranks_agree_and_fix2_mutants_diverge(device):
    outcomes = tp.run_ranks(2, mutants=(None, *FIRST_FIELD))
    clean = outcomes.pop(None)
    assert clean.agreed, clean.message
    if device.type == "cpu":
        assert (clean.backend, clean.ranks) == ("gloo", ("rank 0 on cpu", "rank 1 on cpu"))
    for mutant, outcome in outcomes.items():
        assert not outcome.agreed, f"{mutant}: ranks agreed although the mutant was applied"
        assert "DIVERGED step " in outcome.message, outcome.message
        field = outcome.message.split(" field ")[1].split(":")[0]
        assert field in FIRST_FIELD[mutant], f"{mutant}: first divergence in {field}, expected {FIRST_FIELD[mutant]}"


def test_tp_command_runs_production_first_and_judges_each_scenario(monkeypatch, capsys):
    """Exit 0 only when production agrees and every named mutant diverges; a mutant that agrees fails."""
    from stress.__main__ import main

    seen = []

    def fake_run_ranks(world, *, mutants, seed, num_steps, workload, backend):
        seen.append(mutants)
        return {name: tp.Outcome(agreed=name != "diverges", message="m", seconds=0.0, backend="gloo",
                                 ranks=("rank 0 on cpu",)) for name in mutants}

    monkeypatch.setattr(tp, "run_ranks", fake_run_ranks)
    assert main(["tp", "--workload", "slots", "--mutant", "diverges", "--mutant", "diverges"]) == 0
    assert seen[-1] == (None, "diverges")  # production first, each mutant once
    assert main(["tp", "--mutant", "agrees"]) == 1
    assert "[engine] agrees: m  [UNEXPECTED: must diverge]" in capsys.readouterr().out


@pytest.mark.slow
def test_one_rank_runs_the_production_code_over_its_process_group(capsys, device):
    """One rank agrees with itself by construction; it still runs the whole path (NCCL on one GPU)."""
    from stress.__main__ import main

    assert main(["tp", "--ranks", "1", "--workload", "slots"]) == 0
    out = capsys.readouterr().out
    backend = "nccl" if device.type == "cuda" else "gloo"
    assert "[slots] production code: 1 rank(s): AGREED 8 steps" in out
    assert f"[slots] 1 rank(s) over {backend} in " in out and "rank 0 on " in out

