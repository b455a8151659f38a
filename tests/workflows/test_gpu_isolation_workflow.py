"""RemediationWorkflow's per-GPU path (remediation.gpu_isolation: dra) on the time-skipping
test server, with in-memory activities."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.worker import Worker

from policy.models import Action, Finding, Verdict
from tests.workflows.fakes import FakeCluster, until, worker_for
from workflows.ids import CONFIRM_LEASE_UPDATE, REQUEST_SLOT_SIGNAL, SLOT_GRANTED_SIGNAL
from workflows.isolation import rule_name
from workflows.leases import LeaseAnswer, LeaseCheck
from workflows.messages import (
    OperatorCommand,
    RemediationInput,
    RemediationResult,
    RemediationView,
    SlotGrant,
    SlotRequest,
)
from workflows.remediation import RemediationWorkflow
from workflows.settings import GpuOperatorSettings, RemediationSettings
from workflows.transitions import NodeState, Step

GPU_UUID = "GPU-5d1a3c2e-8d0b-4c1e-9a57-6b1f3c2d9e41"
DRA = RemediationSettings(gpu_isolation="dra")


def one_gpu(node: str, action: Action = Action.RESET, xid: int = 48) -> Verdict:
    return Verdict(node=node, action=action, findings=[Finding(
        gpu="3", uuid=GPU_UUID, signal="DCGM_FI_DEV_XID_ERRORS", value=xid,
        rule="xid-48-drain-and-reset", action=action)])


async def _view(handle: WorkflowHandle) -> RemediationView:
    return await handle.query(RemediationWorkflow.view_state)


async def test_a_gpu_that_passes_its_pinned_validation_gets_its_rule_removed(
        time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        result = await client.execute_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n5", verdict=one_gpu("n5"), settings=DRA),
            id=f"remediation-n5-{uuid.uuid4()}", task_queue=queue)
    rule = rule_name("n5", "gpu-3")
    assert result.outcome == "healthy" and "passed its pinned validation" in result.message
    assert cluster.gpu_rules == {}
    jobs = [c[1] for c in cluster.calls if c[0] == "run_node_job"]
    # One validation, pinned to exactly that GPU; the node was never claimed or drained.
    assert [(j.kind, j.device_uuid, j.gpu_index, j.gpu_uuids) for j in jobs] == [
        ("validate", GPU_UUID, "3", [GPU_UUID])]
    assert "gpu3" in jobs[0].name
    assert not any(c[0] in ("claim_node", "drain_node") for c in cluster.calls)
    reasons = [e[1] for e in cluster.events]
    assert reasons == ["GpuIsolated", "GpuIsolationEvicts", "GpuValidated"]
    assert rule in cluster.events[-1][2]
    node = cluster.nodes["n5"]
    assert node.state == NodeState.HEALTHY and not node.cordoned and not node.tainted
    assert "passed its pinned validation" in node.history[-1].outcome


async def test_a_row_remap_failure_is_held_without_validation(time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n6", verdict=one_gpu("n6", Action.QUARANTINE),
                             settings=DRA),
            id=f"remediation-n6-{uuid.uuid4()}", task_queue=queue)
        async def held() -> bool:
            return (await _view(handle)).step == Step.GPU_QUARANTINED
        await until(held, what="the GPU held")
        async def told() -> bool:
            return any(e[1] == "GpuQuarantined" for e in cluster.events)
        await until(told, what="the GpuQuarantined Event")
        assert cluster.jobs_run() == []
        assert "without validation" in next(
            e[2] for e in cluster.events if e[1] == "GpuQuarantined")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()


async def test_without_a_standalone_host_engine_the_gpu_is_held_without_a_job(
        time_skipping_env):
    """A GPU Operator node without the standalone DCGM host engine (the dcgm operand): the
    diag could only use dcgm-exporter's engine, which the other seven GPUs need, so no
    pinned Job is made to wait out its deadline: the GPU is held at once, saying why."""
    cluster = FakeCluster()
    client = time_skipping_env.client
    no_dcgm = DRA.model_copy(update={"gpu_operator": GpuOperatorSettings(
        operands=["device-plugin", "dcgm-exporter", "gpu-feature-discovery"])})
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n9", verdict=one_gpu("n9"), settings=no_dcgm),
            id=f"remediation-n9-{uuid.uuid4()}", task_queue=queue)
        async def told() -> bool:
            return any(e[1] == "GpuQuarantined" for e in cluster.events)
        await until(told, what="the GpuQuarantined Event")
        assert (await _view(handle)).step == Step.GPU_QUARANTINED
        assert cluster.jobs_run() == []
        assert "no standalone DCGM host engine" in next(
            e[2] for e in cluster.events if e[1] == "GpuQuarantined")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()


async def test_one_gpu_that_fails_validation_is_held_and_released_without_touching_the_node(
        time_skipping_env):
    cluster = FakeCluster(job_results={"validate": [False]})
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n1", verdict=one_gpu("n1"), settings=DRA),
            id=f"remediation-n1-{uuid.uuid4()}", task_queue=queue)
        rule = rule_name("n1", "gpu-3")
        async def held() -> bool:
            return (await _view(handle)).step == Step.GPU_QUARANTINED
        await until(held, what="the GPU held")
        assert cluster.gpu_rules.get(rule) == "NoExecute"
        view = await _view(handle)
        assert view.state == NodeState.HEALTHY and view.step == Step.GPU_QUARANTINED
        assert view.gpu_isolation is not None
        assert (view.gpu_isolation.rule, view.gpu_isolation.effect) == (rule, "NoExecute")
        assert view.gpu_isolation.owner == handle.id
        # Not claimed, cordoned or drained: its other GPUs stay in service.
        assert not any(c[0] in ("claim_node", "drain_node") for c in cluster.calls)
        assert cluster.jobs_run() == ["validate"]
        async def told() -> bool:
            return any(e[1] == "GpuQuarantined" for e in cluster.events)
        await until(told, what="the GpuQuarantined Event")
        reasons = [e[1] for e in cluster.events]
        assert reasons == ["GpuIsolated", "GpuIsolationEvicts", "GpuValidationFailed",
                           "GpuQuarantined"]
        assert "diag failed" in cluster.events[2][2] and rule in cluster.events[2][2]
        assert rule in cluster.events[0][2] and handle.id in cluster.events[0][2]
        ack = await handle.execute_update(RemediationWorkflow.release,
                                          OperatorCommand(operator="alice",
                                                          reason="GPU replaced"))
        assert "release ordered by alice" in ack.message
        result = await handle.result()
    assert result.outcome == "healthy" and rule in result.message
    assert cluster.gpu_rules == {}
    node = cluster.nodes["n1"]
    assert node.state == NodeState.HEALTHY and not node.cordoned and not node.tainted
    assert node.acked == {GPU_UUID: 48}
    assert "DeviceTaintRule" in node.history[-1].outcome


async def test_no_rule_means_the_whole_node_path_with_a_warning(time_skipping_env):
    cluster = FakeCluster(isolation_why_not="the API server serves no DeviceTaintRule")
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        result = await client.execute_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n2", verdict=one_gpu("n2"), settings=DRA),
            id=f"remediation-n2-{uuid.uuid4()}", task_queue=queue)
    assert result.outcome == "healthy"
    warning = [e for e in cluster.events if e[1] == "GpuIsolationUnavailable"]
    assert warning and "serves no DeviceTaintRule" in warning[0][2]
    assert cluster.jobs_run() == ["gpu-reset", "validate"]
    assert cluster.nodes["n2"].states_seen[0] == "draining"


async def test_off_never_asks_for_a_rule(time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        await client.execute_workflow(
            RemediationWorkflow.run, RemediationInput(node="n3", verdict=one_gpu("n3")),
            id=f"remediation-n3-{uuid.uuid4()}", task_queue=queue)
    assert not any(c[0] == "isolate_gpu" for c in cluster.calls)


async def test_an_abort_removes_the_rule(time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n4", verdict=one_gpu("n4", Action.QUARANTINE),
                             settings=DRA),
            id=f"remediation-n4-{uuid.uuid4()}", task_queue=queue)
        async def held() -> bool:
            return (await _view(handle)).step == Step.GPU_QUARANTINED
        await until(held, what="the GPU held")
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    assert cluster.gpu_rules == {}
    assert cluster.nodes["n4"].history[-1].outcome.startswith("aborted")
    assert not any(c[0] == "claim_node" for c in cluster.calls)


async def test_an_abort_mid_validation_deletes_the_job_its_claim_and_the_rule(
        time_skipping_env):
    cluster = FakeCluster()
    gate = threading.Event()
    cluster.job_gates["validate"] = gate
    client = time_skipping_env.client
    try:
        async with worker_for(client, cluster) as queue:
            handle = await client.start_workflow(
                RemediationWorkflow.run,
                RemediationInput(node="n7", verdict=one_gpu("n7"), settings=DRA),
                id=f"remediation-n7-{uuid.uuid4()}", task_queue=queue)
            # The Job exists and is being looked at: the step shows VALIDATE a moment
            # before that (the host-engine check runs first), when there is no Job to delete.
            await until(lambda: "validate" in cluster.at_gate, what="the pinned validation")
            await handle.cancel()

            async def look_cancelled() -> bool:
                return EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED in [
                    e.event_type async for e in handle.fetch_history_events()]
            await until(look_cancelled, what="the abort reaching the look in flight")
            gate.set()  # the look in flight runs to its end; then the abort deletes the Job
            with pytest.raises(WorkflowFailureError):
                await handle.result()
    finally:
        gate.set()
    deleted = [c[1] for c in cluster.calls if c[0] == "delete_node_job"]
    # delete_node_job removes the pinned Job and its ResourceClaim (activities/jobs.py).
    assert [(d.kind, d.device_uuid) for d in deleted] == [("validate", GPU_UUID)]
    assert cluster.gpu_rules == {}
    assert cluster.nodes["n7"].history[-1].outcome.startswith("aborted")


async def test_a_dry_run_plans_the_pinned_validation_and_writes_nothing(time_skipping_env):
    cluster = FakeCluster()
    client = time_skipping_env.client
    async with worker_for(client, cluster) as queue:
        handle = await client.start_workflow(
            RemediationWorkflow.run,
            RemediationInput(node="n8", verdict=one_gpu("n8"), settings=DRA, dry_run=True),
            id=f"remediation-n8-{uuid.uuid4()}", task_queue=queue)
        result = await handle.result()
        plan = (await _view(handle)).plan
    assert result.outcome == "quarantined" and "would be isolated" in result.message
    assert cluster.mutations == [] and cluster.gpu_rules == {}
    jobs = [c[1] for c in cluster.calls if c[0] == "run_node_job"]
    assert [(j.dry_run, j.device_uuid) for j in jobs] == [(True, GPU_UUID)]
    assert any("pinned to GPU 3" in line and "ResourceClaim" in line for line in plan), plan
    assert not any(e[1] == "GpuQuarantined" for e in cluster.events)


@workflow.defn(name="LeaseKeeper", sandboxed=False)
class LeaseKeeper:
    """The detector's side of a GPU-scoped lease, and nothing else: it starts the
    remediation as its child, records its requests for a slot, and confirms only the
    lease's own token."""

    def __init__(self) -> None:
        self.requests: list[SlotRequest] = []
        self.token = ""

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        self.token = inp.lease_token
        return await workflow.execute_child_workflow(
            RemediationWorkflow.run, inp, id=f"remediation-{inp.node}-{workflow.uuid4()}")

    @workflow.signal(name=REQUEST_SLOT_SIGNAL)
    def request_slot(self, req: SlotRequest) -> None:
        self.requests.append(req)

    @workflow.update(name=CONFIRM_LEASE_UPDATE)
    def confirm_lease(self, chk: LeaseCheck) -> LeaseAnswer:
        return LeaseAnswer(live=chk.token == self.token, why="" if chk.token == self.token
                           else "wrong lease token")

    @workflow.query
    def asked(self) -> list[SlotRequest]:
        return self.requests


async def test_a_gpu_lease_waits_for_a_node_slot_before_the_whole_node_path(time_skipping_env):
    """Admitted to isolate one GPU (a GPU-scoped lease: no node slot), the remediation finds
    no DeviceTaintRule can be made: it touches nothing on the node until the detector grants
    a node slot with the lease's token; a stray grant is refused and recorded."""
    cluster = FakeCluster(isolation_why_not="forbidden: cannot create devicetaintrules")
    client = time_skipping_env.client
    queue = f"tq-{uuid.uuid4()}"
    with ThreadPoolExecutor(8) as pool:
        async with Worker(client, task_queue=queue,
                          workflows=[RemediationWorkflow, LeaseKeeper],
                          activities=cluster.activities(), activity_executor=pool):
            keeper = await client.start_workflow(
                LeaseKeeper.run,
                RemediationInput(node="n5", verdict=one_gpu("n5"), settings=DRA,
                                 holds_slot=False, lease_scope="gpu", lease_token="the-lease"),
                id=f"keeper-{uuid.uuid4()}", task_queue=queue)
            async def asked() -> bool:
                return bool(await keeper.query(LeaseKeeper.asked))
            await until(asked, what="a slot request")
            child_id = (await keeper.describe()).raw_description.pending_children[0].workflow_id
            child = client.get_workflow_handle(child_id)
            request = (await keeper.query(LeaseKeeper.asked))[0]
            assert (request.node, request.token) == ("n5", "the-lease")
            view = await _view(child)
            assert (view.state, view.step) == (NodeState.HEALTHY, Step.WAITING_FOR_A_DRAIN_SLOT)
            assert view.lease_scope == "gpu"
            await child.signal(SLOT_GRANTED_SIGNAL, SlotGrant(token="guessed"))
            async def refused() -> bool:
                return len((await _view(child)).rejected_commands) == 1
            await until(refused, what="the stray grant refused")
            assert (await _view(child)).step == Step.WAITING_FOR_A_DRAIN_SLOT
            # Nothing node-wide before the grant: no claim (cordon), drain or Job.
            assert not any(c[0] in ("claim_node", "drain_node", "run_node_job")
                           for c in cluster.calls)
            assert cluster.mutations == []
            assert [e[1] for e in cluster.events] == ["GpuIsolationUnavailable",
                                                      "OperatorSignalRejected"]
            await child.signal(SLOT_GRANTED_SIGNAL, SlotGrant(token="the-lease"))
            result = await keeper.result()
            assert (await _view(child)).lease_scope == "node"
    assert result.outcome == "healthy", result
    assert cluster.jobs_run() == ["gpu-reset", "validate"]
    assert cluster.nodes["n5"].states_seen[0] == "draining"


async def test_the_detector_admits_a_gpu_lease_beside_a_node_and_widens_it_in_a_free_slot(
        local_env):
    """The detector, budget one node, gpu_isolation dra: XID 48 on one GPU and XID 79 on
    another node are both admitted (the GPU's lease takes no node slot). No rule can be made,
    so the GPU's remediation asks for the node: it is claimed only after the other node was
    given back, so two nodes are never out at once."""
    from datetime import timedelta

    from tests.workflows.fakes import xid_verdict
    from workflows.detector import DetectorWorkflow
    from workflows.ids import remediation_workflow_id
    from workflows.messages import DetectorInput
    from workflows.settings import DetectorSettings, DrainSettings

    cluster = FakeCluster(isolation_why_not="forbidden: cannot create devicetaintrules")
    tag = uuid.uuid4().hex[:6]
    gpu_node, whole = f"g-{tag}", f"w-{tag}"
    cluster.verdicts = [one_gpu(gpu_node), xid_verdict(whole)]
    for n in (gpu_node, whole, f"x-{tag}"):
        cluster.node(n)
    fast = DRA.model_copy(update={"heartbeat_timeout": timedelta(seconds=2),
                                  "drain": DrainSettings(retry_interval=timedelta(
                                      milliseconds=200))})
    settings = DetectorSettings(interval=timedelta(milliseconds=300), max_unavailable=1,
                                breaker_max_flagged_percent=100.0, remediation=fast)
    async with worker_for(local_env.client, cluster) as queue:
        detector = await local_env.client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings),
            id=f"detector-{tag}", task_queue=queue)
        cluster.detector_id = detector.id
        try:
            await until(lambda: whole in cluster.claimed and any(
                c[0] == "isolate_gpu" for c in cluster.calls), 30, "both admitted")
            cluster.verdicts = []
            result = await local_env.client.get_workflow_handle(
                remediation_workflow_id(gpu_node)).result()
            assert result["outcome"] == "healthy", result
        finally:
            await detector.terminate("test over")
    order = [(c[0], c[1].node) for c in cluster.calls
             if c[0] in ("claim_node", "release_node", "isolate_gpu")]
    # Admitted beside the node under a budget of one (its lease held no node slot)...
    assert order.index(("isolate_gpu", gpu_node)) < order.index(("release_node", whole)), order
    # ...and given the node only once the other was back.
    assert order.index(("claim_node", gpu_node)) > order.index(("release_node", whole)), order
    assert cluster.jobs_run().count("gpu-reset") == 1  # the GPU node, as a whole node
