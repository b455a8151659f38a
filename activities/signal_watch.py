"""What each node's exporter can feed, and repeats of acknowledged XIDs, across observations.

Per worker process, like the counter rates (activities/counter_rates.py):

- **Blind rules.** One scrape can miss a series (an exporter mid-restart, a GPU whose XID
  series is not there yet), so a family counts as served when any reading of the node within
  ``max_age`` held it. A rule whose families were all absent over that time cannot fire on the
  node (policy/signals.py): the observation announces it (``SignalUnavailable``) and counts it
  (``gpu_remediate_signal_blind_nodes``).
- **Repeats of an acknowledged XID.** ``DCGM_FI_DEV_XID_ERRORS`` keeps its last value, so after
  we remediated XID 79 on a GPU the next XID 79 there looks like the old one. Where the exporter
  serves ``DCGM_EXP_XID_ERRORS_COUNT`` (occurrences in its sliding window), a rise of the count
  of the acknowledged XID between two readings of this process is a new occurrence: the
  acknowledgement no longer holds for that GPU. The first reading of a node in this process
  has no baseline, so it never counts as a repeat (a restart cannot invent one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policy.config import PolicySettings
from policy.models import NodeReadings
from policy.rules import gpu_key
from policy.signals import BlindSignal, blind_signals, fields_present


@dataclass(frozen=True)
class Repeat:
    """A new occurrence of the XID a GPU's acknowledgement covers."""

    gpu: str
    """``gpu_key`` of the GPU."""
    xid: int
    before: int
    after: int


@dataclass
class _Node:
    seen: dict[str, float] = field(default_factory=dict)
    """Family -> when a reading of the node last held it (monotonic seconds)."""
    counts: dict[str, dict[int, int]] = field(default_factory=dict)
    """GPU key -> the windowed XID counts at the last reading."""
    at: float = 0.0


class SignalWatch:
    """Per node: the families seen recently and the last windowed XID counts."""

    def __init__(self, *, max_age: float = 3600.0) -> None:
        if max_age <= 0:
            raise ValueError("max_age must be positive")
        self.max_age = max_age
        self._nodes: dict[str, _Node] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    def observe(self, reading: NodeReadings, config: PolicySettings, now: float,
                acknowledged: dict[str, int]) -> tuple[list[BlindSignal], list[Repeat]]:
        """The node's blind rules after this reading, and the acknowledged XIDs that came
        back since the last reading in this process."""
        node = self._nodes.setdefault(reading.node, _Node())
        first = not node.seen and not node.counts
        for family in fields_present(reading.gpus):
            node.seen[family] = now
        cutoff = now - self.max_age
        node.seen = {f: t for f, t in node.seen.items() if t >= cutoff}
        repeats: list[Repeat] = []
        counts: dict[str, dict[int, int]] = {}
        for gpu in reading.gpus:
            if gpu.xid_counts is None:
                continue
            key = gpu_key(gpu)
            counts[key] = dict(gpu.xid_counts)
            xid = acknowledged.get(key)
            if xid is None or first or key not in node.counts:
                continue
            before, after = node.counts[key].get(xid, 0), gpu.xid_counts.get(xid, 0)
            if after > before:
                repeats.append(Repeat(gpu=key, xid=xid, before=before, after=after))
        node.counts = counts
        node.at = now
        return blind_signals(set(node.seen), config), repeats

    def blind_of(self, node: str, config: PolicySettings, now: float) -> list[BlindSignal] | None:
        """The node's blind rules as of its readings in this process (for ``plan`` and
        ``status NODE``); None when this process has not read the node within ``max_age``."""
        state = self._nodes.get(node)
        if state is None or state.at < now - self.max_age:
            return None
        seen = {f for f, t in state.seen.items() if t >= now - self.max_age}
        return blind_signals(seen, config)

    def forget_older_than(self, now: float) -> None:
        """Drop nodes not read within ``max_age`` (gone from the fleet, another shard's)."""
        cutoff = now - self.max_age
        for name in [n for n, s in self._nodes.items() if s.at < cutoff]:
            del self._nodes[name]
