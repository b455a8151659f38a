"""The fleet observation has a task queue and a worker of its own: with every activity slot
of the main worker taken by remediations, the detector still observes each tick."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio.worker import Worker

from tests.workflows.fakes import FakeCluster, until, xid_verdict
from worker.service.wiring import TICK_ACTIVITIES
from workflows.detector import DetectorWorkflow
from workflows.ids import observe_task_queue
from workflows.messages import DetectorInput
from workflows.remediation import RemediationWorkflow
from workflows.settings import DetectorSettings


async def test_observation_never_waits_behind_remediation_activities(local_env) -> None:
    cluster = FakeCluster()
    names = [f"obsq-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    for n in names:
        cluster.node(n)
        cluster.claim_gates[n] = threading.Event()  # every claim holds its slot
    cluster.verdicts = [xid_verdict(n) for n in names[:1]]
    queue = f"tq-{uuid.uuid4()}"
    acts = cluster.activities()
    observe = [a for a in acts if getattr(a, "__name__", "") in TICK_ACTIVITIES]
    settings = DetectorSettings(interval=timedelta(milliseconds=300), max_unavailable=1,
                                observe_task_queue=observe_task_queue(queue))
    with ThreadPoolExecutor(4) as pool:
        async with Worker(local_env.client, task_queue=queue,
                          workflows=[RemediationWorkflow, DetectorWorkflow], activities=acts,
                          activity_executor=pool, max_concurrent_activities=1), \
                Worker(local_env.client, task_queue=observe_task_queue(queue),
                       activities=observe, activity_executor=pool,
                       max_concurrent_activities=1):
            detector = await local_env.client.start_workflow(
                DetectorWorkflow.run, DetectorInput(settings=settings),
                id=f"detector-{uuid.uuid4()}", task_queue=queue)
            try:
                # The claim of the admitted node holds the main worker's only slot...
                await until(lambda: any(c[0] == "observe_fleet" for c in cluster.calls), 15,
                            "a first observation")
                await until(lambda: names[0] in cluster.nodes and cluster.verdicts, 5)
                before = sum(1 for c in cluster.calls if c[0] == "observe_fleet")
                # ... and observations go on regardless.
                await until(lambda: sum(1 for c in cluster.calls
                                        if c[0] == "observe_fleet") >= before + 3,
                            15, "three more observations while the slot is held")
                assert not any(c[0] == "claim_node" for c in cluster.calls), \
                    "the claim is still holding the slot"
            finally:
                cluster.release_gates()
                await detector.terminate("test over")
