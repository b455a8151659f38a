"""The DCGM family table (policy/dcgm.py) holds together: every family fills a reading
field, every link counter belongs to a rate, and the GPU simulator exports what is read."""

from __future__ import annotations

import re
from datetime import timedelta

from activities import exposition
from activities.counter_rates import COUNTER_FIELDS
from activities.prometheus_source import PrometheusSource
from policy import dcgm
from policy.config import LinkPolicy, PolicySettings
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
    assert exposition.HEALTH_METRICS is dcgm.FIELD_OF
    links = LinkPolicy(pcie_replay_enabled=True, nvlink_enabled=True)
    source = PrometheusSource(url="http://prometheus.invalid",
                              policy=PolicySettings(links=links))
    queries = source.queries(timedelta(minutes=2))
    # Every family is read by a query of its own ("present" only lists them all, to see which
    # nodes have series); a name only as a prefix of a longer one does not count.
    promql = " ".join(q for name, (q, _) in queries.items() if name != "present")
    assert [m for m in dcgm.FIELD_OF if not re.search(rf"\b{m}\b", promql)] == []


def test_the_gpu_simulator_exports_every_family_but_the_legacy_clock_name() -> None:
    exported = {f.name for f in simulated.FAMILIES} | {simulated.XID_COUNT.name}
    assert set(dcgm.FIELD_OF) - exported == {dcgm.CLOCK_THROTTLE}
