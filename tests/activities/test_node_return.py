"""check_node_returned (and what claim_node records for it) against both simulators.

The cluster simulator reboots like a real node: the reboot Job may be killed by the
shutdown, the node goes NotReady, comes back with a new boot ID, and shows no GPU
allocatable until the device plugin re-registers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.node_return import (
    NODE_NOT_BACK,
    NodeReturnActivities,
    missing_for_return,
)
from activities.nodes import NodeActivities
from policy.models import Action
from sim.cluster.machines import NodeTiming
from tests.activities.conftest import Cluster, ThreadedGpuSim, _cluster
from tests.polling import wait_for
from workflows.errors import NODE_GONE
from workflows.messages import ClaimInput, ReturnInput
from workflows.transitions import NodeState

NODE = "gpu-node-04"  # runs no workload
TIMING = NodeTiming(reboot_seconds=1.0, shutdown_seconds=0.2, device_plugin_seconds=1.5,
                    status_grace_seconds=5.0, reregister_seconds=1.0)


@pytest.fixture
def k(tmp_path: Path, gpu_sim: ThreadedGpuSim) -> Iterator[Cluster]:
    yield from _cluster(tmp_path, gpu_sim_url=gpu_sim.url, node_timing=TIMING)


@pytest.fixture
def acts(k: Cluster, gpu_sim: ThreadedGpuSim) -> NodeReturnActivities:
    exporter = ExporterSettings(mode="template", timeout_seconds=2.0,
                                url_template=f"{gpu_sim.url}/nodes/{{node}}/metrics")
    return NodeReturnActivities(k.api, FleetActivities(k.api, exporter))


def boot_id(k: Cluster, node: str = NODE) -> str:
    return str(k.node(node).status.node_info.boot_id)


def look(k: Cluster, **kw: Any) -> ReturnInput:
    n = k.node(kw.pop("node", NODE))
    base: dict[str, Any] = {
        "node": n.metadata.name, "uid": n.metadata.uid, "old_boot_id": n.status.node_info.boot_id,
        "expected_gpus": 8, "reboot_requested_at": datetime.now(UTC)}
    return ReturnInput(**{**base, **kw})


async def check(acts: NodeReturnActivities, inp: ReturnInput) -> Any:
    return await ActivityEnvironment().run(acts.check_node_returned, inp)


async def refused(acts: NodeReturnActivities, inp: ReturnInput) -> ApplicationError:
    with pytest.raises(ApplicationError) as err:
        await check(acts, inp)
    return err.value


def reboot(k: Cluster, node: str = NODE) -> None:
    """What the reboot Job does, as the product creates it: pinned, one try."""
    k.batch.create_namespaced_job("default", {"metadata": {"name": f"reboot-{node}"}, "spec": {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {"gpu-remediate.io/job": "reboot"}}, "spec": {
            "restartPolicy": "Never", "nodeName": node, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "reboot", "image": "busybox:1.37"}]}}}})


def test_claim_records_the_boot_id_and_the_uid(k: Cluster, env: ActivityEnvironment) -> None:
    node = k.node(NODE)
    result = env.run(NodeActivities(k.api).claim_node, ClaimInput(
        node=NODE, state=NodeState.DRAINING, reason="XID 79", action=Action.REBOOT,
        workflow_id="remediation-x", run_id="run-1", now=datetime.now(UTC), dry_run=True))
    assert result.boot_id == node.status.node_info.boot_id and result.boot_id
    assert result.uid == node.metadata.uid and result.uid


async def test_a_node_is_back_only_with_a_new_boot_id_ready_and_every_gpu(
        k: Cluster, acts: NodeReturnActivities) -> None:
    inp = look(k)
    err = await refused(acts, inp)
    assert err.type == NODE_NOT_BACK and not err.non_retryable
    from temporalio.exceptions import ApplicationErrorCategory

    assert err.category == ApplicationErrorCategory.BENIGN, "no error noise per look"
    assert f"boot ID unchanged ({inp.old_boot_id})" in str(err)
    reboot(k)
    seen: list[str] = []
    deadline = time.monotonic() + 20
    while True:
        try:
            result = await check(acts, inp)
            break
        except ApplicationError as e:
            assert e.type == NODE_NOT_BACK, e
            seen.append(str(e))
            assert time.monotonic() < deadline, seen[-1]
            await asyncio.sleep(0.05)
    assert any("not Ready (Ready=False, KubeletNotReady" in s for s in seen), seen
    # Ready before the device plugin re-registered: the one thing missing then.
    assert any(s.endswith("allocatable nvidia.com/gpu 0 of 8 expected") and "Ready" not in s
               for s in seen), seen
    assert result.confirmed_by == "boot-id" and result.boot_id == boot_id(k) != inp.old_boot_id
    assert result.allocatable_gpus == 8 and result.ready_since is not None
    assert f"boot ID {inp.old_boot_id} → {result.boot_id}" in result.message
    assert "exporter answering" in result.message


async def test_an_exporter_that_does_not_answer_keeps_the_node_not_back(
        k: Cluster, acts: NodeReturnActivities, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.set_exporter_mode(NODE, "down")
    # A boot ID other than the node's: as if the reboot had been seen.
    inp = look(k, old_boot_id="boot-before-the-reboot")
    err = await refused(acts, inp)
    assert err.type == NODE_NOT_BACK and "exporter not answering" in str(err)
    assert "/nodes/gpu-node-04/metrics" in str(err), "the error names where it looked"
    assert (await check(acts, inp.model_copy(update={"check_exporter": False}))).boot_id
    gpu_sim.client.set_exporter_mode(NODE, "up")
    assert (await check(acts, inp)).allocatable_gpus == 8


async def test_fewer_gpus_than_expected_is_named(k: Cluster, acts: NodeReturnActivities) -> None:
    err = await refused(acts, look(k, old_boot_id="boot-before", expected_gpus=9))
    assert err.type == NODE_NOT_BACK
    assert str(err).endswith("allocatable nvidia.com/gpu 8 of 9 expected")
    assert err.details == ("allocatable nvidia.com/gpu 8 of 9 expected",)


async def test_a_deleted_node_is_gone_for_good(k: Cluster, acts: NodeReturnActivities) -> None:
    inp = look(k)
    k.core.delete_node(NODE)
    err = await refused(acts, inp)
    assert err.type == NODE_GONE and err.non_retryable and "gone" in str(err)


async def test_a_node_replaced_under_the_same_name_is_gone(
        k: Cluster, acts: NodeReturnActivities) -> None:
    import httpx

    inp = look(k)
    httpx.post(f"{k.url}/sim/v1/nodes/{NODE}/replace").raise_for_status()
    err = await refused(acts, inp)
    assert err.type == NODE_GONE and err.non_retryable  # absent first
    wait_for(lambda: k.core.list_node(field_selector=f"metadata.name={NODE}").items)
    err = await refused(acts, inp)
    assert err.type == NODE_GONE and err.non_retryable
    assert f"uid {inp.uid} at claim, now {k.node(NODE).metadata.uid}" in str(err)


async def test_without_a_boot_id_a_ready_transition_after_the_request_counts(
        k: Cluster, acts: NodeReturnActivities) -> None:
    """An API-made node (no kubelet behind it) reporting an empty bootID, like a kubelet
    that does not fill it: the Ready condition's transition is the evidence."""
    name = "old-kubelet"
    k.core.create_node({"metadata": {"name": name}})
    requested = datetime.now(UTC)

    def status(ready: str, since: datetime) -> None:
        k.core.patch_node_status(name, {"status": {
            "nodeInfo": {"bootID": "", "machineID": "m", "systemUUID": "s",
                         "kernelVersion": "k", "osImage": "o", "containerRuntimeVersion": "c",
                         "kubeletVersion": "v1.20.0", "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady",
                            "lastHeartbeatTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ")}]}})

    status("True", requested - timedelta(hours=1))
    inp = look(k, node=name, old_boot_id="", reboot_requested_at=requested, check_exporter=False)
    err = await refused(acts, inp)
    assert err.type == NODE_NOT_BACK and "no boot ID to compare" in str(err)
    assert "NotReady→Ready transition since" in str(err)
    status("True", requested + timedelta(seconds=2))
    result = await check(acts, inp)
    assert result.confirmed_by == "ready-transition" and "no boot ID" in result.message


def _node(*, boot: str = "b2", ready: str = "True", since: str = "2026-01-01T12:00:05Z",
          gpus: Any = "8") -> dict[str, Any]:
    return {"metadata": {"uid": "u"}, "status": {
        "nodeInfo": {"bootID": boot}, "allocatable": {"nvidia.com/gpu": gpus},
        "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletNotReady",
                        "message": "node is shutting down", "lastTransitionTime": since}]}}


T0 = datetime(2026, 1, 1, 12, 0, 0, 500000, tzinfo=UTC)


def _inp(**kw: Any) -> ReturnInput:
    return ReturnInput(**{"node": "n", "uid": "u", "old_boot_id": "b1", "expected_gpus": 8,
                          "reboot_requested_at": T0, **kw})


@pytest.mark.parametrize(("node", "inp", "missing"), [
    (_node(), _inp(), []),
    (_node(boot="b1"), _inp(), ["boot ID unchanged (b1): no reboot seen yet"]),
    (_node(ready="False"), _inp(),
     ["not Ready (Ready=False, KubeletNotReady: node is shutting down)"]),
    (_node(gpus="7"), _inp(), ["allocatable nvidia.com/gpu 7 of 8 expected"]),
    (_node(gpus="lots"), _inp(), ["allocatable nvidia.com/gpu 0 of 8 expected"]),
    # The claim saw a boot ID, the node now reports none: fall back, and name both.
    (_node(boot=""), _inp(), []),
    (_node(boot="", since="2026-01-01T11:59:59Z"), _inp(),
     ["no boot ID to compare (node reports none, claim recorded 'b1') and no "
      "NotReady→Ready transition since 2026-01-01T12:00:00.500000+00:00"]),
    # Second precision: a transition in the request's own second counts.
    (_node(boot="", since="2026-01-01T12:00:00Z"), _inp(), []),
])
def test_what_is_missing_is_said_exactly(node: dict[str, Any], inp: ReturnInput,
                                         missing: list[str]) -> None:
    assert missing_for_return(node, inp)[0] == missing


def test_a_node_without_conditions_is_not_ready() -> None:
    missing, result = missing_for_return({"status": {"nodeInfo": {"bootID": "b2"}}}, _inp())
    assert missing == ["not Ready (Ready=missing, no Ready condition)",
                       "allocatable nvidia.com/gpu 0 of 8 expected"]
    assert result.ready_since is None


def _validator(ready: bool, phase: str = "Running") -> object:
    from kubernetes import client

    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="nvidia-operator-validator-x", namespace="gpu-operator",
                                     labels={"app": "nvidia-operator-validator"}),
        status=client.V1PodStatus(phase=phase, conditions=[
            client.V1PodCondition(type="Ready", status="True" if ready else "False")]))


def test_validation_waits_for_the_gpu_operators_validator_after_a_reboot() -> None:
    from activities.node_return import gpu_stack_not_ready

    waiting = gpu_stack_not_ready({}, [_validator(False)])
    assert waiting == ["GPU Operator validator not Ready yet: "
                       "gpu-operator/nvidia-operator-validator-x"]
    assert gpu_stack_not_ready({"nvidia.com/gpu.present": "false"}, [_validator(True)]) == []
    # No validator on the node: GPU feature discovery's label, where the node has it.
    assert "nvidia.com/gpu.present='false'" in gpu_stack_not_ready(
        {"nvidia.com/gpu.present": "false"}, [])[0]
    assert gpu_stack_not_ready({"nvidia.com/gpu.present": "true"}, []) == []
    assert gpu_stack_not_ready({}, [_validator(False, phase="Failed")]) == []
    assert gpu_stack_not_ready({}, []) == []


async def test_out_of_service_only_on_a_node_that_stays_not_ready_and_off_when_it_returns(
        k: Cluster, acts: NodeReturnActivities) -> None:
    import httpx

    from activities.node_return import OUT_OF_SERVICE
    from workflows.messages import OutOfServiceInput

    env = ActivityEnvironment()
    uid = k.node(NODE).metadata.uid

    def taints() -> list[tuple[str, str | None, str]]:
        return [(t.key, t.value, t.effect) for t in k.node(NODE).spec.taints or []
                if t.key == OUT_OF_SERVICE]

    said = await env.run(acts.mark_out_of_service, OutOfServiceInput(node=NODE, uid=uid, on=True))
    assert "Ready: no" in said and not taints(), "never on a node that runs"
    # A pod of a Job on the node when it loses power: deleted, it stays Terminating.
    k.core.create_namespace({"metadata": {"name": "oos"}})
    k.core.create_namespaced_pod("oos", {"metadata": {"name": "stuck", "annotations": {
        "sim.gpu-remediate.io/run-forever": "true"}}, "spec": {
        "nodeName": NODE, "containers": [{"name": "c", "image": "registry.sim.local/x"}]}})
    wait_for(lambda: k.core.read_namespaced_pod("stuck", "oos").status.phase == "Running")
    httpx.post(f"{k.sim.url}/sim/v1/nodes/{NODE}/hang", params={"hard": "true"}
               ).raise_for_status()
    wait_for(lambda: any(c.type == "Ready" and c.status != "True"
                         for c in k.node(NODE).status.conditions), timeout=15)
    k.core.delete_namespaced_pod("stuck", "oos")
    time.sleep(0.5)
    assert k.core.read_namespaced_pod("stuck", "oos").metadata.deletion_timestamp
    said = await env.run(acts.mark_out_of_service, OutOfServiceInput(node=NODE, uid=uid, on=True))
    assert "put on" in said
    assert taints() == [(OUT_OF_SERVICE, "gpu-remediate", "NoExecute")]

    def pod_gone() -> bool:
        return not [p for p in k.core.list_namespaced_pod("oos").items]

    wait_for(pod_gone, timeout=10)  # podgc force-deletes it: the pod is released
    httpx.post(f"{k.sim.url}/sim/v1/nodes/{NODE}/recover").raise_for_status()
    wait_for(lambda: any(c.type == "Ready" and c.status == "True"
                         for c in k.node(NODE).status.conditions), timeout=15)
    said = await env.run(acts.mark_out_of_service,
                         OutOfServiceInput(node=NODE, uid=uid, on=False))
    assert "taken off" in said and not taints()


def test_validation_waits_for_the_mig_layout_the_node_is_configured_with() -> None:
    from activities.node_return import gpu_stack_not_ready

    mig = {"nvidia.com/mig.config": "all-1g.10gb"}
    assert "MIG layout 'all-1g.10gb' not applied" in gpu_stack_not_ready(
        {**mig, "nvidia.com/mig.config.state": "pending"}, [])[0]
    assert gpu_stack_not_ready({**mig, "nvidia.com/mig.config.state": "success"}, []) == []
    assert gpu_stack_not_ready({"nvidia.com/mig.config": "all-disabled"}, []) == []
