"""list_running_remediations against the dev server's real visibility store."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import ActivityEnvironment

from activities.visibility import RunningRemediationsInput, VisibilityActivities
from tests.workflows.fakes import until
from workflows.search_attributes import GPU_NODE, REMEDIATION_STATE


async def test_lists_running_remediations_of_its_task_queue_only(local_env):
    client = local_env.client
    tag = uuid.uuid4().hex[:6]
    queue, elsewhere = f"tq-{tag}", f"tq-other-{tag}"
    started = []

    async def remediation(wid: str, task_queue: str, node: str | None = None,
                          kind: str = "RemediationWorkflow"):
        attrs = [SearchAttributePair(GPU_NODE, node),
                 SearchAttributePair(REMEDIATION_STATE, "draining")] if node else []
        # No worker polls these queues: each stays Running, as a start not yet claimed.
        handle = await client.start_workflow(kind, {}, id=wid, task_queue=task_queue,
                                             search_attributes=TypedSearchAttributes(attrs))
        started.append(handle)
        return handle

    try:
        await remediation(f"remediation-a-{tag}", queue, node=f"a-{tag}")
        await remediation(f"remediation-b-{tag}", queue)  # no GpuNode: named by its ID
        await remediation(f"remediation-c-{tag}", elsewhere, node=f"c-{tag}")
        await remediation(f"detector-{tag}", queue, kind="DetectorWorkflow")
        ended = await remediation(f"remediation-d-{tag}", queue, node=f"d-{tag}")
        await ended.terminate("test")
        await _check(VisibilityActivities(client), queue, tag)
    finally:
        for h in started[:-1]:
            await h.terminate("test over")


async def _check(acts: VisibilityActivities, queue: str, tag: str) -> None:
    inp = RunningRemediationsInput(task_queue=queue)

    async def listed() -> list[str]:
        found = await ActivityEnvironment().run(acts.list_running_remediations, inp)
        return sorted(r.node for r in found.remediations)
    await until(lambda: _equals(listed(), [f"a-{tag}", f"b-{tag}"]), what="both listed")
    found = await ActivityEnvironment().run(acts.list_running_remediations, inp)
    a = next(r for r in found.remediations if r.node == f"a-{tag}")
    assert a.workflow_id == f"remediation-a-{tag}" and a.state == "draining"
    assert a.started is not None and not found.truncated
    one = await ActivityEnvironment().run(acts.list_running_remediations,
                                          inp.model_copy(update={"limit": 1}))
    assert len(one.remediations) == 1 and one.truncated


async def _equals(value, expected) -> bool:
    return await value == expected


def test_a_task_queue_that_cannot_be_quoted_is_refused_by_name():
    with pytest.raises(ValidationError, match="task_queue"):
        RunningRemediationsInput(task_queue="q' OR WorkflowType != '")
