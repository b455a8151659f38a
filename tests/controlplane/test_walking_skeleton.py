"""The walking skeleton (XID 79 -> drain -> repair -> validate -> healthy) against a real
control plane, with the worker holding only the permissions of deploy/base/rbac.yaml.

The scenario test is tests/e2e/test_walking_skeleton.py's, unchanged: it is imported
here and gets this module's ``pdb_stack``, a ControlPlaneStack (real kube-apiserver,
controllers and scheduler; node_agent.py as the kubelets, whose reboots kill the reboot
Job's own pod or let it exit first, and come back with a new boot ID). The next test
checks each reboot was confirmed by that boot ID; the others read the API server's
audit log of that run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests.controlplane.stack import RBAC, REPO, SA_USER, ControlPlaneStack
from tests.e2e.test_walking_skeleton import (  # the scenario itself, run with pdb_stack below
    test_xid79_on_two_nodes_drains_within_pdb_repairs_validates_and_returns,
)
from worker.stack import Ports

pytestmark = [pytest.mark.e2e, pytest.mark.controlplane]
PROBE_AGENT = "rbac-probe"  # the refusal probes' requests, told apart from the worker's

__all__ = ["test_xid79_on_two_nodes_drains_within_pdb_repairs_validates_and_returns"]


@pytest.fixture(scope="module")
def pdb_stack(controlplane_binary: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneStack]:
    stack = ControlPlaneStack(
        data_dir=tmp_path_factory.mktemp("cpstack"),
        scenario=str(REPO / "tests" / "e2e" / "pdb.yaml"),
        ports=Ports.ephemeral(), headless=True, persistent=True, job_seconds=1.0,
        reboot_seconds=2.0, binary=controlplane_binary, service_account=True,
        overrides={"detector.interval": "PT1S", "remediation.drain.retry_interval": "PT1S",
                   "detector.max_unavailable": 2})
    with stack:
        yield stack


BOOT_CHANGE = re.compile(r"boot ID (\S+) → (\S+)\)")


def test_each_reboot_confirmed_by_a_new_boot_id(pdb_stack: ControlPlaneStack) -> None:
    """The node agent reboots like a real node: the reboot Job's pod exits 0 first or is
    killed by the shutdown, and the node comes back with a new boot ID under the same UID.
    The workflow confirmed each reboot by that boot ID (NodeRebooted), not by the Job."""
    api = config.new_client_from_config(config_file=str(pdb_stack.kubeconfig))
    with api:
        core: Any = client.CoreV1Api(api)
        batch: Any = client.BatchV1Api(api)
        events = core.list_namespaced_event("default").items
        rebooted = {n.metadata.name: n for n in core.list_node().items
                    if any(h.get("action") == "reboot" for h in json.loads(
                        (n.metadata.annotations or {}).get("gpu-remediate.io/history", "[]")))}
        assert len(rebooted) == 2, f"the skeleton reboots two nodes: {sorted(rebooted)}"
        assert not [e for e in events if e.reason == "NodeDidNotReturn"]
        for name, node in rebooted.items():
            confirmed = [e.message for e in events if e.reason == "NodeRebooted"
                         and e.involved_object.name == name]
            assert len(confirmed) == 1, f"{name}: one reboot, one confirmation: {confirmed}"
            change = BOOT_CHANGE.search(confirmed[0])
            assert change, confirmed[0]
            old, new = change.groups()
            assert old != new and new == node.status.node_info.boot_id, confirmed[0]
            jobs = [j for j in batch.list_namespaced_job("gpu-remediate-jobs").items
                    if j.metadata.labels.get("gpu-remediate.io/node") == name
                    and j.metadata.labels.get("gpu-remediate.io/job") == "reboot"]
            assert len(jobs) == 1, f"{name}: exactly one reboot Job"
            if not jobs[0].status.succeeded:
                # The shutdown killed the Job's own pod: its failure did not stop the repair.
                pods = core.list_namespaced_pod(
                    "gpu-remediate-jobs", label_selector=f"job-name={jobs[0].metadata.name}")
                assert [(p.status.phase, p.status.reason) for p in pods.items] == [
                    ("Failed", "Terminated")], f"{name}: {pods.items}"


def _rules() -> list[tuple[str, str, set[str], str | None]]:
    """(apiGroup, resource, verbs, namespace or None for cluster-wide) from rbac.yaml."""
    out = []
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc and doc["kind"] in ("ClusterRole", "Role"):
            ns = doc["metadata"].get("namespace")
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for res in rule["resources"]:
                        out.append((group, res, set(rule["verbs"]), ns))
    return out


def _requests(stack: ControlPlaneStack) -> list[dict[str, Any]]:
    return [{"verb": e["verb"], "group": e.get("objectRef", {}).get("apiGroup", ""),
             "resource": e.get("objectRef", {}).get("resource", "")
             + (f"/{e['objectRef']['subresource']}"
                if e.get("objectRef", {}).get("subresource") else ""),
             "namespace": e.get("objectRef", {}).get("namespace"),
             "code": e.get("responseStatus", {}).get("code"), "uri": e["requestURI"]}
            for e in stack.audit_events() if e.get("stage") == "ResponseComplete"
            and not e.get("userAgent", "").startswith(PROBE_AGENT)]


def test_worker_was_never_forbidden(pdb_stack: ControlPlaneStack) -> None:
    requests = _requests(pdb_stack)
    assert requests, "the audit log holds no request of the worker's ServiceAccount"
    forbidden = [r for r in requests if r["code"] == 403]
    assert not forbidden, f"RBAC in deploy/base/rbac.yaml is missing: {forbidden}"
    worker_log = (pdb_stack.data_dir / "logs" / "worker.log").read_text(errors="replace")
    assert "Forbidden" not in worker_log


def test_granted_permissions_used_or_accounted_for(pdb_stack: ControlPlaneStack) -> None:
    """Every granted (resource, verb) is used in this run, except documented ones."""
    used = {(r["group"], r["resource"], r["verb"]) for r in _requests(pdb_stack)}
    granted = {(g, res, v) for g, res, verbs, _ in _rules() for v in verbs}
    # Audit verbs: "list" of a collection, "get" of one object, "patch", "create", "delete".
    not_exercised_here = {
        # Only the drain deadline policy "force" deletes pods; this scenario never forces.
        ("", "pods", "delete"),
        # Only an abort deletes a node Job (tests/activities/test_jobs.py); none here.
        ("batch", "jobs", "delete"),
        # Only release-orphan lists a dead remediation's Jobs to delete them
        # (tests/activities/test_plan_and_orphans.py); no orphan here.
        ("batch", "jobs", "list"),
        # Only the ledger's retention deletes a month's shard past ledger.retention
        # (tests/activities/test_ledger_store.py); a fresh cluster has none that old.
        ("", "configmaps", "delete"),
        # No GPU reset runs in this scenario (covered against the cluster simulator).
        ("apps", "daemonsets", "list"),
        # Per-GPU isolation (remediation.gpu_isolation: dra) is off in this scenario and
        # the tier's 1.33 serves no DeviceTaintRule (tests/activities/test_gpu_isolation.py
        # covers the calls against the simulator posing as 1.36 and 1.37).
        ("resource.k8s.io", "devicetaintrules", "create"),
        ("resource.k8s.io", "devicetaintrules", "get"),
        ("resource.k8s.io", "devicetaintrules", "patch"),
        ("resource.k8s.io", "devicetaintrules", "delete"),
        ("resource.k8s.io", "resourceslices", "list"),
        # Only release-orphan lists a dead per-GPU remediation's rules to delete them
        # (tests/activities/test_gpu_isolation.py); no orphan here.
        ("resource.k8s.io", "devicetaintrules", "list"),
        # Only a validation pinned to an isolated GPU makes (and deletes) a ResourceClaim
        # (tests/activities/test_pinned_validation.py); isolation is off here.
        ("resource.k8s.io", "resourceclaims", "create"),
        ("resource.k8s.io", "resourceclaims", "delete"),
    }
    unused = granted - used - not_exercised_here
    report = {"used": sorted(map(list, used)), "granted_unused": sorted(map(list, unused))}
    (pdb_stack.data_dir / "rbac-report.json").write_text(json.dumps(report, indent=1))
    assert not unused, f"granted but not used by the walking skeleton: {sorted(unused)}"
    assert used <= granted | {("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
                              ("authorization.k8s.io", "selfsubjectrulesreviews", "create")}


@pytest.mark.parametrize(("call", "describe"), [pytest.param(c, d, id=d.replace(" ", "-"))
                                                for c, d in [
    (lambda core, batch: core.delete_node("gpu-node-01"), "delete a node"),
    (lambda core, batch: core.list_namespaced_secret("default"), "list secrets"),
    (lambda core, batch: core.patch_namespaced_pod("x", "team-a", {}), "patch a pod"),
    (lambda core, batch: batch.create_namespaced_job("team-a", {
        "metadata": {"name": "x"}, "spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}),
     "create a Job outside the job namespace"),
    (lambda core, batch: batch.list_namespaced_job("team-a"),
     "list Jobs outside the job namespace"),
    (lambda core, batch: core.create_namespaced_event("team-a", {
        "metadata": {"name": "x"}, "involvedObject": {"kind": "Node", "name": "n"}}),
     "create an Event outside default"),
]])
def test_service_account_is_refused_what_rbac_does_not_grant(
        pdb_stack: ControlPlaneStack, call: Any, describe: str) -> None:
    assert pdb_stack.worker_kubeconfig is not None
    api = config.new_client_from_config(config_file=str(pdb_stack.worker_kubeconfig))
    api.user_agent = PROBE_AGENT
    with api, pytest.raises(client.ApiException) as err:
        call(client.CoreV1Api(api), client.BatchV1Api(api))
    assert err.value.status == 403, f"{describe}: {err.value.status} {err.value.body}"
    assert SA_USER in json.loads(err.value.body)["message"]
