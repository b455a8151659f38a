"""The API resources the simulator serves, described once.

Everything that differs between resources (group, scope, whether a status
subresource exists) lives here, so the store, the HTTP layer and the error
messages all derive the same names the real API server would print.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False
    # Only resources whose controllers report observedGeneration bump generation.
    tracks_generation: bool = False
    # Pods and namespaces come back from DELETE as objects; most others as a Status.
    returns_deleted_object: bool = False
    read_only: bool = False
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}"

    @property
    def qualified(self) -> str:
        """`jobs.batch`, or `nodes` for the core group: the wording of NotFound etc."""
        return self.plural if not self.group else f"{self.plural}.{self.group}"

    @property
    def group_kind(self) -> str:
        """`Job.batch`, or `Node`: the wording of Invalid errors."""
        return self.kind if not self.group else f"{self.kind}.{self.group}"

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def base_path(self) -> str:
        prefix = "/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"
        return prefix


NODES = ResourceType("", "v1", "nodes", "Node", False, has_status=True, short_names=("no",))
PODS = ResourceType(
    "",
    "v1",
    "pods",
    "Pod",
    True,
    has_status=True,
    returns_deleted_object=True,
    short_names=("po",),
)
NAMESPACES = ResourceType(
    "",
    "v1",
    "namespaces",
    "Namespace",
    False,
    has_status=True,
    returns_deleted_object=True,
    short_names=("ns",),
)
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True, short_names=("cm",))
CORE_EVENTS = ResourceType("", "v1", "events", "Event", True, short_names=("ev",))
EVENTS = ResourceType("events.k8s.io", "v1", "events", "Event", True, short_names=("ev",))
PDBS = ResourceType(
    "policy",
    "v1",
    "poddisruptionbudgets",
    "PodDisruptionBudget",
    True,
    has_status=True,
    tracks_generation=True,
    short_names=("pdb",),
)
JOBS = ResourceType("batch", "v1", "jobs", "Job", True, has_status=True, tracks_generation=True)
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True)
REPLICASETS = ResourceType(
    "apps",
    "v1",
    "replicasets",
    "ReplicaSet",
    True,
    has_status=True,
    tracks_generation=True,
    short_names=("rs",),
)
STATEFULSETS = ResourceType(
    "apps",
    "v1",
    "statefulsets",
    "StatefulSet",
    True,
    has_status=True,
    tracks_generation=True,
    short_names=("sts",),
)
DAEMONSETS = ResourceType(
    "apps",
    "v1",
    "daemonsets",
    "DaemonSet",
    True,
    has_status=True,
    tracks_generation=True,
    short_names=("ds",),
)

ALL: tuple[ResourceType, ...] = (
    NODES,
    PODS,
    NAMESPACES,
    CONFIGMAPS,
    CORE_EVENTS,
    EVENTS,
    PDBS,
    JOBS,
    LEASES,
    REPLICASETS,
    STATEFULSETS,
    DAEMONSETS,
)

# Subresources served besides `status` (which every has_status resource gets).
EXTRA_SUBRESOURCES: dict[str, tuple[str, ...]] = {PODS.key: ("eviction", "log")}


def find(group: str, version: str, plural: str) -> ResourceType | None:
    for rt in ALL:
        if (rt.group, rt.version, rt.plural) == (group, version, plural):
            return rt
    return None


def group_versions() -> dict[str, list[ResourceType]]:
    """Resources by `group/version` (core is `v1`), for discovery documents."""
    out: dict[str, list[ResourceType]] = {}
    for rt in ALL:
        out.setdefault(rt.api_version, []).append(rt)
    return out
