"""Reference slot bookkeeping: a stack of free slots and a private fallback-seed stream, nothing else."""

import numpy as np
import torch

INT64 = np.iinfo(np.int64)


def replay(max_num_reqs, config_seed, schedule, **_ignored):
    """Every admission's (slot, seed, seed_set, num_cached_tokens) as int64 [A, 4]; see stress.schedule."""
    free_stack = list(range(max_num_reqs))  # the top is the end
    slot_of = {}
    fallback = np.random.default_rng(config_seed or 0)
    rows = []
    for step in schedule:
        for req_id in sorted(set(step.finished) | set(step.preempted)):
            free_stack.append(slot_of.pop(req_id))
        for req_id, num_cached, seed in step.admitted:
            slot = free_stack.pop()
            slot_of[req_id] = slot
            drawn = int(fallback.integers(INT64.min, INT64.max, dtype=np.int64)) if seed is None else seed
            rows.append((slot, drawn, int(seed is not None), num_cached))
    return torch.tensor(rows, dtype=torch.int64).view(-1, 4)
