"""A real Prometheus server scraping the GPU simulator, for the Prometheus source tests.

The Prometheus binary comes from the OS (Debian/Ubuntu: ``apt-get install -y
--no-install-recommends prometheus``) or from ``$PROMETHEUS_BIN``; the tests that need it skip
when it is absent.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import yaml

from sim.gpu.client import GpuSimClient
from sim.gpu.fleet import Fleet
from sim.gpu.server import RunningSimulator, start_gpu_simulator
from tests.polling import wait_for
from worker.stack import free_port

INSTALL_HINT = "apt-get install -y --no-install-recommends prometheus"


def find_prometheus() -> str | None:
    """The prometheus binary: ``$PROMETHEUS_BIN``, else the one on PATH, else None."""
    env = os.environ.get("PROMETHEUS_BIN")
    if env:
        return env if Path(env).is_file() else None
    return shutil.which("prometheus")


class ThreadedGpuSim:
    """The GPU simulator on its own event loop in a thread, so the sync control client can be
    called from async tests without blocking the simulator."""

    def __init__(self, fleet: Fleet) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="gpu-sim-prometheus"
        )
        self._thread.start()
        fut: Future[RunningSimulator] = asyncio.run_coroutine_threadsafe(
            start_gpu_simulator(fleet, "127.0.0.1", 0), self._loop
        )
        self.running = fut.result(30)
        self.url = self.running.url
        self.hostport = self.url.removeprefix("http://")
        self.client = GpuSimClient(self.url)

    def stop(self) -> None:
        self.client.close()
        asyncio.run_coroutine_threadsafe(self.running.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def scrape_config(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": jobs,
    }


def node_job(name: str, hostport: str, nodes: list[str], **extra: Any) -> dict[str, Any]:
    """One job scraping each node's simulated exporter: ``__metrics_path__`` set per target."""
    return {
        "job_name": name,
        "static_configs": [
            {
                "targets": [hostport],
                "labels": {"__metrics_path__": f"/nodes/{node}/metrics", "instance": node},
            }
            for node in nodes
        ],
        **extra,
    }


class PrometheusServer:
    """``prometheus`` on 127.0.0.1 with an ephemeral port and a throw-away TSDB."""

    def __init__(self, binary: str, workdir: Path, config: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        config_file = workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                "--storage.tsdb.retention.time=1h",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=5)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}"
            )
        try:
            return self.http.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, targets: int, timeout: float = 30) -> None:
        wait_for(self._ready, timeout, "prometheus ready", every=0.2)

        def all_up() -> bool:
            data = self.http.get("/api/v1/targets").json()["data"]["activeTargets"]
            return len(data) == targets and all(t["health"] == "up" for t in data)

        wait_for(all_up, timeout, f"{targets} scrape targets up", every=0.2)

    def query(self, promql: str) -> list[dict[str, Any]]:
        body = self.http.post("/api/v1/query", data={"query": promql}).json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
