"""Read the local GPUs through NVML with NVIDIA's official binding, ``nvidia-ml-py``.

The binding (import name ``pynvml``) is the optional ``gpu`` extra, so it is imported lazily and
only here; everything takes the module as a parameter, so tests inject a fake with the same
names. Per GPU it reads what dcgm-exporter would export for the policy:

- temperature: ``nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)``; HBM temperature and the
  driver's recovery action through ``nvmlDeviceGetFieldValues`` (``NVML_FI_DEV_MEMORY_TEMP``,
  ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` when the binding has it);
- volatile ECC: ``nvmlDeviceGetTotalEccErrors(h, UNCORRECTED|CORRECTED, NVML_VOLATILE_ECC)``;
- row remapping: ``nvmlDeviceGetRemappedRows(h)`` -> (correctable, uncorrectable, pending,
  failure); not supported before Ampere nor on MIG GPUs with active instances;
- clock-event reasons: ``nvmlDeviceGetCurrentClocksEventReasons`` (the deprecated
  ``...ClocksThrottleReasons`` on bindings without it);
- pre-Ampere page retirement: ``nvmlDeviceGetRetiredPages`` / ``...PendingStatus``.

"Not supported" is absent data; any other NVML error on a health field is a fatal issue.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from types import ModuleType, TracebackType
from typing import Any

from policy.models import GpuReading
from worker.probe.common import (
    NoDriverError,
    ProbedGpu,
    ProbeIssue,
    ProbeResult,
    ProbeUnavailable,
    RetiredPages,
)

SOURCE = "nvml"


def load_pynvml() -> ModuleType | None:
    """The ``pynvml`` module of nvidia-ml-py, or None when the ``gpu`` extra is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class _GpuLost(Exception):
    pass


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class NvmlSession:
    """NVML between ``nvmlInit`` and ``nvmlShutdown``: ``with NvmlSession(pynvml) as s: ...``.

    ``__enter__`` raises ``ProbeUnavailable`` (``no_driver`` set when the library or the kernel
    driver is missing) and ``NoDriverError`` when the driver is there but sees no GPU.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._handles: list[tuple[str, Any]] = []
        self._issues: list[ProbeIssue] = []

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> NvmlSession:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            no_driver = exc.value in self._codes(
                "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED"
            )
            raise ProbeUnavailable(f"NVML init failed: {exc}", no_driver=no_driver) from exc
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()

    def _codes(self, *names: str) -> set[int]:
        return {getattr(self.nvml, n) for n in names if hasattr(self.nvml, n)}

    # ------------------------------------------------------------------ calls
    def _absent(self, exc: Any) -> bool:
        return exc.value in self._codes("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")

    def _call(
        self, where: str, what: str, names: tuple[str, ...], *args: Any, fatal: bool = True
    ) -> Any:
        """Call the first of ``names`` the binding has; None when absent or unsupported."""
        nvml = self.nvml
        fn = next((getattr(nvml, n) for n in names if hasattr(nvml, n)), None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if self._absent(exc):
                return None
            if exc.value in self._codes("NVML_ERROR_GPU_IS_LOST"):
                raise _GpuLost from exc
            self._issues.append(ProbeIssue(where, f"{what}: {exc}", fatal=fatal))
            return None

    def _field_values(self, where: str, handle: Any) -> dict[int, float | None]:
        nvml = self.nvml
        ids = [nvml.NVML_FI_DEV_MEMORY_TEMP]
        # Added to the binding with driver r565; guard so older bindings still work.
        if hasattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"):
            ids.append(nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
        values = self._call(where, "field values", ("nvmlDeviceGetFieldValues",), handle, ids)
        out: dict[int, float | None] = dict.fromkeys(ids)
        if values is None:
            return out
        members = {
            getattr(nvml, "NVML_VALUE_TYPE_DOUBLE", 0): "dVal",
            getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1): "uiVal",
            getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2): "ulVal",
            getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3): "ullVal",
            getattr(nvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4): "sllVal",
            getattr(nvml, "NVML_VALUE_TYPE_SIGNED_INT", 5): "siVal",
            getattr(nvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6): "usVal",
        }
        for fid, value in zip(ids, values, strict=False):
            ret = int(value.nvmlReturn)
            if ret == getattr(nvml, "NVML_SUCCESS", 0):
                member = members.get(int(value.valueType))
                out[fid] = float(getattr(value.value, member)) if member else None
            elif ret in self._codes("NVML_ERROR_GPU_IS_LOST"):
                raise _GpuLost
            elif ret not in self._codes(
                "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"
            ):
                self._issues.append(ProbeIssue(where, f"field {fid}: NVML error {ret}", fatal=True))
        return out

    # ------------------------------------------------------------------ reading
    def read(self) -> ProbeResult:
        """Every GPU NVML enumerates. Raises ``NoDriverError`` when it enumerates none."""
        nvml = self.nvml
        result = ProbeResult(probe=SOURCE)
        self._issues = result.issues
        self._handles = []
        result.driver_version = _text(
            self._call(SOURCE, "driver version", ("nvmlSystemGetDriverVersion",), fatal=False) or ""
        )
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            raise ProbeUnavailable(f"NVML cannot count GPUs: {exc}") from exc
        if count == 0:
            raise NoDriverError("the NVIDIA driver is loaded but NVML finds no GPU")
        for index in range(count):
            gpu = self._read_gpu(index)
            if gpu is not None:
                result.gpus.append(gpu)
        return result

    def _read_gpu(self, index: int) -> ProbedGpu | None:
        nvml = self.nvml
        where = f"{SOURCE}:gpu {index}"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            lost = exc.value in self._codes("NVML_ERROR_GPU_IS_LOST")
            why = "GPU is lost (fallen off the bus?)" if lost else f"no handle: {exc}"
            self._issues.append(ProbeIssue(where, why, fatal=True))
            return None
        identity = GpuReading(gpu=str(index))
        try:
            uuid = _text(self._call(where, "UUID", ("nvmlDeviceGetUUID",), handle) or "")
            name = _text(self._call(where, "name", ("nvmlDeviceGetName",), handle) or "")
            pci = self._call(where, "PCI info", ("nvmlDeviceGetPciInfo",), handle)
            bus_id = _text(pci.busId) if pci is not None else ""
            identity = GpuReading(gpu=str(index), uuid=uuid, model_name=name, pci_bus_id=bus_id)
            if uuid:
                self._handles.append((uuid, handle))
            return self._read_health(where, handle, identity)
        except _GpuLost:
            self._issues.append(ProbeIssue(where, "GPU is lost (fallen off the bus?)", fatal=True))
            return ProbedGpu(reading=identity)

    def _read_health(self, where: str, handle: Any, identity: GpuReading) -> ProbedGpu:
        nvml = self.nvml
        temp = self._call(
            where,
            "GPU temperature",
            ("nvmlDeviceGetTemperature",),
            handle,
            nvml.NVML_TEMPERATURE_GPU,
        )
        fields = self._field_values(where, handle)
        dbe = self._call(
            where,
            "volatile uncorrectable ECC",
            ("nvmlDeviceGetTotalEccErrors",),
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        sbe = self._call(
            where,
            "volatile correctable ECC",
            ("nvmlDeviceGetTotalEccErrors",),
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        remap = self._call(where, "remapped rows", ("nvmlDeviceGetRemappedRows",), handle)
        reasons = self._call(
            where,
            "clock event reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
            handle,
        )
        mig = self._call(where, "MIG mode", ("nvmlDeviceGetMigMode",), handle, fatal=False)
        mig_enabled = (
            None if mig is None else int(mig[0]) == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)
        )
        reading = identity.model_copy(
            update={
                "gpu_temp": None if temp is None else float(temp),
                "memory_temp": fields.get(nvml.NVML_FI_DEV_MEMORY_TEMP),
                "ecc_dbe_volatile": None if dbe is None else float(dbe),
                "ecc_sbe_volatile": None if sbe is None else float(sbe),
                "uncorrectable_remapped_rows": None if remap is None else float(remap[1]),
                "row_remap_pending": None if remap is None else float(remap[2]),
                "row_remap_failure": None if remap is None else float(remap[3]),
                "clock_event_reasons": None if reasons is None else int(reasons),
                "recovery_action": _int_or_none(
                    fields.get(getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", -1))
                ),
            }
        )
        return ProbedGpu(
            reading=reading,
            mig_enabled=mig_enabled,
            retired_pages=self._retired_pages(where, handle) if remap is None else None,
        )

    def _retired_pages(self, where: str, handle: Any) -> RetiredPages | None:
        nvml = self.nvml
        pending = self._call(
            where,
            "retired pages pending",
            ("nvmlDeviceGetRetiredPagesPendingStatus",),
            handle,
            fatal=False,
        )
        if pending is None:
            return None
        counts: list[int | None] = []
        for cause in ("MULTIPLE_SINGLE_BIT_ECC_ERRORS", "DOUBLE_BIT_ECC_ERROR"):
            pages = self._call(
                where,
                "retired pages",
                ("nvmlDeviceGetRetiredPages",),
                handle,
                getattr(nvml, f"NVML_PAGE_RETIREMENT_CAUSE_{cause}"),
                fatal=False,
            )
            counts.append(None if pages is None else len(pages))
        return RetiredPages(single_bit=counts[0], double_bit=counts[1], pending=bool(pending))

    # ------------------------------------------------------------------ XID events
    def wait_xids(self, seconds: float) -> tuple[list[tuple[str, int]], list[ProbeIssue]]:
        """XIDs the driver reports while we listen: ``[(uuid, xid)]``. NVML keeps no history,
        so only XIDs that happen during these ``seconds`` are seen. Call after ``read``."""
        nvml = self.nvml
        issues: list[ProbeIssue] = []
        found: list[tuple[str, int]] = []
        source = f"{SOURCE}:xid-events"
        xid_type = nvml.nvmlEventTypeXidCriticalError
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            return found, [ProbeIssue(source, f"cannot create an event set: {exc}")]
        try:
            registered = 0
            for uuid, handle in self._handles:
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                    registered += 1
                except nvml.NVMLError as exc:
                    issues.append(ProbeIssue(source, f"{uuid}: cannot register XID events: {exc}"))
            deadline = time.monotonic() + seconds
            while registered and (remaining := deadline - time.monotonic()) > 0:
                try:
                    data = nvml.nvmlEventSetWait(event_set, max(1, int(remaining * 1000)))
                except nvml.NVMLError as exc:
                    if exc.value not in self._codes("NVML_ERROR_TIMEOUT"):
                        issues.append(ProbeIssue(source, f"waiting for events: {exc}"))
                    break
                if int(data.eventType) & xid_type:
                    try:
                        uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
                    except nvml.NVMLError:
                        uuid = ""
                    found.append((uuid, int(data.eventData)))
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)
        return found, issues


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)
