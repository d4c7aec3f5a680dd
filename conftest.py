"""pytest set-up: device choice (before any kernel is imported), options, markers, hypothesis profiles."""

import os

import pytest
from hypothesis import HealthCheck, settings


def pytest_addoption(parser):
    parser.addoption("--device", choices=("cpu", "cuda"), help="device for kernels (default: cuda when present)")
    parser.addoption("--iters", type=int, default=3, help="seeds per (check, family) in the registry tests")
    parser.addoption("--seed", type=int, default=0, help="base seed of the registry tests")


def pytest_configure(config):
    if config.getoption("--device"):
        os.environ["SPECSAN_DEVICE"] = config.getoption("--device")
    from kernels import runtime  # noqa: F401  - decides compiled vs interpreted before any kernel exists


def pytest_collection_modifyitems(config, items):
    from kernels import runtime

    if runtime.DEVICE != "cuda":
        skip = pytest.mark.skip(reason="needs a CUDA device; kernels run under the CPU interpreter here")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


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
