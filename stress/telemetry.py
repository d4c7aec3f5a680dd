"""GPU telemetry around a stress run (NVML through nvidia-ml-py): clocks and their event
reasons, temperature, power, ECC counters, remapped rows and Xid events. A divergence on a
throttling or faulting GPU reads differently from one on a healthy GPU, so the run records
the envelope. A query the GPU or driver does not support is recorded as "not supported"."""

from contextlib import contextmanager


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
    gpus = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        gpus.append({
            "index": i,
            "name": _query(nv.nvmlDeviceGetName, h),
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
    return {"gpus": gpus}


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
    try:
        yield record
    finally:
        if event_set is not None:
            record["xid"] = _xid_events(event_set, nv)
            _query(nv.nvmlEventSetFree, event_set)
        record["after"] = snapshot()


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
    return out
