"""node_agent.py without the real control plane: against the cluster simulator, whose
API-created nodes have no kubelet, so the agent is the only kubelet of its nodes.

Runs in every test run (no Go binary needed), so the agent the fidelity tier relies on
does not rot when the tier is skipped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from activities.job_templates import VALIDATION_COMMAND
from sim.cluster import fleet, objects
from sim.cluster.gpulink import GpuLink
from sim.cluster.machines import NodeTiming
from sim.cluster.threaded import ThreadedClusterSim
from sim.gpu.server import start_gpu_simulator
from sim.scenario import Scenario
from tests.controlplane.node_agent import (
    SHUTDOWN_MESSAGE,
    NodeAgent,
    reboot_draw,
    scenario_nodes,
    seed,
    serve_logs,
)
from tests.polling import wait_for

SCENARIO = Scenario.model_validate({
    "name": "agent-test",
    "pools": [{"name": "agent-node", "nodes": 2, "gpus": 8}],
    "workloads": [{"name": "web", "namespace": "agent-test", "kind": "ReplicaSet",
                   "replicas": 2, "gpus_per_pod": 8, "labels": {"app": "web"},
                   "pool": "agent-node", "pdb": {"min_available": 1},
                   "termination_grace_seconds": 1, "readiness_delay_seconds": 0.5}],
})
NODES = ("agent-node-01", "agent-node-02")


def _timing() -> NodeTiming:
    """Short timings, and a seed under which the first reboot of one node returns before
    the shutdown and that of the other is killed by it, so both fates are exercised."""
    base = NodeTiming(reboot_seconds=1.5, shutdown_seconds=0.3, device_plugin_seconds=1.5)
    return next(t for s in range(100) if (t := dataclasses.replace(base, seed=s))
                and reboot_draw(t, NODES[0], 0)[0] != reboot_draw(t, NODES[1], 0)[0])


class Agent:
    def __init__(self, api: client.ApiClient, agent: NodeAgent) -> None:
        self.api, self.agent = api, agent
        self.core: Any = client.CoreV1Api(api)
        self.batch: Any = client.BatchV1Api(api)

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod("agent-test").items)

    def job(self, name: str, kind: str, node: str, command: list[str] | None = None,
            env: list[dict[str, Any]] | None = None) -> Any:
        labels = {"gpu-remediate.io/job": kind}
        container: dict[str, Any] = {"name": "c", "image": "x"}
        if command:
            container["command"] = command
        if env:
            container["env"] = env
        self.batch.create_namespaced_job("agent-test", {
            "metadata": {"name": name, "labels": labels},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
                "nodeName": node, "restartPolicy": "Never",
                "tolerations": [{"operator": "Exists"}],
                "containers": [container]}}}})
        return wait_for(lambda: (lambda j: j if (j.status.succeeded or j.status.failed)
                                 else None)(self.batch.read_namespaced_job(name, "agent-test")),
                        timeout=15)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with ThreadedClusterSim(scenario="small", job_seconds=0.2) as sim:
        path = sim.kubeconfig(Path(tmp_path_factory.mktemp("agent")) / "kubeconfig")
        api = config.new_client_from_config(config_file=str(path))
        node_agent = NodeAgent(api, scenario_nodes(SCENARIO), job_seconds=0.2,
                               timing=_timing(), interval=0.1)
        node_agent.register()
        seed(api, SCENARIO)
        stop = threading.Event()
        loop = threading.Thread(target=node_agent.run, args=(stop,), daemon=True)
        loop.start()
        try:
            wait_for(lambda: node_agent.all_ready({"agent-test"}), timeout=20)
            yield Agent(api, node_agent)
        finally:
            stop.set()
            loop.join(timeout=5)
            api.close()


def test_nodes_registered_ready_with_gpus_and_leases(agent: Agent) -> None:
    for name in ("agent-node-01", "agent-node-02"):
        node = agent.core.read_node(name)
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True"
        lease = client.CoordinationV1Api(agent.api).read_namespaced_lease(name, "kube-node-lease")
        assert lease.spec.holder_identity == name
        assert agent.core.read_namespaced_pod(f"node-local-agent-{name}", "kube-system")


def test_bound_pods_run_and_become_ready(agent: Agent) -> None:
    pods = agent.pods()
    assert sorted(p.spec.node_name for p in pods) == ["agent-node-01", "agent-node-02"]
    for p in pods:
        assert p.status.phase == "Running" and p.status.pod_ip
        assert {c.type: c.status for c in p.status.conditions}["Ready"] == "True"


def test_graceful_deletion_finishes_after_the_grace_period(agent: Agent) -> None:
    victim = agent.pods()[0]
    agent.core.delete_namespaced_pod(victim.metadata.name, "agent-test")
    started = time.monotonic()
    wait_for(lambda: victim.metadata.uid not in {p.metadata.uid for p in agent.pods()},
             timeout=10)
    assert time.monotonic() - started >= 0.9, "removed before its 1 s grace period"
    wait_for(lambda: agent.agent.all_ready({"agent-test"}) and len(agent.pods()) == 2,
             timeout=15)


def test_validate_job_succeeds_without_a_gpu_simulator(agent: Agent) -> None:
    assert agent.job("validate", "validate", "agent-node-01").status.succeeded == 1


def test_pod_that_does_not_fit_is_rejected(agent: Agent) -> None:
    agent.core.create_namespaced_pod("default", {
        "metadata": {"name": "too-big"},
        "spec": {"nodeName": "agent-node-02", "restartPolicy": "Never", "containers": [{
            "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    pod = wait_for(lambda: (lambda p: p if p.status.phase == "Failed" else None)(
        agent.core.read_namespaced_pod("too-big", "default")))
    assert pod.status.reason == "OutOfnvidia.com/gpu"


def _ready_condition(node: Any) -> Any:
    return next(c for c in node.status.conditions if c.type == "Ready")


def _watch_reboot(agent: Agent, name: str, old_boot: str, timeout: float = 20) -> list[tuple]:
    """(Ready, bootID, allocatable GPUs) as seen every 20 ms until the node is back with a
    new boot ID and all its GPUs."""
    seen: list[tuple[str, str, str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = agent.core.read_node(name)
        look = (_ready_condition(node).status, node.status.node_info.boot_id,
                node.status.allocatable["nvidia.com/gpu"])
        if not seen or seen[-1] != look:
            seen.append(look)
        if look[0] == "True" and look[1] != old_boot and look[2] == "8":
            return seen
        time.sleep(0.02)
    raise AssertionError(f"{name} not back within {timeout}s: {seen}")


@pytest.mark.parametrize("name", NODES)
def test_reboot_kills_every_pod_and_the_node_returns_with_a_new_boot_id(
        agent: Agent, name: str) -> None:
    before = agent.core.read_node(name)
    old_boot, uid = before.status.node_info.boot_id, before.metadata.uid
    ready_since = _ready_condition(before).last_transition_time
    web = {p.metadata.uid for p in agent.pods()
           if p.spec.node_name == name and p.metadata.labels.get("app") == "web"}
    daemons = {p.metadata.uid: p for p in agent.core.list_pod_for_all_namespaces().items
               if p.spec.node_name == name and p.metadata.owner_references
               and p.metadata.owner_references[0].kind in ("DaemonSet", "Node")}
    kinds = sorted(p.metadata.owner_references[0].kind for p in daemons.values())
    assert web and kinds[-1] == "Node" and "DaemonSet" in kinds, \
        f"a web pod, the dcgm-exporter and the mirror pod: {kinds}"
    returns_first = reboot_draw(agent.agent.timing, name, 0)[0]

    with ThreadPoolExecutor(1) as watcher:
        watching = watcher.submit(_watch_reboot, agent, name, old_boot)
        job = agent.job(f"reboot-{name}", "reboot", name)
        seen = watching.result()

    # The command returned before the shutdown (Job succeeded) or was killed by it.
    pod = agent.core.list_namespaced_pod(
        "agent-test", label_selector=f"job-name=reboot-{name}").items[0]
    if returns_first:
        assert job.status.succeeded == 1 and pod.status.phase == "Succeeded"
    else:
        assert job.status.failed == 1 and pod.status.phase == "Failed"
        assert pod.status.reason == "Terminated" and pod.status.message == SHUTDOWN_MESSAGE
        assert pod.status.container_statuses[0].state.terminated.exit_code == 137
    # NotReady under the old boot ID, then Ready with a new one and no GPUs, then GPUs.
    assert seen[0][0] == "True" and seen[0][1] == old_boot
    down = seen.index(next(s for s in seen if s[0] == "False"))
    assert all(s[1] == old_boot for s in seen[:down + 1])
    assert ("True", seen[-1][1], "0") in seen[down:], f"no device-plugin window: {seen}"
    after = agent.core.read_node(name)
    assert after.metadata.uid == uid, "a reboot keeps the Node's identity"
    assert after.status.capacity["nvidia.com/gpu"] == "8"
    assert _ready_condition(after).last_transition_time > ready_since
    # Every other pod on the node died; DaemonSet and static pods restarted in place.
    pods = {p.metadata.uid: p for p in agent.core.list_pod_for_all_namespaces().items}
    for u in web & set(pods):
        assert pods[u].status.phase == "Failed" and pods[u].status.reason == "Terminated"
    for u, old in daemons.items():
        wait_for(lambda u=u: all(c.status == "True" for c in agent.core.read_namespaced_pod(
            pods[u].metadata.name, pods[u].metadata.namespace).status.conditions
            if c.type == "Ready"), timeout=10)
        assert pods[u].status.container_statuses[0].restart_count == \
            old.status.container_statuses[0].restart_count + 1
    machine = agent.agent.machines[name]
    assert machine.reboots == 1 and machine.powered and machine.plugin_at is None


def test_gpu_pod_bound_before_the_device_plugin_registers_is_rejected(agent: Agent) -> None:
    name = NODES[0]
    old_boot = agent.core.read_node(name).status.node_info.boot_id
    agent.agent.request_reboot(name)
    wait_for(lambda: agent.core.read_node(name).status.node_info.boot_id != old_boot,
             timeout=15, every=0.02)
    agent.core.create_namespaced_pod("default", {
        "metadata": {"name": "too-early"},
        "spec": {"nodeName": name, "restartPolicy": "Never", "containers": [{
            "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    pod = wait_for(lambda: (lambda p: p if p.status.phase == "Failed" else None)(
        agent.core.read_namespaced_pod("too-early", "default")))
    assert pod.status.reason == "OutOfnvidia.com/gpu"
    assert "capacity: 0" in pod.status.message
    wait_for(lambda: agent.core.read_node(name).status.allocatable["nvidia.com/gpu"] == "8",
             timeout=10)


# -- the GPU Operator's node side ----------------------------------------------------------

OPERATOR_NS = "gpu-operator"
HOLDING = ("device-plugin", "dcgm", "dcgm-exporter")
HOLDERS = {"nvidia-device-plugin-daemonset", "nvidia-dcgm", "nvidia-dcgm-exporter"}


def _allocatable(agent: Agent, name: str) -> str:
    return str(agent.core.read_node(name).status.allocatable["nvidia.com/gpu"])


def _operand_pods(agent: Agent, name: str) -> dict[str, Any]:
    return {p.metadata.labels.get("app"): p
            for p in agent.core.list_namespaced_pod(OPERATOR_NS).items
            if p.spec.node_name == name and p.metadata.deletion_timestamp is None}


def _deploy(agent: Agent, name: str, operands: tuple[str, ...], value: str) -> None:
    agent.core.patch_node(name, {"metadata": {"labels": {
        f"nvidia.com/gpu.deploy.{o}": value for o in operands}}})


def _failure(agent: Agent, job: str) -> str:
    pod = agent.core.list_namespaced_pod("agent-test", label_selector=f"job-name={job}").items[0]
    return str(pod.status.container_statuses[0].state.terminated.message or "")


def test_the_device_plugin_pod_drives_allocatable(agent: Agent) -> None:
    """Turned off through its deploy label, the device plugin's GPUs go at once; back on,
    they return once its new pod runs and registers."""
    name = NODES[1]
    wait_for(lambda: "nvidia-device-plugin-daemonset" in _operand_pods(agent, name)
             and _allocatable(agent, name) == "8", timeout=20)
    _deploy(agent, name, ("device-plugin",), "false")
    try:
        wait_for(lambda: _allocatable(agent, name) == "0", timeout=15, every=0.05)
    finally:
        _deploy(agent, name, ("device-plugin",), "true")
    wait_for(lambda: _allocatable(agent, name) == "8", timeout=20)
    assert "device plugin registered" in agent.agent.machines[name].events


def test_a_reset_fails_while_the_operands_hold_the_gpus(agent: Agent) -> None:
    name = NODES[1]
    wait_for(lambda: set(_operand_pods(agent, name)) >= HOLDERS, timeout=20)
    held = agent.job("reset-held", "gpu-reset", name)
    assert held.status.failed == 1
    why = _failure(agent, "reset-held")
    assert "being used by some other process" in why and "gpu-operator/" in why, why
    _deploy(agent, name, HOLDING, "false")
    try:
        # Gone, not only told to go: a terminating operand still holds the device.
        wait_for(lambda: not any(
            p.spec.node_name == name and p.metadata.labels.get("app") in HOLDERS
            for p in agent.core.list_namespaced_pod(OPERATOR_NS).items), timeout=20)
        # Only the workload's GPU pod holds them now (this agent's nodes are not drained).
        assert agent.job("reset-free", "gpu-reset", name).status.failed == 1
        why = _failure(agent, "reset-free")
        assert "agent-test/web-" in why and "gpu-operator/" not in why, why
    finally:
        _deploy(agent, name, HOLDING, "true")
    wait_for(lambda: _allocatable(agent, name) == "8", timeout=20)


def _log(agent: Agent, job: str) -> str:
    pod = agent.core.list_namespaced_pod("agent-test", label_selector=f"job-name={job}").items[0]
    return agent.agent.logs.get(("agent-test", pod.metadata.name, "c"), "")


def _shipped(engine: str | None) -> dict[str, Any]:
    """The shipped validation command with the environment the worker gives it."""
    env: list[dict[str, Any]] = [
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    if engine is not None:
        env.append({"name": "DCGM_HOST_ENGINE", "value": engine})
    return {"command": ["/bin/sh", "-c", VALIDATION_COMMAND], "env": env}


def test_dcgmi_needs_a_host_engine_and_only_one(agent: Agent) -> None:
    """One DCGM host engine per node (sim/cluster/jobs.py): dcgmi alone reaches none; the
    standalone dcgm operand is reached with --host on the node's IP; a Job's own engine
    beside it or beside dcgm-exporter's embedded one fails, and succeeds once both are off;
    the shipped command with no engine chosen runs no diagnostic."""
    name = NODES[1]
    wait_for(lambda: {"nvidia-dcgm", "nvidia-dcgm-exporter"} <= {
        app for app, p in _operand_pods(agent, name).items()
        if p.status.phase == "Running" and any(
            c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])},
        timeout=20)
    alone = agent.job("dcgmi-alone", "validate", name, ["dcgmi", "diag", "-r", "1"])
    assert alone.status.failed == 1
    standalone = agent.job("dcgmi-standalone", "validate", name, **_shipped("standalone"))
    assert standalone.status.succeeded == 1, _failure(agent, "dcgmi-standalone")
    assert '"DCGM Diagnostic"' in _log(agent, "dcgmi-standalone")
    second = agent.job("dcgmi-second", "validate", name, **_shipped("embedded"))
    assert second.status.failed == 1
    assert "already manages the GPUs" in _log(agent, "dcgmi-second")
    unset = agent.job("dcgmi-unset", "validate", name, **_shipped(None))
    assert unset.status.failed == 1
    assert "no DCGM host engine chosen" in _log(agent, "dcgmi-unset")
    _deploy(agent, name, ("dcgm", "dcgm-exporter"), "false")
    try:
        wait_for(lambda: not {"nvidia-dcgm", "nvidia-dcgm-exporter"} & {
            p.metadata.labels.get("app") for p in agent.core.list_namespaced_pod(
                OPERATOR_NS).items if p.spec.node_name == name}, timeout=20)
        # Unreachable now: --host names the node's IP, where nothing listens.
        gone = agent.job("dcgmi-gone", "validate", name, **_shipped("standalone"))
        assert gone.status.failed == 1
        ip = fleet.node_ip(agent.agent.index[name])  # NODE_IP, from the pod's status.hostIP
        assert f"connection to the specified host: {ip}\n" in _log(agent, "dcgmi-gone")
        own = agent.job("dcgmi-own", "validate", name, **_shipped("embedded"))
        assert own.status.succeeded == 1, _log(agent, "dcgmi-own")
    finally:
        _deploy(agent, name, ("dcgm", "dcgm-exporter"), "true")


@pytest.fixture
def gpu_sim() -> Iterator[str]:
    """The GPU simulator for SCENARIO's nodes, on a loop of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    running = asyncio.run_coroutine_threadsafe(start_gpu_simulator(SCENARIO), loop).result(20)
    try:
        yield running.url
    finally:
        asyncio.run_coroutine_threadsafe(running.stop(), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


def _reset_pod(command: str, env: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "reset", "namespace": "agent-test", "uid": "reset-uid"},
            "spec": {"nodeName": NODES[0], "containers": [{
                "name": "c", "command": ["/bin/sh", "-c", command],
                "env": [{"name": k, "value": v} for k, v in env.items()]}]}}


def _persistence(url: str) -> dict[str, bool]:
    async def read() -> dict[str, bool]:
        link = GpuLink(url)
        try:
            gpus = await link.gpus(NODES[0]) or []
        finally:
            await link.aclose()
        return {str(g["uuid"]): bool(g["persistence_mode"]) for g in gpus}
    return asyncio.run(read())


def test_a_reset_turns_persistence_off_for_its_targets_only(
        agent: Agent, gpu_sim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As sim/cluster/jobs.py: the GPU simulator refuses a reset while persistence mode is
    on; `-pm 0` turns it off for the GPUs named by GPU_UUIDS only, `-pm 1` back on."""
    node_agent = agent.agent
    # Nothing holds the GPUs here: the holders' refusal is the test above.
    monkeypatch.setattr(node_agent, "_gpu_holders", lambda node, uid: [])
    monkeypatch.setattr(node_agent, "gpu_url", gpu_sim)
    before = _persistence(gpu_sim)
    first, second = sorted(before)[:2]
    assert all(before.values())
    code, message = asyncio.run(node_agent._reset(
        _reset_pod("nvidia-smi -r -i $GPU_UUIDS", {"GPU_UUIDS": first}), NODES[0]))
    assert code != 0 and "persistence" in message, message
    command = "nvidia-smi -i $GPU_UUIDS -pm 0 && nvidia-smi -r -i $GPU_UUIDS; " \
              "nvidia-smi -i $GPU_UUIDS -pm 1"
    code, message = asyncio.run(node_agent._reset(
        _reset_pod(command, {"GPU_UUIDS": f"{first},{second}"}), NODES[0]))
    assert (code, message) == (0, "")
    assert _persistence(gpu_sim) == before  # back on where it was on, nothing else touched
    code, message = asyncio.run(node_agent._reset(
        _reset_pod(command, {"GPU_UUIDS": "GPU-nonexistent"}), NODES[0]))
    assert code == 6 and "GPU-nonexistent" in message


def test_the_kubelet_api_serves_what_job_containers_wrote(agent: Agent, tmp_path: Path) -> None:
    """pods/log on the real API server reaches the node agent's /containerLogs."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(tmp_path / "c.pem")], check=True, capture_output=True)
    server = serve_logs(agent.agent, tmp_path / "c.pem", tmp_path / "k.pem")
    try:
        agent.agent.logs[("ns", "p", "c")] = "one\ntwo\nthree\n"
        port = server.server_address[1]
        context = ssl._create_unverified_context()

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}",
                                            context=context, timeout=5) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as err:
                return err.code, ""
        assert get("/containerLogs/ns/p/c") == (200, "one\ntwo\nthree\n")
        assert get("/containerLogs/ns/p/c?tailLines=1") == (200, "three\n")
        assert get("/containerLogs/ns/p/c?limitBytes=3") == (200, "one")
        assert get("/containerLogs/ns/q/c")[0] == 404
    finally:
        server.shutdown()
        agent.agent.logs.pop(("ns", "p", "c"), None)


# -- scripted machine faults ---------------------------------------------------------------


def _boot_id(agent: Agent, name: str) -> str:
    return str(agent.core.read_node(name).status.node_info.boot_id)


def test_a_wedged_kubelet_confirms_no_deletion_until_it_recovers(agent: Agent) -> None:
    name = NODES[0]
    victim = next(p for p in agent.pods() if p.spec.node_name == name
                  and (p.metadata.labels or {}).get("app") == "web"
                  and p.metadata.deletion_timestamp is None and p.status.phase == "Running")
    renewed = client.CoordinationV1Api(agent.api).read_namespaced_lease(
        name, "kube-node-lease").spec.renew_time
    agent.agent.command(name, "wedge")
    agent.core.delete_namespaced_pod(victim.metadata.name, "agent-test")
    time.sleep(2.5)  # past its 1 s grace period: a running kubelet would have confirmed
    stuck = agent.core.read_namespaced_pod(victim.metadata.name, "agent-test")
    assert stuck.metadata.deletion_timestamp is not None, "stays Terminating"
    assert client.CoordinationV1Api(agent.api).read_namespaced_lease(
        name, "kube-node-lease").spec.renew_time == renewed, "no Lease renewal while wedged"
    agent.agent.command(name, "recover")
    wait_for(lambda: victim.metadata.uid not in {p.metadata.uid for p in agent.pods()},
             timeout=10)
    wait_for(lambda: client.CoordinationV1Api(agent.api).read_namespaced_lease(
        name, "kube-node-lease").spec.renew_time != renewed, timeout=10)


def test_a_power_loss_reports_nothing_until_recovered(agent: Agent) -> None:
    """No graceful shutdown: the API server is told nothing (the node stays as last
    reported, its pods keep their phase), nothing starts; after `recover` the machine boots
    with a new boot ID and a Job's pod that ran when the power went ends Failed."""
    name = NODES[0]
    old_boot = _boot_id(agent, name)
    labels = {"gpu-remediate.io/job": "sleeper"}
    agent.batch.create_namespaced_job("agent-test", {
        "metadata": {"name": "sleeper", "labels": labels},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": labels, "annotations": {objects.RUN_FOREVER: "true"}},
            "spec": {"nodeName": name, "restartPolicy": "Never",
                     "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "x"}]}}}})

    def sleeper() -> Any:
        pods = agent.core.list_namespaced_pod("agent-test", label_selector="job-name=sleeper")
        return pods.items[0] if pods.items else None
    wait_for(lambda: (lambda p: p is not None and p.status.phase == "Running")(sleeper()),
             timeout=10)
    web = wait_for(lambda: next((p for p in agent.pods() if p.spec.node_name == name
                                 and p.metadata.labels.get("app") == "web"
                                 and p.status.phase == "Running"), None), timeout=20)
    agent.agent.command(name, "hang", hard=True)
    assert agent.agent.machines[name].power_lost and not agent.agent.is_up(name)
    agent.core.create_namespaced_pod("agent-test", {
        "metadata": {"name": "after-the-power-went"},
        "spec": {"nodeName": name, "restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "x"}]}})
    time.sleep(2 * agent.agent.timing.reboot_seconds + 0.5)
    assert _ready_condition(agent.core.read_node(name)).status == "True"  # never told
    assert _boot_id(agent, name) == old_boot
    assert sleeper().status.phase == "Running"
    assert agent.core.read_namespaced_pod(web.metadata.name, "agent-test").status.phase \
        == "Running"
    assert agent.core.read_namespaced_pod("after-the-power-went", "agent-test").status.phase \
        == "Pending"
    agent.agent.command(name, "recover")
    wait_for(lambda: _boot_id(agent, name) != old_boot
             and _allocatable(agent, name) == "8", timeout=20)
    lost = wait_for(lambda: (lambda p: p if p.status.phase == "Failed" else None)(sleeper()),
                    timeout=10)
    assert lost.status.message == "The node lost power while the pod ran."
    wait_for(lambda: agent.core.read_namespaced_pod(
        "after-the-power-went", "agent-test").status.phase == "Running", timeout=10)
    agent.core.delete_namespaced_pod("after-the-power-went", "agent-test")
    assert not agent.agent.machines[name].power_lost


def test_a_hung_reboot_never_returns_until_recovered(agent: Agent) -> None:
    name = NODES[0]
    old_boot = _boot_id(agent, name)
    agent.agent.command(name, "hang")
    agent.agent.request_reboot(name)
    wait_for(lambda: _ready_condition(agent.core.read_node(name)).status == "False",
             timeout=10, every=0.05)
    time.sleep(2 * agent.agent.timing.reboot_seconds + 0.5)
    assert _ready_condition(agent.core.read_node(name)).status == "False"
    assert _boot_id(agent, name) == old_boot and not agent.agent.machines[name].powered
    agent.agent.command(name, "recover")
    wait_for(lambda: _boot_id(agent, name) != old_boot
             and _allocatable(agent, name) == "8", timeout=20)


def test_a_replaced_node_comes_back_under_its_name_with_a_new_uid(agent: Agent) -> None:
    name = NODES[1]
    before = agent.core.read_node(name)
    agent.core.patch_node(name, {"metadata": {"labels": {"gpu-remediate.io/state": "draining"}},
                                 "spec": {"unschedulable": True}})
    agent.agent.command(name, "replace")
    wait_for(lambda: (lambda n: n is not None and n.metadata.uid != before.metadata.uid)(
        _node_or_none(agent, name)), timeout=15)
    new = agent.core.read_node(name)
    assert "gpu-remediate.io/state" not in (new.metadata.labels or {})
    assert not new.spec.unschedulable and new.status.node_info.boot_id
    wait_for(lambda: "registered as a new node" in agent.agent.machines[name].events,
             timeout=5)
    wait_for(lambda: _ready_condition(agent.core.read_node(name)).status == "True"
             and _allocatable(agent, name) == "8", timeout=20)


def _node_or_none(agent: Agent, name: str) -> Any:
    try:
        return agent.core.read_node(name)
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
