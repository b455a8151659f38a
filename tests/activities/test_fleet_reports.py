"""observe_fleet with node reports (ObserveInput.reports): a node's reported XID is merged
into that node's readings for its verdict, and only there."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from temporalio.testing import ActivityEnvironment

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.node_keys import A_ACK_XIDS, A_XID_SIGHTINGS
from policy.config import PolicySettings
from policy.models import Action
from tests.activities.conftest import Cluster, ThreadedGpuSim
from workflows.messages import FleetObservation, NodeReport, ObserveInput

POLICY = PolicySettings()


def template(gpu: ThreadedGpuSim) -> ExporterSettings:
    return ExporterSettings(mode="template", timeout_seconds=2.0,
                            url_template=f"{gpu.url}/nodes/{{node}}/metrics")


def report(node: str, gpu: str, xid: int) -> NodeReport:
    return NodeReport(node=node, gpu=gpu, xid=xid, at=datetime.now(UTC),
                      line=f"NVRM: Xid (PCI:0000:18:00): {xid}")


async def observe(k: Cluster, gpu: ThreadedGpuSim, *reports: NodeReport) -> FleetObservation:
    return await ActivityEnvironment().run(
        FleetActivities(k.api, template(gpu)).observe_fleet,
        ObserveInput(policy=POLICY, reports=list(reports)))


async def test_a_reported_xid_flags_its_node_before_the_exporter_shows_it(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    assert (await observe(cluster, gpu_sim)).verdicts == []
    bus = gpu_sim.client.get_node("gpu-node-02")["gpus"][3]["pci_bus_id"]
    obs = await observe(cluster, gpu_sim, report("gpu-node-02", bus, 79))
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-02", Action.REBOOT)]
    assert [(f.gpu, f.value) for f in obs.verdicts[0].findings] == [("3", 79.0)]
    # The report was evidence for the verdict, not something the node now records.
    annotations = cluster.core.read_node("gpu-node-02").metadata.annotations or {}
    assert A_XID_SIGHTINGS not in annotations


async def test_a_report_names_only_its_own_node(cluster: Cluster,
                                                gpu_sim: ThreadedGpuSim) -> None:
    obs = await observe(cluster, gpu_sim, report("gpu-node-01", "0", 79),
                        report("no-such-node", "0", 79))
    assert [v.node for v in obs.verdicts] == ["gpu-node-01"]


async def test_a_reported_repeat_of_an_acknowledged_xid_is_seen(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-03", 1, "xid", 48)
    gpu_sim.client.clear("gpu-node-03")  # the gauge keeps showing XID 48
    uuid = gpu_sim.client.get_node("gpu-node-03")["gpus"][1]["uuid"]
    cluster.core.patch_node("gpu-node-03", {"metadata": {"annotations": {
        A_ACK_XIDS: json.dumps({uuid: 48})}}})
    assert (await observe(cluster, gpu_sim)).verdicts == []
    obs = await observe(cluster, gpu_sim, report("gpu-node-03", uuid, 48))
    assert [v.node for v in obs.verdicts] == ["gpu-node-03"]
    # The acknowledgement stays on the node: the report does not rewrite it.
    annotations = cluster.core.read_node("gpu-node-03").metadata.annotations or {}
    assert json.loads(annotations[A_ACK_XIDS]) == {uuid: 48}


async def test_no_reading_no_verdict_whatever_the_node_reports(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.set_exporter_mode("gpu-node-04", "down")
    obs = await observe(cluster, gpu_sim, report("gpu-node-04", "0", 79))
    assert obs.verdicts == [] and any("gpu-node-04" in e for e in obs.errors)


async def test_a_node_only_observation_reads_that_node_alone(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """A detector woken by a report observes the reported node only: its verdict from a
    fresh reading, nothing of any other node (another node's fault waits for the full
    tick), and its records and exporter only: the fleet is not listed or scraped."""
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 79)
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    listed, scraped = [], []
    list_node, read_many = fleet.core.list_node, fleet.read_many

    def spy_list(*args, **kw):
        listed.append(kw.get("field_selector"))
        return list_node(*args, **kw)

    async def spy_read(names, *args, **kw):
        scraped.append(sorted(names))
        return await read_many(names, *args, **kw)
    fleet.core.list_node, fleet.read_many = spy_list, spy_read  # type: ignore[method-assign]
    bus = gpu_sim.client.get_node("gpu-node-02")["gpus"][3]["pci_bus_id"]
    obs = await ActivityEnvironment().run(fleet.observe_fleet, ObserveInput(
        policy=POLICY, nodes=["gpu-node-02"],
        reports=[report("gpu-node-02", bus, 79), report("gpu-node-01", "0", 79)]))
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-02", Action.REBOOT)]
    assert listed == ["metadata.name=gpu-node-02"] and scraped == [["gpu-node-02"]]
    assert obs.managed_nodes == 1
    # The same report for a node the fresh reading finds healthy (an application XID)
    # flags nothing.
    healthy = await ActivityEnvironment().run(fleet.observe_fleet, ObserveInput(
        policy=POLICY, nodes=["gpu-node-03"], reports=[report("gpu-node-03", "0", 13)]))
    assert healthy.verdicts == []


async def test_a_node_only_observation_skips_what_is_not_a_node_name(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """A name from a signal is never spliced into a field selector: one that is not a node
    name is not read (here it would have selected gpu-node-01 instead)."""
    obs = await ActivityEnvironment().run(
        FleetActivities(cluster.api, template(gpu_sim)).observe_fleet,
        ObserveInput(policy=POLICY, nodes=["gpu-node-01,metadata.name!=x"]))
    assert obs.managed_nodes == 0 and obs.verdicts == []
