"""A validation pinned to one GPU (gpu_isolation: dra) against the cluster simulator: the
Job's own ResourceClaim gets exactly that DRA device through our device taint, the pod lands
on the node, dcgmi diag looks at that GPU only, and the claim goes afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import jobs as jobs_module
from activities.gpu_isolation import GpuIsolationActivities
from activities.job_templates import JobsSettings
from activities.jobs import JobActivities
from sim.scenario import gpu_uuid
from tests.activities.conftest import Cluster, ThreadedGpuSim, _cluster
from tests.polling import wait_for
from workflows import errors
from workflows.isolation import GpuTaintInput, IsolateGpuInput
from workflows.messages import NodeJobInput

NS = "gpu-remediate-jobs"
NODE = "gpu-node-04"  # runs no workload: all 8 GPUs free
UUID3 = f"GPU-{gpu_uuid(NODE, 3)}"


@pytest.fixture
def k(tmp_path: Path, gpu_sim: ThreadedGpuSim,
      monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setattr(jobs_module, "POLL_SECONDS", 0.1)
    for cluster in _cluster(tmp_path, gpu_sim_url=gpu_sim.url, kubernetes_version="1.37"):
        cluster.core.create_namespace({"metadata": {"name": NS}})
        wait_for(lambda c=cluster: [p for p in c.pods_on(NODE)
                          if (p.metadata.labels or {}).get("app") == "nvidia-dcgm"
                          and any(c.type == "Ready" and c.status == "True"
                                  for c in p.status.conditions or [])], timeout=15)
        yield cluster


def _isolated(k: Cluster) -> None:
    """GPU 3 isolated as the workflow leaves it before the validation: NoExecute."""
    acts, env = GpuIsolationActivities(k.api), ActivityEnvironment()
    out = env.run(acts.isolate_gpu, IsolateGpuInput(node=NODE, uuid=UUID3, gpu="3",
                                                     workflow_id="remediation-x"))
    assert out.isolated
    env.run(acts.set_gpu_taint, GpuTaintInput(rule=out.rule, api_version=out.api_version,
                                              node=NODE, effect="NoExecute"))


def pinned(name: str = "gr-validate-gpu3-x-1") -> NodeJobInput:
    return NodeJobInput(node=NODE, kind="validate", name=name, gpus=8, gpu_index="3",
                        gpu_uuids=[UUID3], device_uuid=UUID3)


def _claims(k: Cluster) -> list[dict[str, Any]]:
    return list(client.CustomObjectsApi(k.api).list_namespaced_custom_object(
        "resource.k8s.io", "v1", NS, "resourceclaims")["items"])


def _poll(acts: JobActivities, inp: NodeJobInput) -> Any:
    env = ActivityEnvironment()
    env.info = env.info.__class__(**{**env.info.__dict__, "attempt": 2})
    try:
        return env.run(acts.poll_node_job, inp)
    except ApplicationError as err:
        assert err.type == errors.JOB_RUNNING, err
        return None


def test_the_claim_gets_exactly_that_device_through_our_taint_and_goes_after(
        k: Cluster) -> None:
    _isolated(k)
    acts = JobActivities(k.api, JobsSettings(namespace=NS))
    with pytest.raises(ApplicationError) as running:
        ActivityEnvironment().run(acts.poll_node_job, pinned())
    assert running.value.type == errors.JOB_RUNNING
    claim = next(c for c in _claims(k) if c["metadata"]["name"] == "gr-validate-gpu3-x-1")
    exactly = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "gpu.nvidia.com" and exactly["count"] == 1
    assert exactly["tolerations"] == [{"key": "gpu-remediate.io/isolated",
                                       "operator": "Exists"}]
    assert UUID3 in exactly["selectors"][0]["cel"]["expression"]
    assert claim["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-remediate"

    def allocated() -> list[Any]:
        c = client.CustomObjectsApi(k.api).get_namespaced_custom_object(
            "resource.k8s.io", "v1", NS, "resourceclaims", "gr-validate-gpu3-x-1")
        return list(((c.get("status") or {}).get("allocation") or {}).get(
            "devices", {}).get("results") or [])
    wait_for(allocated, timeout=15)
    assert [(r["pool"], r["device"]) for r in allocated()] == [(NODE, "gpu-3")]
    pod = next(p for p in k.core.list_namespaced_pod(NS).items
               if p.metadata.labels.get("job-name") == "gr-validate-gpu3-x-1")
    assert pod.spec.node_name == NODE
    assert pod.spec.containers[0].resources.limits in (None, {})
    result = None
    for _ in range(300):
        result = _poll(acts, pinned())
        if result is not None:
            break
        wait_for(lambda: True, timeout=0.1)
    assert result is not None and result.succeeded, result
    # dcgmi diag -i 3: the one GPU's results, no other's.
    assert result.evidence.startswith("dcgmi diag: all "), result.evidence
    assert result.evidence.endswith("on GPUs 3"), result.evidence
    assert _claims(k) == []


def test_a_sick_other_gpu_does_not_fail_it_and_its_own_fault_is_not_masked(
        k: Cluster, gpu_sim: ThreadedGpuSim) -> None:
    _isolated(k)
    acts = JobActivities(k.api, JobsSettings(namespace=NS))
    gpu_sim.client.inject_fault(NODE, 5, "xid", 79, clears_on="never")
    ok = ActivityEnvironment().run(acts.run_node_job, pinned("gr-validate-gpu3-a-1"))
    assert ok.succeeded, ok.message
    gpu_sim.client.inject_fault(NODE, 3, "ecc-dbe", 1, clears_on="never")
    bad = ActivityEnvironment().run(acts.run_node_job, pinned("gr-validate-gpu3-b-1"))
    assert not bad.succeeded and "GPU 3" in bad.message, bad.message
    assert "GPU 5" not in bad.evidence
    assert _claims(k) == []


def test_no_claim_is_made_in_a_dry_run(k: Cluster) -> None:
    acts = JobActivities(k.api, JobsSettings(namespace=NS))
    k.clear_writes()
    out = ActivityEnvironment().run(acts.run_node_job,
                                    pinned().model_copy(update={"dry_run": True}))
    assert out.succeeded and "would run" in out.message
    assert k.writes() == []


def test_the_simulated_dcgmi_diag_honours_its_gpu_list_only() -> None:
    from sim.cluster import dcgmi
    from sim.cluster.gpulink import Outcome

    shipped = 'exec dcgmi diag -r 2 -j --host "$NODE_IP" ${GPU_INDEX:+-i "$GPU_INDEX"}'
    assert dcgmi.gpu_list(shipped, {"GPU_INDEX": "3"}) == [3]
    assert dcgmi.gpu_list(shipped, {}) is None  # unset: every GPU, as the shell expands it
    assert dcgmi.gpu_list("dcgmi diag -r 2 -i 1,2", {}) == [1, 2]
    engine = dcgmi.HostEngine(False, "10.0.0.1")
    sick5 = Outcome(ok=False, problems=["GPU 5: XID 79 fallen off the bus"])
    assert dcgmi.run("dcgmi diag -r 2 -j", engine, 8, "570", sick5)[0] != 0
    assert dcgmi.run("dcgmi diag -r 2 -j", engine, 8, "570", sick5, [3])[0] == 0
    assert dcgmi.run("dcgmi diag -r 2 -j", engine, 8, "570", sick5, [5])[0] != 0
    assert dcgmi.run("dcgmi diag -r 2 -j", engine, 8, "570", None, [9])[0] != 0


def test_a_claim_that_cannot_be_allocated_fails_by_the_deadline_saying_why(
        k: Cluster) -> None:
    """No device with the UUID in the node's slices (no DRA driver, another naming): the
    pod is never scheduled; the Job's deadline ends it and the failure says why."""
    from datetime import timedelta

    from activities.job_templates import VALIDATION_COMMAND, JobTemplate

    short = JobTemplate(purpose="validate", image="nvcr.io/nvidia/cloud-native/dcgm:4.2.3",
                        command=["/bin/sh", "-c", VALIDATION_COMMAND],
                        deadline=timedelta(seconds=2), output="dcgmi-json")
    acts = JobActivities(k.api, JobsSettings(namespace=NS, templates={"validation": short}))
    nowhere = "GPU-00000000-0000-0000-0000-000000000000"
    inp = pinned("gr-validate-gpu3-c-1").model_copy(
        update={"device_uuid": nowhere, "gpu_uuids": [nowhere]})
    out = ActivityEnvironment().run(acts.run_node_job, inp)
    assert not out.succeeded
    assert "cannot be scheduled" in out.message or "not scheduled" in out.message, out.message
    assert _claims(k) == []


def test_an_abort_deletes_the_pinned_job_and_its_claim(k: Cluster) -> None:
    _isolated(k)
    acts = JobActivities(k.api, JobsSettings(namespace=NS))
    inp = pinned("gr-validate-gpu3-d-1")
    with pytest.raises(ApplicationError):
        ActivityEnvironment().run(acts.poll_node_job, inp)
    assert [c["metadata"]["name"] for c in _claims(k)] == [inp.name]
    ActivityEnvironment().run(acts.delete_node_job, inp)
    wait_for(lambda: not _claims(k), timeout=15)
    wait_for(lambda: not [j for j in k.batch.list_namespaced_job(NS).items
                          if j.metadata.name == inp.name], timeout=15)
