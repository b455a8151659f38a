"""claim_node / set_node_state / release_node against the cluster simulator."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.node_keys import (
    A_ACK_XIDS,
    A_HISTORY,
    A_PRECORDONED,
    A_REASON,
    A_RUN,
    A_SINCE,
    A_STEP,
    A_WORKFLOW,
    A_XID_SIGHTINGS,
    EXCLUDE_LABEL,
    IN_FLIGHT_ANNOTATIONS,
    STATE_LABEL,
    TAINT_KEY,
)
from activities.nodes import UNSCHEDULABLE_TAINT, NodeActivities
from policy.models import Action
from tests.activities.conftest import Cluster
from tests.polling import wait_for
from workflows import errors
from workflows.messages import ClaimInput, HistoryEntry, ReleaseInput, StateInput
from workflows.transitions import NodeState

NODE = "gpu-node-01"
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
Outcome = Literal["healthy", "quarantined", "released", "aborted"]
OTHER_TAINT = {"key": "example.com/maintenance", "value": "yes", "effect": "NoExecute"}


def claim(node: str = NODE, *, wf: str = "remediation-x", dry_run: bool = False,
          now: datetime = T0) -> ClaimInput:
    return ClaimInput(node=node, state=NodeState.DRAINING, reason="XID 79 on GPU 3",
                      action=Action.REBOOT, workflow_id=wf, run_id="run-1", now=now,
                      dry_run=dry_run)


def release(node: str = NODE, *, outcome: Outcome = "healthy", uncordon: bool = True,
            acked: dict[str, int] | None = None, started: datetime = T0,
            wf: str = "remediation-x") -> ReleaseInput:
    return ReleaseInput(
        node=node, outcome=outcome, uncordon=uncordon,
        history=HistoryEntry(started=started, finished=started + timedelta(minutes=5),
                             action="reboot", reason="XID 79", outcome=outcome,
                             workflow_id=wf),
        acknowledged_xids=acked or {}, event_reason="RemediationFinished",
        event_message=f"finished: {outcome}",
    )


def taint_keys(node: Any) -> list[str]:
    return [t.key for t in node.spec.taints or []]


def add_taint(k: Cluster, node: str, taint: dict[str, str]) -> None:
    current = [t.to_dict() for t in k.node(node).spec.taints or []]
    body = [{"key": t["key"], "value": t.get("value"), "effect": t["effect"]} for t in current]
    k.core.patch_node(node, {"spec": {"taints": [*body, taint]}})


@pytest.fixture
def acts(cluster: Cluster) -> NodeActivities:
    return NodeActivities(cluster.api)


def test_claim_cordons_taints_labels_and_annotates(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    add_taint(cluster, NODE, OTHER_TAINT)
    result = env.run(acts.claim_node, claim())
    node = cluster.node(NODE)
    assert node.spec.unschedulable is True
    assert TAINT_KEY in taint_keys(node) and OTHER_TAINT["key"] in taint_keys(node)
    assert node.metadata.labels[STATE_LABEL] == "draining"
    ann = node.metadata.annotations
    assert ann[A_WORKFLOW] == "remediation-x" and ann[A_REASON] == "XID 79 on GPU 3"
    assert ann[A_PRECORDONED] == "false" and ann[A_SINCE] == T0.isoformat()
    assert (result.previously_cordoned, result.gpus, result.recent_remediations) == (False, 8, 0)
    assert [e.reason for e in cluster.events(NODE)] == ["RemediationStarted"]


def test_claim_keeps_a_taint_added_between_its_read_and_its_patch(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    real_read = acts.core.read_node
    reads = []

    def read_then_someone_taints(name: str, **kw: Any) -> Any:
        node = real_read(name, **kw)
        assert node.metadata is not None
        reads.append(node.metadata.resource_version)
        if len(reads) == 1:  # another controller taints the node after our read
            add_taint(cluster, name, OTHER_TAINT)
        return node

    acts.core.read_node = read_then_someone_taints  # type: ignore[method-assign,assignment]
    env.run(acts.claim_node, claim())
    node = cluster.node(NODE)
    assert len(reads) == 2, "the stale patch must have hit a 409 and been recomputed"
    assert OTHER_TAINT["key"] in taint_keys(node) and TAINT_KEY in taint_keys(node)
    conflicts = [w for w in cluster.writes("nodes") if w["verb"] == "patch" and w["code"] == 409]
    assert len(conflicts) == 1


def test_claim_retry_of_the_same_workflow_keeps_pre_cordoned_as_first_recorded(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    first = env.run(acts.claim_node, claim())
    again = env.run(acts.claim_node, claim(now=T0 + timedelta(minutes=1)))
    ann = cluster.node(NODE).metadata.annotations
    assert (first.previously_cordoned, again.previously_cordoned) == (False, False)
    assert ann[A_PRECORDONED] == "false"
    assert ann[A_SINCE] == T0.isoformat(), "a retry keeps when the remediation started"
    assert taint_keys(cluster.node(NODE)).count(TAINT_KEY) == 1


def test_claim_of_a_node_an_admin_cordoned_reports_previously_cordoned(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.cordon(NODE)
    result = env.run(acts.claim_node, claim())
    assert result.previously_cordoned is True
    assert cluster.node(NODE).metadata.annotations[A_PRECORDONED] == "true"


def test_claim_does_not_take_a_node_written_workflow_annotation_for_its_own(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    # An admin cordoned the node; the node (a kubelet may annotate its own Node) then wrote
    # our workflow id, which is derived from its name, and "not cordoned before us".
    cluster.cordon(NODE)
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {
        A_WORKFLOW: "remediation-x", A_PRECORDONED: "false", A_RUN: "guessed"}}})
    result = env.run(acts.claim_node, claim())
    assert result.previously_cordoned is True, "the admin's cordon is kept at the end"
    assert cluster.node(NODE).metadata.annotations[A_PRECORDONED] == "true"


def test_claim_dry_run_writes_nothing_to_nodes(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.clear_writes()
    result = env.run(acts.claim_node, claim(dry_run=True))
    assert cluster.writes("nodes") == []
    node = cluster.node(NODE)
    assert not node.spec.unschedulable and STATE_LABEL not in (node.metadata.labels or {})
    assert result.gpus == 8
    # The plan is still shown: a [dry-run] Event is the only write.
    assert [w["resource"] for w in cluster.writes()] == ["events"]
    assert cluster.events(NODE)[0].message.startswith("[dry-run]")


def test_claim_of_a_missing_node_is_a_non_retryable_node_gone(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    """The node's own 404 is its own type (workflows/errors.py), not a NotFound the workflow
    would have to recognise by its message."""
    with pytest.raises(ApplicationError) as err:
        env.run(acts.claim_node, claim("no-such-node"))
    assert err.value.type == errors.NODE_GONE and err.value.non_retryable


def test_claim_retries_through_a_storm_of_conflicts(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.faults({"verb": "patch", "resource": "nodes", "status": 409, "rate": 0.5}, seed=3)
    env.run(acts.claim_node, claim())
    assert cluster.node(NODE).spec.unschedulable is True
    assert cluster.injected()["injected"] >= 1


def test_claim_gives_up_retryably_when_every_patch_conflicts(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.faults({"verb": "patch", "resource": "nodes", "status": 409})
    with pytest.raises(ApplicationError) as err:
        env.run(acts.claim_node, claim())
    assert err.value.type == "Conflict" and not err.value.non_retryable


def test_set_node_state_writes_label_annotations_and_event(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    env.run(acts.claim_node, claim())
    env.run(acts.set_node_state, StateInput(
        node=NODE, state=NodeState.VALIDATING, reason="XID 79", step="validate",
        now=T0 + timedelta(minutes=3), attempt=2, event_reason="ValidationStarted",
        event_message="attempt 2: validation Job"))
    node = cluster.node(NODE)
    assert node.metadata.labels[STATE_LABEL] == "validating"
    assert node.metadata.annotations[A_STEP] == "validate"
    assert node.metadata.annotations["gpu-remediate.io/attempt"] == "2"
    assert node.spec.unschedulable is True and TAINT_KEY in taint_keys(node)
    event = cluster.events(NODE, "ValidationStarted")[0]
    assert event.message == "attempt 2: validation Job" and event.type == "Normal"


def test_release_healthy_uncordons_removes_our_taint_and_keeps_others(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    add_taint(cluster, NODE, OTHER_TAINT)
    env.run(acts.claim_node, claim())
    # The node lifecycle controller adds the unschedulable taint to a cordoned node.
    wait_for(lambda: UNSCHEDULABLE_TAINT in taint_keys(cluster.node(NODE)))
    env.run(acts.release_node, release(acked={"GPU-abc": 79}))
    node = cluster.node(NODE)
    assert not node.spec.unschedulable
    assert taint_keys(node) == [OTHER_TAINT["key"]]
    assert node.metadata.labels[STATE_LABEL] == "healthy"
    ann = node.metadata.annotations or {}
    assert not set(IN_FLIGHT_ANNOTATIONS) & set(ann)
    history = json.loads(ann[A_HISTORY])
    assert [h["outcome"] for h in history] == ["healthy"]
    assert json.loads(ann[A_ACK_XIDS]) == {"GPU-abc": 79}
    assert cluster.events(NODE, "RemediationFinished")


def test_release_merges_acknowledged_xids_and_bounds_history(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    for i in range(22):
        env.run(acts.release_node, release(started=T0 + timedelta(hours=i), wf=f"wf-{i}",
                                           acked={f"GPU-{i % 2}": 40 + i}))
    # A retried release of the last one does not add it twice.
    env.run(acts.release_node, release(started=T0 + timedelta(hours=21), wf="wf-21",
                                       acked={f"GPU-{21 % 2}": 40 + 21}))
    ann = cluster.node(NODE).metadata.annotations
    history = json.loads(ann[A_HISTORY])
    assert len(history) == 20
    assert history[-1]["workflow_id"] == "wf-21" and history[0]["workflow_id"] == "wf-2"
    assert json.loads(ann[A_ACK_XIDS]) == {"GPU-0": 60, "GPU-1": 61}


def test_release_clears_the_xid_sightings_of_the_acknowledged_gpus(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    """Repeat escalation counts from the repair on: the repaired GPU's sightings go, its
    baseline (last gauge value, counter) and other GPUs' sightings stay."""
    before = {"GPU-0": {"shown": 13, "counts": {"13": 5}, "seen": [[13, 1.0], [13, 2.0]]},
              "GPU-1": {"shown": 31, "counts": {}, "seen": [[31, 3.0]]}}
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {
        A_XID_SIGHTINGS: json.dumps(before)}}})
    env.run(acts.release_node, release(acked={"GPU-0": 13}))
    after = json.loads(cluster.node(NODE).metadata.annotations[A_XID_SIGHTINGS])
    assert after["GPU-0"] == {"shown": 13, "counts": {"13": 5}, "seen": []}
    assert after["GPU-1"] == before["GPU-1"]


def test_release_of_a_node_cordoned_before_the_claim_keeps_it_cordoned(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.cordon(NODE)
    wait_for(lambda: UNSCHEDULABLE_TAINT in taint_keys(cluster.node(NODE)))
    result = env.run(acts.claim_node, claim())
    env.run(acts.release_node, release(uncordon=not result.previously_cordoned))
    node = cluster.node(NODE)
    assert node.spec.unschedulable is True
    assert UNSCHEDULABLE_TAINT in taint_keys(node) and TAINT_KEY not in taint_keys(node)
    assert node.metadata.labels[STATE_LABEL] == "healthy"


@pytest.mark.parametrize("outcome", ["healthy", "released", "aborted"])
def test_release_keeps_cordoned_a_node_an_admin_excluded_during_the_remediation(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment,
        outcome: Outcome) -> None:
    """`kubectl cordon` of a node we cordoned changes nothing Kubernetes records; the
    exclude label (which a kubelet cannot set on its own Node) does: set at any time
    before the end, the node stays cordoned, our taint and state still go."""
    env.run(acts.claim_node, claim())
    cluster.core.patch_node(NODE, {"metadata": {"labels": {EXCLUDE_LABEL: "true"}}})
    env.run(acts.release_node, release(outcome=outcome))
    node = cluster.node(NODE)
    assert node.spec.unschedulable is True, outcome
    assert TAINT_KEY not in taint_keys(node)
    assert node.metadata.labels[STATE_LABEL] == "healthy"
    events = cluster.events(NODE, "RemediationFinished")
    assert any("left cordoned: an admin set" in e.message for e in events), events
    # Without the label, the same release uncordons.
    cluster.core.patch_node(NODE, {"metadata": {"labels": {EXCLUDE_LABEL: None}},
                                   "spec": {"unschedulable": None}})
    env.run(acts.claim_node, claim(wf="remediation-y"))
    env.run(acts.release_node, release(outcome=outcome, wf="remediation-y"))
    assert not cluster.node(NODE).spec.unschedulable


def test_release_quarantined_keeps_cordon_taint_and_labels_quarantined(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    env.run(acts.claim_node, claim())
    env.run(acts.release_node, release(outcome="quarantined", uncordon=False))
    node = cluster.node(NODE)
    assert node.spec.unschedulable is True and TAINT_KEY in taint_keys(node)
    assert node.metadata.labels[STATE_LABEL] == "quarantined"
    assert node.metadata.annotations[A_STEP] == "quarantined"
    assert cluster.events(NODE, "RemediationFinished")[0].type == "Warning"


def test_every_quarantine_write_re_applies_cordon_and_taint(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    """A kubelet may uncordon its own node and an admin may remove our taint by mistake:
    the next quarantine write (a failed release validation, a continue-as-new) holds the
    node again."""
    env.run(acts.claim_node, claim())
    env.run(acts.release_node, release(outcome="quarantined", uncordon=False))
    others = [t for t in cluster.node(NODE).spec.taints or [] if t.key != TAINT_KEY]
    cluster.core.patch_node(NODE, {"spec": {"unschedulable": False, "taints": [
        {"key": t.key, "value": t.value, "effect": t.effect} for t in others] or None}})
    assert TAINT_KEY not in taint_keys(cluster.node(NODE))
    env.run(acts.release_node, release(outcome="quarantined", uncordon=False))
    node = cluster.node(NODE)
    assert node.spec.unschedulable is True and TAINT_KEY in taint_keys(node)
    assert taint_keys(node).count(TAINT_KEY) == 1


@pytest.mark.parametrize(("label", "expected"), [
    ("8", 8),     # declared and capacity agree
    ("9", 9),     # a GPU already gone at claim: expect the declared count back
    ("4", 8),     # a lower label never lowers what the node's capacity shows
    ("08x", 8),   # not plain digits: ignored
    ("99999", 8),  # absurd: ignored
])
def test_claim_expects_the_declared_gpu_count_or_capacity_if_larger(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment,
        label: str, expected: int) -> None:
    cluster.core.patch_node(NODE, {"metadata": {"labels": {"nvidia.com/gpu.count": label}}})
    assert env.run(acts.claim_node, claim()).gpus == expected


def test_release_survives_a_damaged_history_annotation(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {
        A_HISTORY: "{not json", A_ACK_XIDS: "[1, 2]"}}})
    env.run(acts.claim_node, claim())
    env.run(acts.release_node, release(acked={"GPU-1": 79}))
    ann = cluster.node(NODE).metadata.annotations
    assert len(json.loads(ann[A_HISTORY])) == 1
    assert json.loads(ann[A_ACK_XIDS]) == {"GPU-1": 79}


def test_claim_after_a_damaged_history_annotation_reads_it_as_empty(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {A_HISTORY: '[{"x": 1}]'}}})
    assert env.run(acts.claim_node, claim()).recent_remediations == 0


def test_release_dry_run_writes_nothing_to_nodes(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    cluster.clear_writes()
    inp = release().model_copy(update={"dry_run": True})
    env.run(acts.release_node, inp)
    assert cluster.writes("nodes") == []


def test_autoscalers_are_kept_off_the_node_while_it_is_ours_and_an_admins_mark_stays(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    """A drained or quarantined node looks empty to cluster-autoscaler and Karpenter; the
    claim marks it (where unmarked), quarantine keeps the marks, release removes exactly
    the ones the claim added."""
    from activities.node_keys import A_ADDED_MARKS, AUTOSCALER_MARKS

    ca, karpenter = AUTOSCALER_MARKS
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {karpenter: "true"}}})
    env.run(acts.claim_node, claim())
    ann = cluster.node(NODE).metadata.annotations
    assert ann[ca] == "true" and ann[karpenter] == "true" and ann[A_ADDED_MARKS] == ca
    env.run(acts.release_node, release(outcome="quarantined", uncordon=False))
    assert cluster.node(NODE).metadata.annotations[ca] == "true", "kept while quarantined"
    env.run(acts.release_node, release(outcome="released"))
    ann = cluster.node(NODE).metadata.annotations
    assert ca not in ann and A_ADDED_MARKS not in ann
    assert ann[karpenter] == "true", "the admin's own mark stays"


def test_release_removes_only_known_marks_whatever_the_node_wrote(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    from activities.node_keys import A_ADDED_MARKS

    env.run(acts.claim_node, claim())
    cluster.core.patch_node(NODE, {"metadata": {"annotations": {
        A_ADDED_MARKS: "example.com/keep-me", "example.com/keep-me": "x"}}})
    env.run(acts.release_node, release())
    assert cluster.node(NODE).metadata.annotations["example.com/keep-me"] == "x"


def test_state_and_release_writes_refuse_another_machine_under_the_same_name(
        cluster: Cluster, acts: NodeActivities, env: ActivityEnvironment) -> None:
    """A node deleted and registered again (another UID) carries none of our marks: a
    state write or a release of the old remediation must not put them on the new one."""
    env.run(acts.claim_node, claim())
    before = cluster.node(NODE)
    for call, inp in (
            (acts.set_node_state, StateInput(
                node=NODE, state=NodeState.REPAIRING, reason="x", step="reboot", now=T0,
                event_reason="RepairStarted", event_message="m", uid="uid-of-the-old-one")),
            (acts.release_node, release(outcome="quarantined", uncordon=False).model_copy(
                update={"uid": "uid-of-the-old-one"}))):
        with pytest.raises(ApplicationError) as err:
            env.run(call, inp)
        assert err.value.type == "NodeGone" and err.value.non_retryable
        assert "was replaced" in str(err.value)
    after = cluster.node(NODE)
    assert after.metadata.labels == before.metadata.labels
    assert after.metadata.annotations == before.metadata.annotations
    assert [t.key for t in after.spec.taints or []] == [t.key for t in before.spec.taints or []]
