"""The worker process: Temporal worker, metrics and health endpoints, graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from aiohttp import web
from kubernetes.client import ApiClient
from prometheus_client import start_http_server
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.common import VersioningBehavior
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError
from temporalio.worker import Worker, WorkerDeploymentConfig, WorkerDeploymentVersion

from activities.drain import DrainActivities
from activities.events import EventActivities, set_event_namespace
from activities.fleet import FleetActivities
from activities.jobs import JobActivities
from activities.kube import KubeSettings, make_api_client
from activities.node_return import NodeReturnActivities
from activities.nodes import NodeActivities
from activities.operands import OperandActivities
from activities.prometheus_source import PrometheusSource
from activities.scrape import ExporterSettings
from activities.visibility import VisibilityActivities
from worker.config import Settings, TemporalConfig, WorkerConfig
from worker.temporal_client import connect
from workflows.detector import DetectorWorkflow, PinnedDetectorWorkflow
from workflows.ids import observe_task_queue
from workflows.remediation import RemediationWorkflow

log = logging.getLogger("gpu_remediate.worker")
# What a detector tick runs, served on observe_task_queue by a worker of its own.
TICK_ACTIVITIES = ("observe_fleet", "report_admission")


def kube_client(settings: Settings) -> ApiClient:
    k = settings.kubernetes
    return make_api_client(KubeSettings(kubeconfig=k.kubeconfig, context=k.context,
                                        in_cluster=k.in_cluster),
                           pool_size=settings.worker.max_concurrent_activities)


def build_fleet(settings: Settings, api: ApiClient) -> FleetActivities:
    """The fleet observer: where readings come from is configuration."""
    e = settings.exporter
    prometheus = None
    if e.mode == "prometheus" and e.prometheus_url:
        headers = {}
        if e.prometheus_bearer_token_file is not None:
            token = e.prometheus_bearer_token_file.read_text().strip()
            headers["Authorization"] = f"Bearer {token}"
        prometheus = PrometheusSource(
            url=e.prometheus_url, window=e.prometheus_window, timeout_seconds=e.timeout_seconds,
            node_label=e.prometheus_node_labels, headers=headers, policy=settings.policy)
    exporter = ExporterSettings(mode=e.mode, url_template=e.url_template, namespace=e.namespace,
                                label_selector=e.label_selector, port=e.port, path=e.path,
                                timeout_seconds=e.timeout_seconds, max_bytes=e.max_bytes,
                                concurrency=e.concurrency,
                                parse_helper_from=e.parse_helper_from, prometheus=prometheus,
                                prometheus_thermal_hold=e.prometheus_thermal_hold)
    return FleetActivities(api, exporter, node_selector=settings.kubernetes.node_selector)


def build_activities(settings: Settings) -> list[Callable[..., Any]]:
    set_event_namespace(settings.kubernetes.event_namespace)
    api = kube_client(settings)
    nodes, drain = NodeActivities(api), DrainActivities(api)
    jobs = JobActivities(api, settings.jobs)
    events = EventActivities(api)
    fleet = build_fleet(settings, api)
    back = NodeReturnActivities(api, fleet)
    operands = OperandActivities(api)
    return [nodes.claim_node, nodes.set_node_state, nodes.release_node, drain.drain_node,
            jobs.run_node_job, jobs.poll_node_job, jobs.delete_node_job,
            fleet.observe_fleet, fleet.read_node_health, fleet.watch_thermal,
            fleet.check_thermal,
            fleet.release_orphan, events.record_event,
            back.check_node_returned, back.check_gpus_free,
            operands.pause_gpu_operands, operands.check_operands_gone,
            operands.restore_gpu_operands, operands.check_operands_back,
            operands.restart_device_plugin,
            fleet.report_admission]


def worker_activities(settings: Settings, client: Client) -> list[Callable[..., Any]]:
    """Every activity the worker registers: the cluster's, and the visibility look-up a
    fresh detector makes to learn which remediations already run."""
    return [*build_activities(settings), VisibilityActivities(client).list_running_remediations]


class Health:
    """Liveness: the worker loop runs. Readiness: connected and polling."""

    def __init__(self) -> None:
        self.ready = False
        self.worker: Worker | None = None

    async def live(self, _: web.Request) -> web.Response:
        ok = self.worker is None or self.worker.is_running or not self.ready
        return web.json_response({"live": ok}, status=200 if ok else 503)

    async def readyz(self, _: web.Request) -> web.Response:
        ok = self.ready and self.worker is not None and self.worker.is_running
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def serve(self, bind: str, port: int) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/healthz", self.live)
        app.router.add_get("/readyz", self.readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, bind, port).start()
        return runner


NOT_POLLING_WARN_AFTER = 10.0
NOT_POLLING_WARN_EVERY = 30.0


async def _report_start(worker: Worker, client: Client, settings: Settings) -> None:
    """Say when the worker polls, and until then, why it does not: the server answers but
    cannot serve the namespace (its database is down, the namespace is missing). The SDK
    retries by itself; /readyz answers 503 meanwhile."""
    t = settings.temporal
    loop = asyncio.get_running_loop()
    start, warn_at = loop.time(), NOT_POLLING_WARN_AFTER
    while not worker.is_running:
        await asyncio.sleep(0.25)
        waited = loop.time() - start
        if waited >= warn_at:
            warn_at += NOT_POLLING_WARN_EVERY
            log.warning("not polling yet after %.0fs: Temporal at %s cannot serve namespace "
                        "%s (%s); retrying, /readyz answers 503 until it can",
                        waited, t.address, t.namespace, await _namespace_problem(client, t))
    log.info("worker polling task queue %s on %s (namespace %s)", t.task_queue, t.address,
             t.namespace)


async def _namespace_problem(client: Client, t: TemporalConfig) -> str:
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=t.namespace), retry=False,
            timeout=timedelta(seconds=5))
    except RPCError as err:
        return f"{err.status.name}: {err.message}"
    except Exception as err:  # whatever it is, the warning is still written
        return f"{type(err).__name__}: {err}"
    return "the namespace answers now"


async def _run_both(worker: Worker, observer: Worker) -> None:
    """Both workers until either stops (the other is then shut down too)."""
    tasks = [asyncio.create_task(worker.run()), asyncio.create_task(observer.run())]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for w in (worker, observer):
        if w.is_running:
            await w.shutdown()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        t.result()


def deployment_config(w: WorkerConfig) -> WorkerDeploymentConfig | None:
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
    runtime = None
    if w.sdk_metrics_port:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
            bind_address=f"{w.bind}:{w.sdk_metrics_port}")))
    if w.metrics_port:
        start_http_server(w.metrics_port, addr=w.bind)
    health = Health()
    runner = await health.serve(w.bind, w.health_port) if w.health_port else None
    client = await connect(settings.temporal, runtime=runtime)
    activities = worker_activities(settings, client)
    with ThreadPoolExecutor(max_workers=w.max_concurrent_activities) as pool:
        worker = Worker(
            client, task_queue=settings.temporal.task_queue,
            workflows=[RemediationWorkflow, detector_workflow(deployment_config(w))],
            activities=activities,
            activity_executor=pool, max_concurrent_activities=w.max_concurrent_activities,
            graceful_shutdown_timeout=timedelta(seconds=w.graceful_shutdown_seconds),
            deployment_config=deployment_config(w),
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
            deployment_config=deployment_config(w),
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
        stop_wait = asyncio.create_task(stopping.wait())
        await asyncio.wait({run, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        health.ready = False
        if not run.done():
            await asyncio.gather(worker.shutdown(), observer.shutdown())
        stop_wait.cancel()
        await run
    if runner is not None:
        await runner.cleanup()
    log.info("worker stopped")
