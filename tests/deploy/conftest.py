"""Fixtures for the deployment artefacts: rendered kustomizations and parsed files."""

from __future__ import annotations

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
