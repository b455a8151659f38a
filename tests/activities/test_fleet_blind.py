"""Blind rules and repeats of acknowledged XIDs, as the fleet observation sees them: a GPU
Operator fleet on stock counters (sim/scenarios/gpu-operator.yaml), and a fleet whose
exporter serves the windowed XID count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.node_keys import A_ACK_XIDS
from activities.notices import SIGNAL_UNAVAILABLE
from activities.signal_watch import SignalWatch
from policy.config import PolicySettings
from policy.models import GpuReading, NodeReadings
from tests.activities.conftest import Cluster, ThreadedGpuSim, _cluster, metric
from workflows.messages import FleetObservation, ObserveInput

POLICY = PolicySettings()
STOCK_BLIND = {"ecc-dbe", "row-remap-pending", "clock-reasons", "recovery-action", "repeat-xid"}


def template(gpu: ThreadedGpuSim) -> ExporterSettings:
    return ExporterSettings(mode="template", timeout_seconds=0.5,
                            url_template=f"{gpu.url}/nodes/{{node}}/metrics")


async def observe(fleet: FleetActivities, *, dry_run: bool = False) -> FleetObservation:
    return await ActivityEnvironment().run(
        fleet.observe_fleet, ObserveInput(policy=POLICY, track_xid_repeats=not dry_run))


@pytest.fixture
def stock_sim() -> Iterator[ThreadedGpuSim]:
    sim = ThreadedGpuSim("gpu-operator", xid_count_window_ms=300000)
    yield sim
    sim.stop()


@pytest.fixture
def stock_cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from _cluster(tmp_path, scenario="gpu-operator")


async def test_a_stock_counter_fleet_says_once_which_rules_cannot_fire(
        stock_cluster: Cluster, stock_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(stock_cluster.api, template(stock_sim))
    for _ in range(3):
        await observe(fleet)
    nodes = [n["name"] for n in stock_sim.client.list_nodes()]
    assert len(nodes) == 4
    for node in nodes:
        (event,) = stock_cluster.events(node, SIGNAL_UNAVAILABLE)
        assert event.type == "Warning"
        for signal in STOCK_BLIND:
            assert signal in event.message
        assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in event.message
        assert "DCGM_EXP_XID_ERRORS_COUNT" in event.message
    for signal in STOCK_BLIND:
        assert metric("gpu_remediate_signal_blind_nodes", signal=signal) == 4
    assert metric("gpu_remediate_signal_blind_nodes", signal="gpu-temp") == 0


async def test_no_blind_event_in_dry_run(
        stock_cluster: Cluster, stock_sim: ThreadedGpuSim) -> None:
    await observe(FleetActivities(stock_cluster.api, template(stock_sim)), dry_run=True)
    assert stock_cluster.events("gpu-operator-01", SIGNAL_UNAVAILABLE) == []


async def test_a_full_counter_fleet_is_blind_to_nothing(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    # The default simulator serves every field but the opt-in windowed XID count.
    await observe(FleetActivities(cluster.api, template(gpu_sim)))
    (event,) = cluster.events("gpu-node-01", SIGNAL_UNAVAILABLE)
    assert "repeat-xid" in event.message and "ecc-dbe" not in event.message


@pytest.fixture
def counting_sim() -> Iterator[ThreadedGpuSim]:
    sim = ThreadedGpuSim(xid_count_window_ms=300000)
    yield sim
    sim.stop()


@pytest.fixture
def counting_cluster(tmp_path: Path, counting_sim: ThreadedGpuSim) -> Iterator[Cluster]:
    yield from _cluster(tmp_path, gpu_sim_url=counting_sim.url)


async def test_a_repeat_of_an_acknowledged_xid_is_seen_from_the_windowed_count(
        counting_cluster: Cluster, counting_sim: ThreadedGpuSim) -> None:
    sim, cluster = counting_sim, counting_cluster
    sim.client.inject_fault("gpu-node-01", 2, "xid", 79)
    sim.client.clear("gpu-node-01")  # the gauge keeps showing XID 79
    uuid = sim.client.get_node("gpu-node-01")["gpus"][2]["uuid"]
    cluster.core.patch_node("gpu-node-01", {"metadata": {"annotations": {
        A_ACK_XIDS: json.dumps({uuid: 79})}}})
    fleet = FleetActivities(cluster.api, template(sim))
    assert (await observe(fleet)).verdicts == []
    assert (await observe(fleet)).verdicts == []  # the same occurrence: still acknowledged
    sim.client.inject_fault("gpu-node-01", 2, "xid", 79)  # the same XID again
    sim.client.clear("gpu-node-01")
    (verdict,) = (await observe(fleet)).verdicts
    assert verdict.node == "gpu-node-01" and verdict.action == "reboot"
    (finding,) = [f for f in verdict.findings if f.uuid == uuid]
    assert "repeat of acknowledged XID 79" in finding.detail


def reading(counts: dict[int, int] | None, **fields: float) -> NodeReadings:
    return NodeReadings(node="n", gpus=[GpuReading(gpu="0", uuid="GPU-a", xid=79,
                                                   xid_counts=counts, **fields)])


def test_the_first_reading_in_a_process_is_never_a_repeat() -> None:
    watch = SignalWatch()
    acked = {"GPU-a": 79}
    assert watch.observe(reading({79: 1}), POLICY, 0.0, acked)[1] == []
    assert watch.observe(reading({79: 1}), POLICY, 10.0, acked)[1] == []
    assert watch.observe(reading({79: 0}), POLICY, 20.0, acked)[1] == []  # aged out
    (repeat,) = watch.observe(reading({79: 1}), POLICY, 30.0, acked)[1]
    assert (repeat.xid, repeat.before, repeat.after) == (79, 0, 1)
    # Another XID's count rising says nothing about the acknowledged one.
    assert watch.observe(reading({79: 1, 13: 4}), POLICY, 40.0, acked)[1] == []


def test_a_family_seen_recently_is_not_blind_and_old_sightings_expire() -> None:
    watch = SignalWatch(max_age=100.0)
    full = reading({}, ecc_dbe_volatile=0, row_remap_pending=0, clock_event_reasons=0,
                   recovery_action=0, gpu_temp=40, row_remap_failure=0,
                   uncorrectable_remapped_rows=0)
    blind, _ = watch.observe(full, POLICY, 0.0, {})
    assert blind == []
    bare = reading(None, gpu_temp=40, row_remap_failure=0, uncorrectable_remapped_rows=0)
    blind, _ = watch.observe(bare, POLICY, 50.0, {})
    assert blind == []  # one scrape without the series is not blindness
    blind, _ = watch.observe(bare, POLICY, 151.0, {})
    assert {b.signal for b in blind} == STOCK_BLIND
    assert watch.blind_of("n", POLICY, 160.0) == blind
    assert watch.blind_of("n", POLICY, 500.0) is None and watch.blind_of("x", POLICY, 0) is None
    watch.forget_older_than(1000.0)
    assert len(watch) == 0
