"""Discovery documents (/api, /apis, /api/v1, /apis/<g>/<v>, /version).

Clients such as kubectl and dynamic clients read these before anything else;
the official Python client's typed APIs do not, but serving them keeps
generic tooling working against the simulator.
"""

from __future__ import annotations

from typing import Any

from sim.cluster import resources as r

GIT_VERSION = "v1.33.1"
# The patch release the simulator names for each minor it can pose as.
_GIT_VERSIONS = {33: GIT_VERSION, 36: "v1.36.0", 37: "v1.37.0"}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def version(minor: int = r.DEFAULT_MINOR) -> dict[str, Any]:
    return {
        "major": "1",
        "minor": str(minor),
        "gitVersion": _GIT_VERSIONS.get(minor, f"v1.{minor}.0"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-05-15T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def api_groups(minor: int = r.DEFAULT_MINOR) -> dict[str, Any]:
    by_group: dict[str, list[dict[str, str]]] = {}
    for gv in r.group_versions(minor):
        if "/" not in gv:
            continue
        group, version_ = gv.split("/")
        by_group.setdefault(group, []).append({"groupVersion": gv, "version": version_})
    groups = []
    for group, entries in by_group.items():
        # A GA version is preferred over a beta one, as the real server orders them.
        entries.sort(key=lambda e: (not e["version"].startswith("v1") or "beta" in e["version"]
                                    or "alpha" in e["version"], e["version"]))
        groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(group_version: str, minor: int = r.DEFAULT_MINOR) -> dict[str, Any] | None:
    rts = r.group_versions(minor).get(group_version)
    if rts is None:
        return None
    out: list[dict[str, Any]] = []
    for rt in rts:
        verbs = ["get", "list", "watch"] if rt.read_only else list(_VERBS)
        out.append(
            {
                "name": rt.plural,
                "singularName": rt.kind.lower(),
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": verbs,
                **({"shortNames": list(rt.short_names)} if rt.short_names else {}),
            }
        )
        if rt.has_status:
            out.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        for sub in r.EXTRA_SUBRESOURCES.get(rt.key, ()):
            entry: dict[str, Any] = {"name": f"{rt.plural}/{sub}", "singularName": "",
                                     "namespaced": rt.namespaced}
            if sub == "eviction":
                entry.update({"group": "policy", "version": "v1", "kind": "Eviction",
                              "verbs": ["create"]})
            else:  # pods/log: plain text, read only
                entry.update({"kind": rt.kind, "verbs": ["get"]})
            out.append(entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": out,
    }
