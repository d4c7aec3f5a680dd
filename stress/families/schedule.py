"""Admission schedules: seeded sequences of finish / preempt / admit steps, and their replay.

A schedule is what the scheduler hands every TP rank alike; replaying it through the production
``RequestSlots`` must give the same slots and seeds whatever the process's hash salt or global
RNG state. Finish and preemption lists are sets, as upstream, so their iteration order is the
process's own.
"""

from typing import NamedTuple

import numpy as np
import torch

from kernels.spec import slots


class Admission(NamedTuple):
    req_id: str
    num_cached_tokens: int  # restored at this (re)admission
    seed: int | None  # None: a fallback seed is drawn


class Step(NamedTuple):
    finished: set[str]
    preempted: set[str]
    admitted: tuple[Admission, ...]
    global_draws: int  # draws a rank-local consumer takes from the global numpy RNG before the step


ADMISSION_FIELDS = ("slot", "seed", "seed_set", "num_cached_tokens")


def random_schedule(rng: np.random.Generator, *, max_num_reqs: int, num_steps: int, finish_p: float = 0.3,
                    preempt_p: float = 0.15, seeded_p: float = 0.3, block_size: int = 16,
                    unaligned_p: float = 0.0) -> list[Step]:
    """Fill free slots every step; finish and preempt running requests; re-admit the preempted later.

    Request ids sort in an order unrelated to admission order, so sorted and set order both differ
    from it. Cached counts are block multiples, or with probability ``unaligned_p`` not.
    """
    running: list[str] = []
    waiting: list[str] = []  # preempted, to be resumed
    schedule, next_id = [], 0
    for _ in range(num_steps):
        finished = {r for r in running if rng.random() < finish_p}
        preempted = {r for r in running if r not in finished and rng.random() < preempt_p}
        running = [r for r in running if r not in finished | preempted]
        admitted = []
        for _ in range(max_num_reqs - len(running)):
            if waiting and rng.random() < 0.5:
                req_id = waiting.pop(0)
            else:
                req_id, next_id = f"r{int(rng.integers(0, 1000)):03d}-{next_id}", next_id + 1
            cached = int(rng.integers(0, 8)) * block_size
            if rng.random() < unaligned_p:
                cached += int(rng.integers(1, block_size))
            seed = int(rng.integers(-2**40, 2**40)) if rng.random() < seeded_p else None
            admitted.append(Admission(req_id, cached, seed))
            running.append(req_id)
        waiting += sorted(preempted)
        schedule.append(Step(finished, preempted, tuple(admitted), int(rng.integers(0, 50))))
    return schedule


def apply_step(state: "slots.RequestSlots", step: Step) -> list[tuple[int, int, int, int]]:
    """Run one step (global-RNG consumer first, then release, then admit); rows in ADMISSION_FIELDS order."""
    np.random.random(step.global_draws)  # a rank-local consumer the slot state must not see
    state.release(step.finished | step.preempted)
    rows = []
    for admission in step.admitted:
        seed = {} if admission.seed is None else {"seed": admission.seed}  # unseeded: admitted without one
        slot = state.admit(admission.req_id, admission.num_cached_tokens, **seed)
        rows.append((slot, int(state.seeds[slot]), int(state.seeds_set[slot]), int(state.num_cached_tokens[slot])))
    return rows


def replay(max_num_reqs: int, config_seed: int, schedule: list[Step], global_seed: int) -> torch.Tensor:
    """Every admission's (slot, seed, seed_set, num_cached_tokens) as int64 [A, 4].

    The global numpy RNG is seeded with ``global_seed`` and drawn from between steps (a stand-in
    for rank-local consumers), then restored, so a case is reproducible and leaves no trace.
    """
    saved = np.random.get_state()
    try:
        np.random.seed(global_seed)  # deliberate: see the docstring
        state = slots.RequestSlots(max_num_reqs, config_seed)  # looked up now, so a mutant applies
        rows = [row for step in schedule for row in apply_step(state, step)]
    finally:
        np.random.set_state(saved)
    _check_state_dtypes(state)
    return torch.tensor(rows, dtype=torch.int64).view(-1, len(ADMISSION_FIELDS))


# The per-slot arrays' documented dtypes: the engine hands them to the kernels (num_cached_tokens as int32) and to
# every rank's records as tensors, where a flag array of another dtype indexes by position instead of masking.
STATE_DTYPES = {"seeds": np.int64, "seeds_set": np.bool_, "num_cached_tokens": np.int32}


def _check_state_dtypes(state) -> None:
    """Raise (the case crashes) where a per-slot array has another dtype than ``STATE_DTYPES`` documents: the rows
    are recorded as ints, which would hide it."""
    for name, dtype in STATE_DTYPES.items():
        if getattr(state, name).dtype != dtype:
            raise RuntimeError(f"RequestSlots.{name} is {getattr(state, name).dtype}, documented {np.dtype(dtype)}")
