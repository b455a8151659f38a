"""Leases: the budget's record, owned by the detector.

A slot is a lease the detector grants when it admits a remediation and holds for that
remediation's whole life, across its continue-as-new runs, however long its claim takes.
It ends only when Temporal says the remediation closed cleanly (completed, or cancelled:
an abort runs its cleanup); a remediation that closed any other way (terminated, failed,
timed out) leaves an orphan lease that keeps its slot until an operator releases the node
(fail closed). Nothing a node can write (labels, annotations) moves a lease: the node's
state label is a mirror, compared with the record and rewritten when it disagrees.

Each lease carries a token, passed in the remediation's input. The remediation confirms
its lease (through the detector's ``confirm_lease`` update) before every disruptive step;
internal grants and requests (``slot_granted``, ``request_slot``) carry it too, and one
without the right token is refused and recorded.

A lease has a scope. ``node`` (the default, and every lease recorded before scopes): the
node is out of service, so the lease holds a node slot at every level (fleet, pool, fault
domain) and counts all the node's GPUs. ``gpu``: admission found the verdict confined to
one GPU that the remediation isolates with a DeviceTaintRule (workflows/isolation.py); the
node stays in service, so the lease holds no node slot and counts one GPU in every GPU
budget. It becomes a node lease only through the budget: the remediation that cannot
isolate its GPU asks for a slot with its token (``request_slot``) and the detector widens
the lease when admission would admit a drain of that node (``widened``). Nothing narrows a
lease.

Pure code over pydantic models: the detector workflow and ``gpu-remediate plan`` use it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workflows.transitions import NodeState

LeaseScope = Literal["node", "gpu"]

# Temporal's close statuses after which the remediation's own cleanup has run.
CLEAN_CLOSE = frozenset({"COMPLETED", "CANCELED"})


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Lease(_Message):
    """One remediation's hold on the budget (or on the thermal cordon cap)."""

    node: str
    token: str = Field(description="Shared with the remediation through its input; '' for a "
                                   "lease adopted from visibility until the remediation "
                                   "first confirms it (then its token is recorded).")
    granted_at: datetime
    workflow_id: str
    slot: bool = Field(default=True, description="Holds a drain slot. false: a heat cordon "
                                                  "admitted outside the budget, under the "
                                                  "thermal cap, until a slot is granted.")
    state: NodeState = Field(default=NodeState.HEALTHY,
                             description="The remediation's state as Temporal records it "
                                         "(its RemediationState search attribute).")
    adopted: bool = Field(default=False, description="Found running when this detector "
                                                     "started, not granted by it.")
    orphan: str = Field(default="", description="Why the remediation is gone without "
                                                "returning its lease: the slot is kept until "
                                                "`release-orphan`.")
    requested_by: str = ""
    pool: str = Field(default="", description="The node's pool when the lease was granted: a "
                                              "node that relabels itself later moves nothing.")
    domains: dict[str, str] = Field(
        default_factory=dict,
        description="The node's fault domain at each level (label: value, '' unlabelled) "
                    "when the lease was granted: never read again from the node.")
    gpus: int = Field(default=0, ge=0,
                      description="The node's GPUs when the lease was granted, as its "
                                  "observation said: what it takes from a GPU budget.")
    confirmed_at: datetime | None = None
    scope: LeaseScope = Field(
        default="node",
        description="node: the node is out of service (a node slot, all its GPUs). gpu: one "
                    "GPU isolated by a DeviceTaintRule, the node in service (no node slot, "
                    "`gpus` GPUs of every GPU budget) until the lease is widened.")

    @property
    def quarantined(self) -> bool:
        return self.state == NodeState.QUARANTINED

    def holds_slot(self, cordoned_counts: bool) -> bool:
        """Counted against the drain budget: every lease with a slot except a quarantined
        node (quarantined nodes hold no slot, by design), and a heat cordon outside the
        budget only where cordons count. A GPU-scoped lease holds none: its node stays in
        service."""
        if self.isolating or self.quarantined:
            return False
        if self.slot:
            return True
        return cordoned_counts and self.state in (NodeState.CORDONED, NodeState.HEALTHY)

    @property
    def isolating(self) -> bool:
        """Takes GPUs (not a node) from the budgets: a GPU-scoped lease."""
        return self.scope == "gpu"


def widened(lease: Lease, node_gpus: int) -> Lease:
    """The lease after the detector granted its remediation a node slot: a GPU-scoped
    lease becomes the node's (every GPU of it counted from now on); any other gets the drain
    slot a heat cordon asked for."""
    if lease.scope == "gpu":
        return lease.model_copy(update={"scope": "node", "slot": True, "gpus": node_gpus})
    return lease.model_copy(update={"slot": True})


class LeaseCheck(_Message):
    """A remediation asks whether its lease is live before a disruptive step."""

    node: str = Field(min_length=1, max_length=253)
    token: str = Field(default="", max_length=100)
    workflow_id: str = Field(default="", max_length=300)
    step: str = Field(default="", max_length=100)


class LeaseAnswer(_Message):
    live: bool
    why: str = ""


class LeaseStatus(_Message):
    """What Temporal says of a lease holder's workflow."""

    workflow_id: str
    status: Literal["RUNNING", "COMPLETED", "CANCELED", "TERMINATED", "FAILED", "TIMED_OUT",
                    "CONTINUED_AS_NEW", "NOT_FOUND", "UNKNOWN"]
    state: str = Field(default="", description="RemediationState, while running.")
    close_reason: str = ""


def check(leases: dict[str, Lease], chk: LeaseCheck) -> LeaseAnswer:
    """Is ``chk`` a live lease? An adopted lease (a remediation found running when the
    detector started, which cannot know its token) learns its token at its first confirm:
    trust on first use. Every adopted lease holds a slot from adoption, so the budget holds
    whoever confirms first; what this admits is a remediation started directly while no
    detector ran (docs/security.md)."""
    lease = leases.get(chk.node)
    if lease is None:
        return LeaseAnswer(live=False, why=f"no lease for {chk.node}: every remediation is "
                                           "admitted by the detector")
    if lease.orphan:
        return LeaseAnswer(live=False, why=f"the lease of {chk.node} is an orphan's "
                                           f"({lease.orphan})")
    if chk.workflow_id and chk.workflow_id != lease.workflow_id:
        return LeaseAnswer(live=False, why=f"the lease of {chk.node} belongs to "
                                           f"{lease.workflow_id}, not {chk.workflow_id}")
    if lease.token == "" and lease.adopted:
        return LeaseAnswer(live=True, why="adopted")
    if not chk.token or chk.token != lease.token:
        return LeaseAnswer(live=False, why=f"wrong lease token for {chk.node}")
    return LeaseAnswer(live=True)
