"""What every step of a remediation stands on: the workflow's state (declared here, set by
``RemediationWorkflow.__init__`` in workflows/remediation.py), the call helpers every
activity goes through, the view and the node's state writes.

The step families are mixins of ``RemediationBase``, one module each beside this one; the
workflow class mixes them. A step that calls into another family sees it declared here,
under TYPE_CHECKING (mypy checks each definition against its declaration), so each module
type-checks alone and nothing is looked up at run time but the real method.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from policy.models import Action
    from policy.rules import SIG_XID, gpu_key
    from workflows import activity_refs as act
    from workflows import errors, transitions
    from workflows.messages import (
        ExternalWait,
        NodeEventInput,
        NodeJobInput,
        NodeJobResult,
        OperatorCommand,
        RemediationInput,
        RemediationResult,
        RemediationView,
        StateInput,
        Transition,
    )
    from workflows.operands import OperandsPaused
    from workflows.search_attributes import REMEDIATION_STATE
    from workflows.transitions import NodeState, Outcome, Step

NODE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=[*errors.NOT_RETRIED],
)
NODE_CALL = timedelta(minutes=2)
# What an abort reads before giving the node back: a few quick tries, never a wait.
ABORT_READ_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                               maximum_interval=timedelta(seconds=2), maximum_attempts=3,
                               non_retryable_error_types=[*errors.NOT_RETRIED])
# Polling by retry: an activity that raises "not yet" every few seconds until the node
# shows what we wait for (or the schedule-to-close timeout ends the wait).
# Waits on the node (back from a reboot, operands gone or back, GPUs free) are one-look
# activities retried every ``remediation.node_poll_interval`` (see _poll_retry).
POLL_NOT_RETRIED = [*errors.NOT_RETRIED, errors.NODE_GONE]
TRANSITIONS_KEPT = 50
# An activity's argument and result (the call helpers are generic in both).
A = TypeVar("A")
R = TypeVar("R")


class NodeGone(Exception):
    """The node was deleted while we remediated it."""


def _timed_out(err: ActivityError) -> bool:
    """The wait ran out (schedule-to-close while polling by retry): its cause is either the
    timeout itself or, when the last look failed, that failure with retry state TIMEOUT."""
    return isinstance(err.cause, ActivityTimeout) or err.retry_state == RetryState.TIMEOUT


def _cause(err: BaseException) -> str:
    while getattr(err, "cause", None) is not None:
        err = err.cause  # type: ignore[attr-defined]
    return str(err)


def _minutes(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes}m" if minutes else f"{int(delta.total_seconds())}s"


class RemediationBase:
    """State and call helpers shared by the step families (one remediation of one node)."""

    inp: RemediationInput
    action: Action
    view: RemediationView
    decision: Literal["approve", "reject"] | None
    decided_by: OperatorCommand | None
    quarantine_order: OperatorCommand | None
    policy_quarantine: str | None
    release_order: OperatorCommand | None
    abort_note: OperatorCommand | None
    repaired_order: OperatorCommand | None
    claim_started: bool
    claimed: bool
    released: bool
    aborting: bool
    gpus: int
    started: datetime
    drain_started: datetime | None
    drain_force: bool
    report_after: timedelta | None
    hot_since: datetime | None
    boot_id: str
    job_in_progress: NodeJobInput | None
    operands_paused: OperandsPaused | None
    signal_events: int
    slot_granted: bool
    uid: str
    ledger_from: datetime | None
    _lease_gate: bool | None
    out_of_service: bool

    if TYPE_CHECKING:
        # Steps of one family that another family calls, declared for mypy (which checks
        # each definition in its family's module against this declaration).

        # claim.py
        def _gated(self) -> bool: ...

        async def _confirm_lease(self, step: str) -> None: ...

        async def _wait_for_slot(self) -> None: ...

        # repair.py
        def _pausing_operands(self) -> None: ...

        async def _restore_operands(self, *, best_effort: bool = False) -> None: ...

        async def _out_of_service(self, on: bool) -> None: ...

        # validate.py
        async def _validate(self, attempt: int,
                            released_xids: dict[str, int] | None = None) -> NodeJobResult: ...

        async def _job(self, kind: Literal["validate", "gpu-reset", "reboot"],
                       attempt: int, pinned: tuple[str, str] | None = None
                       ) -> NodeJobResult: ...

        def _job_poll_retry(self) -> RetryPolicy: ...

        async def _standalone_host_engine_missing(self) -> str: ...

        async def _clear_for_validation(self) -> str: ...

        async def _xids_shown_at_release(self, acked: dict[str, int], *,
                                         aborting: bool = False) -> dict[str, int]: ...

        # release.py
        async def _quarantine(self, why: str, acked: dict[str, int] | None = None, *,
                              applied: bool = False) -> RemediationResult: ...

        async def _finish(self, outcome: Literal[Outcome.HEALTHY, Outcome.RELEASED], why: str,
                          acked: dict[str, int] | None = None) -> RemediationResult: ...

        async def _release_call(self, outcome: Outcome, why: str, acked: dict[str, int], *,
                                claim_unconfirmed: bool = False,
                                retry: RetryPolicy = NODE_RETRY,
                                node_untouched: bool = False) -> None: ...

        def _abort_reason(self) -> str: ...

        async def _delete_job_in_progress(self) -> None: ...

        # gpu_isolation.py
        async def _abort_gpu_isolation(self) -> None: ...

        # the workflow class (workflows/remediation.py)
        async def _continue_as_new_if_due(
                self, phase: Literal["drain", "thermal", "quarantine", "approval", "external"],
                *, now: bool = False, why: str = "", acked: dict[str, int] | None = None,
                approval_until: datetime | None = None,
                external: ExternalWait | None = None) -> None: ...

    def _quarantine_due(self) -> bool:
        return self.quarantine_order is not None or self.policy_quarantine is not None

    def _quarantine_reason(self) -> str:
        if self.quarantine_order is not None:
            order = self.quarantine_order
            return f"{order.reason or 'ordered'} (by {order.operator})"
        if self.policy_quarantine is not None:
            return f"{self.policy_quarantine} (by policy)"
        return f"policy: {self.inp.verdict.summary}"

    def _poll_retry(self) -> RetryPolicy:
        every = self.inp.settings.node_poll_interval
        return RetryPolicy(initial_interval=every, backoff_coefficient=1.0,
                           maximum_interval=every, non_retryable_error_types=POLL_NOT_RETRIED)

    @overload
    async def _wait_for(self, activity: Callable[[A], Awaitable[R]], arg: A,
                        timeout: timedelta, summary: str) -> R | str: ...

    @overload
    async def _wait_for(self, activity: Callable[[A], R], arg: A,
                        timeout: timedelta, summary: str) -> R | str: ...

    async def _wait_for(self, activity: Callable[[Any], Any], arg: Any,
                        timeout: timedelta, summary: str) -> Any:
        """Poll a one-look activity by retry until it answers or ``timeout`` passes; on
        timeout, the last "not yet" as a string (the reason for the Event and history)."""
        try:
            return await self._call(activity, arg,
                                    timeout=timedelta(minutes=1), heartbeat=False,
                                    retry=self._poll_retry(), schedule_to_close=timeout,
                                    summary=summary)
        except ActivityError as err:
            if not _timed_out(err):
                raise
            return _cause(err)

    async def _note_event(self, reason: str, message: str,
                          event_type: Literal["Normal", "Warning"] = "Normal") -> None:
        """An Event on the node that goes with no state change."""
        await self._node_call(act.record_event,
                              NodeEventInput(node=self.inp.node, reason=reason, message=message,
                                             event_type=event_type),
                              summary=f"event {reason}")

    async def _tell(self, reason: str, message: str) -> None:
        """A Warning Event on the way out (a few tries): the API that failed the step may
        refuse it too, and the run must still end. The result and the log say it anyway."""
        try:
            await self._call(act.record_event,
                             NodeEventInput(node=self.inp.node, reason=reason, message=message),
                             timeout=NODE_CALL, heartbeat=False, retry=ABORT_READ_RETRY,
                             check_cancel=False, summary=f"event {reason}")
        except ActivityError as err:
            workflow.logger.warning("could not record %s on %s: %s", reason, self.inp.node,
                                    _cause(err))

    def _acknowledged_xids(self) -> dict[str, int]:
        """XIDs this remediation handles: the exporter keeps showing the last XID, so
        the detector must not remediate again for the same stale value."""
        return {gpu_key(f): int(f.value) for f in self.inp.verdict.findings
                if f.signal == SIG_XID and f.value}

    def _check_cancelled(self) -> None:
        """An activity that completes despite a cancel returns normally, with the cancel
        consumed: look at the request itself, so no step runs after an abort."""
        if not self.aborting and workflow.cancellation_reason() is not None:
            raise asyncio.CancelledError()

    async def _enter(self, state: NodeState, step: Step, event_reason: str, message: str,
                     event_type: Literal["Normal", "Warning"] = "Normal") -> None:
        self._set(state, step)
        self._details(message)
        await self._node_call(
            act.set_node_state,
            StateInput(node=self.inp.node, state=state, reason=self.view.reason, step=step,
                       now=workflow.now(), attempt=self.view.attempt, event_reason=event_reason,
                       event_message=message, event_type=event_type, dry_run=self.inp.dry_run,
                       uid=self.uid),
            summary=f"{state.value}: {step}",
        )

    def _set(self, state: NodeState, step: Step) -> None:
        now = workflow.now()
        if not transitions.allowed(self.view.state, state):
            # A bug, not a reason to stop a remediation half-way: told and counted.
            workflow.logger.warning("state %s -> %s (step %s) is not an edge of the state "
                                    "machine (workflows/transitions.py)", self.view.state.value,
                                    state.value, step)
            workflow.metric_meter().create_counter(
                "gpu_remediate_illegal_transitions",
                "State changes outside the state machine's table.").add(
                1, {"from": self.view.state.value, "to": state.value})
        if state != self.view.state:
            self.view.since = now
            workflow.upsert_search_attributes([REMEDIATION_STATE.value_set(state.value)])
        self.view.state, self.view.step = state, step
        self.view.transitions = [*self.view.transitions,
                                 Transition(at=now, state=state, step=step)][-TRANSITIONS_KEPT:]

    def _plan(self, line: str) -> None:
        self.view.plan.append(line)

    def _details(self, line: str) -> None:
        v = self.view
        text = [f"**{v.state.value}** — {line}", "",
                f"- node: `{v.node}`", f"- action: `{v.action.value}` — {v.reason}",
                f"- step: `{v.step}`, attempt {v.attempt}"]
        if v.blocking_pdb:
            text.append(f"- blocked by PDB `{v.blocking_pdb}`")
        if v.previously_cordoned:
            text.append("- cordoned by someone else before us: stays cordoned")
        if v.dry_run:
            text += ["", "**dry-run plan**", *(f"1. {p}" for p in v.plan)]
        workflow.set_current_details("\n".join(text))

    # The call helpers take an activity reference (workflows/activity_refs.py): its name goes
    # on the wire and its return annotation is the result type, so a call returns what the
    # activity does. One variant for async activities, one for sync ones.

    @overload
    async def _node_call(self, activity: Callable[[A], Awaitable[R]], arg: A, *,
                         summary: str, check_cancel: bool = True) -> R: ...

    @overload
    async def _node_call(self, activity: Callable[[A], R], arg: A, *,
                         summary: str, check_cancel: bool = True) -> R: ...

    async def _node_call(self, activity: Callable[[Any], Any], arg: Any, *, summary: str,
                         check_cancel: bool = True) -> Any:
        return await self._call(activity, arg, timeout=NODE_CALL, heartbeat=False,
                                summary=summary, check_cancel=check_cancel)

    @overload
    async def _call(self, activity: Callable[[A], Awaitable[R]], arg: A, *,
                    timeout: timedelta, heartbeat: bool | timedelta, summary: str,
                    check_cancel: bool = True, retry: RetryPolicy = NODE_RETRY,
                    schedule_to_close: timedelta | None = None) -> R: ...

    @overload
    async def _call(self, activity: Callable[[A], R], arg: A, *,
                    timeout: timedelta, heartbeat: bool | timedelta, summary: str,
                    check_cancel: bool = True, retry: RetryPolicy = NODE_RETRY,
                    schedule_to_close: timedelta | None = None) -> R: ...

    async def _call(self, activity: Callable[[Any], Any], arg: Any, *, timeout: timedelta,
                    heartbeat: bool | timedelta, summary: str, check_cancel: bool = True,
                    retry: RetryPolicy = NODE_RETRY,
                    schedule_to_close: timedelta | None = None) -> Any:
        if isinstance(heartbeat, timedelta):
            beat: timedelta | None = heartbeat
        else:
            beat = self.inp.settings.heartbeat_timeout if heartbeat else None
        try:
            result = await workflow.execute_activity(
                activity, arg, start_to_close_timeout=timeout,
                schedule_to_close_timeout=schedule_to_close,
                heartbeat_timeout=beat, retry_policy=retry,
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=summary[:200],
            )
        except ActivityError as err:
            if not self.aborting and workflow.cancellation_reason() is not None:
                # Cancelled in flight, while queued or between retries (or failed meanwhile):
                # either way an abort was asked for, not a quarantine.
                raise asyncio.CancelledError() from err
            cause = err.cause
            # Activities raise NodeGone for the node itself. A node NotFound recognised by its
            # message is what activities of earlier releases raised: histories that hold one
            # must replay the same way, so it stays.
            if isinstance(cause, ApplicationError) and (
                    cause.type == errors.NODE_GONE or (
                        cause.type == errors.NOT_FOUND
                        and f"node {self.inp.node}" in str(cause))):
                raise NodeGone() from err
            raise
        if check_cancel:
            self._check_cancelled()
        return result
