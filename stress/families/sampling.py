"""Case families for Gumbel-max sampling: mixed greedy/sampled rows, inert padding, nonfinite
logits, long vocabularies, exact ties, and no rows at all."""

import numpy as np
import torch

from stress.families.common import big, pick, slots_for
from stress.types import Case

SENTINEL_LOGIT = -7777.0  # pre-filled cache entries no row may write


def sampling_sweep(device: str) -> list[dict]:
    """Vocab tiles (the running max crosses tiles) and warps; CPU keeps few tiles (slow interpreter)."""
    if device == "cuda":
        return [{"block_v": b, "num_warps": w} for b in (128, 1024, 4096) for w in (1, 4, 8)]
    return [{}, {"block_v": 128}]


def temperatures(rng, num_slots: int, greedy_share: float) -> torch.Tensor:
    """Per slot: 0 (greedy) with probability ``greedy_share``, else in [0.25, 2)."""
    temps = rng.uniform(0.25, 2.0, num_slots)
    temps[rng.random(num_slots) < greedy_share] = 0.0
    return torch.from_numpy(temps.astype(np.float32))


def seeds(rng, num_slots: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(-(2**63), 2**63 - 1, num_slots, dtype=np.int64))


def random_logits(rng, shape, scale: float | None = None) -> torch.Tensor:
    scale = rng.uniform(0.5, 6.0) if scale is None else scale
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))


def _case(rng, *, rows, vocab, pad_rows=0, greedy_share=0.3, logits=None, note="") -> Case:
    """``rows`` live rows on distinct slots, then ``pad_rows`` inert ones (slot -1, stale logits).

    The cache is pre-filled with a sentinel: only ``[slot, col]`` of live rows may change.
    """
    idx_mapping, num_slots = slots_for(rng, rows, int(rng.integers(1, 4)))
    idx_mapping = torch.cat([idx_mapping, torch.full((pad_rows,), -1, dtype=torch.int32)])
    total = rows + pad_rows
    depth = int(rng.integers(1, 4))
    return Case(inputs={
        "logits": random_logits(rng, (total, vocab)) if logits is None else logits,
        "idx_mapping": idx_mapping,
        "temperature": temperatures(rng, num_slots, greedy_share),
        "seeds": seeds(rng, num_slots),
        "positions": torch.from_numpy(rng.integers(0, 2**33, total, dtype=np.int64)),
        "draft": bool(rng.integers(2)),
        "logits_cache": torch.full((num_slots, depth, vocab), SENTINEL_LOGIT, dtype=torch.float32),
        "cache_cols": torch.from_numpy(rng.integers(0, depth, total).astype(np.int32)),
    }, note=note)


def mixed(rng, device, launch):
    """Greedy and sampled rows, drafting or verifying."""
    rows = int(rng.integers(1, 9)) if big(device) else 1
    return _case(rng, rows=rows, vocab=int(rng.integers(2, 4096 if big(device) else 200)), note=f"{rows} rows")


def padded(rng, device, launch):
    """Inert rows (slot -1) after the live ones must not touch any cache row (spec fix 3)."""
    pad = int(rng.integers(1, 4))
    return _case(rng, rows=int(rng.integers(1, 3)) if big(device) else 1, pad_rows=pad, vocab=int(rng.integers(2, 64)),
                 greedy_share=0.2, note=f"{pad} inert rows")


def zero_width(rng, device, launch):
    """No rows at all (a depth-0 draft), or only inert ones."""
    if rng.integers(2):
        return _case(rng, rows=0, vocab=int(rng.integers(1, 32)), note="no rows")
    return _case(rng, rows=0, pad_rows=int(rng.integers(1, 3)), vocab=int(rng.integers(1, 32)),
                 note="only inert rows")


def nonfinite(rng, device, launch):
    """NaN and +-inf logits, sometimes a row entirely -inf, NaN or +inf: tokens must be in range."""
    rows, vocab = int(rng.integers(1, 5)) if big(device) else 1, int(rng.integers(2, 48))
    logits = random_logits(rng, (rows, vocab))
    for value in (float("nan"), float("inf"), float("-inf")):
        logits[torch.from_numpy(rng.random((rows, vocab)) < 0.15)] = value
    if rng.random() < 0.3:
        logits[int(rng.integers(rows))] = pick(rng, (float("-inf"), float("nan"), float("inf")))
    return _case(rng, rows=rows, vocab=vocab, logits=logits, note="nonfinite logits")


def long_vocab(rng, device, launch):
    """Vocabularies of many tiles (128k on the GPU)."""
    vocab = pick(rng, (32000, 128256, 131072) if big(device) else (300, 600))
    return _case(rng, rows=int(rng.integers(1, 5 if big(device) else 2)), vocab=vocab, note=f"vocab {vocab}")


def ties(rng, device, launch):
    """Logits on a few levels: exact ties must go to the lowest token id."""
    rows, vocab = int(rng.integers(1, 5)) if big(device) else 1, int(rng.integers(2, 64))
    logits = torch.from_numpy(rng.integers(0, 3, (rows, vocab)).astype(np.float32))
    return _case(rng, rows=rows, vocab=vocab, logits=logits, greedy_share=0.7, note="tied logits")


FAMILIES = {"mixed": mixed, "padded": padded, "zero_width": zero_width, "nonfinite": nonfinite,
            "long_vocab": long_vocab, "ties": ties}
