"""End-to-end scenarios on one stack (real dev server, worker and detector processes, both
simulators), each on its own pool of tests/e2e/fleet.yaml so they never share a node.

Supervised mode is on for reboots (``approval.required_for: [reboot]``), thermal
settings are shortened, and the breaker is opened wide: other stacks test it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client
from temporalio.client import WorkflowExecutionStatus

from activities.node_keys import (
    A_ACK_XIDS,
    A_HISTORY,
    A_PRECORDONED,
    A_WORKFLOW,
    A_XID_SIGHTINGS,
)
from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import (
    Cluster,
    metrics_text,
    release_input,
    result,
    settle_ticks,
    update,
    view_state,
    wait_for,
    workflow_runs,
    workflow_status,
)
from worker.cli.operator import OperatorError
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e

RUNNING = WorkflowExecutionStatus.RUNNING


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(
        tmp_path_factory.mktemp("fleet"), str(HERE / "fleet.yaml"),
        **{"detector.max_unavailable": 20,
           "detector.breaker_max_flagged_percent": 100,
           "detector.breaker_max_flagged_nodes": 50,
           "remediation.approval.required_for": ["reboot"],
           "remediation.thermal.poll_interval": "PT1S",
           "remediation.thermal.hold": "PT3S",
           "remediation.thermal.escalate_after": "PT20S",
           # Both thermal nodes at once (10% of this small fleet would be 1).
           "detector.max_thermal_cordoned": 2,
           # Sightings two ticks apart are separate bursts here (3 minutes by default).
           "policy.app_xid_escalation.burst_gap": "PT1S"})
    with stack:
        yield stack


@pytest.fixture(scope="module")
def k8s(fleet: LocalStack) -> Cluster:
    return Cluster(fleet)


@pytest.fixture(scope="module")
def gpu(fleet: LocalStack) -> GpuSimClient:
    return GpuSimClient(fleet.gpu_url)


def healthy_and_back(k8s: Cluster, node: str) -> bool:
    n = k8s.node(node)
    return ((n.metadata.labels or {}).get("gpu-remediate.io/state") == "healthy"
            and not n.spec.unschedulable and not k8s.has_our_taint(n))


def assert_quarantined(k8s: Cluster, node: str) -> None:
    n = k8s.node(node)
    assert (n.metadata.labels or {})["gpu-remediate.io/state"] == "quarantined"
    assert n.spec.unschedulable, f"{node}: a quarantined node stays cordoned"
    assert k8s.has_our_taint(n), f"{node}: a quarantined node keeps our taint"


def uids(pods: list[Any]) -> set[str]:
    return {p.metadata.uid for p in pods}


# ---------------------------------------------------------------- 7. PDB (in the background)


class Background:
    """A slow scenario run in a thread while the others go on; the last test joins it."""

    def __init__(self, target: Any, *args: Any) -> None:
        self.error: BaseException | None = None
        self.notes: dict[str, Any] = {}

        def body() -> None:
            try:
                target(*args, self.notes)
            except BaseException as err:
                self.error = err

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()


def pdb_scenario(stack: LocalStack, k8s: Cluster, gpu: GpuSimClient,
                 notes: dict[str, Any], ready_after: float = 65) -> None:
    """Two replicas of `team-p/blocker` on pdbwait-01 under a minAvailable-1 PDB; their
    replacements need ``ready_after`` seconds to become Ready, longer than the drain
    activity's first report (``remediation.drain.report_after``), so the workflow's view
    must name the PDB while the drain waits. Also run on the real control plane."""
    node, ns = "pdbwait-01", "team-p"
    k8s.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    labels = {"app": "blocker"}
    template = {
        "metadata": {"labels": labels,
                     "annotations": {"sim.gpu-remediate.io/readiness-delay-seconds": "0.5"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": "trainer:1",
                                 "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
    }
    k8s.apps.create_namespaced_replica_set(ns, {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "blocker"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": template}})
    k8s.policy.create_namespaced_pod_disruption_budget(ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "blocker"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}})

    def ready_pods() -> list[Any]:
        return [p for p in k8s.core.list_namespaced_pod(ns).items
                if p.metadata.deletion_timestamp is None and any(
                    c.type == "Ready" and c.status == "True"
                    for c in (p.status.conditions or []))]

    wait_for(stack, "two ready blockers", lambda: len(ready_pods()) == 2, timeout=30)
    # Replacements go anywhere in the pool and take 65 s to become Ready.
    k8s.apps.patch_namespaced_replica_set("blocker", ns, {"spec": {"template": {
        "metadata": {"annotations": {
            "sim.gpu-remediate.io/readiness-delay-seconds": f"{ready_after:g}"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": None,
                                  "sim.gpu-remediate.io/pool": "pdbwait"}}}}})
    gpu.inject_fault(node, "0", "xid", 48)

    blocked = wait_for(stack, "a DrainBlocked event", lambda: k8s.events(node, "DrainBlocked"),
                       timeout=40)
    notes["event"] = blocked[0].message
    metric = (f'gpu_remediate_drain_blocked{{node="{node}",pdb="{ns}/blocker"}} 1.0')
    notes["metric"] = wait_for(stack, "the drain-blocked metric",
                               lambda: metric in metrics_text(stack), timeout=20)
    min_ready = 2
    deadline = time.monotonic() + ready_after + 35
    view = None
    while time.monotonic() < deadline:
        min_ready = min(min_ready, len(ready_pods()))
        view = view_state(stack, node)
        if view.blocking_pdb:
            break
        time.sleep(1)
    assert view is not None and view.blocking_pdb == f"{ns}/blocker", view
    assert view.state == "draining" and view.pods_left >= 1, view
    notes["view"] = view
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not healthy_and_back(k8s, node):
        min_ready = min(min_ready, len(ready_pods()))
        time.sleep(0.5)
    assert healthy_and_back(k8s, node), \
        f"{node} did not come back: {k8s.state(node)} {k8s.annotations(node)}"
    notes["min_ready"] = min_ready
    notes["metric_after"] = metric in metrics_text(stack)
    notes["placement"] = sorted(
        p.spec.node_name or "" for p in k8s.core.list_namespaced_pod(ns).items
        if p.metadata.deletion_timestamp is None)


@pytest.fixture(scope="module")
def pdb_run(fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> Background:
    return Background(pdb_scenario, fleet, k8s, gpu)


def test_pdb_scenario_starts_in_background(pdb_run: Background) -> None:
    assert pdb_run.thread.is_alive() or pdb_run.error is None


# ---------------------------------------------------------------- 2. XID 48 → GPU reset


def test_xid48_gpu_reset_job_then_validation_returns_node(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    node = "reset-01"
    before = uids(k8s.pods_on(node))
    assert before, "the scenario runs a workload on reset-01"
    gpu.inject_fault(node, "3", "xid", 48)

    wait_for(fleet, f"{node} claimed", lambda: k8s.state(node) != "healthy", timeout=20)
    n = k8s.node(node)
    assert n.spec.unschedulable and k8s.has_our_taint(n)
    assert n.metadata.annotations[A_WORKFLOW] == f"remediation-{node}"
    # While repairing, no workload pod may run there.
    wait_for(fleet, f"{node} repairing", lambda: k8s.state(node) in ("repairing", "validating"),
             timeout=30)
    assert not (uids(k8s.pods_on(node)) & before), "the workload was drained before the repair"

    res = result(fleet, node)
    assert res.outcome == "healthy", res
    wait_for(fleet, f"{node} back in service", lambda: healthy_and_back(k8s, node), timeout=10)
    jobs = k8s.jobs(node)
    assert sorted(j.metadata.labels["gpu-remediate.io/job"] for j in jobs) == [
        "gpu-reset", "validate"], "a reset, no reboot"
    reset = next(j for j in jobs if j.metadata.labels["gpu-remediate.io/job"] == "gpu-reset")
    env = {e.name: e.value for e in reset.spec.template.spec.containers[0].env}
    assert env.get("GPU_INDEX") == "3", env
    assert all((j.status.succeeded or 0) >= 1 for j in jobs)
    history = k8s.history(node)
    assert len(history) == 1 and history[0]["action"] == "reset"
    assert list(release_input(fleet, node).acknowledged_xids.values()) == [48]
    # The reset restarted dcgm-exporter, whose gauge no longer shows 48: the detector
    # forgets the acknowledgement, so a new XID 48 on this GPU would count as new.
    wait_for(fleet, f"{node} acknowledgement forgotten",
             lambda: A_ACK_XIDS not in k8s.annotations(node), timeout=10)
    assert k8s.state(node) == "healthy" and len(k8s.history(node)) == 1
    reasons = k8s.event_reasons(node)
    for expected in ("RemediationStarted", "RepairStarted", "GpuOperandsPaused",
                     "GpuOperandsRestored", "ValidationStarted", "RemediationSucceeded"):
        assert expected in reasons, reasons
    assert gpu.health(node)["healthy"]
    # The operands held the GPUs (the reset could not have run beside them): they were
    # turned off and are back as found, running on the node again.
    labels = k8s.node(node).metadata.labels
    assert all(labels[f"nvidia.com/gpu.deploy.{o}"] == "true" for o in (
        "device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery"))
    assert "gpu-remediate.io/operands-paused" not in k8s.annotations(node)
    def operands() -> dict[str, str]:
        return {(p.metadata.labels or {}).get("app", "?"): p.status.phase
                for p in k8s.pods_on(node, include_system=True)
                if p.metadata.namespace == "gpu-operator"}
    try:
        wait_for(fleet, f"{node}'s operands running again", lambda: {
            a for a, phase in operands().items() if phase == "Running"} >= {
            "nvidia-device-plugin-daemonset", "nvidia-dcgm", "nvidia-dcgm-exporter",
            "gpu-feature-discovery"}, timeout=20)
    except AssertionError as err:
        raise AssertionError(f"{err}\noperand pods now: {operands()}") from None
    # The validation's dcgmi JSON is the evidence, kept in the node's history.
    assert "dcgmi diag: all" in history[0]["outcome"], history[0]
    # The replacement pod lands back on the node once it is schedulable again.
    wait_for(fleet, "the workload back on reset-01", lambda: k8s.pods_on(node), timeout=20)


# ---------------------------------------------------------------- 13. app / ignored XIDs


def test_app_and_ignored_xids_cause_no_node_action(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    node = "ignored-01"
    for index, xid in ((0, 13), (1, 31), (2, 43)):
        gpu.inject_fault(node, index, "xid", xid)
    settle_ticks(fleet, 5)
    n = k8s.node(node)
    assert k8s.state(node) == "healthy" and not n.spec.unschedulable
    assert not k8s.has_our_taint(n)
    assert workflow_status(fleet, node) is None, "no remediation workflow for app XIDs"
    # Only the word to the application's owners (the original tool's warning Event).
    # SignalUnavailable says what the exporter cannot feed (the simulated one, like a stock
    # dcgm-exporter, serves no windowed XID count): an announcement, not a node action.
    assert set(k8s.event_reasons(node)) <= {"ApplicationXid", "SignalUnavailable"}, \
        k8s.event_reasons(node)


def test_app_xid_repeating_on_one_gpu_asks_for_a_diagnostic_not_a_reset(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    """XID 31 once is the application's; two separate bursts on the same GPU within a day
    point at the GPU (NVSentinel's rule): the detector counts bursts across ticks on the node
    and asks for a deeper diagnostic with a Warning Event. It never drains for it."""
    node = "appxid-01"
    uuid = gpu.get_node(node)["gpus"][4]["uuid"]
    gpu.inject_fault(node, 4, "xid", 31)
    settle_ticks(fleet, 2)
    assert k8s.state(node) == "healthy" and workflow_status(fleet, node) is None
    seen = json.loads(k8s.annotations(node)[A_XID_SIGHTINGS])[uuid]["seen"]
    assert [x for x, _ in seen] == [31]
    gpu.inject_fault(node, 4, "xid", 13)
    settle_ticks(fleet, 2)
    assert k8s.state(node) == "healthy"
    gpu.inject_fault(node, 4, "xid", 31)

    wait_for(fleet, f"{node} GPUDiagnosticNeeded",
             lambda: "GPUDiagnosticNeeded" in k8s.event_reasons(node), timeout=20)
    event = k8s.events(node, "GPUDiagnosticNeeded")[-1]
    assert "31" in event.message, event.message
    settle_ticks(fleet, 3)
    assert k8s.state(node) == "healthy" and workflow_status(fleet, node) is None, \
        "a diagnostic request is reported, never a drain"
    assert k8s.history(node) == []
    assert k8s.event_reasons(node).count("GPUDiagnosticNeeded") == 1, "once per appearance"


# ---------------------------------------------------------------- 11. admin cordon


def test_admin_cordon_survives_remediation(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    node = "admin-01"
    k8s.cordon(node)
    gpu.inject_fault(node, "0", "xid", 48)
    wait_for(fleet, f"{node} claimed", lambda: k8s.state(node) != "healthy", timeout=20)
    assert k8s.annotations(node)[A_PRECORDONED] == "true"
    # The claim activity writes the node before the workflow reads its result: the view
    # follows a moment later.
    wait_for(fleet, "the view shows the admin's cordon",
             lambda: view_state(fleet, node).previously_cordoned, timeout=20)
    assert result(fleet, node).outcome == "healthy"
    n = k8s.node(node)
    assert n.metadata.labels["gpu-remediate.io/state"] == "healthy"
    assert n.spec.unschedulable is True, "the admin's cordon was undone"
    assert not k8s.has_our_taint(n)
    assert A_PRECORDONED not in (n.metadata.annotations or {})


# ---------------------------------------------------------------- 3. RMA → quarantine → release


def test_row_remap_failure_quarantines_until_released_and_fixed(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    node = "rma-01"
    gpu.inject_fault(node, "2", "row-remap-failure")
    wait_for(fleet, f"{node} quarantined", lambda: k8s.state(node) == "quarantined", timeout=30)
    assert_quarantined(k8s, node)
    assert "row-remap" in k8s.annotations(node)["gpu-remediate.io/reason"]
    assert "NodeQuarantined" in k8s.event_reasons(node)
    assert k8s.job_kinds(node) == [], "no repair for an RMA-class fault"

    # No automatic return: it stays quarantined, the workflow waits for a human.
    settle_ticks(fleet, 3)
    assert_quarantined(k8s, node)
    assert workflow_status(fleet, node) == RUNNING
    view = view_state(fleet, node)
    assert view.state == "quarantined"
    with pytest.raises(OperatorError, match="cannot approve"):
        update(fleet, node, "approve")

    # First release with the fault still there: validation fails, back to quarantine.
    ack = update(fleet, node, "release", reason="reseated GPU 2")
    assert "validating" in ack.message
    # The node stays labelled quarantined while it is validated (no budget slot);
    # the step tells the validation apart from the quarantine it returns to.
    wait_for(fleet, "the release validation to fail",
             lambda: k8s.job_kinds(node) == ["validate"] and view_state(fleet, node).step
             == "quarantined" and view_state(fleet, node).attempt == 1, timeout=30)
    assert_quarantined(k8s, node)
    assert "ReleaseRequested" in k8s.event_reasons(node)
    assert (k8s.jobs(node)[0].status.failed or 0) >= 1

    # Fixed for real: the second release validates and returns the node.
    gpu.clear(node)
    update(fleet, node, "release", reason="GPU 2 replaced, RMA 4411")
    res = result(fleet, node)
    assert res.outcome == "healthy", res
    assert healthy_and_back(k8s, node)
    history = k8s.history(node)
    assert history[-1]["outcome"].startswith("healthy") and "released" in history[-1]["outcome"]
    settle_ticks(fleet, 3)
    # One remediation (its quarantine waited in runs of its own, one history entry), and
    # no second one after the release.
    assert k8s.state(node) == "healthy" and len(k8s.history(node)) == 1
    assert workflow_status(fleet, node) != RUNNING


# ---------------------------------------------------------------- 5. repeat offender


def test_repeat_offender_goes_straight_to_quarantine(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    node = "repeat-01"
    now = datetime.now(UTC)
    seeded = [{"started": (now - timedelta(days=d)).isoformat(),
               "finished": (now - timedelta(days=d) + timedelta(minutes=20)).isoformat(),
               "action": "reset", "reason": "xid 48", "outcome": "healthy: validated",
               "workflow_id": f"remediation-{node}", "by": "detector"} for d in (1, 2, 3)]
    k8s.core.patch_node(node, {"metadata": {"annotations": {A_HISTORY: json.dumps(seeded)}}})
    gpu.inject_fault(node, "0", "xid", 48)
    res = None
    wait_for(fleet, f"{node} quarantined", lambda: k8s.state(node) == "quarantined", timeout=30)
    assert_quarantined(k8s, node)
    assert k8s.job_kinds(node) == [], "a repeat offender gets no repair"
    view = view_state(fleet, node)
    assert any("repeat offender" in line for line in view.plan), view.plan
    history = k8s.history(node)
    assert len(history) == 4 and history[-1]["outcome"].startswith("quarantined")
    assert "repeat offender" in history[-1]["outcome"]
    assert res is None


# ---------------------------------------------------------------- 4. thermal


def test_thermal_cordons_without_drain_then_recovers_or_escalates(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    cools, stays = "thermal-01", "thermal-02"
    pods = {n: uids(k8s.pods_on(n)) for n in (cools, stays)}
    assert all(pods.values()), "the scenario runs a job on each thermal node"
    gpu.inject_fault(cools, "0", "gpu-temp", 92)
    gpu.inject_fault(stays, "5", "gpu-temp", 95)
    for n in (cools, stays):
        wait_for(fleet, f"{n} cordoned for heat", lambda n=n: k8s.state(n) == "cordoned",
                 timeout=20)
    time.sleep(2)  # a drain would have started by now: the pods must still be there
    for n in (cools, stays):
        node = k8s.node(n)
        assert node.spec.unschedulable and k8s.has_our_taint(node)
        assert uids(k8s.pods_on(n)) == pods[n], f"{n}: pods moved, but heat means no drain"
        assert view_state(fleet, n).state == "cordoned"

    gpu.clear(cools)
    res = result(fleet, cools, timeout=30)
    assert res.outcome == "healthy" and "cooled" in res.message, res
    assert healthy_and_back(k8s, cools)
    assert uids(k8s.pods_on(cools)) == pods[cools], "the job kept running through it"
    assert k8s.job_kinds(cools) == []

    wait_for(fleet, f"{stays} escalated", lambda: "ThermalEscalation" in
             k8s.event_reasons(stays), timeout=40)
    wait_for(fleet, f"{stays} quarantined", lambda: k8s.state(stays) == "quarantined",
             timeout=30)
    assert_quarantined(k8s, stays)
    assert not (uids(k8s.pods_on(stays)) & pods[stays]), "escalation drains the node"
    assert "still hot" in k8s.history(stays)[-1]["outcome"]


# ---------------------------------------------------------------- 10. supervised mode


def test_supervised_reboot_waits_for_approval_and_reject_releases(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    approved, rejected = "sup-01", "sup-02"
    pods = {n: uids(k8s.pods_on(n)) for n in (approved, rejected)}
    assert all(pods.values())
    for n in (approved, rejected):
        gpu.inject_fault(n, "1", "xid", 79)
    for n in (approved, rejected):
        # The label is written by the claim; the workflow takes the state when the
        # claim returns: approve only once the workflow itself is waiting.
        wait_for(fleet, f"{n} awaiting approval",
                 lambda n=n: view_state(fleet, n).state == "awaiting-approval", timeout=20)
    time.sleep(2)
    for n in (approved, rejected):
        node = k8s.node(n)
        assert node.spec.unschedulable and k8s.has_our_taint(node)
        assert uids(k8s.pods_on(n)) == pods[n], f"{n}: drained before approval"
        assert view_state(fleet, n).state == "awaiting-approval"
    with pytest.raises(OperatorError, match="cannot release"):
        update(fleet, approved, "release")

    update(fleet, approved, "approve", reason="checked dmesg")
    update(fleet, rejected, "reject", reason="job finishing tonight")
    res = result(fleet, rejected)
    assert res.outcome == "released" and "rejected" in res.message
    node = k8s.node(rejected)
    assert node.metadata.labels["gpu-remediate.io/state"] == "healthy"
    assert not node.spec.unschedulable and not k8s.has_our_taint(node)
    assert uids(k8s.pods_on(rejected)) == pods[rejected], "reject leaves the pods alone"
    assert k8s.job_kinds(rejected) == []

    res = result(fleet, approved)
    assert res.outcome == "healthy", res
    assert "RemediationApproved" in k8s.event_reasons(approved)
    assert k8s.job_kinds(approved) == ["reboot", "validate"]
    assert healthy_and_back(k8s, approved)


def test_rejected_node_is_not_claimed_again_for_the_same_xid(
        fleet: LocalStack, k8s: Cluster) -> None:
    """After a reject the exporter still shows the XID; re-claiming the node every tick
    would undo the operator's decision."""
    node = "sup-02"
    settle_ticks(fleet, 4)
    assert k8s.state(node) == "healthy"
    assert workflow_runs(fleet, node) == 1


# ---------------------------------------------------------------- 9. validation keeps failing


def test_validation_failure_retries_then_quarantines(
        fleet: LocalStack, k8s: Cluster, gpu: GpuSimClient) -> None:
    node = "valfail-01"
    gpu.inject_fault(node, "1", "ecc-dbe", 1, clears_on="never")
    gpu.inject_fault(node, "0", "xid", 79)
    wait_for(fleet, f"{node} awaiting approval",
             lambda: view_state(fleet, node).state == "awaiting-approval", timeout=20)
    assert k8s.state(node) == "awaiting-approval"
    update(fleet, node, "approve")
    wait_for(fleet, f"{node} quarantined", lambda: k8s.state(node) == "quarantined", timeout=60)
    assert_quarantined(k8s, node)
    view = view_state(fleet, node)
    assert view.attempt == 2, view
    assert "validation failed 2 times" in k8s.history(node)[-1]["outcome"]
    jobs = k8s.jobs(node)
    kinds = sorted(j.metadata.labels["gpu-remediate.io/job"] for j in jobs)
    assert kinds == ["reboot", "reboot", "validate", "validate"], kinds
    assert all((j.status.failed or 0) >= 1 for j in jobs
               if j.metadata.labels["gpu-remediate.io/job"] == "validate")
    assert k8s.event_reasons(node).count("ValidationStarted") == 2


# ---------------------------------------------------------------- 7. PDB, joined


def test_drain_waits_for_pdb_names_it_and_completes(pdb_run: Background) -> None:
    pdb_run.thread.join(timeout=240)
    assert not pdb_run.thread.is_alive(), "the PDB scenario did not finish"
    if pdb_run.error is not None:
        raise pdb_run.error
    assert_pdb_scenario(pdb_run.notes)


def assert_pdb_scenario(notes: dict[str, Any]) -> None:
    assert "team-p/blocker" in notes["event"]
    assert notes["view"].blocking_pdb == "team-p/blocker"
    assert notes["min_ready"] >= 1, "the PDB (minAvailable 1) was violated"
    assert notes["metric_after"] is False, "the blocked metric is cleared after the drain"
    assert notes["placement"] == ["pdbwait-02", "pdbwait-02"]
