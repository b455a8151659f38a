"""kube-scheduler, reduced to the filters that matter for GPU nodes.

A Pending pod with no nodeName is bound to a node that is Ready, schedulable
(or tolerates the unschedulable taint), whose NoSchedule/NoExecute taints it
tolerates, that matches its nodeSelector and required node affinity, and that
has enough free `nvidia.com/gpu` and pod slots, and (DRA) whose devices can satisfy
its ResourceClaims, device taints honoured (sim/cluster/dra.py). Pods that fit nowhere get a
PodScheduled=False/Unschedulable condition with a scheduler-style message.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from sim.cluster import clock, dra
from sim.cluster import resources as r
from sim.cluster.podutil import (
    allocatable_gpus,
    gpu_request,
    is_terminal,
    node_ready,
    set_condition,
    tolerates,
)
from sim.cluster.store import Obj, Store

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def affinity_ok(pod: Obj, node: Obj) -> bool:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(_term_ok(term, labels, fields) for term in terms)


def _term_ok(term: dict[str, Any], labels: dict[str, str], fields: dict[str, str]) -> bool:
    for source, exprs in (
        (labels, term.get("matchExpressions")),
        (fields, term.get("matchFields")),
    ):
        for e in exprs or []:
            value, op, values = source.get(e["key"]), e["operator"], e.get("values") or []
            ok = {
                "In": value in values,
                "NotIn": value not in values,
                "Exists": value is not None,
                "DoesNotExist": value is None,
            }.get(op, False)
            if not ok:
                return False
    return True


def _taint_text(t: dict[str, Any]) -> str:
    return f"{{{t.get('key')}: {t.get('value', '')}}}"


class Scheduler:
    def __init__(self, store: Store) -> None:
        self.store = store

    def reconcile(self, now: float) -> None:
        pending = [
            p
            for p in self.store.list(r.PODS)
            if not (p.get("spec") or {}).get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and not is_terminal(p)
            and (p.get("spec") or {}).get("schedulerName", "default-scheduler")
            == "default-scheduler"
        ]
        if not pending:
            return
        nodes = self.store.list(r.NODES)
        used: Counter[str] = Counter()
        count: Counter[str] = Counter()
        for p in self.store.list(r.PODS):
            node = (p.get("spec") or {}).get("nodeName")
            if node and not is_terminal(p):
                used[node] += gpu_request(p)
                count[node] += 1
        inventory = (dra.Inventory.load(self.store)
                     if any((p.get("spec") or {}).get("resourceClaims") for p in pending)
                     else None)
        for pod in sorted(pending, key=lambda p: p["metadata"].get("creationTimestamp", "")):
            self._schedule(pod, nodes, used, count, now, inventory)

    def _schedule(
        self, pod: Obj, nodes: list[Obj], used: Counter[str], count: Counter[str], now: float,
        inventory: dra.Inventory | None = None,
    ) -> None:
        claims = bool((pod.get("spec") or {}).get("resourceClaims"))
        want = gpu_request(pod)
        tols = (pod.get("spec") or {}).get("tolerations") or []
        reasons: Counter[str] = Counter()
        fits: list[tuple[int, str]] = []
        for node in nodes:
            name = node["metadata"]["name"]
            spec = node.get("spec") or {}
            taints = [
                t
                for t in spec.get("taints") or []
                if t.get("effect") in ("NoSchedule", "NoExecute")
            ]
            if spec.get("unschedulable") and not tolerates(
                tols, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
            ):
                reasons["node(s) were unschedulable"] += 1
                continue
            if not node_ready(node) and not tolerates(
                tols, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
            ):
                reasons["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"] += 1
                continue
            bad = next((t for t in taints if not tolerates(tols, t)), None)
            if bad is not None:
                reasons[f"node(s) had untolerated taint {_taint_text(bad)}"] += 1
                continue
            if not affinity_ok(pod, node):
                reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                continue
            free = allocatable_gpus(node) - used[name]
            # Like NodeResourcesFit: only what the pod requests is checked (a node whose
            # device plugin stopped under running GPU pods is over-committed, yet still
            # takes a pod that asks for no GPU, such as the device plugin's own).
            if want and want > free:
                reasons["Insufficient nvidia.com/gpu"] += 1
                continue
            max_pods = int(((node.get("status") or {}).get("allocatable") or {}).get("pods", 110))
            if count[name] >= max_pods:
                reasons["Too many pods"] += 1
                continue
            if claims and inventory is not None:
                _, why = inventory.allocate(pod, name)
                if why:
                    reasons[why] += 1
                    continue
            fits.append((-free, name))
        ts = clock.rfc3339(now)
        if fits:
            # LeastAllocated scoring: the node with the most free GPUs wins.
            chosen = min(fits)[1]
            if claims and inventory is not None:
                # The claims are allocated (and reserved for the pod) before it is bound.
                inventory.commit(inventory.allocate(pod, chosen)[0])
            pod["spec"]["nodeName"] = chosen
            set_condition(
                pod,
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": ts,
                },
                ts,
            )
            for c in pod["status"]["conditions"]:
                if c["type"] == "PodScheduled":
                    c.pop("reason", None)
                    c.pop("message", None)
            self.store.put_internal(r.PODS, pod)
            used[chosen] += want
            count[chosen] += 1
            return
        detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
        message = (
            f"0/{len(nodes)} nodes are available: {detail}. preemption: 0/{len(nodes)} "
            "nodes are available: "
            f"{len(nodes)} Preemption is not helpful for scheduling."
        )
        set_condition(
            pod,
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "reason": "Unschedulable",
                "message": message,
            },
            ts,
        )
        self.store.put_internal(r.PODS, pod)
