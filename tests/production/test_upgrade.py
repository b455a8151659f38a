"""A rolling upgrade from the previous release's code to this one under Worker Deployment
Versioning, on the production topology, following docs/install.md ("Upgrade with
remediations in flight"): the new release runs beside the old one, is made current with
the temporal CLI, in-flight remediations move to it at their next workflow task
(auto-upgrade), the pinned detector moves at its continue-as-new, then the old workers go.

The previous release is the commit named in tests/production/previous-release; its code
runs from a `git archive` of that commit with this checkout's virtualenv."""

from __future__ import annotations

import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import VersioningBehavior

from sim.gpu.client import GpuSimClient
from tests.chaos.invariants import InvariantChecker
from tests.e2e.conftest import make_stack
from tests.e2e.kit import Cluster, run, wait_for
from tests.production.test_topology import (
    _client,
    assert_healthy,
    assert_returned,
    workflow_task_failures,
)
from tests.production.topology import REPO, ProductionStack
from worker.stack.local import scripts_binary
from workflows.ids import DETECTOR_WORKFLOW_ID, remediation_workflow_id

pytestmark = [pytest.mark.production, pytest.mark.e2e]

HERE = Path(__file__).parent
DEPLOYMENT = "gpu-remediate"
MAX_UNAVAILABLE = 3


def previous_release() -> str:
    """The commit of the previous release (first word of tests/production/previous-release)."""
    return (HERE / "previous-release").read_text().split()[0]


def checkout(commit: str, into: Path) -> Path:
    """The previous release's tree, from this clone's history."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                             capture_output=True, timeout=120)
    if archive.returncode != 0:
        pytest.fail(f"the previous release {commit} is not in this clone's history "
                    f"({archive.stderr.decode().strip()}): fetch it, or update "
                    f"{HERE / 'previous-release'}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def set_current(stack: ProductionStack, build_id: str) -> None:
    """The documented step: temporal worker deployment set-current-version."""
    def done() -> bool:
        out = subprocess.run(
            [scripts_binary("temporal"), "worker", "deployment", "set-current-version",
             "--address", stack.temporal_address, "--deployment-name", DEPLOYMENT,
             "--build-id", build_id, "--yes"], capture_output=True, text=True, timeout=60)
        return out.returncode == 0
    wait_for(stack, f"{DEPLOYMENT}:{build_id} current", done, timeout=90, every=1)


def versioning(stack: ProductionStack, workflow_id: str) -> tuple[str, int, str]:
    """(run ID, behaviour, build ID) of the workflow's current run."""
    async def go() -> tuple[str, int, str]:
        desc = await (await _client(stack)).get_workflow_handle(workflow_id).describe()
        info = desc.raw_description.workflow_execution_info.versioning_info
        return (desc.run_id or "", int(info.behavior),
                info.deployment_version.build_id)
    return run(go())


def _engine_env(job: Any) -> str | None:
    """The DCGM_HOST_ENGINE the worker gave the Job's container (None: not told)."""
    for env in job.spec.template.spec.containers[0].env or []:
        if env.name == "DCGM_HOST_ENGINE":
            return str(env.value)
    return None


def _failed(job: Any) -> bool:
    return any(c.type == "Failed" and c.status == "True" for c in job.status.conditions or [])


def _log(k8s: Cluster, job: Any) -> str:
    pods = k8s.core.list_namespaced_pod(job.metadata.namespace,
                                        label_selector=f"job-name={job.metadata.name}").items
    return "".join(str(k8s.core.read_namespaced_pod_log(p.metadata.name, p.metadata.namespace))
                   for p in pods)


def assert_repaired_across_the_upgrade(stack: ProductionStack, k8s: Cluster, node: str) -> None:
    """Back in service, validated by the current release. The previous release's
    validation starts a DCGM host engine of its own whatever runs on the node; beside the
    standalone dcgm operand that fails (one host engine per node): where that release ran
    a node's validation before the upgrade, the current one repairs again (one more reboot)
    and validates on the node's engine. Nothing else may fail."""
    assert_returned(stack, k8s, node, timeout=240)
    jobs = sorted(k8s.jobs(node), key=lambda j: j.metadata.creation_timestamp)
    kinds = [j.metadata.labels["gpu-remediate.io/job"] for j in jobs]
    validations = [j for j in jobs if j.metadata.labels["gpu-remediate.io/job"] == "validate"]
    assert validations and kinds.count("reboot") == len(validations), kinds
    last = validations[-1]
    assert _engine_env(last) is not None and not _failed(last), last.metadata.name
    for job in validations[:-1]:
        # Only the previous release's validation (told no engine) may have failed, and only
        # because a host engine already ran on the node.
        assert _engine_env(job) is None and _failed(job), job.metadata.name
        assert "already manages the GPUs" in _log(k8s, job), _log(k8s, job)


@pytest.fixture(scope="module")
def upgrade(temporal_server: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ProductionStack]:
    old_code = checkout(previous_release(), tmp_path_factory.mktemp("previous-release"))
    stack = make_stack(
        tmp_path_factory.mktemp("upgrade"), str(HERE / "production.yaml"),
        kind=ProductionStack,
        # The detector continues as new every 20 ticks (20 s) so that it moves soon.
        **{"detector.max_unavailable": MAX_UNAVAILABLE, "detector.observe_timeout": "PT10S",
           "detector.breaker_max_flagged_percent": 100, "detector.ticks_per_run": 20})
    stack.server = temporal_server
    stack.deployment_name = DEPLOYMENT
    stack.old_code = old_code  # type: ignore[attr-defined]
    stack.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        stack.start_temporal()
        stack.start_simulators()
        stack.write_worker_config()
        yield stack
    finally:
        stack.stop()


def test_rolling_upgrade_from_the_previous_release(upgrade: ProductionStack) -> None:
    stack = upgrade
    old_code: Path = stack.old_code  # type: ignore[attr-defined]
    prev, cur = f"prev-{previous_release()[:12]}", "current"
    k8s, gpu = Cluster(stack), GpuSimClient(stack.gpu_url)

    # The previous release: two replicas, current version, the detector started.
    for i in range(2):
        old = stack.start_replica(f"old-{i}", code=old_code, build_id=prev)
        # `python -m worker` in the old tree imports the old release's packages.
        assert Path(f"/proc/{old.pid}/cwd").resolve() == old_code.resolve()
    set_current(stack, prev)
    stack.start_detector()
    wait_for(stack, "the detector on the old version",
             lambda: versioning(stack, DETECTOR_WORKFLOW_ID)[2] == prev or None, timeout=60)
    detector_run, behaviour, _ = versioning(stack, DETECTOR_WORKFLOW_ID)
    assert behaviour == VersioningBehavior.VERSIONING_BEHAVIOR_PINNED

    nodes = ["gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04"]
    with InvariantChecker(stack, MAX_UNAVAILABLE, grace=60) as checker:
        for node in nodes:
            gpu.inject_fault(node, "0", "xid", 79)
        wait_for(stack, "remediations in flight on the old version",
                 lambda: sum(k8s.state(n) != "healthy" for n in nodes) >= 2, timeout=60)
        started_on_old = [n for n in nodes if k8s.state(n) != "healthy"]
        for node in started_on_old:
            _, behaviour, build = versioning(stack, remediation_workflow_id(node))
            assert (behaviour, build) == (VersioningBehavior.VERSIONING_BEHAVIOR_AUTO_UPGRADE,
                                          prev), node

        # The new release beside the old one, then made current.
        for i in range(2):
            stack.start_replica(f"new-{i}", build_id=cur)
        set_current(stack, cur)

        # The pinned detector stays on the old version until its continue-as-new, then
        # its next run is pinned to the new one.
        wait_for(stack, "the detector's next run on the new version",
                 lambda: versioning(stack, DETECTOR_WORKFLOW_ID)[2] == cur or None,
                 timeout=120, every=1)
        new_run, behaviour, _ = versioning(stack, DETECTOR_WORKFLOW_ID)
        assert new_run != detector_run
        assert behaviour == VersioningBehavior.VERSIONING_BEHAVIOR_PINNED

        # Every remediation finishes, those begun on the old code on the new one.
        for node in nodes:
            assert_repaired_across_the_upgrade(stack, k8s, node)
            assert versioning(stack, remediation_workflow_id(node))[2] == cur, node
            assert not workflow_task_failures(stack, node), node

        # The old Deployment goes; new work runs on the new release alone.
        for name in [n for n in stack.workers if n.startswith("old-")]:
            stack.kill_replica(name)
        gpu.inject_fault("gpu-node-05", "0", "xid", 79)
        assert_healthy(stack, k8s, "gpu-node-05", timeout=240)
    assert not checker.violations, "\n".join(checker.violations)
    assert "nondetermin" not in stack.worker_logs().lower()
