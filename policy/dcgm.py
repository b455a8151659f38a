"""The DCGM metric families gpu-remediate reads, in one table.

Each family fills one ``GpuReading`` field (policy/models.py). The exporter parser
(activities/exposition.py) reads the table to pick the lines it keeps, the Prometheus source
(activities/prometheus_source.py) to build one query per way of reading, the counter rates
(activities/counter_rates.py) to turn link totals into rates, and the rules (policy/rules.py)
name their findings' signals from it. A family added here is parsed and queried everywhere;
the field it fills is what a rule then reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

XID = "DCGM_FI_DEV_XID_ERRORS"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
MEMORY_TEMP = "DCGM_FI_DEV_MEMORY_TEMP"
ECC_DBE_VOLATILE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ECC_SBE_VOLATILE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
ROW_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
CLOCK_EVENTS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
CLOCK_THROTTLE = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
RECOVERY_ACTION = "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
NVLINK_CRC_FLIT = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
NVLINK_CRC_DATA = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
NVLINK_REPLAY = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
NVLINK_RECOVERY = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"

Read = Literal["xid", "held", "clock", "last", "counter", "xid-count"]
"""How the Prometheus source reads a family over its window: ``xid`` every raw sample (each
value the gauge took); ``held`` the value held for the thermal hold; ``clock`` every raw
sample, the bits combined (activities/prometheus_source.py, ``ClockMode``); ``last`` the last
value; ``counter`` a link total, read only as a rate (``RATES``); ``xid-count`` the last value
per ``xid`` label."""


@dataclass(frozen=True)
class Family:
    metric: str
    field: str
    """The ``GpuReading`` field a scraped sample fills."""
    read: Read
    why: str
    integral: bool = False
    """A count, a flag, an XID or a bit mask: a value with a fraction (``1e-300`` double-bit
    errors) is a malformed reading, never a fault (activities/exposition.py refuses it)."""


FAMILIES: tuple[Family, ...] = (
    Family(XID, "xid", "xid",
           "The last XID the driver logged, per GPU (docs/xid-policy.md).", integral=True),
    Family(GPU_TEMP, "gpu_temp", "held", "Heat: counts once it lasts the thermal hold."),
    Family(MEMORY_TEMP, "memory_temp", "held", "Heat in HBM: same rule as the GPU."),
    Family(ECC_DBE_VOLATILE, "ecc_dbe_volatile", "last",
           "Double-bit ECC errors since the driver loaded: uncorrectable.", integral=True),
    Family(ECC_SBE_VOLATILE, "ecc_sbe_volatile", "last",
           "Single-bit ECC errors: corrected; carried in the reading, no rule acts on them.",
           integral=True),
    Family(ROW_REMAP_PENDING, "row_remap_pending", "last",
           "A row remap waits for a GPU reset to take effect.", integral=True),
    Family(ROW_REMAP_FAILURE, "row_remap_failure", "last",
           "The GPU ran out of spare rows: the board needs replacing.", integral=True),
    Family(UNCORRECTABLE_REMAPPED_ROWS, "uncorrectable_remapped_rows", "last",
           "Rows remapped for uncorrectable errors: at uncorrectable_remap_limit, a finding.",
           integral=True),
    Family(CLOCK_EVENTS, "clock_event_reasons", "clock",
           "Why the clocks are held down (thermal and power-brake bits).", integral=True),
    Family(CLOCK_THROTTLE, "clock_event_reasons", "clock",
           "The pre-DCGM-3.3 name of the same field; custom counter files still use it.",
           integral=True),
    Family(RECOVERY_ACTION, "recovery_action", "last",
           "The driver's own recovery advice, followed when follow_recovery_action is on.",
           integral=True),
    Family(PCIE_REPLAY, "pcie_replay_total", "counter",
           "PCIe replays since the driver loaded: judged as a rate.", integral=True),
    Family(NVLINK_CRC_FLIT, "nvlink_crc_flit_total", "counter",
           "NVLink flow-control CRC errors since the driver loaded: judged as a rate.",
           integral=True),
    Family(NVLINK_CRC_DATA, "nvlink_crc_data_total", "counter",
           "NVLink data CRC errors since the driver loaded: judged as a rate.", integral=True),
    Family(NVLINK_REPLAY, "nvlink_replay_total", "counter",
           "NVLink replays since the driver loaded: judged as a rate.", integral=True),
    Family(NVLINK_RECOVERY, "nvlink_recovery_total", "counter",
           "NVLink recoveries since the driver loaded: judged as a rate.", integral=True),
    Family(XID_COUNT, "xid_counts", "xid-count",
           "Opt-in exporter family: occurrences of each XID in a sliding window, label xid.",
           integral=True),
)

FIELD_OF: dict[str, str] = {f.metric: f.field for f in FAMILIES}
"""Metric family -> the ``GpuReading`` field it fills."""

INTEGRAL_FIELDS: frozenset[str] = frozenset(f.field for f in FAMILIES if f.integral)
"""``GpuReading`` fields whose every sample must be a whole number."""


def read_as(read: Read) -> tuple[Family, ...]:
    """The families read one way, in table order."""
    return tuple(f for f in FAMILIES if f.read == read)


NVLINK_CRC_SIGNAL = "DCGM_FI_DEV_NVLINK_CRC_ERROR_COUNT_TOTAL"
"""Not an exporter family: the signal of a finding on the flow-control and data CRC rates,
summed."""
NVLINK_ERRORS_SIGNAL = "DCGM_FI_DEV_NVLINK_REPLAY_RECOVERY_ERROR_COUNT_TOTAL"
"""Not an exporter family: the signal of a finding on the replay and recovery rates, summed."""


@dataclass(frozen=True)
class Rate:
    field: str
    """The ``GpuReading`` rate field it fills."""
    families: tuple[str, ...]
    """The counter families summed (every one must be read, or there is no rate)."""
    per_seconds: float
    """60: per minute; 1: per second."""
    rule: Literal["pcie", "nvlink"]
    """The link rule (policy.config.LinkPolicy) that must be on for the rate to be read."""
    signal: str
    """The signal of a finding on this rate."""

    @cached_property
    def totals(self) -> tuple[str, ...]:
        """The ``GpuReading`` total fields summed (worked out once: read per GPU per tick)."""
        return tuple(FIELD_OF[f] for f in self.families)


RATES: tuple[Rate, ...] = (
    Rate("pcie_replays_per_minute", (PCIE_REPLAY,), 60.0, "pcie", PCIE_REPLAY),
    Rate("nvlink_crc_errors_per_second", (NVLINK_CRC_FLIT, NVLINK_CRC_DATA), 1.0, "nvlink",
         NVLINK_CRC_SIGNAL),
    Rate("nvlink_errors_per_minute", (NVLINK_REPLAY, NVLINK_RECOVERY), 60.0, "nvlink",
         NVLINK_ERRORS_SIGNAL),
)
