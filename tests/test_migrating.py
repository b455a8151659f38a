"""docs/migrating.md stays complete and true: every name of the original tool is mapped, and
every name of ours it gives exists (config field, metric, Event reason, CLI option)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import activities.metrics  # noqa: F401 - registers the metrics
from worker.config import Settings

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "migrating.md").read_text()

ORIGINAL = {
    "flag": ["-node-selector", "-max-unavailable", "-repeat-limit", "-repeat-window",
             "-clear-checks", "-validation-timeout", "-namespace", "-validation-image",
             "-validation-gpus", "-agent-port", "-event-namespace", "-dry-run", "-temp-cordon",
             "-interval", "-repair", "version", "-json", "-nvidia-smi", "-from-file",
             "-xid-log"],
    "annotation or label": [f"gpu-remediation.lab/{k}" for k in (
        "state", "plan", "reason", "since", "incidents", "validation-job", "clear-checks",
        "last-notice", "quarantined=true")],
    "Event": ["GPUDrainStarted", "GPUDrained", "GPUValidationStarted", "GPUReturnedToService",
              "GPUQuarantined", "GPUCordoned", "RemediationDeferred", "GPURepairFailed",
              "TelemetryUnavailable", "GPUWarning"],
    "metric": ["node_state{node,state}", "reconcile_total", "reconcile_errors_total",
               "last_reconcile_timestamp_seconds"] + [
        f'actions_total{{action="{a}"}}'
        for a in ("cordon", "uncordon", "drain", "evict", "repair", "quarantine")],
}


@pytest.mark.parametrize(("kind", "name"),
                         [(k, n) for k, names in ORIGINAL.items() for n in names])
def test_every_original_name_is_mapped(kind: str, name: str) -> None:
    assert f"`{name}" in DOC, f"original {kind} {name} is not in docs/migrating.md"


def test_every_config_field_named_exists() -> None:
    fields = set(re.findall(
        r"`((?:temporal|kubernetes|exporter|detector|policy|remediation|worker)\.[a-z_.]+)`",
        DOC))
    assert fields, "the doc names config fields"
    for dotted in fields:
        model: object = Settings()
        for part in dotted.split("."):
            assert hasattr(model, part), f"{dotted} is not a config field"
            model = getattr(model, part)


def test_every_metric_named_is_exported() -> None:
    names = set(re.findall(r"`(gpu_remediate_[a-z_]+)", DOC))
    exported = {m.name for m in REGISTRY.collect()} | {
        s.name for m in REGISTRY.collect() for s in m.samples}
    for name in names:
        assert name in exported or name.removesuffix("_total") in exported, name


def test_every_event_reason_named_is_emitted_somewhere() -> None:
    table = DOC[DOC.index("## Events"):DOC.index("## Metrics")]
    ours = {cell for row in table.splitlines() if row.startswith("| ")
            for cell in re.findall(r"`([A-Z][A-Za-z]+)`", row.split("|")[2])}
    code = "".join(p.read_text() for d in ("activities", "workflows")
                   for p in (ROOT / d).rglob("*.py"))
    for reason in ours:
        assert f'"{reason}"' in code, f"Event {reason} is in the doc but never recorded"
