"""Which GPU each worker takes, and what a run records about its GPUs.

Stress workers (pool slots) and xdist workers (``gwN``) take GPU ``index mod count``: consecutive
workers land on different GPUs, so any number of workers covers every GPU and a multiple of the
count gives each the same share. Imports nothing from ``kernels`` (``conftest.py`` uses it before
the device is chosen).
"""

import os

import torch


def cores() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def count() -> int:
    """Visible CUDA devices (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_of(worker_index: int, gpus: int) -> int:
    return worker_index % gpus


def workers_per_gpu(workers: int, gpus: int) -> list[int]:
    """How many of ``workers`` (indices 0..workers-1) take each GPU."""
    return [len(range(gpu, workers, gpus)) for gpu in range(gpus)]


def _uuid(index: int) -> str:
    """The device's UUID in NVML's spelling without its ``GPU-`` prefix, so telemetry can be matched to it
    whatever ``CUDA_VISIBLE_DEVICES`` renumbered."""
    try:
        return normal_uuid(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError):
        return ""


def normal_uuid(value) -> str:
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.strip().lower().removeprefix("gpu-")


def describe(workers: int) -> list[dict]:
    """The run header's GPU list: CUDA index, name, UUID, and how many of the run's workers take it
    (``workers == 0``: the run's own process, on its current GPU)."""
    gpus = count()
    if workers:
        shares = workers_per_gpu(workers, gpus)
    else:
        shares = [int(i == torch.cuda.current_device()) for i in range(gpus)]
    return [{"index": i, "name": torch.cuda.get_device_name(i), "uuid": _uuid(i), "workers": shares[i]}
            for i in range(gpus)]


def line(described: list[dict]) -> str:
    """``describe``'s list for a log line."""
    return "; ".join(f"GPU {g['index']} {g['name']}: {g['workers']} worker(s)" for g in described)
