"""A node cordoned for heat: no drain, its temperature watched (by retried looks, so the
wait holds no worker slot) until it stays cool, or escalated when it stays hot, a fault
appears or a quarantine is ordered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import versions

with workflow.unsafe.imports_passed_through():
    from policy.models import Action, Verdict
    from workflows import activity_refs as act
    from workflows import errors
    from workflows.messages import (
        OperatorCommand,
        RemediationResult,
        ThermalCheckInput,
        ThermalWatchInput,
        ThermalWatchResult,
    )
    from workflows.search_attributes import REMEDIATION_ACTION
    from workflows.transitions import NodeState, Outcome, Step

from workflows.steps.base import R, RemediationBase, _timed_out


class ThermalSteps(RemediationBase):
    async def _thermal(self) -> RemediationResult | None:
        """Cordoned for heat: no drain; back when cool; escalate if it stays hot."""
        t = self.inp.settings.thermal
        if self.hot_since is None:
            self.hot_since = workflow.now()
            self._plan("thermal: cordon only, no drain; watch temperature "
                       f"until cool for {t.hold}")
            if self.inp.dry_run:
                return await self._finish(Outcome.HEALTHY,
                                         "dry-run: would wait for the node to cool")
        hot_since = self.hot_since
        while True:
            elapsed = workflow.now() - hot_since
            left = (t.escalate_after - elapsed) if t.escalate_after else timedelta(hours=1)
            watch_for = max(min(left, timedelta(hours=1)), t.hold + t.poll_interval)
            self._details(f"cordoned for heat since {hot_since:%H:%M:%S}; waiting for "
                          f"{t.hold} below the recovery threshold")
            if versions.patched("thermal-polled-by-retry"):
                result = await self._watch_by_retry(watch_for)
            else:
                result = await self._call(
                    act.watch_thermal,
                    ThermalWatchInput(node=self.inp.node, policy=self.inp.policy, hold=t.hold,
                                      poll_interval=t.poll_interval, give_up_after=watch_for),
                    timeout=watch_for + timedelta(minutes=5),
                    heartbeat=max(self.inp.settings.heartbeat_timeout, t.poll_interval * 3),
                    summary=f"watch {self.inp.node} temperature",
                )
            if self._quarantine_due():
                return None
            if result.outcome == "recovered":
                return await self._finish(Outcome.HEALTHY, f"cooled down: {result.message}")
            if result.outcome == "fault" and result.verdict is not None:
                self._escalate(result.verdict, "a hardware fault appeared while cordoned")
                return None
            if t.escalate_after is not None and workflow.now() - hot_since >= t.escalate_after:
                why = f"still hot after {t.escalate_after}: {result.message}; check cooling"
                self.view.quarantine_policy_reason = why
                if versions.patched("policy-quarantine-awaits-approval"):
                    self.policy_quarantine = why
                else:
                    self.quarantine_order = OperatorCommand(operator="policy", reason=why)
                await self._wait_for_slot()
                await self._enter(NodeState.DRAINING, Step.THERMAL_ESCALATION, "ThermalEscalation",
                                  f"still hot after {t.escalate_after}; draining",
                                  event_type="Warning")
                return None
            await workflow.sleep(t.poll_interval, summary="before watching again")
            await self._continue_as_new_if_due("thermal")

    async def _watch_by_retry(self, watch_for: timedelta) -> ThermalWatchResult:
        """Watch a hot node for up to ``watch_for`` without holding a worker slot: each
        look is a short activity retried at the poll interval until the node's state
        changes (hot to cool, cool to hot, or a fault). Cool for ``hold`` is a look that
        stays "unchanged: cool" until its schedule-to-close timeout: recovered."""
        t = self.inp.settings.thermal
        end = workflow.now() + watch_for
        state: Literal["hot", "cool"] = "hot"
        cool_since = workflow.now()
        last = "hot"
        while True:
            wait = (t.hold - (workflow.now() - cool_since)) if state == "cool" \
                else end - workflow.now()
            if wait <= timedelta(0):
                return ThermalWatchResult(outcome="recovered" if state == "cool" else "hot",
                                          message=last)
            watch = self._call(
                act.check_thermal,
                ThermalCheckInput(node=self.inp.node, policy=self.inp.policy, now=state),
                timeout=timedelta(minutes=1), heartbeat=False,
                retry=RetryPolicy(initial_interval=t.poll_interval, backoff_coefficient=1.0,
                                  maximum_interval=t.poll_interval,
                                  non_retryable_error_types=[*errors.NOT_RETRIED]),
                schedule_to_close=wait, summary=f"watch {self.inp.node} temperature")
            try:
                if versions.patched("quarantine-interrupts-the-heat-watch"):
                    look = await self._unless_quarantined(watch)
                    if look is None:
                        return ThermalWatchResult(outcome="hot", message="quarantine ordered")
                else:
                    look = await watch
            except ActivityError as err:
                if not _timed_out(err):
                    raise
                if state == "cool":
                    return ThermalWatchResult(outcome="recovered",
                                              message=f"below the recovery threshold for "
                                                      f"{t.hold}")
                return ThermalWatchResult(outcome="hot", message=last)
            if look.outcome == "fault":
                return ThermalWatchResult(outcome="fault", verdict=look.verdict,
                                          message=look.message)
            state, last = look.outcome, look.message
            cool_since = workflow.now()
            self._details(f"cordoned for heat: {state} ({look.message})")

    async def _unless_quarantined(self, call: Awaitable[R]) -> R | None:
        """``call``'s result, or None as soon as a quarantine is ordered (the call is then
        cancelled): an operator's order does not wait for a watch that may take an hour."""
        task = asyncio.ensure_future(call)
        try:
            await workflow.wait_condition(lambda: task.done() or self._quarantine_due())
        except asyncio.CancelledError:
            task.cancel()  # an abort: the look goes with it
            raise
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ActivityError):
            await task
        return None

    def _escalate(self, verdict: Verdict, why: str) -> None:
        self.action = verdict.action
        self.view.action = verdict.action
        self.view.reason = f"{verdict.summary} ({why})"
        if verdict.action == Action.QUARANTINE:
            self.view.quarantine_policy_reason = self.view.reason
        workflow.upsert_search_attributes([REMEDIATION_ACTION.value_set(self.action.value)])
