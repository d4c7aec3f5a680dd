"""GPU telemetry around a stress run (NVML through nvidia-ml-py): clocks and their event
reasons, temperature, power, ECC counters, remapped rows and Xid events. A divergence on a
throttling or faulting GPU reads differently from one on a healthy GPU, so the run records
the envelope. A query the GPU or driver does not support is recorded as "not supported"."""

import threading
from contextlib import contextmanager

from stress.core import gpus

SAMPLE_SECONDS = 0.5  # how often the GPUs' utilization is read during a run


def _query(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported and friends: record, never crash
        return f"not supported ({type(exc).__name__})"


def snapshot() -> dict:
    """One reading of every visible GPU, or {"nvml": "<why not>"}."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        return {"nvml": f"not available ({type(exc).__name__})"}
    readings = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        readings.append({
            "index": i,
            "name": _query(nv.nvmlDeviceGetName, h),
            "uuid": _query(lambda h=h: gpus.normal_uuid(nv.nvmlDeviceGetUUID(h))),
            "sm_clock_mhz": _query(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": _query(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "clocks_event_reasons": _query(nv.nvmlDeviceGetCurrentClocksEventReasons, h),
            "temperature_c": _query(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power_w": _query(lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000),
            "ecc_uncorrected": _query(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      nv.NVML_VOLATILE_ECC),
            "ecc_corrected": _query(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                    nv.NVML_VOLATILE_ECC),
            "remapped_rows": _query(lambda h=h: list(nv.nvmlDeviceGetRemappedRows(h))),
        })
    return {"gpus": readings}


def _xid_events(event_set, nv) -> list:
    events = []
    while True:
        try:
            data = nv.nvmlEventSetWait(event_set, 0)
        except Exception:  # noqa: BLE001 - NVMLError_Timeout: nothing (more) happened
            return events
        events.append({"gpu": _query(nv.nvmlDeviceGetIndex, data.device), "xid": data.eventData})


@contextmanager
def envelope(record: dict):
    """Fill ``record`` with readings before and after the block, and the Xid events in between."""
    record["before"] = snapshot()
    event_set = nv = None
    try:
        import pynvml as nv

        event_set = nv.nvmlEventSetCreate()
        for i in range(nv.nvmlDeviceGetCount()):
            nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(i), nv.nvmlEventTypeXidCriticalError,
                                        event_set)
    except Exception as exc:  # noqa: BLE001
        record["xid"] = f"not supported ({type(exc).__name__})"
        event_set = None
    host = _cpu_times()
    sampler = _Sampler(nv) if nv is not None else None
    try:
        yield record
    finally:
        if event_set is not None:
            record["xid"] = _xid_events(event_set, nv)
            _query(nv.nvmlEventSetFree, event_set)
        record["load"] = {"host_busy": _busy_since(host), "gpu_busy": sampler.stop() if sampler else "not sampled"}
        record["after"] = snapshot()


def _cpu_times() -> tuple[float, float] | None:
    """(busy, all) jiffies summed over the host's cores since boot (Linux ``/proc/stat``); None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:8]]  # user nice system idle iowait irq softirq
    except (OSError, ValueError):
        return None
    return sum(fields) - fields[3] - fields[4], sum(fields)


def _busy_since(start: tuple[float, float] | None) -> float | str:
    """The share of the host's core-time busy since ``start`` (every process's, not only the run's)."""
    end = _cpu_times()
    if start is None or end is None or end[1] <= start[1]:
        return "not measured (no /proc/stat)"
    return round((end[0] - start[0]) / (end[1] - start[1]), 3)


class _Sampler:
    """Reads each GPU's utilization (NVML: the share of the last sample period in which a kernel ran) every
    ``SAMPLE_SECONDS`` in a thread of its own; ``stop`` gives each GPU's mean, by NVML index."""

    def __init__(self, nv):
        self.nv, self.sums, self.samples = nv, {}, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specsan-gpu-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            handles = [self.nv.nvmlDeviceGetHandleByIndex(i) for i in range(self.nv.nvmlDeviceGetCount())]
            while not self._stop.wait(SAMPLE_SECONDS):
                for i, h in enumerate(handles):
                    self.sums[i] = self.sums.get(i, 0) + self.nv.nvmlDeviceGetUtilizationRates(h).gpu
                self.samples += 1
        except Exception as exc:  # noqa: BLE001 - NVMLError_NotSupported and friends: record, never crash
            self.sums = f"not supported ({type(exc).__name__})"

    def stop(self) -> dict | str:
        self._stop.set()
        self._thread.join()
        if isinstance(self.sums, str):
            return self.sums
        return {i: round(total / self.samples / 100, 3) for i, total in self.sums.items()} if self.samples else {}


def lines(record: dict) -> list[str]:
    """A short human summary of an envelope for summary.md."""
    out = []
    for phase in ("before", "after"):
        reading = record.get(phase, {})
        if "gpus" not in reading:
            out.append(f"{phase}: {reading.get('nvml', 'no reading')}")
            continue
        for g in reading["gpus"]:
            out.append(f"{phase} GPU {g['index']}: SM {g['sm_clock_mhz']} MHz, reasons {g['clocks_event_reasons']}, "
                       f"{g['temperature_c']} C, {g['power_w']} W, ECC uncorrected {g['ecc_uncorrected']}, "
                       f"remapped rows {g['remapped_rows']}")
    out.append(f"Xid events during the run: {record.get('xid', 'not recorded')}")
    load = record.get("load", {})
    if load:
        host, gpu_busy = load["host_busy"], load["gpu_busy"]
        host = f"{100 * host:.0f}% of the host's core-time busy" if isinstance(host, float) else f"host {host}"
        gpu_busy = ("; ".join(f"GPU {i} running a kernel {100 * v:.0f}% of the time" for i, v in gpu_busy.items())
                    if isinstance(gpu_busy, dict) else f"GPU utilization {gpu_busy}")
        out.append(f"Load during the run: {host}; {gpu_busy or 'no GPU sample'} (NVML, read every "
                   f"{SAMPLE_SECONDS:g} s)")
    return out


def of_gpu(record: dict, uuid: str) -> dict:
    """One GPU's part of an envelope: its ``before`` and ``after`` readings and its ``xid`` events, matched
    by UUID (CUDA and NVML may number the GPUs differently); {} when NVML did not see it."""
    part = {phase: g for phase in ("before", "after") for g in record.get(phase, {}).get("gpus", ())
            if uuid and g.get("uuid") == uuid}
    if part:
        nvml_index = next(iter(part.values()))["index"]
        xid = record.get("xid", "not recorded")
        part["xid"] = [e for e in xid if e["gpu"] == nvml_index] if isinstance(xid, list) else xid
    return part


GPU_COLUMNS = ("SM MHz", "temperature C", "power W", "ECC uncorrected", "Xid events")


def gpu_cells(part: dict) -> list[str]:
    """``of_gpu``'s readings as the summary's cells: ``before -> after``, one value where it did not change."""
    if not part:
        return ["no NVML reading"] + [""] * (len(GPU_COLUMNS) - 1)

    def span(key):
        values = [part[phase][key] for phase in ("before", "after") if phase in part]
        return " -> ".join(dict.fromkeys(str(v) for v in values))

    xid = part["xid"]
    return [span("sm_clock_mhz"), span("temperature_c"), span("power_w"), span("ecc_uncorrected"),
            str(len(xid)) if isinstance(xid, list) else str(xid)]
