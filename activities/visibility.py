"""Which remediations are running, from Temporal visibility.

A detector that starts without carried state (the first one, one started again after
`detector stop`, or after its workflow was terminated) does not know the remediations its
predecessor started. Those whose claim has not landed yet carry no node label, so the
fleet observation cannot see them either: without this look-up the new detector would
count their slots as free and could admit past the budget. It asks Temporal instead,
once, before its first admission.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field, field_validator
from temporalio import activity
from temporalio.client import Client

from workflows.models import _Message
from workflows.search_attributes import GPU_NODE, REMEDIATION_STATE

REMEDIATION_WORKFLOW = "RemediationWorkflow"
_ID_PREFIX = "remediation-"


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


def running_remediations_query(task_queue: str) -> str:
    return (f"WorkflowType = '{REMEDIATION_WORKFLOW}' AND ExecutionStatus = 'Running' "
            f"AND TaskQueue = '{task_queue}'")


class VisibilityActivities:
    def __init__(self, client: Client) -> None:
        self._client = client

    @activity.defn
    async def list_running_remediations(
            self, inp: RunningRemediationsInput) -> RunningRemediations:
        """Running RemediationWorkflow executions on the detector's task queue, with their
        node (the GpuNode search attribute, else the workflow ID) and state."""
        found: list[RunningRemediation] = []
        truncated = False
        async for wf in self._client.list_workflows(
                running_remediations_query(inp.task_queue), page_size=1000):
            if len(found) >= inp.limit:
                truncated = True
                break
            node = wf.typed_search_attributes.get(GPU_NODE)
            if not node and wf.id.startswith(_ID_PREFIX):
                node = wf.id[len(_ID_PREFIX):]
            if not node:
                continue  # not one of ours: the detector names every child
            found.append(RunningRemediation(
                node=node, workflow_id=wf.id,
                state=wf.typed_search_attributes.get(REMEDIATION_STATE) or "",
                started=wf.start_time))
            if len(found) % 1000 == 0:
                activity.heartbeat(len(found))
        return RunningRemediations(remediations=found, truncated=truncated)
