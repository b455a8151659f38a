"""XIDs from the kernel log: the driver prints every XID as

    [ 8123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid=..., name=..., GPU has fallen off the bus.

(older drivers leave out ``PCI:``). NVML keeps no XID history, so the kernel log is the only
place a one-shot check can see XIDs that happened before it ran. ``dmesg`` first (the ring
buffer; ``kernel.dmesg_restrict=1`` makes it root-only), then ``journalctl -k -b`` (the whole boot;
root or the ``adm``/``systemd-journal`` groups). Not being allowed to read either is reported, not
fatal: XIDs are one signal among many.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from worker.probe.common import PciKey, ProbeIssue, Runner, format_pci, pci_key

SOURCE = "xid:kernel-log"
KERNEL_LOG_TIMEOUT_S = 15.0

KERNEL_LOG_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("dmesg",),
    ("journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"),
)
"""Both print the seconds since boot in brackets at the start of each line."""

# The boot timestamp may follow a syslog prefix (``/var/log/kern.log``: ``Mar 11 09:42:17 node7
# kernel: [ 5000.1] NVRM: ...``); a wall-clock-only line has none.
_XID_RE = re.compile(
    r"^(?:[^\[]*?\[\s*(?P<ts>\d+(?:\.\d+)?)\])?.*?NVRM: Xid "
    r"\((?P<pci>(?:PCI:)?[0-9a-fA-F:.]+)\):\s*(?P<xid>\d+)\b"
)


@dataclass(frozen=True)
class KernelXid:
    """One XID line: the GPU's PCI address, the XID, and seconds since boot when printed."""

    pci: PciKey
    xid: int
    at_s: float | None = None

    @property
    def bus_id(self) -> str:
        return format_pci(self.pci)


def parse_kernel_log(text: str) -> list[KernelXid]:
    """Every ``NVRM: Xid`` line, oldest first."""
    found: list[KernelXid] = []
    for line in text.splitlines():
        if "NVRM: Xid" not in line:
            continue
        match = _XID_RE.match(line)
        if match is None:
            continue
        key = pci_key(match["pci"])
        if key is None:
            continue
        ts = match["ts"]
        found.append(KernelXid(pci=key, xid=int(match["xid"]), at_s=float(ts) if ts else None))
    return found


def read_xid_log_file(text: str) -> tuple[list[KernelXid], float | None]:
    """The XIDs of a saved kernel log (``--xid-log``) and its latest boot timestamp: the time
    the log reaches, against which the app-XID escalation window is counted."""
    found = parse_kernel_log(text)
    stamps = [float(m) for m in _ANY_TS_RE.findall(text)]
    return found, max(stamps) if stamps else None


_ANY_TS_RE = re.compile(r"^[^\[\n]*?\[\s*(\d+(?:\.\d+)?)\]", re.M)


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
