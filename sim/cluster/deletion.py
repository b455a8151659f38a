"""DELETE semantics: preconditions, graceful pod termination, finalizers and
garbage-collection propagation policies.

Pods bound to a node get a deletionTimestamp (now + grace) and stay visible as
Terminating until their kubelet finishes; unbound or finished pods and an
explicit gracePeriodSeconds=0 go at once. Dependents are handled the way the
garbage collector would: Orphan strips ownerReferences, Background leaves the
dependents for the collector, Foreground keeps the owner until they are gone.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.cluster import clock, errors
from sim.cluster import resources as r
from sim.cluster.podutil import is_terminal
from sim.cluster.store import Obj, Store

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
OWNER_KINDS = (r.JOBS, r.REPLICASETS, r.STATEFULSETS, r.DAEMONSETS)


def success_status(rt: r.ResourceType, obj: Obj) -> dict[str, Any]:
    details: dict[str, Any] = {"name": obj["metadata"]["name"]}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    details["uid"] = obj["metadata"].get("uid", "")
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }


def _check_preconditions(rt: r.ResourceType, obj: Obj, options: dict[str, Any]) -> None:
    pre = options.get("preconditions") or {}
    m = obj["metadata"]
    if pre.get("uid") and pre["uid"] != m.get("uid"):
        raise errors.conflict(
            rt,
            m["name"],
            f"Precondition failed: UID in precondition: "
            f"{pre['uid']}, UID in object meta: {m.get('uid')}",
        )
    if pre.get("resourceVersion") and pre["resourceVersion"] != m.get("resourceVersion"):
        raise errors.conflict(
            rt,
            m["name"],
            "Precondition failed: ResourceVersion in "
            f"precondition: {pre['resourceVersion']}, ResourceVersion in object "
            f"meta: {m.get('resourceVersion')}",
        )


def _policy(rt: r.ResourceType, options: dict[str, Any]) -> str:
    if options.get("propagationPolicy"):
        return str(options["propagationPolicy"])
    if options.get("orphanDependents") is True:
        return "Orphan"
    if options.get("orphanDependents") is False:
        return "Background"
    # batch/v1 Jobs keep the pre-GC default of orphaning; apps/v1 owners cascade.
    return "Orphan" if rt is r.JOBS else "Background"


def delete(
    store: Store,
    rt: r.ResourceType,
    namespace: str,
    name: str,
    options: dict[str, Any],
    *,
    dry_run: bool = False,
) -> dict[str, Any]:
    obj = store.get(rt, namespace, name)
    _check_preconditions(rt, obj, options)
    if rt is r.PODS:
        return delete_pod(store, obj, options.get("gracePeriodSeconds"), dry_run=dry_run)
    if rt is r.NAMESPACES:
        if dry_run or obj["metadata"].get("deletionTimestamp"):
            return obj
        obj["metadata"]["deletionTimestamp"] = clock.rfc3339()
        obj["metadata"]["deletionGracePeriodSeconds"] = 0
        obj["status"] = {"phase": "Terminating"}
        return store.put_internal(rt, obj)
    if dry_run:
        return success_status(rt, obj) if not obj["metadata"].get("finalizers") else obj
    if rt in OWNER_KINDS:
        policy = _policy(rt, options)
        if policy == "Orphan":
            orphan_dependents(store, obj)
        elif policy == "Foreground":
            return _mark_deleting(store, rt, obj, FOREGROUND)
    if obj["metadata"].get("finalizers"):
        return _mark_deleting(store, rt, obj, None)
    store.remove(rt, namespace, name)
    return success_status(rt, obj)


def _mark_deleting(store: Store, rt: r.ResourceType, obj: Obj, finalizer: str | None) -> Obj:
    m = obj["metadata"]
    if finalizer and finalizer not in (m.get("finalizers") or []):
        m.setdefault("finalizers", []).append(finalizer)
    if not m.get("deletionTimestamp"):
        m["deletionTimestamp"] = clock.rfc3339()
        m["deletionGracePeriodSeconds"] = 0
    return store.put_internal(rt, obj)


def orphan_dependents(store: Store, owner: Obj) -> None:
    uid = owner["metadata"]["uid"]
    for pod in store.list(r.PODS, owner["metadata"].get("namespace")):
        refs = pod["metadata"].get("ownerReferences") or []
        kept = [ref for ref in refs if ref.get("uid") != uid]
        if len(kept) != len(refs):
            if kept:
                pod["metadata"]["ownerReferences"] = kept
            else:
                pod["metadata"].pop("ownerReferences", None)
            store.put_internal(r.PODS, pod)


def delete_pod(store: Store, pod: Obj, grace: int | None, *, dry_run: bool = False) -> Obj:
    """Graceful pod deletion as the pod registry strategy does it."""
    m = pod["metadata"]
    if grace is None:
        grace = int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
    if not (pod.get("spec") or {}).get("nodeName") or is_terminal(pod):
        # Nothing is running, so there is nothing to wait for.
        grace = 0
    if m.get("deletionTimestamp"):
        remaining = clock.parse(m["deletionTimestamp"]) - clock.now()
        if grace > 0 and grace >= remaining:
            return pod
    if dry_run:
        out = copy.deepcopy(pod)
        if grace > 0:
            out["metadata"]["deletionTimestamp"] = clock.rfc3339(clock.now() + grace)
            out["metadata"]["deletionGracePeriodSeconds"] = grace
        return out
    if grace == 0 and not m.get("finalizers"):
        return store.remove(r.PODS, m["namespace"], m["name"])
    m["deletionTimestamp"] = clock.rfc3339(clock.now() + grace)
    m["deletionGracePeriodSeconds"] = grace
    return store.put_internal(r.PODS, pod)


def finish_if_released(store: Store, rt: r.ResourceType, obj: Obj) -> bool:
    """Remove an object being deleted once its last finalizer is gone."""
    m = obj["metadata"]
    if m.get("deletionTimestamp") and not m.get("finalizers") and rt not in (r.PODS, r.NAMESPACES):
        store.remove(rt, m.get("namespace", ""), m["name"])
        return True
    return False
