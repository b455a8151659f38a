"""Faults nodes report about themselves (``gpu-remediate watch``): what the detector keeps of
them, and how an observation reads them.

A node's watcher sees an XID in its kernel log the moment the driver prints it; the exporter
shows it at its next collection (30 s by default) and the detector at its next tick. The
worker authenticates each report (the token's bound node must be the reported node), then
signals the detector (``node_report``), which keeps the recent ones here and wakes. The next
observation merges each node's reports into that node's readings only, just before its
verdict: the decision is still the policy's, on a fresh reading of the node, under the
budget. A report is never a verdict.

A detector woken by reports alone does not wait for the fleet: it observes only the reported
nodes (``due_for_node_tick``: each at most once per ``NODE_TICK_GAP``, a few at a time), and
admits them against the last full observation with their fresh entries in place
(``merge_node_observation``): the fleet-wide counts the decision needs (breaker fraction,
domain incidents, pool and domain sizes) are the last full observation's, the budget is the
leases'. Only a reported node can start in such a tick; the next scheduled tick observes the
whole fleet as always.

Pure: no I/O; workflow code imports this module through the sandbox.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from policy.config import PolicySettings
from policy.models import SEVERITY, GpuReading, NodeReadings
from policy.rules import gpu_key, xid_action
from workflows.messages import FleetObservation, NodeReport

NODE_REPORT_SIGNAL = "node_report"
"""The detector's signal for an accepted report (payload: ``NodeReport``)."""

NODE_REPORT_PATCH = "detector-node-reports"
"""The detector's patch id for handling ``node_report`` (a history recorded before it
rejected the signal as unknown, and replays that way)."""

REPORT_TTL = timedelta(minutes=2)
"""How long a report counts. Long enough for the exporter to catch up (its collection
interval is 30 s by default, and the gauge then shows the XID itself); short enough that a
report never outlives the remediation it leads to (reports of a node in remediation are
dropped, see ``reports_for_observation``)."""

MAX_REPORTS_PER_NODE = 8
"""Distinct (GPU, XID) reports kept per node: a node flooding reports only replaces its own."""

NODE_TICK_PATCH = "node-only-woken-tick"
"""The detector's patch id for the node-only tick (a history recorded before it woke for a
whole-fleet tick on every report, and replays that way)."""

NODE_TICK_GAP = timedelta(seconds=30)
"""At most one node-only tick per node this often: a node flooding reports costs one small
observation per gap, never a tick per report. A report inside the gap still counts: the next
full tick merges it."""

MAX_NODE_TICK_NODES = 8
"""More nodes than this due at once: a full tick instead (a fleet-wide storm is the full
observation's and the breaker's to judge, not many small ticks')."""

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

MAX_REPORTING_NODES = 128
"""Nodes with reports kept at once (the oldest node's reports go first): bounds the
detector's state whatever a fleet-wide storm sends."""


def keep_report(held: Sequence[NodeReport], new: NodeReport, now: datetime) -> list[NodeReport]:
    """``held`` with ``new`` added, expired reports dropped, and the bounds applied.

    A repeat of the same (node, GPU, XID) replaces the earlier one (it only refreshes the
    report's age). A report dated in the future counts from ``now``.
    """
    if new.at > now:
        new = new.model_copy(update={"at": now})
    kept = [r for r in current_reports(held, now)
            if (r.node, r.gpu, r.xid) != (new.node, new.gpu, new.xid)]
    kept.append(new)
    per_node: dict[str, list[NodeReport]] = {}
    for r in sorted(kept, key=lambda r: r.at):
        per_node.setdefault(r.node, []).append(r)
    newest_nodes = sorted(per_node, key=lambda n: per_node[n][-1].at)[-MAX_REPORTING_NODES:]
    out = [r for n in newest_nodes for r in per_node[n][-MAX_REPORTS_PER_NODE:]]
    return sorted(out, key=lambda r: (r.at, r.node, r.gpu, r.xid))


def current_reports(held: Sequence[NodeReport], now: datetime,
                    busy: Collection[str] = ()) -> list[NodeReport]:
    """What the detector keeps before each observation: fresh reports, of nodes not in
    remediation. ``busy`` (nodes in remediation, or starting one) drops a node's reports for
    good: that remediation handles what it reported, and its release acknowledges the XIDs
    the exporter shows, so a report kept past it would start another."""
    return [r for r in held if now - r.at <= REPORT_TTL and r.node not in busy]


def reports_for_observation(held: Sequence[NodeReport], now: datetime,
                            busy: Collection[str] = ()) -> list[NodeReport]:
    """The reports the next observation merges (``current_reports``), without their kernel
    lines: the merge needs none, and the observation's input is in every tick's history."""
    return [r.model_copy(update={"line": ""}) if r.line else r
            for r in current_reports(held, now, busy)]


def reports_by_node(reports: Sequence[NodeReport]) -> dict[str, list[NodeReport]]:
    """``reports`` grouped by node (an observation merges each node's own)."""
    out: dict[str, list[NodeReport]] = {}
    for r in reports:
        out.setdefault(r.node, []).append(r)
    return out


_PCI = re.compile(r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
                  r"(?P<device>[0-9a-fA-F]{1,2})(?:\.[0-7])?$")


def pci_slot(text: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address in the forms DCGM (``00000000:18:00.0``),
    nvidia-smi and the kernel's Xid line (``PCI:0000:18:00``) write it; None otherwise."""
    m = _PCI.match(text.strip())
    if m is None:
        return None
    return int(m["domain"] or "0", 16), int(m["bus"], 16), int(m["device"], 16)


def _names(reading: GpuReading, gpu: str) -> bool:
    if gpu in (reading.gpu, reading.uuid) and gpu:
        return True
    slot = pci_slot(gpu)
    return slot is not None and slot == pci_slot(reading.pci_bus_id or "")


def merge_reports(readings: NodeReadings, acknowledged: Mapping[str, int],
                  reports: Sequence[NodeReport],
                  config: PolicySettings) -> tuple[NodeReadings, dict[str, int]]:
    """The node's readings with its reported XIDs, and the acknowledgements that still hold.

    Only ``readings.node``'s own reports are used (any other is ignored). A reported XID
    takes the place of the GPU's XID gauge, as the gauge will show it at the exporter's next
    collection; of several reports for one GPU the most severe counts. A GPU the exporter
    does not list (one that fell off the bus) is added with just its XID. A reported XID
    equal to the GPU's acknowledged one is a new occurrence (the report is younger than the
    last remediation of the node), so that acknowledgement does not hide it.
    """
    mine = [r for r in reports if r.node == readings.node]
    acked = dict(acknowledged)
    if not mine:
        return readings, acked
    gpus = list(readings.gpus)
    chosen: dict[int, NodeReport] = {}
    added: dict[str, NodeReport] = {}
    for report in sorted(mine, key=lambda r: r.at):
        index = next((i for i, g in enumerate(gpus) if _names(g, report.gpu)), None)
        earlier = chosen.get(index) if index is not None else added.get(report.gpu)
        if earlier is not None and _severity(earlier, config) > _severity(report, config):
            continue
        if index is None:
            added[report.gpu] = report
        else:
            chosen[index] = report
    for index, report in chosen.items():
        gpus[index] = gpus[index].model_copy(update={"xid": report.xid})
    for name, report in added.items():
        gpus.append(GpuReading(gpu=name, uuid=name if name.startswith("GPU-") else "",
                               pci_bus_id=name if pci_slot(name) else "", xid=report.xid))
    for g in gpus:
        key = gpu_key(g)
        if g.xid is not None and acked.get(key) == g.xid and \
                any(_names(g, r.gpu) and r.xid == g.xid for r in mine):
            del acked[key]
    return readings.model_copy(update={"gpus": gpus}), acked


def _severity(report: NodeReport, config: PolicySettings) -> int:
    return SEVERITY[xid_action(report.xid, config)]


def due_for_node_tick(woken: Collection[str], reports: Sequence[NodeReport],
                      last: Mapping[str, datetime], now: datetime) -> list[str]:
    """The nodes a node-only tick observes now: of those whose reports woke the detector
    since its last tick (``woken``), each with a report still held (the caller drops those of
    nodes in remediation first), whose last node-only tick (``last``) is at least
    ``NODE_TICK_GAP`` ago, and whose name is a node name (a signal can come from any Temporal
    client: a name that is not one never reaches a field selector)."""
    held = {r.node for r in reports}
    return sorted(n for n in set(woken) & held if _NODE_NAME.match(n)
                  and (n not in last or now - last[n] >= NODE_TICK_GAP))


def merge_node_observation(base: FleetObservation, fresh: FleetObservation,
                           nodes: Collection[str]) -> FleetObservation:
    """The last full observation (``base``) with what a node-only observation (``fresh``) says
    of ``nodes`` in place of what ``base`` said of them; nothing of ``fresh`` about any other
    node is taken. Fleet-wide figures (node and GPU counts, pool and domain sizes) stay the
    base's: one node's look cannot say them. A node the fresh look did not find (opted out,
    gone, not a GPU node) loses its base entries: no stale verdict acts for it."""
    names = set(nodes)

    def others(items: Sequence[Any]) -> list[Any]:
        return [x for x in items if x.node not in names]

    def mine(items: Sequence[Any]) -> list[Any]:
        return [x for x in items if x.node in names]

    def keyed(which: str) -> dict[str, Any]:
        out = {k: v for k, v in getattr(base, which).items() if k not in names}
        out.update({k: v for k, v in getattr(fresh, which).items() if k in names})
        return out

    return base.model_copy(update={
        "verdicts": sorted([*others(base.verdicts), *mine(fresh.verdicts)],
                           key=lambda v: v.node),
        "remediating": sorted([*others(base.remediating), *mine(fresh.remediating)],
                              key=lambda r: r.node),
        "held": sorted([*others(base.held), *mine(fresh.held)], key=lambda h: h.node),
        "orphans": sorted({*(o for o in base.orphans if o not in names),
                           *(o for o in fresh.orphans if o in names)}),
        "errors": [*(e for e in base.errors if e.split(":", 1)[0] not in names),
                   *(e for e in fresh.errors if e.split(":", 1)[0] in names)][:50],
        "pool_of": keyed("pool_of"), "ledger": keyed("ledger"),
        "domains_of": keyed("domains_of"), "gpus_of": keyed("gpus_of"),
        # Looked up at full ticks only (the record is kept as it is between them).
        "lease_holders": [],
    })
