"""`gpu-remediate plan` holds back what the running detector holds back: its pause and its
breaker (the outcome breaker counts quarantines over an hour, which one observation on a
fresh state cannot know)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from policy.models import Action, Finding, Verdict
from worker.cli.plan import plan_from, running_detector, settings_differences
from worker.config import load_settings
from workflows.messages import DetectorView, FleetObservation

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def settings(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "config.yaml"
    path.write_text("temporal: {address: '127.0.0.1:1'}\n"
                    "detector: {max_unavailable: 2, breaker_max_flagged_percent: 100}\n")
    return load_settings(path)


def observation() -> FleetObservation:
    return FleetObservation(managed_nodes=10, readable_nodes=10, verdicts=[
        Verdict(node="n1", action=Action.RESET, findings=[Finding(
            gpu="0", signal="DCGM_FI_DEV_XID_ERRORS", value=48, rule="xid-48",
            action=Action.RESET)])])


def view(**kw: object) -> DetectorView:
    base: dict[str, object] = dict(paused=False, breaker_open=False, breaker_reason="",
                                   budget=2, in_flight=[], waiting=[], last_tick=None,
                                   last_errors=[], ticks_total=1, started_total=0)
    return DetectorView.model_validate({**base, **kw})


def test_without_a_running_detector_the_plan_is_a_fresh_detectors(tmp_path: Path) -> None:
    plan = plan_from(settings(tmp_path), observation(), NOW)
    assert [s.node for s in plan.start] == ["n1"]
    assert "fresh detector" in plan.detector


def test_a_paused_detector_holds_the_plan_back(tmp_path: Path) -> None:
    plan = plan_from(settings(tmp_path), observation(), NOW, view(paused=True))
    assert plan.start == [] and plan.waiting == ["n1 (reset: paused)"]
    assert plan.detector.startswith("running detector: paused")


def test_an_open_breaker_holds_the_plan_back_and_says_why(tmp_path: Path) -> None:
    why = "3 remediations ended in quarantine within 1:00:00"
    plan = plan_from(settings(tmp_path), observation(), NOW,
                     view(breaker_open=True, breaker_reason=why))
    assert plan.start == [] and plan.waiting == ["n1 (reset: breaker open)"]
    assert plan.breaker == why and why in plan.detector


async def test_an_unreachable_temporal_is_said_not_raised(tmp_path: Path) -> None:
    running, why = await running_detector(settings(tmp_path))
    assert running is None
    assert "127.0.0.1:1 not reached" in why and "fresh detector" in why


def test_the_running_detectors_settings_make_the_plan_and_the_file_is_diffed(
        tmp_path: Path) -> None:
    """`up --max-unavailable 3` while the file says 2: the plan is the detector's (budget 3),
    says so first, and lists where the file differs."""
    configured = settings(tmp_path)
    running = configured.detector_settings().model_copy(update={"max_unavailable": 3,
                                                                "dry_run": True})
    plan = plan_from(configured, observation(), NOW, view(budget=3), effective=running,
                     config_source="config.yaml (--config)")
    assert plan.budget == 3 and plan.from_running_detector and plan.dry_run
    assert plan.settings_from.startswith("the running detector's effective settings")
    assert plan.differences == [
        "dry_run: config file False, running detector True",
        "max_unavailable: config file 2, running detector 3"]
    assert settings_differences(running, running) == []


def test_without_a_detector_the_plan_says_it_uses_the_config_file(tmp_path: Path) -> None:
    plan = plan_from(settings(tmp_path), observation(), NOW,
                     config_source="/x/config.yaml (--config)")
    assert plan.settings_from == ("the config file's settings, /x/config.yaml (--config): "
                                  "no detector is running")
    assert plan.budget == 2 and plan.differences == [] and not plan.from_running_detector


def test_the_quarantine_caps_floor_in_a_small_fleet_is_said() -> None:
    from worker.cli.plan import quarantine_cap
    from workflows.settings import DetectorSettings

    said = quarantine_cap(DetectorSettings(), 30, 1)
    assert "quarantine cap 1/1" in said and "floor of one node" in said and "reached" in said
    assert "floor" not in quarantine_cap(DetectorSettings(), 100, 1)
    assert quarantine_cap(DetectorSettings(max_quarantined=None), 30, 4) == "no quarantine cap"


def test_the_plan_command_prints_what_a_reset_would_miss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from worker.cli import app
    from worker.cli import plan as plan_module

    async def planned(settings: object, source: str = "") -> object:
        made = plan_from(load_settings(tmp_path / "config.yaml"), observation(), NOW)
        made.prerequisites = ["GPU Operator operand 'dcgm' missing: no DaemonSet in "
                              "namespace gpu-operator selects nodes by nvidia.com/gpu.deploy.dcgm"]
        return made

    settings(tmp_path)
    monkeypatch.setattr(plan_module, "make_plan", planned)
    result = CliRunner().invoke(app, ["plan", "-c", str(tmp_path / "config.yaml")])
    assert result.exit_code == 0, result.output
    assert "missing: GPU Operator operand 'dcgm' missing: no DaemonSet in namespace " \
           "gpu-operator selects nodes by nvidia.com/gpu.deploy.dcgm" in result.output


def test_with_gpu_isolation_the_plan_says_which_gpu_or_why_the_whole_node(
        tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    # A budget of one node: the isolated GPU's lease takes no node slot, so both start.
    path.write_text("temporal: {address: '127.0.0.1:1'}\n"
                    "detector: {max_unavailable: 1, breaker_max_flagged_percent: 100}\n"
                    "remediation: {gpu_isolation: dra}\n")
    uuid = "GPU-5d1a3c2e-8d0b-4c1e-9a57-6b1f3c2d9e41"
    obs = FleetObservation(managed_nodes=10, readable_nodes=10, verdicts=[
        Verdict(node="n1", action=Action.RESET, findings=[Finding(
            gpu="3", uuid=uuid, signal="DCGM_FI_DEV_XID_ERRORS", value=48, rule="xid-48",
            action=Action.RESET)]),
        Verdict(node="n2", action=Action.REBOOT, findings=[Finding(
            gpu="0", uuid=uuid, signal="DCGM_FI_DEV_XID_ERRORS", value=79, rule="xid-79",
            action=Action.REBOOT)])])
    plan = plan_from(load_settings(path), obs, NOW)
    scopes = {s.node: s.scope for s in plan.start}
    assert scopes == {"n1": f"GPU 3 ({uuid}) only: a DeviceTaintRule, NoExecute; lease: one "
                            "GPU, no node slot",
                      "n2": "whole node: action reboot is a whole-node repair; lease: the node"}
    assert plan.waiting == []
    assert plan.gpus is not None and (plan.gpus.out_of_service, plan.gpus.isolated) == (0, 0)
    assert {s.scope for s in plan_from(settings(tmp_path), observation(), NOW).start} == {""}


def test_the_plan_counts_gpus_out_of_service_with_the_running_detectors_gpu_leases(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from worker.cli import app
    from worker.cli import plan as plan_module
    from workflows.leases import Lease

    path = tmp_path / "config.yaml"
    path.write_text("temporal: {address: '127.0.0.1:1'}\n"
                    "detector: {max_unavailable: 2, max_unavailable_gpus: 10}\n"
                    "remediation: {gpu_isolation: dra}\n")
    running = DetectorView(
        paused=False, breaker_open=False, breaker_reason="", budget=2, in_flight=[],
        waiting=[], last_tick=None, last_errors=[], ticks_total=1, started_total=2, leases=[
            Lease(node="n1", token="t", granted_at=NOW, workflow_id="remediation-n1",
                  scope="gpu", gpus=1, slot=False),
            Lease(node="n2", token="u", granted_at=NOW, workflow_id="remediation-n2", gpus=8)])
    obs = FleetObservation(managed_nodes=10, readable_nodes=10, managed_gpus=80)
    plan = plan_from(load_settings(path), obs, NOW, running=running)
    assert plan.gpus is not None
    assert (plan.gpus.out_of_service, plan.gpus.isolated, plan.gpus.budget, plan.gpus.gpus) \
        == (9, 1, 10, 80)

    async def planned(settings: object, source: str = "") -> object:
        return plan

    monkeypatch.setattr(plan_module, "make_plan", planned)
    result = CliRunner().invoke(app, ["plan", "-c", str(path)])
    assert result.exit_code == 0, result.output
    assert "GPUs 9/10 out of service (1 isolated GPUs, node in service) of 80" in \
        " ".join(result.output.split())


def test_a_node_the_plan_would_not_admit_names_the_level_and_its_count(
        tmp_path: Path) -> None:
    """Pool GPUs, domain nodes, fleet GPUs: each refusal says which level and
    how full it is."""
    pool, rack = "node-restriction.kubernetes.io/pool", "node-restriction.kubernetes.io/rack"
    path = tmp_path / "config.yaml"
    path.write_text(
        "temporal: {address: '127.0.0.1:1'}\n"
        f"detector: {{max_unavailable: 4, max_unavailable_gpus: 24, pool_label: '{pool}',\n"
        "  pool_max_unavailable_gpus: {p1: 8}, breaker_max_flagged_percent: 100,\n"
        f"  fault_domains: [{{label: '{rack}', max_unavailable: 1}}]}}\n")

    def reboot(node: str) -> Verdict:
        return Verdict(node=node, action=Action.REBOOT, findings=[Finding(
            gpu="0", signal="DCGM_FI_DEV_XID_ERRORS", value=79, rule="xid-79",
            action=Action.REBOOT)])

    where = {"n1": ("p1", "r1"), "n2": ("p1", "r2"), "n3": ("p2", "r1"), "n4": ("p2", "r3"),
             "n5": ("p2", "r4"), "n6": ("p2", "r5")}
    obs = FleetObservation(
        managed_nodes=10, readable_nodes=10, verdicts=[reboot(n) for n in where],
        pool_of={n: p for n, (p, _) in where.items()}, pool_sizes={"p1": 4, "p2": 6},
        pool_gpus={"p1": 32, "p2": 48}, gpus_of={n: 8 for n in where}, managed_gpus=80,
        domains_of={n: {rack: r} for n, (_, r) in where.items()},
        domain_sizes={rack: {"r1": 2, "r2": 2, "r3": 2, "r4": 2, "r5": 2}},
        domain_gpus={rack: {"r1": 16, "r2": 16, "r3": 16, "r4": 16, "r5": 16}})
    plan = plan_from(load_settings(path), obs, NOW)
    assert [s.node for s in plan.start] == ["n1", "n4", "n5"]
    assert plan.waiting == [
        "n2 (reboot: pool p1 GPU budget full (8 + 8 > 8 GPUs))",
        f"n3 (reboot: domain {rack}=r1 full (1/1))",
        "n6 (reboot: GPU budget full (24 + 8 > 24 GPUs))"]
    assert plan.gpus is not None and plan.gpus.budget == 24
