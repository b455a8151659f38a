"""The node Job manifests: pinned, tolerant, GPU-exclusive for validation, least privilege."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest

from activities.job_templates import JobsSettings, JobTemplate
from activities.jobs import job_manifest
from workflows.messages import NodeJobInput

TEMPLATES = JobsSettings().templates


def manifest(kind: str, job: JobTemplate, gpus: int = 8) -> dict:
    return job_manifest(NodeJobInput(node="gpu-node-07", kind=kind, name=f"gr-{kind}-x-1",
                                     gpus=gpus, gpu_index="3" if kind == "gpu-reset" else None),
                        job, "gpu-remediate-jobs")


def test_validation_job_requests_every_gpu_on_the_nodes_one_host_engine() -> None:
    m = manifest("validate", TEMPLATES["validation"])
    pod = m["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["nodeName"] == "gpu-node-07"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # Root as the image runs (an engine of its own on MIG/NVSwitch nodes needs it), but
    # neither privileged nor the host's namespaces or files.
    assert "securityContext" not in container
    assert "hostPID" not in pod and "volumes" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert m["metadata"]["namespace"] == "gpu-remediate-jobs"
    assert m["spec"]["backoffLimit"] == 0
    assert m["spec"]["activeDeadlineSeconds"] == 20 * 60
    shell, flag, script = container["command"]
    assert (shell, flag) == ("/bin/sh", "-c")
    # The worker chooses the engine: the node's standalone one, or the Job's own (started
    # before the diagnostic); nothing chosen runs no diagnostic at all.
    standalone = script[script.index("standalone)"):script.index(";;")]
    assert 'dcgmi diag -r 2 -j --host "$NODE_IP"' in standalone
    assert "nv-hostengine" not in standalone
    embedded = script[script.index("embedded)"):]
    assert embedded.index("nv-hostengine") < embedded.index("dcgmi diag -r 2 -j")
    assert "*) echo" in script and "exit 3" in script
    assert TEMPLATES["validation"].output == "dcgmi-json"
    chosen = job_manifest(NodeJobInput(node="n", kind="validate", name="v", gpus=8),
                          TEMPLATES["validation"], "ns", host_engine="standalone")
    env = chosen["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "DCGM_HOST_ENGINE", "value": "standalone"} in env
    assert {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}} in env


def test_default_reset_holds_no_gpu_and_handles_persistence_mode_by_uuid() -> None:
    t = TEMPLATES["gpu-reset"]
    # void: the runtime gives the container no GPU, so nothing of its own holds one.
    assert t.runtime_class_name == "nvidia" and t.env == {"NVIDIA_VISIBLE_DEVICES": "void"}
    script = t.command[-1]
    # Persistence off for each target by UUID, the reset by UUID, back on only where it was.
    off, reset, on = (script.index('-i "$u" -pm 0'), script.index('-i "$u" --gpu-reset'),
                      script.index('-i "$u" -pm 1'))
    assert off < reset < on
    assert 'was_on="$was_on $u"' in script and "for u in $was_on" in script
    assert 'if [ "$pm" = "Enabled" ]' in script
    # A refusal lists who holds the GPUs, as nvidia-smi reports them.
    assert "--query-compute-apps=gpu_uuid,pid,process_name" in script
    env = manifest("gpu-reset", t)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in env


def test_reset_targets_travel_as_uuids() -> None:
    inp = NodeJobInput(node="n", kind="gpu-reset", name="r", gpus=8, gpu_index="3",
                       gpu_uuids=["GPU-5f0c6a2e-8d0b-4c1e-9a57-6b1f3c2d9e41"])
    env = job_manifest(inp, TEMPLATES["gpu-reset"], "ns")["spec"]["template"]["spec"][
        "containers"][0]["env"]
    assert {"name": "GPU_UUIDS", "value": "GPU-5f0c6a2e-8d0b-4c1e-9a57-6b1f3c2d9e41"} in env
    # Exporter text is the node's: anything but a UUID never reaches the shell.
    with pytest.raises(ValueError, match="gpu_uuids"):
        NodeJobInput(node="n", kind="gpu-reset", name="r", gpus=8,
                     gpu_uuids=["GPU-1; reboot"])
    with pytest.raises(ValueError, match="set by the worker"):
        JobTemplate(purpose="gpu-reset", image="x", command=["true"],
                    deadline=timedelta(minutes=3), env={"GPU_UUIDS": "all"})


def test_reboot_runs_from_the_workers_own_image_and_sysrq_only_without_systemctl() -> None:
    jobs = JobsSettings(worker_image="registry.example/gpu-remediate@sha256:" + "a" * 64)
    t = jobs.resolve("reboot", "")
    assert t.image == "registry.example/gpu-remediate@sha256:" + "a" * 64
    assert "busybox" not in JobsSettings().resolve("reboot", "").image
    script = t.command[-1]
    # A failing `systemctl reboot` is the Job's failure (exec), never a sysrq crash.
    assert script.index("[ -x /host/usr/bin/systemctl ]") < script.index(
        "exec nsenter -t 1 -m -u -i -n -p -- systemctl reboot") < script.index("sysrq-trigger")
    assert "|| { sync" not in script
    pod = manifest("reboot", t)["spec"]["template"]["spec"]
    # The worker's image runs as a non-root user: the privileged container runs as root.
    assert pod["containers"][0]["securityContext"] == {"privileged": True, "runAsUser": 0}


def test_require_digest_names_the_worker_image_the_reboot_runs_from() -> None:
    with pytest.raises(ValueError, match=r"worker_image: .* not pinned .*templates reboot"):
        JobsSettings(require_digest=True, templates={
            "validation": {"image": "v@sha256:" + "b" * 64, "command": ["x"],
                           "deadline": "PT1M"},
            "gpu-reset": {"image": "r@sha256:" + "c" * 64, "command": ["x"],
                          "deadline": "PT1M"}})
    with pytest.raises(ValueError, match="worker_image: must be an image reference"):
        JobsSettings(worker_image="has blanks")


def test_a_built_in_pinned_by_its_own_image_keeps_its_command_and_no_other_image_does() -> None:
    """What require_digest asks of an install: the built-in validation image, by digest,
    with nothing else restated. Any other image replaces the built-in whole, so it must
    bring its own command (nothing is inherited by an image of someone else's)."""
    builtin = TEMPLATES["validation"]
    pinned = f"{builtin.image}@sha256:" + "e" * 64
    jobs = JobsSettings(require_digest=True, worker_image="w@sha256:" + "a" * 64,
                        templates={"validation": {"image": pinned}})
    assert jobs.templates["validation"] == builtin.model_copy(update={"image": pinned})
    with pytest.raises(ValueError, match="command"):
        JobsSettings(templates={"validation": {"image": "evil.example/dcgm@sha256:" + "e" * 64}})
    # Unpinned, the refusal names the template and how to pin it.
    with pytest.raises(ValueError, match=r"templates\.validation\.image: .* not pinned .*"
                                         r"crane digest nvcr\.io/nvidia/cloud-native/dcgm"):
        JobsSettings(require_digest=True, worker_image="w@sha256:" + "a" * 64)


def test_template_env_cannot_override_what_the_worker_sets() -> None:
    with pytest.raises(ValueError, match="set by the worker"):
        JobTemplate(purpose="reboot", image="x", command=["true"],
                    deadline=timedelta(minutes=3), env={"NODE_NAME": "other"})


def test_reset_job_is_privileged_targets_one_gpu_and_requests_none() -> None:
    job = TEMPLATES["gpu-reset"].model_copy(update={"service_account": "gpu-repair",
                                                    "runtime_class_name": "nvidia"})
    m = manifest("gpu-reset", job)
    pod = m["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"] == {"privileged": True, "runAsUser": 0}
    assert {"name": "GPU_INDEX", "value": "3"} in container["env"]
    assert "resources" not in container
    assert pod["serviceAccountName"] == "gpu-repair"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["hostPID"] is True
    assert pod["volumes"] == [{"name": "host", "hostPath": {"path": "/"}}]
    assert m["metadata"]["labels"]["gpu-remediate.io/job"] == "gpu-reset"


def test_deadline_image_and_command_come_from_the_template() -> None:
    job = JobTemplate(purpose="reboot", image="x", command=["true"],
                      deadline=timedelta(minutes=3))
    m = manifest("reboot", job)
    assert m["spec"]["activeDeadlineSeconds"] == 180
    container = m["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["command"]) == ("x", ["true"])
    assert "securityContext" not in container


# A node name may be a 253-character DNS subdomain; label values and Job names stop at 63.
LONG_NODE = ".".join(["gpu-node-0007", *["a" * 40] * 5, "b" * 26, "example"])


def test_a_long_node_name_labels_its_job_with_a_stable_short_value() -> None:
    from activities.node_keys import label_value
    from sim.cluster.validation import _LABEL_VALUE

    assert len(LONG_NODE) == 253
    m = job_manifest(NodeJobInput(node=LONG_NODE, kind="validate", name="gr-validate-x-1",
                                  gpus=8), TEMPLATES["validation"], "ns")
    value = m["metadata"]["labels"]["gpu-remediate.io/node"]
    assert len(value) <= 63 and _LABEL_VALUE.match(value), value
    assert value == label_value(LONG_NODE) and value.startswith("gpu-node-0007.")
    assert m["spec"]["template"]["metadata"]["labels"]["gpu-remediate.io/node"] == value
    assert m["metadata"]["annotations"]["gpu-remediate.io/node"] == LONG_NODE
    assert m["spec"]["template"]["spec"]["nodeName"] == LONG_NODE
    # Two long names sharing the first 54 characters still label apart.
    assert label_value(LONG_NODE + "x") != value
    assert label_value("gpu-node-07") == "gpu-node-07"


@pytest.mark.parametrize("node", ["gpu-node-07", LONG_NODE,
                                  "ip-10-0-1-23.us-west-2.compute.internal",
                                  # "gr-validate-" + the first 38 characters end in a dot
                                  "node-" + "x" * 32 + ".rack-7.example.com"])
def test_job_names_are_short_valid_subdomains(node: str) -> None:
    from sim.cluster.validation import _DNS1123_SUBDOMAIN
    from workflows.remediation import node_job_name

    for kind in ("validate", "gpu-reset", "reboot"):
        name = node_job_name(kind, node, "01a23858-d59a-7c38-98dd-25ad5521cb6d", 12)
        assert len(name) <= 63 and _DNS1123_SUBDOMAIN.match(name), name
        assert name.endswith("-12")


def test_runs_started_close_together_never_share_a_job_name() -> None:
    """Run IDs are time-ordered (UUIDv7): two remediations of one node a few seconds apart
    share the first eight characters. Had the Job name used them, the second run would
    adopt the first run's finished Jobs: a reset that never ran, a stale validation."""
    from workflows.remediation import node_job_name

    first, second = ("01a23858-46b8-7544-8d54-3b7ca2fc61d0",
                     "01a23858-d59a-7c38-98dd-25ad5521cb6d")
    for kind in ("validate", "gpu-reset", "reboot"):
        assert node_job_name(kind, "gpu-node-06", first, 1) != \
            node_job_name(kind, "gpu-node-06", second, 1)
    # The same run and attempt always names the same Job (a retry adopts it).
    assert node_job_name("validate", "n", first, 2) == node_job_name("validate", "n", first, 2)


class _Recorded:
    """Just enough of the Kubernetes API for ``JobActivities._ensure``: a Ready node whose
    pods are ``pods``, and a record of the Job it creates."""

    def __init__(self, pods: list[dict]) -> None:
        self.pods = pods
        self.created: list = []

    def read_node(self, name: str, **_: object) -> SimpleNamespace:
        return SimpleNamespace(data=json.dumps({"metadata": {"name": name}, "status": {
            "conditions": [{"type": "Ready", "status": "True"}]}}))

    def list_pod_for_all_namespaces(self, **_: object) -> SimpleNamespace:
        return SimpleNamespace(data=json.dumps({"items": self.pods}))

    def create_namespaced_job(self, namespace: str, body: object, **_: object) -> None:
        self.created.append(body)


def _standalone_dcgm(ready: bool = True) -> dict:
    return {"metadata": {"namespace": "gpu-operator", "name": "nvidia-dcgm-x",
                         "labels": {"app": "nvidia-dcgm"}},
            "spec": {"containers": [{"name": "dcgm", "ports": [{"hostPort": 5555}]}]},
            "status": {"phase": "Running",
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


def _created_env(template: JobTemplate, pods: list[dict], kind: str = "validate") -> dict:
    from kubernetes import client
    from temporalio.testing import ActivityEnvironment

    from activities.jobs import JobActivities

    acts = JobActivities(client.ApiClient(), JobsSettings(
        templates={"validation" if kind == "validate" else kind: template}))
    api = _Recorded(pods)
    acts.core = acts.batch = api  # type: ignore[assignment]
    ActivityEnvironment().run(acts._ensure, NodeJobInput(
        node="gpu-node-07", kind=kind, name=f"gr-{kind}-x-1", gpus=8))
    (job,) = api.created
    return {e.name: e.value for e in job.spec.template.spec.containers[0].env}


EXIT_CODE_VALIDATION = JobTemplate(
    purpose="validate", image="registry.example/checks:1", command=["/check-gpus"],
    deadline=timedelta(minutes=5), output="exit-code")


def test_an_exit_code_validation_is_told_the_nodes_one_host_engine() -> None:
    """As the dcgmi-json template is: the node's standalone engine where one runs Ready,
    else one of its own; a template that runs dcgmi cannot guess it."""
    env = _created_env(EXIT_CODE_VALIDATION, [_standalone_dcgm()])
    assert env["DCGM_HOST_ENGINE"] == "standalone"
    assert "NODE_IP" in env
    assert _created_env(EXIT_CODE_VALIDATION, [])["DCGM_HOST_ENGINE"] == "embedded"
    # Starting or stopping, the standalone engine is one all the same: not the Job's to start.
    assert _created_env(EXIT_CODE_VALIDATION,
                        [_standalone_dcgm(ready=False)])["DCGM_HOST_ENGINE"] == "busy"
    # The shipped template gets the same choice.
    shipped = _created_env(TEMPLATES["validation"], [_standalone_dcgm()])
    assert shipped["DCGM_HOST_ENGINE"] == "standalone"


def test_only_validation_jobs_are_told_a_host_engine() -> None:
    reboot = EXIT_CODE_VALIDATION.model_copy(update={"purpose": "reboot"})
    env = _created_env(reboot, [_standalone_dcgm()], kind="reboot")
    assert "DCGM_HOST_ENGINE" not in env and "NODE_IP" not in env
