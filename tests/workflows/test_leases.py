"""A remediation acts only under the detector's lease, and orders it accepts take effect.

Stray starts and stray internal signals are refused and recorded; a `repaired` accepted
while its state is being written is kept; an operator's quarantine interrupts a heat
watch at once.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from temporalio.client import WorkflowExecutionStatus

from policy.models import Action
from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from tests.workflows.test_abort import Hold, Unkind, unkind_worker, view
from workflows.detector import DetectorWorkflow
from workflows.ids import SLOT_GRANTED_SIGNAL
from workflows.messages import (
    DetectorInput,
    OperatorCommand,
    RemediationInput,
    SlotGrant,
    ThermalWatchResult,
)
from workflows.remediation import RemediationWorkflow
from workflows.settings import (
    DetectorSettings,
    DrainSettings,
    RemediationSettings,
    ThermalSettings,
)
from workflows.transitions import NodeState, Step

OP = OperatorCommand(operator="alice", reason="checked the rack")
FAST = RemediationSettings(heartbeat_timeout=timedelta(seconds=2),
                           drain=DrainSettings(retry_interval=timedelta(milliseconds=200)),
                           thermal=ThermalSettings(poll_interval=timedelta(milliseconds=200),
                                                   hold=timedelta(hours=1)))


async def test_a_remediation_started_past_the_detector_takes_no_step(local_env) -> None:
    """Anyone with namespace access can start RemediationWorkflow, naming any node and
    `requested_by: detector`: with no lease from the detector it ends at once, the node
    untouched, and says why (Event LeaseRefused)."""
    cluster = FakeCluster()
    node = f"stray-{uuid.uuid4().hex[:8]}"
    cluster.node(node)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await local_env.client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=DetectorSettings(
                interval=timedelta(milliseconds=300))),
            id=f"detector-{uuid.uuid4()}", task_queue=queue)
        cluster.detector_id = detector.id
        try:
            stray = await local_env.client.start_workflow(
                RemediationWorkflow.run,
                RemediationInput(node=node, verdict=xid_verdict(node), settings=FAST,
                                 lease_token="guessed"),
                id=f"remediation-{node}", task_queue=queue)
            result = await asyncio.wait_for(stray.result(), 30)
        finally:
            await detector.terminate("test over")
    assert result.outcome == "released" and "no lease" in result.message
    assert cluster.mutations == [], "nothing written to the node"
    assert not any(c[0] == "claim_node" for c in cluster.calls)
    assert [(n, r) for n, r, _ in cluster.events] == [(node, "LeaseRefused")]


async def test_a_verdict_naming_another_node_is_refused(local_env) -> None:
    cluster = FakeCluster()
    node, other = (f"n-{uuid.uuid4().hex[:8]}" for _ in range(2))
    async with worker_for(local_env.client, cluster) as queue:
        result = await local_env.client.execute_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(other), settings=FAST),
            id=f"remediation-{node}", task_queue=queue)
    assert result.outcome == "released" and f"names {other!r}" in result.message
    assert cluster.mutations == []


async def test_a_stray_slot_grant_is_refused_and_recorded(local_env) -> None:
    """A heat cordon drains only in a slot the detector grants with its lease's token: a
    hand-sent `slot_granted` (no token, or another) is refused and shown."""
    cluster = FakeCluster(thermal_results=[ThermalWatchResult(outcome="hot", message="93 C")])
    node = f"hot-{uuid.uuid4().hex[:8]}"
    cluster.node(node)
    heat = FAST.model_copy(update={"thermal": ThermalSettings(
        poll_interval=timedelta(milliseconds=200), hold=timedelta(seconds=1),
        escalate_after=timedelta(seconds=1))})
    async with worker_for(local_env.client, cluster) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(node, 0, Action.THERMAL),
                             settings=heat, holds_slot=False, lease_token="the-lease"),
            id=f"remediation-{node}", task_queue=queue)
        try:
            async def waiting() -> bool:
                return (await view(handle)).step == Step.WAITING_FOR_A_DRAIN_SLOT
            await until(waiting, 20, "waiting for a drain slot")
            await handle.signal(SLOT_GRANTED_SIGNAL)
            await handle.signal(SLOT_GRANTED_SIGNAL, SlotGrant(token="guessed"))

            async def refused() -> bool:
                return len((await view(handle)).rejected_commands) == 2
            await until(refused, 20, "both grants refused")
            await asyncio.sleep(1)
            assert (await view(handle)).step == Step.WAITING_FOR_A_DRAIN_SLOT
            assert not any(c[0] == "drain_node" for c in cluster.calls), "drained unslotted"
            why = [r.why for r in (await view(handle)).rejected_commands]
            assert all("only the detector grants drain slots" in w for w in why), why
            await handle.signal(SLOT_GRANTED_SIGNAL, SlotGrant(token="the-lease"))
            await until(lambda: cluster.nodes[node].state == NodeState.QUARANTINED, 30,
                        "drained in the granted slot, then quarantined (still hot)")
        finally:
            await handle.terminate("test over")


async def test_a_repair_reported_while_its_state_is_written_takes_effect(local_env) -> None:
    """`repaired` is accepted once the step is external, which is set before the state
    write returns: an order accepted then must not be dropped when the write returns."""
    cluster = FakeCluster()
    node = f"ext-{uuid.uuid4().hex[:8]}"
    hold = Hold("set_node_state", "gate")
    unkind = Unkind(cluster, hold)
    external = FAST.model_copy(update={"reboot_method": "external",
                                       "external_timeout": timedelta(minutes=10)})
    async with unkind_worker(local_env.client, unkind) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(node), settings=external),
            id=f"remediation-{node}", task_queue=queue)
        assert await asyncio.to_thread(hold.entered.wait, 20), "the external step's write"
        ack = await handle.execute_update(RemediationWorkflow.repaired, OP)
        assert "repair reported by alice" in ack.message
        hold.gate.set()
        result = await asyncio.wait_for(handle.result(), 30)
    assert result.outcome == "healthy", result
    assert "validate" in cluster.jobs_run()


async def test_an_operators_quarantine_interrupts_the_heat_watch(local_env) -> None:
    """The heat watch looks for up to an hour at a time; an operator's quarantine of the
    hot node takes effect at once, not when the watch returns."""
    cluster = FakeCluster(thermal_results=[ThermalWatchResult(outcome="hot", message="93 C")])
    node = f"hot-{uuid.uuid4().hex[:8]}"
    cluster.node(node)
    async with worker_for(local_env.client, cluster) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(node, 0, Action.THERMAL),
                             settings=FAST),
            id=f"remediation-{node}", task_queue=queue)
        try:
            await until(lambda: cluster.nodes[node].state == NodeState.CORDONED, 20,
                        "cordoned for heat")
            await asyncio.sleep(1)  # the watch is under way
            await handle.execute_update(RemediationWorkflow.quarantine, OP)
            await until(lambda: cluster.nodes[node].state == NodeState.QUARANTINED, 15,
                        "quarantined without waiting for the watch")
        finally:
            if (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await handle.terminate("test over")
