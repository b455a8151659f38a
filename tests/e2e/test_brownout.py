"""An API brownout on the real stack: reads work, every Node write fails with 500.

Two nodes fail under max_unavailable=1. The first claim retries through the brownout
holding the detector's lease; the second waits for the slot, whatever time passes. When
writes recover, the claims do not land together: never more than one node out of service,
sampled continuously from the cluster, and both are repaired one after the other."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import OUT_OF_SERVICE, Cluster, detector_view, worker_log
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def brownout_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("brownout"), str(HERE / "budget.yaml"),
                       **{"detector.max_unavailable": 1,
                          "detector.breaker_max_flagged_percent": 100})
    with stack:
        yield stack


def _out(k8s: Cluster) -> set[str]:
    return {n for n, node in k8s.nodes().items()
            if (node.metadata.labels or {}).get("gpu-remediate.io/state") in OUT_OF_SERVICE}


def test_claims_held_through_a_brownout_never_land_together(
        brownout_stack: LocalStack) -> None:
    k8s = Cluster(brownout_stack)
    claims_held_through_a_brownout(
        brownout_stack,
        start=lambda: k8s.set_faults([{"verb": "patch", "resource": "nodes", "status": 500}]),
        stop=k8s.clear_faults)


def claims_held_through_a_brownout(stack: LocalStack, start: Callable[[], object],
                                   stop: Callable[[], object]) -> None:
    """Two nodes fail under max_unavailable=1 while ``start``..``stop`` makes every Node
    write of the worker fail: one lease, no write lands, then one node out at a time."""
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    sick = ["gpu-node-01", "gpu-node-02"]
    start()
    try:
        for node in sick:
            gpu.inject_fault(node, "0", "xid", 79)
        # The brownout: the detector admits one (its lease), the other waits for the slot.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            view = detector_view(stack)
            if len(view.in_flight) == 1 and any("budget full" in w for w in view.waiting):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no admission under the brownout: {view}\n{worker_log(stack)}")
        held = view.in_flight[0]
        seen_max = 0
        end = time.monotonic() + 30
        while time.monotonic() < end:  # many ticks; the claim keeps failing
            view = detector_view(stack)
            assert view.in_flight == [held], view
            seen_max = max(seen_max, len(_out(k8s)))
            time.sleep(0.5)
        assert seen_max == 0, "no write landed during the brownout"
    finally:
        stop()
    max_out, seen = 0, set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        out = _out(k8s)
        max_out, seen = max(max_out, len(out)), seen | out
        if seen >= set(sick) and not out and all(
                not k8s.node(n).spec.unschedulable for n in sick):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"not both repaired: seen {seen}\n{worker_log(stack)}")
    assert max_out == 1, f"{max_out} nodes out of service at once with max_unavailable=1"
    assert seen == set(sick)
