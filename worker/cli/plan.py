"""`gpu-remediate plan`: what the detector would do now, without doing it.

It observes the fleet exactly as the detector's activity does (same source,
same policy) and runs the same admission code, so the plan is reviewable before
anything is switched on. When a detector runs, the plan is that detector's: its effective
settings (budget, pool limits, breaker thresholds, dry-run, policy: the `settings` query,
which a `detector reconfigure` changes without any file changing), its pause and its
breaker (which a fresh state could not know: the outcome breaker counts quarantines over an
hour); a config file that differs is listed, not used. Without one, the plan is a fresh
detector's with the config file's settings.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from activities.prerequisites import check_runtime_classes, missing_prerequisites
from policy.models import Verdict
from worker.config import Settings
from workflows.admission import Admission
from workflows.isolation import GpuIsolation, IsolationDecision, IsolationPlan
from workflows.messages import (
    DetectorState,
    DetectorView,
    FleetObservation,
    GpuUse,
    ObserveInput,
)
from workflows.settings import DetectorSettings, limit_for

# How long `plan` waits for Temporal to say whether a detector runs (a plan made before
# anything is switched on has no Temporal to ask).
DETECTOR_LOOKUP_SECONDS = 5.0


class PlannedStart(BaseModel):
    node: str
    action: str
    reason: str
    verdict: Verdict
    scope: str = Field(default="", description="With remediation.gpu_isolation dra: the GPU "
                                               "it would isolate, or why the whole node "
                                               "(the workflow's own IsolationDecision).")


class Plan(BaseModel):
    budget: int
    in_use: list[str]
    gpu_leases: list[str] = Field(
        default_factory=list, description="Nodes whose lease holds one isolated GPU and no "
                                          "node slot (in service), before this plan's starts.")
    gpus: GpuUse | None = Field(
        default=None, description="GPUs out of service before this plan's starts (node "
                                  "leases' GPUs and isolated GPUs) against the GPU budget.")
    start: list[PlannedStart] = Field(default_factory=list)
    waiting: list[str] = Field(default_factory=list)
    breaker: str = ""
    detector: str = Field(default="", description="The running detector's pause and breaker, "
                                                    "or why none was consulted.")
    orphans: list[str] = Field(default_factory=list)
    managed_nodes: int
    readable_nodes: int
    errors: list[str] = Field(default_factory=list)
    settings_from: str = Field(
        default="", description="Whose settings the plan uses: the running detector's "
                                "(its `settings` query) or the config file's, and why.")
    from_running_detector: bool = False
    dry_run: bool = False
    differences: list[str] = Field(
        default_factory=list, description="Where the config file differs from the running "
                                          "detector's effective settings (not used).")
    quarantine_cap: str = Field(
        default="", description="The quarantine cap: how many quarantined nodes stop "
                                "automatic starts, and its floor in a small fleet.")
    prerequisites: list[str] = Field(
        default_factory=list, description="What a repair path needs and the cluster lacks "
                                          "(GPU Operator operand DaemonSets a GPU reset "
                                          "pauses: the worker warns at start; a "
                                          "RuntimeClass a Job template names: the worker "
                                          "refuses to start, naming the field), one line "
                                          "each, or why it could not be checked.")


def plan_from(settings: Settings, obs: FleetObservation, now: datetime,
              running: DetectorView | None = None, lookup: str = "",
              effective: DetectorSettings | None = None, config_source: str = "") -> Plan:
    """The plan: with ``effective`` (the running detector's settings) the detector's own,
    else a fresh detector's with the config file's settings."""
    state = DetectorState()
    detector = lookup or "no running detector consulted: a fresh detector's plan"
    if running is not None:
        # The running detector's record: its leases count the budget, as in the detector.
        state = DetectorState(paused=running.paused, paused_by="the running detector",
                              breaker_open=running.breaker_open,
                              breaker_reason=running.breaker_reason,
                              leases={lease.node: lease for lease in running.leases},
                              leases_ready=True)
        detector = "running detector: " + ("paused" if running.paused else "not paused") + (
            f"; breaker open: {running.breaker_reason}" if running.breaker_open
            else "; breaker closed")
    configured = settings.detector_settings()
    used = effective or configured
    source = config_source or "the config file"
    if effective is not None:
        whose = ("the running detector's effective settings (read from the detector, "
                 "not from a file)")
    elif running is not None:
        whose = (f"the config file's settings, {source}: the running detector does not "
                 "report its own (an older release)")
    else:
        whose = f"the config file's settings, {source}: no detector is running"
    # Without a running detector there is no record: what the nodes show stands in for it
    # (a fresh detector adopts what runs, and orphans under our taint, the same way).
    adm = Admission(used, state, obs, now, leases=running is not None)
    plan = Plan(budget=adm.budget, in_use=list(adm.in_use), gpu_leases=list(adm.isolated),
                gpus=adm.gpu_use(),
                managed_nodes=obs.managed_nodes,
                readable_nodes=obs.readable_nodes, errors=obs.errors, orphans=obs.orphans,
                breaker=adm.state.breaker_reason, detector=detector, settings_from=whose,
                from_running_detector=effective is not None, dry_run=used.dry_run,
                differences=settings_differences(configured, effective)
                if effective is not None else [],
                quarantine_cap=quarantine_cap(used, obs.managed_nodes, adm.quarantined))
    isolation = IsolationDecision(used.remediation.gpu_isolation)
    for c in adm.queue:
        why = adm.blocked(c)
        if why is None:
            lease = adm.scope_of(c)
            adm.admit(c)
            scope = ""
            if used.remediation.gpu_isolation == GpuIsolation.DRA:
                one = isolation.decide(c.verdict)
                scope = (f"GPU {one.gpu} ({one.uuid}) only: a DeviceTaintRule"
                         + (", NoExecute" if one.evict else ", NoSchedule")
                         if isinstance(one, IsolationPlan) else f"whole node: {one}")
                scope += ("; lease: one GPU, no node slot" if lease == "gpu"
                          else "; lease: the node")
            plan.start.append(PlannedStart(node=c.node, action=c.verdict.action.value,
                                           reason=c.why, verdict=c.verdict, scope=scope))
        else:
            plan.waiting.append(f"{c.node} ({c.label}: {why})")
    return plan


def quarantine_cap(s: DetectorSettings, managed: int, quarantined: int) -> str:
    """max_quarantined in words. A percentage is never below one node, so in a small fleet
    one quarantined node can stop every automatic start (5% of 30 nodes is 1)."""
    if s.max_quarantined is None:
        return "no quarantine cap"
    cap = limit_for(s.max_quarantined, managed)
    line = f"quarantine cap {quarantined}/{cap} (max_quarantined {s.max_quarantined}"
    if isinstance(s.max_quarantined, str) and s.max_quarantined.endswith("%") and cap <= 1:
        exact = float(s.max_quarantined[:-1]) * managed / 100
        line += (f" of {managed} nodes is {exact:.2f}, rounded down with a floor of one node: "
                 "in a fleet this small a single quarantined node stops every automatic "
                 "start; set a count to allow more")
    line += ")"
    if quarantined >= cap:
        line += ": reached, automatic starts wait (operators' `remediate` does not)"
    return line


# Set from the worker's task queue when the detector starts: not a setting an operator
# writes, so a config file without it does not "differ".
_NOT_COMPARED = frozenset({"observe_task_queue"})


def settings_differences(config: DetectorSettings, running: DetectorSettings) -> list[str]:
    """Each setting whose value in the config file is not the running detector's, as
    ``path: config file X, running detector Y``."""
    mine, theirs = _flat(config.model_dump(mode="json")), _flat(running.model_dump(mode="json"))
    lines = []
    for key in sorted(set(mine) | set(theirs)):
        if key.split(".", 1)[0] in _NOT_COMPARED or mine.get(key) == theirs.get(key):
            continue
        lines.append(f"{key}: config file {_shown(mine.get(key))}, "
                     f"running detector {_shown(theirs.get(key))}")
    return lines


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _shown(value: Any) -> str:
    return "(unset)" if value is None else str(value)


class DetectorLookup(BaseModel):
    """What a running detector says about itself, or why none was asked."""

    view: DetectorView | None = None
    settings: DetectorSettings | None = None
    why: str = ""


async def running_detector(settings: Settings) -> tuple[DetectorView | None, str]:
    """The running detector's view, or None and why (no Temporal, no detector)."""
    found = await look_up_detector(settings)
    return found.view, found.why


async def look_up_detector(settings: Settings) -> DetectorLookup:
    """The running detector's view and effective settings, or why there are none."""
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    from worker.cli.operator import OperatorError, detector_settings, detector_view
    from worker.config import ConfigError
    from worker.temporal_client import connect

    try:
        client = await asyncio.wait_for(connect(settings.temporal), DETECTOR_LOOKUP_SECONDS)
        view = await asyncio.wait_for(detector_view(client), DETECTOR_LOOKUP_SECONDS)
    except OperatorError as err:
        return DetectorLookup(why=f"{err}: a fresh detector's plan")
    except (TimeoutError, RuntimeError, ValueError, ConfigError, RPCError) as err:
        why = str(err) or type(err).__name__
        return DetectorLookup(why=f"Temporal at {settings.temporal.address} not reached "
                                  f"({why[:120]}): a fresh detector's plan")
    try:
        effective = await asyncio.wait_for(detector_settings(client), DETECTOR_LOOKUP_SECONDS)
    except (OperatorError, WorkflowQueryFailedError, RPCError, TimeoutError):
        effective = None  # a detector of an older release: no `settings` query
    return DetectorLookup(view=view, settings=effective)


async def make_plan(settings: Settings, config_source: str = "") -> Plan:
    from worker.service import build_fleet, kube_client

    found = await look_up_detector(settings)
    used = found.settings or settings.detector_settings()
    fleet = build_fleet(settings, kube_client(settings))
    obs = await fleet.observe_fleet(ObserveInput(policy=used.policy, pool_label=used.pool_label,
                                                 ledger_lookback=used.ledger.lookback(),
                                                 domain_labels=used.domain_labels()))
    plan = plan_from(settings, obs, datetime.now(UTC), found.view, found.why, found.settings,
                     config_source)
    api = kube_client(settings)
    try:
        plan.prerequisites = await asyncio.to_thread(
            missing_prerequisites, api, settings.remediation.gpu_operator)
        runtime = await asyncio.to_thread(check_runtime_classes, api, settings.jobs)
        plan.prerequisites += runtime.missing + runtime.unchecked
    finally:
        api.close()
    return plan
