"""Helpers the families share: sizes per device, distinct block ids, slot layouts, sentinels."""

import numpy as np
import torch

SENTINEL = -7777  # pre-filled where a kernel must not write; it must survive
BLOCK_SIZES = (1, 3, 16, 64)


def big(device: str) -> bool:
    """Full-size cases on the GPU; small ones under the (slow) CPU interpreter."""
    return device == "cuda"


def pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def distinct_blocks(rng: np.random.Generator, rows: int, width: int) -> torch.Tensor:
    """A [rows, width] int32 table of distinct non-null block ids, so a wrong entry names its source."""
    ids = rng.permutation(rows * width) + 1
    return torch.from_numpy(ids.astype(np.int32)).view(rows, width)


def slots_for(rng: np.random.Generator, batch_rows: int, extra_slots: int = 0) -> tuple[torch.Tensor, int]:
    """idx_mapping for ``batch_rows`` rows: a random permutation of slots with gaps; returns it and S."""
    num_slots = batch_rows + extra_slots
    chosen = rng.permutation(num_slots)[:batch_rows]
    return torch.from_numpy(chosen.astype(np.int32)), num_slots


def int32(values) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64)).to(torch.int32)


def int64(values) -> torch.Tensor:
    return torch.as_tensor(np.asarray(values, dtype=np.int64))
