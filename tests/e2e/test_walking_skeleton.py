"""A simulated XID 79 drives two nodes through the whole remediation, end to end:
real Temporal dev server, worker process, GPU and cluster simulators."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from kubernetes import client, config

from activities.ledger import LEDGER_SELECTOR, parse_shard
from sim.gpu.client import GpuSimClient
from tests.e2e.conftest import core_api
from tests.e2e.kit import wait_for
from worker.config import TemporalSettings
from worker.stack import LocalStack
from worker.temporal_client import connect
from workflows.ids import remediation_workflow_id
from workflows.messages import RemediationResult

pytestmark = pytest.mark.e2e

OUT_OF_SERVICE = {"awaiting-approval", "draining", "repairing", "validating", "cordoned"}
TAINT = "gpu-remediate.io/remediation"


def _ready(pod: client.V1Pod) -> bool:
    if pod.metadata.deletion_timestamp is not None or pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_xid79_on_two_nodes_drains_within_pdb_repairs_validates_and_returns(
        pdb_stack: LocalStack) -> None:
    core = core_api(pdb_stack)
    def ready_trainers() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod("team-a", label_selector="app=trainer").items
        return [p for p in pods if _ready(p)]

    # The PDB is measured from a settled start: both trainers Ready (the scenario's take
    # five seconds, and the stack can be up sooner).
    trainers = wait_for(pdb_stack, "both trainers Ready",
                        lambda: ready if len(ready := ready_trainers()) == 2 else None,
                        timeout=60)
    sick = sorted({p.spec.node_name for p in trainers})
    assert len(sick) == 2, "the scenario puts one trainer on each of two nodes"

    gpu = GpuSimClient(pdb_stack.gpu_url)
    for node in sick:
        gpu.inject_fault(node, "0", "xid", 79)

    max_out, min_ready, done = 0, 2, False
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        nodes = {n.metadata.name: n for n in core.list_node().items}
        out = [n for n in nodes.values()
               if (n.metadata.labels or {}).get("gpu-remediate.io/state") in OUT_OF_SERVICE]
        max_out = max(max_out, len(out))
        pods = core.list_namespaced_pod("team-a", label_selector="app=trainer").items
        min_ready = min(min_ready, sum(1 for p in pods if _ready(p)))
        done = all((nodes[n].metadata.labels or {}).get("gpu-remediate.io/state") == "healthy"
                   and not nodes[n].spec.unschedulable for n in sick)
        if done:
            break
        time.sleep(0.25)
    assert done, f"nodes not back in service: {[(n, nodes[n].metadata.labels) for n in sick]}"
    assert max_out <= 2, "budget max_unavailable=2 exceeded"
    assert min_ready >= 1, "the trainer PDB (minAvailable 1) was violated"

    for node in sick:
        n = core.read_node(node)
        ann = n.metadata.annotations or {}
        assert not any(t.key == TAINT for t in n.spec.taints or [])
        history = json.loads(ann["gpu-remediate.io/history"])
        assert len(history) == 1 and history[0]["outcome"].startswith("healthy")
        assert history[0]["action"] == "reboot"
        assert "gpu-remediate.io/workflow-id" not in ann, "in-flight annotations are removed"
        reasons = [e.reason for e in core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={node}").items]
        for expected in ("RemediationStarted", "RepairStarted", "NodeRebooted",
                         "ValidationStarted", "RemediationSucceeded"):
            assert expected in reasons, f"{node}: no {expected} event in {reasons}"
        assert gpu.health(node)["healthy"], "the reboot cleared XID 79"

    # The second drain had to wait for the first node's replacement trainer to be Ready.
    blocked = [e for e in core.list_namespaced_event("default").items
               if e.reason == "DrainBlocked"]
    assert blocked and all("team-a/trainer" in e.message for e in blocked)

    batch = client.BatchV1Api(config.new_client_from_config(
        config_file=str(pdb_stack.kubeconfig)))
    jobs = batch.list_namespaced_job("gpu-remediate-jobs").items
    for node in sick:
        # One reboot Job, whatever its fate (the shutdown may kill its own pod: the reboot
        # is confirmed by the node's new boot ID, NodeRebooted), and a passing validation.
        kinds = sorted(j.metadata.labels["gpu-remediate.io/job"] for j in jobs
                       if j.metadata.labels.get("gpu-remediate.io/node") == node)
        assert kinds == ["reboot", "validate"], f"{node}: {kinds}"
        validate = next(j for j in jobs if j.metadata.labels["gpu-remediate.io/job"] == "validate"
                        and j.metadata.labels["gpu-remediate.io/node"] == node)
        assert validate.status.succeeded == 1, f"{node}: {validate.status}"
        spec = validate.spec.template.spec
        assert spec.node_name == node
        assert spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"

    async def results() -> list[RemediationResult]:
        temporal = await connect(TemporalSettings(address=pdb_stack.temporal_address))
        return [await temporal.get_workflow_handle(
            remediation_workflow_id(n), result_type=RemediationResult).result() for n in sick]

    for result in asyncio.run(results()):
        assert result.outcome == "healthy"

    # Each outcome is in the repair ledger, off the nodes (wherever the record namespace is).
    raw = core.list_config_map_for_all_namespaces(label_selector=LEDGER_SELECTOR,
                                                  _preload_content=False)
    entries = [e for item in json.loads(raw.data)["items"] for e in parse_shard(item)[1]]
    mine = sorted((e for e in entries if e.node in sick), key=lambda e: e.node)
    assert [(e.node, e.action, e.outcome, e.gpu_count) for e in mine] == [
        (n, "reboot", "healthy", 8) for n in sick]
    for e in mine:
        assert e.fault.startswith("xid-79")   # the catalog's rule: xid-79-restart-bm
        assert {"draining", "repairing", "validating"} <= {s.state for s in e.steps}
        assert e.node_uid == core.read_node(e.node).metadata.uid
