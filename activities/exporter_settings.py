"""Where each node's GPU readings come from: the ``exporter:`` section of the worker's
configuration, and the one definition the scrape code (activities/scrape.py) reads.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ExporterSettings(BaseModel):
    """The ``exporter:`` section: each node's dcgm-exporter, or a Prometheus that scrapes them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["discover", "template", "prometheus"] = Field(
        default="discover",
        description="discover: the dcgm-exporter DaemonSet pod on each node; template: a URL "
                    "per node from url_template; prometheus: PromQL against prometheus_url.",
    )
    prometheus_url: str | None = Field(default=None, description="e.g. http://prometheus:9090")
    prometheus_window: timedelta = Field(
        default=timedelta(minutes=5), gt=timedelta(0), le=timedelta(days=1),
        description="XIDs seen anywhere in this window count, so none is missed between ticks.",
    )
    prometheus_thermal_hold: timedelta = Field(
        default=timedelta(minutes=2), ge=timedelta(0), le=timedelta(days=1),
        description="A temperature must last this long to count.",
    )
    prometheus_node_labels: list[str] = Field(
        default_factory=lambda: ["instance"], min_length=1,
        description="Label(s) that name a series' node: ones Prometheus attaches to the target "
                    "(ServiceMonitor relabelling of __meta_kubernetes_pod_node_name), never the "
                    "exporter's own Hostname/hostname.")
    prometheus_bearer_token_file: Path | None = None
    url_template: str = "http://{node}:9400/metrics"
    namespace: str = "gpu-operator"
    label_selector: str = "app=nvidia-dcgm-exporter"
    port: int = Field(default=9400, ge=1, le=65535)
    path: str = "/metrics"
    timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    max_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, le=64 * 1024 * 1024,
        description="Per-node exporter body cap; a larger body is that node's error.")
    concurrency: int = Field(default=64, ge=1, le=1024)
    parse_helper_from: int = Field(
        default=2000, ge=0,
        description="Fleets of at least this many scraped nodes also parse in one helper "
                    "process (on a machine with a spare core), so smaller ones do not pay its "
                    "start-up; 0 never starts it.")

    @model_validator(mode="after")
    def _coherent(self) -> ExporterSettings:
        if self.mode == "template" and "{node}" not in self.url_template:
            raise ValueError("url_template must contain {node}")
        if self.mode == "prometheus" and not self.prometheus_url:
            raise ValueError("mode prometheus needs prometheus_url")
        own = sorted({"Hostname", "hostname"}.intersection(self.prometheus_node_labels))
        if own:
            raise ValueError(f"prometheus_node_labels: {own} is written by the exporter itself "
                             "(one exporter could name another node); use a label Prometheus "
                             "attaches to the target, such as instance")
        return self
