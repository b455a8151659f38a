"""Tunable knobs of the health policy.

Every model forbids unknown fields so that a typo in the YAML fails at start with the field named
instead of silently running the defaults. No I/O here: loading the YAML is the caller's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from policy.fields import unknown_fields
from policy.models import Action
from policy.xid import DEFAULT_XID_TABLE, RECOVERY_ACTIONS, Bucket, RecoveryAction, XidRule

ClockReason = Literal[
    "gpu_idle",
    "clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
    "display_clocks",
]

CLOCK_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
"""DCGM/NVML clock-event-reason bits (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``)."""


_DEFAULT_THERMAL_REASONS: tuple[ClockReason, ...] = (
    "hw_slowdown",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
)


UNKNOWN_XID_ACTIONS = (Action.ALERT, Action.QUARANTINE)
"""What an XID outside the catalog may do: tell a human, or hold the node for one."""


class _Strict(BaseModel):
    # The policy travels inside workflow inputs: decoded, unknown fields are ignored (a
    # worker of another release wrote them); read from a file, from_mapping refuses them.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ModelThermalLimits(_Strict):
    """Thresholds for one GPU model; unset fields inherit the global ones."""

    gpu_temp_c: float | None = Field(
        default=None, gt=0, description="GPU core temperature (°C) at or above which it is hot."
    )
    memory_temp_c: float | None = Field(
        default=None, gt=0, description="HBM temperature (°C) at or above which it is hot."
    )


class ThermalPolicy(_Strict):
    """When a GPU counts as running hot; a hot node is cordoned, never reset or rebooted."""

    gpu_temp_c: float = Field(
        default=87.0,
        gt=0,
        description="GPU core temperature (°C) at or above which the GPU is hot. 87 is the "
        "Max Operating temperature of H100/H800 SXM5, where SW thermal slowdown begins.",
    )
    memory_temp_c: float = Field(
        default=95.0,
        gt=0,
        description="HBM temperature (°C) at or above which the GPU is hot (Memory Max "
        "Operating of A100/H100).",
    )
    per_model: dict[str, ModelThermalLimits] = Field(
        default_factory=lambda: {
            "A100": ModelThermalLimits(gpu_temp_c=85.0),
            "A800": ModelThermalLimits(gpu_temp_c=85.0),
        },
        description="Overrides keyed by a case-insensitive substring of the modelName label; "
        "the longest matching key wins. Defaults: A100/A800 Max Operating is 85 °C.",
    )
    recovery_margin_c: float = Field(
        default=5.0,
        ge=0,
        description="A cordoned hot node counts as cooled once every GPU is this many °C "
        "below its thresholds, so it does not flap around the threshold.",
    )
    clock_reasons: list[ClockReason] = Field(
        default_factory=lambda: list(_DEFAULT_THERMAL_REASONS),
        description="Clock-event reasons that count as a thermal/power-delivery event. Idle "
        "and power-cap reasons are normal operation and are not listed by default.",
    )

    @property
    def clock_mask(self) -> int:
        """The configured reasons as one bitmask."""
        mask = 0
        for reason in self.clock_reasons:
            mask |= CLOCK_REASON_BITS[reason]
        return mask

    def limits_for(self, model_name: str) -> tuple[float, float]:
        """``(gpu_temp_c, memory_temp_c)`` for a GPU model, per-model overrides applied."""
        gpu, memory = self.gpu_temp_c, self.memory_temp_c
        name = model_name.lower()
        matches = [key for key in self.per_model if key.lower() in name]
        if matches:
            # Longest key wins so "A100 80GB PCIe" can refine "A100".
            limits = self.per_model[max(matches, key=len)]
            if limits.gpu_temp_c is not None:
                gpu = limits.gpu_temp_c
            if limits.memory_temp_c is not None:
                memory = limits.memory_temp_c
        return gpu, memory


class AppXidEscalation(_Strict):
    """Application-class XIDs that keep coming back on one GPU point at the GPU, not the app.

    The XID gauge holds only the last XID, so the caller (the detector) records sightings per
    GPU and passes in how many *bursts* each XID had within ``window_s``: sightings less than
    ``burst_gap`` apart are one burst, so one crashing job that logs the same XID a dozen times
    counts once. Defaults follow NVIDIA NVSentinel's health-events analyzer (3-minute burst gap;
    five bursts of one XID on one GPU in a day; XID 31 already at two, where NVSentinel asks for
    DCGM diagnostics). The escalation asks for a deeper diagnostic, not a reset: a GPU that
    passes ``dcgmi diag -r 3`` has no fault a reset would clear.
    """

    enabled: bool = Field(default=True, description="Escalate repeated application XIDs.")
    threshold: int = Field(
        default=5, ge=1, description="Bursts of one app XID on one GPU within the window."
    )
    per_xid_threshold: dict[int, int] = Field(
        default_factory=lambda: {31: 2},
        description="Per-XID thresholds (bursts) that replace ``threshold``.",
    )
    window_s: float = Field(
        default=86400.0, gt=0, description="Window (seconds) over which the caller counts."
    )
    burst_gap: timedelta = Field(
        default=timedelta(minutes=3),
        description="Sightings of one XID on one GPU closer than this belong to one burst "
        "(seconds or an ISO 8601 duration; 0 counts every sighting).",
    )
    action: Action = Field(
        default=Action.DIAGNOSE,
        description="Action once a threshold is hit: diagnose (a deeper dcgmi diag before any "
        "reset) by default; reset restores the old behaviour.",
    )

    @model_validator(mode="after")
    def _sane_gap_and_action(self) -> AppXidEscalation:
        if self.burst_gap < timedelta(0):
            raise ValueError("burst_gap must not be negative")
        if self.action in (Action.NONE, Action.APP):
            raise ValueError(
                f"action {self.action.value!r} would not escalate; set enabled: false instead"
            )
        return self

    def threshold_for(self, xid: int) -> int:
        return self.per_xid_threshold.get(xid, self.threshold)

    @model_validator(mode="after")
    def _positive_thresholds(self) -> AppXidEscalation:
        bad = {x: n for x, n in self.per_xid_threshold.items() if n < 1}
        if bad:
            raise ValueError(f"per_xid_threshold values must be >= 1, got {bad}")
        return self


LINK_ACTIONS = (Action.ALERT, Action.DIAGNOSE, Action.RESET, Action.REBOOT, Action.QUARANTINE)
"""What a link rule may ask for: heat and application actions do not fit a link fault."""


class LinkPolicy(_Strict):
    """PCIe replays and NVLink errors: link faults that raise no XID until they get worse.

    Off by default: a few replays or CRC errors are normal on healthy links, a rate is only
    known from two readings, and the NVLink error counters are not in dcgm-exporter's stock
    counter file (add ``DCGM_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_TOTAL``
    to it). The thresholds are DCGM's own health-watch limits (dcgm's hardware limits header):
    8 PCIe replays a minute, 100 NVLink CRC errors a second, any NVLink replay or recovery
    error. The default action tells a human (a Warning Event and a metric): a reset does not
    reseat a card or fix a cable.
    """

    pcie_replay_enabled: bool = Field(
        default=False, description="Judge DCGM_FI_DEV_PCIE_REPLAY_COUNTER's rate.")
    pcie_replays_per_minute: float = Field(
        default=8.0, gt=0, description="PCIe replays per minute above which the link is bad.")
    pcie_replay_action: Action = Field(
        default=Action.ALERT, description="alert, diagnose, reset, reboot or quarantine.")
    nvlink_enabled: bool = Field(
        default=False, description="Judge the NVLink error counters' rates.")
    nvlink_crc_errors_per_second: float = Field(
        default=100.0, gt=0,
        description="NVLink CRC (flow-control plus data) errors per second above which the "
                    "GPU's links are bad.")
    nvlink_errors_per_minute: float = Field(
        default=0.0, ge=0,
        description="NVLink replay plus recovery errors per minute above which the links are "
                    "bad (0: any).")
    nvlink_action: Action = Field(
        default=Action.ALERT, description="alert, diagnose, reset, reboot or quarantine.")

    @field_validator("pcie_replay_action", "nvlink_action")
    @classmethod
    def _link_action(cls, action: Action) -> Action:
        if action not in LINK_ACTIONS:
            raise ValueError(f"must be {', '.join(a.value for a in LINK_ACTIONS)}, "
                             f"not {action.value!r}")
        return action


class PolicySettings(_Strict):
    """The whole health policy. ``PolicySettings()`` is the documented default policy."""

    xid_overrides: dict[int, Action] = Field(
        default_factory=dict,
        description="Per-XID actions that replace the catalog's (e.g. {74: reboot} on HGX "
        "boards where a single-GPU reset is not supported).",
    )
    unknown_xid_action: Action = Field(
        default=Action.ALERT,
        description="Action for an XID that is not in the catalog (and for an unknown GPU "
        "recovery-action code): alert (a Warning Event and a metric, the node stays in "
        "service) or quarantine (held for a human's review). Never a reset: nobody knows yet "
        "what the XID needs, and a drain is not free.",
    )
    missing_gpu_action: Action = Field(
        default=Action.REBOOT,
        description="Action when the exporter reports fewer GPUs than the node declares "
        "(GPU feature discovery's nvidia.com/gpu.count): a GPU that fell off the bus, often "
        "without an XID. reboot (a reset cannot reach a GPU the driver lost), quarantine, "
        "alert, or none to turn the rule off.",
    )
    recovery_action_overrides: dict[int, Action] = Field(
        default_factory=dict,
        description="Per-code actions for the driver's GPU recovery action (NVML enum), "
        "replacing the built-in mapping.",
    )
    follow_recovery_action: bool = Field(
        default=True,
        description="Act on DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION even without XID 154 in the "
        "gauge (the gauge keeps only the last XID, so 154 can be overwritten).",
    )
    ecc_dbe_action: Action = Field(
        default=Action.RESET,
        description="Volatile double-bit (uncorrectable) ECC errors > 0; the counter clears on "
        "reset.",
    )
    row_remap_pending_action: Action = Field(
        default=Action.RESET,
        description="A row remap is pending; it only takes effect after a GPU reset.",
    )
    row_remap_failure_action: Action = Field(
        default=Action.QUARANTINE,
        description="A row remap failed: the GPU is an RMA candidate.",
    )
    uncorrectable_remap_limit: int = Field(
        default=512,
        ge=1,
        description="Uncorrectable remapped rows at or above which the GPU has no spares left "
        "(512 is DCGM's hard limit).",
    )
    uncorrectable_remap_limit_action: Action = Field(
        default=Action.QUARANTINE, description="Action once the remap limit is reached."
    )
    thermal: ThermalPolicy = Field(
        default_factory=ThermalPolicy, description="Temperature and clock-event thresholds."
    )
    app_xid_escalation: AppXidEscalation = Field(
        default_factory=AppXidEscalation,
        description="Escalation of application XIDs that repeat on one GPU.",
    )
    links: LinkPolicy = Field(
        default_factory=LinkPolicy,
        description="PCIe replay and NVLink error rates (off by default).",
    )

    @field_validator("missing_gpu_action")
    @classmethod
    def _missing_gpu(cls, action: Action) -> Action:
        allowed = (Action.NONE, Action.ALERT, Action.REBOOT, Action.QUARANTINE)
        if action not in allowed:
            raise ValueError(f"must be {', '.join(a.value for a in allowed)}, "
                             f"not {action.value!r}")
        return action

    @field_validator("unknown_xid_action")
    @classmethod
    def _alert_or_quarantine(cls, action: Action, info: ValidationInfo) -> Action:
        if action == Action.RESET and not (info.context or {}).get("config"):
            # Workflow inputs recorded before unknown XIDs alerted carry "reset": they must
            # still decode after an upgrade. A configuration file may not say it.
            return action
        if action not in UNKNOWN_XID_ACTIONS:
            allowed = " or ".join(a.value for a in UNKNOWN_XID_ACTIONS)
            raise ValueError(f"must be {allowed}, not {action.value!r}")
        return action

    @model_validator(mode="after")
    def _valid_xid_keys(self) -> PolicySettings:
        bad = [x for x in self.xid_overrides if x < 1]
        if bad:
            raise ValueError(f"xid_overrides keys must be XID numbers >= 1, got {bad}")
        return self

    def xid_rule(self, xid: int) -> XidRule | None:
        """The catalog row for ``xid`` with any override applied; None for unknown XIDs."""
        row = DEFAULT_XID_TABLE.get(xid)
        override = self.xid_overrides.get(xid)
        if override is None:
            return row
        if row is None:
            return XidRule(
                xid=xid,
                mnemonic="UNKNOWN",
                bucket=Bucket.NO_BUCKET,
                action=override,
                why="Set by configuration.",
            )
        return row.model_copy(update={"action": override, "why": "Set by configuration."})

    def recovery_action(self, code: int) -> RecoveryAction | None:
        """What the driver's recovery action ``code`` maps to; None for an unknown code."""
        known = RECOVERY_ACTIONS.get(code)
        override = self.recovery_action_overrides.get(code)
        if override is None:
            return known
        name = known.name if known else f"CODE_{code}"
        return RecoveryAction(code=code, name=name, action=override)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> PolicySettings:
        """Build from parsed YAML: either the policy section or a whole service config with a
        top-level ``policy:`` key. Raises pydantic's ``ValidationError`` naming the field."""
        if not data:
            return cls()
        section = data.get("policy", data) if isinstance(data, Mapping) else data
        if section is None:
            return cls()
        unknown = unknown_fields(cls, section)
        if unknown:
            raise ValidationError.from_exception_data(cls.__name__, [
                {"type": "extra_forbidden", "loc": tuple(name.split(".")), "input": None}
                for name in unknown])
        return cls.model_validate(section, context={"config": True})
