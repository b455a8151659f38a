"""Fixtures for the deployment artefacts: rendered kustomizations and parsed files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.kustomize import render

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("dry-run", "supervised", "autonomous")
KUSTOMIZATIONS = {
    "base": DEPLOY / "base",
    **{name: DEPLOY / "overlays" / name for name in OVERLAYS},
}


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Every kustomization (base and overlays), rendered."""
    return {name: render(path) for name, path in KUSTOMIZATIONS.items()}


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
