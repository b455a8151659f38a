"""The worker process: Temporal worker, metrics and health endpoints, graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from prometheus_client import start_http_server
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.common import VersioningBehavior
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError
from temporalio.worker import Worker, WorkerDeploymentConfig, WorkerDeploymentVersion

from activities.prerequisites import check_runtime_classes, missing_prerequisites
from worker.config import ConfigError, Settings, TemporalSettings, WorkerSettings
from worker.service.health import Health
from worker.service.reports import serve_reports
from worker.service.wiring import TICK_ACTIVITIES, kube_client, worker_activities
from worker.temporal_client import connect
from worker.version import code_build_id
from workflows.detector import DetectorWorkflow, PinnedDetectorWorkflow
from workflows.ids import observe_task_queue
from workflows.remediation import RemediationWorkflow

log = logging.getLogger("gpu_remediate.worker")


NOT_POLLING_WARN_AFTER = 10.0
NOT_POLLING_WARN_EVERY = 30.0


NAMESPACE_POLL_SECONDS = 1.0


class _NotPollingYet:
    """Says why the worker does not poll yet: first after NOT_POLLING_WARN_AFTER seconds,
    then every NOT_POLLING_WARN_EVERY (the same line while it waits for the namespace and
    while the SDK's own start check retries)."""

    def __init__(self, settings: Settings) -> None:
        self.t = settings.temporal
        self.loop = asyncio.get_running_loop()
        self.start, self.warn_at = self.loop.time(), NOT_POLLING_WARN_AFTER

    def due(self) -> bool:
        if self.loop.time() - self.start < self.warn_at:
            return False
        self.warn_at += NOT_POLLING_WARN_EVERY
        return True

    def say(self, problem: str) -> None:
        log.warning("not polling yet after %.0fs: Temporal at %s cannot serve namespace %s "
                    "(%s); retrying, /readyz answers 503 until it can",
                    self.loop.time() - self.start, self.t.address, self.t.namespace, problem)


async def _wait_for_namespace(client: Client, settings: Settings) -> None:
    """Until the server can serve the namespace (its database may be down, the namespace
    missing), say why now and then and ask again. The SDK's own check when a worker starts
    gives up after a few retries, and a worker whose check failed never polls: it is built
    only once the namespace answers."""
    warner = _NotPollingYet(settings)
    while (problem := await _namespace_problem(client, settings.temporal)) != NAMESPACE_ANSWERS:
        if warner.due():
            warner.say(problem)
        await asyncio.sleep(NAMESPACE_POLL_SECONDS)


async def _report_start(worker: Worker, client: Client, settings: Settings) -> None:
    """Say when the worker polls, and until then, why it does not: the server answers but
    cannot serve the namespace (its database is down, the namespace is missing). The SDK
    retries by itself; /readyz answers 503 meanwhile."""
    t = settings.temporal
    warner = _NotPollingYet(settings)
    while not worker.is_running:
        await asyncio.sleep(0.25)
        if warner.due():
            warner.say(await _namespace_problem(client, t))
    log.info("worker polling task queue %s on %s (namespace %s)", t.task_queue, t.address,
             t.namespace)


async def _report_prerequisites(settings: Settings) -> list[str]:
    """Say, one line each, which GPU Operator operands a GPU reset would pause have no
    DaemonSet (activities/prerequisites.py): a warning, never a reason not to start."""
    gpu_operator = settings.remediation.gpu_operator
    try:
        api = kube_client(settings)
        try:
            missing = await asyncio.to_thread(missing_prerequisites, api, gpu_operator)
        finally:
            api.close()
    except Exception as err:  # a bad kubeconfig shows in every activity; here, said once
        missing = [f"GPU Operator operands not checked: {type(err).__name__}: "
                   f"{str(err)[:200]}"]
    for line in missing:
        log.warning("%s", line)
    if not missing and gpu_operator.operands:
        log.info("GPU Operator operands found in namespace %s: %s", gpu_operator.namespace,
                 ", ".join(gpu_operator.operands))
    return missing


RUNTIME_CLASS_CHECK_SECONDS = 15.0
"""How long the start waits for the RuntimeClass check: an API server in a brownout
delays the worker by this much at most (then a warning, and it starts)."""


async def check_start_runtime_classes(settings: Settings) -> list[str]:
    """Before anything starts: a RuntimeClass a Job template names and the cluster lacks
    is a ConfigError naming the field (activities/prerequisites.py); where they cannot be
    read, a warning each, returned, and the worker starts."""
    try:
        api = kube_client(settings)
        try:
            found = await asyncio.wait_for(
                asyncio.to_thread(check_runtime_classes, api, settings.jobs),
                RUNTIME_CLASS_CHECK_SECONDS)
        finally:
            api.close()
    except TimeoutError:
        unchecked = [f"RuntimeClasses not checked: the Kubernetes API did not answer within "
                     f"{RUNTIME_CLASS_CHECK_SECONDS:.0f}s"]
    except Exception as err:  # a bad kubeconfig shows in every activity; here, said once
        unchecked = [f"RuntimeClasses not checked: {type(err).__name__}: {str(err)[:200]}"]
    else:
        if found.missing:
            raise ConfigError(f"{settings.source or 'configuration'}: "
                              + "; ".join(found.missing))
        unchecked = found.unchecked
    for line in unchecked:
        log.warning("%s", line)
    return unchecked


async def _namespace_problem(client: Client, t: TemporalSettings) -> str:
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=t.namespace), retry=False,
            timeout=timedelta(seconds=5))
    except RPCError as err:
        return f"{err.status.name}: {err.message}"
    except Exception as err:  # whatever it is, the warning is still written
        return f"{type(err).__name__}: {err}"
    return NAMESPACE_ANSWERS


NAMESPACE_ANSWERS = "the namespace answers now"


async def _run_both(worker: Worker, observer: Worker) -> None:
    """Both workers until either stops (the other is then shut down too)."""
    tasks = [asyncio.create_task(worker.run()), asyncio.create_task(observer.run())]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for w in (worker, observer):
        if w.is_running:
            await w.shutdown()
    for task, w in zip(tasks, (worker, observer), strict=True):
        if task in pending and not w.is_running:
            task.cancel()  # still in the SDK's start check: it would never end by itself
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        t.result()


def deployment_config(w: WorkerSettings) -> WorkerDeploymentConfig | None:
    """Worker Deployment Versioning when a deployment name is configured: this worker
    serves one version (its build ID). Remediations auto-upgrade to the deployment's current
    version at their next workflow task: one may be quarantined for months and must follow
    every release (replay-tested against the previous release's histories, every change
    guarded by workflow.patched). The detector is pinned (``detector_workflow``) and moves
    at its continue-as-new."""
    if w.deployment_name is None:
        return None
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=w.deployment_name,
                                        build_id=w.deployment_build_id()),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.AUTO_UPGRADE)


def detector_workflow(cfg: WorkerDeploymentConfig | None) -> type[DetectorWorkflow]:
    """The detector class to register: pinned under versioning, plain otherwise (an
    unversioned worker refuses a class that declares a versioning behaviour)."""
    return PinnedDetectorWorkflow if cfg is not None else DetectorWorkflow


async def run_worker(settings: Settings) -> None:
    w = settings.worker
    await check_start_runtime_classes(settings)
    runtime = None
    if w.sdk_metrics_port:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
            bind_address=f"{w.bind}:{w.sdk_metrics_port}")))
    if w.metrics_port:
        start_http_server(w.metrics_port, addr=w.bind)
    health = Health()
    runner = await health.serve(w.bind, w.health_port) if w.health_port else None
    client = await connect(settings.temporal, runtime=runtime)
    await _wait_for_namespace(client, settings)
    activities = worker_activities(settings, client)
    # Off by default: the endpoint nodes' watchers report faults to (gpu-remediate watch).
    reports = (await serve_reports(settings.reports, kube_client(settings), client)
               if settings.reports.enabled else None)
    versioned = deployment_config(w)
    # Versioned, the build ID is the deployment version's.
    build_id = None if versioned else code_build_id()
    with ThreadPoolExecutor(max_workers=w.max_concurrent_activities) as pool:
        worker = Worker(
            client, task_queue=settings.temporal.task_queue,
            workflows=[RemediationWorkflow, detector_workflow(versioned)],
            activities=activities,
            activity_executor=pool, max_concurrent_activities=w.max_concurrent_activities,
            graceful_shutdown_timeout=timedelta(seconds=w.graceful_shutdown_seconds),
            deployment_config=versioned, build_id=build_id,
        )
        # The detector's tick (observation, admission report) on its own queue, served by
        # its own worker: a tick never waits behind drains and claims for a slot (the main
        # worker keeps these activities too, for detectors started with settings that name
        # no observation queue).
        observer = Worker(
            client, task_queue=observe_task_queue(settings.temporal.task_queue),
            activities=[a for a in activities
                        if getattr(a, "__name__", "") in TICK_ACTIVITIES],
            max_concurrent_activities=4,
            graceful_shutdown_timeout=timedelta(seconds=w.graceful_shutdown_seconds),
            deployment_config=versioned, build_id=build_id,
        )
        health.worker = worker
        loop = asyncio.get_running_loop()
        stopping = asyncio.Event()

        def _stop(signame: str) -> None:
            if not stopping.is_set():
                log.info("received %s: finishing running activities, then exiting", signame)
                stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stop, sig.name)
        run = asyncio.create_task(_run_both(worker, observer))
        health.ready = True
        started = asyncio.create_task(_report_start(worker, client, settings))
        checked = asyncio.create_task(_report_prerequisites(settings))
        stop_wait = asyncio.create_task(stopping.wait())
        await asyncio.wait({run, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        checked.cancel()
        health.ready = False
        if not run.done():
            await asyncio.gather(worker.shutdown(), observer.shutdown())
        stop_wait.cancel()
        await run
    if reports is not None:
        await reports.cleanup()
    if runner is not None:
        await runner.cleanup()
    log.info("worker stopped")
