"""Argument checks shared by the launchers: each failure is a ValueError naming the argument."""

import torch

from kernels import runtime


def tensor(name: str, t, *, dtype=None, ndim=None, device=None, min_numel=0, unit_stride=True):
    """Check one tensor argument; ``unit_stride`` asks for a stride-1 innermost dimension."""
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
    if unit_stride and t.dim() > 0 and t.numel() > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: innermost stride {t.stride(-1)}, expected 1; pass .contiguous()")
    if t.dim() > 1 and t.numel() > 0 and any(s < 0 for s in t.stride()):
        raise ValueError(f"{name}: negative strides are not supported; pass .contiguous()")
    return t


def same_device(**tensors) -> torch.device:
    """All tensors on one device; returns it."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    for name, dev in devices.items():
        if dev != first:
            raise ValueError(f"{name}: on {dev}, but {next(iter(devices))} is on {first}; "
                             "put all tensors on one device")
    return first


def on_kernel_device(**tensors) -> torch.device:
    """All tensors on one device, and that the device kernels run on; returns it."""
    dev = same_device(**tensors)
    if dev.type != runtime.DEVICE:
        name = next(iter(tensors))
        raise ValueError(f"{name}: on {dev.type}, but kernels run on {runtime.DEVICE}; move the tensors there")
    return dev


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
