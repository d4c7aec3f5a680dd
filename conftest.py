"""pytest set-up: device choice (before any kernel is imported), options, markers, hypothesis profiles,
a per-test timeout, and one GPU per xdist worker."""

import os
import sys
import threading
import traceback

import pytest
from hypothesis import HealthCheck, settings


def pytest_addoption(parser):
    parser.addoption("--device", choices=("cpu", "cuda"),
                     help="device for kernels (default: cuda when a GPU is visible, else cpu)")
    parser.addoption("--iters", type=int, default=3,
                     help="seeds per (check, family) in the registry tests (default: 3)")
    parser.addoption("--seed", type=int, default=0, help="base seed of the registry tests (default: 0)")
    parser.addoption("--test-timeout", type=float, default=600.0,
                     help="seconds one test may take before its process is stopped with every thread's stack "
                          "(under xdist the test fails and the worker is replaced); 0 = none (default: 600)")


def _usage_error(argument: str, problem: str, fix: str) -> pytest.UsageError:
    return pytest.UsageError(f"specsan: {argument}: {problem}; {fix}")


def gpu_of_worker(worker: str, gpus: int) -> int:
    """xdist worker ``gwN`` takes GPU ``N mod gpus``, so workers spread over the GPUs."""
    return int(worker.removeprefix("gw")) % gpus


def pytest_configure(config):
    iters, seed = config.getoption("--iters"), config.getoption("--seed")
    if iters < 1:
        raise _usage_error("--iters", f"must be at least 1, got {iters}", "pass --iters 1 or more")
    if seed < 0:
        raise _usage_error("--seed", f"must be >= 0, got {seed}", "seeds are non-negative")
    if config.getoption("--test-timeout") < 0:
        raise _usage_error("--test-timeout", "must be >= 0", "pass seconds, or 0 for no limit")
    device = config.getoption("--device")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise _usage_error("--device", "cuda asked for, but no CUDA device is visible here",
                               "use --device cpu, or leave --device out to pick what is present")
    if device:
        os.environ["SPECSAN_DEVICE"] = device
    from kernels import runtime  # decides compiled vs interpreted before any kernel exists

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if runtime.DEVICE == "cuda" and worker:
        import torch

        torch.cuda.set_device(gpu_of_worker(worker, torch.cuda.device_count()))


def pytest_collection_modifyitems(config, items):
    from kernels import runtime

    if runtime.DEVICE != "cuda":
        skip = pytest.mark.skip(reason="needs a CUDA device; kernels run under the CPU interpreter here")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def _timed_out(item, limit: float) -> None:
    """A hung kernel never returns to Python, so no exception can end the test: print where the
    test is stuck and end the process (xdist reports the test as failed and starts a new worker)."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    stacks = [f"--- thread {tid}\n" + "".join(traceback.format_stack(frame))
              for tid, frame in sys._current_frames().items() if tid != threading.get_ident()]
    sys.stderr.write(f"\nspecsan: {item.nodeid} ran past --test-timeout={limit:g} s; stopping this test process\n"
                     + "\n".join(stacks))
    sys.stderr.flush()
    os._exit(1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = item.config.getoption("--test-timeout")
    timer = threading.Timer(limit, _timed_out, args=(item, limit)) if limit else None
    if timer:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer:
            timer.cancel()


settings.register_profile("cpu", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("gpu", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "cpu"))


@pytest.fixture(scope="session")
def device():
    from kernels import runtime

    return runtime.device()


@pytest.fixture(scope="session")
def iters(request):
    return request.config.getoption("--iters")


@pytest.fixture(scope="session")
def base_seed(request):
    return request.config.getoption("--seed")
