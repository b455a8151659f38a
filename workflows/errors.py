"""The failure types: what activities and workflow handlers raise, and what the workflows match.

A Temporal ``ApplicationError`` carries its type as a string across processes (and releases:
a type already in a history must keep its spelling). Every type raised or matched here is
one of these names, with what it means; code uses the names, never the strings.

Pure: imported by workflows inside the sandbox and by activities.
"""

from __future__ import annotations

from typing import Final

NODE_GONE: Final = "NodeGone"
NOT_FOUND: Final = "NotFound"
FORBIDDEN: Final = "Forbidden"
INVALID: Final = "Invalid"
CONFLICT: Final = "Conflict"
REJECTED: Final = "Rejected"
JOB_RUNNING: Final = "JobRunning"
JOB_CONFLICT: Final = "JobConflict"
JOB_TEMPLATE_REFUSED: Final = "JobTemplateRefused"
THERMAL_UNCHANGED: Final = "ThermalUnchanged"
NOT_ORPHAN: Final = "NotOrphan"
DETECTOR_NOT_RUNNING: Final = "DetectorNotRunning"
LEASE_REFUSED: Final = "LeaseRefused"
JOB_NOT_STARTED: Final = "JobNotStarted"
NODE_NOT_READY: Final = "NodeNotReady"
HOST_ENGINE_BUSY: Final = "HostEngineBusy"
OPERANDS_NOT_FOUND: Final = "OperandsNotFound"

ERROR_TYPES: Final[dict[str, str]] = {
    NODE_GONE: "The node was deleted, or replaced by another machine under its name (another "
               "metadata.uid): nothing more is written to it; the remediation ends.",
    NOT_FOUND: "An object the activity needs does not exist (HTTP 404): not retried.",
    FORBIDDEN: "HTTP 401/403: missing RBAC; retried slowly, so a fixed ClusterRole resumes.",
    INVALID: "HTTP 400/422: the request is wrong, retrying cannot help.",
    CONFLICT: "The object kept changing under a guarded write: retried.",
    REJECTED: "An operator command (signal or update) refused, with why.",
    JOB_RUNNING: "A node Job has not finished yet: the poll of a wait by retry (benign).",
    JOB_CONFLICT: "A Job of that name exists and is not ours: not retried.",
    JOB_TEMPLATE_REFUSED: "The Job template fails the worker's checks: not retried.",
    THERMAL_UNCHANGED: "A heat watch saw no change yet: the poll of a wait by retry (benign).",
    NOT_ORPHAN: "release-orphan found the node's remediation running again.",
    DETECTOR_NOT_RUNNING: "A lease cannot be confirmed: the detector is not running (retried: "
                          "no disruptive step is taken meanwhile).",
    LEASE_REFUSED: "The detector holds no live lease for this remediation (a direct start, a "
                   "wrong token, an orphan's lease): it takes no disruptive step.",
    JOB_NOT_STARTED: "A node Job's pod cannot start (its image cannot be pulled): the step "
                     "never ran on the node; the Job is deleted; not retried.",
    HOST_ENGINE_BUSY: "A DCGM validation Job is not created while dcgm-exporter's embedded "
                      "host engine runs on the node (its own would be a second one): the "
                      "poll of a wait by retry (benign) until the exporter is paused.",
    OPERANDS_NOT_FOUND: "No DaemonSet in the configured GPU Operator namespace selects a "
                        "configured operand's deploy label (a wrong namespace would look like "
                        "a successful restore): not retried.",
    NODE_NOT_READY: "The node is NotReady, so no node Job is created on it (its pod could "
                    "not run, or would run late): the poll of a wait by retry (benign).",
}
"""Every failure type, and what it means."""

NOT_RETRIED: Final = (NOT_FOUND, INVALID)
"""Types no call to the cluster retries (each retry policy adds what else it must not)."""
