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
    ("detector:\n  ledger: {}\n", "detector.ledger: set it at the top level"),
    ("ledger:\n  lemon_faults: 0\n", "ledger.lemon_faults"),
    ("ledger:\n  probaton: PT1H\n", "ledger.probaton: unknown field"),
    ("ledger:\n  retention: P7D\n", "ledger.retention"),
    # An operand the GPU Operator does not have pauses nothing; the driver must never pause.
    ("remediation:\n  gpu_operator:\n    operands: [device-plugin, nvidia-mig-manager]\n",
     "remediation.gpu_operator.operands: Value error, 'nvidia-mig-manager' is not a GPU "
     "Operator operand"),
    ("remediation:\n  gpu_operator:\n    operands: [driver]\n",
     "'driver' is never paused around a reset"),
    ("- just\n- a list\n", "top level must be a mapping"),
    ("detector: [unclosed\n", "not valid YAML"),
    # A key given twice: YAML would keep the second silently.
    ("detector:\n  max_unavailable: 1\npolicy: {}\ndetector:\n  dry_run: true\n",
     "key 'detector' is given twice (line 1 and line 4)"),
    ("detector:\n  max_unavailable: 1\n  max_unavailable: 9\n",
     "key 'max_unavailable' is given twice (line 2 and line 3)"),
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


def test_the_ledger_section_reaches_the_detector(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "ledger:\n  probation: PT48H\n"
                                             "  lemon_window: P60D\n"))
    ledger = settings.detector_settings().ledger
    assert ledger.probation.total_seconds() == 48 * 3600
    assert ledger.lookback().days == 60


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
    from workflows.messages import RemediationInput

    inp = RemediationInput.model_validate({
        "node": "n1", "verdict": {"node": "n1", "action": "reboot"},
        "settings": {"job_poll_interval_of_the_future": "PT1S",
                     "drain": {"deadline": "PT1H", "knob": 1}},
        "field_of_the_next_release": {"x": 1}})
    assert inp.settings.drain.deadline.total_seconds() == 3600


def test_worker_deployment_versioning_is_opt_in_and_names_its_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from temporalio.common import VersioningBehavior

    from worker.service.run import deployment_config

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


@pytest.mark.parametrize(("text", "says"), [
    # Where the templates used to be: the loader says where they went.
    ("remediation:\n  validation: {image: x, command: [x], deadline: PT1M}\n",
     "remediation.validation: moved to jobs.templates.validation"),
    ("remediation:\n  job_namespace: jobs\n", "remediation.job_namespace: moved to jobs.namespace"),
    # A step names a template the worker lacks, or one made for another step.
    ("remediation:\n  job_templates: {validation: long-diag}\n",
     "remediation.job_templates.validation: no Job template 'long-diag'"),
    ("remediation:\n  job_templates: {validation: reboot}\n",
     "'reboot' is for reboot, not validate"),
    ("jobs:\n  templates:\n    validation: {purpose: reboot, image: x, command: [x], "
     "deadline: PT1M}\n", "templates.validation.purpose: the built-in validation template"),
    ("jobs:\n  require_digest: true\n", "worker_image: 'ghcr.io/gpu-remediate/gpu-remediate:"),
    ("jobs:\n  templates:\n    reboot: {image: x, command: [x], deadline: PT1M, "
     "privileged: true, run_as_user: 1000}\n", "a privileged template runs as root"),
    ("jobs:\n  templates:\n    Bad_Name: {purpose: validate, image: x, command: [x], "
     "deadline: PT1M}\n", "templates.Bad_Name: a name must be a DNS label"),
    ("jobs:\n  templates:\n    validation: {image: x, command: [x], deadline: PT3H}\n",
     "remediation.job_timeout: must be longer than the longest Job template deadline"),
    ("jobs:\n  namespace: Kube_System\n", "namespace: must be a DNS label"),
])
def test_job_templates_are_checked_when_the_worker_loads_them(
        tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, text))
    assert says in str(err.value)


def test_an_added_template_can_be_chosen_for_its_step_and_builtins_stay(tmp_path: Path) -> None:
    digest = "sha256:" + "0" * 64
    s = load_settings(write(tmp_path, (
        "jobs:\n  templates:\n    long-diag: {purpose: validate, image: 'dcgm@" + digest
        + "', command: [dcgmi, diag, -r, '3'], deadline: PT90M, run_as_user: 1000}\n"
        "remediation:\n  job_templates: {validation: long-diag}\n")))
    assert s.jobs.resolve("validate", "long-diag").deadline.total_seconds() == 90 * 60
    assert set(s.jobs.templates) == {"validation", "gpu-reset", "reboot", "long-diag"}
    assert s.jobs.templates["long-diag"].pinned and not s.jobs.templates["reboot"].pinned


def test_a_workflow_input_from_before_templates_decodes_and_names_the_defaults() -> None:
    """Runs in flight at the upgrade carry the Job's image and command in their settings:
    they decode, the content is dropped, and their steps use the worker's templates."""
    from workflows.messages import NodeJobInput
    from workflows.settings import RemediationSettings

    old = RemediationSettings.model_validate({
        "job_namespace": "kube-system",
        "validation": {"image": "evil", "command": ["sh"], "deadline": "PT1M",
                       "privileged": True}})
    assert old.job_templates.for_kind("validate") == "validation"
    assert not hasattr(old, "validation")
    job = NodeJobInput.model_validate({"node": "n", "kind": "reboot", "name": "j", "gpus": 8,
                                       "namespace": "kube-system",
                                       "job": {"image": "evil", "command": ["sh"]}})
    assert job.template == "" and "evil" not in job.model_dump_json()


@pytest.mark.parametrize("command", [["detector", "status"], ["worker"]])
def test_require_auth_refuses_to_connect_without_a_certificate_or_key(
        tmp_path: Path, command: list[str]) -> None:
    # Port 9 (discard): had it tried to connect it would say "cannot reach".
    path = write(tmp_path, "temporal:\n  address: 127.0.0.1:9\n  require_auth: true\n"
                           "worker: {metrics_port: 0, sdk_metrics_port: 0, health_port: 0}\n")
    result = CliRunner().invoke(app, [*command, "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert "temporal.require_auth is set" in result.output
    assert "cannot reach" not in result.output


def test_evaluate_refuses_a_policy_file_with_a_key_given_twice(tmp_path: Path) -> None:
    from worker.probe.evaluate import ConfigError as PolicyFileError
    from worker.probe.evaluate import load_policy_config

    path = write(tmp_path, "xid_overrides: {13: none}\nxid_overrides: {31: none}\n")
    with pytest.raises(PolicyFileError, match="given twice"):
        load_policy_config(path)
    same_line = write(tmp_path, "xid_overrides: {13: none, 13: reset}\n")
    with pytest.raises(PolicyFileError, match="key 13 is given twice"):
        load_policy_config(same_line)
    ok = write(tmp_path, "xid_overrides: {13: none, 31: none}\n")
    assert set(load_policy_config(ok).xid_overrides) == {13, 31}


# ---------------------------------------------------------------- limits: the ceiling


def test_limits_default_to_the_settings_the_worker_starts_with(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "detector:\n  max_unavailable: 2\n"
                                             "remediation:\n  approval:\n"
                                             "    required_for: [reboot]\n"))
    limits = settings.limits_settings()
    assert limits.max_unavailable == 2
    assert [a.value for a in limits.approval_required_for] == ["reboot"]
    assert limits.dry_run_may_end is True


def test_limits_looser_than_the_settings_are_kept(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "detector:\n  max_unavailable: 1\n"
                                             "limits:\n  max_unavailable: 4\n"))
    assert settings.detector.max_unavailable == 1
    assert settings.limits_settings().max_unavailable == 4


@pytest.mark.parametrize(("text", "both"), [
    ("detector:\n  max_unavailable: 3\nlimits:\n  max_unavailable: 2\n",
     ["detector.max_unavailable = 3", "limits.max_unavailable = 2"]),
    ("remediation:\n  drain:\n    deadline_policy: force\nlimits:\n  drain_force_allowed: false\n",
     ["remediation.drain.deadline_policy = force", "limits.drain_force_allowed = false"]),
    ("remediation:\n  approval:\n    required_for: []\n"
     "limits:\n  approval_required_for: [reboot]\n",
     ["remediation.approval.required_for = []", "limits.approval_required_for = [reboot]"]),
])
def test_a_limits_section_tighter_than_the_settings_fails_at_start_naming_both(
        tmp_path: Path, text: str, both: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert all(part in str(err.value) for part in both), str(err.value)
    result = CliRunner().invoke(app, ["worker", "-c", str(path)])
    assert result.exit_code == 2, result.output
    assert "limits.max_unavailable" in result.output or "limits." in result.output


def test_an_environment_override_past_the_file_limits_fails_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_REMEDIATE_DETECTOR__MAX_UNAVAILABLE", "50%")
    with pytest.raises(ConfigError, match=r"detector\.max_unavailable = 50%"):
        load_settings(write(tmp_path, "limits:\n  max_unavailable: 10%\n"))


def test_an_unknown_limit_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"limits\.max_unavailabel: unknown field"):
        load_settings(write(tmp_path, "limits:\n  max_unavailabel: 3\n"))


# ---------------------------------------------------------------- the API key from a file


def test_the_api_key_comes_from_its_file_and_follows_a_rotation(tmp_path: Path) -> None:
    from worker.temporal_client import refresh_api_key

    key = tmp_path / "api-key"
    key.write_text("first-token\n")
    t = load_settings(write(tmp_path, f"temporal:\n  require_auth: true\n"
                                      f"  api_key_file: {key}\n")).temporal
    assert t.current_api_key() == "first-token" and t.auth_problem() == ""

    class Holder:
        api_key: str | None = "first-token"

    client = Holder()
    assert refresh_api_key(client, t) is False
    key.write_text("second-token")
    assert refresh_api_key(client, t) is True and client.api_key == "second-token"
    # A Secret being replaced: the file is briefly gone; the last key stays.
    key.unlink()
    assert refresh_api_key(client, t) is False and client.api_key == "second-token"


def test_a_missing_key_file_is_no_key_and_says_which_file(tmp_path: Path) -> None:
    t = load_settings(write(tmp_path, "temporal:\n  require_auth: true\n"
                                      f"  api_key_file: {tmp_path / 'absent'}\n")).temporal
    assert t.current_api_key() is None
    assert f"api_key_file {tmp_path / 'absent'} is absent or empty" in t.auth_problem()


def test_a_key_file_with_two_tokens_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "api-key"
    key.write_text("one\ntwo\n")
    t = load_settings(write(tmp_path, f"temporal:\n  api_key_file: {key}\n")).temporal
    with pytest.raises(ConfigError, match="more than one token"):
        t.current_api_key()


def test_a_key_and_a_key_file_together_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_REMEDIATE_TEMPORAL__API_KEY", "k")
    with pytest.raises(ConfigError, match="api_key and api_key_file: set one"):
        load_settings(write(tmp_path, f"temporal:\n  api_key_file: {tmp_path / 'k'}\n"))
