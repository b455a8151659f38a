"""What the fleet observation tells outside the detector: Events on nodes (rate-limited), the
per-node state metric, the error counter and last-observation time, and the node selector."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from activities import metrics
from activities.counter_rates import CounterRates
from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.node_keys import A_WORKFLOW, STATE_LABEL
from activities.notices import (
    APPLICATION_XID,
    GPU_LINK_ERRORS,
    TELEMETRY_UNAVAILABLE,
    Notice,
    NoticeBook,
    deferred_notices,
)
from policy.config import PolicySettings
from tests.activities.conftest import Cluster, ThreadedGpuSim, metric
from workflows.messages import FleetObservation, ObserveInput
from workflows.transitions import NodeState

POLICY = PolicySettings()


def template(gpu: ThreadedGpuSim) -> ExporterSettings:
    return ExporterSettings(mode="template", timeout_seconds=0.5,
                            url_template=f"{gpu.url}/nodes/{{node}}/metrics")


async def observe(fleet: FleetActivities, *, dry_run: bool = False) -> FleetObservation:
    return await ActivityEnvironment().run(
        fleet.observe_fleet, ObserveInput(policy=POLICY, track_xid_repeats=not dry_run))


def counter(name: str, **labels: str) -> float:
    return metric(name, **labels) or 0.0


async def test_an_exporter_that_stays_down_gets_one_event_not_one_per_tick(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    before = counter("gpu_remediate_node_events_total", reason=TELEMETRY_UNAVAILABLE)
    gpu_sim.client.set_exporter_mode("gpu-node-01", "down")
    for _ in range(3):
        await observe(fleet)
    (event,) = cluster.events("gpu-node-01", TELEMETRY_UNAVAILABLE)
    assert event.type == "Warning" and "not evaluated" in event.message
    assert cluster.events("gpu-node-02", TELEMETRY_UNAVAILABLE) == []
    assert counter("gpu_remediate_node_events_total", reason=TELEMETRY_UNAVAILABLE) == before + 1
    # Back, then down again: a new outage is news.
    gpu_sim.client.set_exporter_mode("gpu-node-01", "up")
    await observe(fleet)
    gpu_sim.client.set_exporter_mode("gpu-node-01", "down")
    await observe(fleet)
    assert len(cluster.events("gpu-node-01", TELEMETRY_UNAVAILABLE)) == 2


async def test_no_telemetry_event_for_a_node_in_remediation_or_in_dry_run(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    cluster.core.patch_node("gpu-node-02", {"metadata": {
        "labels": {STATE_LABEL: NodeState.REPAIRING.value},
        "annotations": {A_WORKFLOW: "remediation-gpu-node-02"}}})
    gpu_sim.client.set_exporter_mode("gpu-node-02", "down")  # rebooting: expected
    gpu_sim.client.set_exporter_mode("gpu-node-03", "down")
    await observe(FleetActivities(cluster.api, template(gpu_sim)), dry_run=True)
    assert cluster.events("gpu-node-03", TELEMETRY_UNAVAILABLE) == []
    await observe(FleetActivities(cluster.api, template(gpu_sim)))
    assert cluster.events("gpu-node-02", TELEMETRY_UNAVAILABLE) == []
    assert len(cluster.events("gpu-node-03", TELEMETRY_UNAVAILABLE)) == 1


async def test_application_xid_gets_a_warning_event_once_per_new_xid(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    gpu_sim.client.inject_fault("gpu-node-03", 5, "xid", 13)
    obs = await observe(fleet)
    assert obs.verdicts == []  # the node stays in service
    await observe(fleet)
    (event,) = cluster.events("gpu-node-03", APPLICATION_XID)
    assert event.type == "Warning"
    assert "XID 13 on GPU 5" in event.message and "stays in service" in event.message
    gpu_sim.client.inject_fault("gpu-node-03", 5, "xid", 31)
    await observe(fleet)
    assert len(cluster.events("gpu-node-03", APPLICATION_XID)) == 2


async def test_pcie_replays_over_the_limit_get_a_warning_event_from_two_scrapes(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """The simulated GPU replays 600 times a minute; the exporter shows a total, so the first
    scrape judges nothing and the second (a second later here) measures the rate."""
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    fleet.rates = CounterRates(min_interval=0.5)
    policy = PolicySettings.from_mapping({"links": {"pcie_replay_enabled": True}})
    gpu_sim.client.inject_fault("gpu-node-02", 1, "pcie-replay", 600)
    before = counter("gpu_remediate_link_error_findings_total", signal="pcie_replay")
    env = ActivityEnvironment()
    first = await env.run(fleet.observe_fleet, ObserveInput(policy=policy))
    assert cluster.events("gpu-node-02", GPU_LINK_ERRORS) == []
    await asyncio.sleep(1.5)
    second = await env.run(fleet.observe_fleet, ObserveInput(policy=policy))
    assert first.verdicts == second.verdicts == [], "an alert drains nothing"
    (event,) = cluster.events("gpu-node-02", GPU_LINK_ERRORS)
    assert event.type == "Warning" and "GPU 1: pcie-replays-over-8-per-minute" in event.message
    assert counter("gpu_remediate_link_error_findings_total", signal="pcie_replay") == before + 1
    # Off (the default), the same GPU is not judged at all.
    await asyncio.sleep(1.0)
    await observe(fleet)
    assert len(cluster.events("gpu-node-02", GPU_LINK_ERRORS)) == 1
    assert cluster.events("gpu-node-01", GPU_LINK_ERRORS) == []


async def test_node_state_metric_has_one_series_per_node_and_forgets_deleted_nodes(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    cluster.core.patch_node("gpu-node-04", {"metadata": {
        "labels": {STATE_LABEL: NodeState.DRAINING.value},
        "annotations": {A_WORKFLOW: "remediation-gpu-node-04"}}})
    await observe(fleet)
    series = "gpu_remediate_node_state"
    assert metric(series, node="gpu-node-04", state="draining") == 1.0
    assert metric(series, node="gpu-node-04", state="healthy") is None
    assert metric(series, node="gpu-node-01", state="healthy") == 1.0
    cluster.core.patch_node("gpu-node-04", {"metadata": {"labels": {STATE_LABEL: None}}})
    cluster.core.delete_node("gpu-node-01")
    await observe(fleet)
    assert metric(series, node="gpu-node-04", state="draining") is None
    assert metric(series, node="gpu-node-04", state="healthy") == 1.0
    assert metric(series, node="gpu-node-01", state="healthy") is None


def test_node_state_series_go_stale_when_no_longer_observed() -> None:
    states = metrics.NodeStates(stale_after_s=60)
    states.observed([("a", "healthy"), ("b", "quarantined")], now=0.0)
    states.observed([("a", "healthy")], now=50.0)
    (family,) = states.collect(now=100.0)
    assert [(s.labels["node"], s.labels["state"]) for s in family.samples] == [("a", "healthy")]


async def test_observation_errors_are_counted_and_success_is_timestamped(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    await observe(fleet)
    stamp = metric("gpu_remediate_last_observation_timestamp_seconds")
    assert stamp is not None and stamp > 1.7e9
    errors = sum(s.value for m in metrics.OBSERVATION_ERRORS.collect() for s in m.samples
                 if s.name.endswith("_total"))
    cluster.faults({"verb": "list", "resource": "nodes", "status": 503})
    with pytest.raises(Exception):  # noqa: B017 - the typed error is raise_typed's business
        await observe(fleet)
    after = sum(s.value for m in metrics.OBSERVATION_ERRORS.collect() for s in m.samples
                if s.name.endswith("_total"))
    assert after == errors + 1
    assert metric("gpu_remediate_last_observation_timestamp_seconds") == stamp


async def test_node_selector_picks_the_fleet_and_keeps_nodes_in_remediation(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    for node in ("gpu-node-01", "gpu-node-02"):
        cluster.core.patch_node(node, {"metadata": {
            "labels": {"nvidia.com/gpu.present": "true"}}})
    # gpu-node-03 left the selection while in remediation: it still holds its slot.
    cluster.core.patch_node("gpu-node-03", {"metadata": {
        "labels": {STATE_LABEL: NodeState.DRAINING.value},
        "annotations": {A_WORKFLOW: "remediation-gpu-node-03"}}})
    fleet = FleetActivities(cluster.api, template(gpu_sim),
                            node_selector="nvidia.com/gpu.present=true")
    obs = await observe(fleet)
    assert obs.managed_nodes == 3  # 01, 02, and 03 in remediation; 04 not selected
    assert [n.node for n in obs.remediating] == ["gpu-node-03"]
    gpu_sim.client.inject_fault("gpu-node-04", 0, "xid", 79)
    assert (await observe(fleet)).verdicts == []  # not ours: not selected


# ---------------------------------------------------------------- the rate limit itself


def test_notice_book_sends_new_and_changed_notices_and_repeats_slowly() -> None:
    book = NoticeBook(repeat_after=timedelta(hours=1))
    first = Notice(node="n", reason="R", message="m", fingerprint="a")
    assert book.due([first], 0.0) == [first]
    book.sent(first, 0.0)
    assert book.due([first], 60.0) == []
    changed = Notice(node="n", reason="R", message="m2", fingerprint="b")
    assert book.due([changed], 60.0) == [changed]
    assert book.due([first], 3600.0) == [first]
    book.settle("R", current=[], nodes=["n"])
    assert book.due([first], 61.0) == [first]
    with pytest.raises(ValueError, match="repeat_after"):
        NoticeBook(repeat_after=timedelta(0))


def test_deferred_notices_ignore_the_slot_counts() -> None:
    one, = deferred_notices(["gpu-node-02 (reset: budget full (1/1))"])
    two, = deferred_notices(["gpu-node-02 (reset: budget full (2/2))"])
    assert one.node == "gpu-node-02" and one.reason == "RemediationDeferred"
    assert one.fingerprint == two.fingerprint == "reset: budget full"
    assert "budget full (1/1)" in one.message
    paused, = deferred_notices(["gpu-node-02 (reset: paused)"])
    assert paused.fingerprint != one.fingerprint


# ---------------------------------------------------------------- configuration


def test_events_go_to_the_configured_namespace(cluster: Cluster) -> None:
    from activities import events

    cluster.core.create_namespace({"metadata": {"name": "gpu-remediate"}})
    events.set_event_namespace("gpu-remediate")
    try:
        events.record_node_event(cluster.core, "gpu-node-01", reason="Probe", message="m")
    finally:
        events.set_event_namespace("default")
    (event,) = cluster.core.list_namespaced_event(
        "gpu-remediate", field_selector="involvedObject.name=gpu-node-01").items
    assert event.reason == "Probe" and event.involved_object.kind == "Node"
    assert cluster.events("gpu-node-01", "Probe") == []  # not in "default"


@pytest.mark.parametrize(("override", "field"), [
    ({"kubernetes.event_namespace": "Not_A_Namespace"}, "kubernetes.event_namespace"),
    ({"kubernetes.node_selector": "nvidia.com/gpu.present=true,"}, "kubernetes.node_selector"),
    ({"kubernetes.node_selector": "gpu in nvidia"}, "kubernetes.node_selector"),
])
def test_bad_namespace_or_selector_fails_at_start_naming_the_field(
        override: dict[str, str], field: str) -> None:
    from worker.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(**override)


def test_worker_wiring_passes_the_selector() -> None:
    from worker.config import load_settings
    from worker.service import build_fleet

    settings = load_settings(**{"kubernetes.node_selector": "nvidia.com/gpu.present=true",
                                "kubernetes.event_namespace": "ops"})
    from kubernetes import client

    assert build_fleet(settings, client.ApiClient()).node_selector == \
        "nvidia.com/gpu.present=true"
