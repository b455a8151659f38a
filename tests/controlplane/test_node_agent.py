"""node_agent.py without the real control plane: against the cluster simulator, whose
API-created nodes have no kubelet, so the agent is the only kubelet of its nodes.

Runs in every test run (no Go binary needed), so the agent the fidelity tier relies on
does not rot when the tier is skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sim.cluster.testkit import wait_for
from sim.cluster.threaded import ThreadedClusterSim
from sim.scenario import Scenario
from tests.controlplane.node_agent import NodeAgent, scenario_nodes, seed

SCENARIO = Scenario.model_validate({
    "name": "agent-test",
    "pools": [{"name": "agent-node", "nodes": 2, "gpus": 8}],
    "workloads": [{"name": "web", "namespace": "agent-test", "kind": "ReplicaSet",
                   "replicas": 2, "gpus_per_pod": 8, "labels": {"app": "web"},
                   "pool": "agent-node", "pdb": {"min_available": 1},
                   "termination_grace_seconds": 1, "readiness_delay_seconds": 0.5}],
})


class Agent:
    def __init__(self, api: client.ApiClient, agent: NodeAgent) -> None:
        self.api, self.agent = api, agent
        self.core: Any = client.CoreV1Api(api)
        self.batch: Any = client.BatchV1Api(api)

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod("agent-test").items)

    def job(self, name: str, kind: str, node: str) -> Any:
        labels = {"gpu-remediate.io/job": kind}
        self.batch.create_namespaced_job("agent-test", {
            "metadata": {"name": name, "labels": labels},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
                "nodeName": node, "restartPolicy": "Never",
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "x"}]}}}})
        return wait_for(lambda: (lambda j: j if (j.status.succeeded or j.status.failed)
                                 else None)(self.batch.read_namespaced_job(name, "agent-test")),
                        timeout=15)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with ThreadedClusterSim(scenario="small", job_seconds=0.2) as sim:
        path = sim.kubeconfig(Path(tmp_path_factory.mktemp("agent")) / "kubeconfig")
        api = config.new_client_from_config(config_file=str(path))
        node_agent = NodeAgent(api, scenario_nodes(SCENARIO), job_seconds=0.2,
                               reboot_seconds=1.0, interval=0.1)
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


def test_reboot_job_takes_the_node_down_and_fails_its_pods(agent: Agent) -> None:
    before = {p.metadata.uid for p in agent.pods()
              if p.spec.node_name == "agent-node-01" and p.metadata.labels.get("app") == "web"}
    assert before
    assert agent.job("reboot", "reboot", "agent-node-01").status.succeeded == 1
    after = {p.metadata.uid: p for p in agent.pods()}
    for uid in before & set(after):
        assert after[uid].status.phase == "Failed"
        assert after[uid].status.reason == "Terminated"
    node = agent.core.read_node("agent-node-01")
    assert next(c for c in node.status.conditions if c.type == "Ready").status == "True"
