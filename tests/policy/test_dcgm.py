"""The DCGM family table (policy/dcgm.py) holds together: every family fills a reading
field, every link counter belongs to a rate, and the GPU simulator exports what is read."""

from __future__ import annotations

from activities import exposition, prometheus_source
from activities.counter_rates import COUNTER_FIELDS
from policy import dcgm
from policy.models import GpuReading
from sim.gpu import exposition as simulated


def test_every_family_fills_a_reading_field_and_names_one_metric() -> None:
    fields = set(GpuReading.model_fields)
    assert {f.field for f in dcgm.FAMILIES} <= fields
    assert len({f.metric for f in dcgm.FAMILIES}) == len(dcgm.FAMILIES)


def test_every_counter_is_summed_into_exactly_one_rate_and_nothing_else_is() -> None:
    counters = [f.metric for f in dcgm.read_as("counter")]
    summed = [m for r in dcgm.RATES for m in r.families]
    assert sorted(summed) == sorted(counters)
    assert {r.field for r in dcgm.RATES} <= set(GpuReading.model_fields)
    assert tuple(f.field for f in dcgm.read_as("counter")) == COUNTER_FIELDS


def test_the_parser_and_the_prometheus_source_read_the_table() -> None:
    assert exposition.HEALTH_METRICS == dcgm.FIELD_OF
    queried = {*prometheus_source.LAST_VALUE_METRICS, *prometheus_source.CLOCK_METRICS,
               prometheus_source.XID_METRIC, prometheus_source.XID_COUNT_METRIC,
               *(m for fams, _, _ in prometheus_source.RATE_METRICS.values() for m in fams),
               *(f.metric for f in dcgm.read_as("held"))}
    assert queried == set(dcgm.FIELD_OF)


def test_the_gpu_simulator_exports_every_family_but_the_legacy_clock_name() -> None:
    exported = {f.name for f in simulated.FAMILIES} | {simulated.XID_COUNT.name}
    assert set(dcgm.FIELD_OF) - exported == {dcgm.CLOCK_THROTTLE}
