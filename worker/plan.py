"""`gpu-remediate plan`: what the detector would do now, without doing it.

It observes the fleet exactly as the detector's activity does (same source,
same policy) and runs the same admission code on a fresh detector state, so the
plan is reviewable before anything is switched on.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from policy.models import Verdict
from worker.config import Settings
from workflows.admission import Admission
from workflows.models import DetectorState, FleetObservation, ObserveInput


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
    orphans: list[str] = Field(default_factory=list)
    managed_nodes: int
    readable_nodes: int
    errors: list[str] = Field(default_factory=list)


def plan_from(settings: Settings, obs: FleetObservation, now: datetime) -> Plan:
    adm = Admission(settings.detector_settings(), DetectorState(), obs, now)
    plan = Plan(budget=adm.budget, in_use=list(adm.in_use), managed_nodes=obs.managed_nodes,
                readable_nodes=obs.readable_nodes, errors=obs.errors, orphans=obs.orphans,
                breaker=adm.state.breaker_reason)
    for c in adm.queue:
        why = adm.blocked(c)
        if why is None:
            adm.admit(c)
            plan.start.append(PlannedStart(node=c.node, action=c.verdict.action.value,
                                           reason=c.why, verdict=c.verdict))
        else:
            plan.waiting.append(f"{c.node} ({c.verdict.action.value}: {why})")
    return plan


async def make_plan(settings: Settings) -> Plan:
    from worker.service import build_fleet, kube_client

    fleet = build_fleet(settings, kube_client(settings))
    obs = await fleet.observe_fleet(ObserveInput(policy=settings.policy,
                                                 pool_label=settings.detector.pool_label))
    return plan_from(settings, obs, datetime.now(UTC))
