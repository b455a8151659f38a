"""The detector shows GPUs out of service (node leases' GPUs and isolated GPUs) against the
GPU budget: in its view, its Temporal UI details and the admission report behind the
metrics. On the dev server (the details are read with the metadata query)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from tests.workflows.fakes import FakeCluster, until, worker_for, xid_verdict
from tests.workflows.test_gpu_isolation_workflow import DRA, one_gpu
from workflows.detector import DetectorWorkflow
from workflows.messages import DetectorInput, DetectorView
from workflows.settings import DetectorSettings, DrainSettings


@contextlib.asynccontextmanager
async def running_detector(client: Client, cluster: FakeCluster, settings: DetectorSettings,
                           tag: str) -> AsyncIterator[WorkflowHandle]:
    """A detector on the fake cluster's worker, terminated on the way out."""
    async with worker_for(client, cluster) as queue:
        detector = await client.start_workflow(
            DetectorWorkflow.run, DetectorInput(settings=settings),
            id=f"detector-{tag}", task_queue=queue)
        cluster.detector_id = detector.id
        try:
            yield detector
        finally:
            await detector.terminate("test over")


async def test_an_isolated_gpu_and_a_node_out_are_counted_in_view_details_and_report(
        local_env):
    cluster = FakeCluster()
    tag = uuid.uuid4().hex[:6]
    gpu_node, whole = f"g-{tag}", f"w-{tag}"
    cluster.verdicts = [one_gpu(gpu_node), xid_verdict(whole)]
    for n in (gpu_node, whole, f"x-{tag}", f"y-{tag}"):
        cluster.node(n)
    per_node = cluster.nodes[whole].gpus
    fast = DRA.model_copy(update={"heartbeat_timeout": timedelta(seconds=2),
                                  "drain": DrainSettings(retry_interval=timedelta(
                                      milliseconds=200))})
    settings = DetectorSettings(interval=timedelta(milliseconds=300), max_unavailable=1,
                                max_unavailable_gpus=per_node + 2,
                                breaker_max_flagged_percent=100.0, remediation=fast)
    async with running_detector(local_env.client, cluster, settings, tag) as detector:
        await until(lambda: any(r.gpus is not None and r.gpus.isolated == 1
                                and r.in_use == 1 for r in cluster.reports),
                    30, "both admitted and reported")
        # The view and details as the same tick counted them, once both are out.
        for _ in range(100):
            meta = await detector.query("__temporal_workflow_metadata",
                                        result_type=WorkflowMetadata)
            view = await detector.query("view", result_type=DetectorView)
            if view.gpus is not None and view.gpus.isolated == 1 and \
                    len(view.in_flight) == 1 and "**GPUs**" in meta.current_details:
                break
            await asyncio.sleep(0.1)
    report = next(r for r in cluster.reports if r.gpus is not None and r.gpus.isolated == 1
                  and r.in_use == 1)
    assert report.gpus is not None
    # The node's GPUs and the one isolated GPU, against the fleet's GPU budget.
    assert (report.gpus.out_of_service, report.gpus.budget) == (per_node + 1, per_node + 2)
    assert report.gpus.gpus == 4 * per_node
    assert view.gpus is not None
    assert (view.gpus.out_of_service, view.gpus.isolated) == (per_node + 1, 1), view.gpus
    assert f"**GPUs** {per_node + 1}/{per_node + 2} out of service (1 isolated)" \
        in meta.current_details, meta.current_details


async def test_the_detector_holds_a_pools_gpu_budget(local_env):
    """Only a pool GPU budget configured (no fault domain, no fleet GPU budget): the detector
    counts it. Two whole-node faults in one pool of 8-GPU nodes under a budget of 8 GPUs:
    one starts, the other waits naming the pool; a fault in another pool starts."""
    pool = "node-restriction.kubernetes.io/pool"
    cluster = FakeCluster()
    tag = uuid.uuid4().hex[:6]
    a0, a1, b0 = f"a0-{tag}", f"a1-{tag}", f"b0-{tag}"
    for n, p in ((a0, "a"), (a1, "a"), (b0, "b"), (f"b1-{tag}", "b")):
        cluster.node(n).labels[pool] = p
    per_node = cluster.nodes[a0].gpus
    cluster.verdicts = [xid_verdict(a0), xid_verdict(a1), xid_verdict(b0)]
    settings = DetectorSettings(interval=timedelta(milliseconds=300), max_unavailable=3,
                                pool_label=pool,
                                pool_max_unavailable_gpus={"*": per_node},
                                breaker_max_flagged_percent=100.0,
                                remediation=DRA.model_copy(update={"gpu_isolation": "off"}))
    async with running_detector(local_env.client, cluster, settings, tag) as detector:
        await until(lambda: b0 in cluster.claimed and (a0 in cluster.claimed
                                                      or a1 in cluster.claimed),
                    30, "one node of each pool claimed")
        view = await detector.query("view", result_type=DetectorView)
        meta = await detector.query("__temporal_workflow_metadata",
                                    result_type=WorkflowMetadata)
    assert not (a0 in cluster.claimed and a1 in cluster.claimed)
    waiting = [w for w in view.waiting if w.startswith((a0, a1))]
    assert len(waiting) == 1, view.waiting
    assert f"pool a GPU budget full ({per_node} + {per_node} > {per_node} GPUs)" in waiting[0]
    assert view.gpus is not None
    assert view.gpus.pools == {"a": per_node, "b": per_node}
    assert f"pool a {per_node}/{per_node} · pool b {per_node}/{per_node}" in \
        meta.current_details, meta.current_details
