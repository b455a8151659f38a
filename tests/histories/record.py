"""Record the workflow histories that tests/workflows/test_replay.py replays.

Rerun this when a workflow change is intentional (and replay of the old histories
is *meant* to break, e.g. a new activity call), then commit the new JSON files:

    .venv/bin/python -m tests.histories.record            # the current corpus (v5_*)
    .venv/bin/python -m tests.histories.record v5_abort   # only these (prefix match)
    .venv/bin/python -m tests.histories.record --missing  # only what a patch id lacks

``--missing`` is the one to run after adding a ``workflow.patched("<id>")``: it reads
every patch id from workflows/*.py (tests/workflows/test_patch_coverage.py fails until
each is a marker in some history here), records the scenarios in SCENARIOS made for the
ids no history has, then the others, each under the next free tag (v6_..., never over a
kept file), and keeps only the files that took a missing id. An id no scenario takes is
named at the end: add a scenario to SCENARIOS that goes down its new branch.

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

Recorded before leases, the detector's limits and node reports (kept: they replay the
old branch of every patch id the v5 corpus below takes):

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

The current corpus (SCENARIOS; together they take every patched branch, and each names
the ids it is there for):

- v5_reboot.json                     XID 79 under a lease: reboot timed from its request,
                                     validation on the standalone DCGM host engine
- v5_reset.json                      XID 48 on one GPU: operands off, reset by the GPU's UUID
- v5_gpu_isolated.json               gpu_isolation dra, XID 48 on one GPU: a DeviceTaintRule
                                     (NoSchedule, NoExecute), no claim; `release`, healthy
- v5_gpu_validated.json              gpu_isolation dra, XID 48 on one GPU: a DeviceTaintRule,
                                     a validation pinned to that GPU passes, the rule removed
- v5_abort_in_operands_pause.json    cancelled while the operands are turned off: restored,
                                     the XIDs shown acknowledged
- v5_abort_in_quarantine_write.json  cancelled while the quarantine is written: the abort is
                                     carried to the hand-over and ends the run
- v5_external_repaired_signal.json   external reboot, `repaired` signal (operator rules), kept
- v5_repeat_offender_gated.run1.json  a reboot made a quarantine by the repeat-offender rule
                                     waits for the quarantine's approval
- v5_heat_watch_quarantined.run1.json  `quarantine` interrupts a heat watch under way
- v5_job_not_started.json            the first validation Job cannot pull its image
- v5_job_wait_last_look.json         the first validation Job still runs at job_timeout
- v5_heat_slot.run1.json             a heat cordon outside the budget, still hot: drains
                                     only in a granted slot (standalone, grant by hand)
- v5_detector.run1.json              detector with leases and the worker's limits: a hot
                                     node cordoned outside the budget, a slot request
                                     granted, a `node_report` signal
- remediation-v5-detector-hot.run1.json  that detector's child: heat cordon, slot, drain
- v5_reboot_not_back.run1.json       the node never returns from its reboot, with
                                     out_of_service_taint: marked out of service, quarantined
- v5_detector_mirror.run1.json       a node mid-drain relabelled quarantined: the detector
                                     rewrites its label from the record
- v5_detector_gpu_lease.run1.json   gpu_isolation dra, budget one node: XID 48 on one GPU (a
                                     GPU-scoped lease, no node slot) beside an XID 79, both
                                     admitted; no rule can be made, the GPU's remediation
                                     asks for the node, granted once the other is back
- remediation-v5-detector-gpu-lease-gpu.json  that GPU's remediation: GpuIsolationUnavailable,
                                     request_slot, slot_granted, the whole-node reset
- v5_detector_woken.run1.json        a node's report between full ticks: a node-only tick
                                     observes that node alone and starts its remediation; a
                                     report of a node in remediation wakes nothing
                                     (node-only-woken-tick)

Recorded by ``--missing`` for the repair ledger (the v5 scenarios, run again):

- v6_reboot.json                     the reboot scenario: its outcome written to the repair
                                     ledger after the release (repair-ledger)
- v6_detector_mirror.run1.json       the mirror scenario's detector: the ledger read with the
                                     observation, probation and lemons at admission
                                     (probation-at-admission)

Recorded under the release marker (workflows/versions.py: a run under this release
records one ``core_patch`` marker, first, and takes every folded branch without its own
marker), with ``record --tag v7 v7_reboot v7_detector v7_heat_watch_quarantined
v7_abort_in_quarantine_write v7_external_repaired_signal``: the v5 scenarios of those
names, run again (``remediation-v7-detector-hot.run1.json`` is the detector's child).

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
import ast
import asyncio
import base64
import contextlib
import functools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
from tests.workflows.test_abort import Hold, Unkind, unkind_worker
from workflows import errors, versions
from workflows.detector import DetectorWorkflow
from workflows.ids import SLOT_GRANTED_SIGNAL, remediation_workflow_id
from workflows.messages import (
    DetectorInput,
    DrainResult,
    HistoryEntry,
    IncidentCommand,
    NodeJobInput,
    NodeJobResult,
    NodeReport,
    OperatorCommand,
    RemediationInput,
    SlotGrant,
    ThermalWatchResult,
)
from workflows.remediation import RemediationWorkflow
from workflows.reports import NODE_REPORT_SIGNAL
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES
from workflows.settings import (
    ApprovalSettings,
    DetectorSettings,
    DrainSettings,
    FaultDomain,
    RemediationSettings,
    ThermalSettings,
)
from workflows.transitions import NodeState, Step

HERE = Path(__file__).parent
FAST = RemediationSettings(drain=DrainSettings(retry_interval=timedelta(seconds=1)))
OP = OperatorCommand(operator="recorder", reason="recorded history")


# Where save() writes: here, or (``--missing``) a scratch folder first.
OUT = HERE


async def save(name: str, handle: WorkflowHandle) -> None:
    history = await handle.fetch_history()
    (OUT / f"{name}.json").write_text(history.to_json() + "\n")
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


async def v5_release_cleared(client: Client, name: str = "v5_release_cleared") -> None:
    """A quarantine while draining, then a release whose drain of what is left is blocked
    for a few rounds (backing off) and then empty: validated, healthy."""
    cluster = FakeCluster(drain_results=[BLOCKED])
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, name)
        run1 = await first_run(handle)
        await state_is(handle, NodeState.DRAINING)
        await handle.execute_update(RemediationWorkflow.quarantine, OP)
        await continued(handle, run1)
        run2 = await first_run(handle)
        await state_is(handle, NodeState.QUARANTINED)
        with cluster.lock:
            cluster.drain_results[:] = [BLOCKED, BLOCKED, DRAINED]
        await handle.execute_update(RemediationWorkflow.release, OP)
        await handle.result()
        await save_run(client, f"{name}.run2", name, run2)


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


# ------------------------------------------------- v5: every patched branch taken
#
# Each scenario records ``{tag}_{name}`` (``tag`` is v5 for the committed corpus; --missing
# picks the next free one so no kept file is overwritten) and names the patch ids it is
# there for; test_patch_coverage.py checks that every id is in some history.

GPU_UUID = "GPU-3f1c2a9e-8d47-4b6a-9c21-5e0f7a1b2c3d"
QUICK_HEAT = ThermalSettings(poll_interval=timedelta(milliseconds=300), hold=timedelta(seconds=1),
                             escalate_after=timedelta(seconds=2))


def reset_verdict(node: str) -> Verdict:
    """XID 48 on GPU 0, with a UUID as dcgm-exporter gives it (the reset targets it)."""
    return Verdict(node=node, action=Action.RESET, findings=[Finding(
        gpu="0", uuid=GPU_UUID, signal="DCGM_FI_DEV_XID_ERRORS", value=48, rule="xid-48",
        action=Action.RESET)])


async def cancelled(handle: WorkflowHandle) -> None:
    try:
        await handle.result()
    except WorkflowFailureError:
        return
    raise AssertionError(f"{handle.id} did not end cancelled")


async def v5_reboot(client: Client, name: str) -> None:
    """XID 79 under a lease: reboot timed from its request, validation on the node's
    standalone DCGM host engine, healthy."""
    cluster = FakeCluster()
    cluster.node(name.replace("_", "-")).returns_after = 1
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, name)
        await handle.result()
        await save(name, handle)


async def v5_reset(client: Client, name: str) -> None:
    """XID 48 on one GPU: operands off (recorded before any abort could land), the reset
    by the GPU's UUID, operands restored, validated."""
    async with worker_for(client, FakeCluster()) as queue:
        handle = await start(client, queue, name, verdict=reset_verdict(name.replace("_", "-")))
        await handle.result()
        await save(name, handle)


async def v5_gpu_isolated(client: Client, name: str) -> None:
    """remediation.gpu_isolation: dra, XID 48 on one GPU: a DeviceTaintRule (NoSchedule,
    then NoExecute) instead of a claim; held until `release`, the rule removed, healthy."""
    async with worker_for(client, FakeCluster()) as queue:
        handle = await start(client, queue, name,
                             settings=FAST.model_copy(update={"gpu_isolation": "dra"}),
                             verdict=reset_verdict(name.replace("_", "-")))
        await step_is(handle, "gpu-quarantined")
        await handle.execute_update(RemediationWorkflow.release,
                                    OperatorCommand(operator="recorder", reason="replaced"))
        await handle.result()
        await save(name, handle)


async def v5_gpu_validated(client: Client, name: str) -> None:
    """remediation.gpu_isolation: dra, XID 48 on one GPU: a DeviceTaintRule, then a
    validation pinned to that GPU (its own ResourceClaim) passes: the rule removed, healthy."""
    async with worker_for(client, FakeCluster()) as queue:
        handle = await start(client, queue, name,
                             settings=FAST.model_copy(update={"gpu_isolation": "dra"}),
                             verdict=reset_verdict(name.replace("_", "-")))
        await handle.result()
        await save(name, handle)


async def held(client: Client, name: str, hold: Hold, verdict: Verdict) -> None:
    """Start on a worker whose ``hold`` activity waits, cancel it there, let it finish."""
    unkind = Unkind(FakeCluster(), hold)
    async with unkind_worker(client, unkind) as queue:
        handle = await start(client, queue, name, verdict=verdict)
        if not await asyncio.to_thread(hold.entered.wait, 30):
            raise AssertionError(f"{name}: {hold.activity} never reached")
        await handle.cancel(reason="by recorder: test")
        await asyncio.sleep(0.5)
        hold.gate.set()
        await cancelled(handle)
        await save(name, handle)


async def v5_abort_in_operands_pause(client: Client, name: str) -> None:
    """Aborted while the operands are being turned off: what the pause turned off is
    restored, and the XIDs the node shows are acknowledged."""
    await held(client, name, Hold("pause_gpu_operands", "gate"),
               reset_verdict(name.replace("_", "-")))


async def v5_abort_in_quarantine_write(client: Client, name: str) -> None:
    """Aborted while the quarantine is written (that write does not look for a cancel):
    the abort is carried to the hand-over to the hold run and ends this one."""
    node = name.replace("_", "-")
    await held(client, name, Hold("release_node", "gate"),
               xid_verdict(node, 79, Action.QUARANTINE))


async def v5_external_repaired_signal(client: Client, name: str) -> None:
    """External reboot: `repaired` by signal, held to the operator-command rules, kept."""
    await external_repair(client, name, lambda h: h.signal("repaired", SIGNAL_OP))


async def v5_external_storm(client: Client, name: str) -> None:
    """External reboot under a storm of refused signals: the wait continues as new (run 1),
    the next run picks it up and takes `repaired` (the final run)."""
    settings = FAST.model_copy(update={"reboot_method": "external",
                                       "external_timeout": timedelta(hours=6),
                                       "history_events_per_run": 200})
    async with worker_for(client, FakeCluster()) as queue:
        handle = await start(client, queue, name, settings=settings)
        run1 = await first_run(handle)
        await step_is(handle, "external")
        for _ in range(220):
            await handle.signal("repaired-now", SIGNAL_OP)
        await continued(handle, run1)
        await step_is(handle, "external")
        await handle.execute_update(RemediationWorkflow.repaired, OP)
        await handle.result()
        await save_run(client, f"{name}.run1", name, run1)
        await save(name, handle)


async def v5_repeat_offender_gated(client: Client, name: str) -> None:
    """A reboot that needs no approval, made a quarantine by the repeat-offender rule, waits
    for the approval a quarantine needs: approved, drained, quarantined (run 1)."""
    cluster = FakeCluster()
    node = name.replace("_", "-")
    now = datetime.now(UTC)
    cluster.node(node).history = [
        HistoryEntry(started=now - timedelta(days=d), finished=now - timedelta(days=d),
                     action="reboot", reason="XID 79", outcome="healthy: validated",
                     workflow_id=f"remediation-{node}", repaired=True) for d in (1, 2, 3)]
    settings = FAST.model_copy(update={"approval": ApprovalSettings(
        required_for=[Action.QUARANTINE], timeout=timedelta(hours=4))})
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, name, settings=settings)
        run1 = await first_run(handle)
        await state_is(handle, NodeState.AWAITING_APPROVAL)
        await handle.execute_update(RemediationWorkflow.approve, OP)
        await continued(handle, run1)
        await state_is(handle, NodeState.QUARANTINED)
        await handle.execute_update(RemediationWorkflow.release, OP)
        await handle.result()
        await save_run(client, f"{name}.run1", name, run1)


async def v5_heat_watch_quarantined(client: Client, name: str) -> None:
    """A heat watch under way; an operator's quarantine interrupts it at once (run 1)."""
    cluster = FakeCluster(thermal_results=[ThermalWatchResult(outcome="hot", message="93 C")])
    node = name.replace("_", "-")
    settings = FAST.model_copy(update={"thermal": ThermalSettings(
        poll_interval=timedelta(milliseconds=200), hold=timedelta(hours=1))})
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, name, settings=settings,
                             verdict=thermal_verdict(node))
        run1 = await first_run(handle)
        await until(lambda: cluster.node(node).state == NodeState.CORDONED, 20, "cordoned")
        await asyncio.sleep(1)  # the watch is under way
        await handle.execute_update(RemediationWorkflow.quarantine, OP)
        await continued(handle, run1)
        await state_is(handle, NodeState.QUARANTINED)
        await handle.terminate("recorded")
        await save_run(client, f"{name}.run1", name, run1)


class ScriptedJobsCluster(FakeCluster):
    """The first validation Job does not end well: its pod cannot start (``not_started``),
    or it is still running at the job_timeout (each look a retried failure). Later Jobs
    answer at the first look."""

    def __init__(self, first_validation: str) -> None:
        super().__init__()
        self.first_validation = first_validation
        self.first_name = ""

    def activities(self) -> list[Any]:
        acts = super().activities()
        poll = next(a for a in acts if a.__name__ == "poll_node_job")
        cluster = self

        @activity.defn(name="poll_node_job")
        def poll_node_job(inp: NodeJobInput) -> NodeJobResult:
            if inp.kind == "validate":
                with cluster.lock:
                    cluster.first_name = cluster.first_name or inp.name
                if inp.name == cluster.first_name:
                    if cluster.first_validation == "not_started":
                        raise ApplicationError(
                            f"Job {inp.name}: pod cannot start: ErrImagePull "
                            "(registry.example/dcgm-diag:4.1 not found)",
                            type=errors.JOB_NOT_STARTED, non_retryable=True)
                    raise ApplicationError(f"Job {inp.name}: pod Running, dcgmi diag -r 3",
                                           type="JobRunning")
            result: NodeJobResult = poll(inp)
            return result
        return [poll_node_job if a is poll else a for a in acts]


async def v5_job_not_started(client: Client, name: str) -> None:
    """The validation Job's image cannot be pulled: that round fails as never started; the
    next round reboots and validates."""
    async with worker_for(client, ScriptedJobsCluster("not_started")) as queue:
        handle = await start(client, queue, name)
        await handle.result()
        await save(name, handle)


async def v5_job_wait_last_look(client: Client, name: str) -> None:
    """The validation Job still runs at job_timeout: that round fails with the last look;
    the next round reboots and validates."""
    settings = FAST.model_copy(update={"job_timeout": timedelta(seconds=3),
                                       "job_poll_interval": timedelta(seconds=1)})
    async with worker_for(client, ScriptedJobsCluster("running")) as queue:
        handle = await start(client, queue, name, settings=settings)
        await handle.result()
        await save(name, handle)


async def v5_heat_slot(client: Client, name: str) -> None:
    """A heat cordon outside the budget (no slot), still hot after escalate_after: it
    stays cordoned and asks for a drain slot, drains only in the one granted, quarantined
    (run 1). Standalone: the grant is sent with the lease's token."""
    cluster = FakeCluster(thermal_results=[ThermalWatchResult(outcome="hot", message="93 C")])
    node = name.replace("_", "-")
    settings = FAST.model_copy(update={"thermal": QUICK_HEAT})
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node=node, verdict=thermal_verdict(node), settings=settings,
                             holds_slot=False, lease_token="the-lease"),
            id=name, task_queue=queue)
        run1 = await first_run(handle)
        await step_is(handle, Step.WAITING_FOR_A_DRAIN_SLOT.value)
        await handle.signal(SLOT_GRANTED_SIGNAL, SlotGrant(token="the-lease"))
        await continued(handle, run1)
        await state_is(handle, NodeState.QUARANTINED)
        await handle.terminate("recorded")
        await save_run(client, f"{name}.run1", name, run1)


async def v5_detector(client: Client, name: str) -> None:
    """A detector run under leases and the worker's limits: a hot node cordoned outside
    the budget, still hot, drained in the slot the detector grants, quarantined; a node
    report wakes it. Saves the detector's run 1 and the hot node's remediation run 1."""
    hot = f"{name.replace('_', '-')}-hot"
    other = f"{name.replace('_', '-')}-0"
    cluster = FakeCluster(verdicts=[thermal_verdict(hot)],
                          thermal_results=[ThermalWatchResult(outcome="hot", message="93 C")])
    for n in (hot, other, *(f"{name.replace('_', '-')}-{i}" for i in range(1, 6))):
        cluster.node(n)
    settings = DetectorSettings(interval=timedelta(milliseconds=500), ticks_per_run=30,
                                max_unavailable=1, thermal_debounce=timedelta(0),
                                remediation=FAST.model_copy(update={"thermal": QUICK_HEAT}))
    child_id = remediation_workflow_id(hot)
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings), id=name, task_queue=queue)
        run1 = await first_run(handle)
        cluster.detector_id = name
        await until(lambda: cluster.node(hot).state == NodeState.CORDONED, 30,
                    "cordoned for heat")
        child = client.get_workflow_handle(child_id)
        child_run1 = await first_run(child)
        await handle.signal(NODE_REPORT_SIGNAL, NodeReport(
            node=other, xid=79, gpu="0", at=datetime.now(UTC),
            line="NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus."))
        await until(lambda: any(c[0] == "drain_node" and c[1].node == hot
                                for c in cluster.calls), 30, "drained in a granted slot")
        await continued(child, child_run1)
        await continued(handle, run1)
        await save_run(client, f"{name}.run1", name, run1)
        await save_run(client, f"{child_id}.run1", child_id, child_run1)
        await handle.terminate("recorded")
        await child.terminate("recorded")


async def v5_reboot_not_back(client: Client, name: str) -> None:
    """A reboot whose node never comes back (power lost), with out_of_service_taint on:
    marked out of service, quarantined (run 1)."""
    cluster = FakeCluster()
    node = name.replace("_", "-")
    cluster.node(node).returns_after = 10**6
    settings = drain(out_of_service_taint=True).model_copy(update={
        "reboot_return_timeout": timedelta(seconds=3),
        "node_poll_interval": timedelta(seconds=1), "max_repair_attempts": 1})
    async with worker_for(client, cluster) as queue:
        handle = await start(client, queue, name, settings=settings)
        run1 = await first_run(handle)
        await continued(handle, run1)
        await state_is(handle, NodeState.QUARANTINED)
        marks = [c[1].on for c in cluster.calls if c[0] == "mark_out_of_service"]
        assert marks == [True], marks
        await handle.terminate("recorded")
        await save_run(client, f"{name}.run1", name, run1)


async def v5_detector_mirror(client: Client, name: str) -> None:
    """A node mid-drain that relabels itself quarantined: the detector's record wins, and
    the label is rewritten from it (run 1)."""
    node = f"{name.replace('_', '-')}-0"
    cluster = FakeCluster()
    for i in range(5):
        cluster.node(f"{name.replace('_', '-')}-{i}")
    cluster.nodes[node].state, cluster.nodes[node].tainted = NodeState.QUARANTINED, True
    cluster.visible_states[node] = NodeState.DRAINING
    cluster.visible_remediations = [node]
    settings = DetectorSettings(interval=timedelta(milliseconds=500), ticks_per_run=12,
                                remediation=FAST)
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings), id=name, task_queue=queue)
        run1 = await first_run(handle)
        await until(lambda: cluster.nodes[node].state == NodeState.DRAINING, 30,
                    "the label rewritten from the record")
        await continued(handle, run1)
        await save_run(client, f"{name}.run1", name, run1)
        await handle.terminate("recorded")


async def v5_detector_incident(client: Client, name: str) -> None:
    """A domain of four nodes failing together beside an unrelated fault: one incident
    (its nodes cordoned, not drained), the other node remediated under the domain budgets;
    `resolve_incident` once two nodes' faults cleared: those uncordoned, the rest go one by
    one (run 1)."""
    clique = "nvidia.com/gpu.clique"
    prefix = name.replace("_", "-")
    cluster = FakeCluster()
    nodes = [f"{prefix}-{i}" for i in range(8)]
    for i, n in enumerate(nodes):
        cluster.node(n).labels = {clique: f"d{i // 4}"}
    d0, other = nodes[:4], nodes[5]
    cluster.verdicts = [xid_verdict(n) for n in [*d0, other]]
    settings = DetectorSettings(
        interval=timedelta(milliseconds=500), ticks_per_run=16, max_unavailable=2,
        max_unavailable_gpus=16, trust_node_writable_labels=True, remediation=FAST,
        breaker_min_flagged_nodes=3, breaker_max_flagged_nodes=3,
        fault_domains=[FaultDomain(label=clique, max_unavailable=1, incident_threshold=3)])
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings), id=name, task_queue=queue)
        run1 = await first_run(handle)
        await until(lambda: all(cluster.node(n).incident for n in d0), 30, "incident cordon")
        cluster.verdicts = [xid_verdict(n) for n in d0[2:]]
        await handle.execute_update(DetectorWorkflow.resolve_incident, IncidentCommand(
            domain="d0", operator="recorder", reason="switch tray replaced"))
        await until(lambda: d0[2] in cluster.claimed and not cluster.node(d0[0]).cordoned,
                    30, "cleared nodes uncordoned, the rest one by one")
        await continued(handle, run1)
        await save_run(client, f"{name}.run1", name, run1)
        await handle.terminate("recorded")


async def v5_detector_gpu_lease(client: Client, name: str) -> None:
    """gpu_isolation dra under a budget of one node: XID 48 on one GPU beside an XID 79,
    both admitted (the GPU's lease takes no node slot). No DeviceTaintRule can be made, so
    the GPU's remediation asks for the node and waits, untouched, until the other's slot
    is free; the detector grants it (the lease widened), the whole node is reset. Saves the
    detector's run 1 and the GPU node's remediation."""
    prefix = name.replace("_", "-")
    gpu_node, whole = f"{prefix}-gpu", f"{prefix}-0"
    cluster = FakeCluster(verdicts=[reset_verdict(gpu_node), xid_verdict(whole)],
                          isolation_why_not="forbidden: cannot create devicetaintrules")
    for n in (gpu_node, whole, *(f"{prefix}-{i}" for i in range(1, 4))):
        cluster.node(n)
    settings = DetectorSettings(interval=timedelta(milliseconds=500), ticks_per_run=30,
                                max_unavailable=1,
                                remediation=FAST.model_copy(update={"gpu_isolation": "dra"}))
    child_id = remediation_workflow_id(gpu_node)
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings), id=name, task_queue=queue)
        run1 = await first_run(handle)
        cluster.detector_id = name
        await until(lambda: whole in cluster.claimed and any(
            c[0] == "isolate_gpu" for c in cluster.calls), 30, "both admitted")
        cluster.verdicts = []
        await until(lambda: gpu_node in cluster.claimed, 60, "the node granted, then claimed")
        child = client.get_workflow_handle(child_id)
        result = await child.result()
        assert result["outcome"] == "healthy", result
        await continued(handle, run1)
        await save_run(client, f"{name}.run1", name, run1)
        await save(child_id, child)
        await handle.terminate("recorded")


async def v5_detector_woken(client: Client, name: str) -> None:
    """A detector woken by a node's report between its full ticks: a node-only tick observes
    that node alone and starts its remediation at once; a report of a node in remediation
    wakes nothing; continue-as-new at the next full tick (run 1)."""
    prefix = name.replace("_", "-")
    cluster = FakeCluster()
    for i in range(5):
        cluster.node(f"{prefix}-{i}")
    node = f"{prefix}-3"
    settings = DetectorSettings(interval=timedelta(seconds=4), ticks_per_run=2,
                                remediation=FAST)
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings), id=name, task_queue=queue)
        run1 = await first_run(handle)
        await until(lambda: any(c[0] == "observe_fleet" for c in cluster.calls), 30,
                    "the first full tick")
        cluster.verdicts = [xid_verdict(node)]
        await handle.signal(NODE_REPORT_SIGNAL, NodeReport(
            node=node, xid=79, gpu="0", at=datetime.now(UTC),
            line="NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus."))
        await until(lambda: node in cluster.claimed, 30, "the reported node claimed")
        nodes = [c[1].nodes for c in cluster.calls if c[0] == "observe_fleet"]
        assert nodes[:2] == [[], [node]], nodes
        await handle.signal(NODE_REPORT_SIGNAL, NodeReport(
            node=node, xid=79, gpu="0", at=datetime.now(UTC)))
        await continued(handle, run1)
        await save_run(client, f"{name}.run1", name, run1)
        await handle.terminate("recorded")
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(remediation_workflow_id(node)).terminate(
                "recorded")


@dataclass(frozen=True)
class Scenario:
    """One recording: ``record(client, name)`` writes ``{name}.json`` (or its runs)."""

    name: str
    record: Callable[[Client, str], Awaitable[None]]
    takes: tuple[str, ...]  # the patch ids it is there for (more are taken on the way)


SCENARIOS = (
    Scenario("reboot", v5_reboot, ("remediation-holds-a-lease", "reboot-timed-from-request",
                                   "one-dcgm-host-engine")),
    Scenario("reset", v5_reset, ("reset-by-uuid", "reset-beside-gpu-operator",
                                 "operands-paused-recorded-before-abort",
                                 "operands-pause-answer-may-be-lost")),
    Scenario("abort_in_operands_pause", v5_abort_in_operands_pause,
             ("operands-paused-recorded-before-abort", "abort-acknowledges-shown-xids")),
    Scenario("abort_in_quarantine_write", v5_abort_in_quarantine_write,
             ("abort-carried-past-continue-as-new",)),
    Scenario("external_repaired_signal", v5_external_repaired_signal,
             ("repaired-accepted-is-kept", "operator-command-rules",
              "operator-marked-unverified")),
    Scenario("external_storm", v5_external_storm, ("external-wait-bounded",)),
    Scenario("repeat_offender_gated", v5_repeat_offender_gated,
             ("repeat-offender-quarantine-gated-as-quarantine",)),
    Scenario("heat_watch_quarantined", v5_heat_watch_quarantined,
             ("quarantine-interrupts-the-heat-watch",)),
    Scenario("job_not_started", v5_job_not_started, ("job-not-started-reported",)),
    Scenario("job_wait_last_look", v5_job_wait_last_look, ("job-wait-says-last-look",)),
    Scenario("heat_slot", v5_heat_slot, ("heat-cordon-drains-in-a-slot",)),
    Scenario("reboot_not_back", v5_reboot_not_back, ("out-of-service-taint",)),
    Scenario("detector_mirror", v5_detector_mirror, ("state-mirror-rewritten",)),
    Scenario("release_cleared", v5_release_cleared, ("release-clear-bounded",)),
    Scenario("detector_incident", v5_detector_incident, ("fault-domains-and-incidents",)),
    Scenario("gpu_isolated", v5_gpu_isolated, ("gpu-isolation-dra",)),
    Scenario("gpu_validated", v5_gpu_validated, ("gpu-validation-pinned",)),
    Scenario("detector_gpu_lease", v5_detector_gpu_lease,
             ("gpu-scoped-leases", "gpu-lease-waits-for-the-node", "gpu-counts-reported")),
    Scenario("detector_woken", v5_detector_woken, ("node-only-woken-tick",)),
    Scenario("detector", v5_detector,
             ("slots-are-leases", "thermal-cordons-outside-budget", "detector-bounded-by-limits",
              "detector-node-reports", "heat-cordon-drains-in-a-slot")),
)
TAG = "v5"


# ------------------------------------------------------------- patch-id bookkeeping

WORKFLOWS = HERE.parent.parent / "workflows"


def patch_ids(root: Path = WORKFLOWS) -> dict[str, list[str]]:
    """Every ``workflow.patched(...)`` id in the workflow sources (``root`` and its
    subpackages: the remediation's steps are in workflows/steps/), with where it is called
    (``file:line``). The argument is a string literal or a module-level string constant,
    of that module or imported from another one in ``root`` (``from workflows.x import
    NAME``); any other argument is an error, so no id can hide from the check."""
    constants: dict[str, dict[str, str]] = {}
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}

    def module(path: Path) -> str:  # "remediation", "steps.claim": as imported, less root
        return ".".join(path.relative_to(root).with_suffix("").parts)

    for path, tree in trees.items():
        mine = constants.setdefault(module(path), {})
        for stmt in tree.body:
            target: ast.expr | None = None
            value: ast.expr | None = None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
            elif isinstance(stmt, ast.AnnAssign):
                target, value = stmt.target, stmt.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Constant) \
                    and isinstance(value.value, str):
                mine[target.id] = value.value
    found: dict[str, list[str]] = {}
    for path, tree in trees.items():
        names = dict(constants[module(path)])
        for imp in ast.walk(tree):  # imports in a ``with`` block too (passed through)
            if isinstance(imp, ast.ImportFrom) and imp.module and \
                    imp.module.startswith(f"{root.name}."):
                source = constants.get(imp.module.split(".", 1)[1], {})
                for alias in imp.names:
                    if alias.name in source:
                        names[alias.asname or alias.name] = source[alias.name]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "patched"):
                continue
            where = f"{path.relative_to(root.parent)}:{node.lineno}"
            arg = node.args[0] if node.args else None
            if path.name == "versions.py" and isinstance(arg, ast.Name) \
                    and arg.id == "patch_id":
                continue  # versions.patched forwarding its caller's id (found at the caller)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                pid = arg.value
            elif isinstance(arg, ast.Name) and arg.id in names:
                pid = names[arg.id]
            else:
                raise ValueError(f"{where}: workflow.patched() takes a string literal or a "
                                 "module-level constant here, not "
                                 f"{ast.unparse(arg) if arg else 'nothing'}")
            found.setdefault(pid, []).append(where)
    return found


def markers(path: Path) -> set[str]:
    """The patch ids one recorded history took (its ``core_patch`` markers)."""
    found = set()
    for event in json.loads(path.read_text())["events"]:
        attrs = event.get("markerRecordedEventAttributes")
        if attrs and attrs["markerName"] == "core_patch":
            payload = attrs["details"]["patch-data"]["payloads"][0]["data"]
            found.add(json.loads(base64.b64decode(payload))["id"])
    return found


def recorded(folder: Path = HERE, *, folded: bool = True) -> dict[str, list[str]]:
    """Patch id -> the history files (names) that took it. A history with the release
    marker took every id it folds (workflows/versions.py), unless ``folded`` is False:
    then only the ids with a marker of their own count."""
    taken: dict[str, list[str]] = {}
    for path in sorted(folder.glob("*.json")):
        took = markers(path)
        if folded and versions.RELEASE_PATCH in took:
            took |= versions.FOLDED
        for pid in took:
            taken.setdefault(pid, []).append(path.name)
    return taken


def missing() -> list[str]:
    return sorted(set(patch_ids()) - set(recorded()))


def free_tag(scenario: Scenario) -> str:
    """v5, or the first vN after it under which ``scenario`` has no file yet."""
    n = int(TAG[1:])
    while list(HERE.glob(f"v{n}_{scenario.name}.*json")) or \
            list(HERE.glob(f"remediation-v{n}-{scenario.name.replace('_', '-')}*.json")):
        n += 1
    return f"v{n}"


async def record_missing(client: Client) -> int:
    """Record what takes the patch ids no history has: the scenarios made for them first,
    then any other (an id taken at every run start is in all of them). Each records in a
    scratch folder under a name no kept file has; only files that take a missing id are
    moved here. Returns how many ids are still without a history."""
    global OUT
    want = set(missing())
    if not want:
        print("every patch id has a recorded history")
        return 0
    print(f"patch ids without a history: {', '.join(sorted(want))}")
    ordered = sorted(SCENARIOS, key=lambda s: not (set(s.takes) & want))
    for scenario in ordered:
        if not want:
            break
        name = f"{free_tag(scenario)}_{scenario.name}"
        with tempfile.TemporaryDirectory() as scratch:
            OUT = Path(scratch)
            try:
                await scenario.record(client, name)
            finally:
                OUT = HERE
            for path in sorted(Path(scratch).glob("*.json")):
                took = markers(path) & want
                if took:
                    shutil.move(path, HERE / path.name)
                    print(f"kept {path.name}: {', '.join(sorted(took))}")
                    want -= took
    if want:
        print(f"no scenario takes {', '.join(sorted(want))}: add one to SCENARIOS in "
              "tests/histories/record.py", file=sys.stderr)
    return len(want)


async def _named(scenario: Scenario, name: str, client: Client) -> None:
    await scenario.record(client, name)


PREVIOUS = (remediation_reboot, remediation_approved, remediation_quarantine_release,
            detector_ticks)
KEPT = (v2_reboot, v2_reset_then_reboot,
        v2_external_repaired_update, v2_external_repaired_signal, v2_approved_update,
        v2_approved_signal, v2_rejected, v2_approval_timeout, v2_rejected_signals,
        v2_abort_mid_drain, v2_drain_force, v2_drain_release, v2_drain_overdue,
        v2_step_failure, v2_quarantine_hold, v2_drain_continue_as_new,
        v2_dry_run, v2_detector_pause_signal, v3_thermal_recovered, v3_thermal_escalated,
        v3_repeat_offender, v4_reset_beside_operands, v4_node_gone)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("only", nargs="*",
                        help="record only the scenarios whose file names start with these "
                             "(v2_*..v4_* re-recorded only when named: they are kept)")
    parser.add_argument("--previous", action="store_true",
                        help="also re-record the previous release's corpus (don't)")
    parser.add_argument("--missing", action="store_true",
                        help="record only what takes the patch ids no history has yet")
    parser.add_argument("--tag", default=TAG,
                        help=f"the scenarios' file-name prefix (default {TAG}; v7 recorded "
                             "the release marker's corpus)")
    args = parser.parse_args()
    runs: list[tuple[str, Callable[[Client], Awaitable[None]]]] = []
    if not args.missing:
        runs = [(r.__name__, r) for r in PREVIOUS if args.previous]
        runs += [(r.__name__, r) for r in KEPT
                 if any(r.__name__.startswith(o) for o in args.only)]
        for s in SCENARIOS:
            name = f"{args.tag}_{s.name}"
            if not args.only or any(name.startswith(o) for o in args.only):
                runs.append((name, functools.partial(_named, s, name)))
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter, dev_server_existing_path=binary("temporal"),
        search_attributes=list(SEARCH_ATTRIBUTES))
    try:
        if args.missing:
            return 1 if await record_missing(env.client) else 0
        for name, record in runs:
            began = time.monotonic()
            await record(env.client)
            print(f"  {name}: {time.monotonic() - began:.1f} s")
    finally:
        await env.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
