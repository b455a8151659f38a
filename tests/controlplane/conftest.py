"""The fidelity tier: the same tests against a real kube-apiserver and controllers.

Off unless GPU_REMEDIATE_CONTROLPLANE (or --controlplane, when tests/controlplane is
on the command line) says where the control plane binary comes from; see
tests/controlplane/controlplane.py and docs/controlplane.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.controlplane.controlplane import ENV, ControlPlane, resolve


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--controlplane", default=None, metavar="cached|build|PATH",
        help=f"run tests/controlplane against a real control plane (default: ${ENV})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "controlplane: needs the real control plane built by "
                   "tests/controlplane/build.sh (skipped without it)")


@pytest.fixture(scope="session")
def controlplane_binary(request: pytest.FixtureRequest) -> Path:
    choice = request.config.getoption("--controlplane", default=None) or os.environ.get(ENV)
    path, why = resolve(choice)
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def controlplane(controlplane_binary: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, tmp_path_factory.mktemp("controlplane")) as cp:
        yield cp
