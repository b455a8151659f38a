"""The pods/eviction subresource, following pkg/registry/core/pod/storage/eviction.go.

Order of checks: the Eviction's name must match the URL; the pod must exist;
pods that are not running (Pending, Succeeded, Failed) or already terminating
are deleted without consulting budgets; otherwise the one matching PDB must
allow a disruption, which the server records in the PDB status
(disruptionsAllowed-1, disruptedPods[pod]) before deleting the pod gracefully.
"""

from __future__ import annotations

from typing import Any

from sim.cluster import clock, disruption, errors
from sim.cluster import resources as r
from sim.cluster.deletion import delete_pod
from sim.cluster.podutil import is_ready, is_terminating, phase
from sim.cluster.store import Obj, Store

BUDGET_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _can_ignore_pdb(pod: Obj) -> bool:
    return phase(pod) in ("Succeeded", "Failed", "Pending") or is_terminating(pod)


def _budget_refusal(pdb: Obj) -> errors.ApiError:
    st = pdb.get("status") or {}
    return errors.too_many_requests(
        BUDGET_MESSAGE,
        0,
        [
            {
                "reason": "DisruptionBudget",
                "message": f"The disruption budget {pdb['metadata']['name']} needs "
                f"{st.get('desiredHealthy', 0)} healthy pods and has "
                f"{st.get('currentHealthy', 0)} currently",
            }
        ],
    )


def evict(store: Store, namespace: str, name: str, body: dict[str, Any], dry_run: bool) -> Obj:
    if (body.get("metadata") or {}).get("name") not in (None, "", name):
        raise errors.bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    dry_run = dry_run or "All" in (options.get("dryRun") or [])
    pod = store.get(r.PODS, namespace, name)
    pre = options.get("preconditions") or {}
    if pre.get("uid") and pre["uid"] != pod["metadata"]["uid"]:
        raise errors.conflict(
            r.PODS,
            name,
            f"Precondition failed: UID in precondition: "
            f"{pre['uid']}, UID in object meta: {pod['metadata']['uid']}",
        )
    grace = options.get("gracePeriodSeconds")
    if _can_ignore_pdb(pod):
        delete_pod(store, pod, grace, dry_run=dry_run)
        return dict(SUCCESS)
    pdbs = [p for p in store.list(r.PDBS, namespace) if disruption.matching_pods(p, [pod])]
    if len(pdbs) > 1:
        raise errors.internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource "
            "does not support."
        )
    if pdbs:
        pdb = pdbs[0]
        st = pdb.get("status") or {}
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        unready_ok = not is_ready(pod) and (
            policy == "AlwaysAllow"
            or st.get("currentHealthy", 0) >= st.get("desiredHealthy", 0) > 0
        )
        if not unready_ok:
            _check_and_decrement(store, pdb, name, dry_run)
    delete_pod(store, pod, grace, dry_run=dry_run)
    return dict(SUCCESS)


def _check_and_decrement(store: Store, pdb: Obj, pod_name: str, dry_run: bool) -> None:
    st = pdb.setdefault("status", {})
    pdb_name = pdb["metadata"]["name"]
    if st.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        raise errors.too_many_requests(
            BUDGET_MESSAGE,
            10,
            [
                {
                    "reason": "DisruptionBudget",
                    "message": f"The disruption budget {pdb_name} is still being processed "
                    "by the server.",
                }
            ],
        )
    allowed = int(st.get("disruptionsAllowed", 0))
    if allowed < 0:
        raise errors.forbidden(r.PDBS, pdb_name, "pdb disruptions allowed is negative")
    if allowed == 0:
        raise _budget_refusal(pdb)
    if dry_run:
        return
    st["disruptionsAllowed"] = allowed - 1
    st.setdefault("disruptedPods", {})[pod_name] = clock.rfc3339()
    store.put_internal(r.PDBS, pdb)
