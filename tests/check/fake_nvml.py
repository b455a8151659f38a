"""A fake ``pynvml`` module: the functions the NVML probe calls, with the real binding's
constants, exception classes and ctypes structures, over a described GPU state."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@dataclass
class FakeGpu:
    """What one GPU would answer. ``None`` for a health value: NVML says Not Supported."""

    uuid: str
    name: str
    bus_id: str
    temp: int | None = 35
    mem_temp: int | None = 40
    dbe: int | None = 0
    sbe: int | None = 0
    remap: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    """(correctable, uncorrectable, pending, failure) as nvmlDeviceGetRemappedRows returns."""
    reasons: int | None = 0x1
    recovery: int | None = 0
    mig: int | None = 0
    retired: tuple[int, int, int] | None = None
    """(single-bit pages, double-bit pages, pending) on pre-Ampere GPUs."""
    lost: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    """Function name -> NVML error code it raises for this GPU."""


@dataclass(frozen=True)
class FakeHandle:
    index: int


class FakeNvml:
    """Module-like: ``probe(FakeNvml([...]))`` behaves as with ``import pynvml``."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: int | None = None,
        driver: str = "570.124.06",
        xid_events: list[tuple[int, int]] | None = None,
        has_recovery_field: bool = True,
    ) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "NVMLError")):
                setattr(self, name, getattr(pynvml, name))
        if not has_recovery_field:
            del self.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.events = list(xid_events or [])
        self.calls: list[str] = []
        self.initialised = 0
        self.registered: list[int] = []

    # -- helpers
    def _gpu(self, handle: FakeHandle, fn: str) -> FakeGpu:
        self.calls.append(fn)
        if self.initialised <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            raise pynvml.NVMLError(gpu.errors[fn])
        return gpu

    @staticmethod
    def _value(value: Any) -> Any:
        if value is None:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return value

    # -- lifecycle / system
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if index >= len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost and "handle" in self.gpus[index].errors:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    # -- identity
    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        domain, bus, rest = gpu.bus_id.split(":")
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = gpu.bus_id[4:].encode()
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest[:2], 16)
        info.pciDeviceId = 0x233010DE
        return info

    # -- health
    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(self._value(self._gpu(handle, "nvmlDeviceGetTemperature").temp))

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, field_ids: list[int]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            values[i].fieldId = fid
            known = {
                pynvml.NVML_FI_DEV_MEMORY_TEMP: (
                    gpu.mem_temp,
                    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                    "uiVal",
                ),
                pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: (
                    gpu.recovery,
                    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                    "uiVal",
                ),
            }
            value, vtype, member = known.get(fid, (None, 0, "dVal"))
            if value is None:
                values[i].nvmlReturn = NOT_SUPPORTED
                continue
            values[i].nvmlReturn = pynvml.NVML_SUCCESS
            values[i].valueType = vtype
            setattr(values[i].value, member, value)
        return values

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        assert counter == pynvml.NVML_VOLATILE_ECC
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return int(self._value(gpu.dbe))
        return int(self._value(gpu.sbe))

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRemappedRows")
        if gpu.mig:  # not supported with MIG instances
            raise pynvml.NVMLError(NOT_SUPPORTED)
        return tuple(self._value(gpu.remap))  # type: ignore[return-value]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return int(self._value(self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons))

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        mode = self._value(gpu.mig)
        return [mode, mode]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeHandle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        return int(self._value(gpu.retired)[2])

    def nvmlDeviceGetRetiredPages(self, handle: FakeHandle, cause: int) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRetiredPages")
        retired = self._value(gpu.retired)
        n = (
            retired[0]
            if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            else retired[1]
        )
        return [0x31C2A8000 + i * 0x1000 for i in range(n)]

    # -- events
    def nvmlEventSetCreate(self) -> object:
        self.calls.append("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, types: int, event_set: object) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        assert types == pynvml.nvmlEventTypeXidCriticalError
        self.registered.append(handle.index)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        self.calls.append("nvmlEventSetWait")
        assert timeout_ms >= 1
        while self.events:
            index, xid = self.events.pop(0)
            if index in self.registered:
                return SimpleNamespace(
                    device=FakeHandle(index),
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=xid,
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.calls.append("nvmlEventSetFree")


# ------------------------------------------------------------------ states of the fixtures
H100 = "NVIDIA H100 80GB HBM3"
H100_BUSES = [
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
]
H100_UUIDS = [
    "GPU-5c2a9f3e-1b7d-4e0a-9c61-2f8d3a7b4e10",
    "GPU-a81e4d27-6c3f-4b92-8e15-7d0c9b2a6f31",
    "GPU-3f9b7c02-84e1-4d6a-b2c7-19e5a0d8c452",
    "GPU-d04c6e81-2a5b-47f9-9d3e-6b1a8c7f0e63",
    "GPU-7e2d1a94-c8b6-4f03-a5e2-3c9f6d1b8a74",
    "GPU-b65f0c38-9d27-4a1e-8f4b-5e2c7a9d0185",
    "GPU-2a8c5e71-f4d9-4b36-9a0c-8d7e1f3b5296",
    "GPU-e9147b5d-3c0a-4e82-b6f9-0a5d2c8e7307",
]


def h100(i: int, **kw: Any) -> FakeGpu:
    base: dict[str, Any] = dict(
        uuid=H100_UUIDS[i],
        name=H100,
        bus_id=H100_BUSES[i],
        temp=31 + (i * 3) % 7,
        mem_temp=38 + (i * 5) % 6,
    )
    base.update(kw)
    return FakeGpu(**base)


def fixture_states() -> Iterator[tuple[str, list[FakeGpu]]]:
    """The GPU state each recorded XML fixture shows, as NVML would answer it."""
    yield "h100x8_healthy.xml", [h100(i) for i in range(8)]
    yield "h100_remap_pending_dbe.xml", [h100(0), h100(1, dbe=2, remap=(0, 1, 1, 0), reasons=0)]
    yield (
        "h100_hot_hw_thermal.xml",
        [
            h100(0, temp=58, mem_temp=61, reasons=0),
            h100(1, temp=91, mem_temp=93, reasons=0x20 | 0x40),
        ],
    )
    a100 = "NVIDIA A100-SXM4-80GB"
    yield (
        "a100_remap_failure.xml",
        [
            FakeGpu(
                uuid="GPU-0c1d7a39-5e84-4b2f-9a60-c3e81f7d2b45",
                name=a100,
                bus_id="00000000:07:00.0",
                temp=34,
                mem_temp=41,
                recovery=None,
            ),
            FakeGpu(
                uuid="GPU-8f42b6d0-1a7c-4e93-b5d8-2e6f0c9a7b13",
                name=a100,
                bus_id="00000000:0F:00.0",
                temp=36,
                mem_temp=44,
                recovery=None,
                remap=(2, 9, 0, 1),
                reasons=0,
            ),
        ],
    )
    yield "h100_mig_na.xml", [h100(0, mig=1, mem_temp=None, recovery=None, reasons=0)]
    v100 = "Tesla V100-SXM2-32GB"
    yield (
        "v100_retired_pages.xml",
        [
            FakeGpu(
                uuid="GPU-1d5e8b20-7c3a-9f41-6e02-b8a4c7d9e315",
                name=v100,
                bus_id="00000000:1A:00.0",
                temp=36,
                mem_temp=34,
                remap=None,
                recovery=None,
                mig=None,
                retired=(0, 0, 0),
            ),
            FakeGpu(
                uuid="GPU-9b02f6c4-3d81-a7e5-1c96-4f0b2e8d7a60",
                name=v100,
                bus_id="00000000:1C:00.0",
                temp=41,
                mem_temp=39,
                dbe=1,
                sbe=4,
                remap=None,
                recovery=None,
                mig=None,
                retired=(2, 1, 1),
                reasons=0,
            ),
        ],
    )
