"""Remediations that live for days: no run outgrows its history, and a reboot is
confirmed by the node, never by the Job. Time-skipping server, in-memory activities."""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import WorkflowHandle

from tests.workflows.fakes import FakeCluster, xid_verdict
from tests.workflows.test_remediation import end_in_hold, running
from workflows.messages import DrainResult, RemediationInput, RemediationResult
from workflows.remediation import RemediationWorkflow
from workflows.settings import DrainSettings, RemediationSettings
from workflows.transitions import NodeState

BLOCKED = DrainResult(outcome="blocked", remaining=["team-a/trainer-1"],
                      blocking_pdb="team-a/trainer-pdb")
# A real drain reports after report_after (15 s doubling to 10 min) while a PDB blocks it;
# the fake reports at once, so the workflow's own pause between rounds stands in for the
# activity's wait at its longest: one round every 10 minutes.
WEEK_OF_ROUNDS = 7 * 24 * 6


async def run_sizes(handle: WorkflowHandle) -> list[int]:
    """History events of every run of the workflow, newest first (following the chain of
    continue-as-new back to the first run)."""
    client = handle._client
    history = await client.get_workflow_handle(handle.id).fetch_history()
    sizes: list[int] = []
    while True:
        sizes.append(len(history.events))
        started = history.events[0].workflow_execution_started_event_attributes
        if not started.continued_execution_run_id:
            return sizes
        history = await client.get_workflow_handle(
            handle.id, run_id=started.continued_execution_run_id).fetch_history()


async def test_a_pdb_blocked_for_a_week_continues_as_new_and_ends_when_the_pdb_allows(
        time_skipping_env) -> None:
    cluster = FakeCluster(drain_results=[BLOCKED] * WEEK_OF_ROUNDS + [
        DrainResult(outcome="drained", evicted=["team-a/trainer-1"])])
    settings = RemediationSettings(
        drain=DrainSettings(retry_interval=timedelta(minutes=10), deadline=timedelta(days=7),
                            report_max=timedelta(minutes=10)),
        heartbeat_timeout=timedelta(minutes=20), history_events_per_run=1000)
    async with running(time_skipping_env.client, cluster) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, RemediationInput(node="pdb-week",
                                                      verdict=xid_verdict("pdb-week"),
                                                      settings=settings),
            id="remediation-pdb-week", task_queue=queue)
        result: RemediationResult = await handle.result()
        sizes = await run_sizes(handle)
    assert result.outcome == NodeState.HEALTHY, result
    assert cluster.jobs_run() == ["reboot", "validate"]
    rounds = sum(1 for c in cluster.calls if c[0] == "drain_node")
    assert rounds == WEEK_OF_ROUNDS + 1
    total = sum(sizes)
    print(f"PDB blocked 7 simulated days: {rounds} rounds, {len(sizes)} runs, "
          f"{total} events ({total / 7:.0f} per day), largest run {max(sizes)} events")
    assert len(sizes) >= 2, "the run handed over at least once"
    # Each run hands over at the first loop boundary past the limit (one round is ~10
    # events), far below the server's suggestion (4 Ki events) and its hard limit (50 Ki).
    assert max(sizes) <= 1000 + 30, sizes
    node = cluster.nodes["pdb-week"]
    assert node.states_seen[-1] == "healthy" and not node.tainted and not node.cordoned


async def test_reboot_is_confirmed_by_the_node_coming_back(time_skipping_env) -> None:
    cluster = FakeCluster()
    cluster.node("slow").returns_after = 3
    async with running(time_skipping_env.client, cluster) as queue:
        result = await time_skipping_env.client.execute_workflow(
            RemediationWorkflow.run, RemediationInput(node="slow", verdict=xid_verdict("slow")),
            id="remediation-slow", task_queue=queue)
    assert result.outcome == NodeState.HEALTHY
    checks = [c for c in cluster.calls if c[0] == "check_node_returned"]
    assert len(checks) == 4, "polled until the node showed its new boot"
    assert cluster.jobs_run() == ["reboot", "validate"], "exactly one reboot"
    order = [c[0] for c in cluster.calls if c[0] in ("run_node_job", "check_node_returned")]
    assert order.index("check_node_returned") < len(order) - 1, "validation waits for it"


async def test_a_node_that_never_comes_back_is_quarantined_with_the_reason(
        time_skipping_env) -> None:
    cluster = FakeCluster()
    cluster.node("gone-dark").returns_after = 10**6
    settings = RemediationSettings(reboot_return_timeout=timedelta(minutes=3))
    async with running(time_skipping_env.client, cluster) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, RemediationInput(node="gone-dark",
                                                      verdict=xid_verdict("gone-dark"),
                                                      settings=settings),
            id="remediation-gone-dark", task_queue=queue)
        for _ in range(200):
            await time_skipping_env.sleep(timedelta(minutes=1))
            if cluster.node("gone-dark").state == NodeState.QUARANTINED:
                break
        await end_in_hold(handle)
    node = cluster.nodes["gone-dark"]
    assert node.state == NodeState.QUARANTINED and node.tainted and node.cordoned
    assert cluster.jobs_run() == ["reboot"], "no validation of a node that is not back"
    assert any(e[1] == "NodeDidNotReturn" and "did not return within 0:03:00" in e[2]
               for e in cluster.events), cluster.events
    assert "did not return" in node.history[-1].outcome
