"""Reference slot bookkeeping: a stack of free slots and a private fallback-seed stream, nothing else."""

import numpy as np
import torch

INT64 = np.iinfo(np.int64)


class Slots:
    """The free stack (its top is the end), who holds which slot, and the fallback-seed stream."""

    def __init__(self, max_num_reqs, config_seed):
        self.free_stack = list(range(max_num_reqs))
        self.slot_of = {}
        self.fallback = np.random.default_rng(config_seed or 0)

    def release(self, req_ids) -> None:
        for req_id in sorted(set(req_ids)):
            self.free_stack.append(self.slot_of.pop(req_id))

    def admit(self, req_id, seed) -> tuple[int, int]:
        """The slot given to ``req_id`` and its seed (``seed``, or the next fallback draw)."""
        slot = self.free_stack.pop()
        self.slot_of[req_id] = slot
        return slot, int(self.fallback.integers(INT64.min, INT64.max, dtype=np.int64)) if seed is None else seed


def replay(max_num_reqs, config_seed, schedule, **_ignored):
    """Every admission's (slot, seed, seed_set, num_cached_tokens) as int64 [A, 4]; see stress.families.schedule."""
    state = Slots(max_num_reqs, config_seed)
    rows = []
    for step in schedule:
        state.release(set(step.finished) | set(step.preempted))
        for req_id, num_cached, seed in step.admitted:
            rows.append((*state.admit(req_id, seed), int(seed is not None), num_cached))
    return torch.tensor(rows, dtype=torch.int64).view(-1, 4)
