"""Names and limits the workflows, activities, worker and CLI agree on: the task queues,
the workflow IDs, the signal names, and how long an operator's name and reason may be.

Pure: no pydantic, no I/O; workflow code imports this module through the sandbox.
"""

from __future__ import annotations

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


def shard_of(node: str, shards: int) -> int:
    """A stable shard for a node name (no hash randomisation: workers must agree)."""
    return zlib.crc32(node.encode()) % shards if shards > 1 else 0
