"""Two more end-to-end scenarios on a real control plane (kube-apiserver, the disruption,
job and replicaset controllers, the garbage collector, the scheduler; node_agent.py as the
kubelets), the worker holding only deploy/base/rbac.yaml's permissions:

- the budget under several failures: tests/e2e/test_budget_under_load.py's test, unchanged,
  with this module's ``five_stack``;
- the PDB-blocked drain: tests/e2e/test_fleet_scenarios.py's ``pdb_scenario`` (the real
  disruption controller computes the PDB's status), with a shorter readiness delay and first
  drain report so it takes a minute, not two;
- the brownout: tests/e2e/test_brownout.py's scenario, where every Node write of the worker
  is refused by the real API server (a ValidatingAdmissionPolicy answering 403, as an RBAC
  change or a failing Node webhook does) while two nodes fail under a budget of one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from sim.gpu.client import GpuSimClient
from tests.controlplane.stack import REPO, SA_USER, ControlPlaneStack
from tests.e2e.kit import Cluster
from tests.e2e.test_brownout import claims_held_through_a_brownout
from tests.e2e.test_budget_under_load import (  # the scenario itself, run with five_stack below
    test_five_failures_at_once_never_exceed_a_budget_of_two,
)
from tests.e2e.test_fleet_scenarios import assert_pdb_scenario, pdb_scenario
from tests.polling import wait_for
from worker.stack import Ports

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]
HERE = Path(__file__).parent

__all__ = ["test_five_failures_at_once_never_exceed_a_budget_of_two"]


def _stack(binary: Path, tmp: Path, scenario: Path, **overrides: object) -> ControlPlaneStack:
    # The settings of tests/e2e/conftest.py's make_stack, on the real control plane.
    return ControlPlaneStack(
        data_dir=tmp, scenario=str(scenario), ports=Ports.ephemeral(), headless=True,
        persistent=True, job_seconds=1.0, reboot_seconds=2.0, binary=binary,
        service_account=True,
        overrides={"detector.interval": "PT1S", "remediation.drain.retry_interval": "PT1S",
                   "remediation.heartbeat_timeout": "PT5S", **overrides})


@pytest.fixture(scope="module")
def five_stack(controlplane_binary: Path,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneStack]:
    with _stack(controlplane_binary, tmp_path_factory.mktemp("cpfive"),
                REPO / "tests" / "e2e" / "five.yaml",
                **{"detector.max_unavailable": 2,
                   "detector.breaker_max_flagged_percent": 100}) as stack:
        yield stack


@pytest.fixture(scope="module")
def pdbwait_stack(controlplane_binary: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneStack]:
    with _stack(controlplane_binary, tmp_path_factory.mktemp("cppdb"), HERE / "pdbwait.yaml",
                **{"detector.max_unavailable": 1,
                   "remediation.drain.report_after": "PT10S"}) as stack:
        yield stack


def test_drain_waits_for_the_pdb_on_a_real_disruption_controller(
        pdbwait_stack: ControlPlaneStack) -> None:
    notes: dict[str, Any] = {}
    pdb_scenario(pdbwait_stack, Cluster(pdbwait_stack), GpuSimClient(pdbwait_stack.gpu_url),
                 notes, ready_after=20)
    assert_pdb_scenario(notes)


def test_a_gpu_reset_turns_the_gpu_operator_off_and_back_on_a_real_control_plane(
        five_stack: ControlPlaneStack) -> None:
    """XID 48 on a node of the real control plane: the worker sets the operands' deploy
    labels "false", the real DaemonSet controller removes their pods, the reset runs (the
    node agent refuses it while an operand holds the GPUs), the labels come back, the
    controller starts the operands again under the lifted taint, the device plugin
    registers, the validation (its own host engine) passes and the node returns."""
    from tests.e2e.kit import result, wait_for

    k8s, gpu = Cluster(five_stack), GpuSimClient(five_stack.gpu_url)
    node = "gpu-node-06"
    gpu.inject_fault(node, "3", "xid", 48)
    wait_for(five_stack, f"{node} claimed", lambda: k8s.state(node) != "healthy", timeout=60)
    res = result(five_stack, node, timeout=180)
    assert res.outcome == "healthy", res
    assert k8s.job_kinds(node) == ["gpu-reset", "validate"], "reset, no reboot"
    reasons = k8s.event_reasons(node)
    assert "GpuOperandsPaused" in reasons and "GpuOperandsRestored" in reasons, reasons
    labels = k8s.node(node).metadata.labels or {}
    assert all(labels.get(f"nvidia.com/gpu.deploy.{o}") == "true"
               for o in ("device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery"))
    n = k8s.node(node)
    assert n.status.allocatable["nvidia.com/gpu"] == "8" and not n.spec.unschedulable


@pytest.fixture(scope="module")
def brownout_stack(controlplane_binary: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneStack]:
    with _stack(controlplane_binary, tmp_path_factory.mktemp("cpbrownout"),
                REPO / "tests" / "e2e" / "budget.yaml",
                **{"detector.max_unavailable": 1,
                   "detector.breaker_max_flagged_percent": 100}) as stack:
        yield stack


BROWNOUT = "gpu-remediate-test-brownout"


def test_claims_held_through_a_refused_node_write_never_land_together(
        brownout_stack: ControlPlaneStack) -> None:
    """The brownout on kube-apiserver itself: a ValidatingAdmissionPolicy refuses every Node
    update by the worker's ServiceAccount with 403 Forbidden. One lease is held through it,
    no write lands, and once the policy is gone the nodes are repaired one at a time."""
    api = config.new_client_from_config(config_file=str(brownout_stack.kubeconfig))
    adm: Any = client.AdmissionregistrationV1Api(api)

    def start() -> None:
        adm.create_validating_admission_policy({
            "metadata": {"name": BROWNOUT},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{
                         "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                         "resources": ["nodes"]}]},
                     "validations": [{
                         "expression": f"request.userInfo.username != '{SA_USER}'",
                         "message": "node writes refused (test brownout)",
                         "reason": "Forbidden"}]}})
        adm.create_validating_admission_policy_binding({
            "metadata": {"name": BROWNOUT},
            "spec": {"policyName": BROWNOUT, "validationActions": ["Deny"]}})
        # The API server applies a new policy a moment later: the brownout starts when a
        # write of the worker's ServiceAccount is refused (a harmless annotation).
        worker_api = config.new_client_from_config(
            config_file=str(brownout_stack.worker_kubeconfig))
        with worker_api:
            as_worker: Any = client.CoreV1Api(worker_api)

            def refused() -> bool:
                try:
                    as_worker.patch_node("gpu-node-03", {"metadata": {"annotations": {
                        "gpu-remediate.io/test-brownout-probe": str(time.monotonic())}}})
                except client.ApiException as err:
                    return err.status == 403
                return False
            wait_for(refused, timeout=30, what="the policy refusing the worker's writes",
                     every=0.2)

    def stop() -> None:
        adm.delete_validating_admission_policy_binding(BROWNOUT)
        adm.delete_validating_admission_policy(BROWNOUT)

    with api:
        claims_held_through_a_brownout(brownout_stack, start, stop)
        denied = [e for e in brownout_stack.audit_events()
                  if e.get("user", {}).get("username") == SA_USER
                  and e.get("objectRef", {}).get("resource") == "nodes"
                  and e.get("verb") == "patch"
                  and e.get("responseStatus", {}).get("code") == 403]
        assert denied, "the worker's node writes were refused by the API server"
