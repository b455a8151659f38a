"""The opt-in DCGM_EXP_XID_ERRORS_COUNT family, shaped like dcgm-exporter's XID collector."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

import sim.gpu.server
from sim.gpu.cli import gpu_app
from sim.gpu.exposition import render_chunks, render_fleet, render_node
from sim.gpu.fleet import Fleet, NodeSpec

NODE = "node-1"
COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
WINDOW_MS = 60_000
IDENTITY = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def fleet_of(clock: FakeClock, gpus: int = 2, **switches: Any) -> Fleet:
    switches.setdefault("xid_count_window_ms", WINDOW_MS)
    fleet = Fleet([NodeSpec(NODE, gpus=gpus)], clock=clock, **switches)
    fleet.set_persistence(NODE, None, False)  # as the reset Job leaves it before resetting
    return fleet


def count_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(COUNT + "{")]


def counts(fleet: Fleet, node: str = NODE) -> dict[tuple[str, str | None], float]:
    """(gpu, xid or None) -> value, parsed by the Prometheus client library."""
    out: dict[tuple[str, str | None], float] = {}
    for fam in text_string_to_metric_families(render_node(fleet, node)):
        if fam.name == COUNT:
            for s in fam.samples:
                out[(s.labels["gpu"], s.labels.get("xid"))] = s.value
    return out


def test_off_by_default(clock: FakeClock) -> None:
    fleet = Fleet([NodeSpec(NODE, gpus=2)], clock=clock)
    assert fleet.xid_count_window_ms is None
    fleet.inject(NODE, 0, "xid", 13)
    text = render_node(fleet, NODE)
    assert COUNT not in text
    assert "DCGM_FI_DEV_XID_ERRORS{" in text  # the last-XID gauge is unaffected
    assert fleet.gpu(NODE, 0).xid_events == ()  # nothing recorded while off


def test_no_xid_gives_one_zero_series_without_xid_label(clock: FakeClock) -> None:
    fleet = fleet_of(clock)
    lines = count_lines(render_node(fleet, NODE))
    assert len(lines) == 2
    for gpu, line in enumerate(lines):
        assert line.startswith(f'{COUNT}{{gpu="{gpu}",')
        assert line.endswith(f',window_size_in_ms="{WINDOW_MS}"}} 0')
        assert "xid=" not in line
    assert counts(fleet) == {("0", None): 0.0, ("1", None): 0.0}


def test_one_injection_counts_one_with_exact_shape(clock: FakeClock) -> None:
    fleet = fleet_of(clock, xid_count_window_ms=300_000)
    fleet.inject(NODE, 0, "xid", 13)
    g = fleet.gpu(NODE, 0)
    text = render_node(fleet, NODE)
    assert count_lines(text)[0] == (
        f'{COUNT}{{gpu="0",UUID="{g.uuid}",pci_bus_id="00000000:18:00.0",device="nvidia0",'
        f'modelName="NVIDIA H100 80GB HBM3",Hostname="{NODE}",'
        'DCGM_FI_DRIVER_VERSION="570.124.06",window_size_in_ms="300000",xid="13"} 1'
    )
    assert counts(fleet) == {("0", "13"): 1.0, ("1", None): 0.0}


def test_label_order_matches_the_other_families(clock: FakeClock) -> None:
    fleet = fleet_of(clock, hostname_label="hostname")
    fleet.inject(NODE, 1, "xid", 48)
    fleet.assign(NODE, 1, "ml", "job-1", "trainer")
    names = [
        [kv.split("=", 1)[0] for kv in line[line.index("{") + 1 : line.rindex("}")].split('",')]
        for line in count_lines(render_node(fleet, NODE))
    ]
    base = [("hostname" if n == "Hostname" else n) for n in IDENTITY] + ["window_size_in_ms"]
    assert names[0] == base
    # Collector labels (sorted) come before the attributes the pod mapper adds.
    assert names[1] == [*base, "xid", "container", "namespace", "pod"]


def test_repeat_of_the_same_xid_counts_each_time(clock: FakeClock) -> None:
    fleet = fleet_of(clock)
    for _ in range(3):
        fleet.inject(NODE, 0, "xid", 13)  # earlier identical faults are still active
        clock.t += 1
    assert len(fleet.gpu(NODE, 0).faults) == 3
    assert counts(fleet)[("0", "13")] == 3.0
    # The last-XID gauge cannot tell the repeats apart: it still just says 13.
    gauge = [ln for ln in render_node(fleet, NODE).splitlines() if ln.startswith("DCGM_FI_DEV_XID")]
    assert len(gauge) == 1 and gauge[0].endswith(" 13")


def test_two_different_xids_give_two_series(clock: FakeClock) -> None:
    fleet = fleet_of(clock)
    fleet.inject(NODE, 0, "xid", 94)
    fleet.inject(NODE, 0, "xid", 13)
    fleet.inject(NODE, 0, "xid", 94)
    fleet.inject(NODE, 1, "xid", 79)
    assert counts(fleet) == {("0", "13"): 1.0, ("0", "94"): 2.0, ("1", "79"): 1.0}
    xids = [ln.split('xid="')[1].split('"')[0] for ln in count_lines(render_node(fleet, NODE))]
    assert xids == ["13", "94", "79"]  # by GPU, then by XID number


def test_occurrences_age_out_of_the_sliding_window(clock: FakeClock) -> None:
    fleet = fleet_of(clock)  # 60 s window
    fleet.inject(NODE, 0, "xid", 13)  # t=1000
    clock.t = 1030.0
    fleet.inject(NODE, 0, "xid", 13)  # t=1030
    clock.t = 1059.0
    assert counts(fleet)[("0", "13")] == 2.0
    clock.t = 1061.0  # the first one is now older than the window
    assert counts(fleet)[("0", "13")] == 1.0
    clock.t = 1091.0
    assert counts(fleet) == {("0", None): 0.0, ("1", None): 0.0}
    # The fault itself is still active and the last-XID gauge still shows it.
    assert fleet.gpu(NODE, 0).last_xid == 13


def test_memory_stays_bounded_to_one_window(clock: FakeClock) -> None:
    fleet = fleet_of(clock, gpus=1)
    for _ in range(1000):
        fleet.inject(NODE, 0, "xid", 13)
        clock.t += 1.0  # one XID a second, 60 s window
    fleet.inject(NODE, 0, "xid", 13)
    assert len(fleet.gpu(NODE, 0).xid_events) == 60
    assert counts(fleet)[("0", "13")] == 60.0


def test_exporter_restart_forgets_history_but_sees_surviving_faults(clock: FakeClock) -> None:
    fleet = fleet_of(clock)
    for _ in range(3):
        fleet.inject(NODE, 0, "xid", 13)  # clears on reset
    fleet.inject(NODE, 1, "xid", 13)
    fleet.inject(NODE, 1, "xid", 74, clears_on="never")
    assert fleet.reset(NODE).ok
    # A fresh exporter's DCGM has no history; the permanent fault fires once more.
    assert counts(fleet) == {("0", None): 0.0, ("1", "74"): 1.0}
    fleet.set_exporter(NODE, "down")
    fleet.set_exporter(NODE, "up")
    assert counts(fleet) == {("0", None): 0.0, ("1", "74"): 1.0}


def test_gpu_off_the_bus_has_no_count_series(clock: FakeClock) -> None:
    fleet = fleet_of(clock)
    fleet.inject(NODE, 1, "fallen-off-bus")
    assert set(counts(fleet)) == {("0", None)}


def test_help_and_type_once_and_family_last(clock: FakeClock) -> None:
    fleet = Fleet(
        [NodeSpec(f"n{i}", gpus=2) for i in range(3)], clock=clock, xid_count_window_ms=WINDOW_MS
    )
    fleet.inject("n1", 0, "xid", 31)
    fleet.inject("n2", 1, "xid", 31)
    text = render_fleet(fleet)
    assert text.count(f"# HELP {COUNT} ") == 1 and text.count(f"# TYPE {COUNT} gauge\n") == 1
    assert text.index(f"# HELP {COUNT} ") > text.index("# HELP DCGM_FI_PROF_PCIE_RX_BYTES")
    assert (
        f"# HELP {COUNT} Count of XID Errors within user-specified time window "
        "(see xid-count-window-size param).\n" in text
    )
    assert len(count_lines(text)) == 6
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams[COUNT].type == "gauge"
    by_key = {
        (s.labels["Hostname"], s.labels["gpu"], s.labels.get("xid")): s.value
        for s in fams[COUNT].samples
    }
    assert by_key[("n1", "0", "31")] == 1.0 and by_key[("n0", "0", None)] == 0.0
    assert all(s.labels["window_size_in_ms"] == str(WINDOW_MS) for s in fams[COUNT].samples)


def test_big_fleet_render_is_correct_when_on() -> None:
    on = Fleet.synthetic(1000, 8, xid_count_window_ms=300_000, clock=lambda: 50.0)
    off = Fleet.synthetic(1000, 8, clock=lambda: 50.0)
    for fleet in (on, off):
        fleet.inject("gpu-node-00500", 3, "xid", 13)
        fleet.inject("gpu-node-00500", 3, "xid", 13)
    chunks = list(render_chunks(on, on.nodes.values()))
    last = chunks[-1]
    assert last.startswith(f"# HELP {COUNT} ")
    assert last.count("\n") - 2 == 8000
    assert last.count('xid="13"} 2\n') == 1 and last.count("} 0\n") == 7999
    assert "".join(chunks[:-1]) == render_fleet(off)  # every other family is unchanged


@pytest.mark.parametrize("bad", [0, -5, True, 1.5, "300000"])
def test_bad_window_is_rejected_naming_the_field(bad: object) -> None:
    with pytest.raises(ValueError, match="xid_count_window_ms must be a positive"):
        Fleet([NodeSpec(NODE)], xid_count_window_ms=bad)  # type: ignore[arg-type]


def test_switches_report_the_window(clock: FakeClock) -> None:
    assert fleet_of(clock).switches()["xid_count_window_ms"] == WINDOW_MS
    assert Fleet([NodeSpec(NODE)]).switches()["xid_count_window_ms"] is None


def test_cli_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Fleet] = []
    monkeypatch.setattr(sim.gpu.server, "run_gpu_simulator", lambda h, p, f: served.append(f))
    runner = CliRunner()
    r = runner.invoke(gpu_app, ["serve", "--nodes", "2", "--gpus", "1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(gpu_app, ["serve", "--scenario", "small", "--xid-count-window-ms", "120000"])
    assert r.exit_code == 0, r.output
    assert [f.xid_count_window_ms for f in served] == [None, 120_000]
    assert COUNT not in render_node(served[0], "gpu-node-00001")
    assert 'window_size_in_ms="120000"} 0' in render_node(served[1], "gpu-node-01")


@pytest.mark.parametrize("bad", ["0", "-1", "abc"])
def test_cli_rejects_bad_window(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setattr(sim.gpu.server, "run_gpu_simulator", lambda *a: pytest.fail("served"))
    r = CliRunner().invoke(gpu_app, ["serve", "--nodes", "1", "--xid-count-window-ms", bad])
    assert r.exit_code == 2
    assert "--xid-count-window-ms" in r.output
