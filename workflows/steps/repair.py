"""The repair: rounds of repair and validation (a failed GPU reset escalates to a reboot),
each repair a Job or a hand-off (`external`, whose wait for `repaired` continues as new
under a signal storm); a reboot confirmed by the node (new boot ID, Ready, every GPU),
never by the Job's exit code; a GPU reset beside the GPU Operator (its operands turned
off, and back on as found); the out-of-service taint for a node that did not come back.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from policy.models import Action
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.messages import (
        ExternalWait,
        NodeJobInput,
        NodeJobResult,
        OutOfServiceInput,
        RemediationResult,
        ReturnInput,
    )
    from workflows.operands import (
        PAUSE_ANSWER_MAY_BE_LOST,
        OperandsInput,
        OperandsWaitInput,
        pause_in_flight,
    )
    from workflows.transitions import NodeState, Outcome, Step

from workflows.steps.base import (
    ABORT_READ_RETRY,
    NODE_CALL,
    NodeGone,
    RemediationBase,
    _cause,
    _timed_out,
)
from workflows.steps.validate import node_job_name

EXTERNAL_WAIT_PATCH = "external-wait-bounded"
"""The wait for an external repair continues as new past history_events_per_run (a storm
of refused signals), carrying its window and any `repaired` already accepted."""


class RepairSteps(RemediationBase):
    async def _repair_and_validate(self, resumed: ExternalWait | None = None,
                                   ) -> RemediationResult:
        """Repair and validate, up to max_repair_attempts; ``resumed``: an external
        repair's wait continued from an earlier run, picked up at its attempt."""
        s = self.inp.settings
        kind: Literal["gpu-reset", "reboot"] = (
            "reboot" if self.action == Action.REBOOT else "gpu-reset")
        acked = self._acknowledged_xids()
        first = 1
        if resumed is not None:
            kind, first = resumed.kind, resumed.attempt
        for attempt in range(first, s.max_repair_attempts + 1):
            self.view.attempt = attempt
            if resumed is not None and attempt == first:
                repair = await self._resume_external(resumed)
            else:
                repair = await self._repair(kind, attempt)
            if not repair.succeeded:
                if kind == "gpu-reset":
                    self._plan("GPU reset failed: escalate to reboot")
                    kind = "reboot"
                    repair = await self._repair(kind, attempt)
                if not repair.succeeded:
                    return await self._quarantine(f"{kind} failed: {repair.message}", acked)
            if self._quarantine_due():
                return await self._quarantine(self._quarantine_reason(), acked)
            await self._confirm_lease("the validation")
            await self._enter(NodeState.VALIDATING, Step.VALIDATE, "ValidationStarted",
                              f"attempt {attempt}: validation Job on all {self.gpus} GPUs")
            check = await self._validate(attempt)
            if self._quarantine_due():
                # An operator's order outranks a passing validation.
                return await self._quarantine(self._quarantine_reason(), acked)
            if check.succeeded:
                return await self._finish(Outcome.HEALTHY, f"validated: {check.message}", acked)
            self._plan(f"validation failed (attempt {attempt}): {check.message}")
            if kind == "gpu-reset":
                kind = "reboot"  # the next round escalates
        return await self._quarantine(
            f"validation failed {s.max_repair_attempts} times", acked)

    async def _repair(self, kind: Literal["gpu-reset", "reboot"],
                      attempt: int) -> NodeJobResult:
        """One repair: a Job, or a hand-off to whoever does it (`external`)."""
        s = self.inp.settings
        method = s.reset_method if kind == "gpu-reset" else s.reboot_method
        await self._confirm_lease(f"the {kind}")
        if method != "external":
            await self._enter(NodeState.REPAIRING, Step(kind), "RepairStarted",
                              f"attempt {attempt}/{s.max_repair_attempts}: {kind}")
            if kind == "reboot" and versions.patched("reboot-confirmed-by-the-node"):
                return await self._reboot(attempt)
            if kind == "gpu-reset" and versions.patched("reset-beside-gpu-operator"):
                return await self._reset(attempt)
            return await self._job(kind, attempt)
        # A `repaired` the validator accepts from here on takes effect: it may arrive while
        # the state below is still being written (before: cleared after that write).
        kept = versions.patched("repaired-accepted-is-kept")
        if kept:
            self.repaired_order = None
        await self._enter(NodeState.REPAIRING, Step.EXTERNAL, "ExternalRepairRequested",
                          f"attempt {attempt}: {kind} handed off; waiting for `gpu-remediate "
                          f"repaired {self.inp.node}`", event_type="Warning")
        self._plan(f"wait for an external {kind} and the `repaired` update")
        if self.inp.dry_run:
            return NodeJobResult(succeeded=True, message="dry-run", job_name="")
        if not kept:
            self.repaired_order = None
        try:
            await self._await_external(kind, attempt, until=None)
        except TimeoutError:
            return NodeJobResult(succeeded=False, job_name="",
                                 message=f"no repair reported within {s.external_timeout}")
        return self._external_done(kind)

    async def _await_external(self, kind: Literal["gpu-reset", "reboot"], attempt: int, *,
                              until: datetime | None) -> None:
        """Wait for `repaired` (or a quarantine order) until the external window ends
        (``until``, for a wait continued from an earlier run); TimeoutError past it. A storm
        of refused signals grows the history while nothing is reported: past
        history_events_per_run the wait continues in a new run, with the same window."""
        s = self.inp.settings
        bounded = until is not None or versions.patched(EXTERNAL_WAIT_PATCH)
        limit = s.history_events_per_run

        def reported() -> bool:
            return self.repaired_order is not None or self.quarantine_order is not None

        def outgrown() -> bool:
            return bounded and workflow.info().get_current_history_length() >= limit

        if not bounded:
            await workflow.wait_condition(reported, timeout=s.external_timeout,
                                          timeout_summary=f"external {kind}")
            return
        end = until or (workflow.now() + s.external_timeout
                        if s.external_timeout is not None else None)
        while True:
            await workflow.wait_condition(
                lambda: reported() or outgrown(),
                timeout=None if end is None else max(end - workflow.now(), timedelta(0)),
                timeout_summary=f"external {kind}")
            if reported():
                return
            await self._continue_as_new_if_due(
                "external", now=True, external=ExternalWait(kind=kind, attempt=attempt,
                                                            until=end))

    async def _resume_external(self, w: ExternalWait) -> NodeJobResult:
        """The external wait handed over by the previous run: same window, no new Event."""
        try:
            await self._await_external(w.kind, w.attempt, until=w.until)
        except TimeoutError:
            return NodeJobResult(succeeded=False, job_name="", message=(
                f"no repair reported within {self.inp.settings.external_timeout}"))
        return self._external_done(w.kind)

    def _external_done(self, kind: Literal["gpu-reset", "reboot"]) -> NodeJobResult:
        if self.repaired_order is None:
            return NodeJobResult(succeeded=True, job_name="", message="quarantine ordered")
        who = self.repaired_order
        return NodeJobResult(succeeded=True, job_name="",
                             message=f"{kind} reported done by {who.operator}: {who.reason}")

    async def _reboot(self, attempt: int) -> NodeJobResult:
        """Reboot, then wait for the node to show it: a new boot ID (or, from kubelets that
        report none, a Ready transition after the request), Ready, every GPU allocatable
        and its exporter answering. The Job's own fate says nothing: the shutdown kills its
        pod, or lets it exit 0 first, and on a node that lost power its pod never ends (the
        Job stays at FailureTarget, or running). So the return is timed from the request:
        the Job is watched only within reboot_return_timeout, and only a Job that never
        started (its image cannot be pulled) ends the step as such. Polled by activity
        retries, so the wait holds no worker slot and adds no history events."""
        requested = workflow.now()
        timeout = self.inp.settings.reboot_return_timeout
        if self.inp.dry_run or not versions.patched("reboot-timed-from-request"):
            job = await self._job("reboot", attempt)
        else:
            s = self.inp.settings
            name = node_job_name("reboot", self.inp.node, workflow.info().run_id, attempt)
            self._plan(f"run reboot Job {name} on {self.inp.node}")
            job_in = NodeJobInput(node=self.inp.node, kind="reboot", name=name,
                                  template=s.job_templates.for_kind("reboot"), gpus=self.gpus)
            self.job_in_progress = job_in
            try:
                job = await self._call(
                    act.poll_node_job, job_in, timeout=timedelta(minutes=1),
                    heartbeat=False, summary=f"reboot job on {self.inp.node}",
                    retry=self._job_poll_retry(), schedule_to_close=min(timeout, s.job_timeout))
            except ActivityError as err:
                cause = err.cause
                if isinstance(cause, ApplicationError) and cause.type == errors.JOB_NOT_STARTED:
                    self.job_in_progress = None
                    why = f"reboot never started: {cause}"
                    await self._note_event("RebootNotStarted", f"{self.inp.node} {why}",
                                           "Warning")
                    return NodeJobResult(succeeded=False, job_name=name, message=why)
                if not _timed_out(err):
                    raise
                # Still running (its pod on a node that lost power never ends): the node's
                # return decides, in what is left of the same timeout.
                job = NodeJobResult(succeeded=False, job_name=name,
                                    message=f"reboot Job {name} not finished: {_cause(err)}")
            self.job_in_progress = None
        self._plan(f"wait up to {timeout} for a new boot ID, Ready, {self.gpus} GPUs "
                   "allocatable and the exporter answering")
        if self.inp.dry_run:
            return job
        wait = timeout
        if versions.patched("reboot-timed-from-request"):
            # What is left of the timeout since the request; at least one more look.
            wait = max(timeout - (workflow.now() - requested),
                       self.inp.settings.node_poll_interval)
        self._details(f"reboot requested ({job.message or 'Job created'}); waiting up to "
                      f"{wait} for the node to come back")
        try:
            back = await self._call(
                act.check_node_returned,
                ReturnInput(node=self.inp.node, uid=self.uid, old_boot_id=self.boot_id,
                            expected_gpus=self.gpus, reboot_requested_at=requested),
                timeout=timedelta(minutes=1), heartbeat=False, retry=self._poll_retry(),
                schedule_to_close=wait,
                summary=f"wait for {self.inp.node} to come back from its reboot")
        except ActivityError as err:
            why = f"did not return within {timeout} of its reboot: {_cause(err)}"
            await self._note_event("NodeDidNotReturn", f"{self.inp.node} {why}", "Warning")
            await self._out_of_service(True)
            return NodeJobResult(succeeded=False, job_name=job.job_name, message=why)
        self._set(NodeState.REPAIRING, Step.REBOOTED)
        self._details(back.message)
        await self._note_event("NodeRebooted", back.message)
        return NodeJobResult(succeeded=True, job_name=job.job_name, message=back.message)

    async def _out_of_service(self, on: bool) -> None:
        """remediation.drain.out_of_service_taint: a node that did not come back gets
        node.kubernetes.io/out-of-service (non-graceful node shutdown: its pods and volumes
        are released elsewhere), and loses it when it is given back. Best effort: the
        quarantine (or the release) goes on whatever the API says."""
        if self.inp.dry_run or on == self.out_of_service or \
                not self.inp.settings.drain.out_of_service_taint or \
                not versions.patched("out-of-service-taint"):
            return
        try:
            said = await self._call(
                act.mark_out_of_service,
                OutOfServiceInput(node=self.inp.node, uid=self.uid, on=on),
                timeout=NODE_CALL, heartbeat=False, retry=ABORT_READ_RETRY,
                check_cancel=False,
                summary=("mark" if on else "unmark") + f" {self.inp.node} out of service")
        except (ActivityError, NodeGone) as err:
            workflow.logger.warning("out-of-service taint on %s not %s: %s", self.inp.node,
                                    "added" if on else "removed", _cause(err))
            return
        self.out_of_service = on
        self._plan(said)

    async def _reset(self, attempt: int) -> NodeJobResult:
        """GPU reset beside the GPU Operator: its operands hold the GPUs, so they are turned
        off (only labels found "true"), the reset runs once they are gone, they are turned
        back on exactly as found, and the reset counts only once they are Ready again with
        every GPU allocatable (a device plugin restart also clears a GPU it held unhealthy
        after the XID)."""
        op = self.inp.settings.gpu_operator
        if not op.operands:
            return await self._job("gpu-reset", attempt)
        self._pausing_operands()
        paused = await self._node_call(
            act.pause_gpu_operands,
            OperandsInput(node=self.inp.node, operands=op.operands, namespace=op.namespace,
                          dry_run=self.inp.dry_run),
            summary=f"turn GPU Operator operands off on {self.inp.node}", check_cancel=False)
        # An abort that arrives while the pause runs must still find what it turned off, or
        # the node would go back to service with its device plugin off: record it first.
        if versions.patched("operands-paused-recorded-before-abort") and not self.inp.dry_run:
            self.operands_paused = paused
        self._check_cancelled()
        labels = sorted(paused.changed)
        self._plan(f"turn off GPU Operator operands ({', '.join(labels) or 'none on'}); "
                   "reset; restore them as found; wait until Ready with every GPU")
        if self.inp.dry_run:
            return await self._job("gpu-reset", attempt)
        self.operands_paused = paused
        if labels:
            self._details(f"waiting up to {op.stop_timeout} for the operands to leave "
                          f"({', '.join(labels)})")
            gone = await self._wait_for(
                act.check_operands_gone,
                OperandsWaitInput(node=self.inp.node, labels=labels, namespace=op.namespace),
                op.stop_timeout, f"wait for operands to leave {self.inp.node}")
            if isinstance(gone, str):
                await self._restore_operands()
                return NodeJobResult(succeeded=False, job_name="",
                                     message=f"GPU Operator operands did not stop within "
                                             f"{op.stop_timeout}: {gone}")
        result = await self._job("gpu-reset", attempt)
        await self._restore_operands()
        if labels:
            self._details(f"reset {'done' if result.succeeded else 'failed'}; waiting up to "
                          f"{op.start_timeout} for the operands and {self.gpus} GPUs")
            back = await self._wait_for(
                act.check_operands_back,
                OperandsWaitInput(node=self.inp.node, labels=labels, namespace=op.namespace,
                                  expected_gpus=self.gpus),
                op.start_timeout, f"wait for operands on {self.inp.node}")
            if isinstance(back, str) and result.succeeded:
                return NodeJobResult(succeeded=False, job_name=result.job_name,
                                     message=f"reset done, but the GPU Operator operands were "
                                             f"not back within {op.start_timeout}: {back}")
        return result

    def _pausing_operands(self) -> None:
        """Before a pause: an abort landing in the workflow task that also brings the
        pause's completion gets no result (the SDK raises the cancellation), so until the
        answer comes the restore goes by the node's pause record."""
        if not self.inp.dry_run and versions.patched(PAUSE_ANSWER_MAY_BE_LOST):
            self.operands_paused = pause_in_flight(self.inp.node)

    async def _restore_operands(self, *, best_effort: bool = False) -> None:
        """Turn back on what the reset turned off (idempotent; nothing when nothing is
        paused). ``best_effort``: on the way to quarantine or out of an abort, a failure is
        logged, not raised: the node is held anyway and the Event says what to restore."""
        paused = self.operands_paused
        if paused is None:
            return
        try:
            await self._node_call(act.restore_gpu_operands, paused,
                                  summary=f"turn GPU Operator operands back on on "
                                          f"{self.inp.node}", check_cancel=not best_effort)
        except (ActivityError, NodeGone) as err:
            if not best_effort:
                raise
            workflow.logger.warning("could not restore the GPU Operator operands on %s: %s",
                                    self.inp.node, err)
            return
        self.operands_paused = None
