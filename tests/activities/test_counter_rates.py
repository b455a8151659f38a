"""Link counters into rates: two readings of a GPU; nothing where two readings cannot tell."""

from __future__ import annotations

import pytest

from activities.counter_rates import CounterRates
from policy.models import GpuReading, NodeReadings


def reading(node: str = "n1", **gpus: dict[str, float]) -> NodeReadings:
    return NodeReadings(node=node, gpus=[GpuReading(gpu=i, uuid=f"GPU-{i}", **f)  # type: ignore[arg-type]
                                         for i, f in gpus.items()])


def rate(r: NodeReadings, field: str, gpu: int = 0) -> float | None:
    value: float | None = getattr(r.gpus[gpu], field)
    return value


def test_the_first_reading_has_no_rate_and_the_second_has_one() -> None:
    rates = CounterRates()
    first = rates.apply(reading(**{"0": {"pcie_replay_total": 1000.0}}), now=100.0)
    assert rate(first, "pcie_replays_per_minute") is None, "a total alone says nothing"
    second = rates.apply(reading(**{"0": {"pcie_replay_total": 1030.0}}), now=130.0)
    assert rate(second, "pcie_replays_per_minute") == pytest.approx(60.0)


def test_nvlink_families_are_summed_and_all_must_be_there() -> None:
    rates = CounterRates()
    rates.apply(reading(**{"0": {"nvlink_crc_flit_total": 10.0, "nvlink_crc_data_total": 5.0,
                                 "nvlink_replay_total": 1.0}}), now=0.0)
    r = rates.apply(reading(**{"0": {"nvlink_crc_flit_total": 1010.0,
                                     "nvlink_crc_data_total": 1005.0,
                                     "nvlink_replay_total": 2.0,
                                     "nvlink_recovery_total": 0.0}}), now=20.0)
    assert rate(r, "nvlink_crc_errors_per_second") == pytest.approx(100.0)
    assert rate(r, "nvlink_errors_per_minute") is None, "recovery was not in the first reading"


def test_a_counter_that_went_down_is_a_driver_reload_not_a_rate() -> None:
    rates = CounterRates()
    rates.apply(reading(**{"0": {"pcie_replay_total": 500.0}}), now=0.0)
    after_reset = rates.apply(reading(**{"0": {"pcie_replay_total": 3.0}}), now=60.0)
    assert rate(after_reset, "pcie_replays_per_minute") is None
    later = rates.apply(reading(**{"0": {"pcie_replay_total": 5.0}}), now=120.0)
    assert rate(later, "pcie_replays_per_minute") == pytest.approx(2.0), "the new baseline"


def test_a_reading_too_soon_keeps_the_older_baseline_and_a_stale_one_starts_over() -> None:
    rates = CounterRates(min_interval=10.0, max_age=600.0)
    rates.apply(reading(**{"0": {"pcie_replay_total": 0.0}}), now=0.0)
    soon = rates.apply(reading(**{"0": {"pcie_replay_total": 50.0}}), now=2.0)
    assert rate(soon, "pcie_replays_per_minute") is None
    r = rates.apply(reading(**{"0": {"pcie_replay_total": 60.0}}), now=30.0)
    assert rate(r, "pcie_replays_per_minute") == pytest.approx(120.0), "measured from t=0"
    stale = rates.apply(reading(**{"0": {"pcie_replay_total": 70.0}}), now=1000.0)
    assert rate(stale, "pcie_replays_per_minute") is None


def test_gpus_are_matched_by_uuid_and_forgotten_nodes_free_their_memory() -> None:
    rates = CounterRates(max_age=600.0)
    rates.apply(reading(**{"0": {"pcie_replay_total": 0.0}, "1": {"pcie_replay_total": 0.0}}),
                now=0.0)
    # GPU 1 fell off the bus: GPU 0 still gets its rate, nothing is mixed up.
    r = rates.apply(reading(**{"0": {"pcie_replay_total": 10.0}}), now=60.0)
    assert rate(r, "pcie_replays_per_minute") == pytest.approx(10.0)
    rates.apply(reading("n2", **{"0": {"pcie_replay_total": 0.0}}), now=500.0)
    rates.forget_older_than(now=700.0)
    assert len(rates) == 1, "n1 (last read at 60) is gone, n2 stays"


def test_a_rate_the_source_already_knows_is_kept() -> None:
    rates = CounterRates()
    rates.apply(reading(**{"0": {"pcie_replay_total": 0.0}}), now=0.0)
    r = rates.apply(reading(**{"0": {"pcie_replay_total": 600.0,
                                     "pcie_replays_per_minute": 1.0}}), now=60.0)
    assert rate(r, "pcie_replays_per_minute") == 1.0
