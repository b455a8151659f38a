"""The production tier: the real Temporal server on PostgreSQL, several workers, upgrades.

Off unless the Temporal server is built (tests/production/build.sh, cached) and PostgreSQL
is installed; GPU_REMEDIATE_PRODUCTION names the built folder (CI sets it when the tier's
inputs changed since tests/production/VERIFIED). See docs/production-tier.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.production.topology import ENV, built_server, postgres_bindir


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "production: needs the Temporal server built by tests/production/build.sh "
                   "and PostgreSQL (skipped without them)")


@pytest.fixture(scope="session")
def temporal_server() -> Path:
    if not os.environ.get(ENV):
        pytest.skip(f"the production tier is off: set {ENV}=cached or the folder "
                    "tests/production/build.sh printed (tests/production/verify.sh runs it)")
    server = built_server()
    if server is None:
        pytest.fail(f"{ENV} is set but no built Temporal server was found: run "
                    "tests/production/build.sh")
    if postgres_bindir() is None:
        pytest.fail("PostgreSQL is not installed: apt-get install postgresql")
    return server
