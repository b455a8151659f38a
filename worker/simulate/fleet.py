"""The in-memory fleet of `gpu-remediate simulate`, and the activities that serve it.

The activities are registered under the production names with the production types
(workflows/activity_refs.py), so the real DetectorWorkflow and RemediationWorkflow run
against this fleet unchanged. A node's faults become the readings a real dcgm-exporter
would show (faults.CAUSES), and the production policy (policy.rules.evaluate_node) turns
them into verdicts: no decision is made here.

Cheap per tick: a node object exists only once a fault touched it; a healthy fleet is a
count. Time is the Temporal server's (time-skipping), read from the activity's schedule
time, as seconds since the simulation started; nothing reads the wall clock.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import dataclasses
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.node_return import NODE_NOT_BACK
from policy.config import PolicySettings
from policy.models import SEVERITY, Action, GpuReading, NodeReadings, Verdict
from policy.rules import evaluate_node
from worker.simulate.clock import CLOCK_WORKFLOW_ID, SimulationClockWorkflow
from worker.simulate.faults import CAUSES, FaultModel
from worker.simulate.watcher import (
    WATCHER_WORKFLOW_ID,
    Due,
    SimulationWatcherWorkflow,
    kernel_second,
)
from workflows import errors
from workflows.ids import DETECTOR_WORKFLOW_ID, shard_of
from workflows.incidents import IncidentCordon, IncidentCordonResult
from workflows.isolation import GpuTaintInput, IsolateGpuInput, IsolateGpuResult
from workflows.leases import LeaseAnswer, LeaseCheck, LeaseStatus
from workflows.ledger import LedgerEntry, LedgerInput, LedgerResult, notes_for
from workflows.limits import LimitsSettings
from workflows.messages import (
    AdmissionReport,
    ClaimInput,
    ClaimResult,
    DrainInput,
    DrainResult,
    FleetObservation,
    GpusFree,
    GpusFreeInput,
    HistoryEntry,
    MirrorRepair,
    NodeEventInput,
    NodeHealth,
    NodeHealthInput,
    NodeJobInput,
    NodeJobResult,
    NodeStatus,
    ObserveInput,
    OrphanRelease,
    OutOfServiceInput,
    ReleaseInput,
    ReturnInput,
    ReturnResult,
    RunningRemediations,
    RunningRemediationsInput,
    StateInput,
    ThermalCheckInput,
    ThermalCheckResult,
    ThermalWatchInput,
    ThermalWatchResult,
)
from workflows.operands import (
    DevicePluginInput,
    DevicePluginRestart,
    OperandsInput,
    OperandsPaused,
    OperandsState,
    OperandsWaitInput,
    deploy_label,
)
from workflows.settings import DetectorSettings
from workflows.transitions import OUT_OF_SERVICE_STATES, NodeState

MODEL_NAME = "NVIDIA H100 80GB HBM3"
DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Fault:
    """One drawn fault: when (seconds from the start), where, what, and how its repair ends."""

    at: float
    node: int
    gpu: int
    cause: str
    outcome: str
    relapse_after: float
    """Seconds after a relapsing repair until the same fault shows again."""
    remapped: bool
    """An HBM3 fault the GPU absorbs by row remapping (else a remap failure)."""
    then: str
    """The outcome of the relapse's own repair."""


def draw_faults(model: FaultModel, *, nodes: int, gpus: int, days: float,
                seed: int) -> list[Fault]:
    """A Poisson process per cause over the whole run, from ``seed`` alone: two configs
    compared on one seed see the same faults at the same instants on the same GPUs."""
    rng = random.Random(seed)
    rates = [(name, rate) for name, rate in model.rates_per_gpu_day.items() if rate > 0]
    total = sum(rate for _, rate in rates) * nodes * gpus  # faults per day, whole fleet
    names = [name for name, _ in rates]
    weights = [rate for _, rate in rates]
    outcomes = list(model.outcomes)
    odds = list(model.outcomes.values())
    out: list[Fault] = []
    t = 0.0
    while total > 0:
        t += rng.expovariate(total)
        if t >= days:
            break
        cause = rng.choices(names, weights)[0]
        out.append(Fault(
            at=t * DAY, node=rng.randrange(nodes), gpu=rng.randrange(gpus), cause=cause,
            outcome=rng.choices(outcomes, odds)[0],
            relapse_after=rng.uniform(0.1, 1.0) * model.relapse_within_hours * 3600,
            remapped=rng.random() < model.hbm3_remapped,
            then=rng.choices(outcomes, odds)[0]))
    return out


@dataclass(slots=True)
class ActiveFault:
    fault: Fault
    since: float
    outcome: str
    action: Action
    """What the production policy says of this fault alone (which repair clears it)."""
    cool_at: float | None = None


@dataclass(slots=True)
class SimNode:
    name: str
    index: int
    gpus: int
    state: NodeState = NodeState.HEALTHY
    tainted: bool = False
    cordoned: bool = False
    pre_cordoned: bool = False
    history: list[HistoryEntry] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    faults: list[ActiveFault] = field(default_factory=list)
    boot: int = 0
    generation: int = 0
    claimed_at: float | None = None
    onset: float | None = None
    outcome: str = "success"
    hung_on: str | None = None
    jobs: dict[str, float] = field(default_factory=dict)
    gone_until: float | None = None

    def uuid(self, gpu: int) -> str:
        return f"GPU-{self.index:08x}-{self.generation:04x}-4000-8000-{gpu:012x}"


@dataclass
class Figures:
    """What the run measured (seconds are simulated seconds)."""

    faults_by_cause: dict[str, int] = field(default_factory=dict)
    relapses: int = 0
    faults_on_lost_nodes: int = 0
    mttr: dict[str, list[float]] = field(default_factory=dict)
    out_of_service_s: float = 0.0
    quarantined_s: float = 0.0
    quarantines: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    nodes_lost: int = 0
    lost_s: float = 0.0
    max_in_use: int = 0
    max_waiting: int = 0
    budgets: set[int] = field(default_factory=set)
    breaker_trips: int = 0
    breaker_open: bool = False
    max_by_state: int = 0
    max_quarantined: int = 0
    observations: int = 0
    activity_calls: int = 0


# A workflow's first activity after a tick that woke it runs within this many seconds of the
# tick on the server's clock (the tick's own work and one signal; milliseconds unloaded).
WOKEN_S = 1.0
# The steps SimFleet keeps per workflow: enough for at_server() to find the step before a
# reboot request among the polls that follow it.
STEPS_KEPT = 64


class SimFleet:
    """The fleet and its activities. ``start`` is the server time the run began at;
    ``end`` the simulated second the run ends at (on the tick grid; None: never)."""

    def __init__(self, *, nodes: int, gpus: int, domains: int, faults: list[Fault],
                 model: FaultModel, settings: DetectorSettings, start: datetime,
                 end: float | None = None, watchers: bool = False) -> None:
        self.size = nodes
        self.gpus = gpus
        self.domains = max(1, domains)
        self.model = model
        self.settings = settings
        self.start = start
        self.schedule = faults
        self.next_fault = 0
        self.relapses: list[tuple[float, int, Fault]] = []  # (at, seq, fault), sorted
        self.nodes: dict[int, SimNode] = {}
        self.gone: set[int] = set()
        # The repair ledger the remediations write (record_repair), read back by the
        # observation for probation and lemons, as the production observation does.
        self.ledger: list[LedgerEntry] = []
        self.figures = Figures(faults_by_cause={name: 0 for name in CAUSES})
        self.end_at = end
        self.final: Figures | None = None
        """The figures as they stood at ``end`` (set by ``close``)."""
        self._shard_sizes: dict[int, list[int]] = {}
        self._fault_actions: dict[tuple[str, bool], Action] = {}
        self._seq = 0
        self.ticks = 0
        self.tick_at = 0.0
        self.tick_server = 0.0
        # Where now() counts from: the last full tick, or a later node-only tick's stamp.
        self.anchor_at = 0.0
        self.anchor_server = 0.0
        # Each other workflow's steps: (simulated second, server second) of its latest
        # activities, newest last (now() counts a remediation's moment from its own last
        # step; at_server() finds the step a moment of its own came after).
        self.steps: dict[str, list[tuple[float, float]]] = {}
        # What read_limits answers: the config's own limits (a client may only tighten).
        self.limits = LimitsSettings.from_settings(settings)
        # Node watchers (worker/simulate/watcher.py): the next scheduled fault and the
        # relapses already handed to them, and the node-only ticks their reports woke.
        self.watchers = watchers
        self.next_report = 0
        self.reported_relapses: set[int] = set()
        self.node_ticks = 0
        # A run over several test servers (worker/simulate/run.py): the simulated second
        # from which the next full tick may hand the run over to a fresh server, and the
        # driver's say (it checks the workflows too): True, and the observation of that
        # tick never answers on this server; the next server's first tick observes it.
        self.handover_at: float | None = None
        self.hand_over: Callable[[float], Awaitable[bool]] | None = None
        self.handovers: list[float] = []
        self.quarantined_at: dict[str, float] = {}

    # ------------------------------------------------------------ the model

    def name(self, index: int) -> str:
        return f"gpu-node-{index:05d}"

    def index_of(self, name: str) -> int:
        return int(name.rsplit("-", 1)[1])

    def domain(self, index: int) -> str:
        return f"domain-{index * self.domains // self.size:03d}"

    def node(self, name: str) -> SimNode:
        i = self.index_of(name)
        n = self.nodes.get(i)
        if n is None:
            n = self.nodes[i] = SimNode(name=name, index=i, gpus=self.gpus)
        return n

    def server_seconds(self) -> float:
        return (activity.info().current_attempt_scheduled_time - self.start).total_seconds()

    def now(self) -> float:
        """Seconds since the start, as the run would have them with no processing time.

        The test server's clock also moves at wall-clock speed while work is in flight, so
        its readings drift by the run's own processing time: milliseconds a step, more on a
        loaded machine, and differently for each workflow (the detector drifts by its ticks'
        work, a remediation by its own steps'). Every timer, retry interval and deadline in
        the workflows is whole seconds, so a moment is whole seconds after the last one of
        the same workflow, give or take that one step's processing (under half a second):

        - the detector's activities are on its tick grid (a tick at ``ticks x interval``, or
          a node-only tick's stamp) and count from the tick;
        - another workflow's first activity, and its first after a tick that woke it (within
          ``WOKEN_S`` after the tick on the server's clock, its previous step before it: a
          slot granted, a remediation started), is the tick's moment, counted from the tick;
        - any other activity counts from that workflow's previous step, rounded to whole
          seconds, so a long remediation does not gather the drift of all its steps (the
          first use counted every moment from the tick, and a reboot's forty-odd steps on a
          busy machine took it a second or two past its true moment)."""
        server = self.server_seconds()
        tick = self.anchor_at + math.floor(server - self.anchor_server)
        info = activity.info()
        if info.workflow_type == "DetectorWorkflow":
            return tick
        steps = self.steps.setdefault(info.workflow_id or "", [])
        if not steps or (steps[-1][1] < self.anchor_server <= server
                         < self.anchor_server + WOKEN_S):
            at = tick
        else:
            at = steps[-1][0] + round(server - steps[-1][1])
        steps.append((at, server))
        del steps[:-STEPS_KEPT]
        return at

    def at_server(self, when: datetime) -> float:
        """The simulated second of a moment of this activity's workflow (``workflow.now()``
        at one of its steps): counted from the step before it, as now() counts."""
        server = (when - self.start).total_seconds()
        steps = self.steps.get(activity.info().workflow_id or "", [])
        before = [s for s in steps if s[1] <= server]
        if not before:
            return self.anchor_at + math.floor(server - self.anchor_server)
        at, base = before[-1]
        return at + round(server - base)

    def ticked(self) -> float:
        """A new fleet observation: the grid moves on one interval (the first is at 0)."""
        if self.ticks:
            self.tick_at += self.settings.interval.total_seconds()
        self.ticks += 1
        self.tick_server = self.server_seconds()
        self.anchor_at, self.anchor_server = self.tick_at, self.tick_server
        return self.tick_at

    def reported(self, seconds: list[int]) -> float:
        """A node-only tick woken by reports stamped with these simulated seconds: its time
        is the latest stamp (never before the last anchor), and later moments count from
        it, as later moments of a full tick count from the tick."""
        at = max([*seconds, int(self.anchor_at)])
        if at > self.anchor_at:
            self.anchor_at, self.anchor_server = float(at), self.server_seconds()
        return self.now()

    def advance(self, now: float) -> None:
        """Faults due by ``now`` start showing; lost nodes due back come back as new
        machines; hot GPUs past their cool-down cool."""
        f = self.figures
        while self.next_fault < len(self.schedule) and self.schedule[self.next_fault].at <= now:
            fault = self.schedule[self.next_fault]
            self.next_fault += 1
            f.faults_by_cause[fault.cause] += 1
            self._show(fault, fault.at, fault.outcome)
        while self.relapses and self.relapses[0][0] <= now:
            at, _, fault = self.relapses.pop(0)
            f.relapses += 1
            f.faults_by_cause[fault.cause] += 1
            self._show(fault, at, fault.then)
        for i in sorted(self.gone):
            n = self.nodes[i]
            if n.gone_until is not None and n.gone_until <= now:
                self.gone.discard(i)
                f.lost_s += n.gone_until - (n.claimed_at or n.gone_until)
                # A new machine under the same name: no record, no faults.
                self.nodes[i] = SimNode(name=n.name, index=i, gpus=self.gpus,
                                        generation=n.generation + 1, boot=n.boot + 1)
        for n in self.nodes.values():
            n.faults = [a for a in n.faults if a.cool_at is None or a.cool_at > now]

    def dues(self, now: float) -> list[Due]:
        """The kernel-log XIDs that appear after the tick at ``now`` and before the next
        one, for the watchers (whole seconds after ``now``; one at the next tick's instant
        or later is that tick's). Faults on lost nodes show nothing."""
        until = now + self.settings.interval.total_seconds()
        out: list[Due] = []

        def due(fault: Fault) -> None:
            xid = CAUSES[fault.cause].xid
            after = math.ceil(fault.at) - now if fault.at > now else 0
            if xid is not None and now + after < until and fault.node not in self.gone:
                out.append(Due(after=int(after), at=int(now + after),
                               node=self.name(fault.node), gpu=fault.gpu, xid=xid))

        schedule = self.schedule
        while self.next_report < len(schedule) and schedule[self.next_report].at < until:
            fault = schedule[self.next_report]
            self.next_report += 1
            if fault.at > now:  # one at or before the tick is the tick's
                due(fault)
        for at, seq, fault in self.relapses:
            if at >= until:
                break
            if seq not in self.reported_relapses and at > now:
                self.reported_relapses.add(seq)
                due(dataclasses.replace(fault, at=at))
        return out

    def _show(self, fault: Fault, at: float, outcome: str) -> None:
        if fault.node in self.gone:
            self.figures.faults_on_lost_nodes += 1
            return
        n = self.node(self.name(fault.node))
        cause = CAUSES[fault.cause]
        cool_at = at + self.model.repair_minutes.cool_down * 60 if cause.gpu_temp else None
        n.faults.append(ActiveFault(fault=fault, since=at, outcome=outcome,
                                    action=self._action_of(fault), cool_at=cool_at))

    def _action_of(self, fault: Fault) -> Action:
        key = (fault.cause, fault.remapped)
        if key not in self._fault_actions:
            n = SimNode(name="probe-0", index=0, gpus=1)
            r = NodeReadings(node=n.name, gpus=[self._reading(n, 0, [ActiveFault(
                fault=fault, since=0, outcome="", action=Action.NONE)])])
            self._fault_actions[key] = evaluate_node(r, self.settings.policy).action
        return self._fault_actions[key]

    def _reading(self, n: SimNode, gpu: int, faults: list[ActiveFault]) -> GpuReading:
        """What dcgm-exporter would show of one GPU with these faults."""
        values: dict[str, Any] = {}
        for a in faults:
            cause = CAUSES[a.fault.cause]
            if cause.xid is not None:
                values["xid"] = cause.xid
            if cause.gpu_temp is not None:
                values["gpu_temp"] = cause.gpu_temp
            if cause.hbm3:
                values["ecc_dbe_volatile"] = values.get("ecc_dbe_volatile", 0) + 1
                if a.fault.remapped:
                    values["row_remap_pending"] = 1
                else:
                    values["row_remap_failure"] = 1
        return GpuReading(gpu=str(gpu), uuid=n.uuid(gpu), model_name=MODEL_NAME, **values)

    def readings(self, n: SimNode) -> NodeReadings:
        by_gpu: dict[int, list[ActiveFault]] = {}
        for a in n.faults:
            by_gpu.setdefault(a.fault.gpu, []).append(a)
        return NodeReadings(node=n.name, gpus=[self._reading(n, g, by_gpu[g])
                                               for g in sorted(by_gpu)])

    def verdict(self, n: SimNode, policy: PolicySettings,
                acked: dict[str, int] | None = None) -> Verdict:
        return evaluate_node(self.readings(n), policy,
                             acknowledged_xids={**n.acked, **(acked or {})})

    def _repaired(self, n: SimNode, repair: Action, now: float) -> None:
        """A repair that worked clears what it can (a reboot restarts the exporter too, so
        the last-XID gauge clears); a relapse brings the first fault back later."""
        kept: list[ActiveFault] = []
        for a in n.faults:
            if a.action == Action.QUARANTINE or SEVERITY[a.action] > SEVERITY[repair]:
                kept.append(a)
                continue
            if a.outcome == "relapse":
                self._seq += 1
                bisect.insort(self.relapses, (now + a.fault.relapse_after, self._seq, a.fault))
        n.faults = kept

    def hangs(self, n: SimNode, step: str) -> bool:
        """A hanging repair hangs at its first step only; the next one works."""
        if n.outcome != "hang":
            return False
        if n.hung_on is None:
            n.hung_on = step
        if n.hung_on == step:
            return True
        n.outcome = "success"
        return False

    def _lose(self, n: SimNode, now: float) -> ApplicationError:
        self.figures.nodes_lost += 1
        self.gone.add(n.index)
        n.gone_until = now + self.model.replace_lost_node_days * DAY
        n.faults = []
        if n.claimed_at is not None:
            self.figures.out_of_service_s += now - n.claimed_at
        n.claimed_at = now
        return ApplicationError(f"node {n.name} is gone (the machine did not come back; "
                                "replaced later under its name)", type=errors.NODE_GONE,
                                non_retryable=True)

    def _sample(self) -> None:
        oos = sum(1 for i, n in self.nodes.items()
                  if i not in self.gone and n.state in OUT_OF_SERVICE_STATES)
        q = sum(1 for i, n in self.nodes.items()
                if i not in self.gone and n.state == NodeState.QUARANTINED)
        f = self.figures
        f.max_by_state = max(f.max_by_state, oos)
        f.max_quarantined = max(f.max_quarantined, q)

    def _present(self, name: str) -> SimNode:
        n = self.node(name)
        if n.index in self.gone:
            raise ApplicationError(f"node {name} not found", type=errors.NODE_GONE,
                                   non_retryable=True)
        return n

    def shard_sizes(self, shards: int) -> list[int]:
        if shards not in self._shard_sizes:
            sizes = [0] * shards
            for i in range(self.size):
                sizes[shard_of(self.name(i), shards)] += 1
            self._shard_sizes[shards] = sizes
        return self._shard_sizes[shards]

    def due_to_end(self) -> bool:
        """The next observation would be at or past the end (tick n is at n x interval)."""
        return self.end_at is not None and \
            self.ticks * self.settings.interval.total_seconds() >= self.end_at

    def quiet(self) -> bool:
        """No remediation in flight but quarantine holds, as the fleet knows it: every node
        present is healthy or quarantined (heat cordons, approvals, drains, repairs and
        validations are not quiet)."""
        return all(n.state in (NodeState.HEALTHY, NodeState.QUARANTINED)
                   for i, n in self.nodes.items() if i not in self.gone)

    def handover_due(self) -> bool:
        """The next full tick is at or past the segment's boundary, and the fleet is quiet."""
        return self.handover_at is not None and self.hand_over is not None and \
            self.ticks * self.settings.interval.total_seconds() >= self.handover_at \
            and self.quiet()

    async def close(self) -> None:
        """The run is over: the books close at ``end`` and the clock is told.

        Called from the first observation past the end, which never returns: the detector
        stays at that tick (its view is that of the last tick inside the run) until the
        worker stops, and what the remediations still do meanwhile is past the end and
        not counted. This keeps the result off the server's clock, which drifts by the
        run's own processing time."""
        if self.final is None:
            assert self.end_at is not None
            self.advance(self.end_at)  # every fault of the period counts, seen or not
            self.end(self.end_at)
            self.final = copy.deepcopy(self.figures)
            await activity.client().get_workflow_handle(CLOCK_WORKFLOW_ID).signal(
                SimulationClockWorkflow.over)

    def end(self, now: float) -> None:
        """Close the books at the end of the run: what is still out counts until now."""
        for i, n in self.nodes.items():
            if i in self.gone:
                self.figures.lost_s += now - (n.claimed_at or now)
            elif n.claimed_at is not None and n.state == NodeState.QUARANTINED:
                self.figures.quarantined_s += now - n.claimed_at
            elif n.claimed_at is not None:
                self.figures.out_of_service_s += now - n.claimed_at

    # ------------------------------------------------------------ the activities

    def activities(self) -> list[Any]:
        fleet = self
        f = self.figures

        @activity.defn(name="observe_fleet")
        async def observe_fleet(inp: ObserveInput) -> FleetObservation:
            only = set(inp.nodes)  # a node-only tick: the nodes a watcher reported
            if fleet.final is not None or (inp.shard == 0 and not only
                                           and fleet.due_to_end()):
                await fleet.close()
                await asyncio.Event().wait()  # until the worker stops (cancelled)
            if inp.shard == 0 and not only and fleet.handover_due():
                assert fleet.hand_over is not None
                at = fleet.ticks * fleet.settings.interval.total_seconds()
                if await fleet.hand_over(at):
                    fleet.handovers.append(at)
                    await asyncio.Event().wait()  # the next server observes this tick
            if only:
                now = fleet.reported([s for r in inp.reports if r.node in only
                                      and (s := kernel_second(r.line)) is not None])
            else:
                now = fleet.ticked() if inp.shard == 0 else fleet.now()
            fleet.advance(now)
            f.observations += 1
            if only:
                fleet.node_ticks += 1
            elif fleet.watchers and inp.shard == 0 and (dues := fleet.dues(now)):
                await activity.client().get_workflow_handle(WATCHER_WORKFLOW_ID).signal(
                    SimulationWatcherWorkflow.due, dues)
            fleet._sample()
            verdicts: list[Verdict] = []
            remediating: list[NodeStatus] = []
            gone_here = 0
            for i in sorted(fleet.nodes):
                n = fleet.nodes[i]
                if only and n.name not in only:
                    continue
                if inp.shards > 1 and shard_of(n.name, inp.shards) != inp.shard:
                    continue
                if i in fleet.gone:
                    gone_here += 1
                    continue
                if n.faults:
                    v = fleet.verdict(n, inp.policy)
                    if v.action in (Action.THERMAL, Action.RESET, Action.REBOOT,
                                    Action.QUARANTINE):
                        verdicts.append(v)
                if n.state != NodeState.HEALTHY:
                    remediating.append(NodeStatus(node=n.name, state=n.state,
                                                  tainted=n.tainted, label=n.state.value))
            managed = fleet.shard_sizes(inp.shards)[inp.shard] - gone_here
            obs = FleetObservation(managed_nodes=managed, readable_nodes=managed,
                                   verdicts=verdicts, remediating=remediating)
            if inp.pool_label:
                named = {v.node for v in verdicts} | {r.node for r in remediating}
                obs.pool_of = {m: fleet.domain(fleet.index_of(m)) for m in sorted(named)}
                sizes: dict[str, int] = {}
                for i in range(fleet.size):
                    if i not in fleet.gone and (inp.shards == 1 or shard_of(
                            fleet.name(i), inp.shards) == inp.shard):
                        d = fleet.domain(i)
                        sizes[d] = sizes.get(d, 0) + 1
                obs.pool_sizes = sizes
            if inp.lease_workflows:
                obs.lease_holders = [await lease_status(w) for w in inp.lease_workflows]
            if inp.ledger_lookback and verdicts and fleet.ledger:
                notes = notes_for(verdicts, {v.node: "" for v in verdicts}, fleet.ledger,
                                  fleet.start + timedelta(seconds=now) - inp.ledger_lookback)
                obs.ledger = {k: x for k, x in notes.items()
                              if x.last_repair is not None or x.serial_faults}
            return obs

        async def lease_status(wid: str) -> LeaseStatus:
            # A claimed node's remediation runs (its state is the node's, as the search
            # attribute the remediation writes would say); any other is asked of Temporal.
            node = wid.removeprefix("remediation-")
            n = fleet.nodes.get(fleet.index_of(node))
            if n is not None and n.index not in fleet.gone and n.state != NodeState.HEALTHY:
                return LeaseStatus(workflow_id=wid, status="RUNNING", state=n.state.value)
            from activities.visibility import described
            return await described(activity.client(), wid)

        @activity.defn(name="report_admission")
        async def report_admission(report: AdmissionReport) -> None:
            f.max_in_use = max(f.max_in_use, report.in_use)
            f.max_waiting = max(f.max_waiting, report.waiting)
            f.budgets.add(report.budget)
            if report.breaker_open and not f.breaker_open:
                f.breaker_trips += 1
            f.breaker_open = report.breaker_open

        @activity.defn(name="claim_node")
        async def claim_node(inp: ClaimInput) -> ClaimResult:
            now = fleet.now()
            n = fleet._present(inp.node)
            mine = n.state != NodeState.HEALTHY
            pre = n.pre_cordoned if mine else n.cordoned
            if not inp.dry_run:
                n.pre_cordoned = pre
                n.cordoned = n.tainted = True
                n.state = inp.state
                if n.claimed_at is None:
                    n.claimed_at = now
                    n.onset = min((a.since for a in n.faults), default=now)
                    first = min(n.faults, key=lambda a: a.since, default=None)
                    n.outcome = first.outcome if first else "success"
                    n.hung_on = None
                fleet._sample()
            return ClaimResult(previously_cordoned=pre, recent_remediations=len(n.history),
                               gpus=n.gpus, history=list(n.history),
                               boot_id=f"boot-{n.boot}", uid=f"uid-{n.generation}")

        @activity.defn(name="set_node_state")
        async def set_node_state(inp: StateInput) -> None:
            if not inp.dry_run:
                fleet._present(inp.node).state = inp.state
                fleet._sample()

        @activity.defn(name="release_node")
        async def release_node(inp: ReleaseInput) -> None:
            if inp.dry_run:
                return
            now = fleet.now()
            n = fleet._present(inp.node)
            if inp.claim_unconfirmed and not n.tainted:
                return
            n.history = [h for h in n.history if h.workflow_id != inp.history.workflow_id
                         or h.started != inp.history.started] + [inp.history]
            n.acked.update(inp.acknowledged_xids)
            outcome = str(inp.outcome.value if hasattr(inp.outcome, "value") else inp.outcome)
            f.outcomes[outcome] = f.outcomes.get(outcome, 0) + 1
            if outcome == "quarantined":
                f.quarantines += 1
                fleet.quarantined_at.setdefault(n.name, now)
                n.state = NodeState.QUARANTINED
            else:
                n.state = NodeState.HEALTHY
                n.tainted = False
                if inp.uncordon:
                    n.cordoned = False
                if n.claimed_at is not None:
                    f.out_of_service_s += now - n.claimed_at
                    if outcome == "healthy":
                        f.mttr.setdefault(inp.history.action, []).append(
                            now - (n.onset if n.onset is not None else n.claimed_at))
                n.claimed_at = n.onset = None
            fleet._sample()

        @activity.defn(name="drain_node")
        async def drain_node(inp: DrainInput) -> DrainResult:
            fleet._present(inp.node)
            if inp.dry_run:
                return DrainResult(outcome="planned", remaining=["training/worker-0"])
            return DrainResult(outcome="drained", evicted=["training/worker-0"])

        async def job(inp: NodeJobInput) -> NodeJobResult:
            if inp.dry_run:
                return NodeJobResult(succeeded=True, message="planned", job_name=inp.name)
            now = fleet.now()
            n = fleet._present(inp.node)
            started = n.jobs.setdefault(inp.name, now)
            minutes = fleet.model.repair_minutes
            took = {"validate": minutes.validation, "gpu-reset": minutes.reset,
                    "reboot": 0.0}[inp.kind] * 60
            if inp.kind == "gpu-reset" and fleet.hangs(n, inp.name):
                # The Job never finishes: the workflow's job_timeout decides.
                raise ApplicationError(f"Job {inp.name} running", type=errors.JOB_RUNNING)
            if now < started + took:
                raise ApplicationError(f"Job {inp.name} running", type=errors.JOB_RUNNING)
            n.jobs.pop(inp.name, None)
            if inp.kind == "gpu-reset":
                if n.outcome == "node_lost":
                    raise fleet._lose(n, now)
                fleet._repaired(n, Action.RESET, now)
            return NodeJobResult(succeeded=True, message=f"{inp.kind} done", job_name=inp.name)

        @activity.defn(name="poll_node_job")
        async def poll_node_job(inp: NodeJobInput) -> NodeJobResult:
            return await job(inp)

        @activity.defn(name="run_node_job")
        async def run_node_job(inp: NodeJobInput) -> NodeJobResult:
            return await job(inp)

        @activity.defn(name="delete_node_job")
        async def delete_node_job(inp: NodeJobInput) -> None:
            n = fleet.nodes.get(fleet.index_of(inp.node))
            if n is not None:
                n.jobs.pop(inp.name, None)

        @activity.defn(name="check_node_returned")
        async def check_node_returned(inp: ReturnInput) -> ReturnResult:
            now = fleet.now()
            n = fleet._present(inp.node)
            if n.outcome == "node_lost":
                raise fleet._lose(n, now)
            # The request is the workflow's time: its simulated second, as now() counts.
            back = fleet.at_server(inp.reboot_requested_at) \
                + fleet.model.repair_minutes.reboot * 60
            if fleet.hangs(n, f"reboot-{inp.reboot_requested_at.isoformat()}") or now < back:
                raise ApplicationError(f"{inp.node}: boot ID unchanged", type=NODE_NOT_BACK)
            n.boot += 1
            fleet._repaired(n, Action.REBOOT, now)
            return ReturnResult(boot_id=f"boot-{n.boot}", allocatable_gpus=n.gpus,
                                confirmed_by="boot-id",
                                message=f"{inp.node} rebooted (boot ID {inp.old_boot_id} -> "
                                        f"boot-{n.boot})")

        @activity.defn(name="mark_out_of_service")
        async def mark_out_of_service(inp: OutOfServiceInput) -> str:
            return ("tainted" if inp.on else "untainted") + f" {inp.node} out-of-service"

        @activity.defn(name="read_node_health")
        async def read_node_health(inp: NodeHealthInput) -> NodeHealth:
            n = fleet._present(inp.node)
            fleet.advance(fleet.now())
            v = fleet.verdict(n, inp.policy, inp.acknowledged)
            return NodeHealth(readable=True, verdict=v,
                              thermal_recovered=not any(a.cool_at for a in n.faults))

        @activity.defn(name="check_thermal")
        async def check_thermal(inp: ThermalCheckInput) -> ThermalCheckResult:
            n = fleet._present(inp.node)
            fleet.advance(fleet.now())
            state = "hot" if any(a.cool_at for a in n.faults) else "cool"
            if state == inp.now:
                raise ApplicationError(f"still {state}", type=errors.THERMAL_UNCHANGED)
            return ThermalCheckResult(outcome=state, message=f"GPUs {state}")

        @activity.defn(name="watch_thermal")
        async def watch_thermal(inp: ThermalWatchInput) -> ThermalWatchResult:
            n = fleet._present(inp.node)
            fleet.advance(fleet.now())
            hot = any(a.cool_at for a in n.faults)
            return ThermalWatchResult(outcome="hot" if hot else "recovered",
                                      message="hot" if hot else "cool")

        @activity.defn(name="check_gpus_free")
        async def check_gpus_free(inp: GpusFreeInput) -> GpusFree:
            n = fleet._present(inp.node)
            return GpusFree(allocatable_gpus=n.gpus, message="free")

        @activity.defn(name="restart_device_plugin")
        async def restart_device_plugin(inp: DevicePluginInput) -> DevicePluginRestart:
            n = fleet._present(inp.node)
            return DevicePluginRestart(evicted=[], allocatable_gpus=n.gpus,
                                       message="nothing to restart")

        @activity.defn(name="pause_gpu_operands")
        async def pause_gpu_operands(inp: OperandsInput) -> OperandsPaused:
            fleet._present(inp.node)
            return OperandsPaused(node=inp.node,
                                  changed={deploy_label(o): "true" for o in inp.operands},
                                  left={}, message="paused", dry_run=inp.dry_run)

        @activity.defn(name="restore_gpu_operands")
        async def restore_gpu_operands(inp: OperandsPaused) -> None:
            return None

        @activity.defn(name="check_operands_gone")
        async def check_operands_gone(inp: OperandsWaitInput) -> OperandsState:
            fleet._present(inp.node)
            return OperandsState(pods=[], allocatable_gpus=0, message="gone")

        @activity.defn(name="check_operands_back")
        async def check_operands_back(inp: OperandsWaitInput) -> OperandsState:
            n = fleet._present(inp.node)
            return OperandsState(pods=["gpu-operator/operand"], allocatable_gpus=n.gpus,
                                 message="back")

        @activity.defn(name="record_event")
        async def record_event(inp: NodeEventInput) -> None:
            return None

        @activity.defn(name="list_running_remediations")
        async def list_running_remediations(
                inp: RunningRemediationsInput) -> RunningRemediations:
            return RunningRemediations(remediations=[])  # a fresh fleet: nothing runs yet

        @activity.defn(name="rewrite_state_mirror")
        async def rewrite_state_mirror(inp: MirrorRepair) -> bool:
            n = fleet._present(inp.node)
            if n.state.value != inp.shown:
                return False
            n.state = inp.state
            return True

        @activity.defn(name="release_orphan")
        async def release_orphan(req: OrphanRelease) -> None:
            # No operator acts in a simulation, and nothing here loses its workflow.
            raise ApplicationError(f"{req.node}: its remediation is not an orphan's",
                                   type=errors.NOT_ORPHAN, non_retryable=True)

        @activity.defn(name="read_limits")
        async def read_limits() -> LimitsSettings:
            return fleet.limits

        @activity.defn(name="confirm_lease")
        async def confirm_lease(chk: LeaseCheck) -> LeaseAnswer:
            from activities.visibility import VisibilityActivities
            return await VisibilityActivities(activity.client(),
                                              detector_id=DETECTOR_WORKFLOW_ID).confirm_lease(chk)

        @activity.defn(name="record_repair")
        async def record_repair(inp: LedgerInput) -> LedgerResult:
            if any(e.id == inp.entry.id for e in fleet.ledger):
                return LedgerResult(entry=inp.entry.id, written=False)
            fleet.ledger.append(inp.entry)
            return LedgerResult(entry=inp.entry.id, written=True)

        @activity.defn(name="cordon_for_incident")
        async def cordon_for_incident(inp: IncidentCordon) -> IncidentCordonResult:
            # A cordon takes no workload away in the simulation; the incident is the
            # detector's record, counted from its view.
            return IncidentCordonResult(cordoned=sorted(inp.cordon),
                                        uncordoned=sorted(inp.uncordon))

        @activity.defn(name="isolate_gpu")
        async def isolate_gpu(inp: IsolateGpuInput) -> IsolateGpuResult:
            # The simulated fleet serves no DRA: the whole-node path, as on a cluster
            # without resource.k8s.io.
            return IsolateGpuResult(isolated=False,
                                    why_not="the simulated fleet serves no DeviceTaintRule")

        @activity.defn(name="set_gpu_taint")
        async def set_gpu_taint(inp: GpuTaintInput) -> str:
            return "no DeviceTaintRule in the simulated fleet"

        return [record_repair, cordon_for_incident, isolate_gpu, set_gpu_taint,
                observe_fleet, report_admission, claim_node, set_node_state, release_node,
                drain_node, poll_node_job, run_node_job, delete_node_job, check_node_returned,
                mark_out_of_service, read_node_health, check_thermal, watch_thermal,
                check_gpus_free, restart_device_plugin, pause_gpu_operands,
                restore_gpu_operands, check_operands_gone, check_operands_back, record_event,
                list_running_remediations, rewrite_state_mirror, read_limits, confirm_lease,
                release_orphan]


class StepClock(Interceptor):
    """Counts every activity of a workflow as one of its steps (SimFleet.now), so a
    remediation's moments count from its previous step whatever that step was."""

    def __init__(self, fleet: SimFleet) -> None:
        self.fleet = fleet

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        fleet = self.fleet

        class Stepped(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                fleet.now()
                return await super().execute_activity(input)

        return Stepped(next)
