"""The GPU nodes as the fleet's activities see them: the node list, read into ``GpuNode``.

Listing (with a node selector, the selected nodes plus every node in remediation), the
slim parse of the raw NodeList, and what each node's labels, taints and annotations say:
its remediation state (failing closed), opt-out, our workflow and other controllers at work.
Acknowledged XIDs and XID sightings come from the node's record (activities/record.py, one
List of the records per tick), never from its annotations, which only mirror it.
``NodeListing`` is a part of ``FleetActivities`` (activities/fleet.py), which sets up the
state it reads.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from activities import annotations as node_annotations
from activities.gpus import GPU_RESOURCE, quantity
from activities.kube import REQUEST_TIMEOUT, meta_dict, raise_typed
from activities.neighbours import Hold, neighbour_hold
from activities.node_keys import (
    A_ACK_XIDS,
    A_ORPHAN,
    A_WORKFLOW,
    A_XID_SIGHTINGS,
    EXCLUDE_LABEL,
    LEGACY_EXCLUDE_LABEL,
    STATE_LABEL,
    TAINT_KEY,
)
from activities.record import Loaded, NodeRecord, RecordStore, seed_from_annotations
from activities.xid_sightings import Tracks
from workflows.ids import remediation_workflow_id
from workflows.transitions import NodeState


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
    uid: str = ""
    annotations: dict[str, str] = field(default_factory=dict)
    record: NodeRecord | None = None
    """The node's record (``use_record``); a seed from its annotations while it has none;
    None when it is unreadable (``record_problem``)."""
    record_exists: bool = False
    record_problem: str = ""
    capacity_gpus: int = 0
    """The node's GPU capacity (status.capacity nvidia.com/gpu) at this listing."""

    def use_record(self, loaded: Loaded | None, now: datetime) -> None:
        """Take acknowledged XIDs and sightings from the node's record: the annotations'
        values (and whether they could be read) no longer decide anything. Without a record
        (the upgrade to records) they seed one, once. An unreadable record leaves none: no
        acknowledgement (every XID shown counts) and no sightings."""
        self.unreadable = ""
        if loaded is not None and loaded.problem:
            self.record, self.record_exists, self.record_problem = None, True, loaded.problem
            self.acknowledged, self.xid_tracks = {}, {}
            return
        if loaded is not None and loaded.record is not None:
            self.record, self.record_exists = loaded.record, True
        else:
            self.record = seed_from_annotations(self.name, self.uid, self.annotations, now)
        self.acknowledged = dict(self.record.acknowledged)
        self.xid_tracks = dict(self.record.sightings)


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


_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
"""A Node's name (an RFC 1123 subdomain): what a field selector may be built from."""


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
                name=md.get("name"), labels=md.get("labels"), uid=md.get("uid"),
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


def _our_workflow(name: str, ann: dict[str, str]) -> str:
    """The remediation workflow the node's annotation names, when it is this node's own: the
    annotation is node-writable, and a node naming another node's workflow must not lead an
    operator (or us) to that one."""
    wid = ann.get(A_WORKFLOW, "")
    return wid if wid == remediation_workflow_id(name) else ""


def _capacity(n: client.V1Node) -> dict[str, str]:
    status = getattr(n, "status", None)
    return dict(getattr(status, "capacity", None) or {})


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
                   _tainted(n), getattr(n.metadata, "uid", None) or "", ann,
                   capacity_gpus=quantity(_capacity(n).get(GPU_RESOURCE)))


class NodeListing:
    """FleetActivities' node list: every GPU node, read into ``GpuNode``."""

    core: client.CoreV1Api
    node_selector: str
    records: RecordStore
    _list_lock: threading.Lock
    _listed: tuple[float, list[client.V1Node]] | None
    _records_lock: threading.Lock
    _records_listed: tuple[float, dict[str, Loaded]] | None

    def list_records(self) -> dict[str, Loaded]:
        """Every node's record, by node name: one List per observation, shared by the shards
        of one tick running here at once as the node list is (``_list_nodes``)."""
        called = time.monotonic()
        with self._records_lock:
            shared = self._records_listed
            if shared is not None and shared[0] >= called:
                return shared[1]
            records = self.records.list()
            self._records_listed = (time.monotonic(), records)
            return records

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

    def _list_nodes_now(self, name: str | None = None) -> list[client.V1Node]:
        """As ``_list_nodes``; with ``name``, only that node (a field selector on the same
        lists, so the node selector and the labelled nodes count exactly as in the fleet's)."""
        field = f"metadata.name={name}" if name else None

        def listed(selector: str | None = None) -> list[client.V1Node]:
            # The undecoded response (urllib3's), parsed by _slim_nodes.
            raw: Any = self.core.list_node(label_selector=selector, field_selector=field,
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
        return self._gpu_nodes(self._list_nodes())

    def read_gpu_nodes(self, names: list[str]) -> list[GpuNode]:
        """``list_gpu_nodes`` for just these nodes (a node-only observation): each one's
        own lists, so a node that is not a GPU node, has opted out or is gone is left out
        as the fleet's list would leave it. A name that is not a node name is skipped."""
        items = [n for name in names if _NODE_NAME.match(name)
                 for n in self._list_nodes_now(name)]
        return self._gpu_nodes(items)

    def _gpu_nodes(self, items: list[client.V1Node]) -> list[GpuNode]:
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

    def acknowledged_xids(self, node: str) -> dict[str, int]:
        """The node's acknowledged XIDs from its record; none (every XID shown counts) when
        it is unreadable; from its annotations while it has no record yet."""
        loaded = self.records.read(node)
        if loaded.problem:
            return {}
        if loaded.record is not None:
            return dict(loaded.record.acknowledged)
        try:
            n = self.core.read_node(node, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"read node {node}")
        return node_annotations.parse_acknowledged(
            A_ACK_XIDS, meta_dict(n, "annotations").get(A_ACK_XIDS)).value
