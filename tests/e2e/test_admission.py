"""End-to-end admission scenarios, each needing detector-wide settings of its own:
the budget one at a time in priority order, dry-run, and no-data-no-action with the
circuit breaker. One small stack per scenario."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from temporalio.client import WorkflowExecutionStatus

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import (
    OUT_OF_SERVICE,
    Cluster,
    abort,
    detector_update,
    detector_view,
    metrics_text,
    result,
    settle_ticks,
    update,
    view_state,
    wait_for,
    worker_log,
    workflow_status,
)
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e


# ---------------------------------------------------------------- 6. budget, priority order


@pytest.fixture(scope="module")
def budget_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("budget"), str(HERE / "budget.yaml"),
                       **{"detector.max_unavailable": 1,
                          "detector.breaker_max_flagged_percent": 100})
    with stack:
        yield stack


def test_one_at_a_time_in_priority_order(budget_stack: LocalStack) -> None:
    k8s, gpu = Cluster(budget_stack), GpuSimClient(budget_stack.gpu_url)
    quarantine, reboot, reset = "gpu-node-03", "gpu-node-01", "gpu-node-02"
    # Injected in severity order, so a tick boundary between two injections cannot
    # change which is admitted first.
    gpu.inject_fault(quarantine, "0", "row-remap-failure")
    gpu.inject_fault(reboot, "0", "xid", 79)
    gpu.inject_fault(reset, "0", "xid", 48)
    sick = (quarantine, reboot, reset)

    first_out: dict[str, float] = {}
    max_out = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        nodes = k8s.nodes()
        states = {n: (nodes[n].metadata.labels or {}).get("gpu-remediate.io/state",
                                                           "healthy") for n in nodes}
        out = [n for n, s in states.items() if s in OUT_OF_SERVICE]
        max_out = max(max_out, len(out))
        for n in sick:
            if states[n] != "healthy":
                first_out.setdefault(n, time.monotonic())
        if states[quarantine] == "quarantined" and all(
                states[n] == "healthy" and not nodes[n].spec.unschedulable
                and n in first_out for n in (reboot, reset)):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"not done: {first_out}\n{worker_log(budget_stack)}")
    assert max_out <= 1, f"budget max_unavailable=1 exceeded: {max_out} out at once"
    order = sorted(first_out, key=first_out.__getitem__)
    assert order == [quarantine, reboot, reset], order
    view = wait_for(budget_stack, "the detector to see the budget free",
                    lambda: (v := detector_view(budget_stack)).in_flight == [] and v,
                    timeout=10)
    assert view.budget == 1
    assert result(budget_stack, reboot).outcome == "healthy"
    assert result(budget_stack, reset).outcome == "healthy"
    assert k8s.job_kinds(reboot) == ["reboot", "validate"]
    assert k8s.job_kinds(reset) == ["gpu-reset", "validate"]


def test_operator_release_respects_the_budget(budget_stack: LocalStack) -> None:
    k8s, gpu = Cluster(budget_stack), GpuSimClient(budget_stack.gpu_url)
    quarantined, busy = "gpu-node-03", "gpu-node-04"  # node 03 from the test above
    assert k8s.state(quarantined) == "quarantined"
    gpu.inject_fault(busy, 0, "xid", 79)
    wait_for(budget_stack, f"{busy} holding the only slot",
             lambda: k8s.state(busy) in ("draining", "repairing"), timeout=20)
    update(budget_stack, quarantined, "release", reason="budget test")
    max_out = 0
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and k8s.state(busy) != "healthy":
        states = [(n.metadata.labels or {}).get("gpu-remediate.io/state")
                  for n in k8s.nodes().values()]
        max_out = max(max_out, sum(1 for s in states if s in OUT_OF_SERVICE))
        time.sleep(0.05)
    assert max_out <= 1, f"{max_out} nodes out of service with max_unavailable=1"


# ---------------------------------------------------------------- 8. dry-run


@pytest.fixture(scope="module")
def dry_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("dry"), str(HERE / "budget.yaml"),
                       **{"detector.dry_run": True, "detector.max_unavailable": 2})
    with stack:
        yield stack


def test_dry_run_shows_the_plan_and_changes_nothing(dry_stack: LocalStack) -> None:
    k8s, gpu = Cluster(dry_stack), GpuSimClient(dry_stack.gpu_url)
    node = "gpu-node-02"
    before_writes = len(k8s.writes())
    before_node = k8s.node(node)
    pods_before = {p.metadata.uid for p in k8s.pods_on(node)}
    gpu.inject_fault(node, "4", "xid", 79)

    res = result(dry_stack, node, timeout=60) if wait_for(
        dry_stack, "a dry-run remediation", lambda: workflow_status(dry_stack, node),
        timeout=20) else None
    assert res is not None
    view = view_state(dry_stack, node)
    assert view.dry_run
    plan = "\n".join(view.plan)
    for expected in ("cordon", "evict", "reboot Job", "validate Job", "uncordon"):
        assert expected in plan, f"{expected!r} missing from the plan:\n{plan}"
    assert "trainer" in plan, "the plan names the pods it would evict"
    assert "[dry-run]" in " ".join(e.message for e in k8s.events(node, "RemediationPlanned"))

    settle_ticks(dry_stack, 3)
    new = k8s.writes()[before_writes:]
    mutations = [w for w in new if w["resource"] != "events"]
    assert not mutations, f"dry-run wrote to the cluster: {mutations}"
    assert all(w["verb"] == "create" for w in new)
    after = k8s.node(node)
    assert after.metadata.labels == before_node.metadata.labels
    assert after.metadata.annotations == before_node.metadata.annotations
    assert not after.spec.unschedulable and not after.spec.taints
    assert {p.metadata.uid for p in k8s.pods_on(node)} == pods_before
    assert k8s.batch.list_namespaced_job("gpu-remediate-jobs").items == []


# ---------------------------------------------------------------- 12. no data; breaker


@pytest.fixture(scope="module")
def breaker_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("breaker"), str(HERE / "breaker.yaml"),
                       **{"detector.max_unavailable": 2,
                          "detector.breaker_max_flagged_percent": 15,
                          "detector.breaker_min_flagged_nodes": 2,
                          "exporter.timeout_seconds": 1.0})
    with stack:
        yield stack


def test_unreadable_exporters_never_make_a_node_unhealthy(breaker_stack: LocalStack) -> None:
    k8s, gpu = Cluster(breaker_stack), GpuSimClient(breaker_stack.gpu_url)
    modes = {"gpu-node-01": "down", "gpu-node-02": "garbled", "gpu-node-03": "empty",
             "gpu-node-04": "slow", "gpu-node-05": "garbled"}
    # Each exporter breaks before its GPU faults, so no scrape ever reads the XID. A pause
    # alone would not do: a paused detector still observes, and an observation taken while
    # the faults were arranged, ending after the resume, is admitted on (fresh, and true).
    detector_update(breaker_stack, "pause", reason="arrange the exporters")
    for node, mode in modes.items():
        gpu.set_exporter_mode(node, mode, delay_seconds=3 if mode == "slow" else None)
        gpu.inject_fault(node, "0", "xid", 79 if mode != "empty" else 48)
    detector_update(breaker_stack, "resume")
    settle_ticks(breaker_stack, 5)
    view = detector_view(breaker_stack)
    assert not view.breaker_open and view.in_flight == [] and view.waiting == []
    errors = " ".join(view.last_errors)
    for node in modes:
        assert k8s.state(node) == "healthy" and not k8s.node(node).spec.unschedulable
        assert workflow_status(breaker_stack, node) is None, f"{node} was remediated"
        assert node in errors, f"{node}'s unreadable exporter is not reported: {errors}"
    # Put them back as they were: a reboot clears the faults and restarts the exporter.
    for node in modes:
        gpu.set_exporter_mode(node, "up")
        gpu.reboot(node)
    settle_ticks(breaker_stack, 2)
    assert all(workflow_status(breaker_stack, n) is None for n in modes)


# Regression: garbled payloads used to be parsed line by line, so a hot GPU's clock
# reasons in the surviving prefix cordoned the node (fixed in activities/scrape.py).
def test_garbled_exporter_with_hot_gpu_causes_no_action(breaker_stack: LocalStack) -> None:
    k8s, gpu = Cluster(breaker_stack), GpuSimClient(breaker_stack.gpu_url)
    node = "gpu-node-10"
    detector_update(breaker_stack, "pause", reason="arrange the exporter")
    gpu.set_exporter_mode(node, "garbled")
    gpu.inject_fault(node, "0", "gpu-temp", 95)
    detector_update(breaker_stack, "resume")
    try:
        settle_ticks(breaker_stack, 4)
        assert k8s.state(node) == "healthy", f"{node} claimed on garbled data"
        assert workflow_status(breaker_stack, node) is None
        assert node in " ".join(detector_view(breaker_stack).last_errors)
    finally:
        gpu.set_exporter_mode(node, "up")
        gpu.clear(node)
        if workflow_status(breaker_stack, node) == WorkflowExecutionStatus.RUNNING:
            abort(breaker_stack, node)
            wait_for(breaker_stack, f"{node} released",
                     lambda: k8s.state(node) == "healthy", timeout=30)


def test_mass_fault_trips_the_breaker_until_resumed(breaker_stack: LocalStack) -> None:
    k8s, gpu = Cluster(breaker_stack), GpuSimClient(breaker_stack.gpu_url)
    mass = ["gpu-node-06", "gpu-node-07", "gpu-node-08", "gpu-node-09"]  # 40 % of the fleet
    started = detector_view(breaker_stack).started_total
    for node in mass:
        gpu.inject_fault(node, "2", "ecc-dbe", 1)
    view = wait_for(breaker_stack, "the breaker to open",
                    lambda: (v := detector_view(breaker_stack)).breaker_open and v, timeout=20)
    assert "newly flagged" in view.breaker_reason
    # An injection split over two ticks may have let one in before the trip; after the
    # trip nothing new starts.
    started_at_trip = view.started_total
    assert started_at_trip - started <= 1
    settle_ticks(breaker_stack, 4)
    view = detector_view(breaker_stack)
    assert view.breaker_open and view.started_total == started_at_trip
    assert any("breaker open" in w for w in view.waiting), view.waiting
    assert "gpu_remediate_breaker_open 1.0" in metrics_text(breaker_stack)

    detector_update(breaker_stack, "resume", reason="exporter rollback checked")
    wait_for(breaker_stack, "admissions after resume",
             lambda: detector_view(breaker_stack).started_total > started_at_trip, timeout=20)
    view = detector_view(breaker_stack)
    assert not view.breaker_open, "the nodes already seen must not trip it again"
    wait_for(breaker_stack, "a mass-fault node in remediation",
             lambda: any(k8s.state(n) != "healthy" for n in mass), timeout=20)


# ------------------------------------------------ outcome breaker and quarantine cap


@pytest.fixture(scope="module")
def outcome_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("outcomes"), str(HERE / "breaker.yaml"),
                       **{"detector.max_unavailable": 4,
                          "detector.breaker_max_quarantines": 2,
                          "detector.breaker_quarantine_window": "PT1H"})
    with stack:
        yield stack


def test_remediations_ending_in_quarantine_stop_admissions_until_resume(
        outcome_stack: LocalStack) -> None:
    """Two remediations end in quarantine within the hour (the limit here): the detector
    stops admitting, however much budget is free, says why, and resume reopens it."""
    k8s, gpu = Cluster(outcome_stack), GpuSimClient(outcome_stack.gpu_url)
    for node in ("gpu-node-01", "gpu-node-02"):
        gpu.inject_fault(node, "0", "row-remap-failure")
    for node in ("gpu-node-01", "gpu-node-02"):
        wait_for(outcome_stack, f"{node} quarantined",
                 lambda n=node: k8s.state(n) == "quarantined")
    view = wait_for(outcome_stack, "the outcome breaker open",
                    lambda: (v := detector_view(outcome_stack)).breaker_open and v)
    assert view.breaker_reason.startswith(
        "2 remediations ended in quarantine within 1:00:00 (gpu-node-01, gpu-node-02")
    gpu.inject_fault("gpu-node-03", "0", "xid", 79)
    waiting = wait_for(outcome_stack, "gpu-node-03 waiting behind the breaker",
                       lambda: detector_view(outcome_stack).waiting)
    assert waiting == ["gpu-node-03 (reboot: breaker open)"]
    assert workflow_status(outcome_stack, "gpu-node-03") is None
    assert "gpu_remediate_breaker_open 1.0" in metrics_text(outcome_stack)
    detector_update(outcome_stack, "resume", reason="template fixed")
    wait_for(outcome_stack, "gpu-node-03 remediated after resume",
             lambda: workflow_status(outcome_stack, "gpu-node-03") is not None)
