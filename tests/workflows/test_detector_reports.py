"""The detector's ``node_report`` signal: a report wakes the detector, and the next
observation carries it (merged there into that node's readings only: see
tests/activities/test_fleet_reports.py). Runs once the handler is in
workflows/detector.py (docs/architecture.md, "The node-bound event path")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.workflows.fakes import until, worker_for, xid_verdict
from tests.workflows.test_detector import cleanup, dview, fleet, settings, start
from workflows.detector import DetectorWorkflow
from workflows.messages import NodeReport, ObserveInput
from workflows.reports import NODE_REPORT_SIGNAL

pytestmark = pytest.mark.skipif(
    not hasattr(DetectorWorkflow, "node_report"),
    reason="the detector's node_report handler is not in workflows/detector.py yet")


def observations(cluster) -> list[ObserveInput]:
    with cluster.lock:
        return [c[1] for c in cluster.calls if c[0] == "observe_fleet"]


async def test_a_report_wakes_the_detector_and_reaches_the_next_observation(local_env):
    client = local_env.client
    cluster, names = fleet(3)
    async with worker_for(client, cluster) as queue:
        # An hour between ticks: only the report can bring the second observation.
        h = await start(client, queue, settings(interval=timedelta(hours=1)))
        try:
            await until(lambda: len(observations(cluster)) >= 1, what="first tick")
            report = NodeReport(node=names[1], xid=79, gpu="0", at=datetime.now(UTC),
                                line="NVRM: Xid (PCI:0000:18:00): 79")
            await h.signal(NODE_REPORT_SIGNAL, report)
            await until(lambda: len(observations(cluster)) >= 2, what="a woken tick")
            assert [(r.node, r.xid) for r in observations(cluster)[1].reports] == [
                (names[1], 79)]
            # The report does not decide: with no verdict in the observation, nothing starts.
            assert (await dview(h)).in_flight == []
        finally:
            await cleanup(client, h, cluster)


async def test_a_bad_report_is_recorded_not_raised(local_env):
    client = local_env.client
    cluster, _ = fleet(1)
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=timedelta(hours=1)))
        try:
            await until(lambda: len(observations(cluster)) >= 1, what="first tick")
            await h.signal(NODE_REPORT_SIGNAL, {"node": "", "xid": "seventy-nine"})

            async def recorded() -> bool:
                return any(r.name == NODE_REPORT_SIGNAL
                           for r in (await dview(h)).rejected_commands)
            await until(recorded, what="the rejection in the view")
            assert len(observations(cluster)) == 1
        finally:
            await cleanup(client, h, cluster)


async def test_reports_of_a_node_in_remediation_are_not_observed_again(local_env):
    client = local_env.client
    cluster, names = fleet(2)
    cluster.verdicts = [xid_verdict(names[0])]
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=timedelta(hours=1)))
        try:
            await until(lambda: names[0] in cluster.claimed, what="the remediation's claim")
            await h.signal(NODE_REPORT_SIGNAL, NodeReport(
                node=names[0], xid=79, gpu="0", at=datetime.now(UTC)))
            # The report wakes nothing (test_woken_tick.py); the next tick does not see it.
            await h.execute_update(DetectorWorkflow.reconfigure,
                                   settings(interval=timedelta(hours=2)))
            await until(lambda: len(observations(cluster)) >= 2, what="a woken tick")
            assert all(not o.reports for o in observations(cluster)[1:])
        finally:
            await cleanup(client, h, cluster)
