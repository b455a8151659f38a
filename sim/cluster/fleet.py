"""Seed the store from a scenario: nodes, namespaces, workload owners, PDBs.

Workloads become ReplicaSets/StatefulSets/DaemonSets/Jobs/Pods objects and
the controllers create their pods, so scenario workloads and ones created
through the API behave the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.cluster import clock, defaults, objects
from sim.cluster import resources as r
from sim.cluster.store import Obj, Store
from sim.scenario import Pool, Scenario, Workload

POOL_LABEL = "sim.gpu-remediate.io/pool"
DCGM_NAMESPACE = "gpu-operator"
OPERATOR_NAMESPACE = DCGM_NAMESPACE
DCGM_PORT = 9400
# The GPU Operator runs one DaemonSet per operand and turns each on or off per node with
# the node label `nvidia.com/gpu.deploy.<operand>` ("true"/"false"); it labels every GPU
# node "true" when the node joins.
DEPLOY_LABEL = "nvidia.com/gpu.deploy.{}"
DEVICE_PLUGIN = "nvidia-device-plugin-daemonset"
NVIDIA_RUNTIME_CLASS = "nvidia"
VALIDATOR = "nvidia-operator-validator"
VALIDATOR_READY_FACTOR = 3.0
"""The validator is Ready this many operand start times after it starts."""


@dataclass(frozen=True)
class Operand:
    name: str  # the DaemonSet's name, also its pods' `app` label
    deploy: str  # the operand's part of `nvidia.com/gpu.deploy.<operand>`
    image: str
    holds_gpus: bool  # keeps /dev/nvidia* open while it runs


OPERANDS = (
    Operand(DEVICE_PLUGIN, "device-plugin",
            "nvcr.io/nvidia/k8s-device-plugin:v0.17.1", True),
    Operand("nvidia-dcgm", "dcgm", "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04", True),
    Operand("nvidia-dcgm-exporter", "dcgm-exporter",
            "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04", True),
    Operand("gpu-feature-discovery", "gpu-feature-discovery",
            "nvcr.io/nvidia/k8s-device-plugin:v0.17.1", False),
    # Checks the driver, the container toolkit and CUDA on the node, and is Ready only once
    # they work: after a boot, some seconds after the other operands.
    Operand(VALIDATOR, "operator-validator",
            "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0", False),
)
DEPLOY_LABELS = {DEPLOY_LABEL.format(o.deploy): "true" for o in OPERANDS}
# The MIG manager: the GPU Operator runs its DaemonSet in every install and labels only
# MIG nodes for it. Here a node is a MIG node when its pool's labels name a layout
# (`nvidia.com/mig.config`, other than all-disabled): sim/cluster/mig.py acts it out.
MIG_MANAGER = Operand("nvidia-mig-manager", "mig-manager",
                      "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.12.1-ubuntu20.04", False)
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"


def is_mig_layout(labels: dict[str, str]) -> bool:
    """A node whose labels name a MIG layout to apply."""
    config = labels.get(MIG_CONFIG_LABEL)
    return bool(config) and config != "all-disabled"

BASE_NAMESPACES = (
    "default", "kube-system", "kube-public", "kube-node-lease", DCGM_NAMESPACE,
)
_INSTANCE_TYPES = {"H100": "p5.48xlarge", "A100": "p4d.24xlarge", "L40S": "g6e.48xlarge"}


def node_ip(index: int) -> str:
    return f"10.0.{index // 250}.{index % 250 + 2}"


def _instance_type(pool: Pool) -> str:
    for key, value in _INSTANCE_TYPES.items():
        if key in pool.model:
            return value
    return "gpu-standard"


def node_object(name: str, pool: Pool, index: int) -> Obj:
    gpus = str(pool.gpus)
    ts = clock.rfc3339()
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": _instance_type(pool),
        "nvidia.com/gpu.count": gpus,
        POOL_LABEL: pool.name,
        **DEPLOY_LABELS,
        **pool.labels,
    }
    if is_mig_layout(labels):
        labels.setdefault(DEPLOY_LABEL.format(MIG_MANAGER.deploy), "true")
        labels.setdefault(MIG_STATE_LABEL, "success")
    capacity = {
        "cpu": "192",
        "memory": "2113645480Ki",
        "pods": "110",
        "ephemeral-storage": "3750000000Ki",
        "nvidia.com/gpu": gpus,
    }
    allocatable = {**capacity, "cpu": "191", "memory": "2111548328Ki"}
    conds = [
        {
            "type": t,
            "status": "False",
            "reason": f"KubeletHas{reason}",
            "message": msg,
            "lastHeartbeatTime": ts,
            "lastTransitionTime": ts,
        }
        for t, reason, msg in (
            ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
        )
    ]
    conds.append(
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": ts,
            "lastTransitionTime": ts,
        }
    )
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "nvidia.com/gpu.driver": pool.driver,
                "nvidia.com/gpu.product": pool.model,
            },
        },
        "spec": {
            "providerID": f"sim://{pool.name}/{name}",
            "podCIDR": f"10.244.{index}.0/24",
            "podCIDRs": [f"10.244.{index}.0/24"],
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conds,
            "addresses": [
                {"type": "InternalIP", "address": node_ip(index)},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": objects.suffix(32),
                "systemUUID": objects.suffix(32),
                "bootID": objects.suffix(32),
                "kernelVersion": "6.8.0-1015-nvidia",
                "osImage": "Ubuntu 22.04.5 LTS",
                "containerRuntimeVersion": "containerd://1.7.27",
                "kubeletVersion": "v1.33.1",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def _template(w: Workload, pools: dict[str, Pool], job: bool) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": w.name, **w.labels}
    container: dict[str, Any] = {"name": "main", "image": f"registry.sim.local/{w.name}:latest"}
    if w.gpus_per_pod:
        n = str(w.gpus_per_pod)
        container["resources"] = {
            "limits": {"nvidia.com/gpu": n},
            "requests": {"nvidia.com/gpu": n},
        }
    spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": w.termination_grace_seconds,
        "restartPolicy": "Never" if job else "Always",
    }
    if w.pool and w.pool in pools:
        spec["nodeSelector"] = {POOL_LABEL: w.pool}
    if w.kind == "DaemonSet":
        # Node agents run everywhere, cordoned or tainted.
        spec["tolerations"] = [{"operator": "Exists"}]
    annotations = {objects.READINESS_DELAY: str(w.readiness_delay_seconds)}
    if job:
        # Scenario Jobs are long-running training; only remediation Jobs finish on their own.
        annotations[objects.RUN_FOREVER] = "true"
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}


def _pdb(w: Workload, labels: dict[str, str]) -> Obj:
    assert w.pdb is not None
    spec: dict[str, Any] = {"selector": {"matchLabels": labels}}
    if w.pdb.min_available is not None:
        spec["minAvailable"] = w.pdb.min_available
    else:
        spec["maxUnavailable"] = w.pdb.max_unavailable
    return {"metadata": {"name": w.name, "namespace": w.namespace}, "spec": spec}


def _operand_daemonset(op: Operand, operand_seconds: float) -> Obj:
    labels = {"app": op.name}
    delay = operand_seconds * (VALIDATOR_READY_FACTOR if op.name == VALIDATOR else 1.0)
    annotations = {objects.READINESS_DELAY: str(delay)}
    if op.holds_gpus:
        annotations[objects.HOLDS_GPUS] = "true"
    container: dict[str, Any] = {"name": op.name, "image": op.image}
    if op.name == "nvidia-dcgm-exporter":
        # Scraped on the node's loopback by the product's tests and demos.
        annotations[objects.POD_IP] = "127.0.0.1"
        container["ports"] = [{"name": "metrics", "containerPort": DCGM_PORT, "protocol": "TCP"}]
    if op.name == "nvidia-dcgm":
        # The standalone host engine, reachable on the node's IP (the GPU Operator's
        # dcgm operand sets hostPort 5555).
        container["ports"] = [{"name": "dcgm", "containerPort": 5555, "hostPort": 5555,
                               "protocol": "TCP"}]
    return {
        "metadata": {"name": op.name, "namespace": OPERATOR_NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "containers": [container],
                    "nodeSelector": {DEPLOY_LABEL.format(op.deploy): "true"},
                    "priorityClassName": "system-node-critical",
                    # The GPU Operator's default (daemonsets.tolerations): the GPU taint
                    # only, so a NoSchedule taint of someone else's keeps a new pod off.
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}],
                    "terminationGracePeriodSeconds": 1,
                },
            },
        },
    }


def _dcgm_daemonset() -> Obj:
    """The dcgm-exporter DaemonSet alone (kept for callers that seed only the exporter)."""
    return _operand_daemonset(next(o for o in OPERANDS if o.name == "nvidia-dcgm-exporter"), 0)


def _create(store: Store, rt: r.ResourceType, obj: Obj) -> Obj:
    created = store.create(rt, defaults.on_create(rt, obj))
    if rt is r.JOBS:
        defaults.job_selector(created)
        created = store.put_internal(rt, created)
    return created


def seed(store: Store, scenario: Scenario, operand_seconds: float = 1.0) -> list[str]:
    """Create the scenario's objects; returns the names of nodes the kubelet runs.

    ``operand_seconds``: how long the GPU Operator's operand pods take to become Ready.
    """
    namespaces = list(BASE_NAMESPACES) + [w.namespace for w in scenario.workloads]
    for ns in dict.fromkeys(namespaces):
        _create(store, r.NAMESPACES, {"metadata": {"name": ns}})
    names: list[str] = []
    for index, (name, pool) in enumerate(scenario.nodes()):
        _create(store, r.NODES, node_object(name, pool, index))
        names.append(name)
    pools = {p.name: p for p in scenario.pools}
    for w in scenario.workloads:
        template = _template(w, pools, job=w.kind == "Job")
        selector = {"matchLabels": template["metadata"]["labels"]}
        meta = {"name": w.name, "namespace": w.namespace, "labels": dict(w.labels)}
        if w.kind == "ReplicaSet":
            _create(
                store,
                r.REPLICASETS,
                {
                    "metadata": meta,
                    "spec": {"replicas": w.replicas, "selector": selector, "template": template},
                },
            )
        elif w.kind == "StatefulSet":
            _create(
                store,
                r.STATEFULSETS,
                {
                    "metadata": meta,
                    "spec": {
                        "replicas": w.replicas,
                        "selector": selector,
                        "template": template,
                        "serviceName": w.name,
                        "podManagementPolicy": "Parallel",
                    },
                },
            )
        elif w.kind == "DaemonSet":
            _create(
                store,
                r.DAEMONSETS,
                {"metadata": meta, "spec": {"selector": selector, "template": template}},
            )
        elif w.kind == "Job":
            _create(
                store,
                r.JOBS,
                {
                    "metadata": meta,
                    "spec": {
                        "parallelism": w.replicas,
                        "completions": w.replicas,
                        "template": template,
                    },
                },
            )
        else:
            for i in range(w.replicas):
                pod = objects.pod_from_template(
                    template,
                    w.namespace,
                    w.name if w.replicas == 1 else f"{w.name}-{i}",
                    None,
                    None,
                )
                store.create(r.PODS, pod)
        if w.pdb is not None:
            _create(store, r.PDBS, _pdb(w, template["metadata"]["labels"]))
    for op in (*OPERANDS, MIG_MANAGER):
        _create(store, r.DAEMONSETS, _operand_daemonset(op, operand_seconds))
    # The GPU Operator's container toolkit installs RuntimeClass nvidia (handler nvidia).
    _create(store, r.RUNTIMECLASSES, {"metadata": {"name": NVIDIA_RUNTIME_CLASS},
                                      "handler": NVIDIA_RUNTIME_CLASS})
    return names
