"""Ignored regions: the parts of a valid case's inputs that its contract says are never read or must not matter.

A check's entry declares, as a function of a valid case's inputs, where those regions lie (``Region``s);
``poisoned`` wraps one of its valid families so that every ignored region holds hostile values: indices far out
of range both ways (products with a block size that pass 2^31, -1 where -1 means something else), NaN and
infinities. The reference must give the same outputs for the poisoned case as for the valid one
(tests/test_ignored.py), which keeps each declaration honest; a kernel or launcher that reads or checks an
ignored region then diverges, crashes or refuses a valid call.
"""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from stress.core.types import Family

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
# 2^25 + 1 and 2^27 + 1 pass 2^31 once multiplied by a block size of 64 or 16
HOSTILE_INT32 = (-1, -2, INT32_MIN, INT32_MAX, 2**25 + 1, 2**27 + 1, -(2**27) - 1)
HOSTILE_INT64 = (-1, -2, INT64_MIN, INT64_MAX, 2**62, -(2**62), 2**31, 2**32 + 1, -(2**31) - 1)
HOSTILE_FLOAT = (float("nan"), float("inf"), float("-inf"), -0.0, 3.0e38)
# a count whose contract is >= 0 everywhere: only its magnitude may be hostile
HOSTILE_COUNT = (0, INT32_MAX, INT32_MAX - 1, 2**27 + 1)
HOSTILE_NEGATIVE = (-2, INT32_MIN, -(2**27) - 1)  # a padded row's slot, where any negative one is padding


def hostile(dtype: torch.dtype) -> tuple:
    """The values an ignored region of ``dtype`` is filled from when its Region names none."""
    if dtype.is_floating_point:
        return HOSTILE_FLOAT
    return HOSTILE_INT64 if dtype == torch.int64 else HOSTILE_INT32


@dataclass(frozen=True)
class Region:
    """The elements of input ``name`` that ``where`` (a bool mask of its shape) marks, and the values they may be
    given (by default ``hostile`` of its dtype). On an input the kernel also writes, a region is what it neither
    reads nor writes: it must come out as it went in."""

    name: str
    where: torch.Tensor
    values: tuple = ()


def poison(rng: np.random.Generator, inputs: dict, region: Region) -> bool:
    """Fills ``region`` of ``inputs`` (a fresh copy of the tensor, its strides kept) with values drawn from its
    pool, each value at least once where the region has room; False when the region is empty."""
    count = int(region.where.sum())
    if count == 0:
        return False
    tensor = inputs[region.name]
    pool = torch.tensor(region.values or hostile(tensor.dtype),
                        dtype=torch.float64 if tensor.dtype.is_floating_point else torch.int64)
    order = np.concatenate([rng.permutation(pool.numel()),
                            rng.integers(pool.numel(), size=max(0, count - pool.numel()))])
    filled = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype).copy_(tensor)
    filled[region.where] = pool[torch.from_numpy(order[:count])].to(tensor.dtype)
    inputs[region.name] = filled
    return True


def one_of(*families: Callable) -> Callable:
    """A builder that draws one of ``families`` per case (with the case's rng), so one poisoned family meets the
    ignored regions that different valid families hold (inert rows in one, placeholders in another)."""
    def build(rng, device, launch):
        return families[int(rng.integers(len(families)))](rng, device, launch)

    build.__name__ = " or ".join(family.__name__ for family in families)
    return build


def poisoned(valid: Callable, regions: Callable[[dict], list[Region]]) -> Family:
    """``valid``'s case for the same rng, then every region ``regions(inputs)`` declares ignored filled with hostile
    values: the outputs must be the valid case's."""
    def build(rng, device, launch):
        case = valid(rng, device, launch)
        filled = [region.name for region in regions(case.inputs) if poison(rng, case.inputs, region)]
        case.note = ", ".join(filter(None, (case.note, "ignored: " + (", ".join(dict.fromkeys(filled)) or "none"))))
        return case

    build.__name__ = "ignored_poisoned"
    build.__doc__ = (f"{valid.__name__} cases with every input region the contract ignores holding hostile values "
                     "(indices far out of range both ways, NaN and infinities): the outputs must not change.")
    return Family(build, valid=valid, ignored=regions)


# ---------------------------------------------------------------- what declarations are made of


def unmapped_slots(idx_mapping: torch.Tensor, num_slots: int) -> torch.Tensor:
    """The slots no live batch row (slot >= 0) names: per-request state the kernel has no reason to read."""
    mapped = torch.zeros(num_slots, dtype=torch.bool)
    mapped[idx_mapping[idx_mapping >= 0].long()] = True
    return ~mapped


def past(count: int, length: int) -> torch.Tensor:
    """Entries ``count`` and on of ``length`` (rows past the batch, tokens past the last)."""
    return torch.arange(length) >= count


def whole_rows(rows: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """``rows`` (one bool per leading index) spread over every element of those rows of ``tensor``."""
    return rows.view(-1, *[1] * (tensor.dim() - 1)).expand(tensor.shape)
