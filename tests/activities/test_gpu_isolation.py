"""isolate_gpu / set_gpu_taint against the cluster simulator posing as 1.33, 1.36 and 1.37."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.gpu_isolation import GROUP, GpuIsolationActivities
from sim.cluster import ThreadedClusterSim
from sim.scenario import gpu_uuid
from tests.activities.conftest import Cluster
from workflows.isolation import GpuTaintInput, IsolateGpuInput, rule_name

NODE = "gpu-node-01"
UUID3 = f"GPU-{gpu_uuid(NODE, 3)}"


def _open(tmp_path: Path, version: str) -> Iterator[Cluster]:
    sim = ThreadedClusterSim(scenario="small", job_seconds=0.2, kubernetes_version=version)
    sim.start()
    k = Cluster(sim, sim.kubeconfig(tmp_path / "kubeconfig"))
    try:
        yield k
    finally:
        k.api.close()
        sim.stop()


@pytest.fixture
def k137(tmp_path: Path) -> Iterator[Cluster]:
    yield from _open(tmp_path, "1.37")


def _isolate(k: Cluster, node: str = NODE, uuid: str = UUID3, **kw: Any) -> Any:
    acts = GpuIsolationActivities(k.api)
    return ActivityEnvironment().run(acts.isolate_gpu, IsolateGpuInput(
        node=node, uuid=uuid, gpu="3", value="xid-48-drain-and-reset",
        reason="XID 48 on GPU 3", workflow_id=f"remediation-{node}", **kw))


def _rule(k: Cluster, name: str, version: str = "v1") -> dict[str, Any]:
    return dict(client.CustomObjectsApi(k.api).get_cluster_custom_object(
        GROUP, version, "devicetaintrules", name))


def _rules(k: Cluster) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(k.api).list_cluster_custom_object(
        GROUP, "v1", "devicetaintrules")["items"])


def test_one_rule_selects_exactly_the_gpu_found_by_uuid(k137: Cluster) -> None:
    out = _isolate(k137)
    assert out.isolated and out.device == "gpu-3" and out.api_version == "v1"
    assert out.rule == rule_name(NODE, "gpu-3")
    rule = _rule(k137, out.rule)
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": NODE,
                                              "device": "gpu-3"}
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert rule["spec"]["taint"]["key"] == "gpu-remediate.io/isolated"
    assert rule["metadata"]["annotations"]["gpu-remediate.io/workflow-id"] == \
        f"remediation-{NODE}"
    # The node itself is untouched: schedulable, no taint.
    node = k137.node(NODE)
    assert not node.spec.unschedulable and not node.spec.taints
    # A retry of the same step adopts our own rule rather than fail.
    assert _isolate(k137).isolated
    assert len(_rules(k137)) == 1


def test_effect_moves_to_noexecute_then_the_rule_goes(k137: Cluster) -> None:
    out = _isolate(k137)
    acts = GpuIsolationActivities(k137.api)
    env = ActivityEnvironment()
    env.run(acts.set_gpu_taint, GpuTaintInput(rule=out.rule, api_version=out.api_version,
                                              node=NODE, effect="NoExecute"))
    assert _rule(k137, out.rule)["spec"]["taint"]["effect"] == "NoExecute"
    said = env.run(acts.set_gpu_taint, GpuTaintInput(rule=out.rule, node=NODE,
                                                     api_version=out.api_version))
    assert said.startswith("removed")
    assert _rules(k137) == []
    assert "already gone" in env.run(acts.set_gpu_taint, GpuTaintInput(
        rule=out.rule, node=NODE, api_version=out.api_version))


def test_dry_run_finds_the_device_and_writes_nothing(k137: Cluster) -> None:
    k137.clear_writes()
    out = _isolate(k137, dry_run=True)
    assert out.isolated and out.device == "gpu-3"
    assert k137.writes() == []


def test_a_136_server_gets_the_v1beta2_rule(tmp_path: Path) -> None:
    for k in _open(tmp_path, "1.36"):
        out = _isolate(k)
        assert out.isolated and out.api_version == "v1beta2"
        assert _rule(k, out.rule, "v1beta2")["spec"]["deviceSelector"]["device"] == "gpu-3"


def test_a_133_server_falls_back_saying_the_api_is_absent(tmp_path: Path) -> None:
    for k in _open(tmp_path, "1.33"):
        out = _isolate(k)
        assert not out.isolated
        assert "serves no DeviceTaintRule" in out.why_not


def test_rbac_refusal_falls_back_saying_so(k137: Cluster) -> None:
    k137.faults({"verb": "create", "resource": "devicetaintrules", "status": 403})
    out = _isolate(k137)
    assert not out.isolated
    assert "not allowed to create DeviceTaintRules" in out.why_not
    assert "forbidden" in out.why_not


def test_unknown_uuid_falls_back(k137: Cluster) -> None:
    out = _isolate(k137, uuid="GPU-00000000-0000-0000-0000-000000000000")
    assert not out.isolated and "no device" in out.why_not


def test_a_slice_for_another_pool_is_not_believed(k137: Cluster) -> None:
    """A node's DRA plugin writes its slices: node 02 claiming node 01's GPU in its own
    slice (or a slice naming 01's pool) never gets a rule for node 02, nor for 01."""
    custom = client.CustomObjectsApi(k137.api)
    custom.create_cluster_custom_object(GROUP, "v1", "resourceslices", {
        "metadata": {"name": "hostile"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-node-02",
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-3", "attributes": {"uuid": {"string": UUID3}}}]},
    })
    out = _isolate(k137, node="gpu-node-02")
    assert not out.isolated and "no device" in out.why_not


async def test_release_orphan_removes_a_dead_remediations_rule_on_that_node_only(
        k137: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-GPU remediation that was terminated leaves its DeviceTaintRule and an
    untouched node: release-orphan deletes that rule (ours, its owner, its node's pool) and
    nothing else, and says so in an Event; while the remediation runs, nothing goes."""
    from activities.exporter_settings import ExporterSettings
    from activities.fleet import FleetActivities
    from workflows.messages import OrphanRelease

    mine = _isolate(k137)
    other = _isolate(k137, node="gpu-node-02", uuid=f"GPU-{gpu_uuid('gpu-node-02', 1)}")
    custom = client.CustomObjectsApi(k137.api)
    # Someone else's rule for the same node's GPU 0, and one of ours naming another owner.
    custom.create_cluster_custom_object(GROUP, "v1", "devicetaintrules", {
        "metadata": {"name": "admin-gpu-0", "labels": {"team": "infra"},
                     "annotations": {"gpu-remediate.io/node": NODE}},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE,
                                    "device": "gpu-0"},
                 "taint": {"key": "infra", "effect": "NoSchedule"}}})
    forged = dict(_rule(k137, mine.rule))
    forged["metadata"] = {"name": "gpu-remediate.gpu-5." + NODE,
                          "labels": forged["metadata"]["labels"],
                          "annotations": {**forged["metadata"]["annotations"],
                                          "gpu-remediate.io/workflow-id": "someone-else"}}
    forged["spec"] = {**forged["spec"], "deviceSelector": {
        "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-5"}}
    forged.pop("status", None)
    custom.create_cluster_custom_object(GROUP, "v1", "devicetaintrules", forged)
    fleet = FleetActivities(k137.api, ExporterSettings(mode="template"))
    release = OrphanRelease(node=NODE, operator="dana", reason="workflow was terminated")

    async def running(node: str) -> bool:
        return False
    monkeypatch.setattr(fleet, "_gone", running)
    with pytest.raises(ApplicationError, match="not an orphan"):
        await ActivityEnvironment().run(fleet.release_orphan, release)
    assert mine.rule in {r["metadata"]["name"] for r in _rules(k137)}

    async def gone(node: str) -> bool:
        return True
    monkeypatch.setattr(fleet, "_gone", gone)
    await ActivityEnvironment().run(fleet.release_orphan, release)
    left = {r["metadata"]["name"] for r in _rules(k137)}
    assert left == {other.rule, "admin-gpu-0", "gpu-remediate.gpu-5." + NODE}
    said = " ".join(e.message or "" for e in k137.events(NODE, "OrphanReleased"))
    assert f"DeviceTaintRule {mine.rule} removed" in said and "dana" in said, said
    from activities.record import RecordStore
    record = RecordStore(client.CoreV1Api(k137.api), "default").read(NODE).record
    assert record is not None and record.gpu_quarantines == {}
    node = k137.node(NODE)
    assert not node.spec.unschedulable and not node.spec.taints


async def test_release_orphan_refuses_when_it_cannot_look_for_the_rules(
        k137: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """RBAC without `list` on DeviceTaintRules: the orphan lease is not released while a
    GPU may still be isolated with nobody holding it."""
    from activities.exporter_settings import ExporterSettings
    from activities.fleet import FleetActivities
    from workflows.messages import OrphanRelease

    mine = _isolate(k137)
    k137.faults({"verb": "list", "resource": "devicetaintrules", "status": 403})
    fleet = FleetActivities(k137.api, ExporterSettings(mode="template"))

    async def gone(node: str) -> bool:
        return True
    monkeypatch.setattr(fleet, "_gone", gone)
    with pytest.raises(ApplicationError, match="not allowed to list DeviceTaintRules"):
        await ActivityEnvironment().run(fleet.release_orphan, OrphanRelease(
            node=NODE, operator="dana", reason="workflow was terminated"))
    k137.faults()
    assert mine.rule in {r["metadata"]["name"] for r in _rules(k137)}


def test_the_nodes_record_keeps_the_isolated_gpu_until_its_rule_goes(k137: Cluster) -> None:
    """The quarantine lives where the node cannot write (its record, a ConfigMap), beside
    the rule: a worker started again or a re-created Node object still shows it."""
    from activities.record import RecordStore

    records = RecordStore(client.CoreV1Api(k137.api), "default")
    acts = GpuIsolationActivities(k137.api, "default")
    out = ActivityEnvironment().run(acts.isolate_gpu, IsolateGpuInput(
        node=NODE, uuid=UUID3, gpu="3", value="xid-48-drain-and-reset",
        reason="XID 48 on GPU 3", workflow_id=f"remediation-{NODE}"))
    held = records.read(NODE).record
    assert held is not None and set(held.gpu_quarantines) == {UUID3}
    note = held.gpu_quarantines[UUID3]
    assert (note.rule, note.device, note.workflow_id, note.reason) == (
        out.rule, "gpu-3", f"remediation-{NODE}", "XID 48 on GPU 3")
    ActivityEnvironment().run(acts.set_gpu_taint, GpuTaintInput(
        rule=out.rule, api_version=out.api_version, node=NODE, effect=None))
    after = records.read(NODE).record
    assert after is not None and after.gpu_quarantines == {}


def test_a_record_that_cannot_be_written_never_undoes_an_isolation(k137: Cluster) -> None:
    k137.faults({"verb": "create", "resource": "configmaps", "status": 500})
    out = _isolate(k137)
    assert out.isolated and out.rule in {r["metadata"]["name"] for r in _rules(k137)}


def _fleet_with_gpu3_isolated(k137: Cluster) -> tuple[Any, Any]:
    """The fleet activities on the 1.37 cluster, and GPU 3 of NODE isolated by this node's
    remediation (its DeviceTaintRule and the record's note)."""
    from activities.exporter_settings import ExporterSettings
    from activities.fleet import FleetActivities

    fleet = FleetActivities(k137.api, ExporterSettings(mode="template"), record_namespace="default")
    mine = ActivityEnvironment().run(GpuIsolationActivities(k137.api, "default").isolate_gpu,
                                     IsolateGpuInput(node=NODE, uuid=UUID3, gpu="3",
                                                     value="xid-48-drain-and-reset",
                                                     reason="XID 48 on GPU 3",
                                                     workflow_id=f"remediation-{NODE}"))
    return fleet, mine


async def test_a_gpu_held_with_its_remediation_gone_is_found_from_the_record(
        k137: Cluster) -> None:
    """A per-GPU remediation never labels its node. Terminated while it holds a GPU, it
    leaves a DeviceTaintRule that keeps the GPU out for good; only the controller's record
    knows. The observation finds it there: an orphan, one Warning Event (the record notes
    it was said, where the node cannot write), release-orphan accepted and removing the
    rule. While the remediation runs, the held GPU is no orphan."""
    from activities.record import RecordStore
    from tests.activities.test_fleet import _Temporal
    from workflows.messages import ObserveInput, OrphanRelease
    from workflows.settings import PolicySettings

    fleet, mine = _fleet_with_gpu3_isolated(k137)
    assert mine.isolated
    records = RecordStore(client.CoreV1Api(k137.api), "default")

    async def observe(running: dict[str, str]) -> list[str]:
        env = ActivityEnvironment(client=_Temporal(running))  # type: ignore[arg-type]
        obs = await env.run(fleet.observe_fleet, ObserveInput(policy=PolicySettings()))
        return obs.orphans

    assert await observe({f"remediation-{NODE}": "RemediationWorkflow"}) == []
    assert not k137.events(NODE, "GpuQuarantineOrphaned")
    # Terminated: the rule stays, nothing would ever release it.
    assert await observe({}) == [NODE]
    said = k137.events(NODE, "GpuQuarantineOrphaned")
    assert len(said) == 1 and said[0].type == "Warning"
    assert mine.rule in (said[0].message or "") and "release-orphan" in (said[0].message or "")
    note = records.read(NODE).record.gpu_quarantines[UUID3]  # type: ignore[union-attr]
    assert note.orphaned is not None
    # Said once: the next ticks still count it, without another Event.
    assert await observe({}) == [NODE]
    assert len(k137.events(NODE, "GpuQuarantineOrphaned")) == 1
    # A node's own annotations cannot silence it: the note is in the record.
    k137.core.patch_node(NODE, {"metadata": {"annotations": {"gpu-remediate.io/orphaned": "x"}}})
    assert await observe({}) == [NODE]

    async def gone(node: str) -> bool:
        return True
    fleet._gone = gone  # type: ignore[method-assign]
    await ActivityEnvironment().run(fleet.release_orphan, OrphanRelease(
        node=NODE, operator="dana", reason="GPU 3 replaced"))
    assert mine.rule not in {r["metadata"]["name"] for r in _rules(k137)}
    assert records.read(NODE).record.gpu_quarantines == {}  # type: ignore[union-attr]
    del fleet._gone
    assert await observe({}) == []


async def test_a_note_whose_rule_was_deleted_by_hand_is_cleared_by_release_orphan(
        k137: Cluster) -> None:
    """Someone deleted the DeviceTaintRule of a dead per-GPU remediation by hand: the
    record's note still makes the node an orphan each tick, and release-orphan, finding no
    rule to remove, must still end it (clear the note, say so), never refuse it as "not an
    orphan" and leave it reported for good."""
    from activities.record import RecordStore
    from tests.activities.test_fleet import _Temporal
    from workflows.messages import ObserveInput, OrphanRelease
    from workflows.settings import PolicySettings

    fleet, mine = _fleet_with_gpu3_isolated(k137)
    client.CustomObjectsApi(k137.api).delete_cluster_custom_object(
        GROUP, "v1", "devicetaintrules", mine.rule)
    records = RecordStore(client.CoreV1Api(k137.api), "default")

    async def observe() -> list[str]:
        env = ActivityEnvironment(client=_Temporal({}))  # type: ignore[arg-type]
        obs = await env.run(fleet.observe_fleet, ObserveInput(policy=PolicySettings()))
        return obs.orphans

    assert await observe() == [NODE]
    await ActivityEnvironment(client=_Temporal({})).run(  # type: ignore[arg-type]
        fleet.release_orphan, OrphanRelease(node=NODE, operator="dana", reason="rule gone"))
    assert records.read(NODE).record.gpu_quarantines == {}  # type: ignore[union-attr]
    said = " ".join(e.message or "" for e in k137.events(NODE, "OrphanReleased"))
    assert f"note of DeviceTaintRule {mine.rule} cleared (the rule was already gone)" in said
    assert await observe() == []
