"""Read the local GPUs from ``nvidia-smi -q -x``, the fallback when NVML's binding is missing.

``-q -x`` rather than ``--query-gpu``: one invalid field name fails a whole ``--query-gpu`` call
and field names differ across driver generations (retired pages vanish on Ampere, remap fields
do not exist before it), while the XML simply omits what a GPU does not have. Elements read per
``<gpu>`` (in document order, which is nvidia-smi's and NVML's index order):

- ``<uuid>``, ``<product_name>``, ``<pci><pci_bus_id>``, ``<mig_mode><current_mig>``;
- ``<temperature><gpu_temp>`` / ``<memory_temp>`` (``45 C``);
- ``<ecc_errors><volatile>``: the sum of ``dram_uncorrectable``, ``sram_uncorrectable_parity``
  and ``sram_uncorrectable_secded`` (or ``sram_uncorrectable``) -- what NVML's total is -- and on
  older drivers ``double_bit/total``; correctable likewise;
- ``<remapped_rows>``: ``remapped_row_unc``, ``remapped_row_pending`` / ``remapped_row_failure``
  (``Yes``/``No``, or ``1``/``0`` on some drivers); absent before Ampere;
- ``<clocks_event_reasons>`` (``<clocks_throttle_reasons>`` on older drivers): each
  ``..._reason_<name>`` ``Active``/``Not Active`` folded into NVML's bitmask;
- ``<gpu_recovery_action>`` (``None``, ``Reset``, ``Reboot``, ``Drain P2P``, ``Drain and
  Reset``...) mapped to NVML's code;
- ``<retired_pages>`` (pre-Ampere): retired counts and ``pending_retirement``.

Values that say "not available" (``N/A``, ``[N/A]``, ``Not Supported``...) are absent; anything
else that is not a number (``Unknown Error``, ``ERR!``, ``GPU requires reset``) on a health field
is a fatal issue: the GPU answered, but not with its health.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET

from policy.models import GpuReading
from worker.probe.common import (
    NVIDIA_SMI_TIMEOUT_S,
    NoDriverError,
    ProbedGpu,
    ProbeIssue,
    ProbeMissing,
    ProbeResult,
    ProbeUnavailable,
    RetiredPages,
    Runner,
    recovery_action_code,
    run_command,
)

SOURCE = "nvidia-smi"

NVIDIA_SMI_NO_DRIVER_CODES = {9, 12}
"""nvidia-smi exit codes: 9 the NVIDIA driver is not loaded, 12 NVML shared library not found."""
NVIDIA_SMI_NO_GPU_CODE = 6
"""nvidia-smi exit code 6: the query found no GPU ("No devices were found")."""

_ABSENT = {
    "",
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "none",
    "requested functionality has been deprecated",
    "not available",
}
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:[a-z%]+(?:\(s\))?)?\s*$", re.I)

CLOCK_REASON_ELEMENTS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}
"""``clocks_event_reason_<name>`` elements and their NVML ``nvmlClocksEventReason*`` bits."""


class _Unreadable(Exception):
    pass


def _text(node: ET.Element | None, path: str) -> str | None:
    """The stripped text at ``path``; None when the element is missing."""
    if node is None:
        return None
    found = node.find(path)
    if found is None:
        return None
    return (found.text or "").strip()


def _number(raw: str | None) -> float | None:
    """``45 C`` -> 45.0; None for missing or N/A; raises ``_Unreadable`` for anything else."""
    if raw is None or raw.lower() in _ABSENT:
        return None
    match = _NUMBER.match(raw)
    if match is None:
        raise _Unreadable(raw)
    return float(match.group(1))


def _flag(raw: str | None) -> float | None:
    """``Yes``/``No`` or ``1``/``0`` -> 1.0/0.0; None for missing or N/A."""
    if raw is None or raw.lower() in _ABSENT:
        return None
    word = raw.lower()
    if word in ("yes", "true", "active"):
        return 1.0
    if word in ("no", "false", "not active"):
        return 0.0
    return _number(raw)


class _GpuParser:
    def __init__(self, node: ET.Element, index: int, issues: list[ProbeIssue]) -> None:
        self.node = node
        self.index = index
        self.issues = issues
        self.where = f"{SOURCE}:gpu {index}"

    def _field(self, what: str, parse: type[float] | None, raw: str | None) -> float | None:
        try:
            return _flag(raw) if parse is None else _number(raw)
        except _Unreadable:
            self.issues.append(ProbeIssue(self.where, f"{what}: {raw!r}", fatal=True))
            return None

    def _sum(self, what: str, volatile: ET.Element | None, names: tuple[str, ...]) -> float | None:
        """Sum the present, available counters among ``names``; None if none is."""
        values = [self._field(what, float, _text(volatile, n)) for n in names]
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    def _ecc(self, uncorrectable: bool) -> float | None:
        volatile = self.node.find("ecc_errors/volatile")
        if volatile is None:
            return None
        kind = "uncorrectable" if uncorrectable else "correctable"
        what = f"volatile {kind} ECC"
        if volatile.find("dram_" + kind) is not None or volatile.find("sram_" + kind) is not None:
            sram: tuple[str, ...] = ("sram_correctable",)
            if uncorrectable:
                split = ("sram_uncorrectable_parity", "sram_uncorrectable_secded")
                has_split = any(volatile.find(n) is not None for n in split)
                sram = split if has_split else ("sram_uncorrectable",)
            return self._sum(what, volatile, ("dram_" + kind, *sram))
        # Drivers before r525 (and Volta): <single_bit>/<double_bit> with a <total>.
        return self._field(
            what,
            float,
            _text(volatile, "double_bit/total" if uncorrectable else "single_bit/total"),
        )

    def _clock_reasons(self) -> int | None:
        block = self.node.find("clocks_event_reasons")
        prefix = "clocks_event_reason_"
        if block is None:
            block = self.node.find("clocks_throttle_reasons")
            prefix = "clocks_throttle_reason_"
        if block is None:
            return None
        mask = 0
        seen = False
        for name, bit in CLOCK_REASON_ELEMENTS.items():
            active = self._field(f"clock reason {name}", None, _text(block, prefix + name))
            if active is None:
                continue
            seen = True
            if active:
                mask |= bit
        return mask if seen else None

    def _recovery_action(self) -> int | None:
        raw = _text(self.node, "gpu_recovery_action")
        if raw is None or raw.lower() in _ABSENT - {"none"}:
            return None
        code = recovery_action_code(raw)
        if code is None:
            self.issues.append(
                ProbeIssue(self.where, f"unknown GPU recovery action {raw!r}", fatal=True)
            )
        return code

    def _retired_pages(self) -> RetiredPages | None:
        block = self.node.find("retired_pages")
        if block is None:
            return None
        sbe = self._field(
            "retired pages", float, _text(block, "multiple_single_bit_retirement/retired_count")
        )
        dbe = self._field(
            "retired pages", float, _text(block, "double_bit_retirement/retired_count")
        )
        pending = self._field("retired pages", None, _text(block, "pending_retirement"))
        if sbe is None and dbe is None and pending is None:
            return None
        return RetiredPages(
            single_bit=None if sbe is None else int(sbe),
            double_bit=None if dbe is None else int(dbe),
            pending=None if pending is None else bool(pending),
        )

    def parse(self) -> ProbedGpu:
        node = self.node
        remap = node.find("remapped_rows")
        mig = (_text(node, "mig_mode/current_mig") or "").lower()
        reading = GpuReading(
            gpu=str(self.index),
            uuid=_text(node, "uuid") or "",
            model_name=_text(node, "product_name") or "",
            pci_bus_id=_text(node, "pci/pci_bus_id") or node.get("id", ""),
            gpu_temp=self._field("GPU temperature", float, _text(node, "temperature/gpu_temp")),
            memory_temp=self._field(
                "memory temperature", float, _text(node, "temperature/memory_temp")
            ),
            ecc_dbe_volatile=self._ecc(uncorrectable=True),
            ecc_sbe_volatile=self._ecc(uncorrectable=False),
            uncorrectable_remapped_rows=self._field(
                "remapped rows", float, _text(remap, "remapped_row_unc")
            ),
            row_remap_pending=self._field(
                "remap pending", None, _text(remap, "remapped_row_pending")
            ),
            row_remap_failure=self._field(
                "remap failure", None, _text(remap, "remapped_row_failure")
            ),
            clock_event_reasons=self._clock_reasons(),
            recovery_action=self._recovery_action(),
        )
        return ProbedGpu(
            reading=reading,
            mig_enabled={"enabled": True, "disabled": False}.get(mig),
            # Read whatever <remapped_rows> says: pre-Ampere GPUs print it as N/A (no row
            # remapper) and keep their retirements in <retired_pages>; on row-remap GPUs the
            # retired-pages values are N/A, which reads as no block at all.
            retired_pages=self._retired_pages(),
        )


def parse_nvidia_smi_xml(text: str) -> ProbeResult:
    """Readings from the text of ``nvidia-smi -q -x``. Raises ``ProbeUnavailable`` when it is
    not that XML, ``NoDriverError`` when it lists no GPU."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ProbeUnavailable(f"nvidia-smi -q -x output is not XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ProbeUnavailable(
            f"nvidia-smi -q -x output has root <{root.tag}>, not <nvidia_smi_log>"
        )
    result = ProbeResult(probe=SOURCE, driver_version=_text(root, "driver_version") or "")
    for index, node in enumerate(root.findall("gpu")):
        result.gpus.append(_GpuParser(node, index, result.issues).parse())
    if not result.gpus:
        raise NoDriverError("nvidia-smi lists no GPU")
    return result


def probe_nvidia_smi(run: Runner = run_command, *, binary: str = "nvidia-smi") -> ProbeResult:
    """Run ``nvidia-smi -q -x`` (``binary``: a name looked up on PATH, or a path) and parse it.
    ``ProbeUnavailable(no_driver=True)`` when it is not installed or says the driver is not
    loaded."""
    try:
        done = run([binary, "-q", "-x"], NVIDIA_SMI_TIMEOUT_S)
    except FileNotFoundError as exc:
        where = "on PATH" if "/" not in binary else "(no such file)"
        raise ProbeMissing(f"{binary} not found {where}") from exc
    except PermissionError as exc:
        raise ProbeUnavailable(f"nvidia-smi cannot be executed: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise ProbeUnavailable(
            f"nvidia-smi -q -x did not finish in {NVIDIA_SMI_TIMEOUT_S:g} s (hung GPU?)"
        ) from exc
    said = (done.stdout.strip() or done.stderr.strip()).splitlines()
    first = said[0] if said else ""
    if done.returncode in NVIDIA_SMI_NO_DRIVER_CODES:
        raise ProbeUnavailable(
            f"nvidia-smi exit {done.returncode}: {first}".rstrip(": "), no_driver=True
        )
    if done.returncode == NVIDIA_SMI_NO_GPU_CODE or "no devices were found" in first.lower():
        raise NoDriverError(f"nvidia-smi: {first or 'no devices were found'}")
    start = done.stdout.find("<?xml")
    if start < 0:
        start = done.stdout.find("<nvidia_smi_log")
    if done.returncode != 0 and start < 0:
        raise ProbeUnavailable(f"nvidia-smi -q -x exit {done.returncode}: {first}".rstrip(": "))
    result = parse_nvidia_smi_xml(done.stdout[max(start, 0) :])
    if done.returncode != 0:
        # e.g. exit 15 with "Unable to determine the device handle for GPU0000:18:00.0: Unknown
        # Error" before the XML of the GPUs it could still read: a GPU is missing from the list.
        complaint = done.stdout[: max(start, 0)].strip() or done.stderr.strip()
        result.issues.append(
            ProbeIssue(
                SOURCE,
                f"exit {done.returncode}: {complaint or 'no message'}".replace("\n", "; "),
                fatal=True,
            )
        )
    return result
