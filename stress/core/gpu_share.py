"""Worker processes sharing one GPU's memory: each case holds its GPU shared, and a case that ran out
of device memory runs again holding it alone.

A few families build views past 2^31 elements (tens of GB at their peak); when several land on one GPU
at once, one of them can run out of memory through no fault of the kernel. Rather than charge that to
the kernel, its worker waits until the GPU's other cases finish, keeps new ones out, and reruns the
case alone: an out-of-memory verdict then means the case needs more than the whole GPU.

The lock is a pair of ``flock``-ed files per GPU in a folder the parent makes (``stress.core.workers``):
a case takes the gate and then the GPU shared, dropping the gate at once; a rerun takes the gate
exclusively first, so new cases queue behind it instead of starving it. The kernel drops a dead
worker's locks with its process.

A rerun alone waits for every case running beside it and holds every new one back, so it costs the
whole GPU; big cases had better not collide in the first place. A family spreading views past 2^31
elements runs its layouts one after another (``stress.core.cases.plan``), so the workers pick them up
together: five of 8.6 to 17 GB each outgrow an 80 GB GPU. A case whose guarded copies outgrow a
worker's share of the GPU's memory therefore first takes ``room`` for them in the GPU's budget for big
cases: a quarter of its memory, since the workers' shares take half (what each keeps cached, its small
cases) and a case needs more than its guarded copies (its outputs, the reference's copies, scratch). It
waits while the big cases already running leave too little; a case bigger than the whole budget waits
until no other big case runs.
"""

import fcntl
import json
import os
import time
from contextlib import contextmanager

POLL_S = 0.005  # how often a big case waiting for room looks again


def worker_share(memory: int, sharing: int) -> int:
    """A worker's share of a GPU of ``memory`` bytes that ``sharing`` workers share: half of it split among them
    (the other half is the budget for big cases and what a case needs beyond its guarded copies)."""
    return memory // (2 * max(1, sharing))


class GpuShare:
    def __init__(self, directory: str, gpu: int, memory: int = 0, sharing: int = 1):
        """``memory``: the GPU's bytes (0: no budget, every case is small); ``sharing``: the workers on it."""
        self.gate = open(os.path.join(directory, f"gpu{gpu}.gate"), "a+")
        self.gpu = open(os.path.join(directory, f"gpu{gpu}.lock"), "a+")
        self.budget = open(os.path.join(directory, f"gpu{gpu}.budget"), "a+")
        self.small = worker_share(memory, sharing)  # a case within it takes no room
        self.capacity = memory // 4

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


    @contextmanager
    def room(self, nbytes: int):
        """``nbytes`` of the budget for big cases held while the block runs; nothing for a small case. Yields the
        seconds spent waiting for it."""
        if not self.capacity or nbytes <= self.small:
            yield 0.0
            return
        start = time.perf_counter()
        while not self._reserve(nbytes):
            time.sleep(POLL_S)
        try:
            yield time.perf_counter() - start
        finally:
            self._reserve(-nbytes)

    def _reserve(self, nbytes: int) -> bool:
        """Adds ``nbytes`` to this process's reservation if the budget has room (a release always does); the
        reservations of processes that died holding one are dropped first."""
        fcntl.flock(self.budget, fcntl.LOCK_EX)
        try:
            self.budget.seek(0)
            held = {int(pid): n for pid, n in _reservations(self.budget.read()).items() if _alive(int(pid))}
            mine = os.getpid()
            if nbytes > 0 and held and sum(held.values()) + nbytes > self.capacity:
                return False
            held[mine] = held.get(mine, 0) + nbytes
            held = {pid: n for pid, n in held.items() if n > 0}
            self.budget.seek(0)
            self.budget.truncate()
            self.budget.write(json.dumps(held))
            self.budget.flush()
            return True
        finally:
            fcntl.flock(self.budget, fcntl.LOCK_UN)


def _reservations(text: str) -> dict:
    """The budget file's reservations; none where a worker killed mid-write left it unreadable (the room it held
    is then lent again, and a case that runs out of memory still runs again alone)."""
    try:
        held = json.loads(text or "{}")
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only whether the process exists
    except ProcessLookupError:
        return False
    return True
