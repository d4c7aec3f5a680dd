"""Gumbel-max sampling of ``kernels.sampling`` in plain tensor ops: one token per row keyed by
``(seeds[slot], position)``, greedy where the temperature is not > 0, slot -1 rows inert, raw logits cached per
(slot, column) (docs/contracts/sampling.md).

Declared random stream: Philox4x32-10 exactly as Triton's ``tl.randint`` / ``tl.rand`` draw it
(``reference.philox``), the one stream every implementation of this contract shares (a sampled token is only
comparable under the same noise); ``eager.philox`` draws the same numbers on the logits' device.
The argument checks repeat the launcher's (same helpers, same messages): they are inline there, where its
planted refusal bugs patch them.
"""

import torch

from eager import philox
from kernels import validate

DRAFT_NOISE_SALT = 1 << 30  # added to every position when drafting (as kernels.sampling)


def gumbel_noise(gumbel_seeds: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 Gumbel noise ``[..., vocab]`` of tokens ``0..vocab-1`` under each key of ``gumbel_seeds``, from
    ``rand(key, token)``: computed in float64, rounded once (as the kernels)."""
    u = philox.rand(gumbel_seeds[..., None], torch.arange(vocab, device=gumbel_seeds.device)).to(torch.float64)
    return (-torch.log(-torch.log(u + 1e-20) + 1e-20)).to(torch.float32)


def first_argmax(scores: torch.Tensor) -> torch.Tensor:
    """Lowest index of the maximum along the last dim, NaN ranking as -inf (a row of -inf/NaN gives 0)."""
    return scores.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf")).argmax(-1)


def per_slot(values: torch.Tensor, slots: torch.Tensor, inert) -> torch.Tensor:
    """``values[slot]`` for each entry of ``slots``, ``inert`` where the slot is -1."""
    if values.numel() == 0:
        return torch.full(slots.shape, inert, dtype=values.dtype, device=slots.device)
    return torch.where(slots >= 0, values[slots.clamp(min=0)], inert)


def gumbel_sample(logits: torch.Tensor, idx_mapping: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                  positions: torch.Tensor, *, draft: bool = False, logits_cache: torch.Tensor | None = None,
                  cache_cols: torch.Tensor | None = None) -> torch.Tensor:
    """Sample one token per row; returns int64 token ids ``[R]``. Arguments as
    ``kernels.sampling.gumbel_sample``."""
    validate.tensor("logits", logits, dtype=torch.float32, ndim=2)
    validate.tensor("idx_mapping", idx_mapping, dtype=torch.int32, ndim=1)
    validate.tensor("temperature", temperature, dtype=torch.float32, ndim=1)
    validate.tensor("seeds", seeds, dtype=torch.int64, ndim=1)
    validate.tensor("positions", positions, dtype=torch.int64, ndim=1)
    tensors = {"logits": logits, "idx_mapping": idx_mapping, "temperature": temperature, "seeds": seeds,
               "positions": positions}
    num_rows, vocab = logits.shape
    if idx_mapping.numel() != num_rows:
        raise ValueError(f"idx_mapping: {idx_mapping.numel()} entries for {num_rows} logits rows")
    if positions.numel() != num_rows:
        raise ValueError(f"positions: {positions.numel()} entries for {num_rows} logits rows")
    if seeds.numel() != temperature.numel():
        raise ValueError(f"seeds: {seeds.numel()} slots, but temperature has {temperature.numel()}")
    if (logits_cache is None) != (cache_cols is None):
        raise ValueError("logits_cache: pass it together with cache_cols, or neither")
    if logits_cache is not None:
        validate.tensor("logits_cache", logits_cache, dtype=torch.float32, ndim=3)
        validate.tensor("cache_cols", cache_cols, dtype=torch.int32, ndim=1)
        if logits_cache.shape[0] != temperature.numel() or logits_cache.shape[2] != vocab:
            raise ValueError(f"logits_cache: shape {tuple(logits_cache.shape)}, expected "
                             f"[{temperature.numel()}, K, {vocab}]")
        if cache_cols.numel() != num_rows:
            raise ValueError(f"cache_cols: {cache_cols.numel()} entries for {num_rows} logits rows")
        tensors.update(logits_cache=logits_cache, cache_cols=cache_cols)
    validate.same_device(**tensors)
    validate.indices("idx_mapping", idx_mapping, -1, temperature.numel(), what="slot")
    if logits_cache is not None:
        validate.indices("cache_cols", cache_cols, 0, logits_cache.shape[1], what="column", where=idx_mapping >= 0)
    if num_rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    if vocab == 0:
        raise ValueError("logits: vocab size 0; there is no token to sample")
    slots = idx_mapping.to(torch.int64)
    live = slots >= 0
    if logits_cache is not None:  # bit for bit, before temperature; an inert row stores nothing
        logits_cache[slots[live], cache_cols[live].to(torch.int64)] = logits[live]
    temp = per_slot(temperature, slots, 0.0)
    rows = (temp > 0).nonzero()[:, 0]  # not > 0 (0 or NaN): greedy, no draw
    scores = logits.clone()
    if rows.numel():
        salt = DRAFT_NOISE_SALT if draft else 0
        keys = philox.randint(per_slot(seeds, slots, 0)[rows], positions[rows] + salt)
        scores[rows] = logits[rows] / temp[rows, None] + gumbel_noise(keys, vocab)
    return first_argmax(scores)
