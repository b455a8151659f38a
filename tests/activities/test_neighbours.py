"""Other controllers acting on a node: not admitted while they act, their disruption counted."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from temporalio.testing import ActivityEnvironment

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.neighbours import NEIGHBOURS, neighbour_hold
from policy.config import PolicySettings
from tests.activities.conftest import Cluster, ThreadedGpuSim
from workflows.admission import Admission
from workflows.messages import DetectorState, ObserveInput
from workflows.settings import DetectorSettings


@pytest.mark.parametrize(("labels", "annotations", "taints", "by"), [
    ({"nvidia.com/gpu-driver-upgrade-state": "drain-required"}, {}, set(),
     "GPU Operator driver upgrade"),
    ({"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}, {}, set(),
     "GPU Operator driver upgrade"),
    ({}, {"weave.works/kured-reboot-in-progress": "2026-12-03T10:00:00Z"}, set(), "kured"),
    ({}, {}, {"medik8s.io/drain"}, "Node Maintenance Operator"),
    ({}, {}, {"node.kubernetes.io/out-of-service"}, "out-of-service"),
    ({"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}, {}, set(), None),
    ({}, {}, {"node.kubernetes.io/unschedulable"}, None),
])
def test_each_neighbours_mark_is_read(labels: dict, annotations: dict, taints: set,
                                      by: str | None) -> None:
    hold = neighbour_hold(labels, annotations, taints)
    assert (hold.by if hold else None) == by
    assert all(n.why for n in NEIGHBOURS)


async def test_a_node_under_a_driver_upgrade_waits_and_a_tainted_drain_counts(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """gpu-node-02 is flagged but the GPU Operator is upgrading its driver: it waits,
    saying who acts on it. gpu-node-04 is cordoned under a NodeMaintenance taint (which a
    kubelet cannot set): it takes the only slot, so gpu-node-01, flagged too, waits for the
    budget. gpu-node-03 claims a driver upgrade and cordons itself, both of which its own
    kubelet could write: it holds no slot, or one compromised node could stall the fleet."""
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 79)
    gpu_sim.client.inject_fault("gpu-node-02", 0, "xid", 79)
    upgrade = "nvidia.com/gpu-driver-upgrade-state"
    cluster.core.patch_node("gpu-node-02", {"metadata": {"labels": {upgrade: "upgrade-required"}}})
    cluster.core.patch_node("gpu-node-03", {"metadata": {"labels": {upgrade: "drain-required"}},
                                            "spec": {"unschedulable": True}})
    cluster.core.patch_node("gpu-node-04", {"spec": {"unschedulable": True, "taints": [
        {"key": "medik8s.io/drain", "effect": "NoSchedule"}]}})
    fleet = FleetActivities(cluster.api, ExporterSettings(
        mode="template", url_template=f"{gpu_sim.url}/nodes/{{node}}/metrics"))
    obs = await ActivityEnvironment().run(fleet.observe_fleet,
                                          ObserveInput(policy=PolicySettings()))
    assert [(h.node, h.by, h.out_of_service) for h in obs.held] == [
        ("gpu-node-02", "GPU Operator driver upgrade", False),
        ("gpu-node-03", "GPU Operator driver upgrade", False),
        ("gpu-node-04", "Node Maintenance Operator", True)]
    adm = Admission(DetectorSettings(max_unavailable=1, breaker_max_flagged_percent=100),
                    DetectorState(), obs, datetime.now(UTC))
    assert adm.in_use == ["gpu-node-04"]
    why = {c.node: adm.blocked(c) for c in adm.queue}
    assert why == {
        "gpu-node-01": "budget full (1/1)",
        "gpu-node-02": "GPU Operator driver upgrade is acting on it "
                       "(nvidia.com/gpu-driver-upgrade-state=upgrade-required)"}
