"""Fault injection and repair semantics of the simulated GPU fleet."""

from __future__ import annotations

import re

import pytest

from sim.gpu.exposition import render_node
from sim.gpu.faults import FaultError
from sim.gpu.fleet import Fleet, NodeSpec, UnknownGpu, UnknownNode

NODE = "n1"


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fleet(clock: FakeClock) -> Fleet:
    """A fleet whose GPUs have persistence mode off, as the reset Job leaves them before it
    resets: these tests are about what a reset clears (the refusal has its own tests)."""
    f = Fleet([NodeSpec(NODE), NodeSpec("n2")], clock=clock)
    for name in f.nodes:
        f.set_persistence(name, None, False)
    return f


def test_persistence_mode_is_on_by_default_and_refuses_a_reset(clock: FakeClock) -> None:
    f = Fleet([NodeSpec(NODE, gpus=2)], clock=clock)
    f.inject(NODE, 1, "xid", 48)
    assert [g["persistence_mode"] for g in f.node_json(NODE)["gpus"]] == [True, True]
    refused = f.reset(NODE, 1)
    assert not refused.ok and "persistence mode is Enabled" in refused.reason
    assert f.gpu(NODE, 1).faults, "a refused reset clears nothing"
    uuid = f.gpu(NODE, 1).uuid
    f.set_persistence(NODE, uuid, False)  # nvidia-smi -i UUID -pm 0: that GPU only
    assert [g["persistence_mode"] for g in f.node_json(NODE)["gpus"]] == [True, False]
    assert f.reset(NODE, uuid).ok and not f.gpu(NODE, 1).faults
    assert not f.reset(NODE).ok, "GPU 0 still has it on"
    f.reboot(NODE)
    assert f.gpu(NODE, 1).persistence_mode, "nvidia-persistenced starts again at boot"


def test_gpu_by_unknown_uuid_names_it(fleet: Fleet) -> None:
    with pytest.raises(UnknownGpu, match="GPU-nope"):
        fleet.gpu(NODE, "GPU-nope")


def value(fleet: Fleet, metric: str, gpu: int, node: str = NODE) -> str | None:
    """The raw value text of one series in the node's exposition, None when absent."""
    for line in render_node(fleet, node).splitlines():
        if line.startswith(metric + "{") and f'{{gpu="{gpu}",' in line:
            return line.rsplit(" ", 1)[1]
    return None


def test_uuids_are_deterministic_and_unique(fleet: Fleet, clock: FakeClock) -> None:
    again = Fleet([NodeSpec(NODE), NodeSpec("n2")], clock=clock)
    uuids = [g.uuid for n in fleet.nodes.values() for g in n.gpus]
    assert uuids == [g.uuid for n in again.nodes.values() for g in n.gpus]
    assert len(set(uuids)) == 16
    assert all(re.fullmatch(r"GPU-[0-9a-f-]{36}", u) for u in uuids)
    assert render_node(fleet, NODE) == render_node(again, NODE)


def test_healthy_baseline(fleet: Fleet) -> None:
    assert fleet.health(NODE).healthy
    for g in range(8):
        assert 35 <= int(value(fleet, "DCGM_FI_DEV_GPU_TEMP", g) or 0) <= 46
        assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", g) is None
        assert value(fleet, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", g) == "1"  # idle


def test_counters_grow_with_time(fleet: Fleet, clock: FakeClock) -> None:
    before = int(value(fleet, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0) or 0)
    clock.t += 60
    after = int(value(fleet, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0) or 0)
    assert 60 * 60_000 <= after - before <= 60 * 80_000  # ~70 W idle, in mJ


def test_pod_assignment_makes_gpu_busy(fleet: Fleet) -> None:
    fleet.assign(NODE, 2, "ml", "job-0", "trainer")
    assert int(value(fleet, "DCGM_FI_DEV_GPU_UTIL", 2) or 0) >= 90
    assert value(fleet, "DCGM_FI_DEV_GPU_UTIL", 1) == "0"
    fleet.unassign(NODE, 2)
    assert value(fleet, "DCGM_FI_DEV_GPU_UTIL", 2) == "0"


def test_xid_48_cleared_by_gpu_reset(fleet: Fleet) -> None:
    fault = fleet.inject(NODE, 3, "xid", 48)
    assert fault.clears_on == "reset"
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 3) == "48"
    assert not fleet.health(NODE).healthy
    result = fleet.reset(NODE, 3)
    assert result.ok and [(i, f.id) for i, f in result.cleared] == [(3, fault.id)]
    assert fleet.health(NODE).healthy
    # The exporter restarted with the reset, so the XID series is gone again.
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 3) is None


def test_xid_79_needs_a_reboot(fleet: Fleet) -> None:
    fleet.inject(NODE, 5, "xid", 79)
    result = fleet.reset(NODE)
    assert not result.ok
    assert "fallen off the bus" in result.reason and "reboot" in result.reason
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 5) == "79"
    assert fleet.reboot(NODE).ok
    assert fleet.health(NODE).healthy
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 5) is None


def test_reset_of_one_gpu_leaves_other_gpus_faults(fleet: Fleet) -> None:
    fleet.inject(NODE, 1, "xid", 95)
    fleet.inject(NODE, 2, "ecc-dbe", 2)
    fleet.reset(NODE, 1)
    problems = fleet.health(NODE).problems
    assert len(problems) == 1 and problems[0].startswith("GPU 2 ")


def test_reboot_class_fault_survives_reset(fleet: Fleet) -> None:
    fleet.inject(NODE, 0, "xid", 48, clears_on="reboot")
    assert fleet.reset(NODE, 0).ok
    assert not fleet.health(NODE).healthy
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 0) == "48"  # re-raised after the restart
    fleet.reboot(NODE)
    assert fleet.health(NODE).healthy


def test_dbe_volatile_clears_aggregate_stays(fleet: Fleet) -> None:
    fleet.inject(NODE, 4, "ecc-dbe", 3)
    assert value(fleet, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 4) == "3"
    fleet.reset(NODE, 4)
    assert value(fleet, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 4) == "0"
    assert value(fleet, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 4) == "3"
    fleet.reboot(NODE)
    assert value(fleet, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 4) == "3"


def test_sbe_alone_passes_health(fleet: Fleet) -> None:
    fleet.inject(NODE, 4, "ecc-sbe", 7)
    assert fleet.health(NODE).healthy
    assert value(fleet, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 4) == "7"


def test_row_remap_pending_applies_on_reset(fleet: Fleet) -> None:
    fleet.inject(NODE, 6, "row-remap-pending")
    assert value(fleet, "DCGM_FI_DEV_ROW_REMAP_PENDING", 6) == "1"
    assert value(fleet, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 6) == "0"
    assert not fleet.health(NODE).healthy
    fleet.reset(NODE, 6)
    assert value(fleet, "DCGM_FI_DEV_ROW_REMAP_PENDING", 6) == "0"
    assert value(fleet, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 6) == "1"
    assert fleet.health(NODE).healthy


def test_row_remap_failure_is_permanent(fleet: Fleet) -> None:
    fleet.inject(NODE, 7, "row-remap-failure")
    fleet.reset(NODE)
    fleet.reboot(NODE)
    assert value(fleet, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 7) == "1"
    report = fleet.health(NODE)
    assert not report.healthy and "persists after repair" in report.problems[0]


def test_permanent_xid_reappears_after_reboot(fleet: Fleet) -> None:
    fleet.inject(NODE, 2, "xid", 119, clears_on="never")
    fleet.reboot(NODE)
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 2) == "119"
    assert not fleet.health(NODE).healthy


def test_permanent_dbe_counts_again_after_reset(fleet: Fleet) -> None:
    fleet.inject(NODE, 2, "ecc-dbe", 1, clears_on="never")
    fleet.reset(NODE, 2)
    assert value(fleet, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2) == "1"
    assert value(fleet, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 2) == "2"


@pytest.mark.parametrize(
    ("temp", "healthy", "bits"), [(80, True, 0x1), (88, True, 0x21), (95, False, 0x69)]
)
def test_gpu_temperature(fleet: Fleet, temp: int, healthy: bool, bits: int) -> None:
    fleet.inject(NODE, 1, "gpu-temp", temp)
    assert value(fleet, "DCGM_FI_DEV_GPU_TEMP", 1) == str(temp)
    assert value(fleet, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 1) == str(bits)
    assert fleet.health(NODE).healthy is healthy


def test_temperature_survives_repairs_until_cleared(fleet: Fleet) -> None:
    fleet.inject(NODE, 1, "gpu-temp", 95)
    fleet.inject(NODE, 1, "memory-temp", 99)
    fleet.reset(NODE)
    fleet.reboot(NODE)
    assert value(fleet, "DCGM_FI_DEV_GPU_TEMP", 1) == "95"
    assert len(fleet.health(NODE).problems) == 2
    assert len(fleet.clear(NODE, 1)) == 2
    assert fleet.health(NODE).healthy
    assert int(value(fleet, "DCGM_FI_DEV_GPU_TEMP", 1) or 0) < 50


def test_thermal_slowdown_hw_fails_sw_passes(fleet: Fleet, clock: FakeClock) -> None:
    fleet.inject(NODE, 0, "thermal-slowdown", 0x20)
    assert fleet.health(NODE).healthy
    fleet.clear(NODE)
    fleet.assign(NODE, 0, "ml", "p", "c")
    fleet.inject(NODE, 0, "thermal-slowdown")
    assert not fleet.health(NODE).healthy
    assert int(value(fleet, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0) or 0) & 0x48 == 0x48
    assert value(fleet, "DCGM_FI_DEV_SM_CLOCK", 0) == "990"  # halved by HW slowdown
    clock.t += 2
    assert value(fleet, "DCGM_FI_DEV_THERMAL_VIOLATION", 0) == "2000000000"


def test_pcie_replays_accumulate_and_reset_on_reboot(fleet: Fleet, clock: FakeClock) -> None:
    fleet.inject(NODE, 3, "pcie-replay", 120)
    assert value(fleet, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 3) == "120"
    clock.t += 30
    assert value(fleet, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 3) == "180"
    fleet.reset(NODE, 3)  # a reset does not retrain the link
    assert not fleet.health(NODE).healthy
    fleet.reboot(NODE)
    assert value(fleet, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 3) == "0"
    assert fleet.health(NODE).healthy


def test_nvlink_errors_clear_on_reset(fleet: Fleet) -> None:
    fleet.inject(NODE, 3, "nvlink-errors", 5)
    assert value(fleet, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 3) == "5"
    assert not fleet.health(NODE).healthy
    fleet.reset(NODE, 3)
    assert value(fleet, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 3) == "0"
    assert fleet.health(NODE).healthy


def test_fallen_off_bus(fleet: Fleet) -> None:
    fleet.inject(NODE, 4, "fallen-off-bus")
    uuid = fleet.gpu(NODE, 4).uuid
    assert uuid not in render_node(fleet, NODE)
    result = fleet.reset(NODE, 4)
    assert not result.ok and "GPU 4" in result.reason
    fleet.reboot(NODE)
    assert uuid in render_node(fleet, NODE)


@pytest.mark.parametrize(
    ("action", "clears_on", "healthy"),
    [(1, "reset", False), (2, "reboot", False), (3, "reset", True)],
)
def test_recovery_action(fleet: Fleet, action: int, clears_on: str, healthy: bool) -> None:
    fault = fleet.inject(NODE, 0, "recovery-action", action)
    assert fault.clears_on == clears_on
    assert value(fleet, "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", 0) == str(action)
    assert fleet.health(NODE).healthy is healthy


def test_clear_leaves_stale_xid_until_exporter_restart(fleet: Fleet) -> None:
    fleet.inject(NODE, 1, "xid", 62)
    fleet.clear(NODE)
    assert fleet.health(NODE).healthy
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 1) == "62"  # dcgm-exporter issue #500
    fleet.set_exporter(NODE, "down")
    fleet.set_exporter(NODE, "up")
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 1) is None


def test_benign_xid_passes_health(fleet: Fleet) -> None:
    fleet.inject(NODE, 1, "xid", 13)
    assert fleet.health(NODE).healthy
    assert value(fleet, "DCGM_FI_DEV_XID_ERRORS", 1) == "13"


def test_reboot_drops_pod_labels(fleet: Fleet) -> None:
    fleet.assign(NODE, 0, "ml", "job", "c")
    fleet.reboot(NODE)
    assert 'pod="job"' not in render_node(fleet, NODE)


@pytest.mark.parametrize(
    ("kind", "val", "match"),
    [
        ("bogus", None, "valid kinds: xid, ecc-dbe"),
        ("xid", None, "needs a value"),
        ("xid", 0, "positive integer"),
        ("xid", -3, "positive integer"),
        ("xid", True, "must be an integer"),
        ("xid", "79", "must be an integer"),
        ("gpu-temp", 151, "between 0 and 150"),
        ("memory-temp", -1, "between 0 and 150"),
        ("recovery-action", 9, "0..7"),
        ("fallen-off-bus", 1, "takes no value"),
    ],
)
def test_invalid_faults(fleet: Fleet, kind: str, val: object, match: str) -> None:
    with pytest.raises(FaultError, match=match):
        fleet.inject(NODE, 0, kind, val)


def test_invalid_clears_on(fleet: Fleet) -> None:
    with pytest.raises(FaultError, match="reset, reboot, never"):
        fleet.inject(NODE, 0, "xid", 48, clears_on="sometimes")


def test_unknown_node_and_gpu(fleet: Fleet) -> None:
    with pytest.raises(UnknownNode, match=r"'nope'.*2 nodes"):
        fleet.health("nope")
    with pytest.raises(UnknownGpu, match="0-7"):
        fleet.inject(NODE, 8, "xid", 48)
