"""Argument checks shared by the launchers: each failure is a ValueError naming the argument."""

import os

import torch

from kernels import runtime

# Index values live on the device: reading them back to check them would synchronize the
# stream on every launch, so on a GPU they are checked only when asked for.
CHECK_INDICES_ON_GPU = os.environ.get("SPECSAN_CHECK_INDICES", "") == "1"


def tensor(name: str, t, *, dtype=None, ndim=None, device=None, min_numel=0, unit_stride=True):
    """Check one tensor argument; ``unit_stride`` asks for a stride-1 innermost dimension where it holds more than
    one element (one of size 1 is read at index 0 alone, whatever its stride: torch calls such a tensor
    contiguous, and ``.contiguous()`` hands it back as it is)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            want = " or ".join(str(d).removeprefix("torch.") for d in allowed)
            have = str(t.dtype).removeprefix("torch.")
            raise ValueError(f"{name}: dtype {have}, expected {want}; convert with .to({allowed[0]})")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim}-D, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: on {t.device}, expected {device}; move it with .to('{device}')")
    if t.numel() < min_numel:
        raise ValueError(f"{name}: has {t.numel()} elements, needs at least {min_numel}")
    if unit_stride and t.numel() > 1 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: innermost stride {t.stride(-1)}, expected 1; pass .contiguous()")
    if t.dim() > 1 and t.numel() > 0 and any(s < 0 for s in t.stride()):
        raise ValueError(f"{name}: negative strides are not supported; pass .contiguous()")
    return t


def _odd_one(values: dict) -> tuple[str, str, object] | None:
    """(an argument off the value most arguments have, one that has it, that value), or None when all agree. The
    value most have is the one the caller meant (the first argument's on a tie), so the error names an
    argument off it rather than the first one that differs from the first."""
    listed = list(values.values())
    meant = max(dict.fromkeys(listed), key=listed.count)
    odd = next((name for name, value in values.items() if value != meant), None)
    return None if odd is None else (odd, next(name for name, value in values.items() if value == meant), meant)


def same_device(**tensors) -> torch.device:
    """All tensors on one device; returns it. The error names a tensor off the device most of them are on."""
    if found := _odd_one({name: t.device for name, t in tensors.items()}):
        name, others, meant = found
        raise ValueError(f"{name}: on {tensors[name].device}, but {others} is on {meant}; "
                         "put all tensors on one device")
    return next(iter(tensors.values())).device


def same_dtype(fix: str, **tensors) -> torch.dtype:
    """All tensors of one dtype; returns it. The error names a tensor off the dtype most of them have, and ends
    with ``fix``."""
    if found := _odd_one({name: t.dtype for name, t in tensors.items()}):
        name, others, meant = found
        raise ValueError(f"{name}: dtype {tensors[name].dtype}, but {others} is {meant}; {fix}")
    return next(iter(tensors.values())).dtype


def on_kernel_device(**tensors) -> torch.device:
    """All tensors on one device, and that the device kernels run on; returns it. The error names the tensor
    that is off it."""
    for name, t in tensors.items():
        if t.device.type != runtime.DEVICE:
            raise ValueError(f"{name}: on {t.device.type}, but kernels run on {runtime.DEVICE}; move it there")
    return same_device(**tensors)


def positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return v


def power_of_two(name: str, v) -> int:
    positive_int(name, v)
    if v & (v - 1):
        raise ValueError(f"{name}: expected a power of two, got {v}")
    return v


def non_negative_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
    return v


def flag(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name}: expected a bool, got {v!r}")
    return v


def _checked(t: torch.Tensor) -> bool:
    return t.numel() > 0 and (t.device.type == "cpu" or CHECK_INDICES_ON_GPU)


def indices(name: str, t: torch.Tensor, lower: int, upper: int, *, what: str = "index", where=None) -> None:
    """Every entry of ``t`` (or of ``t[where]``) in ``[lower, upper)``: an index the kernel follows.

    ``where`` is a bool mask of ``t``'s shape, or a function returning one, called only when the check runs
    (so an unchecked GPU launch computes no mask).

    Checked whenever ``t`` is on the CPU, where it costs a pass over a small tensor; on a GPU
    only with ``SPECSAN_CHECK_INDICES=1`` (see ``CHECK_INDICES_ON_GPU``).
    """
    if not _checked(t):
        return
    outside = (t < lower) | (t >= upper)
    if where is not None:
        outside &= where() if callable(where) else where
    found = outside.nonzero()
    if found.numel():
        at = [int(i) for i in found[0]]
        raise ValueError(f"{name}: {what} {int(t[tuple(at)])} at {at} is outside [{lower}, {upper}); "
                         f"the kernel would follow it out of bounds")


def offsets(name: str, t: torch.Tensor, total: int) -> None:
    """CSR offsets into ``total`` entries: non-decreasing, each in ``[0, total]`` (checked as ``indices``)."""
    indices(name, t, 0, total + 1, what="offset")
    if _checked(t) and bool((t[1:] < t[:-1]).any()):
        raise ValueError(f"{name}: offsets must not decrease, got {t.tolist()}")
