"""PrometheusSource against a real Prometheus that scrapes the GPU simulator every second.

Windows and holds are seconds here instead of minutes; the semantics are the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta

import httpx
import pytest

from activities.exposition import parse_exposition
from activities.prometheus_source import PrometheusRead, PrometheusSource
from policy.config import PolicySettings
from policy.models import Action, GpuReading
from policy.rules import evaluate_node
from tests.prometheus.conftest import POD_HOSTNAME, Stack
from tests.prometheus.harness import INSTALL_HINT, find_prometheus, free_port

pytestmark = pytest.mark.skipif(
    find_prometheus() is None,
    reason=f"prometheus binary not found: install it ({INSTALL_HINT}) or set PROMETHEUS_BIN",
)

WINDOW = timedelta(seconds=60)
HOLD = timedelta(seconds=4)
POLICY = PolicySettings()


def source(stack: Stack, **kwargs: object) -> PrometheusSource:
    return PrometheusSource(url=stack.prometheus.url, window=WINDOW, **kwargs)  # type: ignore[arg-type]


async def read_until(
    src: PrometheusSource,
    nodes: list[str],
    done: Callable[[PrometheusRead], bool],
    *,
    hold: timedelta = HOLD,
    timeout: float = 15,
) -> PrometheusRead:
    deadline = time.monotonic() + timeout
    while True:
        result = await src.read_detailed(nodes, thermal_hold=hold)
        if done(result) or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.25)


async def until_prometheus(stack: Stack, promql: str, present: bool, timeout: float = 10) -> None:
    """Wait until an instant query of Prometheus itself has (or no longer has) a result."""
    deadline = time.monotonic() + timeout
    while bool(stack.prometheus.query(promql)) != present:
        assert time.monotonic() < deadline, f"{promql} still {'absent' if present else 'there'}"
        await asyncio.sleep(0.2)


def gpu(result: PrometheusRead, node: str, index: str) -> GpuReading:
    return next(g for g in result.readings[node].gpus if g.gpu == index)


def action(result: PrometheusRead, node: str) -> Action:
    return evaluate_node(result.readings[node], POLICY).action


async def test_healthy_fleet_has_no_findings(stack: Stack) -> None:
    nodes = ["healthy-1", "healthy-2"]
    result = await source(stack).read_detailed(nodes, thermal_hold=HOLD)
    assert result.errors == {}
    assert sorted(result.readings) == nodes
    async with httpx.AsyncClient(base_url=stack.sim.url) as http:
        for node in nodes:
            verdict = evaluate_node(result.readings[node], POLICY)
            assert verdict.action == Action.NONE and verdict.findings == []
            # Identity matches what the direct scrape path reads from the same exporter.
            text = (await http.get(f"/nodes/{node}/metrics")).text
            direct = parse_exposition(text, default_node=node).nodes[0]
            assert [(g.gpu, g.uuid, g.model_name, g.pci_bus_id) for g in direct.gpus] == [
                (g.gpu, g.uuid, g.model_name, g.pci_bus_id) for g in result.readings[node].gpus
            ]
            for g in result.readings[node].gpus:
                assert g.xid is None  # absent-until-error exporter: no XID series at all
                assert g.ecc_dbe_volatile == 0 and g.row_remap_failure == 0
                assert g.gpu_temp is not None and g.gpu_temp < 87


async def test_xid_79_cleared_by_reboot_between_reads_is_still_seen(stack: Stack) -> None:
    node, sim = "xid79", stack.sim.client
    src = source(stack)
    before = await src.read_detailed([node], thermal_hold=HOLD)
    assert action(before, node) == Action.NONE
    # Between two detector ticks: the XID arrives, Prometheus scrapes it, the node reboots
    # (exporter restart) and the gauge is gone again.
    sim.inject_fault(node, 1, "xid", 79)
    selector = f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}"}}'
    await until_prometheus(stack, selector, present=True)
    sim.reboot(node)
    await until_prometheus(stack, selector, present=False)
    after = await src.read_detailed([node], thermal_hold=HOLD)
    assert gpu(after, node, "1").xid == 79
    assert gpu(after, node, "0").xid is None
    assert action(after, node) == Action.REBOOT
    uuid = gpu(after, node, "1").uuid
    assert after.xids_seen == {node: {uuid: [79]}}
    # Once remediated (acknowledged), the same value in the window no longer triggers.
    acked = evaluate_node(after.readings[node], POLICY, acknowledged_xids={uuid: 79})
    assert acked.action == Action.NONE


async def test_xid_48_cleared_by_reset_between_reads_is_still_seen(stack: Stack) -> None:
    node, sim = "xid48", stack.sim.client
    sim.inject_fault(node, 0, "xid", 48)
    selector = f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}"}}'
    await until_prometheus(stack, selector, present=True)
    sim.set_persistence(node, False, 0)  # as the reset Job does first
    sim.reset(node, 0)
    await until_prometheus(stack, selector, present=False)
    result = await source(stack).read_detailed([node], thermal_hold=HOLD)
    assert gpu(result, node, "0").xid == 48
    verdict = evaluate_node(result.readings[node], POLICY)
    assert verdict.action == Action.RESET
    assert verdict.findings[0].rule == "xid-48-workflow-xid-48"


async def test_most_severe_xid_of_the_window_wins(stack: Stack) -> None:
    node, sim = "xidmix", stack.sim.client
    base = f'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}",gpu="0"}}'
    sim.inject_fault(node, 0, "xid", 48)
    await until_prometheus(stack, f"{base} == 48", present=True)
    # An application XID afterwards: the gauge now says 13, the 48 is only in the history.
    sim.inject_fault(node, 0, "xid", 13)
    await until_prometheus(stack, f"{base} == 13", present=True)
    src = source(stack)
    result = await src.read_detailed([node], thermal_hold=HOLD)
    reading = gpu(result, node, "0")
    assert reading.xid == 48
    assert result.xids_seen[node][reading.uuid] == [48, 13]
    assert action(result, node) == Action.RESET
    # After the 48 was remediated, the 13 is what is left to report.
    again = await src.read_detailed([node], thermal_hold=HOLD,
                                    acknowledged_by_node={node: {reading.uuid: 48}})
    assert gpu(again, node, "0").xid == 13
    assert action(again, node) == Action.APP


async def test_ecc_dbe(stack: Stack) -> None:
    node = "ecc"
    stack.sim.client.inject_fault(node, 1, "ecc-dbe", 2)
    result = await read_until(
        source(stack),
        [node],
        lambda r: node in r.readings and gpu(r, node, "1").ecc_dbe_volatile == 2,
    )
    assert gpu(result, node, "1").ecc_dbe_volatile == 2
    verdict = evaluate_node(result.readings[node], POLICY)
    assert verdict.action == Action.RESET
    assert [f.rule for f in verdict.findings] == ["ecc-dbe-volatile"]


async def test_row_remap_failure(stack: Stack) -> None:
    node = "remap"
    stack.sim.client.inject_fault(node, 0, "row-remap-failure")
    result = await read_until(
        source(stack),
        [node],
        lambda r: node in r.readings and gpu(r, node, "0").row_remap_failure == 1,
    )
    verdict = evaluate_node(result.readings[node], POLICY)
    assert verdict.action == Action.QUARANTINE
    assert verdict.findings[0].rule == "row-remap-failure"


async def test_pcie_replay_rate_comes_from_prometheus_rate(stack: Stack) -> None:
    """The counter grows 600 a minute on GPU 1; the source asks Prometheus for the rate (only
    while the rule is on), and the policy alerts on it, not on the total."""
    node = "replays"
    links = PolicySettings.from_mapping({"links": {"pcie_replay_enabled": True}})
    stack.sim.client.inject_fault(node, 1, "pcie-replay", 600)
    off = await source(stack).read_detailed([node], thermal_hold=HOLD)
    assert gpu(off, node, "1").pcie_replays_per_minute is None, "not queried while off"
    result = await read_until(
        source(stack, policy=links), [node],
        lambda r: node in r.readings
        and (gpu(r, node, "1").pcie_replays_per_minute or 0) > 300)
    assert 300 < (gpu(result, node, "1").pcie_replays_per_minute or 0) < 1200
    assert gpu(result, node, "0").pcie_replays_per_minute == 0.0
    verdict = evaluate_node(result.readings[node], links)
    assert verdict.action == Action.ALERT
    assert [(f.gpu, f.rule) for f in verdict.findings] == [
        ("1", "pcie-replays-over-8-per-minute")]


async def test_temperature_held_for_the_hold_is_thermal(stack: Stack) -> None:
    node = "hot"
    stack.sim.client.inject_fault(node, 0, "gpu-temp", 95)
    result = await read_until(
        source(stack),
        [node],
        lambda r: node in r.readings and gpu(r, node, "0").gpu_temp == 95,
        timeout=20,
    )
    reading = gpu(result, node, "0")
    assert reading.gpu_temp == 95
    # The simulator sets SW thermal (0x20), HW thermal (0x40) and HW slowdown (0x8) above 89 °C.
    assert reading.clock_event_reasons is not None
    assert reading.clock_event_reasons & 0x68 == 0x68
    verdict = evaluate_node(result.readings[node], POLICY)
    assert verdict.action == Action.THERMAL
    assert "gpu-temp-over-87" in {f.rule for f in verdict.findings}
    assert gpu(result, node, "1").gpu_temp is not None
    assert gpu(result, node, "1").gpu_temp < 87  # type: ignore[operator]


async def test_spike_shorter_than_the_hold_is_not_thermal(stack: Stack) -> None:
    node = "spike"
    hold = timedelta(seconds=8)
    src = source(stack)
    # The series must reach back over the hold before the spike, or "not hot" would only mean
    # "not enough history".
    await read_until(
        src,
        [node],
        lambda r: node in r.readings and gpu(r, node, "0").gpu_temp is not None,
        hold=hold,
        timeout=20,
    )
    stack.sim.client.inject_fault(node, 0, "gpu-temp", 95)
    await until_prometheus(
        stack, f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{node}",gpu="0"}} == 95', present=True
    )
    result = await src.read_detailed([node], thermal_hold=hold)
    reading = gpu(result, node, "0")
    assert reading.gpu_temp is not None and reading.gpu_temp < 87
    assert (reading.clock_event_reasons or 0) & POLICY.thermal.clock_mask == 0
    assert action(result, node) == Action.NONE
    # The clock bits of the spike are still visible, and "seen" mode acts on them.
    assert result.clock_reasons_seen[node][reading.uuid] & 0x68 == 0x68
    seen = await source(stack, clock_mode="seen").read_detailed([node], thermal_hold=hold)
    assert action(seen, node) == Action.THERMAL


async def test_exporter_down_makes_the_node_an_error_not_sick(stack: Stack) -> None:
    node, sim = "down", stack.sim.client
    sim.inject_fault(node, 0, "ecc-dbe")
    src = source(stack)
    sick = await read_until(
        src, [node], lambda r: node in r.readings and gpu(r, node, "0").ecc_dbe_volatile == 1
    )
    assert action(sick, node) == Action.RESET
    sim.set_exporter_mode(node, "down")
    try:
        result = await read_until(src, [node], lambda r: node in r.errors)
        assert node not in result.readings
        assert "stale" in result.errors[node] and node in result.errors[node]
    finally:
        sim.set_exporter_mode(node, "up")


async def test_unknown_node_is_an_error(stack: Stack) -> None:
    _, errors = await source(stack).read(["healthy-1", "ghost"], thermal_hold=HOLD)
    assert errors == {"ghost": "no DCGM series in Prometheus for node ghost"}


async def test_lowercase_hostname_and_relabelled_node_label(stack: Stack) -> None:
    nodes = ["lower-1", "podnet-1"]
    readings, errors = await source(stack).read(nodes, thermal_hold=HOLD)
    assert errors == {}
    assert [len(readings[n].gpus) for n in nodes] == [2, 2]
    # podnet-1's Hostname is the exporter pod's name; the target's instance label finds it.
    assert stack.prometheus.query(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{POD_HOSTNAME}"}}')
    # Another target label the scrape config attaches works the same.
    readings, errors = await source(stack, node_label="kubernetes_node").read(
        ["podnet-1"], thermal_hold=HOLD)
    assert errors == {} and len(readings["podnet-1"].gpus) == 2
    # What the exporter says about itself is never asked.
    with pytest.raises(ValueError, match="written by the exporter itself"):
        source(stack, node_label="Hostname")


async def test_prometheus_down_makes_every_node_an_error() -> None:
    src = PrometheusSource(url=f"http://127.0.0.1:{free_port()}", timeout_seconds=2)
    readings, errors = await src.read(["a", "b"], thermal_hold=HOLD)
    assert readings == {}
    assert sorted(errors) == ["a", "b"]
    assert all(
        "unreachable" in e and "Prometheus at http://127.0.0.1:" in e for e in errors.values()
    )
