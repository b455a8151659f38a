"""The operator-command rules hold wherever a command comes from: an update sent as the
Temporal UI sends it (a JSON payload, no CLI in between) is refused by the model's own
validation; a signal is recorded as refused; a recorded command (a view, a continue-as-new
state) is not held to them. And a command for a node with no running remediation says how
the last one ended and what to run next. Real dev server (``local_env``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowUpdateFailedError

from tests.workflows.fakes import FakeCluster, until, worker_for
from tests.workflows.test_operator_actions import node_name, reach, start, view
from worker.cli import operator as ops
from workflows.messages import (
    ManualRemediation,
    OperatorCommand,
    OrphanRelease,
    RemediationView,
)
from workflows.remediation import RemediationWorkflow
from workflows.transitions import NodeState

ESC = "\x1b"


async def refused_update(handle: Any, payload: dict[str, Any]) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update("approve", payload)
    return str(getattr(failed.value.cause, "message", failed.value.cause))


async def test_an_update_from_the_ui_without_a_reason_is_refused_by_the_model(
        local_env: Any) -> None:
    cluster, node = FakeCluster(), node_name("rules-upd")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        no_reason = await refused_update(handle, {"operator": "alice"})
        spaces = await refused_update(handle, {"operator": "alice", "reason": "  "})
        escape = await refused_update(handle, {"operator": "alice",
                                               "reason": f"ok{ESC}]0;title\a"})
        internal = await refused_update(handle, {"operator": "detector", "reason": "mine"})
        still = (await view(handle)).state
        ack = await handle.execute_update("approve", {"operator": "alice",
                                                      "reason": "checked dmesg"},
                                          result_type=dict)
        await handle.terminate("test over")
    assert "reason: required" in no_reason and "reason: required" in spaces
    assert "U+001B" in escape and ESC not in escape and "title" not in escape
    assert "act under your own name" in internal
    assert still == NodeState.AWAITING_APPROVAL, "no refused update approved anything"
    assert ack["accepted"] is True


async def test_a_signal_without_a_reason_is_recorded_as_refused(local_env: Any) -> None:
    cluster, node = FakeCluster(), node_name("rules-sig")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        await handle.signal("approve", {"operator": "alice"})
        await handle.signal("approve", {"operator": "alice", "reason": f"x{ESC}[2J"})

        async def two() -> bool:
            return len((await view(handle)).rejected_commands) >= 2
        await until(two, 15, "two refused signals")
        v = await view(handle)
        await handle.terminate("test over")
    assert v.state == NodeState.AWAITING_APPROVAL
    whys = [r.why for r in v.rejected_commands]
    assert "reason: required" in whys[0] and "U+001B" in whys[1]
    assert all(ESC not in why for why in whys)
    events = [e for e in cluster.events if e[1] == "OperatorSignalRejected"]
    assert len(events) == 2 and all(ESC not in e[2] for e in events)


def test_the_rules_check_commands_arriving_not_records() -> None:
    with pytest.raises(ValidationError, match="reason: required"):
        OperatorCommand(operator="alice", reason="")
    with pytest.raises(ValidationError, match="node: 'Node_1' is not a node name"):
        ManualRemediation(node="Node_1", action="reboot", operator="a", reason="b")
    with pytest.raises(ValidationError, match="reason: required"):
        OrphanRelease(node="gpu-node-01", operator="a")
    # Recorded before the rules: a view (nested), an activity's input (JSON outside a
    # workflow) keep decoding.
    old = RemediationView.model_validate({
        "node": "n", "state": "quarantined", "step": "quarantined", "action": "reboot",
        "reason": "x", "dry_run": False,
        "quarantine_ordered_by": {"operator": "carol", "reason": ""}})
    assert old.quarantine_ordered_by is not None and old.quarantine_ordered_by.reason == ""
    assert OrphanRelease.model_validate_json('{"node": "n", "operator": "a"}').reason == ""
    # A recorded reason past the limit is cut, not refused.
    long = OperatorCommand.model_validate({"operator": "a", "reason": "x" * 5000},
                                          context={"operator_rules": False})
    assert len(long.reason) == 1024 and long.reason.endswith("…")


async def test_no_running_remediation_says_how_the_last_ended_and_what_next(
        local_env: Any) -> None:
    cluster, node = FakeCluster(), node_name("rules-gone")
    async with worker_for(local_env.client, cluster) as queue:
        handle = await start(local_env.client, queue, node)
        await reach(handle, NodeState.AWAITING_APPROVAL)
        await handle.execute_update(RemediationWorkflow.reject,
                                    OperatorCommand(operator="bob", reason="job deadline"))
        await asyncio.wait_for(handle.result(), 30)
        with pytest.raises(ops.OperatorError) as ended:
            await ops.remediation_update(local_env.client, node, "approve",
                                         OperatorCommand(operator="a", reason="b"))
        with pytest.raises(ops.OperatorError) as never:
            await ops.remediation_update(local_env.client, f"{node}-never", "approve",
                                         OperatorCommand(operator="a", reason="b"))
    said = str(ended.value)
    assert said.startswith(f"no remediation is running for {node}; the last one ended ")
    assert "outcome released: rejected by bob" in said and f"remediation-{node}" in said
    assert f"`gpu-remediate status {node}`" in said and "remediate" in said
    assert ops.NONE_KNOWN in str(never.value)
