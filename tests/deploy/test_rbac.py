"""The worker's RBAC grants exactly the Kubernetes calls activities/*.py makes.

The calls are found by scanning the activities' source for kubernetes client methods;
each method's HTTP verb and path come from the client library itself, and are turned
into the (apiGroup, resource, verb) that RBAC checks.
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.deploy.conftest import ROOT
from tests.deploy.kustomize import find
from worker.config import load_settings

ACTIVITIES = ROOT / "activities"
CALL = re.compile(r"([A-Za-z_][\w.]*)\.((?:read|list|patch|create|delete|replace)_[a-z0-9_]+)\(")
SERIALIZED = re.compile(r"method='(\w+)',\s*resource_path='([^']+)'")
SERVICE_ACCOUNT = ("gpu-remediate", "gpu-remediate")
Permission = tuple[str, str, str]  # apiGroup, resource[/subresource], verb


@cache
def _api_classes() -> list[type]:
    return [
        getattr(client, n)
        for n in dir(client)
        if n.endswith("Api") and inspect.isclass(getattr(client, n))
    ]


def is_client_method(method: str) -> bool:
    return any(hasattr(cls, method) for cls in _api_classes())


@cache
def permission(method: str, api: str = "") -> Permission:
    """The RBAC permission a kubernetes client method needs, from its HTTP request.
    ``api`` names the Api class when several have the method (CoreV1Api, EventsV1Api)."""
    requests = set()
    for cls in _api_classes():
        serialize = getattr(cls, f"_{method}_serialize", None)
        if serialize is None or (api and cls.__name__ != api):
            continue
        match = SERIALIZED.search(inspect.getsource(serialize))
        assert match, f"{cls.__name__}.{method}: no request found in its source"
        requests.add((match.group(1), match.group(2)))
    assert len(requests) == 1, f"{api}.{method}: not exactly one client request: {requests}"
    http, path = requests.pop()
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {
        ("GET", True): "get",
        ("GET", False): "list",
        ("POST", False): "create",
        ("POST", True): "create",
        ("PATCH", True): "patch",
        ("PUT", True): "update",
        ("DELETE", True): "delete",
        ("DELETE", False): "deletecollection",
    }[(http, named)]
    return group, resource, verb


def receiver_api(source: str, receiver: str) -> str | None:
    """The kubernetes Api class a receiver (``self.core``, ``core``) holds in a module:
    from its assignment ``self.core = client.CoreV1Api(...)`` or annotation
    ``core: client.CoreV1Api``."""
    name = re.escape(receiver)
    match = re.search(rf"{name}\s*=\s*client\.(\w+Api)\(", source) or re.search(
        rf"\b{name}\s*:\s*client\.(\w+Api)\b", source
    )
    if match is None and receiver.startswith("self."):
        # A class-level annotation of the attribute (``core: client.CoreV1Api`` in a class
        # that the activities class composes).
        attr = re.escape(receiver.removeprefix("self."))
        match = re.search(rf"^\s+{attr}\s*:\s*client\.(\w+Api)\b", source, re.MULTILINE)
    return match.group(1) if match else None


def calls_in_activities() -> dict[tuple[str, str], set[str]]:
    """(Api class, client method) -> the activities files that call it."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in sorted(ACTIVITIES.glob("*.py")):
        source = path.read_text()
        for receiver, method in CALL.findall(source):
            api = receiver_api(source, receiver)
            if api is None:
                # Our own methods (self.read_node_health) are not API calls; a client
                # method on a receiver we cannot type would escape the check, so fail.
                assert not is_client_method(method) or receiver == "self", (
                    f"{path.name}: cannot tell which Api class {receiver}.{method} uses"
                )
                continue
            found.setdefault((api, method), set()).add(path.name)
    return found


def used_permissions() -> set[Permission]:
    out: set[Permission] = set()
    for (api, method), files in calls_in_activities().items():
        group, resource, verb = permission(method, api)
        if group == "{group}":
            # CustomObjectsApi: the path is generic, so the module says which resources
            # its calls of this verb touch (activities/gpu_isolation.py GENERIC_CALLS).
            for name in files:
                module = importlib.import_module(f"activities.{name.removesuffix('.py')}")
                declared = getattr(module, "GENERIC_CALLS", {})
                assert verb in declared, f"{name}: {method} is not in its GENERIC_CALLS"
                out |= declared[verb]
            continue
        out.add((group, resource, verb))
    return out


def _roles_of_worker(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in ("ClusterRole", "Role")
    }
    bound = []
    for b in objects:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        subjects = {
            (s.get("namespace", ""), s["name"])
            for s in b.get("subjects", [])
            if s["kind"] == "ServiceAccount"
        }
        if SERVICE_ACCOUNT not in subjects:
            continue
        ref = b["roleRef"]
        namespace = "" if ref["kind"] == "ClusterRole" else b["metadata"]["namespace"]
        bound.append(roles[(ref["kind"], namespace, ref["name"])])
    return bound


def granted(role: dict[str, Any]) -> set[Permission]:
    out = set()
    for rule in role.get("rules", []):
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    out.add((group, resource, verb))
    return out


def test_client_calls_are_found() -> None:
    calls = {method for _, method in calls_in_activities()}
    # The scan must see the calls the design names, or it silently proves nothing.
    for method in (
        "patch_node",
        "list_pod_for_all_namespaces",
        "create_namespaced_pod_eviction",
        "create_namespaced_job",
        "create_namespaced_event",
    ):
        assert method in calls


def test_permission_mapping() -> None:
    assert permission("read_node") == ("", "nodes", "get")
    assert permission("list_pod_for_all_namespaces") == ("", "pods", "list")
    assert permission("create_namespaced_pod_eviction") == ("", "pods/eviction", "create")
    assert permission("read_namespaced_job_status") == ("batch", "jobs/status", "get")
    assert permission("create_namespaced_event", "CoreV1Api") == ("", "events", "create")
    assert permission("create_namespaced_event", "EventsV1Api") == (
        "events.k8s.io",
        "events",
        "create",
    )
    assert permission("replace_namespaced_deployment") == ("apps", "deployments", "update")


OPT_IN: dict[Permission, str] = {("", "pods", "delete"): "force-drain"}
"""Calls made only under a setting that needs its own grant: deleting pods bypasses
PodDisruptionBudgets, so only deploy/components/force-drain grants it."""


def assert_grants_exactly_what_the_code_uses(objects: list[dict[str, Any]],
                                             components: tuple[str, ...] = ()) -> None:
    roles = _roles_of_worker(objects)
    have: set[Permission] = set().union(*(granted(r) for r in roles))
    need = {p for p in used_permissions() if OPT_IN.get(p, "") in ("", *components)}
    assert not need - have, f"missing permissions: {sorted(need - have)}"
    assert not have - need, f"permissions the code never uses: {sorted(have - need)}"


@pytest.mark.parametrize("name", ["base", "dry-run", "supervised", "autonomous"])
def test_rbac_grants_exactly_what_the_code_uses(
    name: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    assert_grants_exactly_what_the_code_uses(rendered[name])


def test_pods_delete_is_granted_only_by_the_force_drain_component(tmp_path: Path) -> None:
    from tests.deploy.conftest import DEPLOY
    from tests.deploy.kustomize import render

    assert ("", "pods", "delete") in used_permissions()
    site = tmp_path / "site"
    site.mkdir()
    (site / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{DEPLOY / 'overlays' / 'autonomous'}]\n"
        f"components: [{DEPLOY / 'components' / 'force-drain'}]\n")
    objects = render(site)
    assert_grants_exactly_what_the_code_uses(objects, components=("force-drain",))
    assert _namespace_of_grant(_roles_of_worker(objects), ("", "pods", "delete")) == {"*"}


def test_helm_grants_pods_delete_only_for_a_force_drain(helm: Path) -> None:
    from tests.deploy.test_helm import render as helm_render

    for values, granted_delete in (({}, False), ({"forceDrain": True}, True),
                                   ({"config": {"remediation": {"drain": {
                                       "deadline_policy": "force"}}}}, True)):
        objects = helm_render(helm, values)
        assert_grants_exactly_what_the_code_uses(
            objects, components=("force-drain",) if granted_delete else ())


def _namespace_of_grant(roles: list[dict[str, Any]], perm: Permission) -> set[str]:
    return {
        r["metadata"].get("namespace", "*") if r["kind"] == "Role" else "*"
        for r in roles
        if perm in granted(r)
    }


def test_namespaced_grants_are_where_the_code_calls(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    assert_grants_are_where_the_code_calls(rendered, tmp_path)


def assert_grants_are_where_the_code_calls(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    # Node Events go to the configured namespace (kubernetes.event_namespace), which the
    # worker hands to activities/events.py at start.
    events_source = (ACTIVITIES / "events.py").read_text()
    assert re.search(r"create_namespaced_event\(\s*_namespace\b", events_source)
    service_source = (ROOT / "worker" / "service" / "wiring.py").read_text()
    assert "set_event_namespace(settings.kubernetes.event_namespace)" in service_source
    assert "set_record_namespace(settings.record_namespace())" in service_source
    for name, objects in rendered.items():
        roles = _roles_of_worker(objects)
        config = find(objects, "ConfigMap", "gpu-remediate-config")["data"]["config.yaml"]
        path = tmp_path / f"{name}.yaml"
        path.write_text(config)
        settings = load_settings(path)
        job_ns = settings.jobs.namespace
        assert _namespace_of_grant(roles, ("batch", "jobs", "create")) == {job_ns}, name
        assert _namespace_of_grant(roles, ("batch", "jobs/status", "get")) == {job_ns}, name
        assert _namespace_of_grant(roles, ("", "events", "create")) == {
            settings.kubernetes.event_namespace
        }, name
        # The node records and the repair ledger: only where the worker keeps them (a
        # kubelet cannot write there); delete for the ledger's expired shards.
        for verb in ("get", "list", "create", "update", "delete"):
            assert _namespace_of_grant(roles, ("", "configmaps", verb)) == {
                settings.record_namespace()}, (name, verb)
        # Node, pod and eviction calls span namespaces (drain, exporter discovery).
        for perm in (("", "nodes", "patch"), ("", "pods", "list"), ("", "pods/eviction", "create")):
            assert _namespace_of_grant(roles, perm) == {"*"}, perm
