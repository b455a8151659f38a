"""Admission the API server applies to pods before it stores them, beyond validation.

RuntimeClass admission: a pod whose ``spec.runtimeClassName`` names a RuntimeClass the
cluster does not have is refused (403 Forbidden), whoever creates it: a client, or a
controller such as the Job controller, whose Job then never gets its pod.
"""

from __future__ import annotations

from sim.cluster import errors
from sim.cluster import resources as r
from sim.cluster.store import Obj, Store


def pod_refusal(store: Store, pod: Obj) -> errors.ApiError | None:
    """Why the API server would refuse to create this pod, or None."""
    name = (pod.get("spec") or {}).get("runtimeClassName")
    if name and store.find(r.RUNTIMECLASSES, "", name) is None:
        return errors.forbidden(r.PODS, (pod.get("metadata") or {}).get("name", ""),
                                f'pod rejected: RuntimeClass "{name}" not found')
    return None
