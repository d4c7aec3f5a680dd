"""Several GPUs, faked on the CPU (``torch.cuda`` and the NVML reader monkeypatched): stress workers and
xdist workers spread evenly over every GPU, each case records the GPU it ran on, the report's per-GPU
counts add up to the run and carry each GPU's own telemetry, and TP ranks get NCCL only with a GPU each."""

import json
import sys
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import conftest
from kernels import runtime
from stress import tp
from stress.core import gpus, pool, telemetry, workers
from stress.core.cases import Task
from stress.core.types import Result
from stress.report.summary import Report

FAKE_GPUS = 4


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four visible CUDA devices, named and with UUIDs; ``set_device`` calls are recorded, not made."""
    pinned = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: FAKE_GPUS)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Fake GPU {i}")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=f"UUID-{i}", total_memory=140 << 30))
    monkeypatch.setattr(torch.cuda, "set_device", pinned.append)
    return pinned


@pytest.mark.parametrize("cores, per_gpu", [(256, 8), (48, 6), (20, 2), (6, 1)])
def test_stress_workers_default_to_an_even_share_of_every_gpu(fake_gpus, monkeypatch, cores, per_gpu, device):
    monkeypatch.setattr(gpus, "cores", lambda: cores)
    monkeypatch.setenv("SPECSAN_DEVICE", device.type)  # _init_worker sets it; restored after the test
    jobs = workers.default_jobs("cuda")
    assert jobs == FAKE_GPUS * per_gpu
    for slot in range(jobs):
        workers._init_worker(slot, "cuda", torch.get_num_threads())
    assert Counter(fake_gpus) == {gpu: per_gpu for gpu in range(FAKE_GPUS)}
    assert [g["workers"] for g in gpus.describe(jobs)] == [per_gpu] * FAKE_GPUS


def test_a_gpu_worker_that_sees_no_gpu_says_so(monkeypatch, device):
    """Where a worker's CUDA runtime finds no device (a driver or MPS server its parent could use but it cannot),
    its start fails naming the cause, not with arithmetic on a count of zero."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SPECSAN_DEVICE", device.type)  # _init_worker sets it; restored after the test
    with pytest.raises(RuntimeError, match="sees no CUDA device.*--device cpu"):
        workers._init_worker(0, "cuda", torch.get_num_threads())


def test_xdist_workers_take_one_gpu_each_and_auto_fills_the_cores_evenly(fake_gpus, monkeypatch):
    monkeypatch.setattr(runtime, "DEVICE", "cuda")
    for n in range(2 * FAKE_GPUS):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{n}")
        assert conftest.pin_worker_gpu() == n % FAKE_GPUS
    assert fake_gpus == [n % FAKE_GPUS for n in range(2 * FAKE_GPUS)]

    from xdist import plugin

    monkeypatch.setattr(plugin, "pytest_xdist_auto_num_workers", lambda config: 18)  # xdist's count of the cores
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    options = {"--device": None}
    config = SimpleNamespace(getoption=options.get)
    assert conftest.pytest_xdist_auto_num_workers(config) == 16  # rounded down to 4 per GPU
    monkeypatch.setattr(plugin, "pytest_xdist_auto_num_workers", lambda config: 2)
    assert conftest.pytest_xdist_auto_num_workers(config) == FAKE_GPUS  # never a GPU without a worker
    assert "GPUs: 4 (0 Fake GPU 0, 1 Fake GPU 1" in "\n".join(conftest.pytest_report_header(config))
    options["--device"] = "cpu"
    assert conftest.pytest_xdist_auto_num_workers(config) is None  # xdist's own default: one per core


def fake_nvml(temperature: dict, xids: list):
    """An NVML that numbers the GPUs in reverse of CUDA (as ``CUDA_VISIBLE_DEVICES`` can): a handle is
    the NVML index, and NVML index i is CUDA device 3 - i, whose UUID it reports with NVML's prefix."""
    def wait(event_set, timeout_ms):
        if not xids:
            raise TimeoutError("nothing happened")
        return xids.pop()

    return SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: FAKE_GPUS, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetIndex=lambda h: h, nvmlDeviceGetName=lambda h: f"Fake GPU {FAKE_GPUS - 1 - h}",
        nvmlDeviceGetUUID=lambda h: f"GPU-UUID-{FAKE_GPUS - 1 - h}".encode(),
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, nvmlDeviceGetClockInfo=lambda h, clock: 1980,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0,
        NVML_TEMPERATURE_GPU=0, nvmlDeviceGetTemperature=lambda h, sensor: temperature["c"],
        nvmlDeviceGetPowerUsage=lambda h: 120500, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=0,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=1, NVML_VOLATILE_ECC=0, nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 0,
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlEventSetCreate=lambda: "events", nvmlEventTypeXidCriticalError=8,
        nvmlDeviceRegisterEvents=lambda h, kind, events: None, nvmlEventSetWait=wait,
        nvmlEventSetFree=lambda events: None)


def test_per_gpu_counts_add_up_and_carry_each_gpus_own_telemetry(fake_gpus, monkeypatch, tmp_path):
    temperature = {"c": 30}
    xid_on_nvml_0 = [SimpleNamespace(device=0, eventData=79)]  # NVML 0 is CUDA 3
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(temperature, xid_on_nvml_0))
    jobs = 2 * FAKE_GPUS
    header = {"device": "cuda", "cases": 11, "gpus": gpus.describe(jobs)}
    report = Report(str(tmp_path), header)
    with telemetry.envelope(report.telemetry):
        temperature["c"] = 40
        for seed in range(11):
            task = Task("block_table.gather", "padded", seed, None)
            verdict = "fail:divergence" if seed == 4 else "pass"
            outcome = pool.Outcome(task, value=Result(task.check, task.family, seed, "cuda", verdict), slot=seed % jobs)
            if seed == 9:  # a worker that died is charged to its case on its worker's GPU too
                outcome = pool.Outcome(task, failure="died", detail="killed by SIGSEGV", slot=seed % jobs)
            report.add(workers.result_of(outcome, "cuda", 300, True))
        for slot in (1, 5, 2):
            report.add_matrix_case(workers.result_of(pool.Outcome(Task("c", "f", 0, "m"), failure="raised", slot=slot),
                                                    "cuda", 300, True))
    report.close()

    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    cases = [r for r in records if "check" in r]
    assert [r["gpu"] for r in cases] == [seed % jobs % FAKE_GPUS for seed in range(11)]
    (rows,) = [r["gpus"] for r in records if "gpus" in r]
    assert [r["cases"] for r in rows] == [3, 3, 3, 2] and sum(r["cases"] for r in rows) == len(cases)
    assert [(r["passed"], r["failed"]) for r in rows] == [(2, 1), (2, 1), (3, 0), (2, 0)]
    assert [r["matrix_cases"] for r in rows] == [0, 2, 1, 0]
    assert [r["telemetry"]["after"]["index"] for r in rows] == [3, 2, 1, 0]
    assert [r["telemetry"]["after"]["name"] for r in rows] == [g["name"] for g in header["gpus"]]
    assert [r["telemetry"]["xid"] for r in rows] == [[], [], [], [{"gpu": 0, "xid": 79}]]
    summary = (tmp_path / "summary.md").read_text()
    assert "| 3 | Fake GPU 3 | 2 | 2 | 2 | 0 | 0 | 0.00 | 0 | 1980 | 30 -> 40 | 120.5 | 0 | 1 |" in summary
    assert "uuid-0" not in summary.split("## GPUs")[0]  # the header line leaves the GPU list to its section


def test_nccl_needs_a_gpu_per_rank(fake_gpus, monkeypatch):
    monkeypatch.setattr(runtime, "DEVICE", "cuda")
    assert [tp.choose_backend("auto", n) for n in (1, 4, 5)] == ["nccl", "nccl", "gloo"]
    assert tp.choose_backend("nccl", 4) == "nccl" and tp.choose_backend("gloo", 2) == "gloo"
    with pytest.raises(ValueError, match=r"^--backend: nccl needs one GPU per rank, but 5 ranks and 4 GPU\(s\) "
                                         r"are visible; pass --ranks 4 \(or fewer\), or --backend gloo$"):
        tp.choose_backend("nccl", 5)
    assert [gpus.gpu_of(rank, FAKE_GPUS) for rank in range(FAKE_GPUS)] == [0, 1, 2, 3]  # rank_main's placement


def test_the_envelope_records_how_busy_the_host_and_each_gpu_were(monkeypatch):
    """Whether a run waits for its host or for its GPUs: the host's busy core-time over the run (/proc/stat) and
    each GPU's sampled utilization (NVML), both read while the run works."""
    busy = {0: 40, 1: 0, 2: 100, 3: 0}
    nvml = fake_nvml({"c": 30}, [])
    nvml.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=busy[h])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(telemetry, "SAMPLE_SECONDS", 0.01)
    record = {}
    with telemetry.envelope(record):
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # the host's own work during the run
            pass
    assert record["load"]["gpu_busy"] == {0: 0.4, 1: 0.0, 2: 1.0, 3: 0.0}
    assert 0 < record["load"]["host_busy"] <= 1
    line = telemetry.lines(record)[-1]
    assert "GPU 0 running a kernel 40% of the time" in line and "of the host's core-time busy" in line
