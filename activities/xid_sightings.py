"""Count application XIDs per GPU across detector ticks, for repeat escalation.

NVIDIA's workflow for application-class XIDs (13, 31, 32, ...) is "no node action, unless it
keeps happening on the same GPU". One scrape cannot tell: the ``DCGM_FI_DEV_XID_ERRORS`` gauge
holds only the last XID number. So the detector remembers, per GPU, what it saw last and when
each app XID appeared, in the node's record (activities/record.py: a ConfigMap a kubelet cannot
write, so a node cannot wipe its own sightings; it survives worker and detector restarts) and
mirrored in a node annotation for ``kubectl``. A *sighting* is:

- the gauge changing to an app XID (a new value; the same value tick after tick is one event);
- a rise of the exporter's opt-in ``DCGM_EXP_XID_ERRORS_COUNT{xid=...}`` (occurrences in a
  sliding window): a rise of N is N new occurrences, which is how a repeat of the *same* XID
  becomes visible. A rise that the gauge change already reported is not counted twice.

Sightings older than the policy's escalation window are dropped. The policy counts them in
*bursts* (sightings less than ``app_xid_escalation.burst_gap`` apart are one burst), so one
job crashing a dozen times in a minute is one event. A remediation that acknowledges a GPU's
XID clears that GPU's sightings (``clear_sightings``), so escalation counts only what happened
after the last repair.

The gauge's last value is also remembered for XIDs that only raise a warning (an XID the
catalog does not know, a bucket that asks a human to check something), so that
``new_warnings`` reports each one once, when it appears, and not at every tick while the
gauge keeps showing it. Pure functions; the I/O is in ``fleet.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, Field

from policy.config import PolicySettings
from policy.models import WARNING_ACTIONS, Finding, NodeReadings, Verdict
from policy.rules import (
    SIG_XID,
    XidSighting,
    gpu_key,
    is_app_xid,
    repeated_rule_id,
    usable,
    xid_action,
    xid_repeat_counts,
)

MAX_SIGHTINGS_PER_GPU = 64
"""Far above any sane threshold; bounds the annotation if a GPU floods XIDs."""


class GpuXidTrack(BaseModel):
    """What the detector remembers about one GPU's XIDs."""

    shown: int = Field(default=0, description="The gauge's value at the last observation.")
    counts: dict[int, int] = Field(
        default_factory=dict,
        description="DCGM_EXP_XID_ERRORS_COUNT per app XID at the last observation.",
    )
    seen: list[tuple[int, float]] = Field(
        default_factory=list, description="(XID, epoch seconds) of each sighting in the window."
    )

    def worth_keeping(self, config: PolicySettings) -> bool:
        return bool(self.seen or self.counts or (self.shown and _remembered(self.shown, config)))


def _remembered(xid: int, config: PolicySettings) -> bool:
    """XIDs whose gauge value is kept between ticks: app XIDs (a change is a sighting) and
    the ones that warn (a change is a new warning), unknown ones included whatever their
    configured action."""
    return (is_app_xid(xid, config) or config.xid_rule(xid) is None
            or xid_action(xid, config) in WARNING_ACTIONS)


Tracks = dict[str, GpuXidTrack]
"""GPU key (``policy.rules.gpu_key``) -> track."""


def parse_tracks(text: str | None) -> Tracks:
    """The annotation's value; a damaged one reads as empty (it only delays escalation).
    Read with the caps of ``activities.annotations`` (size, nesting, ranges): the node can
    write this annotation, and a release must never fail on it."""
    from activities.annotations import parse_tracks as read_tracks
    from activities.node_keys import A_XID_SIGHTINGS

    tracks: Tracks = read_tracks(A_XID_SIGHTINGS, text).value
    return tracks


def dump_tracks(tracks: Mapping[str, GpuXidTrack]) -> str | None:
    """Compact, stable JSON; None (remove the annotation) when there is nothing to keep."""
    if not tracks:
        return None
    return json.dumps(
        {k: tracks[k].model_dump(mode="json") for k in sorted(tracks)},
        sort_keys=True, separators=(",", ":"),
    )


def observe(tracks: Mapping[str, GpuXidTrack], readings: NodeReadings, config: PolicySettings,
            now_s: float) -> Tracks:
    """The tracks after one observation of the node (inputs are not modified)."""
    since = now_s - config.app_xid_escalation.window_s
    out: Tracks = {}
    observed: set[str] = set()
    for gpu in readings.gpus:
        key = gpu_key(gpu)
        observed.add(key)
        old = tracks.get(key) or GpuXidTrack()
        track = old.model_copy(deep=True)
        new: list[int] = []
        value = usable(gpu.xid)
        gauge = int(value) if value is not None and value >= 1 else 0
        changed_to = 0
        if gauge and gauge != old.shown:
            changed_to = gauge
            if is_app_xid(gauge, config):
                new.append(gauge)
        # 0 or absent: the exporter restarted (or never saw one); the next value is new.
        track.shown = gauge
        if gpu.xid_counts is not None:
            for xid, count in gpu.xid_counts.items():
                if not is_app_xid(xid, config):
                    continue
                rise = count - old.counts.get(xid, 0)
                if xid == changed_to:
                    rise -= 1  # the gauge change above is one of these occurrences
                new.extend([xid] * max(0, rise))
            track.counts = {x: c for x, c in gpu.xid_counts.items()
                            if c > 0 and is_app_xid(x, config)}
        seen = [(x, t) for x, t in track.seen if since <= t <= now_s]
        seen.extend((x, now_s) for x in new)
        track.seen = seen[-MAX_SIGHTINGS_PER_GPU:]
        if track.worth_keeping(config):
            out[key] = track
    # A GPU missing from this scrape (MIG reconfiguration, a partial exporter) keeps its
    # history until its sightings age out.
    for key, old in tracks.items():
        if key not in observed:
            kept = [(x, t) for x, t in old.seen if since <= t <= now_s]
            if kept:
                out[key] = old.model_copy(update={"seen": kept})
    return out


def repeat_counts(tracks: Mapping[str, GpuXidTrack], config: PolicySettings,
                  now_s: float) -> dict[str, dict[int, int]]:
    """GPU key -> app XID -> sightings in the window, as ``evaluate_node(xid_repeats=)``
    takes them."""
    return xid_repeat_counts(
        (XidSighting(gpu=key, xid=x, at_s=t) for key, track in tracks.items()
         for x, t in track.seen),
        now_s=now_s, config=config,
    )


def clear_sightings(tracks: Mapping[str, GpuXidTrack], gpus: Iterable[str]) -> Tracks:
    """Forget the sightings of ``gpus`` (their XIDs were just remediated); what the gauge and
    the counter showed is kept, so those same occurrences are not counted again."""
    cleared = set(gpus)
    return {k: (t.model_copy(update={"seen": []}) if k in cleared else t)
            for k, t in tracks.items()}


class XidWarning(BaseModel):
    """A finding worth a Warning Event on the node, the first time it is seen."""

    reason: str
    """The Event reason: ``UnknownXid``, ``XidAlert`` or ``GPUDiagnosticNeeded``."""
    message: str
    finding: Finding


def new_warnings(before: Mapping[str, GpuXidTrack], after: Mapping[str, GpuXidTrack],
                 verdict: Verdict, config: PolicySettings, now_s: float) -> list[XidWarning]:
    """The XID findings of ``verdict`` that warn and are new at this observation.

    ``before``/``after``: the node's tracks before and after ``observe`` at ``now_s``. A gauge
    value warns when it differs from what the GPU showed before (it keeps showing it until the
    exporter restarts); an escalation warns when this observation added a sighting of its XID,
    i.e. at each new burst that keeps it over the threshold, not at every tick in the window.
    """
    out: list[XidWarning] = []
    for f in verdict.findings:
        if f.signal != SIG_XID:
            continue
        xid, key = int(f.value), gpu_key(f)
        where = f"GPU {f.gpu}" + (f" ({f.uuid})" if f.uuid else "")
        if f.rule == repeated_rule_id(xid):
            track = after.get(key)
            if f.action in WARNING_ACTIONS and track and (xid, now_s) in track.seen:
                bursts = config.app_xid_escalation.threshold_for(xid)
                out.append(XidWarning(
                    reason="GPUDiagnosticNeeded", finding=f,
                    message=f"{where}: application XID {xid} came back in {bursts} or more "
                            f"separate bursts; run a deeper diagnostic (dcgmi diag -r 3) "
                            f"before any reset"))
            continue
        old = before.get(key)
        if old is not None and old.shown == xid:
            continue
        if config.xid_rule(xid) is None:
            out.append(XidWarning(
                reason="UnknownXid", finding=f,
                message=f"{where}: XID {xid} is not in NVIDIA's XID catalog as this version "
                        f"knows it; action {f.action.value} (policy.unknown_xid_action)"))
        elif f.action in WARNING_ACTIONS:
            row = config.xid_rule(xid)
            why = row.why if row is not None else ""
            out.append(XidWarning(
                reason="XidAlert", finding=f,
                message=f"{where}: XID {xid} needs a human, no node action: {why}"))
    return out
