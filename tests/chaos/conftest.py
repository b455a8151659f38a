"""Chaos fixtures: stacks with short timeouts so a killed worker or a restarted server
costs seconds, not minutes."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "chaos: scripted failure injection against the whole local stack")
