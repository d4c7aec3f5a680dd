"""Helpers the families share: sizes per device, distinct block ids, slot layouts, sentinels, strided views."""

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


INT32_MAX = 2**31 - 1


def padded_view(rng: np.random.Generator, t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a view of the same shape whose outer dimensions skip memory: each inner size is
    padded by 1..3 elements (row padding, so every outer stride grows) and, one time in two, only every
    other outermost row is used. The innermost stride stays 1, as launchers require; 1-D and empty
    tensors come back as they are. The runner keeps such views (``stress.core.guards.place``) and watches
    the skipped bytes."""
    if t.dim() < 2 or t.numel() == 0:
        return t
    step = int(rng.integers(1, 3))
    padded = [size + int(rng.integers(1, 4)) for size in t.shape[1:]]
    base = torch.empty((t.shape[0] * step, *padded), dtype=t.dtype)
    view = base[(slice(None, None, step), *(slice(0, size) for size in t.shape[1:]))]
    return view.copy_(t)


def tile_boundary_sizes(tile: int) -> tuple[int, ...]:
    """Sizes one below, at and one above one and two ``tile``s (the first size of each next tile count)."""
    return tuple(n for m in (1, 2) for n in (m * tile - 1, m * tile, m * tile + 1) if n > 0)


def laid_out(family, *names: str):
    """``family`` with its inputs ``names`` (2-D or more) replaced by ``padded_view``s: the same
    values in a strided layout, so every layout class reuses a family's value classes."""
    def build(rng, device, launch):
        case = family(rng, device, launch)
        for name in names:
            if isinstance(case.inputs.get(name), torch.Tensor):
                case.inputs[name] = padded_view(rng, case.inputs[name])
        case.note = ", ".join(filter(None, (case.note, "strided views")))
        return case

    build.__doc__ = f"{family.__name__} with {', '.join(names)} as row-padded or every-other-row views."
    return build


def one_per_value(family, keyword: str, values, name: str = "") -> dict:
    """``family`` as one family per value of its argument ``keyword``, named ``<name>_<value>`` (``name``: the
    family's function name unless given): a hunt of a
    few cases per family meets every value, not only those its draws would pick. A run gives each an equal
    share of its iterations (``iteration_share``, read by ``cases.plan``), so together they cost what one
    family drawing the value per case did."""
    def bind(value):
        def build(rng, device, launch):
            return family(rng, device, launch, **{keyword: value})
        build.__doc__ = f"{family.__name__} with {keyword}={value!r}: {family.__doc__}"
        build.iteration_share = 1 / len(values)
        return build
    return {f"{name or family.__name__}_{str(value).replace(' ', '_')}": bind(value) for value in values}


def own_launch(*devices: str):
    """Marks a family whose point is the launcher's own launch shape (a default tile capped, a split count
    chosen): on ``devices`` (default: every device) its cases run with no launch knobs, whatever the sweep
    draws or a caller forces, so a slip in that choice is met by every case rather than by the share of
    draws that happen to leave it alone."""
    def mark(family):
        family.own_launch_on = devices or ("cpu", "cuda")
        return family
    return mark


def near_int32_max(rng: np.random.Generator, shape) -> torch.Tensor:
    """Distinct int32 ids from the top of the int32 range (products with a block size pass 2^31)."""
    count = int(np.prod(shape))
    return torch.from_numpy((INT32_MAX - rng.permutation(count)).astype(np.int32)).view(*shape)


def offset_reach(rng: np.random.Generator, device: str) -> int:
    """How far apart a ``big_offsets`` family spreads a view (``spread``): 2^31 elements on the GPU, where int32
    offset arithmetic wraps; a few thousand on the CPU, where a guard fill of GBs is too slow."""
    return 2**31 if big(device) else int(rng.integers(1000, 5000))


def spread(t: torch.Tensor, dim: int, reach: int) -> torch.Tensor:
    """``t``'s values in a view whose last index along ``dim`` lies at least ``reach`` elements after its
    first (``reach`` = 2^31: element offsets that int32 address arithmetic wraps). Dimensions inside
    ``dim`` stay contiguous, outer ones stack after it. Only the view's elements are written: the rest
    of the allocation is never touched (a CPU allocation keeps no memory behind it; the runner's guarded
    GPU copy fills it with canaries, 4 bytes an element)."""
    sizes = list(t.shape)
    strides = [0] * len(sizes)
    inner = 1
    for d in range(len(sizes) - 1, -1, -1):
        strides[d] = max(inner, -(-reach // (sizes[d] - 1))) if d == dim and sizes[d] > 1 else inner
        inner = strides[d] * sizes[d]
    storage = torch.empty(1 + sum((n - 1) * st for n, st in zip(sizes, strides, strict=True)), dtype=t.dtype)
    return storage.as_strided(sizes, strides).copy_(t)
