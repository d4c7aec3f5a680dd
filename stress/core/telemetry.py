"""GPU telemetry around a stress run (NVML through nvidia-ml-py): clocks and their event
reasons, temperature, power, ECC counters, remapped rows and Xid events. A divergence on a
throttling or faulting GPU reads differently from one on a healthy GPU, so the run records
the envelope. A query the GPU or driver does not support is recorded as "not supported"."""

from contextlib import contextmanager

from stress.core import gpus


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
