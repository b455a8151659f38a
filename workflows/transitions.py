"""The remediation's state machine as data: its states, which state may follow which,
and why.

docs/architecture.md draws the same machine (a test checks that the diagram and this table
have the same edges). The remediation workflow checks every state it enters against the
table: an edge not in it is a bug, logged as a warning and counted in the SDK metric
``gpu_remediate_illegal_transitions`` (production goes on: the node's safety does not depend on
the drawing); in the workflow tests the fake cluster records every state write outside the
table and fails the test that made it (tests/workflows/fakes.py). Staying in a
state with a new step (draining → draining: the drain was forced) is always allowed, and so is
leaving any state for healthy: an abort releases the node from wherever it is.

Pure: imported by the workflow inside the Temporal sandbox.
"""

from __future__ import annotations

from enum import StrEnum


class NodeState(StrEnum):
    """The node's remediation state, written to the node's state label."""

    HEALTHY = "healthy"
    AWAITING_APPROVAL = "awaiting-approval"
    DRAINING = "draining"
    REPAIRING = "repairing"
    VALIDATING = "validating"
    CORDONED = "cordoned"
    QUARANTINED = "quarantined"


# States that hold a budget slot. Cordoned is added per configuration.
OUT_OF_SERVICE_STATES = frozenset(
    {NodeState.AWAITING_APPROVAL, NodeState.DRAINING, NodeState.REPAIRING, NodeState.VALIDATING}
)


class Step(StrEnum):
    """Where a remediation is within its state: the view's step, each transition's, and the
    node's step annotation. Values are on nodes and in recorded histories: never renamed."""

    STARTING = "starting"
    CLAIM = "claim"  # the node's annotation, written by the claim itself
    CLAIMED = "claimed"
    REPEAT_OFFENDER = "repeat-offender"
    APPROVED = "approved"
    WAITING_FOR_A_DRAIN_SLOT = "waiting-for-a-drain-slot"
    THERMAL_ESCALATION = "thermal-escalation"
    DRAIN = "drain"
    DRAIN_FORCE = "drain-force"
    DRAIN_OVERDUE = "drain-overdue"
    GPU_RESET = "gpu-reset"
    REBOOT = "reboot"
    REBOOTED = "rebooted"
    EXTERNAL = "external"
    VALIDATE = "validate"
    QUARANTINED = "quarantined"
    RELEASE_VALIDATE = "release-validate"
    NODE_GONE = "node-gone"
    # Per-GPU isolation (workflows/isolation.py): the node stays Healthy and schedulable.
    GPU_ISOLATED = "gpu-isolated"
    GPU_QUARANTINED = "gpu-quarantined"
    # The last step of a remediation that gave the node back: its outcome.
    HEALTHY = "healthy"
    RELEASED = "released"
    ABORTED = "aborted"


class Outcome(StrEnum):
    """How a remediation ended (its result, the release of the node, the Event and the
    history entry): healthy (repaired or cooled down, back in service), quarantined (held
    for a human), released (given back unrepaired: rejected, approval timed out, drain
    deadline, node gone, orphan released) or aborted (cancelled by an operator)."""

    HEALTHY = "healthy"
    QUARANTINED = "quarantined"
    RELEASED = "released"
    ABORTED = "aborted"


S = NodeState

TRANSITIONS: dict[NodeState, dict[NodeState, str]] = {
    S.HEALTHY: {
        S.AWAITING_APPROVAL: "verdict needs a drain, supervised mode",
        S.DRAINING: "verdict reset / reboot / quarantine",
        S.CORDONED: "verdict thermal, hot for thermal_debounce (no drain slot taken)",
    },
    S.AWAITING_APPROVAL: {
        S.DRAINING: "approve (or timeout with on_timeout=approve)",
        S.HEALTHY: "reject / timeout (released untouched)",
    },
    S.DRAINING: {
        S.AWAITING_APPROVAL: "the claim finds a repeat offender whose quarantine needs "
                             "approval (nothing evicted yet)",
        S.REPAIRING: "pods gone",
        S.HEALTHY: "drain deadline with policy=release",
        S.QUARANTINED: "quarantine verdict, repeat offender, operator order",
    },
    S.REPAIRING: {
        S.VALIDATING: "reset Job succeeded / node back from reboot (new boot ID, Ready, GPUs)",
        S.REPAIRING: "GPU reset failed, escalate to reboot",
        S.QUARANTINED: "node did not return within reboot_return_timeout",
    },
    S.VALIDATING: {
        S.HEALTHY: "validation passed (uncordon unless an admin had cordoned)",
        S.REPAIRING: "validation failed, attempts left (reset escalates to reboot)",
        S.QUARANTINED: "validation failed max_repair_attempts times",
    },
    S.CORDONED: {
        S.HEALTHY: "cool for the hold time",
        S.DRAINING: "hardware fault appears, or still hot after escalate_after, once the "
                    "detector grants a drain slot",
    },
    S.QUARANTINED: {
        S.QUARANTINED: "operator release validates it (label stays quarantined: no budget slot)",
        S.HEALTHY: "release validation passed",
    },
}
"""From -> to -> why. Same-state edges with a new step and any state -> healthy (abort) are
allowed without being listed (``allowed``)."""


def allowed(old: NodeState, new: NodeState) -> bool:
    """Whether the workflow may go from ``old`` to ``new``."""
    return old == new or new == NodeState.HEALTHY or new in TRANSITIONS.get(old, {})


def why(old: NodeState, new: NodeState) -> str:
    """The diagram's label of the edge, or what makes an unlisted allowed edge legal."""
    if new in TRANSITIONS.get(old, {}):
        return TRANSITIONS[old][new]
    if old == new:
        return "same state, next step"
    if new == NodeState.HEALTHY:
        return "released (abort or end of the remediation)"
    return "not an edge of the state machine"
