"""DetectorWorkflow with a scripted FakeCluster: budget, priority, breaker, operator updates,
continue-as-new and history size.

Tests that send updates run on the dev server (``local_env``, whose timers fire on
whole seconds); the others run on the time-skipping server (millisecond timers,
and ``env.sleep`` skips minutes). Node names carry a per-test prefix because
children are `remediation-<node>`.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType, IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.visibility import VisibilityActivities
from policy.models import Action
from tests.conftest import binary
from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from workflows.detector import DetectorWorkflow
from workflows.leases import Lease
from workflows.limits import LimitsSettings
from workflows.messages import (
    DetectorInput,
    DetectorState,
    DetectorView,
    ManualRemediation,
    OperatorCommand,
    ThermalWatchResult,
)
from workflows.remediation import RemediationWorkflow
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES
from workflows.settings import DetectorSettings, DrainSettings, RemediationSettings, ThermalSettings
from workflows.transitions import NodeState

TICK = timedelta(milliseconds=500)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def detector_ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of this module's own.

    Detector tests leave the Java test server unable to skip time for a while
    (tasks of terminated workflows polled by a stopped worker seem to hold its
    time-skipping lock), which would stall later tests that need skipping.
    """
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=binary("temporal-test-server"))
    await env.client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=env.client.namespace,
        search_attributes={k.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                           for k in SEARCH_ATTRIBUTES}))
    yield env
    await env.shutdown()


FAST = RemediationSettings(drain=DrainSettings(retry_interval=timedelta(milliseconds=100)))
NO_BREAKER = {"breaker_max_flagged_percent": 100.0, "breaker_max_flagged_nodes": 10_000}


def fleet(size: int) -> tuple[FakeCluster, list[str]]:
    prefix = f"g{uuid.uuid4().hex[:6]}"
    cluster = FakeCluster()
    names = [f"{prefix}-{i:04d}" for i in range(size)]
    for name in names:
        cluster.node(name)
    return cluster, names


def settings(**kw) -> DetectorSettings:
    kw.setdefault("interval", TICK)
    kw.setdefault("remediation", FAST)
    return DetectorSettings(**kw)


async def start(client: Client, queue: str, s: DetectorSettings,
                state: DetectorState | None = None) -> WorkflowHandle:
    return await client.start_workflow(
        DetectorWorkflow.run, DetectorInput(settings=s, state=state or DetectorState()),
        id=f"detector-{uuid.uuid4()}", task_queue=queue)


async def dview(handle: WorkflowHandle) -> DetectorView:
    return await handle.query(DetectorWorkflow.view)


async def ticks(handle: WorkflowHandle, n: int, timeout: float = 15.0) -> DetectorView:
    """Wait until the detector has finished ``n`` more ticks; return its view."""
    first = (await dview(handle)).ticks_total

    async def done() -> bool:
        return (await dview(handle)).ticks_total >= first + n
    await until(done, timeout, f"{n} ticks")
    return await dview(handle)


async def cleanup(client: Client, detector: WorkflowHandle, cluster: FakeCluster) -> None:
    handles = [detector, *(client.get_workflow_handle(f"remediation-{n}")
                           for n in set(cluster.claimed) | {v.node for v in cluster.verdicts})]
    for h in handles:
        try:
            if (await h.describe()).status == WorkflowExecutionStatus.RUNNING:
                await h.terminate("test over")
        except Exception:
            pass


def started_children(cluster: FakeCluster) -> list[str]:
    """Children in the order they claimed their node (dry-run claims included)."""
    with cluster.lock:
        return [c[1].node for c in cluster.calls if c[0] == "claim_node"]


async def rejected(handle: WorkflowHandle, update, arg) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update(update, arg)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "Rejected", cause
    return cause.message


OP = OperatorCommand(operator="alice", reason="maintenance")


# ------------------------------------------------------------------ budget


@pytest.mark.parametrize(("budget", "size", "flagged", "slots"), [
    (1, 10, 4, 1), (3, 10, 6, 3), ("50%", 8, 6, 4)])
async def test_budget_is_never_exceeded(detector_ts_env, budget, size, flagged, slots):
    env = detector_ts_env
    cluster, names = fleet(size)
    # Every remediation spends a few eviction rounds draining, so several overlap.
    cluster.drain_blocked_rounds = 4
    cluster.verdicts = [xid_verdict(n) for n in names[:flagged]]
    s = settings(max_unavailable=budget, **NO_BREAKER)
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, s)
        try:
            await until(lambda: set(cluster.claimed) == set(names[:flagged])
                        and all(cluster.nodes[n].state == NodeState.HEALTHY for n in names),
                        timeout=40, what="every flagged node remediated")
            view = await dview(detector)
        finally:
            await cleanup(env.client, detector, cluster)
    assert view.budget == slots
    assert cluster.max_out_of_service() == slots, "the budget is used, and never exceeded"
    assert sorted(cluster.claimed) == sorted(names[:flagged]), "each node remediated once"
    assert view.started_total == flagged
    assert all(r.in_use <= slots for r in cluster.reports)


async def test_sharded_observation_keeps_the_budget_across_shards(detector_ts_env):
    """Past the shard size the fleet is observed by several activities; slots held in one
    shard still count against the budget when admitting from another."""
    env = detector_ts_env
    cluster, names = fleet(9)
    cluster.drain_blocked_rounds = 4
    cluster.verdicts = [xid_verdict(n) for n in names[:6]]
    s = settings(max_unavailable=2, observe_shard_size=4, **NO_BREAKER)
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, s)
        try:
            await until(lambda: set(cluster.claimed) == set(names[:6])
                        and all(cluster.nodes[n].state == NodeState.HEALTHY for n in names),
                        timeout=40, what="every flagged node remediated")
        finally:
            await cleanup(env.client, detector, cluster)
    shard_counts = {c[1].shards for c in cluster.calls if c[0] == "observe_fleet"}
    assert shard_counts == {1, 3}, "one activity until the fleet size is known, then three"
    assert cluster.max_out_of_service() == 2
    assert sorted(cluster.claimed) == sorted(names[:6])


def heat_lease(node: str) -> DetectorState:
    """A detector that holds a heat cordon's lease (outside the budget) for ``node``."""
    return DetectorState(leases_ready=True, leases={node: Lease(
        node=node, token="t", granted_at=datetime(2026, 1, 1, tzinfo=UTC),
        workflow_id=f"remediation-{node}", slot=False, state=NodeState.CORDONED)})


async def test_leases_hold_slots_and_cordoned_counts_per_setting(detector_ts_env):
    """The record decides: a heat cordon's lease counts per setting, and a state label a
    node wrote on itself (no lease, no taint) holds nothing."""
    env = detector_ts_env
    for counts, expect_start in ((True, False), (False, True)):
        cluster, names = fleet(10)
        cluster.nodes[names[0]].state = NodeState.CORDONED  # a thermal remediation
        cluster.visible_remediations = [names[0]]
        cluster.nodes[names[2]].state = NodeState.DRAINING  # its kubelet's own word
        cluster.verdicts = [xid_verdict(names[1])]
        s = settings(max_unavailable=1, cordoned_counts_against_budget=counts)
        async with worker_for(env.client, cluster) as queue:
            detector = await start(env.client, queue, s, heat_lease(names[0]))
            try:
                view = await ticks(detector, 2)
            finally:
                await cleanup(env.client, detector, cluster)
        assert (started_children(cluster) == [names[1]]) is expect_start, counts
        assert names[2] not in view.in_flight, "a forged label holds no slot"
        if not expect_start:
            assert view.in_flight == [names[0]]
            assert view.waiting == [f"{names[1]} (reboot: budget full (1/1))"]


# ------------------------------------------------------------------ priority


async def test_most_severe_first_then_longest_waiting(detector_ts_env):
    env = detector_ts_env
    cluster, names = fleet(12)
    holder, early, *rest = names
    cluster.nodes[holder].state = NodeState.DRAINING  # the only slot is taken
    cluster.visible_remediations = [holder]
    cluster.verdicts = [xid_verdict(early, 79, Action.REBOOT)]
    async with worker_for(env.client, cluster) as queue:
        # No quarantine cap: the quarantine order started first would hold back the rest.
        # Heat cordons in the budget here (by default they take no slot: see the heat
        # tests), so the thermal verdict competes for the slot, and comes last.
        detector = await start(env.client, queue, settings(
            max_unavailable=1, max_quarantined=None, cordoned_counts_against_budget=True,
            thermal_debounce=timedelta(0), **NO_BREAKER))
        try:
            await ticks(detector, 1)
            thermal, reset, late, quarantine = rest[:4]
            # Listed in the least helpful order on purpose.
            cluster.verdicts = [xid_verdict(thermal, 0, Action.THERMAL),
                                xid_verdict(reset, 48, Action.RESET),
                                xid_verdict(late, 79, Action.REBOOT),
                                xid_verdict(early, 79, Action.REBOOT),
                                xid_verdict(quarantine, 95, Action.QUARANTINE)]
            view = await ticks(detector, 2)
            assert [w.split(" ")[0] for w in view.waiting] == [
                quarantine, early, late, reset, thermal]
            assert started_children(cluster) == []
            cluster.nodes[holder].state = NodeState.HEALTHY  # the slot frees up
            cluster.visible_remediations = []
            cluster.closed_remediations[holder] = "COMPLETED"
            await until(lambda: len(set(started_children(cluster))) == 5, timeout=20,
                        what="all five started, one at a time")
            order = list(dict.fromkeys(started_children(cluster)))
            assert order == [quarantine, early, late, reset, thermal]
            assert cluster.max_out_of_service() == 1
        finally:
            await cleanup(env.client, detector, cluster)


# ------------------------------------------------------------------ circuit breaker


async def test_breaker_trips_on_many_flagged_and_resume_reopens_admissions(local_env):
    cluster, names = fleet(20)
    flagged = names[:6]  # 30% of the fleet at once > 20%
    cluster.verdicts = [xid_verdict(n) for n in flagged]
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, settings(max_unavailable=2))
        try:
            view = await ticks(detector, 2)
            assert view.breaker_open
            assert "6 of 20" in view.breaker_reason and "resume" in view.breaker_reason
            assert all("breaker open" in w for w in view.waiting) and len(view.waiting) == 6
            assert started_children(cluster) == []
            assert cluster.reports[-1].breaker_open
            ack = await detector.execute_update(DetectorWorkflow.resume, OP)
            assert "breaker closed by alice" in ack.message
            # The nodes the operator resumed for are admitted, within the budget.
            await until(lambda: len(started_children(cluster)) >= 2, what="admissions")
            view = await ticks(detector, 2)
            assert not view.breaker_open, view.breaker_reason
            assert cluster.max_out_of_service() <= 2
        finally:
            await cleanup(local_env.client, detector, cluster)


async def test_few_flagged_nodes_never_trip_the_breaker(detector_ts_env):
    env = detector_ts_env
    cluster, names = fleet(4)
    cluster.verdicts = [xid_verdict(n) for n in names[:2]]  # 50%, but fewer than 3 nodes
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, settings(max_unavailable=1))
        try:
            view = await ticks(detector, 2)
        finally:
            await cleanup(env.client, detector, cluster)
    assert not view.breaker_open
    assert len(set(started_children(cluster))) >= 1


# ------------------------------------------------------------------ pause, resume, manual


async def test_pause_stops_admissions_and_resume_restarts_them(local_env):
    cluster, names = fleet(10)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, settings(max_unavailable=1))
        try:
            await ticks(detector, 1)
            ack = await detector.execute_update(DetectorWorkflow.pause, OP)
            assert "paused by alice" in ack.message
            why = await rejected(detector, DetectorWorkflow.pause, OP)
            assert "already paused" in why and "alice (unverified): maintenance" in why
            cluster.verdicts = [xid_verdict(names[0])]
            view = await ticks(detector, 2)
            assert view.paused and view.waiting == [f"{names[0]} (reboot: paused)"]
            assert started_children(cluster) == []
            await detector.execute_update(DetectorWorkflow.resume, OP)
            await until(lambda: started_children(cluster) == [names[0]], what="a start")
            why = await rejected(detector, DetectorWorkflow.resume, OP)
            assert "nothing to resume" in why
        finally:
            await cleanup(local_env.client, detector, cluster)


async def test_a_remediation_started_elsewhere_holds_its_slot_and_is_shown(local_env):
    """remediation-<node> already runs, not started by this detector (a stray client, or
    one whose claim has not landed): the start is refused, the node counts against the
    budget and the view says so, instead of silently freeing the slot."""
    cluster, names = fleet(6)
    first, second = names[:2]
    stray = await local_env.client.start_workflow(
        "StrayWorkflow", id=f"remediation-{first}", task_queue=f"nobody-{uuid.uuid4()}")
    cluster.verdicts = [xid_verdict(first, 79, Action.REBOOT)]
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, settings(max_unavailable=1))
        try:
            view = await ticks(detector, 2)
            assert f"{first}: remediation-{first} already runs, not started by this " \
                   "detector: counted in the budget" in view.last_errors
            assert view.in_flight == [first]
            cluster.verdicts = [xid_verdict(first, 79, Action.REBOOT),
                                xid_verdict(second, 79, Action.REBOOT)]
            view = await ticks(detector, 2)
            assert f"{second} (reboot: budget full (1/1))" in view.waiting
            assert started_children(cluster) == []
        finally:
            await stray.terminate("test over")
            await cleanup(local_env.client, detector, cluster)


async def test_manual_remediation_goes_through_budget_and_validator(local_env):
    cluster, names = fleet(10)
    holder, target, quarantined = names[:3]
    cluster.nodes[holder].state = NodeState.DRAINING
    cluster.nodes[quarantined].state = NodeState.QUARANTINED
    cluster.visible_remediations = [holder, quarantined]
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, settings(max_unavailable=1))
        try:
            await ticks(detector, 1)
            req = ManualRemediation(node=target, action=Action.RESET, operator="bob",
                                    reason="user report: NaNs")
            ack = await detector.execute_update(DetectorWorkflow.remediate, req)
            assert f"{target} queued for reset by bob" in ack.message
            why = await rejected(detector, DetectorWorkflow.remediate, req)
            assert "already queued" in why
            why = await rejected(detector, DetectorWorkflow.remediate, req.model_copy(
                update={"node": names[5], "action": Action.APP}))
            assert "not a node action" in why and "reboot" in why
            why = await rejected(detector, DetectorWorkflow.remediate,
                                 req.model_copy(update={"node": holder}))
            assert "already in remediation (draining)" in why
            why = await rejected(detector, DetectorWorkflow.remediate,
                                 req.model_copy(update={"node": quarantined}))
            assert "already in remediation (quarantined)" in why
            view = await ticks(detector, 2)
            assert view.waiting == [f"{target} (reset: budget full (1/1))"]
            assert started_children(cluster) == []
            cluster.nodes[holder].state = NodeState.HEALTHY
            cluster.visible_remediations = [quarantined]
            cluster.closed_remediations[holder] = "COMPLETED"
            await until(lambda: started_children(cluster) == [target], what="manual start")
            child = await local_env.client.get_workflow_handle(f"remediation-{target}").describe()
            details = await child.static_details()
            assert details is not None and r"Requested by **bob \(unverified\)**" in details
            assert "user report: NaNs" in details
        finally:
            await cleanup(local_env.client, detector, cluster)


# ------------------------------------------------------------------ no data, no action


async def test_observation_failure_admits_nothing_and_detector_keeps_ticking(detector_ts_env):
    env = detector_ts_env
    cluster, names = fleet(10)
    cluster.verdicts = [xid_verdict(names[0])]
    cluster.observe_error = "dcgm-exporter unreachable"
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, settings(max_unavailable=1))
        try:
            view = await ticks(detector, 2)
            assert view.last_errors and "dcgm-exporter unreachable" in view.last_errors[0]
            assert started_children(cluster) == []
            assert (await detector.describe()).status == WorkflowExecutionStatus.RUNNING
            cluster.observe_error = None
            await until(lambda: started_children(cluster) == [names[0]], what="recovery")
        finally:
            await cleanup(env.client, detector, cluster)


async def test_failing_metrics_report_does_not_kill_the_detector(detector_ts_env):
    env = detector_ts_env
    cluster, _names = fleet(10)
    cluster.report_error = "pushgateway down"
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, settings(max_unavailable=1))
        try:
            view = await ticks(detector, 1, timeout=20)
            assert any("pushgateway down" in e for e in view.last_errors)
            assert (await detector.describe()).status == WorkflowExecutionStatus.RUNNING
            cluster.report_error = None
            await until(lambda: cluster.reports != [], what="a report")
        finally:
            await cleanup(env.client, detector, cluster)


# ------------------------------------------------------------------ continue-as-new


async def test_continue_as_new_carries_pause_breaker_and_pending_starts(local_env):
    cluster, names = fleet(10)
    slow, other = names[:2]
    gate = threading.Event()
    cluster.claim_gates[slow] = gate  # started, but its label never shows
    cluster.verdicts = [xid_verdict(slow)]
    s = settings(max_unavailable=1, ticks_per_run=3)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        try:
            first_run = (await detector.describe()).run_id
            await ticks(detector, 1)
            cluster.verdicts = [xid_verdict(slow), xid_verdict(other)]
            await detector.execute_update(DetectorWorkflow.pause, OP)

            async def new_run() -> bool:
                return (await detector.describe()).run_id != first_run
            await until(new_run, timeout=15, what="continue-as-new")
            view = await ticks(detector, 1)
            assert view.paused, "pause survives continue-as-new"
            assert view.in_flight == [slow], "the pending start still holds its slot"
            assert view.started_total == 1 and view.ticks_total >= 3
            await detector.execute_update(DetectorWorkflow.resume, OP)
            await ticks(detector, 4)  # across another continue-as-new
            assert started_children(cluster) == [], "the claim is still held"
            with cluster.lock:
                assert not any(n.state != NodeState.HEALTHY for n in cluster.nodes.values())
            handle = local_env.client.get_workflow_handle(f"remediation-{other}")
            with pytest.raises(RPCError, match="not found"):
                await handle.describe()  # never started: the budget was full all along
            # The first run's history ends in continue-as-new with the state as input.
            history = await local_env.client.get_workflow_handle(
                detector.id, run_id=first_run).fetch_history()
            assert history.events[-1].event_type == \
                EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        finally:
            gate.set()
            await cleanup(local_env.client, detector, cluster)


async def test_breaker_state_survives_continue_as_new(local_env):
    env = local_env
    cluster, names = fleet(10)
    cluster.verdicts = [xid_verdict(n) for n in names[:5]]
    s = settings(max_unavailable=1, ticks_per_run=2)
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, s)
        try:
            first_run = (await detector.describe()).run_id

            async def two_runs_later() -> bool:
                desc = await detector.describe()
                return desc.run_id != first_run and (await dview(detector)).ticks_total >= 5
            await until(two_runs_later, timeout=15, what="continue-as-new twice")
            view = await dview(detector)
            assert view.breaker_open and "5 of 10" in view.breaker_reason
            assert started_children(cluster) == []
        finally:
            await cleanup(env.client, detector, cluster)


async def test_children_are_abandoned_not_terminated(local_env):
    """A remediation outlives its detector; it takes its next disruptive step once a
    detector runs again and adopts it (it cannot know the lease's token: it learns it)."""
    env = local_env
    cluster, names = fleet(10)
    gate = threading.Event()
    cluster.job_gates["reboot"] = gate  # the remediation stays in repair
    cluster.verdicts = [xid_verdict(names[0])]
    s = settings(max_unavailable=1, ticks_per_run=2)
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, s)
        child = env.client.get_workflow_handle(f"remediation-{names[0]}")
        try:
            first_run = (await detector.describe()).run_id
            await until(lambda: cluster.nodes[names[0]].state == NodeState.REPAIRING)

            async def new_run() -> bool:
                return (await detector.describe()).run_id != first_run
            await until(new_run, what="continue-as-new")
            await ticks(detector, 1)
            assert (await child.describe()).status == WorkflowExecutionStatus.RUNNING
            await detector.terminate("operator removed the detector")
            await asyncio.sleep(0.3)
            assert (await child.describe()).status == WorkflowExecutionStatus.RUNNING
            gate.set()
            # Rebooted, it waits for a detector to confirm its lease before validating.
            await until(lambda: cluster.nodes[names[0]].state == NodeState.REPAIRING
                        and any(c[0] == "check_node_returned" for c in cluster.calls))
            await asyncio.sleep(1)
            assert (await child.describe()).status == WorkflowExecutionStatus.RUNNING
            assert not any(c[0] == "run_node_job" and c[1].kind == "validate"
                           for c in cluster.calls), "no validation without a lease"
            cluster.visible_remediations = [names[0]]
            again = await start(env.client, queue, s)
            cluster.detector_id = again.id
            result = await asyncio.wait_for(child.result(), 20)
            assert result["outcome"] == "healthy"
            cluster.visible_remediations = []
            assert (await ticks(again, 2)).leases == [], "its close ends the lease"
        finally:
            gate.set()
            await cleanup(env.client, detector, cluster)
            if cluster.detector_id:
                await cleanup(env.client, env.client.get_workflow_handle(cluster.detector_id),
                              cluster)


# ------------------------------------------------------------------ history size


async def _first_run_history_length(client: Client, size: int, ticks_per_run: int) -> int:
    cluster, names = fleet(size)
    cluster.nodes[names[0]].state = NodeState.DRAINING  # budget full: a waiting node too
    cluster.visible_remediations = [names[0]]
    cluster.verdicts = [xid_verdict(names[1])]
    s = settings(max_unavailable=1, ticks_per_run=ticks_per_run,
                 interval=timedelta(milliseconds=200))
    async with worker_for(client, cluster) as queue:
        detector = await start(client, queue, s)
        try:
            first_run = (await detector.describe()).run_id

            async def new_run() -> bool:
                return (await detector.describe()).run_id != first_run
            await until(new_run, timeout=20, what="continue-as-new")
            history = await client.get_workflow_handle(
                detector.id, run_id=first_run).fetch_history()
        finally:
            await cleanup(client, detector, cluster)
    assert history.events[-1].event_type == \
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    return len(history.events)


async def test_history_events_per_tick_do_not_depend_on_fleet_size(detector_ts_env):
    env = detector_ts_env
    small = await _first_run_history_length(env.client, 10, 6)
    large = await _first_run_history_length(env.client, 1000, 6)
    assert small == large
    longer = await _first_run_history_length(env.client, 10, 8)
    per_tick = (longer - small) / 2
    # The lease holders (one is held here) are looked up inside the observation.
    assert per_tick <= 12, f"{per_tick} events per idle tick"


# ------------------------------------------------------------------ dry-run


async def test_dry_run_plans_each_node_once_and_mutates_nothing(detector_ts_env):
    env = detector_ts_env
    cluster, names = fleet(10)
    slow, quick = names[:2]
    gate = threading.Event()
    cluster.claim_gates[slow] = gate  # its dry-run child is still running for a few ticks
    cluster.verdicts = [xid_verdict(slow), xid_verdict(quick)]
    s = settings(max_unavailable=2, dry_run=True)
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, s)
        try:
            await until(lambda: started_children(cluster) == [quick], what="quick planned")
            await ticks(detector, 3)
            gate.set()
            await until(lambda: sorted(started_children(cluster)) == sorted([slow, quick]),
                        what="slow planned")
            view = await ticks(detector, 4)
        finally:
            await cleanup(env.client, detector, cluster)
    assert sorted(started_children(cluster)) == sorted([slow, quick]), "one plan per node"
    assert view.started_total == 2
    assert cluster.mutations == []
    assert not view.in_flight, "a dry-run child that finished holds no slot"


# ------------------------------------------------------------------ a fresh detector's memory


@asynccontextmanager
async def worker_with_visibility(client: Client, cluster: FakeCluster) -> AsyncIterator[str]:
    """Like ``worker_for``, but the detector asks the server's real visibility store which
    remediations run (the query, the search attributes and the task-queue filter)."""
    queue = f"tq-{uuid.uuid4()}"
    fakes = [a for a in cluster.activities()
             if getattr(a, "__name__", "") != "list_running_remediations"]
    real = VisibilityActivities(client).list_running_remediations
    with ThreadPoolExecutor(16) as pool:
        async with Worker(client, task_queue=queue,
                          workflows=[RemediationWorkflow, DetectorWorkflow],
                          activities=[*fakes, real], activity_executor=pool):
            try:
                yield queue
            finally:
                cluster.release_gates()


async def test_a_fresh_detector_counts_starts_whose_claim_has_not_landed(local_env):
    """`detector stop` and `start` (or a terminated detector) between a child's start and
    its claim: the new detector cannot see the node as labelled, and must still not admit
    past the budget."""
    client = local_env.client
    cluster, names = fleet(10)
    slow, other = names[:2]
    gate = threading.Event()
    cluster.claim_gates[slow] = gate  # started, its claim not landed yet
    cluster.verdicts = [xid_verdict(slow)]
    s = settings(max_unavailable=1, **NO_BREAKER)
    async with worker_with_visibility(client, cluster) as queue:
        first = await start(client, queue, s)
        second = None
        child = client.get_workflow_handle(f"remediation-{slow}")
        try:
            async def child_running() -> bool:
                try:
                    return (await child.describe()).status == WorkflowExecutionStatus.RUNNING
                except RPCError:
                    return False
            await until(child_running, what="the first detector's child")
            await first.terminate("detector stop")
            cluster.verdicts = [xid_verdict(slow), xid_verdict(other)]
            second = await start(client, queue, s)
            cluster.detector_id = second.id  # the one detector (a fixed ID in production)
            view = await ticks(second, 2)
            assert view.in_flight == [slow], "the running child holds the only slot"
            assert view.waiting == [f"{other} (reboot: budget full (1/1))"]
            assert started_children(cluster) == [], "the claim is still held"
            gate.set()
            await until(lambda: set(cluster.claimed) == {slow, other}
                        and all(n.state == NodeState.HEALTHY for n in cluster.nodes.values()),
                        timeout=30, what="both remediated, one after the other")
        finally:
            gate.set()
            if second is not None:
                await cleanup(client, second, cluster)
            await cleanup(client, first, cluster)
    assert cluster.max_out_of_service() == 1, "never two nodes out at once"


async def test_a_fresh_detector_admits_nothing_until_visibility_answers(detector_ts_env):
    env = detector_ts_env
    cluster, names = fleet(10)
    cluster.verdicts = [xid_verdict(names[0])]
    cluster.visibility_error = "visibility store unavailable"
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, settings(max_unavailable=1))
        try:
            view = await ticks(detector, 2, timeout=30)
            assert "listing running remediations failed" in view.last_errors[0]
            assert "visibility store unavailable" in view.last_errors[0]
            with cluster.lock:
                assert not any(c[0] == "observe_fleet" for c in cluster.calls)
            assert started_children(cluster) == []
            cluster.visibility_error = None
            await until(lambda: started_children(cluster) == [names[0]], what="recovery")
        finally:
            await cleanup(env.client, detector, cluster)


async def test_adopted_remediations_hold_slots_until_they_close(detector_ts_env):
    """What visibility lists when the detector starts is adopted: each holds a slot
    whatever its node's label says, until Temporal says it closed. A clean close frees it;
    a terminated one keeps it as an orphan's (fail closed) until release-orphan."""
    env = detector_ts_env
    cluster, names = fleet(10)
    stuck, labelled, ending, flagged = names[:4]
    cluster.visible_remediations = [stuck, labelled, ending]
    cluster.nodes[labelled].state = NodeState.DRAINING
    cluster.verdicts = [xid_verdict(flagged)]
    s = settings(max_unavailable=3, **NO_BREAKER)
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, s)
        try:
            view = await ticks(detector, 2)
            assert view.in_flight == sorted([stuck, labelled, ending])
            assert view.waiting == [f"{flagged} (reboot: budget full (3/3))"]
            assert {lease.node for lease in view.leases if lease.adopted} == {
                stuck, labelled, ending}
            # ending's remediation closed without ever claiming its node.
            cluster.visible_remediations = [stuck, labelled]
            cluster.closed_remediations[ending] = "COMPLETED"
            await until(lambda: started_children(cluster) == [flagged], what="admission")
            view = await ticks(detector, 2)
            assert stuck in view.in_flight and labelled in view.in_flight
            assert ending not in view.in_flight
            # A label that says healthy frees nothing; a terminated remediation neither.
            cluster.nodes[labelled].state = NodeState.HEALTHY
            cluster.visible_remediations = [stuck]
            cluster.closed_remediations[labelled] = "TERMINATED"
            view = await ticks(detector, 2)
            assert labelled in view.in_flight and labelled in view.orphans
            with cluster.lock:
                asked = sum(1 for c in cluster.calls if c[0] == "list_running_remediations")
            await ticks(detector, 3)
            with cluster.lock:
                assert asked == sum(1 for c in cluster.calls
                                    if c[0] == "list_running_remediations") == 1, \
                    "visibility is asked once, when the detector starts"
        finally:
            await cleanup(env.client, detector, cluster)


def _busy_and_orphaned() -> tuple[FakeCluster, str, str]:
    """Nine nodes: one in remediation (visible in Temporal), one an orphan under our taint."""
    cluster, names = fleet(9)
    busy, orphan = names[:2]
    cluster.nodes[busy].state = NodeState.DRAINING
    cluster.visible_remediations = [busy]
    cluster.nodes[orphan].state = NodeState.DRAINING
    cluster.nodes[orphan].tainted = True
    cluster.orphans = [orphan]
    return cluster, busy, orphan


async def _first_run_with_a_rejected_typo(detector: WorkflowHandle) -> str:
    """After a first tick, a mistyped signal recorded as rejected: the run's ID."""
    first_run = (await detector.describe()).run_id
    await ticks(detector, 1)
    await detector.signal("pasue", OP)  # a typo, recorded as rejected

    async def recorded() -> bool:
        return bool((await dview(detector)).rejected_commands)
    await until(recorded, what="the rejected signal")
    assert first_run is not None
    return first_run


async def test_continue_as_new_carries_fleet_size_busy_nodes_orphans_and_rejections(local_env):
    """The next run knows, before its first observation (which fails here), how many shards
    observe the fleet, which nodes are in remediation, which are orphans, and which
    signals were rejected; visibility is asked once per detector, not once per run."""
    cluster, busy, orphan = _busy_and_orphaned()
    s = settings(max_unavailable=2, observe_shard_size=4, ticks_per_run=3)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        try:
            first_run = await _first_run_with_a_rejected_typo(detector)
            # From now on no observation refreshes what the first tick learned.
            cluster.observe_error = "dcgm-exporter unreachable"

            async def new_run() -> bool:
                return (await detector.describe()).run_id != first_run
            await until(new_run, timeout=20, what="continue-as-new")
            view = await dview(detector)
            assert view.orphans == [orphan]
            assert [r.name for r in view.rejected_commands] == ["pasue"]
            why = await rejected(detector, DetectorWorkflow.remediate, ManualRemediation(
                node=busy, action=Action.REBOOT, operator="bob", reason="user report"))
            assert "already in remediation (draining)" in why
            await ticks(detector, 1)
        finally:
            await cleanup(local_env.client, detector, cluster)
    with cluster.lock:
        shards = [c[1].shards for c in cluster.calls if c[0] == "observe_fleet"]
        seeds = [c for c in cluster.calls if c[0] == "list_running_remediations"]
    assert shards[0] == 1 and len(shards) > 6, shards
    assert set(shards[1:]) == {3}, "the new run observes in three shards from its first tick"
    assert len(seeds) == 1


async def test_a_detector_started_from_its_carry_query_goes_on_as_after_continue_as_new(
        local_env):
    """The carry query answers what a continue-as-new would carry at that moment, and
    changes nothing (the detector ticks on in the same run). A detector started from the
    answer (``gpu-remediate simulate`` moves one to the next test server so) knows, before
    its first observation (which fails here), the pause, how many shards observe the fleet,
    which nodes are in remediation, which are orphans and which signals were rejected."""
    cluster, busy, orphan = _busy_and_orphaned()
    s = settings(max_unavailable=2, observe_shard_size=4, ticks_per_run=1000)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        again: WorkflowHandle | None = None
        try:
            first_run = await _first_run_with_a_rejected_typo(detector)
            await detector.execute_update(DetectorWorkflow.pause, OP)
            cluster.observe_error = "dcgm-exporter unreachable"
            carried = await detector.query(DetectorWorkflow.carry)
            assert isinstance(carried, DetectorInput)
            st = carried.state
            assert (st.last_managed, st.orphans, st.paused) == (9, [orphan], True)
            assert st.busy.get(busy) and [r.name for r in st.rejected] == ["pasue"]
            assert st.ticks_total >= 1 and carried.settings == s
            await ticks(detector, 2)
            assert (await detector.describe()).run_id == first_run, "a query hands nothing over"
            await detector.terminate("moved to another server")
            with cluster.lock:
                observed = sum(1 for c in cluster.calls if c[0] == "observe_fleet")
            again = await start(local_env.client, queue, carried.settings, carried.state)
            view = await dview(again)
            assert view.paused and view.orphans == [orphan]
            assert [r.name for r in view.rejected_commands] == ["pasue"]
            why = await rejected(again, DetectorWorkflow.remediate, ManualRemediation(
                node=busy, action=Action.REBOOT, operator="bob", reason="user report"))
            assert "already in remediation (draining)" in why
            view = await ticks(again, 1)
            assert view.ticks_total > st.ticks_total
        finally:
            await cleanup(local_env.client, detector, cluster)
            if again is not None:
                await cleanup(local_env.client, again, cluster)
    with cluster.lock:
        shards = [c[1].shards for c in cluster.calls if c[0] == "observe_fleet"][observed:]
    assert shards and set(shards) == {3}, "observed in three shards from its first tick"


# ------------------------------------------------------------------ heat


async def test_a_heat_cordon_takes_no_slot_and_drains_only_in_one(local_env):
    """With the only drain slot held, a hot node is cordoned at once anyway; still hot
    after escalate_after, it must be drained: it stays cordoned and asks the detector for
    a slot, and drains (then quarantines) only once the slot frees. The budget is never
    exceeded, by a heat escalation either."""
    env = local_env
    cluster, names = fleet(10)
    holder, hot_node = names[0], names[1]
    cluster.nodes[holder].state = NodeState.DRAINING  # the only slot is taken
    cluster.visible_remediations = [holder]
    cluster.thermal_results = [ThermalWatchResult(outcome="hot", message="93 C")]
    cluster.verdicts = [xid_verdict(hot_node, 0, Action.THERMAL)]
    # Real time (the dev server): seconds stand for the production minutes.
    heat = ThermalSettings(escalate_after=timedelta(seconds=2),
                           poll_interval=timedelta(milliseconds=300), hold=timedelta(seconds=1))
    s = settings(max_unavailable=1, thermal_debounce=timedelta(0),
                 remediation=FAST.model_copy(update={"thermal": heat}))
    async with worker_for(env.client, cluster) as queue:
        detector = await start(env.client, queue, s)
        try:
            await until(lambda: cluster.nodes[hot_node].state == NodeState.CORDONED, 15,
                        "cordoned for heat with the budget full")
            await asyncio.sleep(6)  # three times escalate_after
            assert cluster.nodes[hot_node].state == NodeState.CORDONED
            assert not [c for c in cluster.calls
                        if c[0] == "drain_node" and c[1].node == hot_node], "drained unslotted"
            view = await dview(detector)
            assert f"{hot_node} (drain for heat: budget full (1/1))" in view.waiting, view
            cluster.nodes[holder].state = NodeState.HEALTHY  # the slot frees
            cluster.visible_remediations = []
            cluster.closed_remediations[holder] = "COMPLETED"
            await until(lambda: cluster.nodes[hot_node].state == NodeState.QUARANTINED, 30,
                        "drained in the freed slot and quarantined")
        finally:
            await cleanup(env.client, detector, cluster)
    assert any(c[0] == "drain_node" and c[1].node == hot_node for c in cluster.calls)
    assert "still hot" in cluster.nodes[hot_node].history[-1].outcome
    assert cluster.max_out_of_service(cordoned_counts=False) == 1


# ------------------------------------------------------------------ leases


async def test_a_claim_in_a_brownout_holds_its_lease_and_nothing_lands_together(local_env):
    """An API brownout where reads work and writes fail: the first claim fails with 500
    four times (retry backoff 1, 2, 4, 8 s: about 15 s, here dozens of ticks; in
    production any length up to claim_timeout). Its lease holds the only slot the whole
    time, with no timer: the second node is admitted only once the first remediation is
    over, never beside it."""
    cluster, names = fleet(10)
    first, second = names[:2]
    cluster.claim_failures[first] = 4
    cluster.verdicts = [xid_verdict(first), xid_verdict(second)]
    s = settings(max_unavailable=1, interval=timedelta(milliseconds=200), **NO_BREAKER)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        try:
            await until(lambda: any(c[0] == "claim_failed" for c in cluster.calls),
                        what="the first claim failing")
            view = await ticks(detector, 10, timeout=30)
            assert view.in_flight == [first] and cluster.claimed == []
            assert view.waiting == [f"{second} (reboot: budget full (1/1))"]
            await until(lambda: cluster.claimed == [first, second]
                        and all(n.state == NodeState.HEALTHY for n in cluster.nodes.values()),
                        timeout=90, what="both remediated, one after the other")
        finally:
            await cleanup(local_env.client, detector, cluster)
    with cluster.lock:
        assert sum(1 for c in cluster.calls if c[0] == "claim_failed") == 4
    assert cluster.max_out_of_service() == 1, "the waiting claim never landed beside another"


async def test_a_claim_that_cannot_complete_ends_untouched_and_frees_its_lease(local_env):
    """A claim that fails for longer than claim_timeout ends the remediation without the
    node, says why (Event ClaimFailed), and its lease is freed: the next node is admitted,
    still one at a time."""
    cluster, names = fleet(10)
    first, second = names[:2]
    cluster.claim_failures[first] = 10**6
    cluster.verdicts = [xid_verdict(first), xid_verdict(second)]
    fast_claim = FAST.model_copy(update={"claim_timeout": timedelta(seconds=4)})
    s = settings(max_unavailable=1, interval=timedelta(milliseconds=300),
                 remediation=fast_claim, **NO_BREAKER)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        child = local_env.client.get_workflow_handle(f"remediation-{first}")
        try:
            await until(lambda: any(c[0] == "claim_failed" for c in cluster.calls),
                        what="the first claim failing")
            result = await asyncio.wait_for(child.result(), 30)
            cluster.verdicts = [xid_verdict(second)]
            await until(lambda: second in cluster.claimed, timeout=30,
                        what="the second node admitted once the first claim gave up")
        finally:
            await cleanup(local_env.client, detector, cluster)
    assert result["outcome"] == "released" and "claim did not complete" in result["message"]
    assert any(n == first and reason == "ClaimFailed" for n, reason, _ in cluster.events)
    assert first not in cluster.claimed and not cluster.nodes[first].tainted
    assert cluster.max_out_of_service() == 1


# ------------------------------------------------------------------ the config is the ceiling


async def test_a_reconfigure_may_tighten_and_never_loosen_past_the_workers_limits(local_env):
    """`up --max-unavailable 1`, then a client's reconfigure to "100%" with the breaker off
    and drain force on: refused, naming each field and limit; the budget stays 1. A
    tighter reconfigure is accepted."""
    cluster, _ = fleet(10)
    s = settings(max_unavailable=1)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        try:
            await ticks(detector, 1)
            loose = s.model_copy(update={
                "max_unavailable": "100%", "breaker_max_flagged_percent": 100.0,
                "remediation": s.remediation.model_copy(update={"drain": s.remediation.drain
                                                                .model_copy(update={
                                                                    "deadline_policy":
                                                                    "force"})})})
            why = await rejected(detector, DetectorWorkflow.reconfigure, loose)
            assert "max_unavailable: 100% is past the limit limits.max_unavailable = 1" in why
            assert "breaker_max_flagged_percent" in why and "deadline_policy" in why
            assert (await ticks(detector, 1)).budget == 1
            tighter = s.model_copy(update={"breaker_max_flagged_nodes": 5})
            ack = await detector.execute_update(DetectorWorkflow.reconfigure, tighter)
            assert "breaker_max_flagged_nodes" in ack.message
        finally:
            await cleanup(local_env.client, detector, cluster)


async def test_a_detector_started_past_the_limits_admits_nothing(local_env):
    """A stray client that stops the detector and starts one with a looser budget gains
    nothing: the worker's own limits hold it until it is reconfigured within them."""
    cluster, names = fleet(10)
    cluster.verdicts = [xid_verdict(n) for n in names[:3]]
    s = settings(max_unavailable=3, **NO_BREAKER)
    cluster.limits = LimitsSettings.from_settings(settings(max_unavailable=1, **NO_BREAKER))
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        try:
            view = await ticks(detector, 2)
            assert started_children(cluster) == []
            assert all("past the worker's limits" in w for w in view.waiting), view.waiting
            await detector.execute_update(DetectorWorkflow.reconfigure,
                                          s.model_copy(update={"max_unavailable": 1}))
            await until(lambda: len(started_children(cluster)) >= 1, what="admission resumes")
        finally:
            await cleanup(local_env.client, detector, cluster)
    assert cluster.max_out_of_service() == 1


# ------------------------------------------------------------------ the record wins


async def test_a_node_relabelling_itself_moves_no_slot_and_its_label_is_rewritten(local_env):
    """A kubelet can write its own labels. A quarantined node that relabels itself
    draining blocks nothing (budget 1: another node is admitted); a node mid-drain that
    relabels itself quarantined frees nothing and counts as no quarantine. Each label is
    rewritten from the record, with a StateMismatch Event."""
    cluster, names = fleet(10)
    quarantined, draining, flagged = names[:3]
    for node, label, record in ((quarantined, NodeState.DRAINING, NodeState.QUARANTINED),
                                (draining, NodeState.QUARANTINED, NodeState.DRAINING)):
        cluster.nodes[node].state, cluster.nodes[node].tainted = label, True
        cluster.visible_states[node] = record
    cluster.visible_remediations = [quarantined, draining]
    cluster.verdicts = [xid_verdict(flagged)]
    s = settings(max_unavailable=2, max_quarantined=None, **NO_BREAKER)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await start(local_env.client, queue, s)
        try:
            await until(lambda: cluster.nodes[quarantined].state == NodeState.QUARANTINED
                        and cluster.nodes[draining].state == NodeState.DRAINING, timeout=30,
                        what="both labels rewritten from the record")
            view = await dview(detector)
            assert view.quarantined == [quarantined]
            assert draining in view.in_flight and quarantined not in view.in_flight
            await until(lambda: flagged in started_children(cluster),
                        what="the quarantined node holds no slot whatever its label says")
        finally:
            await cleanup(local_env.client, detector, cluster)
    assert {n for n, reason, _ in cluster.events if reason == "StateMismatch"} == {
        quarantined, draining}
