"""Names and limits the workflows, activities, worker and CLI agree on: the task queues,
the workflow IDs, the signal names, and how long an operator's name and reason may be.

Pure: no pydantic, no I/O; workflow code imports this module through the sandbox.
"""

from __future__ import annotations

import re
import unicodedata
import zlib

TASK_QUEUE = "gpu-remediate"
DETECTOR_WORKFLOW_ID = "gpu-remediate-detector"
DETECTOR_REQUESTER = "detector"
"""Who requested a remediation the detector started for its policy's verdict (a remediation's
``requested_by``); any other requester is the operator of a manual remediation."""

MAX_REASON_CHARS = 1024
"""The longest reason an operator may give: it is written into node annotations, Events and
the history annotation, and the API server refuses a node whose annotations together pass
256 KiB. A command arriving with a longer one is refused (workflows/messages.py,
``reason_problem``); a recorded one is cut to it (ending in "…"), so that it still decodes."""
MAX_OPERATOR_CHARS = 253


def observe_task_queue(task_queue: str) -> str:
    """The fleet observation's own task queue, polled by a worker of its own in every
    worker process, so a tick never waits for a slot behind remediation activities."""
    return f"{task_queue}-observe"


def remediation_workflow_id(node: str) -> str:
    return f"remediation-{node}"


REQUEST_SLOT_SIGNAL = "request_slot"
SLOT_GRANTED_SIGNAL = "slot_granted"
CONFIRM_LEASE_UPDATE = "confirm_lease"
"""The detector's update a remediation's activity calls before each disruptive step."""


def shard_of(node: str, shards: int) -> int:
    """A stable shard for a node name (no hash randomisation: workers must agree)."""
    return zlib.crc32(node.encode()) % shards if shards > 1 else 0


MAX_NODE_NAME_CHARS = 253
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def valid_node_name(name: str) -> str | None:
    """Why ``name`` cannot be a Kubernetes node's name, or None when it can: a DNS-1123
    subdomain (lower-case letters, digits, '-' and '.', each dot-separated part starting
    and ending with a letter or digit, at most 253 characters), as the API server requires.
    Checked before any call, so a name that no node can have (CR/LF, a path, upper case)
    is never written into a workflow ID, an Event or a history."""
    if not name:
        return "a node name cannot be empty"
    bad = next((c for c in name if unicodedata.category(c) in ("Cc", "Cf")), None)
    if bad is not None:
        return f"a node name cannot contain control characters (U+{ord(bad):04X})"
    if len(name) > MAX_NODE_NAME_CHARS:
        return f"a node name has at most {MAX_NODE_NAME_CHARS} characters, not {len(name)}"
    if name != name.lower():
        return f"{name!r} is not a node name: node names are lower-case"
    if not _DNS1123_SUBDOMAIN.fullmatch(name):
        return (f"{name!r} is not a node name: lower-case letters, digits, '-' and '.', "
                "starting and ending with a letter or digit (a DNS-1123 subdomain)")
    return None
