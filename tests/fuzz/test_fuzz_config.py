"""Fuzz: config files. Property: ``load_settings`` gives Settings or a ConfigError naming the
file (never a traceback), and what it accepts has positive, bounded durations, never the
exporter's own label as a Prometheus node label, and settings inside its own limits."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.strategies import budget, corpus, json_values, mutated
from worker.config import ConfigError, Settings, load_settings
from workflows.limits import violations

KEYS = ["detector", "exporter", "policy", "remediation", "temporal", "worker", "interval",
        "prometheus_node_labels", "max_bytes", "timeout_seconds", "mode", "drain",
        "retry_interval", "thermal", "poll_interval", "observe_timeout", "dry_run",
        "limits", "max_unavailable", "dry_run_may_end", "approval_required_for",
        "drain_force_allowed", "breaker_max_flagged_nodes", "pool_max_unavailable"]

configs = st.one_of(
    st.sampled_from(corpus("config")).flatmap(mutated),
    st.recursive(st.one_of(st.sampled_from(["0", "-1", "PT0S", "P400D", "30", "Hostname",
                                            "instance", "true"]), json_values),
                 lambda inner: st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
                 max_leaves=10).map(lambda v: yaml.safe_dump(v).encode()),
    st.binary(max_size=200),
)


def check(raw: bytes, folder: Path) -> None:
    path = folder / "config.yaml"
    path.write_bytes(raw)
    try:
        settings = load_settings(path)
    except ConfigError as err:
        assert str(path) in str(err)
        return
    assert isinstance(settings, Settings)
    assert timedelta(0) < settings.detector.interval <= timedelta(days=1)
    assert settings.remediation.drain.retry_interval > timedelta(0)
    assert not {"Hostname", "hostname"} & set(settings.exporter.prometheus_node_labels)
    # What loads is inside its own ceiling: a reconfigure to these settings is accepted.
    assert violations(settings.detector_settings(), settings.limits_settings()) == []


@budget(400)
@given(configs)
def test_config_files(tmp_path_factory: object, raw: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        check(raw, Path(folder))


def test_every_corpus_config(tmp_path: Path) -> None:
    for raw in corpus("config"):
        check(raw, tmp_path)
