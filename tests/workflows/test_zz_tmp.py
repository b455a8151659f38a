from temporalio.client import WorkflowExecutionStatus
async def test_list(time_skipping_env):
    async for w in time_skipping_env.client.list_workflows():
        if w.status == WorkflowExecutionStatus.RUNNING:
            print("RUNNING", w.id, w.workflow_type)
