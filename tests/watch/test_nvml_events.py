"""NVML XID events (worker/watch/nvml_events.py) over a fake ``pynvml`` with the real
binding's names: each XID event is reported with its GPU's UUID; a GPU that cannot
register is skipped; the wait's timeout is not an error."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from worker.watch.nvml_events import gpu_names, watch_xids

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
TIMEOUT, NOT_SUPPORTED = 10, 3


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(events: list[tuple[int, int]], stop: threading.Event,
              unsupported: frozenset[int] = frozenset()) -> Any:
    """GPUs 0..2; ``events``: (GPU index, XID) returned by successive waits."""
    queue = list(events)
    freed: list[object] = []

    def wait(_set: object, _ms: int) -> Any:
        if not queue:
            stop.set()
            raise NVMLError(TIMEOUT)
        index, xid = queue.pop(0)
        return SimpleNamespace(device=index, eventData=xid, eventType=XID_EVENT)

    def register(handle: int, _kind: int, _set: object) -> None:
        if handle in unsupported:
            raise NVMLError(NOT_SUPPORTED)

    return SimpleNamespace(
        NVMLError=NVMLError, NVML_ERROR_TIMEOUT=TIMEOUT, nvmlEventTypeXidCriticalError=XID_EVENT,
        nvmlDeviceGetCount=lambda: 3, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:{0x18 + h:02x}:00.0"),
        nvmlEventSetCreate=lambda: "set", nvmlEventSetFree=freed.append,
        nvmlDeviceRegisterEvents=register, nvmlEventSetWait_v2=wait, freed=freed)


def test_each_xid_event_is_reported_with_its_gpus_uuid() -> None:
    stop = threading.Event()
    nvml = fake_nvml([(1, 79), (2, 48)], stop)
    got: list[tuple[str, int, str]] = []
    watch_xids(nvml, lambda *a: got.append(a), stop)
    assert [(u, x) for u, x, _ in got] == [("GPU-1", 79), ("GPU-2", 48)]
    assert nvml.freed == ["set"]


def test_a_gpu_that_cannot_register_is_skipped_not_fatal() -> None:
    stop = threading.Event()
    nvml = fake_nvml([(0, 13)], stop, unsupported=frozenset({1}))
    got: list[Any] = []
    watch_xids(nvml, lambda *a: got.append(a), stop)
    assert [x for _, x, _ in got] == [13]


def test_kernel_lines_name_gpus_by_the_same_uuid() -> None:
    names = gpu_names(fake_nvml([], threading.Event()))
    assert names["00000000:19:00.0".upper()] == "GPU-1"
