"""`gpu-remediate version`: the installed distribution's version, not a copy in the source."""

from __future__ import annotations

import json
from importlib import metadata

from typer.testing import CliRunner

from worker.cli import app


def test_version_reports_the_installed_distribution() -> None:
    result = CliRunner().invoke(app, ["version", "-o", "json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["gpu-remediate"] == metadata.version("gpu-remediate")
    assert found["temporalio"] == metadata.version("temporalio")
    assert found["kubernetes"] == metadata.version("kubernetes")
    table = CliRunner().invoke(app, ["version"])
    assert table.exit_code == 0
    assert table.output.splitlines()[0] == f"gpu-remediate {found['gpu-remediate']}"
