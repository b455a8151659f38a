"""Activities against the real simulators over HTTP, with the official kubernetes client.

Each test gets its own cluster simulator (it starts in tens of milliseconds), so no
test sees another's nodes, faults or write log.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from kubernetes import client, config
from prometheus_client import REGISTRY
from temporalio.testing import ActivityEnvironment

from sim.cluster import ThreadedClusterSim
from sim.gpu.client import GpuSimClient
from sim.gpu.server import RunningSimulator, start_gpu_simulator

T = TypeVar("T")


def metric(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


class Cluster:
    """A running cluster simulator plus the official client pointed at it."""

    def __init__(self, sim: ThreadedClusterSim, kubeconfig: Path) -> None:
        self.sim = sim
        self.url = sim.url
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(config_file=str(kubeconfig),
                                                 persist_config=False)
        # Any: the client accepts plain dict bodies, which its stubs do not admit.
        self.core: Any = client.CoreV1Api(self.api)
        self.batch: Any = client.BatchV1Api(self.api)
        self.apps: Any = client.AppsV1Api(self.api)
        self.policy: Any = client.PolicyV1Api(self.api)

    def writes(self, resource: str | None = None) -> list[dict[str, Any]]:
        out = httpx.get(f"{self.url}/sim/v1/writes").json()["writes"]
        return [w for w in out if resource is None or w["resource"] == resource]

    def clear_writes(self) -> None:
        httpx.delete(f"{self.url}/sim/v1/writes").raise_for_status()

    def faults(self, *rules: dict[str, Any], seed: int = 1) -> None:
        httpx.put(f"{self.url}/sim/v1/faults",
                  json={"rules": list(rules), "seed": seed}).raise_for_status()

    def injected(self) -> Any:
        return httpx.get(f"{self.url}/sim/v1/faults").json()

    def clear_faults(self) -> None:
        httpx.delete(f"{self.url}/sim/v1/faults").raise_for_status()

    def node(self, name: str) -> Any:
        return self.core.read_node(name)

    def cordon(self, name: str, on: bool = True) -> None:
        self.core.patch_node(name, {"spec": {"unschedulable": True if on else None}})

    def pods_on(self, node: str) -> list[Any]:
        return list(self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}").items)

    def events(self, node: str, reason: str | None = None) -> list[Any]:
        items = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node}").items
        return [e for e in items if reason is None or e.reason == reason]


class ThreadedGpuSim:
    """The GPU simulator on its own loop in a thread (the cluster simulator's Jobs call it
    over HTTP while the test thread blocks in a sync activity)."""

    def __init__(self, scenario: str = "small", **switches: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="gpu-sim")
        self._thread.start()
        fut: Future[RunningSimulator] = asyncio.run_coroutine_threadsafe(
            start_gpu_simulator(scenario, "127.0.0.1", 0, **switches), self._loop)
        self.running = fut.result(30)
        self.url = self.running.url
        self.port = int(self.url.rsplit(":", 1)[1])
        self.client = GpuSimClient(self.url)

    def stop(self) -> None:
        self.client.close()
        asyncio.run_coroutine_threadsafe(self.running.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def gpu_sim() -> Iterator[ThreadedGpuSim]:
    sim = ThreadedGpuSim()
    yield sim
    sim.stop()


def _cluster(tmp_path: Path, **options: Any) -> Iterator[Cluster]:
    sim = ThreadedClusterSim(**{"scenario": "small", "job_seconds": 0.2,
                                "reboot_seconds": 0.5, **options})
    sim.start()
    k = Cluster(sim, sim.kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield k
    finally:
        k.api.close()
        sim.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from _cluster(tmp_path)


@pytest.fixture
def cluster_with_gpus(tmp_path: Path, gpu_sim: ThreadedGpuSim) -> Iterator[Cluster]:
    yield from _cluster(tmp_path, gpu_sim_url=gpu_sim.url)


@pytest.fixture
def env() -> ActivityEnvironment:
    return ActivityEnvironment()


class Heartbeats:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __call__(self, *details: Any) -> None:
        self.seen.append(details[0] if len(details) == 1 else details)


@pytest.fixture
def heartbeats(env: ActivityEnvironment) -> Heartbeats:
    hb = Heartbeats()
    env.on_heartbeat = hb
    return hb
