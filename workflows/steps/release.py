"""How a remediation ends: the node given back (healthy or released), held in quarantine
until an operator's release (which evicts, validates and returns it), undone by an abort
from any step, or found gone; each end written to the node's record and to the repair
ledger.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.commands import CANCEL_REQUESTER, abort_requester
    from workflows.ledger import (
        LedgerEntry,
        LedgerInput,
        action_taken,
        entry_id,
        fault_of,
        gpus_of,
        step_times,
    )
    from workflows.messages import HistoryEntry, NodeJobResult, ReleaseInput, RemediationResult
    from workflows.operator_identity import OPERATOR_MARK_PATCH, shown_operator
    from workflows.transitions import NodeState, Outcome, Step

from workflows.steps.base import NODE_CALL, NODE_RETRY, NodeGone, RemediationBase, _cause
from workflows.steps.claim import NoLease

# Every outcome goes to the repair ledger (runs recorded before it: as they ran). A write
# that keeps failing is told and counted, never the remediation's failure.
LEDGER_PATCH = "repair-ledger"
LEDGER_CALL = timedelta(seconds=30)
LEDGER_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                           maximum_interval=timedelta(seconds=10), maximum_attempts=5,
                           non_retryable_error_types=[*errors.NOT_RETRIED])


class ReleaseSteps(RemediationBase):
    async def _node_gone(self, gone: NodeGone) -> RemediationResult:
        """The node was deleted, or replaced by another machine under its name (another
        UID). Nothing of ours is on a new machine, and it is not ours to touch: the
        remediation ends; its record is this workflow's result and history (they outlive
        the Node object), and an Event on the name tells whoever looks at the new node."""
        cause = _cause(gone.__cause__) if gone.__cause__ else "node deleted"
        why = (f"node gone during remediation ({cause}); remediation {self.view.step} "
               f"attempt {self.view.attempt} ended, the new node is left untouched")
        self._set(self.view.state, Step.NODE_GONE)
        self._details(why)
        if versions.patched("node-gone-event"):
            try:
                await self._note_event("NodeGone", f"{why}; record: workflow "
                                                   f"{workflow.info().workflow_id}", "Warning")
            except (ActivityError, NodeGone) as err:
                workflow.logger.warning("NodeGone Event for %s not recorded: %s",
                                        self.inp.node, err)
        return RemediationResult(node=self.inp.node, outcome=Outcome.RELEASED,
                                 attempts=self.view.attempt, message=why)

    async def _quarantine(self, why: str, acked: dict[str, int] | None = None, *,
                          applied: bool = False) -> RemediationResult:
        """Keep the node cordoned and tainted until an operator releases it.

        The hold runs in a run of its own (continue-as-new as soon as the quarantine is
        written), so a node quarantined for months replays only this loop."""
        acked = acked or {}
        while True:
            if not applied:
                self._set(NodeState.QUARANTINED, Step.QUARANTINED)
                await self._release_call(Outcome.QUARANTINED, why, acked)
                self._details(f"quarantined: {why}. Release with `gpu-remediate release "
                              f"{self.inp.node}` after the repair.")
                if self.inp.dry_run:
                    return RemediationResult(node=self.inp.node,
                                             outcome=Outcome.QUARANTINED,
                                             attempts=self.view.attempt, message=why)
                if self.release_order is None:
                    await self._continue_as_new_if_due("quarantine", now=True, why=why,
                                                       acked=acked)
            applied = False
            await workflow.wait_condition(lambda: self.release_order is not None)
            order = self.release_order
            assert order is not None
            try:
                await self._confirm_lease("the release validation")
            except NoLease as refused:
                # Stays quarantined; the operator sees why the release did nothing.
                self.release_order = None
                self._details(f"release by {order.operator} refused: {refused}")
                continue
            self.view.attempt += 1
            # The node stays labelled quarantined while it is validated: quarantined nodes
            # hold no budget slot, and an operator's release must not take one that the
            # detector has not admitted. It is cordoned, so nothing new lands on it.
            await self._enter(NodeState.QUARANTINED, Step.RELEASE_VALIDATE, "ReleaseRequested",
                              f"release by {order.operator}: {order.reason}; validating")
            # Patched: a release that was already validated (and recorded) before this change
            # replays without the drain; every release from the upgrade on drains first,
            # including releases of nodes quarantined before it.
            left = (await self._clear_for_validation()
                    if versions.patched("drain-before-release-validation") else "")
            released: dict[str, int] = {}
            if left:
                check = NodeJobResult(succeeded=False, job_name="", message=left)
            else:
                released = await self._xids_shown_at_release(acked)
                check = await self._validate(self.view.attempt, released)
            self.release_order = None
            if check.succeeded:
                self.quarantine_order = self.view.quarantine_ordered_by = None
                self.policy_quarantine = self.view.quarantine_policy_reason = None
                return await self._finish(
                    Outcome.HEALTHY, f"released by {order.operator} and validated",
                    {**acked, **released})
            why = f"release by {order.operator} failed validation: {check.message}"

    async def _finish(self, outcome: Literal[Outcome.HEALTHY, Outcome.RELEASED], why: str,
                      acked: dict[str, int] | None = None) -> RemediationResult:
        await self._out_of_service(False)
        self._set(NodeState.HEALTHY, Step(outcome))
        await self._release_call(outcome, why, acked or {})
        self.released = True
        self._check_cancelled()
        self._details(f"{outcome}: {why}")
        return RemediationResult(node=self.inp.node, outcome=outcome,
                                 attempts=self.view.attempt, message=why)

    async def _release_call(self, outcome: Outcome, why: str, acked: dict[str, int], *,
                            claim_unconfirmed: bool = False,
                            retry: RetryPolicy = NODE_RETRY,
                            node_untouched: bool = False) -> None:
        info = workflow.info()
        reasons = {Outcome.HEALTHY: "RemediationSucceeded",
                   Outcome.QUARANTINED: "NodeQuarantined",
                   Outcome.RELEASED: "RemediationReleased",
                   Outcome.ABORTED: "RemediationAborted"}
        self._plan({Outcome.HEALTHY: "uncordon" if not self.view.previously_cordoned
                    else "leave cordoned (an admin cordoned it before us)",
                    Outcome.QUARANTINED: "keep cordoned and tainted: quarantined",
                    Outcome.RELEASED: "remove taint and label; uncordon if we cordoned",
                    Outcome.ABORTED: "remove taint and label; uncordon if we cordoned"}[outcome])
        await self._call(
            act.release_node,
            ReleaseInput(
                node=self.inp.node, outcome=outcome,
                uncordon=not self.view.previously_cordoned,
                history=HistoryEntry(started=self.started, finished=workflow.now(),
                                     action=self.action.value, reason=self.view.reason,
                                     repaired=self.view.attempt > 0,
                                     outcome=f"{outcome}: {why}"[:300],
                                     workflow_id=info.workflow_id,
                                     by=self.inp.requested_by),
                acknowledged_xids=acked, event_reason=reasons[outcome],
                event_message=f"{outcome}: {why}", dry_run=self.inp.dry_run,
                claim_unconfirmed=claim_unconfirmed, uid=self.uid, run_id=info.run_id,
                node_untouched=node_untouched,
            ),
            timeout=NODE_CALL, heartbeat=False, retry=retry,
            summary=f"{outcome}: release {self.inp.node}", check_cancel=False,
        )
        await self._record_repair(outcome, why)

    async def _record_repair(self, outcome: Outcome, why: str) -> None:
        """The outcome into the repair ledger (workflows/ledger.py). A write that fails after
        its retries is counted by the activity and told in a Warning Event: the ledger is
        the fleet's memory, never a reason for a remediation to fail."""
        if self.inp.dry_run or not versions.patched(LEDGER_PATCH):
            return
        info = workflow.info()
        finished = workflow.now()
        marks = [(t.at, t.state.value, t.step.value) for t in self.view.transitions]
        verdict = self.inp.verdict
        entry = LedgerEntry(
            id=entry_id(info.workflow_id, self.started, finished), node=self.inp.node,
            node_uid=self.uid, gpus=gpus_of(verdict), gpu_count=self.gpus,
            fault=fault_of(verdict), verdict_action=verdict.action.value,
            action=action_taken(marks, self.action.value, outcome.value),
            outcome=outcome.value, why=why[:300], started=self.started, finished=finished,
            accounted_from=self.ledger_from, steps=step_times(marks, finished),
            attempts=self.view.attempt, workflow_id=info.workflow_id)
        self.ledger_from = finished
        try:
            await self._call(act.record_repair, LedgerInput(entry=entry), timeout=LEDGER_CALL,
                             heartbeat=False, retry=LEDGER_RETRY, check_cancel=False,
                             summary=f"repair ledger: {outcome}")
        except ActivityError as err:
            workflow.logger.warning("%s: outcome %s not in the repair ledger: %s",
                                    self.inp.node, outcome.value, _cause(err))
            await self._tell("LedgerWriteFailed",
                             f"the outcome of {info.workflow_id} ({outcome.value}) is not in "
                             f"the repair ledger: {_cause(err)[:300]}")

    async def _abort_cleanup(self) -> None:
        """Undo what this remediation did to the node: our taint and label go, the node is
        uncordoned unless someone else had cordoned it, and who/why go to its history.

        Runs after the cancellation was delivered (once): activities scheduled from here on
        run normally. A node Job still running deletes itself when its activity sees the
        cancel (activities/jobs.py); nothing new is created after this point."""
        self.aborting = True
        if self.view.gpu_isolation is not None and not self.released:
            await self._abort_gpu_isolation()
            return
        if not self.claim_started or self.released:
            return
        why = self._abort_reason()
        self._set(NodeState.HEALTHY, Step.ABORTED)
        self._details(why)
        # Between looks at a polled Job no activity holds it: delete it here, so an
        # aborted validation does not keep every GPU of the node.
        await self._delete_job_in_progress()
        await self._restore_operands(best_effort=True)
        await self._out_of_service(False)
        # The XIDs that started it and any shown since are acknowledged: an XID keeps
        # showing until another comes, and the detector must not start this again.
        acked = self._acknowledged_xids()
        if self.claimed:
            acked |= await self._xids_shown_at_release({}, aborting=True)
        try:
            await self._release_call(Outcome.ABORTED, why, acked,
                                    claim_unconfirmed=not self.claimed)
        except NodeGone:
            return
        self.released = True

    async def _delete_job_in_progress(self) -> None:
        """An abort's: the Job this remediation polls (and its ResourceClaim, for a pinned
        validation) is deleted, best effort (a failure is logged)."""
        job = self.job_in_progress
        if job is None:
            return
        try:
            await self._node_call(act.delete_node_job, job, summary=f"delete {job.name}",
                                  check_cancel=False)
        except ActivityError as err:
            workflow.logger.warning("could not delete %s: %s", job.name, _cause(err))

    def _abort_reason(self) -> str:
        if self.abort_note is not None:
            return f"aborted by {self.abort_note.operator}: {self.abort_note.reason}"
        operator, text = abort_requester(workflow.cancellation_reason() or "")
        if operator != CANCEL_REQUESTER and versions.patched(OPERATOR_MARK_PATCH):
            # the cancel's reason names whom its sender claims to be
            operator = shown_operator(operator, self.inp.settings.server_authorizes)
        return f"aborted by {operator}: {text}"
