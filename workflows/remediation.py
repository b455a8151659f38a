"""RemediationWorkflow: one durable remediation of one GPU node (`remediation-<node>`).

Healthy -> [AwaitingApproval] -> Draining -> Repairing -> Validating -> Healthy,
Cordoned for heat, Quarantined for what a repair cannot fix. It acts only under
the lease the detector granted it (workflows/leases.py), confirmed before every
disruptive step; the lease holds its budget slot until it closes. The node's label
is the record's mirror, written by this workflow only. No execution timeout: a
terminated remediation leaves an orphan lease and keeps its slot until an operator
releases the node (fail closed).

This class holds the flow (run, the order of the steps, continue-as-new) and the state;
each family of steps has a module of its own in workflows/steps/, mixed in here: the
operators' orders, the claim (lease, approval, slots), the heat cordon, the drain,
the repair, the validation, the release (quarantine, finish, abort) and one GPU held
alone. docs/architecture.md maps each decision to its module.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from policy.models import Action
    from workflows.ids import DETECTOR_REQUESTER
    from workflows.isolation import GpuIsolation, IsolationDecision, IsolationPlan
    from workflows.messages import (
        ExternalWait,
        NodeJobInput,
        OperatorCommand,
        RemediationInput,
        RemediationResult,
        RemediationResume,
        RemediationView,
    )
    from workflows.operands import OperandsPaused
    from workflows.search_attributes import REMEDIATION_ACTION
    from workflows.transitions import NodeState, Outcome, Step

from workflows.steps.base import NodeGone, _cause
from workflows.steps.claim import ClaimFailed, ClaimSteps, NoLease
from workflows.steps.drain import DrainSteps, _GiveUp
from workflows.steps.gpu_isolation import GpuIsolationSteps
from workflows.steps.operator_orders import OperatorOrders
from workflows.steps.release import ReleaseSteps
from workflows.steps.repair import RepairSteps
from workflows.steps.thermal import ThermalSteps
from workflows.steps.validate import ValidationSteps, node_job_name

# node_job_name (workflows/steps/validate.py) is imported from here too.
__all__ = ["RemediationWorkflow", "node_job_name"]

GPU_ISOLATION_PATCH = "gpu-isolation-dra"
PLAN_KEPT = 100


@workflow.defn
class RemediationWorkflow(OperatorOrders, ClaimSteps, ThermalSteps, DrainSteps, RepairSteps,
                          ValidationSteps, ReleaseSteps, GpuIsolationSteps):
    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        self.inp = inp
        r = inp.resume
        self.action = r.action if r else inp.verdict.action
        if r:
            self.view = r.view.model_copy(update={"runs": r.view.runs + 1})
        else:
            self.view = RemediationView(
                node=inp.node, state=NodeState.HEALTHY, step=Step.STARTING, action=self.action,
                reason=inp.reason or inp.verdict.summary, dry_run=inp.dry_run,
                lease_scope=inp.lease_scope,
            )
        self.decision: Literal["approve", "reject"] | None = None
        self.decided_by: OperatorCommand | None = None
        # An operator's order and the policy's (repeat offender, heat that does not go
        # away) are kept apart: only an operator's order skips the approval gate.
        self.quarantine_order: OperatorCommand | None = r.quarantine_order if r else None
        self.policy_quarantine: str | None = r.policy_quarantine if r else None
        self.release_order: OperatorCommand | None = r.release_order if r else None
        self.abort_note: OperatorCommand | None = r.abort_note if r else None
        self.repaired_order: OperatorCommand | None = None
        # claim_started: the claim may have touched the node; claimed: it said what it did.
        self.claim_started = r is not None
        self.claimed = r is not None
        # The node was handed back (healthy or released): an abort has nothing left to undo.
        self.released = False
        self.aborting = False
        self.gpus = r.gpus if r else 0
        self.started = r.started if r else workflow.now()
        self.drain_started = r.drain_started if r else None
        self.drain_force = r.drain_force if r else False
        self.report_after = r.report_after if r else None
        self.hot_since = r.hot_since if r else None
        # The node's identity and boot at claim: a reboot is confirmed by a new boot ID on
        # the same node (same UID), never by the reboot Job's exit code.
        self.boot_id = r.boot_id if r else ""
        self.job_in_progress: NodeJobInput | None = None
        # GPU Operator operands this remediation turned off for a GPU reset: restored after
        # the reset, and by an abort or a failed step, so the node is left as found.
        self.operands_paused: OperandsPaused | None = None
        self.signal_events = 0  # Events recorded for rejected signals in this run
        # A heat cordon admitted outside the budget drains only in a slot the detector
        # granted (signal slot_granted); one admitted in a slot has it from the start.
        # A GPU-scoped lease widened to the node (carried in the view) holds a slot too.
        self.slot_granted = self.inp.holds_slot or (
            inp.lease_scope == "gpu" and self.view.lease_scope == "node")
        self.uid = r.uid if r else ""
        self.ledger_from = r.ledger_from if r else None
        self._lease_gate: bool | None = None
        # We put node.kubernetes.io/out-of-service on the node (it did not come back).
        self.out_of_service = r.out_of_service if r else False
        if r is None or (self.view.quarantine_ordered_by is None
                         and self.view.quarantine_policy_reason is None):
            # Also a run continued from a release whose view did not show them yet.
            self._show_quarantine_orders()

    def _show_quarantine_orders(self) -> None:
        """Who ordered a quarantine, in the view: an operator's order and the policy's apart
        (an operator's quarantine command, or a manual remediation with action quarantine;
        the policy's verdict, a repeat offender, heat that stays)."""
        v, inp = self.view, self.inp
        v.quarantine_ordered_by = self.quarantine_order
        v.quarantine_policy_reason = self.policy_quarantine
        if inp.verdict.action != Action.QUARANTINE:
            return
        if inp.requested_by == DETECTOR_REQUESTER:
            v.quarantine_policy_reason = v.quarantine_policy_reason or v.reason
        elif inp.requested_by and v.quarantine_ordered_by is None:
            v.quarantine_ordered_by = OperatorCommand(operator=inp.requested_by,
                                                      reason=inp.reason)

    # ------------------------------------------------------------ main flow

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        versions.begin()  # this release's one marker, the run's first row (versions.py)
        if inp.resume is None:
            workflow.upsert_search_attributes([REMEDIATION_ACTION.value_set(self.action.value)])
        try:
            try:
                result = await (self._resume(inp.resume) if inp.resume else self._remediate())
            except _GiveUp as give_up:
                result = await self._finish(Outcome.RELEASED, str(give_up))
            except NoLease as refused:
                result = await self._no_lease(refused)
            except ClaimFailed as failed:
                result = RemediationResult(node=self.inp.node, outcome=Outcome.RELEASED,
                                           attempts=0, message=str(failed))
            except NodeGone as gone:
                result = await self._node_gone(gone)
            except ActivityError as err:
                if not self.claimed:
                    raise
                # A step failed in a way retries cannot fix (bad config, missing namespace,
                # invalid object): hold the node for a human rather than fail the workflow,
                # which would leave it cordoned with nobody watching.
                await self._restore_operands(best_effort=True)
                result = await self._quarantine(
                    f"step {self.view.step} failed: {_cause(err)}", self._acknowledged_xids())
        except asyncio.CancelledError:
            # An abort, wherever it landed: on a timer, on an activity in flight, queued or
            # between retries, or on one that completed anyway (see _call).
            await self._abort_cleanup()
            raise
        await workflow.wait_condition(workflow.all_handlers_finished)
        return result

    async def _remediate(self) -> RemediationResult:
        s = self.inp.settings
        # Read only where the setting is on, so histories recorded with it off (and every
        # one from before it) replay without a marker.
        if s.gpu_isolation == GpuIsolation.DRA and versions.patched(GPU_ISOLATION_PATCH):
            plan = IsolationDecision(s.gpu_isolation).decide(self.inp.verdict)
            if isinstance(plan, IsolationPlan):
                done = await self._isolate_gpu(plan)
                if done is not None:
                    return done
            else:
                self._plan(f"whole node: {plan}")
        await self._wait_for_the_node()
        if self.action == Action.THERMAL:
            first = NodeState.CORDONED
        elif self.action in s.approval.required_for:
            first = NodeState.AWAITING_APPROVAL
        else:
            first = NodeState.DRAINING
        claim = await self._claim(first)
        window_start = self.started - s.repeat_offender_window
        recent = [h for h in claim.history if h.started >= window_start]
        if versions.patched("repeat-offender-counts-repairs"):
            recent = [h for h in recent if h.counts_as_repair()]
        if len(recent) >= s.repeat_offender_count and self.action != Action.THERMAL:
            self._plan(f"repeat offender: {len(recent)} repairs since "
                       f"{window_start:%Y-%m-%d}; quarantine")
            why = f"repeat offender: {len(recent)} repairs within " \
                  f"{s.repeat_offender_window}"
            self.view.quarantine_policy_reason = why
            if versions.patched("policy-quarantine-awaits-approval"):
                self.policy_quarantine = why
            else:
                self.quarantine_order = OperatorCommand(operator="policy", reason=why)
            if first == NodeState.DRAINING and Action.QUARANTINE in s.approval.required_for \
                    and versions.patched("repeat-offender-quarantine-gated-as-quarantine"):
                # Claimed for a repair that needs no approval; the rule made it a
                # quarantine, which does: the gate is the quarantine's, not the verdict's.
                first = NodeState.AWAITING_APPROVAL
                await self._enter(NodeState.AWAITING_APPROVAL, Step.REPEAT_OFFENDER,
                                  "RemediationAwaitingApproval",
                                  f"{why}: quarantine waits for an operator's approval")
        if self.action == Action.THERMAL and not self._quarantine_due():
            done = await self._thermal()
            if done is not None:
                return done
        if first == NodeState.AWAITING_APPROVAL and self.quarantine_order is None:
            # Supervised means supervised: a policy quarantine drains too, so it waits for
            # an operator like any other drain; only an operator's own order skips the gate.
            return await self._decided(await self._await_approval())
        await self._drain()
        return await self._after_drain()

    async def _decided(self, approved: bool) -> RemediationResult:
        """After the approval wait: drain and repair, or give the node back."""
        s = self.inp.settings
        if not approved:
            if self.decided_by is None:
                # Nobody decided: the fault is not acknowledged, so the detector asks
                # again at its next tick rather than return an XID 79 to service unseen.
                return await self._finish(
                    Outcome.RELEASED, f"approval timed out after {s.approval.timeout}: not "
                                      "remediated; the node is flagged again while its fault "
                                      "shows")
            # Acknowledge the XIDs: the exporter keeps showing the last one, and
            # without this the detector claims the node again at its next tick,
            # undoing the operator's decision. A new XID still triggers.
            return await self._finish(Outcome.RELEASED,
                                      f"rejected by {self.decided_by.operator}",
                                      self._acknowledged_xids())
        await self._drain()
        return await self._after_drain()

    async def _after_drain(self) -> RemediationResult:
        if self.action == Action.QUARANTINE or self._quarantine_due():
            return await self._quarantine(self._quarantine_reason())
        return await self._repair_and_validate()

    async def _resume(self, r: RemediationResume) -> RemediationResult:
        """Pick up the loop the previous run handed over at continue-as-new."""
        self._details(f"continued in run {self.view.runs} ({r.phase})")
        if r.phase == "quarantine":
            return await self._quarantine(r.quarantine_why, r.acknowledged, applied=True)
        if r.phase == "approval":
            return await self._decided(await self._await_approval(r.approval_until))
        if r.phase == "external" and r.external is not None:
            self.repaired_order = r.repaired_order
            return await self._repair_and_validate(r.external)
        if r.phase == "thermal":
            done = await self._thermal()
            if done is not None:
                return done
        await self._drain()
        return await self._after_drain()

    async def _continue_as_new_if_due(
            self, phase: Literal["drain", "thermal", "quarantine", "approval", "external"], *,
            now: bool = False, why: str = "", acked: dict[str, int] | None = None,
            approval_until: datetime | None = None,
            external: ExternalWait | None = None) -> None:
        """At a loop boundary: hand over to a fresh run when the history is long (or the
        server suggests it), or ``now`` for the quarantine hold, so a run waiting for days
        or months replays only the loop it waits in."""
        info = workflow.info()
        due = now or info.is_continue_as_new_suggested() \
            or info.get_current_history_length() >= self.inp.settings.history_events_per_run
        # Patched: a run recorded before this change replays without handing over.
        if not due or self.inp.dry_run or not versions.patched("continue-as-new-in-loops"):
            return
        await workflow.wait_condition(workflow.all_handlers_finished)
        # An abort that came while the last step ran (the quarantine write does not look
        # for one) must not be left behind with this run: it takes effect here.
        if not self.aborting and workflow.cancellation_reason() is not None and \
                versions.patched("abort-carried-past-continue-as-new"):
            raise asyncio.CancelledError()
        v = self.view
        view = v.model_copy(update={"plan": v.plan[-PLAN_KEPT:]})
        workflow.continue_as_new(self.inp.model_copy(update={"resume": RemediationResume(
            phase=phase, view=view, action=self.action, started=self.started, gpus=self.gpus,
            quarantine_order=self.quarantine_order, policy_quarantine=self.policy_quarantine,
            release_order=self.release_order, abort_note=self.abort_note,
            quarantine_why=why, acknowledged=acked or {}, drain_started=self.drain_started,
            drain_force=self.drain_force, report_after=self.report_after,
            hot_since=self.hot_since, boot_id=self.boot_id, uid=self.uid,
            out_of_service=self.out_of_service, approval_until=approval_until,
            ledger_from=self.ledger_from, external=external,
            repaired_order=self.repaired_order if external is not None else None)}))
