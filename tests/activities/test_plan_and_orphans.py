"""`gpu-remediate plan` and orphan release against the cluster and GPU simulators."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.fleet_nodes import GpuNode
from activities.node_keys import (
    A_ACK_XIDS,
    A_ORPHAN,
    A_PRECORDONED,
    A_WORKFLOW,
    STATE_LABEL,
    TAINT_KEY,
)
from tests.activities.conftest import Cluster, ThreadedGpuSim
from worker.cli.plan import make_plan
from worker.config import load_settings
from workflows.messages import ObserveInput, OrphanRelease
from workflows.transitions import NodeState


def settings_for(tmp_path: Path, cluster: Cluster, gpu: ThreadedGpuSim, extra: str = "") -> Path:
    path = tmp_path / "config.yaml"
    # No Temporal: the plan reads the config file. Left at its default (localhost:7233), a
    # stack that `./dev.sh up` runs beside the tests would answer with its own detector.
    path.write_text(f"""
temporal: {{address: "127.0.0.1:1"}}
kubernetes: {{kubeconfig: {cluster.kubeconfig}}}
exporter: {{mode: template, url_template: "{gpu.url}/nodes/{{node}}/metrics"}}
detector: {{max_unavailable: 1, breaker_max_flagged_percent: 100}}
{extra}""")
    return path


async def test_plan_shows_who_would_start_and_who_waits_and_changes_nothing(
        tmp_path: Path, cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    gpu_sim.client.inject_fault("gpu-node-01", 2, "xid", 48)
    gpu_sim.client.inject_fault("gpu-node-03", 0, "row-remap-failure")
    # What a detector tick would write down: an application XID's sighting on node 02 and
    # the end of an acknowledgement node 04's exporter no longer shows.
    gpu_sim.client.inject_fault("gpu-node-02", 1, "xid", 13)
    cluster.core.patch_node("gpu-node-04", {"metadata": {"annotations": {
        A_ACK_XIDS: '{"gpu5": 79}'}}})
    cluster.clear_writes()
    plan = await make_plan(load_settings(settings_for(tmp_path, cluster, gpu_sim)))
    assert [(s.node, s.action) for s in plan.start] == [("gpu-node-03", "quarantine")]
    assert plan.waiting == ["gpu-node-01 (reset: budget full (1/1))"]
    assert (plan.budget, plan.managed_nodes, plan.readable_nodes) == (1, 4, 4)
    assert plan.prerequisites == [], "the simulated GPU Operator runs every operand"
    assert cluster.writes() == [], "a plan changes nothing"
    # The same observation inside a worker does write them (so the check above can fail).
    fleet = FleetActivities(cluster.api, ExporterSettings(
        mode="template", url_template=f"{gpu_sim.url}/nodes/{{node}}/metrics"))
    await ActivityEnvironment().run(fleet.observe_fleet, ObserveInput(
        policy=load_settings(settings_for(tmp_path, cluster, gpu_sim)).policy))
    written = {w["name"] for w in cluster.writes("nodes") if w["verb"] == "patch"}
    assert {"gpu-node-02", "gpu-node-04"} <= written


def _orphan(cluster: Cluster, node: str, precordoned: bool) -> None:
    cluster.cordon(node)
    cluster.core.patch_node(node, {
        "metadata": {"labels": {STATE_LABEL: NodeState.REPAIRING.value},
                     "annotations": {A_WORKFLOW: f"remediation-{node}",
                                     A_PRECORDONED: "true" if precordoned else "false"}},
        "spec": {"taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]}})


class _NoWorkflows:
    """find_orphans asks Temporal whether the remediation runs: here, none does."""

    async def __call__(self, labelled: list[GpuNode]) -> list[str]:
        return sorted(n.name for n in labelled)


async def test_orphan_release_returns_the_node_and_records_who(
        cluster: Cluster, gpu_sim: ThreadedGpuSim, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = FleetActivities(cluster.api, ExporterSettings(mode="template"))
    monkeypatch.setattr(fleet, "find_orphans", _NoWorkflows())
    _orphan(cluster, "gpu-node-02", precordoned=False)
    _orphan(cluster, "gpu-node-04", precordoned=True)
    for node in ("gpu-node-02", "gpu-node-04"):
        await ActivityEnvironment().run(fleet.release_orphan, OrphanRelease(
            node=node, operator="dana", reason="workflow was terminated"))
    freed, admin = cluster.node("gpu-node-02"), cluster.node("gpu-node-04")
    assert (freed.metadata.labels or {}).get(STATE_LABEL) == "healthy"
    assert not freed.spec.unschedulable
    assert not any(t.key == TAINT_KEY for t in freed.spec.taints or [])
    assert A_ORPHAN not in (freed.metadata.annotations or {})
    assert "orphan released by dana" in (freed.metadata.annotations or {})[
        "gpu-remediate.io/history"]
    assert admin.spec.unschedulable, "an admin's cordon stays"
    assert cluster.events("gpu-node-02", "OrphanReleased")


async def test_a_node_that_is_not_an_orphan_is_not_released(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    fleet = FleetActivities(cluster.api, ExporterSettings(mode="template"))
    with pytest.raises(ApplicationError, match="not an orphan"):
        await ActivityEnvironment().run(fleet.release_orphan, OrphanRelease(
            node="gpu-node-01", operator="dana", reason="looked stuck"))


async def test_orphan_release_restores_the_operands_and_deletes_its_jobs(
        cluster: Cluster, gpu_sim: ThreadedGpuSim, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remediation that died during a GPU reset left the GPU Operator's device plugin
    (and others) off and maybe a Job: release-orphan gives them back as found, not a node
    back in service without its device plugin."""
    from activities.node_keys import NODE_LABEL, label_value
    from activities.operands import A_OPERANDS_PAUSED, dump_record
    from workflows.operands import deploy_label

    ns = "gpu-remediate-jobs"
    cluster.core.create_namespace({"metadata": {"name": ns}})
    plugin = deploy_label("device-plugin")
    fleet = FleetActivities(cluster.api, ExporterSettings(mode="template"), jobs_namespace=ns)
    monkeypatch.setattr(fleet, "find_orphans", _NoWorkflows())
    _orphan(cluster, "gpu-node-02", precordoned=False)
    cluster.core.patch_node("gpu-node-02", {"metadata": {
        "labels": {plugin: "false"},
        "annotations": {A_OPERANDS_PAUSED: dump_record({plugin: "true"})}}})
    batch = client.BatchV1Api(cluster.api)
    batch.create_namespaced_job(ns, {
        "metadata": {"name": "gr-validate-gpu-node-02-x-1",
                     "labels": {NODE_LABEL: label_value("gpu-node-02")}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "v", "image": "busybox", "command": ["true"]}]}}}})
    await ActivityEnvironment().run(fleet.release_orphan, OrphanRelease(
        node="gpu-node-02", operator="dana", reason="workflow was terminated"))
    node = cluster.node("gpu-node-02")
    assert (node.metadata.labels or {}).get(plugin) == "true"
    assert A_OPERANDS_PAUSED not in (node.metadata.annotations or {})
    assert batch.list_namespaced_job(ns).items == [] or all(
        j.metadata.deletion_timestamp for j in batch.list_namespaced_job(ns).items)
    history = (node.metadata.annotations or {})["gpu-remediate.io/history"]
    assert "operands restored" in history
    said = " ".join(e.message or "" for e in cluster.events("gpu-node-02", "OrphanReleased"))
    assert "Job gr-validate-gpu-node-02-x-1 deleted" in said, said


async def test_plan_names_a_gpu_operator_operand_a_reset_could_not_pause(
        tmp_path: Path, cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    config = settings_for(tmp_path, cluster, gpu_sim, extra=(
        "remediation: {gpu_operator: {operands: [device-plugin, nvsm]}}"))
    plan = await make_plan(load_settings(config))
    (line,) = plan.prerequisites
    assert "'nvsm' missing" in line
    assert "nvidia.com/gpu.deploy.nvsm" in line
