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

from tests.controlplane.controlplane import DRA_ENV, DRA_MODULE, ENV, ControlPlane, resolve


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


@pytest.fixture(scope="session")
def controlplane_dra_binary(request: pytest.FixtureRequest) -> Path:
    """The tier's second version (Kubernetes 1.37, DeviceTaintRule v1): its own variable,
    else the first's when that says cached or build (a path names one binary only)."""
    choice = os.environ.get(DRA_ENV) or ""
    if not choice:
        first = request.config.getoption("--controlplane", default=None) or \
            os.environ.get(ENV) or ""
        choice = first if first in ("1", "auto", "cached", "yes", "build") else ""
    path, why = resolve(choice, DRA_MODULE)
    if path is None:
        pytest.skip(f"{why} (the DRA tier: {DRA_ENV} or build.sh with MODULE={DRA_MODULE})")
    return path


@pytest.fixture(scope="module")
def controlplane_dra(controlplane_dra_binary: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_dra_binary, tmp_path_factory.mktemp("controlplane-dra"),
                      apiserver_args=DRA_APISERVER_ARGS) as cp:
        yield cp


DRA_APISERVER_ARGS = ["--runtime-config=resource.k8s.io/v1beta2=true"]
"""DeviceTaintRule v1 is on by default from 1.37; its v1beta2 (what a 1.36 cluster serves)
is a beta API, off unless asked for, as a cluster that keeps 1.36 clients working does."""


@pytest.fixture(scope="module")
def controlplane(controlplane_binary: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(controlplane_binary, tmp_path_factory.mktemp("controlplane")) as cp:
        yield cp
