"""Seconds spent compiling Triton kernels, or loading them from the on-disk cache, while a block runs.

A launch shape a process has not compiled yet costs it seconds, where a compiled launch costs microseconds; a
cold run's cost is mostly such first launches, so a case's time names them apart from its launches. Triton
calls ``knobs.runtime.jit_cache_hook`` before such a compile and ``jit_post_compile_hook`` after it; under the
interpreter nothing compiles and neither fires.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager


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
