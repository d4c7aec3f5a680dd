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


class MemoryTraffic:
    """Memory traffic on a side stream: copies of a buffer larger than L2, so the kernel under test
    competes for DRAM bandwidth and L2 while it runs."""

    def __init__(self, device: torch.device, nbytes: int = 256 << 20, depth: int = 2):
        self.stream = torch.cuda.Stream(device=device)
        self.src = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        self.dst = torch.empty_like(self.src)
        self.depth = depth
        self.done = None  # recorded after the last queued copies

    def kick(self) -> None:
        """Queue a few copies on the side stream, unless the last ones still run (the queue never grows);
        they overlap the next launches on the main stream."""
        if self.done is not None and not self.done.query():
            return
        with torch.cuda.stream(self.stream):
            for _ in range(self.depth):
                self.dst.copy_(self.src)
            self.done = torch.cuda.Event()
            self.done.record(self.stream)

    def drain(self) -> None:
        self.stream.synchronize()
