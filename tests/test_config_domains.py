"""Start-up checks of fault domains: a domain label a kubelet can write is refused as a pool
label is, a domain budget larger than the fleet's is refused naming both, and a bad level
names its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.config import ConfigError, Settings, load_settings

RACK = "node-restriction.kubernetes.io/rack"


def _load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_settings(path)


def test_a_node_writable_domain_label_is_refused_unless_trusted(tmp_path: Path) -> None:
    text = "detector:\n  fault_domains:\n    - label: nvidia.com/gpu.clique\n"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert "detector.fault_domains[0].label" in str(err.value)
    assert "trust_node_writable_labels" in str(err.value)
    settings = _load(tmp_path, text + "  trust_node_writable_labels: true\n")
    assert settings.detector.fault_domains[0].label == "nvidia.com/gpu.clique"


def test_a_domain_budget_larger_than_the_fleets_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f"detector:\n  max_unavailable: 2\n  fault_domains:\n"
                        f"    - label: {RACK}\n      max_unavailable: 3\n")
    text = str(err.value)
    assert "detector.fault_domains[0].max_unavailable: 3" in text
    assert "detector.max_unavailable: 2" in text
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f"detector:\n  max_unavailable_gpus: 8\n  fault_domains:\n"
                        f"    - label: {RACK}\n      max_unavailable_gpus: 16\n")
    assert "max_unavailable_gpus: 16" in str(err.value)
    assert "detector.max_unavailable_gpus: 8" in str(err.value)
    ok = _load(tmp_path, f"detector:\n  max_unavailable: 2\n  fault_domains:\n"
                         f"    - label: {RACK}\n      max_unavailable: 1\n"
                         "      incident_threshold: 3\n      incident_window: PT2M\n")
    assert ok.detector.fault_domains[0].incident_threshold == 3


@pytest.mark.parametrize(("level", "named"), [
    ("      max_unavailable: lots\n", "max_unavailable"),
    ("      incident_threshold: 1\n", "incident_threshold"),
    ("      incident_window: PT0S\n", "incident_window"),
    ("      treshold: 3\n", "treshold"),
])
def test_a_bad_level_names_its_field(tmp_path: Path, level: str, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f"detector:\n  fault_domains:\n    - label: {RACK}\n" + level)
    assert "fault_domains" in str(err.value) and named in str(err.value)


def test_one_level_per_label(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, f"detector:\n  fault_domains:\n    - label: {RACK}\n"
                        f"    - label: {RACK}\n")
    assert "given twice" in str(err.value)


def test_pool_gpu_budgets_need_a_pool_label_and_no_more_than_the_fleets(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "detector:\n  pool_max_unavailable_gpus: {'*': 8}\n")
    assert "detector.pool_max_unavailable_gpus: needs detector.pool_label" in str(err.value)
    pooled = f"detector:\n  pool_label: {RACK}\n  max_unavailable_gpus: 8\n"
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, pooled + "  pool_max_unavailable_gpus: {big: 16, '*': 4}\n")
    assert "detector.pool_max_unavailable_gpus.big: 16 is larger than the fleet's " \
           "detector.max_unavailable_gpus: 8" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, pooled + "  pool_max_unavailable_gpus: {big: lots}\n")
    assert "pool_max_unavailable_gpus" in str(err.value)
    ok = _load(tmp_path, pooled + "  pool_max_unavailable_gpus: {big: 8, '*': '25%'}\n")
    assert ok.detector.pool_gpu_budget_for("big", 64) == 8
    assert ok.detector.pool_gpu_budget_for("small", 16) == 4
