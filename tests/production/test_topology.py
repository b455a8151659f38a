"""Production scenarios on the real Temporal server (PostgreSQL, SQL visibility) with two
worker processes: the schema and setup scripts of docker-compose.yml, a SIGKILLed worker
whose remediation the other replica finishes, a rolling restart, the server and the
database restarted mid-remediation, and the bad inputs an installer meets."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import GetClusterInfoRequest
from temporalio.client import Client

from sim.gpu.client import GpuSimClient
from tests.chaos.invariants import InvariantChecker
from tests.e2e.conftest import make_stack
from tests.e2e.kit import Cluster, detector_view, result, run, wait_for, workflow_status
from tests.production.topology import ProductionStack, compose_image_tag
from worker.config import TemporalSettings
from worker.temporal_client import connect
from workflows.ids import remediation_workflow_id

pytestmark = [pytest.mark.production, pytest.mark.e2e]

HERE = Path(__file__).parent
MAX_UNAVAILABLE = 3


@pytest.fixture(scope="module")
def prod(temporal_server: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[ProductionStack]:
    stack = make_stack(
        tmp_path_factory.mktemp("production"), str(HERE / "production.yaml"),
        kind=ProductionStack,
        **{"detector.max_unavailable": MAX_UNAVAILABLE, "detector.observe_timeout": "PT10S",
           "detector.breaker_max_flagged_percent": 100})
    stack.server = temporal_server
    stack.job_seconds = 3.0  # windows wide enough to kill a worker inside a Job
    with stack:
        yield stack


async def _client(stack: ProductionStack) -> Client:
    return await connect(TemporalSettings(address=stack.temporal_address))


def assert_returned(stack: ProductionStack, k8s: Cluster, node: str, timeout: float = 180
                    ) -> None:
    """The node's remediation ended healthy and the node is back in service."""
    wait_for(stack, f"a remediation of {node}", lambda: workflow_status(stack, node),
             timeout=60)
    res = result(stack, node, timeout=timeout)
    assert res.outcome == "healthy", res
    n = k8s.node(node)
    assert n.metadata.labels["gpu-remediate.io/state"] == "healthy"
    assert not n.spec.unschedulable and not k8s.has_our_taint(n)


def assert_healthy(stack: ProductionStack, k8s: Cluster, node: str, timeout: float = 180
                   ) -> None:
    """Back in service after one reboot and one validation."""
    assert_returned(stack, k8s, node, timeout)
    assert sorted(k8s.job_kinds(node)) == ["reboot", "validate"], k8s.job_kinds(node)
    assert k8s.event_reasons(node).count("RemediationSucceeded") == 1


def workflow_task_failures(stack: ProductionStack, node: str) -> list[str]:
    """Workflow task failures in the node's remediation history (a nondeterminism error
    shows up as one)."""
    async def go() -> list[str]:
        handle = (await _client(stack)).get_workflow_handle(remediation_workflow_id(node))
        return [e.workflow_task_failed_event_attributes.failure.message
                async for e in handle.fetch_history_events()
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    return run(go())


def timeline(stack: ProductionStack, node: str) -> str:
    """The node's remediation history, one line per event (seconds from its start)."""
    async def go() -> str:
        handle = (await _client(stack)).get_workflow_handle(remediation_workflow_id(node))
        lines, start = [], None
        async for e in handle.fetch_history_events():
            t = e.event_time.ToDatetime()
            start = start or t
            name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
            if e.HasField("activity_task_scheduled_event_attributes"):
                name += " " + e.activity_task_scheduled_event_attributes.activity_type.name
            if e.HasField("activity_task_started_event_attributes"):
                name += " by " + e.activity_task_started_event_attributes.identity
            lines.append(f"{(t - start).total_seconds():7.1f} {name}")
        return "\n".join(lines)
    return run(go())


def running_on(stack: ProductionStack, node: str, activity: str) -> int | None:
    """The pid of the worker process running ``activity`` for the node, if one does."""
    async def go() -> int | None:
        handle = (await _client(stack)).get_workflow_handle(remediation_workflow_id(node))
        desc = await handle.describe()
        for act in desc.raw_description.pending_activities:
            identity = act.last_worker_identity
            if act.activity_type.name == activity and "@" in identity and \
                    act.last_started_time.seconds:
                return int(identity.split("@", 1)[0])
        return None
    return run(go())


# ------------------------------------------------------------------ the topology itself


def test_the_server_is_the_compose_server_on_postgresql(prod: ProductionStack) -> None:
    async def go() -> tuple[str, str, str]:
        client = await _client(prod)
        info = await client.workflow_service.get_cluster_info(GetClusterInfoRequest())
        return info.persistence_store, info.visibility_store, info.server_version
    persistence, visibility, version = run(go())
    assert (persistence, visibility) == ("postgres12", "postgres12")
    # docker-compose.yml runs the same release the tier built.
    assert version == compose_image_tag("temporal")
    # The compose schema script is idempotent: a second run changes nothing.
    again = prod.run_schema_script()
    assert again.returncode == 0, again.stderr
    assert "database temporal: schema" in again.stdout


def test_a_newer_schema_is_refused_by_the_schema_script(prod: ProductionStack) -> None:
    assert prod.pg is not None
    was = prod.pg.psql("SELECT curr_version FROM schema_version", db="temporal")
    prod.pg.psql("UPDATE schema_version SET curr_version = '9.9'", db="temporal")
    try:
        out = prod.run_schema_script()
    finally:
        prod.pg.psql(f"UPDATE schema_version SET curr_version = '{was}'", db="temporal")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "database temporal has a schema newer than this release's" in out.stderr
    assert "9.9" in out.stderr and was in out.stderr


# ------------------------------------------------------------------ workers


def test_sigkill_of_the_worker_running_a_remediation(prod: ProductionStack) -> None:
    k8s, gpu = Cluster(prod), GpuSimClient(prod.gpu_url)
    node = "gpu-node-01"
    gpu.inject_fault(node, "0", "xid", 79)
    # The drain: the long step (minutes on a real node), a heartbeating activity.
    pid = wait_for(prod, f"the drain of {node} on a worker",
                   lambda: running_on(prod, node, "drain_node"), timeout=90, every=0.1)
    victim = prod.replica_by_pid(pid)
    assert victim is not None, f"pid {pid} is none of {[r.pid for r in prod.workers.values()]}"
    survivors = [r.name for r in prod.workers.values() if r is not victim]
    prod.kill_replica(victim.name)
    # The other replica alone finishes it (the Deployment starts a new pod meanwhile).
    started = time.monotonic()
    assert_healthy(prod, k8s, node)
    took = time.monotonic() - started
    history = timeline(prod, node)
    print(f"finished {took:.0f}s after the kill\n{history}")
    # Taken over by the other replica after the heartbeat timeout (5 s here), not after
    # the drain's own time limit.
    lines = history.splitlines()
    scheduled = next(i for i, line in enumerate(lines) if line.endswith("SCHEDULED drain_node"))
    finisher = next(line for line in lines[scheduled:] if "STARTED by" in line)
    assert f" {victim.pid}@" not in finisher, history
    assert took < 60, history
    assert [r.name for r in prod.workers.values()] == survivors
    assert not workflow_task_failures(prod, node)
    prod.start_replica(victim.name)


def test_rolling_restart_of_both_workers(prod: ProductionStack) -> None:
    k8s, gpu = Cluster(prod), GpuSimClient(prod.gpu_url)
    nodes = ["gpu-node-02", "gpu-node-03"]
    with InvariantChecker(prod, MAX_UNAVAILABLE, grace=45) as checker:
        for node in nodes:
            gpu.inject_fault(node, "0", "xid", 79)
        wait_for(prod, "both claimed", lambda: all(k8s.state(n) != "healthy" for n in nodes),
                 timeout=60)
        # As `kubectl rollout restart` with maxUnavailable 0: a new pod is ready before an
        # old one gets SIGTERM.
        for name in list(prod.workers):
            prod.start_replica(f"{name}-new")
            prod.kill_replica(name, signal.SIGTERM)
        for node in nodes:
            assert_healthy(prod, k8s, node)
    assert not checker.violations, "\n".join(checker.violations)


# ------------------------------------------------------------------ server and database


def test_temporal_server_killed_and_restarted_mid_remediation(prod: ProductionStack) -> None:
    k8s, gpu = Cluster(prod), GpuSimClient(prod.gpu_url)
    nodes = ["gpu-node-04", "gpu-node-05", "gpu-node-06", "gpu-node-07"]
    with InvariantChecker(prod, MAX_UNAVAILABLE, grace=60) as checker:
        for node in nodes:
            gpu.inject_fault(node, "0", "xid", 79)
        wait_for(prod, "the budget full and one repairing",
                 lambda: sum(k8s.state(n) != "healthy" for n in nodes) >= MAX_UNAVAILABLE
                 and any(k8s.state(n) == "repairing" for n in nodes), timeout=90)
        prod.restart_temporal()
        for node in nodes:
            assert_healthy(prod, k8s, node, timeout=240)
    print(f"samples {checker.samples}, max out of service {checker.max_out}")
    assert checker.max_out <= MAX_UNAVAILABLE
    assert not checker.violations, "\n".join(checker.violations)


def test_postgresql_restart_needs_no_operator(prod: ProductionStack) -> None:
    assert prod.pg is not None
    k8s, gpu = Cluster(prod), GpuSimClient(prod.gpu_url)
    nodes = ["gpu-node-08", "gpu-node-09"]
    with InvariantChecker(prod, MAX_UNAVAILABLE, grace=90) as checker:
        for node in nodes:
            gpu.inject_fault(node, "0", "xid", 79)
        wait_for(prod, "both claimed", lambda: all(k8s.state(n) != "healthy" for n in nodes),
                 timeout=60)
        prod.pg.stop("immediate")  # as a crash: recovery from the WAL on start
        time.sleep(10)
        prod.pg.start()
        for node in nodes:
            assert_healthy(prod, k8s, node, timeout=300)
    assert not checker.violations, "\n".join(checker.violations)
    # The detector ticks on and every worker is ready, with nobody restarting anything.
    ticks = detector_view(prod).ticks_total
    wait_for(prod, "3 more detector ticks",
             lambda: detector_view(prod).ticks_total >= ticks + 3, timeout=60)
    for replica in prod.workers.values():
        assert replica.alive() and prod.ready(replica), replica.name


def test_a_worker_started_while_postgresql_is_down_waits_unready(prod: ProductionStack
                                                                 ) -> None:
    assert prod.pg is not None
    prod.pg.stop("fast")
    try:
        replica = prod.start_replica("worker-late", wait=False)
        # Down for at least 20 s and until the worker has said why it does not poll: on a
        # loaded machine its start (imports, then the SDK's own retries of the namespace
        # while it builds the worker) can take most of that before our wait begins.
        started = time.monotonic()
        while time.monotonic() < started + 20 or "not polling yet" not in \
                replica.part.log.read_text(errors="replace"):
            assert time.monotonic() < started + 120, replica.part.log.read_text()[-3000:]
            assert replica.alive(), replica.part.log.read_text()[-2000:]
            assert not prod.ready(replica)
            time.sleep(1)
    finally:
        prod.pg.start()
    prod.wait_ready(replica, timeout=120)
    # Ready as soon as the SDK's worker runs; the line saying so follows within a poll of
    # _report_start (longer when that poll is still asking the server why it could not).
    wait_for(prod, "the worker's 'polling' line",
             lambda: "worker polling task queue" in replica.part.log.read_text(), timeout=30)
    log = replica.part.log.read_text()
    # Our own line, with the server's reason, before the one that says it polls.
    warning = next((line for line in log.splitlines() if "not polling yet" in line), "")
    assert "cannot serve namespace default" in warning, log[-3000:]
    assert "/readyz answers 503" in warning and "database" in warning.lower(), warning
    assert log.index("not polling yet") < log.index("worker polling task queue"), log[-3000:]


def test_no_worker_logged_a_nondeterminism_error(prod: ProductionStack) -> None:
    assert "nondetermin" not in prod.worker_logs().lower()
