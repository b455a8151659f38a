"""Record the workflow histories that tests/workflows/test_replay.py replays.

Rerun this when a workflow change is intentional (and replay of the old histories
is *meant* to break, e.g. a new activity call), then commit the new JSON files:

    .venv/bin/python -m tests.histories.record            # the current corpus (v2_*)
    .venv/bin/python -m tests.histories.record v2_abort   # only these (prefix match)

It starts the pip-installed dev server, runs the workflows against the in-memory
FakeCluster (tests/workflows/fakes.py) and writes one file per history here.

The previous release's corpus, recorded before abort by cancellation, signals,
continue-as-new, polled node Jobs and the confirmed reboot. Keep these files as they
are: they prove that every ``workflow.patched`` branch replays what old workers wrote
(``--previous`` re-records them, which throws that proof away):

- remediation_reboot.json            XID 79: drain, reboot, validate, healthy
- remediation_approved.json          supervised: awaiting approval, `approve` update, healthy
- remediation_quarantine_release.json  `quarantine` while draining, `release`, validated
- detector_ticks.json                first run of a detector: ticks, a child start, a
                                     `pause` and `resume` update, continue-as-new

Recorded by an earlier version of this script and kept as they are, like the previous
release's (their scenarios now take later patched branches, recorded as v3_*):

- v2_thermal_recovered.json, v2_thermal_escalated.run1.json   the thermal watch as one
                                     long activity (before thermal-polled-by-retry)
- v2_repeat_offender.run1.json       every history entry counted (before
                                     repeat-offender-counts-repairs)

The current corpus, one history per workflow test scenario (every patched branch taken):

- v2_reboot.json                     XID 79: drain, reboot Job polled by retry, the node
                                     polled (check_node_returned) until it is back, healthy
- v2_reset_then_reboot.json          GPU reset, validation fails, the next round reboots
- v3_thermal_recovered.json          thermal: cordon only, the watch polled by retry
                                     (check_thermal), cools down, healthy
- v3_thermal_escalated.run1.json     thermal: still hot after escalate_after, drained,
                                     quarantined by policy (the run before its hold run)
- v3_repeat_offender.run1.json       supervised repeat offender (only repairs that happened
                                     count): approved, drained, quarantined
- v4_reset_beside_operands.json      GPU reset beside the GPU Operator (operands off, reset,
                                     restored, back), every GPU free before validation, DCGM
                                     read again; the first validation fails, then a reboot
- v4_node_gone.json                  the node replaced before validation: NodeGone, released
- v2_external_repaired_update.json   external reboot, `repaired` update, validated
- v2_external_repaired_signal.json   the same with a `repaired` signal
- v2_approved_update.json            supervised: `approve` update
- v2_approved_signal.json            supervised: `approve` signal
- v2_rejected.json                   supervised: `reject` update, released untouched
- v2_approval_timeout.json           supervised: nobody decides, released
- v2_abort_mid_drain.json            cancel("by recorder: test") while a PDB blocks the drain
- v2_drain_force.json                drain deadline passes, policy force, repaired
- v2_drain_release.json              drain deadline passes, policy release
- v2_drain_overdue.json              drain deadline passes, policy wait (DrainOverdue), drains
- v2_step_failure.run1.json          the reboot Job is invalid (non-retryable): quarantined
- v2_quarantine_hold.run1.json       `quarantine` while draining: continue-as-new into the hold
- v2_quarantine_hold.run2.json       the hold run: `release`, drain what is left, validated
- v2_drain_continue_as_new.run1.json  a blocked drain past history_events_per_run (200)
- v2_dry_run.json                    dry-run XID 79: the plan, no mutation
- v2_rejected_signals.json           malformed `approve`, unknown `aprove`, `release` in the
                                     wrong state (recorded, Warning Events), then approved
- v2_detector_pause_signal.run1.json  detector: a child start, `pause` and `resume` signals,
                                     an unknown signal, continue-as-new

Each file is ``(await handle.fetch_history()).to_json()`` of one run; the file name up
to its first dot is the workflow id given to ``WorkflowHistory.from_json`` on replay
(``.runN`` names the run of a workflow that continued as new). Event counts vary a
little between recordings (polls and timers race the fake activities); the commands
do not. Before you rerun it for a change that should NOT affect replay, don't: a
failing replay test means the change breaks workflows already running in production;
guard it with ``workflow.patched(...)`` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from policy.models import Action, Finding, Verdict
from tests.conftest import binary
from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from workflows.detector import DetectorWorkflow
from workflows.messages import (
    DetectorInput,
    DrainResult,
    HistoryEntry,
    NodeJobInput,
    NodeJobResult,
    OperatorCommand,
    RemediationInput,
    ThermalWatchResult,
)
from workflows.remediation import RemediationWorkflow
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES
from workflows.settings import (
    ApprovalSettings,
    DetectorSettings,
    DrainSettings,
    RemediationSettings,
    ThermalSettings,
)
from workflows.transitions import NodeState

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


# ---------------------------------------------------------------- the current corpus

SUPERVISED = FAST.model_copy(update={"approval": ApprovalSettings(
    required_for=[Action.REBOOT], timeout=timedelta(hours=4))})
BLOCKED = DrainResult(outcome="blocked", remaining=["team-a/trainer-1"],
                      blocking_pdb="team-a/trainer")
DRAINED = DrainResult(outcome="drained", evicted=["team-a/trainer-1"])
SIGNAL_OP = {"operator": "recorder", "reason": "recorded history (signal)"}


def drain(**kw: Any) -> RemediationSettings:
    return FAST.model_copy(update={"drain": FAST.drain.model_copy(update=kw)})


def thermal_verdict(node: str) -> Verdict:
    return Verdict(node=node, action=Action.THERMAL, findings=[Finding(
        gpu="0", uuid=f"GPU-{node}-0", signal="DCGM_FI_DEV_GPU_TEMP", value=95,
        rule="gpu-hot", action=Action.THERMAL)])


async def start(client: Client, queue: str, name: str, *, settings: RemediationSettings = FAST,
                verdict: Verdict | None = None, dry_run: bool = False) -> WorkflowHandle:
    """A remediation whose workflow id is the file name (its node is the id, dashed)."""
    node = name.replace("_", "-")
    return await client.start_workflow(
        RemediationWorkflow.run,
        RemediationInput(node=node, verdict=verdict or xid_verdict(node), settings=settings,
                         dry_run=dry_run),
        id=name, task_queue=queue)


async def step_is(handle: WorkflowHandle, step: str) -> None:
    async def check() -> bool:
        return (await handle.query(RemediationWorkflow.view_state)).step == step
    await until(check, 30, f"step {step}")


async def first_run(handle: WorkflowHandle) -> str:
    return (await handle.describe()).run_id or ""


async def continued(handle: WorkflowHandle, run_id: str) -> None:
    async def check() -> bool:
        return (await handle.describe()).run_id != run_id
    await until(check, 60, "continue-as-new")


async def save_run(client: Client, name: str, workflow_id: str, run_id: str) -> None:
    await save(name, client.get_workflow_handle(workflow_id, run_id=run_id))


async def v2_reboot(client: Client) -> None:
    cluster = FakeCluster()
    cluster.node("v2-reboot").returns_after = 2  # two "boot ID unchanged" looks, 5 s apart
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v2_reboot")
        await handle.result()
        await save("v2_reboot", handle)


async def v2_reset_then_reboot(client: Client) -> None:
    cluster = FakeCluster(job_results={"validate": [False, True]})
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v2_reset_then_reboot",
                             verdict=xid_verdict("v2-reset-then-reboot", 48, Action.RESET))
        await handle.result()
        assert cluster.jobs_run() == ["gpu-reset", "validate", "reboot", "validate"], \
            cluster.jobs_run()
        await save("v2_reset_then_reboot", handle)


async def v4_reset_beside_operands(client: Client) -> None:
    """A GPU reset beside the GPU Operator (operands off, reset, restored, back), validation
    with every GPU free first and DCGM read again; the first validation fails, the next
    round reboots."""
    cluster = FakeCluster(job_results={"validate": [False, True]})
    node = cluster.node("v4-reset-beside-operands")
    node.operands_leave_after = node.operands_return_after = node.gpus_free_after = 1
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v4_reset_beside_operands",
                             verdict=xid_verdict(node.name, 48, Action.RESET))
        await handle.result()
        assert cluster.jobs_run() == ["gpu-reset", "validate", "reboot", "validate"], \
            cluster.jobs_run()
        assert all(v == "true" for v in node.operand_labels.values())
        await save("v4_reset_beside_operands", handle)


async def v4_node_gone(client: Client) -> None:
    """The node is replaced (another UID) before validation: NodeGone Event, released."""
    cluster = FakeCluster()
    cluster.node("v4-node-gone").replaced_at = "check_gpus_free"
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v4_node_gone")
        result = await handle.result()
        assert result.outcome == "released" and "node gone" in result.message, result
        await save("v4_node_gone", handle)


async def v3_thermal_recovered(client: Client) -> None:
    """The thermal watch polled by retry (check_thermal), cools down, healthy."""
    async with worker_for(client, FakeCluster()) as queue:
        handle = await start(client, queue, "v3_thermal_recovered",
                             verdict=thermal_verdict("v3-thermal-recovered"))
        await handle.result()
        await save("v3_thermal_recovered", handle)


async def v3_thermal_escalated(client: Client) -> None:
    """Polled by retry and still hot after escalate_after: drained, quarantined by policy."""
    hot = ThermalWatchResult(outcome="hot", message="GPU 0 at 92 C")
    settings = FAST.model_copy(update={"thermal": ThermalSettings(
        poll_interval=timedelta(seconds=1), hold=timedelta(0),
        escalate_after=timedelta(seconds=2))})
    async with worker_for(client, FakeCluster(thermal_results=[hot])) as queue:
        handle = await start(client, queue, "v3_thermal_escalated", settings=settings,
                             verdict=thermal_verdict("v3-thermal-escalated"))
        run1 = await first_run(handle)
        await continued(handle, run1)
        await state_is(handle, NodeState.QUARANTINED)
        await handle.execute_update(RemediationWorkflow.release, OP)
        await handle.result()
        await save_run(client, "v3_thermal_escalated.run1", "v3_thermal_escalated", run1)


async def external_repair(client: Client, name: str,
                          report: Callable[[WorkflowHandle], Awaitable[Any]]) -> None:
    settings = FAST.model_copy(update={"reboot_method": "external"})
    async with worker_for(client, FakeCluster()) as queue:
        handle = await start(client, queue, name, settings=settings)
        await step_is(handle, "external")
        await report(handle)
        await handle.result()
        await save(name, handle)


async def v2_external_repaired_update(client: Client) -> None:
    await external_repair(client, "v2_external_repaired_update",
                          lambda h: h.execute_update(RemediationWorkflow.repaired, OP))


async def v2_external_repaired_signal(client: Client) -> None:
    await external_repair(client, "v2_external_repaired_signal",
                          lambda h: h.signal("repaired", SIGNAL_OP))


async def supervised(client: Client, name: str,
                     decide: Callable[[WorkflowHandle], Awaitable[Any]] | None,
                     settings: RemediationSettings = SUPERVISED) -> None:
    async with worker_for(client, FakeCluster()) as queue:
        handle = await start(client, queue, name, settings=settings)
        await state_is(handle, NodeState.AWAITING_APPROVAL)
        if decide is not None:
            await decide(handle)
        await handle.result()
        await save(name, handle)


async def v2_approved_update(client: Client) -> None:
    await supervised(client, "v2_approved_update",
                     lambda h: h.execute_update(RemediationWorkflow.approve, OP))


async def v2_approved_signal(client: Client) -> None:
    await supervised(client, "v2_approved_signal", lambda h: h.signal("approve", SIGNAL_OP))


async def v2_rejected(client: Client) -> None:
    await supervised(client, "v2_rejected",
                     lambda h: h.execute_update(RemediationWorkflow.reject, OP))


async def v2_approval_timeout(client: Client) -> None:
    settings = FAST.model_copy(update={"approval": ApprovalSettings(
        required_for=[Action.REBOOT], timeout=timedelta(seconds=2))})
    await supervised(client, "v2_approval_timeout", None, settings)


async def v2_rejected_signals(client: Client) -> None:
    async def decide(handle: WorkflowHandle) -> None:
        await handle.signal("approve", "yes please")  # not an object
        await handle.signal("aprove", SIGNAL_OP)      # a typo: the dynamic handler
        await handle.signal("release", SIGNAL_OP)     # not quarantined

        async def recorded() -> bool:
            view = await handle.query(RemediationWorkflow.view_state)
            return len(view.rejected_commands) == 3
        await until(recorded, 20, "three rejected signals")
        await handle.execute_update(RemediationWorkflow.approve, OP)
    await supervised(client, "v2_rejected_signals", decide)


async def v2_abort_mid_drain(client: Client) -> None:
    async with worker_for(client, FakeCluster(drain_results=[BLOCKED])) as queue:
        handle = await start(client, queue, "v2_abort_mid_drain")
        await state_is(handle, NodeState.DRAINING)
        await asyncio.sleep(1.5)  # a round or two of refused evictions first
        await handle.cancel(reason="by recorder: test")
        try:
            await handle.result()
        except WorkflowFailureError:
            pass
        else:
            raise AssertionError("the aborted remediation did not end cancelled")
        await save("v2_abort_mid_drain", handle)


async def deadline(client: Client, name: str, policy: str) -> None:
    cluster = FakeCluster(drain_results=[BLOCKED])
    settings = drain(deadline=timedelta(seconds=2), deadline_policy=policy)
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, name, settings=settings)
        if policy == "wait":
            await step_is(handle, "drain-overdue")
            with cluster.lock:
                cluster.drain_results[:] = [DRAINED]  # the PDB allows it at last
        await handle.result()
        await save(name, handle)


async def v2_drain_force(client: Client) -> None:
    await deadline(client, "v2_drain_force", "force")


async def v2_drain_release(client: Client) -> None:
    await deadline(client, "v2_drain_release", "release")


async def v2_drain_overdue(client: Client) -> None:
    await deadline(client, "v2_drain_overdue", "wait")


class InvalidJobCluster(FakeCluster):
    """The reboot Job is refused by the API server (non-retryable): a failed step."""

    def activities(self) -> list[Any]:
        acts = super().activities()
        poll = next(a for a in acts if a.__name__ == "poll_node_job")

        @activity.defn(name="poll_node_job")
        def poll_node_job(inp: NodeJobInput) -> NodeJobResult:
            if inp.kind == "reboot":
                raise ApplicationError(f"Job {inp.name} is invalid: spec.template.spec."
                                       "containers[0].image: Required value",
                                       type="Invalid", non_retryable=True)
            result: NodeJobResult = poll(inp)
            return result
        return [poll_node_job if a is poll else a for a in acts]


async def v2_step_failure(client: Client) -> None:
    async with worker_for(client, InvalidJobCluster()) as queue:
        handle = await start(client, queue, "v2_step_failure")
        run1 = await first_run(handle)
        await continued(handle, run1)
        await handle.execute_update(RemediationWorkflow.release, OP)
        await handle.result()
        await save_run(client, "v2_step_failure.run1", "v2_step_failure", run1)


async def v3_repeat_offender(client: Client) -> None:
    """Repeat offender counting only repairs that happened (repeat-offender-counts-repairs):
    three real repairs and a rejected remediation in the window."""
    cluster = FakeCluster()
    now = datetime.now(UTC)
    cluster.node("v3-repeat-offender").history = [
        *(HistoryEntry(started=now - timedelta(days=d), finished=now - timedelta(days=d),
                       action="reboot", reason="XID 79", outcome="healthy: validated",
                       workflow_id="remediation-v3-repeat-offender", repaired=True)
          for d in (1, 2, 3)),
        HistoryEntry(started=now - timedelta(days=4), action="reboot", reason="XID 79",
                     outcome="released: rejected by bob", repaired=False)]
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v3_repeat_offender", settings=SUPERVISED)
        run1 = await first_run(handle)
        await state_is(handle, NodeState.AWAITING_APPROVAL)
        await handle.execute_update(RemediationWorkflow.approve, OP)
        await continued(handle, run1)
        await state_is(handle, NodeState.QUARANTINED)
        await handle.execute_update(RemediationWorkflow.release, OP)
        await handle.result()
        await save_run(client, "v3_repeat_offender.run1", "v3_repeat_offender", run1)


async def v2_quarantine_hold(client: Client) -> None:
    cluster = FakeCluster(drain_results=[BLOCKED])
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v2_quarantine_hold")
        run1 = await first_run(handle)
        await state_is(handle, NodeState.DRAINING)
        await handle.execute_update(RemediationWorkflow.quarantine, OP)
        await continued(handle, run1)
        run2 = await first_run(handle)
        await state_is(handle, NodeState.QUARANTINED)
        with cluster.lock:
            cluster.drain_results[:] = [DRAINED]  # what is left leaves before validation
        await handle.execute_update(RemediationWorkflow.release, OP)
        await handle.result()
        await save_run(client, "v2_quarantine_hold.run1", "v2_quarantine_hold", run1)
        await save_run(client, "v2_quarantine_hold.run2", "v2_quarantine_hold", run2)


async def v2_drain_continue_as_new(client: Client) -> None:
    cluster = FakeCluster(drain_blocked_rounds=30)
    settings = drain(retry_interval=timedelta(milliseconds=200)).model_copy(
        update={"history_events_per_run": 200})
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v2_drain_continue_as_new", settings=settings)
        run1 = await first_run(handle)
        await handle.result()
        assert (await first_run(handle)) != run1, "the blocked drain did not continue as new"
        await save_run(client, "v2_drain_continue_as_new.run1", "v2_drain_continue_as_new",
                       run1)


async def v2_dry_run(client: Client) -> None:
    cluster = FakeCluster()
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, "v2_dry_run", dry_run=True)
        await handle.result()
        assert cluster.mutations == [], cluster.mutations
        await save("v2_dry_run", handle)


async def v2_detector_pause_signal(client: Client) -> None:
    name = "v2_detector_pause_signal"
    cluster = FakeCluster(verdicts=[xid_verdict("node-e")])
    for n in ("node-e", *(f"node-e{i}" for i in range(10))):
        cluster.node(n)
    settings = DetectorSettings(interval=timedelta(seconds=1), ticks_per_run=6,
                                remediation=FAST)
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings), id=name, task_queue=queue)
        run1 = await first_run(handle)
        await until(lambda: cluster.claimed == ["node-e"], 20, "a child start")

        async def paused(want: bool) -> None:
            async def check() -> bool:
                return (await handle.query(DetectorWorkflow.view)).paused == want
            await until(check, 20, f"paused={want}")
        await handle.signal("pause", {"operator": "recorder", "reason": "maintenance window"})
        await paused(True)
        await handle.signal("pasue", SIGNAL_OP)  # a typo: recorded as rejected
        await handle.signal("resume", SIGNAL_OP)
        await paused(False)
        await continued(handle, run1)
        await save_run(client, f"{name}.run1", name, run1)
        await handle.terminate("recorded")
        await client.get_workflow_handle("remediation-node-e").result()


PREVIOUS = (remediation_reboot, remediation_approved, remediation_quarantine_release,
            detector_ticks)
CURRENT = (v2_reboot, v2_reset_then_reboot,
           v2_external_repaired_update, v2_external_repaired_signal, v2_approved_update,
           v2_approved_signal, v2_rejected, v2_approval_timeout, v2_rejected_signals,
           v2_abort_mid_drain, v2_drain_force, v2_drain_release, v2_drain_overdue,
           v2_step_failure, v2_quarantine_hold, v2_drain_continue_as_new,
           v2_dry_run, v2_detector_pause_signal, v3_thermal_recovered, v3_thermal_escalated,
           v3_repeat_offender, v4_reset_beside_operands, v4_node_gone)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("only", nargs="*", help="record only the scenarios with these prefixes")
    parser.add_argument("--previous", action="store_true",
                        help="also re-record the previous release's corpus (don't)")
    args = parser.parse_args()
    records = [r for r in (*(PREVIOUS if args.previous else ()), *CURRENT)
               if not args.only or any(r.__name__.startswith(o) for o in args.only)]
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=binary("temporal"),
        search_attributes=list(SEARCH_ATTRIBUTES))
    try:
        for record in records:
            began = time.monotonic()
            await record(env.client)
            print(f"  {record.__name__}: {time.monotonic() - began:.1f} s")
    finally:
        await env.shutdown()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
