"""Read the fleet's DCGM health from Prometheus instead of scraping each dcgm-exporter.

Many clusters already have Prometheus scraping dcgm-exporter. ``PrometheusSource.read`` asks it a
small, fixed set of fleet-wide instant queries (one per signal, run concurrently, never one per
node) over the HTTP API and folds the answers into the same ``NodeReadings`` the direct scrape
path produces, so ``policy.rules.evaluate_node`` judges both alike.

What Prometheus adds over a single scrape is history, and the queries use it:

- XID: the gauge holds only the *last* XID, so an XID that came and went between two detector
  ticks (replaced by another XID, or reset by an exporter restart) is invisible to a scrape. The
  raw samples of ``DCGM_FI_DEV_XID_ERRORS[window]`` show every value the gauge took; the reading
  gets the most severe one (by the policy's XID table), the others stay visible in
  ``PrometheusRead.xids_seen`` and in the log.
- Temperatures: ``min_over_time(...[thermal_hold])``: a GPU is hot only if it stayed hot for the
  whole hold, so a spike shorter than the hold is not a thermal event.
- Clock-event reasons are a bitmask, so ``max``/``min`` over time mean nothing; the raw samples
  are fetched and combined bit by bit (see ``ClockMode``).
- The other fields (ECC DBE/SBE volatile, row remap pending/failure, uncorrectable remapped rows,
  recovery action) take their last value in the window, as a scrape would.

Fail closed: a node without current series in Prometheus is an error for that node (never a
healthy or sick verdict), and a Prometheus that cannot answer every query cleanly (unreachable,
HTTP error, invalid JSON, ``status: error``, an answer of the wrong shape) makes every node an
error. Garbage values (NaN, infinities, DCGM sentinels, negatives) are "no data", never a fault.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import httpx

from activities.exposition import (
    MAX_GPU_INDEX_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_XID,
    ascii_int,
    xid_label,
)
from policy import dcgm
from policy.config import PolicySettings
from policy.models import SEVERITY, GpuReading, NodeReadings
from policy.rules import usable

log = logging.getLogger(__name__)

DEFAULT_NODE_LABELS: tuple[str, ...] = ("instance",)
"""The label that names the Kubernetes node of a series: one Prometheus attaches to the scrape
target, never one the exporter writes about itself.

``instance`` is always a target label; the dcgm-exporter ServiceMonitor of the GPU Operator
(and the dcgm-exporter chart's documented relabelling) set it from
``__meta_kubernetes_pod_node_name``. With ``honorLabels: false`` (the ServiceMonitor default)
an exporter that writes its own ``instance`` sees it renamed ``exported_instance``, so one
compromised exporter cannot speak for another node. Without that relabelling ``instance`` is
``<pod IP>:9400``, no node matches, and every node is an error (fail closed)."""

EXPORTER_LABELS = frozenset({"Hostname", "hostname"})
"""Labels the exporter writes about itself: refused as node labels."""

ClockMode = Literal["held", "seen"]
"""How clock-event-reason samples become the reading's one bitmask.

``held`` (default): a bit counts only if it was set in every sample over ``thermal_hold``, the
same "stayed hot" rule the temperatures follow (the reasons the policy reads are all thermal or
power-brake ones, and a hot spike sets them too). ``seen``: OR of every sample in the window, so
a single sample with a bit set is enough."""

_UUID_LABELS = ("UUID", "uuid", "gpu_uuid")
_MODEL_LABELS = ("modelName", "model_name")
_IDENTITY_LABELS = ("gpu", *_UUID_LABELS, *_MODEL_LABELS, "pci_bus_id")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MAX_BODY_EXCERPT = 200


class PrometheusError(Exception):
    """Prometheus did not answer a query cleanly; every node of the read is an error."""


@dataclass
class PrometheusRead:
    """Everything one ``read_detailed`` learned, beyond the ``(readings, errors)`` pair."""

    readings: dict[str, NodeReadings] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    xids_seen: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """node -> GPU key (UUID, or ``index:N``) -> every distinct non-zero XID the gauge showed in
    the window, oldest first. The reading carries only the most severe one."""
    clock_reasons_seen: dict[str, dict[str, int]] = field(default_factory=dict)
    """node -> GPU key -> OR of every clock-event-reason sample in the window (for visibility
    when the reading holds the ``held`` mask)."""
    warnings: list[str] = field(default_factory=list)
    """Prometheus' own warnings (partial results), deduplicated."""


# --- small helpers ----------------------------------------------------------------------------


def promql_duration(span: timedelta) -> str:
    """A positive ``timedelta`` as a PromQL duration: ``300s``, ``1500ms``."""
    ms = round(span.total_seconds() * 1000)
    if ms <= 0:
        raise ValueError(f"a PromQL duration must be positive, got {span}")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _name_regex(names: Sequence[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names))


def node_of(labels: Mapping[str, str], wanted: set[str], candidates: Sequence[str]) -> str | None:
    """The requested node a series belongs to: the first candidate label whose value is one of
    ``wanted``. Checking every candidate (not just the first present) matters because without
    ``hostNetwork`` the exporter's ``Hostname`` is its pod name, while a relabelled ``node`` label
    holds the real node name."""
    for name in candidates:
        value = labels.get(name)
        if value and value in wanted:
            return value
    return None


def _gpu_identity(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """``(index, uuid)`` of a GPU series; None for non-GPU entities (NVSwitch, CPU)."""
    index = labels.get("gpu", "")
    uuid = next((labels[k] for k in _UUID_LABELS if labels.get(k)), "")
    if not index and not uuid:
        return None
    return index, uuid


def _malformed(labels: Mapping[str, str]) -> str | None:
    """Why a series' identity labels are not what an exporter writes, or None: the same rules
    as the scrape path (activities/exposition.py)."""
    for name in (*_IDENTITY_LABELS, "xid"):
        if len(labels.get(name, "")) > MAX_LABEL_VALUE_CHARS:
            return f"label {name} longer than {MAX_LABEL_VALUE_CHARS} characters"
    index = labels.get("gpu", "")
    if index and ascii_int(index, max_chars=MAX_GPU_INDEX_CHARS) is None:
        return f"gpu label {index[:20]!r} is not a GPU index (ASCII digits)"
    raw_xid = labels.get("xid")
    if raw_xid and xid_label(raw_xid) is None:
        return f"xid label {raw_xid[:20]!r} is not an XID (1..{MAX_XID})"
    return None


def _key(index: str, uuid: str) -> str:
    # Same keying as policy.rules.gpu_key: the UUID survives re-enumeration.
    return uuid or f"index:{index}"


def _number(raw: Any) -> float:
    """A sample value as Prometheus' JSON writes it (a string: "42", "NaN", "+Inf")."""
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):
        raise PrometheusError(f"sample value is not a number: {raw!r:.60}")
    try:
        return float(raw)
    except ValueError as err:
        raise PrometheusError(f"sample value is not a number: {raw!r:.60}") from err


def _pair(raw: Any) -> tuple[float, float]:
    """``[timestamp, "value"]`` -> ``(timestamp, value)``."""
    if not isinstance(raw, list) or len(raw) != 2:
        raise PrometheusError(f"sample is not a [time, value] pair: {raw!r:.60}")
    ts = _number(raw[0])
    if not math.isfinite(ts):
        raise PrometheusError(f"sample timestamp is not finite: {raw!r:.60}")
    return ts, _number(raw[1])


def _clean(value: float) -> float | None:
    """No data for NaN, infinities, DCGM sentinels and negatives (no health field is negative)."""
    number = usable(value)
    if number is None or number < 0:
        return None
    return number


# --- parsed query results ---------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One series of a query answer: its labels and its samples (one for a vector)."""

    labels: dict[str, str]
    samples: list[tuple[float, float]]


def parse_result(
    body: Any, expected: Literal["vector", "matrix"]
) -> tuple[list[Series], list[str]]:
    """The ``data.result`` of a successful API answer, strictly checked, and its warnings.

    Raises ``PrometheusError`` for ``status: error`` and for anything that is not the shape the
    HTTP API documents: an answer we cannot read is an error of the source, not "no series".
    """
    if not isinstance(body, dict):
        raise PrometheusError("answer is not a JSON object")
    warnings = body.get("warnings") or []
    if not isinstance(warnings, list):
        warnings = [str(warnings)]
    status = body.get("status")
    if status == "error":
        raise PrometheusError(
            f"query failed: {body.get('errorType', 'error')}: {body.get('error', '(no message)')}"
        )
    if status != "success":
        raise PrometheusError(f"answer has status {status!r}, not 'success'")
    data = body.get("data")
    if not isinstance(data, dict):
        raise PrometheusError("answer has no data object")
    kind = data.get("resultType")
    if kind != expected:
        raise PrometheusError(f"expected a {expected} result, got {kind!r}")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError("answer has no result list")
    series: list[Series] = []
    for item in result:
        if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
            raise PrometheusError("result item has no metric labels")
        labels = {str(k): str(v) for k, v in item["metric"].items()}
        if expected == "vector":
            if "value" not in item:
                # A native-histogram sample ("histogram"): no health family is one.
                continue
            samples = [_pair(item["value"])]
        else:
            raw = item.get("values", [])
            if not isinstance(raw, list):
                raise PrometheusError("matrix series has no values list")
            samples = [_pair(p) for p in raw]
        series.append(Series(labels, samples))
    return series, [str(w) for w in warnings]


# --- folding answers into readings ------------------------------------------------------------


@dataclass
class _Gpu:
    index: str
    uuid: str
    model_name: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    values: dict[str, float | int] = field(default_factory=dict)
    xids: dict[int, float] = field(default_factory=dict)  # xid -> last time seen
    xid_first: dict[int, float] = field(default_factory=dict)  # xid -> first time seen
    xid_gauge: bool = False  # an XID series existed (value 0 included)
    clock_held: int | None = None
    clock_seen: int | None = None
    xid_counts: dict[int, int] | None = None  # DCGM_EXP_XID_ERRORS_COUNT, when exported


@dataclass
class QueryResults:
    """The parsed answers of one read, keyed by what they are (see ``PrometheusSource``)."""

    present: list[Series] = field(default_factory=list)
    xid: list[Series] = field(default_factory=list)
    clocks: list[Series] = field(default_factory=list)
    gpu_temp: list[Series] = field(default_factory=list)
    memory_temp: list[Series] = field(default_factory=list)
    last: dict[str, list[Series]] = field(default_factory=dict)  # GpuReading field -> series
    xid_count: list[Series] = field(default_factory=list)


def xid_severity(xid: int, config: PolicySettings) -> int:
    """How bad an XID is by the policy's table (overrides applied): ``SEVERITY`` of its action."""
    row = config.xid_rule(xid)
    action = row.action if row is not None else config.unknown_xid_action
    return SEVERITY[action]


def choose_xid(
    seen: Mapping[int, float], config: PolicySettings, acknowledged: int | None = None
) -> int:
    """The one XID a reading carries when the gauge showed several in the window.

    The most severe by the policy table; among equals the most recent. A value already
    acknowledged (remediated) for this GPU is chosen only when nothing else was seen, so an old,
    handled XID still in the window cannot hide a new one."""
    fresh = {x: t for x, t in seen.items() if x != acknowledged} or dict(seen)
    return max(fresh, key=lambda x: (xid_severity(x, config), fresh[x], x))


def _held_mask(samples: list[tuple[float, float]], now: float, hold_s: float) -> int | None:
    """Bits set in every sample of the hold ``[now - hold_s, now]``: the bit-wise counterpart of
    ``min_over_time(...[hold])`` on the temperatures. None when the series does not reach back to
    the start of the hold (like the temperature query's ``offset`` check) or has no sample in it.
    """
    values = [(t, int(v)) for t, raw in samples if (v := _clean(raw)) is not None]
    if not values:
        return None
    if hold_s <= 0:
        return values[-1][1]
    start = now - hold_s
    if values[0][0] > start:
        return None
    inside = [v for t, v in values if t >= start]
    if not inside:
        return None
    mask = inside[0]
    for v in inside[1:]:
        mask &= v
    return mask


def assemble_readings(
    results: QueryResults,
    nodes: Sequence[str],
    *,
    node_labels: Sequence[str] = DEFAULT_NODE_LABELS,
    now: float,
    thermal_hold: timedelta,
    clock_mode: ClockMode = "held",
    policy: PolicySettings | None = None,
    acknowledged_by_node: Mapping[str, Mapping[str, int]] | None = None,
) -> PrometheusRead:
    """Fold parsed query answers into one ``NodeReadings`` per requested node (pure, no I/O).

    A node is readable only when the instant ``present`` query (which honours Prometheus'
    staleness markers) holds at least one of its GPU series; otherwise it is an error, worded
    differently when the window still holds older series (exporter down or target dropped).
    """
    config = policy or PolicySettings()
    # Keyed by (node, GPU UUID), never by UUID alone: one node's acknowledgement (its
    # record, or a forged annotation) must not hide another node's XID.
    acked = acknowledged_by_node or {}
    wanted = set(nodes)
    out = PrometheusRead()
    gpus: dict[str, dict[str, _Gpu]] = {}
    fresh: set[str] = set()
    malformed: dict[str, str] = {}
    unlabelled = 0

    def gpu_for(series: Series) -> tuple[str, _Gpu] | None:
        nonlocal unlabelled
        node = node_of(series.labels, wanted, node_labels)
        if node is None:
            if not any(series.labels.get(name) for name in node_labels):
                unlabelled += 1
            return None
        problem = _malformed(series.labels)
        if problem is not None:
            # Judged on no series of a node whose exporter writes garbage (as a scrape).
            malformed.setdefault(node, problem)
            return None
        ident = _gpu_identity(series.labels)
        if ident is None:
            return None
        index, uuid = ident
        per_node = gpus.setdefault(node, {})
        gpu = per_node.get(_key(index, uuid))
        if gpu is None:
            gpu = per_node[_key(index, uuid)] = _Gpu(index=index, uuid=uuid)
        if not gpu.model_name:
            gpu.model_name = next(
                (series.labels[k] for k in _MODEL_LABELS if series.labels.get(k)), ""
            )
        if not gpu.pci_bus_id:
            gpu.pci_bus_id = series.labels.get("pci_bus_id", "")
        if not gpu.serial:
            # The exporter's label field, kept by Prometheus as a target label; exporter
            # text, so one no exporter writes is not kept.
            serial = series.labels.get("DCGM_FI_DEV_SERIAL", "")
            gpu.serial = serial if len(serial) <= 64 else ""
        return node, gpu

    def put(gpu: _Gpu, name: str, value: float | None, *, integer: bool = False) -> None:
        if value is None:
            return
        new: float | int = int(value) if integer else value
        old = gpu.values.get(name)
        # Duplicate series of one GPU (per-pod copies, two scrape jobs) should agree; if they
        # do not, the worse reading is kept, as the direct scrape path does.
        gpu.values[name] = new if old is None else max(old, new)

    def whole(node: str, name: str, raw: Any, value: float | None) -> bool:
        """A count, flag or bit mask with a fraction is a malformed reading (the same rule as
        the direct scrape, activities/exposition.py): the node is an error, never a verdict."""
        if value is None or value.is_integer():
            return True
        malformed.setdefault(node, f"{name} value {raw!r:.40} is not a whole number "
                                   "(a count or flag)")
        return False

    for series in results.present:
        found = gpu_for(series)
        if found is not None:
            fresh.add(found[0])

    for series in results.xid:
        found = gpu_for(series)
        if found is None:
            continue
        gpu = found[1]
        gpu.xid_gauge = True
        for ts, raw in series.samples:
            value = _clean(raw)
            if value is not None and (not value.is_integer() or value > MAX_XID):
                malformed.setdefault(found[0], f"XID value {raw!r:.40} is not an integer in "
                                               f"0..{MAX_XID}")
                continue
            if value is None or value < 1:
                continue
            xid = int(value)
            gpu.xids[xid] = max(gpu.xids.get(xid, ts), ts)
            gpu.xid_first[xid] = min(gpu.xid_first.get(xid, ts), ts)

    hold_s = thermal_hold.total_seconds()
    for series in results.clocks:
        found = gpu_for(series)
        if found is None:
            continue
        _, gpu = found
        seen = 0
        any_value = False
        for _, raw in series.samples:
            value = _clean(raw)
            if value is not None and whole(found[0], "clock_event_reasons", raw, value):
                seen |= int(value)
                any_value = True
        if any_value:
            gpu.clock_seen = seen | (gpu.clock_seen or 0)
        held = _held_mask(series.samples, now, hold_s)
        if held is not None:
            gpu.clock_held = held | (gpu.clock_held or 0)

    for name, group in (("gpu_temp", results.gpu_temp), ("memory_temp", results.memory_temp)):
        for series in group:
            found = gpu_for(series)
            if found is not None and series.samples:
                put(found[1], name, _clean(series.samples[-1][1]))

    for name, group in results.last.items():
        for series in group:
            found = gpu_for(series)
            if found is not None and series.samples:
                value = _clean(series.samples[-1][1])
                if name in dcgm.INTEGRAL_FIELDS and not whole(
                        found[0], name, series.samples[-1][1], value):
                    continue
                put(found[1], name, value, integer=name == "recovery_action")

    for series in results.xid_count:
        found = gpu_for(series)
        if found is None or not series.samples:
            continue
        gpu = found[1]
        counts = gpu.xid_counts if gpu.xid_counts is not None else {}
        gpu.xid_counts = counts
        count_xid = xid_label(series.labels.get("xid"))
        count = _clean(series.samples[-1][1])
        if not whole(found[0], "xid_counts", series.samples[-1][1], count):
            continue
        # The exporter's "none in the window" series has no xid label and value 0.
        if count_xid is not None and count is not None and count >= 1:
            counts[count_xid] = max(counts.get(count_xid, 0), int(count))

    if unlabelled:
        log.warning(
            "%d DCGM series in Prometheus carry none of the node labels %s",
            unlabelled,
            ", ".join(node_labels),
        )

    for node in nodes:
        per_node = gpus.get(node, {})
        if node in malformed:
            out.errors[node] = f"malformed DCGM series in Prometheus for node {node}: " \
                               f"{malformed[node]}"
            continue
        if node not in fresh:
            if per_node:
                out.errors[node] = (
                    f"DCGM series in Prometheus for node {node} are stale "
                    "(exporter down or no longer scraped)"
                )
            else:
                out.errors[node] = f"no DCGM series in Prometheus for node {node}"
            continue
        readings: list[GpuReading] = []
        for key, gpu in per_node.items():
            fields: dict[str, Any] = dict(gpu.values)
            if gpu.xids:
                chosen = choose_xid(gpu.xids, config, (acked.get(node) or {}).get(key))
                fields["xid"] = chosen
                ordered = sorted(gpu.xids, key=lambda x: (gpu.xid_first[x], x))
                out.xids_seen.setdefault(node, {})[key] = ordered
                if len(ordered) > 1:
                    log.info(
                        "node %s GPU %s: XIDs %s in the window; the reading carries %d",
                        node,
                        key,
                        ordered,
                        chosen,
                    )
            elif gpu.xid_gauge:
                fields["xid"] = 0
            mask = gpu.clock_held if clock_mode == "held" else gpu.clock_seen
            if mask is not None:
                fields["clock_event_reasons"] = mask
            if gpu.clock_seen is not None:
                out.clock_reasons_seen.setdefault(node, {})[key] = gpu.clock_seen
            if gpu.xid_counts is not None:
                fields["xid_counts"] = gpu.xid_counts
            readings.append(
                GpuReading(
                    gpu=gpu.index,
                    uuid=gpu.uuid,
                    model_name=gpu.model_name,
                    pci_bus_id=gpu.pci_bus_id,
                    serial=gpu.serial,
                    **fields,
                )
            )
        readings.sort(key=lambda g: (int(g.gpu) if g.gpu.isdecimal() else 1 << 30, g.gpu, g.uuid))
        out.readings[node] = NodeReadings(node=node, gpus=readings)
    return out


# --- the source -------------------------------------------------------------------------------


class PrometheusSource:
    """DCGM health of many nodes from a Prometheus that scrapes dcgm-exporter.

    ``url`` is the server's base URL (``http://prometheus:9090``, or with a path prefix such
    as ``https://thanos.example/prometheus``); ``/api/v1/query`` is appended. ``window`` is how far
    back XIDs and clock-event reasons are looked for and how old a last value may be.
    ``node_label`` names the label (or candidate labels, in order) that holds the node name: a
    label Prometheus attaches to the target (see ``DEFAULT_NODE_LABELS``); the exporter's own
    ``Hostname``/``hostname`` are refused.
    ``headers`` go with every request (``{"Authorization": "Bearer …"}``); ``verify_tls`` is
    httpx' ``verify`` (False, or a CA bundle path). ``policy`` ranks XIDs when the window holds
    several (default table when None). ``clock_mode`` see ``ClockMode``.
    """

    def __init__(
        self,
        *,
        url: str,
        window: timedelta = timedelta(minutes=5),
        timeout_seconds: float = 10.0,
        node_label: str | Sequence[str] = DEFAULT_NODE_LABELS,
        headers: Mapping[str, str] | None = None,
        verify_tls: bool | str = True,
        policy: PolicySettings | None = None,
        clock_mode: ClockMode = "held",
    ) -> None:
        if window.total_seconds() <= 0:
            raise ValueError(f"window must be positive, got {window}")
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        labels = (node_label,) if isinstance(node_label, str) else tuple(node_label)
        if not labels:
            raise ValueError("node_label needs at least one label name")
        bad = [name for name in labels if not _LABEL_NAME_RE.fullmatch(name)]
        if bad:
            raise ValueError(f"node_label holds invalid Prometheus label names: {bad}")
        own = sorted(EXPORTER_LABELS.intersection(labels))
        if own:
            raise ValueError(
                f"node_label {own} is written by the exporter itself, so one exporter could "
                "name another node; use a label Prometheus attaches to the target "
                "(default: instance, relabelled from __meta_kubernetes_pod_node_name)")
        if clock_mode not in ("held", "seen"):
            raise ValueError(f"clock_mode must be 'held' or 'seen', got {clock_mode!r}")
        self.url = url.rstrip("/")
        self.window = window
        self.timeout_seconds = timeout_seconds
        self.node_labels: tuple[str, ...] = labels
        self.headers = dict(headers or {})
        self.verify_tls = verify_tls
        self.policy = policy or PolicySettings()
        self.clock_mode: ClockMode = clock_mode

    # ------------------------------------------------------------ queries

    @property
    def _by(self) -> str:
        names = dict.fromkeys([*_IDENTITY_LABELS, *self.node_labels])
        return ", ".join(names)

    def queries(
        self, thermal_hold: timedelta
    ) -> dict[str, tuple[str, Literal["vector", "matrix"]]]:
        """Every query one read runs: name -> (PromQL, expected result type)."""
        window = promql_duration(self.window)
        by = self._by
        health = _name_regex(list(dcgm.FIELD_OF))
        clocks = _name_regex([f.metric for f in dcgm.read_as("clock")])
        clock_range = promql_duration(max(self.window, thermal_hold * 2))

        def held(metric: str) -> str:
            if thermal_hold.total_seconds() <= 0:
                return f"max by ({by}) (last_over_time({metric}[{window}]))"
            hold = promql_duration(thermal_hold)
            # min over the hold = "stayed at least this hot"; the `and ... offset` drops series
            # that did not exist when the hold began, whose min covers only part of it.
            return f"max by ({by}) (min_over_time({metric}[{hold}]) and {metric} offset {hold})"

        out: dict[str, tuple[str, Literal["vector", "matrix"]]] = {
            # Instant selector: honours staleness markers, so a dead exporter's node drops out.
            "present": (f'count by ({by}) ({{__name__=~"{health}"}})', "vector"),
            # Raw samples (an instant query of a range selector returns a matrix).
            "xid": (f"{dcgm.XID}[{window}]", "matrix"),
            "clocks": (f'{{__name__=~"{clocks}"}}[{clock_range}]', "matrix"),
        }
        # How each family is read is the table's (policy/dcgm.py, ``Read``).
        for family in dcgm.read_as("held"):
            out[family.field] = (held(family.metric), "vector")
        for family in dcgm.read_as("last"):
            out[f"last:{family.field}"] = (
                f"max by ({by}) (last_over_time({family.metric}[{window}]))", "vector")
        links = self.policy.links
        wanted = {"pcie": links.pcie_replay_enabled, "nvlink": links.nvlink_enabled}
        for rate in dcgm.RATES:
            if wanted[rate.rule]:
                # max by GPU first (duplicate series of one GPU must not add up), then the
                # families added; a GPU missing one of them gets no rate (not evidence).
                summed = " + ".join(f"max by ({by}) (rate({f}[{window}]))"
                                    for f in rate.families)
                out[f"last:{rate.field}"] = (f"({summed}) * {rate.per_seconds:g}", "vector")
        # Opt-in exporter family (occurrences per XID in its own sliding window): the last
        # value per XID, which the detector compares with the previous tick's.
        out["xid_count"] = (
            f"max by ({by}, xid) (last_over_time({dcgm.XID_COUNT}[{window}]))", "vector")
        return out

    async def _query(
        self,
        http: httpx.AsyncClient,
        promql: str,
        at: float,
        expected: Literal["vector", "matrix"],
    ) -> tuple[list[Series], list[str]]:
        form = {"query": promql, "time": f"{at:.3f}", "timeout": f"{self.timeout_seconds:g}s"}
        try:
            response = await http.post(f"{self.url}/api/v1/query", data=form)
        except httpx.TimeoutException as err:
            raise PrometheusError(f"timed out after {self.timeout_seconds:g}s") from err
        except httpx.HTTPError as err:
            raise PrometheusError(f"unreachable: {type(err).__name__}: {err}") from err
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200:
            detail = ""
            if isinstance(body, dict) and body.get("status") == "error":
                detail = f": {body.get('errorType', 'error')}: {body.get('error', '')}"
            else:
                text = response.text.strip().replace("\n", " ")[:_MAX_BODY_EXCERPT]
                detail = f": {text}" if text else ""
            raise PrometheusError(f"HTTP {response.status_code}{detail}")
        if body is None:
            raise PrometheusError("answer is not valid JSON")
        return parse_result(body, expected)

    # ------------------------------------------------------------ reading

    async def read_detailed(
        self,
        nodes: list[str],
        *,
        thermal_hold: timedelta,
        acknowledged_by_node: Mapping[str, Mapping[str, int]] | None = None,
    ) -> PrometheusRead:
        """``read`` with the side information (every XID seen, clock reasons seen, warnings)."""
        if not nodes:
            return PrometheusRead()
        now = time.time()
        queries = self.queries(thermal_hold)
        timeout = httpx.Timeout(self.timeout_seconds)
        try:
            # No redirects (httpx' default, said here): the configured URL is the only one asked.
            async with httpx.AsyncClient(
                headers=self.headers, verify=self.verify_tls, timeout=timeout,
                follow_redirects=False,
            ) as http:
                answers = await asyncio.gather(
                    *(self._query(http, q, now, kind) for q, kind in queries.values()),
                    return_exceptions=True,
                )
        except (OSError, ValueError, httpx.HTTPError) as err:
            # Client construction (e.g. an unreadable CA bundle) failed.
            return self._all_failed(nodes, f"cannot query: {type(err).__name__}: {err}")
        parsed: dict[str, list[Series]] = {}
        warnings: list[str] = []
        for name, answer in zip(queries, answers, strict=True):
            if isinstance(answer, PrometheusError):
                return self._all_failed(nodes, str(answer))
            if isinstance(answer, BaseException):
                log.exception("prometheus query %s failed unexpectedly", name, exc_info=answer)
                return self._all_failed(nodes, f"{type(answer).__name__}: {answer}")
            series, warns = answer
            parsed[name] = series
            warnings.extend(w for w in warns if w not in warnings)
        if warnings:
            log.warning("Prometheus at %s returned partial results: %s", self.url, warnings)
        results = QueryResults(
            present=parsed["present"],
            xid=parsed["xid"],
            clocks=parsed["clocks"],
            gpu_temp=parsed["gpu_temp"],
            memory_temp=parsed["memory_temp"],
            last={
                name.split(":", 1)[1]: s for name, s in parsed.items() if name.startswith("last:")
            },
            xid_count=parsed["xid_count"],
        )
        out = assemble_readings(
            results,
            nodes,
            node_labels=self.node_labels,
            now=now,
            thermal_hold=thermal_hold,
            clock_mode=self.clock_mode,
            policy=self.policy,
            acknowledged_by_node=acknowledged_by_node,
        )
        out.warnings = warnings
        return out

    async def read(
        self,
        nodes: list[str],
        *,
        thermal_hold: timedelta,
        acknowledged_by_node: Mapping[str, Mapping[str, int]] | None = None,
    ) -> tuple[dict[str, NodeReadings], dict[str, str]]:
        """``(readings, errors)`` for ``nodes``, the shape ``FleetActivities.scrape_many`` returns.

        Every requested node is in exactly one of the two maps. ``thermal_hold``: how long a
        temperature (and, in ``held`` mode, a clock-event reason) must have lasted to count; zero
        reads the last value instead. ``acknowledged_by_node`` (node -> GPU key -> XID already
        remediated there) only steers which XID a reading carries when the window holds
        several.
        """
        result = await self.read_detailed(
            nodes, thermal_hold=thermal_hold, acknowledged_by_node=acknowledged_by_node
        )
        return result.readings, result.errors

    def _all_failed(self, nodes: list[str], reason: str) -> PrometheusRead:
        log.warning("Prometheus at %s: %s", self.url, reason)
        message = f"Prometheus at {self.url}: {reason}"
        return PrometheusRead(errors={node: f"{node}: {message}" for node in nodes})
