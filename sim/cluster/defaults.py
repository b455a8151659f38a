"""Defaulting and mutating admission applied on create, as kube-apiserver does.

Only fields a client would observe are defaulted: pod scheduling fields, the
DefaultTolerationSeconds tolerations, Job selector/labels/limits, namespace
phase. Keeping them here means objects look the same whether a controller or
a client created them.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.cluster import dra_schema as dra
from sim.cluster import resources as r
from sim.cluster.store import Obj, meta

GPU = "nvidia.com/gpu"
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"


def pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    for c in spec.get("containers") or []:
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("imagePullPolicy", "IfNotPresent")
        res = c.setdefault("resources", {})
        # Limits without requests default the requests (extended resources need both equal).
        if res.get("limits"):
            req = res.setdefault("requests", {})
            for k, v in res["limits"].items():
                req.setdefault(k, v)


def _default_tolerations(spec: dict[str, Any]) -> None:
    """DefaultTolerationSeconds admission: 300 s for not-ready/unreachable NoExecute."""
    tols = spec.setdefault("tolerations", [])
    for key in (NOT_READY, UNREACHABLE):
        covered = any(
            (t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"))
            and t.get("effect") in (None, "", "NoExecute")
            for t in tols
        )
        if not covered:
            tols.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )


def on_create(rt: r.ResourceType, obj: Obj) -> Obj:
    obj = copy.deepcopy(obj)
    m = meta(obj)
    if rt is r.PODS:
        spec = obj.setdefault("spec", {})
        pod_spec(spec)
        _default_tolerations(spec)
        status = obj.setdefault("status", {})
        status.setdefault("phase", "Pending")
        status.setdefault("qosClass", "BestEffort")
    elif rt is r.NAMESPACES:
        m.setdefault("labels", {})["kubernetes.io/metadata.name"] = m.get("name", "")
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj["status"] = {"phase": "Active"}
    elif rt is r.JOBS:
        _job(obj)
    elif rt.group == r.RESOURCESLICES.group:
        dra.on_create(rt, obj)
    elif rt in (r.REPLICASETS, r.STATEFULSETS, r.DAEMONSETS):
        spec = obj.setdefault("spec", {})
        if rt is not r.DAEMONSETS:
            spec.setdefault("replicas", 1)
        pod_spec(spec.setdefault("template", {}).setdefault("spec", {}))
        obj.setdefault("status", {"replicas": 0} if rt is not r.DAEMONSETS else {})
    elif rt is r.PDBS:
        obj.setdefault(
            "status",
            {
                "currentHealthy": 0,
                "desiredHealthy": 0,
                "disruptionsAllowed": 0,
                "expectedPods": 0,
            },
        )
    elif rt is r.NODES:
        obj.setdefault("spec", {})
        obj.setdefault("status", {})
    return obj


def _job(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    template = spec.setdefault("template", {})
    pod_spec(template.setdefault("spec", {}))
    obj.setdefault("status", {})


def job_selector(obj: Obj) -> None:
    """The server generates the Job selector from the uid it just assigned."""
    spec = obj["spec"]
    if spec.get("manualSelector"):
        return
    uid = obj["metadata"]["uid"]
    name = obj["metadata"]["name"]
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
    labels.update(
        {
            "batch.kubernetes.io/controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "controller-uid": uid,
            "job-name": name,
        }
    )
