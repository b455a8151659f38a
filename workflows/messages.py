"""Messages of the workflows and activities: one pydantic model in, one out.

No I/O imports: workflow code imports this module through the sandbox.
Durations are ``timedelta``; fields only ever get added with defaults so that
in-flight workflows keep decoding their history after an upgrade.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationInfo,
    field_validator,
    model_validator,
)
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from policy.config import PolicySettings
from policy.models import Action, Verdict
from workflows import errors
from workflows.ids import (
    DETECTOR_REQUESTER,
    MAX_OPERATOR_CHARS,
    MAX_REASON_CHARS,
    valid_node_name,
)
from workflows.incidents import DomainIncident
from workflows.isolation import GpuIsolationView
from workflows.leases import Lease, LeaseScope, LeaseStatus
from workflows.ledger import LedgerNote
from workflows.settings import DetectorSettings, DrainSettings, RemediationSettings
from workflows.transitions import NodeState, Outcome, Step

GPU_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F-]{7,63}")
"""A GPU (or MIG device) UUID as NVML and dcgm-exporter spell it."""


def _cut(limit: int) -> AfterValidator:
    return AfterValidator(lambda text: text if len(text) <= limit else text[: limit - 1] + "…")


def _node_name(name: str) -> str:
    problem = valid_node_name(name)
    if problem is not None:
        raise ValueError(problem)
    return name


Reason = Annotated[str, _cut(MAX_REASON_CHARS)]
OperatorName = Annotated[str, _cut(MAX_OPERATOR_CHARS)]


class _Message(BaseModel):
    """What travels through Temporal (inputs, results, views, operator payloads).

    Unknown fields are ignored so that a worker of the previous release can still decode
    what a newer one wrote (a rolling upgrade or a rollback), and a newer CLI's extra
    field never makes an older workflow reject an operator's command.
    """

    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------- remediation


class RemediationInput(_Message):
    node: Annotated[str, AfterValidator(_node_name)]
    verdict: Verdict
    settings: RemediationSettings = Field(default_factory=RemediationSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    dry_run: bool = False
    requested_by: str = DETECTOR_REQUESTER
    reason: str = ""
    resume: RemediationResume | None = Field(
        default=None, description="Set by continue-as-new: the loop to pick up and its state."
    )
    holds_slot: bool = Field(
        default=True,
        description="Started in a drain slot. false: a thermal cordon admitted outside the "
                    "budget, which asks the detector for a slot before it drains.")
    lease_token: str = Field(
        default="", max_length=100,
        description="The detector's lease for this remediation (workflows/leases.py): "
                    "confirmed before every disruptive step.")
    lease_scope: LeaseScope = Field(
        default="node",
        description="gpu: admitted to isolate one GPU, holding no node slot (holds_slot "
                    "false); if the GPU cannot be isolated, the remediation asks the "
                    "detector for the node and touches it only once granted.")


class HistoryEntry(_Message):
    started: datetime
    finished: datetime | None = None
    action: str
    reason: str
    outcome: str
    workflow_id: str = ""
    by: str = ""
    repaired: bool | None = Field(
        default=None,
        description="A repair (GPU reset or reboot) ran in this remediation; null in entries "
                    "written before this field (then judged by action and outcome).")

    def counts_as_repair(self) -> bool:
        """For the repeat-offender rule: a repair that actually happened, whether the node
        came back healthy or failed after it. Not a rejected, released or aborted
        remediation, nor a thermal cordon."""
        if self.repaired is not None:
            return self.repaired
        return self.action in ("reset", "reboot") and \
            self.outcome.split(":", 1)[0] in (Outcome.HEALTHY, Outcome.QUARANTINED)


class Transition(_Message):
    at: datetime
    state: NodeState
    step: Step
    note: str = ""


class RemediationView(_Message):
    """Everything an operator needs about one remediation (the ``view`` query)."""

    node: str
    state: NodeState
    step: Step
    action: Action
    reason: str
    dry_run: bool
    attempt: int = 0
    since: datetime | None = None
    pods_left: int = 0
    blocking_pdb: str = ""
    blocked_since: datetime | None = None
    previously_cordoned: bool = False
    plan: list[str] = Field(default_factory=list)
    transitions: list[Transition] = Field(default_factory=list)
    rejected_commands: list[RejectedCommand] = Field(
        default_factory=list,
        description="Operator signals that were not applied, and why (newest last): a "
                    "signal cannot return an error, so this is where its rejection shows.",
    )
    runs: int = Field(default=1, description="Runs of this remediation (continue-as-new).")
    gpu_isolation: GpuIsolationView | None = Field(
        default=None,
        description="The GPU this remediation holds out of scheduling with a DeviceTaintRule "
                    "(remediation.gpu_isolation: dra), its rule, owner and reason; null: "
                    "none (a whole-node remediation, or the rule was removed).")
    lease_scope: LeaseScope = Field(
        default="node",
        description="The detector's lease: node (a node slot and all its GPUs) or gpu (one "
                    "GPU, no node slot: the node stays in service); a GPU-scoped lease "
                    "becomes node once the detector grants the whole node.")
    quarantine_ordered_by: OperatorCommand | None = Field(
        default=None,
        description="The operator who ordered this node quarantined, and why: the quarantine "
                    "update or signal, or a manual remediation with action quarantine. null: "
                    "no operator did.")
    quarantine_policy_reason: str | None = Field(
        default=None,
        description="Why the policy ordered this node quarantined: a verdict whose action is "
                    "quarantine, a repeat offender, heat that outlasted escalate_after. null: "
                    "the policy did not. Neither set on a quarantined node: a repair or its "
                    "validation failed (the step and the history entry say which).")


class RemediationResult(_Message):
    node: str
    outcome: Outcome
    attempts: int
    message: str


# ---------------------------------------------------------------- operator commands
#
# Who and why of every operator action, held to one set of rules wherever it comes from:
# the CLI (which builds these models), an update from the Temporal UI or `temporal workflow
# update` (decoded into them, so the same validation rejects it), a signal
# (workflows/commands.py decodes it with the rules on and records a refusal). Recorded
# copies (a view, a continue-as-new state, an activity's input) are not held to them: they
# were checked when they arrived, by the rules of their day, and must keep decoding.

INTERNAL_OPERATORS = frozenset({DETECTOR_REQUESTER, "policy"})
"""Names the workflows themselves write as who acted (the detector's own remediations; a
quarantine the policy ordered): no person may act under them, or the record would lie."""

# Not control characters in Unicode's sense, but they reorder or break what a terminal, an
# Event or the UI shows (bidirectional overrides, line and paragraph separators).
_DISPLAY_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                              "\u2066\u2067\u2068\u2069\u2028\u2029")


def unprintable(text: str) -> str | None:
    """Where ``text`` holds a control character or a terminal escape (ESC starts every
    one), said without echoing it; None if it holds none."""
    for i, ch in enumerate(text):
        if unicodedata.category(ch) == "Cc" or ch in _DISPLAY_CONTROLS:
            return f"U+{ord(ch):04X} at character {i + 1}"
    return None


def operator_problem(name: str) -> str | None:
    """Why ``name`` cannot stand for the person acting, or None."""
    if not name.strip():
        return "operator: empty; say who you are (--operator, default user@host)"
    if len(name) > MAX_OPERATOR_CHARS:
        return f"operator: {len(name)} characters, at most {MAX_OPERATOR_CHARS}"
    if (where := unprintable(name)) is not None:
        return f"operator: a control character or terminal escape ({where}) is not allowed"
    if name.strip().casefold() in INTERNAL_OPERATORS:
        return (f"operator: {name.strip().casefold()!r} is a name the workflows use for "
                "themselves; act under your own name")
    return None


def reason_problem(reason: str) -> str | None:
    """Why ``reason`` cannot be recorded as an operator's why, or None."""
    if not reason.strip():
        return ("reason: required, and not only spaces: say why (-r/--reason, or the "
                "payload's \"reason\")")
    if len(reason) > MAX_REASON_CHARS:
        return f"reason: {len(reason)} characters, at most {MAX_REASON_CHARS}"
    if (where := unprintable(reason)) is not None:
        return (f"reason: a control character or terminal escape ({where}) is not allowed; "
                "one line of text")
    return None


def node_problem(node: str) -> str | None:
    """Why ``node`` cannot be a Kubernetes node name, or None."""
    if (where := unprintable(node)) is not None:
        return f"node: a control character or terminal escape ({where}) is not allowed"
    problem = valid_node_name(node)
    return None if problem is None else f"node: {problem}"


def _rules_apply(info: ValidationInfo) -> bool:
    """Whether this validation is of a command arriving now (held to the rules) or of a
    recorded one (not). An explicit ``context={"operator_rules": …}`` decides; else:
    nested in another message is a record; in a workflow, an update's argument as it
    arrives is decoded from JSON (one replayed was accepted by the rules of its day, and a
    replay must accept it again); outside one, a command built in Python (the CLI, a
    script) is checked, and JSON is an activity's input, written by a workflow that
    checked it."""
    if isinstance(info.context, dict) and "operator_rules" in info.context:
        return bool(info.context["operator_rules"])
    if info.field_name is not None:
        return False
    if workflow.in_workflow():
        return info.mode == "json" and not workflow.unsafe.is_replaying()
    return info.mode == "python"


class _OperatorMessage(_Message):
    """An operator's command: who, why and (for node commands) which node, checked by the
    rules above when it arrives. Errors never carry the input: a refused value may hold a
    terminal escape, and the message goes to a terminal, an Event and the UI."""

    model_config = ConfigDict(extra="ignore", hide_input_in_errors=True)

    @model_validator(mode="wrap")
    @classmethod
    def _operator_rules(cls, data: Any, handler: ModelWrapValidatorHandler[Any],
                        info: ValidationInfo) -> Any:
        if isinstance(data, dict) and _rules_apply(info):
            checks = {"node": node_problem, "operator": operator_problem,
                      "reason": reason_problem}
            for field, check in checks.items():
                if field not in cls.model_fields:
                    continue
                value = data.get(field, "")
                if not isinstance(value, str):
                    continue  # the field's own type check says what is wrong
                if (problem := check(value)) is not None:
                    if workflow.in_workflow():
                        # Raised as is by the SDK's argument decoding (a ValueError would
                        # reach the UI as "Failed decoding arguments"): the update is
                        # refused with this text, as by its validator.
                        raise ApplicationError(problem, type=errors.REJECTED,
                                               non_retryable=True)
                    raise ValueError(problem)
        return handler(data)


class OperatorCommand(_OperatorMessage):
    """Payload of every operator update and signal: who, and why. Held to the rules above
    when it arrives (a reason is required, at most ``MAX_REASON_CHARS`` characters, one line
    of printable text; the operator is not a name the workflows use); a recorded one is
    cut to those lengths instead."""

    operator: OperatorName = Field(min_length=1)
    reason: Reason = ""


DOMAIN_ARG = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_./=]{0,399}")
"""A domain as an operator names it: a label value, or label=value."""


class IncidentCommand(_OperatorMessage):
    """`gpu-remediate incident resolve|release DOMAIN -r REASON`: who, why, which domain."""

    domain: str = Field(min_length=1, max_length=400,
                        description="The domain's value, or label=value where several "
                                    "levels have a domain of that name.")
    operator: OperatorName = Field(min_length=1)
    reason: Reason = ""

    @field_validator("domain")
    @classmethod
    def _domain(cls, v: str) -> str:
        if not DOMAIN_ARG.fullmatch(v):
            raise ValueError("not a domain: a label value or label=value (letters, digits, "
                             "'-', '_', '.', '/', '=')")
        return v


class SlotRequest(_Message):
    """A thermal cordon admitted outside the budget asks the detector for a drain slot
    (signal ``request_slot``); the detector grants it (signal ``slot_granted`` to the
    remediation) when its admission would admit a drain of that node."""

    node: str = Field(min_length=1, max_length=253)
    reason: Reason = ""
    token: str = Field(default="", max_length=100,
                       description="The requester's lease token: a request without it is "
                                   "refused and recorded.")


class SlotGrant(_Message):
    """The detector's answer to a slot request, carrying the lease's token (a grant
    without it, from a stray client, is refused and recorded)."""

    token: str = Field(default="", max_length=100)


class RejectedCommand(_Message):
    """An operator signal the remediation did not apply."""

    at: datetime
    name: str
    operator: str = ""
    why: str


class ExternalWait(_Message):
    """An external repair's wait handed over at continue-as-new."""

    kind: Literal["gpu-reset", "reboot"]
    attempt: int = Field(ge=1)
    until: datetime | None = Field(default=None, description="When the external window "
                                                            "ends; None: no external_timeout.")


class RemediationResume(_Message):
    """What a remediation carries across continue-as-new: the loop it was in and the
    little state that loop needs. Everything else is on the node or in the view."""

    phase: Literal["drain", "thermal", "quarantine", "approval", "external"]
    view: RemediationView
    action: Action
    started: datetime
    gpus: int
    quarantine_order: OperatorCommand | None = None
    policy_quarantine: str | None = None
    release_order: OperatorCommand | None = None
    abort_note: OperatorCommand | None = None
    quarantine_why: str = ""
    acknowledged: dict[str, int] = Field(default_factory=dict)
    drain_started: datetime | None = None
    drain_force: bool = False
    report_after: timedelta | None = None
    hot_since: datetime | None = None
    boot_id: str = ""
    uid: str = ""
    approval_until: datetime | None = Field(
        default=None, description="Phase approval: when the approval window ends (a wait "
                                  "that outgrew its history continues in a new run).")
    out_of_service: bool = Field(
        default=False, description="This remediation put node.kubernetes.io/out-of-service "
                                   "on the node (it did not return): taken off at release.")
    ledger_from: datetime | None = Field(
        default=None, description="The end of the last repair-ledger entry this remediation "
                                  "wrote (the next accounts for the time after it).")
    external: ExternalWait | None = Field(
        default=None, description="Phase external: the repair whose report is awaited.")
    repaired_order: OperatorCommand | None = Field(
        default=None, description="Phase external: a `repaired` accepted as the run handed "
                                  "over.")


class OperatorAck(_Message):
    accepted: bool = True
    state: NodeState
    message: str


# ---------------------------------------------------------------- activities


class ClaimInput(_Message):
    node: str
    state: NodeState
    reason: str
    action: Action
    workflow_id: str
    run_id: str
    now: datetime
    dry_run: bool = False


class ClaimResult(_Message):
    previously_cordoned: bool
    recent_remediations: int
    gpus: int
    history: list[HistoryEntry] = Field(default_factory=list)
    boot_id: str = Field(
        default="", description="status.nodeInfo.bootID at claim ('' if the kubelet reports none)."
    )
    uid: str = Field(default="", description="metadata.uid at claim: the node's identity.")


class StateInput(_Message):
    node: str
    state: NodeState
    reason: str
    step: Step
    now: datetime
    attempt: int = 0
    event_reason: str
    event_message: str
    event_type: Literal["Normal", "Warning"] = "Normal"
    dry_run: bool = False
    uid: str = Field(default="", description="metadata.uid at claim: a node with another "
                                             "UID is another machine, never written to.")


class ReleaseInput(_Message):
    node: str
    outcome: Outcome
    uncordon: bool
    history: HistoryEntry
    acknowledged_xids: dict[str, int] = Field(default_factory=dict)
    event_reason: str
    event_message: str
    dry_run: bool = False
    claim_unconfirmed: bool = Field(
        default=False,
        description="An abort reached the claim before it reported back: release only if "
                    "the node carries this workflow's claim, and uncordon only if that claim "
                    "found the node schedulable.",
    )
    uid: str = Field(default="", description="metadata.uid at claim: a node with another "
                                             "UID is another machine, never written to.")
    node_untouched: bool = Field(
        default=False,
        description="A per-GPU remediation never claimed the node: its record and Event are "
                    "written, the Node object is left as it is.")
    run_id: str = Field(default="", description="The remediation's run: with "
                                                "claim_unconfirmed, the claim is ours only if "
                                                "the node carries this run id too (the "
                                                "workflow id is derived from the node name).")


class NodeEventInput(_Message):
    node: str
    reason: str
    message: str
    event_type: Literal["Normal", "Warning"] = "Warning"


class DrainInput(_Message):
    node: str
    settings: DrainSettings
    force: bool = Field(default=False, description="Delete what eviction could not move.")
    report_after: timedelta = Field(
        default=timedelta(seconds=60),
        description="Return 'blocked' after this long so the workflow can show progress.",
    )
    dry_run: bool = False
    uid: str = Field(default="", description="metadata.uid at claim: a node with another "
                                             "UID is another machine, never written to.")


class DrainResult(_Message):
    outcome: Literal["drained", "blocked", "planned"]
    evicted: list[str] = Field(default_factory=list)
    remaining: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    forced: list[str] = Field(default_factory=list)
    blocking_pdb: str = ""
    terminating: list[str] = Field(
        default_factory=list,
        description="Pods left that are Terminating past their grace period (a stopped "
                    "kubelet, a finalizer): eviction cannot move them again.")
    counted_gone: list[str] = Field(
        default_factory=list,
        description="Pods stuck Terminating on a node that is not Ready, counted as gone "
                    "after drain.not_ready_terminating_timeout.")
    node_ready: bool = True
    message: str = ""

    def left_summary(self) -> str:
        """Why pods are left, for the UI and the Events: the PDB, the stuck ones, or both."""
        parts = []
        if self.blocking_pdb:
            parts.append(f"blocked by PDB {self.blocking_pdb}")
        if self.terminating:
            parts.append(f"{len(self.terminating)} Terminating past their grace period "
                         f"({', '.join(self.terminating[:3])}"
                         + (", ..." if len(self.terminating) > 3 else "") + ")")
        if not self.node_ready:
            parts.append("node not Ready")
        return "; ".join(parts) or "pods still leaving"


class NodeJobInput(_Message):
    node: str
    kind: Literal["validate", "gpu-reset", "reboot"]
    name: str
    template: str = Field(
        default="", max_length=63,
        description="The worker's Job template by name; empty: the step's default.")
    gpus: int
    gpu_index: str | None = None
    dry_run: bool = False
    gpu_uuids: list[str] = Field(
        default_factory=list, max_length=64,
        description="GPU reset: the target GPUs by UUID (the Job's GPU_UUIDS), which "
                    "survives re-enumeration; empty: GPU_INDEX, else every GPU.")
    device_uuid: str = Field(
        default="", max_length=80,
        description="Validation pinned to one GPU (gpu_isolation: dra): the pod gets exactly "
                    "the DRA device with this UUID through a ResourceClaim of its own, and "
                    "no nvidia.com/gpu; empty: the whole node's GPUs.")

    @field_validator("gpu_uuids")
    @classmethod
    def _uuids(cls, value: list[str]) -> list[str]:
        # Read from the exporter (node-written text) and handed to a shell: UUIDs only.
        for u in value:
            if not GPU_UUID.fullmatch(u):
                raise ValueError(f"gpu_uuids: {u[:60]!r} is not a GPU UUID (GPU-<hex and ->)")
        return value

    @field_validator("device_uuid")
    @classmethod
    def _device_uuid(cls, value: str) -> str:
        # Goes into a CEL expression: a UUID only.
        if value and not GPU_UUID.fullmatch(value):
            raise ValueError(f"device_uuid: {value[:60]!r} is not a GPU UUID (GPU-<hex and ->)")
        return value


class NodeJobResult(_Message):
    succeeded: bool
    message: str
    job_name: str
    evidence: str = Field(
        default="", max_length=2000,
        description="What the Job proved, read from its output (validation: the dcgmi diag "
                    "summary, which tests passed or failed on which GPU).")


class NodeHealthInput(_Message):
    node: str
    policy: PolicySettings
    acknowledged: dict[str, int] = Field(
        default_factory=dict,
        description="XIDs to read as acknowledged besides the node's own record: those the "
                    "remediation in progress handles and has not written yet.")


class GpusFreeInput(_Message):
    """One look before validation: may a pod have every GPU of the node now?"""

    node: str
    uid: str = Field(default="", description="metadata.uid at claim; '' skips the check.")
    expected_gpus: int = Field(ge=0)


class GpusFree(_Message):
    allocatable_gpus: int
    message: str


class NodeHealth(_Message):
    readable: bool
    thermal_recovered: bool
    verdict: Verdict | None = None
    message: str = ""


class ThermalWatchInput(_Message):
    node: str
    policy: PolicySettings
    hold: timedelta
    poll_interval: timedelta
    give_up_after: timedelta = Field(description="Return 'hot' after watching this long.")


class ThermalWatchResult(_Message):
    outcome: Literal["recovered", "hot", "fault"]
    verdict: Verdict | None = None
    message: str = ""


class ThermalCheckInput(_Message):
    """One look at a hot node (``check_thermal``): answers once its state differs from
    ``now``, and raises "unchanged" (retried at the poll interval) until then."""

    node: str
    policy: PolicySettings
    now: Literal["hot", "cool"]


class ThermalCheckResult(_Message):
    outcome: Literal["hot", "cool", "fault"]
    verdict: Verdict | None = None
    message: str = ""


# ---------------------------------------------------------------- detector


class ManualRemediation(_OperatorMessage):
    node: Annotated[str, AfterValidator(_node_name)] = Field(min_length=1)
    action: Action
    operator: OperatorName = Field(min_length=1)
    reason: Reason = Field(min_length=1)


class PendingStart(_Message):
    node: str
    at: datetime
    slot: bool = Field(
        default=True, description="It holds a drain slot (a thermal cordon started outside "
                                  "the budget does not).")
    escalation: bool = Field(
        default=False, description="A slot granted to a node cordoned for heat: held until "
                                   "its label leaves 'cordoned'.")


class DetectorState(_Message):
    """Carried across continue-as-new. Budget truth is on the nodes, not here."""

    paused: bool = False
    paused_by: str = ""
    breaker_open: bool = False
    breaker_reason: str = ""
    breaker_nodes: list[str] = Field(
        default_factory=list,
        description="The nodes that tripped the open breaker (at most BREAKER_NODES_SHOWN): "
                    "each gets a CircuitBreakerOpen Event.")
    pending: list[PendingStart] = Field(default_factory=list)
    slot_requests: dict[str, datetime] = Field(
        default_factory=dict,
        description="Nodes cordoned for heat outside the budget that must now be drained "
                    "(still hot, or a fault appeared), and since when they ask for a slot.")
    manual: list[ManualRemediation] = Field(default_factory=list)
    planned: dict[str, Action] = Field(
        default_factory=dict, description="Dry-run: nodes already planned, so plans don't repeat."
    )
    first_seen: dict[str, datetime] = Field(
        default_factory=dict, description="When each waiting node was first flagged."
    )
    recently_flagged: dict[str, datetime] = Field(
        default_factory=dict,
        description="Newly flagged nodes within the breaker window, and when.",
    )
    quarantined_seen: list[str] | None = Field(
        default=None,
        description="Nodes quarantined at the last observation (null before the first): a "
                    "node quarantined since counts toward the outcome breaker.")
    recently_quarantined: dict[str, datetime] = Field(
        default_factory=dict,
        description="Nodes newly quarantined within breaker_quarantine_window, and when.")
    ticks_total: int = 0
    started_total: int = 0
    # What the next run needs before its first observation (which may fail), so that a
    # continue-as-new changes nothing an operator or the budget can see.
    last_managed: int = Field(
        default=0, ge=0,
        description="GPU nodes at the last observation: how many shards observe the fleet.")
    busy: dict[str, str] = Field(
        default_factory=dict,
        description="Nodes in remediation at the last observation (their state, or "
                    "'starting'): `remediate` refuses them.")
    orphans: list[str] = Field(
        default_factory=list,
        description="Labelled nodes without a running workflow: `release-orphan` accepts them.")
    rejected: list[RejectedCommand] = Field(
        default_factory=list, description="The last rejected or unknown signals (the view).")
    leases: dict[str, Lease] = Field(
        default_factory=dict,
        description="The budget's record: one lease per remediation, held for its whole life "
                    "(workflows/leases.py).")
    leases_ready: bool = Field(
        default=False,
        description="The remediations running when leases began (a detector that did not "
                    "continue from one with leases) have been adopted.")
    incidents: dict[str, DomainIncident] = Field(
        default_factory=dict,
        description="Domain incidents by label=value: the open ones and the last closed "
                    "(workflows/incidents.py).")
    flagged_at: dict[str, datetime] = Field(
        default_factory=dict,
        description="When each flagged node was first flagged, for the incident windows.")
    incident_cordons: dict[str, str] = Field(
        default_factory=dict,
        description="Nodes the detector cordoned for an incident (node: incident): the "
                    "record of what it may uncordon.")
    reports: list[NodeReport] = Field(
        default_factory=list,
        description="Faults nodes reported about themselves not yet observed "
                    "(workflows/reports.py): a report that lands as the run continues as new "
                    "is taken by the next run's first observation.")


class DetectorInput(_Message):
    settings: DetectorSettings = Field(default_factory=DetectorSettings)
    state: DetectorState = Field(default_factory=DetectorState)


class ObserveInput(_Message):
    policy: PolicySettings
    pool_label: str | None = None
    shard: int = Field(default=0, ge=0, description="This activity's share of the fleet ...")
    shards: int = Field(default=1, ge=1, description="... out of this many (by node name).")
    track_xid_repeats: bool = Field(
        default=True, description="Record app-XID sightings on the nodes (off in dry-run: "
                                  "it writes node annotations).")
    lease_workflows: list[str] = Field(
        default_factory=list,
        description="The detector's lease holders: their workflows are looked up in Temporal "
                    "with the observation (one shard asks), so the record costs no extra "
                    "activity per tick.")
    lease_task_queue: str = Field(default="", max_length=1000)
    domain_labels: list[str] = Field(
        default_factory=list, description="The fault domain levels' labels (settings "
                                          "fault_domains): each node's values are reported.")
    reports: list[NodeReport] = Field(
        default_factory=list,
        description="Recent faults nodes reported about themselves (workflows/reports.py): "
                    "each is merged into its own node's readings before that node's verdict.")
    ledger_lookback: timedelta = Field(
        default=timedelta(0), ge=timedelta(0), le=timedelta(days=92),
        description="Read the repair ledger this far back for the flagged nodes "
                    "(FleetObservation.ledger); 0: not read (a detector before probation).")
    nodes: list[str] = Field(
        default_factory=list, max_length=64,
        description="Observe only these nodes (a node-only tick, woken by their reports; "
                    "workflows/reports.py); empty: the fleet (this shard's part). Fleet-wide "
                    "figures and metrics are a full observation's only.")


class NodeStatus(_Message):
    node: str
    state: NodeState
    workflow_id: str = ""
    excluded: bool = False
    tainted: bool = Field(default=False, description="Carries our taint (a kubelet cannot "
                                                     "write taints).")
    label: str = Field(default="", description="The state label as the node shows it (the "
                                               "mirror): compared with the record.")


class NeighbourHold(_Message):
    node: str
    by: str = Field(max_length=100)
    detail: str = Field(max_length=200)
    out_of_service: bool = Field(
        default=False, description="Cordoned (or tainted) while the other controller acts.")


class FleetObservation(_Message):
    """One tick's view of the fleet, kept small: only nodes that need attention."""

    managed_nodes: int
    readable_nodes: int
    verdicts: list[Verdict] = Field(default_factory=list)
    remediating: list[NodeStatus] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    orphans: list[str] = Field(
        default_factory=list,
        description="Labelled nodes whose remediation workflow is not running: they keep "
                    "their budget slot until an operator releases them.",
    )
    pool_of: dict[str, str] = Field(
        default_factory=dict, description="Pool of each node named in verdicts or remediating."
    )
    pool_sizes: dict[str, int] = Field(default_factory=dict)
    held: list[NeighbourHold] = Field(
        default_factory=list,
        description="Nodes another controller is acting on (activities/neighbours.py) that "
                    "are flagged or out of service: never admitted while it acts; counted "
                    "against the budget while out of service.")
    lease_holders: list[LeaseStatus] = Field(
        default_factory=list,
        description="What Temporal says of each lease holder's workflow (ObserveInput."
                    "lease_workflows): running and its state, or closed and how.")
    ledger: dict[str, LedgerNote] = Field(
        default_factory=dict,
        description="What the repair ledger says of flagged nodes (ObserveInput."
                    "ledger_lookback): their last repair and their GPUs' earlier faults, for "
                    "probation and lemons (workflows/probation.py).")
    domains_of: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="Each node named in verdicts, remediating or held: its domain at each "
                    "level (label: value, '' without the label).")
    domain_sizes: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Nodes per domain, per level label.")
    domain_gpus: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="GPUs per domain, per level label.")
    gpus_of: dict[str, int] = Field(
        default_factory=dict,
        description="GPUs of each node named in verdicts, remediating or held (its "
                    "capacity, or what its exporter shows where that is more).")
    managed_gpus: int = Field(default=0, ge=0, description="GPUs of the managed nodes.")
    pool_gpus: dict[str, int] = Field(
        default_factory=dict, description="GPUs per pool (with a pool_label), counted as "
                                          "gpus_of counts a node's.")


class OrphanRelease(_OperatorMessage):
    node: str = Field(min_length=1)
    operator: OperatorName = Field(min_length=1)
    reason: Reason = ""


def merge_observations(parts: list[FleetObservation]) -> FleetObservation:
    """One observation from the shards' observations of disjoint node sets."""
    pool_sizes: dict[str, int] = {}
    pool_gpus: dict[str, int] = {}
    for p in parts:
        for pool, n in p.pool_sizes.items():
            pool_sizes[pool] = pool_sizes.get(pool, 0) + n
        for pool, n in p.pool_gpus.items():
            pool_gpus[pool] = pool_gpus.get(pool, 0) + n

    def summed(which: str) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for p in parts:
            for label, sizes in getattr(p, which).items():
                mine = out.setdefault(label, {})
                for domain, n in sizes.items():
                    mine[domain] = mine.get(domain, 0) + n
        return out
    return FleetObservation(
        managed_nodes=sum(p.managed_nodes for p in parts),
        readable_nodes=sum(p.readable_nodes for p in parts),
        verdicts=sorted((v for p in parts for v in p.verdicts), key=lambda v: v.node),
        remediating=sorted((r for p in parts for r in p.remediating), key=lambda r: r.node),
        errors=sorted(e for p in parts for e in p.errors)[:50],
        orphans=sorted(o for p in parts for o in p.orphans),
        pool_of={k: v for p in parts for k, v in p.pool_of.items()},
        pool_sizes=pool_sizes,
        held=sorted((h for p in parts for h in p.held), key=lambda h: h.node),
        lease_holders=[s for p in parts for s in p.lease_holders],
        ledger={k: v for p in parts for k, v in p.ledger.items()},
        domains_of={k: v for p in parts for k, v in p.domains_of.items()},
        domain_sizes=summed("domain_sizes"), domain_gpus=summed("domain_gpus"),
        gpus_of={k: v for p in parts for k, v in p.gpus_of.items()},
        managed_gpus=sum(p.managed_gpus for p in parts),
        pool_gpus=pool_gpus,
    )


class DetectorView(_Message):
    paused: bool
    breaker_open: bool
    breaker_reason: str
    budget: int
    in_flight: list[str]
    waiting: list[str]
    last_tick: datetime | None
    last_errors: list[str]
    ticks_total: int
    started_total: int
    orphans: list[str] = Field(default_factory=list)
    rejected_commands: list[RejectedCommand] = Field(
        default_factory=list, description="Operator signals not applied, and why.")
    leases: list[Lease] = Field(
        default_factory=list, description="The budget's record: who holds a lease, and why.")
    quarantined: list[str] = Field(
        default_factory=list, description="Quarantined nodes, from the record.")
    incidents: list[DomainIncident] = Field(
        default_factory=list, description="Domain incidents: open, then recently closed.")
    domains: list[DomainUse] = Field(
        default_factory=list,
        description="Each fault domain with nodes out of service or a budget in use.")
    gpus: GpuUse | None = Field(
        default=None, description="GPUs out of service fleet-wide at the last tick (node "
                                  "leases' GPUs and isolated GPUs) against the GPU budget.")


class DomainUse(_Message):
    """One fault domain's use of its budget, as the last tick counted it."""

    label: str
    domain: str = Field(description="The label's value; '' for nodes without the label.")
    nodes: int
    in_use: int
    budget: int | None = None
    gpus: int = 0
    gpus_in_use: int = 0
    gpu_budget: int | None = None


class GpuUse(_Message):
    """The fleet's GPUs out of service, as admission counts them against the GPU budget:
    every GPU of a node that holds a node slot (as its lease recorded them) and each
    isolated GPU (a GPU-scoped lease: its node stays in service)."""

    gpus: int = Field(default=0, ge=0, description="GPUs of the managed nodes.")
    out_of_service: int = Field(default=0, ge=0)
    isolated: int = Field(default=0, ge=0, description="GPU-scoped leases, one GPU each.")
    budget: int | None = Field(default=None, description="max_unavailable_gpus; null: none.")
    pools: dict[str, int] = Field(
        default_factory=dict, description="GPUs out of service per pool (pools with any out, "
                                          "where pool GPU budgets are set).")
    pool_budgets: dict[str, int] = Field(
        default_factory=dict, description="The GPU budget of each pool in ``pools``.")


class AdmissionReport(_Message):
    budget: int
    in_use: int
    waiting: int
    breaker_open: bool
    paused: bool
    breaker_reason: str = ""
    breaker_nodes: list[str] = Field(default_factory=list)
    incidents: list[str] = Field(
        default_factory=list, description="Open domain incidents (label=value).")
    incident_nodes: dict[str, list[str]] = Field(
        default_factory=dict, description="The nodes of each open incident.")
    gpus: GpuUse | None = Field(
        default=None, description="GPUs out of service fleet-wide (none: a detector run "
                                  "recorded before GPU counts were reported).")
    domains: list[DomainUse] = Field(
        default_factory=list, description="Each fault domain with GPUs or nodes out, and "
                                          "every level's unlabelled nodes.")


RemediationInput.model_rebuild()
DetectorView.model_rebuild()
RemediationView.model_rebuild()


# ---------------------------------------------------------------- node return


class ReturnInput(_Message):
    """One look at a node after its reboot was requested (``check_node_returned``)."""

    node: str
    uid: str = Field(default="", description="metadata.uid at claim; '' skips the check.")
    old_boot_id: str = Field(
        default="", description="bootID at claim; '' (older kubelets) falls back to Ready's "
                                "transition after reboot_requested_at.",
    )
    expected_gpus: int = Field(ge=0, description="allocatable nvidia.com/gpu it must show.")
    check_exporter: bool = Field(default=True, description="Also require its exporter to answer.")
    reboot_requested_at: datetime = Field(
        description="When the reboot was requested: a Ready transition after it proves a "
                    "reboot when no boot ID can be compared.",
    )


class MirrorRepair(_Message):
    """A node's state label disagrees with the record: rewrite it (rewrite_state_mirror)."""

    node: str
    state: NodeState = Field(description="The record's state (what the label must say).")
    shown: str = Field(default="", max_length=63,
                       description="The label as the observation saw it: the label is "
                                   "rewritten only if it still says that.")
    workflow_id: str = ""


class OutOfServiceInput(_Message):
    """Put on or take off ``node.kubernetes.io/out-of-service`` (``mark_out_of_service``)."""

    node: str
    uid: str = Field(default="", description="metadata.uid at claim; '' skips the check.")
    on: bool = Field(description="True: taint a node that is still not Ready (non-graceful "
                                 "node shutdown: its pods and volumes are released); False: "
                                 "take our taint off (the node returned, or is released).")


class ReturnResult(_Message):
    boot_id: str
    allocatable_gpus: int
    confirmed_by: Literal["boot-id", "ready-transition"]
    ready_since: datetime | None = None
    message: str


# ---------------------------------------------------------------- visibility


class RunningRemediationsInput(_Message):
    task_queue: str = Field(
        min_length=1, max_length=1000,
        description="Only remediations on this task queue: the detector's own (its "
                    "children run on it), not another installation's in the namespace.")
    limit: int = Field(default=10_000, ge=1, le=100_000,
                       description="At most this many; the rest are reported as truncated.")

    @field_validator("task_queue")
    @classmethod
    def _quotable(cls, v: str) -> str:
        # It goes into a visibility query between single quotes.
        if "'" in v or "\\" in v:
            raise ValueError("task_queue: a quote or backslash cannot be used in a "
                             f"visibility query: {v!r}")
        return v


class RunningRemediation(_Message):
    node: str
    workflow_id: str
    state: str = Field(default="", description="Its RemediationState search attribute.")
    started: datetime | None = None


class RunningRemediations(_Message):
    remediations: list[RunningRemediation] = Field(default_factory=list)
    truncated: bool = False


# ---------------------------------------------------------------- node reports


MAX_REPORT_LINE_CHARS = 512
"""A reported kernel line is kept to this many characters (ending in "…"): it is evidence
to show, written by the node; the XID and GPU are the fields acted on."""


class NodeReport(_Message):
    """A fault one node's watcher saw in its own kernel log or NVML (signal ``node_report``).

    ``node`` is the node named in the watcher's token (the worker refuses a report whose
    token names another node); ``at`` is when the worker accepted it, by the worker's clock
    (the node's own clock is never trusted to say how fresh a report is). A report wakes the
    detector; the decision still comes from a fresh evaluation of that node and the budget.
    """

    node: str = Field(min_length=1, max_length=253)
    xid: int = Field(ge=1, le=65_535)
    gpu: str = Field(
        min_length=1, max_length=96, pattern=r"^[A-Za-z0-9:._-]+$",
        description="The GPU: its index, UUID (GPU-...) or PCI bus id (as the kernel line "
                    "names it when the watcher has no NVML).")
    line: Annotated[str, _cut(MAX_REPORT_LINE_CHARS)] = ""
    at: datetime


ObserveInput.model_rebuild()
DetectorState.model_rebuild()
DetectorInput.model_rebuild()
