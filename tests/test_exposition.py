"""dcgm-exporter text -> NodeReadings: realistic payloads, every quirk, garbage, and agreement
with prometheus_client's parser."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from activities.exposition import (
    ExpositionError,
    ParseResult,
    parse_exposition,
    parse_exposition_reference,
    parse_line,
    select_health_lines,
)
from policy.config import PolicySettings
from policy.models import Action, GpuReading
from policy.rules import evaluate_fleet

PARSERS = [parse_exposition, parse_exposition_reference]

H100 = 'modelName="NVIDIA H100 80GB HBM3"'
DRV = 'DCGM_FI_DRIVER_VERSION="570.124.06"'


def h100(gpu: int, host: str, extra: str = "", hostname_key: str = "Hostname") -> str:
    """Label set in dcgm-exporter's order: gpu, UUID, pci_bus_id, device, modelName, Hostname,
    labels (DCGM_FI_DRIVER_VERSION), then attributes (container, err_*, namespace, pod)."""
    return (
        f'gpu="{gpu}",UUID="GPU-{host}-{gpu}",pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",'
        f'device="nvidia{gpu}",{H100},{hostname_key}="{host}",{DRV}{extra}'
    )


XID_79_WITH_POD = (
    ',container="trainer",err_code="79",err_msg="GPU has fallen off the bus",'
    'namespace="ml",pod="job-0-worker-3"'
)

# Released exporter (Hostname), two H100s; GPU 0 had XID 79 while a pod owned it.
NODE_A = f"""# HELP DCGM_FI_DEV_SM_CLOCK SM frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{{{h100(0, "gpu-a")}}} 1980
DCGM_FI_DEV_SM_CLOCK{{{h100(1, "gpu-a")}}} 1980
# HELP DCGM_FI_DEV_MEMORY_TEMP Memory temperature (in C).
# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge
DCGM_FI_DEV_MEMORY_TEMP{{{h100(0, "gpu-a")}}} 41
DCGM_FI_DEV_MEMORY_TEMP{{{h100(1, "gpu-a")}}} 43
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{h100(0, "gpu-a")}}} 38
DCGM_FI_DEV_GPU_TEMP{{{h100(1, "gpu-a")}}} 36
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{{h100(0, "gpu-a")}}} 112.431000
DCGM_FI_DEV_POWER_USAGE{{{h100(1, "gpu-a")}}} 96.000000
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{{h100(0, "gpu-a", XID_79_WITH_POD)}}} 79
DCGM_FI_DEV_XID_ERRORS{{{h100(1, "gpu-a", ',err_code="0",err_msg="No Error"')}}} 0
# HELP DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS Number of remapped rows for uncorrectable errors
# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS counter
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{h100(0, "gpu-a")}}} 0
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{h100(1, "gpu-a")}}} 2
# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed
# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge
DCGM_FI_DEV_ROW_REMAP_FAILURE{{{h100(0, "gpu-a")}}} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{{{h100(1, "gpu-a")}}} 0
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{h100(0, "gpu-a")}}} 0.000000
"""

# Exporter built from main (lowercase hostname), healthy, no XID series at all (4.5.x behaviour),
# custom counter file with DBE, pending remap, clock reasons under the old name and a hot GPU.
NODE_B = f"""# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{{{h100(0, "gpu-b", hostname_key="hostname")}}} 88
# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{h100(0, "gpu-b", hostname_key="hostname")}}} 0
# TYPE DCGM_FI_DEV_ECC_SBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{h100(0, "gpu-b", hostname_key="hostname")}}} 17
# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge
DCGM_FI_DEV_ROW_REMAP_PENDING{{{h100(0, "gpu-b", hostname_key="hostname")}}} 0
# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{h100(0, "gpu-b", hostname_key="hostname")}}} 64
# TYPE DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION gauge
DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION{{{h100(0, "gpu-b", hostname_key="hostname")}}} 0
"""

# A30 with MIG (pre-3.3.7: no pci_bus_id): one series per GPU instance, same UUID; quirky values.
MIG = 'gpu="0",UUID="GPU-mig-0",device="nvidia0",modelName="NVIDIA A30"'
GI3 = f'{MIG},GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",Hostname="gpu-c",{DRV}'
GI4 = f'{MIG},GPU_I_PROFILE="1g.6gb",GPU_I_ID="4",Hostname="gpu-c",{DRV}'
ESCAPED_MSG = 'err_msg="MMU \\"fault\\", at {0x1} \\\\ retry\\nnext"'
NODE_C = f"""# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{{{GI3},err_code="0",err_msg="No Error"}} 0
DCGM_FI_DEV_XID_ERRORS{{{GI4},err_code="31",{ESCAPED_MSG}}} 31
DCGM_FI_DEV_GPU_TEMP{{{GI3}}} 51
DCGM_FI_DEV_GPU_TEMP{{{GI4}}} 51
DCGM_FI_DEV_MEMORY_TEMP{{{GI3}}} NaN
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{GI3}}} +Inf
DCGM_FI_DEV_ROW_REMAP_FAILURE{{{GI3}}} 9223372036854775794
DCGM_FI_DEV_GPU_TEMP_LIMIT{{{MIG},Hostname="gpu-c"}} 999
"""

REALISTIC = NODE_A + NODE_B + NODE_C


def by_node(result: ParseResult) -> dict[str, list[GpuReading]]:
    return {n.node: n.gpus for n in result.nodes}


@pytest.mark.parametrize("parse", PARSERS)
def test_realistic_payload(parse: Callable[..., ParseResult]) -> None:
    result = parse(REALISTIC)
    assert result.bad_lines == 0
    assert result.unlabelled == 0
    assert result.samples == 10 + 6 + 7
    nodes = by_node(result)
    assert sorted(nodes) == ["gpu-a", "gpu-b", "gpu-c"]

    a0, a1 = nodes["gpu-a"]
    assert a0 == GpuReading(
        gpu="0",
        uuid="GPU-gpu-a-0",
        model_name="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000000:18:00.0",
        xid=79,
        gpu_temp=38,
        memory_temp=41,
        uncorrectable_remapped_rows=0,
        row_remap_failure=0,
    )
    assert (a1.xid, a1.uncorrectable_remapped_rows) == (0, 2)

    (b0,) = nodes["gpu-b"]
    assert b0.xid is None  # absent series: no XID reported
    assert (b0.gpu_temp, b0.ecc_dbe_volatile, b0.ecc_sbe_volatile) == (88, 0, 17)
    assert (b0.row_remap_pending, b0.clock_event_reasons, b0.recovery_action) == (0, 64, 0)

    (c0,) = nodes["gpu-c"]  # MIG instances merged into one physical GPU
    assert c0.uuid == "GPU-mig-0" and c0.pci_bus_id == "" and c0.model_name == "NVIDIA A30"
    assert c0.xid == 31
    assert c0.gpu_temp == 51
    # NaN, +Inf and the leaked sentinel are "no data", not huge readings.
    assert (c0.memory_temp, c0.ecc_dbe_volatile, c0.row_remap_failure) == (None, None, None)


def test_realistic_payload_verdicts() -> None:
    verdicts = {
        v.node: v for v in evaluate_fleet(parse_exposition(REALISTIC).nodes, PolicySettings())
    }
    assert verdicts["gpu-a"].action == Action.REBOOT
    assert [f.rule for f in verdicts["gpu-a"].findings] == ["xid-79-restart-bm"]
    assert verdicts["gpu-b"].action == Action.THERMAL
    assert [f.rule for f in verdicts["gpu-b"].findings] == ["clock-hw-thermal", "gpu-temp-over-87"]
    assert verdicts["gpu-c"].action == Action.APP
    assert [f.rule for f in verdicts["gpu-c"].findings] == ["xid-31-restart-app"]


def test_both_parsers_agree_on_realistic_payload() -> None:
    fast, ref = parse_exposition(REALISTIC), parse_exposition_reference(REALISTIC)
    assert fast.nodes == ref.nodes
    assert (fast.samples, fast.bad_lines, fast.unlabelled) == (
        ref.samples,
        ref.bad_lines,
        ref.unlabelled,
    )


def test_escaped_label_values() -> None:
    line = (
        'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n1",'
        'err_msg="say \\"hi\\", then {leave}, back\\\\slash\\nnewline, odd \\q"} 13'
    )
    name, labels, value = parse_line(line)
    assert name == "DCGM_FI_DEV_XID_ERRORS" and value == 13
    assert labels["err_msg"] == 'say "hi", then {leave}, back\\slash\nnewline, odd \\q'
    assert labels["Hostname"] == "n1"


def test_label_value_with_brace_and_comma_does_not_end_label_set() -> None:
    line = 'DCGM_FI_DEV_GPU_TEMP{gpu="0",pod="a},b=\\"c\\"",UUID="GPU-9",Hostname="n"} 40'
    result = parse_exposition(line)
    assert result.nodes[0].gpus[0].uuid == "GPU-9"
    assert result.nodes[0].gpus[0].gpu_temp == 40


def test_similar_family_names_are_not_selected() -> None:
    lines = select_health_lines(REALISTIC)
    assert all(not line.startswith("DCGM_FI_DEV_GPU_TEMP_LIMIT") for line in lines)
    assert all(not line.startswith("DCGM_FI_DEV_SM_CLOCK") for line in lines)


def test_first_line_and_crlf_and_timestamp() -> None:
    text = (
        'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n1"} 48 1700000000000\r\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",Hostname="n1"} 40\r\n'
    )
    for parse in PARSERS:
        result = parse(text)
        assert result.bad_lines == 0
        assert result.nodes[0].gpus[0].xid == 48
        assert result.nodes[0].gpus[0].gpu_temp == 40


def test_series_without_node_label_use_default_node() -> None:
    text = 'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",device="nvidia0"} 79\n'
    for parse in PARSERS:
        named = parse(text, default_node="worker-7")
        assert [n.node for n in named.nodes] == ["worker-7"]
        assert named.unlabelled == 0
        anonymous = parse(text)
        assert anonymous.nodes == []
        assert anonymous.unlabelled == 1
        assert anonymous.examples


def test_hostname_label_beats_default_node() -> None:
    text = 'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",hostname="real"} 79\n'
    assert [n.node for n in parse_exposition(text, default_node="other").nodes] == ["real"]


def test_old_namespace_uuid_label() -> None:
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-old",Hostname="n"} 40\n'
    assert parse_exposition(text).nodes[0].gpus[0].uuid == "GPU-old"


def test_duplicate_series_keep_the_worse_reading() -> None:
    # Per-pod duplicates (virtual GPUs) of one physical GPU; clock reasons are OR-ed.
    labels = 'gpu="0",UUID="GPU-1",Hostname="n"'
    text = (
        f'DCGM_FI_DEV_GPU_TEMP{{{labels},pod="a"}} 40\n'
        f'DCGM_FI_DEV_GPU_TEMP{{{labels},pod="b"}} 42\n'
        f'DCGM_FI_DEV_GPU_TEMP{{{labels},pod="c"}} 41\n'
        f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels},pod="a"}} 1\n'
        f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{labels},pod="b"}} 64\n'
    )
    for parse in PARSERS:
        (gpu,) = parse(text).nodes[0].gpus
        assert (gpu.gpu_temp, gpu.clock_event_reasons) == (42, 65)


GARBAGE_LINES = [
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n1"',  # cut mid label set
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n1"} ',  # no value
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1,Hostname="n1"} 79',  # unbalanced quote
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n1"} seventy-nine',
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID=GPU-1,Hostname="n1"} 79',  # unquoted value
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",gpu="1",Hostname="n1"} 79',  # duplicate label
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",__x="1",Hostname="n1"} 79',  # reserved label name
    'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-1",Hostname="n1"} 7_9',
]


@pytest.mark.parametrize("line", GARBAGE_LINES)
def test_bad_line_is_counted_never_guessed(line: str) -> None:
    text = NODE_A + line + "\n"
    for parse in PARSERS:
        result = parse(text)
        assert result.bad_lines == 1, parse.__name__
        # The valid lines still parse; the garbled one added nothing.
        assert by_node(result)["gpu-a"][0].xid == 79
        assert "gpu-b" not in by_node(result)


def test_both_parsers_count_the_same_bad_lines() -> None:
    text = NODE_A + "\n".join(GARBAGE_LINES) + "\n" + NODE_B
    fast, ref = parse_exposition(text), parse_exposition_reference(text)
    assert fast.bad_lines == ref.bad_lines == len(GARBAGE_LINES)
    assert fast.nodes == ref.nodes


def test_truncated_scrape_followed_by_bytes() -> None:
    text = NODE_A[: NODE_A.index("err_code=")] + "\x8b\x08garbage\x00\n"
    for parse in PARSERS:
        result = parse(text)
        assert result.bad_lines == 1
        # Nothing sick came out of the cut XID line.
        assert all(g.xid is None for n in result.nodes for g in n.gpus)


@pytest.mark.parametrize(
    "text",
    [
        "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>",
        "  \n<html>\n<head><title>login</title></head></html>",
        "\x00\x01\x02\x1f\x8b binary",
        "\ufffd\ufffdPNG\ufffd",
        "this is not exposition\nneither is this\n",
        'node_cpu_seconds_total{cpu="0",mode="idle"} 1234.5\n',  # valid, but not dcgm-exporter
        'DCGM_FI_DEV_XID_ERRORS{gpu="0" 79\nDCGM_FI_DEV_GPU_TEMP{{{{ 1\n',  # only broken DCGM
        '{"status":"error","error":"not found"}',
    ],
)
def test_not_exposition_raises(text: str) -> None:
    for parse in PARSERS:
        with pytest.raises(ExpositionError):
            parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n"
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n",
        # Valid dcgm-exporter text without any health family.
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1",Hostname="n"} 112.431000\n',
    ],
)
def test_empty_payload(text: str) -> None:
    for parse in PARSERS:
        result = parse(text)
        assert result.empty
        assert result.nodes == []
        assert result.samples == 0


def _random_value(rng: random.Random) -> str:
    pieces = ["a", "Z", " ", ",", "}", "{", "=", '\\"', "\\\\", "\\n", "é", "0", "\\x"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))


def test_parsers_agree_on_randomised_payloads() -> None:
    rng = random.Random(20240601)
    families = [
        ("DCGM_FI_DEV_XID_ERRORS", ["0", "13", "31", "48", "79", "154"]),
        ("DCGM_FI_DEV_GPU_TEMP", ["30", "87", "91.500000", "NaN", "+Inf", "-Inf"]),
        ("DCGM_FI_DEV_MEMORY_TEMP", ["0", "95", "9223372036854775794"]),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", ["0", "1"]),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", ["0", "1", "8", "64", "128"]),
        ("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", ["0", "1", "2", "7"]),
        ("DCGM_FI_DEV_POWER_USAGE", ["100.000000"]),
    ]
    for _ in range(30):
        lines = []
        for _ in range(rng.randint(20, 80)):
            name, values = rng.choice(families)
            g = rng.randint(0, 3)
            host_key = rng.choice(["Hostname", "hostname"])
            mig = f',GPU_I_PROFILE="1g.10gb",GPU_I_ID="{rng.randint(1, 7)}"' * rng.randint(0, 1)
            labels = (
                f'gpu="{g}",UUID="GPU-{g}",pci_bus_id="",device="nvidia{g}",'
                f'modelName="NVIDIA H100 80GB HBM3"{mig},{host_key}="n{g % 2}",{DRV},'
                f'err_msg="{_random_value(rng)}",pod="{_random_value(rng)}"'
            )
            lines.append(f"{name}{{{labels}}} {rng.choice(values)}")
        text = "\n".join(lines) + "\n"
        fast, ref = parse_exposition(text), parse_exposition_reference(text)
        assert fast.bad_lines == ref.bad_lines == 0
        assert fast.samples == ref.samples
        assert fast.nodes == ref.nodes


@pytest.mark.parametrize("parse", PARSERS)
def test_link_counters_fill_their_totals_never_a_rate(parse: Callable[..., ParseResult]) -> None:
    text = "\n".join([
        f"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{h100(0, 'gpu-l')}}} 1234",
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{h100(0, 'gpu-l')}}} 5",
        f"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{h100(0, 'gpu-l')}}} 6",
        f"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{{h100(0, 'gpu-l')}}} 7",
        f"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{h100(0, 'gpu-l')}}} 8",
        # NVSwitch entities share family names: not a GPU.
        'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{nvswitch="0",Hostname="gpu-l"} 99', ""])
    (g,) = by_node(parse(text))["gpu-l"]
    assert (g.pcie_replay_total, g.nvlink_crc_flit_total, g.nvlink_crc_data_total,
            g.nvlink_replay_total, g.nvlink_recovery_total) == (1234, 5, 6, 7, 8)
    assert g.pcie_replays_per_minute is None, "one scrape is no rate"
