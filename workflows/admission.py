"""Admission: which flagged nodes may start a remediation now, and why the others wait.

Pure code over one tick's observation and the detector's carried state, so the
detector workflow and the `gpu-remediate plan` command decide exactly alike.
Slots are counted from the detector's leases (workflows/leases.py): the record the
controller owns, never a label a node can write. (Detector runs recorded before leases
counted the nodes' state labels plus starts not yet visible as labels; ``leases=False``
replays them as they ran.)

A verdict confined to one GPU that the remediation will isolate (workflows/isolation.py,
under the running settings) is admitted with a GPU-scoped lease: it takes no node slot at
any level and one GPU from every GPU budget. Its remediation, if it cannot isolate the GPU,
asks for a node slot and waits (``widen`` candidates, granted through every budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from policy.models import SEVERITY, Action, Finding, Verdict
from workflows.ids import DETECTOR_REQUESTER
from workflows.incidents import IncidentWatch
from workflows.isolation import IsolationDecision, IsolationPlan
from workflows.leases import Lease, LeaseScope
from workflows.messages import (
    DetectorState,
    DomainUse,
    FleetObservation,
    GpuUse,
    ManualRemediation,
    PendingStart,
)
from workflows.probation import decide as probation_decide
from workflows.settings import UNLABELLED, DetectorSettings, domain_name, limit_for
from workflows.transitions import OUT_OF_SERVICE_STATES, NodeState

# A start not yet visible as a node label holds its slot this long at most.
PENDING_GRACE = timedelta(minutes=5)

# The nodes named (and given a CircuitBreakerOpen Event) when the breaker trips: enough to
# see the pattern, few enough that a fleet-wide trip is not a storm of Events.
BREAKER_NODES_SHOWN = 20


@dataclass(frozen=True)
class Candidate:
    verdict: Verdict
    who: str
    why: str
    # A node cordoned for heat outside the budget that asks for a drain slot.
    escalation: bool = False
    # A remediation with a GPU-scoped lease that could not isolate its GPU and asks for
    # the node (an escalation too: its lease is widened, no new remediation starts).
    widen: bool = False

    @property
    def node(self) -> str:
        return self.verdict.node

    @property
    def label(self) -> str:
        """What it waits for, in the waiting list."""
        if self.widen:
            return "whole node after GPU isolation failed"
        return "drain for heat" if self.escalation else self.verdict.action.value


def escalation_verdict(node: str) -> Verdict:
    """What a heat cordon's request for a drain slot is shown as while it waits."""
    return Verdict(node=node, action=Action.QUARANTINE, findings=[Finding(
        gpu="all", signal="thermal", value=0, rule="thermal-escalation",
        action=Action.QUARANTINE)])


def widen_verdict(node: str) -> Verdict:
    """What a GPU-scoped remediation's request for the whole node is shown as while it
    waits."""
    return Verdict(node=node, action=Action.RESET, findings=[Finding(
        gpu="all", signal="gpu-isolation", value=0, rule="gpu-isolation-unavailable",
        action=Action.RESET)])


def manual_verdict(m: ManualRemediation) -> Verdict:
    return Verdict(node=m.node, action=m.action, findings=[Finding(
        gpu="all", signal="operator", value=0, rule=f"manual-{m.action.value}", action=m.action)])


@dataclass
class Admission:
    """One tick's admission. Building it updates ``state`` (pending starts, first-seen
    times, dry-run plans, the breaker); ``admit`` records a start."""

    settings: DetectorSettings
    state: DetectorState
    obs: FleetObservation
    now: datetime
    closed: set[str] = field(default_factory=set)
    # Heat cordons outside the drain budget, with their debounce, cap and slot requests
    # (false: a detector run recorded before them replays as it ran).
    thermal_outside: bool = True
    # Count from the detector's leases (false: a detector run recorded before leases).
    leases: bool = True
    # Probation and lemons change a flagged node's action (workflows/probation.py; false:
    # a detector run recorded before them).
    probation: bool = True
    changed: dict[str, str] = field(init=False, default_factory=dict)
    # Fault domain levels, GPU budgets and domain incidents (false: a detector run recorded
    # before them, which had none).
    domains: bool = True
    # GPU-scoped leases for verdicts the remediation isolates on one GPU (false: a detector
    # run recorded before them, which gave every lease the node).
    gpu_scope: bool = True
    watch: IncidentWatch | None = field(init=False, default=None)
    _largest: int | None = field(init=False, default=None)
    in_use: list[str] = field(init=False)
    # Nodes with a GPU-scoped lease: in service, one GPU (each) out.
    isolated: list[str] = field(init=False, default_factory=list)
    cordoned: list[str] = field(init=False)
    busy: dict[str, str] = field(init=False)
    queue: list[Candidate] = field(init=False)
    budget: int = field(init=False)

    def __post_init__(self) -> None:
        if self.leases:
            self._count_from_leases()
        else:
            self._count_from_labels()
        self._queue()

    def _count_from_leases(self) -> None:
        """The record: every lease holds its slot (or its place under the thermal cap)
        until Temporal says its remediation closed; a quarantined node holds none. The
        nodes' labels are not read here: they are the record's mirror."""
        s, st, obs = self.settings, self.state, self.obs
        st.pending = []  # what leases replaced
        # A node under our taint (which a kubelet cannot write) with no remediation
        # running and no lease: a remediation that died before leases, or before this
        # detector knew of it. It keeps a slot until an operator releases it (fail closed).
        tainted = {r.node for r in obs.remediating if r.tainted}
        for node in sorted(set(obs.orphans) & tainted - set(st.leases)):
            st.leases[node] = Lease(
                node=node, token="", granted_at=self.now, workflow_id="",
                state=NodeState.REPAIRING, adopted=True,
                orphan="under our taint with no remediation running and no lease",
                pool=obs.pool_of.get(node, ""))
        leases = st.leases
        counts_cordoned = s.cordoned_counts_against_budget
        self.held = {h.node: h for h in obs.held if h.node not in leases}
        self.in_use = sorted({n for n, lease in leases.items()
                              if lease.holds_slot(counts_cordoned)}
                             | {h.node for h in self.held.values() if h.out_of_service})
        self.cordoned = sorted(n for n, lease in leases.items()
                               if not lease.slot and not lease.quarantined
                               and not lease.isolating)
        self.isolated = sorted(n for n, lease in leases.items() if lease.isolating)
        # Requests for a drain slot stand while the lease is a heat cordon's.
        # So do those of an adopted lease (its scope unknown, it holds a node slot from
        # adoption): a GPU-scoped remediation found running by a restarted detector asks,
        # and is granted at once what it holds already.
        st.slot_requests = {n: t for n, t in st.slot_requests.items()
                            if n in leases and not leases[n].orphan
                            and (not leases[n].slot or (self.gpu_scope and leases[n].adopted))}
        self.busy = {n: ("orphan" if lease.orphan else
                         "starting" if lease.state == NodeState.HEALTHY else lease.state.value)
                     for n, lease in leases.items()}
        quarantined = {n for n, lease in leases.items() if lease.quarantined}
        self.quarantined = len(quarantined)
        self.budget = s.budget_for(obs.managed_nodes)
        self._count_quarantines(quarantined)
        self._granted: set[str] = set()

    def _count_from_labels(self) -> None:
        s, st, obs, now = self.settings, self.state, self.obs, self.now
        labelled = {n.node: n for n in obs.remediating}

        def shown(p: PendingStart) -> bool:
            ns = labelled.get(p.node)
            # A slot granted to a heat cordon shows once the node leaves "cordoned".
            return ns is not None and not (p.escalation and ns.state == NodeState.CORDONED)
        # A pending start holds its slot until its label shows, its child is known to
        # have closed before this observation, or the grace period passes.
        st.pending = [p for p in st.pending if not shown(p)
                      and p.node not in self.closed and now - p.at < PENDING_GRACE]
        holding = set(OUT_OF_SERVICE_STATES)
        counts_cordoned = s.cordoned_counts_against_budget
        if counts_cordoned:
            holding.add(NodeState.CORDONED)
        # Another controller's drain or reboot takes capacity like ours (when visible).
        self.held = {h.node: h for h in obs.held if h.node not in labelled}
        self.in_use = sorted({n for n, ns in labelled.items() if ns.state in holding}
                             | {p.node for p in st.pending if p.slot or counts_cordoned}
                             | {h.node for h in self.held.values() if h.out_of_service})
        # Heat cordons outside the budget, under a cap of their own.
        self.cordoned = sorted({n for n, ns in labelled.items() if ns.state == NodeState.CORDONED}
                               | {p.node for p in st.pending if not p.slot})
        # Their requests for a drain slot stand while the node is still cordoned.
        st.slot_requests = {n: t for n, t in st.slot_requests.items()
                            if n in labelled and labelled[n].state == NodeState.CORDONED}
        self.busy = {**{p.node: "starting" for p in st.pending},
                     **{n: ns.state.value for n, ns in labelled.items()}}
        self.quarantined = sum(1 for ns in labelled.values()
                               if ns.state == NodeState.QUARANTINED)
        self.budget = s.budget_for(obs.managed_nodes)
        self._count_quarantines({n for n, ns in labelled.items()
                                 if ns.state == NodeState.QUARANTINED})
        self._granted = {p.node for p in st.pending if p.escalation}

    def _queue(self) -> None:
        s, st, obs, now = self.settings, self.state, self.obs, self.now
        flagged = {v.node: self._judged(v) for v in obs.verdicts}
        if s.dry_run:
            # Forget a plan only when the node is no longer flagged for that action.
            st.planned = {n: a for n, a in st.planned.items()
                          if n in flagged and flagged[n].action == a}
        verdicts = {n: v for n, v in flagged.items()
                    if n not in self.busy and n not in st.planned}
        # The breaker counts newly flagged nodes: the ones an operator already saw (and
        # resumed for) or that wait for a slot do not trip it again. With a window, the
        # count runs over that window, so a fault spreading tick by tick is caught too.
        newly = [n for n in verdicts if n not in st.first_seen]
        # A burst inside one fault domain is one incident, not a fleet-wide breaker trip.
        held = self._watch_incidents(flagged)
        window_start = now - s.breaker_window
        st.recently_flagged = {
            n: t for n, t in st.recently_flagged.items()
            if t > window_start and s.breaker_window > timedelta(0)}
        if s.breaker_window > timedelta(0):
            for n in newly:
                st.recently_flagged.setdefault(n, now)
            self._check_breaker(sorted(set(st.recently_flagged) - held))
        else:
            self._check_breaker(sorted(set(newly) - held))
        for n in verdicts:
            st.first_seen.setdefault(n, now)
        st.first_seen = {n: t for n, t in st.first_seen.items() if n in verdicts}

        st.manual = [m for m in st.manual if m.node not in self.busy]
        # A hot node that must be drained (it stayed hot, or a fault appeared) comes first:
        # it is cordoned already and waits only for a slot. So does a remediation whose GPU
        # could not be isolated: it has touched nothing yet.
        self.queue = [self._escalation(n)
                      for n, _ in sorted(st.slot_requests.items(), key=lambda kv: kv[1])
                      if n not in self._granted]
        self.queue += [Candidate(manual_verdict(m), m.operator, m.reason) for m in st.manual]
        manual_nodes = {m.node for m in st.manual}
        # Most severe first, then longest waiting.
        for v in sorted(verdicts.values(),
                        key=lambda v: (-SEVERITY[v.action], st.first_seen[v.node], v.node)):
            if v.node not in manual_nodes:
                self.queue.append(Candidate(v, DETECTOR_REQUESTER,
                                            self.changed.get(v.node) or v.summary))

    def _escalation(self, node: str) -> Candidate:
        lease = self._lease(node)
        if lease is not None and lease.isolating:
            return Candidate(widen_verdict(node), "gpu isolation fallback",
                             "its GPU could not be isolated; the whole node must be "
                             "remediated", escalation=True, widen=True)
        return Candidate(escalation_verdict(node), "thermal escalation",
                         "cordoned for heat; must be drained", escalation=True)

    def scope_of(self, c: Candidate) -> LeaseScope:
        """The lease a start gets: ``gpu`` where its remediation, under the running
        settings, isolates the verdict's GPU instead of taking the node (the same pure
        decision it runs); ``node`` otherwise. An escalation asks for the node."""
        if not self.gpu_scope or c.escalation:
            return "node"
        one = IsolationDecision(self.settings.remediation.gpu_isolation).decide(c.verdict)
        return "gpu" if isinstance(one, IsolationPlan) else "node"

    def _judged(self, v: Verdict) -> Verdict:
        """The verdict after probation and lemons; why it changed goes to ``changed``."""
        if not self.probation:
            return v
        decision = probation_decide(v, self.obs.ledger.get(v.node), self.now,
                                    self.settings.ledger)
        if decision.why:
            self.changed[v.node] = decision.why
        return decision.verdict

    def _watch_incidents(self, flagged: dict[str, Verdict]) -> set[str]:
        """The incident decision (workflows/incidents.py); the nodes incidents hold."""
        s, st = self.settings, self.state
        if not self.domains or not (any(d.incident_threshold for d in s.fault_domains)
                                    or st.incidents or st.incident_cordons):
            return set()
        self.watch = IncidentWatch(
            s, st.incidents, st.flagged_at, st.incident_cordons,
            {n: self.obs.domains_of.get(n, {}) for n in flagged}, set(self.busy), self.now)
        st.flagged_at = self.watch.flagged_at
        return self.watch.held_nodes()

    def _count_quarantines(self, quarantined: set[str]) -> None:
        """The outcome breaker: remediations that ended in quarantine (seen as nodes newly
        labelled quarantined since the last observation) within the window. The first
        observation of a detector only learns who is quarantined already."""
        s, st, now = self.settings, self.state, self.now
        if st.quarantined_seen is not None:
            for n in sorted(quarantined - set(st.quarantined_seen)):
                st.recently_quarantined.setdefault(n, now)
        st.quarantined_seen = sorted(quarantined)
        start = now - s.breaker_quarantine_window
        st.recently_quarantined = {n: t for n, t in st.recently_quarantined.items() if t > start}
        count = len(st.recently_quarantined)
        if st.breaker_open or not s.breaker_max_quarantines or \
                count < s.breaker_max_quarantines:
            return
        st.breaker_open = True
        st.breaker_nodes = sorted(st.recently_quarantined)[:BREAKER_NODES_SHOWN]
        names = ", ".join(sorted(st.recently_quarantined)[:5]) + (", …" if count > 5 else "")
        st.breaker_reason = (
            f"{count} remediations ended in quarantine within {s.breaker_quarantine_window} "
            f"({names}; limit {s.breaker_max_quarantines}): a failing repair, validation or "
            "Job template would quarantine the fleet one slot at a time; check them, then "
            "resume")

    def _check_breaker(self, flagged: list[str]) -> None:
        s, st = self.settings, self.state
        newly_flagged = len(flagged)
        if st.breaker_open or newly_flagged < s.breaker_min_flagged_nodes:
            return
        # Unreadable exporters count toward neither side.
        readable = self.obs.readable_nodes
        pct = 100.0 * newly_flagged / max(readable, 1)
        if newly_flagged > s.breaker_max_flagged_nodes or pct > s.breaker_max_flagged_percent:
            st.breaker_open = True
            st.breaker_nodes = flagged[:BREAKER_NODES_SHOWN]
            span = (f"within {s.breaker_window}" if s.breaker_window > timedelta(0)
                    else "in one tick")
            st.breaker_reason = (
                f"{newly_flagged} of {readable} readable nodes newly flagged {span} "
                f"({pct:.0f}% > {s.breaker_max_flagged_percent:.0f}% or > "
                f"{s.breaker_max_flagged_nodes}); resume after checking the fleet")

    def _pool(self, node: str) -> str:
        lease = self.state.leases.get(node) if self.leases else None
        return lease.pool if lease is not None else self.obs.pool_of.get(node, "")

    def pool_in_use(self, pool: str) -> int:
        return sum(1 for n in self.in_use if self._pool(n) == pool)

    def _lease(self, node: str) -> Lease | None:
        return self.state.leases.get(node) if self.leases else None

    def domain_of(self, node: str, label: str) -> str:
        """The node's domain at one level: as its lease recorded it at grant (a node that
        relabels itself later moves nothing), else as this observation says."""
        lease = self._lease(node)
        if lease is not None and label in lease.domains:
            return lease.domains[label]
        return self.obs.domains_of.get(node, {}).get(label, UNLABELLED)

    def gpus_of(self, node: str) -> int:
        """The GPUs a node takes from a GPU budget: as its lease recorded them at grant, else
        as observed; unknown counts as the largest node observed (failing closed)."""
        lease = self._lease(node)
        if lease is not None and lease.gpus:
            return lease.gpus
        if node in self.isolated:
            return 1  # a GPU-scoped start of this tick, before its lease is written
        return self._observed_gpus(node)

    def _observed_gpus(self, node: str) -> int:
        if self._largest is None:
            self._largest = max(self.obs.gpus_of.values(), default=1) or 1
        return self.obs.gpus_of.get(node) or self._largest

    def gpu_use(self) -> GpuUse:
        """The fleet's GPUs out of service as the GPU budget counts them (the nodes in use
        with all their GPUs, each isolated GPU as one), and the isolated GPUs."""
        s, obs = self.settings, self.obs
        out = [*self.in_use, *self.isolated]
        pools: dict[str, int] = {}
        budgets: dict[str, int] = {}
        if s.pool_label and s.pool_max_unavailable_gpus:
            for n in out:
                pool = self._pool(n)
                pools[pool] = pools.get(pool, 0) + self.gpus_of(n)
            for pool in list(pools):
                limit = s.pool_gpu_budget_for(pool, obs.pool_gpus.get(pool, 0))
                if limit is None:
                    del pools[pool]
                else:
                    budgets[pool] = limit
        return GpuUse(gpus=obs.managed_gpus, out_of_service=sum(self.gpus_of(n) for n in out),
                      isolated=len(self.isolated), budget=s.gpu_budget_for(obs.managed_gpus),
                      pools=pools, pool_budgets=budgets)

    def domain_uses(self) -> list[DomainUse]:
        """Every domain with a node in use, and every level's unlabelled nodes (shown, so a
        missing label is never a silent exemption)."""
        s, obs = self.settings, self.obs
        out = []
        for d in s.fault_domains:
            sizes = obs.domain_sizes.get(d.label, {})
            gpus = obs.domain_gpus.get(d.label, {})
            used: dict[str, list[str]] = {}
            for n in self.in_use:
                used.setdefault(self.domain_of(n, d.label), []).append(n)
            # GPUs out: the nodes' and the isolated GPUs'.
            gpus_out: dict[str, list[str]] = {}
            for n in [*self.in_use, *self.isolated]:
                gpus_out.setdefault(self.domain_of(n, d.label), []).append(n)
            for dom in sorted(set(gpus_out) | ({UNLABELLED} & set(sizes))):
                out.append(DomainUse(
                    label=d.label, domain=dom, nodes=sizes.get(dom, 0),
                    in_use=len(used.get(dom, [])),
                    budget=None if d.max_unavailable is None else limit_for(
                        d.max_unavailable, sizes.get(dom, 0)),
                    gpus=gpus.get(dom, 0),
                    gpus_in_use=sum(self.gpus_of(n) for n in gpus_out.get(dom, [])),
                    gpu_budget=None if d.max_unavailable_gpus is None else limit_for(
                        d.max_unavailable_gpus, gpus.get(dom, 0))))
        return out

    def _domain_blocked(self, c: Candidate, gpu_only: bool = False) -> str | None:
        """The GPU budget and every fault domain level, at once. ``gpu_only``: a GPU-scoped
        start, which needs one GPU at every GPU level and no node slot. A widened lease
        needs the node's GPUs in place of the one it held."""
        s, obs = self.settings, self.obs
        need = 1 if gpu_only else (self._observed_gpus(c.node) if c.widen
                                   else self.gpus_of(c.node))
        holders = [n for n in [*self.in_use, *self.isolated] if n != c.node]
        gpu_budget = s.gpu_budget_for(obs.managed_gpus)
        if gpu_budget is not None:
            used = sum(self.gpus_of(n) for n in holders)
            if used + need > gpu_budget:
                return f"GPU budget full ({used} + {need} > {gpu_budget} GPUs)"
        if s.pool_label and s.pool_max_unavailable_gpus:
            pool = self._pool(c.node)
            limit = s.pool_gpu_budget_for(pool, obs.pool_gpus.get(pool, 0))
            if limit is not None:
                used = sum(self.gpus_of(n) for n in holders if self._pool(n) == pool)
                if used + need > limit:
                    return (f"pool {pool or '(none)'} GPU budget full "
                            f"({used} + {need} > {limit} GPUs)")
        for d in s.fault_domains:
            dom = self.domain_of(c.node, d.label)
            name = f"{d.label}={domain_name(dom)}"
            mine = [n for n in self.in_use if self.domain_of(n, d.label) == dom]
            if d.max_unavailable is not None and not gpu_only:
                limit = limit_for(d.max_unavailable, obs.domain_sizes.get(d.label, {}).get(dom, 0))
                if len(mine) >= limit:
                    return f"domain {name} full ({len(mine)}/{limit})"
            if d.max_unavailable_gpus is not None:
                limit = limit_for(d.max_unavailable_gpus,
                                  obs.domain_gpus.get(d.label, {}).get(dom, 0))
                used = sum(self.gpus_of(n) for n in holders
                           if self.domain_of(n, d.label) == dom)
                if used + need > limit:
                    return f"domain {name} GPU budget full ({used} + {need} > {limit} GPUs)"
        return None

    def outside_budget(self, c: Candidate) -> bool:
        """A heat cordon that takes no drain slot (it never drains without asking)."""
        return (self.thermal_outside and not self.settings.cordoned_counts_against_budget
                and not c.escalation and c.verdict.action == Action.THERMAL)

    def blocked(self, c: Candidate) -> str | None:
        """Why ``c`` cannot start now, or None."""
        st, s = self.state, self.settings
        if c.escalation and c.node in self.in_use:
            return None  # its cordon holds a slot already (cordons count, per settings)
        if c.node in self.held:
            h = self.held[c.node]
            return f"{h.by} is acting on it ({h.detail})"
        if st.paused:
            return "paused"
        if self.watch is not None and not c.escalation:
            inc = self.watch.holds(c.node)
            if inc is not None:
                return (f"domain incident {inc.label}={domain_name(inc.domain)}: cordoned, "
                        "not drained until it is resolved or released")
        if st.breaker_open:
            return "breaker open"
        if c.verdict.action == Action.THERMAL and c.who == DETECTOR_REQUESTER \
                and self.thermal_outside:
            hot = self.now - st.first_seen.get(c.node, self.now)
            if hot < s.thermal_debounce:
                return (f"hot for {int(hot.total_seconds())}s of the "
                        f"{int(s.thermal_debounce.total_seconds())}s debounce")
        if self.outside_budget(c):
            cap = limit_for(s.max_thermal_cordoned, self.obs.managed_nodes)
            if len(self.cordoned) >= cap:
                return f"thermal cordon cap reached ({len(self.cordoned)}/{cap})"
            return None
        gpu_only = self.scope_of(c) == "gpu"
        if gpu_only:
            # The node stays in service: no node slot at any level, its GPU at every one.
            why = self._domain_blocked(c, gpu_only=True) if self.domains else None
            if why is not None:
                return why
            return self._quarantine_cap(c)
        if len(self.in_use) >= self.budget:
            return f"budget full ({len(self.in_use)}/{self.budget})"
        if s.pool_label:
            pool = self._pool(c.node)
            limit = s.pool_budget_for(pool, self.obs.pool_sizes.get(pool, 0))
            if limit is not None and self.pool_in_use(pool) >= limit:
                return f"pool {pool or '(none)'} full ({self.pool_in_use(pool)}/{limit})"
        if self.domains:
            why = self._domain_blocked(c)
            if why is not None:
                return why
        return self._quarantine_cap(c)

    def _quarantine_cap(self, c: Candidate) -> str | None:
        s = self.settings
        if s.max_quarantined is not None and c.who == DETECTOR_REQUESTER:
            # Any remediation may end in quarantine (a failed repair or validation), so
            # the cap holds back every automatic start, not only quarantine orders. An
            # operator's own `remediate` request is their decision, made seeing the count.
            cap = limit_for(s.max_quarantined, self.obs.managed_nodes)
            if self.quarantined >= cap:
                return f"quarantine cap reached ({self.quarantined}/{cap})"
        return None

    def admit(self, c: Candidate) -> None:
        """Record a start: it holds a slot from now on (a cap's place, for a heat cordon
        outside the budget); for an escalation, the slot granted."""
        if self.outside_budget(c):
            self.cordoned.append(c.node)
        elif c.escalation and c.node in self.in_use and self.gpu_scope:
            pass  # its lease holds the slot already (before GPU leases: counted twice)
        elif self.scope_of(c) == "gpu":
            self.isolated.append(c.node)
        else:
            self.in_use.append(c.node)
        if c.widen and c.node in self.isolated:
            self.isolated.remove(c.node)  # its GPUs count as the node's from now on
        if c.escalation:
            self.state.slot_requests.pop(c.node, None)
            return
        self.busy[c.node] = "starting"
        if c.verdict.action == Action.QUARANTINE:
            self.quarantined += 1
        self.state.manual = [m for m in self.state.manual if m.node != c.node]
