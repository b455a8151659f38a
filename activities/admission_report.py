"""The detector's admission report: its figures as metrics, and the Events on the nodes it
concerns (``CircuitBreakerOpen`` on those that tripped the breaker, ``RemediationDeferred``
on those that wait). ``AdmissionReporting`` is a part of ``FleetActivities``
(activities/fleet.py), whose notice book it shares with the observation.
"""

from __future__ import annotations

import logging
import time

from kubernetes import client
from temporalio import activity

from activities import metrics
from activities.notices import (
    CIRCUIT_BREAKER_OPEN,
    REMEDIATION_DEFERRED,
    Notice,
    NoticeBook,
    breaker_notices,
    deferred_notices,
)
from activities.notices import send as send_notices
from workflows.messages import AdmissionReport, DetectorView

log = logging.getLogger(__name__)


class AdmissionReporting:
    """FleetActivities' admission report."""

    core: client.CoreV1Api
    notices: NoticeBook

    @activity.defn(name="report_admission")
    async def report_admission(self, report: AdmissionReport) -> None:
        """Publish the detector's admission figures, and a ``RemediationDeferred`` Event on
        each node that waits (rate-limited: once per node and reason, again after
        ``NOTICE_REPEAT``), as the original tool did for a node waiting for the budget."""
        report_admission(report)
        # CircuitBreakerOpen on each node that tripped the breaker, once per trip: forgotten
        # when it closes, so the next trip is told again.
        await self._tell(CIRCUIT_BREAKER_OPEN, breaker_notices(
            report.breaker_nodes if report.breaker_open else [], report.breaker_reason))
        try:
            waiting = await self._waiting_nodes(report)
        except Exception as err:  # an Event is never worth failing the report
            log.warning("could not read the waiting nodes for RemediationDeferred: %s", err)
            return
        await self._tell(REMEDIATION_DEFERRED, deferred_notices(waiting))

    async def _tell(self, reason: str, notices: list[Notice]) -> None:
        """Announce the report's notices of one ``reason``; a node that no longer has it is
        forgotten, so its return is news. Errors are logged, never raised."""
        self.notices.settle(reason, [n.node for n in notices], self.notices.nodes(reason))
        try:
            sent = await send_notices(self.core, self.notices, notices, time.time())
        except Exception as err:  # an Event is never worth failing the report
            log.warning("could not record %s Events: %s", reason, err)
            return
        for n in sent:
            metrics.NODE_EVENTS.labels(n.reason).inc()

    async def _waiting_nodes(self, report: AdmissionReport) -> list[str]:
        """The detector's waiting list (``"node (action: why)"``), asked of the detector that
        runs this activity: the report carries only the count.

        The detector sends a report when its figures change, so a node is seen waiting when
        the count of waiting nodes (or the budget in use) changes, which is when it starts
        to wait. Once the report carries the names, this query goes.
        """
        if report.waiting == 0:
            return []
        detector = activity.info().workflow_id
        if detector is None:
            return []
        view = await activity.client().get_workflow_handle(detector).query(
            "view", result_type=DetectorView)
        return list(view.waiting)


def _report_gpus(report: AdmissionReport) -> None:
    """GPUs out and GPU budgets per level: only the fleet and the domains the report names
    are series (those with GPUs or nodes out), so a domain back in service goes."""
    if report.gpus is None:
        return  # a detector run from before GPU counts: leave them unset
    metrics.GPUS_OUT.clear()
    metrics.GPU_BUDGET.clear()
    metrics.ISOLATED_GPUS.set(report.gpus.isolated)
    metrics.GPUS_OUT.labels("fleet", "").set(report.gpus.out_of_service)
    if report.gpus.budget is not None:
        metrics.GPU_BUDGET.labels("fleet", "").set(report.gpus.budget)
    for pool, used in report.gpus.pools.items():
        metrics.GPUS_OUT.labels("pool", pool or "(none)").set(used)
        if pool in report.gpus.pool_budgets:
            metrics.GPU_BUDGET.labels("pool", pool or "(none)").set(
                report.gpus.pool_budgets[pool])
    for u in report.domains:
        domain = u.domain or "unlabelled"
        metrics.GPUS_OUT.labels(u.label, domain).set(u.gpus_in_use)
        if u.gpu_budget is not None:
            metrics.GPU_BUDGET.labels(u.label, domain).set(u.gpu_budget)


@activity.defn
def report_admission(report: AdmissionReport) -> None:
    """Publish the detector's admission figures as metrics (workflows never touch metrics)."""
    metrics.BUDGET.set(report.budget)
    metrics.BUDGET_IN_USE.set(report.in_use)
    metrics.WAITING.set(report.waiting)
    metrics.BREAKER_OPEN.set(1 if report.breaker_open else 0)
    metrics.PAUSED.set(1 if report.paused else 0)
    # Only open incidents are series: a closed one's series goes, so the alert clears.
    metrics.DOMAIN_INCIDENTS.clear()
    metrics.DOMAIN_INCIDENT_NODES.clear()
    for key in report.incidents:
        label, _, domain = key.partition("=")
        metrics.DOMAIN_INCIDENTS.labels(label, domain or "unlabelled").set(1)
        metrics.DOMAIN_INCIDENT_NODES.labels(label, domain or "unlabelled").set(
            len(report.incident_nodes.get(key, [])))
    _report_gpus(report)
    if report.breaker_open:
        log.warning("circuit breaker open: %s", report.breaker_reason)
