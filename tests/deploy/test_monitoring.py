"""Alerts, dashboard and scrape configs refer only to metrics the code exports."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from activities import metrics
from tests.deploy.conftest import DEPLOY
from tests.deploy.kustomize import find

RULES_FILE = DEPLOY / "monitoring" / "gpu-remediate-rules.yaml"
DASHBOARD = DEPLOY / "grafana" / "gpu-remediate.json"
# Series that come from Prometheus itself, not from the code.
BUILTIN_SERIES = {"up"}
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exported_series() -> set[str]:
    """Every series name activities/metrics.py exports."""
    names = set()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                names |= {family.name + s for s in SUFFIXES[family.type]}
        elif isinstance(value, metrics.NodeStates):
            # A custom collector (one series per node): its families are what it collects.
            names |= {family.name for family in value.collect()}
    return names


def series_in(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (inside {} or by/without lists), durations or strings."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        rest = expr[m.end() :].lstrip()
        if rest.startswith("(") or m.group().lower() in PROMQL_WORDS:
            continue
        names.add(m.group())
    return names


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES_FILE.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_series_parser() -> None:
    assert series_in('sum by (le) (rate(a_bucket{x="y"}[5m])) / b') == {"a_bucket", "b"}
    assert series_in('up{job="gpu-remediate"} == 0') == {"up"}
    assert "gpu_remediate_nodes" in exported_series()
    assert "gpu_remediate_observe_seconds_count" in exported_series()
    assert "gpu_remediate_scrape_errors_total" in exported_series()


def test_alerts_use_exported_metrics() -> None:
    known = exported_series() | BUILTIN_SERIES
    for rule in rules():
        unknown = series_in(rule["expr"]) - known
        assert not unknown, f"{rule['alert']}: unknown series {unknown}"


def test_the_required_alerts_exist() -> None:
    by_name = {r["alert"]: r for r in rules()}
    expected = {
        "GpuRemediateBreakerOpen": ("gpu_remediate_breaker_open", None),
        "GpuRemediateNodeQuarantined": ('gpu_remediate_nodes{state="quarantined"}', None),
        "GpuRemediateDrainBlocked": ("gpu_remediate_drain_blocked", "30m"),
        "GpuRemediateDetectorNotTicking": ("gpu_remediate_observe_seconds_count", "10m"),
        "GpuRemediateScrapeErrors": ("rate(gpu_remediate_scrape_errors_total[5m])", "15m"),
        "GpuRemediateWorkerDown": ('up{job="gpu-remediate"}', None),
        "GpuRemediateOrphanedRemediation": ("gpu_remediate_orphaned_nodes", "10m"),
        "GpuRemediateRemediationStuck": ("gpu_remediate_node_state", None),
        "GpuRemediateLedgerWritesFailing": ("gpu_remediate_ledger_write_failures_total", "30m"),
        "GpuRemediateDomainIncident": ("gpu_remediate_domain_incidents_open", None),
    }
    assert set(by_name) == set(expected)
    for name, (fragment, duration) in expected.items():
        assert fragment in by_name[name]["expr"], name
        if duration:
            assert by_name[name]["for"] == duration, name
        assert by_name[name]["labels"]["severity"] in ("warning", "critical")
        assert by_name[name]["annotations"]["summary"]


def test_a_remediation_stuck_in_any_state_alerts() -> None:
    """One GpuRemediateRemediationStuck rule per state a remediation can sit in, each with
    its own duration, on the per-node state series."""
    from workflows.transitions import NodeState

    stuck = {r["labels"]["state"]: r for r in rules()
             if r["alert"] == "GpuRemediateRemediationStuck"}
    assert set(stuck) == {s.value for s in NodeState} - {"healthy", "quarantined"}
    for state, rule in stuck.items():
        assert rule["expr"] == (f'max by (node) (gpu_remediate_node_state{{state="{state}"}})'
                                " == 1"), state
    assert {s: r["for"] for s, r in stuck.items()} == {
        "awaiting-approval": "12h", "draining": "2h", "repairing": "1h", "validating": "1h",
        "cordoned": "6h"}


def test_prometheusrule_and_rule_file_agree(rendered: dict[str, list[dict[str, Any]]]) -> None:
    rule = find(rendered["base"], "PrometheusRule", "gpu-remediate")
    assert rule["spec"] == yaml.safe_load(RULES_FILE.read_text())


def test_dashboard_uses_exported_metrics() -> None:
    known = exported_series()
    exprs = dashboard_exprs()
    assert exprs
    used: set[str] = set()
    for expr in exprs:
        names = series_in(expr)
        assert names <= known, f"{expr}: unknown series {names - known}"
        used |= names
    # Every family docs/operations.md names is on the board.
    for family in (
        "gpu_remediate_nodes",
        "gpu_remediate_budget_slots",
        "gpu_remediate_budget_in_use",
        "gpu_remediate_nodes_waiting",
        "gpu_remediate_breaker_open",
        "gpu_remediate_drain_blocked",
        "gpu_remediate_scrape_errors_total",
        "gpu_remediate_observe_seconds_bucket",
    ):
        assert family in used, family


def test_dashboard_is_provisionable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "gpu-remediate"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    provider = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "gpu-remediate.yaml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_servicemonitor_scrapes_the_worker_ports(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objects = rendered["base"]
    monitor = find(objects, "ServiceMonitor", "gpu-remediate")
    service = find(objects, "Service", "gpu-remediate")
    deploy = find(objects, "Deployment", "gpu-remediate")
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert (
        {e["port"] for e in monitor["spec"]["endpoints"]}
        == set(service_ports)
        == {"metrics", "sdk-metrics"}
    )
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (worker,) = deploy["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"] for p in worker["ports"]}
    assert {p["targetPort"] for p in service_ports.values()} <= container_ports
    # The alert's job label is the Service name under the Prometheus Operator.
    assert service["metadata"]["name"] == "gpu-remediate"


def test_dcgm_exporter_podmonitor_matches_the_discovery_selector() -> None:
    from activities.exporter_settings import ExporterSettings

    monitor = yaml.safe_load((DEPLOY / "monitoring" / "dcgm-exporter-podmonitor.yaml").read_text())
    exporter = ExporterSettings()
    key, _, value = exporter.label_selector.partition("=")
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == {key: value}
    assert monitor["metadata"]["namespace"] == exporter.namespace


@pytest.mark.parametrize("job", ["gpu-remediate", "dcgm-exporter"])
def test_compose_prometheus_scrapes(job: str) -> None:
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    targets = {t for sc in jobs[job]["static_configs"] for t in sc["targets"]}
    if job == "gpu-remediate":
        from worker.config import load_settings

        w = load_settings(DEPLOY / "compose" / "config.yaml").worker
        assert targets == {f"gpu-sim:{w.metrics_port}", f"gpu-sim:{w.sdk_metrics_port}"}
    else:
        assert targets == {"gpu-sim:9400"}
