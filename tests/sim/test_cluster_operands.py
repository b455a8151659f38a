"""The GPU Operator's operands on the simulated nodes, and what they do to repairs:
DaemonSets switched per node by `nvidia.com/gpu.deploy.*` labels, operands holding the
GPUs so `nvidia-smi -r` refuses, the device plugin driving allocatable and keeping an
XID'd GPU unhealthy until it restarts, dcgmi needing a host engine, and pods/log.
Simulator only (docs/simulators-cluster.md)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from typer.testing import CliRunner

from sim.cluster.cli import cluster_app
from sim.cluster.machines import NodeTiming
from sim.gpu.server import RunningSimulator, start_gpu_simulator
from sim.scenario import Scenario
from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

pytestmark = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")

NODE = "gpu-01"
OPERANDS = {
    "nvidia-device-plugin-daemonset": "device-plugin",
    "nvidia-dcgm": "dcgm",
    "nvidia-dcgm-exporter": "dcgm-exporter",
    "gpu-feature-discovery": "gpu-feature-discovery",
}
HOLDERS = {"nvidia-device-plugin-daemonset", "nvidia-dcgm", "nvidia-dcgm-exporter"}
SCENARIO = Scenario.model_validate({
    "name": "operands",
    "pools": [{"name": "gpu", "nodes": 2, "gpus": 8}],
    "workloads": [
        {"name": "node-agent", "namespace": "kube-system", "kind": "DaemonSet",
         "labels": {"app": "node-agent"}, "readiness_delay_seconds": 0},
    ],
})
TIMING = NodeTiming(reboot_seconds=0.6, shutdown_seconds=0.2, device_plugin_seconds=0.3,
                    status_grace_seconds=1.0, reregister_seconds=0.3, operand_seconds=0.2,
                    plugin_health_seconds=0.2, seed=4)
HOST_ENGINE = ["/bin/sh", "-c",
               "nv-hostengine --service-account nvidia-dcgm -b ALL && dcgmi diag -r {level} -j"]


class GpuSim:
    """The real GPU simulator (same scenario, so the same node names) on its own thread."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.sim: RunningSimulator = asyncio.run_coroutine_threadsafe(
            start_gpu_simulator(SCENARIO), self._loop).result(10)
        self.url = self.sim.url

    def inject(self, node: str, gpu: int, kind: str, value: int | None = None) -> None:
        body: dict[str, Any] = {"kind": kind}
        if value is not None:
            body["value"] = value
        httpx.post(f"{self.url}/api/v1/nodes/{node}/gpus/{gpu}/faults",
                   json=body).raise_for_status()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.sim.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture
def gpu() -> Iterator[GpuSim]:
    sim = GpuSim()
    yield sim
    sim.stop()


@pytest.fixture
def k(tmp_path: Path, gpu: GpuSim) -> Iterator[Contract]:
    c = Contract.open(tmp_path, scenario=SCENARIO, gpu_sim_url=gpu.url, job_seconds=0.1,
                      node_timing=TIMING)
    yield c
    c.close()


# -- helpers ----------------------------------------------------------------------------


def four_operands(k: Contract, node: str = NODE) -> dict[str, Any]:
    """The node's four operand pods, once all run Ready."""
    def check() -> dict[str, Any] | None:
        pods = operand_pods(k, node)
        return pods if len(pods) == 4 else None

    return wait_for(check)


def operand_pods(k: Contract, node: str = NODE, running: bool = True) -> dict[str, Any]:
    pods = k.core.list_namespaced_pod(
        "gpu-operator", field_selector=f"spec.nodeName={node}").items
    # The four operands a reset turns off (the validator is checked on its own).
    return {p.metadata.labels["app"]: p for p in pods
            if p.metadata.labels["app"] in OPERANDS
            and (not running or (p.status.phase == "Running" and any(
                c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])))}


def set_operands(k: Contract, value: str, node: str = NODE, only: list[str] | None = None
                 ) -> None:
    k.core.patch_node(node, {"metadata": {"labels": {
        f"nvidia.com/gpu.deploy.{OPERANDS[o]}": value for o in (only or list(OPERANDS))}}})


def allocatable(k: Contract, node: str = NODE) -> str:
    raw = json.loads(k.core.read_node(node, _preload_content=False).data)
    return str(raw["status"]["allocatable"]["nvidia.com/gpu"])


def job(k: Contract, name: str, kind: str, node: str = NODE, command: list[str] | None = None,
        gpu_index: str | None = None, **container: Any) -> None:
    c: dict[str, Any] = {"name": "c", "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1",
                         **container}
    if command:
        c["command"] = command
    if gpu_index is not None:
        c["env"] = [{"name": "GPU_INDEX", "value": gpu_index}]
    k.batch.create_namespaced_job("default", {"metadata": {"name": name}, "spec": {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {"gpu-remediate.io/job": kind}}, "spec": {
            "restartPolicy": "Never", "nodeName": node,
            "tolerations": [{"operator": "Exists"}], "containers": [c]}}}})


def finished(k: Contract, name: str) -> Any:
    """The Job's pod once it ended."""
    def done() -> Any:
        pods = k.core.list_namespaced_pod("default", label_selector=f"job-name={name}").items
        return pods and pods[0].status.phase in ("Succeeded", "Failed") and pods[0]

    return wait_for(done)


def gpu_pod(k: Contract, name: str, node: str = NODE, gpus: int = 8) -> None:
    k.core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {
        "nodeName": node, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "trainer", "resources": {
            "limits": {"nvidia.com/gpu": str(gpus)}}}]}})


def body(err: pytest.ExceptionInfo[client.ApiException]) -> str:
    return str(err.value.body)


def log(k: Contract, pod: Any, **kw: Any) -> str:
    return str(k.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, **kw))


def diag(text: str) -> dict[str, Any]:
    """The JSON after nv-hostengine's one line."""
    first, _, rest = text.partition("\n")
    assert first == "Started host engine version 4.2.3 using port number: 5555"
    return dict(json.loads(rest))["DCGM Diagnostic"]


def by_test(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for c in report["test_categories"] for t in c["tests"]}


# -- operands ---------------------------------------------------------------------------


def test_every_node_is_labelled_and_runs_the_operands(k: Contract) -> None:
    for node in ("gpu-01", "gpu-02"):
        labels = k.core.read_node(node).metadata.labels
        assert {f"nvidia.com/gpu.deploy.{o}" for o in OPERANDS.values()} <= {
            key for key, value in labels.items() if value == "true"}
        pods = four_operands(k, node)
        for app, pod in pods.items():
            holds = (pod.metadata.annotations or {}).get("sim.gpu-remediate.io/holds-gpus")
            assert holds == ("true" if app in HOLDERS else None), app
            assert pod.spec.termination_grace_period_seconds == 1
    for name, deploy in OPERANDS.items():
        ds = k.apps.read_namespaced_daemon_set(name, "gpu-operator")
        assert ds.spec.template.spec.node_selector == {f"nvidia.com/gpu.deploy.{deploy}": "true"}
        assert ds.spec.template.metadata.labels == {"app": name}
    exporter = operand_pods(k)["nvidia-dcgm-exporter"]
    assert exporter.status.pod_ip == "127.0.0.1"
    assert exporter.spec.containers[0].ports[0].container_port == 9400


def test_operand_pods_go_gracefully_when_labelled_off_and_come_back_when_on(
        k: Contract) -> None:
    before = four_operands(k)
    set_operands(k, "false", only=["nvidia-dcgm", "nvidia-dcgm-exporter"])
    dcgm = wait_for(lambda: (p := k.core.read_namespaced_pod(
        before["nvidia-dcgm"].metadata.name, "gpu-operator")).metadata.deletion_timestamp and p)
    assert dcgm.metadata.deletion_grace_period_seconds == 1, "deleted with the pod's grace"
    wait_for(lambda: set(operand_pods(k, running=False)) ==
             {"nvidia-device-plugin-daemonset", "gpu-feature-discovery"})
    # The other node and the other operands are untouched.
    assert len(operand_pods(k, "gpu-02")) == 4
    assert operand_pods(k)["nvidia-device-plugin-daemonset"].metadata.uid == \
        before["nvidia-device-plugin-daemonset"].metadata.uid
    set_operands(k, "true", only=["nvidia-dcgm", "nvidia-dcgm-exporter"])
    back = four_operands(k)
    assert back["nvidia-dcgm"].metadata.uid != before["nvidia-dcgm"].metadata.uid


def test_a_replaced_node_is_labelled_again_and_gets_its_operands(k: Contract) -> None:
    set_operands(k, "false")
    assert httpx.post(f"{k.sim_url()}/sim/v1/nodes/{NODE}/replace").status_code == 200

    def labelled() -> bool:
        try:
            labels = k.core.read_node(NODE).metadata.labels
        except client.ApiException:
            return False
        return all(labels.get(f"nvidia.com/gpu.deploy.{o}") == "true" for o in OPERANDS.values())

    wait_for(labelled)
    wait_for(lambda: len(operand_pods(k)) == 4)
    wait_for(lambda: allocatable(k) == "8")


def test_a_replaced_node_registers_with_a_fresh_exporter_that_remembers_no_xid(
        k: Contract, gpu: GpuSim) -> None:
    """The old machine's dcgm-exporter remembers its last XID after the fault is gone; the
    machine that registers under the same name is new, so nothing read under the new Node
    may carry it: the GPU simulator is told before the Node object appears."""
    gpu.inject(NODE, 2, "xid", 79)
    httpx.delete(f"{gpu.url}/api/v1/nodes/{NODE}/faults").raise_for_status()

    def last_xids() -> list[object]:
        gpus: list[dict[str, object]] = gpu.sim.fleet.node_json(NODE)["gpus"]  # type: ignore[assignment]
        return [g["last_xid"] for g in gpus]

    assert last_xids()[2] == 79, "a cleared fault leaves the exporter's remembered XID"
    old_uid = k.core.read_node(NODE).metadata.uid
    assert httpx.post(f"{k.sim_url()}/sim/v1/nodes/{NODE}/replace").status_code == 200

    def new_node() -> Any:
        try:
            n = k.core.read_node(NODE)
        except client.ApiException:
            return None
        return n if n.metadata.uid != old_uid else None

    wait_for(new_node)
    assert last_xids() == [None] * 8


# -- gpu reset --------------------------------------------------------------------------


def test_gpu_reset_fails_while_operands_or_gpu_pods_hold_the_gpus(
        k: Contract, gpu: GpuSim) -> None:
    gpu.inject(NODE, 3, "ecc-dbe", 1)
    wait_for(lambda: len(operand_pods(k)) == 4)
    gpu_pod(k, "trainer")  # admitted while the device plugin serves the GPUs
    wait_for(lambda: k.core.read_namespaced_pod("trainer", "default").status.phase == "Running")
    job(k, "reset-1", "gpu-reset", gpu_index="3")
    pod = finished(k, "reset-1")
    term = pod.status.container_statuses[0].state.terminated
    assert pod.status.phase == "Failed" and term.exit_code != 0
    assert term.message.startswith(
        "Unable to reset GPU 3 because it's being used by some other process")
    for app in HOLDERS:
        assert f"gpu-operator/{app}-" in term.message, app
    assert "gpu-feature-discovery" not in term.message
    assert "Unable to reset GPU 3" in log(k, pod)
    assert not gpu.sim.fleet.health(NODE).healthy, "the refused reset reset nothing"

    set_operands(k, "false")
    wait_for(lambda: not operand_pods(k, running=False))
    job(k, "reset-2", "gpu-reset", gpu_index="3")
    term = finished(k, "reset-2").status.container_statuses[0].state.terminated
    assert term.exit_code != 0 and "default/trainer" in term.message
    assert "gpu-operator" not in term.message

    k.core.delete_namespaced_pod("trainer", "default")

    def trainer_gone() -> bool:
        try:
            k.core.read_namespaced_pod("trainer", "default")
        except client.ApiException as e:
            return e.status == 404
        return False

    wait_for(trainer_gone)  # a terminating pod holds the GPUs until it is killed
    # Nothing else holds GPU 3 now, but nvidia-persistenced does: a bare reset is refused.
    job(k, "reset-3", "gpu-reset", gpu_index="3", command=["nvidia-smi", "-r", "-i", "3"])
    term = finished(k, "reset-3").status.container_statuses[0].state.terminated
    assert term.exit_code != 0 and "persistence mode is Enabled" in term.message
    assert not gpu.sim.fleet.health(NODE).healthy
    job(k, "reset-4", "gpu-reset", gpu_index="3", command=[
        "sh", "-c", 'nvidia-smi -i "$U" -pm 0 && nvidia-smi -i "$U" -r; nvidia-smi -i "$U" -pm 1'])
    pod = finished(k, "reset-4")
    assert pod.status.phase == "Succeeded", pod.status.container_statuses[0].state
    assert gpu.sim.fleet.health(NODE).healthy
    assert all(g.persistence_mode for g in gpu.sim.fleet.node(NODE).gpus), "restored as found"


def test_reset_turns_persistence_off_for_its_targets_only_and_back_on_only_where_it_was(
        k: Contract, gpu: GpuSim) -> None:
    set_operands(k, "false")
    wait_for(lambda: not operand_pods(k, running=False))
    fleet = gpu.sim.fleet
    gpu.inject(NODE, 2, "ecc-dbe", 1)
    fleet.set_persistence(NODE, 5, False)  # an admin turned it off on GPU 5 before
    u2, u5 = fleet.gpu(NODE, 2).uuid, fleet.gpu(NODE, 5).uuid
    seen: list[list[bool]] = []
    original = fleet.reset

    def spy(node: str, gpu_id: int | str | None = None) -> Any:
        seen.append([g.persistence_mode for g in fleet.node(node).gpus])
        return original(node, gpu_id)

    fleet.reset = spy  # type: ignore[method-assign]
    job(k, "by-uuid", "gpu-reset", command=["sh", "-c", "-pm 0 ... -r ... -pm 1"],
        env=[{"name": "GPU_UUIDS", "value": f"{u2},{u5}"}])
    pod = finished(k, "by-uuid")
    assert pod.status.phase == "Succeeded", pod.status.container_statuses[0].state
    assert seen and all(not s[2] and not s[5] for s in seen)
    assert all(s[i] for s in seen for i in range(8) if i not in (2, 5)), "others left on"
    modes = [g.persistence_mode for g in fleet.node(NODE).gpus]
    assert modes == [True, True, True, True, True, False, True, True]
    assert fleet.health(NODE).healthy
    job(k, "bad-uuid", "gpu-reset", command=["sh", "-c", "-pm 0 -r"],
        env=[{"name": "GPU_UUIDS", "value": "GPU-00000000-dead"}])
    term = finished(k, "bad-uuid").status.container_statuses[0].state.terminated
    assert term.exit_code == 6 and "GPU-00000000-dead" in term.message


# -- device plugin ----------------------------------------------------------------------


def test_allocatable_is_zero_without_the_device_plugin_and_returns_after_it_registers(
        k: Contract) -> None:
    assert allocatable(k) == "8"
    set_operands(k, "false", only=["nvidia-device-plugin-daemonset"])
    # Told to stop: the plugin's GPUs are gone at once, before its pod is.
    wait_for(lambda: allocatable(k) == "0")
    assert k.core.read_node(NODE).status.capacity["nvidia.com/gpu"] == "8"
    wait_for(lambda: "nvidia-device-plugin-daemonset" not in operand_pods(k, running=False))
    machines = httpx.get(f"{k.sim_url()}/sim/v1/nodes").json()["nodes"]
    assert machines[NODE]["state"] == "up (no device plugin)"
    gpu_pod(k, "too-early")
    rejected = wait_for(lambda: (p := k.core.read_namespaced_pod("too-early", "default"))
                        .status.phase == "Failed" and p)
    assert rejected.status.reason == "OutOfnvidia.com/gpu"
    set_operands(k, "true", only=["nvidia-device-plugin-daemonset"])
    wait_for(lambda: "nvidia-device-plugin-daemonset" in operand_pods(k))
    assert allocatable(k) == "0", "the plugin registers device_plugin_seconds after it runs"
    wait_for(lambda: allocatable(k) == "8")


def test_a_critical_xid_keeps_the_gpu_unhealthy_in_the_plugin_until_it_restarts(
        k: Contract, gpu: GpuSim) -> None:
    wait_for(lambda: len(operand_pods(k)) == 4)
    gpu.inject(NODE, 5, "xid", 13)  # the application's fault: on the plugin's skip list
    gpu.inject(NODE, 3, "xid", 48)
    wait_for(lambda: allocatable(k) == "7")
    assert k.core.read_node(NODE).status.capacity["nvidia.com/gpu"] == "8"
    machines = httpx.get(f"{k.sim_url()}/sim/v1/nodes").json()["nodes"]
    assert machines[NODE]["device_plugin_unhealthy_gpus"] == [3]
    # A reset that reached the GPU (here straight through the GPU simulator) clears the
    # XID, but the running plugin keeps the GPU unhealthy: allocatable < capacity.
    httpx.post(f"{gpu.url}/api/v1/nodes/{NODE}/persistence",
               json={"gpu": 3, "enabled": False}).raise_for_status()
    httpx.post(f"{gpu.url}/api/v1/nodes/{NODE}/reset", json={"gpu": 3}).raise_for_status()
    assert gpu.sim.fleet.health(NODE).healthy
    time.sleep(4 * TIMING.plugin_health_seconds)
    assert allocatable(k) == "7"
    # The plugin restarts (its pod deleted and recreated): every GPU healthy again.
    plugin = operand_pods(k)["nvidia-device-plugin-daemonset"]
    k.core.delete_namespaced_pod(plugin.metadata.name, "gpu-operator")
    wait_for(lambda: allocatable(k) == "0")
    wait_for(lambda: allocatable(k) == "8")
    assert operand_pods(k)["nvidia-device-plugin-daemonset"].metadata.uid != plugin.metadata.uid


def test_a_reboot_restarts_the_plugin_and_clears_its_unhealthy_gpus(
        k: Contract, gpu: GpuSim) -> None:
    wait_for(lambda: len(operand_pods(k)) == 4)
    gpu.inject(NODE, 2, "xid", 94)
    wait_for(lambda: allocatable(k) == "7")
    job(k, "reboot", "reboot")
    wait_for(lambda: allocatable(k) == "0")
    wait_for(lambda: allocatable(k) == "8", timeout=15)


def test_nodes_without_a_machine_keep_their_allocatable(k: Contract) -> None:
    name = k.node(gpus=4)
    time.sleep(0.5)
    assert allocatable(k, name) == "4"


# -- validation -------------------------------------------------------------------------


def test_dcgmi_without_a_host_engine_fails_like_dcgmi(k: Contract) -> None:
    job(k, "validate-bare", "validate", command=["dcgmi", "diag", "-r", "2", "-j"])
    pod = finished(k, "validate-bare")
    term = pod.status.container_statuses[0].state.terminated
    assert pod.status.phase == "Failed" and term.exit_code != 0
    assert log(k, pod) == (
        "Error: unable to establish a connection to the specified host: localhost\n"
        "Error: Unable to connect to host engine. Host engine connection "
        "invalid/disconnected.\n")
    assert not term.message, "dcgmi writes no termination log (policy File)"
    # Started after dcgmi is too late; FallbackToLogsOnError shows the output.
    job(k, "validate-late", "validate", command=["/bin/sh", "-c",
        "dcgmi diag -r 1 -j; nv-hostengine"], terminationMessagePolicy="FallbackToLogsOnError")
    term = finished(k, "validate-late").status.container_statuses[0].state.terminated
    assert term.exit_code != 0 and "Unable to connect to host engine" in term.message


def no_host_engine(k: Contract) -> None:
    """Neither the standalone dcgm operand nor dcgm-exporter (its embedded engine) on the
    node: a Job may start the only host engine."""
    set_operands(k, "false", only=["nvidia-dcgm", "nvidia-dcgm-exporter"])
    wait_for(lambda: not {"nvidia-dcgm", "nvidia-dcgm-exporter"}
             & set(operand_pods(k, running=False)), timeout=15)


def test_dcgmi_with_an_embedded_host_engine_prints_the_diag_json(
        k: Contract, gpu: GpuSim) -> None:
    no_host_engine(k)
    job(k, "validate-ok", "validate", command=[*HOST_ENGINE[:2], HOST_ENGINE[2].format(level=2)])
    pod = finished(k, "validate-ok")
    assert pod.status.phase == "Succeeded"
    report = diag(log(k, pod))
    assert [c["category"] for c in report["test_categories"]] == [
        "Deployment", "Hardware", "Integration"]
    tests = by_test(report)
    assert set(tests) == {"software", "memory", "pcie"}
    assert all(t["test_summary"]["status"] == "Pass" for t in tests.values())
    assert [r["entity_id"] for r in tests["memory"]["results"]] == list(range(8))
    assert report["metadata"]["version"] == "4.2.3"

    gpu.inject(NODE, 1, "ecc-dbe", 2)
    job(k, "validate-bad", "validate", command=[*HOST_ENGINE[:2],
                                                 HOST_ENGINE[2].format(level=2)])
    pod = finished(k, "validate-bad")
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code != 0
    tests = by_test(diag(log(k, pod)))
    assert tests["memory"]["test_summary"]["status"] == "Fail"
    bad = [r for r in tests["memory"]["results"] if r["status"] == "Fail"]
    assert [r["entity_id"] for r in bad] == [1]
    warning = bad[0]["warnings"][0]
    assert {"error_category", "error_id", "error_severity", "warning"} <= set(warning)
    assert "ecc-dbe" in warning["warning"]
    assert tests["pcie"]["test_summary"]["status"] == "Pass"

    # Level 1 (Deployment only) does not exercise memory; level 3 adds the Stress tests.
    job(k, "validate-r1", "validate", command=[*HOST_ENGINE[:2], HOST_ENGINE[2].format(level=1)])
    pod = finished(k, "validate-r1")
    assert pod.status.phase == "Succeeded"
    assert [c["category"] for c in diag(log(k, pod))["test_categories"]] == ["Deployment"]
    job(k, "validate-r3", "validate", command=[*HOST_ENGINE[:2], HOST_ENGINE[2].format(level=3)])
    tests = by_test(diag(log(k, finished(k, "validate-r3"))))
    assert {"targeted_stress", "targeted_power", "memory_bandwidth", "diagnostic"} <= set(tests)


def test_dcgmi_host_reaches_the_nodes_host_engine_only_while_nvidia_dcgm_runs(
        k: Contract) -> None:
    wait_for(lambda: "nvidia-dcgm" in operand_pods(k))
    job(k, "validate-host", "validate",
        command=["dcgmi", "diag", "-r", "1", "-j", "--host", "10.0.0.2"])
    pod = finished(k, "validate-host")
    assert pod.status.phase == "Succeeded"
    assert json.loads(log(k, pod))["DCGM Diagnostic"]["test_categories"]
    set_operands(k, "false", only=["nvidia-dcgm"])
    wait_for(lambda: "nvidia-dcgm" not in operand_pods(k, running=False))
    job(k, "validate-host-2", "validate",
        command=["dcgmi", "diag", "-r", "1", "-j", "--host", "10.0.0.2"])
    pod = finished(k, "validate-host-2")
    assert pod.status.phase == "Failed"
    assert "connection to the specified host: 10.0.0.2" in log(k, pod)


def test_a_second_host_engine_beside_the_nodes_fails_as_dcgm_does(k: Contract) -> None:
    """One host engine per node: beside the standalone operand's, then beside the one
    dcgm-exporter embeds, a Job's own nv-hostengine fails and its diagnostic never runs."""
    wait_for(lambda: {"nvidia-dcgm", "nvidia-dcgm-exporter"} <= set(operand_pods(k)))
    own = [*HOST_ENGINE[:2], HOST_ENGINE[2].format(level=1)]
    job(k, "second-1", "validate", command=own)
    pod = finished(k, "second-1")
    assert pod.status.phase == "Failed"
    assert "the standalone nvidia-dcgm operand" in log(k, pod)
    assert "DCGM Diagnostic" not in log(k, pod)
    set_operands(k, "false", only=["nvidia-dcgm"])
    wait_for(lambda: "nvidia-dcgm" not in operand_pods(k, running=False), timeout=15)
    job(k, "second-2", "validate", command=own)
    pod = finished(k, "second-2")
    assert pod.status.phase == "Failed"
    assert "gpu-operator/nvidia-dcgm-exporter-" in log(k, pod) and "(embedded)" in log(k, pod)


def test_a_case_on_the_environment_runs_the_branch_it_selects(k: Contract) -> None:
    script = ('case "${ENGINE:-}" in standalone) exec dcgmi diag -r 1 -j --host "$NODE_IP" ;; '
              'embedded) nv-hostengine && exec dcgmi diag -r 1 -j ;; '
              '*) echo none; exit 3 ;; esac')
    wait_for(lambda: "nvidia-dcgm" in operand_pods(k))
    job(k, "case-standalone", "validate", command=["/bin/sh", "-c", script],
        env=[{"name": "ENGINE", "value": "standalone"}])
    assert finished(k, "case-standalone").status.phase == "Succeeded"
    job(k, "case-none", "validate", command=["/bin/sh", "-c", script])
    pod = finished(k, "case-none")
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    no_host_engine(k)
    job(k, "case-embedded", "validate", command=["/bin/sh", "-c", script],
        env=[{"name": "ENGINE", "value": "embedded"}])
    assert finished(k, "case-embedded").status.phase == "Succeeded"


def test_validation_without_dcgmi_keeps_the_health_verdict(k: Contract, gpu: GpuSim) -> None:
    gpu.inject(NODE, 0, "xid", 79)
    job(k, "validate-plain", "validate")
    pod = finished(k, "validate-plain")
    assert pod.status.phase == "Failed"
    assert "XID 79" in pod.status.container_statuses[0].state.terminated.message


# -- pods/log ---------------------------------------------------------------------------


def test_pod_logs_through_the_kubernetes_client(k: Contract) -> None:
    no_host_engine(k)
    job(k, "logged", "validate", command=[*HOST_ENGINE[:2], HOST_ENGINE[2].format(level=1)])
    pod = finished(k, "logged")
    full = log(k, pod)
    assert full.count("\n") > 5
    assert log(k, pod, tail_lines=2) == "".join(full.splitlines(keepends=True)[-2:])
    assert log(k, pod, limit_bytes=20) == full[:20]
    assert log(k, pod, container="c") == full

    with pytest.raises(client.ApiException) as err:
        log(k, pod, container="nope")
    assert err.value.status == 400 and "container nope is not valid" in body(err)
    with pytest.raises(client.ApiException) as err:
        k.core.read_namespaced_pod_log("no-such-pod", "default")
    assert err.value.status == 404

    # Two containers: the name is required. Not started yet: waiting to start.
    k.core.create_namespaced_pod("default", {"metadata": {"name": "two"}, "spec": {
        "nodeName": "gpu-02", "containers": [{"name": "a", "image": "x"},
                                              {"name": "b", "image": "x"}]}})
    wait_for(lambda: k.core.read_namespaced_pod("two", "default").status.phase == "Running")
    with pytest.raises(client.ApiException) as err:
        k.core.read_namespaced_pod_log("two", "default")
    assert err.value.status == 400 and "choose one of: [a b]" in body(err)
    assert k.core.read_namespaced_pod_log("two", "default", container="b") == ""
    httpx.post(f"{k.sim_url()}/sim/v1/nodes/gpu-02/wedge").raise_for_status()
    k.core.create_namespaced_pod("default", {"metadata": {"name": "stuck"}, "spec": {
        "nodeName": "gpu-02", "containers": [{"name": "main", "image": "x"}]}})
    with pytest.raises(client.ApiException) as err:
        k.core.read_namespaced_pod_log("stuck", "default")
    assert err.value.status == 400
    assert json.loads(body(err))["message"] == (
        'container "main" in pod "stuck" is waiting to start: ContainerCreating')

    resources = httpx.get(f"{k.sim_url()}/api/v1").json()["resources"]
    entry = next(r for r in resources if r["name"] == "pods/log")
    assert entry["verbs"] == ["get"] and entry["kind"] == "Pod"


def test_serve_offers_the_operand_timings() -> None:
    result = CliRunner().invoke(cluster_app, ["serve", "--help"])
    assert "--operand-seconds" in result.output and "--plugin-health-seconds" in result.output


def test_operands_tolerate_the_gpu_taint_only_and_a_no_schedule_taint_stops_only_new_pods(
        k: Contract) -> None:
    """As the GPU Operator ships them (daemonsets.tolerations: nvidia.com/gpu) and as the
    DaemonSet controller treats taints: running operand pods stay under a NoSchedule taint
    they do not tolerate, but one turned off and on cannot start again until it goes."""
    before = four_operands(k)
    k.core.patch_node(NODE, {"spec": {"taints": [
        {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}]}})
    time.sleep(0.5)
    assert {a: p.metadata.uid for a, p in operand_pods(k).items()} == {
        a: p.metadata.uid for a, p in before.items()}, "running pods stay"
    set_operands(k, "false", only=["nvidia-device-plugin-daemonset"])
    wait_for(lambda: "nvidia-device-plugin-daemonset" not in operand_pods(k, running=False))
    set_operands(k, "true", only=["nvidia-device-plugin-daemonset"])
    time.sleep(1.0)
    assert "nvidia-device-plugin-daemonset" not in operand_pods(k, running=False), \
        "a new pod does not start under a taint it does not tolerate"
    k.core.patch_node(NODE, {"spec": {"taints": None}})
    wait_for(lambda: "nvidia-device-plugin-daemonset" in operand_pods(k))


def test_the_operator_validator_is_ready_some_time_after_the_other_operands_at_boot(
        k: Contract) -> None:
    """After a reboot the GPU Operator's validator is Ready only some seconds after the
    other operands (it checks the driver, the toolkit and CUDA first)."""
    wait_for(lambda: len(operand_pods(k)) == 4)

    def validator_ready() -> bool:
        pods = k.core.list_namespaced_pod(
            "gpu-operator", label_selector="app=nvidia-operator-validator",
            field_selector=f"spec.nodeName={NODE}").items
        return any(c.type == "Ready" and c.status == "True"
                   for p in pods for c in p.status.conditions or [])

    wait_for(validator_ready, timeout=15)
    boot = k.core.read_node(NODE).status.node_info.boot_id
    job(k, "reboot-v", "reboot")
    wait_for(lambda: k.core.read_node(NODE).status.node_info.boot_id != boot, timeout=20)
    wait_for(lambda: len(operand_pods(k)) == 4, timeout=20)
    wait_for(validator_ready, timeout=20)

    def ready_since(p: Any) -> Any:
        return next(c.last_transition_time for c in p.status.conditions if c.type == "Ready")

    pods = k.core.list_namespaced_pod("gpu-operator", field_selector=f"spec.nodeName={NODE}")
    since = {p.metadata.labels["app"]: ready_since(p) for p in pods.items}
    assert since["nvidia-operator-validator"] >= max(since[a] for a in OPERANDS)
    delays = {p.metadata.labels["app"]: float(
        p.metadata.annotations["sim.gpu-remediate.io/readiness-delay-seconds"])
        for p in pods.items}
    assert delays["nvidia-operator-validator"] > max(delays[a] for a in OPERANDS)
