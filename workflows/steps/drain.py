"""The drain: evictions through the Eviction API in rounds that report back (less often as
a drain stays blocked), the blocking PDB shown, and the drain deadline's policy (wait,
force or give the node back) applied; a quarantine ordered mid-drain stops it.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from policy.models import Action
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.messages import DrainInput
    from workflows.transitions import NodeState, Step

from workflows.steps.base import RemediationBase, _minutes

# A drain round that keeps failing (not "blocked": failing) ends after this many tries,
# in quarantine with the cause, instead of retrying for ever.
DRAIN_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=40,
    non_retryable_error_types=[*errors.NOT_RETRIED, errors.NODE_GONE],
)


class _GiveUp(Exception):
    pass


class DrainSteps(RemediationBase):
    async def _drain(self) -> None:
        d = self.inp.settings.drain
        if self.drain_started is None:
            await self._wait_for_slot()
            await self._confirm_lease("the drain")
            if self.view.state != NodeState.DRAINING:
                await self._enter(NodeState.DRAINING, Step.DRAIN, "DrainStarted",
                                  f"draining {self.inp.node}")
            else:
                # Claim or approval already wrote Draining to the node: only the view moves on.
                self._set(NodeState.DRAINING, Step.DRAIN)
            self.drain_started = workflow.now()
        started = self.drain_started
        while True:
            report_after = self.report_after or d.report_after
            result = await self._call(
                act.drain_node,
                DrainInput(node=self.inp.node, settings=d, force=self.drain_force,
                           report_after=report_after, dry_run=self.inp.dry_run, uid=self.uid),
                timeout=max(timedelta(minutes=10), report_after + timedelta(minutes=5)),
                heartbeat=True, retry=DRAIN_RETRY,
                summary=("force-delete" if self.drain_force else "evict")
                + f" pods on {self.inp.node}",
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
            held = result.left_summary()
            self._details(f"evicting {len(result.remaining)} pods; {held}; draining for "
                          f"{_minutes(workflow.now() - started)}")
            if self._quarantine_due() and self.action != Action.QUARANTINE:
                # An order to quarantine does not need an empty node: stop fighting the PDB.
                return
            if workflow.now() - started >= d.deadline:
                if d.deadline_policy == "force" and not self.drain_force:
                    await self._enter(NodeState.DRAINING, Step.DRAIN_FORCE, "DrainForced",
                                      f"drain deadline {d.deadline} passed; deleting "
                                      f"{len(result.remaining)} pods with their grace period",
                                      event_type="Warning")
                    self.drain_force = True
                elif d.deadline_policy == "release":
                    raise _GiveUp(f"drain deadline {d.deadline} passed with "
                                  f"{len(result.remaining)} pods left ({held}); released "
                                  "the node")
                elif d.deadline_policy == "wait" and self.view.step != Step.DRAIN_OVERDUE:
                    await self._enter(NodeState.DRAINING, Step.DRAIN_OVERDUE, "DrainOverdue",
                                      f"drain deadline {d.deadline} passed with "
                                      f"{len(result.remaining)} pods left ({held}); waiting",
                                      event_type="Warning")
            # Reports back off (report_after doubling up to report_max): the activity keeps
            # evicting every retry_interval in between, so a drain blocked for a week costs
            # a few thousand history events, not a hundred thousand.
            nxt = min(report_after * 2, max(d.report_max, d.report_after))
            to_deadline = d.deadline - (workflow.now() - started)
            if to_deadline > timedelta(0):
                # Never report so late that the deadline's policy starts late.
                nxt = max(d.report_after, min(nxt, to_deadline))
            self.report_after = nxt
            # The activity already waited before reporting; this pause only guards
            # against a hot loop if it ever reports at once.
            await workflow.sleep(d.retry_interval, summary="before the next eviction round")
            await self._continue_as_new_if_due("drain")
