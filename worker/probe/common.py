"""What a local GPU probe returns, and the small value helpers both probes share.

A probe reads the GPUs of the machine it runs on (through NVML or ``nvidia-smi -q -x``) into
``policy.models.GpuReading`` values, the same shape ``evaluate`` builds from dcgm-exporter, so the
same policy gives the same verdict. ``None`` in a reading means "not reported / not supported":
absent is never evidence of a fault, but a field that *errored* is recorded as a fatal issue so
that a GPU whose health could not be read never passes as healthy.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from policy.models import GpuReading

NVIDIA_SMI_TIMEOUT_S = 60.0
"""``nvidia-smi -q`` walks every GPU; a hung GPU makes it slow, never this slow."""


class NoDriverError(Exception):
    """No NVIDIA driver (or no NVIDIA GPU) on this machine, as opposed to a broken one."""


class ProbeUnavailable(Exception):
    """The probe cannot run here (binding not installed, tool missing, permission denied)."""

    def __init__(self, message: str, *, no_driver: bool = False) -> None:
        super().__init__(message)
        self.no_driver = no_driver


class ProbeMissing(ProbeUnavailable):
    """The probe's program is not there (not on PATH, or no file at the path given)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, no_driver=True)


@dataclass(frozen=True)
class ProbeIssue:
    """Something a probe could not read. ``fatal``: a GPU or health field is unknown, so the
    check is incomplete and must not pass as healthy; otherwise informational (a source that
    was skipped or replaced by another)."""

    source: str
    message: str
    fatal: bool = False


@dataclass(frozen=True)
class RetiredPages:
    """Pre-Ampere dynamic page retirement (Volta and older have no row remapper)."""

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class ProbedGpu:
    """One GPU as probed: the policy reading plus what the policy has no field for."""

    reading: GpuReading
    mig_enabled: bool | None = None
    retired_pages: RetiredPages | None = None


@dataclass
class ProbeResult:
    """Every GPU a probe found, with what it could not read."""

    probe: str
    driver_version: str = ""
    gpus: list[ProbedGpu] = field(default_factory=list)
    issues: list[ProbeIssue] = field(default_factory=list)


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], CommandResult]
"""Runs a command with a timeout. Raises ``FileNotFoundError`` when the program is missing,
``PermissionError`` when it cannot be executed, ``subprocess.TimeoutExpired`` on timeout."""


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """The real ``Runner``: no shell, C locale so the output parses the same everywhere."""
    done = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout_s,
        check=False,
        env={**os.environ, "LC_ALL": "C"},
    )
    return CommandResult(done.returncode, done.stdout, done.stderr)


_PCI_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<device>[0-9a-fA-F]{1,2})(?:\.(?P<function>[0-7]))?$"
)

PciKey = tuple[int, int, int]


def pci_key(bus_id: str) -> PciKey | None:
    """``(domain, bus, device)`` of a PCI bus id in any of NVIDIA's spellings: NVML and
    nvidia-smi print ``00000000:18:00.0``, the kernel log ``PCI:0000:18:00``."""
    match = _PCI_RE.match(bus_id.strip())
    if match is None:
        return None
    return (
        int(match["domain"] or "0", 16),
        int(match["bus"], 16),
        int(match["device"], 16),
    )


def format_pci(key: PciKey) -> str:
    """The NVML spelling of a bus id: ``00000000:18:00.0``."""
    return f"{key[0]:08X}:{key[1]:02X}:{key[2]:02X}.0"


RECOVERY_ACTION_NAMES: dict[str, int] = {
    "none": 0,
    "reset": 1,
    "gpureset": 1,
    "reboot": 2,
    "nodereboot": 2,
    "drainp2p": 3,
    "drainandreset": 4,
    "recoverimexdomain": 5,
    "imexdomainrecovery": 5,
    "busreset": 6,
    "systemreboot": 7,
}
"""``nvmlGpuRecoveryAction_t`` codes by the words nvidia-smi prints for them, normalised to
lower case without spaces, underscores or dashes (``Drain and Reset`` -> ``drainandreset``)."""


def recovery_action_code(text: str) -> int | None:
    """The NVML code of a recovery action as nvidia-smi prints it; None when unknown."""
    word = re.sub(r"[^a-z0-9]", "", text.lower())
    word = word.removeprefix("nvmlgpurecoveryaction")
    if word.isdecimal():
        return int(word)
    return RECOVERY_ACTION_NAMES.get(word)
