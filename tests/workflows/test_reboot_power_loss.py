"""A node that loses power in the middle of its reboot, on the time-skipping server.

Since Kubernetes 1.31 the reboot Job of such a node never ends: its pod never terminates,
so the Job stays running (or at FailureTarget). The node's return is timed from the reboot
request whatever the Job does: quarantined NodeDidNotReturn within reboot_return_timeout +
one poll, whatever job_timeout is. A reboot whose image cannot be pulled never started,
and says so (not NodeDidNotReturn).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from tests.workflows.fakes import FakeCluster, xid_verdict
from tests.workflows.test_remediation import end_in_hold, running
from workflows import errors
from workflows.messages import NodeEventInput, NodeJobInput, NodeJobResult, RemediationInput
from workflows.remediation import RemediationWorkflow
from workflows.settings import RemediationSettings
from workflows.transitions import NodeState


@dataclass
class PowerLossCluster(FakeCluster):
    """The reboot Job's pod sits on a node without power: every look says running (or,
    ``reboot_pull_fails``, its image cannot be pulled); times are workflow times."""

    reboot_pull_fails: bool = False
    reboot_requested: list[datetime] = field(default_factory=list)
    event_times: list[tuple[str, datetime]] = field(default_factory=list)

    def activities(self) -> list[Any]:
        base = {getattr(f, "__temporal_activity_definition").name: f
                for f in super().activities()}
        poll, record = base["poll_node_job"], base["record_event"]

        @activity.defn(name="poll_node_job")
        def poll_node_job(inp: NodeJobInput) -> NodeJobResult:
            if inp.kind != "reboot" or inp.dry_run:
                result: NodeJobResult = poll(inp)
                return result
            with self.lock:
                if not self.reboot_requested:
                    self.reboot_requested.append(activity.info().scheduled_time)
                    self.calls.append(("run_node_job", inp))
            if self.reboot_pull_fails:
                raise ApplicationError(
                    f"reboot Job {inp.name} never started: pod x: image "
                    "ghcr.io/gpu-remediate/gpu-remediate:0.1.0 not pulled (ImagePullBackOff)",
                    type=errors.JOB_NOT_STARTED, non_retryable=True)
            raise ApplicationError(f"reboot Job {inp.name} running (1 pod(s) active)",
                                   type=errors.JOB_RUNNING,
                                   category=ApplicationErrorCategory.BENIGN)

        @activity.defn(name="record_event")
        def record_event(inp: NodeEventInput) -> None:
            with self.lock:
                self.event_times.append((inp.reason, activity.info().scheduled_time))
            record(inp)

        base["poll_node_job"], base["record_event"] = poll_node_job, record_event
        return list(base.values())


@pytest.mark.parametrize("job_timeout", [timedelta(hours=2), timedelta(minutes=5)])
async def test_power_loss_mid_reboot_is_quarantined_within_the_return_timeout(
        time_skipping_env, job_timeout: timedelta) -> None:
    node = f"dark-{int(job_timeout.total_seconds())}"
    cluster = PowerLossCluster()
    cluster.node(node).returns_after = 10**6
    settings = RemediationSettings(reboot_return_timeout=timedelta(minutes=20),
                                   job_timeout=job_timeout)
    async with running(time_skipping_env.client, cluster) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, RemediationInput(node=node, verdict=xid_verdict(node),
                                                      settings=settings),
            id=f"remediation-{node}-{uuid.uuid4()}", task_queue=queue)
        for _ in range(400):
            await time_skipping_env.sleep(timedelta(seconds=30))
            if cluster.node(node).state == NodeState.QUARANTINED:
                break
        await end_in_hold(handle)
    assert cluster.node(node).state == NodeState.QUARANTINED
    assert cluster.jobs_run() == ["reboot"]
    gone = [t for reason, t in cluster.event_times if reason == "NodeDidNotReturn"]
    assert gone and cluster.reboot_requested
    took = gone[0] - cluster.reboot_requested[0]
    bound = settings.reboot_return_timeout + settings.node_poll_interval
    print(f"power lost mid-reboot, job_timeout {job_timeout}: NodeDidNotReturn "
          f"{took} after the reboot request (bound {bound})")
    # Not before its time either: the last look falls within one poll of the timeout.
    assert settings.reboot_return_timeout - settings.node_poll_interval <= took
    assert took <= bound + timedelta(seconds=2), took


async def test_a_reboot_whose_image_cannot_be_pulled_says_so(time_skipping_env) -> None:
    cluster = PowerLossCluster(reboot_pull_fails=True)
    async with running(time_skipping_env.client, cluster) as queue:
        handle = await time_skipping_env.client.start_workflow(
            RemediationWorkflow.run, RemediationInput(node="offline", verdict=xid_verdict(
                "offline"), settings=RemediationSettings(max_repair_attempts=1)),
            id=f"remediation-offline-{uuid.uuid4()}", task_queue=queue)
        for _ in range(100):
            await time_skipping_env.sleep(timedelta(seconds=30))
            if cluster.node("offline").state == NodeState.QUARANTINED:
                break
        await end_in_hold(handle)
    reasons = [reason for reason, _ in cluster.event_times]
    assert "RebootNotStarted" in reasons and "NodeDidNotReturn" not in reasons, reasons
    assert not [c for c in cluster.calls if c[0] == "check_node_returned"]
    assert "ImagePullBackOff" in cluster.node("offline").history[-1].outcome


async def test_a_node_that_did_not_return_is_marked_out_of_service(time_skipping_env) -> None:
    """With remediation.drain.out_of_service_taint, a node that did not come back gets
    node.kubernetes.io/out-of-service (its pods and volumes are released elsewhere) when
    it is quarantined; without it, nothing is marked."""
    for taint in (True, False):
        node = f"gone-{taint}".lower()
        cluster = PowerLossCluster()
        cluster.node(node).returns_after = 10**6
        settings = RemediationSettings(reboot_return_timeout=timedelta(minutes=5),
                                       max_repair_attempts=1)
        settings.drain.out_of_service_taint = taint
        async with running(time_skipping_env.client, cluster) as queue:
            handle = await time_skipping_env.client.start_workflow(
                RemediationWorkflow.run, RemediationInput(
                    node=node, verdict=xid_verdict(node), settings=settings),
                id=f"remediation-{node}-{uuid.uuid4()}", task_queue=queue)
            for _ in range(200):
                await time_skipping_env.sleep(timedelta(seconds=30))
                if cluster.node(node).state == NodeState.QUARANTINED:
                    break
            await end_in_hold(handle)
        marks = [c[1].on for c in cluster.calls if c[0] == "mark_out_of_service"]
        assert marks == ([True] if taint else []), (taint, marks)
