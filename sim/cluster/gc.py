"""Garbage collection: dependents of deleted owners, foreground deletion,
namespace deletion, and pods bound to nodes that no longer exist (podgc)."""

from __future__ import annotations

from sim.cluster import deletion
from sim.cluster import resources as r
from sim.cluster.podutil import condition
from sim.cluster.store import Obj, Store

_KINDS = {
    "ReplicaSet": r.REPLICASETS,
    "StatefulSet": r.STATEFULSETS,
    "DaemonSet": r.DAEMONSETS,
    "Job": r.JOBS,
    "Node": r.NODES,
}


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


def _out_of_service(node: Obj) -> bool:
    ready = condition(node, "Ready") or {}
    return ready.get("status") != "True" and any(
        t.get("key") == OUT_OF_SERVICE and t.get("effect") == "NoExecute"
        for t in (node.get("spec") or {}).get("taints") or [])


class GarbageCollector:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _owner_alive(self, pod: Obj, ref: dict[str, str]) -> bool:
        rt = _KINDS.get(ref.get("kind", ""))
        if rt is None:
            return True
        owner = self.store.find(rt, pod["metadata"].get("namespace", ""), ref.get("name", ""))
        return owner is not None and owner["metadata"]["uid"] == ref.get("uid")

    def reconcile(self, now: float) -> None:
        pods = self.store.list(r.PODS)
        nodes = self.store.list(r.NODES)
        node_names = {n["metadata"]["name"] for n in nodes}
        out_of_service = {n["metadata"]["name"] for n in nodes if _out_of_service(n)}
        for pod in pods:
            m = pod["metadata"]
            refs = m.get("ownerReferences") or []
            if refs and not any(self._owner_alive(pod, ref) for ref in refs):
                if not m.get("deletionTimestamp"):
                    deletion.delete_pod(self.store, pod, None)
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            if node and node not in node_names:
                self.store.remove(r.PODS, m["namespace"], m["name"])
            elif node in out_of_service and m.get("deletionTimestamp"):
                # Non-graceful node shutdown: podgc force-deletes the pods still
                # terminating on a NotReady node tainted out-of-service.
                self.store.remove(r.PODS, m["namespace"], m["name"])
        self._foreground()
        self._namespaces()

    def _foreground(self) -> None:
        for rt in deletion.OWNER_KINDS:
            for owner in self.store.list(rt):
                m = owner["metadata"]
                if not m.get("deletionTimestamp") or deletion.FOREGROUND not in (
                    m.get("finalizers") or []
                ):
                    continue
                dependents = [
                    p
                    for p in self.store.list(r.PODS, m.get("namespace"))
                    if any(
                        ref.get("uid") == m["uid"]
                        for ref in p["metadata"].get("ownerReferences") or []
                    )
                ]
                for pod in dependents:
                    if not pod["metadata"].get("deletionTimestamp"):
                        deletion.delete_pod(self.store, pod, None)
                if not dependents:
                    m["finalizers"] = [f for f in m["finalizers"] if f != deletion.FOREGROUND]
                    if not m["finalizers"]:
                        del m["finalizers"]
                    saved = self.store.put_internal(rt, owner)
                    deletion.finish_if_released(self.store, rt, saved)

    def _namespaces(self) -> None:
        for ns in self.store.list(r.NAMESPACES):
            if not ns["metadata"].get("deletionTimestamp"):
                continue
            name = ns["metadata"]["name"]
            remaining = 0
            for rt in r.ALL:
                if not rt.namespaced:
                    continue
                for obj in self.store.list(rt, name):
                    remaining += 1
                    if rt is r.PODS:
                        if not obj["metadata"].get("deletionTimestamp"):
                            deletion.delete_pod(self.store, obj, None)
                    else:
                        self.store.remove(rt, name, obj["metadata"]["name"])
                        remaining -= 1
            if remaining == 0:
                self.store.remove(r.NAMESPACES, "", name)
