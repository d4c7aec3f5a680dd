"""pytest set-up: device choice (before any kernel is imported), options, markers, hypothesis profiles,
a per-test timeout, and one GPU per xdist worker."""

import dataclasses
import os
import sys
import threading
import traceback

import pytest
from hypothesis import HealthCheck, settings

from stress import gpus  # imports no kernel: the device is still to be chosen


def pytest_addoption(parser):
    parser.addoption("--device", choices=("cpu", "cuda"),
                     help="device for kernels (default: cuda when a GPU is visible, else cpu)")
    parser.addoption("--iters", type=int, default=3,
                     help="cases per (check, family) in the registry replay, tests/test_registry.py (a check's "
                          "iteration_share of them, at least one); raise it for a longer soak, e.g. "
                          "`make test ARGS=\"tests/test_registry.py -k block_table.shift --iters 20\"` (default: 3)")
    parser.addoption("--seed", type=int, default=0,
                     help="base seed the registry replay derives each case's seed from; a failing case prints "
                          "the `./specsan repro` line of its own seed (default: 0)")
    parser.addoption("--test-timeout", type=float, default=600.0,
                     help="seconds one test may take before its process is stopped with every thread's stack "
                          "(under xdist the test fails and the worker is replaced); 0 = none (default: 600)")


def _usage_error(argument: str, problem: str, fix: str) -> pytest.UsageError:
    return pytest.UsageError(f"specsan: {argument}: {problem}; {fix}")


def gpu_of_worker(worker: str, count: int) -> int:
    """xdist worker ``gwN`` takes GPU ``N mod count``, so workers spread over the GPUs."""
    return gpus.gpu_of(int(worker.removeprefix("gw")), count)


def _gpus_for_tests(config) -> int:
    """GPUs the tests will run on: the visible ones, unless --device cpu."""
    return 0 if config.getoption("--device") == "cpu" else gpus.count()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` with GPUs: xdist's own number (the cores) rounded down to a multiple of the GPUs, at least
    one per GPU, so each GPU gets the same number of workers. Without a GPU, or with
    PYTEST_XDIST_AUTO_NUM_WORKERS set, xdist decides alone."""
    count = _gpus_for_tests(config)
    if not count or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from xdist import plugin

    return count * max(1, plugin.pytest_xdist_auto_num_workers(config) // count)


def pytest_report_header(config):
    mutant = os.environ.get("SPECSAN_MUTANT")
    lines = [f"specsan: every test runs under mutant {mutant}"] if mutant else []
    count = _gpus_for_tests(config)
    if count:
        import torch

        names = ", ".join(f"{i} {torch.cuda.get_device_name(i)}" for i in range(count))
        lines.append(f"GPUs: {count} ({names}); xdist worker gwN takes GPU N mod {count}")
    return lines or None


def pin_worker_gpu() -> int | None:
    """Put this xdist worker on its GPU (``gpu_of_worker``); the GPU, or None outside xdist or without CUDA."""
    from kernels import runtime

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if runtime.DEVICE != "cuda" or not worker:
        return None
    import torch

    gpu = gpu_of_worker(worker, gpus.count())
    torch.cuda.set_device(gpu)
    return gpu


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
    from kernels import runtime  # noqa: F401 - decides compiled vs interpreted before any kernel exists

    pin_worker_gpu()
    if os.environ.get("SPECSAN_MUTANT"):  # built now: a mutant that cannot be is a usage error (exit 4), never a
        from stress import mutate_ops  # failing test, which would read as a kill
        from stress.core import patches as mutants

        try:
            config.specsan_mutant = mutate_ops.resolve(os.environ["SPECSAN_MUTANT"])
            mutants.validate(config.specsan_mutant)
        except (ValueError, mutants.StaleMutant) as exc:
            raise _usage_error("SPECSAN_MUTANT", str(exc), "give an id that `python -m stress mutate` prints") from None


def pytest_collection_modifyitems(config, items):
    """The tests marked slow first, each group in its own order: xdist's workers (``--dist worksteal``) start on
    the long ones and share the short ones at the end, instead of one worker finishing alone on a long tail."""
    from kernels import runtime

    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
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


@pytest.fixture(scope="session", autouse=True)
def _mutant_under_test(request):
    """SPECSAN_MUTANT=<generated mutant id>: the whole session runs with that one slip swapped in (``stress
    mutate`` runs a check's ``unit_tests`` so against a mutant its families did not kill)."""
    from stress.core import patches as mutants

    with mutants.applied(getattr(request.config, "specsan_mutant", None)):
        yield


@pytest.fixture(scope="session")
def repro_of(request):
    """``repro_of(result)``: the line that reruns a case as this session ran it. Under SPECSAN_MUTANT every
    case ran that mutant, which its task does not name (the session applied it), so the line names it."""
    session = getattr(request.config, "specsan_mutant", None)
    return lambda result: dataclasses.replace(result, mutant=result.mutant or (session and session.name)).repro()


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
