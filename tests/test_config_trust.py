"""Start-up checks of trust: a pool label a kubelet can write, a heartbeat timeout no
drain call fits in, and where the node records live."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.pins import pin_config
from worker.config import ConfigError, Settings, load_settings
from workflows.settings import POOL_LABEL, DetectorSettings


def _load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_settings(path)


def test_a_node_writable_pool_label_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "detector:\n  pool_label: gpu-remediate.io/pool\n")
    assert "detector.pool_label" in str(err.value)
    assert "trust_node_writable_labels" in str(err.value)


def test_a_node_writable_pool_label_is_accepted_when_trusted_on_purpose(tmp_path: Path) -> None:
    settings = _load(tmp_path, "detector:\n  pool_label: gpu-remediate.io/pool\n"
                               "  trust_node_writable_labels: true\n")
    assert settings.detector.pool_label == "gpu-remediate.io/pool"


def test_the_shipped_pool_label_is_one_a_kubelet_cannot_set(tmp_path: Path) -> None:
    assert POOL_LABEL.startswith("node-restriction.kubernetes.io/")
    settings = _load(tmp_path, f"detector:\n  pool_label: {POOL_LABEL}\n")
    assert settings.detector.pool_label == POOL_LABEL


def test_a_workflow_input_with_any_pool_label_still_decodes() -> None:
    """The check is the worker's, at start: an in-flight detector's input never fails."""
    assert DetectorSettings(pool_label="pool").pool_label == "pool"


def test_a_heartbeat_timeout_no_drain_call_fits_in_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "remediation:\n  heartbeat_timeout: PT4S\n  drain:\n"
                        "    retry_interval: PT1S\n")
    assert "remediation.heartbeat_timeout" in str(err.value)
    _load(tmp_path, "remediation:\n  heartbeat_timeout: PT5S\n  drain:\n"
                    "    retry_interval: PT1S\n")


def test_records_live_in_the_jobs_namespace_unless_configured(tmp_path: Path) -> None:
    settings = _load(tmp_path, "jobs:\n  namespace: node-jobs\n")
    assert settings.record_namespace() == "node-jobs"
    settings = _load(tmp_path, "kubernetes:\n  record_namespace: gpu-remediate\n")
    assert settings.record_namespace() == "gpu-remediate"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "kubernetes:\n  record_namespace: Not_A_Namespace\n")
    assert "kubernetes.record_namespace" in str(err.value)


SHIPPED_CONFIGS = sorted(Path(__file__).parent.parent.joinpath("deploy").rglob("config.yaml"))


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: str(p.parent.name))
def test_no_shipped_config_claims_a_server_that_authorizes(path: Path, tmp_path: Path) -> None:
    """The project ships no Temporal server: whether one authenticates its callers is for
    whoever runs it to say, so every shipped config marks operator names unverified, and
    its limits let no client turn the mark off."""
    # As a site installs it: with the digests require_digest asks for.
    pinned = tmp_path / "config.yaml"
    pinned.write_text(yaml.safe_dump(pin_config(yaml.safe_load(path.read_text()))))
    settings = load_settings(pinned)
    assert settings.detector_settings().remediation.server_authorizes is False
    assert settings.limits_settings().server_authorizes_allowed is False


def test_server_authorizes_is_read_from_the_remediation_section(tmp_path: Path) -> None:
    settings = _load(tmp_path, "remediation:\n  server_authorizes: true\n")
    assert settings.detector_settings().remediation.server_authorizes is True
    assert settings.limits_settings().server_authorizes_allowed is True
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "remediation:\n  server_authorizes: true\n"
                        "limits:\n  server_authorizes_allowed: false\n")
    assert "remediation.server_authorizes" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "remediation:\n  server_authorizes: maybe\n")
    assert "server_authorizes" in str(err.value)
