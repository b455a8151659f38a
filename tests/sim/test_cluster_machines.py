"""The simulated machines behind the nodes: reboots as unkind as real ones, and the
scripted faults of `gpu-remediate sim node` (hang, wedge, replace, recover).
Simulator only: a real cluster cannot be told to hang a node."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from typer.testing import CliRunner

from sim.cluster.kubelet import SHUTDOWN_MESSAGE, UNKNOWN_MESSAGE
from sim.cluster.machines import NodeTiming
from sim.cluster.node_cli import node_app
from sim.scenario import Scenario
from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

pytestmark = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")

NODE = "gpu-01"
SCENARIO = Scenario.model_validate({
    "name": "tiny",
    "pools": [{"name": "gpu", "nodes": 2, "gpus": 8}],
    "workloads": [
        {"name": "trainer", "namespace": "team-a", "replicas": 2, "gpus_per_pod": 8,
         "labels": {"app": "trainer"}, "termination_grace_seconds": 1,
         "readiness_delay_seconds": 0},
        {"name": "node-agent", "namespace": "kube-system", "kind": "DaemonSet",
         "labels": {"app": "node-agent"}, "readiness_delay_seconds": 0},
    ],
})
# seed 0 draws "the shutdown kills the reboot command", seed 4 "the command returns first".
KILLED, RETURNS_FIRST = 0, 4


def timing(seed: int = KILLED, **kw: float) -> NodeTiming:
    base = {"reboot_seconds": 0.8, "shutdown_seconds": 0.3, "device_plugin_seconds": 1.0,
            "status_grace_seconds": 0.5, "reregister_seconds": 0.5}
    return NodeTiming(**{**base, **kw}, seed=seed)  # type: ignore[arg-type]


def open_sim(tmp_path: Path, node_timing: NodeTiming) -> Contract:
    return Contract.open(tmp_path, scenario=SCENARIO, job_seconds=0.1, node_timing=node_timing)


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Contract]:
    c = open_sim(tmp_path, timing())
    yield c
    c.close()


def ready(k: Contract, node: str = NODE) -> str:
    n = k.core.read_node(node)
    return str(next(c.status for c in n.status.conditions if c.type == "Ready"))


def node_json(k: Contract, node: str = NODE) -> dict[str, Any]:
    """Raw JSON: the typed model would hide what the simulator actually wrote."""
    resp = k.core.read_node(node, _preload_content=False)
    data: dict[str, Any] = json.loads(resp.data)
    return data


def allocatable_gpus(k: Contract, node: str = NODE) -> str:
    return str(node_json(k, node)["status"]["allocatable"]["nvidia.com/gpu"])


def pods_on(k: Contract, node: str = NODE) -> list[Any]:
    return list(k.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items)


def reboot_job(k: Contract, name: str = "reboot", node: str = NODE) -> None:
    k.batch.create_namespaced_job("default", {"metadata": {"name": name}, "spec": {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {"gpu-remediate.io/job": "reboot"}}, "spec": {
            "restartPolicy": "Never", "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "busybox:1.37"}]}}}})


def job_outcome(k: Contract, name: str = "reboot") -> str | None:
    st = k.batch.read_namespaced_job_status(name, "default").status
    done = [c.type for c in st.conditions or [] if c.status == "True"
            and c.type in ("Complete", "Failed")]
    return done[0] if done else None


def command(k: Contract, node: str, what: str) -> httpx.Response:
    return httpx.post(f"{k.sim_url()}/sim/v1/nodes/{node}/{what}")


def trainers_running(k: Contract) -> bool:
    pods = k.core.list_namespaced_pod("team-a", label_selector="app=trainer").items
    return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)


def test_a_killed_reboot_fails_its_job_kills_every_pod_and_returns_with_a_new_boot_id(
        k: Contract) -> None:
    wait_for(lambda: trainers_running(k))
    boot = node_json(k)["status"]["nodeInfo"]["bootID"]
    uid = node_json(k)["metadata"]["uid"]
    reboot_job(k)
    wait_for(lambda: ready(k) == "False")
    # The shutdown killed the Job's own pod, as graceful node shutdown does.
    wait_for(lambda: job_outcome(k) == "Failed")
    job_pod = k.core.list_namespaced_pod("default", label_selector="job-name=reboot").items[0]
    assert job_pod.status.phase == "Failed" and job_pod.status.message == SHUTDOWN_MESSAGE
    on_node = {p.metadata.name: p for p in pods_on(k)}
    trainer = next(p for name, p in on_node.items() if name.startswith("trainer"))
    assert trainer.status.phase == "Failed" and trainer.status.reason == "Terminated"
    agent = next(p for name, p in on_node.items() if name.startswith("node-agent"))
    assert agent.status.phase == "Running" and not any(
        c.type == "Ready" and c.status == "True" for c in agent.status.conditions)
    # Still down: the old boot ID, the GPUs still counted.
    assert node_json(k)["status"]["nodeInfo"]["bootID"] == boot
    wait_for(lambda: ready(k) == "True")
    after = node_json(k)
    assert after["status"]["nodeInfo"]["bootID"] != boot
    assert after["metadata"]["uid"] == uid, "a reboot keeps the node's identity"
    # Ready before the device plugin registered: no GPU allocatable yet, capacity kept.
    assert after["status"]["allocatable"]["nvidia.com/gpu"] == "0"
    assert after["status"]["capacity"]["nvidia.com/gpu"] == "8"
    wait_for(lambda: allocatable_gpus(k) == "8")


def test_a_reboot_command_that_returns_first_completes_its_job_before_the_shutdown(
        tmp_path: Path) -> None:
    k = open_sim(tmp_path, timing(RETURNS_FIRST, shutdown_seconds=1.0))
    try:
        boot = node_json(k)["status"]["nodeInfo"]["bootID"]
        reboot_job(k)
        wait_for(lambda: job_outcome(k) == "Complete")
        assert ready(k) == "True", "the Job succeeded while the node was still up"
        wait_for(lambda: ready(k) == "False")
        wait_for(lambda: ready(k) == "True")
        assert node_json(k)["status"]["nodeInfo"]["bootID"] != boot
    finally:
        k.close()


def test_ready_transition_time_moves_with_the_reboot(k: Contract) -> None:
    def ready_since() -> str:
        cond = next(c for c in node_json(k)["status"]["conditions"] if c["type"] == "Ready")
        return str(cond["lastTransitionTime"])

    before = ready_since()
    reboot_job(k)
    wait_for(lambda: ready(k) == "False")
    down = ready_since()
    wait_for(lambda: ready(k) == "True")
    assert before <= down <= ready_since() and ready_since() != before


def test_a_gpu_pod_admitted_before_the_device_plugin_registers_is_rejected(
        tmp_path: Path) -> None:
    k = open_sim(tmp_path, timing(device_plugin_seconds=3.0))
    try:
        reboot_job(k)
        wait_for(lambda: ready(k) == "False")
        # Created while the node is down: bound by nodeName, admitted once it is back.
        k.core.create_namespaced_pod("default", {"metadata": {"name": "validate"}, "spec": {
            "nodeName": NODE, "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "dcgm", "resources": {
                "limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}}]}})
        pod = wait_for(lambda: (p := k.core.read_namespaced_pod("validate", "default"))
                       .status.phase != "Pending" and p)
        assert pod.status.phase == "Failed" and pod.status.reason == "OutOfnvidia.com/gpu"
        assert allocatable_gpus(k) == "0"
    finally:
        k.close()


def test_two_reboot_commands_before_the_shutdown_reboot_once(k: Contract) -> None:
    reboot_job(k, "reboot-a")
    reboot_job(k, "reboot-b")
    wait_for(lambda: job_outcome(k, "reboot-a") and job_outcome(k, "reboot-b"))
    wait_for(lambda: ready(k) == "True" and allocatable_gpus(k) == "8")
    machines = httpx.get(f"{k.sim_url()}/sim/v1/nodes").json()["nodes"]
    assert machines[NODE]["reboots"] == 1


def test_hang_the_next_reboot_never_returns_until_recover(k: Contract) -> None:
    assert command(k, NODE, "hang").json()["hang_next_reboot"] is True
    boot = node_json(k)["status"]["nodeInfo"]["bootID"]
    reboot_job(k)
    wait_for(lambda: ready(k) == "False")
    # Past the reboot window and the status grace: the node lifecycle's Unknown.
    wait_for(lambda: ready(k) == "Unknown")
    cond = next(c for c in node_json(k)["status"]["conditions"] if c["type"] == "Ready")
    assert cond["message"] == UNKNOWN_MESSAGE
    wait_for(lambda: "node.kubernetes.io/unreachable" in
             {t["key"] for t in node_json(k)["spec"].get("taints") or []})
    assert node_json(k)["status"]["nodeInfo"]["bootID"] == boot
    assert command(k, NODE, "recover").status_code == 200
    wait_for(lambda: ready(k) == "True")
    assert node_json(k)["status"]["nodeInfo"]["bootID"] != boot
    # Only the next reboot hung: the one after returns on its own.
    reboot_job(k, "again")
    wait_for(lambda: job_outcome(k, "again"))
    wait_for(lambda: ready(k) == "True" and allocatable_gpus(k) == "8")


def test_a_wedged_kubelet_leaves_pods_terminating_until_it_recovers(k: Contract) -> None:
    wait_for(lambda: trainers_running(k))
    boot = node_json(k)["status"]["nodeInfo"]["bootID"]
    trainer = next(p for p in pods_on(k) if p.metadata.name.startswith("trainer"))
    assert command(k, NODE, "wedge").status_code == 200
    wait_for(lambda: ready(k) == "Unknown")
    # Its grace period is 1 s (0 would be a force deletion, which needs no kubelet).
    k.core.delete_namespaced_pod(trainer.metadata.name, "team-a")

    def stuck() -> Any:
        return k.core.read_namespaced_pod(trainer.metadata.name, "team-a")

    # Nothing confirms the kill: still Terminating well past its grace period.
    time.sleep(2.0)
    assert stuck().metadata.deletion_timestamp is not None
    assert ready(k) == "Unknown"
    command(k, NODE, "recover")
    wait_for(lambda: ready(k) == "True")

    def gone() -> bool:
        try:
            stuck()
        except client.ApiException as err:
            return err.status == 404
        return False

    wait_for(gone)
    assert node_json(k)["status"]["nodeInfo"]["bootID"] == boot, "a wedge is not a reboot"


def test_replace_registers_a_new_machine_under_the_same_name(k: Contract) -> None:
    wait_for(lambda: trainers_running(k))
    k.core.patch_node(NODE, {"metadata": {"labels": {"gpu-remediate.io/state": "draining"},
                                          "annotations": {"gpu-remediate.io/workflow": "w"}},
                             "spec": {"unschedulable": True, "taints": [
                                 {"key": "gpu-remediate.io/remediation", "value": "true",
                                  "effect": "NoSchedule"}]}})
    old = node_json(k)
    old_pods = {p.metadata.uid for p in pods_on(k)}
    assert old_pods
    assert command(k, NODE, "replace").status_code == 200

    def absent() -> bool:
        try:
            k.core.read_node(NODE)
        except client.ApiException as err:
            return err.status == 404
        return False

    assert absent(), "the old Node object is deleted at once"
    new = wait_for(lambda: not absent() and node_json(k))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert new["status"]["nodeInfo"]["bootID"] != old["status"]["nodeInfo"]["bootID"]
    assert "gpu-remediate.io/state" not in new["metadata"]["labels"]
    assert "gpu-remediate.io/workflow" not in (new["metadata"].get("annotations") or {})
    assert not new["spec"].get("unschedulable") and not any(
        t["key"].startswith("gpu-remediate.io") for t in new["spec"].get("taints") or [])
    assert new["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert not old_pods & {p.metadata.uid for p in pods_on(k)}, "the old machine's pods went"
    wait_for(lambda: ready(k) == "True")


def test_node_commands_name_what_is_wrong(k: Contract) -> None:
    bad = command(k, NODE, "explode")
    assert bad.status_code == 400 and "hang, replace, wedge, recover" in bad.json()["message"]
    missing = command(k, "no-such-node", "hang")
    assert missing.status_code == 404 and "no-such-node" in missing.json()["message"]
    assert httpx.get(f"{k.sim_url()}/sim/v1/nodes/{NODE}/hang").status_code == 405


def test_the_node_cli_drives_the_simulator(k: Contract) -> None:
    runner = CliRunner()
    url = ["--url", k.sim_url()]
    result = runner.invoke(node_app, ["hang", NODE, *url])
    assert result.exit_code == 0 and "next reboot hangs" in result.output
    listing = runner.invoke(node_app, ["list", *url])
    assert listing.exit_code == 0 and NODE in listing.output and "hang" in listing.output
    result = runner.invoke(node_app, ["wedge", "nope", *url])
    assert result.exit_code == 1 and "404" in result.output
    result = runner.invoke(node_app, ["recover", NODE, "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 1 and "cannot reach" in result.output


def test_timings_refuse_negative_values() -> None:
    with pytest.raises(ValueError, match="reboot_seconds"):
        NodeTiming(reboot_seconds=-1)
