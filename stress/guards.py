"""Guard zones: every tensor a kernel sees sits inside a larger buffer with canary bytes before
and after it, so a write past either end is caught even where no sanitizer runs."""

from dataclasses import dataclass

import torch

CANARY = 0xA5
GUARD_BYTES = 512
CHUNK = 1 << 28  # bytes compared at a time: a view spread past 2^31 elements leaves gigabytes of gaps


@dataclass
class Guarded:
    name: str
    buffer: torch.Tensor  # the whole allocation
    view: torch.Tensor  # what the kernel gets
    pad: int  # elements of canary on each side

    def damage(self) -> str | None:
        """Canary bytes overwritten outside the view: before it, after it, or in the gaps a strided
        view leaves between its rows (the row padding a kernel must not touch)."""
        dense = self.view.is_contiguous()
        if not dense:  # the view's own bytes read as canary while the buffer is checked, then come back
            values = self.view.clone()
            fill(self.view, canary_like(self.view))
        raw = self.buffer.view(torch.uint8)
        step = self.buffer.element_size()
        first, end = self.pad * step, raw.numel() - self.pad * step
        bad_before = int((raw[:first] != CANARY).sum())
        bad_after = int((raw[end:] != CANARY).sum())
        bad_gaps = 0 if dense else sum(int((raw[i:min(i + CHUNK, end)] != CANARY).sum())
                                       for i in range(first, end, CHUNK))
        if not dense:
            fill(self.view, values)
        if not (bad_before or bad_after or bad_gaps):
            return None
        gaps = f", {bad_gaps} in the gaps between its rows" if bad_gaps else ""
        return f"{self.name}: guard zone overwritten ({bad_before} byte(s) before, {bad_after} after the tensor{gaps})"


def canary_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s shape and dtype whose every byte is CANARY (broadcast, no copy per element)."""
    one = torch.full((t.element_size(),), CANARY, dtype=torch.uint8, device=t.device).view(t.dtype)
    return one.reshape((1,) * t.dim()).expand(t.shape)


def span(t: torch.Tensor) -> int:
    """Elements from a view's first to its last, as its strides lay it out (its storage extent)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def fill(view: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``view.copy_(t)``, also where ``view`` broadcasts (a stride-0 dimension: rows sharing memory, which
    copy_ refuses): such a dimension's one row is written once, from ``t``'s first (they are all equal)."""
    target, source = view, t
    for dim in range(view.dim()):
        if view.stride(dim) == 0 and view.shape[dim] > 1:
            target, source = target.narrow(dim, 0, 1), source.narrow(dim, 0, 1)
    target.copy_(source)
    return view


def place(name: str, t: torch.Tensor, device: torch.device) -> Guarded:
    """A copy of ``t`` on ``device`` between two canary zones, in ``t``'s layout: a contiguous tensor
    stays contiguous, a strided view (row-padded, every other row) keeps its strides, and the bytes
    its rows skip hold canaries too. Launchers accept such views, so the runner must not hide them."""
    pad = max(1, GUARD_BYTES // t.element_size())
    dense = t.is_contiguous()
    extent = t.numel() if dense else span(t)
    buffer = torch.empty(extent + 2 * pad, dtype=t.dtype, device=device)
    buffer.view(torch.uint8).fill_(CANARY)
    view = buffer[pad:pad + t.numel()].view(t.shape) if dense else buffer.as_strided(t.shape, t.stride(), pad)
    fill(view, t)
    return Guarded(name, buffer, view, pad)
