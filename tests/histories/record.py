"""Record the workflow histories that tests/workflows/test_replay.py replays.

Rerun this when a workflow change is intentional (and replay of the old histories
is *meant* to break, e.g. a new activity call), then commit the new JSON files:

    .venv/bin/python -m tests.histories.record

It starts the pip-installed dev server, runs the workflows against the in-memory
FakeCluster (tests/workflows/fakes.py) and writes one file per history here:

- remediation_reboot.json            XID 79: drain, reboot, validate, healthy
- remediation_approved.json          supervised: awaiting approval, `approve` update, healthy
- remediation_quarantine_release.json  `quarantine` while draining, `release`, validated
- detector_ticks.json                first run of a detector: ticks, a child start, a
                                     `pause` and `resume` update, continue-as-new

Each file is ``(await handle.fetch_history()).to_json()``; the file name (without
``.json``) is the workflow id given to ``WorkflowHistory.from_json`` on replay.
Before you rerun it for a change that should NOT affect replay, don't: a failing
replay test means the change breaks workflows already running in production; guard
it with ``workflow.patched(...)`` instead.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from policy.models import Action
from tests.conftest import binary
from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from workflows.detector import DetectorWorkflow
from workflows.models import (
    ApprovalSettings,
    DetectorInput,
    DetectorSettings,
    DrainResult,
    DrainSettings,
    NodeState,
    OperatorCommand,
    RemediationInput,
    RemediationSettings,
)
from workflows.remediation import RemediationWorkflow
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES

HERE = Path(__file__).parent
FAST = RemediationSettings(drain=DrainSettings(retry_interval=timedelta(seconds=1)))
OP = OperatorCommand(operator="recorder", reason="recorded history")


async def save(name: str, handle: WorkflowHandle) -> None:
    history = await handle.fetch_history()
    (HERE / f"{name}.json").write_text(history.to_json() + "\n")
    print(f"{name}.json: {len(history.events)} events")


async def state_is(handle: WorkflowHandle, state: NodeState) -> None:
    async def check() -> bool:
        return (await handle.query(RemediationWorkflow.view_state)).state == state
    await until(check, 20, state.value)


async def remediation_reboot(client: Client) -> None:
    async with worker_for(client, FakeCluster()) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run, RemediationInput(node="node-a", verdict=xid_verdict("node-a"),
                                                      settings=FAST),
            id="remediation_reboot", task_queue=queue)
        await handle.result()
        await save("remediation_reboot", handle)


async def remediation_approved(client: Client) -> None:
    settings = FAST.model_copy(update={"approval": ApprovalSettings(
        required_for=[Action.REBOOT], timeout=timedelta(hours=4))})
    async with worker_for(client, FakeCluster()) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run, RemediationInput(node="node-b", verdict=xid_verdict("node-b"),
                                                      settings=settings),
            id="remediation_approved", task_queue=queue)
        await state_is(handle, NodeState.AWAITING_APPROVAL)
        await handle.execute_update(RemediationWorkflow.approve, OP)
        await handle.result()
        await save("remediation_approved", handle)


async def remediation_quarantine_release(client: Client) -> None:
    blocked = DrainResult(outcome="blocked", remaining=["team-a/trainer-1"],
                          blocking_pdb="team-a/trainer")
    async with worker_for(client, FakeCluster(drain_results=[blocked])) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run, RemediationInput(node="node-c", verdict=xid_verdict("node-c"),
                                                      settings=FAST),
            id="remediation_quarantine_release", task_queue=queue)
        await state_is(handle, NodeState.DRAINING)
        await handle.execute_update(RemediationWorkflow.quarantine, OP)
        await state_is(handle, NodeState.QUARANTINED)
        await handle.execute_update(RemediationWorkflow.release, OP)
        await handle.result()
        await save("remediation_quarantine_release", handle)


async def detector_ticks(client: Client) -> None:
    cluster = FakeCluster(verdicts=[xid_verdict("node-d")])
    for i in range(10):
        cluster.node(f"node-d{i}")
    settings = DetectorSettings(interval=timedelta(seconds=1), ticks_per_run=4,
                                remediation=FAST)
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings), id="detector_ticks",
            task_queue=queue)
        first = (await handle.describe()).run_id
        await until(lambda: cluster.claimed == ["node-d"], 20, "a child start")
        await handle.execute_update(DetectorWorkflow.pause, OP)
        await handle.execute_update(DetectorWorkflow.resume, OP)

        async def continued() -> bool:
            return (await handle.describe()).run_id != first
        await until(continued, 20, "continue-as-new")
        await save("detector_ticks", client.get_workflow_handle("detector_ticks", run_id=first))
        await handle.terminate("recorded")
        child = client.get_workflow_handle("remediation-node-d")
        await child.result()


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=binary("temporal"),
        search_attributes=list(SEARCH_ATTRIBUTES))
    try:
        for record in (remediation_reboot, remediation_approved,
                       remediation_quarantine_release, detector_ticks):
            await record(env.client)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
