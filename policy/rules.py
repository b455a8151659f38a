"""The health rules: one scrape of a node in, a verdict with evidence out.

Pure functions over pydantic models, so the detector workflow can call them inside the Temporal
sandbox and replay them deterministically.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from policy import dcgm, nvlink5
from policy.config import CLOCK_REASON_BITS, PolicySettings
from policy.models import (
    SEVERITY,
    Action,
    Finding,
    GpuReading,
    NodeReadings,
    Verdict,
    most_severe,
)

# A finding's signal is the family it read (policy/dcgm.py), or for a link rate the signal
# its rate names.
SIG_XID = dcgm.XID
SIG_GPU_TEMP = dcgm.GPU_TEMP
SIG_MEMORY_TEMP = dcgm.MEMORY_TEMP
SIG_ECC_DBE_VOL = dcgm.ECC_DBE_VOLATILE
SIG_ROW_REMAP_PENDING = dcgm.ROW_REMAP_PENDING
SIG_ROW_REMAP_FAILURE = dcgm.ROW_REMAP_FAILURE
SIG_UNC_REMAPPED_ROWS = dcgm.UNCORRECTABLE_REMAPPED_ROWS
SIG_CLOCK_EVENTS = dcgm.CLOCK_EVENTS
SIG_RECOVERY_ACTION = dcgm.RECOVERY_ACTION
SIG_PCIE_REPLAY = dcgm.PCIE_REPLAY
SIG_NVLINK_CRC = dcgm.NVLINK_CRC_SIGNAL
SIG_NVLINK_ERRORS = dcgm.NVLINK_ERRORS_SIGNAL
LINK_SIGNALS = frozenset({SIG_PCIE_REPLAY, SIG_NVLINK_CRC, SIG_NVLINK_ERRORS})

SENTINEL_FLOOR = 9.2e18
"""Old exporters leaked DCGM's int64 "blank/not supported" sentinels (~9.22e18) as values."""

_XID_48_COMPANIONS = (63, 64)
"""Row-remap XIDs that turn a 48 into NVIDIA's drain-and-reset case."""


def usable(value: float | None) -> float | None:
    """The value, or None when it is no data: absent, NaN, infinite, or a DCGM sentinel."""
    if value is None:
        return None
    value = float(value)
    if not math.isfinite(value) or value >= SENTINEL_FLOOR:
        return None
    return value


def gpu_key(gpu: GpuReading | Finding) -> str:
    """How a GPU is keyed in acknowledgements and XID history: its UUID, which survives
    re-enumeration; the index only when the exporter gave no UUID. A finding names its GPU
    the same way as the reading it came from, so both give the same key."""
    return gpu.uuid or f"index:{gpu.gpu}"


def is_app_xid(xid: int, config: PolicySettings) -> bool:
    """An application-class XID (catalog or override says ``app``): the ones counted for
    repeat escalation."""
    row = config.xid_rule(xid)
    return row is not None and row.action == Action.APP


def repeated_rule_id(xid: int) -> str:
    """The rule id of an application XID that escalated because it kept coming back."""
    return f"xid-{xid}-repeated"


def xid_action(xid: int, config: PolicySettings) -> Action:
    """What a new ``xid`` alone asks for: its catalog row (overrides applied), or
    ``unknown_xid_action`` for an XID the catalog does not list."""
    row = config.xid_rule(xid)
    return row.action if row is not None else config.unknown_xid_action


class XidSighting(BaseModel):
    """One time the detector saw an XID appear (a new value of the gauge) on one GPU."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    """``gpu_key`` of the GPU."""
    xid: int
    at_s: float
    """Seconds since the epoch (``workflow.now().timestamp()`` inside a workflow)."""


def burst_count(times: Iterable[float], *, gap_s: float) -> int:
    """How many bursts the sighting times form: a sighting more than ``gap_s`` after the one
    before it starts a new burst, so a chain of sightings each within the gap of the last is
    one burst however long it lasts. A gap of 0 makes every sighting its own burst."""
    bursts = 0
    last: float | None = None
    for t in sorted(times):
        if last is None or gap_s <= 0 or t - last > gap_s:
            bursts += 1
        last = t
    return bursts


def xid_repeat_counts(
    sightings: Iterable[XidSighting], *, now_s: float, config: PolicySettings
) -> dict[str, dict[int, int]]:
    """Bursts per GPU and XID inside the app-XID escalation window (see ``burst_count``), in
    the shape ``evaluate_node(xid_repeats=...)`` takes. Bursts, not sightings: one job that
    crashes with the same XID many times in a minute is one event, not a failing GPU."""
    escalation = config.app_xid_escalation
    since = now_s - escalation.window_s
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for s in sightings:
        if since <= s.at_s <= now_s:
            times[(s.gpu, s.xid)].append(s.at_s)
    gap_s = escalation.burst_gap.total_seconds()
    out: dict[str, dict[int, int]] = {}
    for (gpu, xid), at in times.items():
        out.setdefault(gpu, {})[xid] = burst_count(at, gap_s=gap_s)
    return out


def _fmt(threshold: float) -> str:
    return str(int(threshold)) if float(threshold).is_integer() else f"{threshold:g}"


def _xid_finding(
    gpu: GpuReading,
    xid: int,
    config: PolicySettings,
    repeats: Mapping[int, int],
    remap_pending: bool,
) -> Finding:
    def finding(rule: str, action: Action) -> Finding:
        return Finding(
            gpu=gpu.gpu, uuid=gpu.uuid, serial=gpu.serial, signal=SIG_XID, value=float(xid),
            rule=rule, action=action
        )

    row = config.xid_rule(xid)
    if row is None:
        return finding(f"xid-{xid}-unknown", config.unknown_xid_action)
    if xid in config.xid_overrides:
        return finding(f"xid-{xid}-override", row.action)

    if xid == 154:
        code = usable(gpu.recovery_action)
        if code is None:
            # 154 says "the required recovery changed" but we cannot read to what: the catalog
            # fallback (reset) is the cheapest action that the driver could have asked for.
            return finding("xid-154-recovery-unreadable", row.action)
        recovery = config.recovery_action(int(code))
        if recovery is None:
            # A code newer than NVML as we know it: like an unknown XID, a human decides.
            return finding(f"xid-154-code-{int(code)}", config.unknown_xid_action)
        return finding(f"xid-154-{recovery.slug}", recovery.action)

    if xid in nvlink5.NVLINK5_XIDS and gpu.xid_detail is not None and gpu.xid_detail.xid == xid:
        decoded = nvlink5.decode(gpu.xid_detail)
        if decoded is not None:
            return _nvlink5_finding(gpu, decoded, config)
        return finding(f"xid-{xid}-undecoded", row.action).model_copy(update={
            "detail": f"XID {xid} {gpu.xid_detail.unit} status 0x{gpu.xid_detail.error_status:x}"
                      " is not in NVIDIA's 144-150 decode as this version knows it: the "
                      "catalog's fallback applies"})

    if xid == 48 and (remap_pending or any(repeats.get(x, 0) > 0 for x in _XID_48_COMPANIONS)):
        return finding("xid-48-drain-and-reset", row.action)

    if row.action == Action.APP and _app_xid_repeated(xid, config, repeats):
        return finding(repeated_rule_id(xid), config.app_xid_escalation.action)
    return finding(row.rule_id, row.action)


def _nvlink5_finding(gpu: GpuReading, decoded: nvlink5.Decoded, config: PolicySettings) -> Finding:
    """A decoded NVLink5 XID acts as NVIDIA's decode sheet says: ignore, reset, or for
    ``XID_154_EVAL`` the recovery action XID 154 reports (restart the app when there is none)."""
    xid = decoded.detail.xid
    rule = f"xid-{xid}-{decoded.unit_slug}-{decoded.resolution.slug}"
    action = nvlink5.RESOLUTION_ACTION[decoded.resolution]
    detail = decoded.meaning
    if decoded.resolution == nvlink5.Resolution.XID_154_EVAL:
        code = usable(gpu.recovery_action)
        recovery = config.recovery_action(int(code)) if code is not None and code > 0 else None
        if recovery is not None:
            rule += f"-{recovery.slug}"
            action = recovery.action
            detail += f"; the driver's recovery action is {recovery.name}"
        else:
            detail += "; no XID 154 recovery action readable, so the application restarts"
    return Finding(gpu=gpu.gpu, uuid=gpu.uuid, serial=gpu.serial, signal=SIG_XID,
                   value=float(xid), rule=rule,
                   action=action, detail=detail)


def _app_xid_repeated(xid: int, config: PolicySettings, repeats: Mapping[int, int]) -> bool:
    escalation = config.app_xid_escalation
    return (
        escalation.enabled
        and is_app_xid(xid, config)
        and repeats.get(xid, 0) >= escalation.threshold_for(xid)
    )


def _gpu_findings(
    gpu: GpuReading,
    config: PolicySettings,
    acknowledged_xids: Mapping[str, int],
    xid_repeats: Mapping[str, Mapping[int, int]],
) -> list[Finding]:
    findings: list[Finding] = []

    def add(signal: str, value: float, rule: str, action: Action) -> None:
        findings.append(
            Finding(
                gpu=gpu.gpu, uuid=gpu.uuid, serial=gpu.serial, signal=signal, value=value,
                rule=rule, action=action
            )
        )

    key = gpu_key(gpu)
    remap_pending = (usable(gpu.row_remap_pending) or 0) > 0

    xid_value = usable(gpu.xid)
    # 0 is the exporter's "no XID yet"; negative values are not XIDs.
    if xid_value is not None and xid_value >= 1:
        xid = int(xid_value)
        # The gauge keeps the last XID until the exporter restarts: a value we already
        # remediated is history, a different value is a new event. An acknowledged app XID
        # still escalates when it keeps repeating: the sightings before the remediation were
        # cleared with the acknowledgement, so the counted ones are new.
        repeats = xid_repeats.get(key, {})
        if acknowledged_xids.get(key) != xid or _app_xid_repeated(xid, config, repeats):
            findings.append(_xid_finding(gpu, xid, config, repeats, remap_pending))

    dbe = usable(gpu.ecc_dbe_volatile)
    if dbe is not None and dbe > 0:
        add(SIG_ECC_DBE_VOL, dbe, "ecc-dbe-volatile", config.ecc_dbe_action)

    failure = usable(gpu.row_remap_failure)
    if failure is not None and failure > 0:
        add(SIG_ROW_REMAP_FAILURE, failure, "row-remap-failure", config.row_remap_failure_action)

    if remap_pending:
        add(
            SIG_ROW_REMAP_PENDING,
            usable(gpu.row_remap_pending) or 1.0,
            "row-remap-pending",
            config.row_remap_pending_action,
        )

    unc_rows = usable(gpu.uncorrectable_remapped_rows)
    if unc_rows is not None and unc_rows >= config.uncorrectable_remap_limit:
        add(
            SIG_UNC_REMAPPED_ROWS,
            unc_rows,
            "uncorrectable-remap-limit",
            config.uncorrectable_remap_limit_action,
        )

    gpu_limit, memory_limit = config.thermal.limits_for(gpu.model_name)
    gpu_temp = usable(gpu.gpu_temp)
    if gpu_temp is not None and gpu_temp >= gpu_limit:
        add(SIG_GPU_TEMP, gpu_temp, f"gpu-temp-over-{_fmt(gpu_limit)}", Action.THERMAL)
    memory_temp = usable(gpu.memory_temp)
    if memory_temp is not None and memory_temp >= memory_limit:
        add(SIG_MEMORY_TEMP, memory_temp, f"memory-temp-over-{_fmt(memory_limit)}", Action.THERMAL)

    reasons = usable(gpu.clock_event_reasons)
    if reasons is not None and reasons >= 0:
        mask = int(reasons)
        for name in config.thermal.clock_reasons:
            if mask & CLOCK_REASON_BITS[name]:
                add(
                    SIG_CLOCK_EVENTS, float(mask), f"clock-{name.replace('_', '-')}", Action.THERMAL
                )

    findings += _link_findings(gpu, config)

    code = usable(gpu.recovery_action)
    if config.follow_recovery_action and code is not None and code > 0:
        recovery = config.recovery_action(int(code))
        if recovery is None:
            add(
                SIG_RECOVERY_ACTION,
                code,
                f"recovery-action-code-{int(code)}",
                config.unknown_xid_action,
            )
        else:
            add(SIG_RECOVERY_ACTION, code, f"recovery-action-{recovery.slug}", recovery.action)

    return findings


def _link_findings(gpu: GpuReading, config: PolicySettings) -> list[Finding]:
    """Link rates over their thresholds (policy.links); a rate is the observer's, from two
    readings, so a single reading never judges a link."""
    links = config.links
    checks: list[tuple[bool, str, float | None, float, str, Action]] = [
        (links.pcie_replay_enabled, SIG_PCIE_REPLAY, gpu.pcie_replays_per_minute,
         links.pcie_replays_per_minute,
         f"pcie-replays-over-{_fmt(links.pcie_replays_per_minute)}-per-minute",
         links.pcie_replay_action),
        (links.nvlink_enabled, SIG_NVLINK_CRC, gpu.nvlink_crc_errors_per_second,
         links.nvlink_crc_errors_per_second,
         f"nvlink-crc-errors-over-{_fmt(links.nvlink_crc_errors_per_second)}-per-second",
         links.nvlink_action),
        (links.nvlink_enabled, SIG_NVLINK_ERRORS, gpu.nvlink_errors_per_minute,
         links.nvlink_errors_per_minute,
         ("nvlink-replay-recovery-errors" if links.nvlink_errors_per_minute == 0 else
          f"nvlink-replay-recovery-errors-over-{_fmt(links.nvlink_errors_per_minute)}"
          "-per-minute"),
         links.nvlink_action),
    ]
    out = []
    for enabled, signal, raw, limit, rule, action in checks:
        rate = usable(raw)
        if enabled and rate is not None and rate > limit:
            out.append(Finding(gpu=gpu.gpu, uuid=gpu.uuid, serial=gpu.serial, signal=signal,
                               value=rate, rule=rule, action=action))
    return out


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdecimal() else (1 << 30, gpu)


def evaluate_node(
    readings: NodeReadings,
    config: PolicySettings,
    *,
    acknowledged_xids: Mapping[str, int] | None = None,
    xid_repeats: Mapping[str, Mapping[int, int]] | None = None,
) -> Verdict:
    """What one node needs, with the evidence.

    ``acknowledged_xids``: GPU key (UUID) -> XID value already handled by a past remediation;
    that exact value no longer triggers. ``xid_repeats``: GPU key -> XID -> bursts in the
    escalation window, including the current one (see ``xid_repeat_counts``).
    """
    acked = acknowledged_xids or {}
    repeats = xid_repeats or {}
    findings: list[Finding] = []
    for gpu in readings.gpus:
        findings.extend(_gpu_findings(gpu, config, acked, repeats))
    missing = _missing_gpus(readings, config)
    if missing is not None:
        findings.append(missing)
    # Strongest evidence first; then by GPU so output is stable between scrapes.
    findings.sort(key=lambda f: (-SEVERITY[f.action], _gpu_order(f.gpu), f.uuid, f.rule))
    return Verdict(
        node=readings.node,
        action=most_severe([f.action for f in findings]),
        findings=findings,
    )


def _missing_gpus(readings: NodeReadings, config: PolicySettings) -> Finding | None:
    """Fewer GPUs reported than the node declares: one fell off the bus (the driver lost
    it; DCGM no longer lists it), which often comes with no XID the exporter can show.
    Unknown (no declared count) or an empty scrape says nothing."""
    declared = readings.declared_gpus
    if not declared or not readings.gpus or config.missing_gpu_action == Action.NONE:
        return None
    seen = len({g.uuid or g.gpu for g in readings.gpus})
    if seen >= declared:
        return None
    return Finding(gpu="all", signal="gpu-count", value=float(seen),
                   rule=f"gpus-missing-{declared - seen}-of-{declared}",
                   action=config.missing_gpu_action)


def evaluate_fleet(
    readings: list[NodeReadings],
    config: PolicySettings,
    *,
    acknowledged_xids: Mapping[str, int] | None = None,
    xid_repeats: Mapping[str, Mapping[int, int]] | None = None,
) -> list[Verdict]:
    """``evaluate_node`` for every node; GPU UUIDs are fleet-unique, so the maps are flat."""
    return [
        evaluate_node(r, config, acknowledged_xids=acknowledged_xids, xid_repeats=xid_repeats)
        for r in readings
    ]


def is_thermal_recovered(readings: NodeReadings, config: PolicySettings) -> bool:
    """True once a cordoned hot node has cooled: every GPU reports a core temperature at least
    the recovery margin below its threshold (memory too, where reported) and no thermal clock
    reason is active. Missing data is not recovery: no data, no action."""
    if not readings.gpus:
        return False
    margin = config.thermal.recovery_margin_c
    mask = config.thermal.clock_mask
    for gpu in readings.gpus:
        gpu_limit, memory_limit = config.thermal.limits_for(gpu.model_name)
        gpu_temp = usable(gpu.gpu_temp)
        if gpu_temp is None or gpu_temp >= gpu_limit - margin:
            return False
        memory_temp = usable(gpu.memory_temp)
        if memory_temp is not None and memory_temp >= memory_limit - margin:
            return False
        reasons = usable(gpu.clock_event_reasons)
        if reasons is not None and int(reasons) & mask:
            return False
    return True
