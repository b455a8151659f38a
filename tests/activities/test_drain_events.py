"""The drain's Event when the node holds no workload (the original tool's GPUDrained)."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.drain import DrainActivities
from tests.activities.conftest import Cluster
from tests.activities.test_drain import NODE, acts, block_trainer, drain, trainer_on
from tests.polling import wait_for

__all__ = ["acts"]  # the fixture, shared with test_drain


def test_a_finished_drain_records_drain_completed_once(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    trainer_on(cluster, NODE)
    assert env.run(acts.drain_node, drain()).outcome == "drained"
    (event,) = cluster.events(NODE, "DrainCompleted")
    assert event.type == "Normal" and event.message.startswith("drained: evicted 1 pods")
    assert "left in place" in event.message


def test_no_drain_completed_while_blocked_or_in_dry_run(
        cluster: Cluster, acts: DrainActivities, env: ActivityEnvironment) -> None:
    block_trainer(cluster)
    assert env.run(acts.drain_node, drain(report_after=0.5)).outcome == "blocked"
    assert env.run(acts.drain_node, drain(dry_run=True)).outcome == "planned"
    wait_for(lambda: cluster.events(NODE, "DrainBlocked"))
    assert cluster.events(NODE, "DrainCompleted") == []
