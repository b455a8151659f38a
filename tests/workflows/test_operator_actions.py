"""Operator updates on RemediationWorkflow, on the real dev server (``local_env``).

Updates are not reliable on the Java time-skipping server, and visibility (search
attributes) and the metadata query need the real server. Every test uses its own
task queue and node names, and small intervals so it finishes in seconds.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from datetime import timedelta

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError

from policy.models import Action
from tests.polling import DEFAULT_TIMEOUT
from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from workflows.detector import DetectorWorkflow
from workflows.messages import (
    DetectorInput,
    DrainResult,
    OperatorCommand,
    RemediationInput,
    RemediationResult,
    RemediationView,
)
from workflows.remediation import RemediationWorkflow
from workflows.search_attributes import GPU_NODE, REMEDIATION_ACTION, REMEDIATION_STATE
from workflows.settings import (
    ApprovalSettings,
    DetectorSettings,
    DrainSettings,
    RemediationSettings,
)
from workflows.transitions import NodeState

FAST_DRAIN = DrainSettings(retry_interval=timedelta(milliseconds=200))
SUPERVISED = RemediationSettings(
    drain=FAST_DRAIN,
    approval=ApprovalSettings(required_for=[Action.REBOOT, Action.RESET],
                              timeout=timedelta(hours=4)))
BLOCKED = DrainResult(outcome="blocked", remaining=["team-a/trainer-1"],
                      blocking_pdb="team-a/trainer-pdb")


def cmd(operator: str = "alice", reason: str = "checked") -> OperatorCommand:
    return OperatorCommand(operator=operator, reason=reason)


def node_name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


async def start(client: Client, queue: str, node: str,
                settings: RemediationSettings = SUPERVISED, dry_run: bool = False,
                action: Action = Action.REBOOT,
                ) -> WorkflowHandle[RemediationWorkflow, RemediationResult]:
    return await client.start_workflow(
        RemediationWorkflow.run,
        RemediationInput(node=node, verdict=xid_verdict(node, 79, action), settings=settings,
                         dry_run=dry_run),
        id=f"remediation-{node}", task_queue=queue)


async def view(handle: WorkflowHandle) -> RemediationView:
    return await handle.query(RemediationWorkflow.view_state)


async def reach(handle: WorkflowHandle, state: NodeState, timeout: float = 10.0) -> None:
    async def check() -> bool:
        return (await view(handle)).state == state
    await until(check, timeout, f"{handle.id} {state.value}")


async def rejected(update, handle: WorkflowHandle, *args) -> str:
    """Run an update that must be rejected; return the reason the workflow gave."""
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update(update, *args)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError), cause
    assert cause.type == "Rejected"
    return cause.message


async def result_within(handle: WorkflowHandle, seconds: float = 15.0) -> RemediationResult:
    return await asyncio.wait_for(handle.result(), seconds)


# ------------------------------------------------------------------ approval


async def test_approve_when_awaiting_approval_drains_repairs_and_validates(local_env):
    cluster, node = FakeCluster(), node_name("appr")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        assert cluster.jobs_run() == [] and not any(c[0] == "drain_node" for c in cluster.calls)
        ack = await handle.execute_update(RemediationWorkflow.approve, cmd("alice"))
        assert ack.accepted and "approved by alice" in ack.message
        result = await result_within(handle)
    assert result.outcome == NodeState.HEALTHY
    assert cluster.jobs_run() == ["reboot", "validate"]
    n = cluster.nodes[node]
    assert n.states_seen == ["awaiting-approval", "draining", "repairing", "validating",
                             "healthy"]
    assert not n.cordoned and not n.tainted


async def test_reject_releases_node_untouched(local_env):
    cluster, node = FakeCluster(), node_name("rej")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        await handle.execute_update(RemediationWorkflow.reject, cmd("bob", "job deadline"))
        result = await result_within(handle)
    assert result.outcome == "released"
    assert "rejected by bob" in result.message
    assert cluster.jobs_run() == []
    assert not any(c[0] == "drain_node" for c in cluster.calls)
    n = cluster.nodes[node]
    assert not n.cordoned and not n.tainted and n.state == NodeState.HEALTHY
    assert n.history[-1].outcome.startswith("released")


async def test_approve_when_not_awaiting_approval_is_rejected_with_the_state(local_env):
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("appr-no")
    settings = RemediationSettings(drain=FAST_DRAIN)  # unsupervised: straight to draining
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, settings)
        await reach(handle, NodeState.DRAINING)
        why = await rejected(RemediationWorkflow.approve, handle, cmd())
        assert "draining" in why and "awaiting-approval" in why and node in why
        why = await rejected(RemediationWorkflow.reject, handle, cmd())
        assert "draining" in why
        # A rejected update leaves no trace in history and changes nothing.
        assert (await view(handle)).state == NodeState.DRAINING
        await handle.terminate("test over")


async def test_update_with_invalid_payload_is_rejected(local_env):
    cluster, node = FakeCluster(), node_name("bad")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("approve", {"operator": ""}, result_type=dict)
        assert (await view(handle)).state == NodeState.AWAITING_APPROVAL
        await handle.terminate("test over")


# ------------------------------------------------------------------ quarantine and release


async def _quarantined_from_draining(client: Client, cluster: FakeCluster, queue: str,
                                     node: str) -> WorkflowHandle:
    handle = await start(client, queue, node, RemediationSettings(drain=FAST_DRAIN))
    await reach(handle, NodeState.DRAINING)
    ack = await handle.execute_update(RemediationWorkflow.quarantine,
                                      cmd("carol", "fan failure"))
    assert "carol" in ack.message
    await reach(handle, NodeState.QUARANTINED)
    await until(lambda: cluster.nodes[node].state == NodeState.QUARANTINED)
    # Quarantined mid-drain, a pod is still there; by the release its PDB lets it go
    # (a release evicts what is left before validating).
    with cluster.lock:
        cluster.drain_results = [DrainResult(outcome="drained", evicted=["team-a/trainer-1"])]
    return handle


async def test_quarantine_from_draining_stops_the_drain_and_runs_no_repair(local_env):
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("quar")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await _quarantined_from_draining(local_env.client, cluster, queue, node)
        n = cluster.nodes[node]
        assert cluster.jobs_run() == []
        assert n.cordoned and n.tainted
        assert "fan failure (by carol (unverified))" in n.history[-1].outcome
        drains = sum(1 for c in cluster.calls if c[0] == "drain_node")
        await asyncio.sleep(0.6)
        assert sum(1 for c in cluster.calls if c[0] == "drain_node") == drains, \
            "a quarantined node is no longer drained"
        why = await rejected(RemediationWorkflow.quarantine, handle, cmd("dave"))
        assert "already quarantined" in why
        await handle.terminate("test over")


async def test_the_view_shows_an_operators_quarantine_order_apart_from_the_policys(local_env):
    """An operator's order is shown as theirs, not as the policy's, in the hold run that
    continues the quarantine; the release that returns the node clears it."""
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("quar-who")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await _quarantined_from_draining(local_env.client, cluster, queue, node)
        shown: list[RemediationView] = []

        async def held() -> bool:
            try:
                v = await view(handle)
            except Exception:  # the quarantine is handing over to its hold run
                return False
            shown[:] = [v]
            return v.runs >= 2
        await until(held, 10, "the quarantine hold")
        assert shown[0].quarantine_ordered_by == cmd("carol (unverified)", "fan failure")
        assert shown[0].quarantine_policy_reason is None
        await handle.execute_update(RemediationWorkflow.release, cmd("erin", "fan fixed"))
        assert (await result_within(handle)).outcome == NodeState.HEALTHY
        after = await view(handle)
    assert after.quarantine_ordered_by is None and after.quarantine_policy_reason is None


async def test_release_when_not_quarantined_is_rejected(local_env):
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("rel-no")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, RemediationSettings(drain=FAST_DRAIN))
        await reach(handle, NodeState.DRAINING)
        why = await rejected(RemediationWorkflow.release, handle, cmd())
        assert "draining" in why and "quarantined" in why
        await handle.terminate("test over")


async def test_release_of_quarantined_node_validates_and_returns_it(local_env):
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("rel")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await _quarantined_from_draining(local_env.client, cluster, queue, node)
        ack = await handle.execute_update(RemediationWorkflow.release, cmd("erin", "fan fixed"))
        assert "erin" in ack.message
        result = await result_within(handle)
    assert result.outcome == NodeState.HEALTHY
    assert cluster.jobs_run() == ["validate"]
    n = cluster.nodes[node]
    # Validated while still labelled quarantined: a release takes no budget slot.
    assert n.states_seen[-3:] == ["quarantined", "quarantined", "healthy"]
    assert not n.cordoned and not n.tainted
    assert "released by erin" in n.history[-1].outcome


async def test_a_release_acknowledges_the_xids_the_node_shows_then(local_env):
    """dcgm-exporter keeps showing the last XID: a GPU repaired by hand would show its XID
    for ever. The release reads what shows, acknowledges it for the check after the
    validation and records it, so the detector does not remediate it again."""
    from policy.models import Finding, Verdict
    from workflows.messages import NodeHealth
    node = node_name("rel-xid")
    stale = Verdict(node=node, action=Action.RESET, findings=[Finding(
        gpu="3", uuid="GPU-stale-3", signal="DCGM_FI_DEV_XID_ERRORS", value=48, rule="xid",
        action=Action.RESET)])
    cluster = FakeCluster(drain_results=[BLOCKED], health=[
        NodeHealth(readable=True, thermal_recovered=True, verdict=stale),
        NodeHealth(readable=True, thermal_recovered=True)])
    async with worker_for(local_env.client, cluster) as queue:
        handle = await _quarantined_from_draining(local_env.client, cluster, queue, node)
        await handle.execute_update(RemediationWorkflow.release, cmd("erin", "GPU swapped"))
        result = await result_within(handle)
        view = await handle.query(RemediationWorkflow.view_state)
    assert result.outcome == NodeState.HEALTHY, result
    reads = [c[1] for c in cluster.calls if c[0] == "read_node_health"]
    assert len(reads) == 2
    assert reads[1].acknowledged.get("GPU-stale-3") == 48, reads[1].acknowledged
    assert cluster.nodes[node].acked.get("GPU-stale-3") == 48
    assert any("acknowledges the XIDs" in p and "XID 48" in p for p in view.plan), view.plan


async def test_release_that_fails_validation_goes_back_to_quarantine(local_env):
    cluster = FakeCluster(drain_results=[BLOCKED], job_results={"validate": [False, True]})
    node = node_name("rel-fail")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await _quarantined_from_draining(local_env.client, cluster, queue, node)
        await handle.execute_update(RemediationWorkflow.release, cmd("erin"))
        # The node stays labelled quarantined while it is validated: the failed release is
        # over once its history entry is written, not when the label says quarantined.
        await until(lambda: cluster.jobs_run() == ["validate"]
                    and "failed validation" in cluster.nodes[node].history[-1].outcome,
                    what="requarantine")
        await reach(handle, NodeState.QUARANTINED)
        assert cluster.nodes[node].state == NodeState.QUARANTINED
        assert cluster.nodes[node].cordoned
        # The failed release is over: a new one is accepted and this time passes.
        await handle.execute_update(RemediationWorkflow.release, cmd("frank"))
        result = await result_within(handle)
    assert result.outcome == NodeState.HEALTHY
    assert cluster.jobs_run() == ["validate", "validate"]
    assert "released by frank" in result.message


async def test_release_with_pods_still_blocked_validates_nothing_and_stays_quarantined(
        local_env):
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("rel-blocked")
    settings = RemediationSettings(drain=DrainSettings(
        retry_interval=timedelta(milliseconds=200), deadline=timedelta(seconds=2)))
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, settings)
        await reach(handle, NodeState.DRAINING)
        await handle.execute_update(RemediationWorkflow.quarantine, cmd("carol", "fan"))
        await until(lambda: cluster.nodes[node].state == NodeState.QUARANTINED)
        await handle.execute_update(RemediationWorkflow.release, cmd("erin"))
        # The same remediation's history entry is rewritten with the new outcome.
        await until(lambda: "pods still on the node" in cluster.nodes[node].history[-1].outcome,
                    what="second quarantine")
        assert cluster.jobs_run() == [], "no validation on a node that is not empty"
        assert cluster.nodes[node].state == NodeState.QUARANTINED
        await handle.terminate("test over")


async def test_a_release_that_cannot_empty_the_node_stops_before_its_history_grows(
        local_env):
    """A release drains what is left, up to the drain deadline (a day here): rounds back
    off, and the wait ends, saying why, before the run's history passes
    history_events_per_run, instead of growing to Temporal's limit."""
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("rel-long")
    settings = RemediationSettings(
        history_events_per_run=200,
        drain=DrainSettings(retry_interval=timedelta(milliseconds=50),
                            report_after=timedelta(milliseconds=50),
                            report_max=timedelta(milliseconds=100),
                            deadline=timedelta(days=1)))
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, settings)
        await reach(handle, NodeState.DRAINING)
        await handle.execute_update(RemediationWorkflow.quarantine, cmd("carol", "fan"))
        await until(lambda: cluster.nodes[node].state == NodeState.QUARANTINED)
        await handle.execute_update(RemediationWorkflow.release, cmd("erin"))
        await until(lambda: "release again" in cluster.nodes[node].history[-1].outcome,
                    timeout=120, what="the release gives up before its history grows")
        assert cluster.jobs_run() == [] and cluster.nodes[node].state == NodeState.QUARANTINED
        desc = await handle.describe()
        history = await local_env.client.get_workflow_handle(
            handle.id, run_id=desc.run_id).fetch_history()
        assert len(history.events) < 2 * settings.history_events_per_run
        await handle.terminate("test over")


async def test_a_signal_storm_during_approval_continues_as_new_and_loses_no_decision(
        local_env):
    """A stray client sends refused signals by the hundred while a remediation awaits
    approval: the wait continues in a new run before its history passes
    history_events_per_run, with the same approval window, and the operator's approve
    then takes effect."""
    cluster, node = FakeCluster(), node_name("storm")
    settings = SUPERVISED.model_copy(update={"history_events_per_run": 200})
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, settings)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        first = (await handle.describe()).run_id
        for _ in range(260):
            await handle.signal("approve-me-now", cmd("mallory", "storm"))

        async def continued() -> bool:
            return (await handle.describe()).run_id != first
        await until(continued, timeout=60, what="the approval wait in a new run")
        assert cluster.nodes[node].state == NodeState.AWAITING_APPROVAL
        await reach(handle, NodeState.AWAITING_APPROVAL)
        await handle.execute_update(RemediationWorkflow.approve, cmd("erin", "checked"))
        # Drain, repair and validation after a storm: once over a minute under -n 2 load.
        result = await asyncio.wait_for(handle.result(), 4 * DEFAULT_TIMEOUT)
    assert result.outcome == "healthy"
    history = await local_env.client.get_workflow_handle(handle.id, run_id=first).fetch_history()
    assert len(history.events) < 2 * settings.history_events_per_run


async def test_a_signal_storm_during_an_external_repair_continues_as_new_and_keeps_the_report(
        local_env):
    """A stray client sends refused signals by the hundred while a remediation waits for an
    external reboot: the wait continues in a new run before its history passes
    history_events_per_run, in the same window, with no second hand-off Event; the
    operator's `repaired` then takes effect and validation follows."""
    cluster, node = FakeCluster(), node_name("ext-storm")
    settings = RemediationSettings(
        drain=FAST_DRAIN, reboot_method="external", external_timeout=timedelta(hours=6),
        history_events_per_run=200)
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, settings)
        await reach(handle, NodeState.REPAIRING)
        assert (await view(handle)).step == "external"
        first = (await handle.describe()).run_id
        for _ in range(260):
            await handle.signal("repaired-now", cmd("mallory", "storm"))

        async def continued() -> bool:
            return (await handle.describe()).run_id != first
        await until(continued, timeout=60, what="the external wait in a new run")
        await reach(handle, NodeState.REPAIRING)
        assert (await view(handle)).step == "external"
        ack = await handle.execute_update(RemediationWorkflow.repaired,
                                          cmd("erin", "BMC power-cycled it"))
        assert ack.accepted, ack
        result = await asyncio.wait_for(handle.result(), 4 * DEFAULT_TIMEOUT)
    assert result.outcome == "healthy", result
    assert cluster.jobs_run() == ["validate"], "an external reboot runs no reboot Job"
    handed_off = [c[1] for c in cluster.calls if c[0] == "set_node_state"
                  and c[1].event_reason == "ExternalRepairRequested"]
    assert len(handed_off) == 1, "one hand-off, not one per run"
    history = await local_env.client.get_workflow_handle(handle.id, run_id=first).fetch_history()
    assert len(history.events) < 2 * settings.history_events_per_run


async def test_quarantine_ordered_during_validation_is_not_dropped(local_env):
    gate = threading.Event()
    cluster = FakeCluster(job_gates={"validate": gate})
    node = node_name("quar-val")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, RemediationSettings(drain=FAST_DRAIN))
        await reach(handle, NodeState.VALIDATING)
        ack = await handle.execute_update(RemediationWorkflow.quarantine, cmd("carol", "bad fan"))
        assert "takes effect at the end of the current step" in ack.message
        gate.set()
        try:
            await reach(handle, NodeState.QUARANTINED, timeout=5)
            # The view moves first; the node's label follows with the release activity.
            await until(lambda: cluster.nodes[node].state == NodeState.QUARANTINED, 10,
                        "the node labelled quarantined")
            assert cluster.jobs_run() == ["reboot", "validate"], "nothing after the order"
        finally:
            if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await handle.terminate("test over")


# ------------------------------------------------------------------ abort


async def test_note_abort_then_cancel_records_the_operator(local_env):
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("abort")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, RemediationSettings(drain=FAST_DRAIN))
        await reach(handle, NodeState.DRAINING)
        await handle.execute_update(RemediationWorkflow.note_abort,
                                    cmd("grace", "wrong node"))
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 15)
    n = cluster.nodes[node]
    assert n.history[-1].outcome == "aborted: aborted by grace (unverified): wrong node"
    assert n.state == NodeState.HEALTHY and not n.cordoned and not n.tainted
    assert cluster.jobs_run() == []


# ------------------------------------------------------------------ visibility


async def test_view_state_and_current_details_name_the_blocking_pdb(local_env):
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("pdb")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, RemediationSettings(drain=FAST_DRAIN))

        async def blocked() -> bool:
            return (await view(handle)).blocking_pdb == "team-a/trainer-pdb"
        await until(blocked, what="blocking PDB in view")
        v = await view(handle)
        assert v.state == NodeState.DRAINING
        assert v.action == Action.REBOOT and v.pods_left == 1
        assert v.blocked_since is not None
        assert any("cordon" in p for p in v.plan)
        assert v.transitions[-1].state == NodeState.DRAINING
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        assert "team-a/trainer-pdb" in meta.current_details
        assert "**draining**" in meta.current_details
        assert {u.name for u in meta.definition.update_definitions} >= {
            "approve", "reject", "quarantine", "release", "note_abort"}
        await handle.terminate("test over")


async def test_detector_child_is_findable_by_search_attributes_with_summary(local_env):
    cluster, node = FakeCluster(), node_name("sa")
    cluster.verdicts = [xid_verdict(node)]
    cluster.node(node)
    for i in range(9):
        cluster.node(f"{node}-peer{i}")
    settings = DetectorSettings(interval=timedelta(seconds=1), remediation=SUPERVISED)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await local_env.client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings),
            id=f"detector-{uuid.uuid4()}", task_queue=queue)
        child = local_env.client.get_workflow_handle(f"remediation-{node}")
        await until(lambda: cluster.nodes[node].state == NodeState.AWAITING_APPROVAL)

        async def listed() -> list:
            return [w async for w in local_env.client.list_workflows(f'GpuNode="{node}"')
                    if w.typed_search_attributes.get(REMEDIATION_STATE) == "awaiting-approval"]
        await until(listed, timeout=10, what="visibility")
        (found,) = await listed()
        assert found.id == f"remediation-{node}"
        assert found.workflow_type == "RemediationWorkflow"
        assert found.typed_search_attributes.get(REMEDIATION_ACTION) == "reboot"
        assert found.typed_search_attributes.get(GPU_NODE) == node
        desc = await child.describe()
        assert await desc.static_summary() == f"{node}: reboot: xid-79 on GPU 0"
        details = await desc.static_details()
        assert details is not None and "xid-79" in details and "detector" in details
        # Query by state too: the attribute follows the workflow's transitions.
        await child.execute_update(RemediationWorkflow.approve, cmd())
        await asyncio.wait_for(child.result(), 15)

        async def healthy() -> int:
            return (await local_env.client.count_workflows(
                f'GpuNode="{node}" AND RemediationState="healthy"')).count
        await until(healthy, timeout=10, what="RemediationState=healthy visible")
        await detector.terminate("test over")


# ------------------------------------------------------------------ dry-run


async def test_dry_run_supervised_shows_the_approval_step_and_mutates_nothing(local_env):
    cluster, node = FakeCluster(), node_name("dry-sup")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, SUPERVISED, dry_run=True)
        result = await result_within(handle)
        v = await view(handle)
    assert v.dry_run and any("awaiting-approval" in p for p in v.plan)
    assert any("approval" in p and "as if approved" in p for p in v.plan)
    assert result.outcome == NodeState.HEALTHY
    assert cluster.mutations == []


async def test_dry_run_supervised_plans_past_the_approval_without_an_operator(local_env):
    cluster, node = FakeCluster(), node_name("dry-plan")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, SUPERVISED, dry_run=True)
        try:
            result = await result_within(handle, 5)
        finally:
            if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await handle.terminate("test over")
    assert result.outcome == NodeState.HEALTHY
    assert cluster.mutations == []
    assert cluster.jobs_run() == ["reboot", "validate"]
