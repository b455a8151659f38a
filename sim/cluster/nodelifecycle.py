"""The node lifecycle controller's taints.

Real clusters add `node.kubernetes.io/unschedulable:NoSchedule` to cordoned
nodes and `not-ready`/`unreachable` NoSchedule+NoExecute taints to nodes
whose Ready condition is False/Unknown. A client that rewrites
`spec.taints` wholesale has to cope with these, so the simulator adds them too.
"""

from __future__ import annotations

from typing import Any

from sim.cluster import clock
from sim.cluster import resources as r
from sim.cluster.podutil import condition
from sim.cluster.store import Obj, Store

UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
MANAGED = (UNSCHEDULABLE, NOT_READY, UNREACHABLE)


def wanted_taints(node: Obj, now: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if (node.get("spec") or {}).get("unschedulable"):
        out.append({"key": UNSCHEDULABLE, "effect": "NoSchedule"})
    ready = condition(node, "Ready")
    status = (ready or {}).get("status")
    if status == "False":
        out += [
            {"key": NOT_READY, "effect": "NoSchedule"},
            {"key": NOT_READY, "effect": "NoExecute"},
        ]
    elif status == "Unknown":
        out += [
            {"key": UNREACHABLE, "effect": "NoSchedule"},
            {"key": UNREACHABLE, "effect": "NoExecute"},
        ]
    return out


class NodeLifecycle:
    def __init__(self, store: Store) -> None:
        self.store = store

    def reconcile(self, now: float) -> None:
        for node in self.store.list(r.NODES):
            spec = node.setdefault("spec", {})
            current = spec.get("taints") or []
            others = [t for t in current if t.get("key") not in MANAGED]
            want = wanted_taints(node, now)
            kept: list[dict[str, Any]] = []
            for w in want:
                existing = next(
                    (
                        t
                        for t in current
                        if t.get("key") == w["key"] and t.get("effect") == w["effect"]
                    ),
                    None,
                )
                # Only NoExecute taints carry timeAdded (it starts tolerationSeconds).
                stamp = {"timeAdded": clock.rfc3339(now)} if w["effect"] == "NoExecute" else {}
                kept.append(existing or {**w, **stamp})
            new = others + kept
            if new != current:
                if new:
                    spec["taints"] = new
                else:
                    spec.pop("taints", None)
                self.store.put_internal(r.NODES, node)
