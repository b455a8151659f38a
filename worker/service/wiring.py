"""What the worker registers: the activities, built from the settings over one Kubernetes
client, and the tick's share of them that the observation queue serves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiClient
from temporalio.client import Client

from activities.drain import DrainActivities
from activities.events import EventActivities, set_event_namespace
from activities.fleet import FleetActivities
from activities.gpu_isolation import GpuIsolationActivities
from activities.incidents import IncidentActivities
from activities.jobs import JobActivities
from activities.kube import make_api_client
from activities.ledger import LedgerActivities
from activities.limits import LimitsActivities
from activities.node_return import NodeReturnActivities
from activities.nodes import NodeActivities
from activities.operands import OperandActivities
from activities.prometheus_source import PrometheusSource
from activities.record import set_record_namespace
from activities.visibility import VisibilityActivities
from worker.config import Settings
from workflows.limits import LimitsSettings

# What a detector tick runs, served on observe_task_queue by a worker of its own.
TICK_ACTIVITIES = ("observe_fleet", "report_admission")


def kube_client(settings: Settings) -> ApiClient:
    k = settings.kubernetes
    return make_api_client(kubeconfig=k.kubeconfig, context=k.context, in_cluster=k.in_cluster,
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
    return FleetActivities(api, e, prometheus=prometheus,
                           node_selector=settings.kubernetes.node_selector,
                           record_namespace=settings.record_namespace(),
                           jobs_namespace=settings.jobs.namespace)


def limits_reader(settings: Settings) -> Callable[[], LimitsSettings]:
    """The worker's limits as its configuration file says now (a ConfigMap changes under a
    running pod), read with the same environment; without a file, those it started with."""
    if settings.source is None:
        return settings.limits_settings
    return lambda: settings.reload().limits_settings()


def build_activities(settings: Settings) -> list[Callable[..., Any]]:
    set_event_namespace(settings.kubernetes.event_namespace)
    set_record_namespace(settings.record_namespace())
    api = kube_client(settings)
    nodes, drain = NodeActivities(api), DrainActivities(api)
    jobs = JobActivities(api, settings.jobs)
    events = EventActivities(api)
    fleet = build_fleet(settings, api)
    back = NodeReturnActivities(api, fleet)
    operands = OperandActivities(api)
    isolation = GpuIsolationActivities(api)
    return [nodes.claim_node, nodes.set_node_state, nodes.release_node, drain.drain_node,
            nodes.rewrite_state_mirror,
            jobs.run_node_job, jobs.poll_node_job, jobs.delete_node_job,
            fleet.observe_fleet, fleet.read_node_health, fleet.watch_thermal,
            fleet.check_thermal,
            fleet.release_orphan, events.record_event,
            back.check_node_returned, back.check_gpus_free, back.mark_out_of_service,
            operands.pause_gpu_operands, operands.check_operands_gone,
            operands.restore_gpu_operands, operands.check_operands_back,
            operands.restart_device_plugin,
            isolation.isolate_gpu, isolation.set_gpu_taint,
            fleet.report_admission, IncidentActivities(api).cordon_for_incident,
            LimitsActivities(limits_reader(settings)).read_limits,
            LedgerActivities(api, settings.ledger, settings.record_namespace()).record_repair]


def worker_activities(settings: Settings, client: Client) -> list[Callable[..., Any]]:
    """Every activity the worker registers: the cluster's, and the visibility look-up a
    fresh detector makes to learn which remediations already run."""
    vis = VisibilityActivities(client)
    return [*build_activities(settings), vis.list_running_remediations, vis.confirm_lease]
