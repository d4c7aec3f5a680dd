"""Guard zones: every tensor a kernel sees sits inside a larger buffer with canary bytes before
and after it, so a write past either end is caught even where no sanitizer runs."""

from dataclasses import dataclass

import torch

CANARY = 0xA5
GUARD_BYTES = 512


@dataclass
class Guarded:
    name: str
    buffer: torch.Tensor  # the whole allocation
    view: torch.Tensor  # what the kernel gets
    pad: int  # elements of canary on each side

    def damage(self) -> str | None:
        raw = self.buffer.view(torch.uint8)
        step = self.buffer.element_size()
        before, after = raw[: self.pad * step], raw[raw.numel() - self.pad * step:]
        bad_before = int((before != CANARY).sum())
        bad_after = int((after != CANARY).sum())
        if not (bad_before or bad_after):
            return None
        return f"{self.name}: guard zone overwritten ({bad_before} byte(s) before, {bad_after} after the tensor)"


def place(name: str, t: torch.Tensor, device: torch.device) -> Guarded:
    """A copy of ``t`` on ``device``, contiguous, between two canary zones."""
    pad = max(1, GUARD_BYTES // t.element_size())
    buffer = torch.empty(t.numel() + 2 * pad, dtype=t.dtype, device=device)
    buffer.view(torch.uint8).fill_(CANARY)
    view = buffer[pad:pad + t.numel()].view(t.shape)
    view.copy_(t)
    return Guarded(name, buffer, view, pad)
