"""The label, annotation and taint keys this controller writes on nodes.

A remediation in flight is visible on its node under one prefix, so
``kubectl get nodes -L gpu-remediate.io/state`` shows the fleet's state. What the controller
remembers across remediations (history, acknowledged XIDs, XID sightings) lives in the node's
record (activities/record.py), where a kubelet cannot write; the annotations of those names
only mirror it.
"""

import hashlib

PREFIX = "gpu-remediate.io"

STATE_LABEL = f"{PREFIX}/state"
# The opt-out label: under node-restriction.kubernetes.io/, which the NodeRestriction
# admission plugin forbids a kubelet to set on its own Node, so a compromised node cannot
# mute itself. The label under our prefix (which a kubelet can set) is ignored and reported.
EXCLUDE_LABEL = "node-restriction.kubernetes.io/gpu-remediate-exclude"
LEGACY_EXCLUDE_LABEL = f"{PREFIX}/exclude"
TAINT_KEY = f"{PREFIX}/remediation"
JOB_LABEL = f"{PREFIX}/job"
NODE_LABEL = f"{PREFIX}/node"

A_REASON = f"{PREFIX}/reason"
A_ACTION = f"{PREFIX}/action"
A_STEP = f"{PREFIX}/step"
A_WORKFLOW = f"{PREFIX}/workflow-id"
A_RUN = f"{PREFIX}/run-id"
A_SINCE = f"{PREFIX}/since"
A_ATTEMPT = f"{PREFIX}/attempt"
A_TRANSITION = f"{PREFIX}/last-transition"
A_HISTORY = f"{PREFIX}/history"
A_PRECORDONED = f"{PREFIX}/pre-cordoned"
A_ACK_XIDS = f"{PREFIX}/acknowledged-xids"
A_ORPHAN = f"{PREFIX}/orphaned"
# Per GPU: last XID shown, app-XID sightings in the escalation window (xid_sightings.py).
A_XID_SIGHTINGS = f"{PREFIX}/xid-sightings"

# While a node is out of service because of us, autoscalers must leave it alone: a drained
# or quarantined node looks empty, and scaling it down would lose the evidence and recycle a
# bad host. Added at the claim where absent, removed on release (kept while quarantined);
# which ones we added is recorded, so an admin's own mark is never removed.
AUTOSCALER_MARKS = {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
                    "karpenter.sh/do-not-disrupt": "true"}
A_ADDED_MARKS = f"{PREFIX}/added-marks"

# Annotations that describe an in-flight remediation; removed on release.
IN_FLIGHT_ANNOTATIONS = (A_REASON, A_ACTION, A_STEP, A_WORKFLOW, A_RUN, A_SINCE, A_ATTEMPT,
                         A_PRECORDONED, A_ORPHAN, A_ADDED_MARKS)

HISTORY_LIMIT = 20
"""Entries the history annotation mirrors (the record keeps more: activities/record.py)."""

# A label value holds at most 63 characters; a node name may have up to 253.
LABEL_VALUE_MAX = 63


def label_value(text: str) -> str:
    """``text`` as a label value: itself when it fits, else a prefix and a hash of the whole,
    so two long node names sharing their first 54 characters still label apart. The full
    name goes in an annotation next to it."""
    if len(text) <= LABEL_VALUE_MAX:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[:LABEL_VALUE_MAX - 9].rstrip('-._')}-{digest}"

A_INCIDENT = f"{PREFIX}/domain-incident"
"""On a node the detector cordoned for a domain incident: the incident (label=value). A mirror
for kubectl: the detector's record (DetectorState.incident_cordons) decides what it uncordons."""
