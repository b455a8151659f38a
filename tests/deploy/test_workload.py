"""The worker Deployment, its Jobs and configs: security, health, availability, modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import DEPLOY, OVERLAYS
from tests.deploy.kustomize import find
from worker.config import Settings, load_settings

IMAGE_USER = 10001  # the Dockerfile's USER


def config_of(objects: list[dict[str, Any]], tmp_path: Path) -> Settings:
    text = find(objects, "ConfigMap", "gpu-remediate-config")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_settings(path)


def pod_spec(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = find(objects, kind, name)["spec"]["template"]["spec"]
    return spec


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.fixture(scope="module", params=["kustomize", "helm"])
def base(
    request: pytest.FixtureRequest, rendered: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The first-install objects: the kustomize base, and the Helm chart with its default
    values, which must pass every check here too."""
    if request.param == "helm":
        objects: list[dict[str, Any]] = request.getfixturevalue("helm_rendered")["dry-run"]
        return objects
    return rendered["base"]


def test_every_config_loads(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    for objects in rendered.values():
        config_of(objects, tmp_path)
    load_settings(DEPLOY / "compose" / "config.yaml")


def test_worker_deployment_shape(base: list[dict[str, Any]], tmp_path: Path) -> None:
    deploy = find(base, "Deployment", "gpu-remediate")
    spec = deploy["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["serviceAccountName"] == "gpu-remediate"
    settings = config_of(base, tmp_path)
    assert pod["terminationGracePeriodSeconds"] > settings.worker.graceful_shutdown_seconds
    keys = {c["topologyKey"] for c in pod["topologySpreadConstraints"]}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for c in pod["topologySpreadConstraints"]:
        assert c["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (worker,) = pod["containers"]
    assert worker["args"] == ["worker", "--config", "/etc/gpu-remediate/config.yaml"]
    assert set(worker["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in worker["resources"]["limits"]


def test_worker_probes_and_ports_match_config(base: list[dict[str, Any]], tmp_path: Path) -> None:
    settings = config_of(base, tmp_path)
    (worker,) = pod_spec(base, "Deployment", "gpu-remediate")["containers"]
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports == {
        "health": settings.worker.health_port,
        "metrics": settings.worker.metrics_port,
        "sdk-metrics": settings.worker.sdk_metrics_port,
    }
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert worker["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert settings.worker.bind == "0.0.0.0"  # probes and scrapes come from outside the pod


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("Deployment", "gpu-remediate"),
        ("Job", "gpu-remediate-search-attributes"),
        ("Job", "gpu-remediate-detector-start"),
    ],
)
def test_pods_are_locked_down(base: list[dict[str, Any]], kind: str, name: str) -> None:
    spec = pod_spec(base, kind, name)
    pod_ctx = spec["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True
    assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert all("hostPath" not in v for v in volumes.values())
    for c in containers(spec):
        ctx = c["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, c["name"]
        assert ctx["readOnlyRootFilesystem"] is True, c["name"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}, c["name"]
        assert not ctx.get("privileged"), c["name"]
        user = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
        assert isinstance(user, int) and user > 0, c["name"]
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert "emptyDir" in volumes[mounts["/tmp"]], f"{c['name']}: /tmp must be writable"
        assert c["image"].rsplit(":", 1)[-1] not in ("", "latest") and ":" in c["image"]


def test_worker_runs_as_the_image_user(base: list[dict[str, Any]]) -> None:
    spec = pod_spec(base, "Deployment", "gpu-remediate")
    assert spec["securityContext"]["runAsUser"] == IMAGE_USER
    (worker,) = spec["containers"]
    start = pod_spec(base, "Job", "gpu-remediate-detector-start")
    (starter,) = start["containers"]
    assert starter["image"] == worker["image"]
    assert starter["securityContext"]["runAsUser"] == IMAGE_USER


def test_temporal_credentials_are_referenced_not_shipped(
        base: list[dict[str, Any]], tmp_path: Path) -> None:
    """The key is never in the objects: the temporal CLI of the setup Jobs reads it from
    the Secret's env, gpu-remediate from the mounted Secret (temporal.api_key_file), so a
    rotation reaches a running worker."""
    assert not [o for o in base if o["kind"] == "Secret"]
    key_file = config_of(base, tmp_path).temporal.api_key_file
    assert key_file is not None
    for kind, name in (
        ("Deployment", "gpu-remediate"),
        ("Job", "gpu-remediate-detector-start"),
        ("Job", "gpu-remediate-search-attributes"),
    ):
        spec = pod_spec(base, kind, name)
        secret_volumes = [v["secret"] for v in spec["volumes"] if "secret" in v]
        assert secret_volumes == [
            {"secretName": "gpu-remediate-temporal", "optional": True, "defaultMode": 0o440}
        ]
        for c in containers(spec):
            refs = [
                e["valueFrom"]["secretKeyRef"]
                for e in c.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            ]
            if "gpu-remediate" in c["image"]:
                assert refs == [], f"{name}/{c['name']}: the key comes from the file"
                mounts = {m["mountPath"] for m in c.get("volumeMounts", [])
                          if m["name"] == "temporal"}
                assert str(key_file.parent) in mounts, f"{name}/{c['name']}"
            else:
                assert refs == [{"name": "gpu-remediate-temporal", "key": "api-key",
                                 "optional": True}]


def test_temporal_address_comes_from_one_place(base: list[dict[str, Any]], tmp_path: Path) -> None:
    settings_text = find(base, "ConfigMap", "gpu-remediate-config")["data"]["config.yaml"]
    import yaml

    # A value in the file would win over the environment (worker/config.py).
    temporal = (yaml.safe_load(settings_text) or {}).get("temporal", {})
    assert "address" not in temporal and "namespace" not in temporal
    cm = find(base, "ConfigMap", "gpu-remediate-temporal")
    assert set(cm["data"]) == {"address", "namespace"}
    for kind, name in (
        ("Deployment", "gpu-remediate"),
        ("Job", "gpu-remediate-detector-start"),
        ("Job", "gpu-remediate-search-attributes"),
    ):
        for c in containers(pod_spec(base, kind, name)):
            refs = {
                e["name"]: e["valueFrom"]["configMapKeyRef"]
                for e in c.get("env", [])
                if "configMapKeyRef" in e.get("valueFrom", {})
            }
            assert {r["name"] for r in refs.values()} == {cm["metadata"]["name"]}
            assert sorted(r["key"] for r in refs.values()) == ["address", "namespace"]


def test_pdb_keeps_one_worker(base: list[dict[str, Any]]) -> None:
    pdb = find(base, "PodDisruptionBudget", "gpu-remediate")
    deploy = find(base, "Deployment", "gpu-remediate")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]


def test_job_namespace_allows_privileged_only_there(
    base: list[dict[str, Any]], tmp_path: Path
) -> None:
    settings = config_of(base, tmp_path)
    namespaces = {
        o["metadata"]["name"]: o["metadata"]["labels"] for o in base if o["kind"] == "Namespace"
    }
    assert set(namespaces) == {"gpu-remediate", settings.jobs.namespace}
    enforce = "pod-security.kubernetes.io/enforce"
    assert namespaces[settings.jobs.namespace][enforce] == "privileged"
    assert namespaces["gpu-remediate"][enforce] == "restricted"
    sa = find(base, "ServiceAccount", "default")
    assert sa["metadata"]["namespace"] == settings.jobs.namespace
    assert sa["automountServiceAccountToken"] is False


def test_search_attributes_gate_the_detector(base: list[dict[str, Any]]) -> None:
    register = pod_spec(base, "Job", "gpu-remediate-search-attributes")
    (c,) = register["containers"]
    assert c["command"][-2:] == ["/scripts/search-attributes.sh", "register"]
    assert c["image"].startswith("temporalio/admin-tools:")
    start = pod_spec(base, "Job", "gpu-remediate-detector-start")
    (wait,) = start["initContainers"]
    assert wait["command"][-2:] == ["/scripts/search-attributes.sh", "check"]
    (starter,) = start["containers"]
    assert starter["args"] == ["detector", "start", "--config", "/etc/gpu-remediate/config.yaml"]
    script = find(base, "ConfigMap", "gpu-remediate-scripts")["data"]["search-attributes.sh"]
    for name in ("GpuNode", "RemediationState", "RemediationAction"):
        assert name in script
    for o in base:
        if o["kind"] == "Job":
            assert o["spec"]["ttlSecondsAfterFinished"] > 0  # Jobs are immutable: upgrades


def test_overlays_differ_only_in_mode(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    modes = {name: config_of(rendered[name], tmp_path) for name in ("base", *OVERLAYS)}
    assert modes["base"] == modes["dry-run"]
    assert modes["dry-run"].detector.dry_run is True
    assert modes["dry-run"].remediation.approval.required_for == []
    assert modes["supervised"].detector.dry_run is False
    assert [a.value for a in modes["supervised"].remediation.approval.required_for] == [
        "reset",
        "reboot",
        "quarantine",
    ]
    assert modes["autonomous"].detector.dry_run is False
    assert modes["autonomous"].remediation.approval.required_for == []

    def without_mode(s: Settings) -> dict[str, Any]:
        data = s.model_dump()
        data["detector"].pop("dry_run")
        data["remediation"].pop("approval")
        return data

    for name in OVERLAYS:
        assert without_mode(modes[name]) == without_mode(modes["base"]), name
        label = find(rendered[name], "Deployment", "gpu-remediate")["metadata"]["labels"]
        assert label["gpu-remediate.io/mode"] == name


def test_overlays_change_nothing_but_config_and_labels(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    def strip(objects: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
        out = {}
        for o in objects:
            o = {**o, "metadata": {k: v for k, v in o["metadata"].items() if k != "labels"}}
            name = o["metadata"]["name"]
            if o["kind"] == "ConfigMap":
                name = name.rsplit("-", 1)[0]
                if name == "gpu-remediate-config":
                    continue
            out[(o["kind"], name)] = _unhash(o)
        return out

    base = strip(rendered["base"])
    for name in OVERLAYS:
        assert strip(rendered[name]) == base, name


def _unhash(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (
                v.rsplit("-", 1)[0]
                if k == "name" and isinstance(v, str) and v.startswith("gpu-remediate-config-")
                else _unhash(v)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_unhash(v) for v in node]
    return node


def test_worker_network_is_fenced_to_what_it_talks_to(
        base: list[dict[str, Any]], tmp_path: Path) -> None:
    """Only Prometheus's namespace reaches the metrics ports (the kubelet's probes come from
    the node, always allowed); the worker reaches DNS, the API server, Temporal and the
    exporter pods of the configured namespace and port, each rule naming its peers."""
    policy = find(base, "NetworkPolicy", "gpu-remediate")["spec"]
    worker = find(base, "Deployment", "gpu-remediate")["spec"]["template"]["metadata"]
    assert policy["podSelector"]["matchLabels"].items() <= worker["labels"].items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    (ingress,) = policy["ingress"]
    settings = config_of(base, tmp_path)
    w = settings.worker
    assert {p["port"] for p in ingress["ports"]} == {w.metrics_port, w.sdk_metrics_port}
    assert ingress["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]
    by_port = {tuple(sorted(p["port"] for p in rule["ports"])): rule["to"]
               for rule in policy["egress"]}
    assert set(by_port) == {(53, 53), (443, 6443), (7233,), (settings.exporter.port,)}
    assert by_port[(53, 53)] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert {peer["ipBlock"]["cidr"] for peer in by_port[(443, 6443)]} == {
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
    assert by_port[(7233,)] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "temporal"}}}]
    assert by_port[(settings.exporter.port,)] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": settings.exporter.namespace}}}]


def test_shipped_configs_refuse_an_unauthenticated_temporal(
        rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """Whoever reaches the Temporal namespace can start, approve and abort remediations:
    every shipped configuration makes the worker refuse to connect without mTLS or a key."""
    for name, objects in rendered.items():
        t = config_of(objects, tmp_path).temporal
        assert t.require_auth, name
        assert "require_auth is set" in t.auth_problem()
        # The key arrives as the mounted Secret's file.
        key = tmp_path / "api-key"
        key.write_text("k\n")
        with_key = t.model_copy(update={"api_key_file": key})
        assert with_key.auth_problem() == "" and with_key.current_api_key() == "k"
