"""NVIDIA's "XID 144-150 Decode" sheet as data: what an NVLink5 XID line asks for.

XIDs 144-150 (NVLink5, Blackwell) are filed under the bucket ``WORKFLOW_NVLINK5_ERR``: the
number alone says nothing, the line must be decoded. The driver prints

    NVRM: Xid (PCI:0000:BB:DD): <xid>, <unit> <Fatal|Nonfatal> <XC0|XC1> <iN> Link <NN>
          (<intrInfo> <errorStatus> ...)      (one line)

and NVIDIA's decode sheet (published with the XID catalog, ``Xid-Catalog.xlsx``, "XID 144-150
Decode" tab) gives, per unit and error status, a resolution: ``IGNORE``, ``RESET_GPU`` or
``XID_154_EVAL`` ("if an XID 154 is seen along with this error, take that action; if not,
restart the application"). NETIR link-down events are keyed on the reason in ``intrInfo``
bits 25:20 instead of the status. ``ROWS`` lists the sheet as read (catalog revision 2025-10);
``decode`` applies it. A line that the sheet does not cover (a unit or status bit it does
not list) is *undecoded*: the caller keeps the catalog's fallback for the XID (a reset), so an
unknown fault never reads as ignorable.

Pure data and pure functions: imported by the Temporal workflow sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from policy.models import Action, XidDetail

DECODE_SOURCE = (
    "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html "
    "(Xid-Catalog.xlsx, sheet \"XID 144-150 Decode\")"
)
NVLINK5_XIDS = range(144, 151)


class Resolution(StrEnum):
    """The sheet's "Data Center Recovery Action" values."""

    IGNORE = "IGNORE"
    RESET_GPU = "RESET_GPU"
    XID_154_EVAL = "XID_154_EVAL"

    @property
    def slug(self) -> str:
        return self.value.lower().replace("_", "-")


RESOLUTION_ORDER = {Resolution.IGNORE: 0, Resolution.XID_154_EVAL: 1, Resolution.RESET_GPU: 2}
"""Several status bits set at once: the strongest resolution among them wins."""


class Row(NamedTuple):
    """One row of the sheet: a unit (both spellings where the driver renamed it in R575) and
    one error-status value, or for NETIR link events one reason code."""

    xid: int
    units: tuple[str, ...]
    key: int
    """``errorStatus`` value (or bit); for ``by_reason`` units ``intrInfo`` bits 25:20."""
    resolution: Resolution
    severity: str
    """As the sheet writes it: ``Non-fatal``, ``Fatal``, ``Link Fatal``."""


_BY_REASON = frozenset({"NETIR_LINK_EVT", "NETIR_LINK_DOWN", "NETIR", "NETIR_INT"})
"""Units the sheet keys on the link-down reason, not on the error status."""
_ANY = -1
"""A ``by_reason`` row that holds for every reason (NETIR_INT)."""

_I, _R, _E = Resolution.IGNORE, Resolution.RESET_GPU, Resolution.XID_154_EVAL
_NF, _F, _LF = "Non-fatal", "Fatal", "Link Fatal"


def _rows(xid: int, units: tuple[str, ...], *entries: tuple[int, Resolution, str]) -> list[Row]:
    return [Row(xid, units, key, res, sev) for key, res, sev in entries]


_SW_STATUS = 0x80000000
"""Bit 31 of the status: a software-reported event, non-fatal and ignorable in every unit."""

ROWS: tuple[Row, ...] = tuple(
    _rows(144, ("SAW_MVB",),
          (0x01, _I, _NF), (0x02, _R, _F), (0x04, _I, _NF), (0x08, _I, _NF), (0x10, _R, _F),
          (0x20, _I, _NF))
    + _rows(145, ("RLW_CTRL",), (_SW_STATUS, _I, _NF))
    + _rows(145, ("RLW_REMAP",),
            (0x01, _E, _NF), (0x02, _E, _NF), (0x04, _E, _NF), (0x08, _E, _NF),
            (0x10, _E, _NF), (0x20, _E, _NF), (0x40, _R, _F), (0x80, _R, _F),
            (0x100, _I, _NF), (0x200, _I, _NF), (_SW_STATUS, _I, _NF))
    + _rows(145, ("RLW_RSPCOL",), (0x01, _I, _NF), (0x02, _R, _F), (_SW_STATUS, _I, _NF))
    # 0x1-0x4 are "Non-fatal*": ignore, unless intrInfo carries the sheet's "action 2" bit
    # (RXPIPE_ACTION2_BITS), which makes them a reset.
    + _rows(145, ("RLW_RXPIPE",),
            (0x01, _I, _NF), (0x02, _I, _NF), (0x04, _I, _NF), (0x08, _I, _NF),
            (_SW_STATUS, _I, _NF))
    + _rows(145, ("RLW_SRC_TRACK",),
            (0x01, _R, _F), (0x02, _I, _NF), (0x04, _E, _NF), (0x08, _E, _NF),
            (0x10, _R, _F), (0x20, _R, _F), (_SW_STATUS, _I, _NF))
    + _rows(145, ("RLW_TAGSTATE",),
            (0x01, _I, _NF), (0x02, _R, _F), (0x10000, _I, _NF), (0x20000, _R, _F),
            (0x100000, _R, _F), (_SW_STATUS, _I, _NF))
    + [row for units in (("TLW_CTRL",), ("TLW_RX", "TLW_RX_PIPE0", "TLW_RX_PIPE1"),
                         ("TLW_TX", "TLW_TX_PIPE0", "TLW_TX_PIPE1"))
       for row in _rows(146, units, (0x01, _I, _NF), (0x02, _I, _NF), (0x04, _R, _F),
                        (_SW_STATUS, _I, _NF))]
    + _rows(147, ("TREX",), (0x01, _I, _NF), (_SW_STATUS, _I, _NF))
    + _rows(148, ("NVLPW_CTRL", "NVLPW"), (_SW_STATUS, _I, _NF))
    + _rows(149, ("NETIR", "NETIR_INT"), (_ANY, _R, _LF))
    + _rows(149, ("NETIR_LINK_EVT", "NETIR_LINK_DOWN"),
            *[(reason, _R, _LF) for reason in (0, 1, 2, 4, 10, 15, 16, 17, 18, 21, 22,
                                               32, 33, 34, 35, 36, 37, 42, 43)],
            (38, _I, _LF), (40, _I, _F))
    + _rows(149, ("NETIR_BER_EVENT",), (0, _I, _NF), (1, _I, _NF), (2, _I, _NF), (3, _I, _NF))
    + _rows(149, ("NETIR_MFDE_EVENT",),
            (1, _R, _F), (3, _I, _NF), (4, _R, _F), (5, _R, _F), (7, _R, _F))
    + _rows(150, ("MSE_DEGRADED",), (0, _R, _F), (0xFFFFFFFF, _R, _F))
    + _rows(150, ("MSE_WATCHDOG",), (0, _R, _F))
)

_VALUE_UNITS = frozenset({"NETIR_BER_EVENT", "NETIR_MFDE_EVENT", "MSE_DEGRADED", "MSE_WATCHDOG"})
"""Units whose status is a value, not a bit mask: only an exact match decodes."""

RXPIPE_ACTION2_BITS = ((0x7F, 0b0000110, 1 << 7), (0x3FF, 0b0011000010, 1 << 10))
"""RLW_RXPIPE "action 2": (unit mask, unit code, flag bit) for drivers >= R575 (the unit in
intrInfo[6:0]) and older ones (intrInfo[9:0]); with the flag set, the resolution is a reset."""

_TABLE: dict[tuple[int, str], dict[int, Row]] = {}
for _row in ROWS:
    for _unit in _row.units:
        _TABLE.setdefault((_row.xid, _unit), {})[_row.key] = _row


def _unit_name(unit: str) -> str:
    return unit.strip().upper().replace("-", "_").replace(" ", "_")


@dataclass(frozen=True)
class Decoded:
    """A decoded NVLink5 line: NVIDIA's resolution and the rows that gave it."""

    detail: XidDetail
    resolution: Resolution
    severity: str
    keys: tuple[int, ...]

    @property
    def unit_slug(self) -> str:
        return _unit_name(self.detail.unit).lower().replace("_", "-")

    @property
    def meaning(self) -> str:
        d = self.detail
        link = f" link {d.link}" if d.link is not None else ""
        keys = ", ".join(f"0x{k:x}" for k in self.keys)
        what = "reason" if any(_unit_name(u) in _BY_REASON for u in d.unit.split("/")) \
            else "status"
        printed = f", driver says {d.severity}" if d.severity else ""
        return (f"XID {d.xid} {d.unit}{link}: {what} {keys} is {self.severity} in NVIDIA's "
                f"144-150 decode, resolution {self.resolution.value}{printed} "
                f"({RESOLUTION_WHY[self.resolution]})")


def decode(detail: XidDetail) -> Decoded | None:
    """NVIDIA's resolution for one NVLink5 line; None when the sheet does not cover it."""
    # A unit the driver renamed may be printed in both spellings, "V1/V2".
    names = [_unit_name(u) for u in detail.unit.split("/")]
    unit = next((u for u in names if (detail.xid, u) in _TABLE), names[0])
    rows = _TABLE.get((detail.xid, unit))
    if rows is None:
        return None
    if unit in _BY_REASON:
        reason = (detail.intr_info >> 20) & 0x3F
        row = rows.get(reason) or rows.get(_ANY)
        if row is None:
            return None
        return Decoded(detail, row.resolution, row.severity, (reason,))
    status = detail.error_status
    exact = rows.get(status)
    if exact is not None:
        matched = [exact]
    elif unit in _VALUE_UNITS or status == 0:
        return None
    else:
        bits = [1 << i for i in range(32) if status >> i & 1]
        if any(bit not in rows for bit in bits):
            return None
        matched = [rows[bit] for bit in bits]
    worst = max(matched, key=lambda r: RESOLUTION_ORDER[r.resolution])
    resolution, severity = worst.resolution, worst.severity
    if unit == "RLW_RXPIPE" and resolution == Resolution.IGNORE and _rxpipe_action2(detail):
        resolution, severity = Resolution.RESET_GPU, "Non-fatal* (action 2)"
    return Decoded(detail, resolution, severity, tuple(r.key for r in matched))


def _rxpipe_action2(detail: XidDetail) -> bool:
    if detail.error_status & ~0x7:
        return False  # action 2 applies to statuses 0x1-0x4 only
    return any(detail.intr_info & mask == code and detail.intr_info & flag
               for mask, code, flag in RXPIPE_ACTION2_BITS)


RESOLUTION_WHY: dict[Resolution, str] = {
    Resolution.IGNORE: "NVIDIA's decode needs no recovery for it: the link or the driver "
                       "already dealt with it",
    Resolution.RESET_GPU: "NVIDIA's decode asks for a GPU reset, which also clears link state",
    Resolution.XID_154_EVAL: "NVIDIA's decode defers to the recovery action XID 154 reports, "
                             "else an application restart",
}
"""Why each resolution acts as it does, said in the finding's detail."""

RESOLUTION_ACTION: dict[Resolution, Action] = {
    Resolution.IGNORE: Action.NONE,
    Resolution.RESET_GPU: Action.RESET,
    # Without a readable XID 154 recovery action the sheet says "restart the application".
    Resolution.XID_154_EVAL: Action.APP,
}
"""What each resolution asks of the node; ``XID_154_EVAL`` follows the driver's recovery
action instead when one is readable (policy/rules.py)."""
