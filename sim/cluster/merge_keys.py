"""Strategic-merge-patch metadata for the fields of the served kinds.

Taken from the `patchStrategy`/`patchMergeKey` struct tags of k8s.io/api. A
list that is not named here has no patch strategy and is replaced whole: that
includes node `spec.taints` and pod `spec.tolerations` (Taint.Key carries a
merge tag, but the NodeSpec.Taints list itself does not, so the real server
replaces the list too).
"""

from __future__ import annotations

# Paths are field names from the object root; list items do not add a segment.
Path = tuple[str, ...]

_POD_SPEC: dict[Path, str] = {
    ("containers",): "name",
    ("initContainers",): "name",
    ("ephemeralContainers",): "name",
    ("volumes",): "name",
    ("imagePullSecrets",): "name",
    ("hostAliases",): "ip",
    ("containers", "env"): "name",
    ("containers", "ports"): "containerPort",
    ("containers", "volumeMounts"): "mountPath",
    ("containers", "volumeDevices"): "devicePath",
    ("initContainers", "env"): "name",
    ("initContainers", "ports"): "containerPort",
    ("initContainers", "volumeMounts"): "mountPath",
}


def _under(prefix: Path, table: dict[Path, str]) -> dict[Path, str]:
    return {prefix + k: v for k, v in table.items()}


_META: dict[Path, str] = {("metadata", "ownerReferences"): "uid"}

MERGE_KEYS: dict[str, dict[Path, str]] = {
    "Node": {
        **_META,
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
    },
    "Pod": {
        **_META,
        **_under(("spec",), _POD_SPEC),
        ("status", "conditions"): "type",
        ("status", "podIPs"): "ip",
        ("status", "hostIPs"): "ip",
    },
    "Job": {**_META, **_under(("spec", "template", "spec"), _POD_SPEC)},
    "ReplicaSet": {
        **_META,
        **_under(("spec", "template", "spec"), _POD_SPEC),
        ("status", "conditions"): "type",
    },
    "StatefulSet": {**_META, **_under(("spec", "template", "spec"), _POD_SPEC)},
    "DaemonSet": {
        **_META,
        **_under(("spec", "template", "spec"), _POD_SPEC),
        ("status", "conditions"): "type",
    },
    "Namespace": {**_META, ("status", "conditions"): "type"},
}

# Lists of scalars with patchStrategy=merge: a patch adds to them (set union).
PRIMITIVE_MERGE: set[Path] = {("metadata", "finalizers")}


def merge_key(kind: str, path: Path) -> str | None:
    return MERGE_KEYS.get(kind, _META).get(path)


def is_primitive_merge(path: Path) -> bool:
    return path in PRIMITIVE_MERGE
