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
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from workflows import errors as error_types
from workflows.ids import CONFIRM_LEASE_UPDATE, DETECTOR_WORKFLOW_ID
from workflows.leases import LeaseAnswer, LeaseCheck, LeaseStatus

# The messages live with the others (the detector workflow imports them).
from workflows.messages import RunningRemediation, RunningRemediations, RunningRemediationsInput
from workflows.search_attributes import GPU_NODE, REMEDIATION_STATE

REMEDIATION_WORKFLOW = "RemediationWorkflow"
_ID_PREFIX = "remediation-"
_STATUSES = {"RUNNING", "COMPLETED", "CANCELED", "TERMINATED", "FAILED", "TIMED_OUT",
             "CONTINUED_AS_NEW"}


def running_remediations_query(task_queue: str) -> str:
    return (f"WorkflowType = '{REMEDIATION_WORKFLOW}' AND ExecutionStatus = 'Running' "
            f"AND TaskQueue = '{task_queue}'")


async def lease_statuses(client: Client, task_queue: str,
                         workflow_ids: list[str]) -> list[LeaseStatus]:
    """Each lease holder's workflow as Temporal sees it: running (with its state), or
    closed and how. One visibility list for the running ones; a describe for each lease
    not listed (closed, or started too recently for visibility to list it). An error
    means "cannot tell", and the caller frees nothing."""
    running: dict[str, str] = {}
    if task_queue:
        async for wf in client.list_workflows(running_remediations_query(task_queue),
                                              page_size=1000):
            running[wf.id] = wf.typed_search_attributes.get(REMEDIATION_STATE) or ""
    out: list[LeaseStatus] = []
    for wid in workflow_ids:
        if wid in running:
            out.append(LeaseStatus(workflow_id=wid, status="RUNNING", state=running[wid]))
        else:
            out.append(await described(client, wid))
    return out


async def described(client: Client, wid: str) -> LeaseStatus:
    try:
        desc = await client.get_workflow_handle(wid).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return LeaseStatus(workflow_id=wid, status="NOT_FOUND")
        raise
    status = desc.status.name if desc.status is not None else "UNKNOWN"
    if status not in _STATUSES:
        status = "UNKNOWN"
    state = ""
    if status == "RUNNING":
        state = desc.typed_search_attributes.get(REMEDIATION_STATE) or ""
    return LeaseStatus(workflow_id=wid, status=status, state=state)


class VisibilityActivities:
    def __init__(self, client: Client, *, detector_id: str = DETECTOR_WORKFLOW_ID) -> None:
        self._client = client
        # The one detector whose leases count: never a workflow a caller names (a stray
        # workflow that started a remediation as its child must not vouch for it).
        self._detector_id = detector_id

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


    @activity.defn
    async def confirm_lease(self, chk: LeaseCheck) -> LeaseAnswer:
        """Ask the detector whether this remediation's lease is live (its confirm_lease
        update). A refusal by the detector's validator is an answer (not live, and why);
        a detector that cannot be reached is an error the caller's retry asks again."""
        handle = self._client.get_workflow_handle(self._detector_id)
        try:
            return await handle.execute_update(CONFIRM_LEASE_UPDATE, chk,
                                               result_type=LeaseAnswer)
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            why = cause.message if isinstance(cause, ApplicationError) else str(cause or err)
            if isinstance(cause, ApplicationError) and \
                    cause.type == error_types.DETECTOR_NOT_RUNNING:
                raise ApplicationError(why, type=error_types.DETECTOR_NOT_RUNNING) from err
            return LeaseAnswer(live=False, why=why[:500])
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise ApplicationError(f"the detector ({self._detector_id}) is not running: "
                                       "no lease can be confirmed until it runs",
                                       type=error_types.DETECTOR_NOT_RUNNING) from err
            raise
