"""Scripted chaos against the whole local stack: a worker SIGKILLed at each step of a
remediation, the Temporal dev server restarted mid-flight, and the Kubernetes API
answering 10 % of writes with 409/429/500. Each is bounded in time and checked by the
invariant sampler (tests/chaos/invariants.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.gpu.client import GpuSimClient
from tests.chaos.invariants import InvariantChecker
from tests.e2e.conftest import make_stack
from tests.e2e.kit import Cluster, result, wait_for, worker_log, workflow_status
from worker.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]

HERE = Path(__file__).parent
MAX_UNAVAILABLE = 5


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(
        tmp_path_factory.mktemp("chaos"), str(HERE / "chaos.yaml"),
        # A killed worker's observation must not hold the detector for the default 5 min.
        **{"detector.max_unavailable": MAX_UNAVAILABLE, "detector.observe_timeout": "PT10S",
           "detector.breaker_max_flagged_percent": 100})
    stack.job_seconds = 3.0  # wide enough windows to kill the worker inside a Job
    with stack:
        yield stack


def assert_clean_remediation(stack: LocalStack, k8s: Cluster, node: str,
                             action: str = "reboot") -> None:
    wait_for(stack, f"a remediation of {node}", lambda: workflow_status(stack, node),
             timeout=60)
    res = result(stack, node, timeout=150)
    assert res.outcome == "healthy", res
    n = k8s.node(node)
    assert n.metadata.labels["gpu-remediate.io/state"] == "healthy"
    assert not n.spec.unschedulable and not k8s.has_our_taint(n)
    kinds = k8s.job_kinds(node)
    repair = "reboot" if action == "reboot" else "gpu-reset"
    assert kinds == sorted([repair, "validate"]), f"{node}: a step ran twice: {kinds}"
    history = k8s.history(node)
    assert len(history) == 1, f"{node}: {len(history)} history entries"
    reasons = k8s.event_reasons(node)
    assert reasons.count("RemediationSucceeded") == 1, reasons


# (name, condition that says the remediation is at that step)
def _kill_points(k8s: Cluster) -> list[tuple[str, Callable[[str], bool]]]:
    def job(node: str, kind: str) -> Any | None:
        return next((j for j in k8s.jobs(node)
                     if j.metadata.labels["gpu-remediate.io/job"] == kind), None)

    def after_claim(node: str) -> bool:
        return "RemediationStarted" in k8s.event_reasons(node)

    def during_drain(node: str) -> bool:
        return k8s.state(node) == "draining" and any(
            p.metadata.deletion_timestamp is not None for p in k8s.pods_on(node))

    def during_repair(node: str) -> bool:
        j = job(node, "reboot")
        return j is not None and not (j.status.succeeded or 0)

    def during_validation(node: str) -> bool:
        j = job(node, "validate")
        return j is not None and not (j.status.succeeded or j.status.failed)

    def before_release(node: str) -> bool:
        j = job(node, "validate")
        return j is not None and bool(j.status.succeeded) and k8s.state(node) == "validating"

    return [("after-claim", after_claim), ("during-drain", during_drain),
            ("during-repair", during_repair), ("during-validation", during_validation),
            ("before-release", before_release)]


def test_worker_sigkill_at_each_step_loses_nothing_and_repeats_nothing(
        chaos_stack: LocalStack) -> None:
    k8s, gpu = Cluster(chaos_stack), GpuSimClient(chaos_stack.gpu_url)
    points = _kill_points(k8s)
    nodes = [f"gpu-node-{i:02d}" for i in range(1, len(points) + 1)]
    hit: dict[str, str] = {}
    started = time.monotonic()
    with InvariantChecker(chaos_stack, MAX_UNAVAILABLE, grace=45) as checker:
        # A pipeline: while one node is stalled by the last kill (its activity times out
        # after the 5 s heartbeat timeout), the next one reaches its step.
        for node, (name, at_step) in zip(nodes, points, strict=True):
            gpu.inject_fault(node, "0", "xid", 79)
            wait_for(chaos_stack, f"{node} {name}", lambda n=node, f=at_step: f(n),
                     timeout=90, every=0.05)
            if name == "after-claim":
                time.sleep(0.5)  # let the claim's completion reach the server
            chaos_stack.restart_worker()
            hit[name] = f"{node} at {time.monotonic() - started:.0f}s"
        for node in nodes:
            assert_clean_remediation(chaos_stack, k8s, node)
    print(f"kill points: {hit}; samples {checker.samples}, max out {checker.max_out}")
    assert not checker.violations, "\n".join(checker.violations) + worker_log(chaos_stack)
    for n in k8s.nodes().values():
        assert not (n.spec.unschedulable or k8s.has_our_taint(n)), \
            f"{n.metadata.name} left cordoned"


def test_temporal_restart_mid_remediation(chaos_stack: LocalStack) -> None:
    k8s, gpu = Cluster(chaos_stack), GpuSimClient(chaos_stack.gpu_url)
    nodes = ["gpu-node-06", "gpu-node-07", "gpu-node-08"]
    with InvariantChecker(chaos_stack, MAX_UNAVAILABLE, grace=45) as checker:
        for node in nodes:
            gpu.inject_fault(node, "0", "xid", 79)
        wait_for(chaos_stack, "all three claimed and one repairing",
                 lambda: all(k8s.state(n) != "healthy" for n in nodes)
                 and any(k8s.state(n) == "repairing" for n in nodes), timeout=60)
        chaos_stack.restart_temporal()
        for node in nodes:
            assert_clean_remediation(chaos_stack, k8s, node)
    assert not checker.violations, "\n".join(checker.violations)


def test_api_faults_at_ten_percent(chaos_stack: LocalStack) -> None:
    k8s, gpu = Cluster(chaos_stack), GpuSimClient(chaos_stack.gpu_url)
    nodes = ["gpu-node-09", "gpu-node-10", "gpu-node-11"]
    rules = [
        {"verb": "patch", "resource": "nodes", "rate": 0.1, "status": 409},
        {"verb": "patch", "resource": "nodes", "rate": 0.1, "status": 500},
        {"verb": "create", "resource": "pods/eviction", "rate": 0.1, "status": 429,
         "retry_after": 1},
        {"verb": "create", "resource": "pods/eviction", "rate": 0.1, "status": 500},
        {"verb": "create", "resource": "jobs", "rate": 0.1, "status": 500},
        {"verb": "create", "resource": "events", "rate": 0.1, "status": 500},
        {"verb": "list", "resource": "*", "rate": 0.05, "status": 429, "retry_after": 1},
    ]
    k8s.set_faults(rules, seed=11)
    started = time.monotonic()
    try:
        with InvariantChecker(chaos_stack, MAX_UNAVAILABLE, grace=45) as checker:
            gpu.inject_fault(nodes[0], "0", "xid", 79)
            gpu.inject_fault(nodes[1], "3", "xid", 48)
            gpu.inject_fault(nodes[2], "5", "xid", 79)
            for node, action in zip(nodes, ("reboot", "reset", "reboot"), strict=True):
                assert_clean_remediation(chaos_stack, k8s, node, action)
    finally:
        injected = k8s.clear_faults()["injected"]
    elapsed = time.monotonic() - started
    print(f"API faults injected: {injected}; all done in {elapsed:.0f}s")
    assert injected > 0
    assert elapsed < 120, "over budget"
    assert not checker.violations, "\n".join(checker.violations)
