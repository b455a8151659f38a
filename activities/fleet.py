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
import json
import logging
import threading
import time
from datetime import timedelta

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity

from activities import metrics
from activities.admission_report import AdmissionReporting
from activities.counter_rates import CounterRates
from activities.exporter_settings import ExporterSettings
from activities.fleet_nodes import GpuNode, NodeListing, _gpu_node
from activities.kube import REQUEST_TIMEOUT
from activities.node_keys import A_ACK_XIDS, A_XID_SIGHTINGS, STATE_LABEL, TAINT_KEY
from activities.nodes import NodeActivities
from activities.notices import (
    APPLICATION_XID,
    GPU_LINK_ERRORS,
    TELEMETRY_UNAVAILABLE,
    Notice,
    NoticeBook,
    app_xid_notices,
    link_notices,
    telemetry_notices,
)
from activities.notices import send as send_notices
from activities.observation_budget import bound_observation
from activities.orphans import OrphanActivities
from activities.prometheus_source import PrometheusSource
from activities.scrape import ExporterReading
from activities.thermal import ThermalActivities
from activities.xid_sightings import Tracks, dump_tracks, new_warnings, observe, repeat_counts
from policy.models import NODE_ACTIONS, Action, NodeReadings, Verdict
from policy.rules import (
    LINK_SIGNALS,
    SIG_NVLINK_CRC,
    SIG_NVLINK_ERRORS,
    SIG_PCIE_REPLAY,
    evaluate_node,
    gpu_key,
)
from workflows.ids import shard_of
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


def _learned(node: GpuNode, r: NodeReadings, inp: ObserveInput,
             now: float) -> tuple[Tracks, dict[str, str | None]]:
    """What one observation teaches about a node: its XID tracks (for the verdict) and the
    annotations to write (empty when nothing changed).

    Only a node in service learns: one in remediation has its XIDs being handled, and its
    release rewrites the same annotations. Dry-run writes nothing.
    """
    if node.state != NodeState.HEALTHY:
        return node.xid_tracks, {}
    annotations: dict[str, str | None] = {}
    tracks = node.xid_tracks
    if inp.track_xid_repeats:
        tracks = observe(node.xid_tracks, r, inp.policy, now)
        if (text := dump_tracks(tracks)) != dump_tracks(node.xid_tracks):
            annotations[A_XID_SIGHTINGS] = text
    kept = _still_shown(node.acknowledged, r)
    if kept != node.acknowledged:
        annotations[A_ACK_XIDS] = json.dumps(kept, sort_keys=True) if kept else None
    return tracks, annotations


NOTICE_REPEAT = timedelta(hours=6)
"""A lasting condition (an exporter down all day) is announced again this often."""


OBSERVE_HEARTBEAT_SECONDS = 5.0


async def _heartbeat_every(seconds: float) -> None:
    while True:
        if activity.in_activity():
            activity.heartbeat("observing")
        await asyncio.sleep(seconds)


class FleetActivities(ThermalActivities, OrphanActivities, AdmissionReporting,
                      ExporterReading, NodeListing):
    def __init__(self, api: client.ApiClient, exporter: ExporterSettings, *,
                 prometheus: PrometheusSource | None = None, node_selector: str = "") -> None:
        self.core = client.CoreV1Api(api)
        self.nodes = NodeActivities(api)
        self.exporter = exporter
        self.prometheus = prometheus
        """The Prometheus source that ``exporter.mode == "prometheus"`` reads."""
        self.node_selector = node_selector
        """A label selector for the GPU nodes (the original tool's ``-node-selector``); empty:
        every node with ``nvidia.com/gpu`` capacity."""
        self.notices = NoticeBook(repeat_after=NOTICE_REPEAT)
        self.rates = CounterRates()
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
            return await self._observe_fleet(inp)
        except Exception as err:
            metrics.OBSERVATION_ERRORS.labels(type(err).__name__).inc()
            raise
        finally:
            beating.cancel()

    async def _observe_fleet(self, inp: ObserveInput) -> FleetObservation:
        started = time.monotonic()
        listed = [n for n in await asyncio.to_thread(self.list_gpu_nodes)
                  if shard_of(n.name, inp.shards) == inp.shard]
        nodes = [n for n in listed if not n.excluded]
        # A node whose annotations cannot be read is unreadable (that node only, with the
        # reason), never judged on half its state; its remediation, if any, goes on.
        names = [n.name for n in nodes if not n.unreadable]
        readings, errors = await self.read_many(names, nodes, inp.policy.links)
        errors.update({n.name: f"{n.name}: {n.unreadable}" for n in nodes if n.unreadable})
        verdicts: list[Verdict] = []
        app_only: list[Verdict] = []
        xid_warnings: list[Notice] = []
        writes: list[tuple[GpuNode, NodeReadings, dict[str, str | None]]] = []
        now = time.time()
        reported = reports_by_node(inp.reports)
        for node in nodes:
            r = readings.get(node.name)
            if r is None:
                continue
            tracks, annotations = _learned(node, r, inp, now)
            # What the node itself reported (gpu-remediate watch) is fresher than its
            # exporter: merged for this verdict only, never into what the node records.
            seen, acked = merge_reports(r, node.acknowledged, reported.get(node.name, ()),
                                        inp.policy)
            verdict = evaluate_node(seen, inp.policy, acknowledged_xids=acked,
                                    xid_repeats=repeat_counts(tracks, inp.policy, now))
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
            if annotations:
                writes.append((node, r, annotations))
        # What the tick learned is written only by the detector's own observation: not in
        # its dry-run (track_xid_repeats off), not outside a worker (`gpu-remediate plan`
        # changes nothing; its verdicts use the same tracks, kept in memory).
        if inp.track_xid_repeats and activity.in_activity():
            await self._annotate_many(writes, inp, now)
        labelled = [n for n in listed if n.state != NodeState.HEALTHY]
        orphans = await self.find_orphans(labelled)
        # Ours is what carries our taint or has its remediation running. A state label
        # alone, with neither, is the node's own word (a kubelet can label its own Node):
        # it holds no budget slot, or one compromised node could stall every admission.
        # An orphan under our taint (a remediation that died) keeps its slot: fail closed.
        unclaimed = {n.name: n for n in labelled if n.name in orphans and not n.tainted}
        remediating = [NodeStatus(node=n.name, state=n.state, workflow_id=n.workflow_id,
                                  excluded=n.excluded) for n in labelled
                       if n.name not in unclaimed]
        pool_of: dict[str, str] = {}
        pool_sizes: dict[str, int] = {}
        if inp.pool_label:
            named = {v.node for v in verdicts} | {r.node for r in remediating}
            for gpu_node in nodes:
                pool = gpu_node.labels.get(inp.pool_label, "")
                pool_sizes[pool] = pool_sizes.get(pool, 0) + 1
                if gpu_node.name in named:
                    pool_of[gpu_node.name] = pool
        for state in NodeState:
            metrics.NODES_BY_STATE.labels(state.value).set(
                sum(1 for n in nodes if n.state == state))
        metrics.FLAGGED.set(len(verdicts))
        metrics.UNREADABLE.set(len(errors))
        metrics.NODE_STATE.observed(
            [(n.name, n.state.value) for n in listed],
            gone=self._last_listed.get((inp.shard, inp.shards), set()) - {n.name for n in listed})
        self._last_listed[(inp.shard, inp.shards)] = {n.name for n in listed}
        await self._announce(inp, nodes, errors, app_only, xid_warnings,
                             [*verdicts, *app_only])
        # Markers that disagree (a node writing its own state): shown, not announced as
        # telemetry trouble; the node already counts as out of service.
        notes = [f"{n.name}: {n.marker_note}" for n in listed
                 if n.marker_note and n.name not in unclaimed]
        notes += [f"{name}: state label {n.labels.get(STATE_LABEL, '')[:63]!r} without the "
                  f"{TAINT_KEY} taint and no remediation running: not ours, holds no budget "
                  "slot (release-orphan clears the label)" for name, n in unclaimed.items()]
        metrics.UNCLAIMED_LABELS.set(len(unclaimed))
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
        metrics.TICK_SECONDS.observe(time.monotonic() - started)
        metrics.LAST_OBSERVATION.set_to_current_time()
        return bound_observation(FleetObservation(
            managed_nodes=len(nodes), readable_nodes=len(readings),
            verdicts=sorted(verdicts, key=lambda v: v.node), remediating=remediating,
            errors=sorted([*errors.values(), *notes])[:50], orphans=orphans, pool_of=pool_of,
            pool_sizes=pool_sizes, held=held,
        ))

    async def _announce(self, inp: ObserveInput, nodes: list[GpuNode], errors: dict[str, str],
                        app_only: list[Verdict], xid_warnings: list[Notice],
                        judged: list[Verdict]) -> None:
        """Events for what the observation saw on nodes in service (a node in remediation
        is expected to go quiet while it reboots), rate-limited
        (activities/notices.py): ``TelemetryUnavailable`` for an exporter that could not be
        read, ``ApplicationXid`` for application XIDs, and ``xid_warnings`` (``UnknownXid``,
        ``XidAlert``, ``GPUDiagnosticNeeded``: each new once, so they go first and are counted
        in ``gpu_remediate_xid_warnings_total`` even past the Event cap), ``GpuLinkErrors`` for
        link rates over policy.links' thresholds (``judged``: every verdict with a finding;
        counted in ``gpu_remediate_link_error_findings_total``). Dry-run writes none
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
        for n in sent:
            metrics.NODE_EVENTS.labels(n.reason).inc()

    async def _annotate_many(
            self, writes: list[tuple[GpuNode, NodeReadings, dict[str, str | None]]],
            inp: ObserveInput, now: float, attempts: int = 4) -> None:
        """Write what this tick learned: acknowledgements the exporter no longer shows
        (it restarted, the XID series reset; the same XID again counts as new) and XID
        sightings. Each patch is conditional on the node's resourceVersion; on a conflict
        (a kubelet heartbeat, a claim, a release) the node is read again and what to write
        is recomputed from its fresh annotations, so nothing is lost and a concurrent
        release is never overwritten with stale sightings."""
        sem = asyncio.Semaphore(8)

        async def one(node: GpuNode, r: NodeReadings,
                      annotations: dict[str, str | None]) -> None:
            for attempt in range(attempts):
                meta: dict[str, object] = {"annotations": annotations}
                if node.resource_version:
                    meta["resourceVersion"] = node.resource_version
                try:
                    async with sem:
                        await asyncio.to_thread(self.core.patch_node, node.name,
                                                {"metadata": meta},
                                                _request_timeout=REQUEST_TIMEOUT)
                    return
                except ApiException as err:
                    if err.status != 409 or attempt == attempts - 1:
                        log.warning("could not update %s on %s: %s",
                                    ", ".join(sorted(annotations)), node.name, err.status)
                        return
                try:
                    async with sem:
                        fresh = await asyncio.to_thread(self.core.read_node, node.name,
                                                        _request_timeout=REQUEST_TIMEOUT)
                except ApiException as err:
                    log.warning("could not re-read %s: %s", node.name, err.status)
                    return
                node = _gpu_node(fresh)
                _, annotations = _learned(node, r, inp, now)
                if not annotations:
                    return  # taken into remediation, or someone wrote the same

        await asyncio.gather(*(one(n, r, a) for n, r, a in writes))
