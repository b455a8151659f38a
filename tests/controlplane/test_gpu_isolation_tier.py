"""Per-GPU isolation end to end on the real control plane (the tier's Kubernetes 1.37):
the worker, with `remediation.gpu_isolation: dra` and the ServiceAccount and RBAC of
deploy/base, holds one GPU of an eight-GPU node with a DeviceTaintRule that the real
kube-apiserver validates and kube-scheduler honours; seven GPUs stay allocatable, the node
stays in service, and an operator's release gives the eighth back.

The fault is a row-remap failure on one GPU: the catalog holds it without a validation
(a pinned validation's Job needs a kubelet that prepares DRA claims, which the node agent
is not; tests/e2e/test_gpu_isolation.py runs that part on the simulator). What NVIDIA's
DRA driver would publish for the node (its DeviceClass and ResourceSlice) is created by
the test as an admin.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sim.gpu.client import GpuSimClient
from sim.scenario import gpu_uuid
from tests.controlplane.stack import ControlPlaneStack
from tests.e2e.kit import Cluster, result, update, view_state, wait_for
from worker.stack import Ports

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]

# The control plane's default controllers (tests/controlplane/k8s137/main.go) and DRA's
# two: the one that evicts pods using a device under a NoExecute taint, and the one that
# lets a claim go once no pod uses it.
CONTROLLERS = ("disruption-controller,job-controller,replicaset-controller,"
               "deployment-controller,daemonset-controller,statefulset-controller,"
               "garbage-collector-controller,namespace-controller,serviceaccount-controller,"
               "serviceaccount-token-controller,node-lifecycle-controller,"
               "pod-garbage-collector-controller,taint-eviction-controller,"
               "ttl-after-finished-controller,root-ca-certificate-publisher-controller,"
               "device-taint-eviction-controller,resourceclaim-controller")
NODE = "gpu-node-01"
GROUP = "resource.k8s.io"
NS = "team-dra"
SICK = 3


@pytest.fixture(scope="module")
def dra_stack(controlplane_dra_binary: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneStack]:
    stack = ControlPlaneStack(
        data_dir=tmp_path_factory.mktemp("cpdra"), scenario="small",
        ports=Ports.ephemeral(), headless=True, persistent=True, job_seconds=1.0,
        reboot_seconds=2.0, binary=controlplane_dra_binary, service_account=True,
        controlplane_args=[f"--controllers={CONTROLLERS}"],
        overrides={"detector.interval": "PT1S", "remediation.drain.retry_interval": "PT1S",
                   "remediation.heartbeat_timeout": "PT5S",
                   "remediation.gpu_isolation": "dra"})
    with stack:
        yield stack


class Dra:
    """What NVIDIA's DRA driver publishes, and claims of a GPU user, as an admin."""

    def __init__(self, stack: ControlPlaneStack) -> None:
        api = config.new_client_from_config(config_file=str(stack.kubeconfig))
        self.stack = stack
        self.core: Any = client.CoreV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    def publish(self, node: str) -> None:
        self.custom.create_cluster_custom_object(GROUP, "v1", "deviceclasses", {
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {"selectors": [{"cel": {
                "expression": 'device.driver == "gpu.nvidia.com"'}}]}})
        self.custom.create_cluster_custom_object(GROUP, "v1", "resourceslices", {
            "metadata": {"name": f"{node}-gpu.nvidia.com-tier"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {
                         "uuid": {"string": f"GPU-{gpu_uuid(node, i)}"}}}
                         for i in range(8)]}})
        self.core.create_namespace({"metadata": {"name": NS}})

    def run(self, name: str, count: int, uuid: str = "") -> None:
        exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
        if uuid:
            exactly["selectors"] = [{"cel": {
                "expression": f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'}}]
        self.custom.create_namespaced_custom_object(GROUP, "v1", NS, "resourceclaims", {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}})
        self.core.create_namespaced_pod(NS, {"metadata": {"name": name}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "registry.sim.local/cuda:latest",
                            "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}]}})

    def allocated(self, name: str) -> set[str] | None:
        claim = self.custom.get_namespaced_custom_object(GROUP, "v1", NS, "resourceclaims",
                                                         name)
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                   or {}).get("results")
        return {r["device"] for r in results} if results else None

    def refused(self, name: str) -> str | None:
        pod = self.core.read_namespaced_pod(name, NS)
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                return str(c.message)
        return None

    def gone(self, kind: str, name: str) -> bool:
        read = (self.core.read_namespaced_pod if kind == "pod" else
                lambda n, ns: self.custom.get_namespaced_custom_object(
                    GROUP, "v1", ns, "resourceclaims", n))
        try:
            read(name, NS)
        except client.ApiException as err:
            return err.status == 404
        return False

    def rules(self) -> list[dict[str, Any]]:
        return list(self.custom.list_cluster_custom_object(
            GROUP, "v1", "devicetaintrules")["items"])


def test_one_gpu_held_on_the_real_server_while_seven_stay_allocatable(
        dra_stack: ControlPlaneStack) -> None:
    k8s, dra, gpu = Cluster(dra_stack), Dra(dra_stack), GpuSimClient(dra_stack.gpu_url)
    dra.publish(NODE)
    sick_uuid = f"GPU-{gpu_uuid(NODE, SICK)}"

    # Before: a job on the GPU about to fail.
    dra.run("before", 1, sick_uuid)
    assert wait_for(dra_stack, "the GPU allocated before the fault",
                    lambda: dra.allocated("before"), timeout=60) == {f"gpu-{SICK}"}

    gpu.inject_fault(NODE, SICK, "row-remap-failure")
    rule = wait_for(dra_stack, "a NoExecute DeviceTaintRule on the real API server",
                    lambda: next((r for r in dra.rules()
                                  if r["spec"]["taint"]["effect"] == "NoExecute"), None),
                    timeout=120)
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": NODE,
                                              "device": f"gpu-{SICK}"}
    assert rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-remediate"
    # NoExecute: the real device-taint eviction controller deletes the pod using the GPU.
    wait_for(dra_stack, "the pod on the held GPU evicted", lambda: dra.gone("pod", "before"),
             timeout=60)
    dra.custom.delete_namespaced_custom_object(GROUP, "v1", NS, "resourceclaims", "before")
    wait_for(dra_stack, "its claim let go", lambda: dra.gone("claim", "before"), timeout=60)
    held = wait_for(dra_stack, "the GPU held as a per-GPU quarantine", lambda: (
        v if (v := view_state(dra_stack, NODE)).step == "gpu-quarantined" else None),
        timeout=60)
    assert held.gpu_isolation is not None and held.gpu_isolation.uuid == sick_uuid
    assert held.gpu_isolation.rule == rule["metadata"]["name"]
    assert held.gpu_isolation.api_version == "v1"

    # During: the node is neither cordoned nor tainted; kube-scheduler allocates seven GPUs,
    # not the held one, and refuses a claim for the held one (free but for the rule).
    node = k8s.node(NODE)
    assert not node.spec.unschedulable and not Cluster.has_our_taint(node)
    reasons = k8s.event_reasons(NODE)
    assert "GpuIsolated" in reasons and "GpuQuarantined" in reasons, reasons
    dra.run("during", 7)
    seven = wait_for(dra_stack, "seven GPUs allocated", lambda: dra.allocated("during"),
                     timeout=60)
    assert len(seven) == 7 and f"gpu-{SICK}" not in seven
    dra.run("on-sick-gpu", 1, sick_uuid)
    assert "cannot allocate all claims" in wait_for(
        dra_stack, "the held GPU refused", lambda: dra.refused("on-sick-gpu"), timeout=60)

    # After: the GPU is replaced and an operator releases it; the worker removes the rule
    # and the scheduler gives the GPU out.
    gpu.clear(NODE, SICK)
    update(dra_stack, NODE, "release", reason="GPU 3 replaced")
    done = result(dra_stack, NODE, timeout=60)
    assert done.outcome == "healthy", done.message
    wait_for(dra_stack, "the rule removed", lambda: not dra.rules(), timeout=30)
    assert wait_for(dra_stack, "the GPU given out after the release",
                    lambda: dra.allocated("on-sick-gpu"), timeout=120) == {f"gpu-{SICK}"}
    assert not k8s.node(NODE).spec.unschedulable
