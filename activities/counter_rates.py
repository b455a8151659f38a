"""Link counters into rates: two readings of one GPU, some seconds apart.

dcgm-exporter shows PCIe replays and NVLink errors as totals since the driver loaded, and a
total says nothing alone (a year-old node has replays). The policy judges rates
(policy.config.LinkPolicy), so the observer keeps each GPU's last totals, per worker process,
and fills the reading's rate fields from the difference. What it cannot know it leaves ``None``
(absent is never evidence): the first reading of a node in this process, a reading closer to
the last than ``min_interval`` (a single-node read right after the fleet's), one older than
``max_age``, and a counter that went down (the driver reloaded: a reset, a reboot).
The Prometheus source needs none of this: its ``rate()`` fills the same fields.
"""

from __future__ import annotations

from policy.dcgm import RATES
from policy.models import GpuReading, NodeReadings
from policy.rules import gpu_key, usable

COUNTER_FIELDS = tuple(dict.fromkeys(f for r in RATES for f in r.totals))


class CounterRates:
    """The last totals per node and GPU, and when they were read (monotonic seconds)."""

    def __init__(self, *, min_interval: float = 10.0, max_age: float = 1800.0) -> None:
        if not 0 < min_interval < max_age:
            raise ValueError("need 0 < min_interval < max_age")
        self.min_interval = min_interval
        self.max_age = max_age
        self._last: dict[str, tuple[float, dict[str, dict[str, float]]]] = {}

    def __len__(self) -> int:
        return len(self._last)

    def apply(self, reading: NodeReadings, now: float) -> NodeReadings:
        """``reading`` with the rate fields filled where two readings allow it; remembers its
        totals as the next baseline (unless it came too soon after the last one)."""
        totals = {gpu_key(g): _totals(g) for g in reading.gpus}
        if not any(totals.values()):
            self._last.pop(reading.node, None)
            return reading
        last = self._last.get(reading.node)
        if last is not None and now - last[0] < self.min_interval:
            return reading  # too close to measure; the older baseline stays
        self._last[reading.node] = (now, totals)
        if last is None or now - last[0] > self.max_age:
            return reading
        dt = now - last[0]
        gpus = []
        for g in reading.gpus:
            before, after = last[1].get(gpu_key(g), {}), totals[gpu_key(g)]
            update: dict[str, float] = {}
            for rate in RATES:
                if getattr(g, rate.field) is not None:
                    continue  # a source that knows the rate itself
                if not all(f in before and f in after for f in rate.totals):
                    continue
                deltas = [after[f] - before[f] for f in rate.totals]
                if any(d < 0 for d in deltas):
                    continue  # a counter reset: no rate this time
                update[rate.field] = sum(deltas) / dt * rate.per_seconds
            gpus.append(g.model_copy(update=update) if update else g)
        return reading.model_copy(update={"gpus": gpus})

    def forget_older_than(self, now: float) -> None:
        """Drop nodes not read within ``max_age`` (gone from the fleet, another shard's)."""
        cutoff = now - self.max_age
        for node in [n for n, (t, _) in self._last.items() if t < cutoff]:
            del self._last[node]


def _totals(gpu: GpuReading) -> dict[str, float]:
    out = {}
    for f in COUNTER_FIELDS:
        value = usable(getattr(gpu, f))
        if value is not None and value >= 0:
            out[f] = value
    return out
