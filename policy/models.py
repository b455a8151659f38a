"""Domain models shared by the policy, the activities and the workflows.

Pure pydantic, no I/O: safe to import inside the Temporal workflow sandbox.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Action(StrEnum):
    """What a node needs, ordered by severity (see ``SEVERITY``)."""

    NONE = "none"
    APP = "app"
    ALERT = "alert"
    """No node action, but a human should look: a Warning Event and a metric (an XID the
    catalog does not know, or one whose bucket is a human's check)."""
    DIAGNOSE = "diagnose"
    """The GPU needs a deeper diagnostic (``dcgmi diag`` at a higher level) before anyone
    resets it: application XIDs that keep coming back in separate bursts."""
    THERMAL = "thermal"
    RESET = "reset"
    REBOOT = "reboot"
    QUARANTINE = "quarantine"


SEVERITY: dict[Action, int] = {
    Action.NONE: 0,
    Action.APP: 1,
    Action.ALERT: 2,
    Action.DIAGNOSE: 3,
    Action.THERMAL: 4,
    Action.RESET: 5,
    Action.REBOOT: 6,
    Action.QUARANTINE: 7,
}
"""Only the order matters: compare severities, never store or print the numbers."""

NODE_ACTIONS: frozenset[Action] = frozenset(
    {Action.THERMAL, Action.RESET, Action.REBOOT, Action.QUARANTINE}
)
"""Verdicts the detector admits as remediations. The others are reported, not acted on:
``none`` and ``app`` quietly, ``alert`` and ``diagnose`` with a Warning Event and a metric.
``diagnose`` stays report-only until the remediation workflow can run a diagnostics-only
remediation (drain, ``dcgmi diag -r 3``, return or quarantine): admitted today, it would
reset the GPU, which is exactly what it must come before."""

WARNING_ACTIONS: frozenset[Action] = frozenset({Action.ALERT, Action.DIAGNOSE})
"""Findings that raise a Warning Event on the node and count in a metric when they appear."""


def most_severe(actions: list[Action]) -> Action:
    """The most severe of ``actions``; ``none`` for an empty list."""
    return max(actions, key=lambda a: SEVERITY[a], default=Action.NONE)


class XidDetail(BaseModel):
    """What an NVLink5 XID line (144-150) says beyond its number, as the driver prints it:

        NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 08 (0x00000082
        0x00000001 ...)   (one line)

    The unit (NVIDIA's "subcode", in plain text), the driver's fatal/non-fatal word, the link,
    ``intrInfo`` and ``errorStatus`` (the first two registers): what NVIDIA's "XID 144-150
    Decode" sheet keys its resolution on (policy/nvlink5.py). Only the kernel log carries it;
    the exporter's gauge holds the number alone."""

    model_config = ConfigDict(frozen=True)

    xid: int
    unit: str = Field(max_length=64)
    severity: str = Field(default="", max_length=16)
    link: int | None = None
    intr_info: int = Field(ge=0, le=0xFFFFFFFF)
    error_status: int = Field(ge=0, le=0xFFFFFFFF)


class GpuReading(BaseModel):
    """The health-relevant fields of one GPU, as read from one scrape.

    ``None`` means the series was absent: absent is never evidence of a fault.
    """

    model_config = ConfigDict(frozen=True)

    gpu: str
    uuid: str = ""
    serial: str = ""
    """The board serial (dcgm-exporter's ``DCGM_FI_DEV_SERIAL`` label): exporter text."""
    model_name: str = ""
    pci_bus_id: str = ""
    xid: int | None = None
    xid_detail: XidDetail | None = None
    """The kernel-log line behind ``xid`` when it is an NVLink5 XID (144-150); None from an
    exporter, which shows the number only."""
    gpu_temp: float | None = None
    memory_temp: float | None = None
    ecc_dbe_volatile: float | None = None
    ecc_sbe_volatile: float | None = None
    row_remap_pending: float | None = None
    row_remap_failure: float | None = None
    uncorrectable_remapped_rows: float | None = None
    clock_event_reasons: int | None = None
    recovery_action: int | None = None
    xid_counts: dict[int, int] | None = None
    """``DCGM_EXP_XID_ERRORS_COUNT`` (opt-in in dcgm-exporter): XID -> occurrences within the
    exporter's sliding window. Unlike the ``xid`` gauge it shows a repeat of the same XID.
    ``None``: the family is not exported; ``{}``: exported, no XID in the window."""
    # Link counters as the exporter shows them (totals since the driver loaded). A total says
    # nothing alone; the observer turns two readings into the rates below.
    pcie_replay_total: float | None = None
    nvlink_crc_flit_total: float | None = None
    nvlink_crc_data_total: float | None = None
    nvlink_replay_total: float | None = None
    nvlink_recovery_total: float | None = None
    pcie_replays_per_minute: float | None = None
    """PCIe replays per minute between the previous reading and this one (or Prometheus's
    ``rate()`` over its window); ``None`` without two readings or after a counter reset."""
    nvlink_crc_errors_per_second: float | None = None
    """NVLink flow-control plus data CRC errors per second, all links of the GPU."""
    nvlink_errors_per_minute: float | None = None
    """NVLink replay plus recovery errors per minute, all links of the GPU."""


class NodeReadings(BaseModel):
    """Every GPU of one node from one scrape."""

    node: str
    gpus: list[GpuReading] = Field(default_factory=list)
    declared_gpus: int | None = Field(
        default=None, ge=0, le=1024,
        description="How many GPUs the node declares (GPU feature discovery's "
                    "nvidia.com/gpu.count label); None when unknown.")


class Finding(BaseModel):
    """One piece of evidence: which GPU, which signal, which value, which rule."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    uuid: str = ""
    serial: str = ""
    """The GPU's serial as its exporter showed it: a lemon candidate, never proof alone."""
    signal: str
    value: float
    rule: str
    action: Action
    detail: str = ""
    """What the evidence means where the rule id cannot say it all (a decoded NVLink5 XID:
    unit, severity, NVIDIA's resolution); empty otherwise."""


class Verdict(BaseModel):
    """What a node needs and why."""

    node: str
    action: Action = Action.NONE
    findings: list[Finding] = Field(default_factory=list)

    @property
    def summary(self) -> str:
        """One line for humans: the action and the strongest evidence."""
        worst = [f for f in self.findings if f.action == self.action]
        if not worst:
            return f"{self.action.value}"
        first = worst[0]
        more = f" (+{len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
        return f"{self.action.value}: {first.rule} on GPU {first.gpu}{more}"
