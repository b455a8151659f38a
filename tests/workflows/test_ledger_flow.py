"""A remediation's outcome lands in the repair ledger (workflows/ledger.py), survives
continue-as-new and a worker restart, and a ledger that cannot be written never fails a
remediation."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta

from policy.models import Action
from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from tests.workflows.test_operator_actions import (
    BLOCKED,
    _quarantined_from_draining,
    cmd,
    node_name,
    result_within,
)
from workflows.detector import DetectorWorkflow
from workflows.ledger import LedgerEntry, LedgerGpu
from workflows.messages import DetectorInput, RemediationInput
from workflows.remediation import RemediationWorkflow
from workflows.settings import DetectorSettings, DrainSettings, RemediationSettings
from workflows.transitions import NodeState


async def test_a_repair_lands_in_the_ledger_with_its_steps(time_skipping_env):
    cluster = FakeCluster()
    async with worker_for(time_skipping_env.client, cluster) as queue:
        result = await time_skipping_env.client.execute_workflow(
            RemediationWorkflow.run, RemediationInput(node="n1", verdict=xid_verdict("n1")),
            id=f"remediation-n1-{uuid.uuid4()}", task_queue=queue)
    assert result.outcome == NodeState.HEALTHY
    [entry] = cluster.ledger
    assert (entry.node, entry.action, entry.outcome, entry.fault) == (
        "n1", "reboot", "healthy", "xid-79")
    assert [g.uuid for g in entry.gpus] == ["GPU-n1-0"]
    assert entry.gpu_count == 8
    assert [s.state for s in entry.steps] == ["draining", "repairing", "validating"]
    assert entry.finished >= entry.started
    assert entry.accounted_from is None
    # The ledger's write comes after the node's release: a node back in service first.
    names = [c[0] for c in cluster.calls]
    assert names.index("record_repair") > names.index("release_node")


async def test_a_failed_ledger_write_is_told_and_the_remediation_ends_as_it_would(
        time_skipping_env):
    cluster = FakeCluster(ledger_fails="configmaps is forbidden")
    async with worker_for(time_skipping_env.client, cluster) as queue:
        result = await time_skipping_env.client.execute_workflow(
            RemediationWorkflow.run, RemediationInput(node="n2", verdict=xid_verdict("n2")),
            id=f"remediation-n2-{uuid.uuid4()}", task_queue=queue)
    assert result.outcome == NodeState.HEALTHY
    assert not cluster.nodes["n2"].cordoned and not cluster.nodes["n2"].tainted
    assert cluster.ledger == []
    told = [m for n, r, m in cluster.events if r == "LedgerWriteFailed"]
    assert len(told) == 1 and "forbidden" in told[0] and "healthy" in told[0]


async def test_dry_run_writes_no_ledger_entry(time_skipping_env):
    cluster = FakeCluster()
    async with worker_for(time_skipping_env.client, cluster) as queue:
        await time_skipping_env.client.execute_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n3", verdict=xid_verdict("n3"), dry_run=True),
            id=f"remediation-n3-{uuid.uuid4()}", task_queue=queue)
    assert cluster.ledger == []
    assert not [c for c in cluster.calls if c[0] == "record_repair"]


async def test_quarantine_and_release_are_two_entries_across_continue_as_new_and_a_restart(
        local_env):
    """The quarantine's entry is written before its hold run; the worker stops; a new one
    takes the release: its entry accounts only for the time after the quarantine's."""
    # A drain that stays blocked: the quarantine lands mid-drain however slow the machine.
    cluster, node = FakeCluster(drain_results=[BLOCKED]), node_name("ledger-hold")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await _quarantined_from_draining(local_env.client, cluster, queue, node)
        await until(lambda: len(cluster.ledger) == 1, 10, "the quarantine's ledger entry")

        async def held() -> bool:
            try:
                return (await handle.query(RemediationWorkflow.view_state)).runs >= 2
            except Exception:  # handing over to its hold run
                return False
        await until(held, 10, "the quarantine hold run")
    # The worker is gone; another starts on the same queue and takes the release.
    async with worker_for(local_env.client, cluster, queue):
        await handle.execute_update(RemediationWorkflow.release, cmd("erin", "fan fixed"))
        assert (await result_within(handle)).outcome == NodeState.HEALTHY
    first, second = cluster.ledger
    assert (first.outcome, first.action) == ("quarantined", "quarantine")
    assert "carol" in first.why
    assert (second.outcome, second.workflow_id) == ("healthy", first.workflow_id)
    assert second.started == first.started and second.id != first.id
    assert second.accounted_from == first.finished
    assert "quarantined" in [s.state for s in second.steps]
    assert second.gpu_hours_lost <= second.seconds / 3600 * second.gpu_count
    assert second.finished - second.started >= timedelta(0)


async def test_the_detector_starts_the_next_rung_for_a_relapse_in_probation(local_env):
    """The ledger says the node's reset returned it an hour ago; flagged for a reset again,
    the detector starts a reboot, and the remediation says why."""
    node = node_name("probation")
    cluster = FakeCluster()
    cluster.node(node)
    now = datetime.now(UTC)
    cluster.ledger = [LedgerEntry(
        id="e-earlier", node=node, gpus=[LedgerGpu(index="0", uuid=f"GPU-{node}-0")],
        action="reset", fault="xid-48", outcome="healthy", started=now - timedelta(hours=2),
        finished=now - timedelta(hours=1), workflow_id=f"remediation-{node}")]
    cluster.verdicts = [xid_verdict(node, 48, Action.RESET)]
    async with worker_for(local_env.client, cluster) as queue:
        detector = await local_env.client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=DetectorSettings(
                interval=timedelta(milliseconds=500), remediation=RemediationSettings(
                    drain=DrainSettings(retry_interval=timedelta(milliseconds=100))))),
            id=f"detector-{uuid.uuid4()}", task_queue=queue)
        try:
            await until(lambda: any(c[0] == "claim_node" for c in cluster.calls), 15,
                        "the remediation's claim")
            [claim] = [c[1] for c in cluster.calls if c[0] == "claim_node"]
            assert claim.action == Action.REBOOT
            child = local_env.client.get_workflow_handle(f"remediation-{node}")
            view = await child.query(RemediationWorkflow.view_state)
            assert view.reason.startswith("probation: reset for xid-48")
            assert "next rung: reboot" in view.reason
            observed = [c[1] for c in cluster.calls if c[0] == "observe_fleet"]
            assert observed[0].ledger_lookback == timedelta(days=30)
        finally:
            for h in (detector, local_env.client.get_workflow_handle(f"remediation-{node}")):
                with contextlib.suppress(Exception):
                    await h.terminate("test over")
