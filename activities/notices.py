"""Events the detector's observation raises on nodes, and how often.

An observation runs every few seconds; a condition that lasts (an exporter that stays down, an
application XID the exporter keeps showing, a node that keeps waiting for the budget) must not
write an Event per tick. ``NoticeBook`` remembers, per node and kind, what was last announced:
a notice is due when the condition is new or has changed, and again only after ``repeat_after``
while it lasts. The memory is the worker process's: after a restart a lasting condition is
announced once more, which is the point of an Event (``kubectl describe node`` shows it again).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from kubernetes import client

from activities.events import record_node_event
from policy.models import Action, Verdict
from policy.rules import LINK_SIGNALS
from policy.signals import BlindSignal

log = logging.getLogger(__name__)

TELEMETRY_UNAVAILABLE = "TelemetryUnavailable"
APPLICATION_XID = "ApplicationXid"
REMEDIATION_DEFERRED = "RemediationDeferred"
CIRCUIT_BREAKER_OPEN = "CircuitBreakerOpen"
GPU_LINK_ERRORS = "GpuLinkErrors"
SIGNAL_UNAVAILABLE = "SignalUnavailable"

MAX_EVENTS_PER_TICK = 50
"""A fleet-wide outage (the exporter DaemonSet rolling) would otherwise write an Event per node
in one tick; the rest stay due and go out over the next ticks."""


@dataclass(frozen=True)
class Notice:
    node: str
    reason: str
    message: str
    fingerprint: str
    event_type: Literal["Normal", "Warning"] = "Warning"


class NoticeBook:
    """What was announced, per (node, reason): ``(fingerprint, when)``."""

    def __init__(self, *, repeat_after: timedelta) -> None:
        if repeat_after <= timedelta(0):
            raise ValueError(f"repeat_after must be positive, not {repeat_after}")
        self.repeat_after = repeat_after
        self._sent: dict[tuple[str, str], tuple[str, float]] = {}

    def due(self, notices: Iterable[Notice], now: float) -> list[Notice]:
        """The notices to send now: new, changed, or repeated after ``repeat_after``."""
        out = []
        for n in notices:
            last = self._sent.get((n.node, n.reason))
            if last is None or last[0] != n.fingerprint or \
                    now - last[1] >= self.repeat_after.total_seconds():
                out.append(n)
        return out

    def sent(self, notice: Notice, now: float) -> None:
        self._sent[(notice.node, notice.reason)] = (notice.fingerprint, now)

    def nodes(self, reason: str) -> list[str]:
        """The nodes with a remembered notice of ``reason``."""
        return [node for node, r in self._sent if r == reason]

    def settle(self, reason: str, current: Iterable[str], nodes: Iterable[str]) -> None:
        """Forget ``reason`` for each of ``nodes`` that no longer has it, so its return is new.
        ``nodes``: those this observation looked at (another shard's are not ours to forget)."""
        keep = set(current)
        for node in set(nodes) - keep:
            self._sent.pop((node, reason), None)


def telemetry_notices(errors: dict[str, str]) -> list[Notice]:
    """``TelemetryUnavailable`` for each node whose exporter could not be read. The fingerprint
    is constant: a message that changes every tick (a timeout's duration, a port) is the same
    outage."""
    return [Notice(node=node, reason=TELEMETRY_UNAVAILABLE, fingerprint="unreadable",
                   message=f"no GPU health data from this node's exporter ({why}); the node is "
                           "not evaluated (never flagged on no data) until it answers again")
            for node, why in errors.items()]


def app_xid_notices(verdicts: Iterable[Verdict]) -> list[Notice]:
    """``ApplicationXid`` for application XIDs (the app must restart; the node stays in service).
    Not the original tool's ``GPUWarning``: that meant "a human should look" (XID 94, unknown
    XIDs), which is ``XidAlert``/``UnknownXid`` here; alerts on it must not fire for XID 13."""
    out = []
    for v in verdicts:
        app = sorted({(f.gpu, int(f.value)) for f in v.findings
                      if f.action == Action.APP and f.signal.endswith("XID_ERRORS")})
        if not app:
            continue
        listed = ", ".join(f"XID {xid} on GPU {gpu}" for gpu, xid in app)
        out.append(Notice(node=v.node, reason=APPLICATION_XID, fingerprint=listed,
                          message=f"application error {listed}: restart the application; "
                                  "the node stays in service"))
    return out


def link_notices(verdicts: Iterable[Verdict]) -> list[Notice]:
    """``GpuLinkErrors`` for PCIe replay and NVLink error rates over policy.links' thresholds,
    whatever the action (an alert has no other trace on the node). The fingerprint is the GPUs
    and rules, not the rates, which change every reading."""
    out = []
    for v in verdicts:
        found = sorted({(f.gpu, f.rule, f.value, f.action.value) for f in v.findings
                        if f.signal in LINK_SIGNALS}, key=lambda t: (t[0], t[1]))
        if not found:
            continue
        listed = "; ".join(f"GPU {gpu}: {rule} ({value:.3g}), {action}"
                           for gpu, rule, value, action in found)
        out.append(Notice(node=v.node, reason=GPU_LINK_ERRORS,
                          fingerprint=",".join(f"{g}/{r}" for g, r, _, _ in found),
                          message=f"link errors: {listed} (policy.links)"))
    return out


def blind_notices(blind: dict[str, list[BlindSignal]]) -> list[Notice]:
    """``SignalUnavailable`` for each node whose exporter cannot feed some rules, naming the
    rules and the families missing. The fingerprint is the set of blind signals: a node is
    told again when it changes (a counter file fixed, a rule newly blind), not every tick."""
    out = []
    for node, signals in blind.items():
        if not signals:
            continue
        listed = "; ".join(f"{b.signal} (missing {', '.join(b.missing)})" for b in signals)
        out.append(Notice(node=node, reason=SIGNAL_UNAVAILABLE,
                          fingerprint=",".join(b.signal for b in signals),
                          message=f"this node's exporter does not serve what these rules "
                                  f"read, so they cannot fire here: {listed}. Enable the "
                                  "fields in dcgm-exporter's counter file (docs/install.md)"))
    return out


_COUNTS = re.compile(r"\s*\(\d+/\d+\)")


def deferred_notices(waiting: Iterable[str]) -> list[Notice]:
    """``RemediationDeferred`` from the detector's waiting list (``"node (action: why)"``, as
    ``gpu-remediate detector status`` shows it). The fingerprint is the why without its slot
    counts, so "budget full (1/1)" turning "(2/2)" is not a new notice."""
    out = []
    for line in waiting:
        node, _, rest = line.partition(" (")
        why = rest.removesuffix(")") or "waiting for admission"
        out.append(Notice(node=node, reason=REMEDIATION_DEFERRED, event_type="Normal",
                          fingerprint=_COUNTS.sub("", why),
                          message=f"remediation deferred: {why}; it starts when admitted"))
    return out


def breaker_notices(nodes: Iterable[str], reason: str) -> list[Notice]:
    """``CircuitBreakerOpen`` on each node that tripped the breaker: where an SRE looking at
    one of them (``kubectl describe node``) learns why nothing is being repaired."""
    return [Notice(node=node, reason=CIRCUIT_BREAKER_OPEN, fingerprint=reason,
                   message=f"circuit breaker open, no new remediation starts: {reason}; this "
                           "node is one that tripped it (`gpu-remediate detector resume` "
                           "after checking)")
            for node in nodes]


async def send(core: client.CoreV1Api, book: NoticeBook, notices: list[Notice], now: float,
               *, limit: int = MAX_EVENTS_PER_TICK) -> list[Notice]:
    """Record the due notices as Events (at most ``limit``); returns those sent."""
    due = book.due(notices, now)
    if len(due) > limit:
        log.info("%d node Events due; sending %d now, the rest on later ticks", len(due), limit)
        due = due[:limit]
    sem = asyncio.Semaphore(8)

    async def one(n: Notice) -> None:
        async with sem:
            await asyncio.to_thread(record_node_event, core, n.node, reason=n.reason,
                                    message=n.message, event_type=n.event_type)
        book.sent(n, now)

    await asyncio.gather(*(one(n) for n in due))
    return due
