"""The node Job manifests: pinned, tolerant, GPU-exclusive for validation, least privilege."""

from __future__ import annotations

from datetime import timedelta

from activities.jobs import job_manifest
from workflows.models import JobSettings, NodeJobInput, RemediationSettings


def manifest(kind: str, job: JobSettings, gpus: int = 8) -> dict:
    return job_manifest(NodeJobInput(node="gpu-node-07", kind=kind, name=f"gr-{kind}-x-1",
                                     namespace="gpu-remediate-jobs", job=job, gpus=gpus,
                                     gpu_index="3" if kind == "gpu-reset" else None))


def test_validation_job_requests_every_gpu_and_runs_unprivileged() -> None:
    m = manifest("validate", RemediationSettings().validation)
    pod = m["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["nodeName"] == "gpu-node-07"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "securityContext" not in container and "hostPID" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert m["spec"]["backoffLimit"] == 0
    assert m["spec"]["activeDeadlineSeconds"] == 20 * 60
    assert container["command"] == ["dcgmi", "diag", "-r", "2"]


def test_reset_job_is_privileged_targets_one_gpu_and_requests_none() -> None:
    job = RemediationSettings().gpu_reset.model_copy(update={"service_account": "gpu-repair"})
    m = manifest("gpu-reset", job)
    pod = m["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"] == {"privileged": True}
    assert {"name": "GPU_INDEX", "value": "3"} in container["env"]
    assert "resources" not in container
    assert pod["serviceAccountName"] == "gpu-repair"
    assert m["metadata"]["labels"]["gpu-remediate.io/job"] == "gpu-reset"


def test_deadline_comes_from_settings() -> None:
    job = JobSettings(image="x", command=["true"], deadline=timedelta(minutes=3))
    assert manifest("reboot", job)["spec"]["activeDeadlineSeconds"] == 180
