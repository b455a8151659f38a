"""``gpu-remediate watch``: what it refuses before watching anything."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from worker.watch.cli import watch_app

runner = CliRunner()


def test_a_plain_http_endpoint_is_refused_naming_the_option(tmp_path: Path) -> None:
    result = runner.invoke(watch_app, ["--url", "http://worker:8443/v1/reports",
                                       "--node", "n1", "--kernel-log", str(tmp_path / "log")])
    assert result.exit_code == 2
    assert "--url" in result.output and "https" in result.output


def test_an_unreadable_kernel_log_is_an_error_naming_it(tmp_path: Path) -> None:
    result = runner.invoke(watch_app, ["--url", "https://worker:8443/v1/reports",
                                       "--node", "n1", "--no-nvml",
                                       "--kernel-log", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "missing" in result.output


def test_without_a_node_name_it_does_not_start() -> None:
    result = runner.invoke(watch_app, ["--url", "https://w/v1/reports"], env={"NODE_NAME": ""})
    assert result.exit_code == 2 and "--node" in result.output
