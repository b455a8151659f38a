"""Per-GPU isolation end to end: an eight-GPU node with XID 48 on one GPU keeps seven GPUs
allocatable through DRA before, during and after; only the claim on the sick GPU goes, a
validation pinned to it finds the fault and holds it, and an operator's release returns it.

The laptop stack with the cluster simulator posing as Kubernetes 1.37 (DeviceTaintRule v1,
NVIDIA's DRA driver's ResourceSlices, a scheduler and eviction controller that honour
device taints) and `remediation.gpu_isolation: dra`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from sim.gpu.client import GpuSimClient
from sim.scenario import gpu_uuid
from tests.e2e.conftest import make_stack
from tests.e2e.kit import Cluster, result, update, view_state, wait_for
from worker.stack import LocalStack

pytestmark = pytest.mark.e2e

NODE = "gpu-node-01"
GROUP = "resource.k8s.io"
NS = "team-dra"
SICK = 3


@pytest.fixture(scope="module")
def dra_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = make_stack(tmp_path_factory.mktemp("dra"), "small", kind=LocalStack,
                       **{"remediation.gpu_isolation": "dra"})
    stack.kubernetes_version = "1.37"
    with stack:
        yield stack


def _claim(name: str, count: int, uuid: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
    if uuid:
        exactly["selectors"] = [{"cel": {
            "expression": f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'}}]
    return {"metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}


def _pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {"sim.gpu-remediate.io/run-forever":
                                                       "true"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "registry.sim.local/cuda:latest",
                                     "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimName": name}]}}


class Dra:
    def __init__(self, stack: LocalStack) -> None:
        api = config.new_client_from_config(config_file=str(stack.kubeconfig))
        self.stack = stack
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    def run(self, name: str, count: int, uuid: str = "") -> None:
        self.custom.create_namespaced_custom_object(GROUP, "v1", NS, "resourceclaims",
                                                    _claim(name, count, uuid))
        self.core.create_namespaced_pod(NS, _pod(name))

    def placed(self, name: str) -> dict[str, Any]:
        """The pod once the scheduler decided: bound (nodeName) or Unschedulable."""
        def decided() -> dict[str, Any] | None:
            pod = self.core.read_namespaced_pod(name, NS)
            conds = {c.type: c for c in (pod.status.conditions or [])}
            if "PodScheduled" not in conds:
                return None
            return {"node": pod.spec.node_name, "message": conds["PodScheduled"].message or ""}
        return wait_for(self.stack, f"{name} scheduled or refused", decided, timeout=30)

    def devices(self, name: str) -> set[str]:
        claim = self.custom.get_namespaced_custom_object(GROUP, "v1", NS, "resourceclaims",
                                                         name)
        return {r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}

    def stop(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, NS, grace_period_seconds=0)

        def released() -> bool:
            claim = self.custom.get_namespaced_custom_object(GROUP, "v1", NS,
                                                             "resourceclaims", name)
            return not (claim.get("status") or {}).get("allocation")
        wait_for(self.stack, f"{name}'s claim released", released, timeout=30)

    def gone(self, name: str) -> bool:
        try:
            pod = self.core.read_namespaced_pod(name, NS)
        except client.ApiException as err:
            return err.status == 404
        return pod.metadata.deletion_timestamp is not None

    def rules(self) -> list[dict[str, Any]]:
        return list(self.custom.list_cluster_custom_object(
            GROUP, "v1", "devicetaintrules")["items"])


def test_one_sick_gpu_is_isolated_and_seven_stay_allocatable(dra_stack: LocalStack) -> None:
    k8s, dra, gpu = Cluster(dra_stack), Dra(dra_stack), GpuSimClient(dra_stack.gpu_url)
    dra.core.create_namespace({"metadata": {"name": NS}})
    sick_uuid = f"GPU-{gpu_uuid(NODE, SICK)}"

    # Before: the sick-to-be GPU runs a job of its own; seven more are allocatable.
    dra.run("on-sick-gpu", 1, sick_uuid)
    assert dra.placed("on-sick-gpu")["node"] == NODE
    assert dra.devices("on-sick-gpu") == {f"gpu-{SICK}"}
    dra.run("before", 7)
    assert dra.placed("before")["node"] == NODE
    dra.stop("before")

    # The fault: XID 48 on one GPU. One DeviceTaintRule for that device, NoExecute.
    gpu.inject_fault(NODE, SICK, "xid", 48)
    rule = wait_for(dra_stack, "a NoExecute DeviceTaintRule", lambda: next(
        (r for r in dra.rules() if r["spec"]["taint"]["effect"] == "NoExecute"), None),
        timeout=90)
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": NODE,
                                              "device": f"gpu-{SICK}"}
    wait_for(dra_stack, "the claim on the sick GPU evicted",
             lambda: dra.gone("on-sick-gpu"), timeout=30)
    # The validation pinned to the GPU finds the fault still there: the GPU is held by its
    # rule (a per-GPU quarantine), the node stays in service.
    held = wait_for(dra_stack, "the GPU held after its pinned validation failed", lambda: (
        v if (v := view_state(dra_stack, NODE)).step == "gpu-quarantined" else None),
        timeout=90)
    assert held.gpu_isolation is not None
    assert held.gpu_isolation.rule == rule["metadata"]["name"]
    assert "GpuValidationFailed" in k8s.event_reasons(NODE)

    # During: the node is neither cordoned nor tainted, and seven GPUs are allocatable, not
    # the sick one; with those seven free again, an eighth is still refused: the rule
    # alone holds it (the validation and its claim are over).
    node = k8s.node(NODE)
    assert not node.spec.unschedulable and not Cluster.has_our_taint(node)
    assert "GpuIsolated" in k8s.event_reasons(NODE)
    dra.run("during", 7)
    assert dra.placed("during")["node"] == NODE
    assert f"gpu-{SICK}" not in dra.devices("during")
    dra.stop("during")
    dra.run("during-8", 8)
    assert "cannot allocate all claims" in dra.placed("during-8")["message"]
    dra.core.delete_namespaced_pod("during-8", NS, grace_period_seconds=0)
    assert dra.custom.list_namespaced_custom_object(
        GROUP, "v1", "gpu-remediate-jobs", "resourceclaims")["items"] == []

    # After: the GPU is replaced and the operator releases it; the rule goes and all
    # eight are allocatable. (A validation that passes removes the rule by itself:
    # tests/workflows/test_gpu_isolation_workflow.py, tests/activities/test_pinned_validation.py.)
    gpu.clear(NODE, SICK)
    update(dra_stack, NODE, "release", reason="GPU 3 replaced")
    done = result(dra_stack, NODE, timeout=60)
    assert done.outcome == "healthy", done.message
    wait_for(dra_stack, "the rule removed", lambda: not dra.rules(), timeout=30)
    dra.run("after", 8)
    assert dra.placed("after")["node"] == NODE
    assert not k8s.node(NODE).spec.unschedulable
