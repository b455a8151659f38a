"""The ceiling a Temporal client cannot raise: the worker's ``limits:`` section.

Whoever can reach the Temporal namespace can send the detector new settings (``detector
reconfigure``). The worker's configuration file, reviewed in the operator's GitOps, says how
far any such change may go: a client may tighten anything and loosen nothing past these
limits. Unset, each limit is the value the worker starts with, so out of the box a
reconfigure can only make the detector more careful than its file.

Pure: pydantic only, no I/O; the detector imports this module through the sandbox and the
``read_limits`` activity returns a ``LimitsSettings`` it read from the worker's own file.

Budgets are counts or percents. A count bounds a percent only where it holds for every
fleet size, and the fleet grows: a count of 1 is under any non-zero percent (a percent
never gives fewer than one slot), and a percent is under a count only when it is 0%. State
the limit as a percent to let a reconfigure use percents.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policy.config import PolicySettings
from policy.models import Action
from workflows.settings import DetectorSettings, FaultDomain, JobTemplateNames, parse_limit

Budget = int | str


class LimitsSettings(BaseModel):
    """How loose the detector's settings may become. Each field is named after the setting
    it bounds: ``*_min`` is the shortest/smallest allowed, a bare name or ``*_max`` the
    largest, ``*_may_*``/``*_allowed`` whether a loosening switch may be turned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_unavailable: Budget = Field(description="Largest fleet budget (count or percent).")
    pool_label: str | None = Field(
        description="The pool label pool budgets are counted by; fixed while pool budgets "
                    "are limited (another label would regroup the nodes).")
    pool_max_unavailable: dict[str, Budget] = Field(
        description="Largest budget of each pool ('*': pools not named). A pool limited "
                    "here must keep a budget of its own.")
    max_quarantined: Budget | None = Field(description="Largest quarantine cap; null: none.")
    pool_max_unavailable_gpus: dict[str, Budget] = Field(
        default_factory=dict,
        description="Largest GPU budget of each pool ('*': pools not named). A pool limited "
                    "here must keep a GPU budget of its own.")
    max_unavailable_gpus: Budget | None = Field(
        default=None, description="Largest fleet GPU budget; null: a reconfigure may set any "
                                  "(the node budgets still hold).")
    fault_domains: list[FaultDomain] = Field(
        default_factory=list,
        description="Fault domain levels a reconfigure must keep (by label), each with its "
                    "largest budgets, its highest incident threshold and shortest window.")
    max_thermal_cordoned: Budget = Field(description="Most nodes cordoned for heat at once.")
    cordons_may_skip_budget: bool = Field(
        description="Whether cordoned_counts_against_budget may be switched off.")
    dry_run_may_end: bool = Field(description="Whether a dry-run detector may start acting.")
    out_of_service_taint_allowed: bool = Field(
        default=False, description="Whether a node that did not return may be marked "
                                   "node.kubernetes.io/out-of-service (its pods and volumes "
                                   "are then released elsewhere).")
    server_authorizes_allowed: bool = Field(
        default=False, description="Whether operator names may be shown as verified "
                                   "(remediation.server_authorizes).")
    node_writable_labels_allowed: bool = Field(
        default=False, description="Whether pools may be read from labels a kubelet can "
                                   "write (detector.trust_node_writable_labels).")
    interval_min: timedelta = Field(
        description="Shortest tick: a per-tick breaker counts fewer new nodes per tick.")
    thermal_debounce_min: timedelta
    breaker_max_flagged_percent: float = Field(gt=0, le=100)
    breaker_max_flagged_nodes: int = Field(ge=1)
    breaker_min_flagged_nodes: int = Field(ge=1)
    breaker_window_min: timedelta
    breaker_max_quarantines: int = Field(ge=0, description="0: the breaker may be off.")
    breaker_quarantine_window_min: timedelta
    observe_task_queue: str | None = Field(
        description="Fixed: whoever polls this queue writes the fleet's observation.")
    policy: PolicySettings | None = Field(
        description="The policy a reconfigure must keep (it decides every action); null: "
                    "any policy.")
    approval_required_for: list[Action] = Field(
        description="Actions that must keep waiting for an operator's approve.")
    approval_may_auto_approve: bool = Field(
        description="Whether approval.on_timeout may be approve.")
    approval_timeout_min: timedelta = Field(
        description="Shortest approval timeout when a timeout approves.")
    drain_force_allowed: bool = Field(description="Whether drain.deadline_policy may be force.")
    drain_deadline_min: timedelta = Field(
        description="Shortest drain deadline before a forced deletion.")
    drain_gpu_pods_only_allowed: bool = Field(
        description="Whether a drain may leave non-GPU pods on a node it repairs.")
    drain_not_ready_terminating_timeout_min: timedelta
    job_templates: JobTemplateNames | None = Field(
        description="The Job templates a remediation must keep running (a weaker validation "
                    "template would pass a broken node); null: any configured template.")
    external_repair_allowed: bool = Field(
        description="Whether reset_method or reboot_method may be external (then the "
                    "`repaired` update of any client stands for the repair).")
    gpu_isolation_allowed: bool = Field(
        default=False,
        description="Whether remediation.gpu_isolation may be dra (a node with one sick GPU "
                    "then stays in service for its other GPUs). Absent from an older "
                    "release's limits: not allowed.")
    max_repair_attempts: int = Field(ge=1)
    repeat_offender_count_max: int = Field(ge=1)
    repeat_offender_window_min: timedelta
    thermal_hold_min: timedelta
    thermal_escalate_after_min: timedelta | None = Field(
        description="Shortest time before a hot node is drained; null: never escalate.")
    ledger_probation_min: timedelta = Field(
        default=timedelta(0),
        description="Shortest probation after a repair (0 lets a client turn it off).")
    ledger_lemon_faults_max: int = Field(
        default=10, ge=1, description="Most faults a GPU may have in lemon_window before its "
                                      "next one quarantines it.")
    ledger_lemon_window_min: timedelta = Field(
        default=timedelta(0), description="Shortest window lemon faults are counted over.")

    @field_validator("max_unavailable", "max_quarantined", "max_thermal_cordoned",
                     "max_unavailable_gpus")
    @classmethod
    def _budget(cls, v: Budget | None) -> Budget | None:
        return None if v is None else parse_limit(v)

    @field_validator("pool_max_unavailable", "pool_max_unavailable_gpus")
    @classmethod
    def _pools(cls, v: dict[str, Budget]) -> dict[str, Budget]:
        return {pool: parse_limit(b) for pool, b in v.items()}

    @classmethod
    def from_settings(cls, detector: DetectorSettings) -> LimitsSettings:
        """The default limits: exactly the settings the worker starts with."""
        r = detector.remediation
        return cls(
            max_unavailable=detector.max_unavailable,
            pool_label=detector.pool_label,
            pool_max_unavailable=dict(detector.pool_max_unavailable),
            pool_max_unavailable_gpus=dict(detector.pool_max_unavailable_gpus),
            max_quarantined=detector.max_quarantined,
            max_unavailable_gpus=detector.max_unavailable_gpus,
            fault_domains=[d.model_copy() for d in detector.fault_domains],
            max_thermal_cordoned=detector.max_thermal_cordoned,
            cordons_may_skip_budget=not detector.cordoned_counts_against_budget,
            dry_run_may_end=not detector.dry_run,
            node_writable_labels_allowed=detector.trust_node_writable_labels,
            server_authorizes_allowed=r.server_authorizes,
            out_of_service_taint_allowed=r.drain.out_of_service_taint,
            interval_min=detector.interval,
            thermal_debounce_min=detector.thermal_debounce,
            breaker_max_flagged_percent=detector.breaker_max_flagged_percent,
            breaker_max_flagged_nodes=detector.breaker_max_flagged_nodes,
            breaker_min_flagged_nodes=detector.breaker_min_flagged_nodes,
            breaker_window_min=detector.breaker_window,
            breaker_max_quarantines=detector.breaker_max_quarantines,
            breaker_quarantine_window_min=detector.breaker_quarantine_window,
            observe_task_queue=detector.observe_task_queue,
            policy=detector.policy,
            approval_required_for=list(r.approval.required_for),
            approval_may_auto_approve=r.approval.on_timeout == "approve",
            approval_timeout_min=r.approval.timeout,
            drain_force_allowed=r.drain.deadline_policy == "force",
            drain_deadline_min=r.drain.deadline,
            drain_gpu_pods_only_allowed=r.drain.gpu_pods_only,
            drain_not_ready_terminating_timeout_min=r.drain.not_ready_terminating_timeout,
            job_templates=r.job_templates,
            external_repair_allowed="external" in (r.reset_method, r.reboot_method),
            gpu_isolation_allowed=r.gpu_isolation == "dra",
            max_repair_attempts=r.max_repair_attempts,
            repeat_offender_count_max=r.repeat_offender_count,
            repeat_offender_window_min=r.repeat_offender_window,
            thermal_hold_min=r.thermal.hold,
            thermal_escalate_after_min=r.thermal.escalate_after,
            ledger_probation_min=detector.ledger.probation,
            ledger_lemon_faults_max=detector.ledger.lemon_faults,
            ledger_lemon_window_min=detector.ledger.lemon_window,
        )

    @classmethod
    def resolve(cls, detector: DetectorSettings,
                section: Mapping[str, Any] | None) -> LimitsSettings:
        """The limits a configuration's ``limits:`` section sets, each unset one the value
        ``detector`` (the settings the worker starts with) has. Raises ``ValueError`` /
        ``ValidationError`` naming the field for a bad section."""
        base = cls.from_settings(detector)
        if not section:
            return base
        unknown = sorted(str(k) for k in section if k not in cls.model_fields)
        if unknown:
            raise ValueError("; ".join(f"limits.{k}: unknown field" for k in unknown))
        return cls.model_validate({**base.model_dump(), **section})


class LimitViolation(BaseModel):
    """One setting past its limit: which, what was asked, and the ceiling."""

    model_config = ConfigDict(frozen=True)

    field: str = Field(description="Dotted name within the detector's settings.")
    requested: str
    limit_field: str = Field(description="The field of LimitsSettings that refuses it.")
    limit: str
    why: str = ""

    def __str__(self) -> str:
        why = f" ({self.why})" if self.why else ""
        return (f"{self.field}: {self.requested} is past the limit "
                f"limits.{self.limit_field} = {self.limit}{why}")


def violations(settings: DetectorSettings, limits: LimitsSettings) -> list[LimitViolation]:
    """Every setting of ``settings`` looser than ``limits`` allows, in a stable order.
    Empty: the settings are at or inside every limit."""
    out: list[LimitViolation] = []
    for check in CHECKS.values():
        out += check(settings, limits)
    return out


# ------------------------------------------------------------------ the checks

_Check = Callable[[DetectorSettings, LimitsSettings], list[LimitViolation]]


def _show(value: object) -> str:
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, BaseModel):
        return type(value).__name__ + " (changed)"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value.value if isinstance(value, Action) else value)


def _duration(td: timedelta) -> str:
    seconds = int(td.total_seconds())
    if seconds and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{td.total_seconds():g}s"


def _get(settings: DetectorSettings, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def budget_may_exceed(requested: Budget | None, limit: Budget | None) -> bool:
    """Whether ``requested`` can give more slots than ``limit`` for some fleet size (None:
    no cap). A percent never gives fewer than one slot unless it is 0%."""
    if limit is None:
        return False
    if requested is None:
        return True
    r_pct, l_pct = isinstance(requested, str), isinstance(limit, str)
    if r_pct and l_pct:
        return int(str(requested)[:-1]) > int(str(limit)[:-1])
    if not r_pct and not l_pct:
        return int(requested) > int(limit)
    if l_pct:  # a count under a percent
        pct = int(str(limit)[:-1])
        return pct != 100 and int(requested) > (0 if pct == 0 else 1)
    return requested != "0%"  # a percent under a count


def _budget(field: str, limit_field: str) -> _Check:
    def check(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
        requested, limit = _get(s, field), getattr(lim, limit_field)
        if not budget_may_exceed(requested, limit):
            return []
        why = "a percent is not bounded by a count as the fleet grows" if (
            isinstance(requested, str) and isinstance(limit, int)) else "more nodes out at once"
        return [LimitViolation(field=field, requested=_show(requested),
                               limit_field=limit_field, limit=_show(limit), why=why)]
    return check


def _most(field: str, limit_field: str, why: str, *, zero_is_off: bool = False) -> _Check:
    """A number that loosens as it grows (``zero_is_off``: 0 turns the check off)."""
    def rank(v: float) -> float:
        return float("inf") if zero_is_off and v == 0 else v

    def check(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
        requested, limit = _get(s, field), getattr(lim, limit_field)
        if rank(requested) <= rank(limit):
            return []
        return [LimitViolation(field=field, requested=_show(requested),
                               limit_field=limit_field, limit=_show(limit), why=why)]
    return check


def _least(field: str, limit_field: str, why: str,
           when: Callable[[DetectorSettings], bool] | None = None) -> _Check:
    """A duration that loosens as it shrinks (None: never, the tightest), checked only
    ``when`` it matters."""
    def check(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
        requested, limit = _get(s, field), getattr(lim, limit_field)
        if when is not None and not when(s):
            return []
        if requested is None or (limit is not None and requested >= limit):
            return []
        return [LimitViolation(field=field, requested=_show(requested),
                               limit_field=limit_field, limit=_show(limit), why=why)]
    return check


def _switch(field: str, limit_field: str, loose: Callable[[Any], bool], why: str) -> _Check:
    """A setting whose ``loose`` values need the limit's permission."""
    def check(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
        requested = _get(s, field)
        if getattr(lim, limit_field) or not loose(requested):
            return []
        return [LimitViolation(field=field, requested=_show(requested),
                               limit_field=limit_field, limit="false", why=why)]
    return check


def _pinned(field: str, limit_field: str, why: str,
            when: Callable[[LimitsSettings], bool] | None = None) -> _Check:
    """A setting that is not ordered: it must stay the limit's (None on a policy or
    templates limit: any)."""
    def check(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
        requested, limit = _get(s, field), getattr(lim, limit_field)
        if when is not None and not when(lim):
            return []
        if limit_field in ("policy", "job_templates") and limit is None:
            return []
        if requested == limit:
            return []
        return [LimitViolation(field=field, requested=_show(requested),
                               limit_field=limit_field, limit=_show(limit), why=why)]
    return check


def _pool_budgets(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
    return _pools_within(s.pool_max_unavailable, lim.pool_max_unavailable,
                         "pool_max_unavailable", "nodes")


def _pool_gpu_budgets(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
    return _pools_within(s.pool_max_unavailable_gpus, lim.pool_max_unavailable_gpus,
                         "pool_max_unavailable_gpus", "GPUs")


def _pools_within(mine: dict[str, Budget], ceilings: dict[str, Budget], name: str,
                  what: str) -> list[LimitViolation]:
    """Each pool's budget (its own, else '*') no larger than the limits' for that pool."""
    out = []
    for pool in sorted(set(mine) | set(ceilings) | {"*"}):
        limit = ceilings.get(pool, ceilings.get("*"))
        requested = mine.get(pool, mine.get("*"))
        if budget_may_exceed(requested, limit):
            out.append(LimitViolation(
                field=f"{name}.{pool}", requested=_show(requested),
                limit_field=f"{name}.{pool}", limit=_show(limit),
                why="no budget of its own" if requested is None else f"more {what} of the "
                    "pool out at once"))
    return out


def _fault_domains(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
    """Every level the limits name is kept, its budgets no larger, its incidents no rarer
    (a higher threshold, or 0: off) and its window no shorter. A level the limits do not
    name only adds care: any is accepted."""
    out = []
    mine = {d.label: d for d in s.fault_domains}
    for i, limit in enumerate(lim.fault_domains):
        where = f"fault_domains.{limit.label}"
        d = mine.get(limit.label)
        if d is None:
            out.append(LimitViolation(
                field=where, requested="absent", limit_field=f"fault_domains[{i}]",
                limit=limit.label, why="the level's budgets and incidents would be dropped"))
            continue
        for name in ("max_unavailable", "max_unavailable_gpus"):
            requested, ceiling = getattr(d, name), getattr(limit, name)
            if budget_may_exceed(requested, ceiling):
                out.append(LimitViolation(
                    field=f"{where}.{name}", requested=_show(requested),
                    limit_field=f"fault_domains[{i}].{name}", limit=_show(ceiling),
                    why="more of one domain out at once"))
        if limit.incident_threshold and not 0 < d.incident_threshold <= limit.incident_threshold:
            out.append(LimitViolation(
                field=f"{where}.incident_threshold", requested=_show(d.incident_threshold),
                limit_field=f"fault_domains[{i}].incident_threshold",
                limit=_show(limit.incident_threshold),
                why="a domain failing as a unit would be drained node by node"))
        if limit.incident_threshold and d.incident_window < limit.incident_window:
            out.append(LimitViolation(
                field=f"{where}.incident_window", requested=_show(d.incident_window),
                limit_field=f"fault_domains[{i}].incident_window",
                limit=_show(limit.incident_window),
                why="a shorter window lets a domain's failure spread under the threshold"))
    return out


def _approval_kept(s: DetectorSettings, lim: LimitsSettings) -> list[LimitViolation]:
    kept = s.remediation.approval.required_for
    dropped = [a for a in lim.approval_required_for if a not in kept]
    if not dropped:
        return []
    return [LimitViolation(
        field="remediation.approval.required_for", requested=_show(kept),
        limit_field="approval_required_for", limit=_show(lim.approval_required_for),
        why="drops approval for " + ", ".join(a.value for a in dropped))]


def _forced(s: DetectorSettings) -> bool:
    return s.remediation.drain.deadline_policy == "force"


def _auto_approves(s: DetectorSettings) -> bool:
    return s.remediation.approval.on_timeout == "approve"


CHECKS: dict[str, _Check] = {
    "max_unavailable": _budget("max_unavailable", "max_unavailable"),
    "pool_max_unavailable": _pool_budgets,
    "pool_max_unavailable_gpus": _pool_gpu_budgets,
    "pool_label": _pinned("pool_label", "pool_label",
                          "another label regroups the nodes under the pool budgets",
                          when=lambda lim: bool(lim.pool_max_unavailable
                                                or lim.pool_max_unavailable_gpus)),
    "max_quarantined": _budget("max_quarantined", "max_quarantined"),
    "max_unavailable_gpus": _budget("max_unavailable_gpus", "max_unavailable_gpus"),
    "fault_domains": _fault_domains,
    "max_thermal_cordoned": _budget("max_thermal_cordoned", "max_thermal_cordoned"),
    "cordoned_counts_against_budget": _switch(
        "cordoned_counts_against_budget", "cordons_may_skip_budget", lambda v: not v,
        "heat cordons would stop taking drain slots"),
    "dry_run": _switch("dry_run", "dry_run_may_end", lambda v: not v,
                       "the detector would start acting on nodes"),
    "remediation.drain.out_of_service_taint": _switch(
        "remediation.drain.out_of_service_taint", "out_of_service_taint_allowed",
        lambda v: bool(v), "a node not back would have its pods and volumes released "
                           "elsewhere (wrong if it is only cut off, not down)"),
    "remediation.server_authorizes": _switch(
        "remediation.server_authorizes", "server_authorizes_allowed", lambda v: bool(v),
        "a name any client can claim would be shown as if the server had checked it"),
    "trust_node_writable_labels": _switch(
        "trust_node_writable_labels", "node_writable_labels_allowed", lambda v: bool(v),
        "a node could move itself between pools and let one admit past its limit"),
    "interval": _least("interval", "interval_min",
                       "a shorter tick lets a spreading fault under the per-tick breaker"),
    "thermal_debounce": _least("thermal_debounce", "thermal_debounce_min",
                               "nodes would be cordoned on shorter heat"),
    "breaker_max_flagged_percent": _most(
        "breaker_max_flagged_percent", "breaker_max_flagged_percent",
        "the breaker would let more of the fleet be flagged at once"),
    "breaker_max_flagged_nodes": _most(
        "breaker_max_flagged_nodes", "breaker_max_flagged_nodes",
        "the breaker would let more nodes be flagged at once"),
    "breaker_min_flagged_nodes": _most(
        "breaker_min_flagged_nodes", "breaker_min_flagged_nodes",
        "more newly flagged nodes would never trip the breaker"),
    "breaker_window": _least("breaker_window", "breaker_window_min",
                             "a shorter window lets a spreading fault under the breaker"),
    "breaker_max_quarantines": _most(
        "breaker_max_quarantines", "breaker_max_quarantines",
        "more quarantines before admissions stop (0 turns the breaker off)", zero_is_off=True),
    "breaker_quarantine_window": _least(
        "breaker_quarantine_window", "breaker_quarantine_window_min",
        "fewer quarantines would be counted"),
    "observe_task_queue": _pinned("observe_task_queue", "observe_task_queue",
                                  "whoever polls that queue would write the observation"),
    "policy": _pinned("policy", "policy", "the policy decides every node's action"),
    "remediation.approval.required_for": _approval_kept,
    "remediation.approval.on_timeout": _switch(
        "remediation.approval.on_timeout", "approval_may_auto_approve",
        lambda v: v == "approve", "a drain would start with nobody's approval"),
    "remediation.approval.timeout": _least(
        "remediation.approval.timeout", "approval_timeout_min",
        "a timeout that approves would approve sooner", when=_auto_approves),
    "remediation.drain.deadline_policy": _switch(
        "remediation.drain.deadline_policy", "drain_force_allowed", lambda v: v == "force",
        "pods protected by a PDB would be deleted"),
    "remediation.drain.deadline": _least(
        "remediation.drain.deadline", "drain_deadline_min",
        "a forced deletion would come sooner", when=_forced),
    "remediation.drain.gpu_pods_only": _switch(
        "remediation.drain.gpu_pods_only", "drain_gpu_pods_only_allowed", bool,
        "a repair would run with other pods still on the node"),
    "remediation.drain.not_ready_terminating_timeout": _least(
        "remediation.drain.not_ready_terminating_timeout",
        "drain_not_ready_terminating_timeout_min",
        "pods still terminating would count as gone sooner"),
    "remediation.job_templates": _pinned(
        "remediation.job_templates", "job_templates",
        "another template decides what a repair or validation runs"),
    "remediation.reset_method": _switch(
        "remediation.reset_method", "external_repair_allowed", lambda v: v == "external",
        "any client's `repaired` would stand for the reset"),
    "remediation.reboot_method": _switch(
        "remediation.reboot_method", "external_repair_allowed", lambda v: v == "external",
        "any client's `repaired` would stand for the reboot"),
    "remediation.gpu_isolation": _switch(
        "remediation.gpu_isolation", "gpu_isolation_allowed", lambda v: v == "dra",
        "a node with a sick GPU would stay in service for its other GPUs, not drained"),
    "remediation.max_repair_attempts": _most(
        "remediation.max_repair_attempts", "max_repair_attempts",
        "a failing node would be repaired more often before quarantine"),
    "remediation.repeat_offender_count": _most(
        "remediation.repeat_offender_count", "repeat_offender_count_max",
        "a repeat offender would be returned to service more often"),
    "remediation.repeat_offender_window": _least(
        "remediation.repeat_offender_window", "repeat_offender_window_min",
        "fewer earlier repairs would count"),
    "remediation.thermal.hold": _least(
        "remediation.thermal.hold", "thermal_hold_min",
        "a hot node would be uncordoned after a shorter cool spell"),
    "remediation.thermal.escalate_after": _least(
        "remediation.thermal.escalate_after", "thermal_escalate_after_min",
        "a hot node would be drained sooner"),
    "ledger.probation": _least(
        "ledger.probation", "ledger_probation_min",
        "a relapse would repeat the repair that did not hold sooner after it"),
    "ledger.lemon_faults": _most(
        "ledger.lemon_faults", "ledger_lemon_faults_max",
        "a GPU that keeps failing would be repaired and returned more often"),
    "ledger.lemon_window": _least(
        "ledger.lemon_window", "ledger_lemon_window_min",
        "fewer of a GPU's earlier faults would count"),
}
"""Every bounded setting (dotted within DetectorSettings) and its check, in report order."""


_PACE = "pace only: how often something is looked at or reported; no node is admitted, "\
        "drained or returned by it"
_NODE_IN_HAND = ("acts only on a node already drained under the budget; failing sooner never "
                 "returns a node to service, it escalates or quarantines")

UNBOUNDED: dict[str, str] = {
    "observe_timeout": "an observation that fails admits nothing that tick",
    "observe_heartbeat_timeout": "an observation that fails admits nothing that tick",
    "observe_shard_size": "shards are merged and any failed shard admits nothing",
    "ticks_per_run": "continue-as-new carries the pause, breaker and pending starts",
    "remediation.heartbeat_timeout": "only when a dead worker's activity is retried",
    "remediation.drain.retry_interval": _PACE + " (evictions still honour PDBs)",
    "remediation.drain.report_after": _PACE,
    "remediation.drain.report_max": _PACE,
    "remediation.job_timeout": "a Job past it counts as failed: " + _NODE_IN_HAND,
    "remediation.external_timeout": "null holds the node drained; it never returns one",
    "remediation.reboot_return_timeout": "a node late back is quarantined, never returned",
    "remediation.gpus_free_timeout": "past it validation fails: " + _NODE_IN_HAND,
    "remediation.reset_scope": "resets GPUs of a node already drained: " + _NODE_IN_HAND,
    "remediation.gpu_operator.operands": "turned off only on the node being reset: "
                                         + _NODE_IN_HAND,
    "remediation.gpu_operator.namespace": "a wrong one makes a reset fail: " + _NODE_IN_HAND,
    "remediation.gpu_operator.stop_timeout": _NODE_IN_HAND,
    "remediation.gpu_operator.start_timeout": _NODE_IN_HAND,
    "remediation.gpu_operator.device_plugin_restart_after": _NODE_IN_HAND,
    "remediation.thermal.poll_interval": _PACE,
    "remediation.job_poll_interval": _PACE,
    "remediation.node_poll_interval": _PACE,
    "remediation.history_events_per_run": "continue-as-new carries the remediation's state",
    "remediation.claim_timeout": "a claim that waits longer only holds its lease, and so its "
                                 "slot, longer: it never lets another node out",
    "ledger.relapse_window": "read by the ledger's writer from the worker's configuration "
                             "file, never from a workflow's settings; it labels entries and "
                             "decides no action",
    "ledger.retention": "read by the ledger's writer from the worker's configuration file, "
                        "never from a workflow's settings",
}
"""Every setting no limit bounds, with why it cannot loosen anything: a client may set it
to any valid value. A test keeps CHECKS and UNBOUNDED covering every setting."""
