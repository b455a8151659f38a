"""An operator's name is shown marked unverified unless the worker's own settings say the
Temporal server authenticates callers (``remediation.server_authorizes``), on the real dev
server (``local_env``: updates are not reliable on the time-skipping server)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
import typer
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowFailureError

from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from tests.workflows.test_operator_actions import SUPERVISED
from worker.cli import commands as cli
from workflows.messages import OperatorCommand, RemediationInput, RemediationView
from workflows.operator_identity import UNVERIFIED_MARK, shown_operator
from workflows.remediation import RemediationWorkflow
from workflows.transitions import NodeState


def test_a_name_is_marked_unless_the_server_authorizes() -> None:
    assert shown_operator("alice", server_authorizes=False) == "alice (unverified)"
    assert shown_operator("alice", server_authorizes=True) == "alice"


def test_marking_twice_is_marking_once_and_nothing_is_not_marked() -> None:
    once = shown_operator("alice", server_authorizes=False)
    assert shown_operator(once, server_authorizes=False) == once
    assert shown_operator("", server_authorizes=False) == ""
    assert UNVERIFIED_MARK == " (unverified)"


async def _approve_then_quarantine(local_env, authorizes: bool
                                   ) -> tuple[RemediationView, str, list[str], list[str]]:
    """Approve, order a quarantine (each as an update), then a rejected signal: the view,
    the current details, the node's Events and every history annotation entry written."""
    cluster, node = FakeCluster(), f"ident-{uuid.uuid4().hex[:8]}"
    settings = SUPERVISED.model_copy(update={"server_authorizes": authorizes})
    async with worker_for(local_env.client, cluster) as queue:
        handle = await local_env.client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=xid_verdict(node, 79), settings=settings),
            id=f"remediation-{node}", task_queue=queue)

        async def awaiting() -> bool:
            view = await handle.query(RemediationWorkflow.view_state)
            return view.state == NodeState.AWAITING_APPROVAL
        await until(awaiting, 10.0, f"{node} awaiting approval")
        await handle.execute_update(RemediationWorkflow.approve,
                                    OperatorCommand(operator="alice", reason="checked"))
        await handle.execute_update(RemediationWorkflow.quarantine,
                                    OperatorCommand(operator="bob", reason="hold it"))
        await handle.signal("approve", {"operator": "carol", "reason": "again"})

        async def quarantined() -> bool:
            view = await handle.query(RemediationWorkflow.view_state)
            return view.state == NodeState.QUARANTINED and bool(view.rejected_commands)
        await until(quarantined, 15.0, f"{node} quarantined")
        view = await handle.query(RemediationWorkflow.view_state)
        meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
        await handle.cancel(reason="by dave: done")
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 15)
    events = [message for n, _, message in cluster.events if n == node]
    outcomes = [c[1].history.outcome for c in cluster.calls if c[0] == "release_node"]
    return view, meta.current_details, events, outcomes


def _status_of(view: RemediationView, monkeypatch: pytest.MonkeyPatch) -> str:
    """What `gpu-remediate status NODE` prints for this view."""
    monkeypatch.setattr(cli, "with_client", lambda config, work, hint=None, needs="write":
                        [] if work is cli._open_incidents else view)
    monkeypatch.setattr(cli, "_print_ui_link", lambda config, node: None)
    with cli.out.capture() as captured, contextlib.suppress(typer.Exit):
        cli.status(view.node, "table", False, None)
    return captured.get()


async def test_without_an_authorizing_server_every_name_shown_is_marked(
        local_env, monkeypatch: pytest.MonkeyPatch) -> None:
    view, details, events, outcomes = await _approve_then_quarantine(local_env, False)
    assert "quarantine ordered by operator bob (unverified): hold it" in \
        _status_of(view, monkeypatch)
    assert view.quarantine_ordered_by is not None
    assert view.quarantine_ordered_by.operator == "bob (unverified)"
    assert [c.operator for c in view.rejected_commands] == ["carol (unverified)"]
    assert any("carol (unverified)" in e for e in events), events
    assert any("bob (unverified)" in x for x in [*events, *outcomes]), (events, outcomes)
    assert "aborted: aborted by dave (unverified): done" in outcomes, outcomes
    shown = " ".join([details, *events, *outcomes])
    for name in ("alice", "bob", "carol", "dave"):
        assert shown.count(name) == shown.count(f"{name} (unverified)"), (name, shown)


async def test_with_an_authorizing_server_names_are_shown_as_sent(
        local_env, monkeypatch: pytest.MonkeyPatch) -> None:
    view, details, events, outcomes = await _approve_then_quarantine(local_env, True)
    printed = _status_of(view, monkeypatch)
    assert "quarantine ordered by operator bob: hold it" in printed
    assert "unverified" not in printed
    assert view.quarantine_ordered_by is not None
    assert view.quarantine_ordered_by.operator == "bob"
    assert [c.operator for c in view.rejected_commands] == ["carol"]
    assert "aborted: aborted by dave: done" in outcomes, outcomes
    assert "unverified" not in " ".join([details, *events, *outcomes])
