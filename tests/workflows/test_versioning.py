"""Worker Deployment Versioning on the real dev server: the detector is pinned to the version
it started on and moves to the deployment's current version at its continue-as-new;
remediations auto-upgrade."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import timedelta

from temporalio.api.enums.v1 import VersioningBehavior as WireBehavior
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.workflows.fakes import FakeCluster, until
from worker.config import WorkerSettings
from worker.service.run import deployment_config, detector_workflow
from workflows.detector import DetectorWorkflow
from workflows.messages import DetectorInput, DetectorState
from workflows.remediation import RemediationWorkflow
from workflows.settings import DetectorSettings


@asynccontextmanager
async def versioned_worker(client: Client, queue: str, deployment: str, build: str,
                           cluster: FakeCluster) -> AsyncIterator[None]:
    """A worker as the service builds one for this deployment version."""
    cfg = deployment_config(WorkerSettings(deployment_name=deployment, build_id=build))
    assert cfg is not None
    with ThreadPoolExecutor(8) as pool:
        async with Worker(client, task_queue=queue,
                          workflows=[RemediationWorkflow, detector_workflow(cfg)],
                          activities=cluster.activities(), activity_executor=pool,
                          deployment_config=cfg):
            yield


async def make_current(client: Client, deployment: str, build: str) -> None:
    """Route new and auto-upgrade work to this version (once its worker has polled)."""
    async def done() -> bool:
        try:
            await client.workflow_service.set_worker_deployment_current_version(
                SetWorkerDeploymentCurrentVersionRequest(
                    namespace=client.namespace, deployment_name=deployment,
                    build_id=build, identity="test"))
            return True
        except RPCError:
            return False
    await until(done, 30, f"{deployment}.{build} current")


async def versioning(handle: WorkflowHandle) -> tuple[str, str, str]:
    """(run ID, behavior, build ID) of the workflow's current run."""
    desc = await handle.describe()
    info = desc.raw_description.workflow_execution_info.versioning_info
    return (desc.run_id or "", WireBehavior.Name(info.behavior),
            info.deployment_version.build_id)


async def test_the_detector_stays_on_its_version_until_it_continues_as_new(
        local_env: WorkflowEnvironment) -> None:
    client = local_env.client
    queue, deployment = f"tq-{uuid.uuid4()}", f"gpu-remediate-{uuid.uuid4().hex[:8]}"
    cluster = FakeCluster()
    settings = DetectorSettings(interval=timedelta(milliseconds=300), ticks_per_run=20)
    async with versioned_worker(client, queue, deployment, "1", cluster):
        await make_current(client, deployment, "1")
        detector = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings, state=DetectorState()),
            id=f"detector-{uuid.uuid4()}", task_queue=queue)
        try:
            async def on(build: str, behavior: str = "VERSIONING_BEHAVIOR_PINNED") -> bool:
                _, b, v = await versioning(detector)
                return (b, v) == (behavior, build)
            await until(lambda: on("1"), 20, "the detector pinned to version 1")
            first_run = (await versioning(detector))[0]
            async with versioned_worker(client, queue, deployment, "2", cluster):
                await make_current(client, deployment, "2")
                # Pinned: its run keeps running on version 1 while 2 is current.
                await asyncio.sleep(2)
                run, behavior, build = await versioning(detector)
                assert (run, behavior, build) == (first_run, "VERSIONING_BEHAVIOR_PINNED", "1")
                # Its continue-as-new starts the next run on the current version, pinned.
                await until(lambda: on("2"), 40, "the next run pinned to version 2")
                assert (await versioning(detector))[0] != first_run
        finally:
            await detector.terminate("test over")
