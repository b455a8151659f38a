"""XIDs that need a human but no drain: the observation reports them (a Warning Event once per
appearance and ``gpu_remediate_xid_warnings_total``) and never admits them as remediations."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from policy.config import PolicySettings
from policy.models import Action
from tests.activities.conftest import Cluster, ThreadedGpuSim, metric
from workflows.messages import FleetObservation, ObserveInput

POLICY = PolicySettings()


def template(gpu: ThreadedGpuSim) -> ExporterSettings:
    return ExporterSettings(mode="template", timeout_seconds=2.0,
                            url_template=f"{gpu.url}/nodes/{{node}}/metrics")


async def observe(fleet: FleetActivities, *, policy: PolicySettings = POLICY,
                  dry_run: bool = False) -> FleetObservation:
    return await ActivityEnvironment().run(
        fleet.observe_fleet, ObserveInput(policy=policy, track_xid_repeats=not dry_run))


def counter(reason: str) -> float:
    return metric("gpu_remediate_xid_warnings_total", reason=reason) or 0.0


async def test_an_unknown_xid_warns_once_and_the_node_stays_in_service(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    before = counter("UnknownXid")
    gpu_sim.client.inject_fault("gpu-node-02", 3, "xid", 250)
    for _ in range(3):
        obs = await observe(fleet)
        assert obs.verdicts == []  # alert: never a remediation
    (event,) = cluster.events("gpu-node-02", "UnknownXid")
    assert event.type == "Warning"
    assert "XID 250" in event.message and "GPU 3" in event.message
    assert counter("UnknownXid") == before + 1
    assert cluster.events("gpu-node-01", "UnknownXid") == []


async def test_an_unknown_xid_held_for_review_is_admitted_as_a_quarantine(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    held = PolicySettings(unknown_xid_action=Action.QUARANTINE)
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 250)
    obs = await observe(FleetActivities(cluster.api, template(gpu_sim)), policy=held)
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-01", Action.QUARANTINE)]
    assert len(cluster.events("gpu-node-01", "UnknownXid")) == 1


async def test_an_alert_bucket_xid_warns_without_a_drain(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    before = counter("XidAlert")
    gpu_sim.client.inject_fault("gpu-node-03", 1, "xid", 159)  # CHECK_UVM
    obs = await observe(FleetActivities(cluster.api, template(gpu_sim)))
    assert obs.verdicts == []
    (event,) = cluster.events("gpu-node-03", "XidAlert")
    assert "XID 159" in event.message
    assert counter("XidAlert") == before + 1


async def test_no_xid_warning_in_dry_run(cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    before = counter("UnknownXid")
    gpu_sim.client.inject_fault("gpu-node-04", 0, "xid", 250)
    await observe(FleetActivities(cluster.api, template(gpu_sim)), dry_run=True)
    assert cluster.events("gpu-node-04", "UnknownXid") == []
    assert counter("UnknownXid") == before


async def test_app_xid_bursts_ask_for_a_diagnostic_and_never_reset(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """Two separate bursts of XID 31 on one GPU (here: every sighting its own burst, ticks are
    milliseconds apart in a test): the diagnostic is asked for on the node, nothing drains."""
    every = PolicySettings.model_validate({"app_xid_escalation": {"burst_gap": 0}})
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    before = counter("GPUDiagnosticNeeded")
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 31)
    assert (await observe(fleet, policy=every)).verdicts == []
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 13)
    assert (await observe(fleet, policy=every)).verdicts == []
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 31)
    for _ in range(2):
        assert (await observe(fleet, policy=every)).verdicts == []
    (event,) = cluster.events("gpu-node-01", "GPUDiagnosticNeeded")
    assert "XID 31" in event.message and "dcgmi diag -r 3" in event.message
    assert counter("GPUDiagnosticNeeded") == before + 1


async def test_the_same_bursts_with_the_default_gap_are_one_burst(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    for xid in (31, 13, 31):
        gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", xid)
        assert (await observe(fleet)).verdicts == []
    assert cluster.events("gpu-node-01", "GPUDiagnosticNeeded") == []
