"""Operator commands against Temporal: updates with validators, queries, visibility.

Kept apart from the CLI so the CLI stays a thin layer of argument parsing and
printing, and so tests can drive the same code.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
from typing import Any, Literal

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from workflows.detector import DetectorWorkflow
from workflows.ids import DETECTOR_WORKFLOW_ID, remediation_workflow_id
from workflows.messages import (
    DetectorView,
    ManualRemediation,
    OperatorAck,
    OperatorCommand,
    RemediationResult,
    RemediationView,
)
from workflows.remediation import RemediationWorkflow
from workflows.search_attributes import REMEDIATION_STATE
from workflows.settings import DetectorSettings


class OperatorError(Exception):
    """A command that could not be carried out; the message says why."""


def operator_identity(explicit: str | None) -> str:
    """Who acts: ``--operator``, else $GPU_REMEDIATE_OPERATOR, else user@host (the login
    name alone says nothing once several machines run the CLI)."""
    if explicit is not None:
        return explicit
    if configured := os.environ.get("GPU_REMEDIATE_OPERATOR"):
        return configured
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry
        user = f"uid-{os.getuid()}"
    return f"{user}@{socket.gethostname().split('.', 1)[0]}"


def problems(err: ValidationError) -> str:
    """A refused command's reasons in one line, "field: why; ...", without the values (a
    refused value may carry a terminal escape)."""
    parts = []
    for e in err.errors(include_input=False):
        where = ".".join(str(p) for p in e.get("loc", ()))
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where and not msg.startswith(f"{where}:") else msg)
    return "; ".join(parts)


def _why(err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    return str(getattr(cause, "message", None) or cause or err)


RemediationVerb = Literal["approve", "reject", "quarantine", "release", "repaired", "note_abort"]


async def _update(client: Client, workflow_id: str, verb: str, arg: Any, *, what: str,
                  missing: str) -> OperatorAck:
    """Send an update; a validator's rejection or a missing workflow becomes OperatorError."""
    handle = client.get_workflow_handle(workflow_id)
    try:
        result: OperatorAck = await handle.execute_update(verb, arg, result_type=OperatorAck)
        return result
    except WorkflowUpdateFailedError as err:
        raise OperatorError(f"{what} rejected: {_why(err)}") from err
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError(missing) from err
        if err.status in (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED):
            raise  # the CLI explains a refusal from its token (worker/tokens.py)
        raise OperatorError(f"{what}: {err.message}") from err


async def remediation_update(client: Client, node: str, verb: RemediationVerb,
                             cmd: OperatorCommand) -> OperatorAck:
    try:
        return await _update(client, remediation_workflow_id(node), verb, cmd,
                             what=f"{verb} {node}", missing="")
    except OperatorError as err:
        if str(err):
            raise
        raise OperatorError(await no_remediation(client, node)) from err


async def last_remediation(client: Client, node: str) -> str | None:
    """How this node's last remediation ended: when, its outcome and why, its workflow id
    (Temporal keeps closed workflows for the namespace's retention); None if it had none
    Temporal still knows of."""
    handle = client.get_workflow_handle(remediation_workflow_id(node),
                                        result_type=RemediationResult)
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    status = desc.status.name.lower() if desc.status else "unknown"
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return f"{desc.id} is running (run {desc.run_id})"
    how = status
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        try:
            result = await handle.result()
            how = f"outcome {result.outcome.value}: {result.message}"
        except Exception:  # the status alone still says how it ended
            how = "completed"
    elif desc.status == WorkflowExecutionStatus.TERMINATED:
        how = "terminated (by an operator or `temporal workflow terminate`, not by itself)"
    when = f"{desc.close_time:%Y-%m-%d %H:%M:%S %Z}".strip() if desc.close_time else "(unknown)"
    return f"the last one ended {when}, {how} (workflow {desc.id}, run {desc.run_id})"


NO_REMEDIATION = "no remediation is running for"
NONE_KNOWN = "Temporal knows of none"


async def no_remediation(client: Client, node: str) -> str:
    """Why an action on ``node`` found nothing to act on, and what to run instead."""
    last = await last_remediation(client, node)
    orphan = False
    with contextlib.suppress(OperatorError):
        orphan = node in (await detector_view(client)).orphans
    lines = [f"{NO_REMEDIATION} {node}" + (f"; {last}" if last else f"; {NONE_KNOWN}")]
    if orphan:
        lines.append(f"it still carries our label (its workflow is gone): "
                     f"`gpu-remediate release-orphan {node} -r WHY` releases it")
    lines.append(f"next: `gpu-remediate status {node}` shows its last view; "
                 f"`gpu-remediate remediate {node} --action reset|reboot|quarantine -r WHY` "
                 "starts one")
    return "\n".join(lines)


async def abort(client: Client, node: str, cmd: OperatorCommand) -> str:
    """Cancel with who and why in the request itself (so the history records them as for
    a cancel from the UI); the workflow cleans up (uncordon if it cordoned).

    A remediation that already finished is a no-op said plainly; a node that never had
    one is an OperatorError."""
    handle = client.get_workflow_handle(remediation_workflow_id(node))
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError(f"no remediation found for {node}: nothing to abort") from err
        raise OperatorError(f"abort {node}: {err.message}") from err
    if desc.status != WorkflowExecutionStatus.RUNNING:
        status = desc.status.name.lower() if desc.status else "closed"
        return f"the remediation of {node} already ended ({status}): nothing to abort"
    try:
        await handle.cancel(reason=f"by {cmd.operator}: {cmd.reason or 'no reason given'}")
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return f"the remediation of {node} ended meanwhile: nothing to abort"
        raise OperatorError(f"abort {node}: {err.message}") from err
    return f"abort requested for {node}; the remediation releases the node"


DetectorVerb = Literal["pause", "resume", "remediate", "release_orphan", "reconfigure",
                       "resolve_incident", "release_incident"]


async def detector_update(client: Client, verb: DetectorVerb, arg: Any) -> OperatorAck:
    return await _update(client, DETECTOR_WORKFLOW_ID, verb, arg, what=verb,
                         missing="the detector is not running: `gpu-remediate detector start`")


async def manual_remediation(client: Client, req: ManualRemediation) -> OperatorAck:
    return await detector_update(client, "remediate", req)


async def detector_settings(client: Client) -> DetectorSettings:
    """The running detector's effective settings (its ``settings`` query)."""
    try:
        found: DetectorSettings = await client.get_workflow_handle(DETECTOR_WORKFLOW_ID).query(
            DetectorWorkflow.effective_settings)
        return found
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError("the detector is not running") from err
        raise OperatorError(f"detector settings: {err.message}") from err


async def detector_view(client: Client) -> DetectorView:
    try:
        view: DetectorView = await client.get_workflow_handle(DETECTOR_WORKFLOW_ID).query(
            DetectorWorkflow.view)
        return view
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError("the detector is not running") from err
        raise OperatorError(f"detector status: {err.message}") from err
    except WorkflowQueryFailedError as err:
        raise OperatorError(f"detector status: the workflow could not answer: {err}") from err


async def remediation_views(client: Client) -> list[RemediationView | dict[str, str]]:
    """Every running remediation: the live view when a worker answers the query,
    else what visibility holds (state and node from search attributes)."""
    out: list[RemediationView | dict[str, str]] = []
    query = 'WorkflowType="RemediationWorkflow" AND ExecutionStatus="Running"'
    async for wf in client.list_workflows(query):
        try:
            view: RemediationView = await client.get_workflow_handle(wf.id).query(
                RemediationWorkflow.view_state)
            out.append(view)
        except (RPCError, WorkflowQueryFailedError):
            sa = wf.typed_search_attributes
            out.append({"node": wf.id.removeprefix("remediation-"),
                        "state": str(sa.get(REMEDIATION_STATE) or "?"),
                        "workflow_id": wf.id})
    return out


async def remediation_view(client: Client, node: str) -> RemediationView:
    try:
        view: RemediationView = await client.get_workflow_handle(
            remediation_workflow_id(node)).query(RemediationWorkflow.view_state)
        return view
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError(await no_remediation(client, node)) from err
        raise OperatorError(f"status {node}: {err.message}") from err
    except WorkflowQueryFailedError as err:
        raise OperatorError(f"status {node}: the workflow could not answer: {err}") from err
