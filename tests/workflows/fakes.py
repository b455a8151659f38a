"""In-memory stand-ins for the cluster activities, registered under the real names.

They keep a small model of each node (cordon, taint, label, history) so workflow
tests can assert what a remediation would leave behind, and they record every
call so a test can assert order and the absence of mutations.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from activities.visibility import (
    RunningRemediation,
    RunningRemediations,
    RunningRemediationsInput,
    VisibilityActivities,
    described,
)
from policy.models import Action, Finding, Verdict
from workflows import transitions
from workflows.ids import remediation_workflow_id, shard_of
from workflows.incidents import IncidentCordon, IncidentCordonResult
from workflows.isolation import GpuTaintInput, IsolateGpuInput, IsolateGpuResult, rule_name
from workflows.leases import LeaseAnswer, LeaseCheck, LeaseStatus
from workflows.ledger import LedgerEntry, LedgerInput, LedgerResult, note_for
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
    OutOfServiceInput,
    ReleaseInput,
    ReturnInput,
    ReturnResult,
    StateInput,
    ThermalCheckInput,
    ThermalCheckResult,
    ThermalWatchInput,
    ThermalWatchResult,
)
from workflows.operands import (
    DEFAULT_OPERANDS,
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


@dataclass
class FakeNode:
    name: str
    gpus: int = 8
    cordoned: bool = False
    tainted: bool = False
    state: NodeState = NodeState.HEALTHY
    history: list[HistoryEntry] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    pre_cordoned: bool = False
    states_seen: list[str] = field(default_factory=list)
    # check_node_returned answers "not back" this many times (a very long number: never).
    returns_after: int = 0
    # The GPU Operator's deploy labels, as the node carries them ({} : no operator). A GPU
    # reset fails while any is "true" (the operands hold the GPUs), like on a real node.
    operand_labels: dict[str, str] = field(default_factory=lambda: {
        deploy_label(o): "true" for o in DEFAULT_OPERANDS})
    # Looks that answer "not yet": operands still leaving / coming back, GPUs not free
    # (each look is a retry 5 s later: tests that wait on wall-clock time keep these 0).
    operands_leave_after: int = 0
    # The pause record on the node (annotation gpu-remediate.io/operands-paused).
    pause_record: dict[str, str] = field(default_factory=dict)
    # The node is replaced (another UID) when this activity looks at it: it says NodeGone.
    replaced_at: str = ""
    operands_return_after: int = 0
    gpus_free_after: int = 0
    # The device plugin holds this many GPUs unhealthy (a critical XID it saw) until its
    # pod restarts, as NVIDIA's does; ``gpu_broken``: they are unhealthy again after it.
    plugin_unhealthy: int = 0
    gpu_broken: bool = False
    # The node's labels (fault domains: the observation reports each level's value).
    labels: dict[str, str] = field(default_factory=dict)
    # Cordoned by the detector for a domain incident (the activity's annotation).
    incident: str = ""


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

LIVE: list[FakeCluster] = []
"""The fake clusters of the running test (tests/conftest.py checks their state writes)."""


@dataclass
class FakeCluster:
    nodes: dict[str, FakeNode] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    mutations: list[str] = field(default_factory=list)
    # Scripted outcomes, consumed in order; the last one repeats.
    job_results: dict[str, list[bool]] = field(default_factory=dict)
    drain_results: list[DrainResult] = field(default_factory=list)
    thermal_results: list[ThermalWatchResult] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    observe_error: str | None = None
    reports: list[AdmissionReport] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Each node's first N eviction rounds are refused by a PDB (0: use drain_results).
    drain_blocked_rounds: int = 0
    drain_rounds: dict[str, int] = field(default_factory=dict)
    # A Job of this kind (or a claim of this node) waits until its event is set.
    job_gates: dict[str, threading.Event] = field(default_factory=dict)
    # The kinds of the Jobs now waiting at their gate (the step's Job exists and is polled).
    at_gate: list[str] = field(default_factory=list)
    claim_gates: dict[str, threading.Event] = field(default_factory=dict)
    report_error: str | None = None
    # Out-of-service counts (AwaitingApproval/Draining/Repairing/Validating, and Cordoned)
    # sampled at every observe_fleet call and after every node mutation.
    oos_samples: list[tuple[int, int]] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    # State writes that are not edges of the state machine (workflows/transitions.py): every
    # test with a fake worker fails on one (see worker_for).
    illegal_transitions: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    # What read_node_health reports after validation, consumed in order (last repeats).
    health: list[NodeHealth] = field(default_factory=list)
    # Labelled nodes whose workflow is gone, as the observation reports them.
    orphans: list[str] = field(default_factory=list)
    # What Temporal visibility lists as running remediations (by node), or its error.
    visible_remediations: list[str] = field(default_factory=list)
    visibility_error: str | None = None
    # Leases: with a detector's ID, a remediation's confirmation goes to that detector (the
    # real activity); without one, the fake answers (``lease_refused``: why it says no).
    detector_id: str = ""
    lease_refused: str = ""
    # What Temporal says of remediations that closed (by node: COMPLETED, TERMINATED, ...);
    # visible_remediations are running. Any other lease holder is described for real.
    closed_remediations: dict[str, str] = field(default_factory=dict)
    # The state Temporal records for a visible remediation (its RemediationState search
    # attribute), where it is not what the node's label says (a node that relabelled
    # itself); by default the label's.
    visible_states: dict[str, NodeState] = field(default_factory=dict)
    # The worker's limits (read_limits); None: the detector's own settings (it may tighten,
    # never loosen), as a worker whose config file started it would say.
    limits: LimitsSettings | None = None
    # An API brownout for a node's claim: this many attempts fail with a 500 first.
    claim_failures: dict[str, int] = field(default_factory=dict)
    # Nodes whose operand pause turns the labels off and then loses its answer.
    pause_answer_lost: set[str] = field(default_factory=set)
    # The repair ledger (record_repair), and why its writes fail ("": they succeed).
    ledger: list[LedgerEntry] = field(default_factory=list)
    ledger_fails: str = ""
    # Per-GPU isolation: DeviceTaintRules by name -> effect; a why_not refuses every rule
    # (API absent, RBAC) as the real activity does.
    gpu_rules: dict[str, str] = field(default_factory=dict)
    isolation_why_not: str = ""

    def node(self, name: str) -> FakeNode:
        return self.nodes.setdefault(name, FakeNode(name))

    def _next(self, script: list[Any], default: Any) -> Any:
        if not script:
            return default
        return script.pop(0) if len(script) > 1 else script[0]

    def _sample(self) -> None:
        states = [n.state for n in self.nodes.values() if n.state != NodeState.HEALTHY]
        oos = sum(1 for st in states if st in OUT_OF_SERVICE_STATES)
        self.oos_samples.append((oos, sum(1 for st in states if st == NodeState.CORDONED)))

    def max_out_of_service(self, cordoned_counts: bool = True) -> int:
        with self.lock:
            return max((o + (c if cordoned_counts else 0) for o, c in self.oos_samples),
                       default=0)

    def __post_init__(self) -> None:
        LIVE.append(self)

    def transition(self, node: str, old: NodeState, new: NodeState) -> None:
        """Record a state write outside the state machine (the real activities only count
        them; here it fails the test)."""
        if not transitions.allowed(old, new):
            self.illegal_transitions.append(f"{node}: {old.value} -> {new.value}")

    def release_gates(self) -> None:
        for gate in [*self.job_gates.values(), *self.claim_gates.values()]:
            gate.set()

    def jobs_run(self) -> list[str]:
        return [c[1].kind for c in self.calls if c[0] == "run_node_job"]

    def activities(self) -> list[Any]:
        cluster = self

        @activity.defn(name="claim_node")
        def claim_node(inp: ClaimInput) -> ClaimResult:
            gate = cluster.claim_gates.get(inp.node)
            if gate is not None:
                gate.wait(30)
            with cluster.lock:
                if cluster.claim_failures.get(inp.node, 0) > 0:
                    cluster.claim_failures[inp.node] -= 1
                    cluster.calls.append(("claim_failed", inp))
                    raise ApplicationError("patch node: 500 Internal Server Error",
                                           type="ServerError")
                cluster.calls.append(("claim_node", inp))
                n = cluster.node(inp.node)
                mine = n.state != NodeState.HEALTHY
                pre = n.pre_cordoned if mine else n.cordoned
                if not inp.dry_run:
                    cluster.mutations.append(f"claim {inp.node}")
                    n.pre_cordoned = pre
                    n.cordoned = n.tainted = True
                    cluster.transition(inp.node, n.state, inp.state)
                    n.state = inp.state
                    n.states_seen.append(inp.state.value)
                    cluster.claimed.append(inp.node)
                    cluster._sample()
                return ClaimResult(previously_cordoned=pre, recent_remediations=len(n.history),
                                   gpus=n.gpus, history=list(n.history))

        @activity.defn(name="set_node_state")
        def set_node_state(inp: StateInput) -> None:
            with cluster.lock:
                cluster.calls.append(("set_node_state", inp))
                if not inp.dry_run:
                    cluster.mutations.append(f"state {inp.node} {inp.state.value}")
                    n = cluster.node(inp.node)
                    cluster.transition(inp.node, n.state, inp.state)
                    n.state = inp.state
                    n.states_seen.append(inp.state.value)
                    cluster._sample()

        @activity.defn(name="release_node")
        def release_node(inp: ReleaseInput) -> None:
            with cluster.lock:
                cluster.calls.append(("release_node", inp))
                if inp.dry_run:
                    return
                if inp.node_untouched:  # a per-GPU remediation: the record only
                    n = cluster.node(inp.node)
                    n.history = [*n.history, inp.history]
                    n.acked.update(inp.acknowledged_xids)
                    return
                if inp.claim_unconfirmed and not cluster.node(inp.node).tainted:
                    return  # like the real one: the claim never landed, nothing to undo
                cluster.mutations.append(f"release {inp.node} {inp.outcome}")
                n = cluster.node(inp.node)
                n.history = [h for h in n.history if h.workflow_id != inp.history.workflow_id
                             or h.started != inp.history.started] + [inp.history]
                n.acked.update(inp.acknowledged_xids)
                if inp.outcome == "quarantined":
                    cluster.transition(inp.node, n.state, NodeState.QUARANTINED)
                    n.state = NodeState.QUARANTINED
                else:
                    n.state = NodeState.HEALTHY
                    n.tainted = False
                    if inp.uncordon:
                        n.cordoned = False
                n.states_seen.append(n.state.value)
                cluster._sample()

        @activity.defn(name="drain_node")
        def drain_node(inp: DrainInput) -> DrainResult:
            with cluster.lock:
                cluster.calls.append(("drain_node", inp))
                if inp.dry_run:
                    return DrainResult(outcome="planned", remaining=["team-a/trainer-1"])
                if inp.force:
                    return DrainResult(outcome="drained", forced=["team-a/trainer-1"])
                if cluster.drain_blocked_rounds:
                    rounds = cluster.drain_rounds[inp.node] = \
                        cluster.drain_rounds.get(inp.node, 0) + 1
                    if rounds <= cluster.drain_blocked_rounds:
                        return DrainResult(outcome="blocked", remaining=["team-a/trainer-1"],
                                           blocking_pdb="team-a/trainer")
                return cluster._next(cluster.drain_results,
                                     DrainResult(outcome="drained", evicted=["team-a/trainer-1"]))

        @activity.defn(name="run_node_job")
        def run_node_job(inp: NodeJobInput) -> NodeJobResult:
            gate = cluster.job_gates.get(inp.kind)
            if gate is not None and not inp.dry_run:
                with cluster.lock:
                    cluster.at_gate.append(inp.kind)
                gate.wait(30)
                with cluster.lock:
                    cluster.at_gate.remove(inp.kind)
            with cluster.lock:
                cluster.calls.append(("run_node_job", inp))
                if inp.dry_run:
                    return NodeJobResult(succeeded=True, message="planned", job_name=inp.name)
                cluster.mutations.append(f"job {inp.kind} {inp.node}")
                held = [k for k, v in cluster.node(inp.node).operand_labels.items()
                        if v == "true"]
                if inp.kind == "gpu-reset" and held:
                    return NodeJobResult(succeeded=False, job_name=inp.name,
                                         message="Unable to reset GPU: in use by "
                                                 f"{', '.join(held)}")
                ok = cluster._next(cluster.job_results.get(inp.kind, []), True)
                return NodeJobResult(succeeded=ok, message="ok" if ok else "diag failed",
                                     job_name=inp.name)

        @activity.defn(name="poll_node_job")
        def poll_node_job(inp: NodeJobInput) -> NodeJobResult:
            # Answers at the first look; the tests of the wait itself are in
            # tests/activities/test_jobs.py against the cluster simulator.
            result: NodeJobResult = run_node_job(inp)
            return result

        @activity.defn(name="delete_node_job")
        def delete_node_job(inp: NodeJobInput) -> None:
            with cluster.lock:
                cluster.calls.append(("delete_node_job", inp))
                cluster.mutations.append(f"delete job {inp.kind} {inp.node}")

        @activity.defn(name="watch_thermal")
        def watch_thermal(inp: ThermalWatchInput) -> ThermalWatchResult:
            with cluster.lock:
                cluster.calls.append(("watch_thermal", inp))
                return cluster._next(cluster.thermal_results,
                                     ThermalWatchResult(outcome="recovered", message="cool"))

        @activity.defn(name="check_thermal")
        def check_thermal(inp: ThermalCheckInput) -> ThermalCheckResult:
            # The scripted watch results as states: recovered is cool, hot stays hot.
            with cluster.lock:
                cluster.calls.append(("check_thermal", inp))
                scripted = cluster._next(cluster.thermal_results,
                                         ThermalWatchResult(outcome="recovered", message="cool"))
            if scripted.outcome == "fault":
                return ThermalCheckResult(outcome="fault", verdict=scripted.verdict,
                                          message=scripted.message)
            state = "cool" if scripted.outcome == "recovered" else "hot"
            if state == inp.now:
                raise ApplicationError(f"still {state}: {scripted.message}",
                                       type="ThermalUnchanged")
            return ThermalCheckResult(outcome=state, message=scripted.message)

        @activity.defn(name="read_node_health")
        def read_node_health(inp: NodeHealthInput) -> NodeHealth:
            with cluster.lock:
                cluster.calls.append(("read_node_health", inp))
                return cluster._next(cluster.health,
                                     NodeHealth(readable=True, thermal_recovered=True))

        @activity.defn(name="pause_gpu_operands")
        def pause_gpu_operands(inp: OperandsInput) -> OperandsPaused:
            with cluster.lock:
                cluster.calls.append(("pause_gpu_operands", inp))
                labels = cluster.node(inp.node).operand_labels
                wanted = [deploy_label(o) for o in inp.operands]
                changed = {k: "true" for k in wanted if labels.get(k) == "true"}
                left = {k: labels.get(k) for k in wanted if k not in changed}
                if not inp.dry_run:
                    cluster.mutations.append(f"operands off {inp.node}")
                    labels.update({k: "false" for k in changed})
                    cluster.node(inp.node).pause_record.update(changed)
                    if inp.node in cluster.pause_answer_lost:
                        raise ApplicationError("the pause's answer was lost",
                                               type="AnswerLost", non_retryable=True)
                return OperandsPaused(node=inp.node, changed=changed, left=left,
                                      message="paused", dry_run=inp.dry_run)

        @activity.defn(name="restore_gpu_operands")
        def restore_gpu_operands(inp: OperandsPaused) -> None:
            with cluster.lock:
                cluster.calls.append(("restore_gpu_operands", inp))
                if not inp.dry_run:
                    node = cluster.node(inp.node)
                    changed = ({**node.pause_record, **inp.changed} if inp.from_record
                               else inp.changed)
                    cluster.mutations.append(f"operands on {inp.node}")
                    node.operand_labels.update(changed)
                    for label in changed:
                        node.pause_record.pop(label, None)

        def _replaced(node: FakeNode, where: str) -> None:
            if node.replaced_at == where:
                raise ApplicationError(f"node {node.name} was replaced: uid a at claim, now b",
                                       type="NodeGone", non_retryable=True)

        def _not_yet(node: FakeNode, counter: str, kind: str) -> None:
            left = getattr(node, counter)
            if left > 0:
                setattr(node, counter, left - 1)
                raise ApplicationError(f"{node.name}: not yet", type=kind)

        @activity.defn(name="check_operands_gone")
        def check_operands_gone(inp: OperandsWaitInput) -> OperandsState:
            with cluster.lock:
                cluster.calls.append(("check_operands_gone", inp))
                _not_yet(cluster.node(inp.node), "operands_leave_after", "OperandsRunning")
                return OperandsState(pods=[], allocatable_gpus=0, message="gone")

        @activity.defn(name="check_operands_back")
        def check_operands_back(inp: OperandsWaitInput) -> OperandsState:
            with cluster.lock:
                cluster.calls.append(("check_operands_back", inp))
                n = cluster.node(inp.node)
                _not_yet(n, "operands_return_after", "OperandsNotReady")
                return OperandsState(pods=["gpu-operator/x"], allocatable_gpus=n.gpus,
                                     message="back")

        @activity.defn(name="check_gpus_free")
        def check_gpus_free(inp: GpusFreeInput) -> GpusFree:
            with cluster.lock:
                cluster.calls.append(("check_gpus_free", inp))
                n = cluster.node(inp.node)
                _replaced(n, "check_gpus_free")
                _not_yet(n, "gpus_free_after", "GpusNotFree")
                if n.plugin_unhealthy:
                    raise ApplicationError(
                        f"{n.name}: allocatable nvidia.com/gpu {n.gpus - n.plugin_unhealthy} "
                        f"of {inp.expected_gpus} expected", type="GpusNotFree")
                return GpusFree(allocatable_gpus=n.gpus, message="free")

        @activity.defn(name="restart_device_plugin")
        def restart_device_plugin(inp: DevicePluginInput) -> DevicePluginRestart:
            with cluster.lock:
                cluster.calls.append(("restart_device_plugin", inp))
                n = cluster.node(inp.node)
                _replaced(n, "restart_device_plugin")
                have = n.gpus - n.plugin_unhealthy
                if have >= inp.expected_gpus or not n.operand_labels:
                    return DevicePluginRestart(evicted=[], allocatable_gpus=have,
                                               message="nothing to restart")
                cluster.mutations.append(f"device plugin restarted {inp.node}")
                if not n.gpu_broken:
                    n.plugin_unhealthy = 0
                return DevicePluginRestart(evicted=["gpu-operator/nvidia-device-plugin-x"],
                                           allocatable_gpus=have, message="restarted")

        @activity.defn(name="observe_fleet")
        async def observe_fleet(inp: ObserveInput) -> FleetObservation:
            obs = observed(inp)
            if inp.lease_workflows:
                obs.lease_holders = [await lease_status(w) for w in inp.lease_workflows]
            return obs

        async def lease_status(wid: str) -> LeaseStatus:
            # The time-skipping server has no visibility list: the scripted running and
            # closed remediations, and a describe for each other.
            node = wid.removeprefix("remediation-")
            with cluster.lock:
                running = node in cluster.visible_remediations
                closed = cluster.closed_remediations.get(node)
                state = (cluster.visible_states.get(node) or cluster.node(node).state).value \
                    if node in cluster.nodes else ""
            if running:
                return LeaseStatus(workflow_id=wid, status="RUNNING", state=state)
            if closed:
                return LeaseStatus(workflow_id=wid, status=closed)  # type: ignore[arg-type]
            return await described(activity.client(), wid)

        def observed(inp: ObserveInput) -> FleetObservation:
            with cluster.lock:
                cluster.calls.append(("observe_fleet", inp))
                if cluster.observe_error:
                    raise RuntimeError(cluster.observe_error)
                cluster._sample()
                # Like the real activity: each shard sees its own part of the fleet.
                mine = {n: node for n, node in cluster.nodes.items()
                        if shard_of(n, inp.shards) == inp.shard}
                if inp.nodes:  # a node-only observation: those nodes alone
                    mine = {n: node for n, node in mine.items() if n in inp.nodes}
                remediating = [NodeStatus(node=n.name, state=n.state, tainted=n.tainted,
                                          label=n.state.value)
                               for n in mine.values() if n.state != NodeState.HEALTHY]
                busy = {r.node for r in remediating}
                verdicts = [v for v in cluster.verdicts if v.node in mine
                            and v.node not in busy and cluster.node(v.node).acked == {}]
                # The ledger as the real observation reads it (workflows/ledger.note_for).
                ledger = {v.node: note_for(v, "", cluster.ledger, EPOCH)
                          for v in verdicts} if inp.ledger_lookback else {}
                labels = inp.domain_labels
                sizes: dict[str, dict[str, int]] = {label: {} for label in labels}
                gpus: dict[str, dict[str, int]] = {label: {} for label in labels}
                for n in mine.values():
                    for label in labels:
                        v = n.labels.get(label, "")
                        sizes[label][v] = sizes[label].get(v, 0) + 1
                        gpus[label][v] = gpus[label].get(v, 0) + n.gpus
                pool_sizes: dict[str, int] = {}
                pool_gpus: dict[str, int] = {}
                if inp.pool_label:  # as the real observation counts pools
                    for n in mine.values():
                        p = n.labels.get(inp.pool_label, "")
                        pool_sizes[p] = pool_sizes.get(p, 0) + 1
                        pool_gpus[p] = pool_gpus.get(p, 0) + n.gpus
                return FleetObservation(
                    pool_of={n.name: n.labels.get(inp.pool_label, "") for n in mine.values()}
                    if inp.pool_label else {},
                    pool_sizes=pool_sizes, pool_gpus=pool_gpus,
                    domains_of={n.name: {label: n.labels.get(label, "") for label in labels}
                                for n in mine.values()} if labels else {},
                    domain_sizes=sizes if labels else {},
                    domain_gpus=gpus if labels else {},
                    gpus_of={n.name: n.gpus for n in mine.values()},
                    managed_gpus=sum(n.gpus for n in mine.values()),
                    managed_nodes=len(mine), readable_nodes=len(mine),
                    verdicts=verdicts, remediating=remediating,
                    orphans=[n for n in cluster.orphans if n in mine],
                    ledger={n: x for n, x in ledger.items()
                            if x.last_repair is not None or x.serial_faults})

        @activity.defn(name="report_admission")
        def report_admission(report: AdmissionReport) -> None:
            with cluster.lock:
                if cluster.report_error:
                    raise RuntimeError(cluster.report_error)
                cluster.reports.append(report)

        @activity.defn(name="check_node_returned")
        def check_node_returned(inp: ReturnInput) -> ReturnResult:
            with cluster.lock:
                cluster.calls.append(("check_node_returned", inp))
                n = cluster.node(inp.node)
                if n.returns_after > 0:
                    n.returns_after -= 1
                    raise ApplicationError("boot ID unchanged", type="NodeNotBack")
                return ReturnResult(boot_id="new-boot", allocatable_gpus=n.gpus,
                                    confirmed_by="boot-id",
                                    message=f"{inp.node} rebooted (boot ID old -> new-boot)")

        @activity.defn(name="list_running_remediations")
        def list_running_remediations(inp: RunningRemediationsInput) -> RunningRemediations:
            with cluster.lock:
                cluster.calls.append(("list_running_remediations", inp))
                if cluster.visibility_error:
                    raise RuntimeError(cluster.visibility_error)
                return RunningRemediations(remediations=[
                    RunningRemediation(node=n, workflow_id=remediation_workflow_id(n),
                                       state=(cluster.visible_states.get(n)
                                              or cluster.node(n).state).value)
                    for n in cluster.visible_remediations])

        @activity.defn(name="rewrite_state_mirror")
        def rewrite_state_mirror(inp: MirrorRepair) -> bool:
            with cluster.lock:
                cluster.calls.append(("rewrite_state_mirror", inp))
                n = cluster.node(inp.node)
                if n.state.value != inp.shown:
                    return False
                cluster.mutations.append(f"mirror {inp.node} {inp.state.value}")
                n.state = inp.state
                cluster.events.append((inp.node, "StateMismatch", inp.shown))
                return True

        @activity.defn(name="mark_out_of_service")
        def mark_out_of_service(inp: OutOfServiceInput) -> str:
            with cluster.lock:
                cluster.calls.append(("mark_out_of_service", inp))
                cluster.mutations.append(f"out-of-service {inp.node} {inp.on}")
                return ("tainted" if inp.on else "untainted") + f" {inp.node} out-of-service"

        @activity.defn(name="read_limits")
        async def read_limits() -> LimitsSettings:
            with cluster.lock:
                cluster.calls.append(("read_limits", None))
                if cluster.limits is not None:
                    return cluster.limits
            detector = activity.client().get_workflow_handle(activity.info().workflow_id)
            running = await detector.query("settings", result_type=DetectorSettings)
            return LimitsSettings.from_settings(running)

        @activity.defn(name="confirm_lease")
        async def confirm_lease(chk: LeaseCheck) -> LeaseAnswer:
            """The real confirmation, with the detector that started the remediation (or
            ``detector_id``); a remediation started alone is answered here."""
            with cluster.lock:
                cluster.calls.append(("confirm_lease", chk))
            if cluster.lease_refused:
                return LeaseAnswer(live=False, why=cluster.lease_refused)
            client = activity.client()
            detector = cluster.detector_id
            if not detector:
                desc = await client.get_workflow_handle(activity.info().workflow_id).describe()
                detector = desc.parent_id or ""
            if not detector:
                return LeaseAnswer(live=True)
            return await VisibilityActivities(client, detector_id=detector).confirm_lease(chk)

        @activity.defn(name="record_repair")
        def record_repair(inp: LedgerInput) -> LedgerResult:
            with cluster.lock:
                cluster.calls.append(("record_repair", inp))
                if cluster.ledger_fails:
                    # Like the real store refusing the write (a 422 is not retried).
                    raise ApplicationError(cluster.ledger_fails, type="Invalid",
                                           non_retryable=True)
                for e in cluster.ledger:
                    if e.id == inp.entry.id:
                        return LedgerResult(entry=e.id, written=False)
                cluster.ledger.append(inp.entry)
                return LedgerResult(entry=inp.entry.id, written=True)

        @activity.defn(name="cordon_for_incident")
        def cordon_for_incident(inp: IncidentCordon) -> IncidentCordonResult:
            out = IncidentCordonResult()
            with cluster.lock:
                cluster.calls.append(("cordon_for_incident", inp))
                for name in inp.cordon:
                    n = cluster.node(name)
                    if n.cordoned and not n.incident:
                        out.already.append(name)
                    else:
                        n.cordoned, n.incident = True, inp.key
                        out.cordoned.append(name)
                    cluster.mutations.append(f"incident-cordon {name}")
                    cluster.events.append((name, "DomainIncident", inp.key))
                for name in inp.uncordon:
                    n = cluster.node(name)
                    if n.incident:
                        n.cordoned, n.incident = False, ""
                        cluster.mutations.append(f"incident-uncordon {name}")
                    out.uncordoned.append(name)
            return out

        @activity.defn(name="isolate_gpu")
        def isolate_gpu(inp: IsolateGpuInput) -> IsolateGpuResult:
            with cluster.lock:
                cluster.calls.append(("isolate_gpu", inp))
                if cluster.isolation_why_not:
                    return IsolateGpuResult(isolated=False, why_not=cluster.isolation_why_not)
                device = f"gpu-{inp.gpu}"
                name = rule_name(inp.node, device)
                if not inp.dry_run:
                    cluster.mutations.append(f"isolate {inp.node} {device}")
                    cluster.gpu_rules[name] = "NoSchedule"
                return IsolateGpuResult(isolated=True, rule=name, device=device,
                                        api_version="v1")

        @activity.defn(name="set_gpu_taint")
        def set_gpu_taint(inp: GpuTaintInput) -> str:
            with cluster.lock:
                cluster.calls.append(("set_gpu_taint", inp))
                if inp.dry_run:
                    return "dry-run"
                if inp.effect is None:
                    cluster.gpu_rules.pop(inp.rule, None)
                    return f"removed {inp.rule}"
                cluster.gpu_rules[inp.rule] = inp.effect
                return f"{inp.rule}: {inp.effect}"

        @activity.defn(name="record_event")
        def record_event(inp: NodeEventInput) -> None:
            with cluster.lock:
                cluster.calls.append(("record_event", inp))
                cluster.events.append((inp.node, inp.reason, inp.message))

        return [claim_node, set_node_state, release_node, drain_node, run_node_job,
                watch_thermal, read_node_health, observe_fleet, report_admission, record_event,
                check_node_returned, poll_node_job, delete_node_job, list_running_remediations,
                check_thermal, pause_gpu_operands, restore_gpu_operands, check_operands_gone,
                check_operands_back, check_gpus_free, restart_device_plugin, confirm_lease,
                read_limits, mark_out_of_service, rewrite_state_mirror, record_repair,
                cordon_for_incident, isolate_gpu, set_gpu_taint]


def xid_verdict(node: str, xid: int = 79, action: Action = Action.REBOOT) -> Verdict:
    return Verdict(node=node, action=action, findings=[Finding(
        gpu="0", uuid=f"GPU-{node}-0", signal="DCGM_FI_DEV_XID_ERRORS", value=xid,
        rule=f"xid-{xid}", action=action)])


@asynccontextmanager
async def worker_for(client: Client, cluster: FakeCluster,
                     queue: str | None = None) -> AsyncIterator[str]:
    """A worker with both workflows and the fake activities on a fresh task queue (or on
    ``queue``, to bring a stopped worker back)."""
    from workflows.detector import DetectorWorkflow
    from workflows.remediation import RemediationWorkflow

    queue = queue or f"tq-{uuid.uuid4()}"
    with ThreadPoolExecutor(16) as pool:
        async with Worker(client, task_queue=queue,
                          workflows=[RemediationWorkflow, DetectorWorkflow],
                          activities=cluster.activities(), activity_executor=pool):
            try:
                yield queue
            finally:
                # Let gated activities finish so the worker can shut down.
                cluster.release_gates()


async def until(check: Callable[[], Any], timeout: float = 15.0, what: str = "condition",
                ) -> None:
    """Poll ``check`` (sync or async) until it is truthy. The deadline is at least
    tests/polling.py's DEFAULT_TIMEOUT: a poll that passes returns as soon as it does, and
    one tuned to a quiet machine fails a loaded one."""
    from tests.polling import DEFAULT_TIMEOUT

    timeout = max(timeout, DEFAULT_TIMEOUT)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if loop.time() > end:
            raise AssertionError(f"{what} not reached in {timeout} s")
        await asyncio.sleep(0.05)
