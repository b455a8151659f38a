"""A GPU reset on a MIG node on the real stack (dev server, worker, detector, both
simulators): the reset destroys the MIG instances while `nvidia.com/mig.config.state` still
says `success` (sim/cluster/mig.py), so the node is validated, and returned, only because
the reset restarted the MIG manager and waited for it to apply the layout again."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import Cluster, result, wait_for
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e

NODE = "mig-01"
LAYOUT = "all-1g.10gb"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = make_stack(tmp_path_factory.mktemp("mig"), str(HERE / "mig.yaml"), **{
        "detector.max_unavailable": 2, "detector.breaker_max_flagged_percent": 100})
    with s:
        yield s


def test_a_reset_on_a_mig_node_reapplies_the_layout_before_validation(
        stack: LocalStack) -> None:
    k8s = Cluster(stack)
    gpu = GpuSimClient(stack.gpu_url)
    start = time.monotonic()
    gpu.inject_fault(NODE, "3", "xid", 48)
    wait_for(stack, f"{NODE} claimed", lambda: k8s.state(NODE) != "healthy", timeout=30)
    res = result(stack, NODE, timeout=120)
    took = time.monotonic() - start
    assert res.outcome == "healthy", res
    # One reset and one validation that passed: without the MIG manager's restart the
    # validation finds no MIG instance and the repair escalates to a reboot (whose boot
    # restarts the MIG manager): healthy too, but a reboot the node did not need.
    jobs = sorted(j.metadata.labels["gpu-remediate.io/job"] for j in k8s.jobs(NODE))
    assert jobs == ["gpu-reset", "validate"], jobs
    labels = k8s.node(NODE).metadata.labels
    assert labels["nvidia.com/gpu.deploy.mig-manager"] == "true", "restored as found"
    assert labels["nvidia.com/mig.config.state"] == "success"
    restored = " ".join(e.message for e in k8s.events(NODE, "GpuOperandsRestored"))
    assert f"the MIG manager re-applies MIG layout '{LAYOUT}'" in restored, restored
    paused = " ".join(e.message for e in k8s.events(NODE, "GpuOperandsPaused"))
    assert "nvidia.com/gpu.deploy.mig-manager" in paused, paused
    history = k8s.history(NODE)
    assert history[-1]["action"] == "reset" and "dcgmi diag: all" in history[-1]["outcome"]
    print(f"\nMIG node: XID 48 to healthy (reset, layout re-applied, validated) in "
          f"{took:.1f} s")
