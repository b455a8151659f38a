"""The dcgm-exporter counter file gpu-remediate ships: every field the rules read, the stock
set kept, and the Helm ConfigMap and GPU Operator values that put it in use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from policy import dcgm
from sim.gpu.exposition import DEFAULT_FAMILIES
from tests.deploy.conftest import DEPLOY

CSV = DEPLOY / "dcgm-exporter" / "gpu-remediate-counters.csv"
HELM_COPY = DEPLOY / "helm" / "gpu-remediate" / "files" / "dcgm-exporter-counters.csv"
OPERATOR_VALUES = DEPLOY / "dcgm-exporter" / "gpu-operator-values.yaml"
TYPES = {"gauge", "counter", "label"}


def rows(path: Path) -> list[tuple[str, str, str]]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, typ, help_ = (part.strip() for part in line.split(",", 2))
        out.append((name, typ, help_))
    return out


def test_the_file_is_in_dcgm_exporters_format() -> None:
    parsed = rows(CSV)
    names = [n for n, _, _ in parsed]
    assert len(names) == len(set(names))
    for name, typ, help_ in parsed:
        assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", name), name
        assert typ in TYPES and help_, name


def test_every_family_the_policy_reads_is_enabled() -> None:
    names = {n for n, _, _ in rows(CSV)}
    # The clock reasons have two names for one field; the file enables the current one.
    wanted = {f.metric for f in dcgm.FAMILIES} - {dcgm.CLOCK_THROTTLE}
    assert wanted <= names, sorted(wanted - names)


def test_the_stock_set_is_kept() -> None:
    names = {n for n, _, _ in rows(CSV)}
    stock = {f.name for f in DEFAULT_FAMILIES}
    assert stock <= names, sorted(stock - names)


def test_the_helm_copy_is_the_file() -> None:
    assert HELM_COPY.read_text() == CSV.read_text()


def test_the_operator_values_point_at_the_configmap_key() -> None:
    values = yaml.safe_load(OPERATOR_VALUES.read_text())["dcgmExporter"]
    chart = yaml.safe_load((DEPLOY / "helm" / "gpu-remediate" / "values.yaml").read_text())
    assert values["config"]["name"] == chart["dcgmExporterCounters"]["name"]
    (env,) = values["env"]
    assert env == {"name": "DCGM_EXPORTER_COLLECTORS",
                   "value": "/etc/dcgm-exporter/dcgm-metrics.csv"}


def test_helm_renders_the_configmap_when_enabled(helm: Path) -> None:
    from tests.deploy.chart import template

    assert not [o for o in template(helm, {}) if o["metadata"]["name"]
                == "gpu-remediate-dcgm-counters"]
    objects = template(helm, {"dcgmExporterCounters": {
        "enabled": True, "namespace": "gpu-operator", "name": "gpu-remediate-dcgm-counters"}})
    (cm,) = [o for o in objects if o["kind"] == "ConfigMap"
             and o["metadata"]["name"] == "gpu-remediate-dcgm-counters"]
    assert cm["metadata"]["namespace"] == "gpu-operator"
    assert cm["data"]["dcgm-metrics.csv"] == CSV.read_text().rstrip("\n")


@pytest.mark.parametrize("bad", [{"enabled": True, "name": ""},
                                 {"enabled": True, "namespace": "", "name": "x"},
                                 {"enabled": True, "nmae": "typo"}])
def test_helm_refuses_incomplete_settings(helm: Path, bad: dict[str, object]) -> None:
    from tests.deploy.chart import HelmFailed, template

    with pytest.raises(HelmFailed):
        template(helm, {"dcgmExporterCounters": bad})
