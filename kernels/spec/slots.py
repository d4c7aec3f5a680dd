"""Request slots and per-slot sampling state, identical bit for bit on every TP rank (docs/fixes.md#fix-2).

Every TP rank runs this logic redundantly, so nothing here may depend on process-local state:
freed slots are recycled in sorted request-id order (a set of str iterates in an order salted
per process by PYTHONHASHSEED), and a request without a seed draws its fallback seed from a
private generator seeded by the configuration (any rank-local use of the global numpy RNG
would shift a shared stream). Slots follow the engine's LIFO free list: admission pops from
the end, release appends.
"""

from collections.abc import Iterable

import numpy as np

INT64 = np.iinfo(np.int64)


class RequestSlots:
    """Slot assignment plus the slot-indexed state recorded at every (re)admission."""

    def __init__(self, max_num_reqs: int, seed: int | None):
        if isinstance(max_num_reqs, bool) or not isinstance(max_num_reqs, int) or max_num_reqs < 0:
            raise ValueError(f"max_num_reqs: expected an int >= 0, got {max_num_reqs!r}")
        self.free_slots = list(range(max_num_reqs))
        self.slot_of: dict[str, int] = {}
        self.seeds = np.zeros(max_num_reqs, dtype=np.int64)
        self.seeds_set = np.zeros(max_num_reqs, dtype=bool)
        self.num_cached_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self._fallback_seed_rng = np.random.default_rng(seed or 0)

    def admit(self, req_id: str, num_cached_tokens: int, seed: int | None = None) -> int:
        """Give ``req_id`` a slot; ``num_cached_tokens`` is what was restored (prefix cache, resume)."""
        if req_id in self.slot_of:
            raise ValueError(f"req_id: {req_id!r} already holds slot {self.slot_of[req_id]}")
        if not self.free_slots:
            raise ValueError(f"req_id: no free slot for {req_id!r}; all {len(self.seeds)} are taken")
        slot = self.free_slots.pop()
        self.slot_of[req_id] = slot
        self.num_cached_tokens[slot] = num_cached_tokens
        self.seeds_set[slot] = seed is not None
        if seed is None:
            seed = int(self._fallback_seed_rng.integers(INT64.min, INT64.max, dtype=np.int64))
        self.seeds[slot] = seed
        return slot

    def release(self, req_ids: Iterable[str]) -> None:
        """Free the slots of finished and preempted requests, in sorted id order (never set order)."""
        for req_id in sorted(req_ids):
            self.free_slots.append(self.slot_of.pop(req_id))
