"""The start-up look at what a GPU reset needs: the configured GPU Operator operands'
DaemonSets, against the cluster simulator (which runs them as the GPU Operator does)."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from activities.prerequisites import missing_prerequisites, operands_without_daemonset
from tests.activities.conftest import Cluster
from tests.polling import wait_for
from workflows.settings import GpuOperatorSettings


def _ds(name: str, *, selector: dict[str, str] | None = None,
        affinity: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": selector or {}}
    if affinity:
        spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": affinity}]}}}
    return {"metadata": {"name": name}, "spec": {"template": {"spec": spec}}}


def test_an_operand_is_there_when_a_daemonset_selects_nodes_by_its_deploy_label() -> None:
    daemonsets = [
        _ds("nvidia-device-plugin-daemonset",
            selector={"nvidia.com/gpu.deploy.device-plugin": "true"}),
        _ds("nvidia-dcgm", affinity=[{"key": "nvidia.com/gpu.deploy.dcgm",
                                      "operator": "In", "values": ["true"]}]),
        # Selecting on another label, or excluding the deploy label, is not the operand's.
        _ds("nvidia-dcgm-exporter", selector={"nvidia.com/gpu.present": "true"}),
        _ds("other", affinity=[{"key": "nvidia.com/gpu.deploy.gpu-feature-discovery",
                                "operator": "NotIn", "values": ["false"]}]),
    ]
    assert operands_without_daemonset(
        ["device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery", "dcgm"],
        daemonsets) == ["dcgm-exporter", "gpu-feature-discovery"]
    assert operands_without_daemonset([], daemonsets) == []


def test_the_simulated_gpu_operator_has_every_default_operand(cluster: Cluster) -> None:
    assert missing_prerequisites(cluster.api, GpuOperatorSettings()) == []


def test_a_missing_operand_daemonset_is_one_line_naming_it(cluster: Cluster) -> None:
    apps = client.AppsV1Api(cluster.api)
    apps.delete_namespaced_daemon_set("nvidia-dcgm", "gpu-operator")
    wait_for(lambda: "nvidia-dcgm" not in {
        d.metadata.name for d in apps.list_namespaced_daemon_set("gpu-operator").items},
        10, "the DaemonSet deleted")
    (line,) = missing_prerequisites(cluster.api, GpuOperatorSettings())
    assert "'dcgm' missing" in line and "nvidia.com/gpu.deploy.dcgm" in line
    assert "namespace gpu-operator" in line


def test_the_wrong_namespace_names_every_operand(cluster: Cluster) -> None:
    operands = ["device-plugin", "dcgm-exporter"]
    lines = missing_prerequisites(cluster.api, GpuOperatorSettings(
        operands=operands, namespace="nvidia-gpu-operator"))
    assert [line.split("'")[1] for line in lines] == operands
    assert all("namespace nvidia-gpu-operator" in line for line in lines)


def test_no_operand_configured_checks_nothing() -> None:
    """Empty: the node's GPU software is not the GPU Operator's; no API call at all."""
    assert missing_prerequisites(client.ApiClient(), GpuOperatorSettings(operands=[])) == []
