"""The start-up look at what a GPU reset needs: the configured GPU Operator operands'
DaemonSets, against the cluster simulator (which runs them as the GPU Operator does)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from activities.job_templates import JobsSettings
from activities.prerequisites import (
    RuntimeClassCheck,
    check_runtime_classes,
    missing_prerequisites,
    named_runtime_classes,
    operands_without_daemonset,
)
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


# ------------------------------------------------------------ RuntimeClasses of Job templates


def _jobs(**templates: Any) -> JobsSettings:
    return JobsSettings.model_validate({"templates": templates})


def test_the_simulated_gpu_operator_has_the_runtime_class_the_reset_names(
        cluster: Cluster) -> None:
    assert named_runtime_classes(JobsSettings()) == {
        "nvidia": ["jobs.templates.gpu-reset.runtime_class_name"]}
    assert check_runtime_classes(cluster.api, JobsSettings()) == RuntimeClassCheck()


def test_a_missing_runtime_class_names_every_field_that_names_it(cluster: Cluster) -> None:
    client.NodeV1Api(cluster.api).delete_runtime_class("nvidia")
    jobs = _jobs(**{"long-diag": {"purpose": "validate", "image": "dcgm:1", "command": ["x"],
                                  "deadline": "PT30M", "runtime_class_name": "nvidia"}})
    found = check_runtime_classes(cluster.api, jobs)
    (line,) = found.missing
    assert line.startswith("jobs.templates.gpu-reset.runtime_class_name, "
                           "jobs.templates.long-diag.runtime_class_name: RuntimeClass "
                           "'nvidia' does not exist in the cluster")
    assert "runtime_class_name: null" in line and found.unchecked == []


def test_runtime_class_null_is_the_mode_for_clusters_without_nvidia(cluster: Cluster) -> None:
    """A built-in template given without image and command keeps the built-in's, changing
    only what it gives: the reset without a RuntimeClass, still privileged, still void."""
    client.NodeV1Api(cluster.api).delete_runtime_class("nvidia")
    jobs = _jobs(**{"gpu-reset": {"runtime_class_name": None}})
    reset = jobs.templates["gpu-reset"]
    assert reset.runtime_class_name is None and reset.privileged
    assert reset.env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert reset.command == JobsSettings().templates["gpu-reset"].command
    assert named_runtime_classes(jobs) == {}
    assert check_runtime_classes(cluster.api, jobs) == RuntimeClassCheck()


def test_a_template_with_its_own_command_inherits_nothing_of_the_builtin() -> None:
    jobs = _jobs(**{"gpu-reset": {"image": "mine:1", "command": ["reset"],
                                  "deadline": "PT5M"}})
    reset = jobs.templates["gpu-reset"]
    assert (reset.purpose, reset.privileged, reset.runtime_class_name, reset.env) == (
        "gpu-reset", False, None, {})


def test_no_grant_to_read_them_is_a_warning_naming_the_grant(cluster: Cluster) -> None:
    cluster.faults({"verb": "get", "resource": "runtimeclasses", "status": 403})
    found = check_runtime_classes(cluster.api, JobsSettings())
    assert found.missing == []
    (line,) = found.unchecked
    assert "HTTP 403" in line and "get on runtimeclasses.node.k8s.io" in line
    assert "jobs.templates.gpu-reset.runtime_class_name names 'nvidia'" in line


def test_an_api_server_without_node_k8s_io_is_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def not_served(self: Any, name: str, **_: Any) -> None:
        raise client.ApiException(status=404, reason="Not Found")

    monkeypatch.setattr(client.NodeV1Api, "read_runtime_class", not_served)
    found = check_runtime_classes(client.ApiClient(), JobsSettings())
    assert found.missing == [] and "does not serve node.k8s.io/v1" in found.unchecked[0]


def test_an_unreachable_api_is_a_warning() -> None:
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    found = check_runtime_classes(api, JobsSettings())
    assert found.missing == [] and found.unchecked[0].startswith("RuntimeClasses not checked")
