"""Throughput of the two exposition parsers on a fleet-sized dcgm-exporter payload.

Run: ``.venv/bin/python -m tools.bench.parse [--nodes 1000] [--gpus 8] [--repeat 3]``

Two measurements, each for the fast parser and for the ``prometheus_client``-based reference
on the same payload:

- parse only;
- parse + evaluate: ``evaluate_node`` (default policy) on every node parsed, which is what a
  detector tick does with each body. The readings and the verdicts of both parsers must be
  identical, or the benchmark fails. Target: the fast path >= 3x the reference.

Figures are the median of ``--repeat`` runs after one warm-up run. Results are appended to
``tools/bench/results/parse.json``.

The payload mimics dcgm-exporter 4.x with its stock counter file (25 families, HELP/TYPE per
family, exporter label order, pod labels on allocated GPUs, six-decimal doubles), concatenated
for many nodes the way a Prometheus federation endpoint would serve it.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import TypeVar

from activities.exposition import ParseResult, parse_exposition, parse_exposition_reference
from policy.config import PolicySettings
from policy.models import Verdict
from policy.rules import evaluate_node
from tools.bench._common import median, save, table

TARGET_RATIO = 3.0
T = TypeVar("T")

# (name, type, is_double, help) for the 25 families enabled by default-counters.csv.
DEFAULT_FAMILIES: list[tuple[str, str, bool, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", False, "SM frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", False, "Memory frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", False, "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", False, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", True, "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", False, "Energy since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", False, "Total PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", False, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", False, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", False, "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", False, "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", False, "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", False, "Frame buffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", False, "Frame buffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", False, "Frame buffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", False, "NVLink bandwidth counter."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", False, "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", False, "Uncorrectable remapped rows."),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", False, "Correctable remapped rows."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", False, "Whether remapping of rows has failed"),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        True,
        "Ratio of time the graphics engine is active.",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        True,
        "Ratio of cycles the tensor pipe is active.",
    ),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", True, "Ratio of cycles the memory interface is active."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", False, "Bytes of active PCIe tx data."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", False, "Bytes of active PCIe rx data."),
]


def make_payload(nodes: int, gpus: int, *, seed: int = 7) -> str:
    """A dcgm-exporter-shaped payload for ``nodes`` x ``gpus``."""
    rng = random.Random(seed)
    series: list[tuple[int, int, str]] = []
    for n in range(nodes):
        host = f"gpu-node-{n:04d}"
        for g in range(gpus):
            labels = (
                f'gpu="{g}",UUID="GPU-{n:08x}-{g:04x}-4a1e-9c1d-{rng.getrandbits(48):012x}",'
                f'pci_bus_id="00000000:{0x18 + g * 0x10:02X}:00.0",device="nvidia{g}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{host}",'
                f'DCGM_FI_DRIVER_VERSION="570.124.06"'
            )
            if g % 2 == 0:  # allocated GPUs carry the pod attributes
                labels += f',container="trainer",namespace="ml",pod="job-{n}-worker-{g}"'
            series.append((n, g, labels))
    out: list[str] = []
    for name, typ, is_double, help_text in DEFAULT_FAMILIES:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {typ}")
        for _, _, labels in series:
            if name == "DCGM_FI_DEV_XID_ERRORS":
                value = "0"
                labels = labels + ',err_code="0",err_msg="No Error"'
            elif is_double:
                value = f"{rng.random() * 700:f}"
            else:
                value = str(rng.randint(0, 90))
            out.append(f"{name}{{{labels}}} {value}")
    return "\n".join(out) + "\n"


def measure(fn: Callable[[str], T], text: str, repeat: int) -> tuple[float, T]:
    """Median seconds of ``fn(text)`` over ``repeat`` runs, after one warm-up run."""
    result = fn(text)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(text)
        times.append(time.perf_counter() - start)
    return median(times), result


def parse_and_evaluate(parse: Callable[..., ParseResult], policy: PolicySettings
                       ) -> Callable[[str], tuple[ParseResult, list[Verdict]]]:
    def run(text: str) -> tuple[ParseResult, list[Verdict]]:
        result = parse(text)
        return result, [evaluate_node(node, policy, acknowledged_xids={}) for node in result.nodes]
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    text = make_payload(args.nodes, args.gpus)
    total_lines = text.count("\n")
    mib = len(text.encode()) / (1 << 20)
    print(
        f"payload: {args.nodes} nodes x {args.gpus} GPUs, {len(DEFAULT_FAMILIES)} families, "
        f"{total_lines} lines, {mib:.1f} MiB"
    )

    fast_s, fast = measure(parse_exposition, text, args.repeat)
    ref_s, ref = measure(parse_exposition_reference, text, args.repeat)
    if fast.nodes != ref.nodes or fast.samples != ref.samples:
        raise SystemExit("the parsers disagree on this payload")
    policy = PolicySettings()
    fast_e_s, (fast_e, fast_v) = measure(
        parse_and_evaluate(parse_exposition, policy), text, args.repeat)
    ref_e_s, (ref_e, ref_v) = measure(
        parse_and_evaluate(parse_exposition_reference, policy), text, args.repeat)
    if fast_e.nodes != ref_e.nodes or fast_v != ref_v:
        raise SystemExit("parse + evaluate: the readings or verdicts differ between parsers")

    rows = []
    for label, seconds, result in (
        ("parse_exposition", fast_s, fast),
        ("parse_exposition_reference", ref_s, ref),
        ("parse_exposition + evaluate", fast_e_s, fast_e),
        ("reference + evaluate", ref_e_s, ref_e),
    ):
        rows.append([label, seconds * 1000, mib / seconds, total_lines / seconds / 1e6,
                     args.nodes / seconds, result.samples, len(result.nodes)])
    print(table(["path", "ms", "MiB/s", "M lines/s", "nodes/s", "health samples", "nodes"],
                rows))
    ratio, ratio_e = ref_s / fast_s, ref_e_s / fast_e_s
    print(f"ratio (reference / fast), parse only: {ratio:.1f}x")
    print(f"ratio (reference / fast), parse + evaluate: {ratio_e:.1f}x "
          f"(target >= {TARGET_RATIO:.0f}x: {'met' if ratio_e >= TARGET_RATIO else 'NOT met'}); "
          f"identical readings and verdicts: yes ({len(fast_v)} nodes)")
    save("parse", {"nodes": args.nodes, "gpus": args.gpus, "lines": total_lines,
                   "mib": mib, "seconds": {r[0]: r[1] / 1000 for r in rows},
                   "ratio_parse": ratio, "ratio_parse_evaluate": ratio_e,
                   "target_ratio": TARGET_RATIO})


if __name__ == "__main__":
    main()
