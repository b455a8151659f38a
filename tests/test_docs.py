"""The docs stay true: the README's config example loads, its commands exist."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from worker.cli import app
from worker.config import load_settings

ROOT = Path(__file__).resolve().parents[1]


def test_readme_config_example_is_valid(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert block, "README has a YAML config example"
    path = tmp_path / "config.yaml"
    # Its digests are placeholders a reader fills in (crane digest IMAGE).
    path.write_text(block.group(1).replace("<64 hex>", "f" * 64))
    settings = load_settings(path)
    assert settings.jobs.require_digest
    assert settings.detector.max_unavailable == 1
    assert settings.remediation.drain.deadline.total_seconds() == 1800


def test_every_command_in_the_readme_table_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    runner = CliRunner()
    for command in sorted(set(re.findall(r"^\| `gpu-remediate ([a-z]+)", readme, re.M))):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0, f"gpu-remediate {command}: {result.output}"
