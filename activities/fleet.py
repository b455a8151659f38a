"""Observe the fleet: list GPU nodes, scrape their exporters, evaluate the policy.

One activity per detector tick for the whole fleet. It returns only the nodes
that need attention, so the detector's history grows by a constant per tick
whatever the fleet size. An exporter that cannot be read makes its node
"unreadable", never "unhealthy".
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import aiohttp
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from activities import annotations as node_annotations
from activities import metrics
from activities.counter_rates import CounterRates
from activities.events import record_node_event
from activities.gpus import GPU_RESOURCE, declared_gpus
from activities.kube import REQUEST_TIMEOUT, meta_dict, raise_typed
from activities.neighbours import Hold, neighbour_hold
from activities.node_keys import (
    A_ACK_XIDS,
    A_ACTION,
    A_ORPHAN,
    A_PRECORDONED,
    A_REASON,
    A_SINCE,
    A_WORKFLOW,
    A_XID_SIGHTINGS,
    EXCLUDE_LABEL,
    LEGACY_EXCLUDE_LABEL,
    STATE_LABEL,
    TAINT_KEY,
)
from activities.nodes import NodeActivities
from activities.notices import (
    APPLICATION_XID,
    CIRCUIT_BREAKER_OPEN,
    GPU_LINK_ERRORS,
    REMEDIATION_DEFERRED,
    TELEMETRY_UNAVAILABLE,
    Notice,
    NoticeBook,
    app_xid_notices,
    breaker_notices,
    deferred_notices,
    link_notices,
    telemetry_notices,
)
from activities.notices import send as send_notices
from activities.observation_budget import bound_observation
from activities.parse_pool import (
    PARSE_ON_LOOP_BYTES,
    BodyError,
    ParsePool,
    default_workers,
    read_body,
)
from activities.parse_pool import looks_intact as looks_intact  # re-exported: same check
from activities.prometheus_source import PrometheusSource
from activities.xid_sightings import Tracks, dump_tracks, new_warnings, observe, repeat_counts
from policy.config import LinkPolicy
from policy.models import NODE_ACTIONS, Action, GpuReading, NodeReadings, Verdict
from policy.rules import (
    LINK_SIGNALS,
    SIG_NVLINK_CRC,
    SIG_NVLINK_ERRORS,
    SIG_PCIE_REPLAY,
    evaluate_node,
    gpu_key,
    is_thermal_recovered,
)
from workflows import errors as error_types
from workflows.ids import remediation_workflow_id, shard_of
from workflows.messages import (
    AdmissionReport,
    DetectorView,
    FleetObservation,
    HistoryEntry,
    NeighbourHold,
    NodeHealth,
    NodeHealthInput,
    NodeStatus,
    ObserveInput,
    OrphanRelease,
    ReleaseInput,
    ThermalCheckInput,
    ThermalCheckResult,
    ThermalWatchInput,
    ThermalWatchResult,
)
from workflows.transitions import NodeState, Outcome

log = logging.getLogger(__name__)

_LINK_KIND = {SIG_PCIE_REPLAY: "pcie_replay", SIG_NVLINK_CRC: "nvlink_crc",
              SIG_NVLINK_ERRORS: "nvlink_errors"}



@dataclass(frozen=True)
class ExporterSettings:
    """Where each node's dcgm-exporter is."""

    mode: Literal["template", "discover", "prometheus"] = "discover"
    url_template: str = "http://{node}:9400/metrics"
    namespace: str = "gpu-operator"
    label_selector: str = "app=nvidia-dcgm-exporter"
    port: int = 9400
    path: str = "/metrics"
    timeout_seconds: float = 5.0
    max_bytes: int = 4 * 1024 * 1024
    concurrency: int = 64
    parse_helper_from: int = 2000
    """Fleets of at least this many scraped nodes also parse in a helper process (when the
    machine has a core to spare); smaller ones do not pay its start-up. 0: never."""
    prometheus: PrometheusSource | None = None
    prometheus_thermal_hold: timedelta = timedelta(minutes=2)


class ScrapeError(Exception):
    pass


@dataclass
class GpuNode:
    name: str
    state: NodeState
    workflow_id: str
    acknowledged: dict[str, int]
    labels: dict[str, str]
    orphan_marked: bool = False
    excluded: bool = False
    xid_tracks: Tracks = field(default_factory=dict)
    resource_version: str = ""
    unreadable: str = ""
    """Why an annotation the node carries could not be read (activities/annotations.py):
    the node is reported unreadable rather than judged on half its state."""
    marker_note: str = ""
    """Why our markers on the node disagree (see _state): shown with the observation's
    errors, the node is counted out of service."""
    hold: Hold | None = None
    """Another controller acting on the node (activities/neighbours.py)."""
    unschedulable: bool = False
    tainted: bool = False
    """Carries our taint: the one marker of ours a kubelet cannot write (see _state)."""


def _state(value: str | None, tainted: bool = False) -> tuple[NodeState, str]:
    """The node's remediation state from what it carries, failing closed.

    A kubelet may rewrite its own Node's labels and annotations (not its taints): an unknown
    state value, or the healthy state under our taint (a node relabelling itself healthy
    mid-drain to free a budget slot), counts as out of service (repairing) with a note,
    never as healthy. Returns the state and the note ("" when the markers agree)."""
    if value:
        try:
            state = NodeState(value)
        except ValueError:
            return NodeState.REPAIRING, (f"state label {value[:63]!r} is not one of ours: "
                                         "counted as out of service")
    else:
        state = NodeState.HEALTHY
    if state == NodeState.HEALTHY and tainted:
        return NodeState.REPAIRING, (f"carries the {TAINT_KEY} taint but its state label says "
                                     "healthy: counted as out of service")
    if state == NodeState.QUARANTINED and not tainted:
        # Our quarantine always carries our taint. A label alone does not count toward the
        # quarantine cap or the outcome breaker (one node could stall every admission).
        return NodeState.REPAIRING, ("labelled quarantined without the "
                                     f"{TAINT_KEY} taint: counted as out of service, not as "
                                     "quarantined")
    return state, ""


def _slim_nodes(body: bytes) -> list[client.V1Node]:
    """A NodeList's nodes with only what the observation reads: name, labels, annotations,
    resourceVersion, unschedulable, taints, capacity. The client's full deserialisation
    (conditions, addresses, images, node info, one model object each) was ~0.7 ms of CPU
    per node, most of a 20,000-node tick; this is json.loads and a few objects."""
    doc = json.loads(body)
    nodes = []
    for item in doc.get("items") or []:
        md, spec, status = (item.get(k) or {} for k in ("metadata", "spec", "status"))
        taints = [client.V1Taint(key=str(t.get("key") or ""), effect=str(t.get("effect") or ""),
                                 value=t.get("value"))
                  for t in spec.get("taints") or []]
        nodes.append(client.V1Node(
            metadata=client.V1ObjectMeta(
                name=md.get("name"), labels=md.get("labels"),
                annotations=md.get("annotations"),
                resource_version=md.get("resourceVersion")),
            spec=client.V1NodeSpec(unschedulable=spec.get("unschedulable"),
                                   taints=taints or None),
            status=client.V1NodeStatus(capacity=status.get("capacity"))))
    return nodes


def _taint_keys(n: client.V1Node) -> set[str]:
    spec = getattr(n, "spec", None)
    return {t.key for t in ((spec.taints or []) if spec else []) if t.key}


def _tainted(n: client.V1Node) -> bool:
    return TAINT_KEY in _taint_keys(n)


def _excluded(labels: dict[str, str]) -> tuple[bool, str]:
    if labels.get(EXCLUDE_LABEL) == "true":
        return True, ""
    if labels.get(LEGACY_EXCLUDE_LABEL) == "true":
        return False, (f"{LEGACY_EXCLUDE_LABEL}=true ignored (a kubelet can set it): opt out "
                       f"with {EXCLUDE_LABEL}=true")
    return False, ""


def _still_shown(acked: dict[str, int], readings: NodeReadings) -> dict[str, int]:
    """The acknowledgements whose GPU still reports exactly that XID value."""
    shown = {gpu_key(g): g.xid for g in readings.gpus}
    return {k: v for k, v in acked.items() if shown.get(k) == v}


def _our_workflow(name: str, ann: dict[str, str]) -> str:
    """The remediation workflow the node's annotation names, when it is this node's own: the
    annotation is node-writable, and a node naming another node's workflow must not lead an
    operator (or us) to that one."""
    wid = ann.get(A_WORKFLOW, "")
    return wid if wid == remediation_workflow_id(name) else ""


def _gpu_node(n: client.V1Node) -> GpuNode:
    labels, ann = meta_dict(n, "labels"), meta_dict(n, "annotations")
    assert n.metadata is not None and n.metadata.name
    acked = node_annotations.parse_acknowledged(A_ACK_XIDS, ann.get(A_ACK_XIDS))
    tracks = node_annotations.parse_tracks(A_XID_SIGHTINGS, ann.get(A_XID_SIGHTINGS))
    problem = acked.problem or tracks.problem
    state, note = _state(labels.get(STATE_LABEL), _tainted(n))
    excluded, exclude_note = _excluded(labels)
    return GpuNode(n.metadata.name, state, _our_workflow(n.metadata.name, ann),
                   acked.value, labels, A_ORPHAN in ann, excluded, tracks.value,
                   n.metadata.resource_version or "", str(problem) if problem else "",
                   "; ".join(x for x in (note, exclude_note) if x),
                   neighbour_hold(labels, ann, _taint_keys(n)),
                   bool(getattr(getattr(n, "spec", None), "unschedulable", False)),
                   _tainted(n))


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


def _acknowledged(text: str | None) -> dict[str, int]:
    # The one defensive reader (activities/annotations.py); unreadable reads as none here.
    return node_annotations.parse_acknowledged(A_ACK_XIDS, text).value


NOTICE_REPEAT = timedelta(hours=6)
"""A lasting condition (an exporter down all day) is announced again this often."""


OBSERVE_HEARTBEAT_SECONDS = 5.0


async def _heartbeat_every(seconds: float) -> None:
    while True:
        if activity.in_activity():
            activity.heartbeat("observing")
        await asyncio.sleep(seconds)


class FleetActivities:
    def __init__(self, api: client.ApiClient, exporter: ExporterSettings, *,
                 node_selector: str = "") -> None:
        self.core = client.CoreV1Api(api)
        self.nodes = NodeActivities(api)
        self.exporter = exporter
        self.node_selector = node_selector
        """A label selector for the GPU nodes (the original tool's ``-node-selector``); empty:
        every node with ``nvidia.com/gpu`` capacity."""
        self.notices = NoticeBook(repeat_after=NOTICE_REPEAT)
        self.rates = CounterRates()
        self._last_listed: dict[tuple[int, int], set[str]] = {}
        self._list_lock = threading.Lock()
        self._listed: tuple[float, list[client.V1Node]] | None = None

    # ------------------------------------------------------------ kubernetes side

    def _list_nodes(self) -> list[client.V1Node]:
        """Every node, or with a selector the selected ones plus every node in remediation:
        a node that loses the selected label mid-remediation keeps its budget slot.

        The shards of one observation that run on this worker at the same time share one
        list: a call that overlaps a list in flight waits for it and takes its result (it
        could not see a fresher one than a list that was still running when it was made);
        a later call lists again. Each shard listing the fleet would cost every worker
        O(shards x nodes) per tick (docs/performance.md, "A 50,000-node fleet")."""
        called = time.monotonic()
        with self._list_lock:
            shared = self._listed
            if shared is not None and shared[0] >= called:
                return shared[1]
            nodes = self._list_nodes_now()
            self._listed = (time.monotonic(), nodes)
            return nodes

    def _list_nodes_now(self) -> list[client.V1Node]:
        def listed(selector: str | None = None) -> list[client.V1Node]:
            # The undecoded response (urllib3's), parsed by _slim_nodes.
            raw: Any = self.core.list_node(label_selector=selector,
                                           _request_timeout=REQUEST_TIMEOUT,
                                           _preload_content=False)
            return _slim_nodes(raw.data)

        try:
            if not self.node_selector:
                return listed()
            chosen = listed(self.node_selector)
            labelled = listed(STATE_LABEL)
        except ApiException as err:
            raise_typed(err, "list nodes")
        # The later list wins for a node in both: it is the fresher state label.
        by_name = {n.metadata.name: n for n in chosen if n.metadata}
        by_name.update({n.metadata.name: n for n in labelled if n.metadata})
        return list(by_name.values())

    def list_gpu_nodes(self) -> list[GpuNode]:
        """Nodes with GPU capacity (or the selected ones) that have not opted out."""
        items = self._list_nodes()
        nodes = []
        for n in items:
            labels = meta_dict(n, "labels")
            state, _ = _state(labels.get(STATE_LABEL), _tainted(n))
            excluded, _ = _excluded(labels)
            # An opt-out label added mid-remediation must not free the node's budget
            # slot: such a node is still reported, only never flagged or started again.
            if excluded and state == NodeState.HEALTHY:
                continue
            capacity = (n.status.capacity or {}) if n.status else {}
            # With a selector, its label (GPU feature discovery's, set from the PCI bus) says
            # GPU node, not the capacity: a node whose GPUs all fell off advertises none.
            if not self.node_selector and state == NodeState.HEALTHY and \
                    str(capacity.get(GPU_RESOURCE, "0")) in ("0", ""):
                continue
            nodes.append(_gpu_node(n))
        return nodes

    def endpoints(self, nodes: list[str]) -> dict[str, str]:
        if self.exporter.mode == "template":
            return {n: self.exporter.url_template.format(node=n) for n in nodes}
        try:
            pods = self.core.list_namespaced_pod(
                self.exporter.namespace, label_selector=self.exporter.label_selector,
                _request_timeout=REQUEST_TIMEOUT,
            ).items
        except ApiException as err:
            raise_typed(err, "list dcgm-exporter pods")
        wanted = set(nodes)
        found: dict[str, str] = {}
        for pod in pods:
            node = pod.spec.node_name if pod.spec else None
            ip = pod.status.pod_ip if pod.status else None
            phase = pod.status.phase if pod.status else None
            if node in wanted and ip and phase == "Running":
                host = f"[{ip}]" if ":" in ip else ip
                found[node] = f"http://{host}:{self.exporter.port}{self.exporter.path}"
        return found

    # ------------------------------------------------------------ exporter side

    async def scrape(self, http: aiohttp.ClientSession, node: str, url: str, *,
                     pool: ParsePool | None = None) -> NodeReadings:
        """One node's readings from its exporter, or ``ScrapeError``. With ``pool``, the
        body may be parsed in the helper process; the result or the error is the same."""
        return await self._readings(node, await self._fetch(http, url), pool)

    async def _fetch(self, http: aiohttp.ClientSession, url: str) -> bytes:
        try:
            # Never follow a redirect: an exporter must not send the worker to another
            # address (blind requests inside the cluster, their status shown to operators).
            async with http.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status}" + (
                        " (redirects are not followed)" if 300 <= resp.status < 400 else ""))
                chunks, size = [], 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > self.exporter.max_bytes:
                        raise ScrapeError(f"larger than {self.exporter.max_bytes} bytes")
                    chunks.append(chunk)
        except TimeoutError as err:
            raise ScrapeError("timed out") from err
        except aiohttp.ClientError as err:
            raise ScrapeError(f"{type(err).__name__}: {err}") from err
        return b"".join(chunks)

    async def _readings(self, node: str, raw: bytes, pool: ParsePool | None) -> NodeReadings:
        # Corruption check, parse and this node's series (activities/parse_pool.read_body),
        # here or in the helper process: the same fields or the same error either way.
        try:
            if pool is not None:
                gpus = await pool.read(raw, node)
            elif len(raw) > PARSE_ON_LOOP_BYTES:
                # A big body is parsed off the event loop: health checks and the other
                # nodes' scrapes keep running meanwhile (the GIL is handed over every 5 ms).
                gpus = await asyncio.to_thread(read_body, raw, node)
            else:
                gpus = read_body(raw, node)
        except BodyError as err:
            raise ScrapeError(str(err)) from err
        return NodeReadings(node=node, gpus=[GpuReading(**g) for g in gpus])

    async def scrape_many(self, targets: dict[str, str]) -> tuple[dict[str, NodeReadings],
                                                                   dict[str, str]]:
        # aiohttp rather than httpx here: measured at 10,000 nodes, httpx's connection
        # pool cost ~8 ms of CPU per request against ~0.2 ms (docs/performance.md).
        connector = aiohttp.TCPConnector(limit=self.exporter.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.exporter.timeout_seconds)
        sem = asyncio.Semaphore(self.exporter.concurrency)
        readings: dict[str, NodeReadings] = {}
        errors: dict[str, str] = {}
        done = 0
        # Parsing is most of a scrape's CPU: a large fleet spreads it over a second core.
        pool: ParsePool | None = None
        if 0 < self.exporter.parse_helper_from <= len(targets) and default_workers():
            pool = ParsePool()
            pool.start()

        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
                async def one(node: str, url: str) -> None:
                    nonlocal done
                    try:
                        # The slot is for the connection: parsing does not hold it.
                        async with sem:
                            raw = await self._fetch(http, url)
                        readings[node] = await self._readings(node, raw, pool)
                    except ScrapeError as err:
                        errors[node] = f"{node}: {url}: {err}"
                        metrics.SCRAPE_ERRORS.labels(_reason(str(err))).inc()
                    done += 1
                    if done % 500 == 0 and activity.in_activity():
                        activity.heartbeat(done)

                # A fixed set of workers rather than a task per node: 10,000 waiting tasks
                # are 10,000 coroutines, futures and frames for the garbage collector to walk.
                todo = iter(targets.items())

                async def worker() -> None:
                    for node, url in todo:
                        await one(node, url)

                # Enough workers to keep every connection busy while the helper process
                # holds its full share of bodies.
                workers = min(len(targets), self.exporter.concurrency
                              + (pool.capacity if pool is not None else 0))
                await asyncio.gather(*(worker() for _ in range(workers)))
        finally:
            if pool is not None:
                await pool.close()
        return readings, errors

    async def read_many(self, names: list[str], nodes: list[GpuNode],
                        links: LinkPolicy | None = None) -> tuple[
            dict[str, NodeReadings], dict[str, str]]:
        """Readings per node from the configured source, with the GPU count each node
        declares; a node without any readings is in errors. With a link rule on (``links``),
        scraped counters become rates against this process's previous reading of the node
        (activities/counter_rates.py); the Prometheus source computes them itself."""
        readings, errors = await self._read_many(names, nodes)
        if links is not None and (links.pcie_replay_enabled or links.nvlink_enabled) and \
                self.exporter.mode != "prometheus":
            now = time.monotonic()
            readings = {n: self.rates.apply(r, now) for n, r in readings.items()}
            self.rates.forget_older_than(now)
        declared = {n.name: declared_gpus(n.labels) for n in nodes}
        return {name: (r.model_copy(update={"declared_gpus": declared[name]})
                       if declared.get(name) is not None else r)
                for name, r in readings.items()}, errors

    async def _read_many(self, names: list[str], nodes: list[GpuNode]) -> tuple[
            dict[str, NodeReadings], dict[str, str]]:
        prom = self.exporter.prometheus
        if self.exporter.mode == "prometheus" and prom is not None:
            acked = {k: v for n in nodes for k, v in n.acknowledged.items()}
            readings, errors = await prom.read(
                names, thermal_hold=self.exporter.prometheus_thermal_hold,
                acknowledged_xids=acked)
            for _ in errors:
                metrics.SCRAPE_ERRORS.labels("prometheus").inc()
            return readings, errors
        targets = await asyncio.to_thread(self.endpoints, names)
        readings, errors = await self.scrape_many(targets)
        for n in names:
            if n not in targets:
                errors[n] = f"{n}: no dcgm-exporter endpoint found"
        return readings, errors

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
        for node in nodes:
            r = readings.get(node.name)
            if r is None:
                continue
            tracks, annotations = _learned(node, r, inp, now)
            verdict = evaluate_node(r, inp.policy, acknowledged_xids=node.acknowledged,
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

    async def find_orphans(self, labelled: list[GpuNode]) -> list[str]:
        """Labelled nodes whose remediation is not running (terminated, failed, gone).

        They keep their slot (fail closed); the first time one is seen it gets an
        annotation and a Warning Event so an operator can release it.
        """
        try:
            client = activity.client()
        except RuntimeError:
            return []  # not running in a worker (offline tools)
        orphans = []
        for node in labelled:
            # The one ID a remediation of this node runs under, never the ID the node's
            # annotation names (a node can write it: naming the detector, which always
            # runs, would hold a budget slot forever).
            wid = remediation_workflow_id(node.name)
            try:
                desc = await client.get_workflow_handle(wid).describe()
                running = (desc.status == WorkflowExecutionStatus.RUNNING
                           and desc.workflow_type == "RemediationWorkflow")
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    continue  # cannot tell: never call a node an orphan on no data
                running = False
            if running:
                continue
            orphans.append(node.name)
            if not node.orphan_marked:
                await asyncio.to_thread(self._mark_orphan, node.name, wid)
        metrics.ORPHANS.set(len(orphans))
        return sorted(orphans)

    @activity.defn
    async def release_orphan(self, req: OrphanRelease) -> None:
        """Release a node whose remediation workflow is gone, after checking it still is."""
        try:
            n = await asyncio.to_thread(self.core.read_node, req.node,
                                        _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"read node {req.node}")
        labels, ann = meta_dict(n, "labels"), meta_dict(n, "annotations")
        node = GpuNode(req.node, _state(labels.get(STATE_LABEL), _tainted(n))[0],
                       _our_workflow(req.node, ann), {}, labels)
        if node.state == NodeState.HEALTHY or req.node not in await self.find_orphans([node]):
            raise ApplicationError(f"{req.node} is not an orphan any more",
                                   type=error_types.NOT_ORPHAN, non_retryable=True)
        now = datetime.now(UTC)
        # Node-written: a naive or absurd time must not keep the release from finishing.
        started = node_annotations.parse_timestamp(A_SINCE, ann.get(A_SINCE), now=now).value or now
        why = f"orphan released by {req.operator}" + (f": {req.reason}" if req.reason else "")
        await asyncio.to_thread(self.nodes.release_node, ReleaseInput(
            node=req.node, outcome=Outcome.RELEASED, uncordon=ann.get(A_PRECORDONED) != "true",
            history=HistoryEntry(started=started, finished=now, action=ann.get(A_ACTION, "?"),
                                 reason=ann.get(A_REASON, ""), outcome=f"{Outcome.RELEASED}: {why}",
                                 workflow_id=node.workflow_id, by=req.operator),
            event_reason="OrphanReleased", event_message=why))

    def _mark_orphan(self, node: str, workflow_id: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            self.core.patch_node(node, {"metadata": {"annotations": {A_ORPHAN: now}}},
                                 _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            log.warning("could not mark %s orphaned: %s", node, err.status)
            return
        record_node_event(self.core, node, reason="RemediationOrphaned", event_type="Warning",
                          message=f"labelled in remediation but workflow {workflow_id} is not "
                                  "running; it keeps its budget slot until released "
                                  f"(gpu-remediate release-orphan {node})")

    @activity.defn
    async def read_node_health(self, inp: NodeHealthInput) -> NodeHealth:
        """One node's verdict now, for the thermal watch and post-repair checks."""
        acked = {**await asyncio.to_thread(self.acknowledged_xids, inp.node),
                 **inp.acknowledged}
        readings, errors = await self.read_many(
            [inp.node], [GpuNode(inp.node, NodeState.HEALTHY, "", acked, {})], inp.policy.links)
        r = readings.get(inp.node)
        if r is None:
            return NodeHealth(readable=False, thermal_recovered=False,
                              message=errors.get(inp.node, "unreadable"))
        return NodeHealth(readable=True, thermal_recovered=is_thermal_recovered(r, inp.policy),
                          verdict=evaluate_node(r, inp.policy, acknowledged_xids=acked))

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

    def acknowledged_xids(self, node: str) -> dict[str, int]:
        try:
            n = self.core.read_node(node, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"read node {node}")
        return _acknowledged(meta_dict(n, "annotations").get(A_ACK_XIDS))

    @activity.defn
    async def watch_thermal(self, inp: ThermalWatchInput) -> ThermalWatchResult:
        """Poll one node until it has stayed cool for ``hold``, shows a non-thermal
        fault, or ``give_up_after`` passes. Polling here, heartbeating, keeps the
        workflow's history from growing with every sample."""
        started = time.monotonic()
        cool_since: float | None = None
        last = "no reading yet"
        while True:
            health = await self.read_node_health(
                NodeHealthInput(node=inp.node, policy=inp.policy))
            now = time.monotonic()
            if health.readable and health.verdict is not None:
                worse = health.verdict.action in (Action.RESET, Action.REBOOT, Action.QUARANTINE)
                if worse:
                    return ThermalWatchResult(outcome="fault", verdict=health.verdict,
                                              message=health.verdict.summary)
                if health.thermal_recovered:
                    cool_since = cool_since if cool_since is not None else now
                    last = f"cool for {now - cool_since:.0f}s"
                    if now - cool_since >= inp.hold.total_seconds():
                        return ThermalWatchResult(outcome="recovered", message=last)
                else:
                    cool_since = None
                    last = health.verdict.summary
            else:
                # No data is not evidence of cooling: the hold restarts.
                cool_since = None
                last = f"unreadable: {health.message}"
            activity.heartbeat(last)
            if now - started >= inp.give_up_after.total_seconds():
                return ThermalWatchResult(outcome="hot", message=last)
            await asyncio.sleep(inp.poll_interval.total_seconds())


    @activity.defn
    async def check_thermal(self, inp: ThermalCheckInput) -> ThermalCheckResult:
        """One look at a node cordoned for heat: its state (hot, cool, or a fault that needs
        more than a cordon) once it differs from ``inp.now``, else ThermalUnchanged, which
        the workflow's retry policy turns into the next look a poll interval later. The
        wait holds no worker slot; the hold timer lives in the workflow."""
        health = await self.read_node_health(NodeHealthInput(node=inp.node, policy=inp.policy))
        if health.readable and health.verdict is not None and \
                health.verdict.action in (Action.RESET, Action.REBOOT, Action.QUARANTINE):
            return ThermalCheckResult(outcome="fault", verdict=health.verdict,
                                      message=health.verdict.summary)
        if not health.readable or health.verdict is None:
            # No data is not evidence of cooling.
            state, why = "hot", f"unreadable: {health.message}"
        elif health.thermal_recovered:
            state, why = "cool", "below the recovery threshold"
        else:
            state, why = "hot", health.verdict.summary
        if state == inp.now:
            raise ApplicationError(f"still {state}: {why}", type=error_types.THERMAL_UNCHANGED,
                                   category=ApplicationErrorCategory.BENIGN)
        return ThermalCheckResult(outcome="cool" if state == "cool" else "hot", message=why)

    @activity.defn(name="report_admission")
    async def report_admission(self, report: AdmissionReport) -> None:
        """Publish the detector's admission figures, and a ``RemediationDeferred`` Event on
        each node that waits (rate-limited: once per node and reason, again after
        ``NOTICE_REPEAT``), as the original tool did for a node waiting for the budget."""
        report_admission(report)
        # CircuitBreakerOpen on each node that tripped the breaker, once per trip: forgotten
        # when it closes, so the next trip is told again.
        await self._tell(CIRCUIT_BREAKER_OPEN, breaker_notices(
            report.breaker_nodes if report.breaker_open else [], report.breaker_reason))
        try:
            waiting = await self._waiting_nodes(report)
        except Exception as err:  # an Event is never worth failing the report
            log.warning("could not read the waiting nodes for RemediationDeferred: %s", err)
            return
        await self._tell(REMEDIATION_DEFERRED, deferred_notices(waiting))

    async def _tell(self, reason: str, notices: list[Notice]) -> None:
        """Announce the report's notices of one ``reason``; a node that no longer has it is
        forgotten, so its return is news. Errors are logged, never raised."""
        self.notices.settle(reason, [n.node for n in notices], self.notices.nodes(reason))
        try:
            sent = await send_notices(self.core, self.notices, notices, time.time())
        except Exception as err:  # an Event is never worth failing the report
            log.warning("could not record %s Events: %s", reason, err)
            return
        for n in sent:
            metrics.NODE_EVENTS.labels(n.reason).inc()

    async def _waiting_nodes(self, report: AdmissionReport) -> list[str]:
        """The detector's waiting list (``"node (action: why)"``), asked of the detector that
        runs this activity: the report carries only the count.

        The detector sends a report when its figures change, so a node is seen waiting when
        the count of waiting nodes (or the budget in use) changes, which is when it starts
        to wait. Once the report carries the names, this query goes.
        """
        if report.waiting == 0:
            return []
        detector = activity.info().workflow_id
        if detector is None:
            return []
        view = await activity.client().get_workflow_handle(detector).query(
            "view", result_type=DetectorView)
        return list(view.waiting)


@activity.defn
def report_admission(report: AdmissionReport) -> None:
    """Publish the detector's admission figures as metrics (workflows never touch metrics)."""
    metrics.BUDGET.set(report.budget)
    metrics.BUDGET_IN_USE.set(report.in_use)
    metrics.WAITING.set(report.waiting)
    metrics.BREAKER_OPEN.set(1 if report.breaker_open else 0)
    metrics.PAUSED.set(1 if report.paused else 0)
    if report.breaker_open:
        log.warning("circuit breaker open: %s", report.breaker_reason)


def _reason(message: str) -> str:
    for word in ("timed out", "HTTP", "ConnectError", "larger", "no GPU"):
        if word in message:
            return word.lower().replace(" ", "_")
    return "unparsable"


