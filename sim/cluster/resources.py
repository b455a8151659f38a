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
    # Another version of the same resource that holds the objects (the API server keeps one
    # storage version and converts); "" means this version stores them itself.
    storage_version: str = ""
    # The first Kubernetes minor release that serves this version by default (DRA's versions
    # arrived late); 0: every release the simulator can pose as.
    since_minor: int = 0

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def stored_api_version(self) -> str:
        """The apiVersion stored objects carry (the storage version's)."""
        return f"{self.group}/{self.storage_version}" if self.storage_version else self.api_version

    @property
    def key(self) -> str:
        """Where the objects live: one bucket for every served version of a resource."""
        return f"{self.group}/{self.storage_version or self.version}/{self.plural}"

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

# Dynamic Resource Allocation (resource.k8s.io). A real 1.33 API server serves none of it by
# default; 1.34 made ResourceSlice and ResourceClaim GA (v1); DeviceTaintRule (KEP-5055) was
# v1alpha3 behind feature gates in 1.33-1.35, is v1beta2 in 1.36 and v1 from 1.37, where
# v1beta2 is still served. Both DeviceTaintRule versions have the same schema, so the
# simulator stores one object and serves it under either apiVersion.
RESOURCESLICES = ResourceType(
    "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False, since_minor=34
)
RESOURCECLAIMS = ResourceType(
    "resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, has_status=True,
    since_minor=34,
)
DEVICETAINTRULES = ResourceType(
    "resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", False, has_status=True,
    tracks_generation=True, since_minor=37,
)
DEVICETAINTRULES_BETA = ResourceType(
    "resource.k8s.io", "v1beta2", "devicetaintrules", "DeviceTaintRule", False,
    has_status=True, tracks_generation=True, storage_version="v1", since_minor=36,
)
# RuntimeClass (node.k8s.io/v1, GA since 1.20): which container runtime handler a pod runs
# under. The GPU Operator installs `nvidia`; a pod naming a RuntimeClass the cluster does
# not have is refused by the API server's RuntimeClass admission.
RUNTIMECLASSES = ResourceType("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False)

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
    RESOURCESLICES,
    RESOURCECLAIMS,
    DEVICETAINTRULES,
    DEVICETAINTRULES_BETA,
    RUNTIMECLASSES,
)

# Kubernetes minor releases the simulator can pose as (`--kubernetes-version`).
MINORS = (33, 36, 37)
DEFAULT_MINOR = 33

# Subresources served besides `status` (which every has_status resource gets).
EXTRA_SUBRESOURCES: dict[str, tuple[str, ...]] = {PODS.key: ("eviction", "log")}


def served(minor: int = DEFAULT_MINOR) -> tuple[ResourceType, ...]:
    """What an API server of Kubernetes 1.<minor> serves of ALL."""
    return tuple(rt for rt in ALL if rt.since_minor <= minor)


def find(
    group: str, version: str, plural: str, minor: int = DEFAULT_MINOR
) -> ResourceType | None:
    for rt in served(minor):
        if (rt.group, rt.version, rt.plural) == (group, version, plural):
            return rt
    return None


def group_versions(minor: int = DEFAULT_MINOR) -> dict[str, list[ResourceType]]:
    """Resources by `group/version` (core is `v1`), for discovery documents."""
    out: dict[str, list[ResourceType]] = {}
    for rt in served(minor):
        out.setdefault(rt.api_version, []).append(rt)
    return out
