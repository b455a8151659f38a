"""Builders for the objects controllers create, shaped like the real ones."""

from __future__ import annotations

import copy
import random
from typing import Any

from sim.cluster import clock, defaults
from sim.cluster import resources as r
from sim.cluster.store import Obj

# Simulation knobs carried on pods, so tests creating pods through the API can set them.
READINESS_DELAY = "sim.gpu-remediate.io/readiness-delay-seconds"
RUN_FOREVER = "sim.gpu-remediate.io/run-forever"
POD_IP = "sim.gpu-remediate.io/pod-ip"
# The pod keeps the node's GPUs open while it runs (as the device plugin and DCGM do),
# whether or not it requests nvidia.com/gpu: `nvidia-smi -r` refuses while it runs.
HOLDS_GPUS = "sim.gpu-remediate.io/holds-gpus"
MIRROR = "kubernetes.io/config.mirror"
JOB_LABEL = "gpu-remediate.io/job"
GPU_LABEL = "gpu-remediate.io/gpu"


def suffix(n: int = 5) -> str:
    """Kubernetes' generateName alphabet (no vowels, no confusable digits)."""
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


def owner_ref(owner: Obj, rt: r.ResourceType) -> dict[str, Any]:
    return {
        "apiVersion": rt.api_version,
        "kind": rt.kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_from_template(
    template: dict[str, Any],
    namespace: str,
    name: str,
    owner: Obj | None,
    owner_rt: r.ResourceType | None,
    extra_labels: dict[str, str] | None = None,
) -> Obj:
    tmeta = template.get("metadata") or {}
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(tmeta.get("labels") or {}), **(extra_labels or {})},
            "annotations": dict(tmeta.get("annotations") or {}),
        },
        "spec": copy.deepcopy(template.get("spec") or {}),
    }
    if not pod["metadata"]["annotations"]:
        del pod["metadata"]["annotations"]
    if owner is not None and owner_rt is not None:
        pod["metadata"]["ownerReferences"] = [owner_ref(owner, owner_rt)]
    return defaults.on_create(r.PODS, pod)


def running_status(pod: Obj, node_ip: str, pod_ip: str, now: float) -> dict[str, Any]:
    ts = clock.rfc3339(now)
    containers = (pod.get("spec") or {}).get("containers") or []
    status = dict(pod.get("status") or {})
    status.update(
        {
            "phase": "Running",
            "hostIP": node_ip,
            "hostIPs": [{"ip": node_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": status.get("startTime") or ts,
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "containerID": f"containerd://{suffix(12)}",
                    "ready": False,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": ts}},
                }
                for c in containers
            ],
        }
    )
    conds = [
        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": ts},
        {"type": "Initialized", "status": "True", "lastTransitionTime": ts},
        {
            "type": "Ready",
            "status": "False",
            "lastTransitionTime": ts,
            "reason": "ContainersNotReady",
            "message": "containers with unready status",
        },
        {
            "type": "ContainersReady",
            "status": "False",
            "lastTransitionTime": ts,
            "reason": "ContainersNotReady",
            "message": "containers with unready status",
        },
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts},
    ]
    old = {c["type"]: c for c in status.get("conditions") or []}
    status["conditions"] = [
        old.get(c["type"], c) if c["type"] == "PodScheduled" else c for c in conds
    ]
    return status
