"""Worker processes sharing one GPU's memory: each case holds its GPU shared, and a case that ran out
of device memory runs again holding it alone.

A few families build views past 2^31 elements (tens of GB at their peak); when several land on one GPU
at once, one of them can run out of memory through no fault of the kernel. Rather than charge that to
the kernel, its worker waits until the GPU's other cases finish, keeps new ones out, and reruns the
case alone: an out-of-memory verdict then means the case needs more than the whole GPU.

The lock is a pair of ``flock``-ed files per GPU in a folder the parent makes (``SPECSAN_GPU_LOCKS``):
a case takes the gate and then the GPU shared, dropping the gate at once; a rerun takes the gate
exclusively first, so new cases queue behind it instead of starving it. The kernel drops a dead
worker's locks with its process.
"""

import fcntl
import os
from contextlib import contextmanager

ENV = "SPECSAN_GPU_LOCKS"


class GpuShare:
    def __init__(self, directory: str, gpu: int):
        self.gate = open(os.path.join(directory, f"gpu{gpu}.gate"), "a+")
        self.gpu = open(os.path.join(directory, f"gpu{gpu}.lock"), "a+")

    @contextmanager
    def shared(self):
        fcntl.flock(self.gate, fcntl.LOCK_SH)
        fcntl.flock(self.gpu, fcntl.LOCK_SH)
        fcntl.flock(self.gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.gpu, fcntl.LOCK_UN)

    @contextmanager
    def alone(self):
        """The GPU to this worker alone (call it outside ``shared``)."""
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        fcntl.flock(self.gpu, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.gpu, fcntl.LOCK_UN)
            fcntl.flock(self.gate, fcntl.LOCK_UN)


def for_worker(gpu: int) -> GpuShare | None:
    """This worker's share of ``gpu``, when the parent set the lock folder up (pool workers on a GPU)."""
    directory = os.environ.get(ENV)
    return GpuShare(directory, gpu) if directory else None
