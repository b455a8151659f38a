"""What a remediation accepts from outside while it runs: the view query, the operators'
updates and their same-named signals (each checked by one validator, answered or recorded
as refused), the note that goes with an abort, and the detector's internal drain-slot grant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.commands import checked_command
    from workflows.ids import SLOT_GRANTED_SIGNAL
    from workflows.messages import (
        NodeEventInput,
        OperatorAck,
        OperatorCommand,
        RejectedCommand,
        RemediationView,
        SlotGrant,
    )
    from workflows.operator_identity import OPERATOR_MARK_PATCH, shown_operator
    from workflows.transitions import NodeState, Step

from workflows.steps.base import NODE_CALL, RemediationBase, _cause

REJECTIONS_KEPT = 20
# What a signal handler gets when a signal was sent without a payload.
_NO_PAYLOAD = RawValue(Payload())
# Operator commands that exist both as an update and as a signal of the same name.
SIGNALS = ("approve", "reject", "quarantine", "release", "repaired")


class OperatorOrders(RemediationBase):
    @workflow.query(description="The full current view of this remediation.")
    def view_state(self) -> RemediationView:
        return self.view

    # Every operator command is an update (validated, answered: the CLI uses these) and a
    # signal of the same name (the UI's "Send a Signal", `temporal workflow signal`,
    # automation). Both run the same check; a signal cannot answer, so a rejected one is
    # recorded in the view, as a Warning Event on the node and in the log.

    @workflow.update(description="Approve a remediation waiting for approval (supervised "
                                 "mode). Payload: {\"operator\": \"you\", \"reason\": \"why\"}.")
    async def approve(self, cmd: OperatorCommand) -> OperatorAck:
        return self._do_approve(cmd)

    @approve.validator
    def _check_approve(self, cmd: OperatorCommand) -> None:
        self._require(NodeState.AWAITING_APPROVAL, "approve")
        self._undecided()

    def _do_approve(self, cmd: OperatorCommand) -> OperatorAck:
        cmd = self._received(cmd)
        self.decision, self.decided_by = "approve", cmd
        return self._ack(f"approved by {cmd.operator}")

    @workflow.update(description="Reject a remediation waiting for approval: release the node "
                                 "untouched. Payload: {\"operator\": ..., \"reason\": ...}.")
    async def reject(self, cmd: OperatorCommand) -> OperatorAck:
        return self._do_reject(cmd)

    @reject.validator
    def _check_reject(self, cmd: OperatorCommand) -> None:
        self._require(NodeState.AWAITING_APPROVAL, "reject")
        self._undecided()

    def _do_reject(self, cmd: OperatorCommand) -> OperatorAck:
        cmd = self._received(cmd)
        self.decision, self.decided_by = "reject", cmd
        return self._ack(f"rejected by {cmd.operator}")

    def _undecided(self) -> None:
        if self.decision is not None:
            who = self.decided_by.operator if self.decided_by else "the approval timeout"
            raise ApplicationError(f"{self.inp.node} was already {self.decision}d by {who}",
                                   type=errors.REJECTED)

    @workflow.update(description="Quarantine the node now: it stays cordoned until released. "
                                 "Payload: {\"operator\": ..., \"reason\": ...}.")
    async def quarantine(self, cmd: OperatorCommand) -> OperatorAck:
        return self._do_quarantine(cmd)

    @quarantine.validator
    def _check_quarantine(self, cmd: OperatorCommand) -> None:
        if self.view.step in (Step.HEALTHY, Step.RELEASED, Step.ABORTED):
            raise ApplicationError(
                f"{self.inp.node} is being returned ({self.view.step}); quarantine it with "
                "`gpu-remediate remediate --action quarantine` instead", type=errors.REJECTED)
        if self.view.state == NodeState.QUARANTINED:
            raise ApplicationError(f"{self.inp.node} is already quarantined", type=errors.REJECTED)
        if self.quarantine_order is not None:
            raise ApplicationError(
                f"quarantine already ordered by {self.quarantine_order.operator}",
                type=errors.REJECTED)

    def _do_quarantine(self, cmd: OperatorCommand) -> OperatorAck:
        cmd = self._received(cmd)
        self.quarantine_order = self.view.quarantine_ordered_by = cmd
        return self._ack(f"quarantine ordered by {cmd.operator}; takes effect at the end of "
                         f"the current step ({self.view.step})")

    @workflow.update(description="Release a quarantined node: validate it and return it to "
                                 "service if it passes. Payload: {\"operator\": ..., "
                                 "\"reason\": ...}.")
    async def release(self, cmd: OperatorCommand) -> OperatorAck:
        return self._do_release(cmd)

    @release.validator
    def _check_release(self, cmd: OperatorCommand) -> None:
        if self.view.step != Step.GPU_QUARANTINED:  # a GPU held alone is released alone
            self._require(NodeState.QUARANTINED, "release")
        if self.release_order is not None:
            raise ApplicationError("a release is already in progress", type=errors.REJECTED)

    def _do_release(self, cmd: OperatorCommand) -> OperatorAck:
        cmd = self._received(cmd)
        self.release_order = cmd
        return self._ack(f"release ordered by {cmd.operator}; validating")

    @workflow.update(description="Report that an external repair (reset_method or "
                                 "reboot_method 'external') is done: validation follows. "
                                 "Payload: {\"operator\": ..., \"reason\": ...}.")
    async def repaired(self, cmd: OperatorCommand) -> OperatorAck:
        return self._do_repaired(cmd)

    @repaired.validator
    def _check_repaired(self, cmd: OperatorCommand) -> None:
        if self.repaired_order is not None and self.view.step == Step.EXTERNAL:
            raise ApplicationError(
                f"a repair was already reported by {self.repaired_order.operator}; "
                "validation follows", type=errors.REJECTED)
        if self.view.step != Step.EXTERNAL:
            raise ApplicationError(
                f"{self.inp.node} is not waiting for an external repair (it is "
                f"{self.view.state.value}, step {self.view.step})", type=errors.REJECTED)

    def _do_repaired(self, cmd: OperatorCommand) -> OperatorAck:
        cmd = self._received(cmd)
        self.repaired_order = cmd
        return self._ack(f"repair reported by {cmd.operator}; validating")

    @workflow.update(description="Record who aborts and why, for clients that cannot put it "
                                 "in the cancel request's reason; the cancel cleans up.")
    async def note_abort(self, cmd: OperatorCommand) -> OperatorAck:
        self.abort_note = cmd = self._received(cmd)
        return self._ack(f"abort noted for {cmd.operator}")

    @workflow.signal(name="approve", description="For operators: same as the approve update, "
                                              "as a signal. Payload: {\"operator\": \"you\", "
                                              "\"reason\": \"why (required)\"}.")
    async def approve_signal(self, raw: RawValue = _NO_PAYLOAD) -> None:
        await self._signal("approve", raw, self._check_approve, self._do_approve)

    @workflow.signal(name="reject", description="For operators: same as the reject update, "
                                              "as a signal. Payload: {\"operator\": \"you\", "
                                              "\"reason\": \"why (required)\"}.")
    async def reject_signal(self, raw: RawValue = _NO_PAYLOAD) -> None:
        await self._signal("reject", raw, self._check_reject, self._do_reject)

    @workflow.signal(name="quarantine", description="For operators: same as the quarantine update, "
                                              "as a signal. Payload: {\"operator\": \"you\", "
                                              "\"reason\": \"why (required)\"}.")
    async def quarantine_signal(self, raw: RawValue = _NO_PAYLOAD) -> None:
        await self._signal("quarantine", raw, self._check_quarantine, self._do_quarantine)

    @workflow.signal(name="release", description="For operators: same as the release update, "
                                              "as a signal. Payload: {\"operator\": \"you\", "
                                              "\"reason\": \"why (required)\"}.")
    async def release_signal(self, raw: RawValue = _NO_PAYLOAD) -> None:
        await self._signal("release", raw, self._check_release, self._do_release)

    @workflow.signal(name="repaired", description="For operators: same as the repaired update, "
                                              "as a signal. Payload: {\"operator\": \"you\", "
                                              "\"reason\": \"why (required)\"}.")
    async def repaired_signal(self, raw: RawValue = _NO_PAYLOAD) -> None:
        await self._signal("repaired", raw, self._check_repaired, self._do_repaired)

    @workflow.signal(name=SLOT_GRANTED_SIGNAL,
                     description="Internal — sent by the detector, not by people: a drain "
                                 "slot for this heat cordon, with its lease token. One sent "
                                 "by hand is refused and recorded.")
    async def grant_slot(self, raw: RawValue = _NO_PAYLOAD) -> None:
        if not self._gated():
            self.slot_granted = True
            return
        try:
            grant = SlotGrant.model_validate(
                workflow.payload_converter().from_payload(raw.payload)
                if raw.payload.data else {})
        except Exception as err:  # a stray client's payload: recorded, never raised
            await self._reject_signal(SLOT_GRANTED_SIGNAL, None, f"bad grant: {err}"[:300])
            return
        if grant.token != self.inp.lease_token:
            await self._reject_signal(SLOT_GRANTED_SIGNAL, None,
                                      "internal signal without this remediation's lease "
                                      "token: only the detector grants drain slots")
            return
        self.slot_granted = True

    @workflow.signal(dynamic=True, description="(any other name) Recorded as refused, "
                                                "so a typo shows instead of waiting unseen.")
    async def other_signal(self, name: str, args: Sequence[RawValue]) -> None:
        await self._reject_signal(name, None, f"unknown signal {name!r}; signals are "
                                              f"{', '.join(SIGNALS)}")

    async def _signal(self, name: str, raw: RawValue,
                      check: Callable[[OperatorCommand], None],
                      apply: Callable[[OperatorCommand], OperatorAck]) -> None:
        cmd, refused = checked_command(raw, check)
        if refused is not None or cmd is None:
            await self._reject_signal(name, cmd, refused or "no command")
            return
        ack = apply(cmd)
        workflow.logger.info("signal %s applied: %s", name, ack.message)  # names who, as recorded

    async def _reject_signal(self, name: str, cmd: OperatorCommand | None, why: str) -> None:
        why = why[:500]
        who = self._received(cmd).operator if cmd else ""
        self.view.rejected_commands = [*self.view.rejected_commands, RejectedCommand(
            at=workflow.now(), name=name[:100], operator=who[:100], why=why)][-REJECTIONS_KEPT:]
        workflow.logger.warning("signal %s%s rejected: %s", name[:100],
                                f" from {who}" if who else "", why)
        self._details(f"signal `{name[:100]}` rejected: {why}")
        # Signals cost nothing to send: a stray client looping on a bad one must not turn
        # each into an activity and an Event. Past the first few of a run, view and log only.
        self.signal_events += 1
        if self.signal_events > REJECTIONS_KEPT:
            return
        try:
            await workflow.execute_activity(
                act.record_event,
                NodeEventInput(node=self.inp.node, reason="OperatorSignalRejected",
                               message=f"signal {name[:100]}" + (f" from {who}" if who else "")
                                       + f" rejected: {why}"),
                start_to_close_timeout=NODE_CALL, retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"record rejected signal {name[:100]}")
        except ActivityError as err:
            # The rejection is in the view and the log; a lost Event must not fail the run.
            workflow.logger.warning("could not record the rejected signal: %s", _cause(err))

    def _received(self, cmd: OperatorCommand) -> OperatorCommand:
        """The order as recorded: its operator marked unverified unless this worker's own
        settings say the server authenticates callers (the payload cannot say so). Marked
        once, here, so every later use (annotation, Event, details, view) shows the same
        name; a history from before the mark replays unmarked."""
        if not versions.patched(OPERATOR_MARK_PATCH):
            return cmd
        shown = shown_operator(cmd.operator, self.inp.settings.server_authorizes)
        return cmd if shown == cmd.operator else cmd.model_copy(update={"operator": shown})

    def _require(self, state: NodeState, verb: str) -> None:
        if self.view.state != state:
            raise ApplicationError(
                f"cannot {verb} {self.inp.node}: it is {self.view.state.value} "
                f"(step {self.view.step}), and {verb} applies only when {state.value}",
                type=errors.REJECTED,
            )

    def _ack(self, message: str) -> OperatorAck:
        return OperatorAck(state=self.view.state, message=message)
