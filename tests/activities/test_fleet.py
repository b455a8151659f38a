"""observe_fleet / read_node_health / watch_thermal against both simulators over HTTP."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.node_keys import (
    A_ACK_XIDS,
    A_WORKFLOW,
    A_XID_SIGHTINGS,
    EXCLUDE_LABEL,
    STATE_LABEL,
)
from activities.prometheus_source import PrometheusSource
from policy.config import PolicySettings
from policy.models import Action
from tests.activities.conftest import Cluster, ThreadedGpuSim
from workflows.messages import FleetObservation, NodeHealthInput, ObserveInput, ThermalWatchInput
from workflows.transitions import NodeState

POLICY = PolicySettings()
EVERY_SIGHTING_RESETS = PolicySettings.model_validate(
    {"app_xid_escalation": {"burst_gap": 0, "action": "reset"}})
"""The counting across ticks, isolated: ticks here are milliseconds apart, so each sighting is
made its own burst, and the escalation admitted as a reset (by default it asks for a diagnostic
and is not admitted: tests/activities/test_fleet_xid_warnings.py)."""
NODES = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]


def template(gpu: ThreadedGpuSim, timeout: float = 2.0) -> ExporterSettings:
    return ExporterSettings(mode="template", timeout_seconds=timeout,
                            url_template=f"{gpu.url}/nodes/{{node}}/metrics")


def discover(gpu: ThreadedGpuSim) -> ExporterSettings:
    # The cluster simulator's dcgm-exporter pods have podIP 127.0.0.1 and port 9400; the
    # GPU simulator listens on its own port, so only the port is changed here.
    return ExporterSettings(mode="discover", port=gpu.port, timeout_seconds=2.0)


async def observe(k: Cluster, settings: ExporterSettings, *,
                  track_xid_repeats: bool = True,
                  policy: PolicySettings = POLICY,
                  prometheus: PrometheusSource | None = None) -> FleetObservation:
    return await ActivityEnvironment().run(
        FleetActivities(k.api, settings, prometheus=prometheus).observe_fleet,
        ObserveInput(policy=policy, track_xid_repeats=track_xid_repeats))


def sightings(k: Cluster, node: str) -> dict:
    annotations = k.core.read_node(node).metadata.annotations or {}
    return json.loads(annotations.get(A_XID_SIGHTINGS) or "{}")


async def test_observe_fleet_template_mode_flags_only_the_sick_node(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-02", 3, "xid", 79)
    obs = await observe(cluster, template(gpu_sim))
    assert (obs.managed_nodes, obs.readable_nodes, obs.errors) == (4, 4, [])
    assert [(v.node, v.action) for v in obs.verdicts] == [
        ("gpu-node-02", Action.REBOOT)]


async def test_observe_fleet_discover_mode_attributes_readings_to_the_right_node(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """Discovery gives http://127.0.0.1:<port>/metrics for every node, which on the GPU
    simulator is the whole-fleet endpoint: each node must keep only its own series."""
    gpu_sim.client.inject_fault("gpu-node-02", 3, "xid", 79)
    fleet = FleetActivities(cluster.api, discover(gpu_sim))
    assert set(fleet.endpoints(NODES).values()) == {f"http://127.0.0.1:{gpu_sim.port}/metrics"}
    obs = await observe(cluster, discover(gpu_sim))
    assert obs.readable_nodes == 4 and obs.errors == []
    assert [v.node for v in obs.verdicts] == ["gpu-node-02"]
    finding = obs.verdicts[0].findings[0]
    assert (finding.gpu, finding.value) == ("3", 79)


async def test_observe_fleet_discover_mode_reports_a_node_without_exporter_pod(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    pods = cluster.core.list_namespaced_pod(
        "gpu-operator", field_selector="spec.nodeName=gpu-node-04").items
    # Stop the DaemonSet from recreating it: keep it off gpu-node-04.
    cluster.core.patch_node("gpu-node-04", {"metadata": {"labels": {"no-dcgm": "true"}}})
    cluster.apps.patch_namespaced_daemon_set("nvidia-dcgm-exporter", "gpu-operator", {
        "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "no-dcgm", "operator": "DoesNotExist"}]}]}}}}}}})
    for p in pods:
        cluster.core.delete_namespaced_pod(p.metadata.name, "gpu-operator",
                                           grace_period_seconds=0)
    obs = await observe(cluster, discover(gpu_sim))
    assert obs.readable_nodes == 3
    assert obs.errors == ["gpu-node-04: no dcgm-exporter endpoint found"]


async def test_observe_fleet_skips_excluded_nodes(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-02", 3, "xid", 79)
    cluster.core.patch_node("gpu-node-02", {"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})
    obs = await observe(cluster, template(gpu_sim))
    assert obs.managed_nodes == 3 and obs.verdicts == []


async def test_observe_fleet_still_counts_an_excluded_node_that_is_mid_remediation(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    cluster.core.patch_node("gpu-node-02", {"metadata": {
        "labels": {EXCLUDE_LABEL: "true", STATE_LABEL: NodeState.DRAINING.value},
        "annotations": {A_WORKFLOW: "remediation-gpu-node-02"}}})
    obs = await observe(cluster, template(gpu_sim))
    assert [(n.node, n.state) for n in obs.remediating] == [
        ("gpu-node-02", NodeState.DRAINING)]


async def test_observe_fleet_lists_nodes_labelled_in_remediation(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    cluster.core.patch_node("gpu-node-03", {"metadata": {
        "labels": {STATE_LABEL: NodeState.REPAIRING.value},
        "annotations": {A_WORKFLOW: "remediation-gpu-node-03"}}})
    obs = await observe(cluster, template(gpu_sim))
    assert [(n.node, n.state, n.workflow_id) for n in obs.remediating] == [
        ("gpu-node-03", NodeState.REPAIRING, "remediation-gpu-node-03")]


@pytest.mark.parametrize("mode", ["down", "slow", "empty", "garbled"])
async def test_observe_fleet_unreadable_exporter_is_an_error_never_a_verdict(
        cluster: Cluster, gpu_sim: ThreadedGpuSim, mode: str) -> None:
    # The node really is sick: only a working exporter may say so.
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 79)
    gpu_sim.client.inject_fault("gpu-node-01", 0, "gpu-temp", 95)
    gpu_sim.client.set_exporter_mode("gpu-node-01", mode,
                                     delay_seconds=3 if mode == "slow" else None)
    obs = await observe(cluster, template(gpu_sim, timeout=0.5))
    assert obs.verdicts == []
    assert obs.readable_nodes == 3
    assert [e.split(":")[0] for e in obs.errors] == ["gpu-node-01"]


async def test_observe_fleet_acknowledged_xid_is_history_a_new_one_is_not(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 48)
    gpu_sim.client.clear("gpu-node-01")  # the gauge keeps showing XID 48
    uuid = gpu_sim.client.get_node("gpu-node-01")["gpus"][2]["uuid"]
    cluster.core.patch_node("gpu-node-01", {"metadata": {"annotations": {
        A_ACK_XIDS: json.dumps({uuid: 48})}}})
    assert (await observe(cluster, template(gpu_sim))).verdicts == []
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 79)
    obs = await observe(cluster, template(gpu_sim))
    assert [v.node for v in obs.verdicts] == ["gpu-node-01"]


async def test_read_node_health_reads_one_node(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim))
    health = await ActivityEnvironment().run(
        fleet.read_node_health, NodeHealthInput(node="gpu-node-03", policy=POLICY))
    assert health.readable and health.thermal_recovered
    assert health.verdict is not None and health.verdict.action == Action.NONE


def watch(node: str, *, hold: float = 0.3, give_up: float = 1.5) -> ThermalWatchInput:
    return ThermalWatchInput(node=node, policy=POLICY, hold=timedelta(seconds=hold),
                             poll_interval=timedelta(seconds=0.1),
                             give_up_after=timedelta(seconds=give_up))


async def test_watch_thermal_recovered_after_the_hold(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    beats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *d: beats.append(d)
    result = await env.run(FleetActivities(cluster.api, template(gpu_sim)).watch_thermal,
                           watch("gpu-node-01"))
    assert result.outcome == "recovered" and beats


async def test_watch_thermal_still_hot_gives_up(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-01", 5, "gpu-temp", 92)
    result = await ActivityEnvironment().run(
        FleetActivities(cluster.api, template(gpu_sim)).watch_thermal,
        watch("gpu-node-01", give_up=0.5))
    assert result.outcome == "hot"


async def test_watch_thermal_unreadable_exporter_is_not_recovery(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.set_exporter_mode("gpu-node-01", "down")
    result = await ActivityEnvironment().run(
        FleetActivities(cluster.api, template(gpu_sim)).watch_thermal,
        watch("gpu-node-01", give_up=0.5))
    assert result.outcome == "hot" and "unreadable" in result.message


async def test_watch_thermal_returns_fault_on_a_worse_problem(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-01", 5, "gpu-temp", 92)
    gpu_sim.client.inject_fault("gpu-node-01", 1, "ecc-dbe", 1)
    result = await ActivityEnvironment().run(
        FleetActivities(cluster.api, template(gpu_sim)).watch_thermal, watch("gpu-node-01"))
    assert result.outcome == "fault"
    assert result.verdict is not None and result.verdict.action == Action.RESET


async def test_watch_thermal_ignores_an_acknowledged_stale_xid(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 48)
    gpu_sim.client.clear("gpu-node-01")
    uuid = gpu_sim.client.get_node("gpu-node-01")["gpus"][2]["uuid"]
    cluster.core.patch_node("gpu-node-01", {"metadata": {"annotations": {
        A_ACK_XIDS: json.dumps({uuid: 48})}}})
    result = await ActivityEnvironment().run(
        FleetActivities(cluster.api, template(gpu_sim)).watch_thermal, watch("gpu-node-01"))
    assert result.outcome == "recovered"


class _StubPrometheus:
    """Stands in for PrometheusSource (tested against a real Prometheus elsewhere):
    gpu-node-01 has XID 79, gpu-node-02 has no series."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def read(self, nodes: list[str], *, thermal_hold: timedelta,
                   acknowledged_by_node: dict[str, dict[str, int]]) -> tuple[dict, dict]:
        from policy.models import GpuReading, NodeReadings

        self.asked = nodes
        # Every GPU the nodes declare (nvidia.com/gpu.count 8): fewer would be a finding.
        readings = {n: NodeReadings(node=n, gpus=[
            GpuReading(gpu=str(i), uuid=f"GPU-{n}-{i}",
                       xid=79 if n == "gpu-node-01" and i == 0 else None) for i in range(8)])
            for n in nodes if n != "gpu-node-02"}
        return readings, {"gpu-node-02": "gpu-node-02: no DCGM series in Prometheus"}


async def test_observe_fleet_prometheus_mode_reads_the_source_for_every_gpu_node(
        cluster: Cluster) -> None:
    stub = _StubPrometheus()
    settings = ExporterSettings(mode="prometheus", prometheus_url="http://prometheus.invalid")
    obs = await observe(cluster, settings, prometheus=stub)  # type: ignore[arg-type]
    assert sorted(stub.asked) == NODES
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-01", Action.REBOOT)]
    assert obs.readable_nodes == 3
    assert obs.errors == ["gpu-node-02: no DCGM series in Prometheus"]


async def test_acknowledgement_is_forgotten_once_the_exporter_stops_showing_the_xid(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """The XID gauge holds the last value until the exporter restarts. While it shows the
    handled value, it is ignored; once it no longer does (restart after the repair), the
    same XID number happening again is a new fault."""
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 48)
    uuid = gpu_sim.client.get_node("gpu-node-01")["gpus"][0]["uuid"]
    cluster.core.patch_node("gpu-node-01", {"metadata": {"annotations": {
        A_ACK_XIDS: json.dumps({uuid: 48})}}})
    assert (await observe(cluster, template(gpu_sim))).verdicts == []
    gpu_sim.client.set_persistence("gpu-node-01", False, 0)  # as the reset Job does first
    gpu_sim.client.reset("gpu-node-01", 0)  # the exporter restarts: the series is gone
    await observe(cluster, template(gpu_sim))
    annotations = cluster.core.read_node("gpu-node-01").metadata.annotations or {}
    assert A_ACK_XIDS not in annotations
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 48)
    obs = await observe(cluster, template(gpu_sim))
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-01", Action.RESET)]


async def test_repeated_app_xid_on_one_gpu_escalates_across_ticks(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """XID 31 is an application fault, but twice on one GPU within a day points at the
    GPU (NVIDIA's workflow): the detector counts sightings across ticks on the node."""
    uuid = gpu_sim.client.get_node("gpu-node-01")["gpus"][2]["uuid"]
    p = EVERY_SIGHTING_RESETS
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 31)
    assert (await observe(cluster, template(gpu_sim), policy=p)).verdicts == []
    # Same event, still one sighting.
    assert (await observe(cluster, template(gpu_sim), policy=p)).verdicts == []
    seen = sightings(cluster, "gpu-node-01")[uuid]
    assert seen["shown"] == 31 and [x for x, _ in seen["seen"]] == [31]
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 13)
    assert (await observe(cluster, template(gpu_sim), policy=p)).verdicts == []
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 31)
    obs = await observe(cluster, template(gpu_sim), policy=p)
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-01", Action.RESET)]
    assert [f.rule for f in obs.verdicts[0].findings] == ["xid-31-repeated"]
    assert [x for x, _ in sightings(cluster, "gpu-node-01")[uuid]["seen"]] == [31, 13, 31]
    # Other nodes were never written to.
    assert all(sightings(cluster, n) == {} for n in NODES[1:])


async def test_dry_run_and_nodes_in_remediation_record_no_sightings(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 13)
    gpu_sim.client.inject_fault("gpu-node-02", 0, "xid", 13)
    cluster.core.patch_node("gpu-node-02", {"metadata": {"labels": {
        STATE_LABEL: NodeState.DRAINING.value}}})
    await observe(cluster, template(gpu_sim), track_xid_repeats=False)
    assert sightings(cluster, "gpu-node-01") == {}
    await observe(cluster, template(gpu_sim))
    assert sightings(cluster, "gpu-node-01") != {}
    assert sightings(cluster, "gpu-node-02") == {}


async def test_count_family_makes_a_repeat_of_the_same_app_xid_visible(
        cluster: Cluster) -> None:
    """With dcgm-exporter's opt-in DCGM_EXP_XID_ERRORS_COUNT, XID 13 five times on one GPU
    escalates although the last-XID gauge shows 13 throughout."""
    sim = ThreadedGpuSim(xid_count_window_ms=300_000)
    try:
        p = EVERY_SIGHTING_RESETS
        for _ in range(3):
            sim.client.inject_fault("gpu-node-03", 1, "xid", 13)
        assert (await observe(cluster, template(sim), policy=p)).verdicts == []
        uuid = sim.client.get_node("gpu-node-03")["gpus"][1]["uuid"]
        assert sightings(cluster, "gpu-node-03")[uuid]["counts"] == {"13": 3}
        sim.client.inject_fault("gpu-node-03", 1, "xid", 13)
        assert (await observe(cluster, template(sim), policy=p)).verdicts == []
        sim.client.inject_fault("gpu-node-03", 1, "xid", 13)
        obs = await observe(cluster, template(sim), policy=p)
        assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-03", Action.RESET)]
        assert [f.rule for f in obs.verdicts[0].findings] == ["xid-13-repeated"]
    finally:
        sim.stop()


async def test_sightings_survive_write_conflicts(cluster: Cluster,
                                                 gpu_sim: ThreadedGpuSim) -> None:
    """A 409 (a kubelet heartbeat moved the resourceVersion) re-reads the node and writes
    again from its fresh annotations; past the attempts it gives up without failing."""
    uuid = gpu_sim.client.get_node("gpu-node-01")["gpus"][0]["uuid"]
    gpu_sim.client.inject_fault("gpu-node-01", 0, "xid", 31)
    cluster.faults({"verb": "patch", "resource": "nodes", "name": "gpu-node-01",
                    "status": 409, "times": 2})
    assert (await observe(cluster, template(gpu_sim))).verdicts == []
    assert [x for x, _ in sightings(cluster, "gpu-node-01")[uuid]["seen"]] == [31]
    gpu_sim.client.inject_fault("gpu-node-02", 0, "xid", 31)
    cluster.faults({"verb": "patch", "resource": "nodes", "name": "gpu-node-02",
                    "status": 409})
    assert (await observe(cluster, template(gpu_sim))).verdicts == []
    assert sightings(cluster, "gpu-node-02") == {}
    cluster.faults()
    await observe(cluster, template(gpu_sim))
    assert sightings(cluster, "gpu-node-02") != {}
    assert [x for x, _ in sightings(cluster, "gpu-node-01")[uuid]["seen"]] == [31]


async def test_check_thermal_answers_only_when_the_state_changes(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """One look per call: "unchanged" (retried by the workflow at the poll interval) while
    the node is as the workflow last saw it, the new state once it differs."""
    from temporalio.exceptions import ApplicationError

    from workflows.messages import ThermalCheckInput

    acts = FleetActivities(cluster.api, template(gpu_sim))
    env = ActivityEnvironment()
    gpu_sim.client.inject_fault("gpu-node-01", 5, "gpu-temp", 92)
    look = ThermalCheckInput(node="gpu-node-01", policy=POLICY, now="hot")
    with pytest.raises(ApplicationError) as still:
        await env.run(acts.check_thermal, look)
    assert still.value.type == "ThermalUnchanged" and "still hot" in str(still.value)
    hot = await env.run(acts.check_thermal, look.model_copy(update={"now": "cool"}))
    assert hot.outcome == "hot"
    gpu_sim.client.set_exporter_mode("gpu-node-02", "down")
    with pytest.raises(ApplicationError) as unreadable:
        await env.run(acts.check_thermal, look.model_copy(update={"node": "gpu-node-02"}))
    assert "unreadable" in str(unreadable.value), "no data is not evidence of cooling"
    cool = await env.run(acts.check_thermal, look.model_copy(update={"node": "gpu-node-03"}))
    assert cool.outcome == "cool"


# ------------------------------------------------ what a node writes about itself


async def test_a_node_cannot_opt_itself_out_with_a_label_its_kubelet_can_set(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """NodeRestriction lets a kubelet set its own labels except under
    node-restriction.kubernetes.io/: only that opt-out counts."""
    from activities.node_keys import LEGACY_EXCLUDE_LABEL

    assert EXCLUDE_LABEL.startswith("node-restriction.kubernetes.io/")
    gpu_sim.client.inject_fault("gpu-node-02", 3, "xid", 79)
    cluster.core.patch_node("gpu-node-02", {"metadata": {"labels": {
        LEGACY_EXCLUDE_LABEL: "true"}}})
    obs = await observe(cluster, template(gpu_sim))
    assert [(v.node, v.action) for v in obs.verdicts] == [("gpu-node-02", Action.REBOOT)]
    assert any(e.startswith("gpu-node-02: gpu-remediate.io/exclude=true ignored")
               for e in obs.errors), obs.errors


@pytest.mark.parametrize(("labels", "tainted", "says"), [
    # A value we never write (a typo, or a node muting itself): fail closed.
    ({STATE_LABEL: "fine-thanks"}, False, "state label 'fine-thanks' is not one of ours"),
    # Relabelled healthy mid-drain to free a budget slot: our taint (which a kubelet
    # cannot change) still says otherwise.
    ({STATE_LABEL: NodeState.HEALTHY.value}, True, "taint but its state label says healthy"),
    ({}, True, "taint but its state label says healthy"),
    # Our quarantine always carries our taint: a label alone would count toward the
    # quarantine cap and the outcome breaker, so one node could stall every admission.
    ({STATE_LABEL: NodeState.QUARANTINED.value}, False, "labelled quarantined without the"),
])
async def test_markers_that_disagree_count_the_node_out_of_service(
        cluster: Cluster, gpu_sim: ThreadedGpuSim, labels: dict[str, str], tainted: bool,
        says: str) -> None:
    from activities.node_keys import TAINT_KEY

    body: dict = {"metadata": {"labels": labels}}
    if tainted:
        body["spec"] = {"taints": [{"key": TAINT_KEY, "value": "true",
                                    "effect": "NoSchedule"}]}
    cluster.core.patch_node("gpu-node-03", body)
    gpu_sim.client.inject_fault("gpu-node-03", 1, "xid", 79)
    obs = await observe(cluster, template(gpu_sim))
    assert [(n.node, n.state) for n in obs.remediating] == [
        ("gpu-node-03", NodeState.REPAIRING)]
    # It holds a budget slot and is never started again while its markers say so.
    from datetime import UTC, datetime

    from workflows.admission import Admission
    from workflows.messages import DetectorState
    from workflows.settings import DetectorSettings

    # A detector run recorded before leases counted from these markers, failing closed.
    adm = Admission(DetectorSettings(), DetectorState(), obs, datetime.now(UTC), leases=False)
    assert adm.in_use == ["gpu-node-03"] and adm.queue == []
    assert adm.quarantined == 0, "only our taint makes a quarantine count"
    assert any(e.startswith("gpu-node-03: ") and says in e for e in obs.errors), obs.errors
    # With leases the record decides: no lease, no slot and no quarantine, whatever the
    # markers say (an orphan under our taint is adopted: see the next test).
    adm = Admission(DetectorSettings(), DetectorState(leases_ready=True), obs,
                    datetime.now(UTC))
    assert adm.in_use == [] and adm.quarantined == 0


class _Described:
    def __init__(self, status: object, workflow_type: str) -> None:
        self.status, self.workflow_type = status, workflow_type


class _Handle:
    def __init__(self, described: _Described | None) -> None:
        self.described = described

    async def describe(self) -> _Described:
        from temporalio.service import RPCError, RPCStatusCode

        if self.described is None:
            raise RPCError("not found", RPCStatusCode.NOT_FOUND, b"")
        return self.described


class _Temporal:
    """What Temporal answers about workflows: the detector runs, no remediation does."""

    def __init__(self, running: dict[str, str]) -> None:
        self.running = running
        self.asked: list[str] = []

    def get_workflow_handle(self, wid: str) -> _Handle:
        from temporalio.client import WorkflowExecutionStatus

        self.asked.append(wid)
        kind = self.running.get(wid)
        return _Handle(_Described(WorkflowExecutionStatus.RUNNING, kind) if kind else None)


async def test_a_node_naming_a_running_workflow_of_its_own_choice_is_still_an_orphan(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """Labelled draining with workflow-id=gpu-remediate-detector (which always runs), a
    node held the only budget slot forever. Only remediation-<node> of the remediation
    workflow type backs a node's markers."""
    from activities.fleet_nodes import GpuNode

    fleet = FleetActivities(cluster.api, template(gpu_sim))
    node = GpuNode("gpu-node-01", NodeState.DRAINING, "gpu-remediate-detector", {}, {})
    temporal = _Temporal({"gpu-remediate-detector": "DetectorWorkflow",
                          "remediation-gpu-node-02": "RemediationWorkflow",
                          "remediation-gpu-node-03": "DetectorWorkflow"})
    env = ActivityEnvironment(client=temporal)  # type: ignore[arg-type]
    assert await env.run(fleet.find_orphans, [node]) == ["gpu-node-01"]
    assert temporal.asked == ["remediation-gpu-node-01"]
    backed = GpuNode("gpu-node-02", NodeState.DRAINING, "anything", {}, {})
    assert await env.run(fleet.find_orphans, [backed]) == []
    # Right ID, wrong workflow type (a stray client started something under it).
    impostor = GpuNode("gpu-node-03", NodeState.DRAINING, "remediation-gpu-node-03", {}, {})
    assert await env.run(fleet.find_orphans, [impostor]) == ["gpu-node-03"]


@pytest.mark.parametrize("value", [NodeState.DRAINING.value, "fine-thanks",
                                   NodeState.QUARANTINED.value])
async def test_a_state_label_alone_holds_no_budget_slot(
        cluster: Cluster, gpu_sim: ThreadedGpuSim, value: str) -> None:
    """A kubelet can label its own Node but not taint it. A state label with neither our
    taint nor a running remediation-<node> is the node's own word: it takes no budget slot
    (with the default budget of 1, one compromised node would stall every admission), it
    is reported, and the node can be flagged and claimed like any other."""
    from datetime import UTC, datetime

    from activities.metrics import UNCLAIMED_LABELS
    from activities.node_keys import TAINT_KEY
    from workflows.admission import Admission
    from workflows.messages import DetectorState
    from workflows.settings import DetectorSettings

    cluster.core.patch_node("gpu-node-03", {"metadata": {"labels": {STATE_LABEL: value}}})
    # The same label under our taint: a remediation that died keeps its slot (fail closed).
    cluster.core.patch_node("gpu-node-04", {
        "metadata": {"labels": {STATE_LABEL: NodeState.DRAINING.value}},
        "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]}})
    # Our taint lifted for a while (the operands' restore) while the remediation runs.
    cluster.core.patch_node("gpu-node-01", {"metadata": {"labels": {
        STATE_LABEL: NodeState.REPAIRING.value}}})
    gpu_sim.client.inject_fault("gpu-node-03", 1, "xid", 79)
    temporal = _Temporal({"remediation-gpu-node-01": "RemediationWorkflow"})
    obs = await ActivityEnvironment(client=temporal).run(  # type: ignore[arg-type]
        FleetActivities(cluster.api, template(gpu_sim)).observe_fleet,
        ObserveInput(policy=POLICY))
    assert [n.node for n in obs.remediating] == ["gpu-node-01", "gpu-node-04"]
    assert obs.orphans == ["gpu-node-03", "gpu-node-04"]
    assert any(e.startswith("gpu-node-03: state label") and "not ours" in e
               for e in obs.errors), obs.errors
    assert UNCLAIMED_LABELS._value.get() == 1  # type: ignore[attr-defined]
    adm = Admission(DetectorSettings(max_unavailable=3), DetectorState(), obs,
                    datetime.now(UTC), leases=False)
    assert adm.in_use == ["gpu-node-01", "gpu-node-04"]
    # With leases: the orphan under our taint is adopted as an orphan's lease (fail
    # closed); gpu-node-01's running remediation holds the lease the detector granted (or
    # adopted from visibility when it started), not one its label could give it.
    state = DetectorState(leases_ready=True)
    leased = Admission(DetectorSettings(max_unavailable=3), state, obs, datetime.now(UTC))
    assert leased.in_use == ["gpu-node-04"] and state.leases["gpu-node-04"].orphan
    assert [c.node for c in adm.queue] == ["gpu-node-03"], "flagged, it can be claimed"
    assert adm.blocked(adm.queue[0]) is None


# ------------------------------------------------ a GPU gone without an XID


async def test_a_gpu_fallen_off_the_bus_is_caught_by_the_declared_count(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """The driver lost GPU 3: DCGM no longer lists it, so its series vanish and no XID
    shows. GPU feature discovery still declares 8 (nvidia.com/gpu.count): 7 < 8 reboots."""
    from activities.gpus import GPU_COUNT_LABEL

    assert cluster.node("gpu-node-02").metadata.labels[GPU_COUNT_LABEL] == "8"
    gpu_sim.client.inject_fault("gpu-node-02", 3, "fallen-off-bus")
    obs = await observe(cluster, template(gpu_sim))
    (verdict,) = obs.verdicts
    assert (verdict.node, verdict.action) == ("gpu-node-02", Action.REBOOT)
    assert verdict.findings[0].rule == "gpus-missing-1-of-8"
    assert verdict.summary == "reboot: gpus-missing-1-of-8 on GPU all"
    off = POLICY.model_copy(update={"missing_gpu_action": Action.NONE})
    assert (await observe(cluster, template(gpu_sim), policy=off)).verdicts == []


@pytest.mark.parametrize(("value", "expected"), [
    ("8", 8), ("1024", 1024),
    # Not a plain ASCII number, or absurd: unknown (a label is the node's own word).
    ("", None), ("8x", None), ("٨", None), ("+8", None), (" 8", None), ("1025", None),
    ("99999", None),
    # Zero declares nothing: the rule needs a positive count (rules._missing_gpus).
    ("0", 0),
])
def test_a_declared_count_is_read_as_a_plain_number_only(value: str,
                                                          expected: int | None) -> None:
    from activities.gpus import GPU_COUNT_LABEL, declared_gpus

    assert declared_gpus({GPU_COUNT_LABEL: value}) == expected


async def test_observe_fleet_counts_each_pools_gpus_for_the_pool_gpu_budgets(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    pool = "node-restriction.kubernetes.io/pool"
    for node, name in (("gpu-node-01", "a"), ("gpu-node-02", "a"), ("gpu-node-03", "b")):
        cluster.core.patch_node(node, {"metadata": {"labels": {pool: name}}})
    obs = await ActivityEnvironment().run(
        FleetActivities(cluster.api, template(gpu_sim)).observe_fleet,
        ObserveInput(policy=POLICY, pool_label=pool))
    per_node = obs.managed_gpus // 4
    assert per_node > 0
    # gpu-node-04 has no pool label: the pool '' (as pool_sizes counts it).
    assert obs.pool_gpus == {"a": 2 * per_node, "b": per_node, "": per_node}
    assert obs.pool_sizes == {"a": 2, "b": 1, "": 1}
