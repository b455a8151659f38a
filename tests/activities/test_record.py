"""The record (activities/record.py): what the controller remembers about a node, in a
ConfigMap a kubelet cannot write. Pure parts first, then against the cluster simulator:
the claim, the release and the observation read and write it, never the annotations."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import record as record_module
from activities.exporter_settings import ExporterSettings
from activities.fleet import FleetActivities
from activities.node_keys import A_ACK_XIDS, A_HISTORY, A_XID_SIGHTINGS
from activities.nodes import RECORD_UNREADABLE, NodeActivities
from activities.record import (
    HISTORY_KEEP,
    MAX_CONFIGMAP_BYTES,
    MAX_GPUS,
    MAX_KEY,
    MAX_TEXT,
    GpuQuarantineNote,
    NodeRecord,
    RecordStore,
    reconcile_identity,
    record_name,
    with_release,
)
from activities.xid_sightings import MAX_SIGHTINGS_PER_GPU, GpuXidTrack
from policy.config import PolicySettings
from policy.models import Action
from tests.activities.conftest import Cluster, ThreadedGpuSim, metric
from workflows.messages import ClaimInput, HistoryEntry, ObserveInput, ReleaseInput
from workflows.transitions import NodeState

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NODE = "gpu-node-01"
NS = "default"


def entry(i: int = 0, *, wf: str = "remediation-x", repaired: bool = True,
          at: datetime = NOW) -> HistoryEntry:
    started = at - timedelta(hours=i)
    return HistoryEntry(started=started, finished=started + timedelta(minutes=5),
                        action="reboot", reason="XID 79", outcome="healthy",
                        workflow_id=f"{wf}-{i}", repaired=repaired)


# --- pure -------------------------------------------------------------------------------------

def test_the_worst_record_within_the_bounds_fits_a_configmap() -> None:
    """Every field at its bound, every string at its cap: well under 1 MiB (the API
    server refuses more), so a write never fails for size."""
    long = "x" * 10_000
    track = GpuXidTrack(shown=13, counts={x: 2**31 for x in range(100)},
                        seen=[(13, 1e12 + i) for i in range(500)])
    worst = NodeRecord(
        node="n" * 253, uid="u" * 500, previous_uid="p" * 500,
        gpus=[f"GPU-{i:04d}" + "g" * 300 for i in range(500)],
        history=[HistoryEntry(started=NOW - timedelta(minutes=i), finished=NOW,
                              action=long, reason=long, outcome=long, workflow_id=long,
                              by=long, repaired=True) for i in range(500)],
        acknowledged={f"GPU-{i:04d}" + "a" * 300: 79 for i in range(500)},
        sightings={f"GPU-{i:04d}" + "s" * 300: track for i in range(500)},
        repairs={f"GPU-{i:04d}" + "r" * 300: 2**31 for i in range(500)},
        gpu_quarantines={f"GPU-{i:04d}" + "q" * 300: GpuQuarantineNote(
            rule=long, device=long, since=NOW, workflow_id=long, reason=long)
            for i in range(500)},
        seeded_from_annotations=NOW, updated=NOW,
    ).bounded(NOW)
    assert len(worst.history) == HISTORY_KEEP
    assert len(worst.gpus) == len(worst.acknowledged) == len(worst.sightings) == MAX_GPUS
    assert all(len(t.seen) == MAX_SIGHTINGS_PER_GPU for t in worst.sightings.values())
    assert all(len(h.reason) == MAX_TEXT for h in worst.history)
    assert all(len(k) == MAX_KEY for k in worst.acknowledged)
    assert len(worst.gpu_quarantines) == MAX_GPUS
    assert all(len(q.reason) == MAX_TEXT for q in worst.gpu_quarantines.values())
    size = len(worst.dump().encode()) + len("record.json")
    assert size < MAX_CONFIGMAP_BYTES, size


def test_history_is_kept_within_its_retention_and_count() -> None:
    rec = NodeRecord(node="n", history=[entry(0, at=NOW - timedelta(days=91)),
                                        *(entry(i) for i in range(60))]).bounded(NOW)
    assert len(rec.history) == HISTORY_KEEP
    assert all(h.started > NOW - timedelta(days=90) for h in rec.history)


def test_record_names_fit_and_long_node_names_never_share_one() -> None:
    assert record_name("gpu-node-01") == "gpu-remediate-record-gpu-node-01"
    a, b = "a" * 240 + "-x", "a" * 240 + "-y"
    assert record_name(a) != record_name(b)
    assert len(record_name(a)) <= 253 and len(record_name(b)) <= 253


def test_a_node_recreated_with_the_same_gpus_keeps_its_record() -> None:
    rec = NodeRecord(node="n", uid="uid-1", gpus=["GPU-a", "GPU-b"], history=[entry()])
    same, change = reconcile_identity(rec, "uid-2", {"GPU-a", "GPU-b"}, NOW)
    assert change == "rebound" and same.uid == "uid-2" and same.previous_uid == "uid-1"
    assert same.history == rec.history


def test_another_machine_under_the_same_name_inherits_nothing() -> None:
    rec = NodeRecord(node="n", uid="uid-1", gpus=["GPU-a"], history=[entry()],
                     acknowledged={"GPU-a": 79})
    fresh, change = reconcile_identity(rec, "uid-2", {"GPU-z"}, NOW)
    assert change == "replaced" and fresh.uid == "uid-2"
    assert fresh.history == [] and fresh.acknowledged == {}


def test_without_gpus_to_compare_a_new_uid_keeps_the_record_unchanged() -> None:
    """Unconfirmed identity fails closed: the history stays, nothing is rebound."""
    rec = NodeRecord(node="n", uid="uid-1", gpus=["GPU-a"], history=[entry()])
    kept, change = reconcile_identity(rec, "uid-2", set(), NOW)
    assert change == "" and kept == rec


def test_a_release_is_recorded_once_and_counts_repairs_per_gpu() -> None:
    rec = NodeRecord(node="n", sightings={"GPU-a": GpuXidTrack(shown=13, seen=[(13, 1.0)])})
    once = with_release(rec, entry(), {"GPU-a": 79, "index:3": 48})
    twice = with_release(once, entry(), {"GPU-a": 79, "index:3": 48})  # a retried release
    assert len(twice.history) == 1
    assert twice.repairs == {"GPU-a": 1}
    assert twice.acknowledged == {"GPU-a": 79, "index:3": 48}
    assert twice.sightings["GPU-a"].seen == [] and twice.sightings["GPU-a"].shown == 13
    assert "GPU-a" in twice.gpus


@pytest.mark.parametrize("text, why", [
    ("{not json", "Invalid JSON"),
    ("[" * 5000, "nested deeper"),
    ('{"node": "gpu-node-01", "history": [{"started": "x"}]}', "history.0"),
    ('{"node": "other-node"}', "names node"),
])
def test_an_unparsable_record_is_unreadable_with_the_reason(text: str, why: str) -> None:
    loaded = record_module.parse_configmap({
        "metadata": {"annotations": {record_module.A_RECORD_NODE: NODE},
                     "resourceVersion": "7"},
        "data": {"record.json": text}})
    assert loaded.record is None and loaded.exists
    assert why in loaded.problem


# --- against the simulator ---------------------------------------------------------------------

def claim(wf: str = "remediation-gpu-node-01", run: str = "run-1") -> ClaimInput:
    return ClaimInput(node=NODE, state=NodeState.DRAINING, reason="XID 79", action=Action.REBOOT,
                      workflow_id=wf, run_id=run, now=NOW)


def release(e: HistoryEntry, acked: dict[str, int] | None = None) -> ReleaseInput:
    return ReleaseInput(node=NODE, outcome="healthy", uncordon=True, history=e,
                        acknowledged_xids=acked or {}, event_reason="RemediationFinished",
                        event_message="finished")


def stored(cluster: Cluster, node: str = NODE) -> dict[str, Any]:
    cm = cluster.core.read_namespaced_config_map(record_name(node), NS)
    assert cm.metadata.labels["app.kubernetes.io/managed-by"] == "gpu-remediate"
    return dict(json.loads(cm.data["record.json"]))


def remediate(cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment, i: int,
              acked: dict[str, int] | None = None) -> Any:
    e = entry(i, wf=f"remediation-gpu-node-01-{i}")
    result = env.run(acts.claim_node, claim(wf=e.workflow_id, run=f"run-{i}"))
    env.run(acts.release_node, release(e, acked))
    return result


def test_a_node_that_wipes_its_history_still_counts_its_repairs(cluster: Cluster) -> None:
    """Issue 29: the repeat-offender rule read the node-writable history annotation; a node
    that wiped it between repairs was drained and rebooted forever, never quarantined."""
    acts, env = NodeActivities(cluster.api, NS), ActivityEnvironment()
    for i in range(3):
        remediate(cluster, acts, env, i)
        cluster.core.patch_node(NODE, {"metadata": {"annotations": {A_HISTORY: None}}})
    result = env.run(acts.claim_node, claim(wf="remediation-gpu-node-01-9", run="run-9"))
    assert result.recent_remediations == 3
    assert len(stored(cluster)["history"]) == 3


def test_a_forged_history_annotation_changes_nothing_the_claim_reads(cluster: Cluster) -> None:
    acts, env = NodeActivities(cluster.api, NS), ActivityEnvironment()
    remediate(cluster, acts, env, 0)
    forged = json.dumps([entry(i, wf="forged").model_dump(mode="json") for i in range(10)])
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {A_HISTORY: forged}}})
    result = env.run(acts.claim_node, claim(wf="remediation-gpu-node-01-9", run="run-9"))
    assert [h.workflow_id for h in result.history] == ["remediation-gpu-node-01-0-0"]


@pytest.mark.parametrize("conflict", [False, True], ids=["quiet", "node-patch-conflict"])
def test_the_release_writes_the_record_first_and_mirrors_it_on_the_node(
        cluster: Cluster, conflict: bool) -> None:
    acts, env = NodeActivities(cluster.api, NS), ActivityEnvironment()
    cluster.clear_writes()
    e = entry(0, wf="remediation-gpu-node-01-0")
    env.run(acts.claim_node, claim(wf=e.workflow_id, run="run-0"))
    if conflict:  # what a kubelet's status update between read and patch gives
        cluster.faults({"verb": "patch", "resource": "nodes", "name": NODE, "status": 409,
                        "times": 1})
    env.run(acts.release_node, release(e, {"GPU-3": 79}))
    # The writes that landed: a guarded node patch refused with 409 (the kubelet's status
    # update moved the resourceVersion in between) is logged too, then done again.
    writes = [w for w in cluster.writes() if w["resource"] in ("configmaps", "nodes")
              and w["verb"] != "get" and w["code"] < 300]
    release_writes = [w["resource"] for w in writes][-2:]
    assert release_writes == ["configmaps", "nodes"], writes
    record = stored(cluster)
    assert record["acknowledged"] == {"GPU-3": 79} and record["repairs"] == {"GPU-3": 1}
    ann = cluster.node(NODE).metadata.annotations
    assert json.loads(ann[A_ACK_XIDS]) == {"GPU-3": 79}
    assert [h["workflow_id"] for h in json.loads(ann[A_HISTORY])] == [
        h["workflow_id"] for h in record["history"]]


def test_an_upgraded_node_seeds_its_record_from_its_annotations_once(cluster: Cluster) -> None:
    """The last time annotations are trusted: the first claim after the upgrade; a wipe
    after that changes nothing."""
    old = [entry(i, wf="before-upgrade").model_dump(mode="json") for i in range(2)]
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {
        A_HISTORY: json.dumps(old), A_ACK_XIDS: json.dumps({"GPU-1": 48})}}})
    acts, env = NodeActivities(cluster.api, NS), ActivityEnvironment()
    first = env.run(acts.claim_node, claim())
    assert first.recent_remediations == 2
    record = stored(cluster)
    assert record["seeded_from_annotations"] and record["acknowledged"] == {"GPU-1": 48}
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {A_HISTORY: None,
                                                                A_ACK_XIDS: None}}})
    again = env.run(acts.claim_node, claim(run="run-2"))
    assert again.recent_remediations == 2


def test_an_unreadable_record_fails_the_claim_untouched_and_is_never_overwritten(
        cluster: Cluster) -> None:
    cluster.core.create_namespaced_config_map(NS, {
        "metadata": {"name": record_name(NODE), "labels": {
            "app.kubernetes.io/managed-by": "gpu-remediate", "gpu-remediate.io/node": NODE},
            "annotations": {record_module.A_RECORD_NODE: NODE}},
        "data": {"record.json": "{garbled"}})
    before = metric("gpu_remediate_record_unreadable_total") or 0.0
    acts, env = NodeActivities(cluster.api, NS), ActivityEnvironment()
    with pytest.raises(ApplicationError) as err:
        env.run(acts.claim_node, claim())
    assert err.value.type == RECORD_UNREADABLE and not err.value.non_retryable
    node = cluster.node(NODE)
    assert not node.spec.unschedulable, "the claim touched nothing"
    assert cluster.events(NODE, "RecordUnreadable")
    assert (metric("gpu_remediate_record_unreadable_total") or 0.0) == before + 1
    # A release (of a remediation claimed before the damage) still returns the node and
    # leaves the evidence alone.
    env.run(acts.release_node, release(entry()))
    cm = cluster.core.read_namespaced_config_map(record_name(NODE), NS)
    assert cm.data["record.json"] == "{garbled"
    assert A_HISTORY in (cluster.node(NODE).metadata.annotations or {})


def test_concurrent_writers_lose_nothing(cluster: Cluster) -> None:
    """Replace is guarded by resourceVersion: a stale write conflicts (409) and is
    applied again to the fresh record."""
    store = RecordStore(cluster.core, NS)
    store.update(NODE, lambda cur: NodeRecord(node=NODE, history=[entry(0)]), NOW)
    stale = store.read(NODE)
    store.update(NODE, lambda cur: cur.model_copy(update={"history": [*cur.history, entry(1)]})
                 if cur else None, NOW)

    def add(cur: NodeRecord | None) -> NodeRecord | None:
        assert cur is not None
        return cur.model_copy(update={"history": [*cur.history, entry(2)]})

    store.update(NODE, add, NOW, known=stale)
    assert len(store.read(NODE).record.history) == 3  # type: ignore[union-attr]
    conflicts = [w for w in cluster.writes("configmaps") if w["code"] == 409]
    assert len(conflicts) == 1


# --- the observation ---------------------------------------------------------------------------

def template(gpu: ThreadedGpuSim) -> ExporterSettings:
    return ExporterSettings(mode="template", timeout_seconds=2.0,
                            url_template=f"{gpu.url}/nodes/{{node}}/metrics")


async def observe(fleet: FleetActivities) -> Any:
    return await ActivityEnvironment().run(
        fleet.observe_fleet, ObserveInput(policy=PolicySettings()))


async def test_a_forged_acknowledgement_hides_no_xid(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    """A node acknowledging its own XID in its annotation hid it; now the record decides,
    the mirror is rewritten and the forgery reported once."""
    fleet = FleetActivities(cluster.api, template(gpu_sim), record_namespace=NS)
    await observe(fleet)  # after the upgrade: records seeded for what nodes carried (nothing)
    gpu_sim.client.inject_fault("gpu-node-02", 3, "xid", 79)
    obs = await observe(fleet)
    uuid = next(f.uuid for v in obs.verdicts for f in v.findings if v.node == "gpu-node-02")
    cluster.core.patch_node("gpu-node-02", {"metadata": {"annotations": {
        A_ACK_XIDS: json.dumps({uuid: 79})}}})
    # A node that never had a record yet seeds it from its annotations once (the upgrade):
    # give it one first, as any node has after its first write.
    RecordStore(cluster.core, NS).update(
        "gpu-node-02", lambda cur: cur or NodeRecord(node="gpu-node-02", history=[entry()]),
        NOW)
    before = metric("gpu_remediate_state_mismatch_total", kind="acknowledged-xids") or 0.0
    for _ in range(2):
        obs = await observe(fleet)
        assert ("gpu-node-02", Action.REBOOT) in [(v.node, v.action) for v in obs.verdicts]
    assert A_ACK_XIDS not in (cluster.node("gpu-node-02").metadata.annotations or {})
    events = cluster.events("gpu-node-02", "StateMismatch")
    assert len(events) == 1 and "acknowledged-xids" in events[0].message
    assert metric("gpu_remediate_state_mismatch_total", kind="acknowledged-xids") == before + 1


async def test_sightings_live_in_the_record_and_one_list_reads_them_all(
        cluster: Cluster, gpu_sim: ThreadedGpuSim,
        monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = FleetActivities(cluster.api, template(gpu_sim), record_namespace=NS)
    lists: list[int] = []
    real = fleet.records.list
    monkeypatch.setattr(fleet.records, "list", lambda: lists.append(1) or real())
    reads: list[str] = []
    real_read = fleet.records.read
    monkeypatch.setattr(fleet.records, "read", lambda n: reads.append(n) or real_read(n))
    gpu_sim.client.inject_fault("gpu-node-03", 1, "xid", 13)
    await observe(fleet)
    assert lists == [1] and reads == [], "one List per tick, no GET per node"
    record = stored(cluster, "gpu-node-03")
    assert [x for track in record["sightings"].values() for x, _ in track["seen"]] == [13]
    mirrored = json.loads(cluster.node("gpu-node-03").metadata.annotations[A_XID_SIGHTINGS])
    assert mirrored == record["sightings"]
    # Wiping the mirror forgets nothing: the next sighting still counts the first.
    cluster.core.patch_node("gpu-node-03", {"metadata": {"annotations": {
        A_XID_SIGHTINGS: None}}})
    gpu_sim.client.inject_fault("gpu-node-03", 1, "xid", 31)
    await observe(fleet)
    record = stored(cluster, "gpu-node-03")
    assert sorted(x for track in record["sightings"].values() for x, _ in track["seen"]) \
        == [13, 31]


def _uuids(gpu_sim: ThreadedGpuSim, node: str) -> list[str]:
    text = httpx.get(f"{gpu_sim.url}/nodes/{node}/metrics").text
    return sorted({part.split('"', 2)[1] for line in text.splitlines() if 'UUID="' in line
                   for part in line.split("UUID=")[1:]})


async def test_a_recreated_node_keeps_its_record_and_another_machine_starts_afresh(
        cluster: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    store = RecordStore(cluster.core, NS)
    same, other = "gpu-node-01", "gpu-node-02"
    mine = _uuids(gpu_sim, same)
    assert mine
    for node, gpus in ((same, mine), (other, ["GPU-from-another-machine"])):
        store.update(node, lambda cur, node=node, gpus=gpus: NodeRecord(
            node=node, uid="uid-before", gpus=gpus, history=[entry()],
            acknowledged={gpus[0]: 79}), NOW)
    await observe(FleetActivities(cluster.api, template(gpu_sim), record_namespace=NS))
    kept = stored(cluster, same)
    assert kept["uid"] == cluster.node(same).metadata.uid and kept["previous_uid"] == "uid-before"
    assert len(kept["history"]) == 1 and set(mine) <= set(kept["gpus"])
    assert cluster.events(same, "RecordKept")
    fresh = stored(cluster, other)
    assert fresh["uid"] == cluster.node(other).metadata.uid
    assert fresh.get("history", []) == [] and fresh["gpus"] == _uuids(gpu_sim, other)
    assert cluster.events(other, "RecordReset")
