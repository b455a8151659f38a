"""GPU serials: the GPU simulator labels every series with DCGM_FI_DEV_SERIAL as
dcgm-exporter does for a label field of its counters file; both parsers read it, and it
reaches the verdict's findings (the repair ledger follows a GPU by it)."""

from __future__ import annotations

from activities.exposition import parse_exposition, parse_exposition_reference
from policy.config import PolicySettings
from policy.rules import evaluate_node
from sim.gpu.exposition import render_node
from sim.gpu.fleet import Fleet


def _fleet(**switches: object) -> Fleet:
    fleet = Fleet.synthetic(1, 2, **switches)
    fleet.inject("gpu-node-00001", 0, "xid", 79)
    return fleet


def test_the_simulator_labels_series_with_the_serial_and_the_parsers_read_it() -> None:
    fleet = _fleet(serial_label=True)
    serials = [g.serial for g in fleet.node("gpu-node-00001").gpus]
    assert all(len(s) == 13 and s.isdecimal() for s in serials) and len(set(serials)) == 2
    text = render_node(fleet, "gpu-node-00001")
    assert f'DCGM_FI_DRIVER_VERSION="570.124.06",DCGM_FI_DEV_SERIAL="{serials[0]}"' in text
    fast = parse_exposition(text)
    slow = parse_exposition_reference(text)
    [node] = fast.nodes
    assert [g.serial for g in node.gpus] == serials
    assert fast.nodes == slow.nodes
    verdict = evaluate_node(node, PolicySettings())
    assert [(f.gpu, f.serial) for f in verdict.findings] == [("0", serials[0])]


def test_without_the_label_field_there_is_no_serial() -> None:
    """The GPU Operator's stock counters file has no serial: none is made up."""
    text = render_node(_fleet(), "gpu-node-00001")
    assert "DCGM_FI_DEV_SERIAL" not in text
    [node] = parse_exposition(text).nodes
    assert {g.serial for g in node.gpus} == {""}


def test_a_serial_no_exporter_writes_makes_the_line_bad() -> None:
    fleet = _fleet(serial_label=True)
    g = fleet.node("gpu-node-00001").gpus[0]
    g.serial = "9" * 300
    g.label_cache.clear()
    result = parse_exposition(render_node(fleet, "gpu-node-00001"))
    assert result.bad_lines > 0
    assert all(len(gpu.serial) <= 256 for n in result.nodes for gpu in n.gpus)
