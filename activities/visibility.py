"""Which remediations are running, from Temporal visibility.

A detector that starts without carried state (the first one, one started again after
`detector stop`, or after its workflow was terminated) does not know the remediations its
predecessor started. Those whose claim has not landed yet carry no node label, so the
fleet observation cannot see them either: without this look-up the new detector would
count their slots as free and could admit past the budget. It asks Temporal instead,
once, before its first admission.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client

# The messages live with the others (the detector workflow imports them).
from workflows.messages import RunningRemediation, RunningRemediations, RunningRemediationsInput
from workflows.search_attributes import GPU_NODE, REMEDIATION_STATE

REMEDIATION_WORKFLOW = "RemediationWorkflow"
_ID_PREFIX = "remediation-"


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
