"""Equality of built cases all the way down, for tests that rebuild a case another way."""

import torch


def same(a, b) -> bool:
    """Equal all the way down; tensors bitwise (NaN logits equal NaN) and in the same layout (a strided view must
    come back with the same strides)."""
    from stress.core.compare import exact

    if isinstance(a, torch.Tensor):
        alike = (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
                 and a.stride() == b.stride())
        return alike and (a.is_meta or exact("", a, b) is None)  # a meta tensor holds no data
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and a != a:  # a NaN argument (a refusal's scale)
        return isinstance(b, float) and b != b
    return a == b
