"""Nodes at their worst on the real stack (dev server, worker, detector, both simulators):
a reboot that never returns, a kubelet that stops mid-drain, a node replaced under the same
name mid-remediation. Scripted with the cluster simulator's `sim node` commands."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import Cluster, result, view_state, wait_for
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = make_stack(tmp_path_factory.mktemp("unkind"), str(HERE / "unkind.yaml"), **{
        "detector.max_unavailable": 3,
        "remediation.reboot_return_timeout": "PT15S",
        # The wedge scenario shows the deadline at work: pods stuck Terminating on the
        # NotReady node are not counted as gone before it.
        "remediation.drain.deadline": "PT25S",
        "remediation.drain.deadline_policy": "release",
        "remediation.drain.report_after": "PT3S",
        "remediation.drain.not_ready_terminating_timeout": "PT1H",
        "remediation.gpus_free_timeout": "PT15S",
    })
    with s:
        yield s


def node_command(stack: LocalStack, node: str, what: str) -> None:
    resp = httpx.post(f"{Cluster(stack).url}/sim/v1/nodes/{node}/{what}", timeout=10)
    assert resp.status_code == 200, resp.text


def trainer_node(k8s: Cluster) -> str:
    pods = k8s.core.list_namespaced_pod("team-w", label_selector="app=trainer").items
    names = [p.spec.node_name for p in pods if p.spec.node_name]
    assert names, "the trainer is scheduled"
    return str(names[0])


def node_or_none(k8s: Cluster, name: str) -> object | None:
    return k8s.nodes().get(name)


USED: set[str] = set()
"""Nodes an earlier test of the module scripted (a released node may be flagged again)."""


def idle_node(k8s: Cluster) -> str:
    busy = trainer_node(k8s)
    node = sorted(n for n in k8s.nodes() if n.startswith("unkind-")
                  and n != busy and n not in USED)[0]
    USED.add(node)
    return node


def test_a_reboot_that_never_returns_is_quarantined_node_did_not_return(
        stack: LocalStack) -> None:
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    node = idle_node(k8s)
    node_command(stack, node, "hang")
    gpu.inject_fault(node, "1", "xid", 79)
    wait_for(stack, f"{node} quarantined", lambda: k8s.state(node) == "quarantined",
             timeout=120)
    assert "NodeDidNotReturn" in k8s.event_reasons(node)
    assert "NodeRebooted" not in k8s.event_reasons(node)
    n = k8s.node(node)
    assert n.spec.unschedulable and k8s.has_our_taint(n)
    assert "reboot failed: did not return within 0:00:15" in k8s.history(node)[-1]["outcome"]
    assert [j for j in k8s.job_kinds(node) if j == "reboot"] == ["reboot"], "one reboot"
    node_command(stack, node, "recover")


def test_a_kubelet_that_stops_mid_drain_cannot_hold_the_node_for_ever(
        stack: LocalStack) -> None:
    """The trainer's pod stays Terminating on the wedged node: the drain reports it on its
    timer and the deadline's policy (here: release) applies."""
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    node = trainer_node(k8s)
    USED.add(node)
    gpu.inject_fault(node, "0", "xid", 79)
    wait_for(stack, f"{node} draining", lambda: k8s.state(node) == "draining", timeout=30)
    node_command(stack, node, "wedge")  # the trainer is evicted, and never confirmed gone
    res = result(stack, node, timeout=120)
    # Released without acknowledging the XID: stop it showing, or the detector would
    # (rightly) flag the node again at its next tick.
    gpu.clear(node)
    node_command(stack, node, "recover")
    assert res.outcome == "released", res
    assert "drain deadline 0:00:25 passed with 1 pods left" in res.message, res.message
    assert "Terminating past their grace period" in res.message
    assert "node not Ready" in res.message
    last = k8s.history(node)[-1]
    assert last["outcome"].startswith("released: drain deadline"), last
    assert "DrainCompleted" not in k8s.event_reasons(node)


def test_a_node_replaced_mid_remediation_ends_it_and_the_new_node_is_untouched(
        stack: LocalStack) -> None:
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    node = idle_node(k8s)
    old_uid = k8s.node(node).metadata.uid
    node_command(stack, node, "hang")  # the reboot keeps it down until it is replaced
    gpu.inject_fault(node, "2", "xid", 79)
    wait_for(stack, f"{node} rebooting", lambda: "reboot" in k8s.job_kinds(node), timeout=60)
    gpu.clear(node)  # the new machine's GPUs carry none of the old one's faults
    node_command(stack, node, "replace")
    res = result(stack, node, timeout=90)
    assert res.outcome == "released" and "node gone" in res.message, res
    wait_for(stack, f"{node} registered again",
             lambda: node_or_none(k8s, node) is not None, timeout=30)
    new = k8s.node(node)
    assert new.metadata.uid != old_uid
    assert not new.spec.unschedulable and not k8s.has_our_taint(new)
    assert not any(k.startswith("gpu-remediate.io/")
                   for k in (new.metadata.labels or {}) | (new.metadata.annotations or {}))
    assert "NodeGone" in k8s.event_reasons(node)


def test_a_node_back_with_7_of_8_gpus_is_not_returned_to_service(stack: LocalStack) -> None:
    """GPU 5 stays broken through the reboot (its XID never clears): the device plugin keeps
    it unhealthy, 7 of 8 GPUs are allocatable, and the node does not count as back."""
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    node = idle_node(k8s)
    gpu.inject_fault(node, 5, "xid", 79, clears_on="never")
    wait_for(stack, f"{node} quarantined", lambda: k8s.state(node) == "quarantined",
             timeout=120)
    # Either the return check saw 7 of 8 (the device plugin marks the GPU again as soon
    # as it runs) or, had it looked in the second before, every validation round did.
    outcome = k8s.history(node)[-1]["outcome"]
    plan = view_state(stack, node).plan
    said = [e.message for e in k8s.events(node, "NodeDidNotReturn")]
    why = [outcome, *plan, *said]
    assert any("allocatable nvidia.com/gpu 7 of 8 expected" in w for w in why), why
    assert "RemediationSucceeded" not in k8s.event_reasons(node)
    n = k8s.node(node)
    assert n.spec.unschedulable and k8s.has_our_taint(n)
    gpu.clear(node)
