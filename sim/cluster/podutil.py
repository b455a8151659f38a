"""Small facts about pods and nodes that several controllers need."""

from __future__ import annotations

from typing import Any

from sim.cluster.defaults import GPU
from sim.cluster.store import Obj


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def is_terminal(pod: Obj) -> bool:
    return phase(pod) in ("Succeeded", "Failed")


def is_terminating(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def condition(obj: Obj, kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def is_ready(pod: Obj) -> bool:
    c = condition(pod, "Ready")
    return c is not None and c.get("status") == "True"


def node_ready(node: Obj) -> bool:
    c = condition(node, "Ready")
    return c is not None and c.get("status") == "True"


def controller_ref(obj: Obj) -> dict[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def owned_by(obj: Obj, owner: Obj) -> bool:
    ref = controller_ref(obj)
    return ref is not None and ref.get("uid") == owner["metadata"]["uid"]


def _container_gpus(c: dict[str, Any]) -> int:
    res = c.get("resources") or {}
    return int((res.get("requests") or {}).get(GPU) or (res.get("limits") or {}).get(GPU) or 0)


def gpu_request(pod: Obj) -> int:
    """The pod's effective request, as the scheduler and the kubelet count it: the larger
    of each init container's and the app containers' sum (sidecars, restartable init
    containers, add to both)."""
    spec = pod.get("spec") or {}
    apps = sum(_container_gpus(c) for c in spec.get("containers") or [])
    sidecars = peak = 0
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            sidecars += _container_gpus(c)
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + _container_gpus(c))
    return max(apps + sidecars, peak)


def allocatable_gpus(node: Obj) -> int:
    return int(((node.get("status") or {}).get("allocatable") or {}).get(GPU) or 0)


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if (
            op == "Equal"
            and t.get("key") == taint.get("key")
            and ((t.get("value") or "") == (taint.get("value") or ""))
        ):
            return True
    return False


def set_condition(obj: Obj, cond: dict[str, Any], now_str: str) -> None:
    """Replace a condition by type; keep lastTransitionTime when status is unchanged."""
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    for i, c in enumerate(conds):
        if c.get("type") == cond["type"]:
            if c.get("status") == cond.get("status") and c.get("lastTransitionTime"):
                cond = {**cond, "lastTransitionTime": c["lastTransitionTime"]}
            elif c.get("status") != cond.get("status"):
                # A change of status is a transition, whoever reports it.
                cond = {"lastTransitionTime": now_str, **cond}
            conds[i] = {**c, **cond}
            return
    conds.append({"lastTransitionTime": now_str, **cond})
