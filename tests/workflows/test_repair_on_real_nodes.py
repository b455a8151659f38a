"""The repair steps as real GPU nodes need them, on the time-skipping server: a GPU reset
beside the GPU Operator's operands, validation that proves something, a node that is gone.

The fakes are unkind where the nodes are: a GPU reset fails while any operand's deploy
label is still "true" (the operands hold the GPUs), and the waits answer "not yet" first.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from policy.models import Action, Finding, Verdict
from tests.workflows.fakes import FakeCluster, xid_verdict
from tests.workflows.test_remediation import _until, end_in_hold, remediate, running
from workflows.messages import NodeHealth, RemediationInput
from workflows.operands import deploy_label
from workflows.remediation import RemediationWorkflow
from workflows.settings import GpuOperatorSettings, RemediationSettings
from workflows.transitions import NodeState

RESET = Action.RESET


def reset_input(node: str, **settings: object) -> RemediationInput:
    return RemediationInput(node=node, verdict=xid_verdict(node, 48, RESET),
                            settings=RemediationSettings(**settings))  # type: ignore[arg-type]


class ActivitiesInFlight(Interceptor):
    """Counts the activity attempts this worker is running, and every start and end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.changes = 0

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        counter = self

        class Counted(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                with counter.lock:
                    counter.running += 1
                    counter.changes += 1
                try:
                    return await self.next.execute_activity(input)
                finally:
                    with counter.lock:
                        counter.running -= 1
                        counter.changes += 1

        return Counted(next)

    def state(self) -> tuple[int, int]:
        with self.lock:
            return self.running, self.changes


# The run's last event while the worker owes it a workflow task.
_TASK_OWED = {EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
              EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED}
# The run's last event once it can never move again.
_CLOSED = {EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
           EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
           EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
           EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
           EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED}


async def skip_until(env, handle: WorkflowHandle[Any, Any], busy: ActivitiesInFlight, check,
                     limit: timedelta = timedelta(hours=2)) -> None:
    """Move the test server's clock on until ``check()`` holds (polling by retry waits
    on server timers, which only skip while the test waits through the environment).

    Each 20 s step is taken only once the worker is idle, however long that takes on the
    machine: no activity attempt running, no workflow task owed, nothing changed for
    0.1 s. A fixed wall-clock pace is not enough: a clean-clone run on a loaded machine
    skipped 2 hours in 23 s at 0.05 s a step and never reached the quarantine that takes
    8 minutes of the run's clock."""
    latest = env.client.get_workflow_handle(handle.id)  # the run now, after any hand-over
    skipped = timedelta(0)
    while not check():
        if skipped >= limit:
            pytest.fail(f"condition not reached after {limit} of the run's clock; the run's "
                        f"history ends:\n{await _history_tail(latest)}")
        await _worker_idle(latest, busy, check)
        await env.sleep(timedelta(seconds=20))
        skipped += timedelta(seconds=20)


async def _history_tail(handle: WorkflowHandle[Any, Any], count: int = 40) -> str:
    """The run's last events, one a line, for a failure message."""
    lines = []
    async for e in handle.fetch_history_events():
        name = (e.activity_task_scheduled_event_attributes.activity_type.name
                if e.HasField("activity_task_scheduled_event_attributes") else "")
        failure = next((getattr(e, f).failure.message for f in (
            "workflow_task_failed_event_attributes", "activity_task_failed_event_attributes",
            "activity_task_timed_out_event_attributes",
            "workflow_execution_failed_event_attributes") if e.HasField(f)), "")
        lines.append(f"{e.event_id:4} {e.event_time.ToDatetime():%H:%M:%S} "
                     f"{EventType.Name(e.event_type)} {name} {failure}".rstrip())
    return "\n".join(lines[-count:])


async def _worker_idle(handle: WorkflowHandle[Any, Any], busy: ActivitiesInFlight, check,
                       settle: float = 0.1, deadline: float = 120.0) -> None:
    end = time.monotonic() + deadline
    last: tuple[object, ...] = ()
    while True:
        await asyncio.sleep(settle)
        events = [e.event_type async for e in handle.fetch_history_events()]
        now = (*busy.state(), len(events), events[-1] if events else None)
        if now[3] in _CLOSED and not check():
            pytest.fail(f"the run closed before the condition held; its history ends:\n"
                        f"{await _history_tail(handle)}")
        if now == last and now[0] == 0 and now[3] not in _TASK_OWED:
            return
        if time.monotonic() > end:
            pytest.fail(f"the worker still busy after {deadline:.0f} s: {now}; the run's "
                        f"history ends:\n{await _history_tail(handle)}")
        last = now


def order(cluster: FakeCluster, *names: str) -> list[str]:
    keep = set(names) or {"pause_gpu_operands", "check_operands_gone", "run_node_job",
                          "restore_gpu_operands", "check_operands_back", "check_gpus_free",
                          "read_node_health"}
    return [c[0] if c[0] != "run_node_job" else f"job:{c[1].kind}"
            for c in cluster.calls if c[0] in keep]


async def test_reset_turns_the_operands_off_resets_and_restores_them_as_found(
        time_skipping_env):
    cluster = FakeCluster()
    node = cluster.node("r1")
    # One operand an admin turned off before us: left as found, never turned on.
    node.operand_labels[deploy_label("dcgm")] = "false"
    node.operands_leave_after = node.operands_return_after = node.gpus_free_after = 2
    result = await remediate(time_skipping_env, cluster, reset_input("r1"))
    assert result.outcome == NodeState.HEALTHY, result
    assert cluster.jobs_run() == ["gpu-reset", "validate"]  # no escalation to a reboot
    calls = order(cluster)
    assert calls == ["pause_gpu_operands", *["check_operands_gone"] * 3, "job:gpu-reset",
                     "restore_gpu_operands", *["check_operands_back"] * 3,
                     *["check_gpus_free"] * 3,
                     # One look for the node's standalone DCGM host engine (the fake's
                     # dcgm operand answers Ready): no dcgm-exporter pause needed.
                     "check_operands_back", "job:validate", "read_node_health"], calls
    assert node.operand_labels == {deploy_label("device-plugin"): "true",
                                   deploy_label("dcgm"): "false",
                                   deploy_label("dcgm-exporter"): "true",
                                   deploy_label("gpu-feature-discovery"): "true"}
    wait = next(c[1] for c in cluster.calls if c[0] == "check_operands_back")
    assert wait.expected_gpus == 8 and deploy_label("dcgm") not in wait.labels


async def test_without_the_operator_step_the_reset_fails_and_escalates(time_skipping_env):
    """The unkind fake proves the pause matters: with operands configured away (a node
    managed otherwise) the held GPUs make the reset fail, and it escalates to a reboot."""
    cluster = FakeCluster()
    result = await remediate(time_skipping_env, cluster, reset_input(
        "r2", gpu_operator=GpuOperatorSettings(operands=[])))
    assert result.outcome == NodeState.HEALTHY
    assert cluster.jobs_run() == ["gpu-reset", "reboot", "validate"]
    assert "pause_gpu_operands" not in order(cluster)


async def test_operands_that_never_leave_fail_the_reset_and_are_restored(time_skipping_env):
    cluster = FakeCluster()
    node = cluster.node("r3")
    node.operands_leave_after = 10**6  # a wedged operand pod
    result = await remediate(time_skipping_env, cluster, reset_input(
        "r3", gpu_operator=GpuOperatorSettings(stop_timeout=timedelta(minutes=2))))
    assert result.outcome == NodeState.HEALTHY
    assert cluster.jobs_run() == ["reboot", "validate"]  # no reset Job ran at all
    assert all(v == "true" for v in node.operand_labels.values())
    assert [c[0] for c in cluster.calls].count("restore_gpu_operands") == 1


async def test_operands_not_back_fail_the_reset(time_skipping_env):
    cluster = FakeCluster()
    cluster.node("r4").operands_return_after = 10**6
    result = await remediate(time_skipping_env, cluster, reset_input(
        "r4", gpu_operator=GpuOperatorSettings(start_timeout=timedelta(minutes=3))))
    assert result.outcome == NodeState.HEALTHY
    assert cluster.jobs_run() == ["gpu-reset", "reboot", "validate"]


async def test_gpus_never_free_fail_the_validation_with_the_reason(time_skipping_env):
    cluster = FakeCluster()
    cluster.node("r5").gpus_free_after = 10**6
    busy = ActivitiesInFlight()
    async with running(time_skipping_env.client, cluster, [busy]) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, reset_input("r5", gpus_free_timeout=timedelta(minutes=4)),
            id=f"remediation-r5-{uuid.uuid4()}", task_queue=queue)
        await skip_until(time_skipping_env, handle, busy,
                         lambda: cluster.node("r5").state == NodeState.QUARANTINED)
        # No validation Job was ever created: it could not have had every GPU.
        assert cluster.jobs_run() == ["gpu-reset", "reboot"]
        assert "validation failed 2 times" in cluster.node("r5").history[-1].outcome
        view = await handle.query(RemediationWorkflow.view_state)
        assert any("not every GPU free for validation within 0:04:00" in p
                   for p in view.plan), view.plan
        await end_in_hold(handle)


async def test_a_fault_still_reported_after_validation_keeps_the_node_out(time_skipping_env):
    still = Verdict(node="r6", action=Action.REBOOT, findings=[Finding(
        gpu="2", signal="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", value=1, rule="ecc-dbe",
        action=Action.REBOOT)])
    cluster = FakeCluster(health=[NodeHealth(readable=True, thermal_recovered=True,
                                             verdict=still),
                                  NodeHealth(readable=True, thermal_recovered=True)])
    result = await remediate(time_skipping_env, cluster, reset_input("r6"))
    assert result.outcome == NodeState.HEALTHY
    # The first validation passed but DCGM still showed the fault: another round.
    assert cluster.jobs_run() == ["gpu-reset", "validate", "reboot", "validate"]
    health = [c[1] for c in cluster.calls if c[0] == "read_node_health"]
    assert len(health) == 2 and health[0].acknowledged == {"GPU-r6-0": 48}


async def test_an_exporter_that_does_not_answer_after_validation_is_no_pass(
        time_skipping_env):
    cluster = FakeCluster(health=[NodeHealth(readable=False, thermal_recovered=False,
                                             message="connection refused")])
    busy = ActivitiesInFlight()
    async with running(time_skipping_env.client, cluster, [busy]) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, reset_input("r7"),
            id=f"remediation-r7-{uuid.uuid4()}", task_queue=queue)
        await skip_until(time_skipping_env, handle, busy,
                         lambda: cluster.node("r7").state == NodeState.QUARANTINED)
        view = await handle.query(RemediationWorkflow.view_state)
        assert any("exporter does not answer: connection refused" in p for p in view.plan)
        await end_in_hold(handle)


async def test_abort_during_the_reset_restores_the_operands(local_env):
    """On the dev server: no timer is involved, and the shared time-skipping server may be
    left unable to skip by earlier tests' terminated holds."""
    import threading
    gate = threading.Event()
    cluster = FakeCluster(job_gates={"gpu-reset": gate})
    async with running(local_env.client, cluster) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run, reset_input("r8"),
            id=f"remediation-r8-{uuid.uuid4()}", task_queue=queue)
        await _until(lambda: all(v == "false"
                                 for v in cluster.node("r8").operand_labels.values()))
        await handle.cancel()
        gate.set()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    node = cluster.node("r8")
    assert all(v == "true" for v in node.operand_labels.values()), node.operand_labels
    assert node.state == NodeState.HEALTHY and not node.tainted
    assert node.history[-1].outcome.startswith("aborted")


async def test_a_pause_whose_answer_is_lost_is_restored_from_the_nodes_record(
        time_skipping_env):
    """The pause turned the operands off but its answer never reached the workflow (as when
    an abort lands in the same workflow task as the pause's completion: the SDK raises the
    cancellation and the result is gone). The node is held, and its operands are put back
    from the pause's record on the node, not left off."""
    cluster = FakeCluster(pause_answer_lost={"r13"})
    busy = ActivitiesInFlight()
    async with running(time_skipping_env.client, cluster, [busy]) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, reset_input("r13"),
            id=f"remediation-r13-{uuid.uuid4()}", task_queue=queue)
        await skip_until(time_skipping_env, handle, busy,
                         lambda: cluster.node("r13").state == NodeState.QUARANTINED)
        await end_in_hold(handle)
    node = cluster.node("r13")
    assert all(v == "true" for v in node.operand_labels.values()), node.operand_labels
    assert node.pause_record == {}
    restores = [c[1] for c in cluster.calls if c[0] == "restore_gpu_operands"]
    assert restores and restores[-1].from_record and restores[-1].changed == {}


async def test_a_node_replaced_mid_remediation_ends_it_with_an_event(time_skipping_env):
    cluster = FakeCluster()
    cluster.node("r9").replaced_at = "check_gpus_free"
    result = await remediate(time_skipping_env, cluster, reset_input("r9"))
    assert result.outcome == "released" and "node gone" in result.message
    assert "replaced" in result.message
    gone = [e for e in cluster.events if e[1] == "NodeGone"]
    assert len(gone) == 1 and gone[0][0] == "r9" and "left untouched" in gone[0][2]
    # Nothing was written after the node went: no release of the new machine.
    assert not any(m.startswith("release r9") for m in cluster.mutations)


async def test_validation_restarts_a_device_plugin_that_still_holds_a_gpu_unhealthy(
        time_skipping_env):
    """The GPU is fixed, but the device plugin still holds it unhealthy (it does until it
    restarts; a release, or a repair that turned no operand off, restarts nothing). After
    ``device_plugin_restart_after`` it is restarted once, and the validation goes on with
    every GPU."""
    cluster = FakeCluster()
    cluster.node("r10").plugin_unhealthy = 1
    result = await remediate(time_skipping_env, cluster, reset_input("r10"))
    assert result.outcome == NodeState.HEALTHY, result
    restarts = [c[1] for c in cluster.calls if c[0] == "restart_device_plugin"]
    assert len(restarts) == 1 and restarts[0].expected_gpus == 8
    assert cluster.mutations.count("device plugin restarted r10") == 1
    assert order(cluster, "restart_device_plugin", "run_node_job")[-2:] == [
        "restart_device_plugin", "job:validate"]


async def test_a_gpu_the_restarted_plugin_still_finds_unhealthy_fails_fast(time_skipping_env):
    """The plugin restarted and the GPU is unhealthy again: it is broken. The validation
    fails after the grace twice, not after all of ``gpus_free_timeout``."""
    cluster = FakeCluster()
    node = cluster.node("r11")
    node.plugin_unhealthy, node.gpu_broken = 1, True
    busy = ActivitiesInFlight()
    async with running(time_skipping_env.client, cluster, [busy]) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, reset_input(
                "r11", gpus_free_timeout=timedelta(hours=1),
                gpu_operator=GpuOperatorSettings(
                    device_plugin_restart_after=timedelta(minutes=2))),
            id=f"remediation-r11-{uuid.uuid4()}", task_queue=queue)
        await skip_until(time_skipping_env, handle, busy,
                         lambda: cluster.node("r11").state == NodeState.QUARANTINED)
        view = await handle.query(RemediationWorkflow.view_state)
        assert any("allocatable nvidia.com/gpu 7 of 8" in p for p in view.plan), view.plan
        assert [c[0] for c in cluster.calls].count("restart_device_plugin") == 2  # per round
        await end_in_hold(handle)
    # Two rounds of (2 + 2) minutes, plus repairs: far below two hours of waiting.
    assert cluster.jobs_run() == ["gpu-reset", "reboot"]


async def test_no_restart_when_the_operator_does_not_manage_the_node_or_it_is_off(
        time_skipping_env):
    cluster = FakeCluster()
    cluster.node("r12").gpus_free_after = 15  # a slow registration, no plugin to blame
    result = await remediate(time_skipping_env, cluster, reset_input(
        "r12", gpu_operator=GpuOperatorSettings(device_plugin_restart_after=None)))
    assert result.outcome == NodeState.HEALTHY
    assert "restart_device_plugin" not in [c[0] for c in cluster.calls]
