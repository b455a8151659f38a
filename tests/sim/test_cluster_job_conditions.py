"""Kubernetes >= 1.31 Job conditions and a node that loses power, as the simulator must
act them out: the interim condition (FailureTarget / SuccessCriteriaMet) first, the
terminal one (Failed / Complete) only once every pod of the Job has terminated; a pod on a
node without power never terminates, until the node gets node.kubernetes.io/out-of-service.
Simulator only (the hard power loss is scripted)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.scenario import Scenario
from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

pytestmark = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")

SCENARIO = Scenario.model_validate({
    "name": "tiny",
    "pools": [{"name": "gpu", "nodes": 2, "gpus": 8}],
    "workloads": [
        {"name": "trainer", "namespace": "team-a", "replicas": 1, "gpus_per_pod": 8,
         "labels": {"app": "trainer"}, "termination_grace_seconds": 1,
         "readiness_delay_seconds": 0},
    ],
})
RUN_FOREVER = "sim.gpu-remediate.io/run-forever"


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Contract]:
    c = Contract.open(tmp_path, scenario=SCENARIO, job_seconds=0.2, reboot_seconds=0.6)
    yield c
    c.close()


def _job(k: Contract, name: str, node: str, *, forever: bool = False, **spec: Any) -> None:
    annotations = {RUN_FOREVER: "true"} if forever else {}
    k.batch.create_namespaced_job("default", {"metadata": {"name": name}, "spec": {
        "backoffLimit": 0, **spec,
        "template": {"metadata": {"annotations": annotations}, "spec": {
            "restartPolicy": "Never", "nodeName": node, "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.sim.local/x:1"}]}}}})


def _conditions(k: Contract, name: str) -> list[tuple[str, str]]:
    st = k.batch.read_namespaced_job_status(name, "default").status
    return [(c.type, c.reason) for c in st.conditions or [] if c.status == "True"]


def _pods(k: Contract, name: str) -> list[Any]:
    return k.core.list_namespaced_pod("default", label_selector=f"job-name={name}").items


def _hard_hang(k: Contract, node: str) -> dict[str, Any]:
    resp = httpx.post(f"{k.sim_url()}/sim/v1/nodes/{node}/hang", params={"hard": "true"})
    resp.raise_for_status()
    out: dict[str, Any] = resp.json()
    return out


def _ready(k: Contract, node: str) -> str:
    return next(c.status for c in k.core.read_node(node).status.conditions
                if c.type == "Ready")


def test_interim_condition_comes_first_then_the_terminal_one(k: Contract) -> None:
    _job(k, "ok", "gpu-01")
    wait_for(lambda: "Complete" in dict(_conditions(k, "ok")))
    assert [t for t, _ in _conditions(k, "ok")] == ["SuccessCriteriaMet", "Complete"]
    _job(k, "late", "gpu-01", forever=True, activeDeadlineSeconds=1)
    wait_for(lambda: "Failed" in dict(_conditions(k, "late")), timeout=40)
    assert _conditions(k, "late") == [("FailureTarget", "DeadlineExceeded"),
                                      ("Failed", "DeadlineExceeded")]
    assert not _pods(k, "late"), "the terminal condition came before the pod was gone"


def test_job_on_a_node_that_lost_power_stays_at_its_interim_condition(k: Contract) -> None:
    """The deadline passes: FailureTarget, the pod is told to stop, but nothing on the node
    can confirm it, so Failed never comes; out-of-service releases the pod, then Failed."""
    _job(k, "stuck", "gpu-02", forever=True, activeDeadlineSeconds=2)
    wait_for(lambda: [p for p in _pods(k, "stuck") if p.status.phase == "Running"])
    assert _hard_hang(k, "gpu-02")["state"] == "down (power lost: never returns)"
    wait_for(lambda: ("FailureTarget", "DeadlineExceeded") in _conditions(k, "stuck"),
             timeout=10)
    time.sleep(2.0)
    assert "Failed" not in dict(_conditions(k, "stuck"))
    pods = _pods(k, "stuck")
    assert len(pods) == 1 and pods[0].metadata.deletion_timestamp is not None
    assert pods[0].status.phase == "Running"
    status = k.batch.read_namespaced_job_status("stuck", "default").status
    assert status.terminating == 1 and not status.active
    k.core.patch_node("gpu-02", {"spec": {"taints": [
        {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
         "effect": "NoExecute"}]}})
    wait_for(lambda: "Failed" in dict(_conditions(k, "stuck")), timeout=10)
    assert not _pods(k, "stuck")


def test_hard_power_loss_keeps_pod_phases_and_never_returns(k: Contract) -> None:
    trainer = wait_for(lambda: [p for p in k.core.list_namespaced_pod(
        "team-a", label_selector="app=trainer").items if p.status.phase == "Running"])[0]
    node = trainer.spec.node_name
    boot = k.core.read_node(node).status.node_info.boot_id
    _hard_hang(k, node)
    # No graceful shutdown: the node is silent, then Unknown (not the kubelet's False).
    wait_for(lambda: _ready(k, node) == "Unknown", timeout=15)
    pod = k.core.read_namespaced_pod(trainer.metadata.name, "team-a")
    assert pod.status.phase == "Running"
    assert not any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
    time.sleep(1.5)  # several reboot windows: it does not come back by itself
    assert _ready(k, node) == "Unknown"
    assert k.core.read_node(node).status.node_info.boot_id == boot
    httpx.post(f"{k.sim_url()}/sim/v1/nodes/{node}/recover").raise_for_status()
    wait_for(lambda: _ready(k, node) == "True", timeout=15)
    assert k.core.read_node(node).status.node_info.boot_id != boot


def test_hard_power_loss_ends_a_running_job_pod_failed_after_recovery(k: Contract) -> None:
    _job(k, "cut", "gpu-01", forever=True)
    wait_for(lambda: [p for p in _pods(k, "cut") if p.status.phase == "Running"])
    _hard_hang(k, "gpu-01")
    time.sleep(0.5)
    assert [p.status.phase for p in _pods(k, "cut")] == ["Running"]
    httpx.post(f"{k.sim_url()}/sim/v1/nodes/gpu-01/recover").raise_for_status()
    wait_for(lambda: "Failed" in dict(_conditions(k, "cut")), timeout=15)


def test_hard_is_refused_for_other_commands(k: Contract) -> None:
    resp = httpx.post(f"{k.sim_url()}/sim/v1/nodes/gpu-01/wedge", params={"hard": "true"})
    assert resp.status_code == 400 and "hard" in resp.text
