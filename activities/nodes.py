"""Activities that write a remediation's state onto its node.

Every write is one PATCH guarded by the node's resourceVersion, so a concurrent
change by someone else (an admin's cordon, another controller's taint) is never
overwritten: a 409 re-reads and re-applies. All of them are idempotent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import TypeAdapter
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import annotations as node_annotations
from activities import metrics
from activities.drain import clear_blocked
from activities.events import record_node_event
from activities.gpus import GPU_RESOURCE, declared_gpus, quantity
from activities.kube import REQUEST_TIMEOUT, meta_dict, raise_typed
from activities.node_keys import (
    A_ACK_XIDS,
    A_ACTION,
    A_ADDED_MARKS,
    A_ATTEMPT,
    A_HISTORY,
    A_PRECORDONED,
    A_REASON,
    A_RUN,
    A_SINCE,
    A_STEP,
    A_TRANSITION,
    A_WORKFLOW,
    A_XID_SIGHTINGS,
    AUTOSCALER_MARKS,
    EXCLUDE_LABEL,
    HISTORY_LIMIT,
    IN_FLIGHT_ANNOTATIONS,
    STATE_LABEL,
    TAINT_KEY,
)
from activities.record import (
    STATE_MISMATCH,
    NodeRecord,
    RecordStore,
    RecordUnreadable,
    mirror_annotations,
    report_unreadable,
    seed_from_annotations,
    with_release,
)
from activities.xid_sightings import clear_sightings, dump_tracks, parse_tracks
from workflows import errors
from workflows.messages import (
    ClaimInput,
    ClaimResult,
    HistoryEntry,
    MirrorRepair,
    ReleaseInput,
    StateInput,
)
from workflows.transitions import NodeState, Outcome, Step

log = logging.getLogger(__name__)

_HISTORY = TypeAdapter(list[HistoryEntry])
MERGE_PATCH = "application/merge-patch+json"
CONFLICT_RETRIES = 8
RECORD_UNREADABLE = "RecordUnreadable"
"""The type of a claim's failure while the node's record cannot be parsed: retried, so
the claim goes on once an operator repairs or deletes the record."""
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def parse_history(text: str | None) -> list[HistoryEntry]:
    """The node's remediation history; a damaged annotation reads as empty, never fails
    (activities/annotations.py: size, nesting, types, times with an offset)."""
    read = node_annotations.parse_history(A_HISTORY, text)
    if read.problem is not None:
        log.warning("ignoring %s", read.problem)
    return read.value


def parse_acknowledged(text: str | None) -> dict[str, int]:
    """GPU -> acknowledged XID; like the history, a damaged annotation reads as empty
    (it must never make a release fail, which would keep the node out of service)."""
    read = node_annotations.parse_acknowledged(A_ACK_XIDS, text)
    if read.problem is not None:
        log.warning("ignoring %s", read.problem)
    return read.value


def our_taint() -> dict[str, str]:
    return {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}


def _taints_without_ours(node: Any) -> list[dict[str, Any]]:
    kept = []
    for t in node.spec.taints or []:
        if t.key == TAINT_KEY:
            continue
        entry = {"key": t.key, "effect": t.effect}
        if t.value is not None:
            entry["value"] = t.value
        if getattr(t, "time_added", None) is not None:
            entry["timeAdded"] = t.time_added.strftime("%Y-%m-%dT%H:%M:%SZ")
        kept.append(entry)
    return kept


def _observe_state_time(node: Any, now: datetime) -> None:
    """Time spent in the state the node is leaving, from its last-transition annotation."""
    state = meta_dict(node, "labels").get(STATE_LABEL)
    since = meta_dict(node, "annotations").get(A_TRANSITION)
    if not state or not since:
        return
    # The node can write this annotation: a naive or absurd time is skipped, never raised
    # (this runs inside every state change and release).
    started = node_annotations.parse_timestamp(A_TRANSITION, since, now=now).value
    if started is None:
        return
    metrics.STATE_SECONDS.labels(state).observe(max(0.0, (now - started).total_seconds()))


def _claim_landed(ann: dict[str, str], inp: ReleaseInput) -> bool:
    """Whether the node carries this remediation's claim (an abort may come before the claim
    reported back)."""
    return ann.get(A_WORKFLOW) == inp.history.workflow_id and \
        (not inp.run_id or ann.get(A_RUN) == inp.run_id)


def _annotations_only(ann: dict[str, str], inp: ReleaseInput) -> dict[str, str | None]:
    """The release's history and acknowledgements merged into the node's annotations, for a
    node whose record cannot be read (kept untouched as evidence)."""
    history = [h for h in parse_history(ann.get(A_HISTORY))
               if h.workflow_id != inp.history.workflow_id
               or h.started != inp.history.started]
    history = [*history, inp.history][-HISTORY_LIMIT:]
    out: dict[str, str | None] = {A_HISTORY: _HISTORY.dump_json(history).decode()}
    if inp.acknowledged_xids:
        acked = parse_acknowledged(ann.get(A_ACK_XIDS))
        acked.update(inp.acknowledged_xids)
        out[A_ACK_XIDS] = json.dumps(acked, sort_keys=True)
        # Repeat escalation counts from this repair on.
        if tracks := parse_tracks(ann.get(A_XID_SIGHTINGS)):
            out[A_XID_SIGHTINGS] = dump_tracks(clear_sightings(tracks, inp.acknowledged_xids))
    return out


class NodeActivities:
    """Claim, state changes and release of a node (sync: run in the worker's thread pool)."""

    def __init__(self, api: client.ApiClient, record_namespace: str | None = None) -> None:
        self.core = client.CoreV1Api(api)
        self.records = RecordStore(self.core, record_namespace)

    # A JSON merge patch replaces the taint list whole, so it is always sent with the
    # resourceVersion it was computed from: someone else's concurrent taint makes it 409.
    def _patch_guarded(self, name: str, build: Callable[[Any], dict[str, Any] | None],
                       uid: str = "") -> Any:
        for _ in range(CONFLICT_RETRIES):
            try:
                node = self.core.read_node(name, _request_timeout=REQUEST_TIMEOUT)
            except ApiException as err:
                raise_typed(err, f"read node {name}", node_itself=True)
            if uid and node.metadata and node.metadata.uid != uid:
                # The same name, another machine (re-provisioned, an autoscaler reusing the
                # name): nothing of ours is on it and nothing of ours is written to it.
                raise ApplicationError(
                    f"node {name} was replaced: uid {uid} at claim, now {node.metadata.uid}",
                    type=errors.NODE_GONE, non_retryable=True)
            body = build(node)
            if body is None:
                return node
            assert node.metadata is not None
            body.setdefault("metadata", {})["resourceVersion"] = node.metadata.resource_version
            try:
                return self.core.patch_node(
                    name, body, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT
                )
            except ApiException as err:
                if err.status == 409:
                    continue
                raise_typed(err, f"patch node {name}", node_itself=True)
        raise ApplicationError(f"node {name} kept changing under us", type=errors.CONFLICT)

    def _read_node(self, name: str) -> Any:
        try:
            return self.core.read_node(name, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            raise_typed(err, f"read node {name}", node_itself=True)

    def _claim_record(self, inp: ClaimInput) -> NodeRecord | None:
        """The node's record, read before anything is written to the node (None: none yet).
        Unreadable: the claim fails, retried, and touches nothing (a history nobody can read
        must not make a repeat offender look new)."""
        loaded = self.records.read(inp.node)
        if loaded.problem:
            report_unreadable(self.core, inp.node, loaded.problem)
            raise ApplicationError(str(RecordUnreadable(inp.node, loaded.problem)),
                                   type=RECORD_UNREADABLE)
        return loaded.record

    def _seed_record(self, inp: ClaimInput, seeded: NodeRecord) -> None:
        """A node without a record yet (the upgrade to records): the one written from its
        annotations at the claim, so that from now on they decide nothing."""
        try:
            self.records.update(inp.node, lambda cur: cur or seeded, inp.now)
        except RecordUnreadable as err:  # written unreadable since our read
            report_unreadable(self.core, inp.node, err.problem)
            raise ApplicationError(str(err), type=RECORD_UNREADABLE) from err

    @activity.defn
    def claim_node(self, inp: ClaimInput) -> ClaimResult:
        """Cordon, taint, label and annotate the node in one guarded patch, once its history
        is read from its record (activities/record.py), never from its annotations."""
        seen: dict[str, Any] = {}
        record = self._claim_record(inp)

        def build(node: Any) -> dict[str, Any] | None:
            ann = meta_dict(node, "annotations")
            # Ours only when both ids match: the workflow id is derived from the node's name,
            # so a node could write it; the run id exists only once this run started.
            mine = ann.get(A_WORKFLOW) == inp.workflow_id and ann.get(A_RUN) == inp.run_id
            seen["mine"] = mine
            # A retry of our own claim must not mistake our cordon for an admin's.
            pre = ann.get(A_PRECORDONED) == "true" if mine else bool(node.spec.unschedulable)
            seen["pre"] = pre
            # From the record; a node without one yet is seeded from its annotations
            # (written below): the last time they are trusted.
            source = record or seed_from_annotations(inp.node, node.metadata.uid or "", ann,
                                                     inp.now)
            seen["seed"] = None if record else source
            seen["history"] = list(source.history)
            # The GPUs to expect back: the node's declared count (GPU feature discovery),
            # or its capacity if larger. Capacity alone misses a GPU already gone at claim.
            capacity = (node.status.capacity or {}) if node.status else {}
            seen["gpus"] = max(quantity(capacity.get(GPU_RESOURCE)),
                               declared_gpus(meta_dict(node, "labels")) or 0)
            # Identity and boot at claim: a reboot is confirmed by a new boot ID, and a
            # node that comes back under the same name with another UID is a new machine.
            info = node.status.node_info if node.status else None
            seen["boot_id"] = (info.boot_id if info else "") or ""
            seen["uid"] = node.metadata.uid or ""
            if inp.dry_run:
                return None
            now = inp.now.isoformat()
            # A retry of our own claim keeps the record of what the first one added.
            marks: dict[str, str] = {} if mine else {
                A_ADDED_MARKS: ",".join(k for k in AUTOSCALER_MARKS if k not in ann),
                **{k: v for k, v in AUTOSCALER_MARKS.items() if k not in ann}}
            return {
                "metadata": {
                    "labels": {STATE_LABEL: inp.state.value},
                    "annotations": {
                        **marks,
                        A_REASON: inp.reason,
                        A_ACTION: inp.action.value,
                        A_STEP: Step.CLAIM.value,
                        A_WORKFLOW: inp.workflow_id,
                        A_RUN: inp.run_id,
                        A_SINCE: ann.get(A_SINCE) if mine and ann.get(A_SINCE) else now,
                        A_TRANSITION: now,
                        A_ATTEMPT: "0",
                        A_PRECORDONED: "true" if pre else "false",
                    },
                },
                "spec": {"unschedulable": True,
                         "taints": [*_taints_without_ours(node), our_taint()]},
            }

        self._patch_guarded(inp.node, build)
        if seen["seed"] is not None and not inp.dry_run:
            self._seed_record(inp, seen["seed"])
        if not seen["mine"]:
            metrics.REMEDIATIONS_STARTED.labels(inp.action.value, str(inp.dry_run).lower()).inc()
        metrics.REMEDIATION_TRANSITIONS.labels(inp.state.value, str(inp.dry_run).lower()).inc()
        record_node_event(
            self.core, inp.node,
            reason="RemediationPlanned" if inp.dry_run else "RemediationStarted",
            message=(("[dry-run] would cordon and taint: " if inp.dry_run else "cordoned: ")
                     + f"{inp.action.value} ({inp.reason}); workflow {inp.workflow_id}"),
            event_type="Warning",
        )
        return ClaimResult(
            previously_cordoned=seen["pre"], recent_remediations=len(seen["history"]),
            gpus=seen["gpus"], history=seen["history"], boot_id=seen["boot_id"],
            uid=seen["uid"],
        )

    @activity.defn
    def rewrite_state_mirror(self, inp: MirrorRepair) -> bool:
        """The record wins: a state label the node rewrote (forged, wiped, edited) is
        written back to the record's state, and said (Warning Event StateMismatch, counter
        gpu_remediate_state_mismatch_total{kind="state"}). Only if the label still shows
        what the observation saw: a fresher write by the remediation is never undone.
        True when it was rewritten."""
        done: list[bool] = []

        def build(node: Any) -> dict[str, Any] | None:
            done.clear()
            shown = meta_dict(node, "labels").get(STATE_LABEL, "")
            if shown[:63] != inp.shown or shown == inp.state.value:
                return None
            done.append(True)
            return {"metadata": {"labels": {STATE_LABEL: inp.state.value}}}

        self._patch_guarded(inp.node, build)
        if done:
            STATE_MISMATCH.labels("state").inc()
            record_node_event(
                self.core, inp.node, reason="StateMismatch", event_type="Warning",
                message=(f"state label {inp.shown or '(none)'!r} is not the controller's "
                         f"record ({inp.state.value}, {inp.workflow_id or 'no remediation'}): "
                         "rewritten; the node's labels decide nothing"))
        return bool(done)

    @activity.defn
    def set_node_state(self, inp: StateInput) -> None:
        """Write a state transition: label, annotations and an Event."""
        if not inp.dry_run:
            def build(node: Any) -> dict[str, Any]:
                _observe_state_time(node, inp.now)
                body: dict[str, Any] = {"metadata": {
                    "labels": {STATE_LABEL: inp.state.value},
                    "annotations": {A_STEP: inp.step.value, A_REASON: inp.reason,
                                    A_ATTEMPT: str(inp.attempt),
                                    A_TRANSITION: inp.now.isoformat()},
                }}
                # Every state write holds the node again: cordoned and tainted (a kubelet
                # may uncordon its own node; the operand restore lifts our taint for a while).
                if TAINT_KEY not in {t.key for t in node.spec.taints or []} or \
                        not node.spec.unschedulable:
                    body["spec"] = {"unschedulable": True,
                                    "taints": [*_taints_without_ours(node), our_taint()]}
                return body

            self._patch_guarded(inp.node, build, inp.uid)
        metrics.REMEDIATION_TRANSITIONS.labels(inp.state.value, str(inp.dry_run).lower()).inc()
        record_node_event(
            self.core, inp.node, reason=inp.event_reason,
            message=("[dry-run] " if inp.dry_run else "") + inp.event_message,
            event_type=inp.event_type,
        )

    def _release_record(self, inp: ReleaseInput) -> NodeRecord | None:
        """Write the remediation's end to the node's record, before the node is touched:
        the history entry, the XIDs it remediated, their sightings cleared. None when there
        is nothing to write (the claim never landed; another machine under the name) or the
        record is unreadable: then it is kept as it is (never overwritten), reported, and the
        release goes on (a record must never keep a node out of service), writing to the
        annotations only."""
        node = self._read_node(inp.node)
        ann = meta_dict(node, "annotations")
        uid = (node.metadata.uid if node.metadata else "") or ""
        if inp.uid and uid != inp.uid:
            return None  # the guarded patch refuses it (NodeGone)
        if inp.claim_unconfirmed and not _claim_landed(ann, inp):
            return None
        now = inp.history.finished or inp.history.started

        def change(current: NodeRecord | None) -> NodeRecord:
            base = current or seed_from_annotations(inp.node, uid, ann, now)
            if not base.uid:
                base = base.model_copy(update={"uid": uid})
            return with_release(base, inp.history, inp.acknowledged_xids)

        try:
            return self.records.update(inp.node, change, now)
        except RecordUnreadable as err:
            report_unreadable(self.core, inp.node, err.problem)
            return None

    @activity.defn
    def release_node(self, inp: ReleaseInput) -> None:
        """End a remediation: record history, then return the node or keep it quarantined.

        A node that was cordoned before we claimed it stays cordoned (``uncordon`` is
        false then); our taint goes unless the node stays quarantined.
        """
        untouched: list[bool] = []
        kept: list[bool] = []
        record: NodeRecord | None = None
        if not inp.dry_run:
            record = self._release_record(inp)
        if not inp.dry_run and not inp.node_untouched:

            def build(node: Any) -> dict[str, Any] | None:
                kept.clear()  # computed again from each fresh read
                ann = meta_dict(node, "annotations")
                uncordon = inp.uncordon
                if inp.claim_unconfirmed and not _claim_landed(ann, inp):
                    untouched.append(True)
                    return None
                if inp.claim_unconfirmed:
                    # Aborted before the claim reported back: the node is ours (the claim's
                    # patch landed), and its annotation says who cordoned first.
                    uncordon = ann.get(A_PRECORDONED) != "true"
                if uncordon and meta_dict(node, "labels").get(EXCLUDE_LABEL) == "true":
                    # An admin took the node over during the remediation (`kubectl cordon`
                    # of a cordoned node changes nothing Kubernetes records; this label,
                    # which a kubelet cannot set, does): it stays cordoned.
                    uncordon = False
                    kept.append(True)
                _observe_state_time(node, inp.history.finished or inp.history.started)
                annotations: dict[str, str | None] = {
                    A_TRANSITION: (inp.history.finished or inp.history.started).isoformat(),
                }
                if record is not None:
                    # The record is written: the annotations mirror it, whatever they held.
                    annotations.update(mirror_annotations(record, HISTORY_LIMIT))
                else:
                    annotations.update(_annotations_only(ann, inp))
                spec: dict[str, Any] = {}
                if inp.outcome == Outcome.QUARANTINED:
                    state = NodeState.QUARANTINED.value
                    annotations[A_STEP] = Step.QUARANTINED.value
                    # Every quarantine write re-applies the hold: a node that uncordoned
                    # itself (a kubelet may) or lost our taint is held again.
                    spec["unschedulable"] = True
                    spec["taints"] = [*_taints_without_ours(node), our_taint()]
                else:
                    state = NodeState.HEALTHY.value
                    for key in IN_FLIGHT_ANNOTATIONS:
                        annotations[key] = None
                    # Only the marks the claim added, and only known ones (the record is
                    # on the node, which could name any annotation).
                    for key in (ann.get(A_ADDED_MARKS) or "").split(","):
                        if key in AUTOSCALER_MARKS:
                            annotations[key] = None
                    taints = _taints_without_ours(node)
                    if uncordon:
                        spec["unschedulable"] = None
                        # The node controller owns this taint; leaving it would keep the
                        # node unschedulable until the controller notices the uncordon.
                        taints = [t for t in taints if t["key"] != UNSCHEDULABLE_TAINT]
                    spec["taints"] = taints or None
                body: dict[str, Any] = {"metadata": {"labels": {STATE_LABEL: state},
                                                     "annotations": annotations}}
                if spec:
                    body["spec"] = spec
                return body

            self._patch_guarded(inp.node, build, inp.uid)
        if untouched:
            record_node_event(self.core, inp.node, reason=inp.event_reason,
                              message=f"{inp.event_message} (before the node was claimed: "
                                      "nothing to undo)")
            return
        # A drain given up (deadline policy "release", a quarantine order, an abort) never
        # reached "drained": without this its blocked gauge would read 1 forever.
        clear_blocked(inp.node)
        metrics.REMEDIATIONS_FINISHED.labels(inp.outcome.value, str(inp.dry_run).lower()).inc()
        if inp.outcome == Outcome.HEALTHY and not inp.dry_run and inp.history.finished:
            metrics.TIME_TO_SERVICE.observe(
                (inp.history.finished - inp.history.started).total_seconds())
        record_node_event(
            self.core, inp.node, reason=inp.event_reason,
            message=("[dry-run] " if inp.dry_run else "") + inp.event_message
            + (f" (left cordoned: an admin set {EXCLUDE_LABEL}=true)" if kept else ""),
            event_type="Warning" if inp.outcome == Outcome.QUARANTINED else "Normal",
        )
