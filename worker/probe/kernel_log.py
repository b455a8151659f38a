"""XIDs from the kernel log: the driver prints every XID as

    [ 8123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., GPU has fallen off the bus.

(older drivers leave out ``PCI:``). NVML keeps no XID history, so the kernel log is the only
place a one-shot check can see XIDs that happened before it ran. ``dmesg`` first (the ring
buffer; ``kernel.dmesg_restrict=1`` makes it root-only), then ``journalctl -k -b`` (the whole boot;
root or the ``adm``/``systemd-journal`` groups). Not being allowed to read either is reported, not
fatal: XIDs are one signal among many.

What the driver and the tools around it print, all read here (``parse_kernel_log``):

- the prefix of each format: ``dmesg`` (``[  312.5]``, seconds since boot), ``dmesg -T``
  (``[Sun Dec  6 03:18:17 2026]``), ISO time (``dmesg --time-format iso``, ``journalctl -o
  short-iso``), syslog (``Mar 11 09:42:17 node7 kernel: [ 5000.1] NVRM: ...``, the bracket
  only where the kernel prints it), ``/dev/kmsg`` records (``3,1234,8123456789,-;NVRM: ...``),
  and journald's export and JSON formats (``journalctl -o export`` / ``-o json``: a
  ``MESSAGE`` field with ``__MONOTONIC_TIMESTAMP`` in microseconds);
- NVLink5 XIDs (144-150) with the unit, severity and registers NVIDIA's decode sheet keys on
  (``XidDetail``, decoded by policy/nvlink5.py);
- "GPU has fallen off the bus" with no Xid line, which newer drivers may print alone: XID 79
  for that GPU, as gpud and NVSentinel read it.

A node's kernel log is written by the node. A line is read only when it is whole: one
``NVRM:`` message (two in one line are interleaved writes), a full PCI address (a cut one
could name another GPU), and the comma the driver prints after the XID number (a line cut
inside the number would read as another XID). Identical lines (a log forwarded twice, a
message repeated a million times) count once, and at most ``MAX_EVENTS`` XIDs are kept.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from policy.models import XidDetail
from worker.probe.common import PciKey, ProbeIssue, Runner, format_pci, pci_key

SOURCE = "xid:kernel-log"
KERNEL_LOG_TIMEOUT_S = 15.0
MAX_LINE_CHARS = 4096
"""The kernel caps a printk record at 1 KiB (a few more with a prefix); a longer line is not
one the driver wrote."""
MAX_EVENTS = 10_000
"""XIDs kept per log (the latest): far above what escalation counts, bounded for a flood."""
FALLEN_OFF_MERGE_S = 60.0
"""A "fallen off the bus" message this close to an Xid 79 line of the same GPU is that XID."""

KERNEL_LOG_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("dmesg",),
    ("journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"),
)
"""Both print the seconds since boot in brackets at the start of each line."""

Clock = Literal["boot", "wall"]

_PCI = r"(?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_XID_RE = re.compile(rf"NVRM: Xid \({_PCI}\): (?P<xid>\d{{1,5}}),")
# NVLink5: "<xid>, [pid=..., name=..., ]<unit> <Fatal|Nonfatal> XC<n> i<n> Link <nn> (<intrInfo>
# <errorStatus> ...)": the format NVIDIA's catalog gives for WORKFLOW_NVLINK5_ERR.
_NVLINK5_RE = re.compile(
    r"\s*(?:pid=[^,]{0,64}, name=[^,]{0,256}, )?"
    r"(?P<unit>[A-Z][A-Z0-9_]{0,40}(?:/[A-Z][A-Z0-9_]{0,40})?)\s+(?P<sev>Fatal|Nonfatal)\s+"
    r"XC[01]\s+i\d{1,3}\s+Link\s+(?P<link>-?\d{1,3})\s+"
    # Both registers whole: followed by a blank or the closing parenthesis, so that a line
    # cut inside the status ("0x00000100" -> "0x0000") does not decode as another status.
    r"\((?P<intr>0x[0-9a-fA-F]{1,8})\s+(?P<status>0x[0-9a-fA-F]{1,8})(?=[\s)])"
)
_FALLEN_RES = (
    # NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.
    re.compile(rf"NVRM: GPU {_PCI}: GPU has fallen off the bus"),
    # NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:2330) installed in this system has
    # fallen off the bus and is not responding to commands.
    re.compile(rf"NVRM: The NVIDIA GPU {_PCI} \(PCI ID: [0-9a-fA-F:]{{4,16}}\) installed in "
               r"this system has fallen off the bus"),
)

# Timestamps a line may start with (before "NVRM:"), most specific first.
_BOOT_TS_RE = re.compile(r"\[\s*(\d{1,10}(?:\.\d{1,9})?)\]")
_CTIME_RE = re.compile(r"\[([A-Z][a-z]{2} [A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d \d{4})\]")
_ISO_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?"
)
_SYSLOG_RE = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d:\d\d:\d\d) ")
_KMSG_RE = re.compile(r"^\d{1,3},\d{1,20},(\d{1,20}),[^;]{0,16};")
_EXPORT_KEY_RE = re.compile(r"^[A-Z_][A-Z0-9_]*=")
_SYSLOG_YEAR = 2000
"""Syslog prefixes carry no year; any leap year keeps Feb 29 and the gaps between lines."""


@dataclass(frozen=True)
class KernelXid:
    """One XID of the log: the GPU's PCI address, the XID, and when it was printed (seconds
    since boot, or since the epoch for a log whose lines carry only wall-clock time)."""

    pci: PciKey
    xid: int
    at_s: float | None = None
    detail: XidDetail | None = None
    """The NVLink5 decode fields (XIDs 144-150) when the line carries them."""
    fallen_off: bool = False
    """From a "GPU has fallen off the bus" message with no Xid line: XID 79."""

    @property
    def bus_id(self) -> str:
        return format_pci(self.pci)


@dataclass(frozen=True)
class _Record:
    message: str
    boot_s: float | None
    wall_s: float | None


@dataclass
class KernelLog:
    """What one kernel log holds: its XIDs, the last time it reaches (on the clock the XIDs
    use), and how many lines were refused as damaged."""

    xids: list[KernelXid]
    last_s: float | None
    damaged: int = 0


def parse_kernel_log(text: str) -> list[KernelXid]:
    """Every XID of the log in the log's order (see the module doc for the formats read)."""
    return read_log(text).xids


def read_xid_log_file(text: str) -> tuple[list[KernelXid], float | None]:
    """The XIDs of a saved kernel log (``--xid-log``) and its latest timestamp: the time the
    log reaches, against which the app-XID escalation window is counted."""
    log = read_log(text)
    return log.xids, log.last_s


def read_log(text: str) -> KernelLog:
    records = list(_records(text))
    # One clock for the whole log: boot time where any line has it (dmesg, kern.log with the
    # kernel's bracket), else wall-clock time. Mixing them would order lines wrongly.
    clock: Clock = "boot" if any(r.boot_s is not None for r in records) else "wall"

    def at(record: _Record) -> float | None:
        return record.boot_s if clock == "boot" else record.wall_s

    stamps = [t for t in map(at, records) if t is not None]
    found: list[KernelXid] = []
    seen: set[tuple[PciKey, int, float | None, XidDetail | None, bool]] = set()
    damaged = 0
    for record in records:
        message = record.message
        if "NVRM" not in message:
            continue
        event, bad = _parse_message(message, at(record))
        damaged += bad
        if event is None:
            continue
        key = (event.pci, event.xid, event.at_s, event.detail, event.fallen_off)
        if key in seen:
            continue
        seen.add(key)
        found.append(event)
    xid_79 = [x for x in found if x.xid == 79 and not x.fallen_off]
    found = [x for x in found if not (x.fallen_off and _has_xid_79(xid_79, x))]
    return KernelLog(xids=found[-MAX_EVENTS:], last_s=max(stamps) if stamps else None,
                     damaged=damaged)


def _has_xid_79(found: list[KernelXid], fallen: KernelXid) -> bool:
    for x in found:
        if x.pci != fallen.pci:
            continue
        if x.at_s is None or fallen.at_s is None:
            return True
        if abs(x.at_s - fallen.at_s) <= FALLEN_OFF_MERGE_S:
            return True
    return False


def _parse_message(message: str, at_s: float | None) -> tuple[KernelXid | None, int]:
    """The XID of one message, and 1 when it was refused as damaged (0 otherwise)."""
    if len(message) > MAX_LINE_CHARS or message.count("NVRM:") > 1:
        return None, 1 if "NVRM: Xid" in message or "fallen off the bus" in message else 0
    match = _XID_RE.search(message)
    if match is not None:
        pci = pci_key(match["pci"])
        if pci is None:
            return None, 1
        xid = int(match["xid"])
        detail = None
        if 144 <= xid <= 150:
            ext = _NVLINK5_RE.match(message, match.end())
            if ext is not None:
                detail = XidDetail(
                    xid=xid, unit=ext["unit"], severity=ext["sev"].lower(),
                    link=int(ext["link"]), intr_info=int(ext["intr"], 16),
                    error_status=int(ext["status"], 16))
        return KernelXid(pci=pci, xid=xid, at_s=at_s, detail=detail), 0
    if "NVRM: Xid" in message:
        return None, 1  # cut before the comma after the number, or a garbled address
    for pattern in _FALLEN_RES:
        fell = pattern.search(message)
        if fell is not None:
            pci = pci_key(fell["pci"])
            if pci is None:
                return None, 1
            return KernelXid(pci=pci, xid=79, at_s=at_s, fallen_off=True), 0
    return None, 0


# ------------------------------------------------------------------------------- formats
def _records(text: str) -> Iterator[_Record]:
    lines = text.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if _EXPORT_KEY_RE.match(first) and not first.startswith("MESSAGE=NVRM"):
        yield from _export_records(lines)
        return
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("{"):
            record = _json_record(line)
            if record is not None:
                yield record
            continue
        yield _line_record(line)


def _export_records(lines: list[str]) -> Iterator[_Record]:
    """``journalctl -o export``: KEY=VALUE lines, records separated by an empty line. Binary
    fields (a name line, then a length and raw bytes) are skipped: MESSAGE is text for NVRM."""
    fields: dict[str, str] = {}
    for line in [*lines, ""]:
        if line:
            key, eq, value = line.partition("=")
            if eq and _EXPORT_KEY_RE.match(line):
                fields.setdefault(key, value)
            continue
        if "MESSAGE" in fields:
            yield _journal_record(fields)
        fields = {}


def _json_record(line: str) -> _Record | None:
    """``journalctl -o json``: one object per line."""
    if len(line) > 4 * MAX_LINE_CHARS:
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("MESSAGE"), str):
        return None
    return _journal_record({k: v for k, v in data.items() if isinstance(v, str)})


def _journal_record(fields: dict[str, str]) -> _Record:
    def micros(name: str) -> float | None:
        raw = fields.get(name, "")
        return int(raw) / 1e6 if raw.isascii() and raw.isdigit() and len(raw) < 20 else None

    boot = micros("_SOURCE_MONOTONIC_TIMESTAMP")
    if boot is None:
        boot = micros("__MONOTONIC_TIMESTAMP")
    return _Record(fields["MESSAGE"], boot, micros("__REALTIME_TIMESTAMP"))


def _line_record(line: str) -> _Record:
    kmsg = _KMSG_RE.match(line)
    if kmsg is not None:
        return _Record(line[kmsg.end():], int(kmsg[1]) / 1e6, None)
    cut = line.find("NVRM")
    prefix = line if cut < 0 else line[:cut]
    boot_s: float | None = None
    boot = _BOOT_TS_RE.search(prefix)
    if boot is not None:
        boot_s = float(boot[1])
    return _Record(line, boot_s, _wall_time(prefix))


def _wall_time(prefix: str) -> float | None:
    """Seconds since the epoch of a wall-clock prefix (ISO, ``dmesg -T``, syslog); None when
    the prefix has none or it does not read as a date."""
    try:
        iso = _ISO_RE.match(prefix)
        if iso is not None:
            day, clock, fraction, zone = iso.groups()
            tz = (zone or "Z").replace("Z", "+00:00")
            if len(tz) == 5:
                tz = f"{tz[:3]}:{tz[3:]}"
            stamp = datetime.fromisoformat(f"{day}T{clock}{tz}").timestamp()
            return stamp + (float(f"0.{fraction}") if fraction else 0.0)
        ctime = _CTIME_RE.search(prefix)
        if ctime is not None:
            text = " ".join(ctime[1].split())
            return datetime.strptime(text, "%a %b %d %H:%M:%S %Y").replace(
                tzinfo=UTC).timestamp()
        syslog = _SYSLOG_RE.match(prefix)
        if syslog is not None:
            month, day, clock = syslog.groups()
            return datetime.strptime(f"{_SYSLOG_YEAR} {month} {day} {clock}",
                                     "%Y %b %d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
    return None


def read_kernel_log(run: Runner) -> tuple[str | None, list[ProbeIssue]]:
    """The kernel log text, or None with why each way of reading it failed (not fatal)."""
    problems: list[str] = []
    for argv in KERNEL_LOG_COMMANDS:
        try:
            done = run(argv, KERNEL_LOG_TIMEOUT_S)
        except FileNotFoundError:
            problems.append(f"{argv[0]}: not installed")
            continue
        except PermissionError as exc:
            problems.append(f"{argv[0]}: {exc}")
            continue
        except subprocess.TimeoutExpired:
            problems.append(f"{argv[0]}: timed out after {KERNEL_LOG_TIMEOUT_S:g} s")
            continue
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout, []
        # A booted kernel always has log lines: empty output (journalctl without permission
        # prints none and exits 0) means we may not read it.
        said = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[0]
        problems.append(f"{argv[0]}: {said} (exit {done.returncode})")
    message = "cannot read the kernel log, XIDs not checked: " + "; ".join(problems)
    return None, [ProbeIssue(SOURCE, message)]
