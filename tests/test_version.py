"""`gpu-remediate version`: the installed distribution's version, not a copy in the source."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from typer.testing import CliRunner

from worker.cli import app
from worker.version import CODE_PACKAGES, code_build_id


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


def test_the_build_id_tells_two_builds_of_one_version_apart(tmp_path: Path) -> None:
    """Without Worker Deployment Versioning the worker's build ID (in every workflow task
    it completes) is the version and a digest of this project's own code: the same code
    gives the same ID, any change to a file of it another."""
    for package in CODE_PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "mod.py").write_text(f"NAME = {package!r}\n")
    first = code_build_id(tmp_path)
    version = metadata.version("gpu-remediate")
    assert first.startswith(f"{version}+") and len(first) == len(version) + 13
    assert code_build_id(tmp_path) == first
    (tmp_path / "workflows" / "sub" / "mod.py").write_text("NAME = 'changed'\n")
    changed = code_build_id(tmp_path)
    assert changed != first
    # A file moved is another build, though its bytes are the same.
    (tmp_path / "workflows" / "sub" / "mod.py").rename(tmp_path / "workflows" / "mod.py")
    assert code_build_id(tmp_path) not in (first, changed)
    # The installed tree's ID is computed from the real packages.
    assert code_build_id().startswith(f"{version}+")
