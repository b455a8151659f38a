"""The way in: the lease the detector granted (confirmed before every disruptive step), the
claim of the node (cordon, taint, label) and a claim that cannot complete in time, the
approval gate of supervised mode, and the slots asked of the detector: the drain slot a
heat cordon must wait for, the node slot a GPU-scoped lease waits for before the
whole-node path.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.ids import DETECTOR_WORKFLOW_ID, REQUEST_SLOT_SIGNAL
    from workflows.leases import LeaseCheck
    from workflows.messages import ClaimInput, ClaimResult, RemediationResult, SlotRequest
    from workflows.transitions import NodeState, Outcome, Step

from workflows.steps.base import ABORT_READ_RETRY, NODE_CALL, RemediationBase, _cause, _timed_out

# A GPU-scoped lease (workflows/leases.py) waits for a node slot before the whole-node path.
GPU_LEASE_PATCH = "gpu-lease-waits-for-the-node"
# A heat cordon waiting for a drain slot asks the detector again this often.
SLOT_ASK_AGAIN = timedelta(minutes=2)
# Acts only under a live lease from the detector (runs recorded before leases: as they ran).
LEASE_PATCH = "remediation-holds-a-lease"
# A confirmation of the lease is one short call, retried while the detector cannot answer.
LEASE_CALL = timedelta(seconds=30)
LEASE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                          maximum_interval=timedelta(seconds=10),
                          non_retryable_error_types=[*errors.NOT_RETRIED])


class NoLease(Exception):
    """The detector holds no live lease for this remediation: it takes no disruptive step."""


class ClaimFailed(Exception):
    """The claim could not complete within ``claim_timeout``: ended without the node."""


class ClaimSteps(RemediationBase):
    def _gated(self) -> bool:
        """Acts only under a live lease: decided once per run (the first look records the
        patch marker), so a run recorded before leases replays as it ran."""
        if self._lease_gate is None:
            self._lease_gate = versions.patched(LEASE_PATCH)
        return self._lease_gate

    async def _confirm_lease(self, step: str) -> None:
        """Before a disruptive step (claim, drain, repair, validation Job): the detector
        must still hold this remediation's lease. Asked again while the detector cannot
        answer: before the claim for up to ``claim_timeout`` (no answer is no lease, and
        the node is left untouched); after it, for as long as it takes (the node stays
        held, and a detector started again adopts this remediation)."""
        if not self._gated() or self.inp.dry_run:
            return
        if self.inp.verdict.node != self.inp.node:
            raise NoLease(f"the verdict names {self.inp.verdict.node!r}, not {self.inp.node!r}")
        wait = None if self.claim_started else self.inp.settings.claim_timeout
        try:
            answer = await self._call(
                act.confirm_lease,
                LeaseCheck(node=self.inp.node, token=self.inp.lease_token,
                           workflow_id=workflow.info().workflow_id, step=step[:100]),
                timeout=LEASE_CALL, heartbeat=False, retry=LEASE_RETRY,
                schedule_to_close=wait, summary=f"confirm the lease before {step}")
        except ActivityError as err:
            if not _timed_out(err):
                raise
            raise NoLease(f"the detector did not confirm the lease within {wait}: "
                          f"{_cause(err)}") from err
        if not answer.live:
            raise NoLease(answer.why)

    async def _no_lease(self, refused: NoLease) -> RemediationResult:
        """No live lease. Before the claim: end without touching the node, and say why.
        After it (a lease lost mid-way, which only an operator's release-orphan or a stray
        detector can cause): hold the node for a human, the fail-closed way."""
        why = f"no live lease from the detector: {refused}"
        workflow.logger.warning("%s: %s", self.inp.node, why)
        if self.claim_started:
            await self._restore_operands(best_effort=True)
            self.release_order = None
            return await self._quarantine(why, self._acknowledged_xids())
        self._set(NodeState.HEALTHY, Step.RELEASED)
        self._details(f"not started: {why}")
        await self._tell("LeaseRefused", f"{workflow.info().workflow_id} took no step: {why}")
        self.released = True
        return RemediationResult(node=self.inp.node, outcome=Outcome.RELEASED, attempts=0,
                                 message=why)

    async def _claim(self, state: NodeState) -> ClaimResult:
        info = workflow.info()
        await self._confirm_lease("the claim")
        self.claim_started = True
        arg = ClaimInput(node=self.inp.node, state=state, reason=self.view.reason,
                         action=self.action, workflow_id=info.workflow_id, run_id=info.run_id,
                         now=workflow.now(), dry_run=self.inp.dry_run)
        summary = f"cordon and taint {self.inp.node}"
        if not self._gated():
            claim = await self._node_call(act.claim_node, arg, summary=summary)
        else:
            timeout = self.inp.settings.claim_timeout
            try:
                claim = await self._call(act.claim_node, arg, timeout=NODE_CALL,
                                         heartbeat=False, summary=summary,
                                         schedule_to_close=timeout)
            except ActivityError as err:
                if not _timed_out(err):
                    raise
                await self._claim_failed(f"the claim did not complete within {timeout}: "
                                         f"{_cause(err)}")
        self.claimed = True
        self.view.previously_cordoned = claim.previously_cordoned
        self._set(state, Step.CLAIMED)
        self._plan(f"cordon {self.inp.node} and add taint; label {state.value}"
                   + (" (already cordoned by someone else: will stay cordoned)"
                      if claim.previously_cordoned else ""))
        self.gpus = claim.gpus
        self.boot_id, self.uid = claim.boot_id, claim.uid
        return claim

    async def _claim_failed(self, why: str) -> None:
        """The API would not take the claim in time (a brownout, an RBAC change, a slow
        webhook). A late attempt may still have landed: take back whatever it wrote (only
        if the node's annotation names this run), record why, and end. If even that cannot
        be done the run fails, and its lease stays as an orphan's: fail closed."""
        workflow.metric_meter().create_counter(
            "gpu_remediate_claims_failed",
            "Remediations ended because their claim did not complete in time.").add(1)
        self._set(NodeState.HEALTHY, Step.RELEASED)
        self._details(why)
        await self._release_call(Outcome.RELEASED, why, {}, claim_unconfirmed=True,
                                 retry=ABORT_READ_RETRY)
        self.released = True
        await self._tell("ClaimFailed", f"{self.inp.node}: {why}; the lease is freed and the "
                                        "detector may admit it again")
        raise ClaimFailed(why)

    async def _await_approval(self, until: datetime | None = None) -> bool:
        """Wait for an operator's decision until the approval window ends (``until``, for a
        wait continued from an earlier run). A storm of refused signals grows the history
        while nothing is decided: past history_events_per_run the wait continues in a
        new run, with the same window."""
        s = self.inp.settings.approval
        if self.inp.dry_run:
            self._plan(f"wait for an operator's approval (up to {s.timeout}, then "
                       f"{s.on_timeout}); the plan continues as if approved")
            return True
        self._details(
            f"waiting for an operator to approve {self.action.value} (timeout {s.timeout}, "
            f"then {s.on_timeout}). To decide: `gpu-remediate approve {self.inp.node} -r "
            f"REASON` (or `reject`), or here, Send a Signal or Send an Update named `approve` "
            'or `reject` with the payload `{"operator": "you", "reason": "why"}`')
        bounded = until is not None or versions.patched("approval-wait-bounded")
        limit = self.inp.settings.history_events_per_run

        def decided() -> bool:
            return self.decision is not None or self.quarantine_order is not None

        def outgrown() -> bool:
            return bounded and workflow.info().get_current_history_length() >= limit

        end = until or workflow.now() + s.timeout
        try:
            while True:
                await workflow.wait_condition(
                    lambda: decided() or outgrown(),
                    timeout=max(end - workflow.now(), timedelta(0)) if bounded else s.timeout,
                    timeout_summary="approval window")
                if decided():
                    break
                await self._continue_as_new_if_due("approval", now=True, approval_until=end)
        except TimeoutError:
            # A decision that arrived in the same moment as the timeout stands.
            if self.decision is None:
                self.decision = "approve" if s.on_timeout == "approve" else "reject"
        if self.quarantine_order is not None:
            return True
        if self.decision == "approve":
            who = self.decided_by.operator if self.decided_by else "approval timeout"
            await self._enter(NodeState.DRAINING, Step.APPROVED, "RemediationApproved",
                              f"approved by {who}")
            return True
        return False

    async def _wait_for_slot(self) -> None:
        """A node cordoned for heat outside the drain budget must now be drained (it stayed
        hot, a fault appeared, an operator ordered a quarantine): it stays cordoned until
        the detector grants a slot, asking again every ``SLOT_ASK_AGAIN`` (a detector
        restarted meanwhile has not heard). Nothing drains past the budget."""
        if self.slot_granted or self.inp.dry_run or \
                not versions.patched("heat-cordon-drains-in-a-slot"):
            return
        self._set(NodeState.CORDONED, Step.WAITING_FOR_A_DRAIN_SLOT)
        self._plan("wait for a drain slot from the detector (the heat cordon took none)")
        await self._ask_for_slot("cordoned")

    async def _ask_for_slot(self, held: str) -> None:
        """Ask the detector (with the lease token) until it grants a slot."""
        parent = workflow.info().parent
        detector = parent.workflow_id if parent else DETECTOR_WORKFLOW_ID
        while not self.slot_granted:
            why = self.view.reason
            try:
                await workflow.get_external_workflow_handle(detector).signal(
                    REQUEST_SLOT_SIGNAL, SlotRequest(node=self.inp.node, reason=why[:500],
                                                     token=self.inp.lease_token))
                self._details(f"must be drained ({why}); {held}, waiting for a drain slot "
                              f"from {detector}")
            except FailureError as err:
                self._details(f"must be drained ({why}); {held}; {detector} cannot be asked "
                              f"for a drain slot ({err}): asking again in {SLOT_ASK_AGAIN}")
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self.slot_granted, timeout=SLOT_ASK_AGAIN,
                                              timeout_summary="drain slot")

    async def _wait_for_the_node(self) -> None:
        """A GPU-scoped lease (one GPU, no node slot) on the whole-node path (the GPU could
        not be isolated): nothing touches the node until the detector grants it a node
        slot through every budget, asked with the lease token."""
        if self.inp.lease_scope != "gpu" or self.slot_granted or self.inp.dry_run or \
                not versions.patched(GPU_LEASE_PATCH):
            return
        self._set(NodeState.HEALTHY, Step.WAITING_FOR_A_DRAIN_SLOT)
        self._plan("wait for a node slot from the detector (the lease held one GPU)")
        await self._ask_for_slot("in service and untouched")
        self.view.lease_scope = "node"
        self._details(f"node slot granted: the whole node is remediated ({self.view.reason})")
