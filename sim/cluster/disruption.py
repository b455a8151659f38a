"""The disruption controller's arithmetic for PodDisruptionBudget status.

Mirrors pkg/controller/disruption: expected pods come from the pods' controller
scale when maxUnavailable or a percentage is used, percentages round up, pods
being deleted or recently evicted (status.disruptedPods) are not healthy, and
disruptionsAllowed is 0 whenever nothing is expected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sim.cluster import clock, selectors
from sim.cluster.podutil import controller_ref, is_ready, is_terminating
from sim.cluster.store import Obj

# How long an eviction keeps a pod out of currentHealthy before the controller gives up.
DELETION_TIMEOUT = 120.0

ScaleOf = Callable[[str, dict[str, Any]], int | None]


def matching_pods(pdb: Obj, pods: list[Obj]) -> list[Obj]:
    reqs = selectors.from_label_selector((pdb.get("spec") or {}).get("selector"))
    if reqs is None:
        return []
    ns = pdb["metadata"].get("namespace")
    return [
        p
        for p in pods
        if p["metadata"].get("namespace") == ns
        and selectors.matches_all(reqs, p["metadata"].get("labels"))
    ]


def _scaled(value: int | str, total: int) -> int:
    if isinstance(value, int):
        return value
    return math.ceil(int(value.rstrip("%")) * total / 100)


def _expected_scale(pods: list[Obj], scale_of: ScaleOf) -> int | None:
    """Sum of the scales of the pods' distinct controllers; None if one has none."""
    seen: dict[str, int] = {}
    for p in pods:
        ref = controller_ref(p)
        if ref is None:
            # Pods without a controller are ignored for the scale, as the real controller does.
            continue
        if ref["uid"] in seen:
            continue
        scale = scale_of(p["metadata"].get("namespace", ""), ref)
        if scale is None:
            return None
        seen[ref["uid"]] = scale
    return sum(seen.values())


def compute_status(pdb: Obj, pods: list[Obj], scale_of: ScaleOf, now: float) -> dict[str, Any]:
    spec = pdb.get("spec") or {}
    status = dict(pdb.get("status") or {})
    matched = matching_pods(pdb, pods)
    names = {p["metadata"]["name"] for p in matched if not is_terminating(p)}
    disrupted = {
        name: ts
        for name, ts in (status.get("disruptedPods") or {}).items()
        if name in names and clock.parse(ts) + DELETION_TIMEOUT > now
    }
    healthy = sum(
        1
        for p in matched
        if not is_terminating(p) and p["metadata"]["name"] not in disrupted and is_ready(p)
    )
    min_a, max_u = spec.get("minAvailable"), spec.get("maxUnavailable")
    sync_error = None
    if max_u is not None:
        expected = _expected_scale(matched, scale_of)
        if expected is None:
            sync_error = "found no controllers for pods"
            expected, desired = 0, 0
        else:
            desired = max(0, expected - _scaled(max_u, expected))
    elif isinstance(min_a, int):
        expected, desired = len(matched), min_a
    elif min_a is not None:
        expected_or_none = _expected_scale(matched, scale_of)
        if expected_or_none is None:
            sync_error = "found no controllers for pods"
            expected, desired = 0, 0
        else:
            expected = expected_or_none
            desired = _scaled(min_a, expected)
    else:
        expected, desired = len(matched), 0
    allowed = healthy - desired
    if expected <= 0 or allowed <= 0 or sync_error:
        allowed = 0
    cond = {
        "type": "DisruptionAllowed",
        "status": "True" if allowed > 0 else "False",
        "reason": "SyncFailed"
        if sync_error
        else ("SufficientPods" if allowed > 0 else "InsufficientPods"),
        "message": sync_error or "",
        "observedGeneration": pdb["metadata"].get("generation", 1),
    }
    old_cond = next(
        (c for c in status.get("conditions") or [] if c.get("type") == cond["type"]), None
    )
    same = old_cond is not None and old_cond.get("status") == cond["status"]
    cond["lastTransitionTime"] = (
        old_cond["lastTransitionTime"] if same and old_cond else (clock.rfc3339(now))
    )
    out: dict[str, Any] = {
        "observedGeneration": pdb["metadata"].get("generation", 1),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": allowed,
        "expectedPods": expected,
        "conditions": [cond],
    }
    if disrupted:
        out["disruptedPods"] = disrupted
    return out
