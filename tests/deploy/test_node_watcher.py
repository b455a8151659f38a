"""The node watcher's deployment (deploy/components/node-watcher): off by default; added to
an overlay, it runs a watcher on every GPU node with a token for the worker's audience, and
gives the worker exactly what it needs to take the reports (TLS, a port, TokenReview)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY
from tests.deploy.kustomize import find, key, render
from tests.deploy.test_kustomize import K8S_VERSIONS, schema_errors
from worker.config import NodeReportSettings, load_settings

COMPONENT = DEPLOY / "components" / "node-watcher"
DEFAULTS = NodeReportSettings()


def with_watcher(tmp_path: Path, overlay: str = "autonomous") -> Path:
    here = tmp_path / "with-watcher"
    here.mkdir(exist_ok=True)
    (here / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "overlays" / overlay, here)],
        "components": [os.path.relpath(COMPONENT, here)]}))
    return here


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(with_watcher(tmp_path_factory.mktemp("kz")))


def container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def test_off_by_default(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, objs in rendered.items():
        assert not [o for o in objs if o["kind"] == "DaemonSet"], name
        worker = container(find(objs, "Deployment", "gpu-remediate"))
        assert "GPU_REMEDIATE_REPORTS__ENABLED" not in env(worker), name


def test_the_watcher_runs_on_every_gpu_node_with_a_token_for_the_worker(
        objects: list[dict[str, Any]]) -> None:
    ds = find(objects, "DaemonSet", "gpu-remediate-watch")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert spec["automountServiceAccountToken"] is False
    namespace = ds["metadata"]["namespace"]
    # The worker accepts reports from this ServiceAccount only, by default.
    assert DEFAULTS.service_accounts == [
        f"system:serviceaccount:{namespace}:{spec['serviceAccountName']}"]
    [projected] = [v["projected"] for v in spec["volumes"] if "projected" in v]
    [source] = projected["sources"]
    assert source["serviceAccountToken"]["audience"] == DEFAULTS.audience
    c = container(ds)
    assert c["args"] == ["watch"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    e = env(c)
    assert e["GPU_REMEDIATE_WATCH_TOKEN_FILE"] == (
        f"{mounts['token']}/{source['serviceAccountToken']['path']}")
    assert e["GPU_REMEDIATE_WATCH_CA_FILE"].startswith(mounts["reports-ca"] + "/")
    assert e["GPU_REMEDIATE_WATCH_KERNEL_LOG"] == mounts["kmsg"] == "/dev/kmsg"
    # A process holding the GPUs would make `nvidia-smi --gpu-reset` refuse them.
    assert e["GPU_REMEDIATE_WATCH_NVML"] == "false"
    assert not any("nvidia.com/gpu" in str(r) for r in c.get("resources", {}).values())
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    ns = find(objects, "Namespace", namespace)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_the_watchers_url_reaches_the_workers_report_port(
        objects: list[dict[str, Any]]) -> None:
    url = env(container(find(objects, "DaemonSet", "gpu-remediate-watch")))[
        "GPU_REMEDIATE_WATCH_URL"]
    svc = find(objects, "Service", "gpu-remediate-reports")
    [port] = svc["spec"]["ports"]
    assert url == (f"https://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:"
                   f"{port['port']}/v1/reports")
    worker = container(find(objects, "Deployment", "gpu-remediate"))
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    assert ports[port["targetPort"]] == DEFAULTS.port
    policy = find(objects, "NetworkPolicy", "gpu-remediate-reports")
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": DEFAULTS.port, "protocol": "TCP"}]


def test_the_worker_serves_reports_with_its_tls_secret(
        objects: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = find(objects, "Deployment", "gpu-remediate")
    worker = container(deployment)
    e = env(worker)
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert e["GPU_REMEDIATE_REPORTS__TLS_CERT"] == f"{mounts['reports-tls']}/tls.crt"
    assert e["GPU_REMEDIATE_REPORTS__TLS_KEY"] == f"{mounts['reports-tls']}/tls.key"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["reports-tls"]["secret"]["secretName"] == "gpu-remediate-reports-tls"
    for name, value in e.items():
        if name.startswith("GPU_REMEDIATE_REPORTS__"):
            monkeypatch.setenv(name, value)
    settings = load_settings(None)
    assert settings.reports.enabled and settings.reports.tls_cert is not None


def test_the_worker_may_review_tokens_and_nothing_more(objects: list[dict[str, Any]]) -> None:
    role = find(objects, "ClusterRole", "gpu-remediate-token-review")
    assert role["rules"] == [{"apiGroups": ["authentication.k8s.io"],
                              "resources": ["tokenreviews"], "verbs": ["create"]}]
    binding = find(objects, "ClusterRoleBinding", "gpu-remediate-token-review")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-remediate",
                                    "namespace": "gpu-remediate"}]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_objects_match_kubernetes_schemas(objects: list[dict[str, Any]], version: str) -> None:
    errors = schema_errors(objects, version)
    assert not errors, "\n".join(errors)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_renderer_agrees_with_kubectl(tmp_path: Path) -> None:
    here = with_watcher(tmp_path)
    out = subprocess.run(["kubectl", "kustomize", str(here)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    theirs = {key(o): o for o in yaml.safe_load_all(out) if o}
    mine = {key(o): o for o in render(here)}
    assert mine == theirs
