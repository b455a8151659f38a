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


PROBE = """
import sys
sys.argv = ["gpu-remediate", *sys.argv[1:]]
from worker.cli import app
try:
    app()
except SystemExit:
    pass
loaded = sorted(m for m in sys.modules if m == "sim" or m.startswith("sim."))
print("SIM-MODULES", loaded, file=sys.stderr)
"""


def sim_modules(*args: str) -> str:
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    return result.stderr.rsplit("SIM-MODULES", 1)[-1].strip()


def test_no_command_but_sim_loads_a_simulator() -> None:
    assert sim_modules("--help") == "[]"
    assert sim_modules("version") == "[]"
    loaded = sim_modules("sim", "gpu", "--help")
    assert "'sim.gpu.cli'" in loaded, "the sim command still mounts the simulators"


def test_sim_help_and_its_commands_still_answer() -> None:
    result = run("sim", "--help")
    assert result.returncode == 0 and "cluster" in result.stdout and "node" in result.stdout
    result = run("sim", "gpu", "no-such-command")
    assert result.returncode == 2 and "No such command" in result.stderr
