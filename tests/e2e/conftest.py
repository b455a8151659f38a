"""End-to-end fixtures: the real dev server, both simulators and the worker as processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from kubernetes import client, config

from worker.stack import LocalStack, Ports

HERE = Path(__file__).parent
S = TypeVar("S", bound=LocalStack)


def make_stack(tmp: Path, scenario: str, *, kind: type[S] = LocalStack,  # type: ignore[assignment]
               **overrides: object) -> S:
    """A stack (``kind``: LocalStack, or the production tier's ProductionStack) with the
    end-to-end tests' short timings."""
    return kind(
        data_dir=tmp, scenario=scenario, ports=Ports.ephemeral(), headless=True,
        persistent=True, job_seconds=1.0, reboot_seconds=2.0,
        overrides={"detector.interval": "PT1S", "remediation.drain.retry_interval": "PT1S",
                   # A killed worker's activity is retried elsewhere after this long.
                   "remediation.heartbeat_timeout": "PT5S",
                   # One stack serves a module's scenarios, several of which quarantine a
                   # node on purpose: the quarantine cap and the outcome breaker would hold
                   # the later scenarios back (they have tests of their own, below and in
                   # tests/workflows/test_admission_rules.py).
                   "detector.max_quarantined": "100%", "detector.breaker_max_quarantines": 0,
                   **overrides},
    )


@pytest.fixture(scope="module")
def pdb_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("stack"), str(HERE / "pdb.yaml"),
                       **{"detector.max_unavailable": 2})
    with stack:
        yield stack


def core_api(stack: LocalStack) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(config_file=str(stack.kubeconfig)))
