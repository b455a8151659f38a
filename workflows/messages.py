"""Messages of the workflows and activities: one pydantic model in, one out.

No I/O imports: workflow code imports this module through the sandbox.
Durations are ``timedelta``; fields only ever get added with defaults so that
in-flight workflows keep decoding their history after an upgrade.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
)

from policy.config import PolicySettings
from policy.models import Action, Verdict
from workflows.ids import DETECTOR_REQUESTER, MAX_OPERATOR_CHARS, MAX_REASON_CHARS
from workflows.settings import DetectorSettings, DrainSettings, RemediationSettings
from workflows.transitions import NodeState, Outcome, Step

GPU_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F][0-9a-fA-F-]{7,63}")
"""A GPU (or MIG device) UUID as NVML and dcgm-exporter spell it."""


def _cut(limit: int) -> AfterValidator:
    return AfterValidator(lambda text: text if len(text) <= limit else text[: limit - 1] + "…")


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
    node: str
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


class OperatorCommand(_Message):
    """Payload of every operator update and signal: who, and why (both cut to a maximum
    length, see ``MAX_REASON_CHARS``)."""

    operator: OperatorName = Field(min_length=1)
    reason: Reason = ""


class SlotRequest(_Message):
    """A thermal cordon admitted outside the budget asks the detector for a drain slot
    (signal ``request_slot``); the detector grants it (signal ``slot_granted`` to the
    remediation) when its admission would admit a drain of that node."""

    node: str = Field(min_length=1, max_length=253)
    reason: Reason = ""


class RejectedCommand(_Message):
    """An operator signal the remediation did not apply."""

    at: datetime
    name: str
    operator: str = ""
    why: str


class RemediationResume(_Message):
    """What a remediation carries across continue-as-new: the loop it was in and the
    little state that loop needs. Everything else is on the node or in the view."""

    phase: Literal["drain", "thermal", "quarantine"]
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

    @field_validator("gpu_uuids")
    @classmethod
    def _uuids(cls, value: list[str]) -> list[str]:
        # Read from the exporter (node-written text) and handed to a shell: UUIDs only.
        for u in value:
            if not GPU_UUID.fullmatch(u):
                raise ValueError(f"gpu_uuids: {u[:60]!r} is not a GPU UUID (GPU-<hex and ->)")
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


class ManualRemediation(_Message):
    node: str = Field(min_length=1)
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


class NodeStatus(_Message):
    node: str
    state: NodeState
    workflow_id: str = ""
    excluded: bool = False


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


class OrphanRelease(_Message):
    node: str = Field(min_length=1)
    operator: OperatorName = Field(min_length=1)
    reason: Reason = ""


def merge_observations(parts: list[FleetObservation]) -> FleetObservation:
    """One observation from the shards' observations of disjoint node sets."""
    pool_sizes: dict[str, int] = {}
    for p in parts:
        for pool, n in p.pool_sizes.items():
            pool_sizes[pool] = pool_sizes.get(pool, 0) + n
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


class AdmissionReport(_Message):
    budget: int
    in_use: int
    waiting: int
    breaker_open: bool
    paused: bool
    breaker_reason: str = ""
    breaker_nodes: list[str] = Field(default_factory=list)


RemediationInput.model_rebuild()
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
