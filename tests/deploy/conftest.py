"""Fixtures for the deployment artefacts: rendered kustomizations and parsed files."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kustomize import render
from tests.deploy.pins import TEST_DIGEST, TEST_IMAGE, pin_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("dry-run", "supervised", "autonomous")
KUSTOMIZATIONS = {
    "base": DEPLOY / "base",
    **{name: DEPLOY / "overlays" / name for name in OVERLAYS},
}


def as_installed(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shipped objects as a site installs them: with jobs.require_digest on, it names
    its digests (docs/install.md), here tests/deploy/pins.py's, which the chart gets too: the
    worker's image by digest where a pod runs it (an overlay's `images:`) and in
    jobs.worker_image, and the validation image pinned (its config file)."""
    def pin(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (f"{v}@{TEST_DIGEST}" if k == "image" and isinstance(v, str)
                        and v.startswith(f"{TEST_IMAGE}:") else pin(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [pin(v) for v in node]
        return node

    out = [pin(obj) for obj in copy.deepcopy(objects)]
    for obj in out:
        data = obj.get("data", {}) if obj["kind"] == "ConfigMap" else {}
        if obj["metadata"]["name"].startswith("gpu-remediate-config") and "config.yaml" in data:
            config = pin_config(yaml.safe_load(data["config.yaml"]))
            data["config.yaml"] = yaml.safe_dump(config, sort_keys=False)
    return out


@pytest.fixture(scope="session")
def shipped() -> dict[str, list[dict[str, Any]]]:
    """Every kustomization (base and overlays), rendered as shipped."""
    return {name: render(path) for name, path in KUSTOMIZATIONS.items()}


@pytest.fixture(scope="session")
def rendered(shipped: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Every kustomization, as a site that named its digests installs it."""
    return {name: as_installed(objects) for name, objects in shipped.items()}


@pytest.fixture(scope="session")
def helm() -> Path:
    """The Helm CLI (tests/deploy/helm/build.sh). Locally the Helm tests skip when it is not
    built and Go is absent; in CI (CI=true) they fail instead, so they never silently vanish."""
    from tests.deploy.chart import HelmUnavailable, helm_binary

    try:
        return helm_binary()
    except HelmUnavailable as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true, but no Helm to test the chart with: {err}")
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def helm_rendered(helm: Path) -> dict[str, list[dict[str, Any]]]:
    """The Helm chart rendered in each mode (the overlays' names), default values otherwise."""
    from tests.deploy.chart import template

    return {mode: template(helm, {"mode": mode}) for mode in OVERLAYS}
