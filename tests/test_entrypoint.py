"""The console entry point skips interpreter finalization (a Temporal client's runtime
threads can abort it after a command succeeded), so it must still flush what the command
printed and return the command's own exit status."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_success_prints_everything_and_exits_zero() -> None:
    result = run("version", "-o", "json")
    assert result.returncode == 0, result.stderr
    assert '"gpu-remediate"' in result.stdout and result.stdout.rstrip().endswith("}")


def test_a_failed_command_keeps_its_status_and_its_message() -> None:
    result = run("detector", "status", "--config", "/nonexistent/config.yaml")
    assert result.returncode == 2
    assert "/nonexistent/config.yaml" in result.stderr


def test_a_usage_error_keeps_click_status() -> None:
    result = run("no-such-command")
    assert result.returncode == 2
    assert "No such command" in result.stderr
