"""Fixtures: one GPU simulator fleet and one real Prometheus scraping it every second.

Shared by the whole module (Prometheus takes about a second to start, and history is what these
tests are about); every test works on its own nodes, so tests do not see each other's faults.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sim.gpu.fleet import Fleet, NodeSpec
from tests.polling import wait_for
from tests.prometheus.harness import (
    INSTALL_HINT,
    PrometheusServer,
    ThreadedGpuSim,
    find_prometheus,
    node_job,
    scrape_config,
)

NODES = [
    "healthy-1",
    "healthy-2",
    "xid79",
    "xid48",
    "xidmix",
    "ecc",
    "remap",
    "hot",
    "spike",
    "down",
    "podnet-1",
    "replays",
]
"""Nodes of the main simulator (``Hostname`` label); one or two per test."""
LOWER_NODES = ["lower-1"]
"""Nodes of a second simulator that labels series ``hostname`` (exporter main)."""
HISTORY_S = 5
"""Seconds of scraped history the fixture waits for (the tests' thermal hold is 4 s)."""
POD_HOSTNAME = "nvidia-dcgm-exporter-x7k2p"
"""What ``Hostname`` says for podnet-1: the exporter pod's name, as without hostNetwork."""


@dataclass
class Stack:
    sim: ThreadedGpuSim
    lower_sim: ThreadedGpuSim
    prometheus: PrometheusServer


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = find_prometheus()
    if binary is None:
        pytest.skip(f"prometheus binary not found (set PROMETHEUS_BIN or {INSTALL_HINT})")
    sim = ThreadedGpuSim(Fleet([NodeSpec(n, gpus=2) for n in NODES]))
    lower = ThreadedGpuSim(
        Fleet([NodeSpec(n, gpus=2) for n in LOWER_NODES], hostname_label="hostname")
    )
    plain = [n for n in NODES if n != "podnet-1"]
    config = scrape_config(
        [
            node_job("dcgm", sim.hostport, plain),
            node_job("dcgm-lower", lower.hostport, LOWER_NODES),
            # An exporter without hostNetwork: Hostname is the pod's name, and the scrape config
            # sets the real node name as instance (what the GPU Operator's ServiceMonitor
            # relabelling of __meta_kubernetes_pod_node_name does) and kubernetes_node.
            {
                **node_job("dcgm-podnet", sim.hostport, ["podnet-1"]),
                "static_configs": [
                    {
                        "targets": [sim.hostport],
                        "labels": {
                            "__metrics_path__": "/nodes/podnet-1/metrics",
                            "instance": "podnet-1",
                            "kubernetes_node": "podnet-1",
                        },
                    }
                ],
                "metric_relabel_configs": [
                    {
                        "source_labels": ["Hostname"],
                        "regex": ".+",
                        "target_label": "Hostname",
                        "replacement": POD_HOSTNAME,
                    }
                ],
            },
        ]
    )
    prometheus = PrometheusServer(binary, tmp_path_factory.mktemp("prometheus"), config)
    try:
        prometheus.wait_ready(targets=len(NODES) + len(LOWER_NODES))
        # The tests read temperatures held for a few seconds: give every GPU that much history.
        gpus = 2 * (len(NODES) + len(LOWER_NODES))
        wait_for(
            lambda: len(prometheus.query(f"DCGM_FI_DEV_GPU_TEMP offset {HISTORY_S}s")) == gpus,
            30,
            f"{HISTORY_S}s of history",
            every=0.2,
        )
        yield Stack(sim, lower, prometheus)
    finally:
        prometheus.stop()
        sim.stop()
        lower.stop()
