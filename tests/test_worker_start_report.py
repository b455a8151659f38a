"""The worker says when it polls, and until then why it does not (the production tier
shows it with PostgreSQL down: tests/production/test_topology.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client, config
from temporalio.service import RPCError, RPCStatusCode

from activities.prerequisites import RuntimeClassCheck
from sim.cluster.threaded import ThreadedClusterSim
from worker.config import Settings, load_settings
from worker.service import run as service


class _Service:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.asked = 0

    async def describe_namespace(self, *_: Any, **__: Any) -> None:
        self.asked += 1
        if self.fail:
            raise RPCError("GetNamespace operation failed. Error no usable database "
                           "connection found", RPCStatusCode.UNAVAILABLE, b"")


async def test_not_polling_is_explained_until_the_worker_runs(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(service, "NOT_POLLING_WARN_AFTER", 0.5)
    monkeypatch.setattr(service, "NOT_POLLING_WARN_EVERY", 1.0)
    worker = SimpleNamespace(is_running=False)
    client = SimpleNamespace(workflow_service=_Service(fail=True))
    caplog.set_level(logging.INFO, logger="gpu_remediate.worker")
    task = asyncio.create_task(service._report_start(
        worker, client, Settings.model_validate({})))  # type: ignore[arg-type]
    await asyncio.sleep(2.2)
    worker.is_running = True
    await asyncio.wait_for(task, 5)
    lines = [r.getMessage() for r in caplog.records]
    warnings = [m for m in lines if m.startswith("not polling yet")]
    assert len(warnings) == 2, lines
    assert "cannot serve namespace default" in warnings[0]
    assert "UNAVAILABLE: GetNamespace operation failed" in warnings[0]
    assert "/readyz answers 503" in warnings[0]
    assert lines[-1].startswith("worker polling task queue gpu-remediate")


async def test_the_worker_is_built_only_once_the_namespace_answers(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL down at start: the SDK's own start check gives up after a few retries and
    a worker whose check failed never polls, so the wait for the namespace is ours: it asks
    until the namespace answers, saying why meanwhile, however long that takes."""
    monkeypatch.setattr(service, "NOT_POLLING_WARN_AFTER", 0.3)
    monkeypatch.setattr(service, "NOT_POLLING_WARN_EVERY", 10.0)
    monkeypatch.setattr(service, "NAMESPACE_POLL_SECONDS", 0.05)
    api = _Service(fail=True)
    client = SimpleNamespace(workflow_service=api)
    caplog.set_level(logging.INFO, logger="gpu_remediate.worker")
    task = asyncio.create_task(service._wait_for_namespace(
        client, Settings.model_validate({})))  # type: ignore[arg-type]
    await asyncio.sleep(0.6)
    assert not task.done(), "still waiting while the database is down"
    api.fail = False
    await asyncio.wait_for(task, 5)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "UNAVAILABLE: GetNamespace operation failed" in warnings[0]
    assert api.asked >= 5


async def test_a_worker_stuck_in_its_start_check_is_not_waited_for_forever() -> None:
    """One worker's start check failed while the other's still hangs in it: the hanging
    one is cancelled, so the process ends (and is restarted) instead of hanging unready."""
    class _Failing:
        is_running = False

        async def run(self) -> None:
            raise RuntimeError("Worker validation failed: Namespace default was not found")

    class _Hanging:
        is_running = False

        async def run(self) -> None:
            await asyncio.Event().wait()

    with pytest.raises(RuntimeError, match="validation failed"):
        await asyncio.wait_for(service._run_both(_Failing(), _Hanging()),  # type: ignore[arg-type]
                               5)


async def test_a_worker_that_polls_at_once_says_only_that(
        caplog: pytest.LogCaptureFixture) -> None:
    worker = SimpleNamespace(is_running=True)
    client = SimpleNamespace(workflow_service=_Service(fail=False))
    caplog.set_level(logging.INFO, logger="gpu_remediate.worker")
    await service._report_start(worker, client, Settings.model_validate({}))  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == [
        "worker polling task queue gpu-remediate on localhost:7233 (namespace default)"]
    assert client.workflow_service.asked == 0


async def test_missing_operands_are_warned_one_line_each_and_start_goes_on(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    closed: list[bool] = []
    monkeypatch.setattr(service, "kube_client",
                        lambda _: SimpleNamespace(close=lambda: closed.append(True)))
    monkeypatch.setattr(service, "missing_prerequisites", lambda api, gpu_operator: [
        f"GPU Operator operand {o!r} missing" for o in gpu_operator.operands[:2]])
    caplog.set_level(logging.INFO, logger="gpu_remediate.worker")
    missing = await service._report_prerequisites(Settings.model_validate({}))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == missing == ["GPU Operator operand 'device-plugin' missing",
                                   "GPU Operator operand 'dcgm' missing"]
    assert closed == [True]


async def test_operands_found_are_said_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(service, "kube_client", lambda _: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(service, "missing_prerequisites", lambda api, gpu_operator: [])
    caplog.set_level(logging.INFO, logger="gpu_remediate.worker")
    assert await service._report_prerequisites(Settings.model_validate({})) == []
    assert [r.getMessage() for r in caplog.records] == [
        "GPU Operator operands found in namespace gpu-operator: device-plugin, dcgm, "
        "dcgm-exporter, gpu-feature-discovery"]


async def test_an_unusable_kubeconfig_is_a_warning_not_a_crash(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(_: object) -> None:
        raise FileNotFoundError("no kubeconfig at /nowhere")

    monkeypatch.setattr(service, "kube_client", broken)
    caplog.set_level(logging.INFO, logger="gpu_remediate.worker")
    (line,) = await service._report_prerequisites(Settings.model_validate({}))
    assert line.startswith("GPU Operator operands not checked: FileNotFoundError")


# ------------------------------------------------- RuntimeClasses the Job templates name


@pytest.fixture
def sim_without_nvidia(tmp_path: Path) -> Iterator[Path]:
    """The cluster simulator (whose GPU Operator installs RuntimeClass nvidia) with it
    deleted: a cluster without the NVIDIA runtime."""
    with ThreadedClusterSim(scenario="small") as sim:
        kubeconfig = sim.kubeconfig(tmp_path / "kubeconfig")
        with config.new_client_from_config(config_file=str(kubeconfig)) as api:
            client.NodeV1Api(api).delete_runtime_class("nvidia")
        yield kubeconfig


def _config(tmp_path: Path, kubeconfig: Path, extra: str = "") -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"temporal: {{address: '127.0.0.1:1'}}\n"
                    f"kubernetes: {{kubeconfig: '{kubeconfig}'}}\n" + extra)
    return path


def test_the_worker_refuses_to_start_naming_the_field(
        tmp_path: Path, sim_without_nvidia: Path) -> None:
    from typer.testing import CliRunner

    from worker.cli import app

    path = _config(tmp_path, sim_without_nvidia)
    result = CliRunner().invoke(app, ["worker", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert (f"{path}: jobs.templates.gpu-reset.runtime_class_name: RuntimeClass 'nvidia' "
            "does not exist in the cluster") in result.output


async def test_the_mode_without_the_nvidia_runtime_class_starts(
        tmp_path: Path, sim_without_nvidia: Path) -> None:
    settings = load_settings(_config(tmp_path, sim_without_nvidia,
                                     "jobs: {templates: {gpu-reset: "
                                     "{runtime_class_name: null}}}\n"))
    assert await service.check_start_runtime_classes(settings) == []


async def test_unreadable_runtime_classes_are_a_warning_and_the_worker_starts(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(service, "kube_client",
                        lambda _: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(service, "check_runtime_classes", lambda api, jobs: RuntimeClassCheck(
        unchecked=["RuntimeClasses not checked: the worker may not read them (HTTP 403)"]))
    caplog.set_level(logging.INFO, logger="gpu_remediate.worker")
    assert await service.check_start_runtime_classes(Settings.model_validate({})) == [
        "RuntimeClasses not checked: the worker may not read them (HTTP 403)"]
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


async def test_plan_shows_the_missing_runtime_class(
        tmp_path: Path, sim_without_nvidia: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.cli import plan as plan_module

    async def no_detector(settings: object) -> plan_module.DetectorLookup:
        return plan_module.DetectorLookup(why="no Temporal in this test")

    monkeypatch.setattr(plan_module, "look_up_detector", no_detector)
    made = await plan_module.make_plan(load_settings(_config(tmp_path, sim_without_nvidia)))
    assert [line.split(":")[0] for line in made.prerequisites] == [
        "jobs.templates.gpu-reset.runtime_class_name"]


async def test_a_silent_api_delays_the_start_by_the_bound_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def hangs(api: object, jobs: object) -> RuntimeClassCheck:
        time.sleep(2)
        return RuntimeClassCheck()

    monkeypatch.setattr(service, "RUNTIME_CLASS_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(service, "kube_client", lambda _: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(service, "check_runtime_classes", hangs)
    started = time.monotonic()
    (line,) = await service.check_start_runtime_classes(Settings.model_validate({}))
    assert time.monotonic() - started < 1.5
    assert line.startswith("RuntimeClasses not checked: the Kubernetes API did not answer")
