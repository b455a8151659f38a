"""The record: what the controller remembers about a node, kept where the node cannot write.

A kubelet may write every annotation of its own Node object, so history, acknowledged XIDs
and XID sightings kept there are the node's word, not ours: a node that wipes its history
between repairs would never be a repeat offender. The record is one ConfigMap per node in
the controller's namespace (``kubernetes.record_namespace``), which the node authorizer
never lets a kubelet write; the node's annotations are a mirror of it for ``kubectl``
users. Why a ConfigMap and not Temporal: the detector and every remediation read and write
it from activities, the observation reads all of them in one List per tick, and an operator
reads one with ``kubectl get configmap`` (docs/operations.md).

Identity. A record names the node's UID and the GPU UUIDs it has seen. A node re-created
under the same name (a new UID) with the same GPUs keeps its record; one whose GPUs are all
different is another machine and starts a new record (``reconcile_identity``). Until the
GPUs say which, the record is kept: unconfirmed identity never makes a node look new.

Failing closed. A record that cannot be parsed is counted
(``gpu_remediate_record_unreadable_total``), reported (Warning Event ``RecordUnreadable``)
and never overwritten: a claim fails (retried) until an operator repairs or deletes it,
so no remediation runs on a node whose history is unknown; an observation judges the node
with no acknowledgements (every XID it shows counts) and no sightings.

Migration. A node with our annotations and no record (the first release with records)
seeds its record from them once, when the record is first written; from then on the
annotations are never read for a decision. That seeding is the last time annotations are
trusted.

Size. A ConfigMap holds at most 1 MiB. ``NodeRecord.bounded`` keeps the last
``HISTORY_KEEP`` entries within ``HISTORY_RETENTION``, at most ``MAX_GPUS`` GPU keys in every
per-GPU map, ``MAX_SIGHTINGS_PER_GPU`` sightings each, and cuts long strings; the worst
record within those bounds is well under the limit (tests/activities/test_record.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter
from pydantic import BaseModel, Field, ValidationError
from temporalio.exceptions import ApplicationError

from activities import annotations as node_annotations
from activities.events import record_node_event
from activities.kube import REQUEST_TIMEOUT, raise_typed
from activities.node_keys import A_ACK_XIDS, A_HISTORY, A_XID_SIGHTINGS, NODE_LABEL, label_value
from activities.xid_sightings import MAX_SIGHTINGS_PER_GPU, GpuXidTrack, dump_tracks
from workflows import errors
from workflows.messages import HistoryEntry

log = logging.getLogger(__name__)

RECORD_PREFIX = "gpu-remediate-record-"
RECORD_KEY = "record.json"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-remediate"
RECORD_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{NODE_LABEL}"
A_RECORD_NODE = "gpu-remediate.io/node"
"""The node's full name on its record (the label holds at most 63 characters)."""

MAX_CONFIGMAP_BYTES = 1024 * 1024
"""The API server refuses a ConfigMap whose data is larger."""
HISTORY_KEEP = 50
HISTORY_RETENTION = timedelta(days=90)
"""Longer than the longest repeat_offender_window anyone sets in practice (the setting's
maximum is a year: a window longer than this counts only the entries kept)."""
MAX_GPUS = 64
"""GPU keys per record in each per-GPU map; a node has at most 16 GPUs, MIG aside."""
MAX_TEXT = 512
MAX_KEY = 128
NAME_MAX = 253
CONFLICT_RETRIES = 8

_namespace = "default"


def set_record_namespace(namespace: str) -> None:
    """Where the records live (``Settings.record_namespace()``): set once at start, before
    any activity runs, like the Event namespace."""
    global _namespace
    _namespace = namespace


def record_namespace() -> str:
    return _namespace


RECORD_UNREADABLE = Counter(
    "gpu_remediate_record_unreadable_total",
    "Node records (ConfigMaps) that could not be parsed; none is overwritten, and no "
    "remediation starts on that node until it is repaired or deleted.")
STATE_MISMATCH = Counter(
    "gpu_remediate_state_mismatch_total",
    "A node's annotation mirror disagreed with the controller's record (forged, wiped, "
    "garbled); the record won and the mirror was rewritten. Counted once per change.",
    ["kind"])


class GpuQuarantineNote(BaseModel):
    """One GPU held out of scheduling by a DeviceTaintRule of ours (per-GPU isolation)."""

    rule: str
    device: str = ""
    since: datetime
    workflow_id: str = ""
    reason: str = ""
    orphaned: datetime | None = Field(
        default=None, description="When the controller found the remediation holding it "
                                  "gone and said so (a Warning Event, once).")


class NodeRecord(BaseModel):
    """One node's record, as stored under ``record.json``."""

    schema_version: int = 1
    node: str
    uid: str = Field(default="", description="metadata.uid of the node this record is about.")
    gpus: list[str] = Field(default_factory=list,
                            description="GPU UUIDs seen on the node: its identity across UIDs.")
    history: list[HistoryEntry] = Field(default_factory=list)
    acknowledged: dict[str, int] = Field(
        default_factory=dict, description="GPU UUID (index:N without one) -> XID remediated.")
    sightings: dict[str, GpuXidTrack] = Field(default_factory=dict)
    repairs: dict[str, int] = Field(
        default_factory=dict, description="GPU UUID -> remediations with a repair for its XID.")
    seeded_from_annotations: datetime | None = Field(
        default=None, description="When the record was seeded from the node's annotations "
                                  "(the upgrade to records): the last time they were trusted.")
    previous_uid: str = Field(default="", description="The UID before a re-creation that "
                                                      "kept the record (same GPUs).")
    updated: datetime | None = None
    gpu_quarantines: dict[str, GpuQuarantineNote] = Field(
        default_factory=dict,
        description="GPU UUID -> the DeviceTaintRule holding it, while one does: kept here, "
                    "where the node cannot write, across worker restarts and a re-created "
                    "Node object.")

    def bounded(self, now: datetime) -> NodeRecord:
        """This record within the size bounds (see the module docstring)."""
        since = now - HISTORY_RETENTION
        history = [h.model_copy(update={
            "reason": h.reason[:MAX_TEXT], "action": h.action[:MAX_KEY],
            "outcome": h.outcome[:MAX_KEY], "workflow_id": h.workflow_id[:NAME_MAX + 40],
            "by": h.by[:MAX_KEY]})
            for h in self.history if (h.finished or h.started) >= since][-HISTORY_KEEP:]

        def first(keys: list[str]) -> list[str]:
            return [k[:MAX_KEY] for k in keys][:MAX_GPUS]

        acked = {k[:MAX_KEY]: v for k, v in list(self.acknowledged.items())[:MAX_GPUS]}
        sightings = {k[:MAX_KEY]: t.model_copy(update={
            "seen": t.seen[-MAX_SIGHTINGS_PER_GPU:],
            "counts": dict(list(t.counts.items())[:MAX_SIGHTINGS_PER_GPU])})
            for k, t in list(self.sightings.items())[:MAX_GPUS]}
        repairs = {k[:MAX_KEY]: v for k, v in list(self.repairs.items())[:MAX_GPUS]}
        held = {k[:MAX_KEY]: q.model_copy(update={
            "rule": q.rule[:NAME_MAX], "device": q.device[:MAX_KEY],
            "workflow_id": q.workflow_id[:NAME_MAX + 40], "reason": q.reason[:MAX_TEXT]})
            for k, q in list(self.gpu_quarantines.items())[:MAX_GPUS]}
        return self.model_copy(update={
            "gpu_quarantines": held,
            "node": self.node[:NAME_MAX], "uid": self.uid[:MAX_KEY],
            "previous_uid": self.previous_uid[:MAX_KEY],
            "gpus": first(list(dict.fromkeys(self.gpus))), "history": history,
            "acknowledged": acked, "sightings": sightings, "repairs": repairs})

    def dump(self) -> str:
        return self.model_dump_json(exclude_none=True)


def is_uuid_key(key: str) -> bool:
    """A GPU key that names the GPU itself (``GPU-…``, ``MIG-…``), not its index."""
    return bool(key) and not key.startswith("index:") and not key.isdecimal()


def record_name(node: str) -> str:
    """``gpu-remediate-record-<node>``, or, when that is longer than a name may be, a prefix
    of it and a hash of the whole node name (two long names never share a record)."""
    name = RECORD_PREFIX + node
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"{name[:NAME_MAX - 17].rstrip('-.')}-{digest}"


def seed_from_annotations(node: str, uid: str, ann: dict[str, str],
                          now: datetime) -> NodeRecord:
    """A record from a node's annotations (the upgrade to records); unreadable parts are
    left empty (activities/annotations.py)."""
    history = node_annotations.parse_history(A_HISTORY, ann.get(A_HISTORY), now=now).value
    acked = node_annotations.parse_acknowledged(A_ACK_XIDS, ann.get(A_ACK_XIDS)).value
    tracks = node_annotations.parse_tracks(A_XID_SIGHTINGS, ann.get(A_XID_SIGHTINGS)).value
    seeded = any(k in ann for k in (A_HISTORY, A_ACK_XIDS, A_XID_SIGHTINGS))
    return NodeRecord(node=node, uid=uid, history=history, acknowledged=acked,
                      sightings=tracks, gpus=[k for k in (*acked, *tracks) if is_uuid_key(k)],
                      seeded_from_annotations=now if seeded else None).bounded(now)


def mirror_annotations(rec: NodeRecord, history_limit: int) -> dict[str, str | None]:
    """What the node's annotations show of its record (None: the annotation goes)."""
    history = rec.history[-history_limit:]
    return {
        A_HISTORY: json.dumps([h.model_dump(mode="json") for h in history],
                              separators=(",", ":")) if history else None,
        A_ACK_XIDS: json.dumps(rec.acknowledged, sort_keys=True) if rec.acknowledged else None,
        A_XID_SIGHTINGS: dump_tracks(rec.sightings),
    }


MIRROR_KINDS = {A_HISTORY: "history", A_ACK_XIDS: "acknowledged-xids",
                A_XID_SIGHTINGS: "xid-sightings"}


def mirror_mismatches(rec: NodeRecord, ann: dict[str, str], history_limit: int,
                      now: datetime) -> dict[str, str]:
    """Mirror annotation -> why it disagrees with the record (forged, wiped, garbled); the
    values are compared, not the text, so formatting never counts."""
    want = mirror_annotations(rec, history_limit)
    out: dict[str, str] = {}
    for key, kind in MIRROR_KINDS.items():
        text = ann.get(key)
        if not text and not want[key]:
            continue
        if not text:
            out[key] = f"{kind} annotation missing (wiped?)"
            continue
        if key == A_HISTORY:
            read: Any = node_annotations.parse_history(key, text, now=now)
            same = read.problem is None and read.value == rec.history[-history_limit:]
        elif key == A_ACK_XIDS:
            read = node_annotations.parse_acknowledged(key, text)
            same = read.problem is None and read.value == rec.acknowledged
        else:
            read = node_annotations.parse_tracks(key, text)
            same = read.problem is None and dump_tracks(read.value) == want[key]
        if read.problem is not None:
            out[key] = f"{kind} annotation garbled ({read.problem.reason})"
        elif not same:
            out[key] = f"{kind} annotation differs from the record (edited or forged?)"
    return out


@dataclass(frozen=True)
class Loaded:
    """A node's record as read: ``record`` is None when there is none (``exists`` false) or
    it could not be parsed (``problem`` says why)."""

    node: str
    record: NodeRecord | None
    resource_version: str = ""
    exists: bool = False
    problem: str = ""


def parse_configmap(obj: dict[str, Any]) -> Loaded:
    """A record ConfigMap (as a plain dict, the API's JSON) read defensively."""
    md = obj.get("metadata") or {}
    node = str((md.get("annotations") or {}).get(A_RECORD_NODE)
               or (md.get("labels") or {}).get(NODE_LABEL) or "")
    rv = str(md.get("resourceVersion") or "")
    text = (obj.get("data") or {}).get(RECORD_KEY)
    if not isinstance(text, str):
        return Loaded(node, None, rv, True, f"no {RECORD_KEY} key")
    problem = _too_big_or_deep(text)
    if problem:
        return Loaded(node, None, rv, True, problem)
    try:
        rec = NodeRecord.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        return Loaded(node, None, rv, True, f"{where}: {first['msg']}"[:300])
    if node and rec.node != node:
        return Loaded(node, None, rv, True, f"names node {rec.node[:80]!r}, not {node!r}")
    return Loaded(rec.node, rec, rv, True)


def _too_big_or_deep(text: str) -> str:
    # Caps before pydantic parses it: someone with write access to the namespace could
    # put anything there.
    if len(text) > MAX_CONFIGMAP_BYTES:
        return f"{len(text)} characters, more than {MAX_CONFIGMAP_BYTES}"
    if node_annotations.depth(text) > node_annotations.MAX_DEPTH:
        return f"nested deeper than {node_annotations.MAX_DEPTH}"
    return ""


class RecordUnreadable(Exception):
    def __init__(self, node: str, problem: str) -> None:
        super().__init__(f"the record of node {node} (ConfigMap {record_name(node)} in "
                         f"{record_namespace()}) is unreadable: {problem}")
        self.node = node
        self.problem = problem


_reported_unreadable: dict[str, str] = {}


def report_unreadable(core: client.CoreV1Api, node: str, problem: str) -> None:
    """Count and announce an unreadable record, once per distinct problem per node."""
    if _reported_unreadable.get(node) == problem:
        return
    _reported_unreadable[node] = problem
    RECORD_UNREADABLE.inc()
    log.warning("record of %s unreadable: %s", node, problem)
    record_node_event(
        core, node, reason="RecordUnreadable", event_type="Warning",
        message=f"the controller's record of this node (ConfigMap {record_name(node)} in "
                f"namespace {record_namespace()}) cannot be read: {problem}. No remediation "
                "starts on this node until it is repaired or deleted (deleting it forgets "
                "the node's history: docs/operations.md, 'The record of a node').")


class RecordStore:
    """Read, list and write the records (sync: called from the worker's thread pool)."""

    core: client.CoreV1Api

    def __init__(self, core: client.CoreV1Api, namespace: str | None = None) -> None:
        self.core = core
        self.namespace = namespace

    @property
    def ns(self) -> str:
        return self.namespace or record_namespace()

    def read(self, node: str) -> Loaded:
        try:
            raw: Any = self.core.read_namespaced_config_map(
                record_name(node), self.ns, _request_timeout=REQUEST_TIMEOUT,
                _preload_content=False)
        except ApiException as err:
            if err.status == 404:
                return Loaded(node, None)
            raise_typed(err, f"read the record of {node}")
        loaded = parse_configmap(json.loads(raw.data))
        if not loaded.problem:
            _reported_unreadable.pop(node, None)  # repaired: a new damage is news again
        return Loaded(node, loaded.record, loaded.resource_version, True, loaded.problem)

    def list(self) -> dict[str, Loaded]:
        """Every record, by node name: one List per call."""
        try:
            raw: Any = self.core.list_namespaced_config_map(
                self.ns, label_selector=RECORD_SELECTOR, _request_timeout=REQUEST_TIMEOUT,
                _preload_content=False)
        except ApiException as err:
            raise_typed(err, f"list node records in {self.ns}")
        out: dict[str, Loaded] = {}
        for item in json.loads(raw.data).get("items") or []:
            loaded = parse_configmap(item)
            if loaded.node:
                out[loaded.node] = loaded
                if not loaded.problem:
                    _reported_unreadable.pop(loaded.node, None)
        return out

    def _body(self, rec: NodeRecord, rv: str) -> dict[str, Any]:
        text = rec.dump()
        if len(text.encode()) > MAX_CONFIGMAP_BYTES:
            # Bounded records never get here (test_record: the worst case fits); refusing
            # beats a 422 that loses the whole write.
            raise ApplicationError(f"record of {rec.node} would be {len(text)} bytes",
                                   type=errors.INVALID, non_retryable=True)
        md: dict[str, Any] = {
            "name": record_name(rec.node), "namespace": self.ns,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, NODE_LABEL: label_value(rec.node)},
            "annotations": {A_RECORD_NODE: rec.node}}
        if rv:
            md["resourceVersion"] = rv
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": md,
                "data": {RECORD_KEY: text}}

    def update(self, node: str, change: Callable[[NodeRecord | None], NodeRecord | None],
               now: datetime, known: Loaded | None = None) -> NodeRecord | None:
        """Apply ``change`` to the node's current record (None: there is none yet) and write
        the result (None: nothing to write), guarded by resourceVersion: a 409 reads again
        and applies ``change`` to the fresh record. ``known``: the record as just listed
        (saves a read; a stale one costs a 409). Raises ``RecordUnreadable`` for a record
        that cannot be parsed: it is never overwritten."""
        for attempt in range(CONFLICT_RETRIES):
            current = known if known is not None and attempt == 0 else self.read(node)
            if current.problem:
                raise RecordUnreadable(node, current.problem)
            new = change(current.record)
            if new is None:
                return current.record
            new = new.model_copy(update={"updated": now}).bounded(now)
            body = client.V1ConfigMap.model_validate(self._body(new, current.resource_version))
            try:
                if current.exists:
                    self.core.replace_namespaced_config_map(
                        record_name(node), self.ns, body, _request_timeout=REQUEST_TIMEOUT)
                else:
                    self.core.create_namespaced_config_map(
                        self.ns, body, _request_timeout=REQUEST_TIMEOUT)
                return new
            except ApiException as err:
                if err.status == 409:
                    continue
                raise_typed(err, f"write the record of {node}")
        raise ApplicationError(f"the record of node {node} kept changing under us",
                               type=errors.CONFLICT)


def reconcile_identity(rec: NodeRecord, uid: str, gpu_uuids: set[str],
                       now: datetime) -> tuple[NodeRecord, str]:
    """The record for a node now carrying ``uid`` and showing ``gpu_uuids``, and what changed
    ("" nothing, "rebound" same machine re-created, "replaced" another machine).

    Same UID, or a record without one: kept (the GPUs seen are added). Another UID: the same
    machine re-created when it shows any GPU the record has seen (the record follows it);
    another machine when it shows GPUs and none of them (a fresh record, nothing inherited).
    Without GPUs to compare, the record is kept unchanged: unconfirmed identity fails closed.
    """
    new_gpus = [g for g in sorted(gpu_uuids) if g not in rec.gpus]
    if not rec.uid or rec.uid == uid or not uid:
        if new_gpus or (uid and not rec.uid):
            return rec.model_copy(update={"uid": rec.uid or uid,
                                          "gpus": [*rec.gpus, *new_gpus]}), ""
        return rec, ""
    if not gpu_uuids or not rec.gpus:
        return rec, ""
    if gpu_uuids & set(rec.gpus):
        return rec.model_copy(update={"uid": uid, "previous_uid": rec.uid,
                                      "gpus": [*rec.gpus, *new_gpus]}), "rebound"
    return NodeRecord(node=rec.node, uid=uid, gpus=sorted(gpu_uuids), updated=now), "replaced"


def with_release(rec: NodeRecord, entry: HistoryEntry, acknowledged: dict[str, int]) -> NodeRecord:
    """The record after a remediation released its node: the entry (once: a retried release
    replaces it), the XIDs it remediated, their GPUs' sightings cleared (escalation counts
    from this repair on) and, for a repair, one more repair on each of those GPUs."""
    history = [h for h in rec.history
               if h.workflow_id != entry.workflow_id or h.started != entry.started]
    retried = len(history) != len(rec.history)
    acked = {**rec.acknowledged, **acknowledged}
    sightings = {k: (t.model_copy(update={"seen": []}) if k in acknowledged else t)
                 for k, t in rec.sightings.items()}
    repairs = dict(rec.repairs)
    if entry.counts_as_repair() and not retried:
        for key in acknowledged:
            if is_uuid_key(key):
                repairs[key] = repairs.get(key, 0) + 1
    gpus = [*rec.gpus, *(k for k in acknowledged if is_uuid_key(k) and k not in rec.gpus)]
    return rec.model_copy(update={"history": [*history, entry], "acknowledged": acked,
                                  "sightings": sightings, "repairs": repairs, "gpus": gpus})


def now_utc() -> datetime:
    return datetime.now(UTC)
