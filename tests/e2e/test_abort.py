"""Abort on the real stack (dev server, worker and detector processes, both simulators):
mid-drain, with a PDB refusing every eviction, and mid-Job, while a GPU reset Job runs.
The node comes back exactly as it was, the running Job is deleted, nothing starts after.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from temporalio.client import WorkflowExecutionStatus

from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import HERE, make_stack
from tests.e2e.kit import (
    Cluster,
    abort,
    settle_ticks,
    view_state,
    wait_for,
    workflow_runs,
    workflow_status,
)
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    s = make_stack(tmp_path_factory.mktemp("abort"), str(HERE / "abort.yaml"),
                   **{"detector.max_unavailable": 2})
    # Jobs long enough to abort one while it runs.
    s.job_seconds = 30.0
    with s:
        yield s


def node_of(k8s: Cluster, workload: str) -> str:
    pods = k8s.core.list_namespaced_pod("team-z", label_selector=f"app={workload}").items
    return next(p.spec.node_name for p in pods if p.spec.node_name)


def given_back(k8s: Cluster, node: str) -> bool:
    n = k8s.node(node)
    return ((n.metadata.labels or {}).get("gpu-remediate.io/state") == "healthy"
            and not n.spec.unschedulable and not k8s.has_our_taint(n))


def assert_aborted(stack: LocalStack, k8s: Cluster, node: str) -> None:
    # Seconds when idle; on two busy cores (the whole suite) it has taken over 30 s.
    wait_for(stack, f"{node} given back", lambda: given_back(k8s, node), timeout=60)
    # The give-back is the workflow's last activity; its end follows a workflow task later.
    wait_for(stack, f"{node}'s remediation cancelled",
             lambda: workflow_status(stack, node) == WorkflowExecutionStatus.CANCELED,
             timeout=15)
    history = k8s.history(node)
    assert history[-1]["outcome"] == "aborted: aborted by e2e (unverified): wrong node", history
    assert "RemediationAborted" in k8s.event_reasons(node)
    # The XID still shows (an XID is an event: the exporter keeps the last one), and the
    # abort acknowledged it: the detector, looking every second, starts nothing again.
    assert "48" in k8s.annotations(node).get("gpu-remediate.io/acknowledged-xids", ""), \
        k8s.annotations(node)
    settle_ticks(stack, 3)
    assert workflow_status(stack, node) == WorkflowExecutionStatus.CANCELED, \
        "the detector started the aborted remediation again"
    assert workflow_runs(stack, node) == 1


def test_abort_mid_drain_with_a_pdb_refusing_every_eviction(stack: LocalStack) -> None:
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    node = node_of(k8s, "pinned")
    gpu.inject_fault(node, "0", "xid", 48)
    wait_for(stack, f"{node} blocked by the PDB",
             lambda: view_state(stack, node).blocking_pdb == "team-z/pinned", timeout=60)
    abort(stack, node, reason="wrong node")
    assert_aborted(stack, k8s, node)
    assert k8s.jobs(node) == [], "no repair Job after an abort"
    assert [p.metadata.name for p in k8s.pods_on(node)], "the protected pod was never evicted"


def test_abort_mid_job_deletes_the_running_job(stack: LocalStack) -> None:
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)
    busy = node_of(k8s, "pinned")
    node = next(n for n in k8s.nodes() if n.startswith("abort-") and n != busy)
    gpu.inject_fault(node, "0", "xid", 48)
    wait_for(stack, f"{node}'s GPU reset Job running",
             lambda: [j for j in k8s.jobs(node) if not (j.status.succeeded or j.status.failed)],
             timeout=60)
    abort(stack, node, reason="wrong node")
    assert_aborted(stack, k8s, node)

    def jobs_gone() -> bool:
        return all(j.metadata.deletion_timestamp for j in k8s.jobs(node))
    wait_for(stack, f"{node}'s Job deleted", jobs_gone, timeout=30)
    assert set(k8s.job_kinds(node)) <= {"gpu-reset"}, "no validation after an abort"
