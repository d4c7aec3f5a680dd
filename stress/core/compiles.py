"""Triton compiles in a run: the seconds they cost a case (``timed``), and one compile of each kernel variant
across the workers of a pool (``share``).

A launch shape a process has not compiled yet costs it seconds, where a compiled launch costs microseconds; a
cold run's cost is mostly such first launches, so a case's time names them apart from its launches. Triton
calls ``knobs.runtime.jit_cache_hook`` before such a compile and ``jit_post_compile_hook`` after it; under the
interpreter nothing compiles and neither fires.

Workers run the same checks side by side, so on a cold cache they meet the same new variant at once and each
would compile it. With ``share`` the first takes a lock named after the variant (kernel source hash,
specialization, options) and the others wait for it, then load what it wrote to Triton's cache: the cores
compile each variant once and are free for other variants meanwhile.
"""

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO


@contextmanager
def timed(phases: dict[str, float], name: str = "compile") -> Iterator[None]:
    """Adds the seconds of every compile inside the block to ``phases[name]``; hooks already installed keep
    running (and a cache hook's answer, which may skip the compile, is passed on)."""
    try:
        from triton import knobs
    except ImportError:  # a Triton without knobs: nothing to time
        yield
        return
    runtime = knobs.runtime
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    started: list[float] = []

    def compiling(*args, **kwargs):
        started.append(time.perf_counter())
        return before(*args, **kwargs) if before else None

    def compiled(*args, **kwargs):
        if started:
            phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - started.pop(), 4)
        return after(*args, **kwargs) if after else None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = compiling, compiled
    try:
        yield
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = before, after


_held: list[IO] = []  # the variant locks this process holds: one compile at a time, so at most one


def _variant(fn, key, text: str) -> str:
    """A file name for one compiled variant: the kernel's source hash (a planted bug changes it), its
    specialization and options (``key``) and Triton's description of the launch."""
    jit = getattr(fn, "jit_function", None)
    source = getattr(jit, "cache_key", "") if jit is not None else ""
    name = f"{getattr(fn, 'module', '')}.{getattr(fn, 'name', '')}|{source}|{key}|{text}"
    return hashlib.sha256(name.encode()).hexdigest()[:32] + ".lock"


def release() -> None:
    """Drops the variant lock this process holds: after its compile, or after a compile that raised (the
    post-compile hook never fires then); the end of every case calls it too."""
    while _held:
        handle = _held.pop()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def share(directory: str) -> None:
    """Installs, for this process, the lock that makes one worker compile each variant while the others wait
    (locks in ``directory``, one file per variant; a dead worker's lock goes with its process). Hooks already
    installed keep running, and a cache hook's answer is passed on."""
    try:
        from triton import knobs
    except ImportError:
        return
    os.makedirs(directory, exist_ok=True)
    runtime = knobs.runtime
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def compiling(*args, **kwargs):
        release()  # a lock still held here is from a compile that raised
        handle = open(os.path.join(directory, _variant(kwargs.get("fn"), kwargs.get("key"), kwargs.get("repr", ""))),
                      "a+")
        fcntl.flock(handle, fcntl.LOCK_EX)
        _held.append(handle)
        skip = before(*args, **kwargs) if before else None
        if skip:  # no compile follows, so no post-compile hook either
            release()
        return skip

    def compiled(*args, **kwargs):
        release()
        return after(*args, **kwargs) if after else None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = compiling, compiled
