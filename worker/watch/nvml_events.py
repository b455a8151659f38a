"""XID events from NVML (``nvmlEventTypeXidCriticalError``), where the optional
``nvidia-ml-py`` binding and a driver are present: the same XIDs the kernel log shows, with
the GPU's UUID. Takes the ``pynvml`` module as a parameter (tests pass a fake)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger("gpu_remediate.watch")

WAIT_MS = 500


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def gpu_names(nvml: ModuleType) -> dict[str, str]:
    """PCI bus id (NVML's spelling) -> UUID of every GPU; NVML initialised by the caller."""
    names = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        names[_text(nvml.nvmlDeviceGetPciInfo(h).busId).upper()] = _text(
            nvml.nvmlDeviceGetUUID(h))
    return names


def watch_xids(nvml: ModuleType, emit: Callable[[str, int, str], None],
               stop: threading.Event) -> None:
    """Call ``emit(uuid, xid, text)`` for each XID event until ``stop``; NVML initialised by
    the caller. GPUs that cannot register for XID events are skipped (logged)."""
    events = nvml.nvmlEventSetCreate()
    try:
        registered = 0
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except nvml.NVMLError as err:
                log.warning("GPU %d: no NVML XID events (%s); the kernel log still is read",
                            i, err)
        log.info("NVML XID events registered on %d GPUs", registered)
        while not stop.is_set() and registered:
            try:
                data = nvml.nvmlEventSetWait_v2(events, WAIT_MS)
            except nvml.NVMLError as err:
                if getattr(err, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                    continue
                log.warning("NVML event wait failed: %s", err)
                stop.wait(1.0)
                continue
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            xid = int(data.eventData)
            emit(uuid, xid, f"NVML: XID {xid} on {uuid}")
    finally:
        nvml.nvmlEventSetFree(events)
