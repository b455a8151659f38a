"""The MIG manager on a simulated MIG node, as unkind as the real one: a GPU reset destroys
the GPU and compute instances while `nvidia.com/mig.config.state` still says `success`; a
validation then fails; only a restarted MIG manager (its deploy label off and on, as the
GPU Operator does it) applies the layout again: `pending`, then `success` (or `failed`).
Simulator only (docs/simulators-cluster.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sim.cluster.machines import NodeTiming
from sim.scenario import Scenario
from tests.polling import wait_for
from tests.sim.testkit import Contract, real_cluster

pytestmark = pytest.mark.skipif(bool(real_cluster()), reason="needs the simulator")

NODE = "mig-01"
LAYOUT = "all-1g.10gb"
STATE = "nvidia.com/mig.config.state"
MIG_MANAGER = "nvidia.com/gpu.deploy.mig-manager"
HOLDERS = ("device-plugin", "dcgm", "dcgm-exporter")
TIMING = NodeTiming(reboot_seconds=0.6, shutdown_seconds=0.2, device_plugin_seconds=0.3,
                    status_grace_seconds=1.0, reregister_seconds=0.3, operand_seconds=0.2,
                    plugin_health_seconds=0.2, seed=4)


def _scenario(layout: str = LAYOUT) -> Scenario:
    return Scenario.model_validate({"name": "mig", "pools": [
        {"name": "mig", "nodes": 1, "gpus": 8, "labels": {"nvidia.com/mig.config": layout}},
        {"name": "gpu", "nodes": 1, "gpus": 8}]})


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Contract]:
    c = Contract.open(tmp_path, scenario=_scenario(), job_seconds=0.1, node_timing=TIMING)
    yield c
    c.close()


def _labels(k: Contract, node: str = NODE) -> dict[str, str]:
    return dict(k.core.read_node(node).metadata.labels)


def _mig_manager(k: Contract, node: str = NODE) -> list[Any]:
    return [p for p in k.core.list_namespaced_pod(
        "gpu-operator", field_selector=f"spec.nodeName={node}").items
        if p.metadata.labels.get("app") == "nvidia-mig-manager"]


def _run(k: Contract, name: str, kind: str) -> Any:
    k.batch.create_namespaced_job("default", {"metadata": {"name": name}, "spec": {
        "backoffLimit": 0,
        "template": {"metadata": {"labels": {"gpu-remediate.io/job": kind}}, "spec": {
            "restartPolicy": "Never", "nodeName": NODE,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "registry.sim.local/x:1"}]}}}})

    def done() -> Any:
        pods = k.core.list_namespaced_pod("default", label_selector=f"job-name={name}").items
        return pods and pods[0].status.phase in ("Succeeded", "Failed") and pods[0]

    return wait_for(done, 20, f"Job {name} finished")


def _reset(k: Contract, name: str) -> None:
    """The node's GPU holders off, a reset, the holders back (what a reset step does)."""
    k.core.patch_node(NODE, {"metadata": {"labels": {
        f"nvidia.com/gpu.deploy.{o}": "false" for o in HOLDERS}}})
    wait_for(lambda: not [p for p in k.core.list_namespaced_pod(
        "gpu-operator", field_selector=f"spec.nodeName={NODE}").items
        if p.metadata.labels.get("app") in ("nvidia-device-plugin-daemonset", "nvidia-dcgm",
                                            "nvidia-dcgm-exporter")], 20, "holders gone")
    assert _run(k, name, "gpu-reset").status.phase == "Succeeded"
    k.core.patch_node(NODE, {"metadata": {"labels": {
        f"nvidia.com/gpu.deploy.{o}": "true" for o in HOLDERS}}})


def _restart_mig_manager(k: Contract) -> None:
    k.core.patch_node(NODE, {"metadata": {"labels": {MIG_MANAGER: "false"}}})
    wait_for(lambda: not _mig_manager(k), 20, "the MIG manager gone")
    k.core.patch_node(NODE, {"metadata": {"labels": {MIG_MANAGER: "true"}}})


def test_a_mig_node_runs_the_mig_manager_and_reports_its_layout_applied(k: Contract) -> None:
    labels = _labels(k)
    assert (labels[MIG_MANAGER], labels[STATE]) == ("true", "success")
    wait_for(lambda: _mig_manager(k), 20, "the MIG manager pod")
    assert MIG_MANAGER not in _labels(k, "gpu-01"), "only MIG nodes are labelled for it"
    assert not _mig_manager(k, "gpu-01")


def test_a_reset_destroys_the_instances_and_the_label_still_says_success(
        k: Contract) -> None:
    wait_for(lambda: _mig_manager(k), 20, "the MIG manager pod")
    _reset(k, "reset")
    assert _labels(k)[STATE] == "success", "the state label is stale, as on a real node"
    pod = _run(k, "validate", "validate")
    term = pod.status.container_statuses[0].state.terminated
    assert pod.status.phase == "Failed" and term.exit_code == 1
    assert f"MIG layout '{LAYOUT}' not applied" in term.message
    # A MIG manager left running does not notice: it applies only when it starts.
    assert _labels(k)[STATE] == "success"


def test_a_restarted_mig_manager_applies_the_layout_again(k: Contract) -> None:
    wait_for(lambda: _mig_manager(k), 20, "the MIG manager pod")
    _reset(k, "reset")
    _restart_mig_manager(k)
    wait_for(lambda: _labels(k)[STATE] == "pending", 20, "the MIG manager applying")
    wait_for(lambda: _labels(k)[STATE] == "success", 20, "the layout applied")
    assert _run(k, "validate", "validate").status.phase == "Succeeded"


def test_a_layout_the_mig_manager_cannot_apply_ends_failed(tmp_path: Path) -> None:
    c = Contract.open(tmp_path, scenario=_scenario("invalid-layout"), job_seconds=0.1,
                      node_timing=TIMING)
    try:
        wait_for(lambda: _mig_manager(c), 20, "the MIG manager pod")
        _reset(c, "reset")
        _restart_mig_manager(c)
        wait_for(lambda: _labels(c)[STATE] == "failed", 20, "the apply failed")
        assert _run(c, "validate", "validate").status.phase == "Failed"
    finally:
        c.close()
