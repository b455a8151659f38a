"""Fault kinds the GPU simulator can inject, their defaults and validation.

The defaults follow DCGM's and dcgm-exporter's documented behaviour (docs/simulators-gpu.md):
what a GPU reset clears, what needs a node reboot, and what no repair fixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

FaultKind = Literal[
    "xid",
    "ecc-dbe",
    "ecc-sbe",
    "row-remap-pending",
    "row-remap-failure",
    "gpu-temp",
    "memory-temp",
    "thermal-slowdown",
    "nvlink-errors",
    "pcie-replay",
    "fallen-off-bus",
    "recovery-action",
]
ClearsOn = Literal["reset", "reboot", "never"]

FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
CLEARS_ON: tuple[str, ...] = get_args(ClearsOn)

# Kinds that describe the environment (cooling), not broken silicon: no repair clears
# them, only an explicit `clear`, and health judges them by threshold, not by presence.
ENVIRONMENTAL: frozenset[str] = frozenset({"gpu-temp", "memory-temp", "thermal-slowdown"})

# Thermal thresholds of an H100/A100 SXM board (docs/simulators-gpu.md); real boards differ
# per VBIOS.
GPU_MAX_OPERATING_C = 87
GPU_SLOWDOWN_C = 89
MEMORY_MAX_OPERATING_C = 95

# Clock-event-reason bits (DCGM_CLOCKS_EVENT_REASON_*).
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
HW_SLOWDOWN_BITS = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE

# XIDs whose catalog action is "restart the app" or "ignore": they do not fail a
# `dcgmi diag` run on their own, so the simulated health check passes them.
BENIGN_XIDS: frozenset[int] = frozenset({8, 13, 31, 32, 43, 45, 63, 68, 69, 92, 93, 94, 121, 137})

# XIDs only a node reboot recovers: 79 (off the bus, RESTART_BM) and 151 (RESTART_VM).
REBOOT_XIDS: frozenset[int] = frozenset({79, 151})

# err_msg text dcgm-exporter attaches to the XID gauge, for the XIDs a remediation
# controller meets; others render as "Unknown Error".
XID_MESSAGES: dict[int, str] = {
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- "
    "Most likely to see when running multiple cuda",
    46: "GPU stopped processing",
    48: "Double Bit ECC Error",
    54: "Auxiliary power is not connected to the GPU board",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    110: "Security Fault Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    121: "C2C Link Error",
    136: "ALI Training Fail",
    137: "NVLink Privilege Error",
    140: "Unrecovered ECC Error",
    143: "GPU Initialization Failure",
    151: "Robust Channel Key rotation Error",
    154: "GPU Recovery Action Changed",
    155: "NVLINK: SW Defined Error",
    156: "Resource Retirement Event",
    157: "Resource Retirement Failure",
    158: "GPU Fatal Timeout",
    171: "Uncorrectable DRAM Error",
    172: "Uncorrectable SRAM Error",
}

# nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
# 4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "GPU reset",
    2: "node reboot",
    3: "drain P2P",
    4: "drain and reset",
    5: "recover IMEX domain",
    6: "bus reset",
    7: "system reboot",
}
RECOVERY_RESET_CLASS = frozenset({1, 3, 4})

# Default value when a kind's value is optional (None = the kind takes no value).
_DEFAULT_VALUE: dict[str, int | None] = {
    "ecc-dbe": 1,
    "ecc-sbe": 1,
    "row-remap-pending": 1,
    "row-remap-failure": 1,
    "thermal-slowdown": SW_THERMAL | HW_THERMAL | HW_SLOWDOWN,
    "nvlink-errors": 1,
    "pcie-replay": 60,
    "recovery-action": 1,
    "fallen-off-bus": None,
}
_REQUIRED_VALUE = frozenset({"xid", "gpu-temp", "memory-temp"})


class FaultError(ValueError):
    """An invalid fault request; the message says what a valid one looks like."""


@dataclass(frozen=True)
class Fault:
    """One active fault on one GPU. Immutable: the fleet swaps tuples of these."""

    id: int
    kind: str
    value: int | None
    clears_on: str
    since: float

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "value": self.value,
            "clears_on": self.clears_on,
            "description": describe(self.kind, self.value),
        }


def default_clears_on(kind: str, value: int | None) -> str:
    """What repair clears a fault of this kind when the request does not say."""
    if kind in ENVIRONMENTAL or kind == "row-remap-failure":
        return "never"
    if kind == "xid":
        return "reboot" if value in REBOOT_XIDS else "reset"
    if kind in ("pcie-replay", "fallen-off-bus"):
        # A flaky link or a GPU gone from PCIe needs the bus re-trained: node reboot.
        return "reboot"
    if kind == "recovery-action":
        return "reset" if value in RECOVERY_RESET_CLASS or value == 0 else "reboot"
    return "reset"


def _int_value(kind: str, value: object) -> int:
    # bool is an int subclass; `true` in JSON is never a meaningful XID or count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultError(f"fault {kind!r}: value must be an integer, got {value!r}")
    return value


def validate(kind: object, value: object, clears_on: object) -> tuple[str, int | None, str]:
    """Check a fault request; return (kind, value, clears_on) with defaults filled in."""
    if kind not in FAULT_KINDS:
        raise FaultError(f"unknown fault kind {kind!r}; valid kinds: {', '.join(FAULT_KINDS)}")
    k = str(kind)
    val: int | None
    if value is None:
        if k in _REQUIRED_VALUE:
            unit = "an XID number" if k == "xid" else "a temperature in °C"
            raise FaultError(f"fault {k!r} needs a value ({unit})")
        val = _DEFAULT_VALUE[k]
    elif k == "fallen-off-bus":
        raise FaultError("fault 'fallen-off-bus' takes no value")
    else:
        val = _int_value(k, value)
        _check_range(k, val)
    if clears_on is None:
        return k, val, default_clears_on(k, val)
    if clears_on not in CLEARS_ON:
        raise FaultError(f"clears_on must be one of {', '.join(CLEARS_ON)}, got {clears_on!r}")
    return k, val, str(clears_on)


def _check_range(kind: str, val: int) -> None:
    if kind == "xid" and val <= 0:
        raise FaultError(f"xid value must be a positive integer, got {val}")
    if kind in ("gpu-temp", "memory-temp") and not 0 <= val <= 150:
        raise FaultError(f"{kind} must be between 0 and 150 °C, got {val}")
    if kind == "thermal-slowdown" and not 0 < val <= 0x7FF:
        raise FaultError(f"thermal-slowdown value is a clock-event bitmask 1..0x7FF, got {val}")
    if kind == "recovery-action" and val not in RECOVERY_ACTIONS:
        raise FaultError(f"recovery-action must be 0..7 (NVML enum), got {val}")
    if kind == "row-remap-failure" and val != 1:
        raise FaultError("row-remap-failure is a flag; its value can only be 1")
    if kind in ("ecc-dbe", "ecc-sbe", "row-remap-pending", "nvlink-errors", "pcie-replay") and (
        val < 1
    ):
        raise FaultError(f"{kind} value is a count and must be >= 1, got {val}")


def xid_message(xid: int) -> str:
    return XID_MESSAGES.get(xid, "Unknown Error")


def describe(kind: str, value: int | None) -> str:
    """Human-readable one-liner, used in health problems and listings."""
    if kind == "xid" and value is not None:
        return f"XID {value} ({xid_message(value)})"
    if kind == "recovery-action" and value is not None:
        return f"driver recovery action {value} ({RECOVERY_ACTIONS[value]})"
    if kind in ("gpu-temp", "memory-temp"):
        return f"{kind} {value} °C"
    if kind == "thermal-slowdown":
        return f"clock event reasons {value:#x}"
    if kind == "fallen-off-bus":
        return "GPU has fallen off the bus (not visible to the driver)"
    return f"{kind} x{value}"


def failing_problem(fault: Fault) -> str | None:
    """What `dcgmi diag -r 2` would report for this fault, or None if it would pass.

    A permanent hardware fault always fails. Environmental faults are judged by
    threshold: only conditions that slow the GPU in hardware fail validation.
    """
    kind, val = fault.kind, fault.value or 0
    if kind == "gpu-temp":
        return (
            f"GPU temperature {val} °C >= slowdown {GPU_SLOWDOWN_C} °C"
            if (val >= GPU_SLOWDOWN_C)
            else None
        )
    if kind == "memory-temp":
        return (
            f"memory temperature {val} °C >= max operating {MEMORY_MAX_OPERATING_C} °C"
            if (val >= MEMORY_MAX_OPERATING_C)
            else None
        )
    if kind == "thermal-slowdown":
        return (
            f"hardware slowdown active (clock event reasons {val:#x})"
            if (val & HW_SLOWDOWN_BITS)
            else None
        )
    text = describe(kind, fault.value)
    if fault.clears_on == "never":
        return f"{text}: persists after repair"
    if kind == "ecc-sbe" or (kind == "xid" and val in BENIGN_XIDS):
        return None
    if kind == "recovery-action" and val in (0, 3):
        return None
    return text
