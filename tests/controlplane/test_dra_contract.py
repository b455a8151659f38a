"""The DRA contract tests (tests/sim/test_cluster_dra.py) against the simulator posing as
Kubernetes 1.37 and against a real 1.37 kube-apiserver with its controllers (the tier's
second version, tests/controlplane/k8s137), compared test by test as the contract suite is
(test_contract_parity.py). Any difference not listed here (and in docs/controlplane.md)
fails the test."""

from __future__ import annotations

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
