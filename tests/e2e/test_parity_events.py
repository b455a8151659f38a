"""The original tool's e2e scenario 3 and 8, with the Events and metrics its users rely on:
two faults with a budget of one, the waiting node gets RemediationDeferred (once, not once per
tick), each drain records DrainCompleted, an unreadable exporter gets TelemetryUnavailable, and
the per-node state metric and last-observation time are exported."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import Cluster, metrics_text, settle_ticks, wait_for
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("parity"), str(HERE / "budget.yaml"),
                       **{"detector.max_unavailable": 1,
                          "detector.breaker_max_flagged_percent": 100})
    with stack:
        yield stack


def test_waiting_node_gets_one_deferred_event_and_drains_are_announced(
        stack: LocalStack) -> None:
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    first, second = "gpu-node-01", "gpu-node-02"
    gpu.inject_fault(first, "0", "xid", 79)
    wait_for(stack, f"{first} out of service", lambda: k8s.state(first) != "healthy")
    gpu.inject_fault(second, "0", "xid", 48)
    deferred = wait_for(stack, f"RemediationDeferred on {second}",
                        lambda: k8s.events(second, "RemediationDeferred"), timeout=30)
    assert "budget full" in deferred[0].message
    settle_ticks(stack, 3)
    if k8s.state(second) == "healthy":  # still waiting: no Event per tick
        assert len(k8s.events(second, "RemediationDeferred")) == 1
    for node in (first, second):
        wait_for(stack, f"{node} back in service", lambda n=node: (
            k8s.state(n) == "healthy" and not k8s.node(n).spec.unschedulable
            and k8s.events(n, "RemediationSucceeded")), timeout=120)
        (drained,) = k8s.events(node, "DrainCompleted")
        assert drained.message.startswith("drained: evicted 1 pods")
    assert k8s.events(first, "RemediationDeferred") == []


def test_unreadable_exporter_is_announced_once(stack: LocalStack) -> None:
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    node = "gpu-node-04"
    gpu.set_exporter_mode(node, "down")
    try:
        (event,) = wait_for(stack, f"TelemetryUnavailable on {node}",
                            lambda: k8s.events(node, "TelemetryUnavailable"), timeout=30)
        assert event.type == "Warning"
        settle_ticks(stack, 3)
        assert len(k8s.events(node, "TelemetryUnavailable")) == 1
    finally:
        gpu.set_exporter_mode(node, "up")


def test_per_node_state_and_last_observation_are_exported(stack: LocalStack) -> None:
    settle_ticks(stack, 1)
    text = metrics_text(stack)
    states = [line for line in text.splitlines()
              if line.startswith("gpu_remediate_node_state{")]
    assert len(states) == 4, states  # one series per node
    assert all(line.endswith(" 1.0") for line in states)
    (stamp,) = [line for line in text.splitlines()
                if line.startswith("gpu_remediate_last_observation_timestamp_seconds ")]
    assert time.time() - float(stamp.split()[1]) < 30
    assert not [line for line in text.splitlines()
                if line.startswith("gpu_remediate_observation_errors_total{")]
