"""The node-only woken tick (workflows/reports.py, NODE_TICK_PATCH): a detector woken by node
reports alone observes just the reported nodes and admits them under the leases' budget,
the rest of the fleet as its last full observation saw it. On the time-skipping server (an
hour between full ticks: only a report can bring another observation)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from tests.workflows.test_detector import cleanup, dview, fleet, settings, start
from workflows.messages import DetectorState, NodeReport, ObserveInput
from workflows.reports import NODE_REPORT_SIGNAL
from workflows.transitions import NodeState

HOUR = timedelta(hours=1)


def observations(cluster: FakeCluster) -> list[ObserveInput]:
    with cluster.lock:
        return [c[1] for c in cluster.calls if c[0] == "observe_fleet"]


def report(node: str, xid: int = 79) -> NodeReport:
    return NodeReport(node=node, xid=xid, gpu="0", at=datetime.now(UTC),
                      line=f"NVRM: Xid (PCI:0000:18:00): {xid}")


async def test_a_report_observes_only_its_node_and_starts_its_remediation(time_skipping_env):
    client = time_skipping_env.client
    cluster, names = fleet(4)
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=HOUR))
        try:
            await until(lambda: len(observations(cluster)) >= 1, what="first tick")
            # The fault shows from now on: only a fresh look at the node can see it.
            cluster.verdicts = [xid_verdict(names[2])]
            await h.signal(NODE_REPORT_SIGNAL, report(names[2]))
            await until(lambda: names[2] in cluster.claimed, what="the reported node claimed")
            seen = observations(cluster)
            assert len(seen) == 2, "one node-only observation, no full tick"
            assert seen[0].nodes == [] and seen[1].nodes == [names[2]]
            assert [r.node for r in seen[1].reports] == [names[2]]
            assert seen[1].lease_workflows == [], "the record is looked up at full ticks"
            view = await dview(h)
            assert view.in_flight == [names[2]] and view.ticks_total == 1
            assert view.budget == 1, "the budget is the full observation's (4 nodes)"
        finally:
            await cleanup(client, h, cluster)


async def test_a_report_the_fresh_evaluation_finds_healthy_starts_nothing(time_skipping_env):
    client = time_skipping_env.client
    cluster, names = fleet(3)
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=HOUR))
        try:
            await until(lambda: len(observations(cluster)) >= 1, what="first tick")

            async def ticked() -> bool:  # the first tick's admission done, not only observed
                return (await dview(h)).last_tick is not None
            await until(ticked, what="the first tick's admission")
            first = (await dview(h)).last_tick
            await h.signal(NODE_REPORT_SIGNAL, report(names[0], xid=13))

            async def admitted() -> bool:
                return (await dview(h)).last_tick != first
            await until(admitted, what="the node-only tick's admission")
            assert [o.nodes for o in observations(cluster)] == [[], [names[0]]]
            view = await dview(h)
            assert view.in_flight == [] and view.started_total == 0
            assert cluster.claimed == []
            # More reports from it within the gap: no more observations (its reports wait
            # for the full tick, which merges them).
            for _ in range(5):
                await h.signal(NODE_REPORT_SIGNAL, report(names[0], xid=13))
            await asyncio.sleep(1.5)
            assert len(observations(cluster)) == 2
        finally:
            await cleanup(client, h, cluster)


async def test_a_report_does_not_start_another_flagged_node(time_skipping_env):
    """Another node flagged at the last full tick and waiting for the budget stays waiting:
    a report acts only for the node that sent it."""
    client = time_skipping_env.client
    cluster, names = fleet(4)
    cluster.verdicts = [xid_verdict(names[0]), xid_verdict(names[1])]
    cluster.claim_gates[names[0]] = gate = threading.Event()
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=HOUR, max_unavailable=1))
        try:
            await until(lambda: len(observations(cluster)) >= 1, what="first tick")

            async def held() -> bool:  # the claim itself waits on the gate
                v = await dview(h)
                return v.in_flight == [names[0]] and len(v.waiting) == 1
            await until(held, what="the first node's lease, the second waiting")
            # names[0] holds the slot; names[1] waits. names[3] reports, healthy: nothing
            # starts, names[1] still waits.
            await h.signal(NODE_REPORT_SIGNAL, report(names[3], xid=13))
            await until(lambda: len(observations(cluster)) >= 2, what="a node-only tick")
            await asyncio.sleep(0.5)
            view = await dview(h)
            assert view.in_flight == [names[0]]
            assert [w.split(" ", 1)[0] for w in view.waiting] == [names[1]]
            assert not any(c[0] == "claim_node" for c in cluster.calls), "the gate held"
            gate.set()
        finally:
            await cleanup(client, h, cluster)


async def test_two_reports_at_once_with_budget_one_start_one(time_skipping_env):
    client = time_skipping_env.client
    cluster, names = fleet(4)
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=HOUR, max_unavailable=1))
        try:
            await until(lambda: len(observations(cluster)) >= 1, what="first tick")
            cluster.verdicts = [xid_verdict(names[1]), xid_verdict(names[2])]
            await asyncio.gather(h.signal(NODE_REPORT_SIGNAL, report(names[1])),
                                 h.signal(NODE_REPORT_SIGNAL, report(names[2])))

            async def settled() -> bool:
                v = await dview(h)
                return len(v.in_flight) == 1 and len(v.waiting) == 1
            await until(settled, what="one started, one waiting")
            # The started remediation runs to its end; its lease holds the slot until the
            # next full tick sees it closed, so the other never starts meanwhile.
            await until(lambda: len(cluster.claimed) == 1
                        and all(n.state == NodeState.HEALTHY for n in cluster.nodes.values()),
                        what="the first remediation done")
            await asyncio.sleep(1.0)
            view = await dview(h)
            assert len(cluster.claimed) == 1 and view.started_total == 1
            assert "budget full (1/1)" in view.waiting[0]
            assert cluster.max_out_of_service() <= 1
        finally:
            await cleanup(client, h, cluster)


async def test_a_report_of_a_node_in_remediation_wakes_nothing(time_skipping_env):
    client = time_skipping_env.client
    cluster, names = fleet(2)
    cluster.verdicts = [xid_verdict(names[0])]
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=HOUR))
        try:
            await until(lambda: names[0] in cluster.claimed, what="the remediation's claim")
            await h.signal(NODE_REPORT_SIGNAL, report(names[0]))
            await asyncio.sleep(1.0)
            assert len(observations(cluster)) == 1
        finally:
            await cleanup(client, h, cluster)


async def test_reports_are_carried_across_continue_as_new(time_skipping_env):
    """A report the run had not observed yet when it continued as new is in the next run's
    first observation."""
    client = time_skipping_env.client
    cluster, names = fleet(2)
    async with worker_for(client, cluster) as queue:
        h = await start(client, queue, settings(interval=HOUR),
                        DetectorState(reports=[report(names[1])]))
        try:
            await until(lambda: len(observations(cluster)) >= 1, what="first tick")
            assert [r.node for r in observations(cluster)[0].reports] == [names[1]]
        finally:
            await cleanup(client, h, cluster)
