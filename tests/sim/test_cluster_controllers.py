"""The simulator's controllers: scheduler, kubelets, workload and Job controllers,
plus its own control endpoints (write log, API faults). Simulator only."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import urllib3
from aiohttp import web
from kubernetes import client

from sim.scenario import Scenario
from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

pytestmark = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")

SCENARIO = Scenario.model_validate({
    "name": "tiny",
    "pools": [{"name": "gpu", "nodes": 2, "gpus": 8, "labels": {"gpu-remediate.io/pool": "h"}}],
    "workloads": [
        {"name": "trainer", "namespace": "team-a", "replicas": 2, "gpus_per_pod": 8,
         "labels": {"app": "trainer"}, "pdb": {"min_available": 1},
         "termination_grace_seconds": 1, "readiness_delay_seconds": 0.2},
        {"name": "node-agent", "namespace": "kube-system", "kind": "DaemonSet",
         "labels": {"app": "node-agent"}, "readiness_delay_seconds": 0},
    ],
})


class GpuStub:
    """A stand-in for the GPU simulator's HTTP API, on its own loop and thread."""

    def __init__(self) -> None:
        self.unhealthy: dict[str, list[str]] = {}
        self.reset_error: str | None = None
        self.calls: list[tuple[str, str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    async def _health(self, request: web.Request) -> web.Response:
        node = request.match_info["node"]
        self.calls.append(("health", node, None))
        problems = self.unhealthy.get(node, [])
        return web.json_response({"node": node, "healthy": not problems, "problems": problems})

    async def _reset(self, request: web.Request) -> web.Response:
        self.calls.append(("reset", request.match_info["node"], await request.json()))
        if self.reset_error:
            return web.json_response({"error": self.reset_error}, status=409)
        return web.json_response({"ok": True})

    async def _reboot(self, request: web.Request) -> web.Response:
        self.calls.append(("reboot", request.match_info["node"], None))
        return web.json_response({"ok": True})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{node}/health", self._health)
        app.router.add_post("/api/v1/nodes/{node}/reset", self._reset)
        app.router.add_post("/api/v1/nodes/{node}/reboot", self._reboot)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture
def gpu() -> Iterator[GpuStub]:
    stub = GpuStub()
    stub.start()
    yield stub
    stub.stop()


@pytest.fixture
def k(tmp_path: Path, gpu: GpuStub) -> Iterator[Contract]:
    c = Contract.open(tmp_path, scenario=SCENARIO, gpu_sim_url=gpu.url, job_seconds=0.2,
                      reboot_seconds=0.6)
    yield c
    c.close()


def _trainers(k: Contract) -> list[Any]:
    return k.core.list_namespaced_pod("team-a", label_selector="app=trainer").items


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _all_trainers_ready(k: Contract) -> list[Any]:
    return wait_for(lambda: (p := _trainers(k)) and len(p) == 2 and all(map(_ready, p)) and p)


def _job(k: Contract, name: str, node: str, kind: str, **spec: Any) -> None:
    template_spec: dict[str, Any] = {
        "restartPolicy": "Never", "nodeName": node,
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "c", "image": "registry.sim.local/validate:1",
                        "env": [{"name": "GPU_INDEX", "value": "3"}]}],
    }
    k.batch.create_namespaced_job("default", {"metadata": {"name": name}, "spec": {
        "backoffLimit": 0, **spec,
        "template": {"metadata": {"labels": {"gpu-remediate.io/job": kind}},
                     "spec": template_spec}}})


def _finished(k: Contract, name: str, timeout: float = 10) -> dict[str, str]:
    def done() -> dict[str, str] | None:
        st = k.batch.read_namespaced_job_status(name, "default").status
        conds = {c.type: c.reason for c in st.conditions or [] if c.status == "True"}
        return conds if {"Complete", "Failed"} & conds.keys() else None

    return wait_for(done, timeout=timeout)


def test_scenario_nodes_have_gpu_capacity_labels_and_ready_condition(k: Contract) -> None:
    node = k.core.read_node("gpu-01")
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.metadata.labels["kubernetes.io/hostname"] == "gpu-01"
    assert node.metadata.labels["gpu-remediate.io/pool"] == "h"
    assert "node.kubernetes.io/instance-type" in node.metadata.labels
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True" and ready.last_heartbeat_time is not None
    assert not node.spec.unschedulable


def test_replicaset_pods_are_owned_bound_and_become_ready(k: Contract) -> None:
    pods = _all_trainers_ready(k)
    assert {p.spec.node_name for p in pods} == {"gpu-01", "gpu-02"}
    ref = pods[0].metadata.owner_references[0]
    assert (ref.kind, ref.api_version, ref.controller) == ("ReplicaSet", "apps/v1", True)
    assert pods[0].metadata.name.startswith("trainer-") and len(pods[0].metadata.name) == 13
    rs = k.apps.read_namespaced_replica_set("trainer", "team-a")
    assert rs.metadata.uid == ref.uid


def test_mirror_and_dcgm_exporter_pods_run_on_every_node(k: Contract) -> None:
    pods = k.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-01").items
    mirror = [p for p in pods if "kubernetes.io/config.mirror" in (p.metadata.annotations or {})]
    assert len(mirror) == 1 and mirror[0].metadata.owner_references[0].kind == "Node"
    exporters = wait_for(lambda: [p for p in k.core.list_namespaced_pod(
        "gpu-operator", label_selector="app=nvidia-dcgm-exporter").items
        if p.status.phase == "Running"])
    assert {p.spec.node_name for p in exporters} == {"gpu-01", "gpu-02"} or len(exporters) >= 1
    assert exporters[0].status.pod_ip == "127.0.0.1"
    assert exporters[0].spec.containers[0].ports[0].container_port == 9400


def test_cordon_adds_unschedulable_taint(k: Contract) -> None:
    k.core.patch_node("gpu-01", {"spec": {"unschedulable": True}})
    node = wait_for(lambda: (n := k.core.read_node("gpu-01")).spec.taints and n)
    assert [(t.key, t.effect) for t in node.spec.taints] == [
        ("node.kubernetes.io/unschedulable", "NoSchedule")]


def test_replacement_pod_stays_pending_while_node_cordoned(k: Contract) -> None:
    pods = _all_trainers_ready(k)
    victim = next(p for p in pods if p.spec.node_name == "gpu-01")
    k.core.patch_node("gpu-01", {"spec": {"unschedulable": True}})
    k.core.create_namespaced_pod_eviction(victim.metadata.name, "team-a", client.V1Eviction(
        metadata=client.V1ObjectMeta(name=victim.metadata.name, namespace="team-a")))
    wait_for(lambda: all(p.metadata.name != victim.metadata.name for p in _trainers(k)))
    time.sleep(0.3)
    pending = [p for p in _trainers(k) if not p.spec.node_name]
    assert len(pending) == 1 and pending[0].status.phase == "Pending"
    cond = next(c for c in pending[0].status.conditions if c.type == "PodScheduled")
    assert cond.reason == "Unschedulable" and "were unschedulable" in cond.message
    k.core.patch_node("gpu-01", {"spec": {"unschedulable": False}})
    wait_for(lambda: all(p.spec.node_name for p in _trainers(k)))


def test_pod_disappears_after_grace_period(k: Contract) -> None:
    pod = _all_trainers_ready(k)[0]
    start = time.monotonic()
    k.core.delete_namespaced_pod(pod.metadata.name, "team-a")
    assert k.core.read_namespaced_pod(pod.metadata.name, "team-a").metadata.deletion_timestamp
    wait_for(lambda: pod.metadata.name not in {p.metadata.name for p in _trainers(k)})
    assert time.monotonic() - start >= 0.8


def test_validation_job_succeeds_when_gpu_healthy(k: Contract, gpu: GpuStub) -> None:
    _job(k, "validate-ok", "gpu-01", "validate")
    assert "Complete" in _finished(k, "validate-ok")
    job = k.batch.read_namespaced_job_status("validate-ok", "default")
    assert job.status.succeeded == 1 and job.status.completion_time is not None
    assert ("health", "gpu-01", None) in gpu.calls


def test_validation_job_fails_when_gpu_unhealthy(k: Contract, gpu: GpuStub) -> None:
    gpu.unhealthy["gpu-02"] = ["GPU 3: XID 79 (fallen off the bus)"]
    _job(k, "validate-bad", "gpu-02", "validate", backoffLimit=1)
    assert _finished(k, "validate-bad")["Failed"] == "BackoffLimitExceeded"
    pods = k.core.list_namespaced_pod("default", label_selector="job-name=validate-bad").items
    assert len(pods) == 2 and all(p.status.phase == "Failed" for p in pods)
    term = pods[0].status.container_statuses[0].state.terminated
    assert term.exit_code == 1 and "XID 79" in term.message


def _clear_gpus(k: Contract, node: str) -> None:
    """What a reset needs first: no operand and no GPU pod left holding the node's GPUs."""
    k.core.patch_node(node, {"metadata": {"labels": {
        f"nvidia.com/gpu.deploy.{o}": "false"
        for o in ("device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery",
                  "operator-validator")}}})
    k.apps.patch_namespaced_replica_set("trainer", "team-a", {"spec": {"replicas": 0}})
    wait_for(lambda: not [
        p for p in k.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        if p.status.phase == "Running" and (
            p.metadata.namespace == "gpu-operator" or p.metadata.namespace == "team-a")])


def test_gpu_reset_job_fails_when_gpu_sim_refuses(k: Contract, gpu: GpuStub) -> None:
    gpu.reset_error = "GPU 3 is in use by a process"
    _clear_gpus(k, "gpu-01")
    _job(k, "reset", "gpu-01", "gpu-reset")
    assert "Failed" in _finished(k, "reset")
    assert ("reset", "gpu-01", {"gpu": "3"}) in gpu.calls


def test_reboot_job_makes_node_not_ready_then_ready(k: Contract, gpu: GpuStub) -> None:
    """The reboot kills the node's pods, its own included, and the node comes back with a
    new boot ID (tests/sim/test_cluster_machines.py covers both orders and the rest)."""
    _all_trainers_ready(k)
    before = k.core.read_node("gpu-02").status.node_info.boot_id

    def ready_status() -> str:
        node = k.core.read_node("gpu-02")
        return next(c.status for c in node.status.conditions if c.type == "Ready")

    _job(k, "reboot", "gpu-02", "reboot")
    wait_for(lambda: ready_status() == "False")
    node = k.core.read_node("gpu-02")
    assert next(c.reason for c in node.status.conditions if c.type == "Ready") == \
        "KubeletNotReady"
    # The default seed's first draw: the shutdown kills the Job's pod before it returns.
    assert _finished(k, "reboot")["Failed"] == "BackoffLimitExceeded"
    wait_for(lambda: ready_status() == "True")
    assert k.core.read_node("gpu-02").status.node_info.boot_id != before
    assert ("reboot", "gpu-02", None) in gpu.calls
    failed = [p for p in _trainers(k) if p.status.phase == "Failed"]
    assert failed and failed[0].status.reason == "Terminated"


def test_job_active_deadline_exceeded(k: Contract) -> None:
    _job(k, "slow", "gpu-01", "other", activeDeadlineSeconds=0)
    assert _finished(k, "slow")["Failed"] == "DeadlineExceeded"


def test_job_ttl_deletes_finished_job(k: Contract) -> None:
    _job(k, "short-lived", "gpu-01", "other", ttlSecondsAfterFinished=0)

    def gone() -> bool:
        try:
            k.batch.read_namespaced_job("short-lived", "default")
        except client.ApiException as err:
            return err.status == 404
        return False

    wait_for(gone)


def test_job_delete_background_removes_its_pods(k: Contract) -> None:
    _job(k, "bg", "gpu-01", "other")
    _finished(k, "bg")
    k.batch.delete_namespaced_job("bg", "default", propagation_policy="Background")
    wait_for(lambda: not k.core.list_namespaced_pod("default", label_selector="job-name=bg").items)


def test_job_delete_without_policy_orphans_its_pods(k: Contract) -> None:
    _job(k, "orphan", "gpu-01", "other")
    _finished(k, "orphan")
    k.batch.delete_namespaced_job("orphan", "default")
    time.sleep(0.2)
    pods = k.core.list_namespaced_pod("default", label_selector="job-name=orphan").items
    assert len(pods) == 1 and not pods[0].metadata.owner_references


def test_pinned_job_pod_is_rejected_when_node_gpus_are_taken(k: Contract) -> None:
    _all_trainers_ready(k)
    k.batch.create_namespaced_job("default", {"metadata": {"name": "greedy"}, "spec": {
        "backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "nodeName": "gpu-01",
            "containers": [{"name": "c", "image": "x",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})
    assert "Failed" in _finished(k, "greedy")
    pod = k.core.list_namespaced_pod("default", label_selector="job-name=greedy").items[0]
    assert pod.status.reason == "OutOfnvidia.com/gpu"


def test_reads_leave_the_write_log_empty(k: Contract) -> None:
    k.clear_writes()
    k.core.list_node()
    k.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-01")
    k.policy.list_pod_disruption_budget_for_all_namespaces()
    assert k.writes() == []


def test_write_log_records_every_mutating_request(k: Contract) -> None:
    k.clear_writes()
    k.core.patch_node("gpu-01", {"spec": {"unschedulable": True}})
    with pytest.raises(client.ApiException):
        k.core.read_node("nope")
    with pytest.raises(client.ApiException):
        k.core.patch_node("nope", {"spec": {}})
    writes = k.writes()
    assert [(w["verb"], w["resource"], w["name"], w["code"]) for w in writes] == [
        ("patch", "nodes", "gpu-01", 200), ("patch", "nodes", "nope", 404)]
    assert "strategic-merge-patch" in writes[0]["summary"]


def test_fault_429_carries_retry_after(k: Contract) -> None:
    k.set_faults([{"verb": "patch", "resource": "nodes", "status": 429, "retry_after": 2}])
    with pytest.raises(client.ApiException) as err:
        k.core.patch_node("gpu-01", {"metadata": {"labels": {"a": "b"}}})
    assert err.value.status == 429
    assert err.value.headers["Retry-After"] == "2"
    k.clear_faults()
    k.core.patch_node("gpu-01", {"metadata": {"labels": {"a": "b"}}})


def test_fault_times_limits_injection(k: Contract) -> None:
    # 500, not 503: urllib3 itself retries a GET answered 503/429 with Retry-After.
    k.set_faults([{"verb": "get", "resource": "nodes", "status": 500, "times": 1}])
    with pytest.raises(client.ApiException) as err:
        k.core.read_node("gpu-01")
    assert err.value.status == 500
    assert k.core.read_node("gpu-01").metadata.name == "gpu-01"


def test_fault_rate_is_seeded_and_reproducible(k: Contract) -> None:
    def run() -> list[int]:
        k.set_faults([{"verb": "list", "resource": "nodes", "status": 500, "rate": 0.5}], seed=7)
        codes = []
        for _ in range(12):
            try:
                k.core.list_node()
                codes.append(200)
            except client.ApiException as err:
                codes.append(err.status)
        return codes

    first = run()
    assert first == run() and {200, 500} == set(first)


def test_fault_drop_closes_the_connection(k: Contract) -> None:
    k.set_faults([{"verb": "create", "resource": "pods/eviction", "drop": True}])
    with pytest.raises((urllib3.exceptions.HTTPError, httpx.HTTPError, ConnectionError)):
        k.core.create_namespaced_pod_eviction("x", "team-a", client.V1Eviction(
            metadata=client.V1ObjectMeta(name="x", namespace="team-a")))
