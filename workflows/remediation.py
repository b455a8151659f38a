"""RemediationWorkflow: one durable remediation of one GPU node (`remediation-<node>`).

Healthy -> [AwaitingApproval] -> Draining -> Repairing -> Validating -> Healthy,
Cordoned for heat, Quarantined for what a repair cannot fix. The node's label
is the truth (it holds the budget slot); this workflow is its only writer while
it runs. No execution timeout: a terminated remediation keeps its node's label
and so its slot until an operator releases it (fail closed).
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import timedelta
from typing import Any, Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from policy.models import Action, Verdict
    from policy.rules import SIG_XID, gpu_key
    from workflows.models import (
        ClaimInput,
        ClaimResult,
        DrainInput,
        DrainResult,
        HistoryEntry,
        NodeJobInput,
        NodeJobResult,
        NodeState,
        OperatorAck,
        OperatorCommand,
        ReleaseInput,
        RemediationInput,
        RemediationResult,
        RemediationView,
        StateInput,
        ThermalWatchInput,
        ThermalWatchResult,
        Transition,
    )
    from workflows.search_attributes import REMEDIATION_ACTION, REMEDIATION_STATE

NODE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=["NotFound", "Invalid"],
)
NODE_CALL = timedelta(minutes=2)
TRANSITIONS_KEPT = 50


class NodeGone(Exception):
    """The node was deleted while we remediated it."""


def node_job_name(kind: str, node: str, run_id: str, attempt: int) -> str:
    """A Job name unique per run and attempt (so a retried activity adopts its own Job and
    never an earlier run's), at most 63 characters (the Job controller copies it into a
    label) and a valid DNS subdomain even where a long node name is cut after a dot.

    The run is named by a hash of its whole ID: run IDs are time-ordered UUIDs, so runs
    started within about a minute share their first eight characters.
    """
    run = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    return f"gr-{kind}-{node}"[:50].rstrip("-.") + f"-{run}-{attempt}"


@workflow.defn
class RemediationWorkflow:
    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        self.inp = inp
        self.action = inp.verdict.action
        self.view = RemediationView(
            node=inp.node, state=NodeState.HEALTHY, step="starting", action=self.action,
            reason=inp.reason or inp.verdict.summary, dry_run=inp.dry_run,
        )
        self.decision: Literal["approve", "reject"] | None = None
        self.decided_by: OperatorCommand | None = None
        self.quarantine_order: OperatorCommand | None = None
        self.release_order: OperatorCommand | None = None
        self.abort_note: OperatorCommand | None = None
        self.repaired_order: OperatorCommand | None = None
        self.claimed = False
        self.gpus = 0
        self.started = workflow.now()

    # ------------------------------------------------------------ queries and updates

    @workflow.query(description="The full current view of this remediation.")
    def view_state(self) -> RemediationView:
        return self.view

    @workflow.update(description="Approve a remediation waiting for approval (supervised mode).")
    async def approve(self, cmd: OperatorCommand) -> OperatorAck:
        self.decision, self.decided_by = "approve", cmd
        return self._ack(f"approved by {cmd.operator}")

    @approve.validator
    def _check_approve(self, cmd: OperatorCommand) -> None:
        self._require(NodeState.AWAITING_APPROVAL, "approve")

    @workflow.update(description="Reject a remediation waiting for approval: release the node "
                                 "untouched.")
    async def reject(self, cmd: OperatorCommand) -> OperatorAck:
        self.decision, self.decided_by = "reject", cmd
        return self._ack(f"rejected by {cmd.operator}")

    @reject.validator
    def _check_reject(self, cmd: OperatorCommand) -> None:
        self._require(NodeState.AWAITING_APPROVAL, "reject")

    @workflow.update(description="Quarantine the node now: it stays cordoned until released.")
    async def quarantine(self, cmd: OperatorCommand) -> OperatorAck:
        self.quarantine_order = cmd
        return self._ack(f"quarantine ordered by {cmd.operator}; takes effect at the end of "
                         f"the current step ({self.view.step})")

    @quarantine.validator
    def _check_quarantine(self, cmd: OperatorCommand) -> None:
        if self.view.step in ("healthy", "released", "aborted"):
            raise ApplicationError(
                f"{self.inp.node} is being returned ({self.view.step}); quarantine it with "
                "`gpu-remediate remediate --action quarantine` instead", type="Rejected")
        if self.view.state == NodeState.QUARANTINED:
            raise ApplicationError(f"{self.inp.node} is already quarantined", type="Rejected")
        if self.quarantine_order is not None:
            raise ApplicationError(
                f"quarantine already ordered by {self.quarantine_order.operator}", type="Rejected")

    @workflow.update(description="Release a quarantined node: validate it and return it to "
                                 "service if it passes.")
    async def release(self, cmd: OperatorCommand) -> OperatorAck:
        self.release_order = cmd
        return self._ack(f"release ordered by {cmd.operator}; validating")

    @release.validator
    def _check_release(self, cmd: OperatorCommand) -> None:
        self._require(NodeState.QUARANTINED, "release")
        if self.release_order is not None:
            raise ApplicationError("a release is already in progress", type="Rejected")

    @workflow.update(description="Report that an external repair (reset_method or "
                                 "reboot_method 'external') is done: validation follows.")
    async def repaired(self, cmd: OperatorCommand) -> OperatorAck:
        self.repaired_order = cmd
        return self._ack(f"repair reported by {cmd.operator}; validating")

    @repaired.validator
    def _check_repaired(self, cmd: OperatorCommand) -> None:
        if self.view.step != "external":
            raise ApplicationError(
                f"{self.inp.node} is not waiting for an external repair (it is "
                f"{self.view.state.value}, step {self.view.step})", type="Rejected")

    @workflow.update(description="Record who aborts and why; the CLI then cancels the workflow, "
                                 "which cleans up.")
    async def note_abort(self, cmd: OperatorCommand) -> OperatorAck:
        self.abort_note = cmd
        return self._ack(f"abort noted for {cmd.operator}")

    def _require(self, state: NodeState, verb: str) -> None:
        if self.view.state != state:
            raise ApplicationError(
                f"cannot {verb} {self.inp.node}: it is {self.view.state.value} "
                f"(step {self.view.step}), and {verb} applies only when {state.value}",
                type="Rejected",
            )

    def _ack(self, message: str) -> OperatorAck:
        return OperatorAck(state=self.view.state, message=message)

    # ------------------------------------------------------------ main flow

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        workflow.upsert_search_attributes([REMEDIATION_ACTION.value_set(self.action.value)])
        try:
            return await self._remediate()
        except _GiveUp as give_up:
            return await self._finish("released", str(give_up))
        except NodeGone:
            return RemediationResult(node=inp.node, outcome="released", attempts=self.view.attempt,
                                     message="node deleted during remediation")
        except ActivityError as err:
            if not self.claimed:
                raise
            # A step failed in a way retries cannot fix (bad config, missing namespace,
            # invalid object): hold the node for a human rather than fail the workflow,
            # which would leave it cordoned with nobody watching.
            return await self._quarantine(
                f"step {self.view.step} failed: {_cause(err)}", self._acknowledged_xids())
        except asyncio.CancelledError:
            await self._abort_cleanup()
            raise

    async def _remediate(self) -> RemediationResult:
        s = self.inp.settings
        if self.action == Action.THERMAL:
            first = NodeState.CORDONED
        elif self.action in s.approval.required_for:
            first = NodeState.AWAITING_APPROVAL
        else:
            first = NodeState.DRAINING
        claim = await self._claim(first)
        window_start = self.started - s.repeat_offender_window
        recent = [h for h in claim.history if h.started >= window_start]
        if len(recent) >= s.repeat_offender_count and self.action != Action.THERMAL:
            self._plan(f"repeat offender: {len(recent)} remediations since "
                       f"{window_start:%Y-%m-%d}; quarantine")
            self.quarantine_order = OperatorCommand(
                operator="policy", reason=f"repeat offender: {len(recent)} remediations within "
                                          f"{s.repeat_offender_window}")
        if self.action == Action.THERMAL and self.quarantine_order is None:
            done = await self._thermal()
            if done is not None:
                return done
        if first == NodeState.AWAITING_APPROVAL and self.quarantine_order is None:
            approved = await self._await_approval()
            if not approved:
                who = self.decided_by.operator if self.decided_by else "approval timeout"
                # Acknowledge the XIDs: the exporter keeps showing the last one, and
                # without this the detector claims the node again at its next tick,
                # undoing the operator's decision. A new XID still triggers.
                return await self._finish("released", f"rejected by {who}",
                                          self._acknowledged_xids())
        await self._drain()
        if self.action == Action.QUARANTINE or self.quarantine_order is not None:
            return await self._quarantine(self._quarantine_reason())
        return await self._repair_and_validate()

    def _quarantine_reason(self) -> str:
        if self.quarantine_order is not None:
            order = self.quarantine_order
            return f"{order.reason or 'ordered'} (by {order.operator})"
        return f"policy: {self.inp.verdict.summary}"

    async def _claim(self, state: NodeState) -> ClaimResult:
        info = workflow.info()
        claim = await self._node_call(
            "claim_node",
            ClaimInput(node=self.inp.node, state=state, reason=self.view.reason,
                       action=self.action, workflow_id=info.workflow_id, run_id=info.run_id,
                       now=workflow.now(), dry_run=self.inp.dry_run),
            ClaimResult, summary=f"cordon and taint {self.inp.node}",
        )
        self.claimed = True
        self.view.previously_cordoned = claim.previously_cordoned
        self._set(state, "claimed")
        self._plan(f"cordon {self.inp.node} and add taint; label {state.value}"
                   + (" (already cordoned by someone else: will stay cordoned)"
                      if claim.previously_cordoned else ""))
        self.gpus = claim.gpus
        return claim

    async def _await_approval(self) -> bool:
        s = self.inp.settings.approval
        if self.inp.dry_run:
            self._plan(f"wait for an operator's approval (up to {s.timeout}, then "
                       f"{s.on_timeout}); the plan continues as if approved")
            return True
        self._details(f"waiting for an operator to approve {self.action.value} "
                      f"(timeout {s.timeout}, then {s.on_timeout})")
        try:
            await workflow.wait_condition(
                lambda: self.decision is not None or self.quarantine_order is not None,
                timeout=s.timeout, timeout_summary="approval window",
            )
        except TimeoutError:
            self.decision = "approve" if s.on_timeout == "approve" else "reject"
        if self.quarantine_order is not None:
            return True
        if self.decision == "approve":
            who = self.decided_by.operator if self.decided_by else "approval timeout"
            await self._enter(NodeState.DRAINING, "approved", "RemediationApproved",
                              f"approved by {who}")
            return True
        return False

    async def _thermal(self) -> RemediationResult | None:
        """Cordoned for heat: no drain; back when cool; escalate if it stays hot."""
        t = self.inp.settings.thermal
        hot_since = workflow.now()
        self._plan("thermal: cordon only, no drain; watch temperature "
                   f"until cool for {t.hold}")
        if self.inp.dry_run:
            return await self._finish("healthy", "dry-run: would wait for the node to cool")
        while True:
            elapsed = workflow.now() - hot_since
            left = (t.escalate_after - elapsed) if t.escalate_after else timedelta(hours=1)
            watch_for = max(min(left, timedelta(hours=1)), t.hold + t.poll_interval)
            self._details(f"cordoned for heat since {hot_since:%H:%M:%S}; waiting for "
                          f"{t.hold} below the recovery threshold")
            result = await workflow.execute_activity(
                "watch_thermal",
                ThermalWatchInput(node=self.inp.node, policy=self.inp.policy, hold=t.hold,
                                  poll_interval=t.poll_interval, give_up_after=watch_for),
                result_type=ThermalWatchResult,
                start_to_close_timeout=watch_for + timedelta(minutes=5),
                heartbeat_timeout=max(self.inp.settings.heartbeat_timeout, t.poll_interval * 3),
                retry_policy=NODE_RETRY,
                summary=f"watch {self.inp.node} temperature",
            )
            if self.quarantine_order is not None:
                return None
            if result.outcome == "recovered":
                return await self._finish("healthy", f"cooled down: {result.message}")
            if result.outcome == "fault" and result.verdict is not None:
                self._escalate(result.verdict, "a hardware fault appeared while cordoned")
                return None
            if t.escalate_after is not None and workflow.now() - hot_since >= t.escalate_after:
                self.quarantine_order = OperatorCommand(
                    operator="policy", reason=f"still hot after {t.escalate_after}: "
                                              f"{result.message}; check cooling")
                await self._enter(NodeState.DRAINING, "thermal-escalation", "ThermalEscalation",
                                  f"still hot after {t.escalate_after}; draining",
                                  event_type="Warning")
                return None
            await workflow.sleep(t.poll_interval, summary="before watching again")

    def _escalate(self, verdict: Verdict, why: str) -> None:
        self.action = verdict.action
        self.view.action = verdict.action
        self.view.reason = f"{verdict.summary} ({why})"
        workflow.upsert_search_attributes([REMEDIATION_ACTION.value_set(self.action.value)])

    async def _drain(self) -> None:
        d = self.inp.settings.drain
        if self.view.state != NodeState.DRAINING:
            await self._enter(NodeState.DRAINING, "drain", "DrainStarted",
                              f"draining {self.inp.node}")
        else:
            # Claim or approval already wrote Draining to the node: only the view moves on.
            self._set(NodeState.DRAINING, "drain")
        started = workflow.now()
        force = False
        while True:
            result = await self._call(
                "drain_node",
                DrainInput(node=self.inp.node, settings=d, force=force,
                           report_after=d.report_after, dry_run=self.inp.dry_run),
                DrainResult,
                timeout=timedelta(minutes=10), heartbeat=True,
                summary=("force-delete" if force else "evict") + f" pods on {self.inp.node}",
            )
            self.view.pods_left = len(result.remaining)
            if result.outcome == "planned":
                self._plan(f"evict {len(result.remaining)} pods: "
                           + ", ".join(result.remaining[:20])
                           + (f"; leave {len(result.skipped)} alone" if result.skipped else ""))
                return
            if result.outcome == "drained":
                self.view.blocking_pdb = ""
                self.view.blocked_since = None
                self._details(f"drained: {result.message}")
                return
            if result.blocking_pdb != self.view.blocking_pdb:
                self.view.blocking_pdb = result.blocking_pdb
                self.view.blocked_since = workflow.now()
            blocked_for = workflow.now() - (self.view.blocked_since or started)
            self._details(f"evicting {len(result.remaining)} pods; blocked by PDB "
                          f"{result.blocking_pdb} for {_minutes(blocked_for)}")
            if self.quarantine_order is not None and self.action != Action.QUARANTINE:
                # An order to quarantine does not need an empty node: stop fighting the PDB.
                return
            if workflow.now() - started >= d.deadline:
                if d.deadline_policy == "force" and not force:
                    await self._enter(NodeState.DRAINING, "drain-force", "DrainForced",
                                      f"drain deadline {d.deadline} passed; deleting "
                                      f"{len(result.remaining)} pods with their grace period",
                                      event_type="Warning")
                    force = True
                elif d.deadline_policy == "release":
                    raise _GiveUp(f"drain deadline {d.deadline} passed, blocked by "
                                  f"{result.blocking_pdb}; released the node")
                elif d.deadline_policy == "wait" and self.view.step != "drain-overdue":
                    await self._enter(NodeState.DRAINING, "drain-overdue", "DrainOverdue",
                                      f"drain deadline {d.deadline} passed; still blocked by "
                                      f"{result.blocking_pdb}; waiting", event_type="Warning")
            # The activity already waited before reporting; this pause only guards
            # against a hot loop if it ever reports at once.
            await workflow.sleep(d.retry_interval, summary="before the next eviction round")

    async def _repair_and_validate(self) -> RemediationResult:
        s = self.inp.settings
        kind: Literal["gpu-reset", "reboot"] = (
            "reboot" if self.action == Action.REBOOT else "gpu-reset")
        acked = self._acknowledged_xids()
        for attempt in range(1, s.max_repair_attempts + 1):
            self.view.attempt = attempt
            repair = await self._repair(kind, attempt)
            if not repair.succeeded:
                if kind == "gpu-reset":
                    self._plan("GPU reset failed: escalate to reboot")
                    kind = "reboot"
                    repair = await self._repair(kind, attempt)
                if not repair.succeeded:
                    return await self._quarantine(f"{kind} failed: {repair.message}", acked)
            if self.quarantine_order is not None:
                return await self._quarantine(self._quarantine_reason(), acked)
            await self._enter(NodeState.VALIDATING, "validate", "ValidationStarted",
                              f"attempt {attempt}: validation Job on all {self.gpus} GPUs")
            check = await self._job("validate", attempt)
            if self.quarantine_order is not None:
                # An operator's order outranks a passing validation.
                return await self._quarantine(self._quarantine_reason(), acked)
            if check.succeeded:
                return await self._finish("healthy", f"validated: {check.message}", acked)
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
        if method != "external":
            await self._enter(NodeState.REPAIRING, kind, "RepairStarted",
                              f"attempt {attempt}/{s.max_repair_attempts}: {kind}")
            return await self._job(kind, attempt)
        await self._enter(NodeState.REPAIRING, "external", "ExternalRepairRequested",
                          f"attempt {attempt}: {kind} handed off; waiting for `gpu-remediate "
                          f"repaired {self.inp.node}`", event_type="Warning")
        self._plan(f"wait for an external {kind} and the `repaired` update")
        if self.inp.dry_run:
            return NodeJobResult(succeeded=True, message="dry-run", job_name="")
        self.repaired_order = None
        try:
            await workflow.wait_condition(
                lambda: self.repaired_order is not None or self.quarantine_order is not None,
                timeout=s.external_timeout, timeout_summary=f"external {kind}")
        except TimeoutError:
            return NodeJobResult(succeeded=False, job_name="",
                                 message=f"no repair reported within {s.external_timeout}")
        if self.repaired_order is None:
            return NodeJobResult(succeeded=True, job_name="", message="quarantine ordered")
        who = self.repaired_order
        return NodeJobResult(succeeded=True, job_name="",
                             message=f"{kind} reported done by {who.operator}: {who.reason}")

    async def _quarantine(self, why: str,
                          acked: dict[str, int] | None = None) -> RemediationResult:
        """Keep the node cordoned and tainted until an operator releases it."""
        while True:
            self._set(NodeState.QUARANTINED, "quarantined")
            await self._release_call("quarantined", why, acked or {})
            self._details(f"quarantined: {why}. Release with `gpu-remediate release "
                          f"{self.inp.node}` after the repair.")
            if self.inp.dry_run:
                return RemediationResult(node=self.inp.node, outcome=NodeState.QUARANTINED,
                                         attempts=self.view.attempt, message=why)
            await workflow.wait_condition(lambda: self.release_order is not None)
            order = self.release_order
            assert order is not None
            self.view.attempt += 1
            # The node stays labelled quarantined while it is validated: quarantined nodes
            # hold no budget slot, and an operator's release must not take one that the
            # detector has not admitted. It is cordoned, so nothing new lands on it.
            await self._enter(NodeState.QUARANTINED, "release-validate", "ReleaseRequested",
                              f"release by {order.operator}: {order.reason}; validating")
            # Patched: remediations quarantined before this change validate as they did.
            left = (await self._clear_for_validation()
                    if workflow.patched("drain-before-release-validation") else "")
            if left:
                check = NodeJobResult(succeeded=False, job_name="", message=left)
            else:
                check = await self._job("validate", self.view.attempt)
            self.release_order = None
            if check.succeeded:
                self.quarantine_order = None
                return await self._finish(
                    "healthy", f"released by {order.operator} and validated", acked or {})
            why = f"release by {order.operator} failed validation: {check.message}"

    # ------------------------------------------------------------ building blocks

    async def _clear_for_validation(self) -> str:
        """Evict what is still on a quarantined node before validating it: a quarantine
        ordered mid-drain (or a failed step) can leave pods, and validation needs every
        GPU. Returns why not, or "" once the node is empty."""
        d = self.inp.settings.drain
        started = workflow.now()
        while True:
            result = await self._call(
                "drain_node",
                DrainInput(node=self.inp.node, settings=d, report_after=d.report_after,
                           dry_run=self.inp.dry_run),
                DrainResult, timeout=timedelta(minutes=10), heartbeat=True,
                summary=f"evict what is left on {self.inp.node} before validation")
            self.view.pods_left = len(result.remaining)
            if result.outcome in ("drained", "planned"):
                return ""
            if workflow.now() - started >= d.deadline:
                return (f"{len(result.remaining)} pods still on the node, eviction blocked by "
                        f"{result.blocking_pdb} for {d.deadline}")
            await workflow.sleep(d.retry_interval, summary="before the next eviction round")

    def _acknowledged_xids(self) -> dict[str, int]:
        """XIDs this remediation handles: the exporter keeps showing the last XID, so
        the detector must not remediate again for the same stale value."""
        return {gpu_key(f): int(f.value) for f in self.inp.verdict.findings
                if f.signal == SIG_XID and f.value}

    async def _job(self, kind: Literal["validate", "gpu-reset", "reboot"],
                   attempt: int) -> NodeJobResult:
        s = self.inp.settings
        spec = {"validate": s.validation, "gpu-reset": s.gpu_reset, "reboot": s.reboot}[kind]
        name = node_job_name(kind, self.inp.node, workflow.info().run_id, attempt)
        gpu_index = None
        if kind == "gpu-reset":
            gpus = sorted({f.gpu for f in self.inp.verdict.findings if f.gpu.isdecimal()})
            gpu_index = gpus[0] if len(gpus) == 1 else None
        self._plan(f"run {kind} Job {name} on {self.inp.node}"
                   + (f" requesting all {self.gpus} GPUs" if kind == "validate" else ""))
        return await self._call(
            "run_node_job",
            NodeJobInput(node=self.inp.node, kind=kind, name=name, namespace=s.job_namespace,
                         job=spec, gpus=self.gpus, gpu_index=gpu_index, dry_run=self.inp.dry_run),
            NodeJobResult, timeout=spec.deadline + timedelta(minutes=5), heartbeat=True,
            summary=f"{kind} job on {self.inp.node}",
        )

    async def _finish(self, outcome: Literal["healthy", "released"], why: str,
                      acked: dict[str, int] | None = None) -> RemediationResult:
        self._set(NodeState.HEALTHY, outcome)
        await self._release_call(outcome, why, acked or {})
        self._details(f"{outcome}: {why}")
        return RemediationResult(node=self.inp.node,
                                 outcome=NodeState.HEALTHY if outcome == "healthy" else outcome,
                                 attempts=self.view.attempt, message=why)

    async def _release_call(self, outcome: Literal["healthy", "quarantined", "released",
                                                   "aborted"],
                            why: str, acked: dict[str, int]) -> None:
        info = workflow.info()
        reasons = {"healthy": "RemediationSucceeded", "quarantined": "NodeQuarantined",
                   "released": "RemediationReleased", "aborted": "RemediationAborted"}
        self._plan({"healthy": "uncordon" if not self.view.previously_cordoned
                    else "leave cordoned (an admin cordoned it before us)",
                    "quarantined": "keep cordoned and tainted: quarantined",
                    "released": "remove taint and label; uncordon if we cordoned",
                    "aborted": "remove taint and label; uncordon if we cordoned"}[outcome])
        await self._node_call(
            "release_node",
            ReleaseInput(
                node=self.inp.node, outcome=outcome,
                uncordon=not self.view.previously_cordoned,
                history=HistoryEntry(started=self.started, finished=workflow.now(),
                                     action=self.action.value, reason=self.view.reason,
                                     outcome=f"{outcome}: {why}"[:300],
                                     workflow_id=info.workflow_id,
                                     by=self.inp.requested_by),
                acknowledged_xids=acked, event_reason=reasons[outcome],
                event_message=f"{outcome}: {why}", dry_run=self.inp.dry_run,
            ),
            type(None), summary=f"{outcome}: release {self.inp.node}",
        )

    async def _abort_cleanup(self) -> None:
        if not self.claimed or self.view.state == NodeState.HEALTHY:
            return
        who = self.abort_note or OperatorCommand(operator="unknown", reason="workflow cancelled")
        self._set(NodeState.HEALTHY, "aborted")
        # The cancellation was delivered once, to the step in progress; activities
        # scheduled from here on run normally.
        await self._release_call("aborted", f"aborted by {who.operator}: {who.reason}", {})

    async def _enter(self, state: NodeState, step: str, event_reason: str, message: str,
                     event_type: Literal["Normal", "Warning"] = "Normal") -> None:
        self._set(state, step)
        self._details(message)
        await self._node_call(
            "set_node_state",
            StateInput(node=self.inp.node, state=state, reason=self.view.reason, step=step,
                       now=workflow.now(), attempt=self.view.attempt, event_reason=event_reason,
                       event_message=message, event_type=event_type, dry_run=self.inp.dry_run),
            type(None), summary=f"{state.value}: {step}",
        )

    def _set(self, state: NodeState, step: str) -> None:
        now = workflow.now()
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

    async def _node_call(self, name: str, arg: Any, result_type: Any, *, summary: str) -> Any:
        return await self._call(name, arg, result_type, timeout=NODE_CALL, heartbeat=False,
                                summary=summary)

    async def _call(self, name: str, arg: Any, result_type: Any, *, timeout: timedelta,
                    heartbeat: bool, summary: str) -> Any:
        try:
            return await workflow.execute_activity(
                name, arg, result_type=result_type, start_to_close_timeout=timeout,
                heartbeat_timeout=self.inp.settings.heartbeat_timeout if heartbeat else None,
                retry_policy=NODE_RETRY,
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=summary[:200],
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == "NotFound" \
                    and f"node {self.inp.node}" in str(cause):
                raise NodeGone() from err
            raise


class _GiveUp(Exception):
    pass


def _cause(err: BaseException) -> str:
    while getattr(err, "cause", None) is not None:
        err = err.cause  # type: ignore[attr-defined]
    return str(err)


def _minutes(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes}m" if minutes else f"{int(delta.total_seconds())}s"
