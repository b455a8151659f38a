"""Bad configuration fails at start, naming the field; good configuration round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from worker.cli import app
from worker.config import ConfigError, load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "field"), [
    ("detector:\n  max_unavailabel: 3\n", "detector.max_unavailabel: unknown field"),
    ("remediation:\n  drain:\n    dedline: PT1H\n", "remediation.drain.dedline: unknown field"),
    ("policy:\n  thermal:\n    gpu_temp: 90\n", "policy.thermal.gpu_temp: unknown field"),
    ("detector:\n  max_unavailable: ten\n", "detector.max_unavailable"),
    ("detector:\n  max_unavailable: 120%\n", "detector.max_unavailable"),
    ("exporter:\n  mode: template\n  url_template: http://x/metrics\n", "{node}"),
    ("remediation:\n  drain:\n    deadline_policy: yolo\n", "remediation.drain.deadline_policy"),
    ("temporal:\n  tls:\n    enabled: true\n    client_cert: a.pem\n", "client_key go together"),
    ("policy:\n  thermal:\n    gpu_temp_c: -4\n", "policy.thermal.gpu_temp_c"),
    ("detector:\n  policy: {}\n", "detector.policy: set it at the top level"),
    ("- just\n- a list\n", "top level must be a mapping"),
    ("detector: [unclosed\n", "not valid YAML"),
])
def test_bad_config_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text))
    assert field in str(err.value)
    assert str(tmp_path) in str(err.value), "the message names the file"


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml")


def test_environment_overrides_nested_fields(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_REMEDIATE_TEMPORAL__ADDRESS", "temporal.example:7233")
    monkeypatch.setenv("GPU_REMEDIATE_DETECTOR__MAX_UNAVAILABLE", "25%")
    settings = load_settings(write(tmp_path, "temporal:\n  namespace: gpu\n"))
    assert settings.temporal.address == "temporal.example:7233"
    assert settings.temporal.namespace == "gpu"
    assert settings.detector.max_unavailable == "25%"


def test_budget_percent_rounds_down_but_never_to_zero(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "detector:\n  max_unavailable: 10%\n"))
    assert settings.detector.budget_for(95) == 9
    assert settings.detector.budget_for(4) == 1
    zero = load_settings(write(tmp_path, "detector:\n  max_unavailable: 0%\n"))
    assert zero.detector.budget_for(100) == 0


def test_detector_settings_carry_policy_and_remediation(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "policy:\n  unknown_xid_action: quarantine\n"
                                             "remediation:\n  max_repair_attempts: 4\n"))
    detector = settings.detector_settings()
    assert detector.policy.unknown_xid_action == "quarantine"
    assert detector.remediation.max_repair_attempts == 4


def test_cli_exits_2_with_the_field_on_bad_config(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["detector", "status", "-c",
                                      str(write(tmp_path, "worker:\n  health_port: -1\n"))])
    assert result.exit_code == 2
    assert "worker.health_port" in result.output


def test_environment_beats_the_file_and_options_beat_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "temporal:\n  address: from-file:7233\n  namespace: file-ns\n"
                           "detector:\n  max_unavailable: 1\n")
    monkeypatch.setenv("GPU_REMEDIATE_TEMPORAL__ADDRESS", "from-env:7233")
    monkeypatch.setenv("GPU_REMEDIATE_DETECTOR__MAX_UNAVAILABLE", "3")
    settings = load_settings(path, **{"detector.max_unavailable": 5})
    assert settings.temporal.address == "from-env:7233"
    assert settings.temporal.namespace == "file-ns", "sections merge across sources"
    assert settings.detector.max_unavailable == 5


def test_settings_in_a_workflow_input_ignore_fields_of_another_release() -> None:
    """A newer detector or CLI writes a field this worker does not know yet (or an older one
    wrote one it dropped): the remediation still decodes; only a config file is strict."""
    from workflows.models import RemediationInput

    inp = RemediationInput.model_validate({
        "node": "n1", "verdict": {"node": "n1", "action": "reboot"},
        "settings": {"job_poll_interval_of_the_future": "PT1S",
                     "drain": {"deadline": "PT1H", "knob": 1}},
        "field_of_the_next_release": {"x": 1}})
    assert inp.settings.drain.deadline.total_seconds() == 3600


def test_worker_deployment_versioning_is_opt_in_and_names_its_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from temporalio.common import VersioningBehavior

    from worker.service import deployment_config

    assert deployment_config(load_settings(write(tmp_path, "{}\n")).worker) is None
    monkeypatch.setenv("GPU_REMEDIATE_BUILD_ID", "sha-abc123")
    cfg = deployment_config(load_settings(write(
        tmp_path, "worker:\n  deployment_name: gpu-remediate\n")).worker)
    assert cfg is not None and cfg.use_worker_versioning
    assert (cfg.version.deployment_name, cfg.version.build_id) == ("gpu-remediate", "sha-abc123")
    assert cfg.default_versioning_behavior == VersioningBehavior.AUTO_UPGRADE



def test_the_detector_observes_on_its_own_queue(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "temporal:\n  task_queue: gpu-q\n"))
    assert settings.detector_settings().observe_task_queue == "gpu-q-observe"
