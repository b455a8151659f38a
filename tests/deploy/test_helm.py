"""The Helm chart (deploy/helm/gpu-remediate): lint, the same objects as the kustomize
overlays for the same settings, the same schema and RBAC checks, and its own values.

The kustomize base is the source of truth; the chart follows it, and the equality test
here is what keeps the two in lockstep.
"""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import chart, pins
from tests.deploy.conftest import DEPLOY, OVERLAYS, ROOT
from tests.deploy.kustomize import find, key
from tests.deploy.test_kustomize import K8S_VERSIONS, schema_errors
from tests.deploy.test_rbac import (
    assert_grants_are_where_the_code_calls,
    assert_grants_exactly_what_the_code_uses,
)
from tests.deploy.test_workload import _unhash
from worker.config import Settings, load_settings

Objects = list[dict[str, Any]]
HOOK = "helm.sh/hook"
CONFIG = "gpu-remediate-config"
# The files the chart carries (Helm reads nothing outside a chart) and their originals.
CHART_FILES = {
    "files/search-attributes.sh": DEPLOY / "base" / "scripts" / "search-attributes.sh",
    "files/gpu-remediate-rules.yaml": DEPLOY / "monitoring" / "gpu-remediate-rules.yaml",
    "files/gpu-remediate.json": DEPLOY / "grafana" / "gpu-remediate.json",
}


def comparable(objects: Objects) -> dict[tuple[str, str, str], Any]:
    """Objects keyed by kind, namespace and name, less what is Helm's alone: hook
    annotations. The worker config is compared parsed (the chart writes it with toYaml, the
    base keeps comments), so its hashed name differs and is dropped, where it is defined
    and where it is referenced."""
    out = {}
    for obj in copy.deepcopy(objects):
        meta = obj["metadata"]
        annotations = {k: v for k, v in meta.get("annotations", {}).items() if HOOK not in k}
        meta.pop("annotations", None)
        if annotations:
            meta["annotations"] = annotations
        if obj["kind"] == "ConfigMap" and meta["name"].startswith(f"{CONFIG}-"):
            meta["name"] = CONFIG
            obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
        obj = _unhash(obj)
        out[key(obj)] = obj
    return out


def config_of(objects: Objects, tmp_path: Path) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(find(objects, "ConfigMap", CONFIG)["data"]["config.yaml"])
    return load_settings(path)


def render(helm: Path, values: dict[str, Any]) -> Objects:
    return chart.template(helm, values)


def test_helm_is_the_pinned_version(helm: Path) -> None:
    go_mod = (chart.BUILD.parent / "go.mod").read_text()
    pinned = re.search(r"^\s*helm\.sh/helm/v4 (v\S+)", go_mod, re.MULTILINE)
    assert pinned, "tests/deploy/helm/go.mod pins no helm.sh/helm/v4"
    assert chart.run(helm, "version", "--template", "{{.Version}}").strip() == pinned.group(1)


@pytest.mark.parametrize("mode", OVERLAYS)
def test_lint(helm: Path, mode: str) -> None:
    out = chart.run(helm, "lint", "--strict", str(chart.CHART),
                    values=chart.with_image({"mode": mode}))
    assert "0 chart(s) failed" in out


def test_the_packaged_chart_is_the_tested_one(
    helm: Path, helm_rendered: dict[str, Objects], tmp_path: Path
) -> None:
    """`helm package` (what a chart repository serves) keeps every file the chart reads."""
    out = chart.run(helm, "package", str(chart.CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("gpu-remediate-*.tgz")
    assert archive.name in out
    packaged = chart.run(
        helm, "template", chart.RELEASE, str(archive), "--kube-version", chart.KUBE_VERSION,
        values=chart.with_image(None)
    )
    assert [d for d in yaml.safe_load_all(packaged) if d] == helm_rendered["dry-run"]


@pytest.mark.parametrize("mode", OVERLAYS)
def test_chart_renders_what_kustomize_renders(
    mode: str, helm_rendered: dict[str, Objects], rendered: dict[str, Objects]
) -> None:
    mine = comparable(helm_rendered[mode])
    theirs = comparable(rendered[mode])
    assert set(mine) == set(theirs), (
        f"only in the chart: {sorted(set(mine) - set(theirs))}; "
        f"only in deploy/overlays/{mode}: {sorted(set(theirs) - set(mine))}"
    )
    for k, obj in mine.items():
        assert obj == theirs[k], f"{mode}: {k} differs from deploy/overlays/{mode}"


def test_generated_configmap_names_are_kustomizes(
    helm_rendered: dict[str, Objects], rendered: dict[str, Objects]
) -> None:
    """Same data, same name: the chart's hash is kustomize's (tests/deploy/kustomize.py)."""
    for name in ("gpu-remediate-temporal", "gpu-remediate-scripts"):
        ours = find(helm_rendered["dry-run"], "ConfigMap", name)["metadata"]["name"]
        assert ours == find(rendered["dry-run"], "ConfigMap", name)["metadata"]["name"]
    # A config change is a new name, so the pods roll.
    names = {find(objs, "ConfigMap", CONFIG)["metadata"]["name"] for objs in helm_rendered.values()}
    assert len(names) == len(OVERLAYS)


def test_setup_jobs_are_ordered_hooks(helm_rendered: dict[str, Objects]) -> None:
    """Jobs are immutable: as hooks they are replaced on every install and upgrade, and the
    detector starts only after the search attributes are registered."""
    hooks = {
        o["metadata"]["name"]: o["metadata"]["annotations"]
        for o in helm_rendered["dry-run"]
        if HOOK in o["metadata"].get("annotations", {})
    }
    assert set(hooks) == {"gpu-remediate-search-attributes", "gpu-remediate-detector-start"}
    for hook in hooks.values():
        assert hook[HOOK] == "post-install,post-upgrade"
        assert hook["helm.sh/hook-delete-policy"] == "before-hook-creation"
    weight = {name: int(a["helm.sh/hook-weight"]) for name, a in hooks.items()}
    assert weight["gpu-remediate-search-attributes"] < weight["gpu-remediate-detector-start"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("mode", OVERLAYS)
def test_chart_objects_match_kubernetes_schemas(
    mode: str, version: str, helm_rendered: dict[str, Objects]
) -> None:
    errors = schema_errors(helm_rendered[mode], version)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("mode", OVERLAYS)
def test_chart_rbac_is_what_the_code_uses(
    mode: str, helm_rendered: dict[str, Objects], tmp_path: Path
) -> None:
    assert_grants_exactly_what_the_code_uses(helm_rendered[mode])
    assert_grants_are_where_the_code_calls({f"helm {mode}": helm_rendered[mode]}, tmp_path)


def test_chart_files_are_the_deploy_files() -> None:
    for inside, original in CHART_FILES.items():
        assert (chart.CHART / inside).read_bytes() == original.read_bytes(), (
            f"deploy/helm/gpu-remediate/{inside} differs from {original.relative_to(ROOT)}: "
            "copy it over"
        )


def test_versions_agree(helm_rendered: dict[str, Objects], rendered: dict[str, Objects]) -> None:
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert meta["version"] == meta["appVersion"] == project
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == project


def test_the_documented_values_file_renders(helm: Path, tmp_path: Path) -> None:
    """docs/install.md's site-values.yaml is a working values file."""
    doc = (ROOT / "docs" / "install.md").read_text()
    block = re.search(r"```yaml\n(# site-values\.yaml\n.*?)```", doc, re.DOTALL)
    assert block, "docs/install.md: no site-values.yaml example"
    values = yaml.safe_load(block.group(1))
    # As written: its digests are the placeholders a reader replaces, so they must be the
    # values' own, not the tests' (chart.template adds those only where none is given).
    text = block.group(1).replace("<64 hex>", "f" * 64)
    objects = [d for d in yaml.safe_load_all(chart.run(
        helm, "template", chart.RELEASE, str(chart.CHART), "--kube-version", chart.KUBE_VERSION,
        values=yaml.safe_load(text))) if d]
    settings = config_of(objects, tmp_path)
    assert settings.jobs.require_digest
    assert settings.detector.dry_run is (values["mode"] == "dry-run")
    assert settings.exporter.namespace == values["config"]["exporter"]["namespace"]


def test_mode_sets_dry_run_and_approval(helm: Path, tmp_path: Path) -> None:
    supervised = config_of(
        render(helm, {"mode": "supervised", "approval": {"requiredFor": ["reboot"]}}), tmp_path
    )
    assert supervised.detector.dry_run is False
    assert [a.value for a in supervised.remediation.approval.required_for] == ["reboot"]
    # requiredFor is the supervised mode's list: autonomous never waits for an operator.
    autonomous = config_of(
        render(helm, {"mode": "autonomous", "approval": {"requiredFor": ["reboot"]}}), tmp_path
    )
    assert autonomous.detector.dry_run is False
    assert autonomous.remediation.approval.required_for == []


DCGM = "registry.example.com/dcgm:4.2.3@sha256:" + "c" * 64


def test_budget_policy_and_job_templates_reach_the_worker(helm: Path, tmp_path: Path) -> None:
    objects = render(
        helm,
        {
            "budget": {"maxUnavailable": "10%"},
            "policy": {"xid_overrides": {74: "reboot"}, "follow_recovery_action": False},
            "jobs": {
                "validation": {
                    "image": DCGM,
                    "command": ["dcgmi", "diag", "-r", "3"],
                    "deadline": "PT45M",
                }
            },
            "config": {
                "detector": {"interval": "PT1M"},
                "remediation": {"approval": {"timeout": "PT2H"}},
            },
        },
    )
    settings = config_of(objects, tmp_path)
    assert settings.detector.max_unavailable == "10%"
    assert settings.policy.xid_overrides[74].value == "reboot"
    assert settings.policy.follow_recovery_action is False
    validation = settings.jobs.templates["validation"]
    assert validation.image == DCGM
    assert validation.command == ["dcgmi", "diag", "-r", "3"]
    assert validation.deadline.total_seconds() == 45 * 60
    assert validation.purpose == "validate"
    # The rest of the config stays as given, and the other Job templates as default.
    assert settings.detector.interval.total_seconds() == 60
    assert settings.remediation.approval.timeout.total_seconds() == 2 * 3600
    assert settings.remediation.drain.deadline_policy == "wait"
    assert settings.jobs.templates["reboot"] == Settings().jobs.templates["reboot"]


def test_namespaces_follow_the_config(helm: Path, tmp_path: Path) -> None:
    objects = render(
        helm,
        {
            "config": {
                "jobs": {"namespace": "gpu-jobs"},
                "kubernetes": {"in_cluster": True, "event_namespace": "gpu-events"},
            }
        },
    )
    settings = config_of(objects, tmp_path)
    assert settings.jobs.namespace == "gpu-jobs"
    assert settings.kubernetes.event_namespace == "gpu-events"
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    assert namespaces == {"gpu-remediate", "gpu-jobs"}
    sa = find(objects, "ServiceAccount", "default")
    assert sa["metadata"]["namespace"] == "gpu-jobs"
    assert_grants_are_where_the_code_calls({"own namespaces": objects}, tmp_path)
    without = render(helm, {"createNamespaces": False})
    assert not [o for o in without if o["kind"] == "Namespace"]


def test_temporal_connection(helm: Path, tmp_path: Path) -> None:
    objects = render(
        helm,
        {
            "temporal": {
                "address": "ns.acct.tmprl.cloud:7233",
                "namespace": "ns.acct",
                "secretName": "temporal-mtls",
                "tls": {"enabled": True, "privateCA": True, "serverName": "temporal.example"},
            }
        },
    )
    temporal = find(objects, "ConfigMap", "gpu-remediate-temporal")["data"]
    assert temporal == {"address": "ns.acct.tmprl.cloud:7233", "namespace": "ns.acct"}
    tls = config_of(objects, tmp_path).temporal.tls
    assert tls.enabled is True
    assert str(tls.client_cert) == "/etc/gpu-remediate/temporal/tls.crt"
    assert str(tls.client_key) == "/etc/gpu-remediate/temporal/tls.key"
    assert str(tls.server_ca) == "/etc/gpu-remediate/temporal/ca.crt"
    assert tls.server_name == "temporal.example"
    for kind, name in (
        ("Deployment", "gpu-remediate"),
        ("Job", "gpu-remediate-search-attributes"),
        ("Job", "gpu-remediate-detector-start"),
    ):
        spec = find(objects, kind, name)["spec"]["template"]["spec"]
        secrets = [v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v]
        assert secrets == ["temporal-mtls"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            env = {e["name"]: e for e in c["env"]}
            keys = [
                e["valueFrom"]["secretKeyRef"]
                for e in env.values()
                if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
            ]
            if c["image"].startswith("temporalio/admin-tools"):
                assert keys == [{"name": "temporal-mtls", "key": "api-key", "optional": True}]
                assert env["TEMPORAL_TLS_SERVER_NAME"]["value"] == "temporal.example"
            else:  # gpu-remediate reads the key from the mounted Secret, re-read on rotation
                assert keys == []
    key_file = config_of(objects, tmp_path).temporal.api_key_file
    assert str(key_file) == "/etc/gpu-remediate/temporal/api-key"
    # A public CA: no ca.crt expected in the Secret.
    public = render(helm, {"temporal": {"tls": {"enabled": True}}})
    assert config_of(public, tmp_path).temporal.tls.server_ca is None


def test_monitoring_toggles(helm: Path) -> None:
    kinds = {o["kind"] for o in render(helm, {})}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds
    off = render(helm, {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}})
    assert not {"ServiceMonitor", "PrometheusRule"} & {o["kind"] for o in off}
    labelled = render(
        helm,
        {
            "serviceMonitor": {"labels": {"release": "kps"}},
            "prometheusRule": {"labels": {"release": "kps"}},
        },
    )
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert find(labelled, kind, "gpu-remediate")["metadata"]["labels"]["release"] == "kps"
    assert not [o for o in render(helm, {}) if o["metadata"]["name"] == "gpu-remediate-dashboard"]


def test_grafana_dashboard(helm: Path) -> None:
    objects = render(helm, {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}})
    cm = find(objects, "ConfigMap", "gpu-remediate-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads((DEPLOY / "grafana" / "gpu-remediate.json").read_text())
    assert json.loads(cm["data"]["gpu-remediate.json"]) == dashboard


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"mode": "yolo"}, "/mode"),
        ({"budget": {"maxUnavailable": True}}, "/budget/maxUnavailable"),
        ({"budget": {"maxUnavailable": "ten"}}, "/budget/maxUnavailable"),
        ({"worker": {"replicas": "two"}}, "/worker/replicas"),
        ({"temporal": {"tls": {"enabled": "yes"}}}, "/temporal/tls/enabled"),
        ({"temporal": {"address": "temporal-frontend"}}, "/temporal/address"),
        ({"serviceMonitor": {"enabled": "false"}}, "/serviceMonitor/enabled"),
        ({"policy": ["reboot"]}, "/policy"),
        ({"approval": {"requiredFor": "reset"}}, "/approval/requiredFor"),
        ({"mod": "autonomous"}, "'mod'"),
    ],
)
def test_wrong_values_fail_naming_the_value(helm: Path, values: dict[str, Any], named: str) -> None:
    with pytest.raises(chart.HelmFailed) as failed:
        render(helm, values)
    assert "schema" in failed.value.stderr
    assert named in failed.value.stderr


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"config": {"detector": {"dry_run": False}}}, "config.detector.dry_run: set mode"),
        ({"config": {"detector": {"max_unavailable": 3}}}, "set budget.maxUnavailable"),
        ({"config": {"policy": {"ecc_dbe_action": "reboot"}}}, "config.policy: set policy"),
        ({"config": {"temporal": {"address": "x:7233"}}}, "config.temporal.address"),
        (
            {"config": {"remediation": {"approval": {"required_for": []}}}},
            "config.remediation.approval.required_for",
        ),
        (
            {
                "config": {"jobs": {"templates": {"reboot": {"deadline": "PT1H"}}}},
                "jobs": {"reboot": {"deadline": "PT2H"}},
            },
            "config.jobs.templates.reboot: set it under jobs.reboot only",
        ),
    ],
)
def test_a_setting_in_two_places_fails_naming_it(
    helm: Path, values: dict[str, Any], named: str
) -> None:
    with pytest.raises(chart.HelmFailed) as failed:
        render(helm, values)
    assert named in failed.value.stderr


def test_stuck_alert_durations_are_values(helm: Path) -> None:
    objects = render(helm, {"prometheusRule": {"stuckAfter": {"draining": "45m"}}})
    rule = find(objects, "PrometheusRule", "gpu-remediate")
    stuck = {r["labels"]["state"]: r["for"] for g in rule["spec"]["groups"]
             for r in g["rules"] if r["alert"] == "GpuRemediateRemediationStuck"}
    assert stuck["draining"] == "45m" and stuck["validating"] == "1h"


def test_without_an_image_the_chart_refuses_to_render_and_says_how_to_build_one(
        helm: Path) -> None:
    """No image is published: a default would only show as ImagePullBackOff, with no hint."""
    with pytest.raises(chart.HelmFailed) as refused:
        chart.run(helm, "template", chart.RELEASE, str(chart.CHART))
    said = refused.value.stderr
    assert "image.repository is required" in said
    assert "Dockerfile" in said and "docs/install.md" in said
    objs = chart.template(helm, {"image": {"repository": "registry.example.com/gpu-remediate"}})
    images = {c["image"] for o in objs if o["kind"] in ("Deployment", "Job")
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert f"registry.example.com/gpu-remediate:0.1.0@{pins.TEST_DIGEST}" in images


def test_require_digest_refuses_to_render_each_unpinned_image_and_says_how_to_pin_it(
        helm: Path, tmp_path: Path) -> None:
    """config.jobs.require_digest is on in the shipped values: the worker's image (the
    reboot and GPU reset Jobs run it) and the built-in validation image must be named by
    digest, or nothing renders; each refusal names the value and the crane line."""
    unpinned = chart.with_image(None, pinned=False)
    with pytest.raises(chart.HelmFailed) as refused:
        chart.run(helm, "template", chart.RELEASE, str(chart.CHART), values=unpinned)
    said = refused.value.stderr
    assert "image.digest is required" in said
    assert f"crane digest {pins.TEST_IMAGE}:0.1.0" in said
    with pytest.raises(chart.HelmFailed) as refused:
        chart.run(helm, "template", chart.RELEASE, str(chart.CHART),
                  values={**unpinned, "image": {**unpinned["image"], "digest": pins.TEST_DIGEST}})
    said = refused.value.stderr
    assert "jobs.validation.image is required" in said
    # The image the chart names is the worker's built-in, so the pin is the same image.
    assert Settings().jobs.templates["validation"].image == pins.VALIDATION_IMAGE
    assert f"crane digest {pins.VALIDATION_IMAGE}" in said
    # A template added by tag is refused too, naming it.
    with pytest.raises(chart.HelmFailed) as refused:
        chart.template(helm, {"jobs": {"long-diag": {
            "purpose": "validate", "image": "registry.example.com/dcgm:4.2.3",
            "command": ["dcgmi", "diag", "-r", "3"], "deadline": "PT90M"}}})
    assert "jobs.long-diag.image: registry.example.com/dcgm:4.2.3 is not pinned" in (
        refused.value.stderr)
    # A digest that is not one is refused by the schema.
    with pytest.raises(chart.HelmFailed) as refused:
        chart.template(helm, {"image": {"digest": "sha256:abc"}})
    assert "/image/digest" in refused.value.stderr
    # Pinned, the pods pull by digest and the validation Job runs the built-in, pinned.
    objects = chart.template(helm, None)
    settings = config_of(objects, tmp_path)
    assert settings.jobs.require_digest
    validation = settings.jobs.resolve("validate", "")
    assert validation.image == pins.TEST_VALIDATION_IMAGE
    assert validation.command == Settings().jobs.templates["validation"].command
    pinned = f"{pins.TEST_IMAGE}:0.1.0@{pins.TEST_DIGEST}"
    assert settings.jobs.resolve("reboot", "").image == pinned
    # Turned off, tags are accepted as before.
    loose = [d for d in yaml.safe_load_all(chart.run(
        helm, "template", chart.RELEASE, str(chart.CHART),
        values={**unpinned, "config": {"jobs": {"require_digest": False}}})) if d]
    assert config_of(loose, tmp_path).jobs.worker_image == f"{pins.TEST_IMAGE}:0.1.0"
