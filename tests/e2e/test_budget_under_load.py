"""Five nodes fail at once under max_unavailable=2: never more than two out of service,
sampled continuously from the cluster, and every node comes back exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import OUT_OF_SERVICE, Cluster, worker_log
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def five_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("five"), str(HERE / "five.yaml"),
                       **{"detector.max_unavailable": 2,
                          "detector.breaker_max_flagged_percent": 100})
    with stack:
        yield stack


def test_five_failures_at_once_never_exceed_a_budget_of_two(five_stack: LocalStack) -> None:
    k8s, gpu = Cluster(five_stack), GpuSimClient(five_stack.gpu_url)
    sick = [f"gpu-node-0{i}" for i in range(1, 6)]
    for i, node in enumerate(sick):
        gpu.inject_fault(node, str(i), "xid", 79)
    max_out, seen_out = 0, set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        states = {n: (node.metadata.labels or {}).get("gpu-remediate.io/state")
                  for n, node in k8s.nodes().items()}
        out = {n for n, s in states.items() if s in OUT_OF_SERVICE}
        max_out, seen_out = max(max_out, len(out)), seen_out | out
        if all(states[n] == "healthy" and not k8s.node(n).spec.unschedulable for n in sick):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"not all back in service: {states}\n{worker_log(five_stack)}")
    assert max_out <= 2, f"{max_out} nodes out of service with max_unavailable=2"
    assert max_out == 2, "the budget was used, not serialised needlessly"
    assert seen_out == set(sick), "every sick node was remediated, no healthy one"
    for node in sick:
        history = json.loads((k8s.node(node).metadata.annotations or {})[
            "gpu-remediate.io/history"])
        assert [h["outcome"].split(":")[0] for h in history] == ["healthy"]
