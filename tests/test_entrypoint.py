"""The console entry point skips interpreter finalization (a Temporal client's runtime
threads can abort it after a command succeeded), so it must still flush what the command
printed and return the command's own exit status."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest


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


PROBE = """
import os
import sys
sys.argv = ["gpu-remediate", *sys.argv[1:]]
from worker.cli import app
try:
    app()
except SystemExit:
    pass
prefix = os.environ["LOADED_PREFIX"]
loaded = sorted(m for m in sys.modules if m == prefix or m.startswith(prefix + "."))
print("LOADED-MODULES", loaded, file=sys.stderr)
"""


def loaded_modules(prefix: str, *args: str) -> str:
    """The modules under ``prefix`` that ``gpu-remediate ARGS`` has loaded when it ends."""
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL,
                            env={**os.environ, "LOADED_PREFIX": prefix})
    return result.stderr.rsplit("LOADED-MODULES", 1)[-1].strip()


def sim_modules(*args: str) -> str:
    return loaded_modules("sim", *args)


def test_no_command_but_sim_loads_a_simulator() -> None:
    assert sim_modules("--help") == "[]"
    assert sim_modules("version") == "[]"
    loaded = sim_modules("sim", "gpu", "--help")
    assert "'sim.gpu.cli'" in loaded, "the sim command still mounts the simulators"


@pytest.mark.parametrize("package", ["worker.service", "worker.stack", "worker.probe.check"])
def test_the_cli_loads_a_process_package_only_for_its_command(package: str) -> None:
    # --help prints every command's help (check's exit-code table too) without loading the
    # worker process, the laptop stack or the node probe (a real module: a renamed one would
    # pass for never loaded).
    assert importlib.util.find_spec(package) is not None
    assert loaded_modules(package, "--help") == "[]"
    assert loaded_modules(package, "check", "--help") == "[]"


def test_sim_help_and_its_commands_still_answer() -> None:
    result = run("sim", "--help")
    assert result.returncode == 0 and "cluster" in result.stdout and "node" in result.stdout
    result = run("sim", "gpu", "no-such-command")
    assert result.returncode == 2 and "No such command" in result.stderr
