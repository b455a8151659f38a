"""The simulator's text must have dcgm-exporter's exact shape (docs/simulators-gpu.md)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.gpu.exposition import garble, render_chunks, render_fleet, render_node
from sim.gpu.fleet import Fleet, NodeSpec

# The stock default-counters.csv of dcgm-exporter 4.x: (name, type, printed as %f?).
STOCK = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", False),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", False),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", False),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", False),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", True),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", False),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", False),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", False),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", False),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", False),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", False),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", False),
    ("DCGM_FI_DEV_FB_FREE", "gauge", False),
    ("DCGM_FI_DEV_FB_USED", "gauge", False),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", False),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", False),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", False),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", False),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", False),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", False),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", True),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", True),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", True),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", False),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", False),
]
EXTRA = {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "gauge",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "counter",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "gauge",
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "gauge",
}
IDENTITY = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
]
SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')
NODE = "gpu-node-07"


def fleet_of(**switches: object) -> Fleet:
    return Fleet([NodeSpec(NODE, gpus=4)], clock=lambda: 5000.0, **switches)  # type: ignore[arg-type]


def samples(text: str) -> list[tuple[str, list[tuple[str, str]], str]]:
    """(name, [(label, value)] in text order, raw value) for every sample line."""
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a dcgm-exporter sample line: {line!r}"
        labels = LABEL.findall(m["labels"])
        # The label regex must consume the whole label set, so nothing odd hides in it.
        assert "".join(f'{k}="{v}"{sep}' for k, v, sep in labels) == m["labels"]
        out.append((m["name"], [(k, v) for k, v, _ in labels], m["value"]))
    return out


def test_stock_counter_set_names_types_and_order() -> None:
    text = render_node(fleet_of(extra_fields=False), NODE)
    families = list(text_string_to_metric_families(text))
    # XID is absent on a healthy GPU with the current exporter, everything else present.
    expected = [(n, t) for n, t, _ in STOCK if n != "DCGM_FI_DEV_XID_ERRORS"]
    assert [(f.name, f.type) for f in families] == expected
    for fam in families:
        assert len(fam.samples) == 4


def test_extra_fields_switch() -> None:
    text = render_node(fleet_of(), NODE)
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name, typ in EXTRA.items():
        assert types[name] == typ
    stock_order = [n for n in types if n not in EXTRA]
    assert stock_order == [n for n, _, _ in STOCK if n != "DCGM_FI_DEV_XID_ERRORS"]


def test_help_and_type_once_per_family_before_its_samples() -> None:
    fleet = fleet_of()
    fleet.inject(NODE, 1, "xid", 48)
    lines = render_node(fleet, NODE).splitlines()
    helps = Counter(line.split()[2] for line in lines if line.startswith("# HELP "))
    assert set(helps.values()) == {1}
    current = None
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            current = line.split()[2]
            assert lines[i + 1].startswith(f"# TYPE {current} ")
        elif not line.startswith("#"):
            assert line.startswith(current + "{"), "samples must sit under their own family"


def test_label_names_order_and_formatting() -> None:
    fleet = fleet_of()
    text = render_node(fleet, NODE)
    assert ", " not in text.replace("# HELP", "").split("}")[0]
    for name, labels, raw in samples(text):
        assert [k for k, _ in labels] == IDENTITY
        assert not name.endswith("_total")
        stock = {n: f for n, _, f in STOCK}
        if stock.get(name):
            assert re.fullmatch(r"-?\d+\.\d{6}", raw), f"{name} must print as %f: {raw}"
        else:
            assert re.fullmatch(r"-?\d+", raw), f"{name} must print as %d: {raw}"
    first = samples(text)[0][1]
    assert dict(first) == {
        "gpu": "0",
        "UUID": fleet.gpu(NODE, 0).uuid,
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": NODE,
        "DCGM_FI_DRIVER_VERSION": "570.124.06",
    }


def test_no_timestamps_and_no_spaces_after_commas() -> None:
    fleet = fleet_of()
    fleet.assign(NODE, 0, "ml", "job-0-worker-3", "trainer")
    for line in render_node(fleet, NODE).splitlines():
        if not line.startswith("#"):
            labelset, _, rest = line.rpartition("} ")
            assert " " not in rest  # value only, no timestamp
            assert ", " not in labelset.replace("NVIDIA H100 80GB HBM3", "")


def test_hostname_label_quirk() -> None:
    new = samples(render_node(fleet_of(hostname_label="hostname"), NODE))
    assert [k for k, _ in new[0][1]][5] == "hostname"
    assert all("Hostname" not in dict(labels) for _, labels, _ in new)


def test_xid_absent_until_error_then_err_labels() -> None:
    fleet = fleet_of()
    assert "DCGM_FI_DEV_XID_ERRORS" not in render_node(fleet, NODE)  # no HELP/TYPE either
    fleet.inject(NODE, 3, "xid", 79)
    fleet.assign(NODE, 3, "ml", "job-0-worker-3", "trainer")
    xids = [
        (labels, raw)
        for name, labels, raw in samples(render_node(fleet, NODE))
        if name == "DCGM_FI_DEV_XID_ERRORS"
    ]
    assert len(xids) == 1
    labels, raw = xids[0]
    assert raw == "79"
    assert [k for k, _ in labels] == [
        *IDENTITY,
        "container",
        "err_code",
        "err_msg",
        "namespace",
        "pod",
    ]
    assert dict(labels)["err_code"] == "79"
    assert dict(labels)["err_msg"] == "GPU has fallen off the bus"


def test_xid_zero_mode_like_older_exporters() -> None:
    fleet = fleet_of(xid_series="zero")
    fleet.inject(NODE, 2, "xid", 48)
    xids = {
        dict(labels)["gpu"]: (dict(labels), raw)
        for name, labels, raw in samples(render_node(fleet, NODE))
        if name == "DCGM_FI_DEV_XID_ERRORS"
    }
    assert len(xids) == 4
    assert xids["0"][1] == "0"
    assert (xids["0"][0]["err_code"], xids["0"][0]["err_msg"]) == ("0", "No Error")
    assert (xids["2"][1], xids["2"][0]["err_msg"]) == ("48", "Double Bit ECC Error")


def test_pod_labels_only_on_assigned_gpu() -> None:
    fleet = fleet_of()
    fleet.assign(NODE, 1, "team-a", "trainer-abc", "main")
    for _, labels, _ in samples(render_node(fleet, NODE)):
        keys = [k for k, _ in labels]
        if dict(labels)["gpu"] == "1":
            assert keys == [*IDENTITY, "container", "namespace", "pod"]
        else:
            assert keys == IDENTITY


def test_fallen_off_bus_gpu_has_no_series() -> None:
    fleet = fleet_of()
    fleet.inject(NODE, 2, "fallen-off-bus")
    gpus = {dict(labels)["gpu"] for _, labels, _ in samples(render_node(fleet, NODE))}
    assert gpus == {"0", "1", "3"}


def test_label_values_are_escaped() -> None:
    fleet = Fleet([NodeSpec(NODE, gpus=1, model='Odd "GPU" \\ name')])
    fleet.assign(NODE, 0, "ns", "pod", 'c"x')
    families = list(text_string_to_metric_families(render_node(fleet, NODE)))
    labels = families[0].samples[0].labels
    assert labels["modelName"] == 'Odd "GPU" \\ name' and labels["container"] == 'c"x'


def test_pcie_cards_have_no_nvlink_family() -> None:
    fleet = Fleet([NodeSpec(NODE, gpus=2, model="NVIDIA H100 PCIe")])
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in render_node(fleet, NODE)


def test_fleet_render_merges_families() -> None:
    fleet = Fleet([NodeSpec(f"n{i}", gpus=2) for i in range(5)])
    text = render_fleet(fleet)
    families = list(text_string_to_metric_families(text))
    assert len({f.name for f in families}) == len(families)
    for fam in families:
        assert len(fam.samples) == 10
        assert {s.labels["Hostname"] for s in fam.samples} == {f"n{i}" for i in range(5)}


def test_garbled_text_does_not_parse() -> None:
    text = garble(render_node(fleet_of(), NODE))
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text))


def test_ten_thousand_nodes_render() -> None:
    fleet = Fleet.synthetic(10_000, 8)
    per_family: dict[str, int] = {}
    for chunk in render_chunks(fleet, fleet.nodes.values()):
        name = chunk.split(" ", 3)[2]
        per_family[name] = chunk.count("\n") - 2
    assert len(per_family) == len(STOCK) - 1 + len(EXTRA)
    assert set(per_family.values()) == {80_000}
