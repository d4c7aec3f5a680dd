"""Background load on a side stream, so kernels under test share the GPU with other work
(a race that needs a slow warp shows more often when the SMs are contended)."""

import torch


class BackgroundLoad:
    def __init__(self, device: torch.device, size: int = 2048, depth: int = 3):
        self.stream = torch.cuda.Stream(device=device)
        gen = torch.Generator(device=device).manual_seed(0)
        self.a = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=gen)
        self.c = torch.empty_like(self.a)
        self.depth = depth

    def kick(self) -> None:
        """Queue a few matmuls on the side stream; they overlap the next launch on the main stream."""
        with torch.cuda.stream(self.stream):
            for _ in range(self.depth):
                torch.mm(self.a, self.a, out=self.c)

    def drain(self) -> None:
        self.stream.synchronize()
