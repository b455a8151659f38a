"""`gpu-remediate plan`: what the detector would do now, without doing it.

It observes the fleet exactly as the detector's activity does (same source,
same policy) and runs the same admission code, so the plan is reviewable before
anything is switched on. When a detector runs, its pause and its breaker (which a
fresh state could not know: the outcome breaker counts quarantines over an hour)
hold the plan back as they hold the detector; without one, the state is fresh.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from policy.models import Verdict
from worker.config import Settings
from workflows.admission import Admission
from workflows.messages import DetectorState, DetectorView, FleetObservation, ObserveInput

# How long `plan` waits for Temporal to say whether a detector runs (a plan made before
# anything is switched on has no Temporal to ask).
DETECTOR_LOOKUP_SECONDS = 5.0


class PlannedStart(BaseModel):
    node: str
    action: str
    reason: str
    verdict: Verdict


class Plan(BaseModel):
    budget: int
    in_use: list[str]
    start: list[PlannedStart] = Field(default_factory=list)
    waiting: list[str] = Field(default_factory=list)
    breaker: str = ""
    detector: str = Field(default="", description="The running detector's pause and breaker, "
                                                    "or why none was consulted.")
    orphans: list[str] = Field(default_factory=list)
    managed_nodes: int
    readable_nodes: int
    errors: list[str] = Field(default_factory=list)


def plan_from(settings: Settings, obs: FleetObservation, now: datetime,
              running: DetectorView | None = None, lookup: str = "") -> Plan:
    state = DetectorState()
    detector = lookup or "no running detector consulted: a fresh detector's plan"
    if running is not None:
        state = DetectorState(paused=running.paused, paused_by="the running detector",
                              breaker_open=running.breaker_open,
                              breaker_reason=running.breaker_reason)
        detector = "running detector: " + ("paused" if running.paused else "not paused") + (
            f"; breaker open: {running.breaker_reason}" if running.breaker_open
            else "; breaker closed")
    adm = Admission(settings.detector_settings(), state, obs, now)
    plan = Plan(budget=adm.budget, in_use=list(adm.in_use), managed_nodes=obs.managed_nodes,
                readable_nodes=obs.readable_nodes, errors=obs.errors, orphans=obs.orphans,
                breaker=adm.state.breaker_reason, detector=detector)
    for c in adm.queue:
        why = adm.blocked(c)
        if why is None:
            adm.admit(c)
            plan.start.append(PlannedStart(node=c.node, action=c.verdict.action.value,
                                           reason=c.why, verdict=c.verdict))
        else:
            plan.waiting.append(f"{c.node} ({c.verdict.action.value}: {why})")
    return plan


async def running_detector(settings: Settings) -> tuple[DetectorView | None, str]:
    """The running detector's view, or None and why (no Temporal, no detector)."""
    from worker.cli.operator import OperatorError, detector_view
    from worker.config import ConfigError
    from worker.temporal_client import connect

    try:
        client = await asyncio.wait_for(connect(settings.temporal), DETECTOR_LOOKUP_SECONDS)
        return await asyncio.wait_for(detector_view(client), DETECTOR_LOOKUP_SECONDS), ""
    except OperatorError as err:
        return None, f"{err}: a fresh detector's plan"
    except (TimeoutError, RuntimeError, ValueError, ConfigError) as err:
        why = str(err) or type(err).__name__
        return None, (f"Temporal at {settings.temporal.address} not reached ({why[:120]}): "
                      "a fresh detector's plan")


async def make_plan(settings: Settings) -> Plan:
    from worker.service import build_fleet, kube_client

    fleet = build_fleet(settings, kube_client(settings))
    obs, (running, lookup) = await asyncio.gather(
        fleet.observe_fleet(ObserveInput(policy=settings.policy,
                                         pool_label=settings.detector.pool_label)),
        running_detector(settings))
    return plan_from(settings, obs, datetime.now(UTC), running, lookup)
