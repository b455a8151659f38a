"""Domain incidents: a burst of flagged nodes inside one fault domain is one fault.

A GB200 NVL72 domain or a rack fails as a unit: one NVLink fault or one switch takes every
node of the domain down within a second. Remediating those nodes one by one drains and
reboots a domain whose fault is in the part they share; counting them toward the fleet's
circuit breaker stops repairs everywhere. When ``incident_threshold`` nodes of one domain
are flagged within ``incident_window`` the detector opens one ``DomainIncident`` instead:
its flagged nodes are cordoned (no new work lands) and wait, while every other domain is
remediated as usual. It ends when an operator resolves it (the shared part is fixed),
releases it (remediate its nodes one by one after all), or when every fault in it clears.

The record of which nodes the detector cordoned is ``DetectorState.incident_cordons``: a
node is uncordoned only if the detector cordoned it (and its annotation still says so), so
a node someone else cordoned stays cordoned. Pure code over pydantic models: the detector
workflow and ``gpu-remediate plan`` decide alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from workflows.settings import UNLABELLED, DetectorSettings, FaultDomain, domain_name

# Incidents closed recently, kept for the view (the newest last).
CLOSED_KEPT = 10


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")


def incident_key(label: str, domain: str) -> str:
    return f"{label}={domain}"


class DomainIncident(_Message):
    """One correlated failure of a fault domain: detector state, carried across
    continue-as-new, shown in the view, the UI's details and ``gpu-remediate status``."""

    label: str
    domain: str
    opened_at: datetime
    nodes: list[str] = Field(default_factory=list,
                             description="The domain's flagged nodes held by the incident.")
    reason: str = ""
    released_by: str = Field(default="", description="An operator's `incident release`: "
                                                     "its nodes are remediated one by one.")
    closed_at: datetime | None = None
    closed_by: str = Field(default="", description="Why it ended: an operator's resolve, or "
                                                   "every fault cleared.")

    @property
    def key(self) -> str:
        return incident_key(self.label, self.domain)

    @property
    def holding(self) -> bool:
        """Its nodes wait (cordoned, not drained): open and not released."""
        return self.closed_at is None and not self.released_by


class IncidentCordon(_Message):
    """The detector's cordon (or uncordon) of an incident's nodes: one activity only when
    the incident's nodes change, never per tick."""

    key: str
    reason: str = Field(default="", max_length=2000)
    cordon: list[str] = Field(default_factory=list)
    uncordon: list[str] = Field(default_factory=list)


class IncidentCordonResult(_Message):
    cordoned: list[str] = Field(default_factory=list, description="Cordoned by us now.")
    already: list[str] = Field(default_factory=list,
                               description="Cordoned by someone else: left as it is and "
                                           "never uncordoned by us.")
    uncordoned: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


def find(incidents: dict[str, DomainIncident], domain: str) -> tuple[DomainIncident | None, str]:
    """The open incident an operator names (its value, or label=value), or why none."""
    open_ = {k: i for k, i in incidents.items() if i.closed_at is None}
    if domain in open_:
        return open_[domain], ""
    named = [i for i in open_.values() if i.domain == domain]
    if len(named) == 1:
        return named[0], ""
    shown = ", ".join(sorted(open_)) or "none"
    if named:
        return None, f"{domain!r} names a domain at several levels: say label=value ({shown})"
    return None, f"no open incident in domain {domain!r} (open: {shown})"


@dataclass
class IncidentWatch:
    """One tick's incident decision. ``flagged``: the nodes flagged this tick, with their
    domain at each level; ``busy``: nodes already in remediation (not held by an
    incident: they hold a lease and run their course)."""

    settings: DetectorSettings
    incidents: dict[str, DomainIncident]
    flagged_at: dict[str, datetime]
    cordons: dict[str, str]
    flagged: dict[str, dict[str, str]]
    busy: set[str]
    now: datetime
    opened: list[DomainIncident] = field(init=False, default_factory=list)
    closed: list[DomainIncident] = field(init=False, default_factory=list)
    to_cordon: dict[str, list[str]] = field(init=False, default_factory=dict)
    to_uncordon: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        levels = [d for d in self.settings.fault_domains if d.incident_threshold > 0]
        longest = max((d.incident_window for d in levels), default=timedelta(0))
        # When each node was first flagged, kept while it is flagged or within the window.
        self.flagged_at = {n: t for n, t in self.flagged_at.items()
                           if n in self.flagged or t > self.now - longest}
        for n in sorted(self.flagged):
            self.flagged_at.setdefault(n, self.now)
        for level in levels:
            self._open(level)
        for inc in sorted(self.incidents.values(), key=lambda i: i.key):
            if inc.closed_at is None:
                self._follow(inc)
        self._release_cordons()

    def _domain(self, node: str, label: str) -> str:
        return self.flagged.get(node, {}).get(label, UNLABELLED)

    def _open(self, level: FaultDomain) -> None:
        start = self.now - level.incident_window
        # A node flagged without a break since an incident of its domain ended (resolved
        # while its own fault stays) was counted once: it goes node by node now.
        counted = {n: i.closed_at for i in self.incidents.values()
                   if i.label == level.label and i.closed_at is not None for n in i.nodes}
        by_domain: dict[str, list[str]] = {}
        for n in sorted(self.flagged):
            ended = counted.get(n)
            if ended is not None and self.flagged_at[n] <= ended:
                continue
            if self.flagged_at[n] > start or self.flagged_at[n] == self.now:
                by_domain.setdefault(self._domain(n, level.label), []).append(n)
        for domain, nodes in sorted(by_domain.items()):
            # Nodes without the label share no known part: they never make an incident.
            if domain == UNLABELLED or len(nodes) < level.incident_threshold:
                continue
            key = incident_key(level.label, domain)
            current = self.incidents.get(key)
            if current is not None and current.closed_at is None:
                continue
            inc = DomainIncident(
                label=level.label, domain=domain, opened_at=self.now, nodes=[],
                reason=(f"{len(nodes)} nodes of {level.label}={domain_name(domain)} flagged "
                        f"within {level.incident_window} (threshold "
                        f"{level.incident_threshold}): one fault of the domain, not "
                        f"{len(nodes)} node faults"))
            self.incidents[key] = inc
            self.opened.append(inc)

    def _follow(self, inc: DomainIncident) -> None:
        """Flagged nodes of the domain join it; it closes once none of them is flagged."""
        members = {n for n in self.flagged if self._domain(n, inc.label) == inc.domain
                   and n not in self.busy}
        if inc.holding:
            inc.nodes = sorted(set(inc.nodes) | members)
            fresh = [n for n in sorted(members) if n not in self.cordons]
            if fresh:
                self.to_cordon[inc.key] = fresh
        if inc.nodes and not any(n in self.flagged for n in inc.nodes):
            inc.closed_at, inc.closed_by = self.now, "no node of it is flagged any more"
            self.closed.append(inc)

    def _release_cordons(self) -> None:
        """Our cordons of nodes no incident holds any more: uncordoned once the node's fault
        cleared. One still flagged stays cordoned until its own remediation starts
        (``release_before_start``), so no work lands on it in between."""
        holding = {n for i in self.incidents.values() if i.holding for n in i.nodes}
        self.to_uncordon = sorted(n for n in self.cordons
                                  if n not in holding and n not in self.flagged
                                  and n not in self.busy)

    def holds(self, node: str) -> DomainIncident | None:
        """The incident that keeps ``node`` from being drained, if any."""
        for inc in self.incidents.values():
            if inc.holding and node in inc.nodes:
                return inc
        return None

    def held_nodes(self) -> set[str]:
        return {n for i in self.incidents.values() if i.holding for n in i.nodes}


def prune_closed(incidents: dict[str, DomainIncident]) -> dict[str, DomainIncident]:
    """Open incidents, and the last CLOSED_KEPT closed ones (for the view)."""
    closed = sorted((i for i in incidents.values() if i.closed_at is not None),
                    key=lambda i: i.closed_at or i.opened_at)[-CLOSED_KEPT:]
    return {i.key: i for i in [*(i for i in incidents.values() if i.closed_at is None),
                               *closed]}
