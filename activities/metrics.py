"""Prometheus metrics written by activities (never by workflow code: replay would double count).

The worker process serves them on its metrics port; docs/metrics.md lists them.
"""

import threading
import time
from collections.abc import Iterable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

NODES_BY_STATE = Gauge(
    "gpu_remediate_nodes", "Managed GPU nodes by remediation state (last tick).", ["state"]
)
REMEDIATION_TRANSITIONS = Counter(
    "gpu_remediate_transitions_total", "State transitions written to nodes.", ["state", "dry_run"]
)
REMEDIATIONS_FINISHED = Counter(
    "gpu_remediate_remediations_finished_total",
    "Remediations that released their node, by outcome.",
    ["outcome", "dry_run"],
)
EVICTIONS = Counter(
    "gpu_remediate_evictions_total", "Eviction requests by result.", ["result"]
)
DRAIN_BLOCKED = Gauge(
    "gpu_remediate_drain_blocked", "1 while a node's drain is blocked by a PDB.", ["node", "pdb"]
)
JOBS = Counter("gpu_remediate_jobs_total", "Node Jobs finished, by kind and result.",
               ["kind", "result"])
SCRAPE_ERRORS = Counter(
    "gpu_remediate_scrape_errors_total", "Exporter scrapes that failed, by reason.", ["reason"]
)
TICK_SECONDS = Histogram(
    "gpu_remediate_observe_seconds",
    "Time to list nodes, scrape every exporter and evaluate the fleet.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
FLAGGED = Gauge("gpu_remediate_nodes_flagged", "Nodes whose verdict needs a node action.")
UNREADABLE = Gauge("gpu_remediate_nodes_unreadable", "Nodes whose exporter could not be read.")
BUDGET = Gauge("gpu_remediate_budget_slots", "Nodes the budget lets out of service at once.")
BUDGET_IN_USE = Gauge("gpu_remediate_budget_in_use", "Budget slots held by nodes out of service.")
WAITING = Gauge("gpu_remediate_nodes_waiting", "Flagged nodes waiting for admission.")
BREAKER_OPEN = Gauge("gpu_remediate_breaker_open", "1 while the circuit breaker stops admissions.")
DOMAIN_INCIDENTS = Gauge(
    "gpu_remediate_domain_incidents_open",
    "Open domain incidents: 1 per fault domain whose nodes failed together (label, domain).",
    ["label", "domain"])
DOMAIN_INCIDENT_NODES = Gauge(
    "gpu_remediate_domain_incident_nodes",
    "Flagged nodes held (cordoned, not drained) by each open domain incident.",
    ["label", "domain"])
GPUS_OUT = Gauge(
    "gpu_remediate_gpus_out_of_service",
    "GPUs out of service as the GPU budgets count them (every GPU of a node in remediation, "
    "each isolated GPU as one), at the fleet (level=fleet, domain=''), in each pool with a "
    "GPU budget and GPUs out (level=pool, domain: the pool) and in each fault domain with "
    "GPUs out (level: the domain's label).", ["level", "domain"])
GPU_BUDGET = Gauge(
    "gpu_remediate_gpu_budget",
    "GPUs a GPU budget lets out of service at once (max_unavailable_gpus), where one is set; "
    "the same labels as gpu_remediate_gpus_out_of_service.", ["level", "domain"])
ISOLATED_GPUS = Gauge(
    "gpu_remediate_isolated_gpus",
    "GPUs isolated on their own (a GPU-scoped lease: the node stays in service).")
PAUSED = Gauge("gpu_remediate_detector_paused", "1 while an operator has paused admissions.")
ORPHANS = Gauge("gpu_remediate_orphaned_nodes",
                "Nodes labelled in remediation whose workflow is not running.")
UNCLAIMED_LABELS = Gauge(
    "gpu_remediate_unclaimed_state_labels",
    "Nodes carrying a remediation state label without our taint and with no remediation "
    "running (a node writing its own label): not counted in the budget.")
REMEDIATIONS_STARTED = Counter(
    "gpu_remediate_remediations_started_total", "Remediations that claimed their node.",
    ["action", "dry_run"])
_DURATIONS = (60, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400, 259200)
STATE_SECONDS = Histogram(
    "gpu_remediate_state_seconds", "Time nodes spent in each remediation state.", ["state"],
    buckets=_DURATIONS)
TIME_TO_SERVICE = Histogram(
    "gpu_remediate_time_to_service_seconds",
    "From claim to the node's return to service (remediations that ended healthy).",
    buckets=_DURATIONS)
OBSERVATION_ERRORS = Counter(
    "gpu_remediate_observation_errors_total",
    "Fleet observations (detector ticks, or one shard of one) that failed, by error type.",
    ["error"])
LAST_OBSERVATION = Gauge(
    "gpu_remediate_last_observation_timestamp_seconds",
    "Unix time of the last fleet observation that completed (any shard, this process).")
NODE_EVENTS = Counter(
    "gpu_remediate_node_events_total",
    "Events the observation recorded on nodes (rate-limited), by reason.", ["reason"])
XID_WARNINGS = Counter(
    "gpu_remediate_xid_warnings_total",
    "XID findings that need a human, counted once when they appear, by reason: UnknownXid "
    "(not in the catalog), XidAlert (a bucket that asks a human), GPUDiagnosticNeeded (an app "
    "XID in too many bursts).", ["reason"])
LINK_FINDINGS = Counter(
    "gpu_remediate_link_error_findings_total",
    "GPUs seen over a link threshold (policy.links), once per observation, by signal: "
    "pcie_replay, nvlink_crc, nvlink_errors.", ["signal"])

SIGNAL_BLIND_NODES = Gauge(
    "gpu_remediate_signal_blind_nodes",
    "Nodes whose exporter cannot feed a rule (policy/signals.py), by signal: its fields were "
    "absent from every reading of the node over the last hour; as of the last observation "
    "this process ran (with shards, that shard's nodes).", ["signal"])


class NodeStates(Collector):
    """``gpu_remediate_node_state{node,state}``: 1 for each node's current state, one series
    per node, as the original tool's ``node_state``.

    Series are kept per node with the time they were observed and dropped once not observed
    for ``stale_after``: a node deleted from the cluster, or a shard now observed by another
    worker replica, does not leave a series behind. Summing over replicas can briefly count a
    node twice while a shard moves; ``max by (node, state)`` does not.
    """

    def __init__(self, *, stale_after_s: float = 1800.0) -> None:
        self.stale_after_s = stale_after_s
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[str, float]] = {}

    def observed(self, states: Iterable[tuple[str, str]], *, gone: Iterable[str] = (),
                 now: float | None = None) -> None:
        """Record ``(node, state)`` pairs from one observation; ``gone``: nodes it looked for
        (its shard) and did not find."""
        at = time.monotonic() if now is None else now
        with self._lock:
            for node in gone:
                self._nodes.pop(node, None)
            for node, state in states:
                self._nodes[node] = (state, at)

    def collect(self, now: float | None = None) -> Iterator[GaugeMetricFamily]:
        at = time.monotonic() if now is None else now
        family = GaugeMetricFamily("gpu_remediate_node_state",
                                   "1 for each managed GPU node's current remediation state.",
                                   labels=["node", "state"])
        with self._lock:
            for node in [n for n, (_, t) in self._nodes.items()
                         if at - t > self.stale_after_s]:
                del self._nodes[node]
            rows = sorted(self._nodes.items())
        for node, (state, _) in rows:
            family.add_metric([node, state], 1.0)
        yield family

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # unchecked: the names are fixed, the series vary


NODE_STATE = NodeStates()
REGISTRY.register(NODE_STATE)

# The repair ledger (activities/ledger.py): repair quality, one sample per entry written.
LEDGER_UNREADABLE = Counter(
    "gpu_remediate_ledger_unreadable_total",
    "Repair ledger entries that could not be read; each is skipped (counted once per "
    "worker), never fatal and never overwritten.")
LEDGER_WRITE_FAILURES = Counter(
    "gpu_remediate_ledger_write_failures_total",
    "Attempts to write a remediation's outcome to the repair ledger that failed (the "
    "remediation goes on; its last failure is a Warning Event LedgerWriteFailed).")
_LEDGER_DURATIONS = (300, 900, 1800, 3600, 7200, 14400, 43200, 86400, 259200, 604800, 2592000)
REPAIR_DURATION = Histogram(
    "gpu_remediate_repair_duration_seconds",
    "From a remediation's start to its outcome, by action taken and outcome (one per "
    "ledger entry).", ["action", "outcome"], buckets=_LEDGER_DURATIONS)
REPAIR_RELAPSES = Counter(
    "gpu_remediate_repair_relapses_total",
    "Repairs whose node or GPU was flagged again within ledger.relapse_window of its "
    "return to service, by the relapsed repair's action and fault.", ["action", "fault"])
GPU_HOURS_LOST = Counter(
    "gpu_remediate_gpu_hours_lost_total",
    "GPU-hours out of service in remediations (node GPUs x time from start to outcome).")
