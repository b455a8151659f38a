"""The DRA contract tests (tests/sim/test_cluster_dra.py) against the simulator posing as
Kubernetes 1.37 and against a real 1.37 kube-apiserver with its controllers (the tier's
second version, tests/controlplane/k8s137), compared test by test as the contract suite is
(test_contract_parity.py). Any difference not listed here (and in docs/controlplane.md)
fails the test."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from temporalio.testing import ActivityEnvironment

from activities.gpu_isolation import GpuIsolationActivities
from sim.scenario import gpu_uuid
from tests.controlplane.controlplane import ControlPlane
from tests.controlplane.test_contract_parity import run_suite
from workflows.isolation import GpuTaintInput, IsolateGpuInput

pytestmark = pytest.mark.controlplane

SUITE = ["tests/sim/test_cluster_dra.py"]
GROUP = "resource.k8s.io"
SIM_ONLY = "simulator-only test (by design: NVIDIA's DRA driver, the simulated scheduler "\
           "and eviction controller run only there)"
KNOWN_DIFFERENCES: dict[str, tuple[str, str, str]] = {
    "test_cluster_dra.py::test_a_133_server_has_no_devicetaintrule": (
        "passed", "skipped", SIM_ONLY),
    "test_cluster_dra.py::test_the_nvidia_driver_publishes_one_slice_per_gpu_node": (
        "passed", "skipped", SIM_ONLY),
    "test_cluster_dra.py::test_scheduler_keeps_claims_off_a_tainted_gpu": (
        "passed", "skipped", SIM_ONLY),
    "test_cluster_dra.py::test_noexecute_evicts_the_pod_holding_the_gpu_and_reports_it": (
        "passed", "skipped", SIM_ONLY),
}


def test_dra_contract_on_simulator_and_real_api_server(
        controlplane_dra: ControlPlane, tmp_path: Path) -> None:
    version = controlplane_dra.info["version"]
    assert version.startswith("v1.37."), version
    sim = run_suite(tmp_path / "sim.xml", None, SUITE)
    real = run_suite(tmp_path / "real.xml", controlplane_dra.kubeconfig, SUITE)
    assert sim and real, "the DRA contract tests produced no results"
    rows, unexpected = [], []
    for test_id in sorted(set(sim) | set(real)):
        s, r = sim.get(test_id, ("missing", "")), real.get(test_id, ("missing", ""))
        if s[0] == r[0]:
            continue
        known = KNOWN_DIFFERENCES.get(test_id)
        why = known[2] if known and known[:2] == (s[0], r[0]) else "NOT DOCUMENTED"
        if why == "NOT DOCUMENTED":
            unexpected.append(test_id)
        rows.append(f"| {test_id} | {s[0]} | {r[0]}: {r[1]} | {why} |")
    table = "\n".join(["| test | simulator | real API server | why |", "|---|---|---|---|",
                       *rows])
    report = (f"# DRA contract: simulator (1.37) vs kube-apiserver {version}\n\n"
              f"{len(sim)} tests; {len(rows)} differ.\n\n{table}\n")
    (tmp_path / "dra-contract.md").write_text(report)
    print(report)
    assert not unexpected, f"undocumented differences (see {tmp_path}):\n{table}"
    passed_real = [t for t, (o, _) in real.items() if o == "passed"]
    assert passed_real, "no DRA contract test passed against the real API server"


def test_isolation_activities_on_a_real_api_server(controlplane_dra: ControlPlane) -> None:
    """isolate_gpu and set_gpu_taint against kube-apiserver 1.37: discovery picks v1, the
    device is found in a ResourceSlice published through the API as NVIDIA's driver
    publishes it, and the rule is created, made NoExecute and removed."""
    api = config.new_client_from_config(config_file=str(controlplane_dra.kubeconfig))
    custom: Any = client.CustomObjectsApi(api)
    node, uuid = "dra-node-01", f"GPU-{gpu_uuid('dra-node-01', 3)}"
    custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", {
        "metadata": {"name": f"{node}-gpu.nvidia.com-x"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {
                     "uuid": {"string": f"GPU-{gpu_uuid(node, i)}"}}} for i in range(8)]}})
    acts = GpuIsolationActivities(api)
    env = ActivityEnvironment()
    out = env.run(acts.isolate_gpu, IsolateGpuInput(node=node, uuid=uuid, gpu="3",
                                                    value="xid-48", reason="XID 48",
                                                    workflow_id="remediation-dra-node-01"))
    assert out.isolated and (out.device, out.api_version) == ("gpu-3", "v1"), out
    rule = custom.get_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules",
                                            out.rule)
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node,
                                              "device": "gpu-3"}
    assert rule["spec"]["taint"]["timeAdded"]
    env.run(acts.set_gpu_taint, GpuTaintInput(rule=out.rule, api_version=out.api_version,
                                              node=node, effect="NoExecute"))
    assert custom.get_cluster_custom_object("resource.k8s.io", "v1", "devicetaintrules",
                                            out.rule)["spec"]["taint"]["effect"] == "NoExecute"
    assert env.run(acts.set_gpu_taint, GpuTaintInput(
        rule=out.rule, api_version=out.api_version, node=node)).startswith("removed")


def _wait(check: Any, what: str, timeout: float = 60.0) -> Any:
    from tests.polling import wait_for
    return wait_for(check, timeout=timeout, what=what, every=0.5)


def test_the_real_scheduler_keeps_claims_off_the_isolated_gpu(
        controlplane_dra: ControlPlane) -> None:
    """The evidence on the real tier: an eight-GPU node's slice, one GPU isolated by
    isolate_gpu; kube-scheduler 1.37 still allocates seven, not the isolated one, and gives
    it out again once the rule is removed. (No kubelet here: claims are allocated and pods
    bound, nothing runs.)"""
    api = config.new_client_from_config(config_file=str(controlplane_dra.kubeconfig))
    core: Any = client.CoreV1Api(api)
    custom: Any = client.CustomObjectsApi(api)
    node, ns = "dra-sched-node", "dra-sched"
    core.create_node({"metadata": {"name": node,
                                   "labels": {"kubernetes.io/hostname": node}}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_node_status(node, {"status": {
        "capacity": {"pods": "110", "cpu": "64", "memory": "512Gi"},
        "allocatable": {"pods": "110", "cpu": "64", "memory": "512Gi"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "contract test", "lastHeartbeatTime": now,
                        "lastTransitionTime": now}]}})
    core.create_namespace({"metadata": {"name": ns}})
    custom.create_cluster_custom_object(GROUP, "v1", "deviceclasses", {
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]}})
    custom.create_cluster_custom_object(GROUP, "v1", "resourceslices", {
        "metadata": {"name": f"{node}-gpu.nvidia.com-x"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {
                     "uuid": {"string": f"GPU-{gpu_uuid(node, i)}"}}} for i in range(8)]}})
    sick = f"GPU-{gpu_uuid(node, 3)}"
    acts, env = GpuIsolationActivities(api), ActivityEnvironment()
    out = env.run(acts.isolate_gpu, IsolateGpuInput(node=node, uuid=sick, gpu="3",
                                                    value="xid-48", reason="XID 48"))
    assert out.isolated and out.device == "gpu-3"

    def run(name: str, count: int, uuid: str = "") -> None:
        exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": count}
        if uuid:
            exactly["selectors"] = [{"cel": {
                "expression": f'device.attributes["gpu.nvidia.com"].uuid == "{uuid}"'}}]
        custom.create_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims", {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}})
        core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "main", "image": "registry.sim.local/cuda",
                            "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}]}})

    def allocated(name: str) -> set[str] | None:
        claim = custom.get_namespaced_custom_object(GROUP, "v1", ns, "resourceclaims", name)
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                   or {}).get("results")
        return {r["device"] for r in results} if results else None

    def refused(name: str) -> str | None:
        pod = core.read_namespaced_pod(name, ns)
        for c in pod.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False":
                return str(c.message)
        return None

    run("seven", 7)
    seven = _wait(lambda: allocated("seven"), "seven GPUs allocated")
    assert len(seven) == 7 and "gpu-3" not in seven
    assert core.read_namespaced_pod("seven", ns).spec.node_name == node
    run("isolated", 1, sick)
    assert "cannot allocate all claims" in _wait(lambda: refused("isolated"),
                                                 "the isolated GPU refused")
    env.run(acts.set_gpu_taint, GpuTaintInput(rule=out.rule, api_version=out.api_version,
                                              node=node))
    assert _wait(lambda: allocated("isolated"), "the GPU given out after the release",
                 timeout=120) == {"gpu-3"}
