"""Real exporter shapes through ``evaluate`` and the scrape's body reader: several exporter
versions and label sets, MIG, old and new field names, and the values a broken exporter writes.

Every payload is written here from a public description of its shape (never copied); the
comment above each names the source. ``SHAPES`` is the table docs/check.md prints as
"Real shapes and their verdicts"; a test keeps the two equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from activities.parse_pool import BodyError, read_body
from policy.config import PolicySettings
from worker.probe.evaluate import evaluate_sources, looks_like_exporter_pod

DOCS = Path(__file__).resolve().parents[1] / "docs" / "check.md"

H100 = 'gpu="{g}",UUID="GPU-5c1f{g}e02",pci_bus_id="00000000:{bus}:00.0",device="nvidia{g}",' \
       'modelName="NVIDIA H100 80GB HBM3"'

# cncf/k8s-ai-conformance v1.35 kops output (dcgm-exporter 4.x, a PCIe card): label order
# gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION; power printed
# with six decimals; no XID series at all on a healthy GPU; no NVLink family.
KOPS_4X = "".join(
    f'{name}{{gpu="0",UUID="GPU-8e1d",pci_bus_id="00000000:00:1E.0",device="nvidia0",'
    f'modelName="NVIDIA L4",Hostname="i-0a1b2c3d",DCGM_FI_DRIVER_VERSION="580.65.06"}} {v}\n'
    for name, v in [("DCGM_FI_DEV_GPU_TEMP", "41"), ("DCGM_FI_DEV_MEMORY_TEMP", "0"),
                    ("DCGM_FI_DEV_POWER_USAGE", "16.365000"),
                    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0"),
                    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "0"),
                    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0")])

# vsphere-tmm Supervisor-Services vks-ai-conformance v1.34 (vGPU GRID A100-8C, driver
# 580.65.06): the XID series present with 0 and err_code/err_msg after the driver label.
VGPU_XID_ZERO = (
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a100v",pci_bus_id="00000000:02:01.0",'
    'device="nvidia0",modelName="GRID A100-8C",Hostname="vks-worker-1",'
    'DCGM_FI_DRIVER_VERSION="580.65.06",err_code="0",err_msg="No Error"} 0\n'
    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a100v",pci_bus_id="00000000:02:01.0",'
    'device="nvidia0",modelName="GRID A100-8C",Hostname="vks-worker-1",'
    'DCGM_FI_DRIVER_VERSION="580.65.06"} 38\n'
)

# NVIDIA/dcgm-exporter issue 317 (A30 with MIG, ~3.3.x): one series per GPU instance with
# GPU_I_PROFILE/GPU_I_ID between modelName and Hostname, no pci_bus_id (before 3.3.7).
MIG_A30 = "".join(
    f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",UUID="GPU-a30mig",device="nvidia0",'
    f'modelName="NVIDIA A30",GPU_I_PROFILE="1g.6gb",GPU_I_ID="{gi}",Hostname="a30-node"}} '
    f'{xid}\n' for gi, xid in [(3, 0), (4, 48), (5, 0)])

# dcgm-exporter main after May 2026 (commit "Rename Hostname label to hostname"), with
# NODE_NAME set by the GPU Operator: the lower-case label holds the node name.
LOWER_HOSTNAME = "".join(
    f'DCGM_FI_DEV_XID_ERRORS{{{H100.format(g=g, bus=b)},hostname="gpu-node-12"}} {x}\n'
    for g, b, x in [(0, "18", 0), (1, "2A", 79)])

# The same exporter without NODE_NAME: the label holds the exporter pod's name (dcgm-exporter
# 4.0+ falls back to the pod's hostname).
POD_NAMED = LOWER_HOSTNAME.replace('hostname="gpu-node-12"',
                                   'hostname="nvidia-dcgm-exporter-x7k2p"')

# PR 239 of dcgm-exporter: the opt-in windowed XID count, labels window_size_in_ms and xid,
# beside the last-value gauge; a repeat of XID 31 shows as a count of 3.
XID_COUNT = (
    f'DCGM_FI_DEV_XID_ERRORS{{{H100.format(g=0, bus="18")},Hostname="gpu-node-3"}} 31\n'
    f'DCGM_EXP_XID_ERRORS_COUNT{{{H100.format(g=0, bus="18")},Hostname="gpu-node-3",'
    'window_size_in_ms="300000",xid="31"} 3\n'
)

# Custom counter file with the pre-DCGM-3.3 clock field name (dcgm-exporter's etc/ CSV
# history): hardware thermal slowdown, bit 0x40.
OLD_CLOCK_NAME = (
    f'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{H100.format(g=0, bus="18")},Hostname="hot-1"}} 64\n'
    f'DCGM_FI_DEV_GPU_TEMP{{{H100.format(g=0, bus="18")},Hostname="hot-1"}} 80\n'
)

# dcgm-exporter 1.x names, still served through its old-namespace option (lower-case uuid).
OLD_NAMESPACE = (
    'dcgm_gpu_temp{gpu="0",uuid="GPU-5c1f0e02"} 45\n'
    'dcgm_xid_errors{gpu="0",uuid="GPU-5c1f0e02"} 0\n'
)

# Issue 250 (V100, older build): doubles everywhere, e.g. power limits as 300.000000; counts
# written as whole doubles read as counts.
V100_DOUBLES = (
    'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-v100",device="nvidia0",'
    'Hostname="v100-node"} 2.000000\n'
    'DCGM_FI_DEV_POWER_MGMT_LIMIT{gpu="0",UUID="GPU-v100",device="nvidia0",'
    'Hostname="v100-node"} 300.000000\n'
)

# A broken or forged exporter: a count with a fraction is not a count.
FRACTIONAL_DBE = (
    'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-x",Hostname="bad-node"} 1e-300\n'
)


@dataclass(frozen=True)
class Shape:
    name: str
    text: str
    node: str | None
    expect: str
    """``node=action:rule`` of the first finding, ``node=none``, or ``error: <words>``."""
    source: str


SHAPES: tuple[Shape, ...] = (
    Shape("dcgm-exporter 4.x, PCIe card, no XID series", KOPS_4X, None,
          "i-0a1b2c3d=none", "cncf/k8s-ai-conformance kops output"),
    Shape("vGPU, XID 0 with err_code/err_msg", VGPU_XID_ZERO, None, "vks-worker-1=none",
          "vsphere-tmm vks-ai-conformance"),
    Shape("MIG instances of one GPU, one with XID 48", MIG_A30, None,
          "a30-node=reset:xid-48-workflow-xid-48", "dcgm-exporter issue 317"),
    Shape("lower-case hostname label", LOWER_HOSTNAME, None,
          "gpu-node-12=reboot:xid-79-restart-bm", "dcgm-exporter commit d5e5f51"),
    Shape("hostname holds the exporter pod, --node given", POD_NAMED, "gpu-node-12",
          "gpu-node-12=reboot:xid-79-restart-bm", "dcgm-exporter 4.0+ without NODE_NAME"),
    Shape("windowed XID count beside the gauge", XID_COUNT, None,
          "gpu-node-3=app:xid-31-restart-app", "dcgm-exporter PR 239"),
    Shape("old clock field name, HW thermal bit", OLD_CLOCK_NAME, None,
          "hot-1=thermal:clock-hw-thermal", "dcgm-exporter etc/ CSV history"),
    Shape("V100 build writing doubles", V100_DOUBLES, None,
          "v100-node=reset:ecc-dbe-volatile", "dcgm-exporter issue 250"),
    Shape("1.x metric names", OLD_NAMESPACE, None, "error: --use-old-namespace",
          "dcgm-exporter old-namespace option"),
    Shape("a count with a fraction (1e-300 DBE)", FRACTIONAL_DBE, None,
          "error: not a whole number", "malformed exporter"),
)


def outcome(shape: Shape, tmp_path: Path) -> str:
    path = tmp_path / "payload.prom"
    path.write_text(shape.text)
    report = evaluate_sources([str(path)], node=shape.node, config=PolicySettings())
    if report.errors:
        return f"error: {report.errors[0].message}"
    (verdict,) = report.nodes
    if not verdict.findings:
        return f"{verdict.node}={verdict.action.value}"
    f = verdict.findings[0]
    return f"{verdict.node}={verdict.action.value}:{f.rule}"


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_each_real_shape_gets_its_verdict(shape: Shape, tmp_path: Path) -> None:
    got = outcome(shape, tmp_path)
    if shape.expect.startswith("error: "):
        assert got.startswith("error: ") and shape.expect[len("error: "):] in got, got
    else:
        assert got == shape.expect


def test_the_docs_table_is_this_table() -> None:
    text = DOCS.read_text(encoding="utf-8").split("## Real shapes and their verdicts")[1]
    rows = re.findall(r"^\| ([^|]+?) \| `([^`]+)` \| ([^|]+?) \|$", text, re.M)
    assert [(r[0], r[1], r[2]) for r in rows] == [(s.name, s.expect, s.source) for s in SHAPES]


def test_a_pod_named_host_label_is_named_in_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "pod.prom"
    path.write_text(POD_NAMED)
    report = evaluate_sources([str(path)], node=None, config=PolicySettings())
    assert [v.node for v in report.nodes] == ["nvidia-dcgm-exporter-x7k2p"]
    (warning,) = report.warnings
    assert "nvidia-dcgm-exporter-x7k2p" in warning.message and "--node" in warning.message
    named = evaluate_sources([str(path)], node="gpu-node-12", config=PolicySettings())
    assert named.warnings == [] and [v.node for v in named.nodes] == ["gpu-node-12"]


def test_node_picks_its_node_out_of_a_federation_payload(tmp_path: Path) -> None:
    path = tmp_path / "fed.prom"
    path.write_text(LOWER_HOSTNAME + KOPS_4X)
    report = evaluate_sources([str(path)], node="i-0a1b2c3d", config=PolicySettings())
    assert [v.node for v in report.nodes] == ["i-0a1b2c3d"]
    missing = evaluate_sources([str(path)], node="gpu-node-99", config=PolicySettings())
    assert missing.nodes == [] and "none named gpu-node-99" in missing.errors[0].message


@pytest.mark.parametrize("name", ["nvidia-dcgm-exporter-x7k2p", "dcgm-exporter-5f7d8c9b4-qxz2w"])
def test_exporter_pod_names_are_recognised(name: str) -> None:
    assert looks_like_exporter_pod(name)


@pytest.mark.parametrize("name", ["gpu-node-12", "ip-10-0-1-7.ec2.internal", "dgx-a100-0a1b2",
                                  "i-0a1b2c3d"])
def test_node_names_are_not_pod_names(name: str) -> None:
    assert not looks_like_exporter_pod(name)


def test_the_scrape_refuses_a_fractional_count_and_names_old_names() -> None:
    with pytest.raises(BodyError, match="unparsable"):
        read_body(FRACTIONAL_DBE.encode(), "bad-node")
    with pytest.raises(BodyError, match=r"dcgm_gpu_temp.*--use-old-namespace"):
        read_body(OLD_NAMESPACE.encode(), "old-node")


def test_a_stock_counter_exporter_is_blind_to_the_rules_it_cannot_feed(tmp_path: Path) -> None:
    path = tmp_path / "kops.prom"
    path.write_text(KOPS_4X)
    report = evaluate_sources([str(path)], node=None, config=PolicySettings())
    assert {b.signal for b in report.blind} == {
        "ecc-dbe", "row-remap-pending", "clock-reasons", "recovery-action", "repeat-xid"}
