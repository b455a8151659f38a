"""Drain: evict a node's pods through the Eviction API, honouring PodDisruptionBudgets.

The activity works in rounds and returns ``blocked`` after ``report_after`` whenever pods
are left, whatever holds them (a PDB, a stopped kubelet, a long grace period), so the
workflow, which owns the deadline and its policy, shows progress and every drain ends.
On a node that is not Ready, a pod stuck Terminating past ``not_ready_terminating_timeout``
counts as gone.

Heartbeats are honest: one after every API call (each eviction included) and after every
pause, and every call is one attempt (the client's own retries are off: urllib3 retried a
timed-out GET three times, 100 s for one "call") bounded by ``call_timeout_for`` the
activity's heartbeat timeout: 25 s at most, and always ``HEARTBEAT_MARGIN_SECONDS`` inside
it. So the longest gap between two heartbeats is one call or one pause: with the API server
taking 20 s per call, a drain of any number of pods heartbeats every ~20 s, inside the
default 30 s. The worker refuses at start a ``remediation.heartbeat_timeout`` too short to
leave a call ``MIN_CALL_SECONDS`` (``min_heartbeat_timeout``, worker/config.py); pauses
are checked by ``RemediationSettings`` (at most half the heartbeat timeout).
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import metrics
from activities.events import record_node_event
from activities.gpus import pod_gpu_request
from activities.kube import REQUEST_TIMEOUT, raise_typed, status_message
from workflows import errors
from workflows.messages import DrainInput, DrainResult

log = logging.getLogger(__name__)

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_PDB_IN_CAUSE = re.compile(r"disruption budget ([a-z0-9.-]+)")
POLL_SECONDS = 1.0
HEARTBEAT_MARGIN_SECONDS = 2.0
"""Room in the heartbeat timeout for what runs between two calls (parsing a pod list,
sending the heartbeat itself)."""
MAX_CALL_SECONDS = 25.0
"""One drain call's limit, connect and read together, with a heartbeat timeout to spare."""
MIN_CALL_SECONDS = 3.0
"""Shorter, and an ordinary call to a loaded API server would time out."""


def call_timeout_for(heartbeat_timeout: timedelta | None) -> float:
    """Seconds one drain call may take: inside the heartbeat timeout by the margin, at most
    ``MAX_CALL_SECONDS``."""
    if not heartbeat_timeout:
        return MAX_CALL_SECONDS
    return max(MIN_CALL_SECONDS, min(
        MAX_CALL_SECONDS, heartbeat_timeout.total_seconds() - HEARTBEAT_MARGIN_SECONDS))


def min_heartbeat_timeout() -> timedelta:
    """The shortest heartbeat timeout a drain call fits in (checked at the worker's start)."""
    return timedelta(seconds=MIN_CALL_SECONDS + HEARTBEAT_MARGIN_SECONDS)


GET_TRIES = 3
TRANSIENT = (429, 500, 502, 503, 504)


def _retry_after(err: ApiException) -> float:
    try:
        return max(0.0, float((err.headers or {}).get("Retry-After", 1)))
    except ValueError:
        return 1.0


def _seconds(timeout: float | tuple[float, float]) -> float:
    return float(sum(timeout)) if isinstance(timeout, tuple) else float(timeout)


def _one_attempt(api: client.ApiClient) -> client.ApiClient:
    """A client on the same configuration whose calls are one attempt each: urllib3 retries
    a GET that timed out (three more times by default), which no heartbeat sees."""
    cfg = copy.copy(api.configuration)
    cfg.retries = False
    return client.ApiClient(cfg)


def pod_key(pod: Any) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name}"


def skip_reason(pod: Any, *, gpu_pods_only: bool) -> str | None:
    """Why a pod is left alone by a drain, or None if it must go."""
    if (pod.metadata.annotations or {}).get(MIRROR_ANNOTATION):
        return "mirror pod"
    for ref in pod.metadata.owner_references or []:
        if ref.kind == "DaemonSet":
            return "DaemonSet pod"
    if pod.status and pod.status.phase in ("Succeeded", "Failed"):
        return "finished"
    if gpu_pods_only and not requests_gpu(pod):
        return "uses no GPU"
    return None


def requests_gpu(pod: Any) -> bool:
    return pod_gpu_request(pod) > 0


def blocking_pdb(err: ApiException, namespace: str) -> str:
    """The PDB named in a 429's causes, as namespace/name."""
    match = _PDB_IN_CAUSE.search(err.body or "")
    return f"{namespace}/{match.group(1)}" if match else f"{namespace}/(unnamed budget)"


# The PDB each node's drain is blocked by in this worker process: it drives the gauge,
# and the DrainBlocked Event is sent once per blocking PDB, not once per drain_node call
# (the workflow calls again after every "blocked" report until its deadline).
_blocked_by: dict[str, str] = {}


def _mark_blocked(node: str, pdb: str) -> bool:
    """Record the blocking PDB; True when it is new for this node (announce it)."""
    if _blocked_by.get(node) == pdb:
        return False
    clear_blocked(node)
    _blocked_by[node] = pdb
    metrics.DRAIN_BLOCKED.labels(node, pdb).set(1)
    return True


def clear_blocked(node: str) -> None:
    """The node's drain is no longer blocked (drained, or the remediation ended)."""
    old = _blocked_by.pop(node, None)
    if old is not None:
        metrics.DRAIN_BLOCKED.remove(node, old)


def _beat(details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(details)


class DrainActivities:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(_one_attempt(api))
        self._call = threading.local()

    @property
    def timeout(self) -> float | tuple[float, float]:
        """This drain's per-call limit (drains run at once in the worker's threads)."""
        return getattr(self._call, "timeout", REQUEST_TIMEOUT)

    def _get(self, call: Callable[[], Any]) -> Any:
        """A read, retried here (not by urllib3, unseen) through a short burst of 429/50x:
        a heartbeat before each pause, each pause within a third of the call limit whatever
        Retry-After asks."""
        for attempt in range(GET_TRIES):
            try:
                return call()
            except ApiException as err:
                if err.status not in TRANSIENT or attempt == GET_TRIES - 1:
                    raise
                _beat({"step": f"read answered {err.status}; retrying"})
                time.sleep(min(_retry_after(err), _seconds(self.timeout) / 3))
        raise AssertionError("unreachable")

    def _pods(self, node: str) -> list[Any]:
        try:
            return list(self._get(lambda: self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=self.timeout,
            )).items)
        except ApiException as err:
            raise_typed(err, f"list pods on {node}")

    def _evict(self, pod: Any) -> tuple[str, str]:
        """Ask the Eviction API to move one pod: (result, blocking PDB)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod.metadata.name, "namespace": pod.metadata.namespace}}
        try:
            self.core.create_namespaced_pod_eviction(
                pod.metadata.name, pod.metadata.namespace, client.V1Eviction.model_validate(body),
                _request_timeout=self.timeout
            )
            return "evicted", ""
        except ApiException as err:
            if err.status == 404:
                return "gone", ""
            if err.status == 429:
                return "blocked", blocking_pdb(err, pod.metadata.namespace)
            if err.status == 500 and "more than one" in status_message(err):
                return "blocked", f"{pod.metadata.namespace}/(several budgets match)"
            raise_typed(err, f"evict {pod_key(pod)}")

    def _delete(self, pod: Any) -> None:
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, _request_timeout=self.timeout
            )
        except ApiException as err:
            if err.status == 403:
                raise_typed(err, f"delete {pod_key(pod)} (a force drain needs pods delete: "
                                 "deploy/components/force-drain, Helm forceDrain: true)")
            if err.status != 404:
                raise_typed(err, f"delete {pod_key(pod)}")

    def _node_ready(self, node: str, uid: str = "") -> bool:
        """Whether the node's kubelet reports Ready (a stopped kubelet never confirms a
        deletion: its pods stay Terminating)."""
        try:
            obj = self._get(lambda: self.core.read_node(node, _request_timeout=self.timeout))
        except ApiException as err:
            if err.status == 404:
                raise ApplicationError(f"node {node} is gone (deleted while it was drained)",
                                       type=errors.NODE_GONE, non_retryable=True) from err
            raise_typed(err, f"read node {node}")
        if uid and obj.metadata and obj.metadata.uid != uid:
            raise ApplicationError(f"node {node} was replaced: uid {uid} at claim, now "
                                   f"{obj.metadata.uid}; its pods are not ours to evict",
                                   type=errors.NODE_GONE, non_retryable=True)
        for cond in (obj.status.conditions or []) if obj.status else []:
            if cond.type == "Ready":
                return bool(cond.status == "True")
        return False

    @activity.defn
    def drain_node(self, inp: DrainInput) -> DrainResult:
        """Evict until the node is empty, reporting back after ``report_after`` whatever
        holds the drain up: a PDB that refuses, pods stuck Terminating (a stopped kubelet,
        a finalizer, a long grace period), pods landing again. The workflow owns the
        deadline and its policy, so every drain ends."""
        started = time.monotonic()
        beat_within = activity.info().heartbeat_timeout if activity.in_activity() else None
        self._call.timeout = call_timeout_for(beat_within)
        evicted: set[str] = set()
        forced: set[str] = set()
        counted_gone: set[str] = set()
        gone_after = inp.settings.not_ready_terminating_timeout
        progress: dict[str, Any] = {"evicted": 0, "remaining": 0, "pdb": "", "terminating": 0}

        def beat(step: str) -> None:
            _beat({**progress, "evicted": len(evicted), "step": step})

        def event(**kw: Any) -> None:
            record_node_event(self.core, inp.node, before_each_try=lambda: beat("event"), **kw)

        while True:
            node_ready = True if inp.dry_run else self._node_ready(inp.node, inp.uid)
            beat("node read")
            pods = self._pods(inp.node)
            beat("pods listed")
            now = datetime.now(UTC)
            targets, skipped, terminating = [], [], []
            for pod in pods:
                why = skip_reason(pod, gpu_pods_only=inp.settings.gpu_pods_only)
                if why:
                    skipped.append(f"{pod_key(pod)} ({why})")
                    continue
                overdue = _past_grace(pod, now)
                if overdue is not None and not node_ready and overdue >= gone_after:
                    # Its kubelet is not there to confirm the deletion: count it as gone.
                    counted_gone.add(pod_key(pod))
                    continue
                if overdue is not None and overdue > timedelta(0):
                    terminating.append(f"{pod_key(pod)} (for {_short(overdue)} past its grace)")
                targets.append(pod)
            if inp.dry_run:
                return DrainResult(outcome="planned", remaining=[pod_key(p) for p in targets],
                                   skipped=skipped, message=f"would evict {len(targets)} pods")
            if not targets:
                clear_blocked(inp.node)
                message = f"evicted {len(evicted)} pods" + (
                    f", deleted {len(forced)} past the drain deadline" if forced else "") + (
                    f", counted {len(counted_gone)} stuck Terminating on the NotReady node as "
                    "gone" if counted_gone else "")
                # The original tool's GPUDrained: the moment the node holds no workload.
                event(reason="DrainCompleted",
                      message=f"drained: {message}; {len(skipped)} pods left in place "
                              "(DaemonSet, mirror, finished or not ours)")
                return DrainResult(outcome="drained", evicted=sorted(evicted),
                                   forced=sorted(forced), skipped=skipped,
                                   counted_gone=sorted(counted_gone), node_ready=node_ready,
                                   message=message)
            pdb_now = ""
            for pod in targets:
                if pod.metadata.deletion_timestamp is not None:
                    continue  # already going: wait for its grace period
                if inp.force:
                    self._delete(pod)
                    forced.add(pod_key(pod))
                    metrics.EVICTIONS.labels("forced").inc()
                    beat(f"deleted {pod_key(pod)}")
                    continue
                result, blocker = self._evict(pod)
                metrics.EVICTIONS.labels(result).inc()
                if result == "evicted":
                    evicted.add(pod_key(pod))
                elif result == "blocked":
                    pdb_now = pdb_now or blocker
                # Per eviction: a slow API server (each call up to call_timeout) must not
                # add its calls up past the heartbeat timeout.
                beat(f"{result} {pod_key(pod)}")
            if pdb_now and _mark_blocked(inp.node, pdb_now):
                event(reason="DrainBlocked", event_type="Warning",
                      message=f"eviction refused by PodDisruptionBudget {pdb_now}; retrying")
            elif not pdb_now:
                clear_blocked(inp.node)
            remaining = [pod_key(p) for p in targets]
            progress.update(remaining=len(remaining), pdb=pdb_now, terminating=len(terminating))
            activity.heartbeat({"evicted": len(evicted), "remaining": len(remaining),
                                "pdb": pdb_now, "terminating": len(terminating)})
            if time.monotonic() - started >= inp.report_after.total_seconds():
                # Whatever holds the drain up, the workflow hears of it on a timer: its
                # deadline and policy apply to any pod left, not only to a PDB's.
                result_now = DrainResult(
                    outcome="blocked", evicted=sorted(evicted), remaining=remaining,
                    skipped=skipped, blocking_pdb=pdb_now, terminating=terminating,
                    counted_gone=sorted(counted_gone), node_ready=node_ready)
                return result_now.model_copy(update={
                    "message": f"{len(remaining)} pods left; {result_now.left_summary()}"})
            time.sleep(POLL_SECONDS if not pdb_now else inp.settings.retry_interval.total_seconds())
            beat("paused")


def _past_grace(pod: Any, now: datetime) -> timedelta | None:
    """How long past the end of its grace period a deleted pod is still there (negative:
    still within it); None for a pod nobody deleted. ``deletionTimestamp`` is the moment
    the grace period ends."""
    ts = pod.metadata.deletion_timestamp
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return now - ts


def _short(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
