"""Observe the fleet: list GPU nodes, scrape their exporters, evaluate the policy.

One activity per detector tick for the whole fleet. It returns only the nodes
that need attention, so the detector's history grows by a constant per tick
whatever the fleet size. An exporter that cannot be read makes its node
"unreadable", never "unhealthy".

``FleetActivities`` holds the fleet's activities, one part per concern: the observation here,
the node list in activities/fleet_nodes.py, the exporters' readings in activities/scrape.py,
orphans in activities/orphans.py, the thermal watch in activities/thermal.py and the
admission report in activities/admission_report.py.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import metrics
from activities.admission_report import AdmissionReporting
from activities.counter_rates import CounterRates
from activities.events import record_node_event
from activities.exporter_settings import ExporterSettings
from activities.fleet_nodes import GpuNode, NodeListing
from activities.kube import REQUEST_TIMEOUT
from activities.ledger import LedgerStore, months_between
from activities.node_keys import HISTORY_LIMIT, STATE_LABEL, TAINT_KEY
from activities.nodes import NodeActivities
from activities.notices import (
    APPLICATION_XID,
    GPU_LINK_ERRORS,
    SIGNAL_UNAVAILABLE,
    TELEMETRY_UNAVAILABLE,
    Notice,
    NoticeBook,
    app_xid_notices,
    blind_notices,
    link_notices,
    telemetry_notices,
)
from activities.notices import send as send_notices
from activities.observation_budget import bound_observation
from activities.orphans import OrphanActivities
from activities.prometheus_source import PrometheusSource
from activities.record import (
    MIRROR_KINDS,
    STATE_MISMATCH,
    Loaded,
    NodeRecord,
    RecordStore,
    RecordUnreadable,
    mirror_annotations,
    mirror_mismatches,
    reconcile_identity,
    report_unreadable,
    seed_from_annotations,
)
from activities.scrape import ExporterReading
from activities.signal_watch import Repeat, SignalWatch
from activities.thermal import ThermalActivities
from activities.visibility import lease_statuses
from activities.xid_sightings import Tracks, new_warnings, observe, repeat_counts
from policy.models import NODE_ACTIONS, Action, NodeReadings, Verdict
from policy.rules import (
    LINK_SIGNALS,
    SIG_NVLINK_CRC,
    SIG_NVLINK_ERRORS,
    SIG_PCIE_REPLAY,
    SIG_XID,
    evaluate_node,
    gpu_key,
)
from policy.signals import SIGNAL_NAMES, BlindSignal
from workflows.ids import shard_of
from workflows.ledger import LedgerNote, notes_for
from workflows.messages import FleetObservation, NeighbourHold, NodeStatus, ObserveInput
from workflows.reports import merge_reports, reports_by_node
from workflows.transitions import NodeState

log = logging.getLogger(__name__)

_LINK_KIND = {SIG_PCIE_REPLAY: "pcie_replay", SIG_NVLINK_CRC: "nvlink_crc",
              SIG_NVLINK_ERRORS: "nvlink_errors"}


def _still_shown(acked: dict[str, int], readings: NodeReadings) -> dict[str, int]:
    """The acknowledgements whose GPU still reports exactly that XID value."""
    shown = {gpu_key(g): g.xid for g in readings.gpus}
    return {k: v for k, v in acked.items() if shown.get(k) == v}


RecordChange = Callable[[NodeRecord | None], NodeRecord | None]


def _next_record(node: GpuNode, base: NodeRecord, r: NodeReadings, inp: ObserveInput,
                 now: float) -> NodeRecord:
    """The node's record after one observation of it: its identity checked against the GPUs
    it shows (activities/record.py, ``reconcile_identity``) and, for a node in service, its
    XID sightings and the acknowledgements it still shows. A node in remediation has its XIDs
    being handled; its release writes them."""
    rec, _ = reconcile_identity(base, node.uid, {g.uuid for g in r.gpus if g.uuid},
                                datetime.fromtimestamp(now, UTC))
    if node.state != NodeState.HEALTHY:
        return rec
    if inp.track_xid_repeats:
        rec = rec.model_copy(update={"sightings": observe(rec.sightings, r, inp.policy, now)})
    return rec.model_copy(update={"acknowledged": _still_shown(rec.acknowledged, r)})


def _same(a: NodeRecord, b: NodeRecord) -> bool:
    return a.model_dump(exclude={"updated"}) == b.model_dump(exclude={"updated"})


def _record_change(node: GpuNode, r: NodeReadings, inp: ObserveInput,
                   now: float) -> RecordChange:
    """What one observation does to the node's record, applied to the record as it is when
    written (a 409 applies it again to the fresh one). None: nothing to write. A node without
    a record is seeded from its annotations (the upgrade to records), written only when
    there is something to keep."""
    def change(current: NodeRecord | None) -> NodeRecord | None:
        base = current if current is not None else seed_from_annotations(
            node.name, node.uid, node.annotations, datetime.fromtimestamp(now, UTC))
        new = _next_record(node, base, r, inp, now)
        if current is None:
            keep = new.history or new.acknowledged or new.sightings or \
                new.seeded_from_annotations
            return new if keep else None
        return None if _same(new, current) else new
    return change


def _learned(node: GpuNode, r: NodeReadings, inp: ObserveInput,
             now: float) -> tuple[Tracks, RecordChange | None]:
    """What one observation teaches about a node: its XID tracks (for the verdict) and the
    change to write to its record (None: nothing changed). An unreadable record is never
    written; the node is judged with no acknowledgements and no sightings."""
    if node.record is None:
        return {}, None
    change = _record_change(node, r, inp, now)
    new = change(node.record if node.record_exists else None)
    after = new or node.record
    # The verdict judges by the record as this observation leaves it (a replaced machine
    # inherits no acknowledgement).
    node.acknowledged = dict(after.acknowledged)
    return after.sightings, (change if new is not None else None)


NOTICE_REPEAT = timedelta(hours=6)
"""A lasting condition (an exporter down all day) is announced again this often."""
BLIND_NOTICE_REPEAT = timedelta(days=365)
"""Blind rules are the exporter's configuration: announced once per change (and again after
a worker restart), not every few hours for as long as the counter file stays as it is."""


def _mark_repeats(verdict: Verdict, repeats: list[Repeat]) -> Verdict:
    """Say in the finding that an acknowledged XID came back, and how it was seen."""
    by_gpu = {(r.gpu, r.xid): r for r in repeats}
    findings = []
    for f in verdict.findings:
        r = by_gpu.get((gpu_key(f), int(f.value))) if f.signal == SIG_XID else None
        if r is not None:
            note = (f"repeat of acknowledged XID {r.xid}: DCGM_EXP_XID_ERRORS_COUNT rose "
                    f"from {r.before} to {r.after}")
            f = f.model_copy(update={"detail": f"{f.detail}; {note}" if f.detail else note})
        findings.append(f)
    return verdict.model_copy(update={"findings": findings})


OBSERVE_HEARTBEAT_SECONDS = 5.0


async def _heartbeat_every(seconds: float) -> None:
    while True:
        if activity.in_activity():
            activity.heartbeat("observing")
        await asyncio.sleep(seconds)


def _node_gpus(n: GpuNode, readings: dict[str, NodeReadings]) -> int:
    """A node's GPUs for the GPU budgets: its capacity, or what its exporter showed where
    that is more (GPUs that fell off the bus still count)."""
    r = readings.get(n.name)
    return max(n.capacity_gpus, len(r.gpus) if r is not None else 0,
               (r.declared_gpus or 0) if r is not None else 0)


def _domains(labels: list[str], nodes: list[GpuNode], readings: dict[str, NodeReadings],
             named: set[str]) -> dict[str, Any]:
    """The fault domain fields of the observation: each level's nodes and GPUs per domain
    (a node without the label in the level's unlabelled domain, ''), and the domains and
    GPUs of the nodes admission may count. A node's GPUs: its capacity, or what its
    exporter showed where that is more (GPUs that fell off the bus still count)."""
    def gpus(n: GpuNode) -> int:
        return _node_gpus(n, readings)

    sizes: dict[str, dict[str, int]] = {label: {} for label in labels}
    gpu_sizes: dict[str, dict[str, int]] = {label: {} for label in labels}
    domains_of: dict[str, dict[str, str]] = {}
    gpus_of: dict[str, int] = {}
    managed = 0
    for n in nodes:
        count = gpus(n)
        managed += count
        mine = {label: n.labels.get(label, "")[:63] for label in labels}
        for label, dom in mine.items():
            sizes[label][dom] = sizes[label].get(dom, 0) + 1
            gpu_sizes[label][dom] = gpu_sizes[label].get(dom, 0) + count
        if n.name in named:
            gpus_of[n.name] = count
            if labels:
                domains_of[n.name] = mine
    return {"domains_of": domains_of, "domain_sizes": sizes if labels else {},
            "domain_gpus": gpu_sizes if labels else {}, "gpus_of": gpus_of,
            "managed_gpus": managed}


class FleetActivities(ThermalActivities, OrphanActivities, AdmissionReporting,
                      ExporterReading, NodeListing):
    def __init__(self, api: client.ApiClient, exporter: ExporterSettings, *,
                 prometheus: PrometheusSource | None = None, node_selector: str = "",
                 record_namespace: str | None = None, jobs_namespace: str = "") -> None:
        self.core = client.CoreV1Api(api)
        self.jobs_namespace = jobs_namespace
        """Where node Jobs run: release-orphan deletes a dead remediation's Jobs there."""
        self.nodes = NodeActivities(api, record_namespace)
        self.records = RecordStore(self.core, record_namespace)
        self.ledger = LedgerStore(self.core, record_namespace)
        """The repair ledger (activities/ledger.py), read for probation and lemons."""
        """The node records (activities/record.py); None: ``record.set_record_namespace``'s."""
        self._records_lock = threading.Lock()
        self._records_listed: tuple[float, dict[str, Loaded]] | None = None
        self._mismatch_reported: dict[str, str] = {}
        self.exporter = exporter
        self.prometheus = prometheus
        """The Prometheus source that ``exporter.mode == "prometheus"`` reads."""
        self.node_selector = node_selector
        """A label selector for the GPU nodes (the original tool's ``-node-selector``); empty:
        every node with ``nvidia.com/gpu`` capacity."""
        self.notices = NoticeBook(repeat_after=NOTICE_REPEAT)
        self.rates = CounterRates()
        self.signals = SignalWatch()
        """Per node: the exporter families seen recently (blind rules) and the last windowed
        XID counts (repeats of acknowledged XIDs)."""
        self.blind_book = NoticeBook(repeat_after=BLIND_NOTICE_REPEAT)
        self._last_listed: dict[tuple[int, int], set[str]] = {}
        self._list_lock = threading.Lock()
        self._listed: tuple[float, list[client.V1Node]] | None = None

    # ------------------------------------------------------------ activities

    @activity.defn
    async def observe_fleet(self, inp: ObserveInput) -> FleetObservation:
        # A heartbeat every few seconds whatever the observation is doing, so that the
        # detector's heartbeat timeout notices a worker that died mid-tick within seconds,
        # not at the end of observe_timeout.
        beating = asyncio.create_task(_heartbeat_every(OBSERVE_HEARTBEAT_SECONDS))
        try:
            if not (inp.lease_workflows and activity.in_activity()):
                return await self._observe_fleet(inp)
            # The detector's lease holders, looked up beside the fleet (workflows/leases.py).
            obs, holders = await asyncio.gather(
                self._observe_fleet(inp),
                lease_statuses(activity.client(), inp.lease_task_queue, inp.lease_workflows))
            return obs.model_copy(update={"lease_holders": holders})
        except Exception as err:
            metrics.OBSERVATION_ERRORS.labels(type(err).__name__).inc()
            raise
        finally:
            beating.cancel()

    async def _observe_fleet(self, inp: ObserveInput) -> FleetObservation:
        started = time.monotonic()
        # A node-only observation (inp.nodes: a detector woken by their reports) reads those
        # nodes and their records alone, and sets no fleet-wide figure or metric.
        whole = not inp.nodes
        if whole:
            listed = [n for n in await asyncio.to_thread(self.list_gpu_nodes)
                      if shard_of(n.name, inp.shards) == inp.shard]
        else:
            listed = await asyncio.to_thread(self.read_gpu_nodes, inp.nodes)
        nodes = [n for n in listed if not n.excluded]
        # Acknowledgements and sightings from the records (one List per tick), never from
        # the annotations: those only mirror them.
        records = await asyncio.to_thread(self.list_records) if whole else \
            await asyncio.to_thread(self.read_records, [n.name for n in listed])
        now_dt = datetime.now(UTC)
        for n in nodes:
            n.use_record(records.get(n.name), now_dt)
        names = [n.name for n in nodes if not n.unreadable]
        readings, errors = await self.read_many(names, nodes, inp.policy.links)
        errors.update({n.name: f"{n.name}: {n.unreadable}" for n in nodes if n.unreadable})
        verdicts: list[Verdict] = []
        app_only: list[Verdict] = []
        xid_warnings: list[Notice] = []
        writes: list[tuple[GpuNode, RecordChange | None]] = []
        now = time.time()
        blind: dict[str, list[BlindSignal]] = {}
        self.signals.forget_older_than(now)
        reported = reports_by_node(inp.reports)
        for node in nodes:
            r = readings.get(node.name)
            if r is None:
                if node.record is not None and mirror_mismatches(
                        node.record, node.annotations, HISTORY_LIMIT, now_dt):
                    writes.append((node, None))
                continue
            tracks, change = _learned(node, r, inp, now)
            blind[node.name], repeats = self.signals.observe(r, inp.policy, now,
                                                             node.acknowledged)
            # What the node itself reported (gpu-remediate watch) is fresher than its
            # exporter: merged for this verdict only, never into what the node records.
            seen, acked = merge_reports(r, node.acknowledged, reported.get(node.name, ()),
                                        inp.policy)
            # An acknowledged XID that came back (its windowed count rose) is news again.
            back = {x.gpu for x in repeats}
            acked = {k: v for k, v in acked.items() if k not in back}
            verdict = evaluate_node(seen, inp.policy, acknowledged_xids=acked,
                                    xid_repeats=repeat_counts(tracks, inp.policy, now))
            if repeats:
                verdict = _mark_repeats(verdict, repeats)
            # alert and diagnose are reported (Events, metric), never admitted: see
            # policy.models.NODE_ACTIONS.
            if verdict.action in NODE_ACTIONS:
                verdicts.append(verdict)
            elif verdict.action != Action.NONE:
                app_only.append(verdict)
            if node.state == NodeState.HEALTHY and inp.track_xid_repeats:
                # Once per appearance: the tracks remember what the gauge showed before.
                xid_warnings.extend(
                    Notice(node=node.name, reason=w.reason, message=w.message,
                           fingerprint=f"{w.finding.gpu}/{w.finding.value:g}/{now}")
                    for w in new_warnings(node.xid_tracks, tracks, verdict, inp.policy, now))
            if change is not None or node.record is None or mirror_mismatches(
                    node.record, node.annotations, HISTORY_LIMIT, now_dt):
                writes.append((node, change))
        # What the tick learned is written only by the detector's own observation: not in
        # its dry-run (track_xid_repeats off), not outside a worker (`gpu-remediate plan`
        # changes nothing; its verdicts use the same tracks, kept in memory).
        async def write() -> None:
            if inp.track_xid_repeats and activity.in_activity():
                await self._record_many(writes, records, now_dt)

        async def read_ledger() -> tuple[dict[str, LedgerNote], str]:
            if not (inp.ledger_lookback and verdicts):
                return {}, ""
            uids = {n.name: n.uid for n in nodes}
            return await asyncio.to_thread(self.ledger_notes, verdicts, uids,
                                           inp.ledger_lookback, now_dt)

        labelled = [n for n in listed if n.state != NodeState.HEALTHY]
        # Per-GPU isolation leaves its node unlabelled: its held GPUs are in the record.
        held_gpus = {n.name: loaded.record for n in nodes if n.state == NodeState.HEALTHY
                     and (loaded := records.get(n.name)) is not None
                     and loaded.record is not None and loaded.record.gpu_quarantines}
        # The record writes, the ledger, the orphans and the Events need nothing of each
        # other: at once, so the observation (of a reported node, on the path to its
        # cordon) waits for the longest of them, not their sum. Each keeps its own errors.
        _, (ledger, ledger_trouble), orphans, _ = await asyncio.gather(
            write(), read_ledger(),
            self.find_orphans(labelled, count=whole, held_gpus=held_gpus),
            self._announce(inp, nodes, errors, app_only, xid_warnings,
                           [*verdicts, *app_only], blind))
        # Ours is what carries our taint or has its remediation running. A state label
        # alone, with neither, is the node's own word (a kubelet can label its own Node):
        # it holds no budget slot, or one compromised node could stall every admission.
        # An orphan under our taint (a remediation that died) keeps its slot: fail closed.
        unclaimed = {n.name: n for n in labelled if n.name in orphans and not n.tainted}
        remediating = [NodeStatus(node=n.name, state=n.state, workflow_id=n.workflow_id,
                                  excluded=n.excluded, tainted=n.tainted,
                                  label=n.labels.get(STATE_LABEL, "")[:63])
                       for n in labelled if n.name not in unclaimed]
        pool_of: dict[str, str] = {}
        pool_sizes: dict[str, int] = {}
        pool_gpus: dict[str, int] = {}
        if inp.pool_label:
            named = {v.node for v in verdicts} | {r.node for r in remediating}
            for gpu_node in nodes:
                pool = gpu_node.labels.get(inp.pool_label, "")
                pool_sizes[pool] = pool_sizes.get(pool, 0) + 1
                pool_gpus[pool] = pool_gpus.get(pool, 0) + _node_gpus(gpu_node, readings)
                if gpu_node.name in named:
                    pool_of[gpu_node.name] = pool
        if whole:
            self._fleet_metrics(inp, listed, nodes, blind, len(verdicts), len(errors))
        # Markers that disagree (a node writing its own state): shown, not announced as
        # telemetry trouble; the node already counts as out of service.
        notes = [f"{n.name}: {n.marker_note}" for n in listed
                 if n.marker_note and n.name not in unclaimed]
        notes += [f"{name}: state label {n.labels.get(STATE_LABEL, '')[:63]!r} without the "
                  f"{TAINT_KEY} taint and no remediation running: not ours, holds no budget "
                  "slot (release-orphan clears the label)" for name, n in unclaimed.items()]
        metrics.UNCLAIMED_LABELS.set(len(unclaimed))
        if ledger_trouble:
            notes.append(ledger_trouble)
        # Other controllers at work: reported when the node is flagged (it waits for them)
        # or out of service (their disruption takes budget, like ours).
        flagged = {v.node for v in verdicts}
        held = [NeighbourHold(node=n.name, by=n.hold.by, detail=n.hold.detail[:200],
                              out_of_service=n.unschedulable and n.hold.unforgeable)
                for n in nodes if n.hold is not None and n.state == NodeState.HEALTHY
                and (n.name in flagged or n.unschedulable)]
        if inp.pool_label:
            labels_of = {n.name: n.labels for n in nodes}
            pool_of.update({h.node: labels_of[h.node].get(inp.pool_label, "")
                            for h in held})
        domains = _domains(inp.domain_labels, nodes, readings,
                           {v.node for v in verdicts} | {r.node for r in remediating}
                           | {h.node for h in held})
        if whole:
            metrics.TICK_SECONDS.observe(time.monotonic() - started)
            metrics.LAST_OBSERVATION.set_to_current_time()
        return bound_observation(FleetObservation(
            managed_nodes=len(nodes), readable_nodes=len(readings),
            verdicts=sorted(verdicts, key=lambda v: v.node), remediating=remediating,
            errors=sorted([*errors.values(), *notes])[:50], orphans=orphans, pool_of=pool_of,
            pool_sizes=pool_sizes, pool_gpus=pool_gpus, held=held, **domains,
            ledger={n: x for n, x in ledger.items()
                    if x.last_repair is not None or x.serial_faults},
        ))

    def _fleet_metrics(self, inp: ObserveInput, listed: list[GpuNode], nodes: list[GpuNode],
                       blind: dict[str, list[BlindSignal]], flagged: int,
                       unreadable: int) -> None:
        """The gauges a full observation (of this shard) sets: counts over the fleet."""
        for state in NodeState:
            metrics.NODES_BY_STATE.labels(state.value).set(
                sum(1 for n in nodes if n.state == state))
        for signal in SIGNAL_NAMES:
            metrics.SIGNAL_BLIND_NODES.labels(signal).set(
                sum(1 for b in blind.values() if any(x.signal == signal for x in b)))
        metrics.FLAGGED.set(flagged)
        metrics.UNREADABLE.set(unreadable)
        metrics.NODE_STATE.observed(
            [(n.name, n.state.value) for n in listed],
            gone=self._last_listed.get((inp.shard, inp.shards), set()) - {n.name for n in listed})
        self._last_listed[(inp.shard, inp.shards)] = {n.name for n in listed}

    def read_records(self, names: list[str]) -> dict[str, Loaded]:
        """These nodes' records (one read each), as ``list_records`` gives them."""
        return {n: loaded for n in names if (loaded := self.records.read(n)).exists}

    def ledger_notes(self, verdicts: list[Verdict], uids: dict[str, str], lookback: timedelta,
                     now: datetime) -> tuple[dict[str, LedgerNote], str]:
        """What the ledger says of each flagged node (one List of the lookback's months),
        and why it could not be read ("" when it could). Unreadable entries are skipped."""
        since = now - lookback
        try:
            read = self.ledger.read(months_between(since, now))
        except Exception as err:  # no ledger, no escalation: the policy's action stands
            log.warning("repair ledger not read: %s", err)
            return {}, (f"repair ledger not read ({type(err).__name__}: {str(err)[:200]}): "
                        "probation and lemons not applied this tick")
        return notes_for(verdicts, uids, read.entries, since), ""

    async def _announce(self, inp: ObserveInput, nodes: list[GpuNode], errors: dict[str, str],
                        app_only: list[Verdict], xid_warnings: list[Notice],
                        judged: list[Verdict],
                        blind: dict[str, list[BlindSignal]] | None = None) -> None:
        """Events for what the observation saw on nodes in service (a node in remediation
        is expected to go quiet while it reboots), rate-limited
        (activities/notices.py): ``TelemetryUnavailable`` for an exporter that could not be
        read, ``ApplicationXid`` for application XIDs, and ``xid_warnings`` (``UnknownXid``,
        ``XidAlert``, ``GPUDiagnosticNeeded``: each new once, so they go first and are counted
        in ``gpu_remediate_xid_warnings_total`` even past the Event cap), ``GpuLinkErrors`` for
        link rates over policy.links' thresholds (``judged``: every verdict with a finding;
        counted in ``gpu_remediate_link_error_findings_total``), ``SignalUnavailable`` for
        rules a node's exporter cannot feed (``blind``; once per change). Dry-run writes none
        (it changes nothing in the cluster); an Event is never worth failing the observation."""
        names = [n.name for n in nodes]
        in_service = {n.name for n in nodes if n.state == NodeState.HEALTHY}
        unreadable = {n: errors[n] for n in names if n in errors and n in in_service}
        warned = app_xid_notices(v for v in app_only if v.node in in_service)
        linked = link_notices(v for v in judged if v.node in in_service)
        for v in judged:
            for f in v.findings:
                if f.signal in LINK_SIGNALS:
                    metrics.LINK_FINDINGS.labels(_LINK_KIND[f.signal]).inc()
        # A condition gone (or a node taken into remediation) is forgotten: its return is news.
        self.notices.settle(TELEMETRY_UNAVAILABLE, unreadable, names)
        self.notices.settle(APPLICATION_XID, [n.node for n in warned], names)
        self.notices.settle(GPU_LINK_ERRORS, [n.node for n in linked], names)
        unfed = blind_notices(blind or {})
        self.blind_book.settle(SIGNAL_UNAVAILABLE, [n.node for n in unfed], names)
        # Off in the detector's dry-run (ObserveInput: no writes to nodes) and outside a
        # worker (`gpu-remediate plan` changes nothing).
        if not inp.track_xid_repeats or not activity.in_activity():
            return
        for w in xid_warnings:
            metrics.XID_WARNINGS.labels(w.reason).inc()
        try:
            sent = await send_notices(self.core, self.notices,
                                      xid_warnings + telemetry_notices(unreadable) + warned
                                      + linked,
                                      time.time())
        except Exception as err:  # Events are best effort: never fail the observation
            log.warning("could not record node Events: %s", err)
            return
        try:
            sent += await send_notices(self.core, self.blind_book, unfed, time.time())
        except Exception as err:
            log.warning("could not record SignalUnavailable Events: %s", err)
        for n in sent:
            metrics.NODE_EVENTS.labels(n.reason).inc()

    def _report_mismatch(self, node: GpuNode) -> None:
        """Count and announce a mirror that disagrees with the record, once per change: the
        same disagreement tick after tick (a write that keeps failing) is not news."""
        if node.record is None:
            return
        found = mirror_mismatches(node.record, node.annotations, HISTORY_LIMIT,
                                  datetime.now(UTC))
        if not found:
            self._mismatch_reported.pop(node.name, None)
            return
        signature = repr(sorted((k, node.annotations.get(k, "")) for k in found))
        if self._mismatch_reported.get(node.name) == signature:
            return
        self._mismatch_reported[node.name] = signature
        for key in found:
            STATE_MISMATCH.labels(MIRROR_KINDS[key]).inc()
        record_node_event(
            self.core, node.name, reason="StateMismatch", event_type="Warning",
            message="the node's annotations disagree with the controller's record, which "
                    "decides and rewrites them: " + "; ".join(found.values()))

    def _write_record(self, node: GpuNode, change: RecordChange | None, known: Loaded | None,
                      now: datetime) -> None:
        """The record first (guarded by resourceVersion), then its mirror on the node
        (guarded too: a 409 re-reads node and record and recomputes, so a concurrent
        release's mirror is never overwritten with an older record)."""
        if node.record_problem:
            report_unreadable(self.core, node.name, node.record_problem)
            return
        self._report_mismatch(node)
        rec = node.record
        try:
            if change is not None:
                rec = self.records.update(node.name, change, now, known) or rec
        except RecordUnreadable as err:
            report_unreadable(self.core, node.name, err.problem)
            return
        before = node.record.uid if node.record is not None else ""
        if rec is not None and before and rec.uid != before:
            # The name came back under another UID: the GPUs said which machine it is.
            same = rec.previous_uid == before
            record_node_event(
                self.core, node.name, reason="RecordKept" if same else "RecordReset",
                message=(f"node re-created (uid {before} -> {rec.uid}) with GPUs its record "
                         "has seen: its history and acknowledgements carry over") if same
                else (f"another machine under this name (uid {before} -> {rec.uid}, none of "
                      "its GPUs seen before): it starts a new record"))
        ann, rv = node.annotations, node.resource_version
        for _ in range(4):
            if rec is None:
                return
            diff = mirror_mismatches(rec, ann, HISTORY_LIMIT, now)
            if not diff:
                return
            want = mirror_annotations(rec, HISTORY_LIMIT)
            meta: dict[str, object] = {"annotations": {k: want[k] for k in diff}}
            if rv:
                meta["resourceVersion"] = rv
            try:
                self.core.patch_node(node.name, {"metadata": meta},
                                     _request_timeout=REQUEST_TIMEOUT)
                return
            except ApiException as err:
                if err.status != 409:
                    log.warning("could not mirror the record on %s: %s", node.name, err.status)
                    return
            try:
                fresh = self.core.read_node(node.name, _request_timeout=REQUEST_TIMEOUT)
                loaded = self.records.read(node.name)
            except ApiException as err:
                log.warning("could not re-read %s: %s", node.name, err.status)
                return
            ann = dict(fresh.metadata.annotations or {}) if fresh.metadata else {}
            rv = (fresh.metadata.resource_version if fresh.metadata else "") or ""
            rec = loaded.record if loaded.record is not None else rec

    async def _record_many(self, writes: list[tuple[GpuNode, RecordChange | None]],
                           records: dict[str, Loaded], now: datetime) -> None:
        """Write what this tick learned to the records (acknowledgements the exporter no
        longer shows, XID sightings, identity) and their mirrors, 8 nodes at a time."""
        sem = asyncio.Semaphore(8)

        async def one(node: GpuNode, change: RecordChange | None) -> None:
            async with sem:
                try:
                    # Not listed: none yet (a create that finds one is a 409, read again).
                    await asyncio.to_thread(self._write_record, node, change,
                                            records.get(node.name) or Loaded(node.name, None),
                                            now)
                except Exception as err:  # one node's record never fails the observation
                    log.warning("could not write the record of %s: %s", node.name, err)

        await asyncio.gather(*(one(n, c) for n, c in writes))
