"""RemediationWorkflow's per-GPU path (remediation.gpu_isolation: dra) on the time-skipping
test server, with in-memory activities."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle

from policy.models import Action, Finding, Verdict
from tests.workflows.fakes import FakeCluster, until, worker_for
from workflows.isolation import rule_name
from workflows.messages import OperatorCommand, RemediationInput, RemediationView
from workflows.remediation import RemediationWorkflow
from workflows.settings import RemediationSettings
from workflows.transitions import NodeState, Step

GPU_UUID = "GPU-5d1a3c2e-8d0b-4c1e-9a57-6b1f3c2d9e41"
DRA = RemediationSettings(gpu_isolation="dra")


def one_gpu(node: str, action: Action = Action.RESET, xid: int = 48) -> Verdict:
    return Verdict(node=node, action=action, findings=[Finding(
        gpu="3", uuid=GPU_UUID, signal="DCGM_FI_DEV_XID_ERRORS", value=xid,
        rule="xid-48-drain-and-reset", action=action)])


async def _view(handle: WorkflowHandle) -> RemediationView:
    return await handle.query(RemediationWorkflow.view_state)


async def test_one_gpu_is_isolated_held_and_released_without_touching_the_node(
        time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n1", verdict=one_gpu("n1"), settings=DRA),
            id=f"remediation-n1-{uuid.uuid4()}", task_queue=queue)
        rule = rule_name("n1", "gpu-3")
        async def held() -> bool:
            return (await _view(handle)).step == Step.GPU_QUARANTINED
        await until(held, what="the GPU held")
        assert cluster.gpu_rules.get(rule) == "NoExecute"
        view = await _view(handle)
        assert view.state == NodeState.HEALTHY and view.step == Step.GPU_QUARANTINED
        assert view.gpu_isolation is not None
        assert (view.gpu_isolation.rule, view.gpu_isolation.effect) == (rule, "NoExecute")
        assert view.gpu_isolation.owner == handle.id
        # Not claimed, cordoned or drained: its other GPUs stay in service.
        assert not any(c[0] in ("claim_node", "drain_node", "run_node_job")
                       for c in cluster.calls)
        reasons = [e[1] for e in cluster.events]
        assert reasons == ["GpuIsolated", "GpuIsolationEvicts"]
        assert rule in cluster.events[0][2] and handle.id in cluster.events[0][2]
        ack = await handle.execute_update(RemediationWorkflow.release,
                                          OperatorCommand(operator="alice",
                                                          reason="GPU replaced"))
        assert "release ordered by alice" in ack.message
        result = await handle.result()
    assert result.outcome == "healthy" and rule in result.message
    assert cluster.gpu_rules == {}
    node = cluster.nodes["n1"]
    assert node.state == NodeState.HEALTHY and not node.cordoned and not node.tainted
    assert node.acked == {GPU_UUID: 48}
    assert "DeviceTaintRule" in node.history[-1].outcome


async def test_no_rule_means_the_whole_node_path_with_a_warning(time_skipping_env):
    cluster = FakeCluster(isolation_why_not="the API server serves no DeviceTaintRule")
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        result = await client.execute_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n2", verdict=one_gpu("n2"), settings=DRA),
            id=f"remediation-n2-{uuid.uuid4()}", task_queue=queue)
    assert result.outcome == "healthy"
    warning = [e for e in cluster.events if e[1] == "GpuIsolationUnavailable"]
    assert warning and "serves no DeviceTaintRule" in warning[0][2]
    assert cluster.jobs_run() == ["gpu-reset", "validate"]
    assert cluster.nodes["n2"].states_seen[0] == "draining"


async def test_off_never_asks_for_a_rule(time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        await client.execute_workflow(
            RemediationWorkflow.run, RemediationInput(node="n3", verdict=one_gpu("n3")),
            id=f"remediation-n3-{uuid.uuid4()}", task_queue=queue)
    assert not any(c[0] == "isolate_gpu" for c in cluster.calls)


async def test_an_abort_removes_the_rule(time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n4", verdict=one_gpu("n4", Action.QUARANTINE),
                             settings=DRA),
            id=f"remediation-n4-{uuid.uuid4()}", task_queue=queue)
        async def held() -> bool:
            return (await _view(handle)).step == Step.GPU_QUARANTINED
        await until(held, what="the GPU held")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    assert cluster.gpu_rules == {}
    assert cluster.nodes["n4"].history[-1].outcome.startswith("aborted")
    assert not any(c[0] == "claim_node" for c in cluster.calls)
