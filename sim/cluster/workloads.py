"""ReplicaSet, StatefulSet and DaemonSet controllers.

Each keeps its pods at the desired count: terminating and finished pods do
not count as active, so an evicted pod is replaced at once and the
replacement waits in Pending until some node fits it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sim.cluster import deletion, objects
from sim.cluster import resources as r
from sim.cluster.podutil import is_ready, is_terminal, is_terminating, owned_by, phase, tolerates
from sim.cluster.scheduler import affinity_ok
from sim.cluster.store import Obj, Store

DS_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]


def _template_hash(owner: Obj) -> str:
    return hashlib.sha256(repr(owner["spec"].get("template")).encode()).hexdigest()[:10]


def _pods_of(store: Store, owner: Obj) -> list[Obj]:
    return [p for p in store.list(r.PODS, owner["metadata"]["namespace"]) if owned_by(p, owner)]


def _active(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if not is_terminal(p) and not is_terminating(p)]


def _status(owner: Obj, active: list[Obj]) -> dict[str, Any]:
    ready = sum(1 for p in active if is_ready(p))
    return {
        "replicas": len(active),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": owner["metadata"].get("generation", 1),
    }


def _save_status(store: Store, rt: r.ResourceType, owner: Obj, status: dict[str, Any]) -> None:
    if owner.get("status") != status:
        owner["status"] = status
        store.put_internal(rt, owner)


class ReplicaSets:
    def __init__(self, store: Store) -> None:
        self.store = store

    def reconcile(self, now: float) -> None:
        for rs in self.store.list(r.REPLICASETS):
            if is_terminating(rs):
                continue
            active = _active(_pods_of(self.store, rs))
            want = int(rs["spec"].get("replicas", 1))
            ns = rs["metadata"]["namespace"]
            labels = {"pod-template-hash": _template_hash(rs)}
            for _ in range(want - len(active)):
                pod = objects.pod_from_template(
                    rs["spec"]["template"],
                    ns,
                    f"{rs['metadata']['name']}-{objects.suffix()}",
                    rs,
                    r.REPLICASETS,
                    labels,
                )
                active.append(self.store.create(r.PODS, pod))
            if len(active) > want:
                # Scale down the least useful pods first: unscheduled, then not ready.
                ranked = sorted(
                    active, key=lambda p: (bool(p["spec"].get("nodeName")), is_ready(p))
                )
                for pod in ranked[: len(active) - want]:
                    deletion.delete_pod(self.store, pod, None)
                    active.remove(pod)
            status = _status(rs, active)
            status["fullyLabeledReplicas"] = len(active)
            _save_status(self.store, r.REPLICASETS, rs, status)


class StatefulSets:
    def __init__(self, store: Store) -> None:
        self.store = store

    def reconcile(self, now: float) -> None:
        for sts in self.store.list(r.STATEFULSETS):
            if is_terminating(sts):
                continue
            ns, name = sts["metadata"]["namespace"], sts["metadata"]["name"]
            pods = {p["metadata"]["name"]: p for p in _pods_of(self.store, sts)}
            want = int(sts["spec"].get("replicas", 1))
            revision = f"{name}-{_template_hash(sts)}"
            for i in range(want):
                pod_name = f"{name}-{i}"
                pod = pods.get(pod_name)
                if pod is not None and phase(pod) == "Failed" and not is_terminating(pod):
                    # The StatefulSet controller deletes failed pods and recreates them.
                    deletion.delete_pod(self.store, pod, 0)
                    continue
                if pod is None:
                    created = objects.pod_from_template(
                        sts["spec"]["template"],
                        ns,
                        pod_name,
                        sts,
                        r.STATEFULSETS,
                        {
                            "statefulset.kubernetes.io/pod-name": pod_name,
                            "apps.kubernetes.io/pod-index": str(i),
                            "controller-revision-hash": revision,
                        },
                    )
                    created["spec"].setdefault("hostname", pod_name)
                    created["spec"].setdefault("subdomain", sts["spec"].get("serviceName", ""))
                    self.store.create(r.PODS, created)
            for pod_name, pod in pods.items():
                index = pod_name.rsplit("-", 1)[-1]
                if index.isdigit() and int(index) >= want and not is_terminating(pod):
                    deletion.delete_pod(self.store, pod, None)
            active = _active(_pods_of(self.store, sts))
            status = _status(sts, active)
            status.update(
                {
                    "currentReplicas": len(active),
                    "updatedReplicas": len(active),
                    "currentRevision": revision,
                    "updateRevision": revision,
                }
            )
            _save_status(self.store, r.STATEFULSETS, sts, status)


class DaemonSets:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _should_run(self, ds: Obj, node: Obj,
                    effects: tuple[str, ...] = ("NoSchedule", "NoExecute")) -> bool:
        tspec = ds["spec"]["template"].get("spec") or {}
        tols = (tspec.get("tolerations") or []) + DS_TOLERATIONS
        fake = {
            "spec": {"nodeSelector": tspec.get("nodeSelector"), "affinity": tspec.get("affinity")}
        }
        if not affinity_ok(fake, node):
            return False
        return all(
            tolerates(tols, t)
            for t in (node.get("spec") or {}).get("taints") or []
            if t.get("effect") in effects
        )

    def _should_continue_running(self, ds: Obj, node: Obj) -> bool:
        """As the DaemonSet controller's NodeShouldRunDaemonPod: a NoSchedule taint the
        pod does not tolerate stops new pods, but a running one stays; only a node that no
        longer matches, or an untolerated NoExecute taint, removes it."""
        return self._should_run(ds, node, effects=("NoExecute",))

    def reconcile(self, now: float) -> None:
        nodes = self.store.list(r.NODES)
        for ds in self.store.list(r.DAEMONSETS):
            if is_terminating(ds):
                continue
            ns = ds["metadata"]["namespace"]
            pods = _pods_of(self.store, ds)
            by_node: dict[str, list[Obj]] = {}
            for p in pods:
                target = _target_node(p)
                by_node.setdefault(target, []).append(p)
            desired = 0
            for node in nodes:
                name = node["metadata"]["name"]
                mine = by_node.get(name, [])
                if not self._should_run(ds, node):
                    keep = self._should_continue_running(ds, node)
                    for p in mine:
                        if not is_terminating(p) and not (keep and not is_terminal(p)):
                            deletion.delete_pod(self.store, p, None)
                    continue
                desired += 1
                for p in mine:
                    if phase(p) == "Failed" and not is_terminating(p):
                        deletion.delete_pod(self.store, p, 0)
                if not [p for p in mine if not is_terminal(p)]:
                    self.store.create(r.PODS, self._pod_for(ds, ns, name))
            active = _active(_pods_of(self.store, ds))
            ready = sum(1 for p in active if is_ready(p))
            status = {
                "desiredNumberScheduled": desired,
                "currentNumberScheduled": len(active),
                "numberMisscheduled": 0,
                "numberReady": ready,
                "numberAvailable": ready,
                "updatedNumberScheduled": len(active),
                "observedGeneration": ds["metadata"].get("generation", 1),
            }
            _save_status(self.store, r.DAEMONSETS, ds, status)

    def _pod_for(self, ds: Obj, ns: str, node: str) -> Obj:
        pod = objects.pod_from_template(
            ds["spec"]["template"],
            ns,
            f"{ds['metadata']['name']}-{objects.suffix()}",
            ds,
            r.DAEMONSETS,
            {
                "controller-revision-hash": _template_hash(ds),
                "pod-template-generation": str(ds["metadata"].get("generation", 1)),
            },
        )
        spec = pod["spec"]
        # Like the real controller: pin with node affinity and let the scheduler bind.
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        }
        tols = spec.setdefault("tolerations", [])
        for t in DS_TOLERATIONS:
            if t not in tols:
                tols.append(dict(t))
        return pod


def _target_node(pod: Obj) -> str:
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    for term in terms:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return ""
