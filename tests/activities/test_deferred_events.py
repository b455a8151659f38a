"""RemediationDeferred: the detector's report_admission activity puts an Event on each node
that waits for admission, once per node and reason (the original tool's Event)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.notices import CIRCUIT_BREAKER_OPEN, REMEDIATION_DEFERRED
from tests.activities.conftest import Cluster
from workflows.messages import AdmissionReport, DetectorView


@workflow.defn(name="DeferralProbe")
class DeferralProbe:
    """Stands in for the detector: answers ``view`` and sends reports like it does."""

    def __init__(self) -> None:
        self.waiting: list[str] = []

    @workflow.query
    def view(self) -> DetectorView:
        return DetectorView(paused=False, breaker_open=False, breaker_reason="", budget=1,
                            in_flight=["gpu-node-01"], waiting=self.waiting, last_tick=None,
                            last_errors=[], ticks_total=0, started_total=0)

    @workflow.run
    async def run(self, ticks: list[list[str]]) -> None:
        for waiting in ticks:
            self.waiting = waiting
            await workflow.execute_activity(
                "report_admission",
                AdmissionReport(budget=1, in_use=1, waiting=len(waiting), breaker_open=False,
                                paused=False),
                start_to_close_timeout=timedelta(seconds=30))


async def run_ticks(env: WorkflowEnvironment, fleet: FleetActivities,
                    ticks: list[list[str]]) -> None:
    queue = f"deferred-{uuid.uuid4()}"
    async with Worker(env.client, task_queue=queue, workflows=[DeferralProbe],
                      activities=[fleet.report_admission],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        await env.client.execute_workflow(DeferralProbe.run, ticks, id=f"probe-{uuid.uuid4()}",
                                          task_queue=queue)


async def test_a_waiting_node_gets_one_deferred_event_per_reason(
        cluster: Cluster, time_skipping_env: WorkflowEnvironment) -> None:
    fleet = FleetActivities(cluster.api, ExporterSettings(mode="template"))
    await run_ticks(time_skipping_env, fleet, [
        ["gpu-node-02 (reset: budget full (1/1))"],
        ["gpu-node-02 (reset: budget full (1/1))", "gpu-node-03 (reboot: budget full (1/1))"],
        ["gpu-node-02 (reset: budget full (1/1))", "gpu-node-03 (reboot: budget full (1/1))"],
        ["gpu-node-02 (reset: paused)", "gpu-node-03 (reboot: paused)"],
    ])
    two = cluster.events("gpu-node-02", REMEDIATION_DEFERRED)
    assert sorted(e.message for e in two) == [
        "remediation deferred: reset: budget full (1/1); it starts when admitted",
        "remediation deferred: reset: paused; it starts when admitted"]
    assert len(cluster.events("gpu-node-03", REMEDIATION_DEFERRED)) == 2
    assert cluster.events("gpu-node-01", REMEDIATION_DEFERRED) == []  # in flight


async def test_a_node_that_waits_again_later_is_announced_again(
        cluster: Cluster, time_skipping_env: WorkflowEnvironment) -> None:
    fleet = FleetActivities(cluster.api, ExporterSettings(mode="template"))
    await run_ticks(time_skipping_env, fleet, [
        ["gpu-node-02 (reset: budget full (1/1))"], [],
        ["gpu-node-02 (reset: budget full (1/1))"]])
    assert len(cluster.events("gpu-node-02", REMEDIATION_DEFERRED)) == 2


async def test_the_nodes_that_tripped_the_breaker_get_one_event_per_trip(
        cluster: Cluster) -> None:
    fleet = FleetActivities(cluster.api, ExporterSettings(mode="template"))
    env = ActivityEnvironment()
    why = "2 remediations ended in quarantine within 1:00:00 (gpu-node-02, gpu-node-03; limit 2)"

    def report(open_: bool) -> AdmissionReport:
        return AdmissionReport(budget=1, in_use=0, waiting=0, breaker_open=open_, paused=False,
                               breaker_reason=why if open_ else "",
                               breaker_nodes=["gpu-node-02", "gpu-node-03"] if open_ else [])

    for open_ in (True, True, False, True):  # tripped, still open, resumed, tripped again
        await env.run(fleet.report_admission, report(open_))
    for node in ("gpu-node-02", "gpu-node-03"):
        events = cluster.events(node, CIRCUIT_BREAKER_OPEN)
        assert len(events) == 2, "once per trip, not once per report"
        assert all(why in e.message and e.type == "Warning" for e in events)
    assert cluster.events("gpu-node-01", CIRCUIT_BREAKER_OPEN) == []
