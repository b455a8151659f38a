"""One node's health now, and the watch of a node cordoned for heat.

``read_node_health`` reads the node as an observation would (its exporter, its
acknowledged XIDs) and evaluates the policy; ``watch_thermal`` polls it until it stays cool,
shows a fault or runs out of time; ``check_thermal`` looks once and answers only when the
state changed. ``ThermalActivities`` is a part of ``FleetActivities`` (activities/fleet.py).
"""

from __future__ import annotations

import asyncio
import time

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities.fleet_nodes import GpuNode, NodeListing
from activities.scrape import ExporterReading
from policy.models import Action
from policy.rules import evaluate_node, is_thermal_recovered
from workflows import errors as error_types
from workflows.messages import (
    NodeHealth,
    NodeHealthInput,
    ThermalCheckInput,
    ThermalCheckResult,
    ThermalWatchInput,
    ThermalWatchResult,
)
from workflows.transitions import NodeState


class ThermalActivities(ExporterReading, NodeListing):
    """FleetActivities' look at one node's health, and the thermal watch."""

    @activity.defn
    async def read_node_health(self, inp: NodeHealthInput) -> NodeHealth:
        """One node's verdict now, for the thermal watch and post-repair checks."""
        acked = {**await asyncio.to_thread(self.acknowledged_xids, inp.node),
                 **inp.acknowledged}
        readings, errors = await self.read_many(
            [inp.node], [GpuNode(inp.node, NodeState.HEALTHY, "", acked, {})], inp.policy.links)
        r = readings.get(inp.node)
        if r is None:
            return NodeHealth(readable=False, thermal_recovered=False,
                              message=errors.get(inp.node, "unreadable"))
        return NodeHealth(readable=True, thermal_recovered=is_thermal_recovered(r, inp.policy),
                          verdict=evaluate_node(r, inp.policy, acknowledged_xids=acked))

    @activity.defn
    async def watch_thermal(self, inp: ThermalWatchInput) -> ThermalWatchResult:
        """Poll one node until it has stayed cool for ``hold``, shows a non-thermal
        fault, or ``give_up_after`` passes. Polling here, heartbeating, keeps the
        workflow's history from growing with every sample."""
        started = time.monotonic()
        cool_since: float | None = None
        last = "no reading yet"
        while True:
            health = await self.read_node_health(
                NodeHealthInput(node=inp.node, policy=inp.policy))
            now = time.monotonic()
            if health.readable and health.verdict is not None:
                worse = health.verdict.action in (Action.RESET, Action.REBOOT, Action.QUARANTINE)
                if worse:
                    return ThermalWatchResult(outcome="fault", verdict=health.verdict,
                                              message=health.verdict.summary)
                if health.thermal_recovered:
                    cool_since = cool_since if cool_since is not None else now
                    last = f"cool for {now - cool_since:.0f}s"
                    if now - cool_since >= inp.hold.total_seconds():
                        return ThermalWatchResult(outcome="recovered", message=last)
                else:
                    cool_since = None
                    last = health.verdict.summary
            else:
                # No data is not evidence of cooling: the hold restarts.
                cool_since = None
                last = f"unreadable: {health.message}"
            activity.heartbeat(last)
            if now - started >= inp.give_up_after.total_seconds():
                return ThermalWatchResult(outcome="hot", message=last)
            await asyncio.sleep(inp.poll_interval.total_seconds())

    @activity.defn
    async def check_thermal(self, inp: ThermalCheckInput) -> ThermalCheckResult:
        """One look at a node cordoned for heat: its state (hot, cool, or a fault that needs
        more than a cordon) once it differs from ``inp.now``, else ThermalUnchanged, which
        the workflow's retry policy turns into the next look a poll interval later. The
        wait holds no worker slot; the hold timer lives in the workflow."""
        health = await self.read_node_health(NodeHealthInput(node=inp.node, policy=inp.policy))
        if health.readable and health.verdict is not None and \
                health.verdict.action in (Action.RESET, Action.REBOOT, Action.QUARANTINE):
            return ThermalCheckResult(outcome="fault", verdict=health.verdict,
                                      message=health.verdict.summary)
        if not health.readable or health.verdict is None:
            # No data is not evidence of cooling.
            state, why = "hot", f"unreadable: {health.message}"
        elif health.thermal_recovered:
            state, why = "cool", "below the recovery threshold"
        else:
            state, why = "hot", health.verdict.summary
        if state == inp.now:
            raise ApplicationError(f"still {state}: {why}", type=error_types.THERMAL_UNCHANGED,
                                   category=ApplicationErrorCategory.BENIGN)
        return ThermalCheckResult(outcome="cool" if state == "cool" else "hot", message=why)
