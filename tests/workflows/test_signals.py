"""Operator commands as signals (the Temporal UI's "Send a Signal", `temporal workflow
signal`, automation): applied with the same checks as the updates, and a rejected,
malformed or misspelt signal is recorded where an operator looks, never dropped.
Real dev server (``local_env``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.api.sdk.v1 import WorkflowMetadata

from tests.workflows.fakes import FakeCluster, until, worker_for
from tests.workflows.test_detector import start as start_detector
from tests.workflows.test_operator_actions import (
    BLOCKED,
    FAST_DRAIN,
    SUPERVISED,
    node_name,
    reach,
    start,
    view,
)
from workflows.detector import DetectorWorkflow
from workflows.settings import DetectorSettings, RemediationSettings
from workflows.transitions import NodeState

OP = {"operator": "alice", "reason": "checked the node"}


async def rejected(handle: Any, count: int) -> list[Any]:
    async def enough() -> bool:
        return len((await view(handle)).rejected_commands) >= count
    await until(enough, 15, f"{count} rejected signals")
    return list((await view(handle)).rejected_commands)


def _rejection_events(cluster: FakeCluster) -> list[str]:
    return [e[2] for e in cluster.events if e[1] == "OperatorSignalRejected"]


async def test_approve_signal_approves_like_the_update(local_env) -> None:
    cluster, node = FakeCluster(), node_name("sig-approve")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        await handle.signal("approve", OP)
        result = await asyncio.wait_for(handle.result(), 30)
    assert result.outcome == NodeState.HEALTHY
    assert cluster.jobs_run() == ["reboot", "validate"]
    assert cluster.nodes[node].states_seen[:2] == ["awaiting-approval", "draining"]


async def test_bad_signals_are_recorded_with_the_reason_and_change_nothing(local_env) -> None:
    cluster, node = FakeCluster(), node_name("sig-bad")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        await handle.signal("approve", "yes please")           # not an object
        await handle.signal("approve", {"reason": "no name"})  # no operator
        await handle.signal("approve")                          # no payload at all
        await handle.signal("aprove", OP)                       # a typo
        await handle.signal("release", OP)                      # not quarantined
        got = await rejected(handle, 5)
        v = await view(handle)
        assert v.state == NodeState.AWAITING_APPROVAL, "none of them approved anything"
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        # Each rejection's Event is an activity of its own: they run side by side and are
        # recorded in whatever order they finish.
        await until(lambda: len(_rejection_events(cluster)) >= 5, 15, "5 rejection Events")
        await handle.terminate("test over")
    whys = [(r.name, r.why) for r in got]
    assert "must be an object" in whys[0][1]
    assert whys[1][0] == "approve" and "operator" in whys[1][1]
    assert "missing or not JSON" in whys[2][1]
    assert whys[3][0] == "aprove" and "unknown signal" in whys[3][1]
    assert whys[4][0] == "release" and "applies only when quarantined" in whys[4][1]
    assert got[4].operator == "alice (unverified)"
    # One Event for each rejection, saying who and why.
    assert sorted(_rejection_events(cluster)) == sorted(
        f"signal {r.name}" + (f" from {r.operator}" if r.operator else "") + f" rejected: {r.why}"
        for r in got)
    # The rejection shows in the UI's current details too.
    assert "rejected" in meta.current_details
    assert {s.name for s in meta.definition.signal_definitions} >= {
        "approve", "reject", "quarantine", "release", "repaired"}


async def test_approve_and_reject_cannot_both_be_acknowledged(local_env) -> None:
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("sig-race")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
    # With the worker away, both wait on the server and arrive in one workflow task: the
    # second is checked against the first's decision, not against a state the workflow
    # has not had the chance to write yet.
    await handle.signal("approve", {"operator": "alice", "reason": "checked"})
    await handle.signal("reject", {"operator": "bob", "reason": "job deadline"})
    async with worker_for(local_env.client, cluster, queue):
        got = await rejected(handle, 1)
        v = await view(handle)
        await handle.terminate("test over")
    assert got[0].name == "reject" and "already approved by alice" in got[0].why, got
    assert v.state == NodeState.DRAINING


async def test_quarantine_signal_mid_drain_quarantines(local_env) -> None:
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("sig-q")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node, RemediationSettings(drain=FAST_DRAIN))
        await reach(handle, NodeState.DRAINING)
        await handle.signal("quarantine", {"operator": "carol", "reason": "bad NVLink"})
        await reach(handle, NodeState.QUARANTINED, timeout=15)
        await handle.terminate("test over")
    assert cluster.nodes[node].history[-1].outcome.startswith("quarantined: bad NVLink")


async def test_detector_pause_signal_and_a_rejected_resume(local_env) -> None:
    cluster = FakeCluster()
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start_detector(local_env.client, queue,
                                        DetectorSettings(interval=timedelta(milliseconds=300),
                                                         remediation=SUPERVISED))
        await detector.signal("pause", {"operator": "dave", "reason": "maintenance window"})

        async def paused() -> bool:
            return (await detector.query(DetectorWorkflow.view)).paused
        await until(paused, 15, "paused by signal")
        await detector.signal("pause", {"operator": "erin", "reason": "x"})  # already paused
        await detector.signal("pasue", {"operator": "erin", "reason": "x"})  # a typo

        async def two() -> bool:
            return len((await detector.query(DetectorWorkflow.view)).rejected_commands) >= 2
        await until(two, 15, "two rejected detector signals")
        got = (await detector.query(DetectorWorkflow.view)).rejected_commands
        await detector.terminate("test over")
    assert "already paused" in got[0].why and got[0].operator == "erin (unverified)"
    assert got[1].name == "pasue" and "unknown signal" in got[1].why


async def test_abort_of_a_finished_remediation_is_a_no_op_and_of_none_an_error(
        local_env) -> None:
    from worker.cli.operator import OperatorError, abort
    from workflows.messages import OperatorCommand

    who = OperatorCommand(operator="alice", reason="test")
    cluster, node = FakeCluster(), node_name("abort-done")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node,
                             RemediationSettings(drain=FAST_DRAIN))
        await asyncio.wait_for(handle.result(), 30)
        said = await abort(local_env.client, node, who)
    assert "already ended" in said and "nothing to abort" in said
    assert cluster.nodes[node].history[-1].outcome.startswith("healthy"), "untouched"
    try:
        await abort(local_env.client, node_name("never"), who)
    except OperatorError as err:
        assert "no remediation found" in str(err)
    else:
        raise AssertionError("an abort of a node without a remediation must fail")


async def test_a_flood_of_bad_signals_records_a_bounded_number_of_events(local_env) -> None:
    """A stray client looping on a bad signal: each is in the log, the view keeps the last
    20, and only the first 20 become activities and Events."""
    cluster, node = FakeCluster(), node_name("sig-flood")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        for i in range(30):
            await handle.signal(f"nonsense-{i}", OP)
        got = await rejected(handle, 20)

        async def last_seen() -> bool:
            return (await view(handle)).rejected_commands[-1].name == "nonsense-29"
        await until(last_seen, 15, "the last signal in the view")

        def events() -> list[tuple[str, str, str]]:
            return [e for e in cluster.events if e[1] == "OperatorSignalRejected"]
        await until(lambda: len(events()) >= 20, 15, "the first 20 Events")
        await asyncio.sleep(1.0)  # room for any further Event to show up
        await handle.terminate("test over")
    assert len(got) == 20
    assert len(events()) == 20, len(events())
