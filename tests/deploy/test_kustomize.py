"""The kustomizations render, match kubectl's rendering, and pass Kubernetes' schemas."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import KUSTOMIZATIONS
from tests.deploy.kustomize import KustomizeError, key, name_hash, render

# Kinds of the Prometheus Operator: no schema ships with kubernetes-validate; their
# content is checked in test_monitoring.py.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# The oldest Kubernetes the manifests claim (Pod Security labels, Job TTL, PDB policy/v1)
# and the newest schema bundled.
K8S_VERSIONS = ("1.29.0", "latest")


def test_name_hash_matches_kustomize() -> None:
    # `kubectl kustomize` (kustomize v5.5.0) names a generator {x: a=b} x-4h2mbtbbt6.
    assert name_hash({"a": "b"}) == "4h2mbtbbt6"


def test_every_kustomization_renders(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, objects in rendered.items():
        keys = [key(o) for o in objects]
        assert len(keys) == len(set(keys)), f"{name}: duplicate objects"
        assert {"Deployment", "ClusterRole", "Job", "ConfigMap"} <= {k[0] for k in keys}


def test_renderer_refuses_unsupported_fields(tmp_path: Any) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_renderer_agrees_with_kubectl(name: str, shipped: dict[str, list[dict[str, Any]]]) -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZATIONS[name])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    theirs = {key(o): o for o in yaml.safe_load_all(out) if o}
    mine = {key(o): o for o in shipped[name]}
    assert set(mine) == set(theirs)
    for k, obj in mine.items():
        assert obj == theirs[k], f"{name}: {k} differs from kubectl kustomize"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", list(KUSTOMIZATIONS))
def test_objects_match_kubernetes_schemas(
    name: str, version: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    errors = schema_errors(rendered[name], version)
    assert not errors, "\n".join(errors)


def schema_errors(objects: list[dict[str, Any]], version: str) -> list[str]:
    """What Kubernetes' OpenAPI schemas (strict: no unknown fields) reject in these objects."""
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (test extra)"
    )
    target = kv.latest_version() if version == "latest" else version
    errors = []
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        try:
            kv.validate(obj, target, strict=True)
        except kv.ValidationError as err:
            errors.append(f"{key(obj)}: {err.message} at {list(err.path)}")
    return errors


def test_crd_objects_are_the_expected_ones(rendered: dict[str, list[dict[str, Any]]]) -> None:
    crds = {(o["apiVersion"], o["kind"]) for o in rendered["base"] if o["kind"] in CRD_KINDS}
    assert crds == {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }
